/* A thread that watches the event loop from outside. Runs in forkboxd.
 *
 * The loop reads its signals through a signalfd, so a loop stuck in one
 * call (a system call that sleeps on something a peer controls, a bug
 * that spins) never sees SIGTERM either: systemd would wait for its
 * TimeoutStopSec and then kill, and a terminal's ^C would do nothing. This
 * thread looks at the loop's progress (loop_progress) once a second. A loop
 * that has been in the same call for LOOP_STUCK_LOG_S seconds (not asleep
 * in epoll_wait) is logged once, with what it is running; one that has
 * been stuck LOOP_STUCK_EXIT_S seconds while SIGTERM or SIGINT is pending
 * makes the process exit with status 1 (the fork server dies with it, by
 * its parent-death signal, and its sandboxes with it). */
#pragma once
#include <stddef.h>

struct loop;

/* Start watching l (borrowed: must outlive the process). 0, or -errno with
 * a reason. */
int loop_watchdog_start(struct loop *l, char *err, size_t errlen);
