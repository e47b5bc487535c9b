/* systemd's readiness protocol (sd_notify(3)), without libsystemd. Used by
 * the supervisor only (main.c opens it, server.c sends through it); the fork
 * server and the sandboxes never link or see any of it.
 *
 * The protocol is one datagram per notification, "NAME=value" lines, sent to
 * the AF_UNIX socket named by $NOTIFY_SOCKET (a path, or an abstract name
 * written with a leading '@'). The manager takes the sender's credentials
 * from the kernel, so nothing else is needed. libsystemd is not linked:
 * it is ~1 MB of code for these few lines, and whatever forkboxd links is
 * also mapped while it parses what the network sends. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

struct sdnotify {
    int fd;                       /* owned; -1 when not started by a notify-aware manager */
    struct sockaddr_un addr;      /* $NOTIFY_SOCKET, '@' turned into the abstract NUL */
    socklen_t addr_len;
    uint64_t watchdog_ms;         /* $WATCHDOG_USEC in ms (0 = no watchdog): ping at half */
    uint64_t next_watchdog_ms;    /* when the next WATCHDOG=1 is due (CLOCK_MONOTONIC) */
    uint64_t status_sent_ms;      /* when STATUS= was last sent */
    char status[128];             /* the STATUS= text last sent ("" = none yet) */
    bool stopping_sent;           /* STOPPING=1 went out (it is sent once) */
};

/* Read $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID and remove all three
 * from the environment, whatever they hold (a child must not ping for us).
 * Not set: n->fd = -1 and every other call is a no-op. 0, or -errno with a
 * reason in err for a value that cannot be used (the caller logs it and goes
 * on without notifications: a readiness protocol is not worth refusing to
 * serve, and a Type=notify unit then fails by its own start timeout). */
int sdnotify_open(struct sdnotify *n, char *err, size_t errlen);
/* Send msg (newline-separated assignments) as one datagram. blocking: wait
 * (at most a second) if the manager's queue is full, for READY=1 and
 * STOPPING=1; otherwise a full queue drops it (STATUS=, WATCHDOG=1: the next
 * tick sends again). 0, or -errno. */
int sdnotify_send(struct sdnotify *n, const char *msg, bool blocking);
/* READY=1 with the first STATUS=, in one datagram (blocking). 0 or -errno. */
int sdnotify_ready(struct sdnotify *n, const char *status, uint64_t now);
/* STOPPING=1 with STATUS=status, once (blocking; repeated calls do nothing). */
void sdnotify_stopping(struct sdnotify *n, const char *status, uint64_t now);
/* STATUS=status, if it differs from the last one sent and at least
 * min_interval_ms has passed since (0: whenever it differs). */
void sdnotify_status(struct sdnotify *n, const char *status, uint64_t now, uint64_t min_interval_ms);
/* WATCHDOG=1 if the watchdog is on and half its interval has passed. */
void sdnotify_watchdog(struct sdnotify *n, uint64_t now);
void sdnotify_close(struct sdnotify *n);
