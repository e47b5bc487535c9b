/* Runs in the sandbox child (its step 8): policy_install, the filter the
 * fork server compiled (seccomp.c) loaded with seccomp(2) alone: no
 * libseccomp, no allocation, about 0.1 ms. */
#include <errno.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sandbox/seccomp.h"
#include "sandbox/seccomp_int.h"

int policy_install(const struct sbx_policy *p, int *listener)
{
    *listener = -1;
    /* The kernel refuses an unprivileged filter without no_new_privs; check
     * so that a missing step is named rather than showing up as EACCES. */
    if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1)
        return -EPERM;
    /* Exceptions first: the main filter refuses seccomp(2) itself, so it
     * must be the last one loaded; it is also the one with the listener
     * (one per filter stack). No TSYNC: the child has one thread. */
    if (p->except.len &&
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &p->except) < 0)
        return -errno;
    long fd = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
                      p->counts ? SECCOMP_FILTER_FLAG_NEW_LISTENER : 0, &p->main);
    if (fd < 0)
        return -errno;
    if (p->counts)
        *listener = (int)fd;
    return 0;
}
