/* A growable byte buffer with a hard ceiling set at creation.
 *
 * Every buffer that holds bytes from a peer has a ceiling, so a hostile peer
 * can make an append fail but never make the process grow without bound. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct buf {
    uint8_t *data; /* owned; NULL until the first append */
    size_t len;    /* bytes in use */
    size_t cap;    /* bytes allocated */
    size_t max;    /* hard ceiling for len */
};

void buf_init(struct buf *b, size_t max);
/* 0, or -ENOBUFS if len + n would pass max (nothing appended), -ENOMEM. */
int buf_append(struct buf *b, const void *p, size_t n);
/* Make room for n more bytes without appending (one allocation before a
 * series of appends of known total size). 0, -ENOBUFS or -ENOMEM. */
int buf_reserve(struct buf *b, size_t n);
/* Same errors as buf_append; the text is not NUL-terminated in len. */
int buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drop the first n bytes (n <= len). */
void buf_consume(struct buf *b, size_t n);
void buf_reset(struct buf *b);   /* len = 0, keeps memory */
void buf_free(struct buf *b);    /* frees memory, keeps max; safe twice */
/* Take the data (caller frees); the buffer is left empty. */
uint8_t *buf_steal(struct buf *b, size_t *len);
