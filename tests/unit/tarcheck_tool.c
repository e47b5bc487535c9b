/* tarcheck_tool: run the supervisor's snapshot check (proto/tarcheck.h) on
 * files, for the Python differential test (test_tarcheck_diff.py) and by
 * hand. For each FILE, prints
 *   M <type> <mode, octal> <size> <path, hex>     one line per member
 *   R <result> <reason>                           0 valid, or -errno
 *   S <calls> <most consumed, most inflated in one call> <inflated> <members>
 * Each file is fed in pseudo-random chunks (--chunk SEED, 0 = whole; the
 * verdict must not depend on it) and checked with --max-data, --max-members,
 * --max-path (defaults: 100 MiB, 100000, 4095) and --budget. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/tarcheck.h"

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
