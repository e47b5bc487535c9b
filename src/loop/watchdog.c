/* The event loop's watchdog thread (see watchdog.h). Runs in forkboxd. */
#include "loop/watchdog.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/limits.h"
#include "core/log.h"
#include "core/util.h"
#include "loop/loop.h"

static void *watchdog_main(void *arg)
{
    struct loop *l = arg;
    uint64_t last = 0;
    unsigned stuck = 0; /* seconds the loop has been in one call */
    for (;;) {
        struct timespec one = {.tv_sec = 1};
        while (clock_nanosleep(CLOCK_MONOTONIC, 0, &one, &one) == EINTR)
            ;
        bool waiting;
        const char *name;
        uint64_t turn;
        uint64_t p = loop_progress(l, &waiting, &name, &turn);
        if (waiting || p != last) {
            last = p;
            stuck = 0;
            continue;
        }
        stuck++;
        char whose[32] = "";
        if (turn)
            snprintf(whose, sizeof whose, " of turn %" PRIu64, turn);
        if (stuck == LOOP_STUCK_LOG_S)
            LOG_E("the event loop has been stuck for %u s in %s%s: nothing is being served",
                  stuck, name, whose);
        sigset_t pending;
        if (stuck >= LOOP_STUCK_EXIT_S && sigpending(&pending) == 0 &&
            (sigismember(&pending, SIGTERM) || sigismember(&pending, SIGINT))) {
            LOG_E("the event loop has been stuck for %u s in %s%s with a stop signal "
                  "pending: exiting (status 1)", stuck, name, whose);
            /* A moment for the log writer; nothing else is run at exit. */
            struct timespec tenth = {.tv_nsec = 100 * 1000 * 1000};
            nanosleep(&tenth, NULL);
            _exit(1);
        }
    }
    return NULL;
}

int loop_watchdog_start(struct loop *l, char *err, size_t errlen)
{
    return thread_start("forkbox-watch", 64 * 1024, watchdog_main, l, err, errlen);
}
