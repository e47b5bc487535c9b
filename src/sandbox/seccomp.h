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
