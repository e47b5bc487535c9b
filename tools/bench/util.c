/* forkbox-bench: small helpers: the monotonic clock, sleeping, allocation that exits on
 * failure, the progress lines on stderr, the scaling of counts (--scale), and waiting for and
 * reading a child's pipe. Runs in the forkbox-bench process. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/select.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "forkbox-bench: out of memory\n");
        exit(1);
    }
    return p;
}

void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p) {
        fprintf(stderr, "forkbox-bench: out of memory\n");
        exit(1);
    }
    return p;
}

char *xstrdup(const char *s) { return strcpy(xmalloc(strlen(s) + 1), s); }

uint64_t t_begin;

void progress(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "forkbox-bench: %6.1fs ", (double)(now_ns() - t_begin) / 1e9);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

double ms_since(uint64_t t0) { return (double)(now_ns() - t0) / NS_PER_MS; }

/* "12.34" or "n/a", for progress lines (the baseline has no supervisor figure). */
const char *fmt_ms(char *buf, size_t n, double v)
{
    if (isnan(v))
        snprintf(buf, n, "n/a");
    else
        snprintf(buf, n, "%.2f", v);
    return buf;
}

unsigned scale_u(unsigned v, double f)
{
    double x = (double)v * f;
    return x < 1 ? 1 : (unsigned)x;
}

/* Whether fd becomes readable (or at EOF) within ms milliseconds: the wait of the loops that
 * read a child's output against a deadline. */
bool fd_readable(int fd, unsigned ms)
{
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(fd, &rs);
    struct timeval tv = {ms / 1000, (long)(ms % 1000) * 1000};
    return select(fd + 1, &rs, NULL, NULL, &tv) > 0;
}

char *child_output(pid_t pid, int fd, unsigned secs, int *status)
{
    size_t len = 0, cap = 1 << 16;
    char *out = xmalloc(cap);
    uint64_t deadline = now_ns() + (uint64_t)secs * 1000000000u;
    for (;;) {
        if (now_ns() > deadline) {
            kill(pid, SIGKILL);
            break;
        }
        if (!fd_readable(fd, 1000))
            continue;
        if (len + 1 == cap)
            out = xrealloc(out, cap *= 2);
        ssize_t r = read(fd, out + len, cap - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    out[len] = 0;
    close(fd);
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
    return out;
}
