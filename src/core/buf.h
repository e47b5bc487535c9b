/* A growable byte buffer with a hard ceiling set at creation.
 *
 * Every buffer that holds bytes from a peer has a ceiling, so a hostile peer
 * can make an append fail but never make the process grow without bound.
 * A buffer may also be charged to a budget (core/budget.h): every byte it
 * allocates is taken from the budget first and given back when freed. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct budget;

struct buf {
    uint8_t *data;         /* owned; NULL until the first append */
    size_t len;            /* bytes in use */
    size_t cap;            /* bytes allocated (charged to budget) */
    size_t max;            /* hard ceiling for len */
    struct budget *budget; /* borrowed, or NULL */
};

void buf_init(struct buf *b, size_t max);
/* The same, charged to budget (borrowed; must outlive the buffer's memory). */
void buf_init_budget(struct buf *b, size_t max, struct budget *budget);
/* 0, or -ENOBUFS if len + n would pass max (nothing appended), -ENOMEM, or
 * -EDQUOT / -ENOSPC if the budget refuses (see budget_take). */
int buf_append(struct buf *b, const void *p, size_t n);
/* Make room for n more bytes without appending (one allocation before a
 * series of appends of known total size). Same errors as buf_append. */
int buf_reserve(struct buf *b, size_t n);
/* Make cap exactly len + n if it is less (no growth beyond what was asked:
 * for an announced length). Same errors as buf_append. */
int buf_reserve_exact(struct buf *b, size_t n);
/* Move src's bytes (and their charge) to dst, which must be empty; src is
 * left empty. dst keeps its own max and budget. 0, or the budget's error. */
int buf_move(struct buf *dst, struct buf *src);
/* Same errors as buf_append; the text is not NUL-terminated in len. */
int buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Give back the capacity past len (a buffer made for more than it got:
 * its charge shrinks to what it holds). An empty one is freed. */
void buf_fit(struct buf *b);
/* Drop the first n bytes (n <= len). */
void buf_consume(struct buf *b, size_t n);
void buf_reset(struct buf *b);   /* len = 0, keeps memory */
void buf_free(struct buf *b);    /* frees memory, keeps max; safe twice */
/* Take the data (caller frees; its charge is given back: the caller owns the
 * memory outside any budget); the buffer is left empty. */
uint8_t *buf_steal(struct buf *b, size_t *len);
