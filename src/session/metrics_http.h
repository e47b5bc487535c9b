/* --metrics-listen: GET /metrics on a listener of its own, in the
 * supervisor's event loop. Runs in the supervisor.
 *
 * A scraper must never hold up a turn: everything is non-blocking, at most
 * METRICS_MAX_CONNECTIONS connections are served at once (one more closes
 * the oldest), each has METRICS_CONN_TIMEOUT_MS from accept to its last
 * byte, and its request may be at most METRICS_MAX_REQUEST_BYTES (core/
 * limits.h). The request is parsed by net/http.c, as the public port's is.
 * Answers: 200 with the text format for GET (or HEAD) /metrics, 404 for any
 * other path, 405 for another method, 400/431 for a bad or large request.
 * Out of fds, a scrape is served from the fd reserve (core/util.h: at most
 * METRICS_MAX_CONNECTIONS of it); with not even that, the listener rests
 * until the next tick instead of waking the loop again at once. No token:
 * bind it where only the scraper reaches (loopback, a private interface),
 * as for any Prometheus exporter. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/limits.h"
#include "loop/loop.h"

struct http_req;
struct metrics_http;

struct metrics_conn {
    struct metrics_http *mh;      /* borrowed: its listener */
    int fd;                       /* owned; -1 = slot free */
    struct loop_watch watch;
    struct http_req *req;         /* owned while the request is read */
    size_t got;                   /* request bytes read */
    struct buf out;               /* the response, as it is written */
    uint64_t deadline_ms;         /* closed then, whatever is left */
};

struct metrics_http {
    struct loop *loop;            /* borrowed */
    int fd;                       /* owned: the listener; -1 = off */
    struct loop_watch watch;
    bool paused;                  /* out of fds: not watched until the next tick */
    struct metrics_conn conn[METRICS_MAX_CONNECTIONS];
};

/* Off, with nothing to free (metrics_http_stop is safe after it). */
void metrics_http_init(struct metrics_http *mh);
/* Listen on host:port and serve from loop. *bound_port gets the port. 0, or
 * -errno with a reason in err. */
int metrics_http_start(struct metrics_http *mh, struct loop *loop, const char *host,
                       uint16_t port, uint16_t *bound_port, char *err, size_t errlen);
/* Close connections past their deadline, watch a listener that rested
 * again (call from the server's tick). */
void metrics_http_tick(struct metrics_http *mh, uint64_t now_ms);
/* Close the listener and every connection. Idempotent. */
void metrics_http_stop(struct metrics_http *mh);
