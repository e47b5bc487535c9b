/* One connection: the HTTP request, then the WebSocket turn relayed between
 * the client and its sandbox (spec 2.3 state machine).
 *
 * The supervisor never interprets user data: frames are validated by the
 * codec and re-encoded; archives are checked for size and passed through.
 * Everything the sandbox sends is hostile: only the frames that are legal in
 * the current state are relayed; anything else ends this turn only. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/utf8.h"
#include "core/util.h"
#include "net/http.h"
#include "net/ws.h"
#include "proto/frame.h"
#include "session/notify.h"
#include "session/session.h"

#define REPLY_LINGER_MS 1000   /* after a non-101 reply: wait for the peer's EOF */
#define CLOSE_LINGER_MS 5000   /* ending a turn: flush what is queued, then close */
#define CHAN_READ_BUDGET (1 * MiB) /* bytes read from a sandbox per wakeup */
#define CHAN_MAX_FDS 8             /* fds taken (and closed) per read; the kernel drops the rest */

static void update_interest(struct session *s);
static void kill_sandbox(struct session *s);
static void mark_dead(struct session *s);
static void send_close_when_flushed(struct session *s);

static const char *turn_state_name(enum turn_state t)
{
    static const char *const names[] = {"T (awaiting tools)", "B (between blocks)",
                                        "R (awaiting run)", "X (block running)",
                                        "X (awaiting output)", "X (awaiting archive)"};
    return names[t];
}

/* ---------------------------------------------------------------- replies */

static void reply_and_close(struct session *s, int status, const char *reason, const char *body)
{
    buf_reset(&s->out);
    if (http_write_response(&s->out, status, reason, body) < 0) {
        mark_dead(s);
        return;
    }
    http_req_free(s->req);
    s->req = NULL;
    s->phase = PHASE_REPLY;
    s->deadline_ms = now_ms() + REPLY_LINGER_MS;
    preauth_touch(&s->srv->preauth, &s->pa, PREAUTH_ACTIVE, now_ms());
    update_interest(s);
}

/* Write what b holds to fd without blocking: -1 on a fatal socket error, 0
 * when everything was written, 1 if bytes remain. */
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

static int flush_out(struct session *s)
{
    return send_buf(s->fd, &s->out);
}

/* ---------------------------------------------------------------- sandbox I/O */

static int chan_send(struct session *s, enum chan_type type, const uint8_t *p, size_t n)
{
    uint8_t hdr[CHAN_HDR_LEN];
    if (n > CHAN_MAX_MESSAGE_BYTES)
        return -EMSGSIZE;
    chan_hdr_encode(hdr, type, (uint32_t)n);
    int r = buf_append(&s->chan_out, hdr, sizeof hdr);
    if (r == 0 && n)
        r = buf_append(&s->chan_out, p, n);
    update_interest(s);
    return r;
}

/* Re-encode a decoded frame straight into the sandbox's queue (no copy):
 * the envelope's length is filled in once the encoding is known. */
static int chan_send_frame(struct session *s, const struct frame *f)
{
    uint8_t hdr[CHAN_HDR_LEN] = {0};
    size_t start = s->chan_out.len;
    int r = buf_append(&s->chan_out, hdr, sizeof hdr);
    if (r == 0)
        r = frame_encode(f, &s->chan_out);
    size_t n = s->chan_out.len - start - CHAN_HDR_LEN;
    if (r == 0 && n > CHAN_MAX_MESSAGE_BYTES)
        r = -EMSGSIZE;
    if (r < 0) {
        s->chan_out.len = start; /* drop the partial envelope */
        return r;
    }
    chan_hdr_encode(s->chan_out.data + start, CHAN_FRAME, (uint32_t)n);
    update_interest(s);
    return 0;
}

static int ws_send_frame(struct session *s, const struct frame *f)
{
    struct buf b;
    buf_init(&b, WS_MAX_MESSAGE_BYTES);
    int r = frame_encode(f, &b);
    if (r == 0)
        r = ws_conn_send_text(s->ws, b.data, b.len);
    buf_free(&b);
    return r;
}

/* A `log` error frame for the client; only sent while a block runs (the host
 * reads by position after `done`, spec 2.4). */
static void send_error_log(struct session *s, const char *msg)
{
    if (s->turn != TURN_RUNNING || !s->ws)
        return;
    struct frame f;
    frame_init(&f, FRAME_LOG);
    if (frame_set_string(&f, "level", "error") == 0 && frame_set_string(&f, "msg", msg) == 0)
        ws_send_frame(s, &f);
    frame_free(&f);
}

/* A block overran its wall clock: the sandbox cannot be trusted to answer,
 * so the supervisor completes the block itself (done, output with a clear
 * stderr, and a zero-length archive, which leaves the host's files as they
 * were; spec 4.4), then ends the turn. */
static void finish_block_for_timeout(struct session *s, const char *what, uint64_t limit_ms)
{
    enum { TIMEOUT_EXIT = 124 };
    char msg[160];
    snprintf(msg, sizeof msg, "forkbox: %s exceeded its time limit of %" PRIu64
             " s; the sandbox was stopped\n", what, limit_ms / 1000);
    struct frame done, out;
    frame_init(&done, FRAME_DONE);
    frame_init(&out, FRAME_OUTPUT);
    if (frame_set_int(&done, "exit_code", TIMEOUT_EXIT) == 0 &&
        frame_set_int(&out, "exit_code", TIMEOUT_EXIT) == 0 &&
        frame_set_string(&out, "stderr", msg) == 0 && ws_send_frame(s, &done) == 0 &&
        ws_send_frame(s, &out) == 0)
        ws_conn_send_binary(s->ws, (const uint8_t *)"", 0);
    frame_free(&done);
    frame_free(&out);
    s->turn = TURN_BETWEEN;
}

/* One complete message from the sandbox. Returns 0, or -1 after failing the
 * session. */
static int handle_child_frame(struct session *s, const uint8_t *p, size_t n)
{
    const char *why = NULL;
    char reason[200];
    struct frame f;
    if (!utf8_valid(p, n)) {
        session_fail(s, 1011, "sandbox protocol error: frame is not valid UTF-8");
        return -1;
    }
    int r = frame_decode(p, n, FRAME_FROM_CHILD, &f, &why);
    if (r < 0) {
        snprintf(reason, sizeof reason, "sandbox protocol error: %s", why ? why : "bad frame");
        session_fail(s, 1011, reason);
        return -1;
    }

    bool legal = false;
    enum turn_state next = s->turn;
    switch (f.kind) {
    case FRAME_READY:
        legal = s->tools_sent && !s->ready_seen;
        s->ready_seen = s->ready_seen || legal;
        if (legal && s->accept_ns)
            LOG_D("turn %" PRIu64 ": ready %.3f ms after the upgrade (spawn %.3f ms)", s->id,
                  (double)(now_ns() - s->accept_ns) / 1e6, (double)s->spawn_ns / 1e6);
        break;
    case FRAME_TOOL_CALL:
        legal = s->turn == TURN_RUNNING && s->ready_seen;
        break;
    case FRAME_LOG: {
        /* Logs are relayed only while a block runs (the host reads frames
         * only then); otherwise they are recorded here and dropped. */
        const struct frame_field *msg = frame_get(&f, "msg");
        if (s->turn != TURN_RUNNING) {
            LOG_I("turn %" PRIu64 ": sandbox log: %.*s", s->id, (int)(msg->len > 300 ? 300 : msg->len),
                  msg->json);
            /* Kept for the close reason if the sandbox then exits (setup and
             * archive errors arrive this way). */
            snprintf(s->last_child_error, sizeof s->last_child_error, "%.*s",
                     (int)(msg->len > 2 ? msg->len - 2 : 0), msg->json + 1);
            frame_free(&f);
            return 0;
        }
        legal = true;
        break;
    }
    case FRAME_DONE:
        legal = s->turn == TURN_RUNNING && s->ready_seen;
        next = TURN_WANT_OUTPUT;
        s->done_exit_code = f.exit_code;
        break;
    case FRAME_OUTPUT:
        legal = s->turn == TURN_WANT_OUTPUT && f.exit_code == s->done_exit_code;
        next = TURN_WANT_SNAPSHOT;
        break;
    default:
        break;
    }
    if (!legal) {
        snprintf(reason, sizeof reason, "sandbox protocol error: unexpected %s frame in state %s",
                 frame_kind_name(f.kind), turn_state_name(s->turn));
        frame_free(&f);
        session_fail(s, 1011, reason);
        return -1;
    }
    r = ws_send_frame(s, &f);
    frame_free(&f);
    if (r < 0) {
        session_fail(s, 1011, "cannot relay a sandbox frame");
        return -1;
    }
    s->turn = next;
    return 0;
}

static int handle_child_message(struct session *s, enum chan_type type, const uint8_t *p, size_t n)
{
    bool first = !s->chan_first_done;
    int fd = s->chan_fd_pending;
    s->chan_first_done = true;
    s->chan_fd_pending = -1;
    if (type == CHAN_NOTIFY) {
        /* Only as the sandbox's first message (sent in setup, before any
         * untrusted code), with its fd and nothing else. */
        if (!first || fd < 0 || n != 0) {
            if (fd >= 0)
                close(fd);
            session_fail(s, 1011, "sandbox protocol error: unexpected listener message");
            return -1;
        }
        notify_adopt(s, fd);
        return 0;
    }
    if (fd >= 0)
        close(fd); /* an fd with a first message that is not the listener */
    switch (type) {
    case CHAN_FRAME:
        return handle_child_frame(s, p, n);
    case CHAN_SNAPSHOT:
        if (s->turn != TURN_WANT_SNAPSHOT)
            break;
        if (ws_conn_send_binary(s->ws, p, n) < 0) {
            session_fail(s, 1011, "cannot relay the workspace archive");
            return -1;
        }
        s->turn = TURN_BETWEEN;
        s->idle_since_ms = now_ms();
        return 0;
    default:
        break;
    }
    char reason[160];
    snprintf(reason, sizeof reason, "sandbox protocol error: unexpected '%c' message in state %s",
             (int)type, turn_state_name(s->turn));
    session_fail(s, 1011, reason);
    return -1;
}

/* recvmsg() on the channel: the only fd a sandbox may send is its seccomp
 * listener, attached to the first byte of its first message (CHAN_NOTIFY).
 * Such an fd is kept in chan_fd_pending until that message is complete
 * (handle_child_message adopts or closes it); every other fd is closed at
 * once. MSG_CMSG_CLOEXEC: none may leak into a process we start. */
static ssize_t chan_recv(struct session *s, void *p, size_t len)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(CHAN_MAX_FDS * sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = p, .iov_len = len};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
                       .msg_controllen = sizeof ctl.b};
    bool at_start = !s->chan_first_done && !s->chan_body_active && s->chan_hdr_got == 0;
    ssize_t n = recvmsg(s->chan_fd, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0)
        return n;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (at_start && nfd == 1 && s->chan_fd_pending < 0)
                s->chan_fd_pending = fd;
            else
                close(fd);
        }
    }
    return n;
}

/* Read what the sandbox sent, within a budget. Returns 0 to continue, -1 if
 * the session was failed, 1 on EOF (the sandbox's end is closed). */
static int chan_read(struct session *s)
{
    size_t budget = CHAN_READ_BUDGET;
    while (budget > 0 && s->chan_fd >= 0) {
        ssize_t n;
        if (!s->chan_body_active) {
            n = chan_recv(s, s->chan_hdr + s->chan_hdr_got, CHAN_HDR_LEN - s->chan_hdr_got);
        } else {
            size_t want = s->chan_body_len - s->chan_body_got;
            if (want > budget)
                want = budget;
            n = want ? chan_recv(s, s->chan_body + s->chan_body_got, want) : 0;
            if (want == 0)
                goto complete;
        }
        if (n < 0)
            return (errno == EAGAIN || errno == EINTR) ? 0 : 1;
        if (n == 0)
            return 1;
        budget -= (size_t)n;
        if (!s->chan_body_active) {
            s->chan_hdr_got += (size_t)n;
            if (s->chan_hdr_got < CHAN_HDR_LEN)
                continue;
            enum chan_type type;
            uint32_t len;
            int r = chan_hdr_decode(s->chan_hdr, CHAN_HDR_LEN, CHAN_MAX_MESSAGE_BYTES, &type, &len);
            if (r <= 0) {
                session_fail(s, 1011, r == -EMSGSIZE ? "sandbox protocol error: message too large"
                                                     : "sandbox protocol error: bad envelope");
                return -1;
            }
            s->chan_body = malloc(len ? len : 1);
            if (!s->chan_body) {
                session_fail(s, 1011, "out of memory");
                return -1;
            }
            s->chan_body_type = type;
            s->chan_body_len = len;
            s->chan_body_got = 0;
            s->chan_body_active = true;
            s->chan_hdr_got = 0;
            if (len > 0)
                continue;
        } else {
            s->chan_body_got += (uint32_t)n;
            if (s->chan_body_got < s->chan_body_len)
                continue;
        }
    complete:;
        uint8_t *body = s->chan_body;
        s->chan_body = NULL;
        s->chan_body_active = false;
        int r = handle_child_message(s, s->chan_body_type, body, s->chan_body_len);
        free(body);
        if (r < 0)
            return -1;
        /* Backpressure: stop when the client is not keeping up. */
        if (s->ws && ws_conn_queued(s->ws) > RELAY_HIGH_WATER)
            return 0;
    }
    return 0;
}

static void sandbox_gone(struct session *s)
{
    if (s->phase != PHASE_TURN) {
        kill_sandbox(s);
        return;
    }
    if (s->last_child_error[0]) {
        session_fail(s, 1011, s->last_child_error);
        return;
    }
    session_fail(s, 1011, s->turn == TURN_WANT_OUTPUT || s->turn == TURN_WANT_SNAPSHOT
                              ? "the sandbox stopped before finishing the block"
                              : "the sandbox stopped unexpectedly (crash, os._exit, or a limit)");
}

/* Write what is queued for the sandbox: 0 when all of it went or the socket
 * is full, -1 when the sandbox is gone. */
static int chan_flush(struct session *s)
{
    return send_buf(s->chan_fd, &s->chan_out) < 0 ? -1 : 0;
}

static void on_chan_io(struct loop_watch *w, uint32_t events)
{
    struct session *s = w->ud;
    if ((events & EPOLLOUT) && chan_flush(s) < 0) {
        sandbox_gone(s);
        return;
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        int r = chan_read(s);
        if (r < 0)
            return;
        if (r == 1) {
            sandbox_gone(s);
            return;
        }
        /* Relay at once what the sandbox sent (the client's socket is almost
         * always writable): waiting for EPOLLOUT costs two epoll_ctl and a
         * loop pass per message, a tenth of a tool call's round trip. */
        if (s->phase == PHASE_TURN && ws_conn_want_write(s->ws) && ws_conn_write(s->ws) < 0) {
            mark_dead(s);
            return;
        }
    }
    update_interest(s);
}

static void on_pidfd(struct loop_watch *w, uint32_t events)
{
    struct session *s = w->ud;
    loop_unwatch(s->srv->loop, &s->pid_watch);
    /* Take what the sandbox managed to send before it died, then end. */
    if (s->chan_fd >= 0 && chan_read(s) < 0)
        return;
    sandbox_gone(s);
}

void session_sandbox_ready(struct session *s, const struct fs_reply *rep, int chan_fd, int pidfd)
{
    s->spawn_pending = false;
    if (rep->status < 0) {
        char reason[120];
        snprintf(reason, sizeof reason, "cannot start a sandbox: %s", strerror(-rep->status));
        session_fail(s, 1011, reason);
        return;
    }
    s->child_pid = rep->pid;
    s->chan_fd = chan_fd;
    s->pidfd = pidfd;
    s->spawn_ns = rep->spawn_ns;
    fd_set_nonblock(chan_fd, true);
    s->chan_watch = (struct loop_watch){.fd = chan_fd, .cb = on_chan_io, .ud = s};
    s->pid_watch = (struct loop_watch){.fd = pidfd, .cb = on_pidfd, .ud = s};
    loop_watch(s->srv->loop, &s->pid_watch, EPOLLIN);
    LOG_D("turn %" PRIu64 ": sandbox pid %d", s->id, (int)rep->pid);
    update_interest(s);
}

static void kill_sandbox(struct session *s)
{
    struct loop *l = s->srv->loop;
    if (s->pidfd >= 0) {
        syscall(SYS_pidfd_send_signal, s->pidfd, SIGKILL, NULL, 0);
        loop_unwatch(l, &s->pid_watch);
        close_and_reset(&s->pidfd);
    }
    if (s->chan_fd >= 0) {
        loop_unwatch(l, &s->chan_watch);
        close_and_reset(&s->chan_fd);
    }
    close_and_reset(&s->chan_fd_pending);
    notify_close(s);
    free(s->chan_body);
    s->chan_body = NULL;
    s->chan_body_active = false;
    buf_free(&s->chan_out);
}

/* ---------------------------------------------------------------- client messages */

static void end_turn(struct session *s) { session_fail(s, 1000, NULL); }

static void on_ws_text(void *ud, const uint8_t *msg, size_t len)
{
    struct session *s = ud;
    if (s->phase != PHASE_TURN)
        return;
    struct frame f;
    const char *why = NULL;
    bool ok = frame_decode(msg, len, FRAME_FROM_CLIENT, &f, &why) == 0;

    switch (s->turn) {
    case TURN_TOOLS: /* text instead of the tools archive */
        end_turn(s);
        break;
    case TURN_BETWEEN: /* only shutdown matters; everything else is ignored */
        if (ok && f.kind == FRAME_SHUTDOWN)
            end_turn(s);
        break;
    case TURN_ARCHIVED:
        if (!ok || f.kind != FRAME_RUN) {
            end_turn(s);
            break;
        }
        if (chan_send_frame(s, &f) < 0) {
            session_fail(s, 1011, "cannot queue the block for the sandbox");
            break;
        }
        s->turn = TURN_RUNNING;
        s->block_started_ms = now_ms();
        break;
    case TURN_RUNNING:
        /* Results go to the sandbox; an undecodable message is dropped alone
         * (spec 9.2 "channel poisoning"); other frames are ignored. */
        if (ok && f.kind == FRAME_TOOL_RESULT && chan_send_frame(s, &f) < 0)
            session_fail(s, 1011, "cannot queue a tool result for the sandbox");
        break;
    default: /* after done: results are no longer wanted */
        break;
    }
    if (ok)
        frame_free(&f);
}

static void on_ws_binary(void *ud, const uint8_t *msg, size_t len)
{
    struct session *s = ud;
    const struct config *cfg = s->srv->cfg;
    char reason[120];
    if (s->phase != PHASE_TURN)
        return;
    switch (s->turn) {
    case TURN_TOOLS:
    case TURN_BETWEEN: {
        bool tools = s->turn == TURN_TOOLS;
        uint64_t limit = tools ? cfg->max_upload_tools : cfg->max_upload_workspace;
        if (len > limit) {
            snprintf(reason, sizeof reason, "%s archive of %zu bytes is over the limit of %" PRIu64,
                     tools ? "tools" : "workspace", len, limit);
            LOG_I("turn %" PRIu64 ": %s", s->id, reason);
            session_fail(s, 1009, reason);
            return;
        }
        if (chan_send(s, tools ? CHAN_TOOLS : CHAN_WORKSPACE, msg, len) < 0) {
            session_fail(s, 1011, "cannot queue the archive for the sandbox");
            return;
        }
        s->tools_sent = s->tools_sent || tools;
        s->turn = tools ? TURN_BETWEEN : TURN_ARCHIVED;
        if (tools)
            s->idle_since_ms = now_ms();
        break;
    }
    case TURN_ARCHIVED: /* a second archive where run was due */
        end_turn(s);
        break;
    default: /* ignored while a block runs */
        break;
    }
}

static void on_ws_pong(void *ud)
{
    struct session *s = ud;
    s->ping_outstanding = false;
}

static const struct ws_handlers ws_handlers = {
    .on_text = on_ws_text,
    .on_binary = on_ws_binary,
    .on_pong = on_ws_pong,
};

/* ---------------------------------------------------------------- HTTP */

static void admit(struct session *s, const uint8_t *rest, size_t rest_len)
{
    struct server *srv = s->srv;
    const char *key = http_req_header(s->req, "Sec-WebSocket-Key");
    buf_reset(&s->out);
    if (http_write_upgrade(&s->out, key) < 0) {
        mark_dead(s);
        return;
    }
    s->ws = ws_conn_new(s->fd, WS_MAX_MESSAGE_BYTES, rest, rest_len, &ws_handlers, s);
    if (!s->ws) {
        mark_dead(s);
        return;
    }
    http_req_free(s->req);
    s->req = NULL;
    preauth_remove(&srv->preauth, &s->pa); /* a turn now: counted by capacity */
    s->holds_slot = true;
    srv->n_turns++;
    srv->single_use_admitted = srv->single_use_admitted || srv->cfg->single_use;
    s->phase = PHASE_TURN;
    s->turn = TURN_TOOLS;
    s->accept_ns = now_ns();
    s->turn_started_ms = s->last_ping_ms = s->idle_since_ms = now_ms();
    buf_init(&s->chan_out, CHAN_MAX_MESSAGE_BYTES + 2 * RELAY_HIGH_WATER);
    int r = server_request_sandbox(srv, s);
    if (r < 0) {
        session_fail(s, 1011, "sandbox service unavailable");
        return;
    }
    /* Frames that arrived with the request are not signalled again. */
    if (rest_len > 0 && ws_conn_read(s->ws) < 0) {
        mark_dead(s);
        return;
    }
    LOG_D("turn %" PRIu64 ": admitted (%u/%u)", s->id, srv->n_turns, srv->cfg->capacity);
    update_interest(s);
}

/* Spec 1.1 routing table, with the slot taken only for a valid upgrade.
 * Malformed requests never get here: http_read answered them 400 (431),
 * a repeated Authorization or other once-only header among them (http.c),
 * even for /health. A wrong Sec-WebSocket-Version is not an upgrade, so it
 * meets 503 and 401 first and then gets 426, which the response writer
 * gives Sec-WebSocket-Version: 13. */
static void route(struct session *s, const uint8_t *rest, size_t rest_len)
{
    struct server *srv = s->srv;
    const char *target = http_req_target(s->req);
    if (strcmp(target, "/health") == 0) {
        reply_and_close(s, 200, "OK", "OK\n");
        return;
    }
    if (srv->n_turns >= srv->cfg->capacity || srv->single_use_admitted) {
        reply_and_close(s, 503, "Service Unavailable", "Busy\n");
        return;
    }
    if (srv->token && !http_auth_ok(http_req_header(s->req, "Authorization"), srv->token,
                                    srv->token_len)) {
        reply_and_close(s, 401, "Unauthorized", "Unauthorized\n");
        return;
    }
    if (!http_req_is_websocket_upgrade(s->req)) {
        reply_and_close(s, 426, "Upgrade Required", "Upgrade Required\n");
        return;
    }
    admit(s, rest, rest_len);
}

static void http_read(struct session *s)
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
        preauth_touch(&s->srv->preauth, &s->pa, PREAUTH_ACTIVE, now_ms());
        return;
    }
    if (r == -E2BIG)
        reply_and_close(s, 431, "Request Header Fields Too Large", "Request Too Large\n");
    else if (r < 0)
        reply_and_close(s, 400, "Bad Request", "Bad Request\n");
    else
        route(s, tmp + used, (size_t)n - used);
}

/* ---------------------------------------------------------------- socket events */

static void on_client_io(struct loop_watch *w, uint32_t events)
{
    struct session *s = w->ud;
    switch (s->phase) {
    case PHASE_HTTP:
        http_read(s);
        break;
    case PHASE_REPLY:
        if (flush_out(s) < 0) {
            mark_dead(s);
            break;
        }
        if (s->out.len == 0) {
            /* Answered: from now on the first to go when the pre-auth pool
             * is full (preauth.h). */
            if (s->pa.cls != PREAUTH_ANSWERED)
                preauth_touch(&s->srv->preauth, &s->pa, PREAUTH_ANSWERED, now_ms());
            /* Half-close, then drain until the peer closes, so the reply is
             * not lost to a reset caused by unread request bytes. */
            uint8_t tmp[1024];
            shutdown(s->fd, SHUT_WR);
            ssize_t n = recv(s->fd, tmp, sizeof tmp, 0);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
                mark_dead(s);
        }
        break;
    case PHASE_TURN:
    case PHASE_CLOSING: {
        int r = flush_out(s);
        if (r < 0) {
            mark_dead(s);
            break;
        }
        if (r == 0 && (events & EPOLLOUT) && ws_conn_write(s->ws) < 0) {
            mark_dead(s);
            break;
        }
        if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && ws_conn_read(s->ws) < 0) {
            mark_dead(s); /* the client is gone, or the close handshake is over */
            break;
        }
        /* Likewise, pass what the client sent straight on to the sandbox. An
         * error stays for on_chan_io, which reports it where it belongs. */
        if (s->chan_fd >= 0 && s->chan_out.len)
            (void)chan_flush(s);
        if (s->phase == PHASE_CLOSING) {
            send_close_when_flushed(s);
            if (!s->close_pending && ws_conn_finished(s->ws))
                mark_dead(s);
        }
        break;
    }
    case PHASE_DEAD:
        break;
    }
    update_interest(s);
}

static void update_interest(struct session *s)
{
    struct loop *l = s->srv->loop;
    if (s->phase == PHASE_DEAD)
        return;
    uint32_t ev = 0;
    switch (s->phase) {
    case PHASE_HTTP:
        ev = EPOLLIN;
        break;
    case PHASE_REPLY:
        ev = s->out.len ? EPOLLOUT : EPOLLIN;
        break;
    default:
        if (s->out.len || ws_conn_want_write(s->ws))
            ev |= EPOLLOUT;
        if (ws_conn_want_read(s->ws) && s->chan_out.len < RELAY_HIGH_WATER)
            ev |= EPOLLIN;
        break;
    }
    loop_watch(l, &s->watch, ev);

    if (s->chan_fd >= 0) {
        uint32_t cev = 0;
        if (s->chan_out.len)
            cev |= EPOLLOUT;
        if (!s->ws || ws_conn_queued(s->ws) < RELAY_HIGH_WATER)
            cev |= EPOLLIN;
        loop_watch(l, &s->chan_watch, cev);
    }
}

/* ---------------------------------------------------------------- lifecycle */

struct session *session_new(struct server *srv, int fd)
{
    struct session *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->srv = srv;
    s->id = srv->next_id++;
    s->fd = fd;
    s->chan_fd = s->pidfd = s->chan_fd_pending = s->notify_fd = -1;
    s->phase = PHASE_HTTP;
    buf_init(&s->out, 64 * KiB);
    buf_init(&s->chan_out, 0);
    s->deadline_ms = now_ms() + HTTP_REQUEST_TIMEOUT_MS;
    s->watch = (struct loop_watch){.fd = fd, .cb = on_client_io, .ud = s};
    if (loop_watch(srv->loop, &s->watch, EPOLLIN) < 0) {
        free(s);
        return NULL;
    }
    return s;
}

/* Queue the pending close once every message queued before it is out. */
static void send_close_when_flushed(struct session *s)
{
    if (!s->close_pending || ws_conn_queued(s->ws) > 0)
        return;
    s->close_pending = false;
    ws_conn_close(s->ws, s->close_code, s->close_reason);
}

static void mark_dead(struct session *s)
{
    if (s->phase == PHASE_DEAD)
        return;
    kill_sandbox(s);
    server_release_slot(s->srv, s);
    preauth_remove(&s->srv->preauth, &s->pa);
    loop_unwatch(s->srv->loop, &s->watch);
    s->phase = PHASE_DEAD;
}

void session_fail(struct session *s, uint16_t code, const char *reason)
{
    if (s->phase == PHASE_DEAD || s->phase == PHASE_CLOSING)
        return;
    if (s->phase != PHASE_TURN) {
        mark_dead(s);
        return;
    }
    if (reason && code != 1000)
        LOG_W("turn %" PRIu64 ": ended: %s", s->id, reason);
    else
        LOG_D("turn %" PRIu64 ": ended (%u)", s->id, code);
    if (reason && code == 1011)
        send_error_log(s, reason);
    kill_sandbox(s);
    server_release_slot(s->srv, s);
    /* RFC 6455 limits a close reason to 123 bytes (ws_conn_close trims). */
    s->close_pending = true;
    s->close_code = code;
    snprintf(s->close_reason, sizeof s->close_reason, "%s", reason ? reason : "");
    send_close_when_flushed(s);
    s->phase = PHASE_CLOSING;
    s->deadline_ms = now_ms() + CLOSE_LINGER_MS;
    update_interest(s);
}

void session_tick(struct session *s, uint64_t now)
{
    const struct config *cfg = s->srv->cfg;
    switch (s->phase) {
    case PHASE_HTTP: /* slow or silent client: closed, never answered */
    case PHASE_REPLY:
    case PHASE_CLOSING:
        if (now >= s->deadline_ms)
            mark_dead(s);
        return;
    case PHASE_DEAD:
        return;
    case PHASE_TURN:
        break;
    }

    /* Keepalive: a pong must arrive within WS_PONG_TIMEOUT_MS of our ping. */
    if (s->ping_outstanding && now - s->last_ping_ms >= WS_PONG_TIMEOUT_MS) {
        LOG_I("turn %" PRIu64 ": no pong from the client; dropping it", s->id);
        mark_dead(s);
        return;
    }
    if (!s->ping_outstanding && now - s->last_ping_ms >= WS_PING_INTERVAL_MS) {
        ws_conn_send_ping(s->ws);
        s->ping_outstanding = true;
        s->last_ping_ms = now;
        update_interest(s);
    }

    if (s->turn == TURN_RUNNING && cfg->block_timeout_ms &&
        now - s->block_started_ms >= cfg->block_timeout_ms) {
        finish_block_for_timeout(s, "the block", cfg->block_timeout_ms);
        session_fail(s, 1000, "block time limit");
    } else if (cfg->turn_timeout_ms && now - s->turn_started_ms >= cfg->turn_timeout_ms) {
        if (s->turn == TURN_RUNNING)
            finish_block_for_timeout(s, "the turn", cfg->turn_timeout_ms);
        session_fail(s, 1000, "turn time limit");
    } else if ((s->turn == TURN_BETWEEN || s->turn == TURN_TOOLS) && cfg->idle_timeout_ms &&
               now - s->idle_since_ms >= cfg->idle_timeout_ms) {
        session_fail(s, 1000, "idle timeout");
    }
}

void session_free(struct session *s)
{
    if (!s)
        return;
    kill_sandbox(s);
    preauth_remove(&s->srv->preauth, &s->pa);
    loop_unwatch(s->srv->loop, &s->watch);
    ws_conn_free(s->ws);
    http_req_free(s->req);
    if (s->fd >= 0) {
        /* Drain unread input first: closing with unread bytes makes the
         * kernel send a reset, and the peer could lose our last bytes. */
        uint8_t tmp[4096];
        shutdown(s->fd, SHUT_WR);
        for (int i = 0; i < 16 && recv(s->fd, tmp, sizeof tmp, MSG_DONTWAIT) > 0; i++)
            ;
        close(s->fd);
    }
    buf_free(&s->out);
    buf_free(&s->chan_out);
    free(s);
}
