/* WebSocket server connection: wslay's event API for sending, our own
 * reader for receiving (see ws.h).
 *
 * Incoming: read_frames() walks the client's frames itself. wslay's reader
 * takes every payload byte through a byte-at-a-time unmask loop and a
 * byte-at-a-time UTF-8 automaton, then hands it over in 4 KiB chunks to be
 * copied again: two thirds of the supervisor's CPU for a large upload or tool
 * result (perf, 40 MiB tool result). It has no way to take payloads without
 * those loops. The checks it made are all here, each once: the header rules
 * of RFC 6455 (answered with 1002 and a reason, which wslay could not give),
 * masking, fragment sequencing, the close handshake's codes, and UTF-8 of
 * text with a word-at-a-time validator (core/utf8.h). A data frame's payload
 * is received straight into its message's buffer, whose room is reserved
 * (and charged) when the frame's header announces its length, and unmasked
 * there eight bytes at a time; small frames and headers go through rbuf.
 * Replies stay wslay's: a ping's pong and the close echo are queued with
 * wslay_event_queue_msg / wslay_event_queue_close.
 *
 * Outgoing: small messages are copied into wslay's queue (charged to the
 * budget until wslay has written them); large ones are fragmented messages
 * whose read callback copies 4 KiB at a time from our buffer into wslay's
 * frame buffer. Everything wslay writes goes through wbuf, so that a run of
 * small frames (headers, 4 KiB fragments) costs one send().
 *
 * The connection's code is cut by direction (ws_int.h: struct ws_conn, and
 * what the files call in each other):
 *   ws_in.c   what the client sends: the frame reader (ws_conn_read);
 *   ws_out.c  what goes to the client: wslay's callbacks, messages and
 *             streams queued, the socket written (ws_conn_write);
 *   ws.c      the connection: charges, closing, creation, the queries.
 * All of it runs in the supervisor's loop thread. */
#include "net/ws.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <wslay/wslay.h>

#include "core/budget.h"
#include "core/limits.h"
#include "core/outq.h"
#include "core/utf8.h"
#include "net/ws_int.h"

/* ---------------------------------------------------------------- charges */

/* Take n bytes from the budget into the account acct: 0 or the budget's
 * -EDQUOT / -ENOSPC. */
int charge(struct ws_conn *c, size_t *acct, size_t n)
{
    int r = c->budget ? budget_take(c->budget, n) : 0;
    if (r == 0)
        *acct += n;
    return r;
}

void uncharge(struct ws_conn *c, size_t *acct, size_t n)
{
    if (c->budget)
        budget_give(c->budget, n);
    *acct -= n;
}

/* What wslay holds of the messages queued (and not yet written): their
 * copies (a fragmented message's bytes are in our ws_stream, charged there)
 * and one WS_MSG_OVERHEAD each. */
static size_t wslay_held(const struct ws_conn *c)
{
    return wslay_event_get_queued_msg_length(c->ctx) +
           wslay_event_get_queued_msg_count(c->ctx) * WS_MSG_OVERHEAD;
}

/* Give back what wslay no longer holds. A close that could not be charged
 * (below) is held uncharged: this only gives back later, never more than
 * was taken. */
void copies_settle(struct ws_conn *c)
{
    size_t q = wslay_held(c);
    if (q < c->charged_copy)
        uncharge(c, &c->charged_copy, c->charged_copy - q);
}

/* A close frame: charged like the rest if the budget allows, queued in any
 * case (one per connection, at most 127 bytes). wslay's result. */
int queue_close(struct ws_conn *c, uint16_t code, const uint8_t *reason, size_t len)
{
    size_t n = (code ? 2 + len : 0) + WS_MSG_OVERHEAD;
    bool charged = charge(c, &c->charged_copy, n) == 0;
    int r = wslay_event_queue_close(c->ctx, code, reason, len);
    if (r != 0 && charged)
        uncharge(c, &c->charged_copy, n);
    if (r == 0)
        c->stalled = false; /* it goes between a stream's fragments */
    return r;
}

/* Queue a message, copied (data or control: a pong too), charged with its
 * overhead. 0, -EPIPE (closing or failed), -ENOMEM, -EINVAL or the
 * budget's -EDQUOT / -ENOSPC. */
int ws_queue(struct ws_conn *c, uint8_t opcode, const uint8_t *p, size_t n)
{
    const struct wslay_event_msg msg = {.opcode = opcode, .msg = p, .msg_length = n};
    if (c->failed)
        return -EPIPE;
    int r = charge(c, &c->charged_copy, n + WS_MSG_OVERHEAD);
    if (r < 0)
        return r;
    r = wslay_event_queue_msg(c->ctx, &msg);
    if (r == 0) {
        c->stalled = false; /* a control frame goes between a stream's fragments */
        return 0;
    }
    uncharge(c, &c->charged_copy, n + WS_MSG_OVERHEAD);
    switch (r) {
    case WSLAY_ERR_NOMEM:
        return -ENOMEM;
    case WSLAY_ERR_INVALID_ARGUMENT:
        return -EINVAL;
    default: /* WSLAY_ERR_NO_MORE_MSG: a close is queued or sent */
        return -EPIPE;
    }
}

/* ---------------------------------------------------------------- closing */

/* Our close is queued (RFC 6455 7.1.1): no message is delivered from now
 * on, nothing but the close is written, and the socket is read on, its
 * bytes discarded, until the client's close frame or EOF, so that a client
 * still sending (a pipelined archive and run) reads our close before the
 * connection ends: closing a socket with unread bytes sends a reset, and a
 * client whose write fails on it never reads the close (websockets then
 * reports 1006). What may be discarded is bounded: the rest of the frame
 * being received (at most a message) and WS_CLOSE_DRAIN_BYTES more; the
 * caller's deadline bounds the time. */
void begin_closing(struct ws_conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    uint64_t rest = c->in_payload ? c->payload_len - c->payload_got : 0;
    c->drain_left = WS_CLOSE_DRAIN_BYTES + (rest < WS_MAX_MESSAGE_BYTES ? rest : WS_MAX_MESSAGE_BYTES);
}

/* Close for a reason decided here, once. */
void refuse(struct ws_conn *c, int err, uint16_t code, const char *reason)
{
    if (c->err)
        return;
    c->err = err;
    queue_close(c, code, (const uint8_t *)reason, strlen(reason));
    begin_closing(c);
}

/* ---------------------------------------------------------------- lifetime */

struct ws_conn *ws_conn_new(int fd, struct budget *budget, const uint8_t *initial,
                            size_t initial_len, const struct ws_handlers *h, void *ud)
{
    /* Only the sending side is wslay's (see the top of this file). */
    const struct wslay_event_callbacks cbs = {.send_callback = ws_send_cb};
    struct ws_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->fd = fd;
    c->h = *h;
    c->ud = ud;
    c->budget = budget;
    c->reading = true;
    buf_init_budget(&c->msg, SIZE_MAX, budget);
    if (initial_len > 0) {
        c->rcap = initial_len > WS_RBUF ? initial_len : WS_RBUF;
        c->rbuf = charge(c, &c->charged_io, c->rcap) == 0 ? malloc(c->rcap) : NULL;
        if (c->rbuf) {
            memcpy(c->rbuf, initial, initial_len);
            c->rlen = initial_len;
            c->bytes_in = initial_len;
            c->read_more = true;
        }
    }
    if ((initial_len > 0 && !c->rbuf) || wslay_event_context_server_init(&c->ctx, &cbs, c) != 0) {
        if (c->budget)
            budget_give(c->budget, c->charged_io);
        free(c->rbuf);
        free(c);
        return NULL;
    }
    return c;
}

void ws_conn_free(struct ws_conn *c)
{
    if (!c)
        return;
    wslay_event_context_free(c->ctx);
    while (c->srcs) {
        struct ws_stream *st = c->srcs;
        c->srcs = st->next;
        stream_free(st);
    }
    if (c->budget)
        budget_give(c->budget, c->charged_copy + c->charged_io);
    buf_free(&c->msg);
    free(c->rbuf);
    free(c->wbuf);
    free(c);
}

int ws_status(const struct ws_conn *c)
{
    if (c->io_failed)
        return -ECONNRESET;
    if (c->failed)
        return -EPIPE;
    if (ws_conn_finished(c))
        return -ESHUTDOWN;
    return 0;
}

/* Longest prefix of s, at most max bytes, that does not split a UTF-8
 * sequence (a close reason must be valid UTF-8: RFC 6455 5.5.1). */
static size_t utf8_prefix(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n <= max)
        return n;
    n = max;
    while (n > 0 && ((uint8_t)s[n] & 0xC0) == 0x80)
        n--;
    return n;
}

int ws_conn_close(struct ws_conn *c, uint16_t code, const char *reason)
{
    /* 125 bytes of control payload minus the 2-byte code. */
    size_t len = reason ? utf8_prefix(reason, 123) : 0;

    if (c->failed)
        return -EPIPE;
    int r = queue_close(c, code, (const uint8_t *)reason, len);
    if (r == WSLAY_ERR_NOMEM)
        return -ENOMEM;
    if (r == WSLAY_ERR_INVALID_ARGUMENT)
        return -EINVAL;
    if (r != 0)
        return -EPIPE;
    /* Once we have decided to close, messages still in flight from the peer
     * must not reach the handlers (this also ends a read_frames loop that a
     * handler closed from); they are discarded until the client's close
     * (begin_closing). */
    begin_closing(c);
    return 0;
}

int ws_conn_refused(const struct ws_conn *c)
{
    return c->err;
}

bool ws_conn_want_read(const struct ws_conn *c)
{
    /* Closing, what arrives is discarded whatever waits to be sent or paced:
     * only the client's close frame matters then (begin_closing). */
    return !c->failed && !c->io_failed && c->reading && (c->closing || !held(c));
}

void ws_conn_set_window(struct ws_conn *c, size_t window)
{
    c->window = window;
}

void ws_conn_pause(struct ws_conn *c, bool paused)
{
    c->paused = paused;
}

bool ws_conn_want_write(const struct ws_conn *c)
{
    return !c->failed && (c->wlen > c->woff || (wslay_event_want_write(c->ctx) && !c->stalled));
}

bool ws_conn_read_more(const struct ws_conn *c)
{
    return c->read_more && ws_conn_want_read(c);
}

size_t ws_conn_queued(const struct ws_conn *c)
{
    size_t q = wslay_held(c) + (c->wlen - c->woff);
    for (const struct ws_stream *st = c->srcs; st; st = st->next)
        q += st->q.held; /* what is charged, not only the bytes: a window counts memory */
    return q;
}

bool ws_conn_pending(const struct ws_conn *c)
{
    /* Behind an aborted stream nothing can go any more: not pending. */
    return (wslay_event_get_queued_msg_count(c->ctx) > 0 && !c->stuck) || c->wlen > c->woff;
}

bool ws_conn_finished(const struct ws_conn *c)
{
    if (c->failed)
        return true;
    if (c->wlen > c->woff)
        return false; /* our last bytes (maybe the close) are still gathered */
    /* wslay stops writing once its close frame is out; the connection is
     * over once the client's close came too (or its EOF, or the drain's
     * budget ran out: reading is over). */
    if (wslay_event_get_close_sent(c->ctx))
        return !c->reading;
    /* A received close queues our reply; done once that is written (the
     * reply cannot be queued only if ours already was, caught above). */
    return c->close_received && !wslay_event_want_write(c->ctx);
}

void ws_conn_bytes(const struct ws_conn *c, uint64_t *in, uint64_t *out)
{
    *in = c ? c->bytes_in : 0;
    *out = c ? c->bytes_out : 0;
}
