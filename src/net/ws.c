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
#include "core/outq.h"
#include "core/utf8.h"

#define WS_HDR_MAX 14          /* 2 + 8 (length) + 4 (mask) */
#define WS_WBUF_DIRECT 16384   /* writes this large skip wbuf when it is empty */

/* An outgoing message read by wslay in fragments: a large one queued whole
 * (ended at once), or one whose bytes come as they are produced. */
struct ws_stream {
    struct ws_stream *next;
    struct outq q;   /* owned, charged: bytes not yet handed to wslay */
    bool ended;      /* no more bytes come: the last may go, with FIN */
    bool aborted;    /* it will never be finished (ws_conn_stream_abort) */
    bool done;       /* wslay has read it to the end: reaped */
};

struct ws_conn {
    int fd;                       /* borrowed: the caller closes it */
    wslay_event_context_ptr ctx;  /* owned */
    struct ws_handlers h;
    void *ud;
    struct budget *budget;        /* borrowed, may be NULL */

    /* input */
    uint8_t *rbuf;                /* owned: bytes read and not yet taken (rbuf[roff..rlen)),
                                     first the bytes read past the HTTP request; NULL while
                                     empty (an idle connection holds none) */
    size_t rcap, roff, rlen;
    size_t read_left;             /* byte budget left in the current ws_conn_read */
    bool read_more;               /* the last read stopped on the budget, not EAGAIN, or
                                     the initial bytes wait for the first read */
    bool reading;                 /* the socket is read: until the client's close frame, its
                                     EOF, or (closing) the drain budget is spent */
    bool closing;                 /* our close is queued: what arrives is discarded, frame by
                                     frame, until the client's close (drain_frames) */
    uint64_t drain_left;          /* closing: socket bytes that may still be discarded */
    bool close_received;          /* the client's close frame arrived (answered, unless ours
                                     went first) */

    /* the frame being received (in_payload: its header is taken) */
    bool in_payload;
    uint8_t opcode;
    bool fin;
    uint8_t mask[4];
    uint64_t payload_len, payload_got;
    uint8_t ctrl[125];            /* a control frame's payload */
    bool msg_open;                /* a data message is between its frames */

    /* the current data message */
    bool msg_text, msg_drop;
    bool msg_stream;              /* handed over in chunks (msg is the one being filled) */
    uint64_t msg_limit;
    uint64_t msg_announced;       /* its frames' lengths so far, dropped or not */
    struct utf8_stream msg_utf8;  /* text: the UTF-8 check so far */
    struct buf msg;               /* owned, charged: the message so far, or a streamed
                                     message's chunk being filled */

    /* output */
    struct ws_stream *srcs;       /* owned: fragmented messages not yet fully read */
    bool stalled;                 /* wslay's message is a stream with no byte to give: nothing
                                     to write until a byte, its end or a control frame comes */
    bool stuck;                   /* ... and it was aborted: it never ends, and nothing queued
                                     behind it can go (only a close, between fragments) */
    size_t charged_copy;          /* charged for what wslay holds of queued messages
                                     (wslay_held: copies, control frames, records) */
    size_t charged_io;            /* charged for rbuf and wbuf while they exist */
    size_t window;                /* read nothing while more than this is queued; 0: no limit */
    bool paused;                  /* the handler stopped reading (ws_conn_pause) */
    bool chunk_stop;              /* on_msg_chunk asked to stop for this read */
    uint8_t *wbuf;                /* owned, WS_WBUF bytes while writes are gathered, else NULL
                                     (an idle connection holds none) */
    size_t wlen, woff;            /* wbuf[woff..wlen) is waiting for the socket */

    int err;                      /* why this module closed (ws_conn_read's return) */
    char reason[124];             /* a close reason with figures in it */
    bool io_failed;               /* EOF or a socket error: nothing more can move */
    uint64_t bytes_in, bytes_out; /* socket bytes after the HTTP request (metrics) */
    bool failed;                  /* wslay gave up writing (I/O or memory) */
};

/* ---------------------------------------------------------------- charges */

/* Take n bytes from the budget into the account acct: 0 or the budget's
 * -EDQUOT / -ENOSPC. */
static int charge(struct ws_conn *c, size_t *acct, size_t n)
{
    int r = c->budget ? budget_take(c->budget, n) : 0;
    if (r == 0)
        *acct += n;
    return r;
}

static void uncharge(struct ws_conn *c, size_t *acct, size_t n)
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
static void copies_settle(struct ws_conn *c)
{
    size_t q = wslay_held(c);
    if (q < c->charged_copy)
        uncharge(c, &c->charged_copy, c->charged_copy - q);
}

/* A close frame: charged like the rest if the budget allows, queued in any
 * case (one per connection, at most 127 bytes). wslay's result. */
static int queue_close(struct ws_conn *c, uint16_t code, const uint8_t *reason, size_t len)
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
static int ws_queue(struct ws_conn *c, uint8_t opcode, const uint8_t *p, size_t n)
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
static void begin_closing(struct ws_conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    uint64_t rest = c->in_payload ? c->payload_len - c->payload_got : 0;
    c->drain_left = WS_CLOSE_DRAIN_BYTES + (rest < WS_MAX_MESSAGE_BYTES ? rest : WS_MAX_MESSAGE_BYTES);
}

/* Close for a reason decided here, once. */
static void refuse(struct ws_conn *c, int err, uint16_t code, const char *reason)
{
    if (c->err)
        return;
    c->err = err;
    queue_close(c, code, (const uint8_t *)reason, strlen(reason));
    begin_closing(c);
}

/* ---------------------------------------------------------------- input */

/* A data frame's payload is received straight into its message once at
 * least this much of it is still due and rbuf is empty. */
#define WS_DIRECT_MIN 1024

/* Reading waits while the handler paused it or more than the window is
 * queued for the client (a peer that sends pings and never reads them
 * stops being read instead of growing its pongs without bound). */
static bool held(const struct ws_conn *c)
{
    return c->paused || (c->window && ws_conn_queued(c) > c->window);
}

/* recv() into p[0..len), within the read budget: the count, 0 for "nothing
 * now" (would block, or the budget is spent), -1 on EOF or a socket error. */
static ssize_t recv_some(struct ws_conn *c, uint8_t *p, size_t len)
{
    if (c->read_left == 0) {
        c->read_more = true;
        return 0;
    }
    if (len > c->read_left)
        len = c->read_left;
    for (;;) {
        ssize_t r = recv(c->fd, p, len, 0);
        if (r > 0) {
            c->read_left -= (size_t)r;
            c->bytes_in += (uint64_t)r;
            if (c->closing) {
                c->drain_left -= (uint64_t)r < c->drain_left ? (uint64_t)r : c->drain_left;
                if (c->drain_left == 0)
                    c->reading = false; /* the drain's budget is spent: we close anyway */
            }
            return r;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        c->io_failed = true; /* EOF (r == 0) or a real error */
        return -1;
    }
}

/* More bytes into rbuf (what is unread there moves to its start): > 0 if
 * some came, 0 if none now, -1 on EOF, a socket error or no memory. */
static ssize_t refill(struct ws_conn *c)
{
    if (!c->rbuf) {
        if (charge(c, &c->charged_io, WS_RBUF) < 0) {
            refuse(c, -EMSGSIZE, WSLAY_CODE_POLICY_VIOLATION,
                   "input buffer over the turn's memory budget");
            return -1;
        }
        if (!(c->rbuf = malloc(WS_RBUF))) {
            uncharge(c, &c->charged_io, WS_RBUF);
            refuse(c, -ENOMEM, WSLAY_CODE_INTERNAL_SERVER_ERROR, "out of memory");
            return -1;
        }
        c->rcap = WS_RBUF;
        c->roff = c->rlen = 0;
    }
    memmove(c->rbuf, c->rbuf + c->roff, c->rlen - c->roff); /* at most a partial header */
    c->rlen -= c->roff;
    c->roff = 0;
    ssize_t r = recv_some(c, c->rbuf + c->rlen, c->rcap - c->rlen);
    if (r > 0)
        c->rlen += (size_t)r;
    return r;
}

/* dst[i] = src[i] ^ the mask, for payload bytes from offset off on; dst may
 * be src. Eight bytes at a time: the key repeats every four bytes, so a word
 * of it, rotated to the offset, masks a word of payload. */
static void unmask(uint8_t *dst, const uint8_t *src, size_t n, const uint8_t key[4], uint64_t off)
{
    uint8_t k[8];
    for (int i = 0; i < 8; i++)
        k[i] = key[(off + (uint64_t)i) % 4];
    uint64_t kw;
    memcpy(&kw, k, 8);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, src + i, 8);
        w ^= kw;
        memcpy(dst + i, &w, 8);
    }
    for (; i < n; i++)
        dst[i] = src[i] ^ k[i % 8];
}

static void msg_reset(struct ws_conn *c)
{
    buf_free(&c->msg);
    c->msg_drop = false;
    c->msg_stream = false;
    c->msg_limit = 0;
}

/* Refuse for a budget's or the allocator's error r (a message's room). */
static void refuse_room(struct ws_conn *c, int r)
{
    if (r == -ENOSPC)
        refuse(c, -ENOSPC, 1013, "server memory budget exhausted, try again later");
    else if (r == -EDQUOT || r == -ENOBUFS)
        refuse(c, -EMSGSIZE, WSLAY_CODE_MESSAGE_TOO_BIG, "message over the turn's memory budget");
    else
        refuse(c, -ENOMEM, WSLAY_CODE_INTERNAL_SERVER_ERROR, "out of memory");
}

/* A streamed message's chunk goes to the handler (which may keep it),
 * charged for what it holds. */
static void chunk_hand_over(struct ws_conn *c)
{
    if (!c->msg_stream || c->msg.len == 0)
        return;
    buf_fit(&c->msg);
    if (!c->h.on_msg_chunk(c->ud, &c->msg))
        c->chunk_stop = true;
    buf_free(&c->msg); /* what the handler left */
}

/* Room in a streamed message's chunk for its next payload bytes: the full
 * chunk handed over, a fresh one made (charged). False if refused. */
static bool chunk_room(struct ws_conn *c)
{
    if (c->msg.cap > c->msg.len)
        return true;
    chunk_hand_over(c);
    if (c->closing)
        return false; /* the handler closed */
    uint64_t due = c->payload_len - c->payload_got;
    int r = buf_reserve_exact(&c->msg, due < WS_STREAM_CHUNK ? (size_t)due : WS_STREAM_CHUNK);
    if (r < 0)
        refuse_room(c, r);
    return r == 0;
}

/* A data frame begins: its message's limit (asked of the handler at a
 * message's first frame), the 256 MiB cap and the budget are applied to the
 * length its header announces, before any of its payload is taken. */
static void data_frame_begin(struct ws_conn *c)
{
    if (c->opcode != WSLAY_CONTINUATION_FRAME) {
        msg_reset(c);
        c->msg_text = c->opcode == WSLAY_TEXT_FRAME;
        c->msg_utf8 = (struct utf8_stream){0};
        c->msg_announced = 0;
        struct ws_msg_start m = {.text = c->msg_text, .fin = c->fin, .len = c->payload_len};
        c->msg_limit = c->h.on_msg_begin ? c->h.on_msg_begin(c->ud, &m) : WS_MSG_DROP;
        c->msg_drop = c->msg_limit == WS_MSG_DROP;
        c->msg_stream = !c->msg_drop && m.stream && c->h.on_msg_chunk;
        if (c->closing) /* the handler closed */
            return;
    }
    /* spec 1.4: 256 MiB per message, whatever happens to it */
    uint64_t len = c->payload_len;
    c->msg_announced += len;
    uint64_t limit = c->msg_drop ? WS_MAX_MESSAGE_BYTES : c->msg_limit;
    if (c->msg_announced > WS_MAX_MESSAGE_BYTES || (!c->msg_drop && c->msg_announced > c->msg_limit)) {
        snprintf(c->reason, sizeof c->reason,
                 "message too large: %llu bytes announced, the limit here is %llu",
                 (unsigned long long)c->msg_announced,
                 (unsigned long long)(limit < WS_MAX_MESSAGE_BYTES ? limit : WS_MAX_MESSAGE_BYTES));
        refuse(c, -EMSGSIZE, WSLAY_CODE_MESSAGE_TOO_BIG, c->reason);
        return;
    }
    if (c->msg_drop || c->msg_stream) /* a stream's room is made a chunk at a time */
        return;
    int r = buf_reserve_exact(&c->msg, (size_t)len);
    if (r < 0)
        refuse_room(c, r);
}

/* The size of the frame header whose second byte is b1. */
static size_t header_size(uint8_t b1)
{
    uint8_t len7 = b1 & 0x7F;
    return 2 + (len7 == 126 ? 2 : len7 == 127 ? 8 : 0) + ((b1 & 0x80) ? 4 : 0);
}

/* The payload length a whole header announces (any form, unchecked). */
static uint64_t header_payload_len(const uint8_t *p)
{
    uint8_t len7 = p[1] & 0x7F;
    uint64_t len = len7;
    if (len7 == 126)
        len = (uint64_t)p[2] << 8 | p[3];
    else if (len7 == 127)
        for (int k = 0; k < 8; k++)
            len = (k ? len << 8 : 0) | p[2 + k];
    return len;
}

/* Take one frame header from rbuf if it is all there: 1 if taken, 0 if more
 * bytes are needed, -1 if the connection was refused (a protocol error). */
static int take_header(struct ws_conn *c)
{
    size_t n = c->rlen - c->roff;
    if (n < 2)
        return 0;
    const uint8_t *p = c->rbuf + c->roff;
    uint8_t b0 = p[0], b1 = p[1], opcode = b0 & 0x0F, len7 = b1 & 0x7F;
    size_t need = header_size(b1);
    if (n < need)
        return 0;
    uint64_t len = header_payload_len(p);
    bool data = !(opcode & 0x8), fin = b0 & 0x80;
    const char *bad = NULL;
    if (b0 & 0x70)
        bad = "reserved bits set";
    else if ((opcode > WSLAY_BINARY_FRAME && data) || opcode > WSLAY_PONG)
        bad = "unknown opcode";
    else if (data && (opcode == WSLAY_CONTINUATION_FRAME) != c->msg_open)
        bad = c->msg_open ? "new message before the last one ended"
                          : "continuation frame outside a message";
    else if (!data && (len > 125 || !fin))
        bad = "control frame too long or fragmented";
    else if ((len7 == 126 && len < 126) || (len7 == 127 && len < 65536))
        bad = "frame length not in its shortest form";
    else if (len7 == 127 && (len >> 63))
        bad = "frame length over 2^63";
    else if (opcode == WSLAY_CONNECTION_CLOSE && len == 1)
        bad = "close frame with a 1-byte payload";
    else if (!(b1 & 0x80))
        bad = "client frame not masked";
    if (bad) {
        refuse(c, -EPROTO, WSLAY_CODE_PROTOCOL_ERROR, bad);
        return -1;
    }
    memcpy(c->mask, p + need - 4, 4);
    c->roff += need;
    c->opcode = opcode;
    c->fin = fin;
    c->payload_len = len;
    c->payload_got = 0;
    c->in_payload = true;
    if (data) {
        c->msg_open = !fin;
        data_frame_begin(c);
    }
    return c->closing ? -1 : 1;
}

/* Where the frame's next payload byte goes: the message's reserved room, the
 * control payload, or (a dropped message) nowhere: NULL. */
static uint8_t *payload_dest(struct ws_conn *c)
{
    if (c->opcode & 0x8)
        return c->ctrl + c->payload_got;
    return c->msg_drop ? NULL : c->msg.data + c->msg.len;
}

/* p[0..n), unmasked, is the frame's next payload. */
static void payload_got(struct ws_conn *c, const uint8_t *p, size_t n)
{
    c->payload_got += n;
    if (c->opcode & 0x8)
        return;
    if (c->msg_text && !utf8_stream_feed(&c->msg_utf8, p, n)) {
        refuse(c, -EPROTO, WSLAY_CODE_INVALID_FRAME_PAYLOAD_DATA, "text message not UTF-8");
        return;
    }
    if (c->msg_drop) {
        if (c->h.on_dropped)
            c->h.on_dropped(c->ud, n);
        return;
    }
    c->msg.len += n; /* into the room reserved at the frame's header, or the chunk's */
    if (c->msg_stream) {
        if (c->msg.len == c->msg.cap)
            chunk_hand_over(c);
        return;
    }
    if (c->h.on_msg_data)
        c->h.on_msg_data(c->ud, c->msg.data, c->msg.len);
}

/* Close codes a client may send (RFC 6455 7.4: 1004-1006 and 1015 are never
 * sent, 1012-2999 are unassigned, 3000-4999 are for applications). */
static bool close_code_ok(uint16_t code)
{
    return (code >= 1000 && code <= 1011 && code != 1004 && code != 1005 && code != 1006) ||
           (code >= 3000 && code <= 4999);
}

/* The client's close: answered with its own code and reason (or, if they
 * are invalid, with 1002 / 1007), after which nothing more is read. */
static void close_received(struct ws_conn *c)
{
    uint16_t code = 0;
    size_t n = (size_t)c->payload_len;
    c->close_received = true;
    c->reading = false;
    if (n >= 2) {
        code = (uint16_t)(c->ctrl[0] << 8 | c->ctrl[1]);
        if (!close_code_ok(code)) {
            refuse(c, -EPROTO, WSLAY_CODE_PROTOCOL_ERROR, "invalid close code");
            return;
        }
        if (!utf8_valid(c->ctrl + 2, n - 2)) {
            refuse(c, -EPROTO, WSLAY_CODE_INVALID_FRAME_PAYLOAD_DATA, "close reason not UTF-8");
            return;
        }
    }
    /* Fails only when our own close is already queued: that one answers. */
    queue_close(c, code, n > 2 ? c->ctrl + 2 : NULL, n > 2 ? n - 2 : 0);
}

/* The frame's last payload byte is in. */
static void frame_end(struct ws_conn *c)
{
    c->in_payload = false;
    switch (c->opcode) {
    case WSLAY_CONNECTION_CLOSE:
        close_received(c);
        return;
    case WSLAY_PING: {
        int r = ws_queue(c, WSLAY_PONG, c->ctrl, (size_t)c->payload_len);
        if (r == -ENOMEM)
            refuse(c, -ENOMEM, WSLAY_CODE_INTERNAL_SERVER_ERROR, "out of memory");
        else if (r == -ENOSPC)
            refuse(c, -ENOSPC, 1013, "server memory budget exhausted, try again later");
        else if (r == -EDQUOT)
            refuse(c, -EMSGSIZE, WSLAY_CODE_POLICY_VIOLATION,
                   "pongs over the turn's memory budget");
        else if (r == 0 && c->h.on_ping)
            c->h.on_ping(c->ud);
        return; /* other failures: a close is queued, no pong is due */
    }
    case WSLAY_PONG:
        if (c->h.on_pong)
            c->h.on_pong(c->ud);
        return;
    default:
        break;
    }
    chunk_hand_over(c); /* a stream's bytes of this frame, before the next frame's */
    if (!c->fin || c->closing) /* not the last frame, or the handler closed */
        return;
    if (c->msg_text && !utf8_stream_end(&c->msg_utf8)) {
        refuse(c, -EPROTO, WSLAY_CODE_INVALID_FRAME_PAYLOAD_DATA, "text message not UTF-8");
        return;
    }
    if (!c->msg_drop && c->h.on_msg_end)
        c->h.on_msg_end(c->ud, c->msg_text, &c->msg);
    msg_reset(c);
}

/* Take what can be taken of the current frame's payload: > 0 if some was,
 * 0 if none now, -1 on EOF or an error. */
static ssize_t take_payload(struct ws_conn *c)
{
    uint64_t due = c->payload_len - c->payload_got;
    if (c->msg_stream && !(c->opcode & 0x8)) {
        if (!chunk_room(c))
            return -1;
        if (due > c->msg.cap - c->msg.len)
            due = c->msg.cap - c->msg.len; /* what the chunk holds */
    }
    uint8_t *dst = payload_dest(c);
    size_t avail = c->rlen - c->roff;
    size_t n;
    if (avail > 0) {
        n = avail < due ? avail : (size_t)due;
        uint8_t *src = c->rbuf + c->roff;
        if (!dst)
            dst = src; /* dropped: unmasked in place (text is still checked) */
        unmask(dst, src, n, c->mask, c->payload_got);
        c->roff += n;
    } else if (dst && due >= WS_DIRECT_MIN) {
        ssize_t r = recv_some(c, dst, due < SIZE_MAX ? (size_t)due : SIZE_MAX);
        if (r <= 0)
            return r;
        n = (size_t)r;
        unmask(dst, dst, n, c->mask, c->payload_got);
    } else {
        return refill(c);
    }
    payload_got(c, dst, n);
    return 1;
}

/* Closing (begin_closing): discard what arrives until the client's close
 * frame. Frames are followed by their headers' lengths alone, without the
 * checks of take_header: the bytes after a protocol error are whatever the
 * client sent, and only a close frame matters. */
static void drain_frames(struct ws_conn *c)
{
    msg_reset(c); /* a message cut short: its room goes back now */
    while (c->reading && !c->io_failed) {
        size_t avail = c->rlen - c->roff;
        if (c->in_payload) {
            uint64_t due = c->payload_len - c->payload_got;
            size_t n = avail < due ? avail : (size_t)due;
            c->roff += n;
            c->payload_got += n;
            if (c->payload_got == c->payload_len) {
                c->in_payload = false;
                if (c->opcode == WSLAY_CONNECTION_CLOSE) {
                    c->close_received = true; /* the handshake is over */
                    c->reading = false;
                }
                continue;
            }
        } else if (avail >= 2 && avail >= header_size(c->rbuf[c->roff + 1])) {
            const uint8_t *p = c->rbuf + c->roff;
            c->opcode = p[0] & 0x0F;
            c->payload_len = header_payload_len(p);
            c->payload_got = 0;
            c->in_payload = true;
            c->roff += header_size(p[1]);
            continue;
        }
        if (refill(c) <= 0)
            return;
    }
}

/* Read and take frames until the socket has nothing more now, the read
 * budget is spent, or reading ends; once a close of ours is queued, only
 * discard (drain_frames). */
static void read_frames(struct ws_conn *c)
{
    while (c->reading && !c->closing && !c->io_failed) {
        ssize_t r;
        if (held(c) || c->chunk_stop) { /* what rbuf holds waits too: read_more says so */
            c->read_more = true;
            return;
        }
        if (c->in_payload) {
            r = c->payload_got < c->payload_len ? take_payload(c) : 1;
            if (r > 0 && c->reading && !c->closing && c->payload_got == c->payload_len)
                frame_end(c);
        } else {
            r = take_header(c);
            if (r == 0)
                r = refill(c);
            else if (r > 0 && c->payload_len == 0)
                frame_end(c);
        }
        if (r <= 0 && !c->closing)
            return;
    }
    if (c->closing)
        drain_frames(c);
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

static ssize_t ws_send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags,
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

static void stream_free(struct ws_stream *st)
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

static int ws_status(const struct ws_conn *c)
{
    if (c->io_failed)
        return -ECONNRESET;
    if (c->failed)
        return -EPIPE;
    if (ws_conn_finished(c))
        return -ESHUTDOWN;
    return 0;
}

int ws_conn_read(struct ws_conn *c)
{
    if (!ws_conn_want_read(c))
        return ws_status(c);
    c->read_left = WS_READ_BUDGET;
    c->read_more = false;
    c->chunk_stop = false;
    read_frames(c);
    if (c->reading && !c->closing)
        chunk_hand_over(c); /* what came of a stream goes on now: nothing lingers here */
    if (c->io_failed)
        c->failed = true; /* nothing more can move either way */
    if (c->rbuf && c->roff == c->rlen) { /* all taken: give the buffer back */
        uncharge(c, &c->charged_io, c->rcap);
        free(c->rbuf);
        c->rbuf = NULL;
        c->rcap = c->roff = c->rlen = 0;
    }
    if (c->err && !c->io_failed && !c->failed) {
        /* A close decided here is queued: sent at once if the socket takes
         * it (else on the next ws_conn_write). */
        if (wslay_event_send(c->ctx) != 0)
            c->failed = true;
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
