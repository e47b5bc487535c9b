/* The sandbox's channel messages in a turn, and their relay to the client.
 * Runs in the supervisor.
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
 *  - anything else ends this turn only, with a close reason from the
 *    supervisor's own vocabulary: never text a sandbox wrote.
 * Relayed bytes are not copied where they need not be: a frame already in
 * canonical form is passed on as it came.
 *
 * Relies on chan_conn.c for envelopes and fds (these handlers,
 * sandbox_handlers, decide what they mean), on turn.c to end the turn and
 * to say why a sandbox that ended on its own ended (sandbox_gone), and on
 * session.c for what the sockets wait for (update_interest). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/buf.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/util.h"
#include "loop/closer.h"
#include "net/ws.h"
#include "proto/chan.h"
#include "proto/frame.h"
#include "proto/relay.h"
#include "proto/tarcheck.h"
#include "session/chan_conn.h"
#include "session/metrics.h"
#include "session/notify.h"
#include "session/session.h"
#include "session/session_int.h"

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

/* ---------------------------------------------------------------- to the client */

/* Send a frame to the client: body (consumed) holds its bytes when it is
 * canonical and unchanged; otherwise it is encoded anew. */
int client_send_frame(struct session *s, const struct frame *f, struct buf *body)
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
 * envelope arrived (on_sandbox_begin): lines over the turn's rate waited
 * for it, unread. */
static void log_sandbox_line(struct session *s, const struct frame_field *msg)
{
    LOG_I("turn %" PRIu64 ": sandbox log: %.*s", s->id, (int)(msg->len > 300 ? 300 : msg->len),
          msg->json);
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

/* What the sandbox sends could not be held: the daemon's budget is spent
 * (1013: try again later), the turn's (1011), or memory. */
static void budget_refused(struct session *s, int r)
{
    session_end(s, r == -ENOSPC ? 1013 : 1011,
                r == -ENOSPC   ? "server memory budget exhausted, try again later"
                : r == -ENOMEM ? "out of memory"
                               : "sandbox message over the turn's memory budget");
}

static void sandbox_protocol_error(struct session *s, const char *what)
{
    char reason[200];
    snprintf(reason, sizeof reason, "sandbox protocol error: %s", what);
    turn_stats_end(&s->stats, TURN_END_PROTOCOL_ERROR);
    session_end(s, 1011, reason);
}

/* Whether f, a frame to relay (a log between blocks is not one), may come
 * in the turn's state: its kind's limits, and the kind order. False after
 * failing the session. *next is the state it leads to; it is counted. */
static bool child_frame_legal(struct session *s, const struct frame *f, enum turn_state *next)
{
    const char *misfit = relay_frame_misfit(f, s->sscan->js.items);
    if (misfit) {
        sandbox_protocol_error(s, misfit);
        return false;
    }
    bool legal = false;
    *next = s->turn;
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
        legal = s->turn == TURN_RUNNING;
        break;
    case FRAME_DONE:
        legal = s->turn == TURN_RUNNING && s->ready_seen;
        *next = TURN_WANT_OUTPUT;
        s->done_exit_code = f->exit_code;
        break;
    case FRAME_OUTPUT:
        legal = s->turn == TURN_WANT_OUTPUT && f->exit_code == s->done_exit_code;
        *next = TURN_WANT_SNAPSHOT;
        break;
    default:
        break;
    }
    if (!legal) {
        char what[120];
        snprintf(what, sizeof what, "unexpected %s frame in state %s", frame_kind_name(f->kind),
                 turn_state_name(s->turn));
        sandbox_protocol_error(s, what);
    }
    return legal;
}

/* One complete frame from the sandbox, held whole; body holds its bytes
 * (consumed). Returns 0, or -1 after failing the session. */
static int handle_child_frame(struct session *s, struct frame *f, struct buf *body)
{
    if (f->kind == FRAME_LOG && s->turn != TURN_RUNNING) {
        /* Logs are relayed only while a block runs (the host reads frames
         * only then); otherwise they go to the operator log, at the turn's
         * log rate, and no further. */
        const char *misfit = relay_frame_misfit(f, s->sscan->js.items);
        if (misfit) {
            buf_free(body);
            sandbox_protocol_error(s, misfit);
            return -1;
        }
        if (s->in_token)
            log_sandbox_line(s, frame_get(f, "msg"));
        note_child_error(s, f, false);
        buf_free(body);
        return 0;
    }
    enum turn_state next;
    if (!child_frame_legal(s, f, &next)) {
        buf_free(body);
        return -1;
    }
    if (f->kind == FRAME_LOG)
        note_child_error(s, f, true);
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
    int r = client_send_frame(s, f, body);
    if (r < 0) {
        relay_failed(s, r, "cannot relay a sandbox frame");
        return -1;
    }
    s->turn = next;
    return 0;
}

/* The last byte of a frame relayed as it arrived is in: it goes whole to the
 * client (the held-back end with FIN) only if it is a frame that may come
 * now, of a kind that may be this large, within its limits (an output
 * stream over --output-cap could not be cut any more: refused). Else the
 * turn is closed between its fragments. 0, or -1 after failing the session. */
static int streamed_frame_end(struct session *s, const struct chan_msg *m)
{
    struct frame f;
    const char *why = NULL;
    if (frame_scan_end(s->sscan, m->len, FRAME_FROM_CHILD, &f, &why) < 0) {
        sandbox_protocol_error(s, why ? why : "bad frame");
        return -1;
    }
    enum turn_state next;
    char what[120];
    uint64_t cap = s->env->cfg->output_cap + OUTPUT_NOTE_ALLOWANCE;
    if (f.kind == FRAME_LOG || f.kind == FRAME_DONE) {
        snprintf(what, sizeof what, "%s frame over %llu bytes", frame_kind_name(f.kind),
                 (unsigned long long)RELAY_WHOLE_MAX);
        sandbox_protocol_error(s, what);
        return -1;
    }
    if (!child_frame_legal(s, &f, &next))
        return -1;
    if (f.kind == FRAME_OUTPUT && (frame_get(&f, "stdout")->str_bytes > cap ||
                                   frame_get(&f, "stderr")->str_bytes > cap)) {
        sandbox_protocol_error(s, "output stream over --output-cap");
        return -1;
    }
    ws_conn_stream_end(s->ws, s->out_stream);
    s->out_stream = NULL;
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

/* A snapshot passed its check: what it held, for the debug log. */
static void snapshot_log(const struct session *s)
{
    struct tarcheck_stats st;
    tarcheck_get_stats(s->tc, &st);
    LOG_D("turn %" PRIu64 ": snapshot of %" PRIu64 " members, %" PRIu64
          " of them verified earlier in the turn (not inflated)",
          s->id, st.members, st.cache_hits);
}

/* The end of an 'S' check: relay, or end the turn. */
static void snapshot_checked(struct session *s, int r)
{
    char reason[120];
    if (r == TARCHECK_VALID) {
        snapshot_log(s);
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

/* ---------------------------------------------------------------- a snapshot relayed as it arrives */

/* A snapshot over RELAY_WHOLE_MAX is passed on as it arrives, checked as it
 * goes (tarcheck's windowed calls): a chunk is held until the check is past
 * it (tarcheck_next: a step budget may leave it partly read), then pushed
 * to the client; its end goes only once the check said valid, else the
 * turn is closed between its fragments (the host cannot be given a
 * zero-length archive in its place any more, as for one held whole). */
struct held_chunk {
    struct held_chunk *next;
    uint64_t base;  /* its offset in the message */
    struct buf b;   /* owned, charged */
};

void held_free(struct session *s)
{
    while (s->held) {
        struct held_chunk *h = s->held;
        s->held = h->next;
        buf_free(&h->b);
        free(h);
    }
}

static int held_add(struct session *s, struct buf *chunk)
{
    struct held_chunk *h = calloc(1, sizeof *h), **pp = &s->held;
    if (!h)
        return -ENOMEM;
    buf_init_budget(&h->b, SIZE_MAX, &s->budget);
    buf_move(&h->b, chunk); /* the same budget: nothing to charge again */
    h->base = s->in_got - h->b.len;
    while (*pp)
        pp = &(*pp)->next;
    *pp = h;
    return 0;
}

/* Pass on the held chunks that end at or before keep_from. 0 or -errno. */
static int held_release(struct session *s, uint64_t keep_from)
{
    while (s->held && s->held->base + s->held->b.len <= keep_from) {
        struct held_chunk *h = s->held;
        s->held = h->next;
        int r = ws_conn_stream_push(s->ws, s->out_stream, &h->b);
        free(h);
        if (r < 0)
            return r;
    }
    return 0;
}

#define SNAPSHOT_CALLS_PER_ROUND 4

/* Check what is held of a streamed snapshot, a few bounded calls in one
 * loop round: NEED_INPUT (read more), AGAIN (more work first: a later
 * round), VALID (at its end), or an error (refused; -EPIPE and the like:
 * relaying failed). */
static int snapshot_advance(struct session *s)
{
    for (int i = 0; i < SNAPSHOT_CALLS_PER_ROUND; i++) {
        uint64_t next = tarcheck_next(s->tc);
        struct held_chunk *h = s->held;
        while (h && !(h->base <= next && next < h->base + h->b.len))
            h = h->next;
        int r;
        if (h)
            r = (s->in_ended ? tarcheck_finish_at : tarcheck_feed_at)(
                s->tc, h->b.data, h->base, h->b.len, s->in_got);
        else if (s->in_ended)
            r = tarcheck_finish_at(s->tc, NULL, s->in_got, 0, s->in_got);
        else
            return TARCHECK_NEED_INPUT;
        int e = held_release(s, r == TARCHECK_VALID ? UINT64_MAX : tarcheck_next(s->tc));
        if (e < 0)
            return e == -EINVAL ? -EPIPE : e; /* never a check's -EINVAL: a relay error */
        if (r != TARCHECK_NEED_INPUT)
            return r;
    }
    return TARCHECK_AGAIN;
}

/* A streamed snapshot's check went as far as it could now. 0 to read on, 1
 * to stop reading (more checking first: session_work; or the client's
 * window is full), -1 after the turn ended (refused, or relaying failed). */
static int snapshot_progress(struct session *s, int r)
{
    if (r == TARCHECK_AGAIN) {
        if (!s->in_checking)
            s->set->n_working++;
        s->in_checking = true;
        return 1;
    }
    if (s->in_checking)
        s->set->n_working--;
    s->in_checking = false;
    if (r == TARCHECK_NEED_INPUT)
        return ws_conn_queued(s->ws) > s->window ? 1 : 0;
    if (r == TARCHECK_VALID) {
        snapshot_log(s);
        ws_conn_stream_end(s->ws, s->out_stream);
        s->out_stream = NULL;
        tarcheck_free(s->tc);
        s->tc = NULL;
        s->turn = TURN_BETWEEN;
        s->idle_since_ms = now_ms();
        block_over(s);
        return 0;
    }
    if (r == -EPIPE || r == -ENOMEM || r == -EDQUOT || r == -ENOSPC) {
        relay_failed(s, r, "cannot relay the workspace archive");
        return -1;
    }
    char reason[120];
    snprintf(reason, sizeof reason, "sandbox workspace archive refused: %s",
             tarcheck_reason(s->tc));
    LOG_W("turn %" PRIu64 ": %s", s->id, reason);
    s->turn = TURN_BETWEEN;
    block_over(s);
    turn_stats_end(&s->stats, TURN_END_PROTOCOL_ERROR);
    session_end(s, 1011, reason); /* between its fragments (kill_sandbox aborts it) */
    return -1;
}

/* A snapshot's check, as its limits say (one per message). NULL: out of
 * memory. */
static struct tarcheck *snapshot_check_new(struct session *s)
{
    const struct config *cfg = s->env->cfg;
    const struct tarcheck_limits lim = {.max_data = cfg->snapshot_max,
                                        .max_members = cfg->max_members};
    struct tarcheck *tc = tarcheck_new(&lim);
    if (!tc)
        return NULL;
    /* Members verified in this turn's earlier snapshots are recognised by
     * their hash instead of inflated again (tarcheck.h); its memory is
     * charged to the turn. Without one, everything is inflated. */
    if (!s->tc_cache)
        s->tc_cache = tarcheck_cache_new(TARCHECK_CACHE_MAX, &s->budget);
    tarcheck_set_cache(tc, s->tc_cache);
    return tc;
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
    /* Between blocks only a log is legal (and the first ready), and logs
     * there only go to the operator log, at the turn's log rate: a message
     * over it waits unread until the rate allows it (the tick asks again,
     * sandbox_resume), so a sandbox flooding logs waits instead of costing
     * the loop. Before the ready nothing waits (the ready must come
     * through): a log there over the rate is read but not written. */
    s->in_token = false;
    *into = NULL;
    if (m->type == CHAN_FRAME && s->turn != TURN_RUNNING && s->turn != TURN_WANT_OUTPUT) {
        s->in_token = bucket_ok(&s->sandbox_logs, now_ns());
        if (!s->in_token && s->ready_seen) {
            s->sandbox_paused = true;
            return CHAN_BEGIN_WAIT;
        }
        if (s->in_token)
            bucket_take(&s->sandbox_logs, SANDBOX_LOG_LINE_COST, now_ns());
    }
    /* While a block runs, every frame is relayed: a large one as it arrives
     * (between blocks a log must never reach the client, and "kind" may
     * come last: those are held whole, and they are small); so is a large
     * snapshot. */
    if (m->len > RELAY_WHOLE_MAX && (m->type == CHAN_SNAPSHOT || s->turn == TURN_RUNNING ||
                                     s->turn == TURN_WANT_OUTPUT)) {
        if (m->type == CHAN_SNAPSHOT && !(s->tc = snapshot_check_new(s))) {
            session_end(s, 1011, "out of memory");
            return -1;
        }
        int r = ws_conn_stream_begin(s->ws, m->type == CHAN_FRAME, &s->out_stream);
        if (r < 0) {
            relay_failed(s, r, "cannot relay a sandbox message");
            return -1;
        }
        if (m->type == CHAN_FRAME)
            frame_scan_init(s->sscan, FRAME_FROM_CHILD, relay_items_max(turn_phase(s->turn)));
        s->in_got = 0;
        s->in_ended = false;
        return CHAN_BEGIN_STREAM;
    }
    int r = m->len ? buf_reserve_exact(&s->in, m->len) : 0;
    if (r < 0) {
        budget_refused(s, r);
        return -1;
    }
    *into = &s->in;
    if (m->type == CHAN_FRAME) {
        frame_scan_init(s->sscan, FRAME_FROM_CHILD, relay_items_max(turn_phase(s->turn)));
    } else if (m->type == CHAN_SNAPSHOT && !(s->tc = snapshot_check_new(s))) {
        session_end(s, 1011, "out of memory");
        return -1;
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

/* The next chunk of a message relayed as it arrives: scanned, then passed
 * on (taken: not copied). 0 to read on, 1 to stop while the client's window
 * is full, -1 after failing the session. */
static int on_sandbox_chunk(void *ud, const struct chan_msg *m, struct buf *chunk)
{
    struct session *s = ud;
    const char *why = NULL;
    size_t n = chunk->len;
    if (m->type == CHAN_SNAPSHOT) { /* held until the check is past it */
        s->in_got += n;
        if (held_add(s, chunk) < 0) {
            session_end(s, 1011, "out of memory");
            return -1;
        }
        return snapshot_progress(s, snapshot_advance(s));
    }
    if (frame_scan_feed_at(s->sscan, chunk->data, s->in_got, n, &why) < 0) {
        sandbox_protocol_error(s, why);
        return -1;
    }
    s->in_got += n;
    int r = ws_conn_stream_push(s->ws, s->out_stream, chunk);
    if (r < 0) {
        relay_failed(s, r, "cannot relay a sandbox frame");
        return -1;
    }
    return ws_conn_queued(s->ws) > s->window ? 1 : 0;
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
    if (m->stream && m->type == CHAN_SNAPSHOT) {
        s->in_ended = true;
        return snapshot_progress(s, snapshot_advance(s)) < 0 ? -1 : 0;
    }
    if (m->stream)
        return streamed_frame_end(s, m);
    if (m->type == CHAN_SNAPSHOT) {
        int r = tarcheck_finish(s->tc, s->in.data, s->in.len);
        if (r == TARCHECK_AGAIN) {
            /* More inflating than one step: the rest in later loop rounds
             * (session_work), the channel unread meanwhile. */
            s->in_checking = true;
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
    if (s->in_checking || (s->ws && ws_conn_queued(s->ws) > s->window))
        return 1;
    return 0;
}

const struct chan_conn_handlers sandbox_handlers = {
    .on_begin = on_sandbox_begin,
    .on_data = on_sandbox_data,
    .on_chunk = on_sandbox_chunk,
    .on_end = on_sandbox_end,
};

/* The turn gets no sandbox: the fork server could not make one, or its fds
 * did not fit in our fd table (errno_reason names the limit). */
static void spawn_failed(struct session *s, int err)
{
    char reason[120];
    fs_spawn_failure(-err, reason, sizeof reason);
    session_end(s, 1011, reason);
}

/* Read what the sandbox sent, within the channel's budget. Returns 0 to
 * continue, -1 if the session was failed, 1 when the sandbox's end is
 * closed. */
int sandbox_read(struct session *s)
{
    if (s->in_checking) /* its check first (session_work) */
        return 0;
    int r = chan_conn_read(s->chan);
    if (r == -EMFILE) { /* its listener did not fit in our fd table */
        spawn_failed(s, EMFILE);
        return -1;
    }
    if (chan_conn_error(r)) {
        sandbox_protocol_error(s, chan_conn_error(r));
        return -1;
    }
    if (r == -ENOSPC || r == -EDQUOT || r == -ENOMEM) { /* a streamed chunk's room */
        budget_refused(s, r);
        return -1;
    }
    return r == -ECANCELED ? -1 : r == -EPIPE ? 1 : 0;
}

bool session_work(struct session *s)
{
    if (!s->in_checking)
        return false;
    if (s->out_stream) { /* a snapshot relayed as it arrives */
        if (snapshot_progress(s, snapshot_advance(s)) < 0)
            return false;
        if (s->in_checking)
            return true;
        if (ws_conn_want_write(s->ws) && ws_conn_write(s->ws) < 0) {
            mark_dead(s);
            return false;
        }
        update_interest(s);
        return false;
    }
    int r = tarcheck_finish(s->tc, s->in.data, s->in.len);
    if (r == TARCHECK_AGAIN)
        return true;
    s->in_checking = false;
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

static void on_sandbox_io(struct loop_watch *w, uint32_t events)
{
    struct session *s = w->ud;
    if ((events & EPOLLOUT) && chan_conn_flush(s->chan) < 0) {
        /* Its end is closed: what it sent before it went (an archive
         * error's report, while its workspace archive was still being
         * written to it) says why, not its exit status. */
        if (sandbox_read(s) < 0)
            return;
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

void sandbox_resume(struct session *s)
{
    if (!s->sandbox_paused || s->phase != PHASE_TURN || s->chan_fd < 0 || s->death_wait)
        return;
    s->sandbox_paused = false;
    on_sandbox_io(&s->chan_watch, EPOLLIN); /* its header is asked about again */
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
        spawn_failed(s, -rep->status);
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
