/* Runs in the fork server's cgroup helper (see placer.h): every cgroup write
 * of a spawn and a reap, off the fork server's path. */
#include "sandbox/placer.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/util.h"
#include "sandbox/cgroups.h"
#include "sandbox/fsproto.h"
#include "sandbox/spawn.h"

/* A sandbox handed to a turn has been reaped: the helper reads what its
 * turn cgroup counted (before the cgroup can be reused) and sends the
 * supervisor the death report itself, on its copy of the control socket
 * (fd 4), so that we never wait for it and no reply flows back to us. The
 * supervisor reads the control socket all the time, so the helper's
 * blocking send cannot stall for long. */
static void placer_send_reply(int ctl_fd, const struct fs_reply *rep)
{
    ssize_t n;
    do
        n = send(ctl_fd, rep, sizeof *rep, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno != EPIPE && errno != ECONNRESET)
        PLOG_W("report to the supervisor (kind %u, turn %llu)", rep->kind,
               (unsigned long long)rep->turn_id);
}

static void placer_report(int ctl_fd, const struct placer_req *req, const struct cg_events *ev)
{
    placer_send_reply(ctl_fd, &(struct fs_reply){
        .pid = req->pid, .turn_id = req->turn_id, .kind = FS_REPLY_DEATH,
        .wait_status = req->wait_status, .oom_kills = ev->oom_kills, .oom_own = ev->oom_own,
        .oom_limit = ev->oom_limit, .pids_max = ev->pids_max, .mem_peak = ev->mem_peak});
}

/* How many turn cgroups wait to be removed, for /metrics, when it changes:
 * from the retries (a cgroup whose tasks are gone when it is released, the
 * common case, costs no message), and once none is left. */
static void placer_count(int ctl_fd, size_t waiting, size_t *told)
{
    if (waiting == *told)
        return;
    *told = waiting;
    placer_send_reply(ctl_fd, &(struct fs_reply){.kind = FS_REPLY_CGROUPS,
                                                  .cgroups_waiting = (uint32_t)waiting});
}

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

_Noreturn void placer_main(const struct config *cfg, struct sbx_cgroups *cg, int fd, int ctl_fd)
{
    signal(SIGPIPE, SIG_IGN); /* a child killed before its go */
    /* We leave when the fork server does, however it ends (EOF on our
     * socket), and take every turn cgroup with us: so no death signal, and a
     * stop signal to the whole process group (systemd, a terminal) is left
     * to the supervisor. */
    prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    /* Turn cgroups not removed yet (tasks still exiting, or frozen; a
     * read-only hierarchy; an earlier daemon's, cgroups_stale.h): retried
     * while otherwise idle, every 20 ms, backing off to every second while
     * none goes. */
    size_t busy = cgroups_retry(cg), told = 0;
    int retry_ms = 20;
    for (;;) {
        if (busy) {
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            if (poll(&pfd, 1, retry_ms) == 0) {
                size_t left = cgroups_retry(cg);
                retry_ms = left < busy ? 20 : retry_ms < 1000 ? 2 * retry_ms : 1000;
                busy = left;
                placer_count(ctl_fd, busy, &told);
                continue;
            }
        }
        struct placer_req req;
        int fds[1] = {-1};
        size_t nfds;
        ssize_t n = fd_recv(fd, &req, sizeof req, fds, 1, &nfds, 0, NULL);
        if (n == -EINTR)
            continue;
        if (n <= 0) {
            /* The fork server is gone or done: its sandboxes are dead
             * (PDEATHSIG), so every turn cgroup can go. */
            cgroups_free(cg);
            _exit(0);
        }
        int go_fd = nfds == 1 ? fds[0] : -1;
        if ((size_t)n != sizeof req || req.pid <= 0) {
            if (go_fd >= 0)
                close(go_fd);
            continue;
        }
        if (req.op == PLACER_ATTACH && go_fd >= 0) {
            uint64_t t0 = now_ns(), c0 = cfg->step_times ? cpu_ns() : 0;
            int r = cgroups_attach(cg, req.pid, cfg);
            /* Gone already (killed as its client left, or failed before
             * its go): nothing to place, its cgroup stays a spare. Common
             * and harmless, so not a warning. */
            if (r == -ESRCH)
                LOG_D("sandbox %d was gone before its placement", (int)req.pid);
            else if (r < 0)
                LOG_W("cgroup placement of %d: %s", (int)req.pid, strerror(-r));
            else if (cfg->step_times) /* forkbox-bench --rows steps reads this */
                LOG_D("sandbox %d placed in %llu us (cpu %llu us)", (int)req.pid,
                      (unsigned long long)((now_ns() - t0) / 1000),
                      (unsigned long long)((cpu_ns() - c0) / 1000));
            else
                LOG_D("sandbox %d placed in %llu us", (int)req.pid,
                      (unsigned long long)((now_ns() - t0) / 1000));
            sbx_child_go(go_fd, r < 0 ? -r : 0); /* closes go_fd */
        } else {
            if (go_fd >= 0)
                close(go_fd);
            if (req.op == PLACER_RELEASE || req.op == PLACER_RELEASE_REPORT) {
                /* Counted either way (the next sandbox in this cgroup
                 * starts from here); the report goes first: the turn's
                 * close waits for it, the cgroup's recycling does not. */
                struct cg_events ev;
                cgroups_events(cg, req.pid, &ev);
                if (req.op == PLACER_RELEASE_REPORT)
                    placer_report(ctl_fd, &req, &ev);
                cgroups_release(cg, req.pid);
                busy = cgroups_retry(cg);
                retry_ms = 20;
                if (!busy)
                    placer_count(ctl_fd, busy, &told);
            } else if (req.op == PLACER_SERVING) {
                cgroups_serving(cg, req.pid, req.tenant, cfg);
            }
        }
    }
}
