/* tarcheck_tool: the supervisor's snapshot check (proto/tarcheck.h) on
 * files, for the Python differential test (test_tarcheck_diff.py) and by
 * hand.
 *
 *   tarcheck_tool [-c SEED] [-d MAXDATA] [-m MAXMEMBERS] [-p MAXPATH]
 *                 [-b BUDGET] FILE...
 * prints for each FILE
 *   M <type> <mode, octal> <size> <path, hex>     one line per member
 *   R <result> <reason>                           0 valid, or -errno
 *   S <calls> <most consumed, most inflated in one call> <inflated> <members>
 * Each file is fed in pseudo-random chunks (-c SEED, 0 = whole; the verdict
 * must not depend on it) and checked with -d, -m, -p (defaults: 100 MiB,
 * 100000, 4095) and -b (step budget). With -t, also
 *   T <CPU s> <inflated MB/s> <CPU s of a plain zlib inflate of the same bytes>
 *     <longest call, ms> <median call, ms>
 * (the check's throughput, what inflating alone costs, and call times).
 *
 *   tarcheck_tool -S DIR OUT
 * writes archive_snapshot() of DIR (the sandbox's writer) to OUT. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "proto/tarcheck.h"
#include "stage/archive.h"

static int snapshot(const char *dir, const char *out_path)
{
    struct snapshot_stats st;
    struct buf out;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc;
    FILE *f;

    if (fd < 0) {
        perror(dir);
        return 2;
    }
    buf_init(&out, 1ULL << 30);
    archive_snapshot_prepare();
    rc = archive_snapshot(fd, 100ULL << 20, &out, &st);
    close(fd);
    if (rc < 0) {
        fprintf(stderr, "archive_snapshot: %s\n", strerror(-rc));
        return 1;
    }
    f = fopen(out_path, "wb");
    if (!f || fwrite(out.data, 1, out.len, f) != out.len || fclose(f) != 0) {
        perror(out_path);
        return 2;
    }
    printf("files %llu skipped %llu\n", (unsigned long long)st.files,
           (unsigned long long)st.skipped);
    buf_free(&out);
    return 0;
}

static void on_member(void *ud, const struct tarcheck_member *m)
{
    printf("M %c %o %" PRIu64 " ", m->type, (unsigned)m->mode, m->size);
    for (size_t i = 0; i < m->path_len; i++)
        printf("%02x", (unsigned char)m->path[i]);
    printf("\n");
}

static double cpu_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* zlib alone: inflate every gzip member of msg into a scratch buffer. */
static double plain_inflate(const uint8_t *msg, size_t len)
{
    static uint8_t out[1 << 16];
    z_stream z = {0};
    double t0 = cpu_now();

    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK)
        abort();
    z.next_in = (Bytef *)msg;
    z.avail_in = (uInt)len;
    while (z.avail_in > 0) {
        int r;

        z.next_out = out;
        z.avail_out = sizeof out;
        r = inflate(&z, Z_NO_FLUSH);
        if (r == Z_STREAM_END)
            inflateReset(&z);
        else if (r != Z_OK)
            break;
    }
    inflateEnd(&z);
    return cpu_now() - t0;
}

/* Wall time of every call (the event loop's view). */
struct call_times {
    double *t;
    size_t n, cap;
};

static int timed(struct call_times *ct, int (*fn)(struct tarcheck *, const uint8_t *, size_t),
                 struct tarcheck *tc, const uint8_t *msg, size_t len)
{
    struct timespec a, b;
    int r;

    clock_gettime(CLOCK_MONOTONIC, &a);
    r = fn(tc, msg, len);
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (ct->n == ct->cap) {
        ct->cap = ct->cap ? 2 * ct->cap : 1024;
        ct->t = realloc(ct->t, ct->cap * sizeof *ct->t);
        if (!ct->t)
            abort();
    }
    ct->t[ct->n++] = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    return r;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    uint8_t *p = NULL;
    size_t cap = 0, n = 0;

    if (!f)
        return NULL;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 65536;
            p = realloc(p, cap);
            if (!p)
                abort();
        }
        size_t r = fread(p + n, 1, cap - n, f);
        if (r == 0)
            break;
        n += r;
    }
    fclose(f);
    *len = n;
    return p;
}

int main(int argc, char **argv)
{
    struct tarcheck_limits lim = {
        .max_data = 100ULL << 20, .max_members = 100000, .max_path = 4095,
    };
    unsigned seed = 0;
    bool timing = false;
    int c;

    if (argc == 4 && !strcmp(argv[1], "-S"))
        return snapshot(argv[2], argv[3]);
    while ((c = getopt(argc, argv, "c:d:m:p:b:t")) != -1) {
        switch (c) {
        case 't': timing = true; break;
        case 'c': seed = (unsigned)strtoul(optarg, NULL, 0); break;
        case 'd': lim.max_data = strtoull(optarg, NULL, 0); break;
        case 'm': lim.max_members = strtoull(optarg, NULL, 0); break;
        case 'p': lim.max_path = strtoul(optarg, NULL, 0); break;
        case 'b': lim.step_budget = strtoul(optarg, NULL, 0); break;
        default:
            fprintf(stderr, "usage: tarcheck_tool [-c SEED] [-d MAXDATA] [-m MAXMEMBERS] "
                            "[-p MAXPATH] [-b BUDGET] FILE...\n");
            return 2;
        }
    }
    for (int i = optind; i < argc; i++) {
        size_t len, got = 0;
        uint8_t *msg = slurp(argv[i], &len);
        struct tarcheck *tc = tarcheck_new(&lim);
        struct tarcheck_stats st;
        uint32_t state = 0x9e3779b9u ^ seed;
        struct call_times calls = {0};
        int r = TARCHECK_NEED_INPUT;

        if (!msg || !tc) {
            fprintf(stderr, "tarcheck_tool: %s: cannot read\n", argv[i]);
            return 2;
        }
        if (!timing)
            tarcheck_set_member_fn(tc, on_member, NULL);
        double t0 = cpu_now();
        while (got < len && r >= 0) {
            size_t n = len - got;
            if (seed) {
                state = state * 1103515245u + 12345u;
                n = 1 + (state >> 8) % (seed * 64);
                if (n > len - got)
                    n = len - got;
            }
            got += n;
            do
                r = timed(&calls, tarcheck_feed, tc, msg, got);
            while (r == TARCHECK_AGAIN);
        }
        while (r >= 0 && (r = timed(&calls, tarcheck_finish, tc, msg, len)) == TARCHECK_AGAIN)
            ;
        double t = cpu_now() - t0;
        tarcheck_get_stats(tc, &st);
        printf("R %d %s\n", r, tarcheck_reason(tc));
        if (timing) {
            qsort(calls.t, calls.n, sizeof *calls.t, cmp_double);
            printf("T %.3f %.0f %.3f %.3f %.3f\n", t, (double)st.inflated / 1e6 / t,
                   plain_inflate(msg, len), calls.n ? calls.t[calls.n - 1] * 1e3 : 0.0,
                   calls.n ? calls.t[calls.n / 2] * 1e3 : 0.0);
        }
        free(calls.t);
        printf("S %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", st.calls,
               st.max_step_in, st.max_step_out, st.inflated, st.members);
        tarcheck_free(tc);
        free(msg);
    }
    return 0;
}
