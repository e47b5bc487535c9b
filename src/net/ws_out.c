/* The connection's output: wslay's send callback into wbuf (a run of small
 * frames costs one send()), messages queued whole or as streams whose bytes
 * come as they are produced (read by wslay in fragments), the socket
 * written. Runs in the supervisor's loop thread.
 *
 * Relies on ws.c for the charges (charge, uncharge, copies_settle), for
 * ws_queue, which queues a small message or control frame, and for the
 * connection's status (ws_status); on ws_in.c for whether reading holds
 * (held). */
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

#define WS_WBUF_DIRECT 16384   /* writes this large skip wbuf when it is empty */

/* Write what wbuf holds: 0 when empty, 1 if the socket is full, -1 on error. */
int wflush(struct ws_conn *c)
{
    while (c->woff < c->wlen) {
        ssize_t r = send(c->fd, c->wbuf + c->woff, c->wlen - c->woff, MSG_NOSIGNAL);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 1;
            c->io_failed = true;
            return -1;
        }
        c->woff += (size_t)r;
        c->bytes_out += (uint64_t)r;
    }
    c->woff = c->wlen = 0;
    return 0;
}

/* The gathering buffer, made (and charged) if it is not there: false if
 * it cannot be; writes then go straight to the socket (a close must go out
 * also when the budget is spent). */
static bool wbuf_get(struct ws_conn *c)
{
    if (c->wbuf)
        return true;
    if (charge(c, &c->charged_io, WS_WBUF) < 0)
        return false;
    if (!(c->wbuf = malloc(WS_WBUF))) {
        uncharge(c, &c->charged_io, WS_WBUF);
        return false;
    }
    return true;
}

ssize_t ws_send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags,
                   void *user_data)
{
    struct ws_conn *c = user_data;
    if (c->wlen && WS_WBUF - c->wlen < len && wflush(c) < 0)
        goto fail;
    if (c->wlen == 0 && (len >= WS_WBUF_DIRECT || !wbuf_get(c))) {
        /* large and nothing gathered before it: straight to the socket */
        for (;;) {
            ssize_t r = send(c->fd, data, len, MSG_NOSIGNAL);
            if (r >= 0) {
                c->bytes_out += (uint64_t)r;
                return r;
            }
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                goto block;
            c->io_failed = true;
            goto fail;
        }
    }
    if (c->woff == c->wlen)
        c->woff = c->wlen = 0;
    size_t room = WS_WBUF - c->wlen;
    if (room == 0)
        goto block;
    if (len > room)
        len = room;
    memcpy(c->wbuf + c->wlen, data, len);
    c->wlen += len;
    return (ssize_t)len;
block:
    wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
    return -1;
fail:
    wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
    return -1;
}

/* wslay reads the next fragment of a ws_stream. Its last byte is held back
 * until the stream is ended, so the peer never has the message whole
 * before that (a close queued meanwhile goes out between fragments);
 * nothing to give stalls wslay (returning 0 without eof: it stops, and
 * sends control frames queued since first when it is called again). */
static ssize_t src_read(wslay_event_context_ptr ctx, uint8_t *buf, size_t len,
                        const union wslay_event_msg_source *source, int *eof, void *user_data)
{
    struct ws_conn *c = user_data;
    struct ws_stream *st = source->data;
    size_t avail = st->q.bytes;
    if (st->aborted) {
        c->stuck = c->stalled = true;
        return 0;
    }
    if (!st->ended)
        avail = avail ? avail - 1 : 0;
    if (avail == 0) {
        c->stalled = true;
        return 0;
    }
    size_t n = outq_read(&st->q, buf, avail < len ? avail : len);
    if (st->ended && st->q.bytes == 0) {
        *eof = 1;
        st->done = true; /* wslay has the last bytes in its own buffer */
    }
    return (ssize_t)n;
}

void stream_free(struct ws_stream *st)
{
    outq_free(&st->q);
    free(st);
}

/* Free the streams wslay has read to the end. */
static void srcs_reap(struct ws_conn *c)
{
    for (struct ws_stream **pp = &c->srcs; *pp;) {
        struct ws_stream *st = *pp;
        if (st->done) {
            *pp = st->next;
            stream_free(st);
        } else {
            pp = &st->next;
        }
    }
}

int ws_conn_write(struct ws_conn *c)
{
    if (c->failed)
        return ws_status(c);
    if (wflush(c) < 0)
        return ws_status(c);
    if (wslay_event_send(c->ctx) != 0)
        c->failed = true;
    if (wflush(c) == 0 && c->wbuf) { /* all out: give the gathering buffer back */
        uncharge(c, &c->charged_io, WS_WBUF);
        free(c->wbuf);
        c->wbuf = NULL;
    }
    copies_settle(c);
    srcs_reap(c);
    return ws_status(c);
}

int ws_conn_send_text(struct ws_conn *c, const uint8_t *p, size_t n)
{
    return ws_queue(c, WSLAY_TEXT_FRAME, p, n);
}

int ws_conn_send_binary(struct ws_conn *c, const uint8_t *p, size_t n)
{
    return ws_queue(c, WSLAY_BINARY_FRAME, p, n);
}

int ws_conn_send_buf(struct ws_conn *c, bool text, struct buf *b)
{
    uint8_t opcode = text ? WSLAY_TEXT_FRAME : WSLAY_BINARY_FRAME;
    if (b->len <= WS_SEND_COPY_MAX || c->failed) {
        int r = ws_queue(c, opcode, b->data, b->len);
        buf_free(b);
        return r;
    }
    struct ws_stream *st;
    int r = ws_conn_stream_begin(c, text, &st);
    if (r < 0) {
        buf_free(b);
        return r;
    }
    r = ws_conn_stream_push(c, st, b);
    ws_conn_stream_end(c, st); /* the stream is the connection's from here on */
    return r;
}

int ws_conn_stream_begin(struct ws_conn *c, bool text, struct ws_stream **out)
{
    if (c->failed)
        return -EPIPE;
    struct ws_stream *st = calloc(1, sizeof *st);
    if (!st)
        return -ENOMEM;
    outq_init(&st->q, c->budget);
    const struct wslay_event_fragmented_msg msg = {
        .opcode = text ? WSLAY_TEXT_FRAME : WSLAY_BINARY_FRAME, .source.data = st,
        .read_callback = src_read};
    int r = charge(c, &c->charged_copy, WS_MSG_OVERHEAD);
    if (r == 0 && wslay_event_queue_fragmented_msg(c->ctx, &msg) != 0) {
        uncharge(c, &c->charged_copy, WS_MSG_OVERHEAD);
        r = -EPIPE;
    }
    if (r < 0) {
        free(st);
        return r;
    }
    st->next = c->srcs;
    c->srcs = st;
    c->stalled = false;
    *out = st;
    return 0;
}

int ws_conn_stream_push(struct ws_conn *c, struct ws_stream *st, struct buf *chunk)
{
    size_t n = chunk->len;
    if (st->ended || st->aborted) {
        buf_free(chunk);
        return -EINVAL;
    }
    int r = outq_take(&st->q, chunk);
    if (r == 0 && n)
        c->stalled = false;
    return r;
}

void ws_conn_stream_end(struct ws_conn *c, struct ws_stream *st)
{
    st->ended = true;
    c->stalled = false;
}

void ws_conn_stream_abort(struct ws_conn *c, struct ws_stream *st)
{
    outq_free(&st->q);
    st->aborted = true;
    c->stalled = false; /* wslay finds out, if it is its message (src_read) */
}

int ws_conn_send_ping(struct ws_conn *c)
{
    return ws_queue(c, WSLAY_PING, NULL, 0);
}
