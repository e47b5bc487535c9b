/* Runs in the fork server (policy_load) and the sandbox child (policy_install):
 * the seccomp policy, a text file in policy/ -> libseccomp -> BPF, compiled once
 * in the fork server at start; each sandbox only loads the BPF as its last
 * step before user code. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sbx_policy; /* opaque: the compiled filter plus its source summary */

/* In the fork server, at start (and forkbox-policy, the fuzzer): parse and
 * compile path for the native architecture, refusing foreign ABIs (x32,
 * i386 via int 0x80). 0, or -EINVAL with "file:line: reason" in err
 * (any error in the file stops forkboxd at start). */
int policy_load(const char *path, struct sbx_policy **out, char *err, size_t errlen);
void policy_free(struct sbx_policy *p);
/* How long policy_load() lets libseccomp compile (default 10 s; the fuzz
 * target shortens it). libseccomp 2.5.4 can loop forever on some policies. */
void policy_set_compile_timeout(unsigned ms);

/* In the child, after PR_SET_NO_NEW_PRIVS: load the compiled filters
 * (seccomp(SECCOMP_SET_MODE_FILTER)), the main one with
 * SECCOMP_FILTER_FLAG_NEW_LISTENER when the policy has counted refusals.
 * 0 with *listener set (the notification fd, O_CLOEXEC, or -1 when nothing
 * is counted), or -errno. No allocation.
 *
 * A counted refusal (`deny` without `when`, `default deny`) stops the calling
 * task until the listener's holder answers it; once every copy of the
 * listener is closed, counted refusals fail with ENOSYS. Whoever holds the
 * listener decides what those calls return, and could even let them run
 * (SECCOMP_USER_NOTIF_FLAG_CONTINUE): the caller must hand it out of the
 * sandbox and close its copy before any untrusted code runs. */
int policy_install(const struct sbx_policy *p, int *listener);

/* Number of BPF instructions (for logs and the policy checker). */
size_t policy_bpf_len(const struct sbx_policy *p);

/* One line for the start-up log: what the policy allows and refuses, the
 * default, and the BPF sizes. Borrowed; lives as long as p. */
const char *policy_summary(const struct sbx_policy *p);

