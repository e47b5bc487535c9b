/* WebSocket glue over a socketpair: the test plays the client and writes
 * hand-built masked frames; the server side is a ws_conn. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/budget.h"
#include "net/ws.h"
#include "tap.h"

struct ws_conn;

struct rec {
    uint64_t max_msg;              /* what on_msg_begin answers */
    int ntext, nbin, npong;
    int null_msgs;                 /* messages handed over as NULL */
    struct ws_conn *close_on_text; /* if set, on_text closes it with 1011 */
    uint8_t *last;   /* owned copy of the last message */
    size_t last_len;
    int last_kind;   /* 't' or 'b' */
};

static void rec_store(struct rec *r, int kind, const uint8_t *m, size_t n)
{
    free(r->last);
    r->last = malloc(n ? n : 1);
    if (n)
        memcpy(r->last, m, n);
    r->last_len = n;
    r->last_kind = kind;
}

static uint64_t on_begin(void *ud, struct ws_msg_start *m)
{
    struct rec *r = ud;
    return r->max_msg;
}

static void on_end(void *ud, bool text, struct buf *b)
{
    struct rec *r = ud;
    const uint8_t *m = b->data ? b->data : (const uint8_t *)"";
    if (text) {
        r->ntext++;
        rec_store(r, 't', m, b->len);
        if (r->close_on_text)
            ws_conn_close(r->close_on_text, 1011, "bad frame");
    } else {
        r->nbin++;
        rec_store(r, 'b', m, b->len);
    }
}

static void on_pong(void *ud)
{
    struct rec *r = ud;
    r->npong++;
}

static const struct ws_handlers handlers = {on_begin, NULL, on_end, on_pong};

struct pair {
    int client;        /* blocking, the test writes frames here */
    int server;        /* non-blocking, owned by the test, borrowed by c */
    struct ws_conn *c;
    struct rec rec;
};

static void pair_open(struct pair *p, size_t max_msg, const uint8_t *initial, size_t initial_len)
{
    int sv[2];
    memset(p, 0, sizeof(*p));
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        perror("socketpair");
        exit(1);
    }
    p->client = sv[0];
    p->server = sv[1];
    fcntl(p->server, F_SETFL, fcntl(p->server, F_GETFL) | O_NONBLOCK);
    p->rec.max_msg = max_msg;
    p->c = ws_conn_new(p->server, NULL, initial, initial_len, &handlers, &p->rec);
    if (!p->c) {
        fprintf(stderr, "ws_conn_new failed\n");
        exit(1);
    }
}

static void pair_close(struct pair *p)
{
    ws_conn_free(p->c);
    if (p->client >= 0)
        close(p->client);
    close(p->server);
    free(p->rec.last);
}

/* Build one client frame (masked unless mask == false) into out; returns its
 * length. out must hold n + 14 bytes. */
static size_t frame(uint8_t *out, bool fin, uint8_t opcode, const void *payload, size_t n, bool mask)
{
    static const uint8_t key[4] = {0x37, 0xfa, 0x21, 0x3d};
    size_t h = 0;
    out[h++] = (uint8_t)((fin ? 0x80 : 0) | opcode);
    uint8_t m = mask ? 0x80 : 0;
    if (n < 126) {
        out[h++] = m | (uint8_t)n;
    } else if (n < 65536) {
        out[h++] = m | 126;
        out[h++] = (uint8_t)(n >> 8);
        out[h++] = (uint8_t)n;
    } else {
        out[h++] = m | 127;
        for (int i = 7; i >= 0; i--)
            out[h++] = (uint8_t)((uint64_t)n >> (8 * i));
    }
    if (mask) {
        memcpy(out + h, key, 4);
        h += 4;
    }
    const uint8_t *src = payload;
    for (size_t i = 0; i < n; i++)
        out[h + i] = mask ? src[i] ^ key[i % 4] : src[i];
    return h + n;
}

static void client_write(struct pair *p, const void *b, size_t n)
{
    const uint8_t *s = b;
    while (n > 0) {
        ssize_t w = write(p->client, s, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            perror("client write");
            exit(1);
        }
        s += w;
        n -= (size_t)w;
    }
}

static void send_frame(struct pair *p, bool fin, uint8_t opcode, const void *payload, size_t n)
{
    uint8_t *buf = malloc(n + 14);
    size_t len = frame(buf, fin, opcode, payload, n, true);
    client_write(p, buf, len);
    free(buf);
}

/* Run the server side until it has nothing more to do; returns the last
 * negative status (finished) or 0. */
static int pump(struct pair *p)
{
    int ret = 0;
    for (int i = 0; i < 1000; i++) {
        bool progressed = false;
        if (ws_conn_want_read(p->c)) {
            ret = ws_conn_read(p->c);
            if (ret < 0)
                return ret;
        }
        if (ws_conn_want_write(p->c)) {
            progressed = true;
            ret = ws_conn_write(p->c);
            if (ret < 0)
                return ret;
        }
        if (!progressed && !ws_conn_read_more(p->c))
            break;
    }
    return ret;
}

/* Read exactly n bytes from the client side, waiting at most 2 s. */
static bool client_read(struct pair *p, uint8_t *b, size_t n)
{
    while (n > 0) {
        struct pollfd pfd = {.fd = p->client, .events = POLLIN};
        if (poll(&pfd, 1, 2000) <= 0)
            return false;
        ssize_t r = read(p->client, b, n);
        if (r <= 0)
            return false;
        b += r;
        n -= (size_t)r;
    }
    return true;
}

struct sframe {
    uint8_t fin, opcode, masked;
    uint8_t *payload; /* owned */
    size_t len;
};

/* Read one server frame. Servers never mask (RFC 6455 5.1). */
static bool read_frame(struct pair *p, struct sframe *f)
{
    uint8_t h[8];
    memset(f, 0, sizeof(*f));
    if (!client_read(p, h, 2))
        return false;
    f->fin = h[0] >> 7;
    f->opcode = h[0] & 0x0f;
    f->masked = h[1] >> 7;
    uint64_t len = h[1] & 0x7f;
    if (len == 126) {
        if (!client_read(p, h, 2))
            return false;
        len = (uint64_t)h[0] << 8 | h[1];
    } else if (len == 127) {
        if (!client_read(p, h, 8))
            return false;
        len = 0;
        for (int i = 0; i < 8; i++)
            len = len << 8 | h[i];
    }
    f->len = (size_t)len;
    f->payload = malloc(f->len ? f->len : 1);
    return client_read(p, f->payload, f->len);
}

static uint16_t close_code(const struct sframe *f)
{
    return f->len >= 2 ? (uint16_t)(f->payload[0] << 8 | f->payload[1]) : 0;
}

static bool client_sees_eof_or_nothing(struct pair *p)
{
    struct pollfd pfd = {.fd = p->client, .events = POLLIN};
    if (poll(&pfd, 1, 50) == 0)
        return true;
    uint8_t b;
    return read(p->client, &b, 1) == 0;
}

static void test_text(void)
{
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    send_frame(&p, true, 0x1, "hello\n", 6);
    is_int(pump(&p), 0, "text: connection continues");
    is_int(p.rec.ntext, 1, "text: one message delivered");
    ok(p.rec.last_len == 6 && memcmp(p.rec.last, "hello\n", 6) == 0, "text: payload intact");
    ok(ws_conn_want_read(p.c) && !ws_conn_finished(p.c), "text: still open");

    /* Empty text and a multi-byte UTF-8 message. */
    send_frame(&p, true, 0x1, "", 0);
    send_frame(&p, true, 0x2, "", 0);
    const char *u = "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80";
    send_frame(&p, true, 0x1, u, strlen(u));
    pump(&p);
    is_int(p.rec.ntext, 3, "text: empty and multi-byte messages delivered");
    is_int(p.rec.nbin, 1, "empty binary delivered");
    is_int(p.rec.null_msgs, 0, "empty messages come with a non-NULL pointer");
    ok(p.rec.last_len == strlen(u) && memcmp(p.rec.last, u, strlen(u)) == 0, "text: UTF-8 intact");
    pair_close(&p);
}

static void test_fragmented(void)
{
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    send_frame(&p, false, 0x1, "hel", 3);
    send_frame(&p, false, 0x0, "lo ", 3);
    send_frame(&p, false, 0x0, "", 0);
    /* A ping between fragments is legal (RFC 6455 5.4) and answered. */
    send_frame(&p, true, 0x9, "mid", 3);
    /* A euro sign split across fragments is still valid UTF-8. */
    send_frame(&p, false, 0x0, "\xe2\x82", 2);
    send_frame(&p, true, 0x0, "\xac!", 2);
    pump(&p);
    is_int(p.rec.ntext, 1, "fragments: one message");
    const char *want = "hello \xe2\x82\xac!";
    ok(p.rec.last_len == strlen(want) && memcmp(p.rec.last, want, strlen(want)) == 0,
       "fragments: reassembled in order");
    struct sframe f;
    ok(read_frame(&p, &f) && f.opcode == 0xA && f.len == 3 && memcmp(f.payload, "mid", 3) == 0,
       "fragments: interleaved ping answered with its payload");
    free(f.payload);

    /* Fragmented binary too. */
    send_frame(&p, false, 0x2, "\x00\x01", 2);
    send_frame(&p, true, 0x0, "\xff", 1);
    pump(&p);
    ok(p.rec.nbin == 1 && p.rec.last_len == 3 && memcmp(p.rec.last, "\x00\x01\xff", 3) == 0,
       "fragments: binary reassembled");
    pair_close(&p);
}

static void test_binary(void)
{
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    size_t n = 70000; /* needs the 64-bit length form */
    uint8_t *b = malloc(n);
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(i * 7 + 3);
    /* The frame is bigger than what a socketpair buffers without a reader,
     * so write and pump alternately. */
    uint8_t *fb = malloc(n + 14);
    size_t fl = frame(fb, true, 0x2, b, n, true);
    fcntl(p.client, F_SETFL, fcntl(p.client, F_GETFL) | O_NONBLOCK);
    size_t off = 0;
    while (off < fl) {
        ssize_t w = write(p.client, fb + off, fl - off);
        if (w > 0)
            off += (size_t)w;
        pump(&p);
    }
    fcntl(p.client, F_SETFL, fcntl(p.client, F_GETFL) & ~O_NONBLOCK);
    pump(&p);
    is_int(p.rec.nbin, 1, "binary: delivered once");
    ok(p.rec.last_kind == 'b' && p.rec.last_len == n && memcmp(p.rec.last, b, n) == 0,
       "binary: %zu bytes intact", n);
    is_int(p.rec.ntext, 0, "binary: no text callback");

    /* Bytes that are not UTF-8 are fine in a binary message. */
    send_frame(&p, true, 0x2, "\xff\xfe", 2);
    pump(&p);
    ok(p.rec.nbin == 2 && !ws_conn_finished(p.c), "binary: non-UTF-8 payload accepted");
    free(b);
    free(fb);
    pair_close(&p);
}

/* Write wire[0..n) in pieces of `piece` bytes, pumping between them. */
static void write_pumped(struct pair *p, const uint8_t *wire, size_t n, size_t piece)
{
    fcntl(p->client, F_SETFL, fcntl(p->client, F_GETFL) | O_NONBLOCK);
    for (size_t off = 0; off < n;) {
        size_t k = n - off < piece ? n - off : piece;
        ssize_t w = write(p->client, wire + off, k);
        if (w > 0)
            off += (size_t)w;
        else if (ws_conn_finished(p->c))
            break; /* closed: the rest will not be read */
        pump(p);
    }
    fcntl(p->client, F_SETFL, fcntl(p->client, F_GETFL) & ~O_NONBLOCK);
    pump(p);
}

/* A large text message in fragments of odd sizes, written in odd pieces:
 * payloads land partly through the read buffer and partly straight in the
 * message, at every mask offset, with multi-byte characters cut between
 * fragments; and a bad byte deep inside a large frame is found. */
static void test_large_text(void)
{
    enum { N = 300007 };
    uint8_t *text = malloc(N);
    for (size_t i = 0; i < N;) { /* "ab€" and "😀", repeated */
        static const char pat[] = "ab\xe2\x82\xac\xf0\x9f\x98\x80";
        size_t k = N - i < sizeof pat - 1 ? N - i : sizeof pat - 1;
        memcpy(text + i, pat, k);
        i += k;
    }
    size_t whole = N - (N % 9); /* ends on a whole pattern */
    const size_t cuts[] = {0, 1001, 1002, 65537, 200003, whole};
    uint8_t *wire = malloc(whole + 14 * 6);
    size_t n = 0;
    for (size_t f = 0; f + 1 < sizeof cuts / sizeof *cuts; f++)
        n += frame(wire + n, f + 2 == sizeof cuts / sizeof *cuts, f ? 0x0 : 0x1, text + cuts[f],
                   cuts[f + 1] - cuts[f], true);
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    write_pumped(&p, wire, n, 997);
    is_int(p.rec.ntext, 1, "large text: one message");
    ok(p.rec.last_len == whole && memcmp(p.rec.last, text, whole) == 0,
       "large text: %zu bytes intact across fragments cut inside characters", whole);
    ok(!ws_conn_finished(p.c), "large text: still open");
    pair_close(&p);

    text[150001] = 0xff; /* inside the one frame below */
    n = frame(wire, true, 0x1, text, 200000, true);
    pair_open(&p, 1 << 20, NULL, 0);
    write_pumped(&p, wire, n, 65536);
    is_int(p.rec.ntext, 0, "bad byte deep in a large text: not delivered");
    struct sframe f;
    ok(read_frame(&p, &f) && f.opcode == 0x8 && close_code(&f) == 1007,
       "bad byte deep in a large text: close 1007");
    free(f.payload);
    pair_close(&p);
    free(wire);
    free(text);
}

static void test_ping_pong(void)
{
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    send_frame(&p, true, 0x9, "are you there", 13);
    pump(&p);
    struct sframe f;
    ok(read_frame(&p, &f), "ping: a frame came back");
    ok(f.opcode == 0xA && f.fin && !f.masked, "ping: it is an unmasked final pong");
    ok(f.len == 13 && memcmp(f.payload, "are you there", 13) == 0, "ping: pong echoes the payload");
    free(f.payload);

    send_frame(&p, true, 0xA, "", 0);
    pump(&p);
    is_int(p.rec.npong, 1, "pong from the client reaches on_pong");

    is_int(ws_conn_send_ping(p.c), 0, "server ping queued");
    pump(&p);
    ok(read_frame(&p, &f) && f.opcode == 0x9 && f.len == 0, "server ping on the wire");
    free(f.payload);
    is_int(p.rec.ntext + p.rec.nbin, 0, "control frames are not messages");
    pair_close(&p);
}

static void expect_close(struct pair *p, uint16_t code, const char *what)
{
    struct sframe f;
    bool got = read_frame(p, &f);
    ok(got && f.opcode == 0x8, "%s: close frame sent", what);
    is_int(got ? close_code(&f) : 0, code, "%s: close code %u", what, code);
    free(f.payload);
}

/* Our close is out: the connection waits for the client's (RFC 6455
 * 7.1.1), which ends it. */
static void finish_handshake(struct pair *p, const char *what)
{
    ok(!ws_conn_finished(p->c) && ws_conn_want_read(p->c), "%s: waits for the client's close",
       what);
    send_frame(p, true, 0x8, "\x03\xe8", 2);
    is_int(pump(p), -ESHUTDOWN, "%s: the client's close ends it", what);
    ok(ws_conn_finished(p->c), "%s: finished", what);
}

static void test_invalid_utf8(void)
{
    static const struct {
        const char *s;
        size_t n;
        const char *what;
    } bad[] = {
        {"\xff\xfe", 2, "bytes ff fe"},
        {"\xc0\xaf", 2, "overlong"},
        {"\xed\xa0\x80", 3, "surrogate"},
        {"ok\xe2\x82", 4, "truncated sequence"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct pair p;
        pair_open(&p, 1 << 20, NULL, 0);
        send_frame(&p, true, 0x1, bad[i].s, bad[i].n);
        /* A message queued after the bad one must never be delivered. */
        send_frame(&p, true, 0x1, "after", 5);
        is_int(pump(&p), 0, "invalid UTF-8 (%s): closing", bad[i].what);
        is_int(ws_conn_refused(p.c), -EPROTO, "invalid UTF-8 (%s): -EPROTO", bad[i].what);
        is_int(p.rec.ntext, 0, "invalid UTF-8 (%s): nothing delivered", bad[i].what);
        expect_close(&p, 1007, bad[i].what);
        finish_handshake(&p, bad[i].what);
        pair_close(&p);
    }

    /* Invalid across fragments: the first fragment is fine on its own. */
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    send_frame(&p, false, 0x1, "ab\xe2", 3);
    send_frame(&p, true, 0x0, "x", 1);
    pump(&p);
    is_int(p.rec.ntext, 0, "invalid UTF-8 across fragments: nothing delivered");
    expect_close(&p, 1007, "across fragments");
    pair_close(&p);
}

static void test_too_large(void)
{
    struct pair p;
    pair_open(&p, 1000, NULL, 0);
    uint8_t big[1001];
    memset(big, 'a', sizeof(big));
    send_frame(&p, true, 0x1, big, 1000);
    pump(&p);
    is_int(p.rec.ntext, 1, "exactly max_msg is accepted");
    send_frame(&p, true, 0x1, big, 1001);
    pump(&p);
    is_int(ws_conn_refused(p.c), -EMSGSIZE, "max_msg + 1: -EMSGSIZE");
    is_int(p.rec.ntext, 1, "max_msg + 1: not delivered");
    expect_close(&p, 1009, "one frame over the limit");
    finish_handshake(&p, "max_msg + 1");
    pair_close(&p);

    /* Over the limit only in total, across fragments. */
    pair_open(&p, 1000, NULL, 0);
    send_frame(&p, false, 0x2, big, 600);
    send_frame(&p, true, 0x0, big, 600);
    pump(&p);
    is_int(p.rec.nbin, 0, "fragments over the limit: not delivered");
    expect_close(&p, 1009, "fragments over the limit");
    pair_close(&p);

    /* A header announcing 2^62 bytes is refused before anything is
     * allocated. */
    pair_open(&p, 1000, NULL, 0);
    uint8_t hdr[15] = {0x82, 0xff, 0x40, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 'x'};
    client_write(&p, hdr, sizeof(hdr));
    pump(&p);
    expect_close(&p, 1009, "huge announced length");
    pair_close(&p);
}

static void test_client_close(void)
{
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    uint8_t payload[5] = {0x03, 0xe8, 'b', 'y', 'e'}; /* 1000 "bye" */
    send_frame(&p, true, 0x8, payload, sizeof(payload));
    int ret = ws_conn_read(p.c);
    is_int(ret, 0, "client close: reply still to be written");
    ok(!ws_conn_want_read(p.c), "client close: no more reading");
    ok(ws_conn_want_write(p.c) && !ws_conn_finished(p.c), "client close: reply pending");
    ret = ws_conn_write(p.c);
    ok(ret < 0, "client close: write reports the end (%d)", ret);
    ok(ws_conn_finished(p.c), "client close: finished");
    expect_close(&p, 1000, "client close echoed");
    ok(ws_conn_send_text(p.c, (const uint8_t *)"x", 1) < 0, "send after close fails");
    is_int(ws_conn_queued(p.c), 0, "nothing queued after close");
    pair_close(&p);

    /* Close without a status code gets an empty close back. */
    pair_open(&p, 1 << 20, NULL, 0);
    send_frame(&p, true, 0x8, "", 0);
    ok(pump(&p) < 0 && ws_conn_finished(p.c), "empty close: finished");
    struct sframe f;
    ok(read_frame(&p, &f) && f.opcode == 0x8 && f.len == 0, "empty close answered with empty close");
    free(f.payload);
    pair_close(&p);
}

static void test_server_close_and_send(void)
{
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    is_int(ws_conn_send_text(p.c, (const uint8_t *)"{\"kind\":\"ready\"}\n", 17), 0, "text queued");
    is_int(ws_conn_send_binary(p.c, (const uint8_t *)"\x1f\x8b", 2), 0, "binary queued");
    is_int(ws_conn_queued(p.c), 19 + 2 * WS_MSG_OVERHEAD, "queued counts both messages");
    ok(ws_conn_want_write(p.c), "want_write with messages queued");
    is_int(pump(&p), 0, "sent");
    is_int(ws_conn_queued(p.c), 0, "queue drained");
    ok(!ws_conn_want_write(p.c), "no write interest when drained");
    struct sframe f;
    ok(read_frame(&p, &f) && f.opcode == 0x1 && f.fin && !f.masked && f.len == 17 &&
           memcmp(f.payload, "{\"kind\":\"ready\"}\n", 17) == 0,
       "client got the text frame");
    free(f.payload);
    ok(read_frame(&p, &f) && f.opcode == 0x2 && f.len == 2, "client got the binary frame");
    free(f.payload);

    /* The reason is cut to 123 bytes without splitting a character. */
    char reason[200];
    memset(reason, 'r', sizeof(reason));
    memcpy(reason + 121, "\xe2\x82\xac", 3); /* bytes 121..123 */
    reason[199] = '\0';
    is_int(ws_conn_close(p.c, 1011, reason), 0, "close queued");
    ok(ws_conn_send_text(p.c, (const uint8_t *)"late", 4) < 0, "send after close fails");
    is_int(pump(&p), 0, "our close written");
    ok(read_frame(&p, &f) && f.opcode == 0x8 && close_code(&f) == 1011 && f.len == 2 + 121,
       "close 1011 with the reason cut before the split character");
    free(f.payload);
    finish_handshake(&p, "our close");
    pair_close(&p);
}

static void test_close_from_handler(void)
{
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    p.rec.close_on_text = p.c;
    send_frame(&p, true, 0x1, "first", 5);
    send_frame(&p, true, 0x1, "second", 6);
    send_frame(&p, true, 0x2, "third", 5);
    is_int(pump(&p), 0, "handler close: written");
    is_int(p.rec.ntext, 1, "handler close: later text not delivered");
    is_int(p.rec.nbin, 0, "handler close: later binary not delivered");
    struct sframe f;
    ok(read_frame(&p, &f) && f.opcode == 0x8 && close_code(&f) == 1011 && f.len == 2 + 9 &&
           memcmp(f.payload + 2, "bad frame", 9) == 0,
       "handler close: 1011 with its reason");
    free(f.payload);
    finish_handshake(&p, "handler close");
    is_int(p.rec.ntext, 1, "handler close: nothing delivered while closing");
    pair_close(&p);
}

static void test_one_byte_chunks(void)
{
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    uint8_t wire[512];
    size_t n = 0;
    n += frame(wire + n, false, 0x1, "one ", 4, true);
    n += frame(wire + n, true, 0x9, "p", 1, true);
    n += frame(wire + n, true, 0x0, "byte", 4, true);
    uint8_t mid[200];
    memset(mid, 'm', sizeof(mid)); /* 16-bit length form */
    n += frame(wire + n, true, 0x2, mid, sizeof(mid), true);

    int deliveries_early = 0;
    for (size_t i = 0; i < n; i++) {
        client_write(&p, wire + i, 1);
        if (ws_conn_read(p.c) < 0)
            break;
        if (i + 1 < n && p.rec.nbin > 0)
            deliveries_early++;
    }
    pump(&p);
    is_int(p.rec.ntext, 1, "1-byte chunks: text delivered once");
    is_int(p.rec.nbin, 1, "1-byte chunks: binary delivered once");
    is_int(deliveries_early, 0, "1-byte chunks: nothing delivered before its last byte");
    ok(p.rec.last_len == sizeof(mid) && memcmp(p.rec.last, mid, sizeof(mid)) == 0,
       "1-byte chunks: last message intact");
    struct sframe f;
    ok(read_frame(&p, &f) && f.opcode == 0xA && f.len == 1, "1-byte chunks: ping answered");
    free(f.payload);
    pair_close(&p);
}

static void test_initial_bytes(void)
{
    uint8_t wire[64];
    size_t n = frame(wire, true, 0x1, "first", 5, true);
    n += frame(wire + n, true, 0x1, "second", 6, true);
    /* Hand over the first frame and 3 bytes of the second as "initial". */
    size_t split = n - 9;
    struct pair p;
    pair_open(&p, 1 << 20, wire, split);
    ok(ws_conn_read_more(p.c), "initial bytes pending before the first read");
    ws_conn_read(p.c);
    is_int(p.rec.ntext, 1, "initial bytes: first message delivered without socket data");
    ok(!ws_conn_read_more(p.c), "initial bytes consumed");
    client_write(&p, wire + split, n - split);
    pump(&p);
    is_int(p.rec.ntext, 2, "initial bytes: second message completed from the socket");
    ok(p.rec.last_len == 6 && memcmp(p.rec.last, "second", 6) == 0, "initial bytes: in order");
    pair_close(&p);
}

static void test_eof_and_protocol_errors(void)
{
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    close(p.client);
    p.client = -1;
    is_int(ws_conn_read(p.c), -ECONNRESET, "EOF: -ECONNRESET");
    ok(ws_conn_finished(p.c) && !ws_conn_want_read(p.c) && !ws_conn_want_write(p.c),
       "EOF: finished, no interest");
    pair_close(&p);

    /* EOF in the middle of a frame. */
    pair_open(&p, 1 << 20, NULL, 0);
    client_write(&p, "\x81\x85", 2);
    shutdown(p.client, SHUT_WR);
    ok(pump(&p) < 0 && ws_conn_finished(p.c), "EOF mid-frame: finished");
    is_int(p.rec.ntext, 0, "EOF mid-frame: nothing delivered");
    pair_close(&p);

    /* Unmasked client frame: protocol error 1002. */
    pair_open(&p, 1 << 20, NULL, 0);
    uint8_t buf[32];
    size_t n = frame(buf, true, 0x1, "hi", 2, false);
    client_write(&p, buf, n);
    pump(&p);
    is_int(ws_conn_refused(p.c), -EPROTO, "unmasked frame: -EPROTO");
    is_int(p.rec.ntext, 0, "unmasked frame: not delivered");
    expect_close(&p, 1002, "unmasked frame");
    finish_handshake(&p, "unmasked frame");
    pair_close(&p);

    /* Reserved bits set without an extension: 1002. */
    pair_open(&p, 1 << 20, NULL, 0);
    n = frame(buf, true, 0x1, "hi", 2, true);
    buf[0] |= 0x40; /* RSV1: what permessage-deflate would set */
    client_write(&p, buf, n);
    pump(&p);
    is_int(p.rec.ntext, 0, "RSV1 frame: not delivered");
    expect_close(&p, 1002, "RSV1 without extension");
    pair_close(&p);

    /* Continuation with nothing to continue: 1002. */
    pair_open(&p, 1 << 20, NULL, 0);
    send_frame(&p, true, 0x0, "x", 1);
    pump(&p);
    expect_close(&p, 1002, "stray continuation");
    pair_close(&p);

    /* A control frame over 125 bytes is a frame-level error. */
    pair_open(&p, 1 << 20, NULL, 0);
    uint8_t big[200] = {0};
    send_frame(&p, true, 0x9, big, 126);
    pump(&p);
    is_int(ws_conn_refused(p.c), -EPROTO, "oversized ping: -EPROTO");
    struct sframe f;
    ok(read_frame(&p, &f) && f.opcode == 0x8, "oversized ping: a close frame was sent");
    free(f.payload);
    ok(client_sees_eof_or_nothing(&p), "oversized ping: no pong");
    /* The client's EOF ends the handshake too. */
    shutdown(p.client, SHUT_WR);
    is_int(pump(&p), -ECONNRESET, "oversized ping: the client's EOF ends it");
    ok(ws_conn_finished(p.c), "oversized ping: finished");
    pair_close(&p);
}

static void test_read_budget(void)
{
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    /* Get more than one budget into the socket before the server reads. */
    int sz = 4 << 20;
    setsockopt(p.client, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
    setsockopt(p.server, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
    fcntl(p.client, F_SETFL, fcntl(p.client, F_GETFL) | O_NONBLOCK);
    enum { MSG = 4000 };
    uint8_t payload[MSG], wire[MSG + 14];
    memset(payload, 'x', sizeof(payload));
    size_t fl = frame(wire, true, 0x2, payload, MSG, true);
    size_t written = 0;
    int msgs = 0;
    while (written < WS_READ_BUDGET + 64 * 1024) {
        ssize_t w = write(p.client, wire, fl);
        if (w != (ssize_t)fl) /* socket full (or partial: stop at a frame) */
            break;
        written += fl;
        msgs++;
    }
    if (written <= WS_READ_BUDGET) {
        printf("# socketpair buffers only %zu bytes; skipping budget checks\n", written);
        pair_close(&p);
        return;
    }
    is_int(ws_conn_read(p.c), 0, "budget: first read ok");
    int first = p.rec.nbin;
    ok(first > 0 && first < msgs, "budget: one read delivered %d of %d messages", first, msgs);
    ok((size_t)first * fl <= WS_READ_BUDGET, "budget: at most WS_READ_BUDGET bytes taken");
    ok(ws_conn_read_more(p.c), "budget: read_more says there is more");
    for (int i = 0; i < 100 && ws_conn_read_more(p.c); i++)
        ws_conn_read(p.c);
    is_int(p.rec.nbin, msgs, "budget: later reads deliver the rest");
    ok(!ws_conn_read_more(p.c), "budget: read_more clear once the socket is drained");
    pair_close(&p);
}

/* RFC 6455 protocol errors are closed with 1002 and a reason, at the header
 * (wslay's own reader answered them with an empty close frame). */
static void test_protocol_errors_1002(void)
{
    struct { const char *what; uint8_t b[16]; size_t n; } t[] = {
        {"ping of 126 bytes", {0x89, 0xfe, 0x00, 0x7e, 1, 2, 3, 4}, 8},
        {"fragmented ping", {0x09, 0x80, 1, 2, 3, 4}, 6},
        {"close with a 1-byte payload", {0x88, 0x81, 1, 2, 3, 4, 'x'}, 7},
        {"64-bit length with the top bit set",
         {0x82, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4}, 14},
        {"16-bit length under 126", {0x82, 0xfe, 0x00, 0x05, 1, 2, 3, 4}, 8},
        {"64-bit length under 65536", {0x82, 0xff, 0, 0, 0, 0, 0, 0, 0x01, 0, 1, 2, 3, 4}, 14},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        struct pair p;
        pair_open(&p, 1 << 20, NULL, 0);
        /* one good message first: the connection is in use */
        send_frame(&p, true, 0x1, "ok", 2);
        client_write(&p, t[i].b, t[i].n);
        int r = pump(&p);
        is_int(ws_conn_refused(p.c), -EPROTO, "%s: -EPROTO", t[i].what);
        /* A refused close frame is the client's close all the same. */
        is_int(r, i == 2 ? -ESHUTDOWN : 0, "%s: %s", t[i].what,
               i == 2 ? "over once ours is out" : "closing");
        is_int(p.rec.ntext, 1, "%s: the message before it delivered", t[i].what);
        expect_close(&p, 1002, t[i].what);
        if (i != 2) { /* the frames' payloads never come: the client's EOF ends it */
            shutdown(p.client, SHUT_WR);
            is_int(pump(&p), -ECONNRESET, "%s: the client's EOF ends it", t[i].what);
        }
        pair_close(&p);
    }
    /* The same bytes as one-byte writes: the header is checked whole. */
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    for (size_t k = 0; k < t[3].n; k++) {
        client_write(&p, t[3].b + k, 1);
        pump(&p);
    }
    expect_close(&p, 1002, "top-bit length, one byte at a time");
    pair_close(&p);
}

/* A message over its limit is refused at the header that announces it: the
 * rest of the body never has to arrive, nothing is reserved for it. */
static void test_limit_at_header(void)
{
    struct pair p;
    pair_open(&p, 1000, NULL, 0);
    /* 4096 bytes announced, one sent */
    uint8_t hdr[9] = {0x82, 0xfe, 0x10, 0x00, 1, 2, 3, 4, 'z'};
    client_write(&p, hdr, sizeof hdr);
    pump(&p);
    is_int(ws_conn_refused(p.c), -EMSGSIZE, "refused at the header: -EMSGSIZE");
    expect_close(&p, 1009, "announced over the limit");
    /* The client goes on sending the message it announced, then its close:
     * the rest is read and discarded, and the close found after it. */
    uint8_t rest[4095];
    memset(rest, 'z', sizeof rest);
    client_write(&p, rest, sizeof rest);
    finish_handshake(&p, "announced over the limit");
    pair_close(&p);
}

static uint64_t drop_binary(void *ud, struct ws_msg_start *m)
{
    struct rec *r = ud;
    return m->text ? r->max_msg : WS_MSG_DROP;
}

/* A message dropped at its start is read and discarded, never buffered. */
static void test_dropped_message(void)
{
    static const struct ws_handlers dh = {drop_binary, NULL, on_end, on_pong};
    struct budget b = {.max = 4096 + WS_RBUF};
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    ws_conn_free(p.c);
    p.c = ws_conn_new(p.server, &b, NULL, 0, &dh, &p.rec);
    uint8_t big[60000];
    memset(big, 'z', sizeof big);
    send_frame(&p, false, 0x2, big, sizeof big); /* far over the budget */
    send_frame(&p, true, 0x0, big, sizeof big);
    send_frame(&p, true, 0x1, "after", 5);
    is_int(pump(&p), 0, "dropped message: the connection goes on");
    ok(p.rec.nbin == 0 && p.rec.ntext == 1 && b.used == 0, "not delivered, nothing charged");
    pair_close(&p);
}

/* Budget refusals: the turn's own (1009) and the daemon's (1013). */
static void test_budget_refusals(void)
{
    /* the read buffer is charged too, while it holds bytes */
    struct budget all = {.max = 3000 + WS_RBUF}, turn = {.max = 2000 + WS_RBUF, .up = &all};
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    ws_conn_free(p.c);
    p.c = ws_conn_new(p.server, &turn, NULL, 0, &handlers, &p.rec);
    uint8_t big[2500];
    memset(big, 'y', sizeof big);
    send_frame(&p, true, 0x2, big, 1500);
    pump(&p);
    ok(p.rec.nbin == 1 && turn.used == 0, "within the budget: delivered and given back");
    send_frame(&p, true, 0x2, big, 2500);
    pump(&p);
    is_int(ws_conn_refused(p.c), -EMSGSIZE, "over the turn's budget: -EMSGSIZE");
    expect_close(&p, 1009, "over the turn's budget");
    finish_handshake(&p, "over the turn's budget");
    pair_close(&p);

    all.used = 2000; /* other turns hold most of the daemon's */
    pair_open(&p, 1 << 20, NULL, 0);
    ws_conn_free(p.c);
    p.c = ws_conn_new(p.server, &turn, NULL, 0, &handlers, &p.rec);
    send_frame(&p, true, 0x2, big, 1500);
    pump(&p);
    is_int(ws_conn_refused(p.c), -ENOSPC, "over the daemon's budget: -ENOSPC");
    expect_close(&p, 1013, "daemon budget exhausted: try again later");
    finish_handshake(&p, "over the daemon's budget");
    pair_close(&p);
}

/* Pongs are charged (with wslay's records), and a client with more than the
 * window queued for it is not read until that drains: a ping flood that is
 * never read back holds the window, not more. */
static void test_window_holds_pings(void)
{
    enum { PINGS = 100, PAYLOAD = 10, WINDOW = 10 * (PAYLOAD + WS_MSG_OVERHEAD) };
    struct budget b = {.max = 1 << 20};
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    ws_conn_free(p.c);
    p.c = ws_conn_new(p.server, &b, NULL, 0, &handlers, &p.rec);
    ws_conn_set_window(p.c, WINDOW);
    for (int i = 0; i < PINGS; i++)
        send_frame(&p, true, 0x9, "0123456789", PAYLOAD);
    is_int(ws_conn_read(p.c), 0, "pings read");
    size_t q = ws_conn_queued(p.c);
    ok(q > WINDOW && q <= WINDOW + PAYLOAD + WS_MSG_OVERHEAD,
       "reading stops once the window is passed (%zu queued)", q);
    ok(b.used >= q, "the pongs are charged (%llu for %zu queued)", (unsigned long long)b.used, q);
    ok(!ws_conn_want_read(p.c) && !ws_conn_read_more(p.c), "not read while over the window");
    ws_conn_write(p.c);
    ok(ws_conn_want_read(p.c) && ws_conn_read_more(p.c), "drained: read again, bytes waiting");
    is_int(pump(&p), 0, "the rest answered");
    int pongs = 0;
    struct sframe f;
    while (pongs < PINGS && read_frame(&p, &f)) {
        pongs += f.opcode == 0xA && f.len == PAYLOAD;
        free(f.payload);
    }
    is_int(pongs, PINGS, "every ping answered");
    ok(ws_conn_queued(p.c) == 0 && b.used == 0, "nothing held, nothing charged");
    pair_close(&p);
}

/* A large outgoing message is sent from the caller's buffer in fragments; the
 * client reassembles exactly the bytes, and its charge is given back. */
static void test_send_buf_fragments(void)
{
    struct budget b = {.max = 1 << 20};
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    ws_conn_free(p.c);
    p.c = ws_conn_new(p.server, &b, NULL, 0, &handlers, &p.rec);
    size_t n = 300000;
    struct buf m;
    buf_init_budget(&m, SIZE_MAX, &b);
    buf_reserve_exact(&m, n);
    for (size_t i = 0; i < n; i++)
        m.data[i] = (uint8_t)('a' + i % 26);
    m.len = n;
    is_int(ws_conn_send_buf(p.c, true, &m), 0, "queued");
    ok(m.data == NULL && ws_conn_queued(p.c) == n + WS_MSG_OVERHEAD,
       "taken over; %zu bytes queued", ws_conn_queued(p.c));
    uint8_t *got = malloc(n);
    size_t have = 0;
    int frames = 0;
    bool ok_frames = true;
    while (have < n) {
        if (ws_conn_want_write(p.c))
            ws_conn_write(p.c);
        struct sframe f;
        if (!read_frame(&p, &f))
            break;
        ok_frames = ok_frames && f.opcode == (frames ? 0x0 : 0x1) && !f.masked &&
                    have + f.len <= n && (f.fin == (have + f.len == n));
        memcpy(got + have, f.payload, f.len < n - have ? f.len : n - have);
        have += f.len;
        frames++;
        free(f.payload);
    }
    ok(ok_frames && have == n && frames > 1, "%d fragments, text then continuations, FIN last",
       frames);
    bool same = true;
    for (size_t i = 0; i < n && same; i++)
        same = got[i] == (uint8_t)('a' + i % 26);
    ok(same, "the bytes are the message's");
    ws_conn_write(p.c);
    ok(ws_conn_queued(p.c) == 0 && b.used == 0, "sent and given back");
    free(got);
    pair_close(&p);
}

/* Read server frames until one with opcode op (or `frames` of them); the
 * data frames' payloads are appended to got (got_len), FIN noted. */
static int read_data_until(struct pair *p, uint8_t op, uint8_t *got, size_t *got_len,
                           bool *fin_seen, int frames)
{
    for (int i = 0; i < frames; i++) {
        struct sframe f;
        if (!read_frame(p, &f))
            return -1;
        int o = f.opcode;
        if (o == 0x1 || o == 0x0) {
            memcpy(got + *got_len, f.payload, f.len);
            *got_len += f.len;
            *fin_seen = *fin_seen || f.fin;
        }
        free(f.payload);
        if (o == op)
            return o;
    }
    return 0;
}

/* A stream: its bytes go out as they are pushed, but its last byte only
 * once it is ended (FIN then); a stalled stream wants no write, yet a
 * ping queued meanwhile goes out between its fragments (wslay's read
 * callback returning 0 without eof stalls it, 1.1.1 as in later ones). */
static void test_stream(void)
{
    struct budget b = {.max = 1 << 20};
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    ws_conn_free(p.c);
    p.c = ws_conn_new(p.server, &b, NULL, 0, &handlers, &p.rec);
    static uint8_t msg[20000], got[20000 + 64];
    for (size_t i = 0; i < sizeof msg; i++)
        msg[i] = (uint8_t)('a' + i % 26);
    struct ws_stream *st;
    is_int(ws_conn_stream_begin(p.c, true, &st), 0, "stream begun");
    struct buf chunk;
    buf_init_budget(&chunk, SIZE_MAX, &b);
    buf_append(&chunk, msg, 12000);
    is_int(ws_conn_stream_push(p.c, st, &chunk), 0, "first chunk pushed");
    ok(ws_conn_queued(p.c) >= 12000 && b.used >= 12000, "queued and charged");
    for (int i = 0; i < 8 && ws_conn_want_write(p.c); i++)
        ws_conn_write(p.c);
    ok(!ws_conn_want_write(p.c), "stalled with its last byte held: no write wanted");
    size_t have = 0;
    bool fin = false;
    while (have < 11999 && read_data_until(&p, 0xff, got, &have, &fin, 1) >= 0)
        ;
    ok(have == 11999 && !fin, "all but the last byte out, no FIN (%zu)", have);
    is_int(ws_conn_send_ping(p.c), 0, "a ping queued");
    ok(ws_conn_want_write(p.c), "a control frame wakes the stalled stream");
    ws_conn_write(p.c);
    is_int(read_data_until(&p, 0x9, got, &have, &fin, 4), 0x9, "the ping goes between fragments");
    buf_init_budget(&chunk, SIZE_MAX, &b);
    buf_append(&chunk, msg + 12000, sizeof msg - 12000);
    ws_conn_stream_push(p.c, st, &chunk);
    ws_conn_stream_end(p.c, st);
    for (int i = 0; i < 8 && ws_conn_want_write(p.c); i++)
        ws_conn_write(p.c);
    while (!fin && read_data_until(&p, 0xff, got, &have, &fin, 1) >= 0)
        ;
    ok(fin && have == sizeof msg && memcmp(got, msg, sizeof msg) == 0,
       "ended: the rest, FIN last, the message exact");
    ok(ws_conn_queued(p.c) == 0 && b.used == 0, "nothing held, nothing charged");
    pair_close(&p);

    /* Aborted: a close goes out between its fragments; what was queued after
     * it never does, and does not hold the close back. */
    pair_open(&p, 1 << 20, NULL, 0);
    ws_conn_free(p.c);
    p.c = ws_conn_new(p.server, &b, NULL, 0, &handlers, &p.rec);
    ws_conn_stream_begin(p.c, false, &st);
    buf_init_budget(&chunk, SIZE_MAX, &b);
    buf_append(&chunk, msg, 9000);
    ws_conn_stream_push(p.c, st, &chunk);
    ws_conn_send_text(p.c, (const uint8_t *)"after", 5);
    for (int i = 0; i < 8 && ws_conn_want_write(p.c); i++)
        ws_conn_write(p.c);
    ok(ws_conn_pending(p.c), "pending while the stream may still end");
    ws_conn_stream_abort(p.c, st);
    for (int i = 0; i < 8 && ws_conn_want_write(p.c); i++)
        ws_conn_write(p.c);
    ok(!ws_conn_pending(p.c), "behind an aborted stream nothing is pending");
    is_int(ws_conn_close(p.c, 1011, "bad at its end"), 0, "close queued");
    for (int i = 0; i < 8 && ws_conn_want_write(p.c); i++)
        ws_conn_write(p.c);
    have = 0;
    fin = false;
    int op = read_data_until(&p, 0x8, got, &have, &fin, 16);
    ok(op == 0x8 && !fin && have < 9000, "close after %zu bytes, never FIN, never 'after'", have);
    finish_handshake(&p, "after an aborted stream");
    pair_close(&p);
    ok(b.used == 0, "all given back");
}

/* A streamed incoming message: its payload is handed over in chunks of at
 * most WS_STREAM_CHUNK as it arrives (a fragmented one too), the chunks
 * charged until taken, nothing assembled; UTF-8 is checked across chunks,
 * the limit across frames. */
struct srec {
    struct buf got;    /* what the chunks brought */
    int chunks, ends;
    size_t biggest;
    size_t end_len;    /* on_msg_end's buffer: empty for a stream */
    bool end_text;
};

static uint64_t stream_begin(void *ud, struct ws_msg_start *m)
{
    m->stream = true;
    return 300000;
}

static bool stream_chunk(void *ud, struct buf *chunk)
{
    struct srec *r = ud;
    r->chunks++;
    r->biggest = chunk->len > r->biggest ? chunk->len : r->biggest;
    buf_append(&r->got, chunk->data, chunk->len);
    return true;
}

static void stream_end(void *ud, bool text, struct buf *msg)
{
    struct srec *r = ud;
    r->ends++;
    r->end_len = msg->len;
    r->end_text = text;
}

static void test_stream_in(void)
{
    static const struct ws_handlers sh = {.on_msg_begin = stream_begin, .on_msg_end = stream_end,
                                          .on_msg_chunk = stream_chunk};
    struct budget b = {.max = 1 << 20};
    struct srec r = {0};
    buf_init(&r.got, SIZE_MAX);
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    ws_conn_free(p.c);
    p.c = ws_conn_new(p.server, &b, NULL, 0, &sh, &r);
    static uint8_t msg[200000];
    for (size_t i = 0; i < sizeof msg; i += 2) { /* "é" repeated: cut anywhere */
        msg[i] = 0xc3;
        msg[i + 1] = 0xa9;
    }
    static uint8_t wire[2 * sizeof msg + 64];
    size_t w = frame(wire, false, 0x1, msg, 70001, true); /* a character cut between frames */
    w += frame(wire + w, true, 0x0, msg + 70001, sizeof msg - 70001, true);
    write_pumped(&p, wire, w, 9000);
    is_int(pump(&p), 0, "streamed text read");
    ok(r.ends == 1 && r.end_text && r.end_len == 0, "ended once, nothing in the end buffer");
    ok(r.got.len == sizeof msg && memcmp(r.got.data, msg, sizeof msg) == 0,
       "the chunks make the message (%zu bytes in %d chunks)", r.got.len, r.chunks);
    ok(r.chunks >= 4 && r.biggest <= WS_STREAM_CHUNK, "in chunks of at most WS_STREAM_CHUNK");
    ok(b.used == 0, "nothing held");
    /* over the limit across frames: refused at the header that passes it */
    w = frame(wire, false, 0x2, msg, 200000, true);
    w += frame(wire + w, true, 0x0, msg, 200000, true);
    write_pumped(&p, wire, w, 9000);
    expect_close(&p, 1009, "300000 bytes at most, across frames");
    pair_close(&p);
    /* bad UTF-8 in a later chunk: refused, 1007 */
    buf_free(&r.got);
    memset(&r, 0, sizeof r);
    buf_init(&r.got, SIZE_MAX);
    pair_open(&p, 1 << 20, NULL, 0);
    ws_conn_free(p.c);
    p.c = ws_conn_new(p.server, &b, NULL, 0, &sh, &r);
    msg[150001] = 0xff;
    w = frame(wire, true, 0x1, msg, sizeof msg, true);
    write_pumped(&p, wire, w, 9000);
    expect_close(&p, 1007, "streamed text not UTF-8");
    ok(r.ends == 0, "never ended");
    buf_free(&r.got);
    pair_close(&p);
    ok(b.used == 0, "all given back");
}

/* A close reason that is not UTF-8 is refused with 1007, also when it arrives
 * in pieces (wslay checks it per chunk from each chunk's third byte, and would
 * echo the bad reason back). */
static void test_close_reason_utf8(void)
{
    uint8_t payload[5] = {0x03, 0xe8, 0x81, 0x04, 0x01}; /* 1000, then a stray continuation */
    uint8_t buf[32];
    size_t n = frame(buf, true, 0x8, payload, sizeof payload, true);
    struct pair p;
    pair_open(&p, 1 << 20, NULL, 0);
    client_write(&p, buf, n - 4); /* the header and the code's first byte */
    pump(&p);
    client_write(&p, buf + n - 4, 4);
    is_int(pump(&p), -ESHUTDOWN, "bad close reason in two pieces: over once ours is out");
    is_int(ws_conn_refused(p.c), -EPROTO, "bad close reason in two pieces: -EPROTO");
    expect_close(&p, 1007, "bad close reason in two pieces");
    pair_close(&p);
}

/* Write n bytes from the client while the server side runs (the socket
 * buffers hold less than a pipelined message). -ESHUTDOWN, -ECONNRESET: the
 * server finished before all of it was written (then the rest is not). */
static int client_write_pumping(struct pair *p, const uint8_t *b, size_t n)
{
    fcntl(p->client, F_SETFL, fcntl(p->client, F_GETFL) | O_NONBLOCK);
    int r = 0;
    for (int spins = 0; n > 0 && r == 0 && spins < 100000; spins++) {
        ssize_t w = write(p->client, b, n);
        if (w > 0) {
            b += w;
            n -= (size_t)w;
        }
        r = pump(p);
    }
    fcntl(p->client, F_SETFL, fcntl(p->client, F_GETFL) & ~O_NONBLOCK);
    return r;
}

/* RFC 6455 7.1.1, what a host that pipelines sees: the server closes while
 * a message is on its way (its header refused), and the client sends the
 * whole message before it gets to its own close. The rest of that message
 * is read and discarded, however large (it is bounded by the 256 MiB a
 * message may have), and the close after it ends the connection: nothing
 * is left unread for a reset to throw our close away. */
static void test_close_while_client_sends(void)
{
    enum { BIG = 3 * WS_CLOSE_DRAIN_BYTES };
    struct pair p;
    pair_open(&p, 1000, NULL, 0);
    uint8_t *wire = malloc(BIG + 14);
    uint8_t *big = calloc(1, BIG);
    size_t n = frame(wire, true, 0x2, big, BIG, true);
    client_write(&p, wire, 14); /* the header: refused at once */
    pump(&p);
    is_int(ws_conn_refused(p.c), -EMSGSIZE, "pipelined: refused at its header");
    expect_close(&p, 1009, "pipelined");
    is_int(client_write_pumping(&p, wire + 14, n - 14), 0, "pipelined: all of it read");
    finish_handshake(&p, "pipelined");
    pair_close(&p);

    /* Past the frame being received, at most WS_CLOSE_DRAIN_BYTES more are
     * discarded: a client that never sends its close is cut off. */
    pair_open(&p, 1 << 20, NULL, 0);
    ws_conn_close(p.c, 1000, "bye");
    pump(&p);
    expect_close(&p, 1000, "budget");
    n = frame(wire, true, 0x2, big, 4096, true);
    int r = 0;
    size_t sent = 0;
    while (r == 0 && sent < 2 * WS_CLOSE_DRAIN_BYTES) {
        r = client_write_pumping(&p, wire, n);
        sent += n;
    }
    is_int(r, -ESHUTDOWN, "budget: over after the drain budget");
    ok(sent > WS_CLOSE_DRAIN_BYTES && sent <= WS_CLOSE_DRAIN_BYTES + 4 * n,
       "budget: %zu bytes read after the close", sent);
    pair_close(&p);

    /* After a frame that cannot be followed, a close frame in the bytes
     * after it still ends the connection. */
    pair_open(&p, 1 << 20, NULL, 0);
    n = frame(wire, true, 0x1, "hi", 2, true);
    wire[0] |= 0x20; /* RSV2 */
    client_write(&p, wire, n);
    pump(&p);
    expect_close(&p, 1002, "after a bad frame");
    send_frame(&p, true, 0x2, big, 100); /* not delivered */
    finish_handshake(&p, "after a bad frame");
    is_int(p.rec.nbin, 0, "after a bad frame: nothing delivered");
    pair_close(&p);
    free(wire);
    free(big);
}

int main(void)
{
    test_close_while_client_sends();
    test_protocol_errors_1002();
    test_close_reason_utf8();
    test_limit_at_header();
    test_dropped_message();
    test_budget_refusals();
    test_send_buf_fragments();
    test_window_holds_pings();
    test_stream();
    test_stream_in();
    test_text();
    test_fragmented();
    test_binary();
    test_large_text();
    test_ping_pong();
    test_invalid_utf8();
    test_too_large();
    test_client_close();
    test_server_close_and_send();
    test_close_from_handler();
    test_one_byte_chunks();
    test_initial_bytes();
    test_eof_and_protocol_errors();
    test_read_budget();
    return tap_done();
}
