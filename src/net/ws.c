/* WebSocket server connection over wslay's event API (see ws.h).
 *
 * Incoming: wslay runs with buffering off and hands us each frame's payload
 * in chunks (on_frame_recv_*); this file appends data frames to the current
 * message's buffer, whose room is reserved (and charged) when a frame header
 * announces its length, and calls the handlers. Before wslay sees any byte,
 * hdr_check() walks the frame headers in the byte stream for the protocol
 * errors wslay would answer with an empty close frame (RFC 6455 wants 1002);
 * a header is only handed to wslay once it is complete and checked.
 *
 * Outgoing: small messages are copied into wslay's queue (charged to the
 * budget until wslay has written them); large ones are fragmented messages
 * whose read callback copies 4 KiB at a time from our buffer into wslay's
 * frame buffer. Everything wslay writes goes through wbuf, so that a run of
 * small frames (headers, 4 KiB fragments) costs one send(). */
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
#include "core/utf8.h"

#define WS_HDR_MAX 14          /* 2 + 8 (length) + 4 (mask) */
#define WS_WBUF (64 * 1024)    /* gathered writes */
#define WS_WBUF_DIRECT 16384   /* writes this large skip wbuf when it is empty */

/* A large outgoing message being read by wslay in fragments. */
struct ws_src {
    struct ws_src *next;
    struct buf data; /* owned, charged */
    size_t off;      /* bytes handed to wslay */
};

struct ws_conn {
    int fd;                       /* borrowed: the caller closes it */
    wslay_event_context_ptr ctx;  /* owned */
    struct ws_handlers h;
    void *ud;
    struct budget *budget;        /* borrowed, may be NULL */

    /* input */
    uint8_t *initial;             /* owned: bytes read past the HTTP request */
    size_t initial_len, initial_off;
    size_t read_left;             /* byte budget left in the current ws_conn_read */
    bool read_more;               /* the last read stopped on the budget, not EAGAIN */
    uint8_t hold[WS_HDR_MAX];     /* an incomplete frame header not yet given to wslay */
    size_t hold_len;
    uint64_t payload_left;        /* hdr_check: payload bytes before the next header */
    bool hdr_msg_open;            /* hdr_check: a data message is between its frames */
    struct {                      /* a data frame's header that ended the bytes last given
                                     to wslay: wslay reports a frame only once a payload
                                     byte arrives, so its limits are applied here when
                                     wslay next asks for bytes (see ws_recv_cb) */
        bool set;
        uint8_t opcode;
        bool fin;
        uint64_t len;
    } naked;
    bool begun_early;             /* the frame being received was begun from naked */
    bool frame_data;              /* the frame being received belongs to the message */
    bool frame_close;             /* the frame being received is a close frame: */
    uint8_t close_buf[125];       /*   its payload, checked whole (wslay checks the
                                       reason's UTF-8 per chunk, from each chunk's
                                       third byte, and would echo a bad one) */
    size_t close_len;
    bool frame_fin;
    bool msg_text, msg_drop;      /* the current data message */
    uint64_t msg_limit;
    uint64_t msg_announced;       /* its frames' lengths so far, dropped or not */
    struct buf msg;               /* owned, charged: the message so far */

    /* output */
    struct ws_src *srcs;          /* owned: fragmented messages not yet fully read */
    size_t src_left;              /* bytes in srcs not yet handed to wslay */
    size_t charged_copy;          /* charged for wslay's copies of queued messages */
    uint8_t *wbuf;                /* owned, WS_WBUF bytes while writes are gathered, else NULL
                                     (an idle connection holds none) */
    size_t wlen, woff;            /* wbuf[woff..wlen) is waiting for the socket */

    int err;                      /* why this module closed (ws_conn_read's return) */
    char reason[124];             /* a close reason with figures in it */
    const char *bad;              /* a protocol error found by hdr_check, refused once
                                     wslay has taken the frames before it */
    bool io_failed;               /* EOF or a socket error: nothing more can move */
    bool failed;                  /* wslay gave up (I/O, protocol or memory) */
};

/* ---------------------------------------------------------------- closing */

/* Close for a reason decided here, once; reading stops. */
static void refuse(struct ws_conn *c, int err, uint16_t code, const char *reason)
{
    if (c->err)
        return;
    c->err = err;
    wslay_event_queue_close(c->ctx, code, (const uint8_t *)reason, strlen(reason));
    wslay_event_shutdown_read(c->ctx);
}

/* ---------------------------------------------------------------- input */

/* Walk the frame headers in p[0..n) (the stream continues from the last
 * call). Returns how many bytes may go to wslay: all of them, or up to the
 * start of a header that is incomplete (*hold_from = that start) or that is
 * a protocol error (refused here). */
static size_t hdr_check(struct ws_conn *c, const uint8_t *p, size_t n, size_t *hold_from)
{
    size_t i = 0;
    *hold_from = n;
    c->naked.set = false;
    for (;;) {
        uint64_t skip = c->payload_left < n - i ? c->payload_left : n - i;
        i += skip;
        c->payload_left -= skip;
        if (i >= n)
            return n;
        /* a header starts at p[i] */
        if (n - i < 2) {
            *hold_from = i;
            return i;
        }
        uint8_t b0 = p[i], b1 = p[i + 1], opcode = b0 & 0x0F, len7 = b1 & 0x7F;
        size_t need = 2 + (len7 == 126 ? 2 : len7 == 127 ? 8 : 0) + ((b1 & 0x80) ? 4 : 0);
        if (n - i < need) {
            *hold_from = i;
            return i;
        }
        uint64_t len = len7;
        if (len7 == 126)
            len = (uint64_t)p[i + 2] << 8 | p[i + 3];
        else if (len7 == 127)
            for (int k = 0; k < 8; k++)
                len = (k ? len << 8 : 0) | p[i + 2 + k];
        bool data = !(opcode & 0x8), fin = b0 & 0x80;
        const char *bad = NULL;
        if (b0 & 0x70)
            bad = "reserved bits set";
        else if ((opcode > WSLAY_BINARY_FRAME && data) || opcode > WSLAY_PONG)
            bad = "unknown opcode";
        else if (data && (opcode == WSLAY_CONTINUATION_FRAME) != c->hdr_msg_open)
            bad = c->hdr_msg_open ? "new message before the last one ended"
                                  : "continuation frame outside a message";
        else if (!data && (len > 125 || !fin))
            bad = "control frame too long or fragmented";
        else if ((len7 == 126 && len < 126) || (len7 == 127 && len < 65536))
            bad = "frame length not in its shortest form";
        else if (len7 == 127 && (len >> 63))
            bad = "frame length over 2^63";
        else if (opcode == WSLAY_CONNECTION_CLOSE && len == 1)
            bad = "close frame with a 1-byte payload";
        if (bad) {
            c->bad = bad;
            return i;
        }
        i += need;
        c->payload_left = len;
        if (data)
            c->hdr_msg_open = !fin;
        c->naked.set = data && len > 0 && i == n;
        if (c->naked.set) {
            c->naked.opcode = opcode;
            c->naked.fin = fin;
            c->naked.len = len;
        }
    }
}

/* Fill buf with the next input bytes (held-back header bytes first, then the
 * initial bytes, then the socket): the count, 0 for "none now", -1 on EOF or
 * a socket error. */
static ssize_t fill(struct ws_conn *c, uint8_t *buf, size_t len)
{
    /* wslay asks for bytes with ~4 KiB free (it keeps no partial header,
     * since it only ever gets complete ones); be exact all the same. */
    size_t got = c->hold_len < len ? c->hold_len : len;
    memcpy(buf, c->hold, got);
    memmove(c->hold, c->hold + got, c->hold_len - got);
    c->hold_len -= got;
    if (c->hold_len)
        return (ssize_t)got;
    if (c->initial_off < c->initial_len) {
        /* already in memory: no read budget for them */
        size_t k = c->initial_len - c->initial_off;
        if (k > len - got)
            k = len - got;
        memcpy(buf + got, c->initial + c->initial_off, k);
        c->initial_off += k;
        got += k;
        if (c->initial_off == c->initial_len) {
            free(c->initial);
            c->initial = NULL;
            c->initial_len = c->initial_off = 0;
        }
        return (ssize_t)got;
    }
    if (c->read_left == 0) {
        c->read_more = true;
        return (ssize_t)got;
    }
    size_t want = len - got < c->read_left ? len - got : c->read_left;
    for (;;) {
        ssize_t r = recv(c->fd, buf + got, want, 0);
        if (r > 0) {
            c->read_left -= (size_t)r;
            return (ssize_t)(got + (size_t)r);
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return (ssize_t)got;
        return -1; /* EOF (r == 0) or a real error */
    }
}

static void frame_begin(struct ws_conn *c, uint8_t opcode, bool fin, uint64_t len);

static ssize_t ws_recv_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags,
                          void *user_data)
{
    struct ws_conn *c = user_data;
    if (c->naked.set && !c->err) {
        /* wslay asks for bytes only when it has taken all it was given: the
         * frame whose header ended them is now wslay's current one. An
         * announced length over the limit is refused here, before any of
         * its payload is read (wslay would report the frame only with its
         * first payload byte). */
        c->naked.set = false;
        c->begun_early = true;
        frame_begin(c, c->naked.opcode, c->naked.fin, c->naked.len);
    }
    if (c->bad) /* wslay has taken every byte before the bad header */
        refuse(c, -EPROTO, WSLAY_CODE_PROTOCOL_ERROR, c->bad);
    if (c->err) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
        return -1;
    }
    for (;;) {
        size_t held = c->hold_len;
        ssize_t got = fill(c, buf, len);
        if (got < 0) {
            /* Returning 0 would read as "would block" to wslay, so EOF must
             * be reported as a failure. */
            c->io_failed = true;
            wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
            return -1;
        }
        size_t hold_from, ok = hdr_check(c, buf, (size_t)got, &hold_from);
        if (hold_from < (size_t)got && !c->bad) {
            c->hold_len = (size_t)got - hold_from;
            memmove(c->hold, buf + hold_from, c->hold_len);
        }
        if (ok > 0)
            return (ssize_t)ok;
        /* Only part of a header so far: read on while bytes come, as wslay
         * would (and so that an EOF behind them is seen now). */
        if (c->bad) {
            refuse(c, -EPROTO, WSLAY_CODE_PROTOCOL_ERROR, c->bad);
            wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
            return -1;
        }
        if ((size_t)got <= held) {
            wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
            return -1;
        }
    }
}

static void msg_reset(struct ws_conn *c)
{
    buf_free(&c->msg);
    c->msg_drop = false;
    c->msg_limit = 0;
}

/* A data frame begins: its message's limit (asked of the handler at a
 * message's first frame), the 256 MiB cap and the budget are applied to the
 * length its header announces, before any of its payload is taken. */
static void frame_begin(struct ws_conn *c, uint8_t opcode, bool fin, uint64_t len)
{
    if (opcode != WSLAY_CONTINUATION_FRAME) {
        msg_reset(c);
        c->msg_text = opcode == WSLAY_TEXT_FRAME;
        c->msg_limit = c->h.on_msg_begin ? c->h.on_msg_begin(c->ud, c->msg_text) : WS_MSG_DROP;
        c->msg_drop = c->msg_limit == WS_MSG_DROP;
        c->msg_announced = 0;
    }
    c->frame_data = true;
    c->frame_fin = fin;
    if (c->err)
        return;
    /* spec 1.4: 256 MiB per message, whatever happens to it */
    c->msg_announced += len;
    uint64_t limit = c->msg_drop ? WS_MAX_MESSAGE_BYTES : c->msg_limit;
    if (c->msg_announced > WS_MAX_MESSAGE_BYTES ||
        (!c->msg_drop && len > c->msg_limit - c->msg.len)) {
        snprintf(c->reason, sizeof c->reason,
                 "message too large: %llu bytes announced, the limit here is %llu",
                 (unsigned long long)c->msg_announced,
                 (unsigned long long)(limit < WS_MAX_MESSAGE_BYTES ? limit : WS_MAX_MESSAGE_BYTES));
        refuse(c, -EMSGSIZE, WSLAY_CODE_MESSAGE_TOO_BIG, c->reason);
        return;
    }
    if (c->msg_drop)
        return;
    int r = buf_reserve_exact(&c->msg, (size_t)len);
    if (r == -ENOSPC)
        refuse(c, -ENOSPC, 1013, "server memory budget exhausted, try again later");
    else if (r == -EDQUOT || r == -ENOBUFS)
        refuse(c, -EMSGSIZE, WSLAY_CODE_MESSAGE_TOO_BIG, "message over the turn's memory budget");
    else if (r < 0)
        refuse(c, -ENOMEM, WSLAY_CODE_INTERNAL_SERVER_ERROR, "out of memory");
}

static void on_frame_start(wslay_event_context_ptr ctx,
                           const struct wslay_event_on_frame_recv_start_arg *arg, void *user_data)
{
    struct ws_conn *c = user_data;
    c->frame_close = arg->opcode == WSLAY_CONNECTION_CLOSE;
    c->close_len = 0;
    if (c->begun_early) { /* ws_recv_cb began this one from its header */
        c->begun_early = false;
        return;
    }
    c->frame_data = false;
    if (arg->opcode & 0x8 || c->err)
        return; /* control frames are wslay's */
    frame_begin(c, arg->opcode, arg->fin, arg->payload_length);
}

static void on_frame_chunk(wslay_event_context_ptr ctx,
                           const struct wslay_event_on_frame_recv_chunk_arg *arg, void *user_data)
{
    struct ws_conn *c = user_data;
    if (c->frame_close) {
        size_t k = arg->data_length < sizeof c->close_buf - c->close_len
                        ? arg->data_length : sizeof c->close_buf - c->close_len;
        memcpy(c->close_buf + c->close_len, arg->data, k);
        c->close_len += k;
        return;
    }
    if (!c->frame_data || c->msg_drop || c->err || arg->data_length == 0)
        return;
    /* The room was reserved at the frame's start: this cannot fail. */
    if (buf_append(&c->msg, arg->data, arg->data_length) < 0) {
        refuse(c, -ENOMEM, WSLAY_CODE_INTERNAL_SERVER_ERROR, "out of memory");
        return;
    }
    if (c->h.on_msg_data)
        c->h.on_msg_data(c->ud, c->msg.data, c->msg.len);
}

static void on_frame_end(wslay_event_context_ptr ctx, void *user_data)
{
    struct ws_conn *c = user_data;
    if (c->frame_close) {
        /* Before wslay answers it: our close wins, wslay's echo is dropped. */
        c->frame_close = false;
        if (c->close_len > 2 && !utf8_valid(c->close_buf + 2, c->close_len - 2))
            refuse(c, -EPROTO, WSLAY_CODE_INVALID_FRAME_PAYLOAD_DATA, "close reason not UTF-8");
        return;
    }
    if (!c->frame_data || !c->frame_fin)
        return;
    c->frame_data = false;
    /* wslay calls this only once a final text frame's UTF-8 is complete. */
    if (!c->msg_drop && !c->err && c->h.on_msg_end)
        c->h.on_msg_end(c->ud, c->msg_text, &c->msg);
    msg_reset(c);
}

static void on_msg(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg,
                   void *user_data)
{
    struct ws_conn *c = user_data;
    /* Close and ping: wslay has queued the reply. Data messages arrive
     * through the frame callbacks (buffering is off). */
    if (arg->opcode == WSLAY_PONG && c->h.on_pong)
        c->h.on_pong(c->ud);
}

/* ---------------------------------------------------------------- output */

/* Write what wbuf holds: 0 when empty, 1 if the socket is full, -1 on error. */
static int wflush(struct ws_conn *c)
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
    }
    c->woff = c->wlen = 0;
    return 0;
}

static ssize_t ws_send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags,
                          void *user_data)
{
    struct ws_conn *c = user_data;
    if (c->wlen && WS_WBUF - c->wlen < len && wflush(c) < 0)
        goto fail;
    if (c->wlen == 0 && len >= WS_WBUF_DIRECT) {
        /* large and nothing gathered before it: straight to the socket */
        for (;;) {
            ssize_t r = send(c->fd, data, len, MSG_NOSIGNAL);
            if (r >= 0)
                return r;
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
    if (!c->wbuf && !(c->wbuf = malloc(WS_WBUF)))
        goto fail;
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

static ssize_t src_read(wslay_event_context_ptr ctx, uint8_t *buf, size_t len,
                        const union wslay_event_msg_source *source, int *eof, void *user_data)
{
    struct ws_conn *c = user_data;
    struct ws_src *s = source->data;
    size_t n = s->data.len - s->off;
    if (n > len)
        n = len;
    memcpy(buf, s->data.data + s->off, n);
    s->off += n;
    c->src_left -= n;
    if (s->off == s->data.len) {
        *eof = 1;
        buf_free(&s->data); /* wslay has the last bytes in its own buffer */
    }
    return (ssize_t)n;
}

/* Free the sources wslay has read to the end. */
static void srcs_reap(struct ws_conn *c)
{
    for (struct ws_src **pp = &c->srcs; *pp;) {
        struct ws_src *s = *pp;
        if (s->data.data == NULL) {
            *pp = s->next;
            free(s);
        } else {
            pp = &s->next;
        }
    }
}

/* Give back what wslay no longer holds of the copied messages. */
static void copies_settle(struct ws_conn *c)
{
    size_t q = wslay_event_get_queued_msg_length(c->ctx);
    if (q < c->charged_copy) {
        if (c->budget)
            budget_give(c->budget, c->charged_copy - q);
        c->charged_copy = q;
    }
}

/* ---------------------------------------------------------------- lifetime */

struct ws_conn *ws_conn_new(int fd, struct budget *budget, const uint8_t *initial,
                            size_t initial_len, const struct ws_handlers *h, void *ud)
{
    const struct wslay_event_callbacks cbs = {
        .recv_callback = ws_recv_cb,
        .send_callback = ws_send_cb,
        /* genmask: only clients mask. */
        .on_frame_recv_start_callback = on_frame_start,
        .on_frame_recv_chunk_callback = on_frame_chunk,
        .on_frame_recv_end_callback = on_frame_end,
        .on_msg_recv_callback = on_msg,
    };
    struct ws_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->fd = fd;
    c->h = *h;
    c->ud = ud;
    c->budget = budget;
    buf_init_budget(&c->msg, SIZE_MAX, budget);
    if (initial_len > 0) {
        c->initial = malloc(initial_len);
        if (c->initial) {
            memcpy(c->initial, initial, initial_len);
            c->initial_len = initial_len;
        }
    }
    if ((initial_len > 0 && !c->initial) || wslay_event_context_server_init(&c->ctx, &cbs, c) != 0) {
        free(c->initial);
        free(c);
        return NULL;
    }
    /* Messages are assembled here (limits and budget at each frame's header),
     * not by wslay. */
    wslay_event_config_set_no_buffering(c->ctx, 1);
    return c;
}

void ws_conn_free(struct ws_conn *c)
{
    if (!c)
        return;
    wslay_event_context_free(c->ctx);
    while (c->srcs) {
        struct ws_src *s = c->srcs;
        c->srcs = s->next;
        buf_free(&s->data);
        free(s);
    }
    if (c->budget)
        budget_give(c->budget, c->charged_copy);
    buf_free(&c->msg);
    free(c->initial);
    free(c->wbuf);
    free(c);
}

static int ws_status(const struct ws_conn *c)
{
    if (c->io_failed)
        return -ECONNRESET;
    if (c->err)
        return c->err;
    if (c->failed)
        return -EPROTO;
    if (ws_conn_finished(c))
        return -ESHUTDOWN;
    return 0;
}

int ws_conn_read(struct ws_conn *c)
{
    if (c->failed || c->err || !wslay_event_want_read(c->ctx))
        return ws_status(c);

    c->read_left = WS_READ_BUDGET;
    c->read_more = false;
    int r = wslay_event_recv(c->ctx);
    if (r != 0)
        c->failed = true;
    if (c->bad)
        refuse(c, -EPROTO, WSLAY_CODE_PROTOCOL_ERROR, c->bad);
    if ((r != 0 && !c->io_failed) || c->err) {
        /* A protocol error (ours or wslay's) left a close frame queued: one
         * best-effort attempt to send it, then the connection is over. */
        wslay_event_send(c->ctx);
        wflush(c);
    }
    return ws_status(c);
}

int ws_conn_write(struct ws_conn *c)
{
    if (c->failed)
        return ws_status(c);
    if (wflush(c) < 0)
        return ws_status(c);
    if (wslay_event_send(c->ctx) != 0)
        c->failed = true;
    if (wflush(c) == 0) { /* all out: give the gathering buffer back */
        free(c->wbuf);
        c->wbuf = NULL;
    }
    copies_settle(c);
    srcs_reap(c);
    return ws_status(c);
}

static int ws_queue(struct ws_conn *c, uint8_t opcode, const uint8_t *p, size_t n)
{
    const struct wslay_event_msg msg = {.opcode = opcode, .msg = p, .msg_length = n};
    if (c->failed)
        return -EPIPE;
    if (c->budget && !(opcode & 0x8)) {
        int r = budget_take(c->budget, n);
        if (r < 0)
            return r;
    }
    int r = wslay_event_queue_msg(c->ctx, &msg);
    if (r == 0) {
        if (!(opcode & 0x8))
            c->charged_copy += n;
        return 0;
    }
    if (c->budget && !(opcode & 0x8))
        budget_give(c->budget, n);
    switch (r) {
    case WSLAY_ERR_NOMEM:
        return -ENOMEM;
    case WSLAY_ERR_INVALID_ARGUMENT:
        return -EINVAL;
    default: /* WSLAY_ERR_NO_MORE_MSG: a close is queued or sent */
        return -EPIPE;
    }
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
    struct ws_src *s = calloc(1, sizeof *s);
    if (!s) {
        buf_free(b);
        return -ENOMEM;
    }
    buf_init_budget(&s->data, SIZE_MAX, c->budget);
    int r = buf_move(&s->data, b);
    const struct wslay_event_fragmented_msg msg = {
        .opcode = opcode, .source.data = s, .read_callback = src_read};
    if (r == 0 && wslay_event_queue_fragmented_msg(c->ctx, &msg) != 0)
        r = -EPIPE;
    if (r < 0) {
        buf_free(b);
        buf_free(&s->data);
        free(s);
        return r;
    }
    s->next = c->srcs;
    c->srcs = s;
    c->src_left += s->data.len;
    return 0;
}

int ws_conn_send_ping(struct ws_conn *c)
{
    return ws_queue(c, WSLAY_PING, NULL, 0);
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
    int r = wslay_event_queue_close(c->ctx, code, (const uint8_t *)reason, len);
    if (r == WSLAY_ERR_NOMEM)
        return -ENOMEM;
    if (r == WSLAY_ERR_INVALID_ARGUMENT)
        return -EINVAL;
    if (r != 0)
        return -EPIPE;
    /* Once we have decided to close, messages still in flight from the peer
     * must not reach the handlers (this also ends a wslay_event_recv loop
     * that a handler closed from). We do not wait for the peer's close:
     * ws_conn_finished() turns true when ours is written. */
    wslay_event_shutdown_read(c->ctx);
    return 0;
}

bool ws_conn_want_read(const struct ws_conn *c)
{
    return !c->failed && !c->err && wslay_event_want_read(c->ctx);
}

bool ws_conn_want_write(const struct ws_conn *c)
{
    return !c->failed && (c->wlen > c->woff || wslay_event_want_write(c->ctx));
}

bool ws_conn_read_more(const struct ws_conn *c)
{
    return (c->read_more || c->initial_off < c->initial_len) && ws_conn_want_read(c);
}

size_t ws_conn_queued(const struct ws_conn *c)
{
    return wslay_event_get_queued_msg_length(c->ctx) + c->src_left + (c->wlen - c->woff);
}

bool ws_conn_pending(const struct ws_conn *c)
{
    return wslay_event_get_queued_msg_count(c->ctx) > 0 || c->wlen > c->woff;
}

bool ws_conn_finished(const struct ws_conn *c)
{
    if (c->failed)
        return true;
    if (c->wlen > c->woff)
        return false; /* our last bytes (maybe the close) are still gathered */
    /* wslay stops writing once its close frame is out. */
    if (wslay_event_get_close_sent(c->ctx))
        return true;
    /* A received close queues our reply; done once that is written (the
     * reply cannot be queued only if ours already was, caught above). */
    return wslay_event_get_close_received(c->ctx) && !wslay_event_want_write(c->ctx);
}
