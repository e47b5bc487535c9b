#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True if p[0..n) is well-formed UTF-8 (RFC 3629: no overlongs, no surrogates,
 * nothing above U+10FFFF). */
bool utf8_valid(const uint8_t *p, size_t n);

/* The sequence lead byte c starts: how many continuation bytes follow and
 * the range of the first one (the others are 80..BF), which excludes
 * overlongs (E0 80..9F, F0 80..8F), surrogates (ED A0..BF) and code points
 * above U+10FFFF (F4 90..). False if c cannot lead a sequence (80..C1,
 * F5..FF). Inline: the JSON scanner calls it per non-ASCII character. */
static inline bool utf8_lead(uint8_t c, uint8_t *need, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        *need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        *need = 2;
        if (c == 0xE0)
            *lo = 0xA0;
        if (c == 0xED)
            *hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        *need = 3;
        if (c == 0xF0)
            *lo = 0x90;
        if (c == 0xF4)
            *hi = 0x8F;
    } else {
        return false;
    }
    return true;
}

/* The same check over a text that arrives in pieces (a WebSocket message
 * frame by frame): a sequence may be cut between two pieces. Zero it to
 * start. */
struct utf8_stream {
    uint8_t need;   /* continuation bytes still due for the cut sequence */
    uint8_t lo, hi; /* the range of the next one */
};

/* Check p[0..n) as the continuation of the text so far: false at the first
 * byte that cannot be part of well-formed UTF-8. */
bool utf8_stream_feed(struct utf8_stream *st, const uint8_t *p, size_t n);
/* True if the text fed so far ends on a whole sequence. */
static inline bool utf8_stream_end(const struct utf8_stream *st) { return st->need == 0; }
