/* Spawning one sandbox (see steps.h).
 *
 * Parent (fork server):  socketpair + sync pipe (+ the warm socket for a
 *   pooled spawn) -> ONE clone() with every namespace flag and CLONE_PIDFD,
 *   made as the sandbox's own host id (clone_as) -> write
 *   setgroups/uid_map/gid_map -> cgroup placement -> "go" byte
 *   (sync 1) -> hand the channel end and the pidfd to the caller.
 * Child: the ordered step table below, then hooks->serve(). A failing step
 *   writes a `log` error frame on the channel and exits 70 + step (habit 4),
 *   so the supervisor can tell "setup failed" from "user code failed".
 *
 * The order of the table is the security property; read it top to bottom. */
#include "sandbox/steps.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/rseq.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "proto/chan.h"
#include "sandbox/caps.h"
#include "sandbox/cgroups.h"
#include "sandbox/rlimits.h"
#include "sandbox/mounts.h"
#include "sandbox/seccomp.h"

#define SBX_HOSTNAME "forkbox"
#define SBX_WORKSPACE "/workspace"
#define SBX_GO 'G'
#define SBX_NO_GO 'E' /* followed by one byte: the errno of the failed placement */
#define SBX_UNSHARED 'U'

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

/* The child's mutable state while the steps run. */
struct sbx_state {
    int chan_fd;        /* the child's end of the channel */
    int sync_fd;        /* read end of the parent's "go" pipe; -1 once consumed */
    int tools_fd;       /* writable tools dir (O_DIRECTORY), from step 3 */
    int warm_fd;        /* pooled spawns: the child's end of the warm socket, else -1 */
    uint32_t id;        /* the sandbox's host uid and gid */
    const char *tools_dir;
    const char *workspace_dir;
    char what[256];     /* what failed, for the error frame */
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int set_what(struct sbx_state *st, const char *what)
{
    int e = errno ? errno : EIO;
    snprintf(st->what, sizeof st->what, "%s", what);
    return -e;
}

/* --- habit 4: report a setup failure as a `log` frame, then _exit --- */

static size_t json_escape(char *out, size_t room, const char *s)
{
    size_t n = 0;
    for (; *s && n + 7 < room; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[n++] = '\\';
            out[n++] = (char)c;
        } else if (c < 0x20) {
            n += (size_t)snprintf(out + n, room - n, "\\u%04x", c);
        } else {
            out[n++] = c < 0x80 ? (char)c : '?'; /* keep the frame valid UTF-8 */
        }
    }
    out[n] = '\0';
    return n;
}

/* A `log` frame on the channel: setup failures, and the one setup warning
 * (step 8). Blocking writes; nothing else is on the channel yet. */
static void send_log_frame(int chan_fd, const char *level, const char *msg)
{
    char esc[600], buf[CHAN_HDR_LEN + 700];
    json_escape(esc, sizeof esc, msg);
    int n = snprintf(buf + CHAN_HDR_LEN, sizeof buf - CHAN_HDR_LEN,
                     "{\"level\":\"%s\",\"msg\":\"%s\",\"kind\":\"log\"}\n", level, esc);
    chan_hdr_encode((uint8_t *)buf, CHAN_FRAME, (uint32_t)n);
    size_t len = CHAN_HDR_LEN + (size_t)n, off = 0;
    while (chan_fd >= 0 && off < len) {
        ssize_t w = write(chan_fd, buf + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += (size_t)w;
    }
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
 * (see clone_as; the fork path has dropped even those). After "go", become
 * uid/gid 0 of the namespace, i.e. our host id for all of real, effective,
 * saved and fs ids: host root is gone from our credentials for good. The
 * cgroup namespace is created here rather than in clone() so that its root
 * is the turn's cgroup, which the parent has just attached. */
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

static int step_ids(const struct sbx_plan *p, struct sbx_state *st)
{
    int r = st->sync_fd >= 0 ? wait_go(st) : 0;
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
    if (unshare(CLONE_NEWCGROUP) < 0)
        return set_what(st, "unshare(CLONE_NEWCGROUP)");
    return 0;
}

/* 3. Filesystem (mounts.c): pivot into the root the fork server built and
 * add the turn's own mounts. Needs CAP_SYS_ADMIN in our user namespace, so
 * before the privilege drop; after step 2, so anything of the host still
 * reachable until the old root is detached is reached as the unprivileged
 * mapped uid. */
static int step_mounts(const struct sbx_plan *p, struct sbx_state *st)
{
    int r = mounts_setup(p->cfg, p->mounts, &st->tools_fd, st->what, sizeof st->what);
    st->tools_dir = p->cfg->tools_dir;
    st->workspace_dir = SBX_WORKSPACE;
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

/* 4. Namespace settings that need CAP_SYS_ADMIN/CAP_NET_ADMIN (or
 * CAP_SYS_RESOURCE) in ours, so before the privilege drop, and our /proc,
 * so after step 3:
 * - hostname;
 * - loopback up, so code that talks to itself over 127.0.0.1 works; the
 *   network namespace has no other interface and no route anywhere;
 * - the per-user-namespace caps above: no nested user namespaces, a small
 *   share of inotify. */
static int step_namespaces(const struct sbx_plan *p, struct sbx_state *st)
{
    if (sethostname(SBX_HOSTNAME, sizeof SBX_HOSTNAME - 1) < 0)
        return set_what(st, "sethostname");
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return set_what(st, "socket");
    struct ifreq ifr = {0};
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    int r = ioctl(s, SIOCGIFFLAGS, &ifr);
    if (r == 0) {
        ifr.ifr_flags |= IFF_UP;
        r = ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    int e = errno;
    close(s);
    if (r < 0) {
        errno = e;
        return set_what(st, "bring up lo");
    }
    return write_userns_caps(st);
}

/* rlimits, after seccomp (the table's order, not this number, is the order):
 * step 8 sends the seccomp listener to the supervisor over a unix socket, and
 * the kernel caps fds in flight per host user against the *sender's*
 * RLIMIT_NOFILE. Since each sandbox has a host id of its own, no other turn
 * can have filled that cap before the listener goes (it once could: every
 * sandbox was one uid), so the order no longer matters for that, and costs
 * nothing. Lowering limits needs no privilege, and the policy allows
 * prlimit64 on the caller itself. Before init, so both processes carry the
 * limits (limits.c has the values and why). */
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
        move_above_stdio(&st->warm_fd) < 0)
        return set_what(st, "move fds above stdio");
    /* The kept fds in ascending order; close every gap above stdio. */
    int keep[3], n = 0;
    for (int i = 0; i < 3; i++) {
        int fd = i == 0 ? st->chan_fd : i == 1 ? st->tools_fd : st->warm_fd;
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
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = hdr, .iov_len = sizeof hdr};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
                       .msg_controllen = sizeof ctl.b};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &listener, sizeof(int));
    ssize_t n;
    do
        n = sendmsg(chan_fd, &m, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
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

static long raw_syscall3(long n, long a, long b, long c)
{
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"(n), "D"(a), "S"(b), "d"(c)
                     : "rcx", "r11", "memory");
    return ret;
}

static long raw_syscall4(long n, long a, long b, long c, long d)
{
    register long r10 __asm__("r10") = d;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
                     : "rcx", "r11", "memory");
    return ret;
}

/* The calling thread's rseq area, registered by glibc (sys/rseq.h). */
static void *rseq_area(void)
{
    if (__rseq_size == 0)
        return NULL; /* glibc did not register one (tunable, old kernel) */
    char *tp;
    __asm__("mov %%fs:0, %0" : "=r"(tp));
    return tp + __rseq_offset;
}

#define RSEQ_LEN 32 /* the original struct rseq, which glibc 2.36 registers */

__attribute__((noreturn, used, no_sanitize_address, no_sanitize("undefined")))
static void init_main(long worker)
{
    /* The rseq area sits in the runtime's thread control block: hand it
     * over (the kernel would otherwise keep writing init's cpu into it). */
    void *rs = rseq_area();
    if (rs)
        raw_syscall4(SYS_rseq, (long)rs, RSEQ_LEN, RSEQ_FLAG_UNREGISTER, RSEQ_SIG);
    /* Init needs no fd; the channel must close when the runtime's copy does. */
    raw_syscall3(SYS_close_range, 0, ~0U, 0);
    for (;;) {
        int status = 0;
        long pid = raw_syscall4(SYS_wait4, -1, (long)&status, __WALL, 0);
        if (pid == worker)
            raw_syscall3(SYS_exit_group, SANDBOX_STATUS(status), 0, 0);
        if (pid < 0 && pid != -EINTR)
            raw_syscall3(SYS_exit_group, 127, 0, 0);
    }
}

/* clone(CLONE_VM | CLONE_CHILD_SETTID | SIGCHLD) on the current stack. The
 * child (the runtime) returns 0 here and carries on as if from a fork. The
 * parent (init) never returns: before touching memory it moves to init_stack
 * and calls init_main(child). Returns -errno if there is no child. */
static long clone_init(pid_t *tid_addr)
{
    register long r10 __asm__("r10") = (long)tid_addr;
    register long r8 __asm__("r8") = 0;
    long ret;
    __asm__ volatile("syscall\n\t"
                     "test %%rax, %%rax\n\t"
                     "jle 1f\n\t"
                     "mov %[stack], %%rsp\n\t"
                     "mov %%rax, %%rdi\n\t"
                     "call *%[fn]\n\t"
                     "ud2\n"
                     "1:"
                     : "=a"(ret)
                     : "0"((long)SYS_clone), "D"((long)(CLONE_VM | CLONE_CHILD_SETTID | SIGCHLD)),
                       "S"(0L), "d"(0L), "r"(r10), "r"(r8),
                       [stack] "r"(init_stack + sizeof init_stack), [fn] "r"(init_main)
                     : "rcx", "r11", "memory");
    return ret;
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
    int r = st->sync_fd >= 0 ? wait_go(st) : 0;
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
};

/* The order is the security property: see each step's comment. */
static const struct sbx_step_def isolated_steps[] = {
    {SBX_STEP_SIGNALS, "signals", step_signals},
    {SBX_STEP_IDS, "ids", step_ids},
    {SBX_STEP_MOUNTS, "mounts", step_mounts},
    {SBX_STEP_NAMESPACES, "namespaces", step_namespaces},
    {SBX_STEP_FDS, "fds", step_fds},
    {SBX_STEP_PRIVS, "privileges", step_privs},
    {SBX_STEP_SECCOMP, "seccomp", step_seccomp},
    {SBX_STEP_RLIMITS, "rlimits", step_rlimits},
    {SBX_STEP_INIT, "init", step_init},
};

static const struct sbx_step_def plain_steps[] = {
    {SBX_STEP_SIGNALS, "signals", step_signals},
    {SBX_STEP_IDS, "ids", step_ids_plain},
    {SBX_STEP_MOUNTS, "dirs", step_dirs_plain},
    {SBX_STEP_RLIMITS, "rlimits", step_rlimits},
    {SBX_STEP_FDS, "fds", step_fds},
    {SBX_STEP_PRIVS, "session", step_session_plain},
};

_Noreturn static void child_main(const struct sbx_plan *p, struct sbx_state *st)
{
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
    }
    /* The interpreter is re-armed (PyOS_AfterFork_Child) only now, in the
     * runtime process (pid 2), after init forked off: no step touches it,
     * and the pages the re-arming writes are then not copied into init as
     * well (init's PSS per idle turn 0.70 -> 0.13 MB, measured). */
    if (p->hooks->after_fork)
        p->hooks->after_fork();
    p->hooks->serve(st->chan_fd, st->tools_fd, st->warm_fd, st->tools_dir, st->workspace_dir);
    _exit(SBX_EXIT_STEP_BASE); /* not reached: serve never returns */
}

/* --- parent side --- */

int sbx_tid_probe(pid_t **out)
{
    *out = NULL;
    pid_t tid = (pid_t)syscall(SYS_gettid);
    uintptr_t self = (uintptr_t)pthread_self(), end = self + 2048;
    /* Never read past the mapping that holds our struct pthread. */
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return -errno;
    char line[512];
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && self >= lo && self < hi) {
            if (end > hi)
                end = hi;
            found = true;
            break;
        }
    }
    fclose(f);
    if (!found)
        return -ENOENT;
    pid_t *hit = NULL;
    int matches = 0;
    for (uintptr_t a = self; a + sizeof(pid_t) <= end; a += sizeof(pid_t)) {
        if (*(pid_t *)a == tid) {
            hit = (pid_t *)a;
            matches++;
        }
    }
    if (matches == 0)
        return -ENOENT;
    if (matches > 1)
        return -EEXIST;
    *out = hit;
    return 0;
}

static int write_proc(int dirfd, const char *name, const char *text)
{
    int fd = openat(dirfd, name, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t n = strlen(text);
    ssize_t w = write(fd, text, n);
    int e = errno;
    close(fd);
    if (w != (ssize_t)n)
        return w < 0 ? -e : -EIO;
    return 0;
}

/* Map exactly one id each way: 0 in the namespace is the sandbox's own
 * unprivileged host id. Written by us, the parent, as root again (mapping an
 * id needs CAP_SETUID/CAP_SETGID over the parent namespace in the writer;
 * the child could only map the id it runs as, but must not choose). */
static int write_maps(pid_t pid, uint32_t id, char *err, size_t errlen)
{
    if (id == 0) {
        snprintf(err, errlen, "refusing to map host root into a sandbox");
        return -EPERM;
    }
    char path[32], map[64];
    snprintf(path, sizeof path, "/proc/%d", (int)pid);
    _cleanup_close_ int dfd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        snprintf(err, errlen, "open %s: %s", path, strerror(errno));
        return -errno;
    }
    int r = write_proc(dfd, "setgroups", "deny");
    if (r == 0) {
        snprintf(map, sizeof map, "0 %u 1\n", id);
        r = write_proc(dfd, "uid_map", map);
    }
    if (r == 0) {
        r = write_proc(dfd, "gid_map", map);
    }
    if (r < 0)
        snprintf(err, errlen, "writing the id maps of %d: %s", (int)pid, strerror(-r));
    return r;
}

static int send_go(int fd)
{
    char c = SBX_GO;
    ssize_t w;
    do
        w = write(fd, &c, 1);
    while (w < 0 && errno == EINTR);
    return w == 1 ? 0 : -EPIPE;
}

int sbx_child_go(int go_fd, int err)
{
    unsigned char c[2] = {SBX_NO_GO, (unsigned char)(err > 0 && err < 256 ? err : EIO)};
    ssize_t w;
    do
        w = err ? write(go_fd, c, 2) : write(go_fd, &(char){SBX_GO}, 1);
    while (w < 0 && errno == EINTR);
    int e = errno;
    close(go_fd);
    errno = e;
    return w == (err ? 2 : 1) ? 0 : -EPIPE;
}

/* Parent-side work between clone and "go": maps (isolated) and cgroups
 * (unless deferred to whoever calls sbx_child_go). */
static int place_child(const struct sbx_plan *p, pid_t pid, uint32_t id, bool maps, bool cgroups,
                       char *err, size_t errlen)
{
    int r = maps ? write_maps(pid, id, err, errlen) : 0;
    if (r == 0 && cgroups && p->cgroups) {
        r = cgroups_attach(p->cgroups, pid, p->cfg);
        if (r < 0)
            snprintf(err, errlen, "cgroup placement of %d: %s", (int)pid, strerror(-r));
    }
    return r;
}

static void kill_child(struct sbx_child *c)
{
    if (c->pidfd >= 0)
        pidfd_send_signal(c->pidfd, SIGKILL, NULL, 0);
    else if (c->pid > 0)
        kill(c->pid, SIGKILL);
}

/* The fallback when glibc's tid field could not be located: fork (glibc
 * keeps its own state right), unshare everything but the pid namespace
 * there, and fork once more so the sandbox is pid 1 of a new pid namespace.
 * The middle process only waits and mirrors the sandbox's exit status. About
 * 2.5 ms slower with a large parent (ARCHITECTURE.md). */
_Noreturn static void middle_main(const struct sbx_plan *p, struct sbx_state *st, int ack_fd)
{
    /* Host root goes for good before the user namespace exists: the
     * namespace is then owned by the sandbox's id (see clone_as) and no
     * process of the sandbox holds host root in any of its ids. First, as
     * an id change clears the parent-death signal. */
    if (setresgid(st->id, st->id, st->id) < 0 || setresuid(st->id, st->id, st->id) < 0)
        setup_failed(st->chan_fd, SBX_STEP_CLONE, "fork path", "become the sandbox's id", errno);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
        setup_failed(st->chan_fd, SBX_STEP_CLONE, "fork path", "PR_SET_PDEATHSIG", errno);
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC |
                CLONE_NEWUTS) < 0)
        setup_failed(st->chan_fd, SBX_STEP_CLONE, "fork path", "unshare", errno);
    char c = SBX_UNSHARED;
    if (write(ack_fd, &c, 1) != 1)
        _exit(SBX_EXIT_STEP_BASE);
    close(ack_fd);
    /* sync 1: maps written and cgroup joined; the sandbox inherits both. */
    if (wait_go(st) < 0)
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
        child_main(p, st);
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

static int spawn_forked(const struct sbx_plan *p, uint32_t id, unsigned spawn_flags,
                        struct sbx_child *out, int chan[2], int sync[2], int warm_child,
                        char *err, size_t errlen)
{
    int ack[2];
    if (pipe2(ack, O_CLOEXEC) < 0) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        return -errno;
    }
    uint64_t t0 = mono_ns();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(ack[0]);
        close(ack[1]);
        snprintf(err, errlen, "fork: %s", strerror(e));
        return -e;
    }
    if (pid == 0) {
        close(ack[0]);
        close(sync[1]);
        close(chan[0]);
        if (out->warm_fd >= 0)
            close(out->warm_fd);
        struct sbx_state st = {.chan_fd = chan[1], .sync_fd = sync[0], .tools_fd = -1,
                               .warm_fd = warm_child, .id = id};
        middle_main(p, &st, ack[1]);
    }
    close(ack[1]);
    out->pid = pid;
    out->pidfd = pidfd_open(pid, 0);
    char c = 0;
    ssize_t r;
    do
        r = read(ack[0], &c, 1);
    while (r < 0 && errno == EINTR);
    close(ack[0]);
    if (out->pidfd < 0 || r != 1 || c != SBX_UNSHARED) {
        snprintf(err, errlen, "fork path: the child did not unshare");
        return -ECHILD;
    }
    bool defer = spawn_flags & SBX_SPAWN_DEFER_GO;
    int ret = place_child(p, pid, id, true, !defer, err, errlen);
    if (ret == 0 && defer) {
        out->go_fd = sync[1];
        sync[1] = -1;
    } else if (ret == 0 && (ret = send_go(sync[1])) < 0) {
        snprintf(err, errlen, "releasing the child: %s", strerror(-ret));
    }
    out->spawn_ns = mono_ns() - t0;
    return ret;
}

/* Non-isolated mode: a per-turn directory under /tmp with tools/ and
 * workspace/, removed when the child is reaped. */
static int make_turn_dir(uint32_t id, char **out, char *err, size_t errlen)
{
    char tmpl[] = "/tmp/forkbox-turn-XXXXXX";
    if (!mkdtemp(tmpl)) {
        snprintf(err, errlen, "mkdtemp: %s", strerror(errno));
        return -errno;
    }
    char sub[sizeof tmpl + 16] = "";
    int r = 0;
    if (chmod(tmpl, 0755) < 0)
        r = -errno;
    for (int i = 0; r == 0 && i < 2; i++) {
        snprintf(sub, sizeof sub, "%s/%s", tmpl, i ? "workspace" : "tools");
        if (mkdir(sub, 0755) < 0 ||
            (geteuid() == 0 && chown(sub, id, id) < 0))
            r = -errno;
    }
    if (r == 0 && !(*out = strdup(tmpl)))
        r = -ENOMEM;
    if (r < 0) {
        snprintf(err, errlen, "turn dir %s: %s", tmpl, strerror(-r));
        if (sub[0])
            rmdir(sub);
        rmdir(tmpl);
    }
    return r;
}

/* rm -r below dirfd/name without following symlinks; the tree was written
 * by untrusted code. Depth-bounded (each level holds an fd). */
static int rm_tree_at(int at, const char *name, int depth)
{
    if (unlinkat(at, name, 0) == 0 || errno == ENOENT)
        return 0;
    if (errno != EISDIR || depth > 128)
        return -errno;
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -ENOMEM;
    }
    int r = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        int rr = rm_tree_at(dirfd(d), de->d_name, depth + 1);
        if (rr < 0 && r == 0)
            r = rr;
    }
    closedir(d);
    if (unlinkat(at, name, AT_REMOVEDIR) < 0 && r == 0)
        r = -errno;
    return r;
}

static void drop_turn_dir(struct sbx_child *c)
{
    if (c->turn_dir) {
        rm_tree_at(AT_FDCWD, c->turn_dir, 0);
        free(c->turn_dir);
        c->turn_dir = NULL;
    }
}

/* The clone of an isolated sandbox is made with the sandbox's host id as
 * our real and effective uid and gid; the saved ids stay host root, so we can
 * come back (clone_done). The kernel makes the creator's effective uid the
 * owner of a new user namespace, and charges what it counts per user to the
 * chain (namespace, uid) -> (parent namespace, owner): created by root, every
 * sandbox's processes, pending signals, inotify instances and watches were
 * also host root's, and one turn could exhaust root's share (and with it the
 * other turns'). Created by the sandbox's id, they are that id's alone.
 * The child starts with these credentials: its host id as real and effective
 * ids (unmapped until we write the maps) and host root only as saved ids,
 * which step 2 replaces. Until then no set*id call in it can name host root
 * (unmapped in its namespace), and no permission check grants anything on
 * the strength of a saved id.
 * Side effects on us: an euid change clears the parent-death signal
 * (clone_done re-arms it) and makes us non-dumpable (it stays so; a sandbox
 * undoes it for itself in step 2). We are single-threaded (CLONE_NEWUSER
 * requires it): no other thread ever runs with these ids. */
static int clone_as(uint32_t id, int *pdeath)
{
    if (prctl(PR_GET_PDEATHSIG, pdeath, 0, 0, 0) < 0 || setresgid(id, id, 0) < 0)
        return -errno;
    if (setresuid(id, id, 0) < 0) {
        int e = errno;
        if (setresgid(0, 0, 0) < 0)
            abort(); /* saved gid 0: cannot happen; never go on as the sandbox's gid */
        return -e;
    }
    return 0;
}

static void clone_done(int pdeath)
{
    /* Cannot fail (the saved ids are root); never go on as the sandbox's id. */
    if (setresuid(0, 0, 0) < 0 || setresgid(0, 0, 0) < 0)
        abort();
    if (pdeath)
        prctl(PR_SET_PDEATHSIG, pdeath, 0, 0, 0);
}

int sbx_spawn(const struct sbx_plan *p, uint32_t id, unsigned spawn_flags,
              struct sbx_child *out, char *err, size_t errlen)
{
    *out = (struct sbx_child){.pid = 0, .id = id, .pidfd = -1, .chan_fd = -1, .warm_fd = -1,
                              .go_fd = -1};
    const struct config *cfg = p->cfg;
    if (cfg->isolate && !p->mounts) {
        snprintf(err, errlen, "no sandbox root (mounts_build)");
        return -EINVAL;
    }
    if (cfg->isolate && (id == 0 || geteuid() != 0)) {
        snprintf(err, errlen, id ? "isolation needs root" : "refusing host id 0 for a sandbox");
        return -EPERM;
    }

    char tools_dir[64] = "", workspace_dir[64] = "";
    if (!cfg->isolate) {
        int r = make_turn_dir(id, &out->turn_dir, err, errlen);
        if (r < 0)
            return r;
        snprintf(tools_dir, sizeof tools_dir, "%s/tools", out->turn_dir);
        snprintf(workspace_dir, sizeof workspace_dir, "%s/workspace", out->turn_dir);
    }

    int chan[2], sync[2], warm[2] = {-1, -1};
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) < 0) {
        int e = errno;
        snprintf(err, errlen, "socketpair: %s", strerror(e));
        drop_turn_dir(out);
        return -e;
    }
    if (pipe2(sync, O_CLOEXEC) < 0) {
        int e = errno;
        close(chan[0]);
        close(chan[1]);
        snprintf(err, errlen, "pipe: %s", strerror(e));
        drop_turn_dir(out);
        return -e;
    }
    /* Pooled: a socket (not a pipe: the child sends with MSG_NOSIGNAL, and
     * the fork server may close its end first, when it hands the child out
     * before the warm-up is over). */
    if ((spawn_flags & SBX_SPAWN_POOLED) &&
        socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, warm) < 0) {
        int e = errno;
        close(chan[0]);
        close(chan[1]);
        close(sync[0]);
        close(sync[1]);
        snprintf(err, errlen, "socketpair: %s", strerror(e));
        drop_turn_dir(out);
        return -e;
    }
    out->warm_fd = warm[0];

    int ret;
    if (cfg->isolate && (!p->tid_addr || (p->flags & SBX_PLAN_FORCE_FORK))) {
        ret = spawn_forked(p, id, spawn_flags, out, chan, sync, warm[1], err, errlen);
    } else {
        /* ONE clone: every namespace at once is far cheaper than fork +
         * unshare + fork (ARCHITECTURE.md). CLONE_CHILD_SETTID repairs
         * glibc's cached tid in the child's copy of our TCB. */
        unsigned long flags = SIGCHLD | CLONE_PIDFD;
        if (cfg->isolate)
            flags |= CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC |
                     CLONE_NEWUTS;
        if (p->tid_addr)
            flags |= CLONE_CHILD_SETTID;
        int pidfd = -1, pdeath = 0, r;
        uint64_t t0 = mono_ns();
        long pid;
        if (!cfg->isolate && !p->tid_addr) {
            /* Without the tid address only glibc's own fork is safe. */
            pid = _Fork();
            if (pid > 0 && (pidfd = pidfd_open((pid_t)pid, 0)) < 0)
                kill((pid_t)pid, SIGKILL); /* reaped and released by the caller */
        } else if (cfg->isolate && (r = clone_as(id, &pdeath)) < 0) {
            errno = -r;
            pid = -1;
        } else {
            pid = syscall(SYS_clone, flags, NULL, &pidfd, p->tid_addr, 0);
            if (pid != 0 && cfg->isolate) {
                int e = errno;
                clone_done(pdeath);
                errno = e;
            }
        }
        if (pid == 0) {
            close(sync[1]);
            close(chan[0]);
            if (warm[0] >= 0)
                close(warm[0]);
            struct sbx_state st = {.chan_fd = chan[1], .sync_fd = sync[0], .tools_fd = -1,
                                   .warm_fd = warm[1], .id = id, .tools_dir = tools_dir,
                                   .workspace_dir = workspace_dir};
            child_main(p, &st);
        }
        if (pid < 0) {
            ret = -errno;
            snprintf(err, errlen, "clone as id %u: %s", id, strerror(errno));
        } else {
            out->pid = (pid_t)pid;
            out->pidfd = pidfd;
            /* sync 1: maps and cgroup in place -> go (or deferred: the
             * caller places and releases it). */
            bool defer = spawn_flags & SBX_SPAWN_DEFER_GO;
            ret = place_child(p, out->pid, id, cfg->isolate, !defer, err, errlen);
            if (ret == 0 && defer) {
                out->go_fd = sync[1];
                sync[1] = -1;
            } else if (ret == 0 && (ret = send_go(sync[1])) < 0) {
                snprintf(err, errlen, "releasing the child: %s", strerror(-ret));
            }
            out->spawn_ns = mono_ns() - t0;
        }
    }
    close(sync[0]);
    if (sync[1] >= 0)
        close(sync[1]);
    close(chan[1]);
    if (warm[1] >= 0)
        close(warm[1]);
    if (ret < 0) {
        kill_child(out);
        close(chan[0]);
        close_and_reset(&out->warm_fd);
        if (out->pid <= 0)
            drop_turn_dir(out);
        return ret;
    }
    out->chan_fd = chan[0];
    return 0;
}

void sbx_child_release(const struct sbx_plan *p, struct sbx_child *c)
{
    if (p->cgroups && c->pid > 0)
        cgroups_release(p->cgroups, c->pid);
    close_and_reset(&c->pidfd);
    close_and_reset(&c->chan_fd);
    close_and_reset(&c->warm_fd);
    close_and_reset(&c->go_fd);
    drop_turn_dir(c);
}
