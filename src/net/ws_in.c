/* The connection's input: read_frames() walks the client's frames itself
 * (ws.c's opening comment says why not wslay's reader): the header rules of
 * RFC 6455, masking, fragment sequencing, the close handshake's codes and
 * UTF-8 of text, each checked once; a data frame's payload received straight
 * into its message's buffer and unmasked there. Runs in the supervisor's
 * loop thread, on the client's bytes.
 *
 * Relies on ws.c for the charges (charge, uncharge), for what a refusal or
 * the client's close does (refuse, queue_close, begin_closing), for the
 * replies it queues (ws_queue) and the connection's status (ws_status), and
 * on ws_out.c to flush what a read decided to send (wflush). */
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

#define WS_HDR_MAX 14          /* 2 + 8 (length) + 4 (mask) */

/* A data frame's payload is received straight into its message once at
 * least this much of it is still due and rbuf is empty. */
#define WS_DIRECT_MIN 1024

/* Reading waits while the handler paused it or more than the window is
 * queued for the client (a peer that sends pings and never reads them
 * stops being read instead of growing its pongs without bound). */
bool held(const struct ws_conn *c)
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
