/* forkbox-bench: the tables: every row's label, target and precision, the values per column,
 * and the printing of the main table and the big-data one (tools/bench/compare parses these
 * rows by their labels: keep them byte for byte). Runs in the forkbox-bench process. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"

struct rowdef {
    char name[64];
    int higher_better;   /* for the ratio: rates are forkbox/baseline, the rest baseline/forkbox */
    const char *target;  /* printed as is */
    int cmp;             /* 0: no check; -1: value <= thr; +1: value >= thr; -2: <= baseline */
    bool no_ratio;       /* the value is itself a ratio, or the baseline's is the same thing */
    double thr;
    enum row base_row;   /* where the baseline value comes from (rows the baseline lacks) */
    int prec;            /* decimals */
};

static struct rowdef rows[NROWS];
double val[NROWS][NCOLS];

static void row_def(enum row r, const char *name, int hb, const char *target, int cmp,
                    double thr, int prec)
{
    snprintf(rows[r].name, sizeof rows[r].name, "%s", name);
    rows[r].higher_better = hb;
    rows[r].target = target;
    rows[r].cmp = cmp;
    rows[r].thr = thr;
    rows[r].base_row = r;
    rows[r].prec = prec;
}

void rows_init(const struct counts *fb)
{
    char n1[64], n2[64], n3[64], n4[64], n5[64], n6[64], n7[64];
    row_def(R_SRV_P50, "turn start p50, server: upgrade->ready [ms]", 0, "<= 2", -1, 2, 3);
    row_def(R_SRV_P99, "turn start p99, server [ms]", 0, "<= 10", -1, 10, 3);
    row_def(R_SPAWN_P50, "  of which spawn (clone+isolation) p50 [ms]", 0, "", 0, 0, 3);
    row_def(R_CLI_P50, "turn start p50, C client: connect->ready [ms]", 0, "", 0, 0, 3);
    row_def(R_CLI_P99, "turn start p99, C client [ms]", 0, "<= 10", -1, 10, 3);
    row_def(R_PY_P50, "turn start p50, Python websockets client [ms]", 0, "<= 3", -1, 3, 3);
    row_def(R_POOL_SRV_P50, "turn start p50, server, --pool 8, turns apart [ms]", 0, "<= 2", -1,
            2, 3);
    row_def(R_POOL_SRV_P99, "turn start p99, server, --pool 8, turns apart [ms]", 0, "<= 10", -1,
            10, 3);
    row_def(R_POOL_CLI_P50, "turn start p50, C client, --pool 8, turns apart [ms]", 0, "", 0, 0,
            3);
    row_def(R_POOL_PY_P50, "turn start p50, Python client, --pool 8, apart [ms]", 0, "<= 3", -1,
            3, 3);
    row_def(R_POOL_B2B_P50, "turn start p50, server, --pool 8, back to back [ms]", 0, "", 0, 0,
            3);
    row_def(R_PRE_SRV_P50, "turn start p50, server, --preload numpy,pandas [ms]", 0, "", 0, 0,
           3);
    row_def(R_PRE_CLI_P50, "turn start p50, C client, --preload numpy,pandas [ms]", 0, "", 0, 0,
           3);
    row_def(R_RTT_P50, "empty block round trip p50 [ms]", 0, "", 0, 0, 3);
    row_def(R_RTT_P99, "empty block round trip p99 [ms]", 0, "", 0, 0, 3);
    row_def(R_TC_INSIDE, "tool call round trip, timed in the sandbox [us]", 0, "", 0, 0, 1);
    row_def(R_TC_CLIENT, "  client's own time to answer, p50 [us]", 0, "", 0, 0, 1);
    row_def(R_TC_ADDED, "  added by the server (inside - client) [us]", 0, "<= 100", -1, 100,
           1);
    row_def(R_TP4, "throughput 4 x 1 block [turns/s]", 1, ">= 500", +1, 500, 0);
    row_def(R_TP16, "throughput 16 x 1 block [turns/s]", 1, ">= 500", +1, 500, 0);
    row_def(R_TP64, "throughput 64 x 1 block [turns/s]", 1, ">= 500", +1, 500, 0);
    row_def(R_TP4x5, "throughput 4 x 5 blocks [turns/s]", 1, "", 0, 0, 1);
    row_def(R_BP4x5, "throughput 4 x 5 blocks [blocks/s]", 1, "", 0, 0, 0);
    row_def(R_TP16x5, "throughput 16 x 5 blocks [turns/s]", 1, "", 0, 0, 1);
    row_def(R_BP16x5, "throughput 16 x 5 blocks [blocks/s]", 1, "", 0, 0, 0);
    row_def(R_CPU1, "CPU per 1-block turn, machine less client (16x1) [ms]", 0, "", 0, 0, 2);
    row_def(R_CPU5, "CPU per 5-block turn, machine less client (16x5) [ms]", 0, "", 0, 0, 2);
    row_def(R_CGCPU1, "CPU per 1-block turn, server's cgroup (16x1) [ms]", 0, "", 0, 0, 2);
    snprintf(n1, sizeof n1, "Pss per idle turn, %u open [MB]", fb->pss_small);
    snprintf(n2, sizeof n2, "Pss per idle turn, %u open [MB]", fb->pss_big);
    snprintf(n3, sizeof n3, "idle turns held (of %u)", fb->pss_big);
    snprintf(n4, sizeof n4, "MemAvailable drop per idle turn, %u open [MB]", fb->pss_big);
    snprintf(n5, sizeof n5, "Pss per idle turn, %u open, pandas preloaded [MB]", fb->pss_small);
    snprintf(n6, sizeof n6, "Pss per idle turn, %u open, pandas preloaded [MB]", fb->pss_big);
    row_def(R_PSS_S, n1, 0, "<= 2", -1, 2, 3);
    row_def(R_PSS_B, n2, 0, "<= 2", -1, 2, 3);
    snprintf(n7, sizeof n7, "Pss per idle turn, %u open, after one block [MB]", fb->pss_small);
    row_def(R_PSS_BLK, n7, 0, "", 0, 0, 3);
    row_def(R_HELD_B, n3, 1, ">= 2000", +1, 2000, 0);
    row_def(R_KMEM_B, n4, 0, "", 0, 0, 3);
    row_def(R_TOP_PSS, "Pss of the fork server (+helper) / launcher [MB]", 0, "", 0, 0, 1);
    row_def(R_PRE_PSS_S, n5, 0, "<= 2", -1, 2, 3);
    row_def(R_PRE_PSS_B, n6, 0, "<= 2", -1, 2, 3);
    row_def(R_PRE_TOP_PSS, "Pss of the fork server, pandas preloaded [MB]", 0, "", 0, 0, 1);
    row_def(R_NUMPY, "import numpy in a turn [ms]", 0, "", 0, 0, 2);
    row_def(R_PANDAS, "import pandas in a turn [ms]", 0, "", 0, 0, 2);
    row_def(R_NUMPY_PRE, "import numpy, --preload numpy,pandas [ms]", 0, "", 0, 0, 3);
    row_def(R_PANDAS_PRE, "import pandas, --preload numpy,pandas [ms]", 0, "<= 1", -1, 1, 3);
    /* the baseline cannot pool or preload: compare those rows with its plain numbers */
    rows[R_POOL_SRV_P50].base_row = R_SRV_P50;
    rows[R_POOL_SRV_P99].base_row = R_SRV_P99;
    rows[R_POOL_CLI_P50].base_row = R_CLI_P50;
    rows[R_POOL_PY_P50].base_row = R_PY_P50;
    rows[R_POOL_B2B_P50].base_row = R_SRV_P50;
    rows[R_PRE_SRV_P50].base_row = R_SRV_P50;
    rows[R_PRE_CLI_P50].base_row = R_CLI_P50;
    rows[R_PRE_PSS_S].base_row = R_PSS_S;
    rows[R_PRE_PSS_B].base_row = R_PSS_S;
    rows[R_PRE_TOP_PSS].base_row = R_TOP_PSS;
    rows[R_NUMPY_PRE].base_row = R_NUMPY;
    rows[R_PANDAS_PRE].base_row = R_PANDAS;
    char nm[64];
    for (int k = 0; k < NKINDS; k++)
        for (int z = 0; z < NBIGSZ; z++) {
            int i = k * NBIGSZ + z;
            unsigned mib = big_mib[z];
            snprintf(nm, sizeof nm, "upload %u MiB %s: wall per block [ms]", mib, kind_name[k]);
            row_def(R_UP_WALL + i, nm, 0, "", 0, 0, 1);
            snprintf(nm, sizeof nm, "upload %u MiB %s: supervisor CPU per MiB [ms]", mib,
                     kind_name[k]);
            row_def(R_UP_SUP + i, nm, 0, "", 0, 0, 2);
            snprintf(nm, sizeof nm, "download %u MiB %s (pass block): wall [ms]", mib,
                     kind_name[k]);
            row_def(R_DN_WALL + i, nm, 0, "", 0, 0, 1);
            snprintf(nm, sizeof nm, "download %u MiB %s: supervisor CPU per MiB [ms]", mib,
                     kind_name[k]);
            row_def(R_DN_SUP + i, nm, 0, "", 0, 0, 2);
            snprintf(nm, sizeof nm, "pass block, %u MiB %s unchanged: server CPU [ms]", mib,
                     kind_name[k]);
            row_def(R_DN_SRV + i, nm, 0, "", 0, 0, 1);
        }
    row_def(R_CHG_WALL, "block rewriting 1 MiB of 50 MiB (50 files): wall [ms]", 0, "", 0, 0, 1);
    row_def(R_CHG_SRV, "block rewriting 1 MiB of 50 MiB: server CPU [ms]", 0, "", 0, 0, 1);
    for (int z = 0; z < NBIGSZ; z++) {
        snprintf(nm, sizeof nm, "tool result %u MiB: wall per call, in the sandbox [ms]",
                 tool_mib[z]);
        row_def(R_TR_WALL + z, nm, 0, "<= baseline", -2, 0, 1);
        snprintf(nm, sizeof nm, "tool result %u MiB: supervisor CPU per call [ms]", tool_mib[z]);
        row_def(R_TR_SUP + z, nm, 0, "", 0, 0, 1);
        snprintf(nm, sizeof nm, "tool result %u MiB: server CPU per call [ms]", tool_mib[z]);
        row_def(R_TR_SRV + z, nm, 0, "", 0, 0, 1);
    }
    row_def(R_SO_WALL, "16 MiB of stdout from one block: wall [ms]", 0, "<= baseline", -2, 0, 1);
    row_def(R_SO_SUP, "16 MiB of stdout: supervisor CPU [ms]", 0, "", 0, 0, 1);
    row_def(R_SO_SRV, "16 MiB of stdout: server CPU [ms]", 0, "", 0, 0, 1);
    row_def(R_LOOP, "pure-Python loop, 3e6 iterations, in a block [ms]", 0, "", 0, 0, 1);
    row_def(R_LOOP_PY3, "  the same code under python3, no turn [ms]", 0, "", 0, 0, 1);
    row_def(R_LOOP_RATIO, "  in a block / under python3", 0, "<= 1.05", -1, 1.05, 3);
    row_def(R_MM, "numpy 500x500 float64 matmul, in a block [ms]", 0, "", 0, 0, 2);
    row_def(R_MM_PY3, "  the same code under python3, no turn [ms]", 0, "", 0, 0, 2);
    row_def(R_MM_RATIO, "  in a block / under python3", 0, "", 0, 0, 3);
    rows[R_LOOP_PY3].no_ratio = rows[R_LOOP_RATIO].no_ratio = true;
    rows[R_MM_PY3].no_ratio = rows[R_MM_RATIO].no_ratio = true;
    for (int r = 0; r < NROWS; r++)
        for (int c = 0; c < NCOLS; c++)
            val[r][c] = NAN;
}

static void fmt_val(char *out, size_t n, enum row r, double v, bool borrowed)
{
    if (isnan(v))
        snprintf(out, n, "n/a");
    else {
        snprintf(out, n, "%.*f", rows[r].prec, v);
        if (borrowed)
            strncat(out, "*", n - strlen(out) - 1);
    }
}

void print_table(int first, int last)
{
    printf("| %-55s | %-18s | %-22s | %-10s | %-8s | %-14s |\n", "metric", "forkbox (isolated)",
           "forkbox (no isolation)", "baseline", "ratio", "target");
    printf("|%s|%s|%s|%s|%s|%s|\n", "---------------------------------------------------------",
           "--------------------", "------------------------", "------------", "----------",
           "----------------");
    for (int r = first; r < last; r++) {
        char a[32], b2[32], c[32], ratio[32] = "", target[40] = "";
        enum row br = rows[r].base_row;
        double base = val[br][COL_BASE], iso = val[r][COL_ISO];
        fmt_val(a, sizeof a, r, iso, false);
        fmt_val(b2, sizeof b2, r, val[r][COL_NOISO], false);
        fmt_val(c, sizeof c, br, base, br != (enum row)r && !isnan(base));
        if (!isnan(base) && !isnan(iso) && iso > 0 && base > 0 && r != R_HELD_B &&
            r != R_TC_CLIENT && r != R_TOP_PSS && r != R_PRE_TOP_PSS && !rows[r].no_ratio)
        {
            double x = rows[r].higher_better ? iso / base : base / iso;
            snprintf(ratio, sizeof ratio, x >= 100 ? "%.0fx" : "%.1fx", x);
        }
        if (rows[r].target[0]) {
            const char *mark = "";
            if (rows[r].cmp == -2 && !isnan(iso) && !isnan(base))
                mark = iso <= base ? " ok" : " MISS";
            else if (rows[r].cmp && rows[r].cmp != -2 && !isnan(iso))
                mark = (rows[r].cmp < 0 ? iso <= rows[r].thr : iso >= rows[r].thr) ? " ok"
                                                                                   : " MISS";
            snprintf(target, sizeof target, "%s%s", rows[r].target, mark);
        }
        printf("| %-55s | %18s | %22s | %10s | %8s | %-14s |\n", rows[r].name, a, b2, c, ratio,
               target);
    }
}

/* The bigdata table, with a header saying what its columns are and a footer with the archive
 * sizes and how flat the supervisor's CPU per MiB is from 1 to 50 MiB. */
void print_big(const struct bench *b)
{
    const struct bigdata *bd = b->big;
    printf("\nbig data (--rows bigdata): one fresh turn (--pool 0) per row, its blocks run one "
           "at a time.\n"
           "  wall: at the client, workspace archive sent -> snapshot received, median of the "
           "blocks; tool results: each call timed in the block (perf_counter), median.\n"
           "  supervisor CPU: forkboxd's own (not the fork server's or a sandbox's), per MiB of "
           "the archive on the wire (the upload; the snapshot) or per call / block. The "
           "baseline has no supervisor.\n"
           "  server CPU: the supervisor and every process serving the turn (fork server, "
           "sandbox init and runtime; baseline: launcher and the turn's python3), from /proc "
           "between blocks, when all of them wait: the live threads' schedstat (ns), or "
           "utime+stime+cutime+cstime (10 ms ticks; counts exited threads and reaped children) "
           "where larger.\n"
           "  upload: the archive holds one file of N MiB (gzip -1), which the block checks and "
           "removes. download: `pass` blocks after a block that kept it: each snapshot carries "
           "it, unchanged (the pass-block rows). text: made-up words, ~2.6:1 at gzip -6.\n"
           "  Python rows: thread CPU time, the fastest of %u runs per round, %u round(s), "
           "alternating with %s -c (BLAS at one thread in both). ratio: baseline / forkbox "
           "(isolated).\n\n", bd->py_reps, bd->py_rounds, b->python);
    print_table(R_BIG_FIRST, NROWS);
    printf("\nbigdata counts: blocks per upload/download row %u / %u / %u (1 / 10 / 50 MiB), "
           "tool calls %u / %u / %u (1 / 10 / 40 MiB), blocks of stdout %u, rewrite blocks %u.\n",
           bd->reps[0], bd->reps[1], bd->reps[2], bd->tool_calls[0], bd->tool_calls[1],
           bd->tool_calls[2], bd->stdout_reps, bd->change_reps);
    for (int k = 0; k < NKINDS; k++) {
        printf("%s: upload archives", kind_name[k]);
        char f1[32];
        for (int z = 0; z < NBIGSZ; z++)
            printf(" %s", fmt_ms(f1, sizeof f1, bd->up[k][z].p ? (double)bd->up[k][z].n / MiB_D
                                                                : NAN));
        for (int c = 0; c < NCOLS; c++) {
            static const char *const cn[] = {"isolated", "no isolation", "baseline"};
            if (!bd->snap[c][k][0] && !bd->snap[c][k][1] && !bd->snap[c][k][2])
                continue;
            printf("; %s snapshots", cn[c]);
            for (int z = 0; z < NBIGSZ; z++)
                printf(" %s", fmt_ms(f1, sizeof f1, bd->snap[c][k][z]
                                                        ? (double)bd->snap[c][k][z] / MiB_D
                                                        : NAN));
        }
        printf(" MiB (at 1 / 10 / 50 MiB of content)\n");
    }
    if (isnan(val[R_UP_SUP][COL_ISO]))
        return;
    printf("supervisor CPU per MiB, 50 MiB / 1 MiB (flat: <= 1.5), isolated:");
    for (int k = 0; k < NKINDS; k++) {
        int i = k * NBIGSZ;
        char f1[32], f2[32];
        printf(" upload %s %s, download %s %s%s", kind_name[k],
               fmt_ms(f1, sizeof f1, val[R_UP_SUP + i + 2][COL_ISO] / val[R_UP_SUP + i][COL_ISO]),
               kind_name[k],
               fmt_ms(f2, sizeof f2, val[R_DN_SUP + i + 2][COL_ISO] / val[R_DN_SUP + i][COL_ISO]),
               k + 1 < NKINDS ? ";" : "\n");
    }
}
