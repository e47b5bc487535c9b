/* flock(2) for a sandbox, carried out by the supervisor (forkboxd).
 *
 * Sandboxes share inodes with the host and with each other (/usr, the /etc
 * files, --site-packages dirs, device nodes, the read-only root, and the one
 * anonymous inode behind every eventfd and epoll fd). A flock on one of them
 * would block other turns and host processes that lock the same file, and
 * pass bits between turns. seccomp cannot see which file an fd is, so the
 * policy says `supervise flock`: every flock is a user notification on the
 * turn's listener, and this file answers it.
 *
 * For each call: the caller's open file is fetched with pidfd_getfd (after
 * SECCOMP_IOCTL_NOTIF_ID_VALID has ruled out a reused pid). A file on the
 * sandbox's own scratch tmpfs (/workspace, /tmp, /dev/shm; its device is
 * looked up once per turn through /proc/PID/root), in `forkbox sandbox` on
 * the FUSE mount of the host's workspace (its server offers no locks, so
 * the kernel keeps them among the mount's users: the sandbox's processes),
 * a pipe, a socket or a memfd is locked by the supervisor on that
 * duplicate: flock locks
 * belong to the open file description, so this is exactly the caller's lock,
 * and no later change of the caller's fd table can redirect it (the call is
 * never let through with SECCOMP_USER_NOTIF_FLAG_CONTINUE). Anything else is
 * refused with ENOLCK (as a filesystem without locks does) and counted as a
 * refusal; LOCK_UN there succeeds, since no lock can be held.
 *
 * The event loop never blocks: locks are tried with LOCK_NB, and the copies
 * are closed by the closer thread (loop/closer.h: the caller may have closed
 * its own fd meanwhile, and then ours is the last reference, whose close can
 * wait on the object, e.g. a lingering socket). A blocking call
 * that would block is parked and retried on a timer (FLOCK_RETRY_MIN_MS
 * doubling to FLOCK_RETRY_MAX_MS) until it is granted or its request is no
 * longer pending (the caller was interrupted by a signal or died); at most
 * FLOCK_MAX_PARKED per turn, one more gets ENOLCK. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "loop/loop.h"

struct policy_notify;
struct seccomp_notif;
struct flock_wait; /* a parked call (flock.c) */

/* What this file needs of the turn whose listener it answers on. The owner
 * of the listener (notify.c) fills it in and is told through the two
 * callbacks; flock.c never sees the owner's struct, so the calls go one way
 * (notify.c -> flock.c). */
struct flock_turn {
    uint64_t turn_id;             /* for log lines */
    struct loop *loop;            /* borrowed: the retry timer's loop */
    struct policy_notify *table;  /* borrowed: for answering (policy_notify_reply) */
    const int *listener;          /* borrowed: the owner's listener fd; -1 once dropped */
    const char *workspace;        /* borrowed: `forkbox sandbox`'s workspace path, where
                                     the host's directory is mounted through FUSE; NULL */
    /* A flock refused on a shared file (ENOLCK): count it as a refusal of nr. */
    void (*count_refusal)(void *owner, int nr);
    /* An answer on the listener failed with err: stop using the listener.
     * The owner calls flock_close() while doing so. */
    void (*listener_failed)(void *owner, int err);
    void *owner;                  /* borrowed: the callbacks' first argument */
};

/* Per turn, embedded in the listener's owner (struct notify_turn), which
 * must not move: the timer's watch must live as long as the session, since
 * the loop may still hold an event for it in the batch that ends the turn. */
struct flock_state {
    struct flock_turn turn;       /* a copy, from flock_init */
    struct flock_wait *w;         /* owned: FLOCK_MAX_PARKED slots, from the first park */
    unsigned n;                   /* parked calls, w[0..n) */
    int timer_fd;                 /* owned when timer_on: retries */
    bool timer_on;
    struct loop_watch timer_watch;
    bool warned;                  /* "cannot fetch the caller's fd" logged this turn */
    bool scratch_known;           /* scratch_dev and work_dev were looked up this turn */
    dev_t scratch_dev;            /* st_dev of the sandbox's /workspace, /tmp, /dev/shm */
    dev_t work_dev;               /* st_dev of turn.workspace's mount; (dev_t)-1 */
};

/* Set f up for a turn (idle: nothing parked, no timer). turn is copied;
 * what it points to is borrowed and must outlive f. */
void flock_init(struct flock_state *f, const struct flock_turn *turn);
/* Answer (or park) the flock request req received on the turn's listener.
 * 0, or -errno when the listener failed (the caller then stops using it). */
int flock_handle(struct flock_state *f, const struct seccomp_notif *req);
/* The turn is over: drop parked calls (their callers are being killed; the
 * listener's close makes their calls fail) and the timer. Idempotent. */
void flock_close(struct flock_state *f);
