/* flock(2) for a sandbox, carried out by the supervisor (see flock.h).
 * Runs in forkboxd's event loop; never blocks. */
#include "session/flock.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/magic.h>
#include <linux/seccomp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/util.h"
#include "sandbox/seccomp.h"
#include "session/notify.h"
#include "session/session.h"

#ifndef LOCK_MAND
#define LOCK_MAND 32 /* ignored by Linux since 5.15; a lock of its own before */
#endif

/* A blocking flock that would have blocked: retried until granted or gone. */
struct flock_wait {
    uint64_t id;       /* the pending notification */
    int fd;            /* owned: the caller's open file, duplicated */
    unsigned cmd;      /* LOCK_SH or LOCK_EX, without LOCK_NB */
    int pid;           /* the caller and its fd number, for the debug log */
    int caller_fd;
    uint64_t due_ms;   /* next attempt */
    unsigned delay_ms; /* current back-off */
};

/* Whether a lock on fd can reach nothing but this sandbox: a file on a
 * writable tmpfs (the sandbox's own scratch, /workspace /tmp /dev/shm, and
 * memfds: every writable tmpfs a sandbox can reach is its own; the shared
 * root and /tools are read-only mounts), a pipe or a socket (an inode each).
 * Everything else is treated as shared: read-only mounts (/usr, /etc, site
 * dirs, the root; also the sandbox's own /tools, which nothing needs to
 * lock), device nodes (the host's), anonymous inodes (one inode behind every
 * eventfd, epoll and timerfd on the host), nsfs, pidfs, procfs. The test is
 * on the open file itself, so a path or fd swapped afterwards cannot change
 * what it says. */
static bool lock_is_private(int fd)
{
    struct stat st;
    struct statfs sf;
    if (fstat(fd, &st) < 0 || fstatfs(fd, &sf) < 0)
        return false;
    if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))
        return false;
    switch ((unsigned long)sf.f_type) {
    case TMPFS_MAGIC:
        return !(sf.f_flags & ST_RDONLY); /* the mount's flag, as the caller opened it */
    case PIPEFS_MAGIC:
    case SOCKFS_MAGIC:
        return true;
    default:
        return false;
    }
}

static void log_call(const struct session *s, int pid, int fd, unsigned cmd, const char *what)
{
    if (log_min_level() <= LOG_LEVEL_DEBUG)
        LOG_D("turn %" PRIu64 ": flock(%d, %#x) by pid %d: %s", s->id, fd, cmd, pid, what);
}

/* Answer request id; a listener failure is handed to notify.c (which stops
 * using the listener). POLICY_NOTIFY_GONE if the caller stopped waiting. */
static int reply(struct session *s, uint64_t id, int err)
{
    if (s->notify_fd < 0)
        return POLICY_NOTIFY_GONE; /* the listener was dropped: calls get ENOSYS */
    return policy_notify_reply(s->srv->notify, s->notify_fd, id, 0, err);
}

/* Try to grant the lock on the caller's open file. 1 granted and answered
 * (or gone), 0 would block, or -errno from flock (answer it). */
static int try_lock(struct session *s, uint64_t id, int fd, unsigned cmd)
{
    if (flock(fd, (int)(cmd | LOCK_NB)) < 0)
        return errno == EWOULDBLOCK ? 0 : -errno;
    int r = reply(s, id, 0);
    /* The caller stopped waiting (a signal) between our lock and the answer.
     * An interrupted flock leaves no lock in the kernel (a conversion has
     * dropped the old one already): do the same, so a program that sees
     * EINTR does not hold a lock it does not know about. */
    if (r == POLICY_NOTIFY_GONE && (cmd & ~(unsigned)LOCK_NB) != LOCK_UN)
        flock(fd, LOCK_UN);
    if (r < 0)
        notify_listener_failed(s, -r);
    return 1;
}

static void disarm(struct flock_state *f)
{
    struct itimerspec its = {0};
    timerfd_settime(f->timer_fd, 0, &its, NULL);
}

static void arm(struct flock_state *f)
{
    if (!f->n) {
        disarm(f);
        return;
    }
    uint64_t due = f->w[0].due_ms, now = now_ms();
    for (unsigned i = 1; i < f->n; i++)
        if (f->w[i].due_ms < due)
            due = f->w[i].due_ms;
    uint64_t ms = due > now ? due - now : 1;
    struct itimerspec its = {.it_value = {.tv_sec = (time_t)(ms / 1000),
                                          .tv_nsec = (long)(ms % 1000) * 1000000L}};
    timerfd_settime(f->timer_fd, 0, &its, NULL);
}

static void drop(struct flock_state *f, unsigned i)
{
    close(f->w[i].fd);
    f->w[i] = f->w[--f->n];
}

static void on_timer(struct loop_watch *lw, uint32_t events)
{
    (void)events;
    struct session *s = lw->ud;
    struct flock_state *f = &s->flock;
    uint64_t ticks;
    if (read(f->timer_fd, &ticks, sizeof ticks) < 0 && errno != EAGAIN)
        PLOG_W("turn %" PRIu64 ": flock timer", s->id);
    uint64_t now = now_ms();
    for (unsigned i = 0; i < f->n && s->notify_fd >= 0;) {
        struct flock_wait *w = &f->w[i];
        if (w->due_ms > now) {
            i++;
            continue;
        }
        /* Gone: interrupted by a signal (a restarted call comes back as a
         * new request) or killed. Its lock was never taken. */
        if (!policy_notify_valid(s->notify_fd, w->id)) {
            log_call(s, w->pid, w->caller_fd, w->cmd, "no longer waiting");
            drop(f, i);
            continue;
        }
        int r = try_lock(s, w->id, w->fd, w->cmd);
        if (r == 0) {
            w->delay_ms = w->delay_ms * 2 > FLOCK_RETRY_MAX_MS ? FLOCK_RETRY_MAX_MS
                                                               : w->delay_ms * 2;
            w->due_ms = now + w->delay_ms;
            i++;
            continue;
        }
        int rr = r < 0 ? reply(s, w->id, -r) : 0;
        if (rr < 0)
            notify_listener_failed(s, -rr);
        log_call(s, w->pid, w->caller_fd, w->cmd, r > 0 ? "granted after waiting" : strerror(-r));
        drop(f, i);
    }
    if (s->notify_fd < 0) {
        flock_close(s); /* the listener is gone: nobody can be answered */
        return;
    }
    arm(f);
}

/* The parking lot, set up at the first park of the turn; NULL if it cannot be. */
static struct flock_state *parking(struct session *s)
{
    struct flock_state *f = &s->flock;
    if (f->timer_on)
        return f;
    if (!f->w && !(f->w = calloc(FLOCK_MAX_PARKED, sizeof *f->w)))
        return NULL;
    f->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (f->timer_fd < 0)
        return NULL;
    f->timer_watch = (struct loop_watch){.fd = f->timer_fd, .cb = on_timer, .ud = s};
    if (loop_watch(s->srv->loop, &f->timer_watch, EPOLLIN) < 0) {
        close(f->timer_fd);
        return NULL;
    }
    f->timer_on = true;
    return f;
}

/* A blocking call that would block: park it, or ENOLCK when the turn has
 * FLOCK_MAX_PARKED waiting already (or no memory for the state). Takes fd. */
static int park(struct session *s, const struct seccomp_notif *req, int fd, unsigned cmd)
{
    struct flock_state *f = parking(s);
    if (!f || f->n >= FLOCK_MAX_PARKED) {
        close(fd);
        log_call(s, (int)req->pid, (int)req->data.args[0], cmd, "too many waiting: ENOLCK");
        int r = reply(s, req->id, ENOLCK);
        return r < 0 ? r : 0;
    }
    f->w[f->n++] = (struct flock_wait){.id = req->id, .fd = fd, .cmd = cmd,
                                       .pid = (int)req->pid,
                                       .caller_fd = (int)req->data.args[0],
                                       .due_ms = now_ms() + FLOCK_RETRY_MIN_MS,
                                       .delay_ms = FLOCK_RETRY_MIN_MS};
    log_call(s, (int)req->pid, (int)req->data.args[0], cmd, "waits");
    arm(f);
    return 0;
}

int flock_handle(struct session *s, const struct seccomp_notif *req)
{
    /* The kernel reads both arguments as unsigned int. */
    unsigned fdnum = (unsigned)req->data.args[0], cmd = (unsigned)req->data.args[1];
    unsigned op = cmd & ~(unsigned)LOCK_NB;
    int pid = (int)req->pid, r;

    /* The kernel's order: the command first, then the fd. */
    if (!(cmd & LOCK_MAND) && op != LOCK_SH && op != LOCK_EX && op != LOCK_UN)
        return (r = reply(s, req->id, EINVAL)) < 0 ? r : 0;
    int fd = fdnum > INT32_MAX ? -EBADF
                               : policy_notify_getfd(s->notify_fd, req, (int)fdnum);
    if (fd == -ESRCH)
        return 0; /* no longer waiting: nothing to answer */
    if (fd < 0 && fd != -EBADF) {
        /* pidfd_getfd refused (a kernel before 5.6, an LSM, no fd left):
         * fail closed, the lock is not taken. */
        if (!s->flock.warned)
            LOG_W("turn %" PRIu64 ": cannot fetch the sandbox's fd for flock: %s; flock "
                  "fails with ENOLCK", s->id, strerror(-fd));
        s->flock.warned = true;
        return (r = reply(s, req->id, ENOLCK)) < 0 ? r : 0;
    }
    /* O_PATH files cannot be locked (the kernel's flock does not see them). */
    if (fd == -EBADF || (fcntl(fd, F_GETFL) & O_PATH)) {
        if (fd >= 0)
            close(fd);
        return (r = reply(s, req->id, EBADF)) < 0 ? r : 0;
    }
    if (!lock_is_private(fd)) {
        close(fd);
        if (op == LOCK_UN && !(cmd & LOCK_MAND)) /* no lock can be held there */
            return (r = reply(s, req->id, 0)) < 0 ? r : 0;
        notify_count_refusal(s, SYS_flock);
        log_call(s, pid, (int)fdnum, cmd, "a shared file: ENOLCK");
        return (r = reply(s, req->id, ENOLCK)) < 0 ? r : 0;
    }
    r = try_lock(s, req->id, fd, cmd);
    if (r == 0 && !(cmd & LOCK_NB))
        return park(s, req, fd, op);
    close(fd);
    if (r > 0)
        return 0;
    /* Would block under LOCK_NB (EWOULDBLOCK), or flock's own error. */
    r = reply(s, req->id, r == 0 ? EWOULDBLOCK : -r);
    return r < 0 && r != POLICY_NOTIFY_GONE ? r : 0;
}

void flock_close(struct session *s)
{
    struct flock_state *f = &s->flock;
    while (f->n)
        drop(f, f->n - 1);
    free(f->w);
    f->w = NULL;
    if (f->timer_on) {
        loop_unwatch(s->srv->loop, &f->timer_watch);
        close(f->timer_fd);
        f->timer_on = false;
    }
    f->warned = false;
}
