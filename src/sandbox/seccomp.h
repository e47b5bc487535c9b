/* seccomp policy: a text file in policy/ -> libseccomp -> BPF, compiled once
 * in the fork server at start; each sandbox only loads the BPF as its last
 * step before user code. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sbx_policy; /* opaque: the compiled filter plus its source summary */

/* Parse and compile path for the native architecture, refusing foreign ABIs
 * (x32, i386 via int 0x80). 0, or -EINVAL with "file:line: reason" in err
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

/* Name of a native syscall number into buf ("?" if unknown). Uses libseccomp's
 * table (allocates). */
const char *policy_syscall_name(int nr, char *buf, size_t len);

/* --- answering counted refusals, outside the sandbox ---
 *
 * The listener's holder (the supervisor; the unit test) answers each counted
 * refusal with the errno the policy names for that syscall and never lets a
 * call through. The errno table comes from parsing the same policy file (no
 * compiling: the holder has no filter of its own). */
struct policy_notify; /* errno per syscall, notification buffers sized by the kernel */

/* Parse path and size the buffers (seccomp(SECCOMP_GET_NOTIF_SIZES)). 0, or
 * -errno with "file:line: reason" or the failing call in err. */
int policy_notify_load(const char *path, struct policy_notify **out, char *err, size_t errlen);
void policy_notify_free(struct policy_notify *n);
/* The errno a counted refusal of native syscall nr returns (never 0). */
int policy_notify_errno(const struct policy_notify *n, int nr);

enum policy_notify_result {
    POLICY_NOTIFY_NONE = 0,     /* nothing pending */
    POLICY_NOTIFY_ANSWERED = 1, /* one call refused: *nr (-1 if not a native number), *pid */
    POLICY_NOTIFY_GONE = 2,     /* a pending call went away (its task was killed or
                                   interrupted) before the answer: not refused by us */
    POLICY_NOTIFY_SUPERVISE = 3,/* a `supervise`d call (*nr, *pid) waits for the holder to
                                   carry it out: policy_notify_request(), then answer it
                                   with policy_notify_reply() */
};
/* Take at most one pending notification on listener and answer it if it is
 * a counted refusal. Never blocks: polls first, and
 * SECCOMP_IOCTL_NOTIF_RECV after POLLIN finds its request (the holder is the
 * only reader). A enum policy_notify_result, -EPIPE when no task uses the
 * filter any more (the sandbox is gone), or -errno. *pid is the caller's pid
 * as the holder sees it. */
int policy_notify_answer(struct policy_notify *n, int listener, int *nr, int *pid);

struct seccomp_notif;
/* The request policy_notify_answer() last received (borrowed; overwritten by
 * the next call): for POLICY_NOTIFY_SUPERVISE, its id, pid and arguments. */
const struct seccomp_notif *policy_notify_request(const struct policy_notify *n);
/* Answer request id: err 0 returns val to the caller, else -1 with errno err.
 * Never lets the call run (no SECCOMP_USER_NOTIF_FLAG_CONTINUE). 0,
 * POLICY_NOTIFY_GONE if the request is no longer pending (its task was
 * interrupted or killed), or -errno. */
int policy_notify_reply(struct policy_notify *n, int listener, uint64_t id, int64_t val, int err);
/* Whether request id is still pending (its task is blocked in the call). */
bool policy_notify_valid(int listener, uint64_t id);
/* A duplicate (O_CLOEXEC) of the calling task's fd target_fd: the same open
 * file description, so what is done on it (flock) is done on the caller's.
 * pidfd_open on the request's pid, then SECCOMP_IOCTL_NOTIF_ID_VALID proves
 * the pid still names the waiting caller (not a reused pid), then
 * pidfd_getfd. The fd or -errno: -EBADF if the caller has no such fd, -ESRCH
 * if the request is gone, -EPERM if the holder may not ptrace the caller. */
int policy_notify_getfd(int listener, const struct seccomp_notif *req, int target_fd);
