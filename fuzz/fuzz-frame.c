/* The JSON frame codec (proto/frame.h) on bytes from either peer, and the
 * channel envelope header (proto/chan.h) the supervisor reads from a sandbox.
 *
 * Properties, for every input and both peers:
 *   - frame_decode() returns 0 or one of its documented errors, and leaves
 *     *out untouched on failure;
 *   - it agrees with the decoder forkbox had before the incremental scanner
 *     (oracle-frame.c: a strict lexer plus cJSON) on the verdict, and on the
 *     kind, every field's text and exit_code of what both accept;
 *   - fed in pieces (frame_scan_*, chunked by the input's first byte as in
 *     fuzz.h), the scanner gives exactly the same result; streamed (each
 *     piece a buffer of its own, freed once fed, chunked by the second
 *     byte: frame_scan_feed_at, frame_scan_end), the same verdict, kind,
 *     exit code, canonical flag and string lengths;
 *   - a frame flagged canonical encodes to exactly the input's bytes;
 *   - for every frame it accepts, decode(encode(f)) == f (same kind, every
 *     field's JSON text byte-identical, same exit_code) from the same peer,
 *     and the encoding is a fixed point: encode(decode(encode(f))) ==
 *     encode(f), ending in exactly one '\n';
 *   - a string set with frame_set_stringn() (any valid UTF-8, NULs included)
 *     survives encode -> decode as the child would send it;
 *   - chan_hdr_decode() accepts exactly what chan_hdr_encode() produces;
 *   - frame_log_write() with the input as the message (up to its first NUL),
 *     in any room: fits the room, and is a canonical log frame from a child
 *     (valid UTF-8 whatever the bytes) whose msg is a prefix of the input
 *     with bytes >= 0x80 as '?' -- all of it when the room is FRAME_LOG_MAX
 *     and the input's escape fits. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <string.h>

#include "core/buf.h"
#include "core/utf8.h"
#include "fuzz.h"
#include "oracle-frame.h"
#include "proto/chan.h"
#include "proto/frame.h"

/* Frames are at most as long as the input plus defaults; the ceiling only
 * keeps a bug from eating memory. */
#define ENCODE_MAX (64u * 1024 * 1024)

static bool frame_eq(const struct frame *a, const struct frame *b)
{
    size_t n;

    if (a->kind != b->kind || a->exit_code != b->exit_code)
        return false;
    frame_field_names(a->kind, &n);
    for (size_t i = 0; i < n; i++) {
        if (a->field[i].len != b->field[i].len ||
            memcmp(a->field[i].json, b->field[i].json, a->field[i].len) != 0)
            return false;
        /* The text is NUL-free (U+0000 is "\u0000"). */
        if (memchr(a->field[i].json, '\0', a->field[i].len))
            return false;
    }
    return true;
}

static void check_roundtrip(const struct frame *f, enum frame_peer peer)
{
    struct buf e1, e2;
    struct frame g;
    const char *why = NULL;
    int r;

    buf_init(&e1, ENCODE_MAX);
    buf_init(&e2, ENCODE_MAX);
    r = frame_encode(f, &e1);
    FUZZ_ASSERT(r == 0, "frame_encode: %d", r);
    FUZZ_ASSERT(e1.len > 0 && e1.data[e1.len - 1] == '\n' &&
                    memchr(e1.data, '\n', e1.len) == e1.data + e1.len - 1,
                "encoding must be one line ending in \\n");

    memset(&g, 0xa5, sizeof g);
    r = frame_decode(e1.data, e1.len, peer, &g, &why);
    FUZZ_ASSERT(r == 0, "re-decoding our own encoding of a %s (peer %d) failed: %d %s: %.*s",
                frame_kind_name(f->kind), peer, r, why ? why : "",
                (int)(e1.len > 400 ? 400 : e1.len), (const char *)e1.data);
    FUZZ_ASSERT(frame_eq(f, &g), "decode(encode(f)) != f for a %s: %.*s",
                frame_kind_name(f->kind), (int)(e1.len > 400 ? 400 : e1.len),
                (const char *)e1.data);

    r = frame_encode(&g, &e2);
    FUZZ_ASSERT(r == 0, "frame_encode (second): %d", r);
    FUZZ_ASSERT(e1.len == e2.len && memcmp(e1.data, e2.data, e1.len) == 0,
                "encoding is not a fixed point");
    frame_free(&g);
    buf_free(&e1);
    buf_free(&e2);
}

/* The old decoder's verdict and fields must be the new one's. */
static void check_oracle(const uint8_t *data, size_t size, enum frame_peer peer, int r,
                         const struct frame *f)
{
    struct oracle_frame o;
    const char *owhy = NULL;
    int ro = oracle_frame_decode(data, size, peer, &o, &owhy);

    if (ro == -ENOMEM || r == -ENOMEM)
        return;
    FUZZ_ASSERT(ro == r, "peer %d: oracle says %d (%s), decoder %d", peer, ro,
                owhy ? owhy : "ok", r);
    if (r < 0)
        return;
    size_t n;
    frame_field_names(f->kind, &n);
    FUZZ_ASSERT(o.kind == f->kind && o.exit_code == f->exit_code, "kind or exit_code differs");
    for (size_t i = 0; i < n; i++)
        FUZZ_ASSERT(o.field[i].len == f->field[i].len &&
                        memcmp(o.field[i].json, f->field[i].json, o.field[i].len) == 0,
                    "field %zu differs: oracle %s", i, o.field[i].json);
    oracle_frame_free(&o);
}

/* Fed in pieces, the scanner must reach the same result. */
static void check_chunked(const uint8_t *data, size_t size, enum frame_peer peer, int r,
                          const struct frame *f)
{
    static struct frame_scan fs;
    struct fuzz_chunker ch;
    struct frame g;
    const char *why = NULL;
    size_t have = 0;
    int rc = 0;

    fuzz_chunker_init(&ch, size ? data[0] : 0);
    frame_scan_init(&fs, peer, 0);
    while (have < size && rc == 0) {
        have += fuzz_chunker_next(&ch, size - have);
        rc = frame_scan_feed(&fs, data, have, &why);
    }
    if (rc == 0)
        rc = frame_scan_finish(&fs, data, size, peer, &g, &why);
    else
        FUZZ_ASSERT(r == -EBADMSG, "feed refused (%s) what decode gives %d", why, r);
    if (rc == -ENOMEM || r == -ENOMEM)
        return;
    FUZZ_ASSERT(rc == r, "chunked %d (%s), whole %d", rc, why ? why : "ok", r);
    if (rc < 0)
        return;
    FUZZ_ASSERT(frame_eq(f, &g) && f->canonical == g.canonical, "chunked decode differs");
    frame_free(&g);
}

/* Streamed: each chunk in a buffer of its own, freed after it is fed (a
 * read outside the chunk is a heap error under ASan), then frame_scan_end:
 * the same verdict, kind, exit code and canonical flag, and the same string
 * lengths, without the message. */
static void check_streamed(const uint8_t *data, size_t size, enum frame_peer peer, int r,
                           const struct frame *f)
{
    static struct frame_scan fs;
    struct fuzz_chunker ch;
    struct frame g;
    const char *why = NULL;
    size_t have = 0;
    int rc = 0;

    fuzz_chunker_init(&ch, size > 1 ? data[1] : 0);
    frame_scan_init(&fs, peer, 0);
    while (have < size && rc == 0) {
        size_t k = fuzz_chunker_next(&ch, size - have);
        uint8_t *chunk = malloc(k);
        FUZZ_ASSERT(chunk, "malloc");
        memcpy(chunk, data + have, k);
        rc = frame_scan_feed_at(&fs, chunk, have, k, &why);
        free(chunk);
        have += k;
    }
    if (rc == 0)
        rc = frame_scan_end(&fs, size, peer, &g, &why);
    if (r == -ENOMEM)
        return;
    FUZZ_ASSERT(rc == r, "streamed %d (%s), whole %d", rc, why ? why : "ok", r);
    if (rc < 0)
        return;
    size_t n;
    frame_field_names(f->kind, &n);
    FUZZ_ASSERT(g.kind == f->kind && g.exit_code == f->exit_code && g.canonical == f->canonical,
                "streamed kind, exit code or canonical differs");
    for (size_t i = 0; i < n; i++)
        FUZZ_ASSERT(g.field[i].str_bytes == f->field[i].str_bytes &&
                        (g.field[i].json == NULL ||
                         (g.field[i].json == f->field[i].json && g.field[i].len == f->field[i].len)),
                    "streamed field %zu differs", i);
    frame_free(&g);
}

/* A canonical frame is its own encoding. */
static void check_canonical(const uint8_t *data, size_t size, const struct frame *f)
{
    struct buf e;

    if (!f->canonical)
        return;
    buf_init(&e, ENCODE_MAX);
    FUZZ_ASSERT(frame_encode(f, &e) == 0, "frame_encode");
    FUZZ_ASSERT(e.len == size && memcmp(e.data, data, size) == 0,
                "canonical frame does not encode to its input");
    buf_free(&e);
}

static void check_decode(const uint8_t *data, size_t size, enum frame_peer peer)
{
    struct frame f, sentinel;
    const char *why = NULL;
    int r;

    memset(&f, 0x5a, sizeof f);
    memcpy(&sentinel, &f, sizeof f);
    r = frame_decode(data, size, peer, &f, &why);
    check_oracle(data, size, peer, r, &f);
    check_chunked(data, size, peer, r, &f);
    check_streamed(data, size, peer, r, &f);
    if (r < 0) {
        FUZZ_ASSERT(r == -EBADMSG || r == -EPROTO || r == -ENOMEM, "undocumented error %d", r);
        FUZZ_ASSERT(why != NULL, "no reason for error %d", r);
        FUZZ_ASSERT(memcmp(&f, &sentinel, sizeof f) == 0, "*out changed on failure");
        return;
    }
    FUZZ_ASSERT(r == 0, "unexpected return %d", r);
    FUZZ_ASSERT((unsigned)f.kind < FRAME_KIND_COUNT, "kind %d", (int)f.kind);
    if (peer == FRAME_FROM_CHILD) {
        FUZZ_ASSERT(f.kind == FRAME_READY || f.kind == FRAME_TOOL_CALL || f.kind == FRAME_LOG ||
                        f.kind == FRAME_DONE || f.kind == FRAME_OUTPUT,
                    "kind %s accepted from a child", frame_kind_name(f.kind));
        /* What the supervisor relays must be UTF-8 (the client reads text). */
        size_t n;
        frame_field_names(f.kind, &n);
        for (size_t i = 0; i < n; i++)
            FUZZ_ASSERT(utf8_valid((const uint8_t *)f.field[i].json, f.field[i].len),
                        "field %zu of a child frame is not UTF-8", i);
    }
    check_canonical(data, size, &f);
    check_roundtrip(&f, peer);
    frame_free(&f);
    frame_free(&f); /* documented as safe on a freed frame */
}

/* A log frame carrying the input as its message, as the child's runtime
 * builds them: set_stringn -> encode -> decode must give the same text. */
static void check_set_string(const uint8_t *data, size_t size)
{
    struct frame f;
    int r;

    if (!utf8_valid(data, size))
        return;
    frame_init(&f, FRAME_LOG);
    r = frame_set_stringn(&f, "msg", (const char *)data, size);
    FUZZ_ASSERT(r == 0, "frame_set_stringn: %d", r);
    r = frame_set_int(&f, "level", 7);
    FUZZ_ASSERT(r == 0, "frame_set_int: %d", r);
    check_roundtrip(&f, FRAME_FROM_CLIENT);
    frame_free(&f);

    frame_init(&f, FRAME_OUTPUT);
    r = frame_set_stringn(&f, "stdout", (const char *)data, size);
    FUZZ_ASSERT(r == 0, "frame_set_stringn: %d", r);
    r = frame_set_int(&f, "exit_code", size > 0 ? (int64_t)data[0] - 128 : INT64_MIN);
    FUZZ_ASSERT(r == 0, "frame_set_int: %d", r);
    check_roundtrip(&f, FRAME_FROM_CHILD);
    frame_free(&f);
}

static void check_chan(const uint8_t *data, size_t size)
{
    enum chan_type type;
    uint32_t len, max = size >= 9 ? (uint32_t)data[8] << 16 : 0xffffffffu;
    uint8_t again[CHAN_HDR_LEN];
    int r = chan_hdr_decode(data, size, max, &type, &len);

    if (size < CHAN_HDR_LEN) {
        FUZZ_ASSERT(r == 0, "short header gave %d", r);
        return;
    }
    FUZZ_ASSERT(r == 1 || r == -EPROTO || r == -EMSGSIZE, "chan_hdr_decode: %d", r);
    if (r != 1)
        return;
    FUZZ_ASSERT(len <= max, "len %u over max %u", len, max);
    chan_hdr_encode(again, type, len);
    FUZZ_ASSERT(memcmp(again, data, CHAN_HDR_LEN) == 0, "chan header does not round-trip");
}

static void check_log_write(const uint8_t *data, size_t size)
{
    char msg[FRAME_LOG_MAX], out[FRAME_LOG_MAX];
    size_t n = size < sizeof msg - 1 ? size : sizeof msg - 1, esc = 0;
    memcpy(msg, data, n);
    msg[n] = '\0';
    n = strlen(msg);
    for (size_t i = 0; i < n; i++)
        esc += msg[i] == '"' || msg[i] == '\\' ? 2 : (uint8_t)msg[i] < 0x20 ? 6 : 1;
    /* The room: FRAME_LOG_MAX, or one picked by the input's first byte. */
    size_t room = size && data[0] & 1 ? data[0] >> 1 : sizeof out;
    size_t len = frame_log_write(out, room, "warning", msg);
    size_t fixed = strlen("{\"level\":\"warning\",\"msg\":\"\",\"kind\":\"log\"}\n");
    FUZZ_ASSERT(room < fixed ? len == 0 : len >= fixed && len <= room, "log frame of %zu in %zu",
                len, room);
    if (len == 0)
        return;
    struct frame f;
    const char *why = NULL;
    FUZZ_ASSERT(frame_decode((const uint8_t *)out, len, FRAME_FROM_CHILD, &f, &why) == 0,
                "log frame refused: %s", why);
    FUZZ_ASSERT(f.kind == FRAME_LOG && f.canonical, "log frame not canonical");
    const struct frame_field *m = frame_get(&f, "msg");
    cJSON *root = cJSON_ParseWithLength(m->json, m->len);
    const char *got = cJSON_GetStringValue(root);
    FUZZ_ASSERT(got, "msg is not a string");
    size_t i = 0;
    for (; got[i]; i++)
        FUZZ_ASSERT(i < n && got[i] == ((uint8_t)msg[i] < 0x80 ? msg[i] : '?'),
                    "msg differs at %zu", i);
    if (room == sizeof out && esc + fixed <= room)
        FUZZ_ASSERT(i == n, "msg cut at %zu of %zu", i, n);
    cJSON_Delete(root);
    frame_free(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_decode(data, size, FRAME_FROM_CLIENT);
    check_decode(data, size, FRAME_FROM_CHILD);
    check_set_string(data, size);
    check_chan(data, size);
    check_log_write(data, size);
    return 0;
}
