/* A small epoll loop: fd watches, one periodic tick, and a before-sleep hook.
 *
 * Level-triggered. A watch is a struct owned by the caller (usually embedded
 * in the object it serves), so registering never allocates. Callbacks must
 * not free the object they were called for: mark it and let the before-sleep
 * hook reap it (redis freeClientAsync).
 *
 * Stalls are seen: every iteration (from epoll_wait's return to its next
 * call) is timed and handed to the stats hook (the /metrics histogram), and
 * one that takes LOOP_SLOW_MS or more is logged with the callback that took
 * most of it (its watch's name and turn). A thread that watches the loop
 * from outside, for a loop stuck in one call, is loop/watchdog.h. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>

struct loop;
struct loop_watch;

typedef void (*loop_fd_cb)(struct loop_watch *w, uint32_t events);
typedef void (*loop_hook_cb)(void *ud);

struct loop_watch {
    int fd;           /* borrowed */
    uint32_t events;  /* current EPOLL* interest */
    bool added;       /* registered with epoll */
    loop_fd_cb cb;
    void *ud;         /* the object this watch belongs to */
    const char *name; /* static: what it is, for the stall log ("sandbox channel");
                         NULL: "fd N" */
    uint64_t turn;    /* whose: a turn's id, 0 for the daemon's own */
};

struct loop *loop_new(void);
void loop_free(struct loop *l);

/* Set the interest of w (adding, modifying or removing it from epoll as
 * needed; events == 0 removes it). 0 or -errno. */
int loop_watch(struct loop *l, struct loop_watch *w, uint32_t events);
/* Remove w if it was added; call before closing w->fd. */
void loop_unwatch(struct loop *l, struct loop_watch *w);

/* tick runs every period_ms; before_sleep runs after every batch of events. */
void loop_set_tick(struct loop *l, unsigned period_ms, loop_hook_cb tick, void *ud);
void loop_set_before_sleep(struct loop *l, loop_hook_cb cb, void *ud);
/* work runs after every batch of events, before before_sleep; while it
 * returns true (work is left), the loop only polls for events instead of
 * sleeping. For work done in bounded steps, one per round, so that it
 * shares the loop with everything else. */
typedef bool (*loop_work_cb)(void *ud);
void loop_set_work(struct loop *l, loop_work_cb work, void *ud);

/* stats(ud, ns) after every iteration, with its busy time (not the time
 * asleep in epoll_wait). Only a loop with a stats hook logs its slow
 * iterations: the supervisor's, which every turn waits behind. */
void loop_set_stats(struct loop *l, void (*stats)(void *ud, uint64_t busy_ns), void *ud);

/* For a thread watching the loop (loop/watchdog.h), safe from any thread:
 * a count that moves at every entry to and return from epoll_wait,
 * whether it is waiting there now (or loop_run has returned), and what it
 * is running when it is not (*name static, "?" before the first callback;
 * *turn 0 for none). */
uint64_t loop_progress(const struct loop *l, bool *waiting, const char **name, uint64_t *turn);

/* Run until loop_stop(). 0, or -errno if epoll fails. */
int loop_run(struct loop *l);
/* One round of loop_run (work, before_sleep, one epoll_wait of at most
 * timeout_ms, the callbacks): for tests and fuzzers that drive the loop
 * themselves. The number of events handled, or -errno. */
int loop_run_once(struct loop *l, int timeout_ms);
void loop_stop(struct loop *l);
