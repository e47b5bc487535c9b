/* Strict UTF-8 validation (RFC 3629, Unicode table 3-7).
 *
 * Text is mostly ASCII, so runs of ASCII are checked eight bytes at a time;
 * multi-byte sequences go through the well-formed byte ranges below, which
 * exclude overlongs (C0, C1, E0 80..9F, F0 80..8F), surrogates (ED A0..BF)
 * and code points above U+10FFFF (F4 90.., F5..FF). */
#include "core/utf8.h"

#include <string.h>

#define UTF8_HIGH_BITS 0x8080808080808080ULL

/* The sequence lead byte c starts: how many continuation bytes follow and
 * the range of the first one (the others are 80..BF). False if c cannot lead
 * a sequence (80..C1, F5..FF). */
static bool lead(uint8_t c, uint8_t *need, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        *need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        *need = 2;
        if (c == 0xE0)
            *lo = 0xA0; /* E0 80..9F: overlong */
        if (c == 0xED)
            *hi = 0x9F; /* ED A0..BF: surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        *need = 3;
        if (c == 0xF0)
            *lo = 0x90; /* F0 80..8F: overlong */
        if (c == 0xF4)
            *hi = 0x8F; /* F4 90..: above U+10FFFF */
    } else {
        return false;
    }
    return true;
}

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
        } else if (c >= 0x80 && !lead(c, &st->need, &st->lo, &st->hi)) {
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
        if (!lead(c, &need, &lo, &hi))
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
