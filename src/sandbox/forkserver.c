/* Runs in the fork server (forkbox-sandbox.so, never forkboxd): its start-up,
 * loop and pool (see forkserver.h), and starting and feeding its cgroup
 * helper (placer.c). The supervisor's side of the control socket is
 * fsclient.c.
 *
 * Start-up handshake (sync 0): after everything that can fail at start has
 * run (policy compiled, mount plan built, cgroups probed, interpreter
 * initialised), the fork server sends one "ready" record: a struct fs_reply
 * with turn_id 0, pid = its pid, spawn_ns = its start-up time and status 0 or
 * -errno; on failure the same record carries the reason as text after the
 * struct (at most FS_READY_MAX_MSG bytes, not NUL-terminated).
 *
 * Before that, the supervisor's first record on the control socket is the
 * fork server's configuration (config_for_forkserver: a struct config with
 * the supervisor's own settings cleared). It is not on the command line:
 * sandboxes are clones of the fork server and read its argv as their own
 * /proc/self/cmdline, which is therefore only FS_ARGV. */
#include "sandbox/forkserver.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/util.h"
#include "core/log.h"
#include "proto/chan.h"
#include "sandbox/ids.h"
#include "sandbox/cgroups.h"
#include "sandbox/hostfs.h"
#include "sandbox/mounts.h"
#include "sandbox/netns.h"
#include "sandbox/placer.h"
#include "sandbox/probe.h"
#include "sandbox/seccomp.h"
#include "sandbox/spawn.h"

static void reap_blocking(pid_t pid, int *status)
{
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
}

/* One pooled sandbox: isolated, warming up or warm, waiting for a turn. */
struct pool_slot {
    pid_t pid;
    int chan_fd;       /* owned until hand-off */
    int pidfd;         /* owned until hand-off */
    int warm_fd;       /* owned while the warm-up runs; -1 once warm */
    uint64_t born_ns;  /* clone time */
    uint64_t spawn_ns; /* our side of the spawn */
};

struct forkserver {
    const struct config *cfg;    /* borrowed */
    struct sbx_ids *ids;         /* owned: host ids of live sandboxes, pooled ones too */
    int ctl_fd;                  /* borrowed (fd 3) */
    int sig_fd;                  /* owned: signalfd for SIGCHLD */
    struct sbx_plan plan;
    struct sbx_policy *policy;   /* owned */
    struct sbx_cgroups *cgroups; /* owned */
    struct mount_plan *mounts;   /* owned */
    struct netns_spares *netns;  /* owned: network namespaces made ahead (isolating only) */
    uint64_t netns_after_ns;     /* no spare made before this (after a failure) */
    struct sbx_child *kids;      /* owned: live (unreaped) sandboxes, pooled ones too */
    size_t nkids, capkids;
    struct pool_slot *pool;      /* owned: cfg->pool_size slots, oldest first */
    size_t npool;
    unsigned pool_failures;      /* consecutive failed refills / pooled deaths */
    uint64_t refill_after_ns;    /* back-off after a failure */
    uint64_t quiet_until_ns;     /* last request + POOL_QUIET_US */
    struct pollfd *pfd;          /* owned: ctl, signalfd, one per warming pooled child */
    int placer_fd;               /* owned: SEQPACKET to the cgroup helper */
    pid_t placer_pid;
    uint32_t stream_id;          /* stream mode (cfg->workdir): the one sandbox's host id */
    struct hostfs hostfs;        /* stream mode: the workspace's FUSE server (hostfs.h) */
};

#define POOL_BACKOFF_MIN_MS 10
#define POOL_BACKOFF_MAX_MS 5000
/* While the pool still holds a sandbox, a refill waits until no request came
 * for this long: a clone (1-3 ms of our time) and the new sandbox's set-up
 * would otherwise compete for the CPU with the turn just handed out (which
 * is then reading its tools), and delay the next request of a burst.
 * Measured: request -> ready p50 2.2 ms without, 0.5 ms with. An empty pool
 * refills at once (between requests): the next request would be fresh. */
#define POOL_QUIET_US 5000
/* Network namespaces kept made (netns.h): ~350 us each here, ~30-180 KB of
 * kernel memory. Bursts beyond them make theirs on the spot, as the clone
 * did. Stream mode's one sandbox takes the one made at start. */
#define NETNS_SPARES 4
#define NETNS_RETRY_MS 1000


static int send_ready(int ctl_fd, int status, uint64_t start_ns, const char *msg)
{
    struct {
        struct fs_reply rep;
        char msg[FS_READY_MAX_MSG];
    } rec = {.rep = {.status = status, .pid = getpid(), .turn_id = 0, .spawn_ns = start_ns}};
    size_t len = msg ? strnlen(msg, sizeof rec.msg) : 0;
    if (len)
        memcpy(rec.msg, msg, len);
    ssize_t n;
    do
        n = send(ctl_fd, &rec, sizeof rec.rep + len, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : 0;
}

/* The reason goes to the supervisor, which prints it as forkboxd's one line
 * on stderr; logged here too only if it cannot get there. */
_Noreturn static void fail_start(int ctl_fd, int status, const char *msg)
{
    if (send_ready(ctl_fd, status < 0 ? status : -EINVAL, 0, msg) < 0)
        LOG_E("not starting: %s", msg);
    _exit(1);
}

static int count_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -errno;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

static int send_reply(int ctl_fd, const struct fs_reply *rep, int chan_fd, int pidfd)
{
    const int fds[2] = {chan_fd, pidfd};
    ssize_t n = fd_send(ctl_fd, rep, sizeof *rep, fds, rep->status == 0 ? 2 : 0, 0);
    return n < 0 ? (int)n : 0;
}

static int kids_reserve(struct forkserver *fsv)
{
    return GROW_ARRAY(fsv->kids, &fsv->capkids, fsv->nkids + 1, 64, SIZE_MAX);
}

/* --- the cgroup helper (placer.c): starting it and queueing its work --- */

static int placer_start(struct forkserver *fsv, char *err, size_t errlen)
{
    int fd = -1;
    /* The helper sends death reports on the control socket (fd 4 there):
     * a copy above the fds fork_helper uses. */
    int ctl_copy = fcntl(fsv->ctl_fd, F_DUPFD_CLOEXEC, 10);
    if (ctl_copy < 0) {
        int e = errno;
        return err_fmt(err, errlen, -e, "cgroup helper: dup: %s", strerror(e));
    }
    pid_t pid = fork_helper("cgroup helper", &fd, err, errlen);
    if (pid < 0) {
        close(ctl_copy);
        return pid;
    }
    if (pid == 0) {
        /* Keep stdio (the log), our socket and the control socket's copy. */
        if (dup2(ctl_copy, 4) < 0)
            _exit(127);
        close_range(5, ~0u, 0);
        log_init("forkserver/cgroups", fsv->cfg->log_level);
        placer_main(fsv->cfg, fsv->cgroups, 3, 4);
    }
    close(ctl_copy);
    fsv->placer_fd = fd;
    fsv->placer_pid = pid;
    return 0;
}

/* Queue one request for the helper (blocking: it drains its queue quickly).
 * The helper is part of us: if it is gone, stop. */
_Noreturn static void shutdown_all(struct forkserver *fsv, int code);

static void placer_send(struct forkserver *fsv, const struct placer_req *reqp, int go_fd)
{
    struct placer_req req = *reqp;
    ssize_t n = fd_send(fsv->placer_fd, &req, sizeof req, &go_fd, go_fd >= 0 ? 1 : 0, 0);
    if (n != (ssize_t)sizeof req) {
        PLOG_E("the cgroup helper is gone");
        if (go_fd >= 0)
            close(go_fd);
        shutdown_all(fsv, 1);
    }
}

/* Spawn one sandbox (fresh or pooled) as a host id of its own: clone and maps
 * here, cgroups and the release by the helper. Same contract as sbx_spawn();
 * the id goes back when the sandbox has been reaped (reap), or here if no
 * process was made. */
static int spawn_one(struct forkserver *fsv, unsigned flags, struct sbx_child *c, char *err,
                     size_t errlen)
{
    uint32_t id;
    int r = ids_take(fsv->ids, &id);
    if (r < 0) {
        *c = (struct sbx_child){.pidfd = -1, .chan_fd = -1, .warm_fd = -1, .go_fd = -1,
                                .times_fd = -1};
        return err_fmt(err, errlen, FS_NO_FREE_ID, "no free host id: all %zu of --id-range are "
                       "held by sandboxes not yet reaped", ids_live(fsv->ids));
    }
    /* Stream mode: one sandbox, as the id its workdir's bind maps to. */
    if (fsv->cfg->workdir[0] && fsv->cfg->isolate && id != fsv->stream_id) {
        ids_put(fsv->ids, id);
        *c = (struct sbx_child){.pidfd = -1, .chan_fd = -1, .warm_fd = -1, .go_fd = -1,
                                .times_fd = -1};
        return err_fmt(err, errlen, -EAGAIN, "stream mode runs one sandbox");
    }
    r = sbx_spawn(&fsv->plan, id, flags | SBX_SPAWN_DEFER_GO, c, err, errlen);
    if (r < 0 && c->pid <= 0)
        ids_put(fsv->ids, id);
    if (r == 0) {
        placer_send(fsv, &(struct placer_req){.op = PLACER_ATTACH, .pid = c->pid}, c->go_fd);
        close_and_reset(&c->go_fd);
    }
    return r;
}

/* --- the pool --------------------------------------------------------------
 *
 * Up to cfg->pool_size sandboxes wait fully isolated (every step done, seccomp
 * loaded, init running, the runtime warmed up) for their tools archive, i.e.
 * exactly where a fresh sandbox is when it starts reading the channel. A
 * spawn request takes the oldest warm one (else the oldest) at once; only an
 * empty pool makes it wait for a fresh clone. A pooled sandbox serves one
 * turn, like any other: nothing is ever reused.
 *
 * Refills happen one sandbox at a time and only while no request is pending:
 * before each one the control socket is polled with timeout 0, so a request
 * never waits behind more than the refill already under way (a clone and the
 * id maps, 1-3 ms; the cgroup placement is the helper's, below). While the
 * pool is not empty, a refill also waits for 5 ms without requests
 * (POOL_QUIET_US). Under sustained load the pool therefore runs down to one
 * sandbox or none, requests beyond it are served fresh, in order, and it
 * fills again in the first pause. A pooled sandbox that dies unused (killed from outside, a
 * failed step) is reaped and replaced; repeated failures back off
 * exponentially (10 ms .. 5 s) and a sandbox that gets warm resets that. */

static void pool_slot_close(struct pool_slot *sl)
{
    close_and_reset(&sl->chan_fd);
    close_and_reset(&sl->pidfd);
    close_and_reset(&sl->warm_fd);
}

static void pool_remove(struct forkserver *fsv, size_t i)
{
    memmove(&fsv->pool[i], &fsv->pool[i + 1], (fsv->npool - i - 1) * sizeof *fsv->pool);
    fsv->npool--;
}

static void pool_failed(struct forkserver *fsv)
{
    unsigned shift = fsv->pool_failures < 16 ? fsv->pool_failures : 16;
    uint64_t ms = (uint64_t)POOL_BACKOFF_MIN_MS << shift;
    if (ms > POOL_BACKOFF_MAX_MS)
        ms = POOL_BACKOFF_MAX_MS;
    fsv->pool_failures++;
    fsv->refill_after_ns = now_ns() + ms * 1000000ull;
}

/* A pooled sandbox that failed a setup step wrote a `log` frame saying why
 * before it exited: show it (it has run no user code, and we only print). */
static void pool_log_death(struct pool_slot *sl, int status)
{
    char buf[CHAN_HDR_LEN + 600];
    ssize_t n = sl->chan_fd >= 0 ? recv(sl->chan_fd, buf, sizeof buf - 1, MSG_DONTWAIT) : -1;
    const char *why = "";
    if (n > CHAN_HDR_LEN && buf[0] == CHAN_FRAME) {
        buf[n] = '\0';
        for (char *p = buf + CHAN_HDR_LEN; *p; p++)
            if ((unsigned char)*p < 0x20)
                *p = ' ';
        why = buf + CHAN_HDR_LEN;
    }
    LOG_W("pool: sandbox %d died unused (%s %d)%s%s", (int)sl->pid,
          WIFSIGNALED(status) ? "signal" : "status",
          WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), *why ? ": " : "", why);
}

static void pool_refill_one(struct forkserver *fsv)
{
    struct sbx_child c;
    char err[256] = "";
    if (kids_reserve(fsv) < 0) {
        pool_failed(fsv);
        return;
    }
    int r = spawn_one(fsv, SBX_SPAWN_POOLED, &c, err, sizeof err);
    if (r < 0) {
        if (fsv->pool_failures == 0 || fsv->pool_failures % 16 == 0)
            LOG_W("pool: spawn failed (%u in a row): %s", fsv->pool_failures + 1, err);
        pool_failed(fsv);
        close_and_reset(&c.chan_fd);
        close_and_reset(&c.pidfd);
        close_and_reset(&c.warm_fd);
        if (c.pid > 0 || c.turn_dir)
            fsv->kids[fsv->nkids++] = c;
        return;
    }
    fsv->pool[fsv->npool++] = (struct pool_slot){
        .pid = c.pid, .chan_fd = c.chan_fd, .pidfd = c.pidfd, .warm_fd = c.warm_fd,
        .born_ns = now_ns() - c.spawn_ns, .spawn_ns = c.spawn_ns};
    c.chan_fd = c.pidfd = c.warm_fd = -1; /* the slot owns them until hand-off */
    fsv->kids[fsv->nkids++] = c;
    LOG_D("pool: sandbox %d spawned in %llu us (%zu/%u)", (int)c.pid,
          (unsigned long long)(c.spawn_ns / 1000), fsv->npool, fsv->cfg->pool_size);
}

/* The warm socket of slot i is readable: one byte = warm; EOF = it died or
 * gave up warming (then the reaper hears about it). */
static void pool_note_warm(struct forkserver *fsv, struct pool_slot *sl)
{
    char c = 0;
    ssize_t n = recv(sl->warm_fd, &c, 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    close_and_reset(&sl->warm_fd);
    if (n == 1) {
        fsv->pool_failures = 0;
        LOG_D("pool: sandbox %d warm %llu us after its clone", (int)sl->pid,
              (unsigned long long)((now_ns() - sl->born_ns) / 1000));
    }
}

/* Take a live pooled sandbox: the oldest warm one, else the oldest. */
static bool pool_take(struct forkserver *fsv, struct pool_slot *out)
{
    for (size_t i = 0; i < fsv->npool; i++)
        if (fsv->pool[i].warm_fd >= 0)
            pool_note_warm(fsv, &fsv->pool[i]);
    while (fsv->npool) {
        size_t pick = 0;
        for (size_t i = 0; i < fsv->npool; i++) {
            if (fsv->pool[i].warm_fd < 0) {
                pick = i;
                break;
            }
        }
        struct pool_slot sl = fsv->pool[pick];
        pool_remove(fsv, pick);
        /* Died meanwhile (its SIGCHLD not handled yet)? The reaper releases
         * it; the turn gets another one. */
        struct pollfd p = {.fd = sl.pidfd, .events = POLLIN};
        if (poll(&p, 1, 0) != 0) {
            pool_slot_close(&sl);
            pool_failed(fsv);
            continue;
        }
        *out = sl;
        return true;
    }
    return false;
}

/* A sandbox was handed to a turn of tenant: tell the cgroup helper (CPU
 * weight, the tenant's cgroup). */
static void serving(struct forkserver *fsv, pid_t pid, uint32_t tenant)
{
    if (fsv->placer_fd >= 0)
        placer_send(fsv, &(struct placer_req){.op = PLACER_SERVING, .pid = pid, .tenant = tenant},
                    -1);
}

static void handle_spawn(struct forkserver *fsv, const struct fs_request *req)
{
    struct fs_reply rep = {.turn_id = req->turn_id};
    uint64_t t0 = now_ns();
    struct pool_slot sl;
    if (pool_take(fsv, &sl)) {
        for (size_t i = 0; i < fsv->nkids; i++)
            if (fsv->kids[i].pid == sl.pid)
                fsv->kids[i].turn_id = req->turn_id;
        /* If it is still warming up, it finds our end closed: fine. */
        bool warm = sl.warm_fd < 0;
        close_and_reset(&sl.warm_fd);
        rep.pid = sl.pid;
        rep.spawn_ns = now_ns() - t0;
        int sr = send_reply(fsv->ctl_fd, &rep, sl.chan_fd, sl.pidfd);
        if (sr < 0) {
            errno = -sr;
            PLOG_E("reply for turn %llu", (unsigned long long)req->turn_id);
            kill(sl.pid, SIGKILL); /* reaped and released on SIGCHLD */
        } else {
            serving(fsv, sl.pid, req->tenant);
        }
        LOG_D("turn %llu: pooled sandbox %d (%s, %llu ms old) in %llu us",
              (unsigned long long)req->turn_id, (int)sl.pid, warm ? "warm" : "still warming up",
              (unsigned long long)((t0 - sl.born_ns) / 1000000),
              (unsigned long long)(rep.spawn_ns / 1000));
        pool_slot_close(&sl);
        return;
    }

    if (kids_reserve(fsv) < 0) {
        rep.status = -ENOMEM;
        send_reply(fsv->ctl_fd, &rep, -1, -1);
        return;
    }
    struct sbx_child c;
    char err[256] = "";
    int r = spawn_one(fsv, 0, &c, err, sizeof err);
    rep.status = r;
    rep.pid = c.pid;
    rep.spawn_ns = c.spawn_ns;
    if (r < 0)
        LOG_W("turn %llu: spawn failed: %s", (unsigned long long)req->turn_id, err);
    else
        LOG_D("turn %llu: sandbox %d in %llu us", (unsigned long long)req->turn_id, (int)c.pid,
              (unsigned long long)(c.spawn_ns / 1000));
    int sr = send_reply(fsv->ctl_fd, &rep, c.chan_fd, c.pidfd);
    if (c.times)
        steptime_mark_rec(c.times, ST_P_HANDOFF);
    if (sr < 0 && r == 0) {
        errno = -sr;
        PLOG_E("reply for turn %llu", (unsigned long long)req->turn_id);
        kill(c.pid, SIGKILL); /* nobody will talk to it */
    } else if (r == 0) {
        serving(fsv, c.pid, req->tenant);
    }
    /* Handed off (or failed): our copies go, so no later sandbox inherits
     * them and the supervisor alone decides when the channel closes. */
    close_and_reset(&c.chan_fd);
    close_and_reset(&c.pidfd);
    c.turn_id = r == 0 ? req->turn_id : 0;
    if (c.pid > 0 || c.turn_dir)
        fsv->kids[fsv->nkids++] = c; /* reaped and released on SIGCHLD */
}

/* One step: " name=WALL/CPU/FAULTS" (us, us, count) since the mark prev. */
static void step_time(char *line, size_t len, size_t *off, const char *name,
                      const struct steptime_rec *r, int m, const struct steptime_rec *rp,
                      int prev)
{
    /* Signed: a child can run before clone() returns in the fork server. */
    int64_t wall = prev < 0 ? 0 : (int64_t)r->wall[m] - (int64_t)rp->wall[prev];
    if (wall < 0)
        wall = 0;
    int64_t cpu = (int64_t)r->cpu[m] - (rp == r && prev >= 0 ? (int64_t)rp->cpu[prev] : 0);
    int64_t flt = (int64_t)r->flt[m] - (rp == r && prev >= 0 ? (int64_t)rp->flt[prev] : 0);
    if (prev < 0 && rp == r)
        cpu = flt = 0;
    if (*off < len)
        *off += (size_t)snprintf(line + *off, len - *off, " %s=%.1f/%.1f/%lld", name,
                                 (double)wall / 1e3, (double)cpu / 1e3, (long long)flt);
}

/* --step-times: one debug line per fresh sandbox, when it is reaped: each
 * step's wall time, CPU time and page faults since the mark before it in the
 * same process (core/steptime.h), the child's from its record (if it sent
 * one: it did if its first block ended; its first step, from the return of
 * clone() in the fork server, as the floor's child_start), then its exit:
 * the wall time from the first block's
 * snapshot to the reap. Its CPU is not known: killing a pid namespace's init
 * reaps the runtime without adding its CPU to init's rusage. */
static void log_step_times(const struct sbx_child *c)
{
    struct steptime_rec rec;
    ssize_t n = read(c->times_fd, &rec, sizeof rec);
    if (n != (ssize_t)sizeof rec)
        memset(&rec, 0, sizeof rec);
    const struct steptime_rec *pt = c->times;
    char line[1600];
    size_t off = 0;
    int prev = -1;
    for (int m = 0; m < ST_C_START; m++) {
        if (!pt->wall[m])
            continue;
        step_time(line, sizeof line, &off, steptime_names[m], pt, m, pt, prev);
        prev = m;
    }
    prev = -1;
    for (int m = ST_C_START; m < ST_N; m++) {
        if (!rec.wall[m])
            continue;
        if (prev < 0)
            step_time(line, sizeof line, &off, steptime_names[m], &rec, m, pt, ST_P_CLONED);
        else
            step_time(line, sizeof line, &off, steptime_names[m], &rec, m, &rec, prev);
        prev = m;
    }
    if (prev >= 0 && off < sizeof line)
        snprintf(line + off, sizeof line - off, " exit=%.1f/nan/0",
                 (double)(now_ns() - rec.wall[prev]) / 1e3);
    LOG_D("sandbox %d steps:%s", (int)c->pid, off ? line : " none");
}

/* No zombies, ever: reap everything that has exited and release what each
 * sandbox held (cgroups, non-isolated turn dirs). A pooled sandbox that
 * exited unused leaves the pool (and is replaced by the refill). */
static void reap(struct forkserver *fsv)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            return;
        for (size_t i = 0; i < fsv->npool; i++) {
            if (fsv->pool[i].pid != pid)
                continue;
            pool_log_death(&fsv->pool[i], status);
            pool_slot_close(&fsv->pool[i]);
            pool_remove(fsv, i);
            pool_failed(fsv);
            break;
        }
        if (pid == fsv->placer_pid) {
            LOG_E("the cgroup helper exited (status 0x%x)", (unsigned)status);
            fsv->placer_pid = 0;
            shutdown_all(fsv, 1);
        }
        if (pid == fsv->hostfs.pid) {
            LOG_E("the workspace's server exited (status 0x%x)", (unsigned)status);
            fsv->hostfs.pid = 0;
            shutdown_all(fsv, 1);
        }
        for (size_t i = 0; i < fsv->nkids; i++) {
            if (fsv->kids[i].pid != pid)
                continue;
            /* Handed to a turn: the helper reports its death to the
             * supervisor, which says why the turn ended. */
            struct placer_req req = {.op = PLACER_RELEASE, .pid = pid};
            if (fsv->kids[i].turn_id) {
                req.op = PLACER_RELEASE_REPORT;
                req.turn_id = fsv->kids[i].turn_id;
                req.wait_status = status;
            }
            placer_send(fsv, &req, -1);
            if (fsv->kids[i].times)
                log_step_times(&fsv->kids[i]);
            /* Reaped: its whole pid namespace is gone (init's exit waits for
             * the rest), so the id is free again. */
            ids_put(fsv->ids, fsv->kids[i].id);
            sbx_child_release(&fsv->plan, &fsv->kids[i]); /* plan.cgroups is NULL */
            fsv->kids[i] = fsv->kids[--fsv->nkids];
            break;
        }
    }
}

_Noreturn static void shutdown_all(struct forkserver *fsv, int code)
{
    static bool once;
    if (once)
        _exit(code); /* the helper vanished while we were shutting down */
    once = true;
    for (size_t i = 0; i < fsv->npool; i++)
        pool_slot_close(&fsv->pool[i]);
    fsv->npool = 0;
    for (size_t i = 0; i < fsv->nkids; i++)
        if (fsv->kids[i].pid > 0)
            kill(fsv->kids[i].pid, SIGKILL);
    while (fsv->nkids) {
        struct sbx_child *c = &fsv->kids[fsv->nkids - 1];
        int status;
        if (c->pid > 0) {
            reap_blocking(c->pid, &status);
            if (fsv->placer_pid > 0)
                placer_send(fsv, &(struct placer_req){.op = PLACER_RELEASE, .pid = c->pid}, -1);
        }
        sbx_child_release(&fsv->plan, c);
        fsv->nkids--;
    }
    /* The workspace's server: no sandbox uses it now. */
    close_and_reset(&fsv->hostfs.sock);
    if (fsv->hostfs.pid > 0) {
        int status;
        kill(fsv->hostfs.pid, SIGKILL);
        reap_blocking(fsv->hostfs.pid, &status);
    }
    /* The helper removes the cgroups queued above, then sees EOF. */
    close_and_reset(&fsv->placer_fd);
    if (fsv->placer_pid > 0) {
        int status;
        reap_blocking(fsv->placer_pid, &status);
    }
    _exit(code);
}

/* Handle every request already queued on the control socket. false when the
 * supervisor is gone. */
static bool handle_requests(struct forkserver *fsv)
{
    for (;;) {
        struct fs_request req = {0};
        ssize_t n = recv(fsv->ctl_fd, &req, sizeof req, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return true;
        if (n <= 0)
            return false;
        if ((size_t)n != sizeof req || req.op != FS_OP_SPAWN) {
            LOG_E("bad control record (%zd bytes, op %u)", n, (unsigned)req.op);
            struct fs_reply rep = {.status = -EPROTO, .turn_id = req.turn_id};
            send_reply(fsv->ctl_fd, &rep, -1, -1);
            continue;
        }
        handle_spawn(fsv, &req);
        fsv->quiet_until_ns = now_ns() + POOL_QUIET_US * 1000ull;
    }
}

/* When the next refill may start (see POOL_QUIET_US). */
static uint64_t refill_time(const struct forkserver *fsv)
{
    uint64_t t = fsv->refill_after_ns;
    if (fsv->npool > 0 && fsv->quiet_until_ns > t)
        t = fsv->quiet_until_ns;
    return t;
}

/* When the next network namespace may be made, UINT64_MAX if none is due:
 * as the pool, at once while there is no spare left (the next spawn would
 * make it), else once requests have been quiet. */
static uint64_t netns_time(const struct forkserver *fsv)
{
    if (!fsv->netns || netns_spares_ready(fsv->netns) >= netns_spares_max(fsv->netns))
        return UINT64_MAX;
    uint64_t t = fsv->netns_after_ns;
    if (netns_spares_ready(fsv->netns) > 0 && fsv->quiet_until_ns > t)
        t = fsv->quiet_until_ns;
    return t;
}

static void netns_refill_one(struct forkserver *fsv)
{
    char err[256];
    if (netns_refill(fsv->netns, err, sizeof err) == 0) {
        fsv->netns_after_ns = 0;
        return;
    }
    if (!fsv->netns_after_ns)
        LOG_W("%s (spawns make theirs as they go; retrying every %d ms)", err, NETNS_RETRY_MS);
    fsv->netns_after_ns = now_ns() + NETNS_RETRY_MS * 1000000ull;
}

static bool request_pending(int ctl_fd)
{
    struct pollfd p = {.fd = ctl_fd, .events = POLLIN};
    return poll(&p, 1, 0) != 0;
}

/* The configuration the supervisor sends first (see the top). The record
 * must be exactly one struct config: forkboxd and forkbox-sandbox.so are built
 * together from one tree (a size mismatch means they were not). */
static void recv_config(int ctl_fd, struct config *cfg)
{
    ssize_t n;
    do
        n = recv(ctl_fd, cfg, sizeof *cfg, MSG_TRUNC);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof *cfg)
        fail_start(ctl_fd, n < 0 ? -errno : -EPROTO,
                   "no configuration from the supervisor on the control socket");
}

_Noreturn void forkserver_main(int ctl_fd)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    static struct config config; /* ours for good: sandboxes see it in their copy of us */
    recv_config(ctl_fd, &config);
    const struct config *cfg = &config;
    log_init("forkserver", cfg->log_level);
    /* Our stderr is the supervisor's: the same format, and the same verdict
     * on the journal (we are exec'd without $JOURNAL_STREAM). */
    log_set_format(cfg->log_format, cfg->log_journal);
    char err[FS_READY_MAX_MSG];

    /* Die with the supervisor, and make sure it had not died already: its
     * pid is the control socket's peer. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
        _exit(1);
    struct ucred peer;
    socklen_t plen = sizeof peer;
    if (getsockopt(ctl_fd, SOL_SOCKET, SO_PEERCRED, &peer, &plen) < 0 || getppid() != peer.pid)
        _exit(1);
    umask(022);
    /* Before the cgroup helper and every sandbox, which start from ours:
     * above the supervisor's, below the sandboxes' (core/limits.h). */
    int r = oom_score_adj_set(OOM_ADJ_FORKSERVER, false);
    if (r < 0)
        LOG_D("oom_score_adj not set to %d: %s", OOM_ADJ_FORKSERVER, strerror(-r));

    struct forkserver fsv = {.cfg = cfg, .ctl_fd = ctl_fd, .sig_fd = -1, .placer_fd = -1,
                             .hostfs = {.sock = -1}};

    /* Supplementary groups would follow every sandbox (it cannot drop them:
     * setgroups is denied inside), and ours as root include gid 0. */
    if (geteuid() == 0 && setgroups(0, NULL) < 0)
        fail_start(ctl_fd, -errno, "setgroups(0): cannot drop supplementary groups");

    if (cfg->isolate && geteuid() != 0)
        fail_start(ctl_fd, -EPERM,
                   "isolation needs root (to map the sandbox ids); use --no-isolation "
                   "for benchmarks only");

    /* The host ids sandboxes run as: a range no host user has (config.c
     * refused ranges with root, nobody or too few ids in them). */
    r = geteuid() == 0 ? ids_check_host("/etc", cfg->id_first, cfg->id_count, err, sizeof err)
                           : 0;
    if (r < 0)
        fail_start(ctl_fd, r, err);
    if (ids_new(cfg->id_first, cfg->id_count, &fsv.ids) < 0)
        fail_start(ctl_fd, -ENOMEM, "out of memory for the id range");

    /* Fail closed: what isolation needs is tried once here, in throwaway
     * children (probe.c), so that a host without it stops forkboxd at start
     * with one line instead of failing every turn. The kernel's seccomp
     * first: a kernel without it would otherwise show as a policy error. */
    if (cfg->isolate && ((r = probe_seccomp_kernel(err, sizeof err)) < 0 ||
                         (r = probe_userns(cfg->id_first, err, sizeof err)) < 0))
        fail_start(ctl_fd, r, err);

    /* Policy errors stop forkboxd at start, isolated or not. The path is a
     * host path and nothing needs it again: every sandbox reads our memory. */
    r = policy_load(cfg->policy_file, &fsv.policy, err, sizeof err);
    if (r < 0)
        fail_start(ctl_fd, r, err);
    if (cfg->isolate && (r = probe_seccomp_policy(fsv.policy, err, sizeof err)) < 0)
        fail_start(ctl_fd, r, err);
    explicit_bzero(config.policy_file, sizeof config.policy_file);
    /* Stream mode (`forkbox sandbox`): one sandbox, whose host id is known
     * now, served its workspace (the host's directory) by a helper of its
     * own, forked before the interpreter imports anything (hostfs.h). */
    if (cfg->workdir[0]) {
        fsv.stream_id = cfg->isolate ? ids_next(fsv.ids) : 0;
        r = mounts_make_workdir(cfg->workdir, err, sizeof err);
        if (r < 0)
            fail_start(ctl_fd, r, err);
    }
    if (cfg->isolate) {
        r = mounts_prepare(cfg, &fsv.mounts, err, sizeof err);
        if (r < 0)
            fail_start(ctl_fd, r, err);
    }
    if (cfg->isolate && cfg->workdir[0]) {
        int tree;
        r = hostfs_start(cfg, fsv.stream_id, &fsv.hostfs, &tree, err, sizeof err);
        if (r < 0)
            fail_start(ctl_fd, r, err);
        mounts_set_workspace(fsv.mounts, tree);
    }
    r = cgroups_init(cfg, &fsv.cgroups, err, sizeof err);
    if (r < 0)
        fail_start(ctl_fd, r, err);

    /* We stop when the supervisor closes the control socket (or dies): a
     * stop signal sent to the whole process group is the supervisor's to
     * handle, and would otherwise cut our orderly shutdown short. Sandboxes
     * reset both (step 1). */
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);

    /* Before the interpreter exists: the helper stays small. */
    r = placer_start(&fsv, err, sizeof err);
    if (r < 0)
        fail_start(ctl_fd, r, err);

    pid_t *tid_addr = NULL;
    r = sbx_tid_probe(&tid_addr);
    if (r < 0)
        LOG_W("glibc's cached thread id not found (%s): sandboxes use the slower fork path",
              r == -EEXIST ? "ambiguous" : strerror(-r));

    /* Block SIGCHLD for the signalfd before any child can exist. */
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &chld, NULL) < 0 ||
        (fsv.sig_fd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC)) < 0) {
        snprintf(err, sizeof err, "signalfd: %s", strerror(errno));
        fail_start(ctl_fd, -errno, err);
    }

    if (sbx_runtime_init(cfg, err, sizeof err) < 0)
        fail_start(ctl_fd, -EINVAL, err);
    /* From here on we must stay single-threaded: CLONE_NEWUSER refuses a
     * multi-threaded caller (pin OpenBLAS & co. before preloading). */
    int nthreads = count_threads();
    if (nthreads != 1) {
        snprintf(err, sizeof err, "fork server has %d threads after interpreter start-up "
                 "(a preloaded module started threads)", nthreads);
        fail_start(ctl_fd, -EINVAL, err);
    }

    /* The sandbox root, in a mount namespace of our own: after the
     * interpreter's start-up, which may still want the host's /tmp. */
    if (cfg->isolate && (r = mounts_build(cfg, fsv.mounts, err, sizeof err)) < 0)
        fail_start(ctl_fd, r, err);

    if (cfg->isolate &&
        (r = netns_spares_new(cfg->workdir[0] ? 1 : NETNS_SPARES, &fsv.netns, err, sizeof err)) < 0)
        fail_start(ctl_fd, r, err);

    fsv.plan = (struct sbx_plan){
        .cfg = cfg,
        .policy = fsv.policy,
        .cgroups = NULL, /* placed and removed by the helper (placer_send) */
        .mounts = fsv.mounts,
        .netns = fsv.netns,
        .hooks = &sbx_runtime_hooks,
        .tid_addr = tid_addr,
    };
    /* glibc registered our thread's robust mutex list; a raw clone drops the
     * registration, which the child restores (steps.c). */
    syscall(SYS_get_robust_list, 0, &fsv.plan.robust_head, &fsv.plan.robust_len);

    fsv.pool = calloc(cfg->pool_size ? cfg->pool_size : 1, sizeof *fsv.pool);
    fsv.pfd = calloc(2 + (size_t)cfg->pool_size, sizeof *fsv.pfd);
    if (!fsv.pool || !fsv.pfd)
        fail_start(ctl_fd, -ENOMEM, "out of memory for the pool");
    /* Give back the free pages of the C heap that start-up left behind (the
     * interpreter, preloads, the policy compiler). Every sandbox is a copy of
     * us: a free page still mapped is a page table entry copied per clone and
     * a copy-on-write fault when the sandbox reuses it; returned, it is a
     * fresh zero page there instead. */
    malloc_trim(0);

    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    uint64_t start_ns = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000ull +
                        (uint64_t)(t1.tv_nsec - t0.tv_nsec);
    LOG_I("ready in %llu ms: %s, %zu mount ops, seccomp %zu insns, %s clone, pool %u, "
          "host ids %u..%u", (unsigned long long)(start_ns / 1000000),
          cfg->isolate ? "isolated" : "NOT isolated", mounts_len(fsv.mounts),
          policy_bpf_len(fsv.policy), tid_addr ? "one" : "fork-path", cfg->pool_size,
          cfg->id_first, cfg->id_first + cfg->id_count - 1);
    if (send_ready(ctl_fd, 0, start_ns, NULL) < 0)
        _exit(1);

    for (;;) {
        uint64_t when = netns_time(&fsv);
        if (fsv.npool < cfg->pool_size && refill_time(&fsv) < when)
            when = refill_time(&fsv);
        int timeout = -1;
        if (when != UINT64_MAX) {
            uint64_t now = now_ns();
            timeout = now >= when ? 0 : (int)((when - now + 999999) / 1000000);
        }
        struct pollfd *pfd = fsv.pfd;
        pfd[0] = (struct pollfd){.fd = ctl_fd, .events = POLLIN};
        pfd[1] = (struct pollfd){.fd = fsv.sig_fd, .events = POLLIN};
        nfds_t nfds = 2;
        for (size_t i = 0; i < fsv.npool; i++)
            if (fsv.pool[i].warm_fd >= 0)
                pfd[nfds++] = (struct pollfd){.fd = fsv.pool[i].warm_fd, .events = POLLIN};
        int n = poll(pfd, nfds, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            PLOG_E("poll");
            shutdown_all(&fsv, 1);
        }
        /* Requests first: nothing we can postpone goes before them. */
        if (pfd[0].revents & POLLIN) {
            if (!handle_requests(&fsv))
                shutdown_all(&fsv, 0); /* the supervisor is gone */
        } else if (pfd[0].revents & (POLLHUP | POLLERR)) {
            shutdown_all(&fsv, 0);
        }
        if (pfd[1].revents & POLLIN) {
            struct signalfd_siginfo si[8];
            while (read(fsv.sig_fd, si, sizeof si) > 0)
                ;
            reap(&fsv);
        }
        for (nfds_t k = 2; k < nfds; k++) {
            if (!pfd[k].revents)
                continue;
            for (size_t i = 0; i < fsv.npool; i++)
                if (fsv.pool[i].warm_fd == pfd[k].fd)
                    pool_note_warm(&fsv, &fsv.pool[i]);
        }
        /* One refill, and only if no request came in meanwhile: a network
         * namespace first (a pooled sandbox takes one too). */
        uint64_t now = now_ns();
        if (now >= netns_time(&fsv) && !request_pending(ctl_fd))
            netns_refill_one(&fsv);
        else if (fsv.npool < cfg->pool_size && now >= refill_time(&fsv) &&
                 !request_pending(ctl_fd))
            pool_refill_one(&fsv);
    }
}
