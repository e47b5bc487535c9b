/* Closing the fds the supervisor did not create, off its loop thread. Runs
 * in forkboxd and in forkbox sandbox's relay; never in the fork server
 * (clone(CLONE_NEWUSER) needs it single-threaded, and it never calls this).
 *
 * Why a thread: close(2) of the last reference to an open file runs the
 * object's release on the closing thread (the final __fput, as task_work on
 * the way back to user space), and some releases wait: a TCP socket with
 * unsent data and SO_LINGER {1, N} waits up to N seconds for its peer (a
 * sandbox's loopback peer that never reads: on d4bf581 the whole daemon
 * stalled 3 s per such fd), a unix socket releases the fds still queued in
 * it (each, in turn, maybe such a socket), a tty drains its output. A
 * sandbox chooses all of that, and can make the supervisor's copy the last
 * one by closing its own first. So every fd the supervisor holds without
 * having made it (the sandbox's seccomp listener, the pidfd_getfd copies of
 * flock.c, a received fd, and where the kernel has no SO_PASSRIGHTS the
 * channel itself: chan_conn.h) is closed here, by one thread that does
 * nothing else. It is safe for any object type by construction, which an
 * abortive close alone is not (it covers TCP only).
 *
 * The loop never waits for it: closer_close() takes a mutex that the thread
 * holds only to move an index (never across a close), appends and signals.
 * A close that takes long stalls only this thread, and the fds queued behind
 * it stay open meanwhile: counted, and logged past CLOSER_SLOW_MS. When
 * CLOSER_QUEUE_MAX fds wait, one more is kept open for good (counted as
 * dropped, logged): a leak bounded by the fd limit, never a blocking close.
 * Before closer_start() (unit tests, fuzz targets) it closes at once. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define CLOSER_ABORT 1u /* a socket: SO_LINGER {1, 0} first, so TCP closes at once
                           (with a reset); for fds a sandbox sent, never its own */
#define CLOSER_DRAIN 2u /* a unix socket: first take out the fds queued in it and
                           close them (CLOSER_ABORT, CLOSER_DRAIN again, a few
                           levels deep), so their last closes are not its release's */

/* Start the thread (every signal blocked in it). 0, or -errno with a
 * reason. Once per process. */
int closer_start(char *err, size_t errlen);
/* Close fd (taken; < 0 is ignored) on the closer thread; flags as above.
 * Never blocks, never fails (see the header comment for a full queue). */
void closer_close(int fd, unsigned flags);

struct closer_counts {
    uint64_t queued;  /* handed over so far */
    uint64_t pending; /* not closed yet */
    uint64_t slow;    /* closes that took CLOSER_SLOW_MS or more */
    uint64_t dropped; /* kept open for good: the queue was full */
};
void closer_get_counts(struct closer_counts *out);
