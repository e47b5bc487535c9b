/* The HTTP request parser in front of the WebSocket upgrade (net/http.h),
 * fed in arbitrary chunkings, followed by what the session does with a
 * complete request (route, auth check, upgrade checks, 101 response).
 *
 * Input: byte 0 seeds the chunking (see fuzz.h), the rest is the stream.
 *
 * Properties:
 *   - every feed returns 1, 0 or a documented error, and consumed <= fed;
 *     a feed returning 0 consumed everything it was given (the session
 *     drops what was not consumed), and once the request is complete or
 *     failed every later feed returns the same and consumes nothing;
 *   - the parser never reads past its limit: in every chunk, the bytes past
 *     HTTP_MAX_REQUEST_BYTES - (bytes consumed so far) are poisoned for ASan
 *     while it runs, and the total consumed is <= HTTP_MAX_REQUEST_BYTES;
 *   - chunking does not matter: the stream fed in one piece gives the same
 *     result, and a complete request ends at the same byte; in that second
 *     run everything after the request is poisoned, so the parser is also
 *     caught reading one byte past the blank line;
 *   - a complete request has a method, a target and NUL-terminated header
 *     values, and the routing, auth, accept-key and 101 helpers the session
 *     calls on it run without fault.
 */
#include <errno.h>
#include <string.h>

#include "core/buf.h"
#include "core/limits.h"
#include "fuzz.h"
#include "net/http.h"

static const char token[] = "s3cret-token";

static void use_request(const struct http_req *r)
{
    const char *method = http_req_method(r), *target = http_req_target(r);
    static const char *const names[] = {
        "Host",    "Upgrade",       "Connection", "Sec-WebSocket-Key", "Sec-WebSocket-Version",
        "Authorization", "Content-Length", "Transfer-Encoding", "X-Unknown",
    };

    FUZZ_ASSERT(method && target, "complete request without method or target");
    FUZZ_ASSERT(strlen(target) <= HTTP_MAX_REQUEST_BYTES, "target longer than the request");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = http_req_header(r, names[i]);
        if (v)
            FUZZ_ASSERT(strlen(v) <= 2 * HTTP_MAX_REQUEST_BYTES, "header value too long");
    }
    (void)http_auth_ok(http_req_header(r, "Authorization"), token, sizeof token - 1);

    const char *key = http_req_header(r, "Sec-WebSocket-Key");
    char accept[29];
    if (key) {
        int rc = http_ws_accept(key, accept);
        FUZZ_ASSERT(rc == 0 || rc == -EINVAL, "http_ws_accept: %d", rc);
        if (rc == 0)
            FUZZ_ASSERT(strlen(accept) == 28, "accept is not 28 characters");
    }
    if (http_req_is_websocket_upgrade(r)) {
        struct buf out;
        FUZZ_ASSERT(key != NULL, "an upgrade without a key");
        buf_init(&out, 4096);
        FUZZ_ASSERT(http_write_upgrade(&out, key) == 0, "http_write_upgrade failed");
        FUZZ_ASSERT(out.len > 4 && memcmp(out.data + out.len - 4, "\r\n\r\n", 4) == 0,
                    "101 response does not end with a blank line");
        buf_free(&out);
    }
}

/* Feed stream[0..size) in the chunking seeded by seed; bytes at or past
 * `fence` (an offset in the stream) are poisoned while the parser runs.
 * Returns the final result; *total gets the bytes consumed. */
static int run(const uint8_t *stream, size_t size, uint8_t seed, size_t fence, size_t *total)
{
    struct fuzz_chunker ch;
    struct http_req *r = http_req_new();
    size_t off = 0;
    int result = 0;

    FUZZ_ASSERT(r != NULL, "http_req_new");
    fuzz_chunker_init(&ch, seed);
    *total = 0;
    while (off < size) {
        size_t n = fuzz_chunker_next(&ch, size - off), used = 12345;
        /* An exact-size copy per chunk, so ASan sees reads past the chunk. */
        uint8_t *chunk = malloc(n);
        FUZZ_ASSERT(chunk != NULL, "malloc");
        memcpy(chunk, stream + off, n);

        /* Bytes past the request ceiling (or the fence) are not for the
         * parser. */
        size_t room = HTTP_MAX_REQUEST_BYTES - *total;
        if (fence > off && fence - off < room)
            room = fence - off;
        else if (fence <= off)
            room = 0;
        if (result == 0 && n > room)
            FUZZ_POISON(chunk + room, n - room);
        int rc = http_req_feed(r, chunk, n, &used);
        FUZZ_UNPOISON(chunk, n);
        free(chunk);

        FUZZ_ASSERT(used <= n, "consumed %zu of %zu", used, n);
        if (result != 0) {
            /* Sticky: the same answer, nothing consumed. */
            FUZZ_ASSERT(rc == result && used == 0, "feed after %d gave %d (consumed %zu)", result,
                        rc, used);
            off += n;
            continue;
        }
        FUZZ_ASSERT(rc == 1 || rc == 0 || rc == -E2BIG || rc == -EBADMSG, "feed: %d", rc);
        if (rc == 0)
            FUZZ_ASSERT(used == n, "feed returned 0 but consumed %zu of %zu", used, n);
        *total += used;
        FUZZ_ASSERT(*total <= HTTP_MAX_REQUEST_BYTES, "consumed %zu in total", *total);
        if (rc == 1)
            use_request(r);
        else if (rc < 0)
            FUZZ_ASSERT(http_req_method(r) == NULL && http_req_target(r) == NULL &&
                            http_req_header(r, "Host") == NULL,
                        "accessors answer on a failed request");
        result = rc;
        off += n;
    }
    /* An empty feed changes nothing. */
    size_t used = 1;
    int rc = http_req_feed(r, stream, 0, &used);
    FUZZ_ASSERT(used == 0 && rc == result, "empty feed gave %d after %d", rc, result);
    http_req_free(r);
    return result;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t total, total1;
    int result, result1;

    if (size < 1)
        return 0;
    result = run(data + 1, size - 1, data[0], SIZE_MAX, &total);
    if (data[0] == 0)
        return 0;
    /* The same stream in one piece gives the same answer, and a complete
     * request ends at the same byte. With the request's length known, every
     * byte after it is poisoned: the parser must not look past the blank
     * line that ends the request. */
    result1 = run(data + 1, size - 1, 0, result == 1 ? total : SIZE_MAX, &total1);
    FUZZ_ASSERT(result == result1, "chunked feed gave %d, one feed gave %d", result, result1);
    if (result == 1)
        FUZZ_ASSERT(total == total1, "request ends at %zu chunked, at %zu in one feed", total,
                    total1);
    return 0;
}
