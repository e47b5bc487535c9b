/* The HTTP/1.1 request in front of the WebSocket upgrade (see http.h).
 *
 * http-parser does the tokenising; this file only collects what its callbacks
 * hand over and enforces our ceilings. Everything lands in one fixed arena
 * inside struct http_req, so a hostile request can make a feed fail but never
 * make us allocate more than the struct itself. */
#include "net/http.h"

#include <errno.h>
#include <http_parser.h>
#include <nettle/base64.h>
#include <nettle/sha1.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "core/limits.h"
#include "core/util.h"

/* Room for every request byte, a NUL after each piece, and the joined
 * Connection value (which copies at most the request's bytes again). */
#define HTTP_ARENA_BYTES (2 * HTTP_MAX_REQUEST_BYTES + 2 * HTTP_MAX_HEADERS + 64)

/* RFC 6455 1.3: the GUID appended to the key before hashing. */
static const char ws_guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

struct http_hdr {
    size_t name;  /* arena offset of the NUL-terminated name */
    size_t value; /* arena offset of the NUL-terminated value */
};

enum http_last_cb { LAST_NONE, LAST_FIELD, LAST_VALUE };

struct http_req {
    http_parser parser;
    size_t fed;              /* request bytes given to the parser so far */
    int result;              /* 0 parsing, 1 complete, or a negative errno */
    int cb_error;            /* why a callback stopped the parser */
    enum http_last_cb last;  /* the previous data callback, to split headers */
    size_t url;              /* arena offset of the target */
    bool url_open;           /* the target is still being appended */
    size_t nhdrs;
    struct http_hdr hdrs[HTTP_MAX_HEADERS];
    bool skipping;           /* the current header is past HTTP_MAX_HEADERS: not kept */
    bool too_many;           /* some header was */
    size_t connection;       /* arena offset of the joined Connection value, or SIZE_MAX */
    size_t arena_len;
    char arena[HTTP_ARENA_BYTES];
};

struct http_req *http_req_new(void)
{
    struct http_req *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    http_parser_init(&r->parser, HTTP_REQUEST);
    r->parser.data = r;
    r->connection = SIZE_MAX;
    return r;
}

void http_req_free(struct http_req *r)
{
    free(r);
}

/* Append bytes to the arena. The arena is sized from the request ceiling, so
 * running out means the accounting is wrong; fail the request rather than
 * trust it. */
static int arena_put(struct http_req *r, const char *p, size_t n)
{
    if (n > sizeof(r->arena) - r->arena_len) {
        r->cb_error = -E2BIG;
        return -1;
    }
    memcpy(r->arena + r->arena_len, p, n);
    r->arena_len += n;
    return 0;
}

static int arena_end_string(struct http_req *r)
{
    return arena_put(r, "", 1);
}

static int on_url(http_parser *p, const char *at, size_t n)
{
    struct http_req *r = p->data;
    if (!r->url_open) {
        r->url = r->arena_len;
        r->url_open = true;
    }
    return arena_put(r, at, n);
}

/* Headers past HTTP_MAX_HEADERS are counted but not kept, and the request
 * is refused only once the header block is complete (on_headers_complete).
 * http-parser reports a partial field or value at the end of every chunk, so
 * refusing at the callback would let the place where a chunk ends decide
 * between "too many headers" (431) and "malformed" (400) for a request that
 * is both (found by fuzz/fuzz-http.c). */
static int on_header_field(http_parser *p, const char *at, size_t n)
{
    struct http_req *r = p->data;

    if (r->last != LAST_FIELD) {
        /* A new header starts: close whatever was open before it. */
        if (r->url_open) {
            r->url_open = false;
            if (arena_end_string(r) < 0)
                return -1;
        }
        if (r->last == LAST_VALUE && !r->skipping && arena_end_string(r) < 0)
            return -1;
        r->last = LAST_FIELD;
        r->skipping = r->nhdrs == HTTP_MAX_HEADERS;
        if (r->skipping) {
            r->too_many = true;
            return 0;
        }
        r->hdrs[r->nhdrs].name = r->arena_len;
        r->hdrs[r->nhdrs].value = SIZE_MAX;
        r->nhdrs++;
    }
    return r->skipping ? 0 : arena_put(r, at, n);
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    struct http_req *r = p->data;

    if (r->last != LAST_VALUE) {
        if (r->last != LAST_FIELD) { /* cannot happen with http-parser */
            r->cb_error = -EBADMSG;
            return -1;
        }
        r->last = LAST_VALUE;
        if (r->skipping)
            return 0;
        if (arena_end_string(r) < 0)
            return -1;
        r->hdrs[r->nhdrs - 1].value = r->arena_len;
    }
    return r->skipping ? 0 : arena_put(r, at, n);
}

static bool is_ows(char c)
{
    return c == ' ' || c == '\t';
}

/* RFC 7230 3.2.6 tchar. */
static bool is_tchar(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* http-parser, built without HTTP_PARSER_STRICT, lets a space into a header
 * name ("Bad Name: x"); RFC 7230 3.2.4 says to reject such a request. */
static bool is_token(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++) {
        if (!is_tchar((unsigned char)*s))
            return false;
    }
    return true;
}

/* Trim trailing OWS in place (http-parser already skips the leading OWS but
 * keeps trailing blanks, which RFC 7230 3.2.4 excludes from the value). */
static void trim_trailing_ows(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && is_ows(s[n - 1]))
        s[--n] = '\0';
}

/* Join every Connection value with "," so one lookup sees all its tokens
 * (RFC 7230 3.2.2 makes repeats equivalent to one comma-separated list). */
static int join_connection(struct http_req *r)
{
    bool first = true;

    for (size_t i = 0; i < r->nhdrs; i++) {
        if (strcasecmp(r->arena + r->hdrs[i].name, "connection") != 0)
            continue;
        if (first)
            r->connection = r->arena_len;
        else if (arena_put(r, ",", 1) < 0)
            return -1;
        first = false;
        const char *v = r->arena + r->hdrs[i].value;
        if (arena_put(r, v, strlen(v)) < 0)
            return -1;
    }
    if (!first && arena_end_string(r) < 0)
        return -1;
    return 0;
}

/* Headers a request may carry once. A second one is refused, whatever the
 * two values: which of them counts would otherwise be up to each reader,
 * and a proxy in front that checks the first while we take the last is how
 * a request gets past one of us (request smuggling, auth confusion).
 *   Authorization          one credential (RFC 7235 has no list form)
 *   Host                   RFC 7230 5.4: more than one is a 400
 *   Upgrade                a list by RFC 7230, but a WebSocket client sends one, and the
 *                          reference (python websockets) refuses anything but one token
 *   Sec-WebSocket-Key      RFC 6455 11.3.1: MUST NOT appear more than once
 *   Sec-WebSocket-Version  RFC 6455 11.3.5: likewise, in a request
 *   Content-Length         http-parser refuses a second one already; listed to say so
 * Connection stays a list (joined below): repeating it is harmless, its
 * tokens only add up. Other repeats keep the last value. */
static const char *const http_single_headers[] = {
    "Authorization", "Host", "Upgrade", "Sec-WebSocket-Key", "Sec-WebSocket-Version",
    "Content-Length",
};

static bool has_repeated_single_header(const struct http_req *r)
{
    for (size_t k = 0; k < sizeof http_single_headers / sizeof http_single_headers[0]; k++) {
        unsigned seen = 0;
        for (size_t i = 0; i < r->nhdrs; i++)
            seen += strcasecmp(r->arena + r->hdrs[i].name, http_single_headers[k]) == 0;
        if (seen > 1)
            return true;
    }
    return false;
}

static int on_headers_complete(http_parser *p)
{
    struct http_req *r = p->data;

    /* Close the last open string: the target when there are no headers, or
     * the last value (a header may have had an empty value and so no value
     * callback at all). */
    if (r->url_open) {
        r->url_open = false;
        if (arena_end_string(r) < 0)
            return -1;
    }
    if (r->too_many) {
        r->cb_error = -E2BIG;
        return -1;
    }
    if (r->last != LAST_NONE && arena_end_string(r) < 0)
        return -1;
    if (r->nhdrs > 0 && r->hdrs[r->nhdrs - 1].value == SIZE_MAX) {
        r->hdrs[r->nhdrs - 1].value = r->arena_len - 1; /* "" : the NUL just written */
    }
    for (size_t i = 0; i < r->nhdrs; i++) {
        if (!is_token(r->arena + r->hdrs[i].name)) {
            r->cb_error = -EBADMSG;
            return -1;
        }
        trim_trailing_ows(r->arena + r->hdrs[i].value);
    }
    if (has_repeated_single_header(r)) {
        r->cb_error = -EBADMSG;
        return -1;
    }

    if (p->http_major != 1) {
        r->cb_error = -EBADMSG;
        return -1;
    }
    /* The front door takes no bodies: a request with one is not an upgrade
     * and not a health check, and reading it would only cost us memory. */
    if ((p->flags & F_CHUNKED) || p->uses_transfer_encoding ||
        ((p->flags & F_CONTENTLENGTH) && p->content_length > 0)) {
        r->cb_error = -EBADMSG;
        return -1;
    }
    if (join_connection(r) < 0)
        return -1;

    /* Stop here: whatever follows the blank line is WebSocket data (or
     * garbage we never look at), not a second request. */
    r->result = 1;
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings http_settings = {
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
};

int http_req_feed(struct http_req *r, const uint8_t *p, size_t n, size_t *consumed)
{
    *consumed = 0;
    if (r->result != 0)
        return r->result == 1 ? 1 : r->result;

    /* Never let the parser see more than the request ceiling: bytes past it
     * are either WebSocket data that follows a complete request or proof
     * that the request is too big. */
    size_t room = HTTP_MAX_REQUEST_BYTES - r->fed;
    size_t len = n < room ? n : room;
    if (len == 0) {
        if (n == 0)
            return 0;
        return r->result = -E2BIG;
    }

    size_t used = http_parser_execute(&r->parser, &http_settings, (const char *)p, len);
    enum http_errno err = HTTP_PARSER_ERRNO(&r->parser);

    if (err == HPE_PAUSED && r->result == 1) {
        /* http-parser stops on the final LF of the header block without
         * counting it (s_headers_almost_done returns p - data), so the
         * request ends one byte further. Check instead of trusting that. */
        if (used >= len || p[used] != '\n')
            return r->result = -EBADMSG;
        *consumed = used + 1;
        r->fed += used + 1;
        return 1;
    }
    if (err != HPE_OK) {
        if (r->cb_error != 0)
            return r->result = r->cb_error;
        return r->result = -EBADMSG;
    }
    r->fed += used;
    *consumed = used;
    if (r->fed >= HTTP_MAX_REQUEST_BYTES)
        return r->result = -E2BIG;
    return 0;
}

const char *http_req_method(const struct http_req *r)
{
    if (r->result != 1)
        return NULL;
    return http_method_str((enum http_method)r->parser.method);
}

const char *http_req_target(const struct http_req *r)
{
    if (r->result != 1)
        return NULL;
    return r->arena + r->url;
}

const char *http_req_header(const struct http_req *r, const char *name)
{
    if (r->result != 1)
        return NULL;
    if (strcasecmp(name, "connection") == 0)
        return r->connection == SIZE_MAX ? NULL : r->arena + r->connection;
    /* Last one wins, like the reference's header mapping. */
    for (size_t i = r->nhdrs; i-- > 0;) {
        if (strcasecmp(r->arena + r->hdrs[i].name, name) == 0)
            return r->arena + r->hdrs[i].value;
    }
    return NULL;
}

/* True if the comma-separated list has token tok (ASCII case-insensitive,
 * OWS around elements ignored, empty elements skipped: RFC 7230 7). */
static bool list_has_token(const char *list, const char *tok)
{
    size_t toklen = strlen(tok);
    const char *s = list;

    while (*s) {
        while (*s == ',' || is_ows(*s))
            s++;
        const char *start = s;
        while (*s && *s != ',')
            s++;
        const char *end = s;
        while (end > start && is_ows(end[-1]))
            end--;
        if ((size_t)(end - start) == toklen && strncasecmp(start, tok, toklen) == 0)
            return true;
    }
    return false;
}

static bool is_b64_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '+' || c == '/';
}

/* base64 of exactly 16 bytes: 22 alphabet characters then "==". The unused
 * low bits of the 22nd character are not checked, as Python's b64decode (the
 * reference) does not check them either. */
static bool ws_key_valid(const char *key)
{
    if (strlen(key) != 24 || key[22] != '=' || key[23] != '=')
        return false;
    for (int i = 0; i < 22; i++) {
        if (!is_b64_char(key[i]))
            return false;
    }
    return true;
}

bool http_req_is_websocket_upgrade(const struct http_req *r)
{
    if (r->result != 1)
        return false;
    if (r->parser.method != HTTP_GET)
        return false;
    if (r->parser.http_major != 1 || r->parser.http_minor < 1)
        return false;

    const char *upgrade = http_req_header(r, "Upgrade");
    const char *connection = http_req_header(r, "Connection");
    const char *version = http_req_header(r, "Sec-WebSocket-Version");
    const char *key = http_req_header(r, "Sec-WebSocket-Key");

    return upgrade && list_has_token(upgrade, "websocket") && connection &&
           list_has_token(connection, "upgrade") && version && strcmp(version, "13") == 0 &&
           key && ws_key_valid(key);
}

/* Python's str.strip() for the bytes a header value can hold (http-parser
 * rejects other control characters in values). */
static bool is_strip_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

bool http_auth_ok(const char *authorization, const char *token, size_t token_len)
{
    static const char scheme[] = "Bearer ";
    const size_t scheme_len = sizeof(scheme) - 1;
    const char *v = authorization ? authorization : "";
    size_t n = strlen(v);

    while (n > 0 && is_strip_space(v[0])) {
        v++;
        n--;
    }
    while (n > 0 && is_strip_space(v[n - 1]))
        n--;
    if (!token)
        token = "";

    /* Compare "Bearer " and the token separately so nothing is allocated;
     * both comparisons always run and are combined without a branch, so the
     * time depends only on the lengths, as ct_equal promises. */
    size_t head = n < scheme_len ? n : scheme_len;
    bool scheme_ok = ct_equal(v, head, scheme, scheme_len);
    bool token_ok = ct_equal(v + head, n - head, token, token_len);
    return scheme_ok & token_ok;
}

int http_ws_accept(const char *key, char out[29])
{
    if (!key)
        return -EINVAL;
    size_t klen = strlen(key);
    /* Real keys are 24 characters; anything long is not a key. */
    if (klen == 0 || klen + sizeof(ws_guid) > 128)
        return -EINVAL;
    struct sha1_ctx ctx;
    uint8_t md[SHA1_DIGEST_SIZE];
    sha1_init(&ctx);
    sha1_update(&ctx, klen, (const uint8_t *)key);
    sha1_update(&ctx, sizeof(ws_guid) - 1, (const uint8_t *)ws_guid);
    sha1_digest(&ctx, sizeof md, md);
    /* 20 bytes encode to 28 characters. */
    base64_encode_raw(out, sizeof md, md);
    out[BASE64_ENCODE_RAW_LENGTH(SHA1_DIGEST_SIZE)] = '\0';
    return 0;
}

int http_format_date(time_t t, char out[30])
{
    /* Fixed English names: strftime's %a and %b follow the locale. */
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    struct tm tm;

    if (!gmtime_r(&t, &tm) || tm.tm_year + 1900 > 9999 || tm.tm_year + 1900 < 0)
        return -EINVAL;
    snprintf(out, 30, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday], tm.tm_mday,
             months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
    return 0;
}

static int write_response(struct buf *out, int status, const char *reason,
                          const char *content_type, const void *body, size_t body_len, time_t now)
{
    char date[30];
    int ret;

    ret = http_format_date(now, date);
    if (ret < 0)
        return ret;
    /* A 426 names what to upgrade to: RFC 7231 6.5.15 (Upgrade) and RFC
     * 6455 4.2.2 / 4.4 (the versions we speak). Connection stays "close"
     * alone, as spec 1.1 and the reference (python websockets) have it:
     * the socket is closed after the response whatever a proxy does. */
    /* A 503 (at capacity, draining, /ready not ready) and a 429 (a tenant
     * at its share) say when to ask again (RFC 9110 10.2.3, RFC 6585 4):
     * the host retries them anyway (spec 7.1), a load balancer or a plain
     * client learns to. */
    const char *upgrade = status == 426                   ? "Upgrade: websocket\r\n"
                                                            "Sec-WebSocket-Version: 13\r\n"
                          : status == 503 || status == 429 ? "Retry-After: 1\r\n"
                                                           : "";
    ret = buf_printf(out,
                     "HTTP/1.1 %d %s\r\n"
                     "Content-Type: %s\r\n"
                     "Content-Length: %zu\r\n"
                     "Date: %s\r\n"
                     "Server: forkbox\r\n"
                     "%s"
                     "Connection: close\r\n"
                     "\r\n",
                     status, reason, content_type, body_len, date, upgrade);
    if (ret < 0)
        return ret;
    return buf_append(out, body, body_len);
}

int http_write_response_at(struct buf *out, int status, const char *reason, const char *body,
                           time_t now)
{
    return write_response(out, status, reason, "text/plain; charset=utf-8", body,
                          body ? strlen(body) : 0, now);
}

int http_write_response_typed(struct buf *out, int status, const char *reason,
                              const char *content_type, const void *body, size_t body_len)
{
    return write_response(out, status, reason, content_type, body, body_len, time(NULL));
}

int http_write_response(struct buf *out, int status, const char *reason, const char *body)
{
    return http_write_response_at(out, status, reason, body, time(NULL));
}

int http_write_upgrade(struct buf *out, const char *ws_key)
{
    char accept[29];
    int ret = http_ws_accept(ws_key, accept);
    if (ret < 0)
        return ret;
    /* No Sec-WebSocket-Extensions: that declines permessage-deflate (spec
     * 1.4). No Sec-WebSocket-Protocol: there is no subprotocol (spec 1.1). */
    return buf_printf(out,
                      "HTTP/1.1 101 Switching Protocols\r\n"
                      "Upgrade: websocket\r\n"
                      "Connection: Upgrade\r\n"
                      "Sec-WebSocket-Accept: %s\r\n"
                      "\r\n",
                      accept);
}
