/* Sandbox spawn tests (TAP): spawn real sandboxes through sbx_spawn() with a
 * test "serve" hook in place of pyrt_serve, check the isolation from inside
 * the child, and report each check over the channel as a line:
 *   "P <name>\n" or "F <name>: <detail>\n", then "T <ns>\n" (the monotonic
 * time at which serve was entered).
 * The parent counts the checks each child reports against the number its
 * hook makes (CHECKS_*), and wants the "T" line last: a check that stops
 * reporting, or a child that dies half-way, fails instead of shortening the
 * list of passes.
 * Needs root and user namespaces; exits 77 (skip) otherwise. Seccomp is
 * skipped (SBX_PLAN_NO_SECCOMP): the policy has its own tests, and the checks
 * here use syscalls a policy may refuse. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/securebits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/nsfs.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto/chan.h"
#include "sandbox/caps.h"
#include "sandbox/mounts.h"
#include "sandbox/netns.h"
#include "sandbox/spawn.h"

/* --- test-only globals: the serve hooks get no context argument --- */
static char g_expected_root[512]; /* space-separated sorted names of / */
static char g_site_dir[128];      /* a site dir bound read-only, with a file "mod.py" */
static volatile sig_atomic_t g_usr1;
/* Host ids for the spawns: each spawn takes the next one (next_id()); the
 * child, a clone of us, reads the one it was given from g_id. */
#define TEST_ID_BASE 2030043136u /* 0x79000000: inside the unused range, like the default */
static uint32_t g_id = TEST_ID_BASE;

static uint32_t next_id(void) { return ++g_id; }

static int tap_n, tap_failed;

static void tap(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tap(bool ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s %d - ", ok ? "ok" : "not ok", ++tap_n);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (!ok)
        tap_failed++;
    fflush(stdout);
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---------------------------- inside the child ---------------------------- */

static int g_out = -1;

static void say(bool ok, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(bool ok, const char *name, const char *fmt, ...)
{
    char line[600], detail[400] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(detail, sizeof detail, fmt, ap);
        va_end(ap);
    }
    int n = ok ? snprintf(line, sizeof line, "P %s\n", name)
               : snprintf(line, sizeof line, "F %s: %s\n", name, detail);
    if (write(g_out, line, (size_t)n) != n)
        _exit(99);
}

static int read_text(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    if (n < 0)
        return -errno;
    buf[n] = '\0';
    return (int)n;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted, space-separated names in dir (without . and ..). */
static void list_dir(const char *dir, char *out, size_t len)
{
    char *names[64];
    int n = 0;
    out[0] = '\0';
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d)) && n < 64)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            names[n++] = strdup(de->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        off += (size_t)snprintf(out + off, len - off, "%s%s", i ? " " : "", names[i]);
        free(names[i]);
        if (off >= len)
            break;
    }
}

static void on_usr1(int sig) { g_usr1 = 1; }

static void check_isolated(int chan_fd, int tools_fd, const char *tools_dir, const char *ws)
{
    char buf[4096];
    int r;

    say(getpid() == 2 && getppid() == 1, "pid 2 of a new pid namespace, under its init",
        "getpid() = %d, getppid() = %d", getpid(), getppid());
    say(getuid() == 0 && geteuid() == 0 && getgid() == 0, "uid/gid 0 inside", "uid %d gid %d",
        getuid(), getgid());
    unsigned a, b, c;
    r = read_text("/proc/self/uid_map", buf, sizeof buf);
    say(r > 0 && sscanf(buf, "%u %u %u", &a, &b, &c) == 3 && a == 0 && b == g_id && c == 1 &&
            !strchr(strchr(buf, '\n') ? strchr(buf, '\n') + 1 : "", '\n'),
        "uid_map is exactly 0 -> the spawn's host id", "uid_map: %s (id %u)",
        r > 0 ? buf : strerror(-r), g_id);
    r = read_text("/proc/self/gid_map", buf, sizeof buf);
    say(r > 0 && sscanf(buf, "%u %u %u", &a, &b, &c) == 3 && a == 0 && b == g_id && c == 1,
        "gid_map is exactly 0 -> the spawn's host id", "gid_map: %s (id %u)",
        r > 0 ? buf : strerror(-r), g_id);
    uid_t ru, eu, su;
    gid_t rg, eg, sg;
    say(getresuid(&ru, &eu, &su) == 0 && getresgid(&rg, &eg, &sg) == 0 && ru == 0 && eu == 0 &&
            su == 0 && rg == 0 && eg == 0 && sg == 0,
        "real, effective and saved ids all 0 inside (no unmapped host root left)",
        "uids %d %d %d gids %d %d %d", (int)ru, (int)eu, (int)su, (int)rg, (int)eg, (int)sg);
    r = read_text("/proc/sys/user/max_inotify_instances", buf, sizeof buf);
    say(r > 0 && atoi(buf) == 32, "max_inotify_instances 32 in our user namespace", "%s", buf);
    r = read_text("/proc/sys/user/max_inotify_watches", buf, sizeof buf);
    say(r > 0 && atoi(buf) == 8192, "max_inotify_watches 8192 in our user namespace", "%s", buf);
    struct rlimit rl;
    say(getrlimit(RLIMIT_SIGPENDING, &rl) == 0 && rl.rlim_cur == 1024 && rl.rlim_max == 1024,
        "RLIMIT_SIGPENDING 1024", "%llu", (unsigned long long)rl.rlim_cur);
    say(getrlimit(RLIMIT_MSGQUEUE, &rl) == 0 && rl.rlim_cur == 819200,
        "RLIMIT_MSGQUEUE 800K", "%llu", (unsigned long long)rl.rlim_cur);
    /* One above pids.max, so that the cgroup refuses (and counts) first. */
    say(getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur == 65, "RLIMIT_NPROC = pids + 1 (65)",
        "%llu", (unsigned long long)rl.rlim_cur);
    r = read_text("/proc/self/setgroups", buf, sizeof buf);
    say(r > 0 && strncmp(buf, "deny", 4) == 0, "setgroups denied", "%s", buf);
    gid_t groups[8];
    int ng = getgroups(8, groups);
    say(ng == 0, "no supplementary groups", "%d groups", ng);

    say(caps_all_dropped() == 1, "no capabilities in any set, no_new_privs set", "%d",
        caps_all_dropped());
    int sb = prctl(PR_GET_SECUREBITS, 0, 0, 0, 0);
    int want = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP_LOCKED |
               SECBIT_KEEP_CAPS_LOCKED;
    say(sb >= 0 && (sb & want) == want && !(sb & SECBIT_KEEP_CAPS), "securebits locked",
        "securebits 0x%x", sb);

    char root[512];
    list_dir("/", root, sizeof root);
    say(strcmp(root, g_expected_root) == 0, "/ holds exactly the expected entries",
        "got \"%s\", want \"%s\"", root, g_expected_root);
    list_dir("/dev", buf, sizeof buf);
    say(strcmp(buf, "fd full null random shm stderr stdin stdout urandom zero") == 0,
        "/dev holds exactly the expected entries", "got \"%s\"", buf);
    list_dir("/etc", buf, sizeof buf);
    say(strstr(buf, "passwd") && strstr(buf, "ld.so.cache") && !strstr(buf, "shadow"),
        "/etc is the minimal subset", "got \"%s\"", buf);
    /* The root the fork server built is host root's, like /usr: unmapped
     * here, so it reads as the overflow id (nobody), not as our root. */
    struct stat rs, ps, us;
    say(stat("/", &rs) == 0 && stat("/etc/passwd", &ps) == 0 && stat("/usr", &us) == 0 &&
            rs.st_uid != 0 && rs.st_uid == us.st_uid && ps.st_uid == us.st_uid &&
            ps.st_gid == us.st_gid && us.st_uid != 0,
        "/, /etc/passwd and /usr are host root's, unmapped", "uids %u %u %u",
        (unsigned)rs.st_uid, (unsigned)ps.st_uid, (unsigned)us.st_uid);
    say(access("/etc/shadow", F_OK) < 0 && errno == ENOENT, "/etc/shadow absent", "%s",
        strerror(errno));
    r = read_text("/etc/passwd", buf, sizeof buf);
    say(r > 0 && strncmp(buf, "root:x:0:0:", 11) == 0 && strstr(buf, "\nnobody:"),
        "synthetic /etc/passwd", "%s", buf);

    errno = 0;
    int fd = open("/workspace/probe", O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    bool ok = fd >= 0 && write(fd, "hello", 5) == 5 && pread(fd, buf, 5, 0) == 5 &&
              memcmp(buf, "hello", 5) == 0;
    say(ok && strcmp(ws, "/workspace") == 0, "/workspace writable", "%s", strerror(errno));
    if (fd >= 0)
        close(fd);
    struct stat st;
    say(stat("/tmp", &st) == 0 && (st.st_mode & 07777) == 01777, "/tmp is 1777",
        "mode %o", st.st_mode & 07777);
    fd = open("/tmp/probe", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    say(fd >= 0, "/tmp writable", "%s", strerror(errno));
    if (fd >= 0)
        close(fd);
    errno = 0;
    fd = open("/usr/forkbox-probe", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    say(fd < 0 && errno == EROFS, "/usr read-only (EROFS)", "%s", strerror(errno));
    errno = 0;
    say(mkdir("/probe", 0755) < 0 && errno == EROFS, "/ read-only (EROFS)", "%s",
        strerror(errno));
    errno = 0;
    say(mkdir("/etc/probe", 0755) < 0 && errno == EROFS, "/etc read-only (EROFS)", "%s",
        strerror(errno));
    say(access("/usr/bin/env", X_OK) == 0 && access("/bin/sh", X_OK) == 0,
        "/usr/bin and /bin reachable", "%s", strerror(errno));

    /* /tools: read-only by path, writable only through the fd. */
    errno = 0;
    fd = open("/tools/probe.py", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    say(fd < 0 && errno == EROFS && strcmp(tools_dir, "/tools") == 0,
        "/tools read-only by path (EROFS)", "%s", strerror(errno));
    fd = openat(tools_fd, "probe.py", O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    ok = fd >= 0 && write(fd, "x = 1\n", 6) == 6;
    say(ok, "tools fd writable", "%s", strerror(errno));
    if (fd >= 0)
        close(fd);
    say(access("/tools/probe.py", R_OK) == 0, "file written via fd visible at /tools", "%s",
        strerror(errno));
    close(tools_fd);

    snprintf(buf, sizeof buf, "%s/mod.py", g_site_dir);
    say(access(buf, R_OK) == 0, "site dir bound at the same path", "%s: %s", buf,
        strerror(errno));
    snprintf(buf, sizeof buf, "%s/new.py", g_site_dir);
    errno = 0;
    fd = open(buf, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    say(fd < 0 && errno == EROFS, "site dir read-only", "%s", strerror(errno));

    /* Devices. */
    fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    say(fd >= 0 && write(fd, "x", 1) == 1, "/dev/null writable", "%s", strerror(errno));
    if (fd >= 0)
        close(fd);
    fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    say(fd >= 0 && read(fd, buf, 16) == 16, "/dev/urandom readable", "%s", strerror(errno));
    if (fd >= 0)
        close(fd);

    /* Network: lo only, and nowhere to go. */
    r = read_text("/proc/net/dev", buf, sizeof buf);
    int ifaces = 0;
    bool only_lo = r > 0;
    for (char *l = strchr(buf, '\n'); l && (l = strchr(l + 1, '\n')) && l[1];) {
        char name[32];
        if (sscanf(l + 1, " %31[^:]:", name) == 1) {
            ifaces++;
            if (strcmp(name, "lo") != 0)
                only_lo = false;
        }
    }
    say(only_lo && ifaces == 1, "only lo in the network namespace", "%d ifaces: %s", ifaces,
        buf);
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in out = {.sin_family = AF_INET, .sin_port = htons(53),
                              .sin_addr.s_addr = htonl(0x01010101)};
    errno = 0;
    say(s >= 0 && connect(s, (struct sockaddr *)&out, sizeof out) < 0 && errno == ENETUNREACH,
        "no route out (ENETUNREACH)", "%s", strerror(errno));
    if (s >= 0)
        close(s);
    s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    errno = 0;
    say(s >= 0 && bind(s, (struct sockaddr *)&lo, sizeof lo) == 0 &&
            connect(s, (struct sockaddr *)&lo, sizeof lo) == 0,
        "loopback is up", "%s", strerror(errno));
    if (s >= 0)
        close(s);

    /* No privilege left to undo any of it. */
    errno = 0;
    say(mount("tmpfs", "/workspace", "tmpfs", 0, NULL) < 0 && errno == EPERM,
        "mount(2) refused (EPERM)", "%s", strerror(errno));
    errno = 0;
    say(umount2("/usr", MNT_DETACH) < 0 && errno == EPERM, "umount(2) refused (EPERM)", "%s",
        strerror(errno));
    errno = 0;
    say(setuid(1) < 0 && errno == EINVAL, "cannot become another uid", "%s", strerror(errno));
    errno = 0;
    say(unshare(CLONE_NEWUSER) < 0 && errno == ENOSPC, "cannot nest a user namespace (ENOSPC)",
        "%s", errno ? strerror(errno) : "unshare succeeded");

    gethostname(buf, sizeof buf);
    say(strcmp(buf, "forkbox") == 0, "hostname is forkbox", "%s", buf);
    r = read_text("/proc/self/cgroup", buf, sizeof buf);
    ok = r > 0;
    for (char *l = buf; ok && *l; l = strchr(l, '\n') + 1) {
        char *e = strchr(l, '\n');
        if (!e)
            break;
        ok = e - l >= 2 && e[-1] == '/' && e[-2] == ':';
    }
    say(ok, "cgroup namespace rooted at our cgroup", "%s", buf);

    /* Nothing but stdio, the channel and (already closed) tools fd. */
    list_dir("/proc/self/fd", buf, sizeof buf);
    char want_fds[64];
    int dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    snprintf(want_fds, sizeof want_fds, "0 1 2 %d %d", chan_fd < dfd ? chan_fd : dfd,
             chan_fd < dfd ? dfd : chan_fd);
    close(dfd);
    say(strcmp(buf, want_fds) == 0, "only stdio and the channel are open", "fds %s", buf);
    list_dir("/proc", buf, sizeof buf);
    int pids = 0;
    for (char *t = strtok(buf, " "); t; t = strtok(NULL, " "))
        if (t[0] >= '0' && t[0] <= '9')
            pids++;
    say(pids == 2, "only the sandbox's init and us in /proc", "%d pids", pids);

    /* Our own /proc/self files stay ours after the id change. */
    static const char marker[] = "forkbox-self-read";
    fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    ok = fd >= 0 && pread(fd, buf, sizeof marker, (off_t)(uintptr_t)marker) == sizeof marker &&
         memcmp(buf, marker, sizeof marker) == 0;
    say(ok, "/proc/self/mem readable by the sandbox itself", "%s", strerror(errno));
    if (fd >= 0)
        close(fd);
    say(prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1, "dumpable (own /proc files owned by us)", NULL);

    /* glibc's cached tid was repaired: raise() reaches ourselves. */
    signal(SIGUSR1, on_usr1);
    raise(SIGUSR1);
    say(g_usr1 == 1 && pthread_kill(pthread_self(), 0) == 0, "raise() reaches us (tid fixed)",
        "handler ran: %d", (int)g_usr1);
}

static uint64_t g_serve_ns;

/* How many say() lines each hook sends; update with the checks. */
#define CHECKS_ISOLATED 48 /* check_isolated() */
#define CHECKS_PLAIN 5     /* serve_plain() */
#define CHECKS_WARM 2      /* serve_warm() */

__attribute__((noreturn)) static void serve_checks(int chan_fd, int tools_fd, int warm_fd,
                                                    const char *tools_dir, const char *ws)
{
    g_serve_ns = mono_ns();
    g_out = chan_fd;
    check_isolated(chan_fd, tools_fd, tools_dir, ws);
    char line[64];
    int n = snprintf(line, sizeof line, "T %llu\n", (unsigned long long)g_serve_ns);
    if (write(chan_fd, line, (size_t)n) != n)
        _exit(98);
    _exit(0);
}

/* Forked fallback: the same checks; only the tid probe differs. */

__attribute__((noreturn)) static void serve_plain(int chan_fd, int tools_fd, int warm_fd,
                                                   const char *tools_dir, const char *ws)
{
    g_serve_ns = mono_ns();
    g_out = chan_fd;
    char buf[256];
    say(getppid() > 1, "non-isolated: ordinary child", "ppid %d", getppid());
    say(geteuid() == g_id && getegid() == g_id && getuid() == g_id,
        "non-isolated: runs as the spawn's host id", "uid %d (id %u)", geteuid(), g_id);
    int fd = openat(tools_fd, "t.py", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    say(fd >= 0, "non-isolated: tools fd writable", "%s", strerror(errno));
    if (fd >= 0)
        close(fd);
    snprintf(buf, sizeof buf, "%s/w", ws);
    fd = open(buf, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    say(fd >= 0, "non-isolated: workspace writable", "%s: %s", buf, strerror(errno));
    if (fd >= 0)
        close(fd);
    say(strncmp(tools_dir, "/tmp/forkbox-turn-", 18) == 0 &&
            strcmp(strrchr(tools_dir, '/'), "/tools") == 0,
        "non-isolated: per-turn tools dir", "%s", tools_dir);
    int n = snprintf(buf, sizeof buf, "D %s\nT %llu\n", ws, (unsigned long long)g_serve_ns);
    if (write(chan_fd, buf, (size_t)n) != n)
        _exit(98);
    _exit(0);
}

__attribute__((noreturn)) static void serve_ready(int chan_fd, int tools_fd, int warm_fd,
                                                   const char *tools_dir, const char *ws)
{
    uint64_t t = mono_ns();
    if (write(chan_fd, &t, sizeof t) != sizeof t)
        _exit(98);
    _exit(0);
}

__attribute__((noreturn)) static void serve_hang(int chan_fd, int tools_fd, int warm_fd,
                                                  const char *tools_dir, const char *ws)
{
    /* A grandchild that would outlive us if the pid namespace did not die. */
    if (fork() == 0)
        for (;;)
            pause();
    if (write(chan_fd, "R", 1) != 1)
        _exit(98);
    for (;;)
        pause();
}

/* A pooled sandbox: exactly stdio, the channel, the tools fd and the warm
 * socket are open; report, then send the warm byte. */
__attribute__((noreturn)) static void serve_warm(int chan_fd, int tools_fd, int warm_fd,
                                                  const char *tools_dir, const char *ws)
{
    g_out = chan_fd;
    char buf[256], want[64];
    int dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int fds[4] = {chan_fd, tools_fd, warm_fd, dfd};
    for (int i = 1; i < 4; i++) /* insertion sort */
        for (int j = i; j > 0 && fds[j - 1] > fds[j]; j--) {
            int t = fds[j];
            fds[j] = fds[j - 1];
            fds[j - 1] = t;
        }
    snprintf(want, sizeof want, "0 1 2 %d %d %d %d", fds[0], fds[1], fds[2], fds[3]);
    close(dfd);
    list_dir("/proc/self/fd", buf, sizeof buf);
    /* list_dir sorts by name: compare as sets of numbers by sorting ours the same way */
    char *names[8];
    int n = 0;
    char copy[64];
    snprintf(copy, sizeof copy, "%s", want);
    for (char *t = strtok(copy, " "); t && n < 8; t = strtok(NULL, " "))
        names[n++] = t;
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    char sorted[64] = "";
    for (int i = 0; i < n; i++)
        snprintf(sorted + strlen(sorted), sizeof sorted - strlen(sorted), "%s%s", i ? " " : "",
                 names[i]);
    say(warm_fd > 2 && strcmp(buf, sorted) == 0, "pooled: stdio, channel, tools fd and warm socket only",
        "fds %s, want %s", buf, sorted);
    say(getpid() == 2, "pooled: fully isolated (pid 2 under init)", "pid %d", getpid());
    if (send(warm_fd, "W", 1, MSG_NOSIGNAL) != 1)
        _exit(97);
    close(warm_fd);
    if (write(chan_fd, "T 1\n", 4) != 4)
        _exit(98);
    _exit(0);
}

/* ---------------------------- in the parent ------------------------------- */

static const struct sbx_hooks hooks_checks = {.serve = serve_checks};
static const struct sbx_hooks hooks_plain = {.serve = serve_plain};
static const struct sbx_hooks hooks_ready = {.serve = serve_ready};
static const struct sbx_hooks hooks_hang = {.serve = serve_hang};
static const struct sbx_hooks hooks_warm = {.serve = serve_warm};

/* Read everything the child sends until EOF (bounded). */
static size_t slurp(int fd, char *buf, size_t len)
{
    size_t off = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 10000) <= 0)
            break;
        ssize_t n = read(fd, buf + off, len - 1 - off);
        if (n <= 0)
            break;
        off += (size_t)n;
        if (off == len - 1)
            break;
    }
    buf[off] = '\0';
    return off;
}

/* Wait for the pidfd to report the exit, then reap; returns the status. */
static int await_exit(const struct sbx_child *c, bool *pidfd_ok)
{
    struct pollfd p = {.fd = c->pidfd, .events = POLLIN};
    *pidfd_ok = poll(&p, 1, 10000) == 1 && (p.revents & POLLIN);
    int status = -1;
    if (waitpid(c->pid, &status, 0) != c->pid)
        return -1;
    return status;
}

static bool no_zombies(void)
{
    return waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD;
}

/* Turn the child's P/F lines into TAP, then one test that it sent exactly
 * `want` of them and its "T" line last; returns the T timestamp (or 0). */
static uint64_t relay_results(const char *prefix, char *text, char **dir, int want)
{
    uint64_t t = 0;
    int checks = 0;
    bool ended = false; /* the T line came, and nothing after it */
    for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n")) {
        ended = l[0] == 'T';
        if (l[0] == 'P' || l[0] == 'F')
            checks++;
        if (l[0] == 'P')
            tap(true, "%s%s", prefix, l + 2);
        else if (l[0] == 'F')
            tap(false, "%s%s", prefix, l + 2);
        else if (l[0] == 'T')
            t = strtoull(l + 2, NULL, 10);
        else if (l[0] == 'D' && dir)
            *dir = strdup(l + 2);
        else
            tap(false, "%sunexpected line from the child: %s", prefix, l);
    }
    tap(checks == want && ended, "%sthe child reported all %d checks, then its end (%d%s)",
        prefix, want, checks, ended ? "" : ", no end line");
    return t;
}

static int userns_available(void)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET) == 0 ? 0 : 1);
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void expected_root(char *out, size_t len)
{
    const char *names[] = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc",
                           "sbin", "tmp", "tools", "usr", "workspace"};
    size_t off = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char p[32];
        struct stat st;
        snprintf(p, sizeof p, "/%s", names[i]);
        bool always = !strcmp(names[i], "dev") || !strcmp(names[i], "etc") ||
                      !strcmp(names[i], "proc") || !strcmp(names[i], "tmp") ||
                      !strcmp(names[i], "tools") || !strcmp(names[i], "usr") ||
                      !strcmp(names[i], "workspace");
        if (always || lstat(p, &st) == 0)
            off += (size_t)snprintf(out + off, len - off, "%s%s", off ? " " : "", names[i]);
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Median clone -> serve-entered, and median parent-side spawn_ns. */
static void bench(const char *label, const struct sbx_plan *plan)
{
    enum { N = 41 };
    uint64_t ready[N], parent[N];
    int got = 0;
    for (int i = 0; i < N; i++) {
        struct sbx_child c;
        char err[256];
        uint64_t t0 = mono_ns();
        if (sbx_spawn(plan, next_id(), 0, &c, err, sizeof err) < 0) {
            tap(false, "%s: spawn %d: %s", label, i, err);
            return;
        }
        uint64_t t = 0;
        struct pollfd p = {.fd = c.chan_fd, .events = POLLIN};
        if (poll(&p, 1, 5000) == 1 && read(c.chan_fd, &t, sizeof t) == sizeof t) {
            ready[got] = t - t0;
            parent[got++] = c.spawn_ns;
        }
        int st;
        waitpid(c.pid, &st, 0);
        sbx_child_release(plan, &c);
    }
    qsort(ready, (size_t)got, sizeof *ready, cmp_u64);
    qsort(parent, (size_t)got, sizeof *parent, cmp_u64);
    tap(got == N, "%s: %d spawns", label, got);
    if (got)
        printf("# %s: median clone->serve %.1f us (min %.1f, max %.1f); parent side %.1f us\n",
               label, ready[got / 2] / 1e3, ready[0] / 1e3, ready[got - 1] / 1e3,
               parent[got / 2] / 1e3);
}

/* From the host: every id of pid (real, effective, saved, fs) is id, and
 * its user namespace is owned by id, not by host root. */
static void check_host_ids(const char *label, pid_t pid, uint32_t id)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    buf[n > 0 ? n : 0] = '\0';
    unsigned u[4] = {0}, g[4] = {0};
    char *lu = strstr(buf, "\nUid:"), *lg = strstr(buf, "\nGid:");
    bool ok = lu && lg && sscanf(lu, "\nUid: %u %u %u %u", &u[0], &u[1], &u[2], &u[3]) == 4 &&
              sscanf(lg, "\nGid: %u %u %u %u", &g[0], &g[1], &g[2], &g[3]) == 4;
    for (int i = 0; i < 4; i++)
        ok = ok && u[i] == id && g[i] == id;
    tap(ok, "%s: host uids %u %u %u %u, gids %u %u %u %u, all the spawn's id %u", label, u[0],
        u[1], u[2], u[3], g[0], g[1], g[2], g[3], id);
    snprintf(path, sizeof path, "/proc/%d/ns/user", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    uid_t owner = 0;
    ok = fd >= 0 && ioctl(fd, NS_GET_OWNER_UID, &owner) == 0;
    if (fd >= 0)
        close(fd);
    tap(ok && owner == id, "%s: its user namespace is owned by the spawn's id, not root "
        "(owner %u)", label, (unsigned)owner);
}

/* After a spawn, the parent (the fork server's part) is root again, with
 * the parent-death signal main() set still armed. */
static void check_parent_restored(const char *label)
{
    uid_t ru = 1, eu = 1, su = 1;
    gid_t rg = 1, eg = 1, sg = 1;
    int sig = 0;
    getresuid(&ru, &eu, &su);
    getresgid(&rg, &eg, &sg);
    prctl(PR_GET_PDEATHSIG, &sig, 0, 0, 0);
    tap(ru == 0 && eu == 0 && su == 0 && rg == 0 && eg == 0 && sg == 0 && sig == SIGWINCH,
        "%s: the parent is root again (uids %d %d %d, gids %d %d %d), parent-death signal %d",
        label, (int)ru, (int)eu, (int)su, (int)rg, (int)eg, (int)sg, sig);
}

/* The first child pid listed for pid (its main thread's children). */
static pid_t first_child(pid_t pid)
{
    char path[64], kids[64] = "";
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t k = read(fd, kids, sizeof kids - 1);
        kids[k > 0 ? k : 0] = '\0';
        close(fd);
    }
    return (pid_t)atoi(kids);
}

static void enter_mnt_ns(int fd)
{
    if (setns(fd, CLONE_NEWNS) < 0)
        tap(false, "setns(mount namespace): %s", strerror(errno));
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (geteuid() != 0) {
        printf("1..0 # SKIP needs root\n");
        return 77;
    }
    if (!userns_available()) {
        printf("1..0 # SKIP user namespaces unavailable\n");
        return 77;
    }
    /* Like the fork server: SIGCHLD blocked, no supplementary groups, a
     * parent-death signal (a harmless one here) that spawning must keep. */
    prctl(PR_SET_PDEATHSIG, SIGWINCH, 0, 0, 0);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    setgroups(0, NULL);

    /* The site dir is part of every isolated check run (CHECKS_ISOLATED). */
    char site_tmpl[] = "/tmp/fbtest-site-XXXXXX";
    if (!mkdtemp(site_tmpl)) {
        printf("Bail out! mkdtemp %s: %s\n", site_tmpl, strerror(errno));
        return 1;
    }
    chmod(site_tmpl, 0755);
    snprintf(g_site_dir, sizeof g_site_dir, "%s", site_tmpl);
    char site_mod[160]; /* the site dir's mod.py, removed at the end */
    snprintf(site_mod, sizeof site_mod, "%s/mod.py", site_tmpl);
    int site_fd = open(site_mod, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (site_fd >= 0)
        close(site_fd);

    struct config cfg = {0};
    cfg.isolate = true;
    cfg.id_first = TEST_ID_BASE;
    cfg.id_count = 65536;
    snprintf(cfg.tools_dir, sizeof cfg.tools_dir, "/tools");
    cfg.tmpfs_size = 64ull << 20;
    cfg.max_unpacked = 64ull << 20;
    cfg.max_members = 10000;
    cfg.pids_max = 64;
    snprintf(cfg.site_dirs[0], sizeof cfg.site_dirs[0], "%s", g_site_dir);
    cfg.n_site_dirs = 1;
    expected_root(g_expected_root, sizeof g_expected_root);

    char err[512];
    struct mount_plan *mp = NULL;
    int r = mounts_prepare(&cfg, &mp, err, sizeof err);
    tap(r == 0, "mounts_prepare: %s", r ? err : "ok");
    if (r)
        return 1;
    /* Like the fork server, we build the root in a mount namespace of our
     * own; the non-isolated parts run back in the host's (its /tmp). */
    int host_ns = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    r = mounts_build(&cfg, mp, err, sizeof err);
    tap(r == 0, "mounts_build: %s", r ? err : "ok");
    if (r)
        return 1;
    int root_ns = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    tap(host_ns >= 0 && root_ns >= 0, "mount namespace fds");
    /* Every mount left in the namespace sandboxes copy costs each of them:
     * only "/", the host's proc and the root (at /tmp) stay. */
    FILE *mi = fopen("/proc/self/mountinfo", "re");
    char mline[4096], extra[1024] = "";
    int nmounts = 0;
    while (mi && fgets(mline, sizeof mline, mi)) {
        char mpt[1024];
        if (sscanf(mline, "%*s %*s %*s %*s %1023s", mpt) != 1)
            continue;
        nmounts++;
        if (strcmp(mpt, "/") && strcmp(mpt, "/proc") && strncmp(mpt, "/proc/", 6) &&
            strcmp(mpt, "/tmp") && strncmp(mpt, "/tmp/", 5) && !extra[0])
            snprintf(extra, sizeof extra, "%s", mpt);
    }
    if (mi)
        fclose(mi);
    tap(mi && nmounts > 2 && !extra[0], "the root's namespace holds only /, /proc and the root "
        "(%d mounts; first other: %s)", nmounts, extra[0] ? extra : "none");
    pid_t *tid_addr = NULL;
    r = sbx_tid_probe(&tid_addr);
    tap(r == 0 && tid_addr && *tid_addr == (pid_t)syscall(SYS_gettid),
        "tid probe finds glibc's cached tid");

    struct netns_spares *netns = NULL;
    r = netns_spares_new(2, &netns, err, sizeof err);
    tap(r == 0, "netns_spares_new: %s", r ? err : "ok");
    if (r)
        return 1;
    struct sbx_plan plan = {.cfg = &cfg, .mounts = mp, .netns = netns, .hooks = &hooks_checks,
                            .tid_addr = tid_addr, .flags = SBX_PLAN_NO_SECCOMP};

    /* 1. One clone, all checks from inside. */
    static char text[65536];
    struct sbx_child c;
    uint64_t t0 = mono_ns();
    r = sbx_spawn(&plan, next_id(), 0, &c, err, sizeof err);
    tap(r == 0 && c.pid > 0 && c.pidfd >= 0 && c.chan_fd >= 0 && c.id == g_id,
        "spawn (one clone): %s", r ? err : "ok");
    check_parent_restored("one clone");
    if (r == 0) {
        slurp(c.chan_fd, text, sizeof text);
        uint64_t ts = relay_results("isolated: ", text, NULL, CHECKS_ISOLATED);
        bool pidfd_ok;
        int st = await_exit(&c, &pidfd_ok);
        tap(pidfd_ok, "pidfd reports the exit");
        tap(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child exited 0 (status 0x%x)", st);
        sbx_child_release(&plan, &c);
        tap(no_zombies(), "no zombie left");
        if (ts)
            printf("# first isolated spawn: clone->serve %.1f us, parent side %.1f us\n",
                   (ts - t0) / 1e3, c.spawn_ns / 1e3);
    }

    /* 2. The fork()+unshare fallback gives the same sandbox. */
    plan.flags |= SBX_PLAN_FORCE_FORK;
    r = sbx_spawn(&plan, next_id(), 0, &c, err, sizeof err);
    tap(r == 0, "spawn (fork fallback): %s", r ? err : "ok");
    check_parent_restored("fork path");
    if (r == 0) {
        slurp(c.chan_fd, text, sizeof text);
        relay_results("fork path: ", text, NULL, CHECKS_ISOLATED);
        bool pidfd_ok;
        int st = await_exit(&c, &pidfd_ok);
        tap(pidfd_ok && WIFEXITED(st) && WEXITSTATUS(st) == 0,
            "fork path: exit 0 seen through the pidfd (status 0x%x)", st);
        sbx_child_release(&plan, &c);
        tap(no_zombies(), "fork path: no zombie left");
    }
    plan.flags &= ~SBX_PLAN_FORCE_FORK;

    /* 3. A failing step reports a log frame and exits 70 + step. */
    plan.flags &= ~SBX_PLAN_NO_SECCOMP; /* and no policy: step 8 must fail */
    r = sbx_spawn(&plan, next_id(), 0, &c, err, sizeof err);
    if (r == 0) {
        size_t n = slurp(c.chan_fd, text, sizeof text);
        bool pidfd_ok;
        int st = await_exit(&c, &pidfd_ok);
        const char *want = "{\"level\":\"error\",\"msg\":\"sandbox setup: seccomp: no compiled "
                           "policy: Invalid argument\",\"kind\":\"log\"}\n";
        uint32_t len = (uint32_t)(n >= 8 ? (uint8_t)text[4] | (uint8_t)text[5] << 8 : 0);
        tap(n == 8 + strlen(want) && text[0] == 'F' && len == strlen(want) &&
                memcmp(text + 8, want, strlen(want)) == 0,
            "failing step sends one log error frame");
        tap(WIFEXITED(st) && WEXITSTATUS(st) == 78, "failing step 8 exits 78 (status 0x%x)", st);
        sbx_child_release(&plan, &c);
    } else {
        tap(false, "spawn for the failure test: %s", err);
    }
    plan.flags |= SBX_PLAN_NO_SECCOMP;

    /* 4. Killing pid 1 through the pidfd takes its whole namespace along.
     * While it runs, its host ids and its user namespace's owner are checked
     * from outside: its own id everywhere, host root nowhere. */
    plan.hooks = &hooks_hang;
    r = sbx_spawn(&plan, next_id(), 0, &c, err, sizeof err);
    if (r == 0) {
        char ch = 0;
        struct pollfd p = {.fd = c.chan_fd, .events = POLLIN};
        bool up = poll(&p, 1, 5000) == 1 && read(c.chan_fd, &ch, 1) == 1 && ch == 'R';
        char path[64];
        pid_t grandchild = first_child(c.pid);
        tap(up && grandchild > 0, "hanging sandbox with a grandchild (%d)", grandchild);
        check_host_ids("one clone: init", c.pid, c.id);
        check_host_ids("one clone: runtime", grandchild, c.id);
        tap(pidfd_send_signal(c.pidfd, SIGKILL, NULL, 0) == 0, "pidfd_send_signal(SIGKILL)");
        bool pidfd_ok;
        int st = await_exit(&c, &pidfd_ok);
        tap(pidfd_ok && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "killed (status 0x%x)", st);
        snprintf(path, sizeof path, "/proc/%d", grandchild);
        tap(grandchild > 0 && access(path, F_OK) < 0, "grandchild gone with the namespace");
        sbx_child_release(&plan, &c);
        tap(no_zombies(), "no zombie after kill");
    } else {
        tap(false, "spawn for the kill test: %s", err);
    }
    /* The same from the fork path: its middle process too. */
    plan.flags |= SBX_PLAN_FORCE_FORK;
    r = sbx_spawn(&plan, next_id(), 0, &c, err, sizeof err);
    if (r == 0) {
        char ch = 0;
        struct pollfd p = {.fd = c.chan_fd, .events = POLLIN};
        bool up = poll(&p, 1, 5000) == 1 && read(c.chan_fd, &ch, 1) == 1 && ch == 'R';
        pid_t init = first_child(c.pid);
        tap(up && init > 0, "fork path: hanging sandbox (%d) under its middle process", init);
        check_host_ids("fork path: middle", c.pid, c.id);
        check_host_ids("fork path: init", init, c.id);
        pidfd_send_signal(c.pidfd, SIGKILL, NULL, 0);
        bool pidfd_ok;
        await_exit(&c, &pidfd_ok);
        sbx_child_release(&plan, &c);
    } else {
        tap(false, "spawn for the fork-path ids test: %s", err);
    }
    plan.flags &= ~SBX_PLAN_FORCE_FORK;
    r = sbx_spawn(&plan, 0, 0, &c, err, sizeof err);
    tap(r == -EPERM && c.pid == 0, "host id 0 refused: %s", err);

    /* 5. Non-isolated mode (benchmarks): per-turn dir, removed at release. */
    struct config pcfg = cfg;
    pcfg.isolate = false;
    struct sbx_plan pplan = {.cfg = &pcfg, .hooks = &hooks_plain, .tid_addr = tid_addr};
    enter_mnt_ns(host_ns);
    r = sbx_spawn(&pplan, next_id(), 0, &c, err, sizeof err);
    tap(r == 0 && c.turn_dir, "spawn (non-isolated): %s", r ? err : "ok");
    if (r == 0) {
        slurp(c.chan_fd, text, sizeof text);
        char *ws = NULL;
        relay_results("non-isolated: ", text, &ws, CHECKS_PLAIN);
        bool pidfd_ok;
        int st = await_exit(&c, &pidfd_ok);
        tap(pidfd_ok && WIFEXITED(st) && WEXITSTATUS(st) == 0,
            "non-isolated: exit 0 (status 0x%x)", st);
        char *dir = c.turn_dir ? strdup(c.turn_dir) : NULL;
        sbx_child_release(&pplan, &c);
        tap(dir && access(dir, F_OK) < 0 && errno == ENOENT,
            "non-isolated: turn dir removed at release");
        free(dir);
        free(ws);
        tap(no_zombies(), "non-isolated: no zombie left");
    }
    enter_mnt_ns(root_ns);

    /* 6. Pooled spawn: the warm socket survives step 6, and only it. */
    plan.hooks = &hooks_warm;
    r = sbx_spawn(&plan, next_id(), SBX_SPAWN_POOLED, &c, err, sizeof err);
    tap(r == 0 && c.warm_fd >= 0 && c.go_fd < 0, "spawn (pooled): %s", r ? err : "ok");
    if (r == 0) {
        char w = 0;
        struct pollfd p = {.fd = c.warm_fd, .events = POLLIN};
        tap(poll(&p, 1, 10000) == 1 && recv(c.warm_fd, &w, 1, 0) == 1 && w == 'W',
            "pooled: warm byte arrives on the warm socket");
        slurp(c.chan_fd, text, sizeof text);
        relay_results("", text, NULL, CHECKS_WARM);
        bool pidfd_ok;
        int st = await_exit(&c, &pidfd_ok);
        tap(pidfd_ok && WIFEXITED(st) && WEXITSTATUS(st) == 0, "pooled: exit 0 (status 0x%x)",
            st);
        sbx_child_release(&plan, &c);
        tap(c.warm_fd < 0 && no_zombies(), "pooled: released, no zombie");
    }

    /* 7. Deferred go: the child waits until sbx_child_go(); an error there
     * makes it fail step 4 with the reason. */
    plan.hooks = &hooks_ready;
    r = sbx_spawn(&plan, next_id(), SBX_SPAWN_DEFER_GO, &c, err, sizeof err);
    tap(r == 0 && c.go_fd >= 0, "spawn (deferred go): %s", r ? err : "ok");
    if (r == 0) {
        struct pollfd p = {.fd = c.chan_fd, .events = POLLIN};
        tap(poll(&p, 1, 200) == 0, "deferred go: the child waits for it");
        tap(sbx_child_go(c.go_fd, 0) == 0, "sbx_child_go(0)");
        c.go_fd = -1;
        uint64_t t = 0;
        tap(poll(&p, 1, 10000) == 1 && read(c.chan_fd, &t, sizeof t) == sizeof t && t > 0,
            "deferred go: the child runs after it");
        bool pidfd_ok;
        await_exit(&c, &pidfd_ok);
        sbx_child_release(&plan, &c);
    }
    r = sbx_spawn(&plan, next_id(), SBX_SPAWN_DEFER_GO, &c, err, sizeof err);
    if (r == 0) {
        tap(sbx_child_go(c.go_fd, EPERM) == 0, "sbx_child_go(EPERM)");
        c.go_fd = -1;
        slurp(c.chan_fd, text, sizeof text);
        bool pidfd_ok;
        int st = await_exit(&c, &pidfd_ok);
        tap(strstr(text + 8, "sandbox setup: namespaces: cgroup placement (by the fork server): "
                             "Operation not permitted") != NULL,
            "refused go: the log frame names the placement: %s", text + 8);
        tap(WIFEXITED(st) && WEXITSTATUS(st) == 74, "refused go: exits 74 (status 0x%x)", st);
        sbx_child_release(&plan, &c);
    } else {
        tap(false, "spawn for the refused-go test: %s", err);
    }
    tap(no_zombies(), "no zombie after the pool and go tests");

    /* 8. Timings (informational). */
    plan.hooks = &hooks_ready;
    bench("isolated, one clone", &plan);
    plan.flags |= SBX_PLAN_FORCE_FORK;
    bench("isolated, fork fallback", &plan);
    plan.flags &= ~SBX_PLAN_FORCE_FORK;
    pplan.hooks = &hooks_ready;
    enter_mnt_ns(host_ns);
    bench("non-isolated", &pplan);
    tap(no_zombies(), "no zombie after the benchmark runs");

    netns_spares_free(netns);
    mounts_free(mp);
    struct stat sst;
    tap(stat(g_site_dir, &sst) == 0 && sst.st_uid == 0,
        "building the root left the host's site dir owned by root");
    unlink(site_mod);
    rmdir(g_site_dir);
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}
