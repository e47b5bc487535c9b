/* Counted refusals and supervised calls: the supervisor's side of the
 * sandbox's seccomp listener.
 *
 * A counted refusal (`deny`, `default deny`) stops the calling task in the
 * kernel and queues a notification on the listener, which the sandbox sent
 * as its first channel message (CHAN_NOTIFY, SCM_RIGHTS) and closed before
 * any untrusted code ran. The supervisor holds it for the turn: each
 * notification is counted per syscall and answered with the policy's errno
 * for that syscall (never "let it run"). The count is logged when the turn
 * ends; each refusal at debug level. A `supervise`d call (flock) goes to its
 * handler (flock.c), which carries it out on the caller's behalf.
 *
 * Non-blocking throughout: answering polls first (policy_notify_answer), and
 * one wakeup answers at most NOTIFY_BATCH calls so a sandbox that does
 * nothing but refused calls cannot starve the other turns. */
#pragma once

struct session;

#define NOTIFY_BATCH 64

/* Take ownership of listener fd and start answering it (needs the server's
 * errno table; without one the fd is closed and refused calls get ENOSYS). */
void notify_adopt(struct session *s, int fd);
/* The turn is over: log its count (info, when anything was refused) and
 * close the listener (calls still waiting get ENOSYS; the sandbox is being
 * killed). Idempotent. */
void notify_close(struct session *s);
/* Count one refusal of native syscall nr (for the turn's summary); the
 * caller logs it. */
void notify_count_refusal(struct session *s, int nr);
/* The listener failed with err: warn, stop answering and close it (calls
 * still waiting and any later ones get ENOSYS). Idempotent. */
void notify_listener_failed(struct session *s, int err);
