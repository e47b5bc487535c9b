/* flock(2) for a sandbox, carried out by the supervisor (see flock.h).
 * Runs in forkboxd's event loop; never blocks. */
#include "session/flock.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/seccomp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/util.h"
#include "loop/closer.h"
#include "sandbox/seccomp_notify.h"

#ifndef LOCK_MAND
#define LOCK_MAND 32
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

/* The kernel-internal filesystems where every open object is an inode of
 * its own: a lock there reaches nobody else. Learned once, from objects of
 * our own. */
static struct {
    bool known;
    dev_t pipe, sock, memfd; /* pipefs, sockfs, the internal tmpfs of memfd_create */
} internal;

/* The owner's listener (notify.c): -1 once it was dropped. */
static int listener(const struct flock_state *f)
{
    return *f->turn.listener;
}

/* An answer failed: the owner stops using the listener, and calls
 * flock_close() on us while doing so. */
static void listener_failed(struct flock_state *f, int err)
{
    f->turn.listener_failed(f->turn.owner, err);
}

void flock_init(struct flock_state *f, const struct flock_turn *turn)
{
    *f = (struct flock_state){.turn = *turn};
}

/* st_dev and st_mode without asking the filesystem to revalidate anything:
 * for a network or FUSE filesystem a plain fstat can wait on a server, and
 * this runs in the event loop. */
static int dev_of(int dirfd, const char *path, int flags, dev_t *dev, mode_t *mode)
{
    struct statx stx;
    if (statx(dirfd, path, flags | AT_STATX_DONT_SYNC, STATX_TYPE, &stx) < 0)
        return -errno;
    *dev = makedev(stx.stx_dev_major, stx.stx_dev_minor);
    *mode = stx.stx_mode;
    return 0;
}

static void learn_internal(void)
{
    int p[2], sv[2] = {-1, -1}, m = memfd_create("forkbox-flock", MFD_CLOEXEC);
    mode_t mode;
    if (pipe2(p, O_CLOEXEC) < 0) {
        p[0] = p[1] = -1;
    }
    internal.known = m >= 0 && p[0] >= 0 &&
                     socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0 &&
                     dev_of(p[0], "", AT_EMPTY_PATH, &internal.pipe, &mode) == 0 &&
                     dev_of(sv[0], "", AT_EMPTY_PATH, &internal.sock, &mode) == 0 &&
                     dev_of(m, "", AT_EMPTY_PATH, &internal.memfd, &mode) == 0;
    int fds[] = {p[0], p[1], sv[0], sv[1], m};
    for (size_t i = 0; i < sizeof fds / sizeof *fds; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* The sandbox's scratch tmpfs (/workspace, /tmp and /dev/shm are one; /tmp
 * in every mode) and the FUSE mount of `forkbox sandbox`'s workspace, as the
 * caller's root shows them: found through /proc/PID/root, which the sandbox
 * cannot change (no chroot, no mounts, a read-only root), and confirmed by
 * the request still pending afterwards (so PID was the caller's). Once per
 * turn. 0, -ESRCH if the request is gone, or -errno. */
static int learn_scratch(struct flock_state *f, const struct seccomp_notif *req)
{
    char path[64 + 256];
    mode_t mode;
    dev_t dev, work = (dev_t)-1;
    snprintf(path, sizeof path, "/proc/%d/root/tmp", (int)req->pid);
    int r = dev_of(AT_FDCWD, path, 0, &dev, &mode);
    if (r == 0 && f->turn.workspace) {
        snprintf(path, sizeof path, "/proc/%d/root%s", (int)req->pid, f->turn.workspace);
        r = dev_of(AT_FDCWD, path, 0, &work, &mode);
    }
    if (!policy_notify_valid(listener(f), req->id))
        return -ESRCH;
    if (r < 0)
        return r;
    f->scratch_dev = dev;
    f->work_dev = work;
    f->scratch_known = true;
    return 0;
}

/* Whether a lock on fd can reach nothing but this sandbox: a file on its own
 * scratch tmpfs (/workspace, /tmp, /dev/shm) or on the FUSE mount of its
 * host workspace (kernel-local locks: see flock.h), a pipe, a socket or a
 * memfd.
 * Everything else is shared, or may be: /usr, the /etc files, site dirs and
 * the root (other sandboxes and the host see the same inodes), device nodes
 * (the host's), the anonymous inode behind every eventfd, epoll and timerfd
 * on the host, nsfs, pidfs, procfs, and /tools (the sandbox's own, but
 * nothing needs to lock it). It is an allowlist by the open file's device,
 * so a mount added to the sandbox later is refused until it is listed, and
 * the test is on the open file itself: a path or fd swapped afterwards
 * cannot change what it says. */
static bool lock_is_private(const struct flock_state *f, int fd)
{
    dev_t dev;
    mode_t mode;
    if (dev_of(fd, "", AT_EMPTY_PATH, &dev, &mode) < 0 || S_ISCHR(mode) || S_ISBLK(mode))
        return false;
    if (f->scratch_known && (dev == f->scratch_dev || dev == f->work_dev))
        return true;
    return internal.known &&
           (dev == internal.pipe || dev == internal.sock || dev == internal.memfd);
}

static void log_call(const struct flock_state *f, int pid, int fd, unsigned cmd, const char *what)
{
    if (log_min_level() <= LOG_LEVEL_DEBUG)
        LOG_D("turn %" PRIu64 ": flock(%d, %#x) by pid %d: %s", f->turn.turn_id, fd, cmd, pid,
              what);
}

/* Answer request id; a listener failure is handed to the owner (which stops
 * using the listener). POLICY_NOTIFY_GONE if the caller stopped waiting. */
static int reply(struct flock_state *f, uint64_t id, int err)
{
    if (listener(f) < 0)
        return POLICY_NOTIFY_GONE; /* the listener was dropped: calls get ENOSYS */
    return policy_notify_reply(f->turn.table, listener(f), id, 0, err);
}

/* Try to grant the lock on the caller's open file. 1 granted and answered
 * (or gone), 0 would block, or -errno from flock (answer it). */
static int try_lock(struct flock_state *f, uint64_t id, int fd, unsigned cmd)
{
    if (flock(fd, (int)(cmd | LOCK_NB)) < 0)
        return errno == EWOULDBLOCK ? 0 : -errno;
    int r = reply(f, id, 0);
    /* The caller stopped waiting (a signal) between our lock and the answer.
     * An interrupted flock leaves no lock in the kernel (a conversion has
     * dropped the old one already): do the same, so a program that sees
     * EINTR does not hold a lock it does not know about. */
    if (r == POLICY_NOTIFY_GONE && (cmd & ~(unsigned)LOCK_NB) != LOCK_UN)
        flock(fd, LOCK_UN);
    if (r < 0)
        listener_failed(f, -r);
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
    closer_close(f->w[i].fd, 0);
    f->w[i] = f->w[--f->n];
}

static void on_timer(struct loop_watch *lw, uint32_t events)
{
    (void)events;
    struct flock_state *f = lw->ud;
    uint64_t ticks;
    if (read(f->timer_fd, &ticks, sizeof ticks) < 0 && errno != EAGAIN)
        PLOG_W("turn %" PRIu64 ": flock timer", f->turn.turn_id);
    uint64_t now = now_ms();
    for (unsigned i = 0; i < f->n;) {
        struct flock_wait w = f->w[i]; /* a copy: answering may tear the lot down */
        if (w.due_ms > now) {
            i++;
            continue;
        }
        /* Gone: interrupted by a signal (a restarted call comes back as a
         * new request) or killed. Its lock was never taken. */
        if (!policy_notify_valid(listener(f), w.id)) {
            log_call(f, w.pid, w.caller_fd, w.cmd, "no longer waiting");
            drop(f, i);
            continue;
        }
        int r = try_lock(f, w.id, w.fd, w.cmd);
        if (r == 0) {
            f->w[i].delay_ms = w.delay_ms * 2 > FLOCK_RETRY_MAX_MS ? FLOCK_RETRY_MAX_MS
                                                                   : w.delay_ms * 2;
            f->w[i].due_ms = now + f->w[i].delay_ms;
            i++;
            continue;
        }
        int rr = r < 0 ? reply(f, w.id, -r) : 0;
        if (rr < 0)
            listener_failed(f, -rr);
        if (listener(f) < 0)
            return; /* the listener failed: flock_close() has dropped every call */
        log_call(f, w.pid, w.caller_fd, w.cmd, r > 0 ? "granted after waiting" : strerror(-r));
        drop(f, i);
    }
    arm(f);
}

/* The parking lot, set up at the first park of the turn; NULL if it cannot be. */
static struct flock_state *parking(struct flock_state *f)
{
    if (f->timer_on)
        return f;
    if (!f->w && !(f->w = calloc(FLOCK_MAX_PARKED, sizeof *f->w)))
        return NULL;
    f->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (f->timer_fd < 0)
        return NULL;
    f->timer_watch = (struct loop_watch){.fd = f->timer_fd, .cb = on_timer, .ud = f,
                                         .name = "flock retry timer", .turn = f->turn.turn_id};
    if (loop_watch(f->turn.loop, &f->timer_watch, EPOLLIN) < 0) {
        close(f->timer_fd);
        return NULL;
    }
    f->timer_on = true;
    return f;
}

/* A blocking call that would block: park it, or ENOLCK when the turn has
 * FLOCK_MAX_PARKED waiting already (or no memory for the state). Takes fd. */
static int park(struct flock_state *f, const struct seccomp_notif *req, int fd, unsigned cmd)
{
    if (!parking(f) || f->n >= FLOCK_MAX_PARKED) {
        closer_close(fd, 0);
        log_call(f, (int)req->pid, (int)req->data.args[0], cmd, "too many waiting: ENOLCK");
        int r = reply(f, req->id, ENOLCK);
        return r < 0 ? r : 0;
    }
    f->w[f->n++] = (struct flock_wait){.id = req->id, .fd = fd, .cmd = cmd,
                                       .pid = (int)req->pid,
                                       .caller_fd = (int)req->data.args[0],
                                       .due_ms = now_ms() + FLOCK_RETRY_MIN_MS,
                                       .delay_ms = FLOCK_RETRY_MIN_MS};
    log_call(f, (int)req->pid, (int)req->data.args[0], cmd, "waits");
    arm(f);
    return 0;
}

int flock_handle(struct flock_state *f, const struct seccomp_notif *req)
{
    /* The kernel reads both arguments as unsigned int. */
    unsigned fdnum = (unsigned)req->data.args[0], cmd = (unsigned)req->data.args[1];
    unsigned op = cmd & ~(unsigned)LOCK_NB;
    int pid = (int)req->pid, r;

    /* The kernel's order: the command first, then the fd. LOCK_MAND
     * requests return 0 without looking at the fd (Linux 5.18 removed them;
     * they never conflicted with anything before). */
    if (cmd & LOCK_MAND)
        return (r = reply(f, req->id, 0)) < 0 ? r : 0;
    if (op != LOCK_SH && op != LOCK_EX && op != LOCK_UN)
        return (r = reply(f, req->id, EINVAL)) < 0 ? r : 0;
    if (!internal.known)
        learn_internal();
    if (!f->scratch_known && (r = learn_scratch(f, req)) < 0) {
        if (r == -ESRCH)
            return 0; /* no longer waiting */
        /* Then only pipes, sockets and memfds can be locked this turn. */
        LOG_W("turn %" PRIu64 ": cannot find the sandbox's /workspace: %s; flock on its "
              "files fails with ENOLCK", f->turn.turn_id, strerror(-r));
        f->scratch_known = true;
        f->scratch_dev = f->work_dev = (dev_t)-1; /* matches no file */
    }
    int fd = fdnum > INT32_MAX ? -EBADF
                               : policy_notify_getfd(listener(f), req, (int)fdnum);
    if (fd == -ESRCH)
        return 0; /* no longer waiting: nothing to answer */
    if (fd < 0 && fd != -EBADF) {
        /* pidfd_getfd refused (a kernel before 5.6, an LSM, no fd left):
         * fail closed, the lock is not taken. */
        if (!f->warned)
            LOG_W("turn %" PRIu64 ": cannot fetch the sandbox's fd for flock: %s; flock "
                  "fails with ENOLCK", f->turn.turn_id, errno_reason(-fd));
        f->warned = true;
        return (r = reply(f, req->id, ENOLCK)) < 0 ? r : 0;
    }
    /* O_PATH files cannot be locked (the kernel's flock does not see them). */
    if (fd == -EBADF || (fcntl(fd, F_GETFL) & O_PATH)) {
        closer_close(fd, 0);
        return (r = reply(f, req->id, EBADF)) < 0 ? r : 0;
    }
    if (!lock_is_private(f, fd)) {
        closer_close(fd, 0);
        if (op == LOCK_UN) /* no lock can be held there */
            return (r = reply(f, req->id, 0)) < 0 ? r : 0;
        f->turn.count_refusal(f->turn.owner, SYS_flock);
        log_call(f, pid, (int)fdnum, cmd, "a shared file: ENOLCK");
        return (r = reply(f, req->id, ENOLCK)) < 0 ? r : 0;
    }
    r = try_lock(f, req->id, fd, cmd);
    if (r == 0 && !(cmd & LOCK_NB))
        return park(f, req, fd, op);
    closer_close(fd, 0);
    if (r > 0)
        return 0;
    /* Would block under LOCK_NB (EWOULDBLOCK), or flock's own error. */
    r = reply(f, req->id, r == 0 ? EWOULDBLOCK : -r);
    return r < 0 && r != POLICY_NOTIFY_GONE ? r : 0;
}

void flock_close(struct flock_state *f)
{
    while (f->n)
        drop(f, f->n - 1);
    free(f->w);
    f->w = NULL;
    if (f->timer_on) {
        loop_unwatch(f->turn.loop, &f->timer_watch);
        close(f->timer_fd);
        f->timer_on = false;
    }
    f->warned = false;
    f->scratch_known = false;
}
