/* Strict UTF-8 validation (RFC 3629, Unicode table 3-7).
 *
 * Text is mostly ASCII, so runs of ASCII are checked eight bytes at a time;
 * multi-byte sequences go through the well-formed byte ranges below, which
 * exclude overlongs (C0, C1, E0 80..9F, F0 80..8F), surrogates (ED A0..BF)
 * and code points above U+10FFFF (F4 90.., F5..FF). */
#include "core/utf8.h"

#include <string.h>

#define UTF8_HIGH_BITS 0x8080808080808080ULL

/* Check p[0..n) byte by byte from the state *st (the slow path: the end of
 * a piece, where a sequence may be cut). */
static bool feed_bytes(struct utf8_stream *st, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t c = p[i];
        if (st->need) {
            if (c < st->lo || c > st->hi)
                return false;
            st->lo = 0x80;
            st->hi = 0xBF;
            st->need--;
        } else if (c >= 0x80 && !utf8_lead(c, &st->need, &st->lo, &st->hi)) {
            return false;
        }
    }
    return true;
}

bool utf8_stream_feed(struct utf8_stream *st, const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n && st->need) /* the end of a sequence the last piece cut */
        if (!feed_bytes(st, p + i++, 1))
            return false;
    while (i < n) {
        /* ASCII fast path: no byte of the word has its top bit set. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8); /* unaligned-safe load */
            if (w & UTF8_HIGH_BITS)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        uint8_t c = p[i], need, lo, hi;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (!utf8_lead(c, &need, &lo, &hi))
            return false;
        if (n - i <= need) /* cut by the end of this piece */
            return feed_bytes(st, p + i, n - i);
        if (p[i + 1] < lo || p[i + 1] > hi)
            return false;
        for (size_t k = 2; k <= need; k++)
            if ((p[i + k] & 0xC0) != 0x80)
                return false;
        i += (size_t)need + 1;
    }
    return true;
}

bool utf8_valid(const uint8_t *p, size_t n)
{
    struct utf8_stream st = {0};
    return utf8_stream_feed(&st, p, n) && utf8_stream_end(&st);
}
