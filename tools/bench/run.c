/* forkbox-bench: running one server configuration: forkboxd (plain, --pool 8, --preload
 * numpy,pandas; isolated or not) or the baseline, and which measurements run on it, into which
 * column. Runs in the forkbox-bench process. */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"

#define POOL_GAP_MS 20 /* between pooled turns, so that the pool refills: 8 x ~2 ms spawns */

/* "--id-range=F:C": host ids of this bench run's own, as tools/id_block.py
 * takes them (N blocks in a row, aligned to N, flock on
 * /run/forkbox/test-ids/<first> of each, held until we exit): forkboxd locks
 * its range, and other test runs on this machine have theirs. The servers run
 * one after another and share them: 16384 ids, for --capacity 4096. */
static const char *id_range_arg(void)
{
    enum { FIRST = 0x7A000000, BLOCK = 4096, BLOCKS = 1024, N = 4 };
    static char arg[48];
    if (arg[0])
        return arg;
    mkdir("/run/forkbox", 0755);
    mkdir("/run/forkbox/test-ids", 0700);
    unsigned start = (unsigned)getpid();
    for (unsigned i = 0; i < BLOCKS / N; i++) {
        unsigned first = FIRST + (start + i) % (BLOCKS / N) * N * BLOCK;
        int fds[N], k;
        for (k = 0; k < N; k++) {
            char path[64];
            snprintf(path, sizeof path, "/run/forkbox/test-ids/%u", first + k * BLOCK);
            fds[k] = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
            if (fds[k] < 0 || flock(fds[k], LOCK_EX | LOCK_NB) < 0) {
                if (fds[k] >= 0)
                    close(fds[k]);
                break;
            }
        }
        if (k == N) {
            snprintf(arg, sizeof arg, "--id-range=%u:%u", first, (unsigned)(N * BLOCK));
            return arg; /* the fds stay open: the blocks are ours */
        }
        while (k-- > 0)
            close(fds[k]);
    }
    fprintf(stderr, "forkbox-bench: no %d blocks of test ids in a row free in "
                    "/run/forkbox/test-ids\n", N);
    exit(1);
}

static int start_forkboxd(struct server *s, const char *name, const char *daemon, bool iso,
                          const char *extra1, const char *extra2, unsigned capacity, char *why,
                          size_t whylen)
{
    char cap[32];
    snprintf(cap, sizeof cap, "--capacity=%u", capacity);
    char *argv[13];
    size_t n = 0;
    argv[n++] = (char *)daemon;
    argv[n++] = "--listen=127.0.0.1:0";
    argv[n++] = "--log-level=debug";
    argv[n++] = cap;
    if (!iso)
        argv[n++] = "--no-isolation";
    else
        argv[n++] = (char *)id_range_arg();
    if (extra1)
        argv[n++] = (char *)extra1;
    if (extra2)
        argv[n++] = (char *)extra2;
    /* Fresh sandboxes per turn unless a pool is asked for: --pool 0, as forkboxd keeps a small
     * pool by default. A daemon that rejects the flag has no pool: start it without. */
    bool pool0 = !(extra1 && !strncmp(extra1, "--pool", 6)) &&
                 !(extra2 && !strncmp(extra2, "--pool", 6));
    if (pool0)
        argv[n++] = "--pool=0";
    argv[n] = NULL;
    int r = server_start(s, name, false, argv, why, whylen);
    if (r < 0 && pool0 && strstr(why, "pool")) {
        argv[--n] = NULL;
        r = server_start(s, name, false, argv, why, whylen);
    }
    if (r == 0)
        progress("[%s] %s (port %u)", name, s->cmd, s->port);
    else
        progress("[%s] %s: %s", name, s->cmd, why);
    return r;
}

/* Everything measured on a plain server (forkboxd or the baseline) into column `col`. */
static void measure_all(struct bench *b, struct server *s, enum col col, const struct counts *n)
{
    if (b->groups & G_START) {
        struct samples cli = {0}, srv = {0}, spawn = {0};
        measure_turn_start(b, s, n->start_turns, b->gap_ms, &cli, &srv, &spawn);
        val[R_CLI_P50][col] = samples_pct(&cli, 50);
        val[R_CLI_P99][col] = samples_pct(&cli, 99);
        val[R_SRV_P50][col] = samples_pct(&srv, 50);
        val[R_SRV_P99][col] = samples_pct(&srv, 99);
        val[R_SPAWN_P50][col] = samples_pct(&spawn, 50);
        samples_free(&cli);
        samples_free(&srv);
        samples_free(&spawn);
        val[R_PY_P50][col] = measure_py_turn_start(b, s, n->py_turns, b->gap_ms);
    }
    if (b->groups & G_RTT)
        measure_rtt(b, s, n->rtt_blocks, &val[R_RTT_P50][col], &val[R_RTT_P99][col]);
    if (b->groups & G_TOOL) {
        measure_tool_call(b, s, n->calls, &val[R_TC_INSIDE][col], &val[R_TC_CLIENT][col]);
        val[R_TC_ADDED][col] = val[R_TC_INSIDE][col] - val[R_TC_CLIENT][col];
    }

    double dummy;
    if (b->groups & G_THROUGHPUT) {
        struct tp_cpu c1, c5;
        measure_throughput(b, s, 4, 1, n->tp_secs, &val[R_TP4][col], &dummy, NULL);
        measure_throughput(b, s, 16, 1, n->tp_secs, &val[R_TP16][col], &dummy, &c1);
        measure_throughput(b, s, 64, 1, n->tp_secs, &val[R_TP64][col], &dummy, NULL);
        measure_throughput(b, s, 4, 5, n->tp_secs, &val[R_TP4x5][col], &val[R_BP4x5][col], NULL);
        measure_throughput(b, s, 16, 5, n->tp_secs, &val[R_TP16x5][col], &val[R_BP16x5][col],
                           &c5);
        val[R_CPU1][col] = c1.machine;
        val[R_CGCPU1][col] = c1.cgroup;
        val[R_CPU5][col] = c5.machine;
    }
    if (b->groups & G_PSS) {
        double held, kmem;
        measure_pss(b, s, n->pss_small, &val[R_PSS_S][col], &held, &val[R_TOP_PSS][col], &kmem);
        measure_pss_after(b, s, n->pss_small, 1, &val[R_PSS_BLK][col], &held, &dummy, &kmem);
        if (n->pss_big)
            measure_pss(b, s, n->pss_big, &val[R_PSS_B][col], &val[R_HELD_B][col], &dummy,
                        &val[R_KMEM_B][col]);
    }
    if (b->groups & G_IMPORT) {
        val[R_NUMPY][col] = measure_import(b, s, "numpy", n->import_turns);
        val[R_PANDAS][col] = measure_import(b, s, "pandas", n->import_turns);
    }
    if ((b->groups & G_BIG) && (col != COL_NOISO || b->big_noiso))
        measure_big(b, s, col);
    if ((b->groups & G_FLOOR) && col == COL_ISO)
        measure_floor(b, s, b->quick ? 2 : 3);
}

void run_forkbox(struct bench *b, const char *daemon, bool iso, enum col col,
                 const char *tag)
{
    struct server s;
    char why[512], name[64];
    unsigned cap = b->fb.pss_big + 64 > 4096 ? b->fb.pss_big + 64 : 4096;
    if (start_forkboxd(&s, tag, daemon, iso, NULL, NULL, cap, why, sizeof why) < 0) {
        b->failed = true;
        return;
    }
    measure_all(b, &s, col, &b->fb);
    server_stop(&s);
    close(s.log_fd);

    if ((b->groups & G_STEPS) && iso) {
        if (start_forkboxd(&s, "isolated steps", daemon, iso, "--step-times", NULL, 64, why,
                           sizeof why) == 0) {
            measure_steps(b, &s, b->fb.start_turns);
            server_stop(&s);
            close(s.log_fd);
        } else
            printf("note: --step-times not available: %s\n", why);
    }

    snprintf(name, sizeof name, "%s pool", tag);
    if (!(b->groups & G_POOL))
        ;
    else if (start_forkboxd(&s, name, daemon, iso, "--pool=8", NULL, 256, why, sizeof why) == 0) {
        s.pooled = true;
        sleep_ms(300); /* let the pool fill */
        struct samples cli = {0}, srv = {0}, spawn = {0};
        /* Apart: the pool refills between turns (the best case for a pooled turn). */
        measure_turn_start(b, &s, b->fb.start_turns, POOL_GAP_MS, &cli, &srv, &spawn);
        val[R_POOL_CLI_P50][col] = samples_pct(&cli, 50);
        val[R_POOL_SRV_P50][col] = samples_pct(&srv, 50);
        val[R_POOL_SRV_P99][col] = samples_pct(&srv, 99);
        samples_reset(&cli);
        samples_reset(&srv);
        /* Back to back: turns arrive faster than the pool refills. */
        measure_turn_start(b, &s, b->fb.start_turns, b->gap_ms, &cli, &srv, &spawn);
        val[R_POOL_B2B_P50][col] = samples_pct(&srv, 50);
        samples_free(&cli);
        samples_free(&srv);
        samples_free(&spawn);
        val[R_POOL_PY_P50][col] = measure_py_turn_start(b, &s, b->fb.py_turns, POOL_GAP_MS);
        server_stop(&s);
        close(s.log_fd);
    } else
        printf("note: %s: --pool 8 not available: %s\n", tag, why);

    snprintf(name, sizeof name, "%s preload", tag);
    if (!(b->groups & G_PRELOAD))
        ;
    else if (start_forkboxd(&s, name, daemon, iso, "--preload=numpy,pandas", NULL, cap, why,
                            sizeof why) == 0) {
        struct samples cli = {0}, srv = {0}, spawn = {0};
        measure_turn_start(b, &s, b->fb.start_turns / 2, b->gap_ms, &cli, &srv, &spawn);
        val[R_PRE_CLI_P50][col] = samples_pct(&cli, 50);
        val[R_PRE_SRV_P50][col] = samples_pct(&srv, 50);
        samples_free(&cli);
        samples_free(&srv);
        samples_free(&spawn);
        val[R_NUMPY_PRE][col] = measure_import(b, &s, "numpy", b->fb.import_turns);
        val[R_PANDAS_PRE][col] = measure_import(b, &s, "pandas", b->fb.import_turns);
        double held, kmem;
        measure_pss(b, &s, b->fb.pss_small, &val[R_PRE_PSS_S][col], &held,
                    &val[R_PRE_TOP_PSS][col], &kmem);
        /* Pss divides each shared page among the processes mapping it: with
         * a large preloaded heap, per turn shrinks as turns are added. */
        if (b->fb.pss_big) {
            double top;
            measure_pss(b, &s, b->fb.pss_big, &val[R_PRE_PSS_B][col], &held, &top, &kmem);
        }
        server_stop(&s);
        close(s.log_fd);
    } else
        printf("note: %s: --preload numpy,pandas not available: %s\n", tag, why);
}

void run_baseline(struct bench *b)
{
    char launcher[PATH_MAX], why[512];
    snprintf(launcher, sizeof launcher, "%s/baseline-server", b->bench_dir);
    char *argv[] = {(char *)b->python, launcher, "--python", (char *)b->python, NULL};
    struct server s;
    if (server_start(&s, "baseline", true, argv, why, sizeof why) < 0) {
        progress("[baseline] %s: %s", launcher, why);
        b->failed = true;
        return;
    }
    progress("[baseline] %s (port %u)", s.cmd, s.port);
    measure_all(b, &s, COL_BASE, &b->bl);
    server_stop(&s);
    close(s.log_fd);
}
