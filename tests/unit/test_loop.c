/* The event loop sees its own stalls (issue 25, item 5): an iteration that
 * takes LOOP_SLOW_MS or more is logged with the callback and turn that took
 * it and reaches the stats hook (the /metrics histogram); a loop stuck in one
 * call with SIGTERM pending is ended by the watchdog thread. The slow
 * callback is this test's own (a hook that sleeps), compiled in here only. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/limits.h"
#include "core/log.h"
#include "core/util.h"
#include "loop/loop.h"
#include "loop/watchdog.h"
#include "tap.h"

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* The hook: takes its byte and sleeps for as long as its watch's ud says. */
static void slow_cb(struct loop_watch *w, uint32_t events)
{
    (void)events;
    char c;
    (void)!read(w->fd, &c, 1);
    sleep_ms(*(unsigned *)w->ud);
}

static void record(void *ud, uint64_t ns)
{
    uint64_t *max = ud;
    if (ns > *max)
        *max = ns;
}

/* stderr into a pipe for the time of fn; what was written (NUL-terminated). */
static char *capture_stderr(void (*fn)(void))
{
    static char out[8192];
    int p[2], saved = dup(2);
    if (pipe2(p, O_NONBLOCK) < 0)
        return NULL;
    dup2(p[1], 2);
    fn();
    dup2(saved, 2);
    close(saved);
    close(p[1]);
    ssize_t n = read(p[0], out, sizeof out - 1);
    close(p[0]);
    out[n > 0 ? n : 0] = '\0';
    return out;
}

static uint64_t slowest;

static void one_slow_iteration(void)
{
    struct loop *l = loop_new();
    int p[2];
    unsigned ms = LOOP_SLOW_MS + 50;
    if (!l || pipe(p) < 0)
        return;
    struct loop_watch w = {.fd = p[0], .cb = slow_cb, .ud = &ms, .name = "test hook", .turn = 7};
    loop_watch(l, &w, EPOLLIN);
    loop_set_stats(l, record, &slowest);
    (void)!write(p[1], "x", 1);
    loop_run_once(l, 1000); /* runs the hook */
    loop_run_once(l, 0);    /* the iteration ends before the next wait */
    loop_unwatch(l, &w);
    loop_free(l);
    close(p[0]);
    close(p[1]);
}

static void test_slow_iteration(void)
{
    log_init("test", LOG_LEVEL_INFO);
    const char *err = capture_stderr(one_slow_iteration);
    ok(slowest >= (uint64_t)LOOP_SLOW_MS * 1000000ULL, "the stats hook saw the slow iteration "
       "(%llu ms)", (unsigned long long)(slowest / 1000000));
    ok(err && strstr(err, "event loop iteration took "), "a slow iteration is logged");
    ok(err && strstr(err, " ms of it in test hook of turn 7"), "with the callback and the turn");
    if (err && !strstr(err, "test hook"))
        printf("#   stderr: %s\n", err);

    /* A quick iteration is measured and not logged. */
    slowest = 0;
    struct loop *l = loop_new();
    loop_set_stats(l, record, &slowest);
    loop_run_once(l, 0);
    loop_run_once(l, 0);
    ok(slowest > 0 && slowest < (uint64_t)LOOP_SLOW_MS * 1000000ULL, "a quick one is measured");
    loop_free(l);
}

/* A child whose loop is stuck in a callback, with SIGTERM blocked as
 * forkboxd's is (its loop reads signals through a signalfd). */
static void stuck_child(int out_fd)
{
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, NULL);
    dup2(out_fd, 2);
    log_init("test", LOG_LEVEL_INFO);
    struct loop *l = loop_new();
    int p[2];
    unsigned ms = 30000;
    char err[256];
    if (!l || pipe(p) < 0 || loop_watchdog_start(l, err, sizeof err) < 0)
        _exit(99);
    struct loop_watch w = {.fd = p[0], .cb = slow_cb, .ud = &ms, .name = "test hook", .turn = 9};
    loop_watch(l, &w, EPOLLIN);
    (void)!write(p[1], "x", 1);
    loop_run_once(l, 1000); /* 30 s in the hook */
    _exit(0);
}

static void test_watchdog(void)
{
    int p[2];
    if (pipe(p) < 0)
        return;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        stuck_child(p[1]);
    }
    close(p[1]);
    sleep_ms(LOOP_STUCK_LOG_S * 1000 + 1500); /* stuck, and logged as such */
    kill(pid, SIGTERM);
    uint64_t t0 = now_ms(), deadline = t0 + (LOOP_STUCK_EXIT_S + 5) * 1000;
    int status = 0;
    pid_t r = 0;
    while ((r = waitpid(pid, &status, WNOHANG)) == 0 && now_ms() < deadline)
        sleep_ms(50);
    if (r == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    ok(r == pid && WIFEXITED(status) && WEXITSTATUS(status) == 1,
       "a loop stuck with SIGTERM pending exits with status 1 (after %llu ms)",
       (unsigned long long)(now_ms() - t0));
    char out[8192];
    ssize_t n = read(p[0], out, sizeof out - 1);
    out[n > 0 ? n : 0] = '\0';
    close(p[0]);
    ok(strstr(out, "has been stuck for 2 s in test hook of turn 9") != NULL,
       "the stuck loop is logged with what it runs");
    ok(strstr(out, "with a stop signal pending: exiting") != NULL, "and why it exits");
    if (!strstr(out, "exiting"))
        printf("#   stderr: %s\n", out);
}

int main(void)
{
    test_slow_iteration();
    test_watchdog();
    return tap_done();
}
