/* seccomp policy: a text file in policy/ -> libseccomp -> BPF, compiled once
 * in the fork server at start; each sandbox only loads the BPF as its last
 * step before user code. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct sbx_policy; /* opaque: the compiled filter plus its source summary */

/* Parse and compile path for the native architecture, refusing foreign ABIs
 * (x32, i386 via int 0x80). 0, or -EINVAL with "file:line: reason" in err
 * (any error in the file stops forkboxd at start). */
int policy_load(const char *path, struct sbx_policy **out, char *err, size_t errlen);
void policy_free(struct sbx_policy *p);

/* In the child, after PR_SET_NO_NEW_PRIVS: load the compiled filter
 * (seccomp(SECCOMP_SET_MODE_FILTER)). 0 or -errno. Async-signal-safe-ish: no
 * allocation. */
int policy_install(const struct sbx_policy *p);

/* Number of BPF instructions (for logs and the policy checker). */
size_t policy_bpf_len(const struct sbx_policy *p);

/* One line for the start-up log: what the policy allows and refuses, the
 * default, and the BPF sizes. Borrowed; lives as long as p. */
const char *policy_summary(const struct sbx_policy *p);

/* Denied-call accounting, in the child. A `deny` rule (and `default deny`)
 * compiles to SECCOMP_RET_TRAP; policy_install() sets a SIGSYS handler that
 * counts the call and makes it return -errno as the policy says. The counter
 * starts at 0 in each sandbox (the fork server never installs a filter), so
 * it is per turn; the child reports it when the turn ends.
 *
 * Limits, stated honestly: it counts in-process. A program exec'd by user
 * code starts with SIGSYS at SIG_DFL, so there a counted denial kills that
 * program ("Bad system call") instead of returning an errno, and is not
 * counted. User code cannot replace the handler (the default policy refuses
 * rt_sigaction(SIGSYS) with a handler) but can corrupt the counter in its own
 * memory; treat the number as a diagnostic, not evidence. Calls refused with
 * `errno` rules are not counted by design (expected probes such as clone3). */
uint64_t policy_denied_count(void);
/* Syscall number of the most recent counted denial, -1 if none. */
int policy_denied_last(void);
/* Name of a native syscall number into buf ("?" if unknown). Uses libseccomp's
 * table (allocates): fine in the child once user code is done, not in a
 * signal handler. */
const char *policy_syscall_name(int nr, char *buf, size_t len);
