/* Small fd and time helpers (see util.h). */
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

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

#define NOFILE_WANT (1u << 20)

/* Thousands of idle turns need fds: the supervisor holds three per turn
 * (client socket, channel, pidfd), the fork server three per pooled sandbox.
 * Raise the soft RLIMIT_NOFILE to the hard one, and as root the hard one to
 * 1M (capped by fs.nr_open). Sandboxes lower theirs again (limits.c). Runs
 * in forkboxd and in the fork server (forkbox-sandbox). */
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
