/* A growing byte buffer for building test inputs (archives, streams) in the
 * unit tests; aborts on allocation failure. */
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct mem {
    uint8_t *p;
    size_t len, cap;
};

static inline void mem_add(struct mem *m, const void *p, size_t n)
{
    if (m->len + n > m->cap) {
        size_t cap = m->cap ? m->cap : 4096;

        while (cap < m->len + n)
            cap *= 2;
        m->p = realloc(m->p, cap);
        if (!m->p)
            abort();
        m->cap = cap;
    }
    if (n)
        memcpy(m->p + m->len, p, n);
    m->len += n;
}
