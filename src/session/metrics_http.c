/* --metrics-listen: the scrape endpoint (see metrics_http.h). Runs in the
 * supervisor. */
#include "session/metrics_http.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/log.h"
#include "core/ratelimit.h"
#include "core/util.h"
#include "net/http.h"
#include "session/metrics.h"

#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define METRICS_MAX_RESPONSE_BYTES (4 * MiB) /* a few KiB in practice */

static void conn_close(struct metrics_conn *c)
{
    if (c->fd < 0)
        return;
    loop_unwatch(c->mh->loop, &c->watch);
    close_and_reset(&c->fd);
    http_req_free(c->req);
    c->req = NULL;
    buf_free(&c->out);
}

/* Queue the answer and start writing it. */
static void conn_reply(struct metrics_conn *c, int status, const char *reason, bool head)
{
    struct buf body;
    buf_init(&body, METRICS_MAX_RESPONSE_BYTES);
    int r = 0;
    if (status == 200)
        r = metrics_write(&body);
    else
        r = buf_printf(&body, "%s\n", reason);
    r = r ? r : http_write_response_typed(&c->out, status, reason,
                                          status == 200 ? METRICS_CONTENT_TYPE
                                                        : "text/plain; charset=utf-8",
                                          body.data, body.len);
    if (r == 0 && head) {
        /* HEAD: the headers (Content-Length says the body's size) only. */
        const uint8_t *end = memmem(c->out.data, c->out.len, "\r\n\r\n", 4);
        if (end)
            c->out.len = (size_t)(end + 4 - c->out.data);
    }
    buf_free(&body);
    http_req_free(c->req);
    c->req = NULL;
    if (r < 0) {
        LOG_W_RL("metrics: cannot build the answer: %s", strerror(-r));
        conn_close(c);
        return;
    }
    loop_watch(c->mh->loop, &c->watch, EPOLLOUT);
}

static void route(struct metrics_conn *c)
{
    const char *method = http_req_method(c->req);
    const char *target = http_req_target(c->req);
    size_t plen = strcspn(target, "?");
    bool get = strcmp(method, "GET") == 0, head = strcmp(method, "HEAD") == 0;
    if (plen != strlen("/metrics") || strncmp(target, "/metrics", plen) != 0)
        conn_reply(c, 404, "Not Found", head);
    else if (!get && !head)
        conn_reply(c, 405, "Method Not Allowed", false);
    else
        conn_reply(c, 200, "OK", head);
}

static void conn_read(struct metrics_conn *c)
{
    uint8_t tmp[1024];
    ssize_t n = recv(c->fd, tmp, sizeof tmp, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        conn_close(c);
        return;
    }
    c->got += (size_t)n;
    size_t used = 0;
    int r = c->got > METRICS_MAX_REQUEST_BYTES ? -E2BIG
                                               : http_req_feed(c->req, tmp, (size_t)n, &used);
    if (r == 0)
        return;
    if (r == -E2BIG)
        conn_reply(c, 431, "Request Header Fields Too Large", false);
    else if (r < 0)
        conn_reply(c, 400, "Bad Request", false);
    else
        route(c);
}

static void conn_write(struct metrics_conn *c)
{
    while (c->out.len) {
        ssize_t n = send(c->fd, c->out.data, c->out.len, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        if (n < 0) {
            conn_close(c);
            return;
        }
        buf_consume(&c->out, (size_t)n);
    }
    /* All written; the request was read to its end, so closing now sends
     * no reset over the answer. */
    shutdown(c->fd, SHUT_WR);
    conn_close(c);
}

static void on_conn(struct loop_watch *w, uint32_t events)
{
    struct metrics_conn *c = w->ud;
    if (c->req)
        conn_read(c);
    else
        conn_write(c);
}

/* A free slot, or the one accepted longest ago (closed for the new one). */
static struct metrics_conn *slot(struct metrics_http *mh)
{
    struct metrics_conn *oldest = &mh->conn[0];
    for (size_t i = 0; i < METRICS_MAX_CONNECTIONS; i++) {
        if (mh->conn[i].fd < 0)
            return &mh->conn[i];
        if (mh->conn[i].deadline_ms < oldest->deadline_ms)
            oldest = &mh->conn[i];
    }
    LOG_W_RL("metrics: %d scrapes at once; closed the oldest", METRICS_MAX_CONNECTIONS);
    conn_close(oldest);
    return oldest;
}

static void on_accept(struct loop_watch *w, uint32_t events)
{
    struct metrics_http *mh = w->ud;
    for (int i = 0; i < METRICS_MAX_CONNECTIONS; i++) {
        bool reserved; /* served all the same: the slots bound what it holds */
        int fd = accept_reserved(mh->fd, NULL, NULL, &reserved);
        if (fd == -EMFILE || fd == -ENFILE || fd == -ENOBUFS || fd == -ENOMEM) {
            LOG_W_RL("metrics: accept: %s (pausing until the next tick)", errno_reason(-fd));
            loop_watch(mh->loop, &mh->watch, 0);
            mh->paused = true;
            return;
        }
        if (fd < 0) {
            if (fd != -EAGAIN && fd != -EINTR && fd != -ECONNABORTED)
                LOG_W_RL("metrics: accept: %s", strerror(-fd));
            return;
        }
        struct metrics_conn *c = slot(mh);
        *c = (struct metrics_conn){.mh = mh, .fd = fd,
                                   .deadline_ms = now_ms() + METRICS_CONN_TIMEOUT_MS};
        buf_init(&c->out, METRICS_MAX_RESPONSE_BYTES + 4 * KiB);
        c->watch = (struct loop_watch){.fd = fd, .cb = on_conn, .ud = c,
                                       .name = "metrics connection"};
        c->req = http_req_new();
        if (!c->req || loop_watch(mh->loop, &c->watch, EPOLLIN) < 0)
            conn_close(c);
    }
}

void metrics_http_init(struct metrics_http *mh)
{
    memset(mh, 0, sizeof *mh);
    mh->fd = -1;
    for (size_t i = 0; i < METRICS_MAX_CONNECTIONS; i++)
        mh->conn[i].fd = -1;
}

int metrics_http_start(struct metrics_http *mh, struct loop *loop, const char *host,
                       uint16_t port, uint16_t *bound_port, char *err, size_t errlen)
{
    metrics_http_init(mh);
    mh->loop = loop;
    int fd = tcp_listen(host, port, bound_port);
    if (fd < 0)
        return err_fmt(err, errlen, fd, "--metrics-listen %s:%u: %s", host, port,
                       fd == -EINVAL ? "not a numeric address" : strerror(-fd));
    mh->fd = fd;
    mh->watch = (struct loop_watch){.fd = fd, .cb = on_accept, .ud = mh,
                                    .name = "metrics listener"};
    int r = loop_watch(loop, &mh->watch, EPOLLIN);
    if (r < 0) {
        close_and_reset(&mh->fd);
        return err_fmt(err, errlen, r, "--metrics-listen: epoll: %s", strerror(-r));
    }
    return 0;
}

void metrics_http_tick(struct metrics_http *mh, uint64_t now)
{
    for (size_t i = 0; i < METRICS_MAX_CONNECTIONS; i++)
        if (mh->conn[i].fd >= 0 && now >= mh->conn[i].deadline_ms)
            conn_close(&mh->conn[i]);
    if (mh->paused && mh->fd >= 0) {
        mh->paused = false;
        loop_watch(mh->loop, &mh->watch, EPOLLIN);
    }
}

void metrics_http_stop(struct metrics_http *mh)
{
    for (size_t i = 0; i < METRICS_MAX_CONNECTIONS; i++)
        conn_close(&mh->conn[i]);
    if (mh->fd >= 0) {
        if (mh->loop)
            loop_unwatch(mh->loop, &mh->watch);
        close_and_reset(&mh->fd);
    }
}
