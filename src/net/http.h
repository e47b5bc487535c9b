/* The HTTP/1.1 request in front of the WebSocket upgrade (spec 1.1, 1.2).
 *
 * Parsing uses Debian's http-parser (nodejs/http-parser) with hard ceilings
 * on total request bytes and header count. No I/O: bytes are fed in any
 * chunking; the caller owns the socket. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "core/buf.h"

struct http_req; /* opaque */

struct http_req *http_req_new(void);
void http_req_free(struct http_req *r);

/* Feed bytes. Returns 1 when the request (line + headers, through the blank
 * line) is complete and *consumed says how much of p was used (the rest
 * belongs to the WebSocket stream); 0 if more bytes are needed; or
 *   -E2BIG   more than HTTP_MAX_REQUEST_BYTES, or more than HTTP_MAX_HEADERS
 *   -EBADMSG not HTTP/1.x, or malformed
 * Requests with a body (Content-Length > 0 or chunked) are -EBADMSG, and so
 * are requests with two Authorization, Host, Upgrade, Sec-WebSocket-Key,
 * Sec-WebSocket-Version or Content-Length headers, whatever their values
 * (http.c says why).
 * Once it has returned 1 or an error it keeps returning that (consumed 0). */
int http_req_feed(struct http_req *r, const uint8_t *p, size_t n, size_t *consumed);

/* Accessors, valid once feed returned 1. Strings are NUL-terminated,
 * borrowed, header names matched case-insensitively; another repeated header
 * keeps the last value, except Connection, whose values are joined with ",". */
const char *http_req_method(const struct http_req *r);
const char *http_req_target(const struct http_req *r); /* raw, with query */
const char *http_req_header(const struct http_req *r, const char *name); /* NULL if absent */

/* The upgrade checks of RFC 6455 4.2.1: GET, HTTP/1.1, Upgrade: websocket,
 * Connection has the token "upgrade", Sec-WebSocket-Version: 13, and a
 * Sec-WebSocket-Key that is base64 of 16 bytes. */
bool http_req_is_websocket_upgrade(const struct http_req *r);

/* Spec 1.2: value ("" if NULL) stripped of surrounding whitespace, compared in
 * constant time to "Bearer " + token. */
bool http_auth_ok(const char *authorization, const char *token, size_t token_len);

/* Sec-WebSocket-Accept for a key: base64(SHA-1(key + GUID)), via nettle.
 * out gets 28 characters and a NUL. 0 or -EINVAL. */
int http_ws_accept(const char *key, char out[29]);

/* Append a complete non-101 response: status line, Content-Type: text/plain;
 * charset=utf-8, Content-Length, Date, Server: forkbox, (for 426 only:
 * Upgrade: websocket, Sec-WebSocket-Version: 13; for 503 and 429 only:
 * Retry-After: 1,) Connection: close, blank
 * line, body (byte exact). */
int http_write_response(struct buf *out, int status, const char *reason, const char *body);
/* The same with another Content-Type and a body of body_len bytes (the
 * metrics listener's text/plain; version=0.0.4). */
int http_write_response_typed(struct buf *out, int status, const char *reason,
                              const char *content_type, const void *body, size_t body_len);
/* The same with a given clock (tests need byte-exact output). */
int http_write_response_at(struct buf *out, int status, const char *reason, const char *body,
                           time_t now);
/* RFC 7231 IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT"), always English.
 * out gets 29 characters and a NUL. 0 or -EINVAL (year outside 0..9999). */
int http_format_date(time_t t, char out[30]);

/* Append the 101 Switching Protocols response for the given client key. */
int http_write_upgrade(struct buf *out, const char *ws_key);
