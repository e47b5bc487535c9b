/* The client's WebSocket messages in an admitted turn (spec 2.3; the
 * table is in docs/internals.md): which message may come in the turn's
 * state and how large (on_msg_begin, so net/ws.c refuses the rest at its
 * header), the scan of a text message as it arrives, and what a complete
 * one does: an archive, run or a tool_result is queued for the sandbox,
 * shutdown ends the turn. Runs in the supervisor.
 *
 * What the client sends is checked as from_sandbox.c checks the sandbox
 * (limits at frame headers, budgets, incremental scan). A frame already in
 * the supervisor's encoding is passed on as it came, and a large value is
 * not copied (sandbox_send_frame). Relies on chan_conn.c for the channel's
 * queue, on turn.c to end the turn and on session.c for what the sockets
 * wait for (update_interest). */
#include <stdbool.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/limits.h"
#include "core/util.h"
#include "net/ws.h"
#include "proto/chan.h"
#include "proto/frame.h"
#include "proto/relay.h"
#include "session/chan_conn.h"
#include "session/metrics.h"
#include "session/session.h"
#include "session/session_int.h"

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

/* ---------------------------------------------------------------- client messages */

/* End the turn normally (1000): the client's shutdown, or (end
 * TURN_END_CLIENT_ERROR) a message the client should not have sent there. */
static void end_turn(struct session *s, enum turn_end end)
{
    turn_stats_end(&s->stats, end);
    session_end(s, 1000, NULL);
}

/* An archive was queued for the sandbox (r: how that went): the tools
 * archive makes the turn wait for blocks, a workspace archive for its run. */
static void archive_queued(struct session *s, int r)
{
    bool tools = s->turn == TURN_TOOLS;
    if (r < 0) {
        session_end(s, 1011, "cannot queue the archive for the sandbox");
        return;
    }
    s->tools_sent = s->tools_sent || tools;
    s->turn = tools ? TURN_BETWEEN : TURN_ARCHIVED;
    if (tools)
        s->idle_since_ms = now_ms();
}

/* The run went to the sandbox: the block runs. */
static void block_started(struct session *s)
{
    s->turn = TURN_RUNNING;
    s->block_started_ms = now_ms();
    s->stats.blocks++;
    s->stats.block_started_ns = now_ns();
}

/* The client made us read cost (bytes, pings) only to ignore it: past its
 * turn's allowance it is not read until the bucket refills (client_resume,
 * from the tick), so a flood waits instead of costing the loop. */
static void client_charge(struct session *s, struct bucket *b, uint64_t cost)
{
    if (!bucket_take(b, cost, now_ns()) && !s->client_paused) {
        s->client_paused = true;
        ws_conn_pause(s->ws, true);
    }
}

/* A message the turn's state ignores: what it costs to read and drop (one
 * read whole counts at most a burst: the pause it earns stays short). */
static void ignored(struct session *s, uint64_t len)
{
    uint64_t cost = len > CLIENT_IGNORED_MSG_COST ? len : CLIENT_IGNORED_MSG_COST;
    client_charge(s, &s->client_ignored, cost < CLIENT_IGNORED_BURST ? cost : CLIENT_IGNORED_BURST);
}

/* A message the state ignores, dropped unread: its start is charged here,
 * its payload as it is read (on_dropped). */
static uint64_t drop(struct session *s)
{
    ignored(s, 0);
    return WS_MSG_DROP;
}

/* What a message from the client may be in the turn's state: its largest
 * size, or 0 to drop it unread (ws.h). One that may be large (over
 * RELAY_WHOLE_MAX, or fragmented: its length unknown) is streamed: each
 * chunk scanned and, if the state forwards it, passed on to the sandbox as
 * a part of a channel message (chan.h), nothing of it kept here; its last
 * part only once it passed, else its parts are dropped (CHAN_ABORT). */
static uint64_t on_msg_begin(void *ud, struct ws_msg_start *m)
{
    struct session *s = ud;
    const struct config *cfg = s->env->cfg;
    if (s->phase != PHASE_TURN)
        return WS_MSG_DROP;
    s->cmsg_stream = m->stream = !m->fin || m->len > RELAY_WHOLE_MAX;
    s->cmsg_got = 0;
    s->cmsg_parts = s->cmsg_sent = false;
    if (m->text) {
        switch (s->turn) {
        case TURN_TOOLS: /* text instead of the tools archive */
            end_turn(s, TURN_END_CLIENT_ERROR);
            return WS_MSG_DROP;
        case TURN_BETWEEN:  /* only shutdown matters: scanned, not forwarded */
        case TURN_ARCHIVED: /* run */
        case TURN_RUNNING:  /* tool_result */
            frame_scan_init(s->cscan, FRAME_FROM_CLIENT, 0);
            s->cmsg_bad = false;
            s->cmsg_parts = s->cmsg_stream && s->turn != TURN_BETWEEN;
            return WS_MAX_MESSAGE_BYTES;
        default: /* after done: results are no longer wanted */
            return drop(s);
        }
    }
    s->cmsg_bad = true; /* an archive: not scanned */
    s->cmsg_parts = s->cmsg_stream;
    switch (s->turn) {
    case TURN_TOOLS:
        return cfg->max_upload_tools;
    case TURN_BETWEEN:
        return cfg->max_upload_workspace;
    case TURN_ARCHIVED: /* a second archive where run was due */
        end_turn(s, TURN_END_CLIENT_ERROR);
        return WS_MSG_DROP;
    default: /* ignored while a block runs (spec 2.3) */
        return drop(s);
    }
}

static void on_dropped(void *ud, size_t n)
{
    struct session *s = ud;
    if (s->phase == PHASE_TURN)
        client_charge(s, &s->client_ignored, n);
}

/* The channel type a streamed client message goes to the sandbox as. */
static enum chan_type cmsg_type(const struct session *s)
{
    return s->turn == TURN_TOOLS ? CHAN_TOOLS : s->turn == TURN_BETWEEN ? CHAN_WORKSPACE
                                                                      : CHAN_FRAME;
}

/* A streamed message's last part (flags 0 or CHAN_RAW), or CHAN_ABORT (of
 * the parts sent: nothing if none was). */
static int parts_end(struct session *s, unsigned flags)
{
    struct buf none;
    buf_init(&none, 0);
    bool sent = s->cmsg_sent;
    s->cmsg_parts = s->cmsg_sent = false;
    if (flags == CHAN_ABORT && !sent)
        return 0;
    int r = chan_conn_send_part(s->chan, cmsg_type(s), flags, &none);
    update_interest(s);
    return r;
}

/* A chunk of a streamed client message. False (stop reading the client for
 * now) once a window waits for the sandbox: a read's budget of tiny
 * fragments makes as many parts, each holding its envelope's memory too. */
static bool on_msg_chunk(void *ud, struct buf *chunk)
{
    struct session *s = ud;
    if (s->phase != PHASE_TURN)
        return false;
    const char *why;
    size_t n = chunk->len;
    if (!s->cmsg_bad && frame_scan_feed_at(s->cscan, chunk->data, s->cmsg_got, n, &why) < 0) {
        s->cmsg_bad = true;
        if (s->turn == TURN_ARCHIVED) { /* spec 2.3: undecodable text in R ends the turn */
            end_turn(s, TURN_END_CLIENT_ERROR);
            return false;
        }
        if (s->cmsg_parts && parts_end(s, CHAN_ABORT) < 0) { /* a result dropped alone */
            session_end(s, 1011, "cannot queue a tool result for the sandbox");
            return false;
        }
    }
    s->cmsg_got += n;
    if (!s->cmsg_parts) { /* scanned only: text between blocks, or one found bad */
        client_charge(s, &s->client_ignored, n);
        return true;
    }
    struct buf part;
    buf_init_budget(&part, SIZE_MAX, &s->budget);
    buf_move(&part, chunk);
    if (chan_conn_send_part(s->chan, cmsg_type(s), CHAN_MORE, &part) < 0) {
        session_end(s, 1011, "cannot queue a message for the sandbox");
        return false;
    }
    s->cmsg_sent = true;
    update_interest(s);
    return chan_conn_held(s->chan) < s->window;
}

/* A streamed message is complete (its parts, if forwarded, are queued): its
 * verdict, as on_text and on_msg_end decide for one held whole. */
static void streamed_end(struct session *s, bool text)
{
    if (!text) { /* an archive */
        archive_queued(s, parts_end(s, 0));
        return;
    }
    struct frame f;
    bool ok = !s->cmsg_bad &&
              frame_scan_end(s->cscan, s->cmsg_got, FRAME_FROM_CLIENT, &f, NULL) == 0;
    unsigned raw = ok && !f.canonical ? CHAN_RAW : 0; /* the sandbox decodes it whole */
    switch (s->turn) {
    case TURN_BETWEEN:
        if (ok && f.kind == FRAME_SHUTDOWN)
            end_turn(s, TURN_END_OK);
        break;
    case TURN_ARCHIVED:
        if (!ok || f.kind != FRAME_RUN) {
            end_turn(s, TURN_END_CLIENT_ERROR);
            break;
        }
        if (parts_end(s, raw) < 0) {
            session_end(s, 1011, "cannot queue the block for the sandbox");
            break;
        }
        block_started(s);
        break;
    case TURN_RUNNING:
        if (s->cmsg_parts && parts_end(s, ok && f.kind == FRAME_TOOL_RESULT ? raw : CHAN_ABORT) < 0)
            session_end(s, 1011, "cannot queue a tool result for the sandbox");
        else if (!ok || f.kind != FRAME_TOOL_RESULT)
            ignored(s, 0);
        break;
    default:
        break;
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
        else
            ignored(s, msg->len);
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
        block_started(s);
        break;
    case TURN_RUNNING:
        /* Results go to the sandbox; an undecodable message is dropped alone
         * (spec 9.2 "channel poisoning"); other frames are ignored. */
        if (!ok || f.kind != FRAME_TOOL_RESULT)
            ignored(s, msg->len);
        else if (sandbox_send_frame(s, &f, msg) < 0)
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
    if (s->cmsg_stream) {
        streamed_end(s, text);
        return;
    }
    if (text) {
        on_text(s, msg);
        return;
    }
    if (s->turn != TURN_TOOLS && s->turn != TURN_BETWEEN)
        return;
    archive_queued(s, sandbox_send(s, s->turn == TURN_TOOLS ? CHAN_TOOLS : CHAN_WORKSPACE, msg));
}

static void on_ws_pong(void *ud)
{
    struct session *s = ud;
    if (s->phase != PHASE_TURN)
        return;
    if (!s->ping_outstanding) /* unsolicited: ignored */
        ignored(s, 0);
    s->ping_outstanding = false;
}

static void on_ws_ping(void *ud)
{
    struct session *s = ud;
    if (s->phase == PHASE_TURN)
        client_charge(s, &s->client_pings, 1);
}

const struct ws_handlers client_handlers = {
    .on_msg_begin = on_msg_begin,
    .on_msg_data = on_msg_data,
    .on_msg_end = on_msg_end,
    .on_pong = on_ws_pong,
    .on_ping = on_ws_ping,
    .on_dropped = on_dropped,
    .on_msg_chunk = on_msg_chunk,
};
