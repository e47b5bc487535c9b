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
 * 100000, 4095) and -b (step budget).
 *
 *   tarcheck_tool -S DIR OUT
 * writes archive_snapshot() of DIR (the sandbox's writer) to OUT. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    int c;

    if (argc == 4 && !strcmp(argv[1], "-S"))
        return snapshot(argv[2], argv[3]);
    while ((c = getopt(argc, argv, "c:d:m:p:b:")) != -1) {
        switch (c) {
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
        int r = TARCHECK_NEED_INPUT;

        if (!msg || !tc) {
            fprintf(stderr, "tarcheck_tool: %s: cannot read\n", argv[i]);
            return 2;
        }
        tarcheck_set_member_fn(tc, on_member, NULL);
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
                r = tarcheck_feed(tc, msg, got);
            while (r == TARCHECK_AGAIN);
        }
        while (r >= 0 && (r = tarcheck_finish(tc, msg, len)) == TARCHECK_AGAIN)
            ;
        tarcheck_get_stats(tc, &st);
        printf("R %d %s\n", r, tarcheck_reason(tc));
        printf("S %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", st.calls,
               st.max_step_in, st.max_step_out, st.inflated, st.members);
        tarcheck_free(tc);
        free(msg);
    }
    return 0;
}
