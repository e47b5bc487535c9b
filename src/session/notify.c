/* Counted refusals for one turn (see notify.h). */
#include "session/notify.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/log.h"
#include "sandbox/policy.h"
#include "sandbox/seccomp.h"
#include "sandbox/seccomp_notify.h"
#include "session/flock.h"
#include "session/session.h"

#define SUMMARY_NAMES 12 /* syscalls named in the turn's log line */

static void stop_watching(struct session *s)
{
    loop_unwatch(s->srv->loop, &s->notify_watch);
}

void notify_count_refusal(struct session *s, int nr)
{
    s->refused++;
    if (nr >= 0 && nr < POLICY_NR_MAX) {
        if (!s->refused_by_nr)
            s->refused_by_nr = calloc(POLICY_NR_MAX, sizeof *s->refused_by_nr);
        if (s->refused_by_nr && s->refused_by_nr[nr] < UINT32_MAX)
            s->refused_by_nr[nr]++;
    }
}

static void count(struct session *s, int nr, int pid)
{
    notify_count_refusal(s, nr);
    if (log_min_level() <= LOG_LEVEL_DEBUG) {
        char name[64];
        LOG_D("turn %" PRIu64 ": refused %s (pid %d): %s", s->id,
              nr >= 0 ? policy_syscall_name(nr, name, sizeof name) : "a foreign call", pid,
              strerrorname_np(policy_notify_errno(s->srv->notify, nr)));
    }
}

void notify_listener_failed(struct session *s, int err)
{
    if (s->notify_fd < 0)
        return;
    /* Fail closed: without a holder, counted refusals and supervised calls
     * get ENOSYS. */
    LOG_W("turn %" PRIu64 ": seccomp listener: %s; refused and supervised calls now fail "
          "with ENOSYS and are not counted", s->id, strerror(err));
    stop_watching(s);
    close_and_reset(&s->notify_fd);
    flock_close(s);
}

/* A `supervise`d call: its handler answers it. policy_supervisable() names
 * the syscalls that have one; anything else is refused like a `deny`. */
static int supervise(struct session *s, int nr)
{
    const struct seccomp_notif *req = policy_notify_request(s->srv->notify);
    if (nr == SYS_flock)
        return flock_handle(s, req);
    int r = policy_notify_reply(s->srv->notify, s->notify_fd, req->id, 0,
                                policy_notify_errno(s->srv->notify, nr));
    return r < 0 ? r : 0;
}

static void on_notify(struct loop_watch *w, uint32_t events)
{
    struct session *s = w->ud;
    for (int i = 0; i < NOTIFY_BATCH && s->notify_fd >= 0; i++) {
        int nr, pid;
        int r = policy_notify_answer(s->srv->notify, s->notify_fd, &nr, &pid);
        if (r == POLICY_NOTIFY_NONE)
            return;
        if (r == POLICY_NOTIFY_GONE)
            continue;
        if (r == -EPIPE) { /* no task left under the filter: nothing more will come */
            stop_watching(s);
            return;
        }
        if (r == POLICY_NOTIFY_SUPERVISE)
            r = supervise(s, nr);
        else if (r == POLICY_NOTIFY_ANSWERED)
            count(s, nr, pid);
        if (r < 0) {
            notify_listener_failed(s, -r);
            return;
        }
    }
}

void notify_adopt(struct session *s, int fd)
{
    if (s->notify_fd >= 0 || !s->srv->notify) {
        LOG_W("turn %" PRIu64 ": %s seccomp listener dropped: refused calls fail with ENOSYS "
              "and are not counted", s->id, s->notify_fd >= 0 ? "a second" : "unexpected");
        close(fd);
        return;
    }
    s->notify_fd = fd;
    s->notify_watch = (struct loop_watch){.fd = fd, .cb = on_notify, .ud = s};
    if (loop_watch(s->srv->loop, &s->notify_watch, EPOLLIN) < 0) {
        LOG_W("turn %" PRIu64 ": cannot watch the seccomp listener: refused calls fail with "
              "ENOSYS and are not counted", s->id);
        close_and_reset(&s->notify_fd);
    }
}

struct tally {
    int nr;
    uint32_t n;
};

static int by_count(const void *a, const void *b)
{
    const struct tally *x = a, *y = b;
    if (x->n != y->n)
        return x->n > y->n ? -1 : 1;
    return x->nr - y->nr;
}

static void log_summary(struct session *s)
{
    struct tally top[POLICY_NR_MAX];
    size_t n = 0;
    uint64_t named = 0;
    for (int nr = 0; s->refused_by_nr && nr < POLICY_NR_MAX; nr++)
        if (s->refused_by_nr[nr]) {
            top[n++] = (struct tally){nr, s->refused_by_nr[nr]};
            named += s->refused_by_nr[nr];
        }
    qsort(top, n, sizeof *top, by_count);
    char list[1024];
    size_t len = 0;
    list[0] = '\0';
    for (size_t i = 0; i < n && i < SUMMARY_NAMES && len < sizeof list; i++) {
        char name[64];
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s \u00d7%" PRIu32,
                                i ? ", " : "", policy_syscall_name(top[i].nr, name, sizeof name),
                                top[i].n);
    }
    if ((n > SUMMARY_NAMES || named < s->refused) && len < sizeof list)
        snprintf(list + len, sizeof list - len, "%s\u2026", len ? ", " : "");
    LOG_I("turn %" PRIu64 ": %" PRIu64 " system call%s refused by the policy (%s)", s->id,
          s->refused, s->refused == 1 ? "" : "s", list);
}

void notify_close(struct session *s)
{
    flock_close(s);
    if (s->notify_fd >= 0) {
        stop_watching(s);
        close_and_reset(&s->notify_fd);
        if (!s->refused)
            LOG_D("turn %" PRIu64 ": no system call refused by the policy", s->id);
    }
    if (s->refused)
        log_summary(s);
    s->refused = 0;
    free(s->refused_by_nr);
    s->refused_by_nr = NULL;
}
