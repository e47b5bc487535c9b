/* Runs in the supervisor (forkboxd, which links no Python; and `forkbox
 * sandbox`): its side of the fork server (see forkserver.h): finding,
 * checking and starting python3.11 with forkbox-sandbox.so (with core's
 * fork_helper), the control socket's records, and what its replies mean in
 * words of ours (why a spawn failed, why a sandbox ended). */
#include "sandbox/forkserver.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/ratelimit.h"
#include "core/util.h"

#define FS_STOP_GRACE_MS 2000


static void fs_client_stop_child(struct fs_client *fs);

static void reap_blocking(pid_t pid, int *status)
{
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
}

/* Which forkbox-sandbox.so: --sandbox-module; else the build tree's when
 * this forkboxd is the build tree's (the same file, by device and inode: a
 * copy or an installed forkboxd is not); else the installed one. All three
 * are fixed paths, never searched for in PATH or next to anything. */
static const char *sandbox_module_path(const struct config *cfg)
{
    if (cfg->sandbox_module[0])
        return cfg->sandbox_module;
    if (config_built_here())
        return FORKBOX_BUILD_SANDBOX;
    return FORKBOX_SANDBOX_MODULE;
}

/* Open a file the fork server runs (the interpreter, the module) once and
 * check the file itself: a regular file that only root or our own user can
 * have written (owner root or our euid, not writable by group or others).
 * The child execs and loads these very files (execveat on the fd, the
 * module from /proc/self/fd), so a rename or a symlink swapped in after the
 * check changes nothing. The directories above them are not checked
 * (residual risk, docs/security.md "How it works"): the compiled-in paths are root's.
 * The fd is above FS_MODULE_FD, the highest fd the child sets up. */
static int open_checked(const char *path, const char *what, const char *flag, char *err,
                        size_t errlen)
{
    _cleanup_close_ int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return err_fmt(err, errlen, -e, "%s %s: %s%s%s%s", what, path, strerror(e),
                       flag ? " (set it with " : "", flag ? flag : "", flag ? ")" : "");
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        return err_fmt(err, errlen, -e, "%s: fstat: %s", path, strerror(e));
    }
    const char *bad = !S_ISREG(st.st_mode)                        ? "not a regular file"
                      : st.st_uid != 0 && st.st_uid != geteuid()  ? "owned by another user"
                      : st.st_mode & (S_IWGRP | S_IWOTH)          ? "writable by group or others"
                      : !(st.st_mode & S_IXUSR)                   ? "not executable"
                                                                  : NULL;
    if (bad) {
        return err_fmt(err, errlen, -EPERM, "%s %s: %s", what, path, bad);
    }
    int high = fcntl(fd, F_DUPFD_CLOEXEC, FS_MODULE_FD + 1);
    if (high < 0) {
        int e = errno;
        return err_fmt(err, errlen, -e, "%s: fcntl: %s", path, strerror(e));
    }
    return high;
}

/* fds 0-2 must be open before the supervisor opens anything: a socket that
 * landed on one of them (forkboxd started with stdin closed) would cross
 * into a fork server started later, which keeps fds 0-3. */
static void stdio_hold(void)
{
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && open("/dev/null", O_RDWR) < 0)
            break;
}

/* A build with AddressSanitizer: forkbox-sandbox.so is instrumented and
 * python3.11 is not, and ASan's runtime must be the first library loaded,
 * so the fork server preloads the one forkboxd runs with. The runtime drops
 * LD_PRELOAD from user code's environment. */
#if !defined(__SANITIZE_ADDRESS__) && defined(__has_feature)
#if __has_feature(address_sanitizer)
#define __SANITIZE_ADDRESS__ 1 /* clang's spelling */
#endif
#endif
#ifdef __SANITIZE_ADDRESS__
void __asan_init(void);
static const char *asan_runtime(void)
{
    Dl_info di;
    return dladdr((void *)__asan_init, &di) && di.dli_fname ? di.dli_fname : NULL;
}
#else
static const char *asan_runtime(void)
{
    return NULL;
}
#endif

int fs_client_open(const struct config *cfg, struct fs_client *fs, char *err, size_t errlen)
{
    fs->ctl_fd = -1;
    fs->pid = 0;
    fs->exe_fd = -1;
    fs->mod_fd = -1;
    fs->log_fd = -1;
    stdio_hold();
    int fd = open_checked(FORKBOX_PYTHON, "the fork server's interpreter", NULL, err, errlen);
    if (fd < 0)
        return fd;
    fs->exe_fd = fd;
    fd = open_checked(sandbox_module_path(cfg), "the fork server's module", "--sandbox-module",
                      err, errlen);
    if (fd < 0) {
        close_and_reset(&fs->exe_fd);
    close_and_reset(&fs->mod_fd);
        return fd;
    }
    fs->mod_fd = fd;
    return 0;
}

int fs_client_launch(const struct config *cfg, struct fs_client *fs, char *err, size_t errlen)
{
    if (fs->exe_fd < 0 || fs->mod_fd < 0)
        return err_fmt(err, errlen, -EBADF, "the fork server's files are not open");

    /* The fork server gets a fixed environment: ours holds the token.
     * Thread pools that numerical libraries start at import (OpenBLAS, MKL,
     * BLIS, OpenMP, numexpr, Accelerate) are pinned to one thread: a
     * preloaded numpy must leave the fork server single-threaded, which
     * clone(CLONE_NEWUSER) requires and which makes forking it safe. The
     * libraries read these once, when they load; sandboxes inherit that
     * setting in the preloaded copies, but not the variables (the runtime
     * reduces the environment to the spec 6.4 allowlist). */
    /* LD_BIND_NOW: every library symbol is resolved once, here, at start-up
     * (and in modules dlopen()ed later). With lazy binding each sandbox
     * resolved the functions it was first to call itself: the dynamic
     * linker's time, and a copy-on-write fault for every GOT page written.
     * The runtime drops it from user code's environment too. */
    /* The sanitizers' settings are passed on (they hold no secrets), so a
     * sanitized build's fork server and sandboxes obey the same options as
     * forkboxd; the runtime drops them from user code's environment. */
    static const char *const passed[] = {"ASAN_OPTIONS", "UBSAN_OPTIONS"};
    char kv[3][PATH_MAX + 16];
    char *envp[] = {
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "LANG=C.UTF-8",
        cfg->isolate ? "HOME=/workspace" : "HOME=/tmp",
        "TMPDIR=/tmp",
        "OPENBLAS_NUM_THREADS=1",
        "GOTO_NUM_THREADS=1",
        "OMP_NUM_THREADS=1",
        "MKL_NUM_THREADS=1",
        "BLIS_NUM_THREADS=1",
        "NUMEXPR_NUM_THREADS=1",
        "VECLIB_MAXIMUM_THREADS=1",
        "LD_BIND_NOW=1",
        NULL, /* room for the passed variables and LD_PRELOAD */
        NULL,
        NULL,
        NULL,
    };
    size_t n_env = sizeof envp / sizeof *envp - 4;
    for (size_t i = 0; i < sizeof passed / sizeof *passed; i++) {
        const char *v = getenv(passed[i]);
        if (v && snprintf(kv[i], sizeof kv[i], "%s=%s", passed[i], v) < (int)sizeof kv[i])
            envp[n_env++] = kv[i];
    }
    const char *asan = asan_runtime();
    if (asan && snprintf(kv[2], sizeof kv[2], "LD_PRELOAD=%s", asan) < (int)sizeof kv[2])
        envp[n_env++] = kv[2];

    int ctl_fd = -1;
    pid_t pid = fork_helper("fork server", &ctl_fd, err, errlen);
    if (pid < 0)
        return pid;
    if (pid == 0) {
        /* Nothing else of ours crosses the exec but the program (FS_BOOT,
         * a pipe as fd 0: it fits in the pipe's buffer) and the module's
         * fd, as FS_MODULE_FD, whatever their flags (the interpreter's fd
         * need not: an ELF file is mapped before the close-on-exec fds are
         * closed). A restart forks a supervisor that holds the token,
         * turns' sockets and buffers: only these fds and the fresh address
         * space of execve cross, as at the first start. */
        int boot[2];
        if ((fs->log_fd >= 0 && dup2(fs->log_fd, 2) < 0) ||
            dup2(fs->mod_fd, FS_MODULE_FD) < 0 || pipe2(boot, O_CLOEXEC) < 0 ||
            write(boot[1], FS_BOOT, sizeof FS_BOOT - 1) != sizeof FS_BOOT - 1 ||
            dup2(boot[0], 0) < 0 || fcntl(0, F_SETFD, 0) < 0)
            _exit(127);
        close_range(FS_MODULE_FD + 1, ~0u, CLOSE_RANGE_CLOEXEC);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL); /* the mask survives execve */
        /* So do ignored signals (the supervisor ignores SIGPIPE once it
         * serves): a restarted fork server starts from the defaults too. */
        for (int sig = 1; sig < NSIG; sig++)
            if (sig != SIGKILL && sig != SIGSTOP)
                signal(sig, SIG_DFL);
        static char *const argv[] = FS_ARGV;
        execveat(fs->exe_fd, "", argv, envp, AT_EMPTY_PATH);
        _exit(127);
    }
    fs->ctl_fd = ctl_fd;
    fs->pid = pid;

    /* Its configuration, as the first record (it waits for it). */
    struct config fcfg;
    config_for_forkserver(cfg, &fcfg);
    ssize_t sent;
    do
        sent = send(fs->ctl_fd, &fcfg, sizeof fcfg, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    if (sent != (ssize_t)sizeof fcfg) {
        snprintf(err, errlen, "sending the fork server its configuration: %s",
                 sent < 0 ? strerror(errno) : "short write");
        fs_client_kill(fs);
        return -EPIPE;
    }
    int rn = fd_set_nonblock(fs->ctl_fd, true);
    if (rn < 0) {
        fs_client_kill(fs);
        return err_fmt(err, errlen, rn, "fcntl: %s", strerror(-rn));
    }
    return 0;
}

int fs_client_ready(struct fs_client *fs, char *err, size_t errlen)
{
    /* sync 0: the ready record. */
    struct {
        struct fs_reply rep;
        char msg[FS_READY_MAX_MSG];
    } rec;
    ssize_t n;
    do
        n = recv(fs->ctl_fd, &rec, sizeof rec, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    if (n <= 0) {
        int status = 0;
        close_and_reset(&fs->ctl_fd);
        reap_blocking(fs->pid, &status);
        fs->pid = 0;
        return err_fmt(err, errlen, -ECHILD, "fork server exited before ready (%s %d)",
                 WIFSIGNALED(status) ? "signal" : "status",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    }
    if ((size_t)n < sizeof rec.rep || rec.rep.turn_id != 0) {
        snprintf(err, errlen, "fork server: malformed ready record");
        fs_client_kill(fs);
        return -EPROTO;
    }
    if (rec.rep.status != 0) {
        int len = (int)((size_t)n - sizeof rec.rep);
        snprintf(err, errlen, "%.*s", len, len ? rec.msg : strerror(-rec.rep.status));
        int status = rec.rep.status;
        fs_client_stop_child(fs);
        return status < 0 ? status : -EIO;
    }
    return 1;
}

int fs_client_start(const struct config *cfg, int log_fd, struct fs_client *fs, char *err,
                    size_t errlen)
{
    int r = fs_client_open(cfg, fs, err, errlen);
    fs->log_fd = log_fd;
    if (r == 0)
        r = fs_client_launch(cfg, fs, err, errlen);
    uint64_t deadline = now_ms() + FS_READY_TIMEOUT_MS;
    while (r == 0) {
        uint64_t now = now_ms();
        if (now >= deadline) {
            snprintf(err, errlen, "fork server not ready after %d ms", FS_READY_TIMEOUT_MS);
            r = -ETIMEDOUT;
            break;
        }
        struct pollfd pfd = {.fd = fs->ctl_fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)(deadline - now)) < 0 && errno != EINTR) {
            r = err_errno(err, errlen, "poll");
            break;
        }
        r = fs_client_ready(fs, err, errlen);
    }
    if (r < 0) {
        fs_client_stop(fs);
        return r;
    }
    return 0;
}

int fs_client_request(struct fs_client *fs, uint64_t turn_id, uint32_t tenant)
{
    struct fs_request req = {.op = FS_OP_SPAWN, .tenant = tenant, .turn_id = turn_id};
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
    int fds[2] = {-1, -1}, flags;
    size_t nfds;
    ssize_t n = fd_recv(fs->ctl_fd, rep, sizeof *rep, fds, 2, &nfds, MSG_DONTWAIT, &flags);
    if (n < 0)
        return n == -EAGAIN ? 0 : (int)n;
    if (n == 0)
        return -EPIPE; /* the fork server is gone */

    /* MSG_CTRUNC on a spawn reply: our fd table was full (RLIMIT_NOFILE,
     * or the system's), and the kernel dropped the fds that did not fit
     * (the channel's end, then the pidfd, in that order). That spawn
     * failed; the fork server did its part. What arrived is closed: the
     * sandbox (no user code has run in it) reads EOF and exits. */
    if ((size_t)n == sizeof *rep && !(flags & MSG_TRUNC) && (flags & MSG_CTRUNC) &&
        rep->kind == FS_REPLY_SPAWN && rep->status == 0 && nfds < 2) {
        struct rlimit rl = {0};
        getrlimit(RLIMIT_NOFILE, &rl);
        LOG_W_RL("turn %" PRIu64 ": its sandbox's fds did not fit in our fd table (RLIMIT_NOFILE "
                 "%llu): that turn fails", rep->turn_id, (unsigned long long)rl.rlim_cur);
        for (size_t i = 0; i < nfds; i++)
            close(fds[i]);
        rep->status = -EMFILE;
        return 1;
    }
    bool ok = (size_t)n == sizeof *rep && !(flags & (MSG_TRUNC | MSG_CTRUNC)) &&
              rep->kind <= FS_REPLY_CGROUPS &&
              (rep->kind != FS_REPLY_SPAWN ? nfds == 0 : rep->status != 0 || nfds == 2);
    if (!ok || rep->status != 0 || rep->kind != FS_REPLY_SPAWN) {
        for (size_t i = 0; i < nfds; i++)
            close(fds[i]);
        return ok ? 1 : -EPROTO;
    }
    *chan_fd = fds[0];
    *pidfd = fds[1];
    return 1;
}

/* EOF on the control socket makes the fork server kill its sandboxes and
 * exit; give it a moment, then insist. */
static void fs_client_stop_child(struct fs_client *fs)
{
    close_and_reset(&fs->ctl_fd);
    if (fs->pid <= 0)
        return;
    uint64_t deadline = now_ms() + FS_STOP_GRACE_MS;
    int status;
    for (;;) {
        pid_t r = waitpid(fs->pid, &status, WNOHANG);
        if (r == fs->pid || (r < 0 && errno != EINTR))
            break;
        if (r == 0 && now_ms() >= deadline) {
            kill(fs->pid, SIGKILL);
            reap_blocking(fs->pid, &status);
            break;
        }
        if (r == 0)
            nanosleep(&(struct timespec){.tv_nsec = 5 * 1000 * 1000}, NULL);
    }
    fs->pid = 0;
}

void fs_client_kill(struct fs_client *fs)
{
    close_and_reset(&fs->ctl_fd);
    if (fs->pid <= 0)
        return;
    int status;
    kill(fs->pid, SIGKILL);
    reap_blocking(fs->pid, &status);
    fs->pid = 0;
}

void fs_client_stop(struct fs_client *fs)
{
    fs_client_stop_child(fs);
    close_and_reset(&fs->exe_fd);
    close_and_reset(&fs->mod_fd);
}

/* ---------------------------------------------------------------- why a sandbox ended */

void fs_spawn_failure(int status, char *out, size_t len)
{
    if (status == FS_NO_FREE_ID)
        snprintf(out, len, "no free sandbox id (--id-range): each is held by a sandbox not yet "
                 "reaped");
    else
        snprintf(out, len, "cannot start a sandbox: %s", errno_reason(-status));
}

static bool crash_signal(int sig)
{
    return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGABRT ||
           sig == SIGSYS || sig == SIGTRAP;
}

/* Init exits with the runtime's exit code below 128, 128 + the signal that
 * killed it, or 255 for an exit code of 128 or more (steps.c, step 9); init
 * itself killed by a signal (the OOM killer kills every process sharing the
 * runtime's memory, init included) counts as that signal. Which signal came
 * from where cannot be known from outside, so the rule is by signal: the
 * synchronous faults (and SIGABRT, SIGSYS: abort() and the seccomp policy's
 * kill) are a crash of the runtime or of native code in it; any other is a
 * kill (os.kill from user code, a subprocess). An OOM kill names the limit
 * the OOM killer acted for: the turn's own when its cgroup reached it, else
 * the memory cgroup above that did (the daemon's), else the host's memory
 * (cgroups_above.h). */
enum fs_death fs_death_reason(const struct fs_reply *d, const struct config *cfg, uint64_t waited_ms,
                              char *out, size_t len)
{
    if (!d) {
        snprintf(out, len, "sandbox stopped: no death report (the fork server did not answer "
                 "for %llu s)", (unsigned long long)(waited_ms / 1000));
        return FS_DEATH_UNKNOWN;
    }
    int st = d->wait_status, sig = 0, code = 0;
    if (WIFSIGNALED(st))
        sig = WTERMSIG(st);
    else if (WEXITSTATUS(st) > 128 && WEXITSTATUS(st) < 255)
        sig = WEXITSTATUS(st) - 128;
    else
        code = WEXITSTATUS(st);
    char how[40];
    const char *abbrev = sig ? sigabbrev_np(sig) : NULL;
    if (abbrev)
        snprintf(how, sizeof how, "SIG%s", abbrev);
    else if (sig)
        snprintf(how, sizeof how, "signal %d", sig);
    else if (code == 255)
        snprintf(how, sizeof how, "status 128 or more");
    else
        snprintf(how, sizeof how, "status %d", code);

    unsigned long long own = cfg->memory_max >> 20;
    if (sig == SIGKILL && d->oom_kills) {
        if (d->oom_own)
            snprintf(out, len, "out of memory: the sandbox was killed at its memory limit "
                     "(%llu MiB)", own);
        else if (d->oom_limit)
            snprintf(out, len, "out of memory: the sandbox was killed at the daemon's memory "
                     "limit (%llu MiB), not its own (%llu MiB)",
                     (unsigned long long)(d->oom_limit >> 20), own);
        else
            snprintf(out, len, "out of memory: the host ran out and its OOM killer killed the "
                     "sandbox (below its limit of %llu MiB)", own);
        return FS_DEATH_MEMORY;
    }
    if (d->pids_max && (sig || code)) {
        snprintf(out, len, "process limit: the sandbox died (%s) after reaching its limit of "
                 "%llu processes", how, (unsigned long long)cfg->pids_max);
        return FS_DEATH_PIDS;
    }
    if (crash_signal(sig)) {
        snprintf(out, len, "sandbox crashed: %s in the runtime or native code", how);
        return FS_DEATH_CRASH;
    }
    if (sig) {
        snprintf(out, len, "sandbox killed: %s", how);
        return FS_DEATH_KILLED;
    }
    snprintf(out, len, "sandbox exited: %s", how);
    return FS_DEATH_EXITED;
}
