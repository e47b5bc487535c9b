/* The WebSocket message path as the session drives it (net/ws.h: our frame
 * reader, wslay's sender): bytes from a client arrive on a socket in arbitrary chunkings,
 * possibly with a first part already read together with the HTTP request,
 * and ws_conn_read()/ws_conn_write() run as the loop would run them.
 *
 * Input: byte 0 seeds the chunking (fuzz.h), byte 1 holds flags, the rest
 * is the client's stream:
 *   0x01  structured: the rest is a list of frame descriptions that are
 *         turned into client frames here (below), so the fuzzer reaches
 *         reassembly, control frames and UTF-8 checks instead of stopping at
 *         the mask check; otherwise the bytes go to the socket as they are
 *   0x02  the first chunk is handed to ws_conn_new() as bytes read past the
 *         HTTP request
 *   0x04  small max_msg (100 bytes) instead of 64 KiB
 *   0x08  the text handler closes the connection (1000) as the session does
 *         when a turn ends on a client message
 *   0x10  handlers reply (a text per text, a binary and a ping per binary)
 *   0x20  the server closes (1011, with a reason over the 123-byte limit
 *         that must be cut on a UTF-8 boundary) half way through the stream
 *   0xc0  (both bits, and byte 0 == 0xff) bulk: the stream is repeated (up
 *         to 64 times) and padded with 60000-byte binary frames to over
 *         WS_READ_BUDGET bytes, max_msg is 64 KiB, and it is all sent
 *         through a large socket buffer, so ws_conn_read() stops on its
 *         budget and the ws_conn_read_more() loop has to finish the job
 *
 * A frame description (structured mode): byte b0 is the first header byte
 * as sent (FIN, RSV, opcode); byte b1's low 7 bits are the length code
 * (126 and 127 read a 16/64-bit length from the input, so non-minimal and
 * huge lengths happen) and its top bit, when set, sends the frame *unmasked*
 * (a client must mask: a protocol error); then 4 mask key bytes (masked
 * frames only) and the payload, which is masked here. A declared length
 * longer than what is left keeps the declared value (a truncated frame).
 *
 * Properties (the handlers' contract in ws.h):
 *   - text is delivered only if it is valid UTF-8, and no message is longer
 *     than max_msg; msg is never NULL; on_msg_data always shows a prefix of
 *     the message that on_msg_end then delivers; a message dropped at its
 *     start (every third one) is never delivered; one streamed (every third
 *     one but one) comes in chunks of at most WS_STREAM_CHUNK bytes, and
 *     what they make is held to the same rules as a whole message, with
 *     nothing left in on_msg_end's buffer;
 *   - after ws_conn_close(), or a close ws.c decided (ws_conn_refused), no
 *     message is delivered;
 *   - the bytes delivered never exceed the bytes sent;
 *   - ws_conn_read()/ws_conn_write() return 0 or a documented error, and once
 *     the client's EOF is read a connection that still wants to read reports
 *     the end instead of 0 (a close under way included: the EOF ends its
 *     handshake);
 *   - what the connection holds is charged to its budget and every byte is
 *     given back by ws_conn_free();
 *   - every close frame the server sends carries a code a client may see
 *     (1000, 1002, 1007, 1009, 1011, 1013, none, or the client's own echoed)
 *     and a reason of at most 123 bytes of UTF-8 (an echoed one too). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/utf8.h"
#include "fuzz.h"
#include "net/ws.h"

enum {
    F_STRUCTURED = 0x01,
    F_INITIAL = 0x02,
    F_SMALL_MAX = 0x04,
    F_CLOSE_ON_TEXT = 0x08,
    F_REPLY = 0x10,
    F_SERVER_CLOSE = 0x20,
    F_BULK = 0xc0, /* with byte 0 == 0xff: rare, a bulk input costs ~5 ms */
};

/* 61 two-byte characters and one more: cut at 123 bytes, the last one must
 * go whole. */
static const char long_reason[] =
    "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
    "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
    "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
    "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
    "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
    "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
    "\xc3\xa9\xc3\xa9";

#define BULK_BYTES (WS_READ_BUDGET + 16 * 1024)

struct state {
    struct ws_conn *c;
    uint8_t flags;
    size_t max_msg;
    bool closed;      /* ws_conn_close() was called */
    size_t delivered; /* message bytes handed to the handlers */
    size_t messages;  /* begun */
    bool dropping;    /* the current message was dropped at its start */
    uint8_t seen[64]; /* the first bytes on_msg_data showed */
    size_t seen_len;
    size_t pongs;
    bool streaming;   /* the current message is streamed (on_chunk) */
    struct buf chunks; /* what its chunks brought */
};

static uint64_t on_begin(void *ud, struct ws_msg_start *m)
{
    struct state *s = ud;
    FUZZ_ASSERT(!s->closed, "message begun after ws_conn_close()");
    FUZZ_ASSERT(!ws_conn_refused(s->c), "message begun after a refusal");
    s->dropping = ++s->messages % 3 == 0;
    s->streaming = m->stream = s->messages % 3 == 1;
    s->seen_len = 0;
    buf_free(&s->chunks);
    return s->dropping ? WS_MSG_DROP : s->max_msg;
}

static bool on_chunk(void *ud, struct buf *chunk)
{
    struct state *s = ud;
    FUZZ_ASSERT(s->streaming && !s->dropping, "a chunk of a message not streamed");
    FUZZ_ASSERT(chunk->len > 0 && chunk->len <= WS_STREAM_CHUNK, "a chunk of %zu bytes",
                chunk->len);
    FUZZ_ASSERT(s->chunks.len + chunk->len <= s->max_msg, "chunks past max %zu", s->max_msg);
    buf_append(&s->chunks, chunk->data, chunk->len);
    return chunk->len & 1; /* an odd one stops the read: the rest comes at the next */
}

static void on_data(void *ud, const uint8_t *msg, size_t len)
{
    struct state *s = ud;
    FUZZ_ASSERT(!s->dropping, "data of a dropped message");
    FUZZ_ASSERT(len >= s->seen_len && memcmp(msg, s->seen, s->seen_len) == 0,
                "on_msg_data is not a growing prefix");
    s->seen_len = len < sizeof s->seen ? len : sizeof s->seen;
    memcpy(s->seen, msg, s->seen_len);
}

static void on_end(void *ud, bool text, struct buf *m)
{
    struct state *s = ud;
    const uint8_t *msg = m->data ? m->data : (const uint8_t *)"";
    size_t len = m->len;

    if (s->streaming) {
        FUZZ_ASSERT(m->len == 0, "a streamed message's bytes in on_msg_end");
        msg = s->chunks.data ? s->chunks.data : (const uint8_t *)"";
        len = s->chunks.len;
    }
    FUZZ_ASSERT(!s->dropping, "a dropped message was delivered");
    FUZZ_ASSERT(len <= s->max_msg, "message of %zu bytes over max %zu", len, s->max_msg);
    FUZZ_ASSERT(!s->closed, "message delivered after ws_conn_close()");
    FUZZ_ASSERT(!ws_conn_refused(s->c), "message delivered after a refusal");
    FUZZ_ASSERT(len >= s->seen_len && memcmp(msg, s->seen, s->seen_len) == 0,
                "the message does not start with what on_msg_data showed");
    s->delivered += len;
    if (text)
        FUZZ_ASSERT(utf8_valid(msg, len), "text message of %zu bytes is not UTF-8", len);
    if (text && (s->flags & F_REPLY))
        ws_conn_send_text(s->c, msg, len < 64 ? len : 64);
    if (!text && (s->flags & F_REPLY)) {
        /* a large reply goes out as fragments from the buffer itself */
        struct buf b;
        buf_init(&b, SIZE_MAX);
        for (size_t k = 0; k < (len > 32 ? 3 : 0); k++)
            buf_append(&b, msg, len);
        ws_conn_send_buf(s->c, false, &b);
        ws_conn_send_ping(s->c);
    }
    if (text && (s->flags & F_CLOSE_ON_TEXT)) {
        int r = ws_conn_close(s->c, 1000, "turn over");
        if (r == 0)
            s->closed = true;
    }
}

static void on_pong(void *ud)
{
    struct state *s = ud;
    s->pongs++;
}

static const struct ws_handlers handlers = {
    .on_msg_begin = on_begin, .on_msg_data = on_data, .on_msg_end = on_end, .on_pong = on_pong,
    .on_msg_chunk = on_chunk};

/* Turn frame descriptions into a client stream (see the top comment). */
static uint8_t *build_frames(const uint8_t *p, size_t n, size_t *out_len)
{
    /* Every input byte a description consumes becomes one output byte. */
    uint8_t *out = malloc(n + 1), *o = out;
    size_t i = 0;

    FUZZ_ASSERT(out != NULL, "malloc");
    while (i + 2 <= n) {
        uint8_t b0 = p[i], b1 = p[i + 1];
        bool masked = !(b1 & 0x80);
        uint64_t declared = b1 & 0x7f;
        size_t hdr_len = 0;
        i += 2;
        if (declared == 126) {
            if (i + 2 > n)
                break;
            declared = (uint64_t)p[i] << 8 | p[i + 1];
            hdr_len = 2;
        } else if (declared == 127) {
            if (i + 8 > n)
                break;
            declared = 0;
            for (int k = 0; k < 8; k++)
                declared = declared << 8 | p[i + k];
            hdr_len = 8;
        }
        const uint8_t *len_bytes = p + i;
        i += hdr_len;
        uint8_t key[4] = {0};
        if (masked) {
            if (i + 4 > n)
                break;
            memcpy(key, p + i, 4);
            i += 4;
        }
        size_t avail = n - i, len = declared < avail ? (size_t)declared : avail;

        *o++ = b0;
        *o++ = (uint8_t)((masked ? 0x80 : 0) | (b1 & 0x7f));
        /* The length bytes as given: if the payload is cut short by the end
         * of the input, the declared length still stands. */
        memcpy(o, len_bytes, hdr_len);
        o += hdr_len;
        if (masked) {
            memcpy(o, key, 4);
            o += 4;
        }
        for (size_t k = 0; k < len; k++)
            *o++ = p[i + k] ^ (masked ? key[k & 3] : 0);
        i += len;
    }
    *out_len = (size_t)(o - out);
    return out;
}

static void check_rc(const struct ws_conn *c, int rc, const char *what)
{
    FUZZ_ASSERT(rc == 0 || rc == -ECONNRESET || rc == -EPIPE || rc == -ESHUTDOWN, "%s: %d", what,
                rc);
    int why = ws_conn_refused(c);
    FUZZ_ASSERT(why == 0 || why == -EPROTO || why == -EMSGSIZE || why == -ENOSPC || why == -ENOMEM,
                "refused: %d", why);
}

/* What the loop does on EPOLLIN: read, and again while the budget cut it. */
static int read_all(struct ws_conn *c)
{
    int rc;
    do {
        rc = ws_conn_read(c);
        check_rc(c, rc, "ws_conn_read");
    } while (rc == 0 && ws_conn_read_more(c));
    return rc;
}

/* Every close frame the server sends, as a client reads it (fuzz_wsin), must
 * carry a code a client may see and a short UTF-8 reason. */
static void check_close(const uint8_t *p, size_t n)
{
    if (n == 0)
        return;
    FUZZ_ASSERT(n >= 2, "close frame with a 1-byte payload");
    unsigned code = (unsigned)p[0] << 8 | p[1];
    /* Ours (1000, 1002, 1007, 1009, 1011, 1013), or an echo of a client's
     * valid close code (RFC 6455 7.4: 1000-1011 but 1004-1006,
     * and 3000-4999). */
    FUZZ_ASSERT((code >= 1000 && code <= 1011 && (code < 1004 || code > 1006)) || code == 1013 ||
                    (code >= 3000 && code <= 4999),
                "server closed with %u", code);
    FUZZ_ASSERT(n - 2 <= 123 && utf8_valid(p + 2, n - 2), "bad close reason");
}

static void server_frame(void *ud, uint8_t op, bool fin, const uint8_t *p, size_t n, uint64_t len)
{
    if (op == 0x8) {
        FUZZ_ASSERT(len <= 125, "close frame of %llu bytes", (unsigned long long)len);
        check_close(p, n);
    }
}

static struct fuzz_wsin out_stream;

static void drain(int fd)
{
    uint8_t sink[16384];
    ssize_t n;
    while ((n = recv(fd, sink, sizeof sink, MSG_DONTWAIT)) > 0)
        fuzz_wsin_feed(&out_stream, sink, (size_t)n, server_frame, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_chunker ch;
    struct state s = {0};
    buf_init(&s.chunks, SIZE_MAX);
    struct budget budget = {.max = 8u << 20};
    uint8_t *stream;
    size_t len, off = 0, initial_len = 0;
    int sv[2], rc = 0;

    if (size < 2)
        return 0;
    fuzz_chunker_init(&ch, data[0]);
    s.flags = data[1];
    s.max_msg = (s.flags & F_SMALL_MAX) ? 100 : 64 * 1024;
    if (s.flags & F_STRUCTURED) {
        stream = build_frames(data + 2, size - 2, &len);
    } else {
        len = size - 2;
        stream = malloc(len ? len : 1);
        FUZZ_ASSERT(stream != NULL, "malloc");
        memcpy(stream, data + 2, len);
    }
    bool bulk = (s.flags & F_BULK) == F_BULK && data[0] == 0xff;
    if (bulk) {
        /* Few copies of a short stream, then large frames: thousands of
         * tiny messages per input would make every bulk input slow. */
        size_t copies = len ? BULK_BYTES / len + 1 : 0, pad = 60000, at;
        if (copies > 64)
            copies = 64;
        uint8_t *big = malloc(copies * len + BULK_BYTES + pad + 8);
        FUZZ_ASSERT(big != NULL, "malloc");
        for (size_t i = 0; i < copies; i++)
            memcpy(big + i * len, stream, len);
        at = copies * len;
        while (at < BULK_BYTES) {
            /* FIN binary, masked, 16-bit length, key 0: the payload is
             * zeros either way. */
            const uint8_t hdr[8] = {0x82, 0x80 | 126, (uint8_t)(pad >> 8), (uint8_t)pad, 0, 0, 0, 0};
            memcpy(big + at, hdr, sizeof hdr);
            memset(big + at + sizeof hdr, 0, pad);
            at += sizeof hdr + pad;
        }
        free(stream);
        stream = big;
        len = at;
        s.max_msg = 64 * 1024;
    }

    FUZZ_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0,
                "socketpair: %s", strerror(errno));
    if (bulk) {
        /* More than one read budget must fit in the socket at once (an
         * AF_UNIX stream queues up to the sender's buffer). FORCE needs
         * CAP_NET_ADMIN; without it the budget path may not be reached. */
        int sz = 2 * BULK_BYTES;
        if (setsockopt(sv[0], SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof sz) < 0)
            setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    }
    if (s.flags & F_INITIAL)
        initial_len = off = fuzz_chunker_next(&ch, len);
    fuzz_wsin_free(&out_stream);
    fuzz_wsin_init(&out_stream, 125);
    s.c = ws_conn_new(sv[1], &budget, stream, initial_len, &handlers, &s);
    FUZZ_ASSERT(s.c != NULL, "ws_conn_new");
    if (initial_len > 0) /* as the session does right after the upgrade */
        rc = read_all(s.c);

    bool closed_half = false;
    while (rc == 0 && off < len && ws_conn_want_read(s.c)) {
        size_t n = bulk ? len - off : fuzz_chunker_next(&ch, len - off);
        ssize_t w = send(sv[0], stream + off, n, MSG_NOSIGNAL);
        if (w < 0) {
            FUZZ_ASSERT(errno == EAGAIN, "send: %s", strerror(errno));
            w = 0;
        }
        off += (size_t)w;
        rc = read_all(s.c);
        if (rc == 0 && ws_conn_want_write(s.c)) {
            rc = ws_conn_write(s.c);
            check_rc(s.c, rc, "ws_conn_write");
        }
        drain(sv[0]);
        if (rc == 0 && (s.flags & F_SERVER_CLOSE) && !closed_half && off >= len / 2) {
            closed_half = true;
            if (ws_conn_close(s.c, 1011, long_reason) == 0)
                s.closed = true;
        }
    }

    /* The client goes away. */
    if (rc == 0) {
        shutdown(sv[0], SHUT_WR);
        for (int i = 0; i < 4 && rc == 0; i++) {
            rc = read_all(s.c);
            if (rc == 0 && ws_conn_want_write(s.c)) {
                rc = ws_conn_write(s.c);
                check_rc(s.c, rc, "ws_conn_write");
            }
            drain(sv[0]);
        }
        if (rc == 0)
            FUZZ_ASSERT(!ws_conn_want_read(s.c), "EOF read but ws_conn_read still returns 0");
    }
    FUZZ_ASSERT(s.delivered <= len, "delivered %zu bytes of %zu sent", s.delivered, len);

    ws_conn_free(s.c);
    buf_free(&s.chunks);
    FUZZ_ASSERT(budget.used == 0, "%llu bytes still charged after ws_conn_free",
                (unsigned long long)budget.used);
    close(sv[0]);
    close(sv[1]);
    free(stream);
    return 0;
}
