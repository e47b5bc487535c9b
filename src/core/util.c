/* Small shared helpers (see util.h); every process links them. */
#include "core/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"

int fd_set_nonblock(int fd, bool on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -errno;
    int nfl = on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK;
    if (nfl != fl && fcntl(fd, F_SETFL, nfl) < 0)
        return -errno;
    return 0;
}

int fd_set_cloexec(int fd, bool on)
{
    int fl = fcntl(fd, F_GETFD);
    if (fl < 0)
        return -errno;
    int nfl = on ? fl | FD_CLOEXEC : fl & ~FD_CLOEXEC;
    if (nfl != fl && fcntl(fd, F_SETFD, nfl) < 0)
        return -errno;
    return 0;
}

int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *s = p;
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (w == 0) /* only possible for n == 0; never spin */
            return -EIO;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

int read_all(int fd, void *p, size_t n)
{
    uint8_t *d = p;
    while (n > 0) {
        ssize_t r = read(fd, d, n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return -EPIPE;
        d += r;
        n -= (size_t)r;
    }
    return 0;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for this clock */
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

uint64_t now_ns(void) { return mono_ns(); }
uint64_t now_ms(void) { return mono_ns() / 1000000ULL; }

static void err_vfmt(char *err, size_t errlen, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
static void err_vfmt(char *err, size_t errlen, const char *fmt, va_list ap)
{
    if (err && errlen)
        vsnprintf(err, errlen, fmt, ap);
}

int err_fmt(char *err, size_t errlen, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vfmt(err, errlen, fmt, ap);
    va_end(ap);
    return code;
}

int err_errno(char *err, size_t errlen, const char *fmt, ...)
{
    int code = errno ? -errno : -EIO; /* before vsnprintf can change errno */
    va_list ap;
    va_start(ap, fmt);
    err_vfmt(err, errlen, fmt, ap);
    va_end(ap);
    errno = -code;
    return code;
}

/* Control-message room for FDPASS_MAX_FDS fds, aligned for cmsghdr. */
union fdpass_ctl {
    struct cmsghdr align;
    char buf[CMSG_SPACE(FDPASS_MAX_FDS * sizeof(int))];
};

ssize_t fd_send(int sock, const void *p, size_t n, const int *fds, size_t nfds, int flags)
{
    union fdpass_ctl ctl;
    struct iovec iov = {.iov_base = (void *)p, .iov_len = n};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > FDPASS_MAX_FDS)
        return -EINVAL;
    if (nfds) {
        memset(&ctl, 0, sizeof ctl);
        m.msg_control = ctl.buf;
        m.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
    }
    ssize_t w;
    do
        w = sendmsg(sock, &m, MSG_NOSIGNAL | flags);
    while (w < 0 && errno == EINTR);
    return w < 0 ? -errno : w;
}

ssize_t fd_recv(int sock, void *p, size_t n, int *fds, size_t maxfds, size_t *nfds, int flags,
                int *msg_flags)
{
    union fdpass_ctl ctl;
    struct iovec iov = {.iov_base = p, .iov_len = n};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                       .msg_controllen = sizeof ctl.buf};
    *nfds = 0;
    if (msg_flags)
        *msg_flags = 0;
    ssize_t r;
    do
        r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC | flags);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return -errno;
    /* Every fd that arrived is ours now: keep maxfds, close the rest. */
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (*nfds < maxfds)
                fds[(*nfds)++] = fd;
            else
                close(fd);
        }
    }
    if (msg_flags)
        *msg_flags = m.msg_flags & (MSG_TRUNC | MSG_CTRUNC);
    return r;
}

/* Like hmac.compare_digest: the running time depends on the lengths only.
 * Every byte of a is visited whatever the contents; bytes of a past the end
 * of b are compared with a itself so the work stays the same, and the length
 * mismatch is folded into the result instead of returning early. The
 * volatile accumulator keeps the compiler from adding an early exit. */
bool ct_equal(const void *a, size_t alen, const void *b, size_t blen)
{
    const volatile uint8_t *x = a;
    const volatile uint8_t *y = alen == blen ? b : a;
    volatile uint8_t acc = alen == blen ? 0 : 1;
    for (size_t i = 0; i < alen; i++)
        acc |= x[i] ^ y[i];
    return acc == 0;
}

int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || !*s)
        return -EINVAL;
    uint64_t v = 0;
    bool range = false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -EINVAL; /* no sign, no spaces, no trailing junk */
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            range = true; /* keep scanning: junk later is -EINVAL */
        else
            v = v * 10 + d;
    }
    if (range || v > max)
        return -ERANGE;
    *out = v;
    return 0;
}

int grow_array(void *pp, size_t *cap, size_t need, size_t elem, size_t first, size_t max)
{
    if (need <= *cap)
        return 0;
    if (need > max)
        return -E2BIG;
    size_t ncap = !*cap ? first : *cap > SIZE_MAX / 2 ? SIZE_MAX : *cap * 2;
    if (ncap < need)
        ncap = need;
    if (ncap > max)
        ncap = max;
    if (elem && ncap > SIZE_MAX / elem)
        return -ENOMEM;
    /* Through memcpy: *pp is a T *, not a void * (no aliasing cast). */
    void *p;
    memcpy(&p, pp, sizeof p);
    void *np = realloc(p, ncap * elem);
    if (!np)
        return -ENOMEM;
    memcpy(pp, &np, sizeof np);
    *cap = ncap;
    return 0;
}

#define NOFILE_WANT (1u << 20)

/* Thousands of idle turns need fds: the supervisor holds three per turn
 * (client socket, channel, pidfd), the fork server three per pooled sandbox.
 * Raise the soft RLIMIT_NOFILE to the hard one, and as root the hard one to
 * 1M (capped by fs.nr_open). Sandboxes lower theirs again (rlimits.c). Runs
 * in forkboxd and in the fork server (forkbox-sandbox.so). */
void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return;
    rlim_t want = NOFILE_WANT;
    if (geteuid() == 0 && rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) {
        FILE *f = fopen("/proc/sys/fs/nr_open", "re");
        unsigned long nr_open = 0;
        if (f) {
            if (fscanf(f, "%lu", &nr_open) != 1)
                nr_open = 0;
            fclose(f);
        }
        if (nr_open && nr_open < want)
            want = nr_open;
        if (want > rl.rlim_max) {
            struct rlimit up = {.rlim_cur = want, .rlim_max = want};
            if (setrlimit(RLIMIT_NOFILE, &up) == 0)
                return;
        }
    }
    if (rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static struct {
    bool kept;          /* a reserve is kept */
    bool lending;       /* the soft limit is raised: lent holds the one to put back */
    struct rlimit lent;
} fd_reserve;

int fd_reserve_keep(unsigned n)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return -errno;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 4 * (rlim_t)n)
        return -ERANGE;
    rlim_t soft = rl.rlim_max == RLIM_INFINITY ? rl.rlim_cur : rl.rlim_max - n;
    if (soft < rl.rlim_cur) {
        rl.rlim_cur = soft;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
            return -errno;
    }
    fd_reserve.kept = true;
    return 0;
}

void fd_reserve_lend(bool on)
{
    if (on && fd_reserve.kept && !fd_reserve.lending &&
        getrlimit(RLIMIT_NOFILE, &fd_reserve.lent) == 0) {
        struct rlimit all = {.rlim_cur = fd_reserve.lent.rlim_max,
                             .rlim_max = fd_reserve.lent.rlim_max};
        fd_reserve.lending = setrlimit(RLIMIT_NOFILE, &all) == 0;
    } else if (!on && fd_reserve.lending) {
        setrlimit(RLIMIT_NOFILE, &fd_reserve.lent);
        fd_reserve.lending = false;
    }
}

int accept_reserved(int lfd, struct sockaddr *sa, socklen_t *len, bool *reserved)
{
    socklen_t len0 = len ? *len : 0;
    *reserved = false;
    int fd = accept4(lfd, sa, len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0 && errno == EMFILE) {
        if (len)
            *len = len0;
        fd_reserve_lend(true);
        fd = accept4(lfd, sa, len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        int e = errno;
        fd_reserve_lend(false);
        errno = e;
        *reserved = fd >= 0;
    }
    return fd < 0 ? -errno : fd;
}

const char *errno_reason(int e)
{
    if (e == EMFILE)
        return "out of file descriptors (RLIMIT_NOFILE)";
    if (e == ENFILE)
        return "out of file descriptors (the system's, fs.file-max)";
    return strerror(e);
}

int oom_score_adj_set(int adj, bool keep_lower)
{
    _cleanup_close_ int fd = open("/proc/self/oom_score_adj", O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    char buf[16];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    if (n < 0)
        return -errno;
    buf[n] = '\0';
    if (keep_lower && atoi(buf) <= adj)
        return 0;
    int len = snprintf(buf, sizeof buf, "%d", adj);
    if (pwrite(fd, buf, (size_t)len, 0) != len)
        return -errno;
    return 0;
}

int thread_start(const char *name, size_t stack, void *(*fn)(void *), void *arg, char *err,
                 size_t errlen)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, stack);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the new thread starts with this mask */
    pthread_t t;
    int r = pthread_create(&t, &attr, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (r != 0)
        return err_fmt(err, errlen, -r, "cannot start the %s thread: %s", name, strerror(r));
    pthread_setname_np(t, name);
    return 0;
}

pid_t fork_helper(const char *what, int *fd, char *err, size_t errlen)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        return err_errno(err, errlen, "%s: socketpair", what);
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(sv[0]);
        close(sv[1]);
        return err_fmt(err, errlen, -e, "%s: fork: %s", what, strerror(e));
    }
    if (pid == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 || getppid() != parent)
            _exit(127);
        /* dup2 clears FD_CLOEXEC; an end that already is fd 3 needs it cleared. */
        if (sv[1] == 3 ? fcntl(3, F_SETFD, 0) < 0 : dup2(sv[1], 3) < 0)
            _exit(127);
        return 0;
    }
    close(sv[1]);
    *fd = sv[0];
    return pid;
}

int tcp_listen(const char *host, uint16_t port, uint16_t *bound_port)
{
    union sockaddr_any a = {0};
    socklen_t alen;
    if (inet_pton(AF_INET, host, &a.in4.sin_addr) == 1) {
        a.in4.sin_family = AF_INET;
        a.in4.sin_port = htons(port);
        alen = sizeof a.in4;
    } else if (inet_pton(AF_INET6, host, &a.in6.sin6_addr) == 1) {
        a.in6.sin6_family = AF_INET6;
        a.in6.sin6_port = htons(port);
        alen = sizeof a.in6;
    } else {
        return -EINVAL;
    }
    _cleanup_close_ int fd = socket(a.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, &a.sa, alen) < 0 || listen(fd, LISTEN_BACKLOG) < 0)
        return -errno;
    alen = sizeof a.ss;
    if (getsockname(fd, &a.sa, &alen) < 0)
        return -errno;
    *bound_port = ntohs(a.sa.sa_family == AF_INET ? a.in4.sin_port : a.in6.sin6_port);
    return steal_fd(&fd);
}
