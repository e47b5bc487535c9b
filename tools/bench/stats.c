/* forkbox-bench: samples and their percentiles (nearest rank), the statistics every row is
 * made of. Runs in the forkbox-bench process. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

void samples_add(struct samples *s, double x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->v = xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile over samples [from, n); NAN when there are none. */
double samples_pct_from(const struct samples *s, size_t from, double p)
{
    if (from >= s->n)
        return NAN;
    size_t n = s->n - from;
    double *c = xmalloc(n * sizeof *c);
    memcpy(c, s->v + from, n * sizeof *c);
    qsort(c, n, sizeof *c, cmp_double);
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    double r = c[k ? k - 1 : 0];
    free(c);
    return r;
}

double samples_pct(const struct samples *s, double p) { return samples_pct_from(s, 0, p); }

void samples_reset(struct samples *s) { s->n = 0; }

void samples_free(struct samples *s)
{
    free(s->v);
    memset(s, 0, sizeof *s);
}

double median_of(double *v, size_t n)
{
    struct samples sm = {.v = v, .n = n, .cap = n};
    return samples_pct(&sm, 50);
}
