/* forkbox-bench: the client side of one turn: the HTTP upgrade (OpenSSL libcrypto for the
 * key/accept check), WebSocket framing with wslay on a non-blocking socket, and the protocol's
 * state machine (ready, blocks, tool calls answered at once, done/output/snapshot; wire protocol
 * v2). driver.c's epoll loop calls in here. Runs in the forkbox-bench process. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <wslay/wslay.h>

#include "bench.h"

#define MAX_MSG (256u * 1024 * 1024) /* §1.4 */
#define WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

/* Randomness: WebSocket masks and keys come from getrandom(), a page at a time. */
static uint8_t rnd_pool[4096];
static size_t rnd_left;

static void rnd_bytes(uint8_t *out, size_t n)
{
    while (n) {
        if (!rnd_left) {
            size_t got = 0;
            while (got < sizeof rnd_pool) {
                ssize_t r = getrandom(rnd_pool + got, sizeof rnd_pool - got, 0);
                if (r < 0 && errno != EINTR) {
                    perror("forkbox-bench: getrandom");
                    exit(1);
                }
                got += r > 0 ? (size_t)r : 0;
            }
            rnd_left = sizeof rnd_pool;
        }
        size_t k = n < rnd_left ? n : rnd_left;
        memcpy(out, rnd_pool + sizeof rnd_pool - rnd_left, k);
        rnd_left -= k;
        out += k;
        n -= k;
    }
}

static const char shutdown_frame[] = "{\"kind\":\"shutdown\"}\n";

void conn_fail(struct conn *c, const char *fmt, ...)
{
    if (c->failed)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    c->failed = true;
}

static ssize_t ws_recv_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags,
                          void *user)
{
    struct conn *c = user;
    if (c->pre_off < c->hlen) { /* frames that arrived with the 101 */
        size_t k = c->hlen - c->pre_off < len ? c->hlen - c->pre_off : len;
        memcpy(buf, c->hbuf + c->pre_off, k);
        c->pre_off += k;
        return (ssize_t)k;
    }
    ssize_t r;
    while ((r = recv(c->fd, buf, len, 0)) < 0 && errno == EINTR)
        ;
    if (r > 0)
        return r;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
        return -1;
    }
    c->eof = true;
    if (r < 0 && c->st != C_CLOSING)
        conn_fail(c, "recv: %s", strerror(errno));
    wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
    return -1;
}

static ssize_t ws_send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len,
                          int flags, void *user)
{
    struct conn *c = user;
    ssize_t r;
    while ((r = send(c->fd, data, len, MSG_NOSIGNAL)) < 0 && errno == EINTR)
        ;
    if (r >= 0)
        return r;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
    else {
        if (c->st != C_CLOSING)
            conn_fail(c, "send: %s", strerror(errno));
        wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
    }
    return -1;
}

static int ws_genmask_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, void *user)
{
    rnd_bytes(buf, len);
    return 0;
}

static void queue(struct conn *c, uint8_t opcode, const void *p, size_t n)
{
    struct wslay_event_msg m = {.opcode = opcode, .msg = p, .msg_length = n};
    int r = wslay_event_queue_msg(c->ws, &m);
    if (r != 0)
        conn_fail(c, "wslay_event_queue_msg: %d", r);
}

void start_block(struct conn *c)
{
    const struct blob *up = c->d->plan.upload ? c->d->plan.upload : c->d->empty;
    queue(c, WSLAY_BINARY_FRAME, up->p, up->n);
    queue(c, WSLAY_TEXT_FRAME, c->d->plan.run.p, c->d->plan.run.n);
    c->bs = B_WANT_DONE;
    c->t_block = now_ns();
}

void end_turn(struct conn *c)
{
    if (c->st == C_CLOSING)
        return;
    if (c->held) {
        c->held = false;
        c->d->held_now--;
    }
    queue(c, WSLAY_TEXT_FRAME, shutdown_frame, sizeof shutdown_frame - 1);
    int r = wslay_event_queue_close(c->ws, 1000, NULL, 0);
    if (r != 0)
        conn_fail(c, "wslay_event_queue_close: %d", r);
    c->st = C_CLOSING;
}

/* The turn is between blocks with nothing left to run: end it or hold it. */
static void turn_idle(struct conn *c)
{
    if (c->d->plan.hold) {
        if (!c->held) {
            c->held = true;
            c->d->held_now++;
        }
    } else
        end_turn(c);
}

/* A tool_result whose value is the driver's big string: assembled by hand around it (the id
 * is printed by cJSON), so that the client's own cost is two copies, not a JSON encoding. */
static void reply_big_value(struct conn *c, cJSON *id)
{
    static const char mid[] = ",\"ok\":true,\"value\":\"";
    static const char tail[] = "\",\"error\":null,\"kind\":\"tool_result\"}\n";
    cJSON *o = cJSON_CreateString(cJSON_IsString(id) ? id->valuestring : "");
    char *ids = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!ids) {
        conn_fail(c, "cJSON: out of memory");
        return;
    }
    size_t nid = strlen(ids), n = 6 + nid + sizeof mid - 1 + c->d->tool_value_n + sizeof tail - 1;
    char *t = xmalloc(n), *w = t;
    memcpy(w, "{\"id\":", 6);
    memcpy(w += 6, ids, nid);
    memcpy(w += nid, mid, sizeof mid - 1);
    memcpy(w += sizeof mid - 1, c->d->tool_value, c->d->tool_value_n);
    memcpy(w += c->d->tool_value_n, tail, sizeof tail - 1);
    queue(c, WSLAY_TEXT_FRAME, t, n); /* wslay copies it */
    free(t);
    cJSON_free(ids);
    c->replies++;
    c->d->tool_calls++;
}

static void reply_tool_call(struct conn *c, cJSON *f)
{
    cJSON *id = cJSON_GetObjectItemCaseSensitive(f, "id");
    if (c->d->tool_value) {
        reply_big_value(c, id);
        return;
    }
    cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "args");
    cJSON *msg = cJSON_GetObjectItemCaseSensitive(args, "message");
    cJSON *o = cJSON_CreateObject(), *v = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", cJSON_IsString(id) ? id->valuestring : "");
    cJSON_AddTrueToObject(o, "ok");
    if (cJSON_IsString(msg))
        cJSON_AddStringToObject(v, "echoed", msg->valuestring);
    cJSON_AddItemToObject(o, "value", v);
    cJSON_AddNullToObject(o, "error");
    cJSON_AddStringToObject(o, "kind", "tool_result");
    char buf[512];
    if (!cJSON_PrintPreallocated(o, buf, (int)sizeof buf - 2, 0)) {
        char *s = cJSON_PrintUnformatted(o);
        size_t n = s ? strlen(s) : 0;
        char *t = xmalloc(n + 1);
        memcpy(t, s ? s : "", n);
        t[n] = '\n';
        queue(c, WSLAY_TEXT_FRAME, t, n + 1);
        free(t);
        cJSON_free(s);
    } else {
        size_t n = strlen(buf);
        buf[n] = '\n';
        queue(c, WSLAY_TEXT_FRAME, buf, n + 1);
    }
    cJSON_Delete(o);
    c->replies++;
    c->d->tool_calls++;
}

static void on_text(struct conn *c, const uint8_t *p, size_t n)
{
    struct driver *d = c->d;
    while (n && (p[n - 1] == '\n' || p[n - 1] == '\r')) /* §3.2 step 1 */
        n--;
    cJSON *f = cJSON_ParseWithLength((const char *)p, n);
    cJSON *kind = cJSON_GetObjectItemCaseSensitive(f, "kind");
    if (!cJSON_IsString(kind)) {
        conn_fail(c, "undecodable text frame: %.60s", (const char *)p);
        cJSON_Delete(f);
        return;
    }
    const char *k = kind->valuestring;
    if (!strcmp(k, "ready")) {
        cJSON *pv = cJSON_GetObjectItemCaseSensitive(f, "protocol_version");
        if (c->ready)
            conn_fail(c, "a second ready");
        else if (!cJSON_IsNumber(pv) || pv->valuedouble != 2)
            conn_fail(c, "ready with protocol_version other than 2");
        else {
            c->ready = true;
            c->t_ready = now_ns();
            d->ready_now++;
            samples_add(&d->turn_start, (double)(c->t_ready - c->t_start) / NS_PER_MS);
            if (c->bs == B_IDLE) {
                if (c->blocks_done < d->plan.blocks)
                    start_block(c);
                else
                    turn_idle(c);
            }
        }
    } else if (!strcmp(k, "tool_call")) {
        if (c->bs != B_WANT_DONE)
            conn_fail(c, "tool_call outside a block");
        else
            reply_tool_call(c, f);
    } else if (!strcmp(k, "log")) {
        /* relayed sandbox logs: nothing to do */
    } else if (!strcmp(k, "done")) {
        cJSON *ec = cJSON_GetObjectItemCaseSensitive(f, "exit_code");
        if (c->bs != B_WANT_DONE || !c->ready)
            conn_fail(c, "done out of order");
        c->done_code = cJSON_IsNumber(ec) ? (int64_t)ec->valuedouble : 0;
        c->bs = B_WANT_OUTPUT;
    } else if (!strcmp(k, "output")) {
        cJSON *ec = cJSON_GetObjectItemCaseSensitive(f, "exit_code");
        cJSON *so = cJSON_GetObjectItemCaseSensitive(f, "stdout");
        cJSON *se = cJSON_GetObjectItemCaseSensitive(f, "stderr");
        const char *out = cJSON_IsString(so) ? so->valuestring : "";
        const char *err = cJSON_IsString(se) ? se->valuestring : "";
        if (c->bs != B_WANT_OUTPUT)
            conn_fail(c, "output out of order");
        else if (!cJSON_IsNumber(ec) || (int64_t)ec->valuedouble != c->done_code)
            conn_fail(c, "output.exit_code differs from done.exit_code");
        else if (d->plan.expect && (strcmp(out, d->plan.expect) || c->done_code != 0))
            conn_fail(c, "unexpected output: exit %" PRId64 ", stdout %.40s, stderr %.120s",
                      c->done_code, out, err);
        if (d->plan.capture) {
            free(d->out_stdout);
            free(d->out_stderr);
            d->out_stdout = xstrdup(out);
            d->out_stdout_len = strlen(out);
            d->out_stderr = xstrdup(err);
            d->out_code = c->done_code;
        }
        c->bs = B_WANT_ARCHIVE;
    } else if (strcmp(k, "tool_result") && strcmp(k, "run") && strcmp(k, "shutdown")) {
        conn_fail(c, "unknown frame kind %.40s", k);
    } else {
        conn_fail(c, "host-side frame kind %s from the server", k);
    }
    cJSON_Delete(f);
}

static void on_binary(struct conn *c, size_t len)
{
    struct driver *d = c->d;
    if (c->bs == B_WANT_OUTPUT) {
        conn_fail(c, "binary message in place of output");
        return;
    }
    if (c->bs != B_WANT_ARCHIVE)
        return; /* the host ignores binary messages before done (§2.4) */
    uint64_t t = now_ns();
    d->last_archive = len;
    /* A pipelined first block also waits for the sandbox to start: not a block round trip. */
    if (!(d->plan.pipeline && c->blocks_done == 0))
        samples_add(&d->block_rtt, (double)(t - c->t_block) / NS_PER_MS);
    c->blocks_done++;
    d->blocks_ok++;
    c->bs = B_IDLE;
    if (c->blocks_done < d->plan.blocks)
        start_block(c);
    else
        turn_idle(c);
}

static void ws_msg_cb(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg,
                      void *user)
{
    struct conn *c = user;
    if (c->failed)
        return;
    if (arg->opcode == WSLAY_TEXT_FRAME)
        on_text(c, arg->msg, arg->msg_length);
    else if (arg->opcode == WSLAY_BINARY_FRAME)
        on_binary(c, arg->msg_length);
    else if (arg->opcode == WSLAY_CONNECTION_CLOSE && c->st != C_CLOSING)
        conn_fail(c, "server closed the turn: %u %.*s", arg->status_code,
                  (int)(arg->msg_length > 2 && arg->msg_length < 130 ? arg->msg_length - 2 : 0),
                  arg->msg_length > 2 ? (const char *)arg->msg + 2 : "");
}

static const struct wslay_event_callbacks ws_callbacks = {
    .recv_callback = ws_recv_cb,
    .send_callback = ws_send_cb,
    .genmask_callback = ws_genmask_cb,
    .on_msg_recv_callback = ws_msg_cb,
};

static void conn_set_events(struct conn *c, uint32_t ev)
{
    if (ev == c->ev)
        return;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    if (epoll_ctl(c->d->ep, EPOLL_CTL_MOD, c->fd, &e) < 0)
        conn_fail(c, "epoll_ctl: %s", strerror(errno));
    c->ev = ev;
}

/* Ends the turn's connection; the memory goes to the graveyard until the event batch is over. */
void conn_finish(struct conn *c)
{
    struct driver *d = c->d;
    if (c->dead)
        return;
    c->dead = true;
    epoll_ctl(d->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->ws)
        wslay_event_context_free(c->ws);
    c->ws = NULL;
    if (c->ready)
        d->ready_now--;
    if (c->held)
        d->held_now--;
    d->active--;
    if (c->failed || !c->ready) {
        d->turns_failed++;
        if (!d->first_err[0])
            snprintf(d->first_err, sizeof d->first_err, "%s", c->failed ? c->why : "closed early");
        if (d->max_fail && d->turns_failed >= d->max_fail)
            d->to_launch = 0;
    } else {
        d->turns_ok++;
        d->t_last_done = now_ns();
    }
    if (c->prev)
        c->prev->next = c->next;
    else
        d->live = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->next = d->graveyard;
    d->graveyard = c;
}

void conn_start(struct driver *d)
{
    struct conn *c = xmalloc(sizeof *c);
    memset(c, 0, sizeof *c);
    c->d = d;
    c->t_start = now_ns();
    c->next = d->live;
    if (d->live)
        d->live->prev = c;
    d->live = c;
    d->active++;
    d->launched++;
    if (d->to_launch)
        d->to_launch--;
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        conn_fail(c, "socket: %s", strerror(errno));
        c->fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        conn_finish(c);
        return;
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

    uint8_t key[16], sha[EVP_MAX_MD_SIZE];
    char key64[32], cat[96];
    unsigned shalen = 0;
    rnd_bytes(key, sizeof key);
    EVP_EncodeBlock((unsigned char *)key64, key, sizeof key);
    snprintf(cat, sizeof cat, "%s" WS_GUID, key64);
    EVP_Digest(cat, strlen(cat), sha, &shalen, EVP_sha1(), NULL);
    EVP_EncodeBlock((unsigned char *)c->accept, sha, (int)shalen);
    int n = snprintf(c->req, sizeof c->req,
                     "GET / HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                     "Sec-WebSocket-Version: 13\r\n\r\n",
                     ntohs(d->addr.sin_port), key64);
    c->req_len = (size_t)n;

    struct epoll_event e = {.events = EPOLLOUT, .data.ptr = c};
    c->ev = EPOLLOUT;
    if (epoll_ctl(d->ep, EPOLL_CTL_ADD, c->fd, &e) < 0) {
        conn_fail(c, "epoll_ctl: %s", strerror(errno));
        conn_finish(c);
        return;
    }
    if (connect(c->fd, (struct sockaddr *)&d->addr, sizeof d->addr) < 0 && errno != EINPROGRESS) {
        conn_fail(c, "connect: %s", strerror(errno));
        conn_finish(c);
    }
}

/* Reads the 101; on success the connection becomes a wslay client. Returns false while the
 * response is incomplete. */
static bool http_response(struct conn *c)
{
    for (;;) {
        if (c->hlen == sizeof c->hbuf - 1) {
            conn_fail(c, "HTTP response header too long");
            return false;
        }
        ssize_t r = recv(c->fd, c->hbuf + c->hlen, sizeof c->hbuf - 1 - c->hlen, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return false;
        if (r <= 0) {
            /* A refusal (503 Busy, 401) comes with Connection: close: report its status line. */
            c->hbuf[c->hlen] = 0;
            char *eol = strpbrk(c->hbuf, "\r\n");
            conn_fail(c, "connection closed before the 101%s%.*s", c->hlen ? ": " : "",
                      (int)(eol ? eol - c->hbuf : (ptrdiff_t)c->hlen), c->hbuf);
            return false;
        }
        c->hlen += (size_t)r;
        c->hbuf[c->hlen] = 0;
        char *end = strstr(c->hbuf, "\r\n\r\n");
        if (!end)
            continue;
        unsigned status = 0;
        if (sscanf(c->hbuf, "HTTP/1.1 %u", &status) != 1 || status != 101) {
            char *eol = strpbrk(c->hbuf, "\r\n");
            conn_fail(c, "upgrade refused: %.*s", (int)(eol - c->hbuf), c->hbuf);
            return false;
        }
        bool accept_ok = false;
        for (char *line = strstr(c->hbuf, "\r\n") + 2; line < end;) {
            char *eol = strstr(line, "\r\n");
            if (!strncasecmp(line, "Sec-WebSocket-Accept:", 21)) {
                char *v = line + 21;
                while (*v == ' ' || *v == '\t')
                    v++;
                size_t vl = (size_t)(eol - v);
                while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
                    vl--;
                accept_ok = vl == strlen(c->accept) && !memcmp(v, c->accept, vl);
            }
            line = eol + 2;
        }
        if (!accept_ok) {
            conn_fail(c, "bad or missing Sec-WebSocket-Accept");
            return false;
        }
        c->pre_off = (size_t)(end + 4 - c->hbuf);
        return true;
    }
}

static void conn_open_ws(struct conn *c)
{
    struct driver *d = c->d;
    if (wslay_event_context_client_init(&c->ws, &ws_callbacks, c) != 0) {
        conn_fail(c, "wslay_event_context_client_init failed");
        return;
    }
    wslay_event_config_set_max_recv_msg_length(c->ws, MAX_MSG);
    c->st = C_OPEN;
    queue(c, WSLAY_BINARY_FRAME, d->tools->p, d->tools->n);
    if (d->plan.pipeline && d->plan.blocks)
        start_block(c);
}

/* Lets wslay read (when `readable`) and write, then sets the epoll interest from what it wants. */
void conn_pump_ws(struct conn *c, bool readable)
{
    c->replies = 0;
    if (!c->failed && (readable || c->pre_off < c->hlen) && wslay_event_want_read(c->ws)) {
        int r = wslay_event_recv(c->ws);
        if (r != 0 && !c->eof)
            conn_fail(c, "wslay_event_recv: %d", r);
    }
    if (!c->failed && !c->eof && wslay_event_want_write(c->ws)) {
        int r = wslay_event_send(c->ws);
        if (r != 0)
            conn_fail(c, "wslay_event_send: %d", r);
    }
    if (c->replies) { /* the client's own time to answer a tool_call: read to written */
        double us = (double)(now_ns() - c->t_evt) / 1000.0;
        for (unsigned i = 0; i < c->replies; i++)
            samples_add(&c->d->handling, us);
    }
    if (c->failed || c->eof) {
        if (c->eof && c->st != C_CLOSING && !c->failed)
            conn_fail(c, "server closed the connection mid-turn");
        conn_finish(c);
        return;
    }
    bool rd = wslay_event_want_read(c->ws), wr = wslay_event_want_write(c->ws);
    if (!rd && !wr) { /* close frames exchanged */
        conn_finish(c);
        return;
    }
    conn_set_events(c, (rd ? EPOLLIN : 0) | (wr ? EPOLLOUT : 0));
}

void conn_event(struct conn *c, uint32_t ev)
{
    c->t_evt = now_ns();
    if (c->st == C_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
            conn_fail(c, "connect: %s", strerror(err));
            conn_finish(c);
            return;
        }
        c->st = C_HTTP;
        ev |= EPOLLOUT;
    }
    if (c->st == C_HTTP) {
        while (c->req_off < c->req_len) {
            ssize_t r = send(c->fd, c->req + c->req_off, c->req_len - c->req_off, MSG_NOSIGNAL);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                break;
            if (r < 0) {
                conn_fail(c, "send: %s", strerror(errno));
                conn_finish(c);
                return;
            }
            c->req_off += (size_t)r;
        }
        if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR) && http_response(c))
            conn_open_ws(c);
        if (c->failed) {
            conn_finish(c);
            return;
        }
        if (c->st == C_HTTP) {
            conn_set_events(c, EPOLLIN | (c->req_off < c->req_len ? EPOLLOUT : 0));
            return;
        }
        ev |= EPOLLIN; /* bytes after the 101 may already be buffered: read now */
    }
    conn_pump_ws(c, ev & (EPOLLIN | EPOLLHUP | EPOLLERR));
}
