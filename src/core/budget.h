/* Byte budgets: how much memory a peer can make the supervisor hold.
 *
 * Every buffer that holds bytes from (or for) a peer is charged to its turn's
 * budget, and each turn's budget to the daemon's (`up`), so one turn cannot
 * take more than its share and all turns together cannot take more than the
 * daemon allows. A charge is taken before the memory is allocated, for all it
 * may grow to (an announced length is reserved when its header arrives), and
 * given back when the memory is freed. Single-threaded: the supervisor's
 * loop owns every budget. */
#pragma once
#include <errno.h>
#include <stdint.h>

struct budget {
    uint64_t used;     /* bytes charged now */
    uint64_t max;      /* ceiling; 0 = none */
    struct budget *up; /* charged too (the daemon-wide budget), or NULL */
};

/* Charge n bytes to b and every budget above it, or to none: 0, -EDQUOT if b
 * itself would pass its ceiling, -ENOSPC if a budget above it would. */
static inline int budget_take(struct budget *b, uint64_t n)
{
    for (struct budget *p = b; p; p = p->up)
        if (p->max && (p->used > p->max || n > p->max - p->used))
            return p == b ? -EDQUOT : -ENOSPC;
    for (struct budget *p = b; p; p = p->up)
        p->used += n;
    return 0;
}

static inline void budget_give(struct budget *b, uint64_t n)
{
    for (struct budget *p = b; p; p = p->up)
        p->used = p->used >= n ? p->used - n : 0;
}
