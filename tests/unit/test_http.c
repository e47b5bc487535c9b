/* HTTP front door: request parsing, upgrade checks, auth, response bytes. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h"
#include "core/limits.h"
#include "net/http.h"
#include "tap.h"

#define UPGRADE_REQ                                                                        \
    "GET /chat?x=1&y=%20 HTTP/1.1\r\n"                                                     \
    "Host: example.com:8080\r\n"                                                           \
    "Upgrade: websocket\r\n"                                                               \
    "Connection: Upgrade\r\n"                                                              \
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"                                      \
    "Sec-WebSocket-Version: 13\r\n"                                                        \
    "Authorization: Bearer tok\r\n"                                                        \
    "\r\n"

/* Feed all of s at once; returns feed's result, *consumed as reported. */
static int feed_whole(struct http_req *r, const char *s, size_t n, size_t *consumed)
{
    return http_req_feed(r, (const uint8_t *)s, n, consumed);
}

/* Feed s in chunks of `step` bytes until feed returns non-zero; *total gets
 * the sum of consumed. Returns the final result (0 if input ran out). */
static int feed_chunked(struct http_req *r, const char *s, size_t n, size_t step, size_t *total)
{
    size_t off = 0;
    int ret = 0;
    *total = 0;
    while (off < n) {
        size_t len = n - off < step ? n - off : step;
        size_t used = 0;
        ret = http_req_feed(r, (const uint8_t *)s + off, len, &used);
        *total += used;
        if (ret != 0)
            return ret;
        if (used != len)
            return -1000; /* a 0 return must consume everything */
        off += len;
    }
    return ret;
}

/* Parse a complete request; NULL (and a failed test) if it is not one. */
static struct http_req *parse_ok(const char *s)
{
    struct http_req *r = http_req_new();
    size_t used = 0;
    int ret = feed_whole(r, s, strlen(s), &used);
    if (ret != 1 || used != strlen(s)) {
        ok(0, "parse_ok: ret %d used %zu of %zu", ret, used, strlen(s));
        http_req_free(r);
        return NULL;
    }
    return r;
}

static int parse_err(const char *s, size_t n)
{
    struct http_req *r = http_req_new();
    size_t used = 0;
    int ret = feed_whole(r, s, n, &used);
    http_req_free(r);
    return ret;
}

static void test_whole_and_leftover(void)
{
    const char *req = UPGRADE_REQ;
    size_t req_len = strlen(req);
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s\x81\x85MASKhello", req);
    size_t total = strlen(buf);

    struct http_req *r = http_req_new();
    size_t used = 99;
    is_int(feed_whole(r, buf, total, &used), 1, "whole request with trailing frame bytes completes");
    is_int(used, req_len, "consumed stops at the blank line; %zu bytes left over", total - used);
    is_str(http_req_method(r), "GET", "method");
    is_str(http_req_target(r), "/chat?x=1&y=%20", "raw target with query");
    is_str(http_req_header(r, "host"), "example.com:8080", "header lookup is case-insensitive");
    is_str(http_req_header(r, "SEC-WEBSOCKET-KEY"), "dGhlIHNhbXBsZSBub25jZQ==", "key");
    ok(http_req_header(r, "X-Missing") == NULL, "absent header is NULL");
    ok(http_req_is_websocket_upgrade(r), "valid upgrade recognised");

    used = 99;
    is_int(http_req_feed(r, (const uint8_t *)"more", 4, &used), 1, "feed after completion stays 1");
    is_int(used, 0, "and consumes nothing");
    http_req_free(r);
}

static void test_byte_by_byte(void)
{
    const char *req = UPGRADE_REQ;
    size_t req_len = strlen(req);
    char buf[1024];
    snprintf(buf, sizeof(buf), "%sLEFTOVER", req);
    size_t n = strlen(buf);

    struct http_req *r = http_req_new();
    size_t total = 0;
    int ret = feed_chunked(r, buf, n, 1, &total);
    is_int(ret, 1, "byte-at-a-time completes");
    is_int(total, req_len, "byte-at-a-time consumed exactly the request");
    is_str(http_req_target(r), "/chat?x=1&y=%20", "byte-at-a-time target");
    is_str(http_req_header(r, "Authorization"), "Bearer tok", "byte-at-a-time header value");
    is_str(http_req_header(r, "Connection"), "Upgrade", "byte-at-a-time Connection");
    ok(http_req_is_websocket_upgrade(r), "byte-at-a-time upgrade recognised");
    http_req_free(r);

    /* Every chunk size, so the request end lands at every offset in a chunk. */
    bool all_ok = true;
    for (size_t step = 2; step <= 40; step++) {
        r = http_req_new();
        ret = feed_chunked(r, buf, n, step, &total);
        if (ret != 1 || total != req_len || !http_req_is_websocket_upgrade(r) ||
            strcmp(http_req_header(r, "Sec-WebSocket-Version"), "13") != 0) {
            all_ok = false;
            printf("# step %zu: ret %d total %zu\n", step, ret, total);
        }
        http_req_free(r);
    }
    ok(all_ok, "chunk sizes 2..40 all complete with the right consumed count");
}

static void test_line_endings_and_values(void)
{
    /* Bare LF line endings are accepted; the request ends after "\n\n". */
    const char *lf = "GET / HTTP/1.1\nHost: a\n\nXY";
    struct http_req *r = http_req_new();
    size_t used = 0;
    is_int(feed_whole(r, lf, strlen(lf), &used), 1, "bare LF request completes");
    is_int(used, strlen(lf) - 2, "bare LF: leftover counted");
    http_req_free(r);

    r = parse_ok("GET / HTTP/1.1\r\n"
                 "X-Empty:\r\n"
                 "X-Trail: v \t \r\n"
                 "X-Lead:   \tw\r\n"
                 "X-Rep: 1\r\n"
                 "x-rep: 2\r\n"
                 "Connection: keep-alive\r\n"
                 "connection: Upgrade\r\n"
                 "X-Last:\r\n"
                 "\r\n");
    if (r) {
        is_str(http_req_header(r, "X-Empty"), "", "empty value is \"\"");
        is_str(http_req_header(r, "X-Trail"), "v", "trailing OWS trimmed");
        is_str(http_req_header(r, "X-Lead"), "w", "leading OWS trimmed");
        is_str(http_req_header(r, "X-Rep"), "2", "repeated header: last wins");
        is_str(http_req_header(r, "Connection"), "keep-alive,Upgrade", "Connection values joined");
        is_str(http_req_header(r, "X-Last"), "", "empty last value is \"\"");
        http_req_free(r);
    }

    r = parse_ok("GET /health HTTP/1.1\r\n\r\n");
    if (r) {
        is_str(http_req_target(r), "/health", "no headers at all");
        ok(http_req_header(r, "Connection") == NULL, "no Connection header is NULL");
        ok(!http_req_is_websocket_upgrade(r), "plain GET is not an upgrade");
        http_req_free(r);
    }

    r = parse_ok("GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    ok(r != NULL, "Content-Length: 0 is not a body");
    http_req_free(r);
}

static void test_limits(void)
{
    char *big = malloc(32 * KiB);
    size_t n;

    /* 64 headers fit. */
    n = (size_t)sprintf(big, "GET / HTTP/1.1\r\n");
    for (int i = 0; i < HTTP_MAX_HEADERS; i++)
        n += (size_t)sprintf(big + n, "X-H%d: %d\r\n", i, i);
    n += (size_t)sprintf(big + n, "\r\n");
    struct http_req *r = http_req_new();
    size_t used = 0;
    is_int(feed_whole(r, big, n, &used), 1, "%d headers accepted", HTTP_MAX_HEADERS);
    is_str(http_req_header(r, "x-h63"), "63", "64th header readable");
    http_req_free(r);

    /* 65 do not, whole or byte by byte. */
    n = (size_t)sprintf(big, "GET / HTTP/1.1\r\n");
    for (int i = 0; i < HTTP_MAX_HEADERS + 1; i++)
        n += (size_t)sprintf(big + n, "X-H%d: %d\r\n", i, i);
    n += (size_t)sprintf(big + n, "\r\n");
    is_int(parse_err(big, n), -E2BIG, "65 headers: -E2BIG");
    r = http_req_new();
    is_int(feed_chunked(r, big, n, 1, &used), -E2BIG, "65 headers byte by byte: -E2BIG");
    http_req_free(r);

    /* 17 KiB request: one long header. */
    n = (size_t)sprintf(big, "GET / HTTP/1.1\r\nX-Big: ");
    memset(big + n, 'a', 17 * KiB);
    n += 17 * KiB;
    n += (size_t)sprintf(big + n, "\r\n\r\n");
    is_int(parse_err(big, n), -E2BIG, "17 KiB request: -E2BIG");
    r = http_req_new();
    is_int(feed_chunked(r, big, n, 1000, &used), -E2BIG, "17 KiB request in chunks: -E2BIG");
    size_t again = 7;
    is_int(http_req_feed(r, (const uint8_t *)"x", 1, &again), -E2BIG, "error is sticky");
    http_req_free(r);

    /* Exactly HTTP_MAX_REQUEST_BYTES is fine, with leftover bytes after it. */
    const char *head = "GET / HTTP/1.1\r\nX-Big: ";
    n = strlen(head);
    memcpy(big, head, n);
    size_t fill = HTTP_MAX_REQUEST_BYTES - n - 4;
    memset(big + n, 'b', fill);
    n += fill;
    memcpy(big + n, "\r\n\r\n", 4);
    n += 4;
    memset(big + n, 'Z', 4 * KiB); /* WebSocket bytes after the request */
    r = http_req_new();
    is_int(feed_whole(r, big, n + 4 * KiB, &used), 1, "request of exactly the limit accepted");
    is_int(used, HTTP_MAX_REQUEST_BYTES, "leftover after a limit-sized request not counted");
    http_req_free(r);
    r = http_req_new();
    is_int(feed_chunked(r, big, n + 4 * KiB, 1, &used), 1, "limit-sized request byte by byte");
    is_int(used, HTTP_MAX_REQUEST_BYTES, "byte by byte consumed the limit exactly");
    http_req_free(r);

    free(big);
}

static void test_malformed(void)
{
    static const char *bad[] = {
        "GARBAGE\r\n\r\n",
        "GET / HTTP/1.1\r\nNo colon here\r\n\r\n",
        "GET / HTTP/2.0\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\x01\r\n\r\n",
        "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
        "GET / HTTP/1.1\r\nName : x\r\n\r\n",
        "GET / HTTP/1.1\r\n: x\r\n\r\n",
        "GET / HTTP/1.1\r\nA(b): x\r\n\r\n",
        "GET  HTTP/1.1\r\n\r\n",
        "GET / XTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1\r\nX: a\x7f\r\n\r\n",
        "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", /* a TLS ClientHello */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        is_int(parse_err(bad[i], strlen(bad[i])), -EBADMSG, "malformed #%zu: -EBADMSG", i);

    struct http_req *r = http_req_new();
    size_t used;
    const char *tls = "\x16\x03\x01";
    is_int(feed_chunked(r, tls, 3, 1, &used), -EBADMSG, "malformed byte by byte: -EBADMSG");
    http_req_free(r);
}

static void test_bodies(void)
{
    const char *cl = "POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
    is_int(parse_err(cl, strlen(cl)), -EBADMSG, "Content-Length body rejected");
    const char *getcl = "GET / HTTP/1.1\r\nContent-Length: 1\r\n\r\nx";
    is_int(parse_err(getcl, strlen(getcl)), -EBADMSG, "GET with a body rejected");
    const char *chunked = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    is_int(parse_err(chunked, strlen(chunked)), -EBADMSG, "chunked body rejected");
    const char *te = "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n";
    is_int(parse_err(te, strlen(te)), -EBADMSG, "any Transfer-Encoding rejected");

    struct http_req *r = http_req_new();
    size_t used;
    is_int(feed_chunked(r, cl, strlen(cl), 1, &used), -EBADMSG, "body rejected byte by byte");
    http_req_free(r);
}

/* Build an upgrade request from parts; NULL parts are left out. */
static bool upgrade_with(const char *method, const char *version, const char *upgrade,
                         const char *connection, const char *ws_version, const char *key)
{
    char req[1024];
    int n = snprintf(req, sizeof(req), "%s / %s\r\nHost: h\r\n", method, version);
    if (upgrade)
        n += snprintf(req + n, sizeof(req) - (size_t)n, "Upgrade: %s\r\n", upgrade);
    if (connection)
        n += snprintf(req + n, sizeof(req) - (size_t)n, "Connection: %s\r\n", connection);
    if (ws_version)
        n += snprintf(req + n, sizeof(req) - (size_t)n, "Sec-WebSocket-Version: %s\r\n", ws_version);
    if (key)
        n += snprintf(req + n, sizeof(req) - (size_t)n, "Sec-WebSocket-Key: %s\r\n", key);
    snprintf(req + n, sizeof(req) - (size_t)n, "\r\n");

    struct http_req *r = http_req_new();
    size_t used;
    bool up = false;
    if (http_req_feed(r, (const uint8_t *)req, strlen(req), &used) == 1)
        up = http_req_is_websocket_upgrade(r);
    else
        printf("# request did not parse: %s\n", req);
    http_req_free(r);
    return up;
}

static void test_upgrade_detection(void)
{
    const char *k = "dGhlIHNhbXBsZSBub25jZQ==";
    ok(upgrade_with("GET", "HTTP/1.1", "websocket", "Upgrade", "13", k), "baseline upgrade");
    ok(!upgrade_with("GET", "HTTP/1.1", "websocket", "Upgrade", "13", NULL), "missing key");
    ok(!upgrade_with("GET", "HTTP/1.1", "websocket", "Upgrade", "13", "dGhlIHNhbXBsZSBub25jZQ"),
       "key without padding");
    ok(!upgrade_with("GET", "HTTP/1.1", "websocket", "Upgrade", "13", "dGhlIHNhbXBsZSBub25j"),
       "key of 15 bytes");
    ok(!upgrade_with("GET", "HTTP/1.1", "websocket", "Upgrade", "13", "dGhlIHNhbXBsZSBub25!ZQ=="),
       "key with a non-base64 character");
    ok(!upgrade_with("GET", "HTTP/1.1", "websocket", "Upgrade", "12", k), "version 12");
    ok(!upgrade_with("GET", "HTTP/1.1", "websocket", "Upgrade", "8", k), "version 8 (routed to 426)");
    ok(!upgrade_with("GET", "HTTP/1.1", "websocket", "Upgrade", "013", k), "version 013");
    ok(upgrade_with("GET", "HTTP/1.1", "websocket", "Upgrade", "13  ", k), "version 13, trailing blanks");
    ok(!upgrade_with("GET", "HTTP/1.1", "websocket", "Upgrade", "13, 8", k), "version list");
    ok(!upgrade_with("GET", "HTTP/1.1", "websocket", "Upgrade", NULL, k), "missing version");
    ok(!upgrade_with("GET", "HTTP/1.1", "websocket", "keep-alive", "13", k), "Connection: keep-alive");
    ok(upgrade_with("GET", "HTTP/1.1", "websocket", "keep-alive, Upgrade", "13", k),
       "Connection: keep-alive, Upgrade");
    ok(!upgrade_with("GET", "HTTP/1.1", "websocket", "Upgraded", "13", k), "Connection: Upgraded");
    ok(!upgrade_with("GET", "HTTP/1.1", "websocket", NULL, "13", k), "missing Connection");
    ok(!upgrade_with("GET", "HTTP/1.1", NULL, "Upgrade", "13", k), "missing Upgrade");
    ok(!upgrade_with("GET", "HTTP/1.1", "h2c", "Upgrade", "13", k), "Upgrade: h2c");
    ok(upgrade_with("GET", "HTTP/1.1", "WebSocket", "UPGRADE", "13", k), "tokens case-insensitive");
    ok(!upgrade_with("POST", "HTTP/1.1", "websocket", "Upgrade", "13", k), "POST");
    ok(!upgrade_with("GET", "HTTP/1.0", "websocket", "Upgrade", "13", k), "HTTP/1.0");

    /* Header names case-insensitive, and Connection split over two lines. */
    struct http_req *r = parse_ok("GET / HTTP/1.1\r\n"
                                  "upgrade: websocket\r\n"
                                  "CONNECTION: keep-alive\r\n"
                                  "connection: upgrade\r\n"
                                  "sec-websocket-version: 13\r\n"
                                  "SEC-WEBSOCKET-KEY: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                                  "\r\n");
    ok(r && http_req_is_websocket_upgrade(r), "header names case-insensitive, Connection repeated");
    http_req_free(r);
}

/* A valid upgrade with one extra header line inserted before the blank line. */
static int feed_with_extra(const char *extra, size_t step)
{
    char req[1024];
    size_t base = strlen(UPGRADE_REQ) - 2;
    snprintf(req, sizeof req, "%.*s%s\r\n\r\n", (int)base, UPGRADE_REQ, extra);
    struct http_req *r = http_req_new();
    size_t total = 0;
    int ret = feed_chunked(r, req, strlen(req), step, &total);
    if (ret == 1 && !http_req_is_websocket_upgrade(r))
        ret = 2; /* parsed, but not an upgrade */
    http_req_free(r);
    return ret;
}

static void test_repeated_headers(void)
{
    /* Each header that may appear once, repeated with the same value, another
     * value, another case and an empty value: refused, in any chunking. */
    static const char *const extra[] = {
        "Authorization: Bearer tok",
        "Authorization: Bearer other",
        "authorization: Bearer tok",
        "AUTHORIZATION:",
        "Host: example.com:8080",
        "host: evil.example",
        "Upgrade: websocket",
        "upgrade: h2c",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "sec-websocket-key: AAAAAAAAAAAAAAAAAAAAAA==",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Version: 8",
    };
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        is_int(feed_with_extra(extra[i], 4096), -EBADMSG, "a second \"%s\" is refused", extra[i]);
        is_int(feed_with_extra(extra[i], 1), -EBADMSG, "... also byte by byte");
    }
    /* Content-Length twice (http-parser already refuses it; we list it too). */
    is_int(parse_err("GET / HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n", 56),
           -EBADMSG, "two Content-Length: 0 are refused");
    /* The first of two Authorization headers is the one a proxy may check:
     * neither order upgrades. */
    struct http_req *r = http_req_new();
    size_t used = 0;
    static const char two_auth[] = "GET / HTTP/1.1\r\n"
                                   "Authorization: Bearer right\r\n"
                                   "Upgrade: websocket\r\n"
                                   "Connection: Upgrade\r\n"
                                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                                   "Sec-WebSocket-Version: 13\r\n"
                                   "Authorization: Bearer wrong\r\n"
                                   "\r\n";
    is_int(feed_whole(r, two_auth, strlen(two_auth), &used), -EBADMSG, "two Authorization: refused");
    ok(!http_req_is_websocket_upgrade(r) && http_req_header(r, "Authorization") == NULL,
       "a refused request is not an upgrade and shows no header");
    http_req_free(r);

    /* Repeats that stay legal: a list header and headers we do not read. */
    is_int(feed_with_extra("Connection: keep-alive", 4096), 1, "Connection twice: joined");
    is_int(feed_with_extra("Sec-WebSocket-Extensions: x", 4096), 1, "Sec-WebSocket-Extensions (not read)");
    is_int(feed_with_extra("Origin: http://a", 4096), 1, "Origin once more than none");
    is_int(feed_with_extra("X-Custom: 1\r\nX-Custom: 2", 4096), 1, "unknown header twice");
    /* A lookalike is another header. */
    is_int(feed_with_extra("Authorization2: x", 4096), 1, "Authorization2 is not Authorization");
    /* More than HTTP_MAX_HEADERS still says so first, duplicates or not. */
    char big[8192];
    size_t n = (size_t)snprintf(big, sizeof big, "GET / HTTP/1.1\r\nAuthorization: a\r\n"
                                                 "Authorization: b\r\n");
    for (int i = 0; i < HTTP_MAX_HEADERS; i++)
        n += (size_t)snprintf(big + n, sizeof big - n, "X-%d: v\r\n", i);
    n += (size_t)snprintf(big + n, sizeof big - n, "\r\n");
    is_int(parse_err(big, n), -E2BIG, "too many headers with a repeat: still too many");
}

static void test_auth(void)
{
    const char *tok = "s3cret-token";
    size_t tl = strlen(tok);
    ok(http_auth_ok("Bearer s3cret-token", tok, tl), "correct token");
    ok(!http_auth_ok("Bearer wrong-tokenX", tok, tl), "wrong token of the same length");
    ok(!http_auth_ok("Bearer wrong", tok, tl), "wrong token");
    ok(!http_auth_ok(NULL, tok, tl), "missing header");
    ok(!http_auth_ok("", tok, tl), "empty header");
    ok(http_auth_ok(" \t Bearer s3cret-token\t  ", tok, tl), "surrounding spaces and tabs stripped");
    ok(!http_auth_ok("bearer s3cret-token", tok, tl), "lowercase scheme fails");
    ok(!http_auth_ok("Bearer  s3cret-token", tok, tl), "two spaces fail");
    ok(!http_auth_ok("Bearer\ts3cret-token", tok, tl), "tab instead of space fails");
    ok(!http_auth_ok("Bearer s3cret", tok, tl), "token prefix fails");
    ok(!http_auth_ok("Bearer s3cret-token2", tok, tl), "token with a suffix fails");
    ok(!http_auth_ok("Bearer s3cret-tokem", tok, tl), "last character differs");
    ok(!http_auth_ok("Basic s3cret-token", tok, tl), "other scheme fails");
    ok(!http_auth_ok("s3cret-token", tok, tl), "bare token fails");
    ok(!http_auth_ok("Bearer", tok, tl), "scheme only fails");
    /* Spec 1.2 quirk: a set but empty token matches nothing. */
    ok(!http_auth_ok("Bearer ", "", 0), "empty token: \"Bearer \" fails");
    ok(!http_auth_ok("Bearer", "", 0), "empty token: \"Bearer\" fails");
    ok(!http_auth_ok(NULL, "", 0), "empty token: missing header fails");
    /* The token is length-delimited, not NUL-delimited. */
    ok(http_auth_ok("Bearer abc", "abcdef", 3), "token_len honoured");
}

static void test_accept(void)
{
    char out[29];
    memset(out, 'x', sizeof(out));
    is_int(http_ws_accept("dGhlIHNhbXBsZSBub25jZQ==", out), 0, "accept computed");
    /* RFC 6455 1.3; also base64(sha1(key + GUID)) computed by Python. */
    is_str(out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", "RFC 6455 example accept value");
    is_int(http_ws_accept(NULL, out), -EINVAL, "NULL key: -EINVAL");
    is_int(http_ws_accept("", out), -EINVAL, "empty key: -EINVAL");
}

static void expect_bytes(const struct buf *b, const char *want, const char *what)
{
    size_t wl = strlen(want);
    bool same = b->len == wl && memcmp(b->data, want, wl) == 0;
    ok(same, "%s: bytes exact", what);
    if (!same)
        printf("#   got %zu bytes: %.*s\n", b->len, (int)b->len, b->data ? (char *)b->data : "");
}

static void test_responses(void)
{
    const time_t t = 784111777; /* RFC 7231's example date */
    char date[30];
    is_int(http_format_date(t, date), 0, "date formatted");
    is_str(date, "Sun, 06 Nov 1994 08:49:37 GMT", "IMF-fixdate");

    struct buf b;
    buf_init(&b, 4096);
    is_int(http_write_response_at(&b, 200, "OK", "OK\n", t), 0, "200 written");
    expect_bytes(&b,
                 "HTTP/1.1 200 OK\r\n"
                 "Content-Type: text/plain; charset=utf-8\r\n"
                 "Content-Length: 3\r\n"
                 "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
                 "Server: forkbox\r\n"
                 "Connection: close\r\n"
                 "\r\n"
                 "OK\n",
                 "200 OK");
    buf_reset(&b);
    is_int(http_write_response_at(&b, 401, "Unauthorized", "Unauthorized\n", t), 0, "401 written");
    expect_bytes(&b,
                 "HTTP/1.1 401 Unauthorized\r\n"
                 "Content-Type: text/plain; charset=utf-8\r\n"
                 "Content-Length: 13\r\n"
                 "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
                 "Server: forkbox\r\n"
                 "Connection: close\r\n"
                 "\r\n"
                 "Unauthorized\n",
                 "401");
    buf_reset(&b);
    is_int(http_write_response_at(&b, 503, "Service Unavailable", "Busy\n", t), 0, "503 written");
    expect_bytes(&b,
                 "HTTP/1.1 503 Service Unavailable\r\n"
                 "Content-Type: text/plain; charset=utf-8\r\n"
                 "Content-Length: 5\r\n"
                 "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
                 "Server: forkbox\r\n"
                 "Retry-After: 1\r\n"
                 "Connection: close\r\n"
                 "\r\n"
                 "Busy\n",
                 "503");
    /* A tenant over its share (session/admission.c) is told the same. */
    buf_reset(&b);
    is_int(http_write_response_at(&b, 429, "Too Many Requests", "Tenant busy\n", t), 0,
           "429 written");
    expect_bytes(&b,
                 "HTTP/1.1 429 Too Many Requests\r\n"
                 "Content-Type: text/plain; charset=utf-8\r\n"
                 "Content-Length: 12\r\n"
                 "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
                 "Server: forkbox\r\n"
                 "Retry-After: 1\r\n"
                 "Connection: close\r\n"
                 "\r\n"
                 "Tenant busy\n",
                 "429");

    /* A 426 says what to upgrade to (RFC 7231 6.5.15, RFC 6455 4.4). */
    buf_reset(&b);
    is_int(http_write_response_at(&b, 426, "Upgrade Required", "Upgrade Required\n", t), 0,
           "426 written");
    expect_bytes(&b,
                 "HTTP/1.1 426 Upgrade Required\r\n"
                 "Content-Type: text/plain; charset=utf-8\r\n"
                 "Content-Length: 17\r\n"
                 "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
                 "Server: forkbox\r\n"
                 "Upgrade: websocket\r\n"
                 "Sec-WebSocket-Version: 13\r\n"
                 "Connection: close\r\n"
                 "\r\n"
                 "Upgrade Required\n",
                 "426");

    /* The wall-clock variant: same shape, a 29-character date, body last. */
    buf_reset(&b);
    is_int(http_write_response(&b, 200, "OK", "OK\n"), 0, "200 with the current date");
    const char *s = (const char *)b.data;
    const char *d = b.data ? memmem(s, b.len, "\r\nDate: ", 8) : NULL;
    ok(d && memcmp(d + 8 + 29, "\r\n", 2) == 0 && memcmp(d + 8 + 25, " GMT", 4) == 0,
       "Date line is an IMF-fixdate");
    ok(b.len > 3 && memcmp(s + b.len - 7, "\r\n\r\nOK\n", 7) == 0, "body follows the blank line");

    buf_reset(&b);
    is_int(http_write_upgrade(&b, "dGhlIHNhbXBsZSBub25jZQ=="), 0, "101 written");
    expect_bytes(&b,
                 "HTTP/1.1 101 Switching Protocols\r\n"
                 "Upgrade: websocket\r\n"
                 "Connection: Upgrade\r\n"
                 "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"
                 "\r\n",
                 "101");
    buf_reset(&b);
    ok(http_write_upgrade(&b, NULL) < 0 && b.len == 0, "101 without a key fails, writes nothing");

    /* A full buffer fails instead of truncating silently. */
    struct buf small;
    buf_init(&small, 16);
    ok(http_write_response_at(&small, 200, "OK", "OK\n", t) < 0, "response into a tiny buffer fails");
    buf_free(&small);
    buf_free(&b);
}

int main(void)
{
    test_whole_and_leftover();
    test_byte_by_byte();
    test_line_endings_and_values();
    test_limits();
    test_malformed();
    test_bodies();
    test_upgrade_detection();
    test_repeated_headers();
    test_auth();
    test_accept();
    test_responses();
    return tap_done();
}
