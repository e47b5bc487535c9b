/* The fork server and its client (see forkserver.h).
 *
 * Start-up handshake (sync 0): after everything that can fail at start has
 * run (policy compiled, mount plan built, cgroups probed, interpreter
 * initialised), the fork server sends one "ready" record: a struct fs_reply
 * with turn_id 0, pid = its pid, spawn_ns = its start-up time and status 0 or
 * -errno; on failure the same record carries the reason as text after the
 * struct (at most FS_READY_MAX_MSG bytes, not NUL-terminated). */
#include "sandbox/forkserver.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/log.h"
#include "sandbox/limits.h"
#include "sandbox/mounts.h"
#include "sandbox/seccomp.h"
#include "sandbox/steps.h"

#define FS_READY_TIMEOUT_MS 30000
#define FS_STOP_GRACE_MS 2000

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------------------ */
/* supervisor side                                                           */
/* ------------------------------------------------------------------------ */

static void reap_blocking(pid_t pid, int *status)
{
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
}

int fs_client_start(const struct config *cfg, char *const argv[], struct fs_client *fs,
                    char *err, size_t errlen)
{
    fs->ctl_fd = -1;
    fs->pid = 0;

    /* The fork server gets a fixed environment: ours holds the token. */
    char *const envp[] = {
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "LANG=C.UTF-8",
        cfg->isolate ? "HOME=/workspace" : "HOME=/tmp",
        "TMPDIR=/tmp",
        NULL,
    };

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        snprintf(err, errlen, "socketpair: %s", strerror(errno));
        return -errno;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(sv[0]);
        close(sv[1]);
        snprintf(err, errlen, "fork: %s", strerror(e));
        return -e;
    }
    if (pid == 0) {
        /* Async-signal-safe calls only until execve. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 || getppid() != parent)
            _exit(127);
        if (sv[1] == 3) {
            if (fcntl(3, F_SETFD, 0) < 0)
                _exit(127);
        } else if (dup2(sv[1], 3) < 0) { /* dup2 clears FD_CLOEXEC */
            _exit(127);
        }
        /* Nothing else of ours crosses the exec, whatever its flags. */
        close_range(4, ~0u, CLOSE_RANGE_CLOEXEC);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL); /* the mask survives execve */
        execve("/proc/self/exe", argv, envp);
        _exit(127);
    }
    close(sv[1]);
    fs->ctl_fd = sv[0];
    fs->pid = pid;

    /* sync 0: wait for the ready record. */
    struct {
        struct fs_reply rep;
        char msg[FS_READY_MAX_MSG];
    } rec;
    uint64_t deadline = mono_ms() + FS_READY_TIMEOUT_MS;
    ssize_t n = -1;
    for (;;) {
        uint64_t now = mono_ms();
        if (now >= deadline) {
            snprintf(err, errlen, "fork server not ready after %d ms", FS_READY_TIMEOUT_MS);
            fs_client_stop(fs);
            return -ETIMEDOUT;
        }
        struct pollfd pfd = {.fd = fs->ctl_fd, .events = POLLIN};
        int r = poll(&pfd, 1, (int)(deadline - now));
        if (r < 0 && errno != EINTR) {
            int e = errno;
            snprintf(err, errlen, "poll: %s", strerror(e));
            fs_client_stop(fs);
            return -e;
        }
        if (r <= 0)
            continue;
        n = recv(fs->ctl_fd, &rec, sizeof rec, 0);
        if (n < 0 && errno == EINTR)
            continue;
        break;
    }
    if (n <= 0) {
        int status = 0;
        close_and_reset(&fs->ctl_fd);
        reap_blocking(fs->pid, &status);
        fs->pid = 0;
        snprintf(err, errlen, "fork server exited before ready (%s %d)",
                 WIFSIGNALED(status) ? "signal" : "status",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        return -ECHILD;
    }
    if ((size_t)n < sizeof rec.rep || rec.rep.turn_id != 0) {
        snprintf(err, errlen, "fork server: malformed ready record");
        fs_client_stop(fs);
        return -EPROTO;
    }
    if (rec.rep.status != 0) {
        int len = (int)((size_t)n - sizeof rec.rep);
        snprintf(err, errlen, "%.*s", len, len ? rec.msg : strerror(-rec.rep.status));
        int status = rec.rep.status;
        fs_client_stop(fs);
        return status < 0 ? status : -EIO;
    }
    int fl = fcntl(fs->ctl_fd, F_GETFL);
    if (fl < 0 || fcntl(fs->ctl_fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        int e = errno;
        snprintf(err, errlen, "fcntl: %s", strerror(e));
        fs_client_stop(fs);
        return -e;
    }
    return 0;
}

int fs_client_request(struct fs_client *fs, uint64_t turn_id)
{
    struct fs_request req = {.op = FS_OP_SPAWN, .turn_id = turn_id};
    ssize_t n;
    do
        n = send(fs->ctl_fd, &req, sizeof req, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    return n == sizeof req ? 0 : -EPROTO;
}

int fs_client_reply(struct fs_client *fs, struct fs_reply *rep, int *chan_fd, int *pidfd)
{
    *chan_fd = *pidfd = -1;
    union {
        char buf[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } cbuf;
    struct iovec iov = {.iov_base = rep, .iov_len = sizeof *rep};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf,
                         .msg_controllen = sizeof cbuf.buf};
    ssize_t n;
    do
        n = recvmsg(fs->ctl_fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno == EWOULDBLOCK ? 0 : -errno;
    if (n == 0)
        return -EPIPE; /* the fork server is gone */

    int fds[2] = {-1, -1}, nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (nfds < 2)
                fds[nfds++] = fd;
            else
                close(fd);
        }
    }
    bool ok = (size_t)n == sizeof *rep && !(msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) &&
              (rep->status != 0 || nfds == 2);
    if (!ok || rep->status != 0) {
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        return ok ? 1 : -EPROTO;
    }
    *chan_fd = fds[0];
    *pidfd = fds[1];
    return 1;
}

void fs_client_stop(struct fs_client *fs)
{
    /* EOF on the control socket makes the fork server kill its sandboxes
     * and exit; give it a moment, then insist. */
    close_and_reset(&fs->ctl_fd);
    if (fs->pid <= 0)
        return;
    uint64_t deadline = mono_ms() + FS_STOP_GRACE_MS;
    int status;
    for (;;) {
        pid_t r = waitpid(fs->pid, &status, WNOHANG);
        if (r == fs->pid || (r < 0 && errno != EINTR))
            break;
        if (r == 0 && mono_ms() >= deadline) {
            kill(fs->pid, SIGKILL);
            reap_blocking(fs->pid, &status);
            break;
        }
        if (r == 0)
            nanosleep(&(struct timespec){.tv_nsec = 5 * 1000 * 1000}, NULL);
    }
    fs->pid = 0;
}

/* ------------------------------------------------------------------------ */
/* fork server side                                                          */
/* ------------------------------------------------------------------------ */

struct forkserver {
    const struct config *cfg;    /* borrowed */
    int ctl_fd;                  /* borrowed (fd 3) */
    int sig_fd;                  /* owned: signalfd for SIGCHLD */
    struct sbx_plan plan;
    struct sbx_policy *policy;   /* owned */
    struct sbx_cgroups *cgroups; /* owned */
    struct mount_plan *mounts;   /* owned */
    struct sbx_child *kids;      /* owned: live (unreaped) sandboxes */
    size_t nkids, capkids;
};

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

_Noreturn static void fail_start(int ctl_fd, int status, const char *msg)
{
    LOG_E("not starting: %s", msg);
    send_ready(ctl_fd, status < 0 ? status : -EINVAL, 0, msg);
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
    union {
        char buf[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } cbuf;
    struct iovec iov = {.iov_base = (void *)rep, .iov_len = sizeof *rep};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (rep->status == 0) {
        memset(&cbuf, 0, sizeof cbuf);
        msg.msg_control = cbuf.buf;
        msg.msg_controllen = sizeof cbuf.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(2 * sizeof(int));
        int fds[2] = {chan_fd, pidfd};
        memcpy(CMSG_DATA(c), fds, sizeof fds);
    }
    ssize_t n;
    do
        n = sendmsg(ctl_fd, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : 0;
}

static void handle_spawn(struct forkserver *fsv, const struct fs_request *req)
{
    struct fs_reply rep = {.turn_id = req->turn_id};
    if (fsv->nkids == fsv->capkids) {
        size_t cap = fsv->capkids ? fsv->capkids * 2 : 64;
        struct sbx_child *k = realloc(fsv->kids, cap * sizeof *k);
        if (!k) {
            rep.status = -ENOMEM;
            send_reply(fsv->ctl_fd, &rep, -1, -1);
            return;
        }
        fsv->kids = k;
        fsv->capkids = cap;
    }
    struct sbx_child c;
    char err[256] = "";
    int r = sbx_spawn(&fsv->plan, &c, err, sizeof err);
    rep.status = r;
    rep.pid = c.pid;
    rep.spawn_ns = c.spawn_ns;
    if (r < 0)
        LOG_W("turn %llu: spawn failed: %s", (unsigned long long)req->turn_id, err);
    else
        LOG_D("turn %llu: sandbox %d in %llu us", (unsigned long long)req->turn_id, (int)c.pid,
              (unsigned long long)(c.spawn_ns / 1000));
    int sr = send_reply(fsv->ctl_fd, &rep, c.chan_fd, c.pidfd);
    if (sr < 0 && r == 0) {
        errno = -sr;
        PLOG_E("reply for turn %llu", (unsigned long long)req->turn_id);
        kill(c.pid, SIGKILL); /* nobody will talk to it */
    }
    /* Handed off (or failed): our copies go, so no later sandbox inherits
     * them and the supervisor alone decides when the channel closes. */
    close_and_reset(&c.chan_fd);
    close_and_reset(&c.pidfd);
    if (c.pid > 0 || c.turn_dir)
        fsv->kids[fsv->nkids++] = c; /* reaped and released on SIGCHLD */
}

/* No zombies, ever: reap everything that has exited and release what each
 * sandbox held (cgroups, non-isolated turn dirs). */
static void reap(struct forkserver *fsv)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            return;
        for (size_t i = 0; i < fsv->nkids; i++) {
            if (fsv->kids[i].pid != pid)
                continue;
            sbx_child_release(&fsv->plan, &fsv->kids[i]);
            fsv->kids[i] = fsv->kids[--fsv->nkids];
            break;
        }
    }
}

_Noreturn static void shutdown_all(struct forkserver *fsv, int code)
{
    for (size_t i = 0; i < fsv->nkids; i++)
        if (fsv->kids[i].pid > 0)
            kill(fsv->kids[i].pid, SIGKILL);
    while (fsv->nkids) {
        struct sbx_child *c = &fsv->kids[fsv->nkids - 1];
        int status;
        if (c->pid > 0)
            reap_blocking(c->pid, &status);
        sbx_child_release(&fsv->plan, c);
        fsv->nkids--;
    }
    reap(fsv);
    _exit(code);
}

_Noreturn void forkserver_main(const struct config *cfg, int ctl_fd)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    log_init("forkserver", cfg->log_level);
    char err[512];

    /* Die with the supervisor, and make sure it had not died already: its
     * pid is the control socket's peer. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
        _exit(1);
    struct ucred peer;
    socklen_t plen = sizeof peer;
    if (getsockopt(ctl_fd, SOL_SOCKET, SO_PEERCRED, &peer, &plen) < 0 || getppid() != peer.pid)
        _exit(1);
    umask(022);

    struct forkserver fsv = {.cfg = cfg, .ctl_fd = ctl_fd, .sig_fd = -1};

    /* Supplementary groups would follow every sandbox (it cannot drop them:
     * setgroups is denied inside), and ours as root include gid 0. */
    if (geteuid() == 0 && setgroups(0, NULL) < 0)
        fail_start(ctl_fd, -errno, "setgroups(0): cannot drop supplementary groups");

    if (cfg->isolate) {
        if (geteuid() != 0)
            fail_start(ctl_fd, -EPERM,
                       "isolation needs root (to map the sandbox uid); use --no-isolation "
                       "for benchmarks only");
        if (cfg->sandbox_uid == 0 || cfg->sandbox_gid == 0)
            fail_start(ctl_fd, -EINVAL, "the sandbox uid/gid must not be 0");
    }

    /* Policy errors stop forkboxd at start, isolated or not. */
    int r = policy_load(cfg->policy_file, &fsv.policy, err, sizeof err);
    if (r < 0)
        fail_start(ctl_fd, r, err);
    if (cfg->isolate) {
        r = mounts_prepare(cfg, &fsv.mounts, err, sizeof err);
        if (r < 0)
            fail_start(ctl_fd, r, err);
    }
    r = limits_cgroups_init(cfg, &fsv.cgroups);
    if (r < 0) {
        snprintf(err, sizeof err, "cgroups: %s", strerror(-r));
        fail_start(ctl_fd, r, err);
    }

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

    fsv.plan = (struct sbx_plan){
        .cfg = cfg,
        .policy = fsv.policy,
        .cgroups = fsv.cgroups,
        .mounts = fsv.mounts,
        .hooks = &sbx_runtime_hooks,
        .tid_addr = tid_addr,
    };

    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    uint64_t start_ns = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000ull +
                        (uint64_t)(t1.tv_nsec - t0.tv_nsec);
    LOG_I("ready in %llu ms: %s, %zu mount ops, seccomp %zu insns, %s clone",
          (unsigned long long)(start_ns / 1000000), cfg->isolate ? "isolated" : "NOT isolated",
          mounts_len(fsv.mounts), policy_bpf_len(fsv.policy), tid_addr ? "one" : "fork-path");
    if (send_ready(ctl_fd, 0, start_ns, NULL) < 0)
        _exit(1);

    for (;;) {
        struct pollfd pfd[2] = {{.fd = ctl_fd, .events = POLLIN},
                                {.fd = fsv.sig_fd, .events = POLLIN}};
        if (poll(pfd, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            PLOG_E("poll");
            shutdown_all(&fsv, 1);
        }
        if (pfd[1].revents & POLLIN) {
            struct signalfd_siginfo si[8];
            while (read(fsv.sig_fd, si, sizeof si) > 0)
                ;
            reap(&fsv);
        }
        if (pfd[0].revents & POLLIN) {
            struct fs_request req = {0};
            ssize_t n = recv(ctl_fd, &req, sizeof req, MSG_DONTWAIT);
            if (n < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            if (n <= 0)
                shutdown_all(&fsv, 0); /* the supervisor is gone */
            if ((size_t)n != sizeof req || req.op != FS_OP_SPAWN) {
                LOG_E("bad control record (%zd bytes, op %u)", n, (unsigned)req.op);
                struct fs_reply rep = {.status = -EPROTO, .turn_id = req.turn_id};
                send_reply(ctl_fd, &rep, -1, -1);
                continue;
            }
            handle_spawn(&fsv, &req);
        } else if (pfd[0].revents & (POLLHUP | POLLERR)) {
            shutdown_all(&fsv, 0);
        }
    }
}
