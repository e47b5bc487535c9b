#include "loop/loop.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "core/limits.h"
#include "core/log.h"
#include "core/ratelimit.h"
#include "core/util.h"

#define LOOP_MAX_EVENTS 256

/* One callback of an iteration: the slowest so far, for the stall log. */
struct loop_op {
    const char *name; /* static, NULL: "fd N" */
    uint64_t turn;
    int fd;
    uint64_t ns;
};

struct loop {
    int epfd;
    int timerfd;
    struct loop_watch timer_watch;
    loop_hook_cb tick, before_sleep;
    loop_work_cb work;
    void *tick_ud, *sleep_ud, *work_ud;
    void (*stats)(void *ud, uint64_t busy_ns);
    void *stats_ud;
    bool stop;
    /* the iteration running: since when, and its slowest callback */
    uint64_t busy_since_ns;
    struct loop_op slowest;
    /* read by another thread (loop_progress): atomics */
    uint64_t progress;
    bool waiting;
    const char *cur_name;
    uint64_t cur_turn;
};

/* Around each callback: say what runs (for the watchdog), time it (for the
 * stall log). */
static uint64_t op_begin(struct loop *l, const char *name, uint64_t turn)
{
    __atomic_store_n(&l->cur_name, name, __ATOMIC_RELAXED);
    __atomic_store_n(&l->cur_turn, turn, __ATOMIC_RELAXED);
    return now_ns();
}

static void op_end(struct loop *l, uint64_t t0, const char *name, uint64_t turn, int fd)
{
    uint64_t ns = now_ns() - t0;
    if (ns > l->slowest.ns)
        l->slowest = (struct loop_op){.name = name, .turn = turn, .fd = fd, .ns = ns};
}

/* The iteration is over (the loop is about to wait): report it. */
static void iteration_end(struct loop *l)
{
    uint64_t busy = now_ns() - l->busy_since_ns;
    const struct loop_op slowest = l->slowest, *o = &slowest;
    l->slowest = (struct loop_op){0};
    if (!l->stats) /* a loop nobody waits behind (forkbox sandbox's relay): no report */
        return;
    l->stats(l->stats_ud, busy);
    if (busy >= LOOP_SLOW_MS * 1000000ULL) {
        char what[96], whose[32] = "";
        if (o->name)
            snprintf(what, sizeof what, "%s", o->name);
        else
            snprintf(what, sizeof what, "fd %d", o->fd);
        if (o->turn)
            snprintf(whose, sizeof whose, " of turn %" PRIu64, o->turn);
        LOG_W_RL("event loop iteration took %" PRIu64 " ms, %" PRIu64 " ms of it in %s%s: "
                 "every turn, /health and accept waited that long", busy / 1000000,
                 o->ns / 1000000, what, whose);
    }
}

static void on_timer(struct loop_watch *w, uint32_t events)
{
    struct loop *l = w->ud;
    uint64_t expirations;
    if (read(l->timerfd, &expirations, sizeof expirations) < 0)
        return;
    if (l->tick)
        l->tick(l->tick_ud);
}

struct loop *loop_new(void)
{
    struct loop *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    l->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (l->epfd < 0 || l->timerfd < 0) {
        loop_free(l);
        return NULL;
    }
    l->timer_watch = (struct loop_watch){.fd = l->timerfd, .cb = on_timer, .ud = l,
                                         .name = "tick"};
    l->cur_name = "?";
    l->busy_since_ns = now_ns();
    return l;
}

void loop_free(struct loop *l)
{
    if (!l)
        return;
    if (l->timerfd >= 0)
        close(l->timerfd);
    if (l->epfd >= 0)
        close(l->epfd);
    free(l);
}

int loop_watch(struct loop *l, struct loop_watch *w, uint32_t events)
{
    if (events == w->events && w->added)
        return 0;
    if (events == 0) {
        loop_unwatch(l, w);
        return 0;
    }
    struct epoll_event ev = {.events = events, .data.ptr = w};
    int op = w->added ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    if (epoll_ctl(l->epfd, op, w->fd, &ev) < 0)
        return -errno;
    w->added = true;
    w->events = events;
    return 0;
}

void loop_unwatch(struct loop *l, struct loop_watch *w)
{
    if (w->added)
        epoll_ctl(l->epfd, EPOLL_CTL_DEL, w->fd, NULL);
    w->added = false;
    w->events = 0;
}

void loop_set_tick(struct loop *l, unsigned period_ms, loop_hook_cb tick, void *ud)
{
    struct itimerspec its = {
        .it_interval = {.tv_sec = period_ms / 1000, .tv_nsec = (long)(period_ms % 1000) * 1000000},
    };
    its.it_value = its.it_interval;
    l->tick = tick;
    l->tick_ud = ud;
    timerfd_settime(l->timerfd, 0, &its, NULL);
    loop_watch(l, &l->timer_watch, EPOLLIN);
}

void loop_set_before_sleep(struct loop *l, loop_hook_cb cb, void *ud)
{
    l->before_sleep = cb;
    l->sleep_ud = ud;
}

void loop_set_work(struct loop *l, loop_work_cb work, void *ud)
{
    l->work = work;
    l->work_ud = ud;
}

void loop_set_stats(struct loop *l, void (*stats)(void *ud, uint64_t busy_ns), void *ud)
{
    l->stats = stats;
    l->stats_ud = ud;
}

uint64_t loop_progress(const struct loop *l, bool *waiting, const char **name, uint64_t *turn)
{
    *waiting = __atomic_load_n(&l->waiting, __ATOMIC_ACQUIRE);
    *name = __atomic_load_n(&l->cur_name, __ATOMIC_RELAXED);
    *turn = __atomic_load_n(&l->cur_turn, __ATOMIC_RELAXED);
    return __atomic_load_n(&l->progress, __ATOMIC_ACQUIRE);
}

/* Into or out of epoll_wait. */
static void set_waiting(struct loop *l, bool waiting)
{
    __atomic_store_n(&l->waiting, waiting, __ATOMIC_RELEASE);
    __atomic_add_fetch(&l->progress, 1, __ATOMIC_RELEASE);
}

int loop_run_once(struct loop *l, int timeout_ms)
{
    struct epoll_event evs[LOOP_MAX_EVENTS];
    bool busy = false;
    uint64_t t0;
    if (l->work) {
        t0 = op_begin(l, "work", 0);
        busy = l->work(l->work_ud);
        op_end(l, t0, "work", 0, -1);
    }
    if (l->before_sleep) {
        t0 = op_begin(l, "before-sleep", 0);
        l->before_sleep(l->sleep_ud);
        op_end(l, t0, "before-sleep", 0, -1);
    }
    iteration_end(l);
    if (l->stop)
        return 0;
    set_waiting(l, true);
    int n = epoll_wait(l->epfd, evs, LOOP_MAX_EVENTS, busy ? 0 : timeout_ms);
    set_waiting(l, false);
    l->busy_since_ns = now_ns();
    if (n < 0)
        return errno == EINTR ? 0 : -errno;
    for (int i = 0; i < n; i++) {
        struct loop_watch *w = evs[i].data.ptr;
        /* A callback earlier in this batch may have removed w (the object
         * is freed only in before_sleep, so w is still valid). */
        if (!w->added)
            continue;
        const char *name = w->name;
        uint64_t turn = w->turn;
        int fd = w->fd;
        t0 = op_begin(l, name ? name : "an fd", turn);
        w->cb(w, evs[i].events);
        op_end(l, t0, name, turn, fd); /* w may be gone: what it was, copied */
    }
    return n;
}

int loop_run(struct loop *l)
{
    int r = 0;
    while (!l->stop && r == 0) {
        int n = loop_run_once(l, -1);
        if (n < 0) {
            errno = -n;
            PLOG_E("epoll_wait");
            r = n;
        }
    }
    /* Not running, so not stuck: what follows (the fork server's stop,
     * with its own bound) is no stall for the watchdog. */
    set_waiting(l, true);
    return r;
}

void loop_stop(struct loop *l) { l->stop = true; }
