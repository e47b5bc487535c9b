/* forkbox-bench: load generator and benchmark for forkboxd. This file: the command line and
 * main(); what the other files of tools/bench/ do is in bench.h.
 *
 *   forkbox-bench [--quick] [--forkboxd PATH] [--bench-dir DIR] [--python PATH]
 *                 [--no-baseline] [--only iso|noiso|baseline] [--scale F]
 *
 * Speaks the Code Mode wire protocol v2 (shared/spec/wire-protocol.md) over real loopback
 * sockets: its own HTTP upgrade (OpenSSL libcrypto for the key/accept check), WebSocket framing
 * with wslay on non-blocking sockets driven by one epoll loop, frames parsed with cJSON, gzip tar
 * archives built with libarchive. It starts every server itself, on 127.0.0.1 port 0:
 *
 *   forkboxd (full isolation), forkboxd --no-isolation, each also with --pool 8 and with
 *   --preload numpy,pandas (shown as n/a where the daemon rejects the flag), and the baseline
 *   in tools/bench/ (a fresh python3 process per turn: the reference's model minus its container)
 *
 * and prints one table: metric | forkbox (isolated) | forkbox (no isolation) | baseline | ratio |
 * target, and for --rows bigdata (uploads, snapshots, big tool results and stdout, Python speed
 * against python3) a second one with the same columns. Server-side turn-start times come from
 * forkboxd's debug log ("turn N: ready X ms after the upgrade (spawn Y ms)"). Memory is Pss from /proc/PID/smaps_rollup of every process below
 * the server. Timing never changes the exit status: it is 0 unless a server could not be started
 * or a turn broke the protocol (then 1), 2 on usage errors. Every loop is bounded in count and
 * time; all traffic goes to 127.0.0.1. */
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "bench.h"

#ifndef FORKBOX_DAEMON_PATH
#define FORKBOX_DAEMON_PATH "forkboxd"
#endif
#ifndef FORKBOX_BENCH_DIR
#define FORKBOX_BENCH_DIR "tools/bench"
#endif

/* The --rows names, in the order of the G_* bits (bench.h). */
static const char *const group_names[] = {"start",   "rtt",     "tool",    "throughput",
                                          "pss",     "import",  "pool",    "preload",
                                          "bigdata", "steps",   "floor"};

static int parse_groups(const char *list, unsigned *out)
{
    char *copy = strdup(list), *save = NULL;
    unsigned g = 0;
    int r = 0;
    for (char *w = strtok_r(copy, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        size_t i = 0;
        while (i < sizeof group_names / sizeof *group_names && strcmp(w, group_names[i]))
            i++;
        if (i == sizeof group_names / sizeof *group_names) {
            fprintf(stderr, "forkbox-bench: --rows: no group '%s'\n", w);
            r = -1;
            break;
        }
        g |= 1u << i;
    }
    free(copy);
    *out = g;
    return g ? r : -1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: forkbox-bench [options]\n"
            "  --forkboxd PATH   daemon to start (default: %s, or $FORKBOXD)\n"
            "  --bench-dir DIR   baseline server and helpers (default: %s)\n"
            "  --python PATH     interpreter for the baseline and the Python client "
            "(/usr/bin/python3)\n"
            "  --quick           smaller counts (about a minute)\n"
            "  --scale F         multiply every count by F (after --quick)\n"
            "  --no-baseline     skip the baseline\n"
            "  --only WHICH      iso, noiso or baseline: measure only that column\n"
            "  --gap-ms N        idle time between the sequential turn-start turns (0)\n"
            "  --rows LIST       measure only these groups (comma-separated): start, rtt, tool,\n"
            "                    throughput, pss, import, pool, preload, bigdata, steps, floor\n"
            "                    (default: all; bigdata is measured for the isolated column and\n"
            "                    the baseline, and for no isolation only with --only noiso;\n"
            "                    steps and floor for the isolated column only)\n"
            "  --floor DIR       a build of ../shared/bench/floor: its bench_py runs beside\n"
            "                    forkboxd in the steps and floor groups\n",
            FORKBOX_DAEMON_PATH, FORKBOX_BENCH_DIR);
}

int main(int argc, char **argv)
{
    enum { O_DAEMON = 256, O_DIR, O_PY, O_QUICK, O_SCALE, O_NOBASE, O_ONLY, O_GAP, O_ROWS, O_FLOOR,
           O_HELP };
    static const struct option opts[] = {
        {"forkboxd", required_argument, NULL, O_DAEMON},
        {"bench-dir", required_argument, NULL, O_DIR},
        {"python", required_argument, NULL, O_PY},
        {"quick", no_argument, NULL, O_QUICK},
        {"scale", required_argument, NULL, O_SCALE},
        {"no-baseline", no_argument, NULL, O_NOBASE},
        {"only", required_argument, NULL, O_ONLY},
        {"gap-ms", required_argument, NULL, O_GAP},
        {"rows", required_argument, NULL, O_ROWS},
        {"floor", required_argument, NULL, O_FLOOR},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    const char *daemon = getenv("FORKBOXD") ? getenv("FORKBOXD") : FORKBOX_DAEMON_PATH;
    const char *only = NULL;
    bool quick = false, baseline = true;
    double scale = 1;
    struct bench b = {.bench_dir = FORKBOX_BENCH_DIR, .python = "/usr/bin/python3",
                      .groups = G_ALL & ~G_FLOOR};
    bool rows_given = false;
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case O_DAEMON: daemon = optarg; break;
        case O_DIR: b.bench_dir = optarg; break;
        case O_PY: b.python = optarg; break;
        case O_QUICK: quick = true; break;
        case O_SCALE:
            scale = atof(optarg);
            if (!(scale > 0 && scale <= 100)) {
                fprintf(stderr, "forkbox-bench: --scale: expected a number in (0, 100]\n");
                return 2;
            }
            break;
        case O_NOBASE: baseline = false; break;
        case O_ONLY:
            only = optarg;
            if (strcmp(only, "iso") && strcmp(only, "noiso") && strcmp(only, "baseline")) {
                fprintf(stderr, "forkbox-bench: --only: iso, noiso or baseline\n");
                return 2;
            }
            break;
        case O_GAP:
            b.gap_ms = (unsigned)strtoul(optarg, NULL, 10);
            b.gap_set = true;
            break;
        case O_ROWS:
            if (parse_groups(optarg, &b.groups) < 0)
                return 2;
            rows_given = true;
            break;
        case O_FLOOR: b.floor_dir = optarg; break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    if (b.floor_dir && !rows_given)
        b.groups |= G_FLOOR;

    /* counts: forkbox / baseline (the baseline spends ~100 ms of CPU per turn) */
    b.fb = (struct counts){.start_turns = 200, .py_turns = 50, .rtt_blocks = 500, .calls = 2000,
                           .pss_small = 100, .pss_big = 2000, .import_turns = 3, .tp_secs = 3};
    b.bl = (struct counts){.start_turns = 30, .py_turns = 10, .rtt_blocks = 500, .calls = 1000,
                           .pss_small = 100, .pss_big = 0, .import_turns = 3, .tp_secs = 3};
    if (quick) {
        b.fb = (struct counts){.start_turns = 60, .py_turns = 20, .rtt_blocks = 150,
                               .calls = 500, .pss_small = 50, .pss_big = 500,
                               .import_turns = 1, .tp_secs = 1};
        b.bl = (struct counts){.start_turns = 10, .py_turns = 5, .rtt_blocks = 150, .calls = 300,
                               .pss_small = 20, .pss_big = 0, .import_turns = 1, .tp_secs = 1.5};
    }
    struct counts *cs[] = {&b.fb, &b.bl};
    for (int i = 0; i < 2 && scale != 1; i++) {
        struct counts *c = cs[i];
        c->start_turns = scale_u(c->start_turns, scale);
        c->py_turns = scale_u(c->py_turns, scale);
        c->rtt_blocks = scale_u(c->rtt_blocks, scale);
        c->calls = scale_u(c->calls, scale);
        c->pss_small = scale_u(c->pss_small, scale);
        c->pss_big = c->pss_big ? scale_u(c->pss_big, scale) : 0;
        c->import_turns = scale_u(c->import_turns, scale);
        c->tp_secs *= scale;
    }

    t_begin = now_ns();
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_fatal_signal);
    signal(SIGTERM, on_fatal_signal);
    /* 2000 idle turns need ~2000 sockets here and ~3 fds each in forkboxd, which inherits this */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (make_tools_targz(&b.tools) < 0 || make_targz(NULL, 0, &b.empty) < 0)
        return 1;
    rows_init(&b.fb);
    b.quick = quick;
    struct bigdata bd;
    if (b.groups & G_BIG) {
        bigdata_init(&bd, quick, scale);
        b.big = &bd;
        b.big_noiso = only && !strcmp(only, "noiso");
    }

    printf("command:");
    for (int i = 0; i < argc; i++)
        printf(" %s", argv[i]);
    struct utsname u;
    uname(&u);
    printf("\nmachine: %ld CPUs, %.1f GiB, Linux %s, cgroup favordynmods %s; forkboxd: %s; "
           "archives: tools %zu B, empty %zu B\n",
           sysconf(_SC_NPROCESSORS_ONLN), (double)meminfo_kb("MemTotal:") / 1048576.0, u.release,
           cgroup_favordynmods() ? "on" : "off", daemon, b.tools.n, b.empty.n);
    fflush(stdout);

    char la[64];
    loadavg(la, sizeof la);
    printf("load average at start: %s\n", la);
    fflush(stdout);
    uint64_t t0 = now_ns();
    if (!only || !strcmp(only, "iso"))
        run_forkbox(&b, daemon, true, COL_ISO, "isolated");
    if (!only || !strcmp(only, "noiso"))
        run_forkbox(&b, daemon, false, COL_NOISO, "no-isolation");
    if (baseline && (!only || !strcmp(only, "baseline")))
        run_baseline(&b);

    printf("\n");
    if (b.groups & ~(G_BIG | G_STEPS | G_FLOOR))
        print_table(0, R_BIG_FIRST);
    printf("\nforkbox counts: %u turns for turn start (%u with the Python client), %u empty "
           "blocks, %u tool calls, throughput %.1f s per row, Pss at %u and %u idle turns, "
           "imports median of %u turns.\n"
           "baseline counts: %u turns for turn start (%u Python client), %u empty blocks, %u tool "
           "calls, throughput %.1f s per row, Pss at %u idle turns.\n",
           b.fb.start_turns, b.fb.py_turns, b.fb.rtt_blocks, b.fb.calls, b.fb.tp_secs,
           b.fb.pss_small, b.fb.pss_big, b.fb.import_turns, b.bl.start_turns, b.bl.py_turns,
           b.bl.rtt_blocks, b.bl.calls, b.bl.tp_secs, b.bl.pss_small);
    printf("ratio: how many times better forkbox (isolated) is than the baseline: baseline/forkbox "
           "for times and memory, forkbox/baseline for rates. * = the baseline's number without "
           "pool/preload (it has neither). Server-side times are forkboxd's own log (upgrade -> "
           "ready); the baseline has no such log. CPU per turn = busy time of every CPU over the "
           "row, until the last turn is reaped, less the load generator's own, / turns (kernel "
           "threads included: namespace teardown runs in kworkers). Targets are checked against "
           "the isolated column and never change the exit status.\n");
    if (b.groups & G_BIG)
        print_big(&b);
    loadavg(la, sizeof la);
    printf("total time: %.0f s; load average at the end: %s (other work on this machine skews "
           "every number)\n", ms_since(t0) / 1000.0, la);
    free(b.tools.p);
    free(b.empty.p);
    if (b.big)
        bigdata_free(b.big);
    return b.failed ? 1 : 0;
}
