/* Strict UTF-8 validation (RFC 3629, Unicode table 3-7).
 *
 * Text is mostly ASCII, so runs of ASCII are checked eight bytes at a time;
 * multi-byte sequences go through the well-formed byte ranges below, which
 * exclude overlongs (C0, C1, E0 80..9F, F0 80..8F), surrogates (ED A0..BF)
 * and code points above U+10FFFF (F4 90.., F5..FF). */
#include "core/utf8.h"

#include <string.h>

#define UTF8_HIGH_BITS 0x8080808080808080ULL

static inline bool cont(uint8_t c) { return (c & 0xC0) == 0x80; }

bool utf8_valid(const uint8_t *p, size_t n)
{
    size_t i = 0;
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
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t left = n - i;
        if (c >= 0xC2 && c <= 0xDF) {
            if (left < 2 || !cont(p[i + 1]))
                return false;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (left < 3)
                return false;
            uint8_t c1 = p[i + 1];
            uint8_t lo = c == 0xE0 ? 0xA0 : 0x80; /* E0 80..9F: overlong */
            uint8_t hi = c == 0xED ? 0x9F : 0xBF; /* ED A0..BF: surrogates */
            if (c1 < lo || c1 > hi || !cont(p[i + 2]))
                return false;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (left < 4)
                return false;
            uint8_t c1 = p[i + 1];
            uint8_t lo = c == 0xF0 ? 0x90 : 0x80; /* F0 80..8F: overlong */
            uint8_t hi = c == 0xF4 ? 0x8F : 0xBF; /* F4 90..: > U+10FFFF */
            if (c1 < lo || c1 > hi || !cont(p[i + 2]) || !cont(p[i + 3]))
                return false;
            i += 4;
        } else {
            return false; /* 80..C1 lead, or F5..FF */
        }
    }
    return true;
}
