/* Growable byte buffer with a hard ceiling (see buf.h). */
#include "core/buf.h"

#include "core/budget.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_MIN_CAP 64

void buf_init(struct buf *b, size_t max)
{
    *b = (struct buf){.max = max};
}

void buf_init_budget(struct buf *b, size_t max, struct budget *budget)
{
    *b = (struct buf){.max = max, .budget = budget};
}

/* Reallocate to exactly cap bytes, charging the difference first. */
static int buf_realloc(struct buf *b, size_t cap)
{
    if (b->budget && cap > b->cap) {
        int r = budget_take(b->budget, cap - b->cap);
        if (r < 0)
            return r;
    }
    uint8_t *p = realloc(b->data, cap);
    if (!p) {
        if (b->budget && cap > b->cap)
            budget_give(b->budget, cap - b->cap);
        return -ENOMEM;
    }
    if (b->budget && cap < b->cap)
        budget_give(b->budget, b->cap - cap);
    b->data = p;
    b->cap = cap;
    return 0;
}

/* Make cap >= need. Capacity doubles (amortised O(1) appends) but is clamped
 * to max so a buffer near its ceiling does not allocate twice the ceiling;
 * need itself may exceed max by the one byte buf_printf uses for its NUL. */
static int buf_grow(struct buf *b, size_t need)
{
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : BUF_MIN_CAP;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
    if (cap > b->max)
        cap = b->max;
    if (cap < need)
        cap = need;
    return buf_realloc(b, cap);
}

int buf_reserve(struct buf *b, size_t n)
{
    if (b->len > b->max || n > b->max - b->len)
        return -ENOBUFS;
    return buf_grow(b, b->len + n);
}

int buf_reserve_exact(struct buf *b, size_t n)
{
    if (b->len > b->max || n > b->max - b->len)
        return -ENOBUFS;
    return b->len + n > b->cap ? buf_realloc(b, b->len + n) : 0;
}

int buf_move(struct buf *dst, struct buf *src)
{
    buf_free(dst); /* empty, but it may hold capacity */
    if (dst->budget != src->budget && src->cap) {
        if (dst->budget) {
            int r = budget_take(dst->budget, src->cap);
            if (r < 0)
                return r;
        }
        if (src->budget)
            budget_give(src->budget, src->cap);
    }
    dst->data = src->data;
    dst->len = src->len;
    dst->cap = src->cap;
    src->data = NULL;
    src->len = src->cap = 0;
    return 0;
}

int buf_append(struct buf *b, const void *p, size_t n)
{
    if (n == 0)
        return 0;
    int r = buf_reserve(b, n);
    if (r < 0)
        return r;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

int buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return -EINVAL;
    if (b->len > b->max || (size_t)n > b->max - b->len)
        return -ENOBUFS;
    /* vsnprintf writes a NUL after the text; it is not counted in len. */
    int r = buf_grow(b, b->len + (size_t)n + 1);
    if (r < 0)
        return r;
    va_start(ap, fmt);
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void buf_fit(struct buf *b)
{
    if (b->len == 0)
        buf_free(b);
    else if (b->cap > b->len)
        buf_realloc(b, b->len); /* shrinking: in place, it cannot fail but to keep it */
}

void buf_consume(struct buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    /* O(len): fine for consuming whole messages, not byte by byte. */
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

void buf_reset(struct buf *b) { b->len = 0; }

void buf_free(struct buf *b)
{
    free(b->data);
    if (b->budget)
        budget_give(b->budget, b->cap);
    b->data = NULL;
    b->len = b->cap = 0;
}

uint8_t *buf_steal(struct buf *b, size_t *len)
{
    uint8_t *p = b->data;
    if (len)
        *len = b->len;
    if (b->budget)
        budget_give(b->budget, b->cap);
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}
