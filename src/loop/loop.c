#include "loop/loop.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "core/log.h"

#define LOOP_MAX_EVENTS 256

struct loop {
    int epfd;
    int timerfd;
    struct loop_watch timer_watch;
    loop_hook_cb tick, before_sleep;
    loop_work_cb work;
    void *tick_ud, *sleep_ud, *work_ud;
    bool stop;
};

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
    l->timer_watch = (struct loop_watch){.fd = l->timerfd, .cb = on_timer, .ud = l};
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

int loop_run_once(struct loop *l, int timeout_ms)
{
    struct epoll_event evs[LOOP_MAX_EVENTS];
    bool busy = l->work && l->work(l->work_ud);
    if (l->before_sleep)
        l->before_sleep(l->sleep_ud);
    if (l->stop)
        return 0;
    int n = epoll_wait(l->epfd, evs, LOOP_MAX_EVENTS, busy ? 0 : timeout_ms);
    if (n < 0)
        return errno == EINTR ? 0 : -errno;
    for (int i = 0; i < n; i++) {
        struct loop_watch *w = evs[i].data.ptr;
        /* A callback earlier in this batch may have removed w (the object
         * is freed only in before_sleep, so w is still valid). */
        if (w->added)
            w->cb(w, evs[i].events);
    }
    return n;
}

int loop_run(struct loop *l)
{
    while (!l->stop) {
        int n = loop_run_once(l, -1);
        if (n < 0) {
            errno = -n;
            PLOG_E("epoll_wait");
            return n;
        }
    }
    return 0;
}

void loop_stop(struct loop *l) { l->stop = true; }
