/* The block's `output` frame, written in C straight from the capture buffers
 * (runs in the sandbox's runtime, after capture_end).
 *
 * It used to be assembled in Python: the buffers copied into bytes, decoded,
 * joined with the note, JSON-escaped, formatted and encoded again: six copies
 * of up to --output-cap bytes per stream, each into fresh pages (16 MiB of
 * stdout cost the sandbox ~17,000 page faults and ~200 ms per block). Here
 * each stream is one pass over its bytes into one buffer, and the result is
 * byte for byte what the Python code wrote:
 *   - text is bytes.decode("utf-8", "replace"): each maximal ill-formed
 *     subpart becomes U+FFFD (Unicode 15, 3.9 "U+FFFD Substitution of Maximal
 *     Subparts", which CPython's decoder follows);
 *   - a part that grew in that decoding (U+FFFD is 3 bytes, it may stand for
 *     1) beyond what the capture may keep for it (half of --output-cap) is
 *     cut back to that, at a character boundary: the head keeps its start,
 *     the tail its end (the supervisor holds each stream to --output-cap
 *     bytes, plus notes);
 *   - head, then "\n[forkbox: N bytes of <stream> dropped]\n" if bytes were
 *     dropped, then the tail; the notes for stderr follow on a line of their
 *     own;
 *   - escaped as json.encoder.encode_basestring does (", \, and the controls
 *     below U+0020; everything else as it is). */
#include "pyrt/pyrt_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/utf8.h"
#include "proto/frame_fields.h"

/* The frame is written in the table's order (proto/frame_fields.h), so the
 * supervisor relays it as it is: a reordering there must be one here too. */
_Static_assert(FRAME_FIELD_OUTPUT_stdout == 0 && FRAME_FIELD_OUTPUT_stderr == 1 &&
               FRAME_FIELD_OUTPUT_exit_code == 2 && FRAME_FIELD_OUTPUT_COUNT == 3,
               "output_frame writes {\"stdout\":...,\"stderr\":...,\"exit_code\":...}");

/* Bytes that need an escape: '"', '\\' and 00..1F. Zero-byte trick: a byte b
 * of w is flagged if b ^ '"' or b ^ '\\' is 0, or b < 0x20. */
static inline bool word_special(uint64_t w)
{
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
    uint64_t zq = (q - ones) & ~q, zb = (b - ones) & ~b, lt = (w - ones * 0x20) & ~w;
    return ((zq | zb | lt) & highs) != 0;
}

/* The escaped length of p[0..n). */
static size_t escaped_len(const uint8_t *p, size_t n)
{
    size_t len = n, i = 0;
    while (i < n) {
        uint64_t w;
        if (i + 8 <= n && (memcpy(&w, p + i, 8), !word_special(w))) {
            i += 8;
            continue;
        }
        uint8_t c = p[i++];
        if (c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f')
            len += 1;
        else if (c < 0x20)
            len += 5;
    }
    return len;
}

/* Append p[0..n) to out as JSON string contents; the room (escaped_len) is
 * reserved by the caller. */
static void escape(struct buf *out, const uint8_t *p, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    uint8_t *o = out->data + out->len;
    size_t i = 0;
    while (i < n) {
        size_t run = i;
        while (run + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + run, 8);
            if (word_special(w))
                break;
            run += 8;
        }
        while (run < n && p[run] != '"' && p[run] != '\\' && p[run] >= 0x20)
            run++;
        memcpy(o, p + i, run - i);
        o += run - i;
        if (run == n)
            break;
        uint8_t c = p[run];
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\n': *o++ = 'n'; break;
        case '\r': *o++ = 'r'; break;
        case '\t': *o++ = 't'; break;
        case '\b': *o++ = 'b'; break;
        case '\f': *o++ = 'f'; break;
        default:
            *o++ = 'u';
            *o++ = '0';
            *o++ = '0';
            *o++ = (uint8_t)hex[c >> 4];
            *o++ = (uint8_t)hex[c & 15];
        }
        i = run + 1;
    }
    out->len = (size_t)(o - out->data);
}

/* Length of the maximal subpart at p (n > 0 bytes): the well-formed sequence
 * there, or the longest prefix of one (at least 1 byte) that is ill-formed.
 * *ok says which. */
static size_t subpart(const uint8_t *p, size_t n, bool *ok)
{
    struct utf8_stream st = {0};
    *ok = false;
    if (!utf8_stream_feed(&st, p, 1))
        return 1; /* not a lead byte */
    size_t k = 1;
    while (!utf8_stream_end(&st)) {
        if (k == n || !utf8_stream_feed(&st, p + k, 1))
            return k; /* cut short, or a byte out of range: not taken */
        k++;
    }
    *ok = true;
    return k;
}

/* p[0..n) decoded with "replace" (see the top), into a new buffer. */
static uint8_t *repair(const uint8_t *p, size_t n, size_t *len)
{
    uint8_t *r = malloc(n * 3 + 1); /* U+FFFD for every byte at most */
    if (!r)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        bool ok;
        size_t k = subpart(p + i, n - i, &ok);
        if (ok) {
            memcpy(r + o, p + i, k);
            o += k;
        } else {
            memcpy(r + o, "\xef\xbf\xbd", 3);
            o += 3;
        }
        i += k;
    }
    *len = o;
    return r;
}

/* Append one part of a stream (head or tail, at most `limit` bytes) as JSON
 * string contents; *last is set to its last byte. 0 or -ENOMEM. */
static int put_part(struct buf *out, const uint8_t *p, size_t n, size_t limit, bool keep_end,
                    uint8_t *last)
{
    uint8_t *fixed = NULL;
    if (!utf8_valid(p, n)) {
        size_t len;
        if (!(fixed = repair(p, n, &len)))
            return -ENOMEM;
        p = fixed;
        n = len;
        if (n > limit) { /* grew: cut back at a character boundary */
            size_t cut = keep_end ? n - limit : limit;
            if (keep_end) {
                while (cut < n && (p[cut] & 0xC0) == 0x80)
                    cut++;
                p += cut;
                n -= cut;
            } else {
                while (cut > 0 && (p[cut] & 0xC0) == 0x80)
                    cut--;
                n = cut;
            }
        }
    }
    int r = buf_reserve_exact(out, escaped_len(p, n));
    if (r == 0) {
        escape(out, p, n);
        if (n)
            *last = p[n - 1];
    }
    free(fixed);
    return r;
}

/* Append one stream as a JSON string, with notes (plain text, each ending in
 * '\n') on a line of their own after it. */
static int put_stream(struct buf *out, const struct capture_stream *s, const char *name,
                      const char *notes)
{
    uint8_t last = '\n';
    int r = buf_append(out, "\"", 1);
    size_t start = out->len;
    if (r == 0 && s->head_len)
        r = put_part(out, s->head, s->head_len, s->head_cap, false, &last);
    if (r == 0 && s->dropped) {
        char note[96];
        int k = snprintf(note, sizeof note, "\n[forkbox: %" PRIu64 " bytes of %s dropped]\n",
                         s->dropped, name);
        r = put_part(out, (const uint8_t *)note, (size_t)k, (size_t)k, false, &last);
    }
    if (r == 0 && s->tail_len) {
        /* The ring in order: where it holds it in one piece, as it is. */
        size_t from = (s->tail_pos + s->tail_cap - s->tail_len) % s->tail_cap;
        uint8_t *copy = NULL;
        const uint8_t *tail = s->tail + from;
        if (from + s->tail_len > s->tail_cap) {
            if (!(copy = malloc(s->tail_len)))
                return -ENOMEM;
            capture_tail_copy(s, copy);
            tail = copy;
        }
        r = put_part(out, tail, s->tail_len, s->tail_cap, true, &last);
        free(copy);
    }
    if (r == 0 && notes && *notes) {
        if (out->len > start && last != '\n')
            r = buf_append(out, "\\n", 2);
        if (r == 0)
            r = put_part(out, (const uint8_t *)notes, strlen(notes), SIZE_MAX, false, &last);
    }
    return r ? r : buf_append(out, "\"", 1);
}

int output_frame(struct buf *out, const struct capture *c, const char *stderr_notes,
                 int64_t exit_code)
{
    static const char head[] = "{" FRAME_KEY(stdout), mid[] = "," FRAME_KEY(stderr);
    char end[64];
    int k = snprintf(end, sizeof end, "," FRAME_KEY(exit_code) "%" PRId64 "," FRAME_TAIL("output"),
                     exit_code);
    int r = buf_append(out, head, sizeof head - 1);
    if (r == 0)
        r = put_stream(out, &c->s[0], "stdout", NULL);
    if (r == 0)
        r = buf_append(out, mid, sizeof mid - 1);
    if (r == 0)
        r = put_stream(out, &c->s[1], "stderr", stderr_notes);
    if (r == 0)
        r = buf_append(out, end, (size_t)k);
    return r;
}
