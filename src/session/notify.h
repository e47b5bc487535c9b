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
#include <stdint.h>

#include "loop/loop.h"
#include "session/flock.h"

struct policy_notify;

#define NOTIFY_BATCH 64

/* One turn's listener, embedded in its session (session_int.h), which must not
 * move it: everything this module uses, so it does not reach into the
 * session. flock.c gets what it needs as a struct flock_turn. */
struct notify_turn {
    uint64_t turn_id;             /* for log lines */
    struct loop *loop;            /* borrowed */
    struct policy_notify *table;  /* borrowed: errno per syscall (the policy file, parsed);
                                     NULL without isolation */
    int fd;                       /* owned: the sandbox's seccomp listener, -1 */
    struct loop_watch watch;
    uint64_t refused;             /* counted refusals answered this turn */
    uint32_t *refused_by_nr;      /* owned: per native syscall, from the first refusal */
    struct flock_state flock;     /* flock calls carried out for the sandbox (flock.c) */
};

/* Set t up for a turn, with no listener yet. */
void notify_turn_init(struct notify_turn *t, uint64_t turn_id, struct loop *loop,
                      struct policy_notify *table);
/* `forkbox sandbox`: the workspace's path in the sandbox (borrowed, must
 * outlive t), whose FUSE mount flock.c lets the sandbox lock files on. */
void notify_turn_workspace(struct notify_turn *t, const char *path);
/* Start answering the listener fd. Takes fd, on failure too: without the
 * errno table, or if it cannot be watched, it is closed here and refused
 * calls get ENOSYS. */
void notify_adopt(struct notify_turn *t, int fd);
/* The turn is over: log its count (info, when anything was refused) and
 * close the listener (calls still waiting get ENOSYS; the sandbox is being
 * killed). Idempotent. */
void notify_close(struct notify_turn *t);
