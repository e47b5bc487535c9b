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
#include "loop/closer.h"
#include "sandbox/policy.h"
#include "sandbox/seccomp_notify.h"
#include "session/flock.h"
#include "session/metrics.h"

#define SUMMARY_NAMES 12 /* syscalls named in the turn's log line */

static void stop_watching(struct notify_turn *t)
{
    loop_unwatch(t->loop, &t->watch);
}

/* Count one refusal of native syscall nr (for the turn's summary); the
 * caller logs it. */
static void count_refusal(struct notify_turn *t, int nr)
{
    t->refused++;
    metrics_seccomp_refusal(nr);
    if (nr >= 0 && nr < POLICY_NR_MAX) {
        if (!t->refused_by_nr)
            t->refused_by_nr = calloc(POLICY_NR_MAX, sizeof *t->refused_by_nr);
        if (t->refused_by_nr && t->refused_by_nr[nr] < UINT32_MAX)
            t->refused_by_nr[nr]++;
    }
}

static void count(struct notify_turn *t, int nr, int pid)
{
    count_refusal(t, nr);
    if (log_min_level() <= LOG_LEVEL_DEBUG) {
        char name[64];
        LOG_D("turn %" PRIu64 ": refused %s (pid %d): %s", t->turn_id,
              nr >= 0 ? policy_syscall_name(nr, name, sizeof name) : "a foreign call", pid,
              strerrorname_np(policy_notify_errno(t->table, nr)));
    }
}

/* The listener failed with err: warn, stop answering and close it (calls
 * still waiting and any later ones get ENOSYS). Idempotent. */
static void listener_failed(struct notify_turn *t, int err)
{
    if (t->fd < 0)
        return;
    /* Fail closed: without a holder, counted refusals and supervised calls
     * get ENOSYS. */
    LOG_W("turn %" PRIu64 ": seccomp listener: %s; refused and supervised calls now fail "
          "with ENOSYS and are not counted", t->turn_id, strerror(err));
    stop_watching(t);
    closer_close(steal_fd(&t->fd), 0);
    flock_close(&t->flock);
}

/* A `supervise`d call: its handler answers it. policy_supervisable() names
 * the syscalls that have one; anything else is refused like a `deny`. */
static int supervise(struct notify_turn *t, int nr)
{
    const struct seccomp_notif *req = policy_notify_request(t->table);
    if (nr == SYS_flock)
        return flock_handle(&t->flock, req);
    int r = policy_notify_reply(t->table, t->fd, req->id, 0,
                                policy_notify_errno(t->table, nr));
    return r < 0 ? r : 0;
}

static void on_notify(struct loop_watch *w, uint32_t events)
{
    struct notify_turn *t = w->ud;
    for (int i = 0; i < NOTIFY_BATCH && t->fd >= 0; i++) {
        int nr, pid;
        int r = policy_notify_answer(t->table, t->fd, &nr, &pid);
        if (r == POLICY_NOTIFY_NONE)
            return;
        if (r == POLICY_NOTIFY_GONE)
            continue;
        if (r == -EPIPE) { /* no task left under the filter: nothing more will come */
            stop_watching(t);
            return;
        }
        if (r == POLICY_NOTIFY_SUPERVISE)
            r = supervise(t, nr);
        else if (r == POLICY_NOTIFY_ANSWERED)
            count(t, nr, pid);
        if (r < 0) {
            listener_failed(t, -r);
            return;
        }
    }
}

/* flock.c's two reports (struct flock_turn), on the turn that owns it. */
static void flock_refused(void *owner, int nr)
{
    count_refusal(owner, nr);
}

static void flock_listener_failed(void *owner, int err)
{
    listener_failed(owner, err);
}

void notify_turn_init(struct notify_turn *t, uint64_t turn_id, struct loop *loop,
                      struct policy_notify *table)
{
    *t = (struct notify_turn){.turn_id = turn_id, .loop = loop, .table = table, .fd = -1};
    flock_init(&t->flock, &(struct flock_turn){.turn_id = turn_id, .loop = loop,
                                               .table = table, .listener = &t->fd,
                                               .count_refusal = flock_refused,
                                               .listener_failed = flock_listener_failed,
                                               .owner = t});
}

void notify_turn_workspace(struct notify_turn *t, const char *path)
{
    t->flock.turn.workspace = path;
}

void notify_adopt(struct notify_turn *t, int fd)
{
    if (t->fd >= 0 || !t->table) {
        LOG_W("turn %" PRIu64 ": %s seccomp listener dropped: refused calls fail with ENOSYS "
              "and are not counted", t->turn_id, t->fd >= 0 ? "a second" : "unexpected");
        closer_close(fd, 0);
        return;
    }
    t->fd = fd;
    t->watch = (struct loop_watch){.fd = fd, .cb = on_notify, .ud = t,
                                   .name = "seccomp listener", .turn = t->turn_id};
    if (loop_watch(t->loop, &t->watch, EPOLLIN) < 0) {
        LOG_W("turn %" PRIu64 ": cannot watch the seccomp listener: refused calls fail with "
              "ENOSYS and are not counted", t->turn_id);
        closer_close(steal_fd(&t->fd), 0);
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

static void log_summary(struct notify_turn *t)
{
    struct tally top[POLICY_NR_MAX];
    size_t n = 0;
    uint64_t named = 0;
    for (int nr = 0; t->refused_by_nr && nr < POLICY_NR_MAX; nr++)
        if (t->refused_by_nr[nr]) {
            top[n++] = (struct tally){nr, t->refused_by_nr[nr]};
            named += t->refused_by_nr[nr];
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
    if ((n > SUMMARY_NAMES || named < t->refused) && len < sizeof list)
        snprintf(list + len, sizeof list - len, "%s\u2026", len ? ", " : "");
    LOG_I("turn %" PRIu64 ": %" PRIu64 " system call%s refused by the policy (%s)", t->turn_id,
          t->refused, t->refused == 1 ? "" : "s", list);
}

void notify_close(struct notify_turn *t)
{
    flock_close(&t->flock);
    if (t->fd >= 0) {
        stop_watching(t);
        closer_close(steal_fd(&t->fd), 0);
        if (!t->refused)
            LOG_D("turn %" PRIu64 ": no system call refused by the policy", t->turn_id);
    }
    if (t->refused)
        log_summary(t);
    t->refused = 0;
    free(t->refused_by_nr);
    t->refused_by_nr = NULL;
}
