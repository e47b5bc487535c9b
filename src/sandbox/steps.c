/* Runs in the sandbox child: the ordered isolation steps, then the
 * runtime's serve loop (see steps.h). The fork server's half of a spawn,
 * up to clone, is spawn.c.
 *
 * A failing step writes a `log` error frame on the channel and exits
 * 70 + its id (habit 4), so the supervisor can tell "setup failed" from
 * "user code failed". The ids, not the positions in the table, are what
 * the steps' comments and docs/security.md's "Isolation model" table number them by.
 *
 * The order of the table is the security property; read it top to bottom. */
#include "sandbox/steps.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/rseq.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config/config.h"
#include "core/cleanup.h"
#include "core/limits.h"
#include "core/steptime.h"
#include "core/util.h"
#include "proto/chan.h"
#include "sandbox/arch.h"
#include "sandbox/caps.h"
#include "sandbox/mounts.h"
#include "sandbox/rlimits.h"
#include "sandbox/seccomp.h"

#define SBX_HOSTNAME "forkbox"
#define SBX_WORKSPACE "/workspace"

/* Step numbers are part of the exit status (70 + step): keep them stable. */
enum sbx_step {
    SBX_STEP_CLONE = 0,  /* checks right after clone, before the table */
    SBX_STEP_SIGNALS = 1,
    SBX_STEP_IDS = 2,
    SBX_STEP_MOUNTS = 3,
    SBX_STEP_NAMESPACES = 4,
    SBX_STEP_RLIMITS = 5,
    SBX_STEP_FDS = 6,
    SBX_STEP_PRIVS = 7,
    SBX_STEP_SECCOMP = 8,
    SBX_STEP_INIT = 9,
};

/* What failed, for the step's log frame: -errno (-EIO if errno is 0). */
static int set_what(struct sbx_state *st, const char *what)
{
    return err_errno(st->what, sizeof st->what, "%s", what);
}

/* --- habit 4: report a setup failure as a `log` frame, then _exit --- */

/* A `log` frame on the channel: setup failures, and the one setup warning
 * (step 8). Blocking writes; nothing else is on the channel yet. */
static void send_log_frame(int chan_fd, const char *level, const char *msg)
{
    (void)chan_write_log(chan_fd, level, msg); /* proto/chan.h: allocation-free */
}

_Noreturn static void setup_failed(int chan_fd, enum sbx_step step, const char *name,
                                   const char *what, int err)
{
    char msg[400];
    snprintf(msg, sizeof msg, "sandbox setup: %s: %s%s%s", name, what, err ? ": " : "",
             err ? strerrordesc_np(err) : "");
    send_log_frame(chan_fd, "error", msg);
    _exit(SBX_EXIT_STEP_BASE + step);
}

/* --- the steps --- */

/* 1. First: die with the fork server, and start from a clean signal state
 * (the fork server blocks SIGCHLD for its signalfd). SIGPIPE and SIGXFSZ
 * stay as the inherited interpreter set them (ignored: EPIPE/EFBIG become
 * exceptions) and SIGINT keeps its KeyboardInterrupt handler. */
static int step_signals(const struct sbx_plan *p, struct sbx_state *st)
{
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
        return set_what(st, "PR_SET_PDEATHSIG");
    /* The fork server may have died before the prctl: then the "go" read
     * in step 2 sees EOF, since its write end is gone too. */
    sigset_t none;
    sigemptyset(&none);
    if (sigprocmask(SIG_SETMASK, &none, NULL) < 0)
        return set_what(st, "sigprocmask");
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP || sig == SIGPIPE || sig == SIGXFSZ ||
            sig == SIGINT)
            continue;
        sigaction(sig, &dfl, NULL); /* EINVAL for glibc's internal signals: fine */
    }
    return 0;
}

/* 2. Before touching any file: until the parent has written the id maps we
 * run as our host id, unmapped in here, with host root only as saved ids
 * (see clone_as; the fork path has dropped even those). Once they are
 * (sync 1), become uid/gid 0 of the namespace, i.e. our host id for all of
 * real, effective, saved and fs ids: host root is gone from our credentials
 * for good. The cgroup placement goes on meanwhile (step 4 waits for it). */
static int wait_mapped(struct sbx_state *st)
{
    unsigned char c = 0;
    ssize_t r;
    do
        r = read(st->sync_fd, &c, 1);
    while (r < 0 && errno == EINTR);
    if (r != 1 || c != SBX_MAPPED) {
        errno = r < 0 ? errno : ECHILD;
        return set_what(st, "waiting for the fork server's id maps");
    }
    return 0;
}

/* Sync 2: the cgroups are in place, or the placement failed. */
static int wait_go(struct sbx_state *st)
{
    unsigned char c[2] = {0, 0};
    ssize_t r;
    do
        r = read(st->sync_fd, c, 2);
    while (r < 0 && errno == EINTR);
    if (r == 1 && c[0] == SBX_NO_GO) { /* both bytes come in one write */
        ssize_t r2;
        do
            r2 = read(st->sync_fd, c + 1, 1);
        while (r2 < 0 && errno == EINTR);
        r += r2 > 0 ? r2 : 0;
    }
    close_and_reset(&st->sync_fd);
    steptime_mark(ST_C_GO);
    if (r == 2 && c[0] == SBX_NO_GO) {
        errno = c[1] ? c[1] : EIO;
        return set_what(st, "cgroup placement (by the fork server)");
    }
    if (r != 1 || c[0] != SBX_GO) {
        errno = r < 0 ? errno : ECHILD;
        return set_what(st, "waiting for the fork server's go");
    }
    return 0;
}

/* Both syncs at once: the fork path's middle process and the non-isolated
 * child, whose every step needs the placement done. */
static int wait_mapped_and_go(struct sbx_state *st)
{
    int r = wait_mapped(st);
    return r < 0 ? r : wait_go(st);
}

static int step_ids(const struct sbx_plan *p, struct sbx_state *st)
{
    int r = st->sync_fd >= 0 ? wait_mapped(st) : 0;
    if (r < 0)
        return r;
    /* gid first: after setresuid we could no longer change it. Groups were
     * cleared by the fork server (setgroups is denied in here). */
    if (setresgid(0, 0, 0) < 0)
        return set_what(st, "setresgid(0)");
    if (setresuid(0, 0, 0) < 0)
        return set_what(st, "setresuid(0)");
    /* We start non-dumpable (the fork server is: it changed its ids for the
     * clone), which hands our /proc/self files (mem, environ, ...) to host
     * root, unmapped in here: user code could not read its own memory.
     * Dumpable again, they belong to our uid. No other sandbox can name our
     * pids (sibling pid namespaces) to ptrace us. The id change above kept
     * our euid and fsuid (our host id before and after), so unlike a change
     * from host root it did not clear the parent-death signal of step 1. */
    if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) < 0)
        return set_what(st, "PR_SET_DUMPABLE");
    return 0;
}

/* 3. Filesystem (mounts.c): pivot into the root the fork server built and
 * add the turn's own mounts. Needs CAP_SYS_ADMIN in our user namespace, so
 * before the privilege drop; after step 2, so anything of the host still
 * reachable until the old root is detached is reached as the unprivileged
 * mapped uid. */
static int step_mounts(const struct sbx_plan *p, struct sbx_state *st)
{
    int r = mounts_enter(p->cfg, p->mounts, &st->tools_fd, st->what, sizeof st->what);
    st->tools_dir = p->cfg->tools_dir;
    st->workspace_dir = p->cfg->workdir[0] ? p->cfg->workdir : SBX_WORKSPACE; /* stream mode */
    return r;
}

/* Per-user-namespace caps (/proc/sys/user) written into ours in step 4.
 * The kernel charges each to (our namespace, our id) and then to (the
 * parent namespace, our namespace's owner), i.e. to our own host id, whose
 * host-wide limits (fs.inotify.*: 128 instances, ~190k watches per user
 * here) no one else shares. These caps keep one turn's share small. */
static const struct {
    const char *file;
    unsigned long long value;
} userns_caps[] = {
    /* Creating a user namespace needs no capability, and a nested one would
     * hand user code a fresh full set over new mount/net namespaces. This
     * holds whatever the seccomp policy allows. */
    {"/proc/sys/user/max_user_namespaces", 0},
    {"/proc/sys/user/max_inotify_instances", SBX_MAX_INOTIFY_INSTANCES},
    {"/proc/sys/user/max_inotify_watches", SBX_MAX_INOTIFY_WATCHES},
};

static int write_userns_caps(struct sbx_state *st)
{
    for (size_t i = 0; i < sizeof userns_caps / sizeof *userns_caps; i++) {
        char val[24];
        int n = snprintf(val, sizeof val, "%llu\n", userns_caps[i].value);
        int fd = open(userns_caps[i].file, O_WRONLY | O_CLOEXEC);
        ssize_t w = fd < 0 ? -1 : write(fd, val, (size_t)n);
        int e = errno;
        if (fd >= 0)
            close(fd);
        if (w != n) {
            errno = w < 0 ? e : EIO;
            snprintf(st->what, sizeof st->what, "write %s", userns_caps[i].file);
            return -errno;
        }
    }
    return 0;
}

/* 4. Namespace settings that need CAP_SYS_ADMIN (or CAP_SYS_RESOURCE) in
 * ours, so before the privilege drop, and our /proc, so after step 3:
 * - hostname;
 * - the per-user-namespace caps above: no nested user namespaces, a small
 *   share of inotify;
 * - last, once the parent says our cgroups are in place (sync 2), a cgroup
 *   namespace of our own, rooted at the turn's cgroup. Steps 2-4 ran while
 *   the cgroup helper placed us (only our setup code: no turn code runs
 *   before this), so its round trip overlaps them instead of preceding them.
 * The network namespace came made, its loopback up (netns.c): code that
 * talks to itself over 127.0.0.1 works; there is no other interface and no
 * route anywhere, and the host's user namespace owns it, so we hold no
 * capability over it. */
static int step_namespaces(const struct sbx_plan *p, struct sbx_state *st)
{
    if (sethostname(SBX_HOSTNAME, sizeof SBX_HOSTNAME - 1) < 0)
        return set_what(st, "sethostname");
    int r = write_userns_caps(st);
    if (r == 0 && st->sync_fd >= 0)
        r = wait_go(st);
    if (r == 0 && unshare(CLONE_NEWCGROUP) < 0)
        r = set_what(st, "unshare(CLONE_NEWCGROUP)");
    return r;
}

/* rlimits, after seccomp (the table's order, not this number, is the order):
 * step 8 sends the seccomp listener to the supervisor over a unix socket, and
 * the kernel caps fds in flight per host user against the *sender's*
 * RLIMIT_NOFILE. Since each sandbox has a host id of its own, no other turn
 * can have filled that cap before the listener goes (it once could: every
 * sandbox was one uid), so the order no longer matters for that, and costs
 * nothing. Lowering limits needs no privilege, and the policy allows
 * prlimit64 on the caller itself. Before init, so both processes carry the
 * limits (rlimits.c has the values and why). */
static int step_rlimits(const struct sbx_plan *p, struct sbx_state *st)
{
    int r = rlimits_apply(p->cfg);
    if (r < 0) {
        errno = -r;
        return set_what(st, "rlimits_apply");
    }
    return 0;
}

/* 6. After the mounts (our /dev/null is the new root's): nothing of the
 * fork server's may survive into user code — its control socket, signalfd,
 * stdio, other pooled children's fds. Keep exactly the channel, the tools fd
 * and (pooled) the warm socket; 0/1/2 on /dev/null. */
static int move_above_stdio(int *fd)
{
    if (*fd < 0 || *fd > 2)
        return 0;
    int n = fcntl(*fd, F_DUPFD_CLOEXEC, 3);
    if (n < 0)
        return -1;
    close(*fd);
    *fd = n;
    return 0;
}

static int step_fds(const struct sbx_plan *p, struct sbx_state *st)
{
    if (move_above_stdio(&st->chan_fd) < 0 || move_above_stdio(&st->tools_fd) < 0 ||
        move_above_stdio(&st->warm_fd) < 0 || move_above_stdio(&steptime_fd) < 0)
        return set_what(st, "move fds above stdio");
    /* The kept fds in ascending order; close every gap above stdio. */
    const int kept[] = {st->chan_fd, st->tools_fd, st->warm_fd, steptime_fd};
    int keep[4], n = 0;
    for (int i = 0; i < 4; i++) {
        int fd = kept[i];
        if (fd < 0)
            continue;
        int j = n++;
        for (; j > 0 && keep[j - 1] > fd; j--)
            keep[j] = keep[j - 1];
        keep[j] = fd;
    }
    unsigned from = 3;
    for (int i = 0; i <= n; i++) {
        unsigned to = i < n ? (unsigned)keep[i] : ~0u; /* close [from, to) */
        if (to > from && close_range(from, i < n ? to - 1 : ~0u, 0) < 0)
            return set_what(st, "close_range");
        if (i < n)
            from = (unsigned)keep[i] + 1;
    }
    int null = open("/dev/null", O_RDWR); /* lands on 0 if 0 was free */
    if (null < 0)
        return set_what(st, "open /dev/null");
    for (int fd = 0; fd <= 2; fd++)
        if (fd != null && dup2(null, fd) < 0)
            return set_what(st, "dup2 /dev/null");
    if (null > 2)
        close(null);
    return 0;
}

/* 7. Drop privilege last among the namespace steps: everything above needs
 * it. setsid() detaches from the daemon's session and terminal. */
static int step_privs(const struct sbx_plan *p, struct sbx_state *st)
{
    if (setsid() < 0)
        return set_what(st, "setsid");
    int r = caps_drop_all(st->what, sizeof st->what);
    return r;
}

/* The listener goes to the supervisor as the first message on the channel:
 * a zero-length CHAN_NOTIFY carrying the fd. It waits in the socket buffer
 * (for a pooled sandbox, until the hand-out); the supervisor adopts it. */
static int send_listener(int chan_fd, int listener)
{
    uint8_t hdr[CHAN_HDR_LEN];
    chan_hdr_encode(hdr, CHAN_NOTIFY, 0);
    ssize_t n = fd_send(chan_fd, hdr, sizeof hdr, &listener, 1, 0);
    if (n < 0)
        return (int)n;
    return n == (ssize_t)sizeof hdr ? 0 : -EIO; /* 8 bytes on an empty stream socket */
}

/* 8. Seccomp last before user code (habit 2): the filter then only has to
 * allow what running code needs, not what setup needed. no_new_privs was
 * set in step 7.
 *
 * Counted refusals are user notifications: the listener leaves the sandbox
 * here, before init forks and long before user code runs, and our copy is
 * closed at once. Whoever held it could answer its own refused calls, even
 * with "let it run". If it cannot be sent (the kernel caps the fds in flight
 * per host user; our id is ours alone and no user code has run yet, so this
 * is not expected), the sandbox goes on without it: counted refusals then
 * fail with ENOSYS, uncounted, and the supervisor logs our warning. */
static int step_seccomp(const struct sbx_plan *p, struct sbx_state *st)
{
    if (p->flags & SBX_PLAN_NO_SECCOMP)
        return 0;
    if (!p->policy) {
        errno = EINVAL;
        return set_what(st, "no compiled policy");
    }
    int listener = -1;
    int r = policy_install(p->policy, &listener);
    if (r < 0) {
        errno = -r;
        return set_what(st, "policy_install");
    }
    if (listener < 0)
        return 0; /* the policy counts nothing */
    r = send_listener(st->chan_fd, listener);
    close(listener);
    if (r < 0) {
        char msg[200];
        snprintf(msg, sizeof msg, "seccomp: cannot pass the listener to the supervisor (%s): "
                 "refused calls are not counted in this turn and fail with ENOSYS",
                 strerrordesc_np(-r));
        send_log_frame(st->chan_fd, "warning", msg);
    }
    return 0;
}

/* --- 9. init ---------------------------------------------------------
 *
 * Pid 1 of the namespace reaps every orphan and leaves with the runtime's
 * status (the kernel then kills what is left in the namespace): its exit
 * code when that is below 128, 128 + the signal that killed it, or 255 for
 * an exit code of 128 or more (rare: os._exit(200)), so that the fork
 * server's wait status of init tells an exit from a signal (SANDBOX_STATUS
 * below; the supervisor's close reason is built from it). Signals sent
 * from inside the namespace cannot reach a pid 1 that has no handlers, so
 * user code cannot kill it; the supervisor kills it from outside.
 *
 * Init and the runtime share one address space (CLONE_VM without
 * CLONE_THREAD: two processes, one mm). A plain fork here would copy the
 * page tables of a whole interpreter for a process that only ever calls
 * wait4, and tear them down again at the end of the turn: about 15% of the
 * CPU a one-block turn costs, plus init's own copied pages (PSS).
 *
 * The price is discipline in init: it runs on its own small stack, with
 * every signal blocked, and makes raw system calls only. The thread pointer
 * (and so errno, the stack guard and glibc's state) belongs to the runtime,
 * which keeps the original stack. Sharing the memory gives user code nothing
 * it did not have: init carries the same credentials, namespaces and filter,
 * and if it is corrupted and dies, the turn ends. */

#define SANDBOX_STATUS(st)                                                              \
    (WIFEXITED(st) ? (WEXITSTATUS(st) < 128 ? WEXITSTATUS(st) : 255) : 128 + WTERMSIG(st))

static char init_stack[16384] __attribute__((aligned(64)));

/* A raw clone leaves the child without glibc's robust mutex list. */
static void restore_robust_list(const struct sbx_plan *p)
{
    if (p->robust_head)
        syscall(SYS_set_robust_list, p->robust_head, p->robust_len);
}

/* The calling thread's rseq area, registered by glibc (sys/rseq.h). */
static void *rseq_area(void)
{
    if (__rseq_size == 0)
        return NULL; /* glibc did not register one (tunable, old kernel) */
    return arch_thread_pointer() + __rseq_offset;
}

#define RSEQ_LEN 32 /* the original struct rseq, which glibc 2.36 registers */

__attribute__((noreturn, used, no_sanitize_address, no_sanitize("undefined")))
static void init_main(long worker)
{
    /* The rseq area sits in the runtime's thread control block: hand it
     * over (the kernel would otherwise keep writing init's cpu into it). */
    void *rs = rseq_area();
    if (rs)
        arch_syscall4(SYS_rseq, (long)rs, RSEQ_LEN, RSEQ_FLAG_UNREGISTER, RSEQ_SIG);
    /* Init needs no fd; the channel must close when the runtime's copy does. */
    arch_syscall3(SYS_close_range, 0, ~0U, 0);
    for (;;) {
        int status = 0;
        long pid = arch_syscall4(SYS_wait4, -1, (long)&status, __WALL, 0);
        if (pid == worker)
            arch_syscall3(SYS_exit_group, SANDBOX_STATUS(status), 0, 0);
        if (pid < 0 && pid != -EINTR)
            arch_syscall3(SYS_exit_group, 127, 0, 0);
    }
}

/* clone(CLONE_VM | CLONE_CHILD_SETTID | SIGCHLD) on the current stack. The
 * child (the runtime) returns 0 here and carries on as if from a fork. The
 * parent (init) never returns: before touching memory it moves to init_stack
 * and calls init_main(child). Returns -errno if there is no child. */
static long clone_init(pid_t *tid_addr)
{
    return arch_clone_init(CLONE_VM | CLONE_CHILD_SETTID | SIGCHLD, tid_addr,
                           init_stack + sizeof init_stack, init_main);
}

/* Without the tid address (sbx_tid_probe failed) only glibc's fork is safe;
 * init is then a copy, on the original stack. */
_Noreturn static void run_forked_init(pid_t worker)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, __WALL);
        if (pid == worker)
            _exit(SANDBOX_STATUS(status));
        if (pid < 0 && errno != EINTR)
            _exit(127);
    }
}

/* 9. A minimal init as pid 1, the runtime as its child (pid 2). As pid 1 the
 * runtime would ignore its own kill(getpid(), SIGKILL), and orphans reparented
 * to it would stay zombies for the rest of the turn, counting against the
 * pids limit. Last, so both processes carry every restriction above; the
 * clone has no namespace flag, which the policy allows. */
static int step_init(const struct sbx_plan *p, struct sbx_state *st)
{
    if (!p->tid_addr) {
        pid_t worker = fork();
        if (worker < 0)
            return set_what(st, "fork");
        if (worker > 0) {
            close(st->chan_fd);
            if (st->tools_fd >= 0)
                close(st->tools_fd);
            if (st->warm_fd >= 0)
                close(st->warm_fd);
            run_forked_init(worker);
        }
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        return 0;
    }
    /* Init must not see a signal before it leaves this stack, nor ever run a
     * handler; the runtime restores the mask. Init gets a copy of the fd
     * table and closes all of it. */
    sigset_t all, old;
    sigfillset(&all);
    if (sigprocmask(SIG_SETMASK, &all, &old) < 0)
        return set_what(st, "sigprocmask");
    long worker = clone_init(p->tid_addr);
    if (worker < 0) {
        errno = (int)-worker;
        return set_what(st, "clone");
    }
    /* The runtime (pid 2), on the original stack. */
    steptime_split();
    void *rs = rseq_area();
    if (rs)
        syscall(SYS_rseq, rs, RSEQ_LEN, 0, RSEQ_SIG); /* best effort: sched_getcpu() only */
    restore_robust_list(p);
    sigprocmask(SIG_SETMASK, &old, NULL);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    return 0;
}

/* Non-isolated mode (benchmarks only): no namespaces, mounts, caps or
 * seccomp. The child waits for the parent (cgroups), then runs as its host
 * id when we are root, in its per-turn dir. */
static int step_ids_plain(const struct sbx_plan *p, struct sbx_state *st)
{
    int r = st->sync_fd >= 0 ? wait_mapped_and_go(st) : 0;
    if (r < 0)
        return r;
    if (geteuid() != 0)
        return 0;
    if (setresgid(st->id, st->id, st->id) < 0)
        return set_what(st, "setresgid");
    if (setresuid(st->id, st->id, st->id) < 0)
        return set_what(st, "setresuid");
    /* The id change cleared the parent-death signal of step 1. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
        return set_what(st, "PR_SET_PDEATHSIG");
    return 0;
}

static int step_dirs_plain(const struct sbx_plan *p, struct sbx_state *st)
{
    st->tools_fd = open(st->tools_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (st->tools_fd < 0)
        return set_what(st, "open the turn's tools dir");
    return 0;
}

static int step_session_plain(const struct sbx_plan *p, struct sbx_state *st)
{
    return setsid() < 0 ? set_what(st, "setsid") : 0;
}

struct sbx_step_def {
    enum sbx_step id;
    const char *name;
    int (*fn)(const struct sbx_plan *, struct sbx_state *);
    enum steptime_mark mark; /* --step-times: marked when the step is done (ST_N: the
                                step marks itself, or is not timed) */
};

/* The order is the security property: see each step's comment. */
static const struct sbx_step_def isolated_steps[] = {
    {SBX_STEP_SIGNALS, "signals", step_signals, ST_N},
    {SBX_STEP_IDS, "ids", step_ids, ST_C_IDS},
    {SBX_STEP_MOUNTS, "mounts", step_mounts, ST_N},
    {SBX_STEP_NAMESPACES, "namespaces", step_namespaces, ST_C_NAMESPACES},
    {SBX_STEP_FDS, "fds", step_fds, ST_C_FDS},
    {SBX_STEP_PRIVS, "privileges", step_privs, ST_C_PRIVS},
    {SBX_STEP_SECCOMP, "seccomp", step_seccomp, ST_C_SECCOMP},
    {SBX_STEP_RLIMITS, "rlimits", step_rlimits, ST_C_RLIMITS},
    {SBX_STEP_INIT, "init", step_init, ST_N},
};

static const struct sbx_step_def plain_steps[] = {
    {SBX_STEP_SIGNALS, "signals", step_signals, ST_N},
    {SBX_STEP_IDS, "ids", step_ids_plain, ST_N},
    {SBX_STEP_MOUNTS, "dirs", step_dirs_plain, ST_N},
    {SBX_STEP_RLIMITS, "rlimits", step_rlimits, ST_N},
    {SBX_STEP_FDS, "fds", step_fds, ST_N},
    {SBX_STEP_PRIVS, "session", step_session_plain, ST_N},
};

_Noreturn void sbx_child_main(const struct sbx_plan *p, struct sbx_state *st)
{
    steptime_fd = st->times_fd;
    steptime_mark(ST_C_START);
    /* The raw clone left glibc's cached tid as the fork server's unless
     * CLONE_CHILD_SETTID pointed at it; raise(), abort() and recursive
     * mutexes depend on it. Cheap enough to check in every child. */
    if (p->tid_addr && *p->tid_addr != (pid_t)syscall(SYS_gettid))
        setup_failed(st->chan_fd, SBX_STEP_CLONE, "clone", "glibc's cached thread id is stale",
                     0);
    restore_robust_list(p);
    const struct sbx_step_def *steps = p->cfg->isolate ? isolated_steps : plain_steps;
    size_t n = p->cfg->isolate ? sizeof isolated_steps / sizeof *isolated_steps
                               : sizeof plain_steps / sizeof *plain_steps;
    for (size_t i = 0; i < n; i++) {
        st->what[0] = '\0';
        errno = 0;
        int r = steps[i].fn(p, st);
        if (r < 0)
            setup_failed(st->chan_fd, steps[i].id, steps[i].name, st->what, -r);
        if (steps[i].mark != ST_N)
            steptime_mark(steps[i].mark);
    }
    /* The interpreter is re-armed (PyOS_AfterFork_Child) only now, in the
     * runtime process (pid 2), after init forked off: no step touches it,
     * and the pages the re-arming writes are then not copied into init as
     * well (init's PSS per idle turn 0.70 -> 0.13 MB, measured). */
    if (p->hooks->after_fork)
        p->hooks->after_fork();
    steptime_mark(ST_R_AFTERFORK);
    p->hooks->serve(st->chan_fd, st->tools_fd, st->warm_fd, st->tools_dir, st->workspace_dir);
    _exit(SBX_EXIT_STEP_BASE); /* not reached: serve never returns */
}

/* --- the fork path's middle process ---
 *
 * The fallback when glibc's tid field could not be located: fork (glibc
 * keeps its own state right), unshare everything but the pid namespace
 * there, and fork once more so the sandbox is pid 1 of a new pid namespace.
 * The middle process only waits and mirrors the sandbox's exit status. About
 * 2.5 ms slower with a large parent (ARCHITECTURE.md). */
_Noreturn void sbx_middle_main(const struct sbx_plan *p, struct sbx_state *st, int ack_fd)
{
    /* Host root goes for good before the user namespace exists: the
     * namespace is then owned by the sandbox's id (see clone_as) and no
     * process of the sandbox holds host root in any of its ids. First, as
     * an id change clears the parent-death signal. */
    if (setresgid(st->id, st->id, st->id) < 0 || setresuid(st->id, st->id, st->id) < 0)
        setup_failed(st->chan_fd, SBX_STEP_CLONE, "fork path", "become the sandbox's id", errno);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
        setup_failed(st->chan_fd, SBX_STEP_CLONE, "fork path", "PR_SET_PDEATHSIG", errno);
    /* The network namespace is the one we were forked in (netns.h). */
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS) < 0)
        setup_failed(st->chan_fd, SBX_STEP_CLONE, "fork path", "unshare", errno);
    char c = SBX_UNSHARED;
    if (write(ack_fd, &c, 1) != 1)
        _exit(SBX_EXIT_STEP_BASE);
    close(ack_fd);
    /* Both syncs: maps written and cgroup joined; the sandbox inherits both. */
    if (wait_mapped_and_go(st) < 0)
        _exit(SBX_EXIT_STEP_BASE);
    int life[2];
    if (pipe2(life, O_CLOEXEC) < 0)
        setup_failed(st->chan_fd, SBX_STEP_CLONE, "fork path", "pipe", errno);
    pid_t pid = fork();
    if (pid < 0)
        setup_failed(st->chan_fd, SBX_STEP_CLONE, "fork path", "fork", errno);
    if (pid == 0) {
        close(life[1]);
        /* If we were orphaned before PDEATHSIG took hold, the pipe says so
         * (getppid() is 0 for a pid namespace's init). */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
            _exit(SBX_EXIT_STEP_BASE);
        char b;
        int fl = fcntl(life[0], F_GETFL);
        fcntl(life[0], F_SETFL, fl | O_NONBLOCK);
        if (read(life[0], &b, 1) == 0)
            _exit(SBX_EXIT_STEP_BASE);
        close(life[0]);
        sbx_child_main(p, st);
    }
    close(life[0]);
    /* Keep only the life pipe: the channel and the fork server's fds
     * belong to the sandbox or to nobody. */
    close_range(0, (unsigned)life[1] - 1, 0);
    close_range((unsigned)life[1] + 1, ~0u, 0);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}
