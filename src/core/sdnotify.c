/* sd_notify(3)'s datagram protocol (see sdnotify.h). Runs in the supervisor. */
#include "core/sdnotify.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/util.h"

#define SDNOTIFY_SEND_TIMEOUT_MS 1000 /* a blocking send waits at most this long */

static void forget_env(void)
{
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
}

int sdnotify_open(struct sdnotify *n, char *err, size_t errlen)
{
    memset(n, 0, sizeof *n);
    n->fd = -1;
    const char *sock = getenv("NOTIFY_SOCKET");
    const char *wd_usec = getenv("WATCHDOG_USEC");
    const char *wd_pid = getenv("WATCHDOG_PID");
    /* Everything is read into locals first: the variables go before any
     * return, so no path below leaves them for a child to find. */
    char path[sizeof n->addr.sun_path + 1] = "", wd_text[32] = "";
    uint64_t usec = 0, pid = 0;
    bool had_sock = sock != NULL, bad_wd = false;
    size_t sock_len = sock ? strlen(sock) : 0;
    if (sock)
        snprintf(path, sizeof path, "%s", sock);
    if (wd_usec) {
        snprintf(wd_text, sizeof wd_text, "%s", wd_usec);
        bad_wd = parse_u64(wd_usec, UINT64_MAX / 1000, &usec) < 0 || usec == 0;
    }
    /* WATCHDOG_PID names the process the watchdog is meant for: when it is
     * not us (the variable leaked to a child of the manager's main process),
     * the watchdog is not ours to ping. */
    if (wd_pid && (parse_u64(wd_pid, INT32_MAX, &pid) < 0 || (pid_t)pid != getpid()))
        usec = 0;
    forget_env();
    if (!had_sock)
        return 0;

    if (sock_len < 2 || (path[0] != '/' && path[0] != '@'))
        return err_fmt(err, errlen, -EAFNOSUPPORT,
                       "NOTIFY_SOCKET: not an absolute path or @abstract name: %s", path);
    if (sock_len > sizeof n->addr.sun_path)
        return err_fmt(err, errlen, -ENAMETOOLONG, "NOTIFY_SOCKET: too long");
    n->addr.sun_family = AF_UNIX;
    memcpy(n->addr.sun_path, path, sock_len);
    if (path[0] == '@')
        n->addr.sun_path[0] = '\0'; /* abstract: the length, not a NUL, ends the name */
    n->addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + sock_len);
    n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (n->fd < 0)
        return err_errno(err, errlen, "NOTIFY_SOCKET: socket");
    struct timeval tv = {.tv_sec = SDNOTIFY_SEND_TIMEOUT_MS / 1000,
                         .tv_usec = SDNOTIFY_SEND_TIMEOUT_MS % 1000 * 1000};
    setsockopt(n->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    n->watchdog_ms = usec / 1000;
    if (usec && n->watchdog_ms == 0)
        n->watchdog_ms = 1;
    n->next_watchdog_ms = now_ms() + n->watchdog_ms / 2;
    if (bad_wd)
        return err_fmt(err, errlen, -EINVAL, "WATCHDOG_USEC: not a positive number: %s", wd_text);
    return 0;
}

int sdnotify_send(struct sdnotify *n, const char *msg, bool blocking)
{
    if (n->fd < 0)
        return 0;
    ssize_t r;
    do
        r = sendto(n->fd, msg, strlen(msg), MSG_NOSIGNAL | (blocking ? 0 : MSG_DONTWAIT),
                   (const struct sockaddr *)&n->addr, n->addr_len);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : 0;
}

int sdnotify_ready(struct sdnotify *n, const char *status, uint64_t now)
{
    char msg[sizeof n->status + 16];
    snprintf(msg, sizeof msg, "READY=1\nSTATUS=%s", status);
    int r = sdnotify_send(n, msg, true);
    if (r == 0) {
        snprintf(n->status, sizeof n->status, "%s", status);
        n->status_sent_ms = now;
    }
    return r;
}

void sdnotify_stopping(struct sdnotify *n, const char *status, uint64_t now)
{
    if (n->fd < 0 || n->stopping_sent)
        return;
    char msg[sizeof n->status + 16];
    snprintf(msg, sizeof msg, "STOPPING=1\nSTATUS=%s", status);
    if (sdnotify_send(n, msg, true) == 0) {
        n->stopping_sent = true;
        snprintf(n->status, sizeof n->status, "%s", status);
        n->status_sent_ms = now;
    }
}

void sdnotify_status(struct sdnotify *n, const char *status, uint64_t now, uint64_t min_interval_ms)
{
    if (n->fd < 0 || strcmp(status, n->status) == 0)
        return;
    if (n->status[0] && now - n->status_sent_ms < min_interval_ms)
        return;
    char msg[sizeof n->status + 8];
    snprintf(msg, sizeof msg, "STATUS=%s", status);
    if (sdnotify_send(n, msg, false) < 0)
        return; /* retried on the next call: status still differs */
    snprintf(n->status, sizeof n->status, "%s", status);
    n->status_sent_ms = now;
}

void sdnotify_watchdog(struct sdnotify *n, uint64_t now)
{
    if (n->fd < 0 || !n->watchdog_ms || now < n->next_watchdog_ms)
        return;
    if (sdnotify_send(n, "WATCHDOG=1", false) == 0)
        n->next_watchdog_ms = now + n->watchdog_ms / 2;
}

void sdnotify_close(struct sdnotify *n)
{
    if (n->fd >= 0)
        close(n->fd);
    n->fd = -1;
}
