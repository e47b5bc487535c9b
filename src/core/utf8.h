#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True if p[0..n) is well-formed UTF-8 (RFC 3629: no overlongs, no surrogates,
 * nothing above U+10FFFF). */
bool utf8_valid(const uint8_t *p, size_t n);

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
