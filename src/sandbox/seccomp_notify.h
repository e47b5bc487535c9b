/* Runs in the supervisor (forkboxd; and test_policy): answering counted
 * refusals, outside the sandbox. The filter is compiled and installed by
 * seccomp.h's functions in the fork server and the child.
 *
 * The listener's holder (the supervisor; the unit test) answers each counted
 * refusal with the errno the policy names for that syscall and never lets a
 * call through. The errno table comes from parsing the same policy file (no
 * compiling: the holder has no filter of its own). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
