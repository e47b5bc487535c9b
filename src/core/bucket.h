/* A token bucket for a cost per unit of time (bytes, messages): what a peer
 * may make the supervisor do before it stops being read for a while.
 *
 * Unlike core/ratelimit.h (log lines: a line over the rate is dropped and
 * counted), a cost is never refused: it is taken, the balance may go below
 * zero, and the caller stops reading the peer until bucket_ok() says the
 * balance is back (backpressure: the peer waits, nothing is read to be
 * thrown away). Header only; single-threaded, like the loop that owns it. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

struct bucket {
    uint64_t rate;    /* tokens added per second */
    uint64_t burst;   /* the most it holds */
    int64_t tokens;   /* the balance; below zero after an overdraft */
    uint64_t at_ns;   /* when it was last refilled; 0: never used (full) */
};

#define BUCKET_INIT(BURST, RATE) {.rate = (RATE), .burst = (BURST)}

static inline void bucket_refill(struct bucket *b, uint64_t now_ns)
{
    if (b->at_ns == 0) {
        b->tokens = (int64_t)b->burst;
        b->at_ns = now_ns;
        return;
    }
    if (now_ns <= b->at_ns)
        return;
    uint64_t add = (now_ns - b->at_ns) / 1000 * b->rate / 1000000;
    if (add == 0)
        return; /* less than a token yet: the time counts at the next refill */
    uint64_t room = (uint64_t)((int64_t)b->burst - b->tokens); /* tokens <= burst */
    b->tokens += (int64_t)(add < room ? add : room);
    b->at_ns = now_ns;
}

/* Take cost tokens at now_ns (always taken). True if the balance is still
 * not below zero: the peer may go on. */
static inline bool bucket_take(struct bucket *b, uint64_t cost, uint64_t now_ns)
{
    bucket_refill(b, now_ns);
    b->tokens -= (int64_t)cost;
    return b->tokens >= 0;
}

/* True once the balance is back to zero or more. */
static inline bool bucket_ok(struct bucket *b, uint64_t now_ns)
{
    bucket_refill(b, now_ns);
    return b->tokens >= 0;
}
