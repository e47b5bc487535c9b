/* The HTTP request and admission: a connection's first bytes, read and
 * parsed (the parser only once a byte came), then answered (/health,
 * /ready, every refusal logged once by log_refused) or admitted as a turn:
 * the 101, the turn's WebSocket and channel, its slot, its sandbox asked
 * for. Runs in the supervisor.
 *
 * Relies on from_client.c and from_sandbox.c for the handlers an admitted
 * turn reads with (client_handlers, sandbox_handlers), on turn.c to start
 * its statistics and to end it (turn_stats_begin, session_end, mark_dead)
 * and on session.c for what the socket waits for (update_interest). */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "core/buf.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/ratelimit.h"
#include "core/util.h"
#include "net/http.h"
#include "net/ws.h"
#include "session/chan_conn.h"
#include "session/metrics.h"
#include "session/preauth.h"
#include "session/session.h"
#include "session/session_int.h"
#include "session/tenants.h"

#define REPLY_LINGER_MS 1000   /* after a non-101 reply: wait for the peer's EOF */

/* ---------------------------------------------------------------- replies */

static void reply_and_close(struct session *s, int status, const char *reason, const char *body)
{
    if (status >= 400)
        metrics_http_refusal(status);
    buf_reset(&s->out);
    if (http_write_response(&s->out, status, reason, body) < 0) {
        mark_dead(s);
        return;
    }
    http_req_free(s->req);
    s->req = NULL;
    s->phase = PHASE_REPLY;
    s->deadline_ms = now_ms() + REPLY_LINGER_MS;
    preauth_touch(s->env->preauth, &s->pa, PREAUTH_ACTIVE, now_ms());
    update_interest(s);
}

/* The peer's address and port for the operator log ("192.0.2.1:40000",
 * "[2001:db8::1]:40000"), or its pre-auth key once the socket has lost it. */
static void peer_str(const struct session *s, char *out, size_t len)
{
    union sockaddr_any a = {0};
    socklen_t alen = sizeof a;
    char ip[INET6_ADDRSTRLEN];
    if (getpeername(s->fd, &a.sa, &alen) < 0)
        a.sa.sa_family = AF_UNSPEC;
    if (a.sa.sa_family == AF_INET && inet_ntop(AF_INET, &a.in4.sin_addr, ip, sizeof ip)) {
        snprintf(out, len, "%s:%u", ip, ntohs(a.in4.sin_port));
    } else if (a.sa.sa_family == AF_INET6 && inet_ntop(AF_INET6, &a.in6.sin6_addr, ip, sizeof ip)) {
        snprintf(out, len, "[%s]:%u", ip, ntohs(a.in6.sin6_port));
    } else {
        char key[PREAUTH_KEY_STR];
        preauth_key_str(s->pa.key, key);
        snprintf(out, len, "%s", key);
    }
}

/* The one log line of a refused request: what was answered (or "timeout"
 * for a request never completed), to whom, why, and the request's method
 * and target when it had them (peer-chosen bytes: as printable ASCII, cut).
 * Never a header's value: Authorization holds a token, right or wrong.
 * One rate-limited site for every refusal, so a flood of bad requests costs
 * a line a second and a count (core/ratelimit.h). */
void __attribute__((format(printf, 3, 4)))
log_refused(const struct session *s, const char *status, const char *fmt, ...)
{
    char peer[INET6_ADDRSTRLEN + 16], target[132] = "", req[160] = "", why[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    peer_str(s, peer, sizeof peer);
    const char *method = s->req ? http_req_method(s->req) : NULL;
    const char *t = s->req ? http_req_target(s->req) : NULL;
    if (method && t) {
        log_printable(target, sizeof target, t, strlen(t));
        snprintf(req, sizeof req, " (%s \"%s\")", method, target);
    }
    LOG_W_RL("request refused: %s to %s: %s%s", status, peer, why, req);
}

/* Answer a request with an error status, and log it (log_refused). */
static void refuse(struct session *s, int status, const char *phrase, const char *body,
                   const char *why)
{
    char code[8];
    snprintf(code, sizeof code, "%d", status);
    log_refused(s, code, "%s", why);
    reply_and_close(s, status, phrase, body);
}

/* Write what b holds to fd without blocking: -1 on a fatal socket error, 0
 * when everything was written, 1 if bytes remain. (A short HTTP reply only:
 * relays go through an outq.) */
static int send_buf(int fd, struct buf *b)
{
    while (b->len) {
        ssize_t n = send(fd, b->data, b->len, MSG_NOSIGNAL);
        if (n < 0)
            return (errno == EAGAIN || errno == EINTR) ? 1 : -1;
        buf_consume(b, (size_t)n);
    }
    return 0;
}

int flush_out(struct session *s)
{
    return send_buf(s->fd, &s->out);
}

/* ---------------------------------------------------------------- HTTP */

static void admit(struct session *s, struct tenant *tenant, const uint8_t *rest,
                  size_t rest_len)
{
    const struct session_env *env = s->env;
    const char *key = http_req_header(s->req, "Sec-WebSocket-Key");
    buf_reset(&s->out);
    if (http_write_upgrade(&s->out, key) < 0) {
        mark_dead(s);
        return;
    }
    /* The turn's buffers count for its tenant from the first one on
     * (nothing is charged before admission). */
    s->tenant = tenant_hold(tenant);
    s->budget.up = &tenant->budget;
    s->cscan = malloc(sizeof *s->cscan);
    s->sscan = malloc(sizeof *s->sscan);
    s->ws = ws_conn_new(s->fd, &s->budget, rest, rest_len, &client_handlers, s);
    s->chan = chan_conn_new(-1, &s->budget, &sandbox_handlers, s);
    if (!s->ws || !s->cscan || !s->sscan || !s->chan) {
        mark_dead(s);
        return;
    }
    ws_conn_set_window(s->ws, s->window); /* a client that does not read is not read */
    http_req_free(s->req);
    s->req = NULL;
    preauth_remove(env->preauth, &s->pa); /* a turn now: counted by capacity */
    s->holds_slot = true;
    unsigned n_turns = env->admit(env->host, tenant);
    s->phase = PHASE_TURN;
    s->turn = TURN_TOOLS;
    s->accept_ns = now_ns();
    turn_stats_begin(s);
    s->turn_started_ms = s->last_ping_ms = s->idle_since_ms = now_ms();
    int r = env->request_sandbox(env->host, s->id, tenant);
    if (r == 0)
        s->spawn_pending = true;
    else if (r == -EAGAIN)
        s->spawn_deferred = true; /* what the client sends is queued meanwhile */
    if (r < 0 && r != -EAGAIN) {
        session_end(s, 1011, SESSION_REASON_NO_SANDBOX_SERVICE);
        return;
    }
    /* The 101 goes out before anything after it is judged: a close for bad
     * bytes that came with the request must follow it, never come first.
     * Those bytes are not signalled again: read them now, or (the 101 not
     * all out) once it is (on_client_io). */
    int w = flush_out(s);
    if (w < 0) {
        mark_dead(s);
        return;
    }
    if (w == 0 && rest_len > 0 && client_read(s) < 0)
        return;
    LOG_D("turn %" PRIu64 ": admitted for tenant %s (%u/%u, the tenant's %u)", s->id,
          tenant->name, n_turns, env->cfg->capacity, tenant->turns);
    update_interest(s);
}

/* Spec 1.1 routing table, with the slot taken only for a valid upgrade.
 * Malformed requests never get here: http_read answered them 400 (431),
 * a repeated Authorization or other once-only header among them (http.c),
 * even for /health. A wrong Sec-WebSocket-Version is not an upgrade, so it
 * meets 503 and 401 first and then gets 426, which the response writer
 * gives Sec-WebSocket-Version: 13. A tenant's own limit (429) comes after
 * the token that names the tenant, and before 426, as 503 does. */
static void route(struct session *s, const uint8_t *rest, size_t rest_len)
{
    const char *target = http_req_target(s->req);
    if (strcmp(target, "/health") == 0) {
        reply_and_close(s, 200, "OK", "OK\n");
        return;
    }
    /* Readiness for a load balancer, without auth like /health. An upgrade
     * to /ready is still a turn (spec 1.1: every path but /health). */
    if (strcmp(target, "/ready") == 0 && !http_req_is_websocket_upgrade(s->req)) {
        const char *why = s->env->not_ready(s->env->host);
        if (why)
            reply_and_close(s, 503, "Service Unavailable", why);
        else
            reply_and_close(s, 200, "OK", "Ready\n");
        return;
    }
    const char *auth = http_req_header(s->req, "Authorization");
    struct tenant *tenant = NULL;
    int ok = s->env->may_admit(s->env->host, auth, &tenant);
    if (ok == -EBUSY) {
        refuse(s, 503, "Service Unavailable", "Busy\n", "busy: no turn slot free (--capacity)");
        return;
    }
    if (ok == -ESHUTDOWN) {
        refuse(s, 503, "Service Unavailable", "Shutting down\n", "draining: the daemon is stopping");
        return;
    }
    if (ok == -EUSERS) {
        char body[96], why[160];
        unsigned cap = s->env->cfg->tenant_capacity;
        snprintf(body, sizeof body, "Tenant busy: at most %u turns at once (tenant-capacity)\n",
                 cap);
        snprintf(why, sizeof why, "tenant %s holds %u turns (--tenant-capacity)", tenant->name,
                 cap);
        metrics_tenant_refused(&tenant->metrics);
        refuse(s, 429, "Too Many Requests", body, why);
        return;
    }
    if (ok < 0) {
        refuse(s, 401, "Unauthorized", "Unauthorized\n",
               auth ? "bad token (Authorization matches no token)" : "no Authorization header");
        return;
    }
    if (!http_req_is_websocket_upgrade(s->req)) {
        refuse(s, 426, "Upgrade Required", "Upgrade Required\n",
               "not a WebSocket upgrade (RFC 6455 4.2.1 headers)");
        return;
    }
    admit(s, tenant, rest, rest_len);
}

void request_read(struct session *s)
{
    uint8_t tmp[4096];
    ssize_t n = recv(s->fd, tmp, sizeof tmp, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) { /* a port probe or a client that gave up: nothing to answer */
        mark_dead(s);
        return;
    }
    /* The parser's state (~34 KiB) only for connections that send something:
     * a flood of silent ones costs the pool little memory. */
    if (!s->req && !(s->req = http_req_new())) {
        mark_dead(s);
        return;
    }
    size_t used = 0;
    int r = http_req_feed(s->req, tmp, (size_t)n, &used);
    if (r == 0) {
        preauth_touch(s->env->preauth, &s->pa, PREAUTH_ACTIVE, now_ms());
        return;
    }
    if (r == -E2BIG) {
        char why[96];
        snprintf(why, sizeof why, "request too large (over %llu bytes or %d headers)",
                 (unsigned long long)HTTP_MAX_REQUEST_BYTES, HTTP_MAX_HEADERS);
        refuse(s, 431, "Request Header Fields Too Large", "Request Too Large\n", why);
    } else if (r < 0)
        refuse(s, 400, "Bad Request", "Bad Request\n", "malformed HTTP request");
    else
        route(s, tmp + used, (size_t)n - used);
}
