/* Names for messages and metrics: a syscall's name by number on an
 * architecture, an action with its errno in words, and which calls the
 * supervisor can carry out itself (`supervise`). Runs wherever a policy is
 * read (policy.c's opening comment) and in the supervisor, which names the
 * calls it refused (session/notify.c, session/metrics.c). */
#include "sandbox/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>

const char *policy_syscall_name_arch(uint32_t arch, int nr, char *buf, size_t len)
{
    char *s = seccomp_syscall_resolve_num_arch(arch, nr);
    snprintf(buf, len, "%s", s ? s : "?");
    free(s);
    return buf;
}

const char *policy_syscall_name(int nr, char *buf, size_t len)
{
    return policy_syscall_name_arch(SCMP_ARCH_NATIVE, nr, buf, len);
}

const char *policy_action_str(enum policy_action act, uint16_t err, char *buf, size_t len)
{
    const char *en = err ? strerrorname_np(err) : NULL;
    switch (act) {
    case POLICY_ALLOW: snprintf(buf, len, "allow"); break;
    case POLICY_DENY: snprintf(buf, len, "deny %s", en ? en : "?"); break;
    case POLICY_ERRNO: snprintf(buf, len, "errno %s", en ? en : "?"); break;
    case POLICY_KILL: snprintf(buf, len, "kill"); break;
    case POLICY_NOOP: snprintf(buf, len, "noop"); break;
    case POLICY_SUPERVISE: snprintf(buf, len, "supervise"); break;
    default: snprintf(buf, len, "none"); break;
    }
    return buf;
}

bool policy_supervisable_arch(uint32_t arch, int nr)
{
    /* The supervisor's handlers (src/session/flock.c); keep in step. By
     * name: the number is the rules' architecture's. */
    return nr >= 0 && nr == seccomp_syscall_resolve_name_arch(arch, "flock");
}

bool policy_supervisable(int nr)
{
    return nr == SYS_flock;
}
