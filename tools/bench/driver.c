/* forkbox-bench: the driver: one epoll loop that launches turns (how many at once, how many
 * not yet ready, how far apart, until when), runs them to their end or holds them open, and
 * gathers their samples; one more block on a held turn (driver_block). Runs in the
 * forkbox-bench process. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "bench.h"

int driver_init(struct driver *d, uint16_t port, const struct blob *tools,
                const struct blob *empty)
{
    memset(d, 0, sizeof *d);
    d->ep = epoll_create1(EPOLL_CLOEXEC);
    if (d->ep < 0)
        return -1;
    d->addr.sin_family = AF_INET;
    d->addr.sin_port = htons(port);
    d->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    d->tools = tools;
    d->empty = empty;
    d->max_active = 1;
    d->max_pending = 1;
    d->launch_until = UINT64_MAX;
    return 0;
}

static void driver_bury(struct driver *d)
{
    while (d->graveyard) {
        struct conn *c = d->graveyard;
        d->graveyard = c->next;
        free(c);
    }
}

/* Runs until nothing is left to launch and every live turn is held idle (or gone), or until
 * the deadline, when every turn still busy is failed. */
void driver_run(struct driver *d, uint64_t deadline)
{
    struct epoll_event evs[256];
    if (!d->t_first)
        d->t_first = now_ns();
    for (;;) {
        uint64_t t = now_ns();
        while (d->to_launch && t < d->launch_until && d->active < d->max_active &&
               d->active - d->ready_now < d->max_pending &&
               (!d->gap_ns || !d->t_last_done || t >= d->t_last_done + d->gap_ns))
            conn_start(d);
        driver_bury(d);
        bool launching = d->to_launch && t < d->launch_until;
        if (!launching && d->active == d->held_now)
            return;
        if (t >= deadline) {
            for (struct conn *c = d->live; c; c = d->live) {
                conn_fail(c, "timed out (bench deadline)");
                conn_finish(c);
            }
            driver_bury(d);
            return;
        }
        uint64_t wait_ms = (deadline - t) / 1000000 + 1;
        if (d->gap_ns && d->to_launch && d->active == 0)
            wait_ms = 1;
        int n = epoll_wait(d->ep, evs, 256, wait_ms > 100 ? 100 : (int)wait_ms);
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (!c->dead)
                conn_event(c, evs[i].events);
        }
    }
}

/* Ends every held turn (shutdown + close 1000) and waits for them to finish. */
void driver_release(struct driver *d, uint64_t deadline)
{
    d->plan.hold = false;
    for (struct conn *c = d->live, *next; c; c = next) {
        next = c->next;
        if (c->held) {
            end_turn(c);
            c->t_evt = now_ns();
            conn_pump_ws(c, false);
        }
    }
    driver_run(d, deadline);
}

/* Runs one more block on the driver's one held turn, which stays open and held after it:
 * `upload` as the block's workspace archive (NULL: the empty one), `code` as its code. Returns
 * the block's round trip in ms (workspace archive sent -> snapshot received), NAN when the turn
 * failed (d->first_err says why). */
double driver_block(struct driver *d, const struct blob *upload, const char *code,
                    uint64_t deadline)
{
    struct conn *c = d->live;
    if (!c || c->next || !c->held || c->failed)
        return NAN;
    free(d->plan.run.p);
    d->plan.run = run_frame(code);
    d->plan.upload = upload;
    d->plan.blocks = c->blocks_done + 1;
    c->held = false;
    d->held_now--;
    size_t n0 = d->block_rtt.n;
    start_block(c);
    c->t_evt = now_ns();
    conn_pump_ws(c, false);
    driver_run(d, deadline); /* returns once the turn is held again, or gone */
    if (d->live != c || c->failed || d->block_rtt.n == n0)
        return NAN;
    return d->block_rtt.v[d->block_rtt.n - 1];
}

void driver_free(struct driver *d)
{
    for (struct conn *c = d->live; c; c = d->live)
        conn_finish(c);
    driver_bury(d);
    if (d->ep >= 0)
        close(d->ep);
    samples_free(&d->turn_start);
    samples_free(&d->block_rtt);
    samples_free(&d->handling);
    free(d->out_stdout);
    free(d->out_stderr);
    free(d->plan.run.p);
    d->ep = -1;
}
