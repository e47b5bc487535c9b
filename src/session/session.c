/* One connection: the HTTP request, then the WebSocket turn relayed between
 * the client and its sandbox (spec 2.3 state machine). Runs in the
 * supervisor.
 *
 * The supervisor relays, it does not trust. Everything a sandbox sends is
 * hostile, including envelopes written by user code:
 *  - a message is refused at its envelope header unless its type is legal in
 *    the turn's state and its announced length is within that state's limit
 *    (a `log` between blocks is small; only a block's `tool_call` may be
 *    large); its room is then reserved against the turn's and the daemon's
 *    memory budgets, so nothing is held that was not paid for;
 *  - its body is checked as it arrives, a bounded amount per loop round
 *    (frames by the incremental JSON scanner with per-state item limits,
 *    snapshots by tarcheck), so one turn cannot hold the loop;
 *  - a frame is relayed only if its kind is legal in the state, its fields
 *    have their spec types and its size fits its kind (output streams are
 *    cut to --output-cap here, whatever the sandbox claims); a snapshot only
 *    if it is in tarcheck's canonical subset (regular files and directories,
 *    modes within 0755, owners 0, within --snapshot-max and --max-members);
 *  - anything else ends this turn only, with a close reason from this file's
 *    own vocabulary: never text a sandbox wrote.
 * What the client sends is checked the same way (limits at frame headers,
 * budgets, incremental scan). Relayed bytes are not copied where they need
 * not be: a frame already in canonical form is passed on as it came. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/buf.h"
#include "core/cleanup.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/ratelimit.h"
#include "core/util.h"
#include "loop/closer.h"
#include "net/http.h"
#include "net/ws.h"
#include "proto/chan.h"
#include "proto/frame.h"
#include "proto/relay.h"
#include "proto/tarcheck.h"
#include "session/chan_conn.h"
#include "session/metrics.h"
#include "session/notify.h"
#include "session/session.h"

enum turn_state {
    TURN_TOOLS,        /* T: awaiting the tools archive */
    TURN_BETWEEN,      /* B: between blocks */
    TURN_ARCHIVED,     /* R: workspace archive received, awaiting run */
    TURN_RUNNING,      /* X: block running, until the sandbox's done */
    TURN_WANT_OUTPUT,  /* X: done relayed, awaiting output */
    TURN_WANT_SNAPSHOT,/* X: output relayed, awaiting the archive */
};

enum session_phase {
    PHASE_HTTP,    /* reading the request */
    PHASE_REPLY,   /* writing a non-101 response, then closing */
    PHASE_TURN,    /* WebSocket turn */
    PHASE_CLOSING, /* close frame queued; flushing before closing the socket */
    PHASE_DEAD,    /* waiting for sessions_reap() */
};

struct session {
    struct sessions *set;         /* borrowed: the set it is in */
    const struct session_env *env; /* borrowed: &set->env */
    struct session *prev, *next;  /* in set->head */
    uint64_t id;                  /* the connection's, and its turn's (fork server requests) */
    enum session_phase phase;

    int fd;                       /* owned: the client socket */
    struct loop_watch watch;
    struct preauth_entry pa;      /* in env->preauth until admitted or closed */
    struct http_req *req;         /* owned while PHASE_HTTP, from the first byte */
    struct buf out;               /* raw bytes to write before any WebSocket data */
    uint64_t deadline_ms;         /* phase deadline (request, reply, close) */

    struct ws_conn *ws;           /* owned in PHASE_TURN/CLOSING */
    enum turn_state turn;
    bool holds_slot;              /* taken by env->admit, not yet released */
    uint64_t turn_started_ms, block_started_ms, idle_since_ms;
    uint64_t last_ping_ms;
    bool ping_outstanding;
    int64_t done_exit_code;
    bool ready_seen, tools_sent;
    /* wslay sends control frames ahead of queued messages, so a close is
     * held back until everything queued before it has been written. */
    bool close_pending;
    uint16_t close_code;
    char close_reason[124];

    /* What this turn makes the supervisor hold: every buffer of its messages
     * in both directions (--turn-buffer), charged to env->budget too. */
    struct budget budget;
    /* the client's text message, scanned as it arrives */
    struct frame_scan *cscan;     /* owned (admitted turns) */
    bool cmsg_bad;                /* it can no longer decode */

    /* the sandbox */
    bool spawn_pending;           /* request sent, reply not yet received */
    bool spawn_deferred;          /* no fork server to ask (restarting) or its socket full:
                                     asked again by sessions_sandbox_retry */
    pid_t child_pid;              /* the sandbox's (a death report must name it) */
    int chan_fd;                  /* owned: the sandbox's channel (chan borrows it) */
    struct loop_watch chan_watch;
    int pidfd;                    /* owned: the sandbox's pidfd */
    struct loop_watch pid_watch;
    struct chan_conn *chan;       /* owned (admitted turns): envelopes both ways */
    const char *child_error;      /* static: what the sandbox last reported failing */
    bool death_wait;              /* it ended on its own: the close waits for its death report */
    uint64_t death_deadline_ms;   /* ... until then at most (DEATH_REPORT_WAIT_MS) */
    bool death_known;             /* the fork server's death report arrived */
    struct fs_reply death;        /* that report (kind FS_REPLY_DEATH) */

    /* the sandbox's message being read (chan_conn.h) */
    bool in_token;                /* a log line may be written for it (log_rl) */
    bool in_complete;             /* all of it is in, its check still has work to do */
    struct buf in;                /* the body, room reserved at the header */
    struct frame_scan *sscan;     /* owned (admitted turns): an F body's scan */
    struct tarcheck *tc;          /* owned while an S body is checked */
    struct tarcheck_cache *tc_cache; /* owned: snapshot members verified this turn */
    struct ratelimit log_rl;      /* the sandbox's log lines in the operator log */

    struct notify_turn notify;    /* counted refusals and supervised calls (notify.c) */
    uint64_t spawn_ns;            /* from the fork server */
    uint64_t accept_ns;           /* when the upgrade was accepted */
    struct turn_stats stats;      /* what the turn did (metrics.h), from admit() */
};

struct sessions {
    struct session_env env;       /* copied at sessions_new */
    struct session *head;         /* owned, doubly linked */
    unsigned n;                   /* all connections */
    unsigned n_working;           /* sessions with a message still being checked */
    uint64_t next_id;             /* the next connection's (and turn's) id */
};

#define REPLY_LINGER_MS 1000   /* after a non-101 reply: wait for the peer's EOF */
#define CLOSE_LINGER_MS 5000   /* ending a turn: flush what is queued, then close */
/* A sandbox that ended on its own: how long the close waits for the fork
 * server's death report (it comes once the sandbox is reaped and its cgroup
 * helper has read the counters, behind the placements queued before it). */
#define DEATH_REPORT_WAIT_MS 5000

static void update_interest(struct session *s);
static void kill_sandbox(struct session *s);
static void mark_dead(struct session *s);
static void send_close_when_flushed(struct session *s);
static void turn_stats_begin(struct session *s);

static const char *turn_state_name(enum turn_state t)
{
    static const char *const names[] = {
        [TURN_TOOLS] = "T (awaiting tools)",
        [TURN_BETWEEN] = "B (between blocks)",
        [TURN_ARCHIVED] = "R (awaiting run)",
        [TURN_RUNNING] = "X (block running)",
        [TURN_WANT_OUTPUT] = "X (awaiting output)",
        [TURN_WANT_SNAPSHOT] = "X (awaiting archive)",
    };
    return names[t];
}

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
static void __attribute__((format(printf, 3, 4)))
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

static int flush_out(struct session *s)
{
    return send_buf(s->fd, &s->out);
}

/* ---------------------------------------------------------------- to the sandbox */

/* Queue one envelope for the sandbox whose body is *body, taken over. */
static int sandbox_send(struct session *s, enum chan_type type, struct buf *body)
{
    int r = chan_conn_send(s->chan, type, body);
    update_interest(s);
    return r;
}

/* The field of f whose value is the largest text borrowed from msg, if it
 * is worth sending from where it lies (RELAY_SLICE_MIN): its index, or -1. */
static int big_borrowed_field(const struct frame *f, const struct buf *msg)
{
    int best = -1;
    for (int i = 0; i < FRAME_MAX_FIELDS; i++) {
        const struct frame_field *fld = &f->field[i];
        uintptr_t p = (uintptr_t)fld->json, m = (uintptr_t)msg->data;
        if (fld->owned || fld->len < RELAY_SLICE_MIN || !msg->data || p < m ||
            p - m > msg->len || fld->len > msg->len - (p - m))
            continue;
        if (best < 0 || fld->len > f->field[best].len)
            best = i;
    }
    return best;
}

/* Queue a frame the client sent, decoded from *msg: as it came if it is
 * already in the supervisor's encoding (the sandbox's readers rely on that
 * form, pyrt/shape.c), else re-encoded; a large value (a tool result) is
 * not copied: the encoding is queued around it and the value is sent from
 * msg. msg is consumed either way. */
static int sandbox_send_frame(struct session *s, const struct frame *f, struct buf *msg)
{
    if (f->canonical)
        return sandbox_send(s, CHAN_FRAME, msg);
    struct buf head, tail;
    buf_init_budget(&head, CHAN_MAX_MESSAGE_BYTES, &s->budget);
    buf_init_budget(&tail, CHAN_MAX_MESSAGE_BYTES, &s->budget);
    int big = big_borrowed_field(f, msg);
    if (big < 0) {
        int r = frame_encode(f, &head); /* f may point into msg: encode first */
        buf_free(msg);
        return r < 0 ? (buf_free(&head), r) : sandbox_send(s, CHAN_FRAME, &head);
    }
    /* Everything but the value is copied out of msg before msg is queued. */
    const struct frame_field *v = &f->field[big];
    size_t off = (size_t)((const uint8_t *)v->json - msg->data), len = v->len;
    int r = frame_encode_around(f, (size_t)big, &head, &tail);
    if (r == 0)
        r = chan_conn_send_around(s->chan, CHAN_FRAME, &head, msg, off, len, &tail);
    else
        buf_free(msg);
    buf_free(&head);
    buf_free(&tail);
    update_interest(s);
    return r;
}

/* ---------------------------------------------------------------- to the client */

/* Send a frame to the client: body (consumed) holds its bytes when it is
 * canonical and unchanged; otherwise it is encoded anew. */
static int ws_relay_frame(struct session *s, const struct frame *f, struct buf *body)
{
    if (body && f->canonical)
        return ws_conn_send_buf(s->ws, true, body);
    struct buf b;
    buf_init_budget(&b, WS_MAX_MESSAGE_BYTES, &s->budget);
    int r = frame_encode(f, &b);
    if (body)
        buf_free(body);
    if (r < 0) {
        buf_free(&b);
        return r;
    }
    return ws_conn_send_buf(s->ws, true, &b);
}

static int ws_send_frame(struct session *s, const struct frame *f)
{
    return ws_relay_frame(s, f, NULL);
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

/* The block that was running is over (relayed, refused or timed out): its
 * duration goes to the histogram. */
static void block_over(struct session *s)
{
    if (!s->stats.block_started_ns)
        return;
    metrics_block_done(now_ns() - s->stats.block_started_ns);
    s->stats.block_started_ns = 0;
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
    block_over(s);
}

/* ---------------------------------------------------------------- sandbox: limits */

/* The turn's state as the sandbox-frame limits see it (proto/relay.h). */
static enum relay_phase turn_phase(enum turn_state t)
{
    switch (t) {
    case TURN_RUNNING:
        return RELAY_RUNNING;
    case TURN_WANT_OUTPUT:
        return RELAY_WANT_OUTPUT;
    case TURN_WANT_SNAPSHOT:
        return RELAY_WANT_SNAPSHOT;
    default: /* TURN_TOOLS, TURN_BETWEEN, TURN_ARCHIVED */
        return RELAY_BETWEEN;
    }
}

/* ---------------------------------------------------------------- sandbox: messages */

/* What a sandbox's error report means, in words of ours (NULL if it is not
 * one of the runtime's own reports): the text itself is the sandbox's (logged
 * for the operator, never sent as a close reason). */
static const char *child_error_class(const struct frame_field *msg)
{
    static const struct { const char *prefix, *meaning; } known[] = {
        {"\"sandbox setup:", "sandbox setup failed"},
        {"\"tools archive:", "the tools archive could not be extracted"},
        {"\"workspace archive:", "the workspace archive could not be extracted"},
        {"\"forkbox runtime: internal error", "the sandbox runtime failed"},
    };
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (msg->len >= strlen(known[i].prefix) &&
            memcmp(msg->json, known[i].prefix, strlen(known[i].prefix)) == 0)
            return known[i].meaning;
    return NULL;
}

/* An error-level log names why the sandbox is about to exit (setup and
 * archive errors arrive this way): what it means is kept for the close
 * reason. While a block runs only the runtime's own reports count (the
 * host sends the workspace archive and `run` back to back, so an archive
 * that cannot be extracted is reported while the block counts as
 * running); user code's error logs there are the host's business. */
static void note_child_error(struct session *s, const struct frame *f, bool running)
{
    const struct frame_field *level = frame_get(f, "level");
    if (level->len != 7 || memcmp(level->json, "\"error\"", 7) != 0)
        return;
    const char *meaning = child_error_class(frame_get(f, "msg"));
    if (meaning || !running)
        s->child_error = meaning ? meaning : "the sandbox reported an error";
}

/* A sandbox's log line in the operator log, as its JSON text (escaped: it
 * cannot forge lines), cut to 300 bytes. Its token was taken when its
 * envelope arrived (on_sandbox_begin): lines over the turn's rate were dropped
 * unread, and the next line says how many. */
static void log_sandbox_line(struct session *s, const struct frame_field *msg)
{
    uint64_t span_ns, dropped = ratelimit_take_report(&s->log_rl, now_ns(), &span_ns);
    char more[96] = "";
    if (dropped)
        snprintf(more, sizeof more, " (%" PRIu64 " more sandbox log lines dropped in %.0f s)",
                 dropped, (double)span_ns / 1e9);
    LOG_I("turn %" PRIu64 ": sandbox log: %.*s%s", s->id, (int)(msg->len > 300 ? 300 : msg->len),
          msg->json, more);
}

/* Relaying to the client failed: -EPIPE is a client connection that has
 * already failed or closed (the client went away while the sandbox was
 * sending), which ends the turn with nobody to tell; anything else is ours
 * to explain. */
static void relay_failed(struct session *s, int r, const char *what)
{
    if (r == -EPIPE) {
        LOG_I("turn %" PRIu64 ": ended: the client is gone (closed or failed)", s->id);
        turn_stats_end(&s->stats, TURN_END_CLIENT_CLOSED);
        mark_dead(s);
        return;
    }
    if (r == -ENOSPC)
        turn_stats_end(&s->stats, TURN_END_OVERLOAD);
    session_end(s, 1011, r == -ENOSPC ? "server memory budget exhausted" : what);
}

static void sandbox_protocol_error(struct session *s, const char *what)
{
    char reason[200];
    snprintf(reason, sizeof reason, "sandbox protocol error: %s", what);
    turn_stats_end(&s->stats, TURN_END_PROTOCOL_ERROR);
    session_end(s, 1011, reason);
}

/* One complete frame from the sandbox; body holds its bytes (consumed).
 * Returns 0, or -1 after failing the session. */
static int handle_child_frame(struct session *s, struct frame *f, struct buf *body)
{
    const char *misfit = relay_frame_misfit(f, s->sscan->js.items);
    if (misfit) {
        buf_free(body);
        sandbox_protocol_error(s, misfit);
        return -1;
    }

    bool legal = false;
    enum turn_state next = s->turn;
    switch (f->kind) {
    case FRAME_READY:
        legal = s->tools_sent && !s->ready_seen;
        s->ready_seen = s->ready_seen || legal;
        if (legal && s->accept_ns) {
            s->stats.ready_ns = now_ns();
            metrics_turn_ready(s->stats.ready_ns - s->accept_ns);
        }
        if (legal && s->accept_ns)
            LOG_D("turn %" PRIu64 ": ready %.3f ms after the upgrade (spawn %.3f ms)", s->id,
                  (double)(now_ns() - s->accept_ns) / 1e6, (double)s->spawn_ns / 1e6);
        break;
    case FRAME_TOOL_CALL:
        legal = s->turn == TURN_RUNNING && s->ready_seen;
        if (legal) {
            s->stats.tool_calls++;
            metrics_tool_call();
        }
        break;
    case FRAME_LOG:
        if (s->turn != TURN_RUNNING) {
            /* Logs are relayed only while a block runs (the host reads
             * frames only then); otherwise they go to the operator log,
             * rate-limited, and are dropped. */
            if (s->in_token)
                log_sandbox_line(s, frame_get(f, "msg"));
            note_child_error(s, f, false);
            buf_free(body);
            return 0;
        }
        note_child_error(s, f, true);
        legal = true;
        break;
    case FRAME_DONE:
        legal = s->turn == TURN_RUNNING && s->ready_seen;
        next = TURN_WANT_OUTPUT;
        s->done_exit_code = f->exit_code;
        break;
    case FRAME_OUTPUT:
        legal = s->turn == TURN_WANT_OUTPUT && f->exit_code == s->done_exit_code;
        next = TURN_WANT_SNAPSHOT;
        break;
    default:
        break;
    }
    if (!legal) {
        char what[120];
        snprintf(what, sizeof what, "unexpected %s frame in state %s", frame_kind_name(f->kind),
                 turn_state_name(s->turn));
        buf_free(body);
        sandbox_protocol_error(s, what);
        return -1;
    }
    if (f->kind == FRAME_OUTPUT) {
        int a = relay_cap_stream(f, "stdout", s->env->cfg->output_cap);
        int b = a < 0 ? a : relay_cap_stream(f, "stderr", s->env->cfg->output_cap);
        if (a < 0 || b < 0) {
            buf_free(body);
            session_end(s, 1011, "out of memory");
            return -1;
        }
        if (a || b) {
            f->canonical = false; /* no longer the bytes in body */
            LOG_W("turn %" PRIu64 ": output frame over --output-cap: cut by the supervisor", s->id);
        }
    }
    int r = ws_relay_frame(s, f, body);
    if (r < 0) {
        relay_failed(s, r, "cannot relay a sandbox frame");
        return -1;
    }
    s->turn = next;
    return 0;
}

/* The workspace snapshot passed its check: relay it. */
static void relay_snapshot(struct session *s)
{
    int r = ws_conn_send_buf(s->ws, false, &s->in);
    if (r < 0) {
        relay_failed(s, r, "cannot relay the workspace archive");
        return;
    }
    s->turn = TURN_BETWEEN;
    s->idle_since_ms = now_ms();
    block_over(s);
}

/* The end of an 'S' check: relay, or end the turn. */
static void snapshot_checked(struct session *s, int r)
{
    char reason[120];
    if (r == TARCHECK_VALID) {
        struct tarcheck_stats st;
        tarcheck_get_stats(s->tc, &st);
        LOG_D("turn %" PRIu64 ": snapshot of %" PRIu64 " members, %" PRIu64
              " of them verified earlier in the turn (not inflated)",
              s->id, st.members, st.cache_hits);
        relay_snapshot(s);
    } else {
        snprintf(reason, sizeof reason, "sandbox workspace archive refused: %s",
                 tarcheck_reason(s->tc));
        LOG_W("turn %" PRIu64 ": %s", s->id, reason);
        /* The host takes the message after output as the archive: a zero-
         * length one leaves its files as they were (spec 4.4). */
        ws_conn_send_binary(s->ws, (const uint8_t *)"", 0);
        s->turn = TURN_BETWEEN;
        block_over(s);
        turn_stats_end(&s->stats, TURN_END_PROTOCOL_ERROR);
        session_end(s, 1011, reason);
    }
    tarcheck_free(s->tc);
    s->tc = NULL;
    buf_free(&s->in);
}

/* A sandbox's header arrived (chan_conn.h): decide at once whether its
 * message may come at all, and reserve its room. 0, or -1 after failing the
 * session. */
static int on_sandbox_begin(void *ud, const struct chan_msg *m, struct buf **into)
{
    struct session *s = ud;
    char what[120];
    uint64_t limit = 0;
    switch (m->type) {
    case CHAN_FRAME:
        limit = relay_frame_max(turn_phase(s->turn), s->env->cfg->output_cap);
        break;
    case CHAN_SNAPSHOT:
        limit = s->turn == TURN_WANT_SNAPSHOT ? CHAN_MAX_MESSAGE_BYTES : 0;
        break;
    case CHAN_NOTIFY:
        limit = m->first ? 1 : 0; /* with no body: checked when complete */
        break;
    default:
        break;
    }
    if (limit == 0) {
        snprintf(what, sizeof what, "unexpected '%c' message in state %s", (int)m->type,
                 turn_state_name(s->turn));
        sandbox_protocol_error(s, what);
        return -1;
    }
    if (m->len > limit) {
        snprintf(what, sizeof what, "'%c' message of %" PRIu32 " bytes over the limit of %" PRIu64
                 " in state %s", (int)m->type, m->len, limit, turn_state_name(s->turn));
        sandbox_protocol_error(s, what);
        return -1;
    }
    /* Between blocks only a log is legal, and logs there are only written to
     * the operator log: once this turn's share of log lines is used up, such
     * a message is read and dropped without being scanned or kept. */
    s->in_token = false;
    *into = NULL;
    if (m->type == CHAN_FRAME && s->turn != TURN_RUNNING && s->turn != TURN_WANT_OUTPUT) {
        s->in_token = ratelimit_take(&s->log_rl, now_ns());
        if (!s->in_token && s->ready_seen)
            return 0; /* dropped */
    }
    int r = m->len ? buf_reserve_exact(&s->in, m->len) : 0;
    if (r < 0) {
        session_end(s, r == -ENOSPC ? 1013 : 1011,
                     r == -ENOSPC ? "server memory budget exhausted, try again later"
                     : r == -ENOMEM ? "out of memory"
                                    : "sandbox message over the turn's memory budget");
        return -1;
    }
    *into = &s->in;
    if (m->type == CHAN_FRAME) {
        frame_scan_init(s->sscan, FRAME_FROM_CHILD, relay_items_max(turn_phase(s->turn)));
    } else if (m->type == CHAN_SNAPSHOT) {
        const struct config *cfg = s->env->cfg;
        const struct tarcheck_limits lim = {.max_data = cfg->snapshot_max,
                                            .max_members = cfg->max_members};
        s->tc = tarcheck_new(&lim);
        if (!s->tc) {
            session_end(s, 1011, "out of memory");
            return -1;
        }
        /* Members verified in this turn's earlier snapshots are recognised
         * by their hash instead of inflated again (tarcheck.h); its memory
         * is charged to the turn. Without one, everything is inflated. */
        if (!s->tc_cache)
            s->tc_cache = tarcheck_cache_new(TARCHECK_CACHE_MAX, &s->budget);
        tarcheck_set_cache(s->tc, s->tc_cache);
    }
    return 0;
}

/* Check what arrived of the body so far. 0, or -1 after failing the session. */
static int on_sandbox_data(void *ud, const struct chan_msg *m)
{
    struct session *s = ud;
    const char *why = NULL;
    if (m->type == CHAN_FRAME && frame_scan_feed(s->sscan, s->in.data, s->in.len, &why) < 0) {
        sandbox_protocol_error(s, why);
        return -1;
    }
    if (m->type == CHAN_SNAPSHOT) {
        int r = tarcheck_feed(s->tc, s->in.data, s->in.len);
        if (r < 0) {
            snapshot_checked(s, r);
            return -1;
        }
    }
    return 0;
}

/* The whole body is in. 0, or -1 after failing the session. */
static int sandbox_message(struct session *s, struct chan_msg *m)
{
    int fd = m->fd;
    if (m->type == CHAN_NOTIFY) {
        /* Only as the sandbox's first message (sent in setup, before any
         * untrusted code), with its fd and nothing else. */
        if (!m->first || fd < 0 || m->len != 0) {
            closer_close(fd, CLOSER_ABORT | CLOSER_DRAIN);
            sandbox_protocol_error(s, "unexpected listener message");
            return -1;
        }
        notify_adopt(&s->notify, fd);
        return 0;
    }
    if (fd >= 0) { /* an fd with a first message that is not the listener */
        closer_close(fd, CLOSER_ABORT | CLOSER_DRAIN);
        sandbox_protocol_error(s, chan_conn_error(-EPERM));
        return -1;
    }
    if (m->dropped)
        return 0;
    if (m->type == CHAN_SNAPSHOT) {
        int r = tarcheck_finish(s->tc, s->in.data, s->in.len);
        if (r == TARCHECK_AGAIN) {
            /* More inflating than one step: the rest in later loop rounds
             * (session_work), the channel unread meanwhile. */
            s->in_complete = true;
            s->set->n_working++;
            return 0;
        }
        snapshot_checked(s, r);
        return s->phase == PHASE_TURN ? 0 : -1;
    }
    struct frame f;
    const char *why = NULL;
    int r = frame_scan_finish(s->sscan, s->in.data, s->in.len, FRAME_FROM_CHILD, &f, &why);
    if (r < 0) {
        buf_free(&s->in);
        sandbox_protocol_error(s, why ? why : "bad frame");
        return -1;
    }
    struct buf body;
    buf_init_budget(&body, SIZE_MAX, &s->budget);
    buf_move(&body, &s->in);
    r = handle_child_frame(s, &f, &body);
    frame_free(&f);
    return r;
}

/* 0 to read on, 1 to stop for now, -1 after failing the session. */
static int on_sandbox_end(void *ud, struct chan_msg *m)
{
    struct session *s = ud;
    if (sandbox_message(s, m) < 0)
        return -1;
    /* A check still running, or backpressure: the client is not keeping up. */
    if (s->in_complete || (s->ws && ws_conn_queued(s->ws) > RELAY_HIGH_WATER))
        return 1;
    return 0;
}

static const struct chan_conn_handlers sandbox_handlers = {
    .on_begin = on_sandbox_begin,
    .on_data = on_sandbox_data,
    .on_end = on_sandbox_end,
};

/* Read what the sandbox sent, within the channel's budget. Returns 0 to
 * continue, -1 if the session was failed, 1 when the sandbox's end is
 * closed. */
static int sandbox_read(struct session *s)
{
    if (s->in_complete) /* its check first (session_work) */
        return 0;
    int r = chan_conn_read(s->chan);
    if (chan_conn_error(r)) {
        sandbox_protocol_error(s, chan_conn_error(r));
        return -1;
    }
    return r == -ECANCELED ? -1 : r == -EPIPE ? 1 : 0;
}

static bool session_work(struct session *s)
{
    if (!s->in_complete)
        return false;
    int r = tarcheck_finish(s->tc, s->in.data, s->in.len);
    if (r == TARCHECK_AGAIN)
        return true;
    s->in_complete = false;
    s->set->n_working--;
    snapshot_checked(s, r);
    if (s->phase == PHASE_TURN) {
        if (ws_conn_want_write(s->ws) && ws_conn_write(s->ws) < 0) {
            mark_dead(s);
            return false;
        }
        update_interest(s);
    }
    return false;
}

static bool crash_signal(int sig)
{
    return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGABRT ||
           sig == SIGSYS || sig == SIGTRAP;
}

/* Why a sandbox that ended on its own ended, in words of ours, from facts
 * the fork server and its cgroup helper own: its init's wait status and
 * what its turn cgroup counted (forkserver.h), never from what the sandbox
 * sent. Init exits with the runtime's exit code below 128, 128 + the signal
 * that killed it, or 255 for an exit code of 128 or more (steps.c, step 9);
 * init itself killed by a signal (the OOM killer kills every process sharing
 * the runtime's memory, init included) counts as that signal. Which signal
 * came from where cannot be known from outside, so the rule is by signal:
 * the synchronous faults (and SIGABRT, SIGSYS: abort() and the seccomp
 * policy's kill) are a crash of the runtime or of native code in it; any
 * other is a kill (os.kill from user code, a subprocess). Each reason fits
 * a close frame (123 bytes); README, "Why a turn ended", lists them. */
static enum turn_end death_reason(const struct session *s, char *out, size_t len)
{
    const struct fs_reply *d = &s->death;
    const struct config *cfg = s->env->cfg;
    int st = d->wait_status, sig = 0, code = 0;
    if (WIFSIGNALED(st))
        sig = WTERMSIG(st);
    else if (WEXITSTATUS(st) > 128 && WEXITSTATUS(st) < 255)
        sig = WEXITSTATUS(st) - 128;
    else
        code = WEXITSTATUS(st);
    char how[40];
    const char *abbrev = sig ? sigabbrev_np(sig) : NULL;
    if (abbrev)
        snprintf(how, sizeof how, "SIG%s", abbrev);
    else if (sig)
        snprintf(how, sizeof how, "signal %d", sig);
    else if (code == 255)
        snprintf(how, sizeof how, "status 128 or more");
    else
        snprintf(how, sizeof how, "status %d", code);

    if (sig == SIGKILL && d->oom_kills) {
        snprintf(out, len, "out of memory: the sandbox was killed at its memory limit (%llu MiB)",
                 (unsigned long long)(cfg->memory_max >> 20));
        return TURN_END_MEMORY;
    }
    if (d->pids_max && (sig || code)) {
        snprintf(out, len, "process limit: the sandbox died (%s) after reaching its limit of "
                 "%llu processes", how, (unsigned long long)cfg->pids_max);
        return TURN_END_PIDS;
    }
    if (crash_signal(sig)) {
        snprintf(out, len, "sandbox crashed: %s in the runtime or native code", how);
        return TURN_END_CRASH;
    }
    if (sig) {
        snprintf(out, len, "sandbox killed: %s", how);
        return TURN_END_KILLED;
    }
    snprintf(out, len, "sandbox exited: %s", how);
    return TURN_END_EXITED;
}

/* The sandbox ended on its own (its channel closed or its init exited):
 * end the turn with the reason its death report gives, waiting for that
 * report (at most DEATH_REPORT_WAIT_MS, session_tick) with the channel and
 * pidfd unwatched. A setup or archive error it reported before it exited
 * says more than its exit status, and is kept. */
static void sandbox_gone(struct session *s)
{
    if (s->phase != PHASE_TURN) {
        kill_sandbox(s);
        return;
    }
    if (s->child_error) {
        turn_stats_end(&s->stats, TURN_END_SANDBOX_ERROR);
        session_end(s, 1011, s->child_error);
        return;
    }
    if (!s->death_known) {
        if (!s->death_wait) {
            s->death_wait = true;
            s->death_deadline_ms = now_ms() + DEATH_REPORT_WAIT_MS;
            loop_unwatch(s->env->loop, &s->chan_watch);
            loop_unwatch(s->env->loop, &s->pid_watch);
        }
        return;
    }
    char reason[124];
    turn_stats_end(&s->stats, death_reason(s, reason, sizeof reason));
    session_end(s, 1011, reason);
}

void session_sandbox_died(struct session *s, const struct fs_reply *rep)
{
    if (s->phase != PHASE_TURN || s->death_known || rep->pid != s->child_pid)
        return; /* the turn ended first (we killed it), or not this sandbox */
    s->death = *rep;
    s->death_known = true;
    if (s->death_wait) {
        sandbox_gone(s);
        return;
    }
    /* The report came before the pidfd or the channel's EOF was handled:
     * take what the sandbox managed to send, then end. */
    loop_unwatch(s->env->loop, &s->pid_watch);
    if (s->chan_fd >= 0 && sandbox_read(s) < 0)
        return;
    sandbox_gone(s);
}

static void on_sandbox_io(struct loop_watch *w, uint32_t events)
{
    struct session *s = w->ud;
    if ((events & EPOLLOUT) && chan_conn_flush(s->chan) < 0) {
        sandbox_gone(s);
        return;
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        int r = sandbox_read(s);
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
    loop_unwatch(s->env->loop, &s->pid_watch);
    /* Take what the sandbox managed to send before it died, then end. */
    if (s->chan_fd >= 0 && sandbox_read(s) < 0)
        return;
    sandbox_gone(s);
}

bool session_sandbox_ready(struct session *s, const struct fs_reply *rep, int chan_fd, int pidfd)
{
    bool wanted = s->spawn_pending && s->phase != PHASE_DEAD;
    s->spawn_pending = false;
    if (!wanted)
        return false; /* the turn ended while its sandbox was being made */
    if (rep->status < 0) {
        char reason[120];
        snprintf(reason, sizeof reason, "cannot start a sandbox: %s", strerror(-rep->status));
        session_end(s, 1011, reason);
        return true;
    }
    s->child_pid = rep->pid;
    s->stats.sandbox = true;
    metrics_sandbox_spawned();
    s->chan_fd = chan_fd;
    s->pidfd = pidfd;
    s->spawn_ns = rep->spawn_ns;
    fd_set_nonblock(chan_fd, true);
    chan_conn_set_fd(s->chan, chan_fd);
    s->chan_watch = (struct loop_watch){.fd = chan_fd, .cb = on_sandbox_io, .ud = s,
                                        .name = "sandbox channel", .turn = s->id};
    s->pid_watch = (struct loop_watch){.fd = pidfd, .cb = on_pidfd, .ud = s,
                                       .name = "sandbox pidfd", .turn = s->id};
    loop_watch(s->env->loop, &s->pid_watch, EPOLLIN);
    LOG_D("turn %" PRIu64 ": sandbox pid %d", s->id, (int)rep->pid);
    update_interest(s);
    return true;
}

static void kill_sandbox(struct session *s)
{
    struct loop *l = s->env->loop;
    if (s->pidfd >= 0) {
        syscall(SYS_pidfd_send_signal, s->pidfd, SIGKILL, NULL, 0);
        loop_unwatch(l, &s->pid_watch);
        close_and_reset(&s->pidfd);
    }
    if (s->chan_fd >= 0)
        loop_unwatch(l, &s->chan_watch);
    notify_close(&s->notify);
    if (s->in_complete)
        s->set->n_working--;
    s->in_complete = false;
    chan_conn_close(s->chan); /* its queue, a pending fd, a partial message */
    if (s->chan_fd >= 0)
        chan_conn_close_fd(steal_fd(&s->chan_fd));
    tarcheck_free(s->tc);
    s->tc = NULL;
    tarcheck_cache_free(s->tc_cache);
    s->tc_cache = NULL;
    buf_free(&s->in);
}

/* ---------------------------------------------------------------- client messages */

/* End the turn normally (1000): the client's shutdown, or (end
 * TURN_END_CLIENT_ERROR) a message the client should not have sent there. */
static void end_turn(struct session *s, enum turn_end end)
{
    turn_stats_end(&s->stats, end);
    session_end(s, 1000, NULL);
}

/* What a message from the client may be in the turn's state: its largest
 * size, or 0 to drop it unread (ws.h). */
static uint64_t on_msg_begin(void *ud, bool text)
{
    struct session *s = ud;
    const struct config *cfg = s->env->cfg;
    if (s->phase != PHASE_TURN)
        return WS_MSG_DROP;
    if (text) {
        switch (s->turn) {
        case TURN_TOOLS: /* text instead of the tools archive */
            end_turn(s, TURN_END_CLIENT_ERROR);
            return WS_MSG_DROP;
        case TURN_BETWEEN:  /* only shutdown matters */
        case TURN_ARCHIVED: /* run */
        case TURN_RUNNING:  /* tool_result */
            frame_scan_init(s->cscan, FRAME_FROM_CLIENT, 0);
            s->cmsg_bad = false;
            return WS_MAX_MESSAGE_BYTES;
        default: /* after done: results are no longer wanted */
            return WS_MSG_DROP;
        }
    }
    s->cmsg_bad = true; /* an archive: not scanned */
    switch (s->turn) {
    case TURN_TOOLS:
        return cfg->max_upload_tools;
    case TURN_BETWEEN:
        return cfg->max_upload_workspace;
    case TURN_ARCHIVED: /* a second archive where run was due */
        end_turn(s, TURN_END_CLIENT_ERROR);
        return WS_MSG_DROP;
    default: /* ignored while a block runs (spec 2.3) */
        return WS_MSG_DROP;
    }
}

static void on_msg_data(void *ud, const uint8_t *msg, size_t len)
{
    struct session *s = ud;
    if (s->phase != PHASE_TURN || s->cmsg_bad || !s->cscan)
        return;
    const char *why;
    if (frame_scan_feed(s->cscan, msg, len, &why) < 0) {
        s->cmsg_bad = true;
        if (s->turn == TURN_ARCHIVED) /* spec 2.3: undecodable text in R ends the turn */
            end_turn(s, TURN_END_CLIENT_ERROR);
    }
}

static void on_text(struct session *s, struct buf *msg)
{
    struct frame f;
    const char *why = NULL;
    bool ok = !s->cmsg_bad &&
              frame_scan_finish(s->cscan, msg->data, msg->len, FRAME_FROM_CLIENT, &f, &why) == 0;

    switch (s->turn) {
    case TURN_BETWEEN: /* only shutdown matters; everything else is ignored */
        if (ok && f.kind == FRAME_SHUTDOWN)
            end_turn(s, TURN_END_OK);
        break;
    case TURN_ARCHIVED:
        if (!ok || f.kind != FRAME_RUN) {
            end_turn(s, TURN_END_CLIENT_ERROR);
            break;
        }
        if (sandbox_send_frame(s, &f, msg) < 0) {
            session_end(s, 1011, "cannot queue the block for the sandbox");
            break;
        }
        s->turn = TURN_RUNNING;
        s->block_started_ms = now_ms();
        s->stats.blocks++;
        s->stats.block_started_ns = now_ns();
        break;
    case TURN_RUNNING:
        /* Results go to the sandbox; an undecodable message is dropped alone
         * (spec 9.2 "channel poisoning"); other frames are ignored. */
        if (ok && f.kind == FRAME_TOOL_RESULT && sandbox_send_frame(s, &f, msg) < 0)
            session_end(s, 1011, "cannot queue a tool result for the sandbox");
        break;
    default:
        break;
    }
    if (ok)
        frame_free(&f);
}

static void on_msg_end(void *ud, bool text, struct buf *msg)
{
    struct session *s = ud;
    if (s->phase != PHASE_TURN)
        return;
    if (text) {
        on_text(s, msg);
        return;
    }
    bool tools = s->turn == TURN_TOOLS;
    if (!tools && s->turn != TURN_BETWEEN)
        return;
    if (sandbox_send(s, tools ? CHAN_TOOLS : CHAN_WORKSPACE, msg) < 0) {
        session_end(s, 1011, "cannot queue the archive for the sandbox");
        return;
    }
    s->tools_sent = s->tools_sent || tools;
    s->turn = tools ? TURN_BETWEEN : TURN_ARCHIVED;
    if (tools)
        s->idle_since_ms = now_ms();
}

static void on_ws_pong(void *ud)
{
    struct session *s = ud;
    s->ping_outstanding = false;
}

static const struct ws_handlers ws_handlers = {
    .on_msg_begin = on_msg_begin,
    .on_msg_data = on_msg_data,
    .on_msg_end = on_msg_end,
    .on_pong = on_ws_pong,
};

/* ---------------------------------------------------------------- HTTP */

static void admit(struct session *s, const uint8_t *rest, size_t rest_len)
{
    const struct session_env *env = s->env;
    const char *key = http_req_header(s->req, "Sec-WebSocket-Key");
    buf_reset(&s->out);
    if (http_write_upgrade(&s->out, key) < 0) {
        mark_dead(s);
        return;
    }
    s->cscan = malloc(sizeof *s->cscan);
    s->sscan = malloc(sizeof *s->sscan);
    s->ws = ws_conn_new(s->fd, &s->budget, rest, rest_len, &ws_handlers, s);
    s->chan = chan_conn_new(-1, &s->budget, &sandbox_handlers, s);
    if (!s->ws || !s->cscan || !s->sscan || !s->chan) {
        mark_dead(s);
        return;
    }
    http_req_free(s->req);
    s->req = NULL;
    preauth_remove(env->preauth, &s->pa); /* a turn now: counted by capacity */
    s->holds_slot = true;
    unsigned n_turns = env->admit(env->host);
    s->phase = PHASE_TURN;
    s->turn = TURN_TOOLS;
    s->accept_ns = now_ns();
    turn_stats_begin(s);
    s->turn_started_ms = s->last_ping_ms = s->idle_since_ms = now_ms();
    int r = env->request_sandbox(env->host, s->id);
    if (r == 0)
        s->spawn_pending = true;
    else if (r == -EAGAIN)
        s->spawn_deferred = true; /* what the client sends is queued meanwhile */
    if (r < 0 && r != -EAGAIN) {
        session_end(s, 1011, SESSION_REASON_NO_SANDBOX_SERVICE);
        return;
    }
    /* Frames that arrived with the request are not signalled again. */
    if (rest_len > 0 && ws_conn_read(s->ws) < 0) {
        mark_dead(s);
        return;
    }
    LOG_D("turn %" PRIu64 ": admitted (%u/%u)", s->id, n_turns, env->cfg->capacity);
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
    int ok = s->env->may_admit(s->env->host, auth);
    if (ok == -EBUSY) {
        refuse(s, 503, "Service Unavailable", "Busy\n", "busy: no turn slot free (--capacity)");
        return;
    }
    if (ok == -ESHUTDOWN) {
        refuse(s, 503, "Service Unavailable", "Shutting down\n", "draining: the daemon is stopping");
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
                preauth_touch(s->env->preauth, &s->pa, PREAUTH_ANSWERED, now_ms());
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
        if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
            int rr = ws_conn_read(s->ws);
            if (rr < 0) {
                turn_stats_end(&s->stats, rr == -ECONNRESET || rr == -ESHUTDOWN
                                              ? TURN_END_CLIENT_CLOSED
                                          : rr == -ENOSPC ? TURN_END_OVERLOAD
                                                          : TURN_END_CLIENT_ERROR);
                if (rr != -ECONNRESET && rr != -ESHUTDOWN && s->phase == PHASE_TURN)
                    LOG_I("turn %" PRIu64 ": client message refused (%s); connection closed",
                          s->id, rr == -EMSGSIZE ? "over its limit or the turn's memory budget"
                                 : rr == -ENOSPC ? "server memory budget exhausted"
                                 : rr == -EPROTO ? "WebSocket protocol error"
                                                 : strerror(-rr));
                mark_dead(s); /* the client is gone, or the close handshake is over */
                break;
            }
        }
        /* Likewise, pass what the client sent straight on to the sandbox. An
         * error stays for on_sandbox_io, which reports it where it belongs. */
        if (s->chan_fd >= 0 && chan_conn_queued(s->chan))
            (void)chan_conn_flush(s->chan);
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
    struct loop *l = s->env->loop;
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
        if (ws_conn_want_read(s->ws) && chan_conn_queued(s->chan) < RELAY_HIGH_WATER)
            ev |= EPOLLIN;
        break;
    }
    loop_watch(l, &s->watch, ev);

    if (s->chan_fd >= 0 && !s->death_wait) {
        uint32_t cev = 0;
        if (chan_conn_queued(s->chan))
            cev |= EPOLLOUT;
        /* Backpressure: a client that does not read stops its sandbox (the
         * supervisor does not grow); a message still being checked is
         * finished first (session_work). */
        if ((!s->ws || ws_conn_queued(s->ws) < RELAY_HIGH_WATER) && !s->in_complete)
            cev |= EPOLLIN;
        loop_watch(l, &s->chan_watch, cev);
    }
}

/* ---------------------------------------------------------------- lifecycle */

struct session *session_new(struct sessions *set, int fd, const uint8_t key[PREAUTH_KEY_LEN])
{
    const struct session_env *env = &set->env;
    struct session *s = calloc(1, sizeof *s);
    if (!s) {
        close(fd);
        return NULL;
    }
    s->set = set;
    s->env = env;
    s->id = set->next_id++;
    s->fd = fd;
    s->chan_fd = s->pidfd = -1;
    notify_turn_init(&s->notify, s->id, env->loop, env->notify);
    s->phase = PHASE_HTTP;
    s->budget = (struct budget){.max = env->cfg->turn_buffer, .up = env->budget};
    s->log_rl = (struct ratelimit)RATELIMIT_INIT(SANDBOX_LOG_BURST, SANDBOX_LOG_PER_MINUTE, 60000);
    buf_init(&s->out, 64 * KiB);
    buf_init_budget(&s->in, CHAN_MAX_MESSAGE_BYTES, &s->budget);
    s->deadline_ms = now_ms() + HTTP_REQUEST_TIMEOUT_MS;
    s->watch = (struct loop_watch){.fd = fd, .cb = on_client_io, .ud = s, .name = "client",
                                   .turn = s->id};
    if (loop_watch(env->loop, &s->watch, EPOLLIN) < 0) {
        buf_free(&s->out);
        buf_free(&s->in);
        free(s);
        close(fd);
        return NULL;
    }
    s->next = set->head;
    if (set->head)
        set->head->prev = s;
    set->head = s;
    set->n++;
    if (preauth_add(env->preauth, &s->pa, key, now_ms()) < 0) {
        /* Cannot happen after preauth_make_room; never hold an
         * unaccounted connection. */
        session_end(s, 1000, NULL);
    }
    return s;
}

struct session *session_of_preauth(struct preauth_entry *e)
{
    return (struct session *)((char *)e - offsetof(struct session, pa));
}

const struct budget *session_budget(const struct session *s)
{
    return &s->budget;
}

/* The turn was admitted: its stats start (metrics.h). */
static void turn_stats_begin(struct session *s)
{
    union {
        struct sockaddr sa;
        struct sockaddr_in in4;
        struct sockaddr_in6 in6;
    } a;
    socklen_t alen = sizeof a;
    s->stats = (struct turn_stats){.id = s->id, .started_ns = s->accept_ns};
    if (getpeername(s->fd, &a.sa, &alen) == 0) {
        char host[INET6_ADDRSTRLEN] = "?";
        bool v6 = a.sa.sa_family == AF_INET6;
        inet_ntop(a.sa.sa_family, v6 ? (void *)&a.in6.sin6_addr : (void *)&a.in4.sin_addr, host,
                  sizeof host);
        snprintf(s->stats.peer, sizeof s->stats.peer, v6 ? "[%s]:%u" : "%s:%u", host,
                 ntohs(v6 ? a.in6.sin6_port : a.in4.sin_port));
    }
    metrics_turn_begin();
}

/* The turn is over (once: session_end or mark_dead, before the sandbox is
 * killed, which closes the seccomp listener and its count): its figures
 * go to the metrics, and its end line is written (metrics.c). end is used
 * if no more precise cause was set where the turn ended. */
static void turn_stats_finish(struct session *s, enum turn_end end)
{
    struct turn_stats *st = &s->stats;
    block_over(s); /* cut short: counted with its time so far */
    st->refusals = s->notify.refused;
    ws_conn_bytes(s->ws, &st->bytes_in, &st->bytes_out);
    if (s->death_known) {
        st->peak_known = true;
        st->mem_peak = s->death.mem_peak;
    }
    turn_stats_end(st, end);
    metrics_turn_end(st);
}

/* Give the turn's slot back, once. */
static void release_slot(struct session *s)
{
    if (!s->holds_slot)
        return;
    s->holds_slot = false;
    s->env->release(s->env->host);
}

/* Queue the pending close once every message queued before it is out. */
static void send_close_when_flushed(struct session *s)
{
    if (!s->close_pending || ws_conn_pending(s->ws))
        return;
    s->close_pending = false;
    ws_conn_close(s->ws, s->close_code, s->close_reason);
}

static void mark_dead(struct session *s)
{
    if (s->phase == PHASE_DEAD)
        return;
    if (s->phase == PHASE_TURN) /* the client went away without a close */
        turn_stats_finish(s, TURN_END_CLIENT_CLOSED);
    kill_sandbox(s);
    release_slot(s);
    preauth_remove(s->env->preauth, &s->pa);
    loop_unwatch(s->env->loop, &s->watch);
    s->phase = PHASE_DEAD;
}

void session_end(struct session *s, uint16_t code, const char *reason)
{
    if (s->phase == PHASE_DEAD || s->phase == PHASE_CLOSING)
        return;
    if (s->phase != PHASE_TURN) {
        mark_dead(s);
        return;
    }
    /* The per-turn log line: the close reason, as the client gets it. */
    if (reason && code != 1000)
        LOG_W("turn %" PRIu64 ": ended: %s", s->id, reason);
    else if (reason)
        LOG_I("turn %" PRIu64 ": ended: %s", s->id, reason);
    else
        LOG_D("turn %" PRIu64 ": ended (%u)", s->id, code);
    if (reason && code == 1011)
        send_error_log(s, reason);
    turn_stats_finish(s, code == 1000 && !reason ? TURN_END_OK
                         : code == 1001         ? TURN_END_DRAINED
                         : code == 1013         ? TURN_END_OVERLOAD
                         : reason && (strcmp(reason, SESSION_REASON_NO_SANDBOX_SERVICE) == 0 ||
                                      strcmp(reason, SESSION_REASON_FORKSERVER_DIED) == 0)
                             ? TURN_END_FORKSERVER_LOST
                             : TURN_END_ERROR);
    kill_sandbox(s);
    release_slot(s);
    /* RFC 6455 limits a close reason to 123 bytes (ws_conn_close trims). */
    s->close_pending = true;
    s->close_code = code;
    snprintf(s->close_reason, sizeof s->close_reason, "%s", reason ? reason : "");
    send_close_when_flushed(s);
    s->phase = PHASE_CLOSING;
    s->deadline_ms = now_ms() + CLOSE_LINGER_MS;
    update_interest(s);
}

static void session_tick(struct session *s, uint64_t now)
{
    const struct config *cfg = s->env->cfg;
    switch (s->phase) {
    case PHASE_HTTP: /* slow or silent client: closed, never answered */
        if (now >= s->deadline_ms)
            log_refused(s, "timeout", "%s within %d s, closed unanswered",
                        s->req ? "request incomplete" : "no request",
                        HTTP_REQUEST_TIMEOUT_MS / 1000);
        /* fall through */
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
        turn_stats_end(&s->stats, TURN_END_CLIENT_CLOSED);
        mark_dead(s);
        return;
    }
    if (!s->ping_outstanding && now - s->last_ping_ms >= WS_PING_INTERVAL_MS) {
        ws_conn_send_ping(s->ws);
        s->ping_outstanding = true;
        s->last_ping_ms = now;
        update_interest(s);
    }

    /* The sandbox is dead: only its death report (or its absence) decides. */
    if (s->death_wait) {
        if (now >= s->death_deadline_ms) {
            turn_stats_end(&s->stats, TURN_END_EXITED);
            session_end(s, 1011, "sandbox stopped: cause unknown (no death report)");
        }
        return;
    }

    char reason[124];
    if (s->turn == TURN_RUNNING && cfg->block_timeout_ms &&
        now - s->block_started_ms >= cfg->block_timeout_ms) {
        finish_block_for_timeout(s, "the block", cfg->block_timeout_ms);
        snprintf(reason, sizeof reason, "block timeout: the block ran longer than %" PRIu64
                 " s (--block-timeout)", cfg->block_timeout_ms / 1000);
        turn_stats_end(&s->stats, TURN_END_TIMEOUT);
        session_end(s, 1000, reason);
    } else if (cfg->turn_timeout_ms && now - s->turn_started_ms >= cfg->turn_timeout_ms) {
        if (s->turn == TURN_RUNNING)
            finish_block_for_timeout(s, "the turn", cfg->turn_timeout_ms);
        snprintf(reason, sizeof reason, "turn timeout: the turn lasted longer than %" PRIu64
                 " s (--turn-timeout)", cfg->turn_timeout_ms / 1000);
        turn_stats_end(&s->stats, TURN_END_TIMEOUT);
        session_end(s, 1000, reason);
    } else if ((s->turn == TURN_BETWEEN || s->turn == TURN_TOOLS) && cfg->idle_timeout_ms &&
               now - s->idle_since_ms >= cfg->idle_timeout_ms) {
        snprintf(reason, sizeof reason, "idle timeout: no block for %" PRIu64
                 " s (--idle-timeout)", cfg->idle_timeout_ms / 1000);
        turn_stats_end(&s->stats, TURN_END_TIMEOUT);
        session_end(s, 1000, reason);
    }
}

static void session_free(struct session *s)
{
    if (!s)
        return;
    kill_sandbox(s);
    preauth_remove(s->env->preauth, &s->pa);
    uint64_t span_ns, dropped = ratelimit_take_report(&s->log_rl, now_ns(), &span_ns);
    if (dropped)
        LOG_I("turn %" PRIu64 ": %" PRIu64 " sandbox log lines were dropped (over the rate)", s->id,
              dropped);
    loop_unwatch(s->env->loop, &s->watch);
    ws_conn_free(s->ws);
    chan_conn_free(s->chan);
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
    free(s->cscan);
    free(s->sscan);
    free(s);
}

/* ---------------------------------------------------------------- the set */

struct sessions *sessions_new(const struct session_env *env)
{
    struct sessions *set = calloc(1, sizeof *set);
    if (!set)
        return NULL;
    set->env = *env;
    set->next_id = 1;
    return set;
}

void sessions_free(struct sessions *set)
{
    if (!set)
        return;
    while (set->head) {
        struct session *s = set->head;
        set->head = s->next;
        session_free(s);
    }
    free(set);
}

unsigned sessions_count(const struct sessions *set)
{
    return set->n;
}

struct session *sessions_find(struct sessions *set, uint64_t turn_id)
{
    for (struct session *s = set->head; s; s = s->next)
        if (s->id == turn_id)
            return s;
    return NULL;
}

void sessions_end_all(struct sessions *set, uint16_t code, const char *reason)
{
    for (struct session *s = set->head; s; s = s->next)
        session_end(s, code, reason);
}

void sessions_forkserver_lost(struct sessions *set)
{
    for (struct session *s = set->head; s; s = s->next) {
        if (s->spawn_pending) {
            /* Its request went to the fork server that died: ask the next
             * one. A dead session's is dropped, so it can be reaped. */
            s->spawn_pending = false;
            s->spawn_deferred = s->phase == PHASE_TURN;
        } else if (s->phase == PHASE_TURN && s->child_pid > 0) {
            /* Its sandbox died with the fork server (parent-death signal),
             * or dies now (kill_sandbox, by its pidfd); no death report
             * will come for it. */
            session_end(s, 1011, SESSION_REASON_FORKSERVER_DIED);
        }
    }
}

void sessions_sandbox_retry(struct sessions *set)
{
    for (struct session *s = set->head; s; s = s->next) {
        if (!s->spawn_deferred || s->phase != PHASE_TURN)
            continue;
        int r = set->env.request_sandbox(set->env.host, s->id);
        if (r == -EAGAIN)
            return; /* still none, or its socket is full: the next tick */
        s->spawn_deferred = false;
        if (r < 0)
            session_end(s, 1011, SESSION_REASON_NO_SANDBOX_SERVICE);
        else
            s->spawn_pending = true;
    }
}

void sessions_tick(struct sessions *set, uint64_t now)
{
    for (struct session *s = set->head; s; s = s->next)
        session_tick(s, now);
}

bool sessions_work(struct sessions *set)
{
    bool more = false;
    if (set->n_working == 0)
        return false;
    for (struct session *s = set->head; s; s = s->next)
        if (s->in_complete)
            more |= session_work(s);
    return more;
}

void sessions_reap(struct sessions *set)
{
    struct session *s = set->head;
    while (s) {
        struct session *next = s->next;
        if (s->phase == PHASE_DEAD && !s->spawn_pending) {
            if (s->prev)
                s->prev->next = s->next;
            else
                set->head = s->next;
            if (s->next)
                s->next->prev = s->prev;
            set->n--;
            session_free(s);
        }
        s = next;
    }
}
