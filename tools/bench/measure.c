/* forkbox-bench: the measurements of the plain groups (--rows start, rtt, tool, throughput,
 * pss, import): turn start (C and Python client), empty blocks, tool calls, throughput and CPU
 * per turn, Pss per idle turn, imports. Each drives turns against one running server and
 * returns its figures; run.c puts them in the table. Runs in the forkbox-bench process (and
 * forks the Python client, tools/bench/py_turnstart.py). */
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

void report_failures(struct bench *b, const struct server *s, const char *what,
                     const struct driver *d, bool fatal)
{
    if (!d->turns_failed)
        return;
    progress("[%s] %s: %lu of %lu turns failed; first: %s", s->name, what, d->turns_failed,
             d->turns_failed + d->turns_ok, d->first_err);
    if (fatal)
        b->failed = true;
}

/* Turn start, one turn at a time: connect -> 101 -> tools archive -> ready, then shutdown and
 * close. Client-side samples in `cli`, server-side (forkboxd only) in `srv`/`spawn`. */
void measure_turn_start(struct bench *b, struct server *s, unsigned n, unsigned gap_ms,
                        struct samples *cli, struct samples *srv, struct samples *spawn)
{
    struct driver d;
    driver_init(&d, s->port, &b->tools, &b->empty);
    d.to_launch = 3; /* warm-up, not counted */
    driver_run(&d, now_ns() + 60ull * 1000000000u);
    samples_reset(&d.turn_start);
    if (!s->baseline)
        server_wait_quiet(s, 2000);
    size_t mark = server_log_mark(s);
    uint64_t t0 = now_ns();
    d.gap_ns = (uint64_t)gap_ms * 1000000u;
    d.to_launch = n;
    driver_run(&d, now_ns() + (s->baseline ? 120ull : 60ull) * 1000000000u);
    for (size_t i = 0; i < d.turn_start.n; i++)
        samples_add(cli, d.turn_start.v[i]);
    if (srv && !s->baseline)
        server_ready_times(s, mark, srv, spawn);
    progress("[%s] turn start: %zu turns %u ms apart in %.0f ms, p50 %.3f ms", s->name,
             d.turn_start.n, gap_ms, ms_since(t0), samples_pct(cli, 50));
    report_failures(b, s, "turn start", &d, true);
    driver_free(&d);
}

/* Turn start as a Python (websockets) client sees it: tools/bench/py_turnstart.py. */
double measure_py_turn_start(struct bench *b, struct server *s, unsigned n, unsigned gap_ms)
{
    char script[PATH_MAX], url[64], count[16], gap[16];
    snprintf(gap, sizeof gap, "%u", gap_ms);
    snprintf(script, sizeof script, "%s/py_turnstart.py", b->bench_dir);
    snprintf(url, sizeof url, "ws://127.0.0.1:%u/", s->port);
    snprintf(count, sizeof count, "%u", n + 3);
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0)
        return NAN;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        char *argv[] = {(char *)b->python, script, url, count, "90", gap, NULL};
        execv(b->python, argv);
        _exit(127);
    }
    close(pfd[1]);
    struct samples sm = {0};
    int status;
    char *out = child_output(pid, pfd[0], 120, &status);
    for (char *line = out, *nl; *line; line = nl + 1) { /* one time per line */
        nl = strchr(line, '\n');
        if (!nl)
            break;
        *nl = 0;
        samples_add(&sm, atof(line));
    }
    free(out);
    double p50 = samples_pct_from(&sm, 3, 50); /* the first three warm up */
    progress("[%s] Python client turn start: %zu turns, p50 %.3f ms", s->name,
             sm.n > 3 ? sm.n - 3 : 0, p50);
    samples_free(&sm);
    return p50;
}

/* Empty-block round trip: one turn, `n` blocks of `pass` after ready (empty archive + run, until
 * the workspace archive after output). */
void measure_rtt(struct bench *b, struct server *s, unsigned n, double *p50, double *p99)
{
    struct driver d;
    driver_init(&d, s->port, &b->tools, &b->empty);
    d.plan.blocks = n + 10;
    d.plan.run = run_frame("pass");
    d.plan.expect = "";
    d.to_launch = 1;
    driver_run(&d, now_ns() + 120ull * 1000000000u);
    *p50 = samples_pct_from(&d.block_rtt, 10, 50);
    *p99 = samples_pct_from(&d.block_rtt, 10, 99);
    progress("[%s] empty block: %zu blocks, p50 %.3f ms, p99 %.3f ms", s->name,
             d.block_rtt.n > 10 ? d.block_rtt.n - 10 : 0, *p50, *p99);
    report_failures(b, s, "empty blocks", &d, true);
    driver_free(&d);
}

/* One turn with one block running code, output captured, within secs; the caller reads d and
 * frees it with driver_free. */
static void run_one_block(struct bench *b, struct server *s, const char *code, unsigned secs,
                          struct driver *d)
{
    driver_init(d, s->port, &b->tools, &b->empty);
    d->plan.blocks = 1;
    d->plan.run = run_frame(code);
    d->plan.capture = true;
    d->to_launch = 1;
    driver_run(d, now_ns() + (uint64_t)secs * 1000000000u);
}

/* Tool-call round trip timed inside the sandbox: the median call of each of TOOL_TURNS turns,
 * then the median over the turns (where the scheduler puts the four parties of a call on two
 * CPUs changes a turn's figure by a third; one turn is not a measurement). */
#define TOOL_TURNS 5
void measure_tool_call(struct bench *b, struct server *s, unsigned calls, double *inside_us,
                       double *client_us)
{
    char code[640];
    unsigned per_turn = calls / TOOL_TURNS ? calls / TOOL_TURNS : 1;
    snprintf(code, sizeof code,
             "import time\n"
             "from tools import echo\n"
             "for _ in range(50):\n"
             "    echo(message='x')\n"
             "ts = []\n"
             "for _ in range(%u):\n"
             "    t = time.perf_counter()\n"
             "    echo(message='x')\n"
             "    ts.append(time.perf_counter() - t)\n"
             "ts.sort()\n"
             "print(ts[len(ts) // 2] * 1e6)\n",
             per_turn);
    struct samples inside = {0}, client = {0};
    unsigned long answered = 0;
    for (int i = 0; i < TOOL_TURNS; i++) {
        struct driver d;
        run_one_block(b, s, code, 120, &d);
        if (d.out_stdout && d.out_code == 0)
            samples_add(&inside, atof(d.out_stdout));
        else if (d.out_stderr)
            progress("[%s] tool-call block failed: %.300s", s->name, d.out_stderr);
        for (size_t k = 50 < d.handling.n ? 50 : d.handling.n; k < d.handling.n; k++)
            samples_add(&client, d.handling.v[k]);
        answered += d.tool_calls;
        report_failures(b, s, "tool calls", &d, true);
        driver_free(&d);
    }
    *inside_us = samples_pct(&inside, 50);
    *client_us = samples_pct(&client, 50);
    progress("[%s] tool calls: %lu answered in %d turns, median call %.1f us inside (turns: "
             "%.1f..%.1f), client %.1f us", s->name, answered, TOOL_TURNS, *inside_us,
             samples_pct(&inside, 0), samples_pct(&inside, 100), *client_us);
    samples_free(&inside);
    samples_free(&client);
}

/* Throughput: `conc` turns in flight, each `k` blocks of print(1) (pipelined like the host: tools,
 * archive and run back to back), a new turn as soon as one ends; new turns for `secs`, then the
 * ones in flight finish. Rates are over the time to the last completed turn. */
void measure_throughput(struct bench *b, struct server *s, unsigned conc, unsigned k,
                        double secs, double *turns_s, double *blocks_s, struct tp_cpu *cpu)
{
    struct driver d;
    driver_init(&d, s->port, &b->tools, &b->empty);
    d.plan.blocks = k;
    d.plan.run = run_frame("print(1)");
    d.plan.expect = "1\n";
    d.plan.pipeline = true;
    d.max_active = d.max_pending = conc;
    d.to_launch = 1000000;
    uint64_t t0 = now_ns();
    double cpu0 = self_cpu_s();
    unsigned long long busy0, total0, busy1, total1;
    machine_jiffies(&busy0, &total0);
    double cg0 = cg_cpu_ns(s->cg);
    long long own0[3], own1[3];
    server_own_cpu(s, own0);
    d.t_first = t0;
    d.launch_until = t0 + (uint64_t)(secs * 1e9);
    driver_run(&d, d.launch_until + 60ull * 1000000000u);
    double el = d.t_last_done > t0 ? (double)(d.t_last_done - t0) / 1e9 : NAN;
    *turns_s = (double)d.turns_ok / el;
    *blocks_s = (double)d.blocks_ok / el;
    machine_jiffies(&busy1, &total1);
    progress("[%s] throughput %ux%u: %lu turns in %.2f s: %.1f turns/s, %.1f blocks/s "
             "(load generator CPU %.0f%%, machine busy %.0f%%)", s->name, conc, k, d.turns_ok,
             el, *turns_s, *blocks_s, 100.0 * (self_cpu_s() - cpu0) / ms_since(t0) * 1000.0,
             total1 > total0 ? 100.0 * (double)(busy1 - busy0) / (double)(total1 - total0) : NAN);
    report_failures(b, s, "throughput", &d, true);
    /* CPU per turn: every CPU's busy time from the first turn until every sandbox is reaped
     * (and the kernel's deferred teardown had a moment), less the load generator's own. Not the
     * server's rusage: a pid namespace's init that is killed auto-reaps the rest of the
     * namespace (zap_pid_ns_processes ignores SIGCHLD), so the runtime's CPU never reaches any
     * cutime, and kernel threads (namespace teardown, RCU) are nobody's child. Assumes nothing
     * else runs on the machine, like every other row. */
    server_wait_quiet(s, 10000);
    sleep_ms(200);
    machine_jiffies(&busy1, &total1);
    double busy_s = (double)(busy1 - busy0) / (double)sysconf(_SC_CLK_TCK);
    double per = d.turns_ok ? (busy_s - (self_cpu_s() - cpu0)) * 1e3 / (double)d.turns_ok : NAN;
    /* The server's own processes, from its cgroup: other work on the machine does not count. */
    double cg = d.turns_ok ? (cg_cpu_ns(s->cg) - cg0) / 1e6 / (double)d.turns_ok : NAN;
    /* Which of them: forkboxd, the fork server and its helper from their threads' run time
     * (exact: none of them is running now); the rest of the cgroup is the sandboxes', whose
     * CPU no process keeps (a killed pid namespace's processes are reaped by the kernel). */
    server_own_cpu(s, own1);
    double own[3];
    for (int i = 0; i < 3; i++)
        own[i] = d.turns_ok && own0[i] >= 0 && own1[i] >= own0[i]
                     ? (double)(own1[i] - own0[i]) / 1e6 / (double)d.turns_ok : NAN;
    if (cpu)
        *cpu = (struct tp_cpu){.machine = per, .cgroup = cg, .sup = own[0], .fs = own[1],
                               .helper = own[2]};
    char f[32];
    progress("[%s] throughput %ux%u: CPU %.2f ms per turn (whole machine, less the load "
             "generator), %s ms in the server's cgroup: supervisor %.3f, fork server %.3f, "
             "its helper %.3f, sandboxes %.3f", s->name, conc, k, per, fmt_ms(f, sizeof f, cg),
             own[0], own[1], own[2], cg - own[0] - own[1] - own[2]);
    driver_free(&d);
}

/* Memory per idle turn: open n turns (each after ready, or after `blocks` `pass` blocks, between
 * blocks) at most 16 starting at once, then sum Pss over every process that serves them. */
void measure_pss_after(struct bench *b, struct server *s, unsigned n, unsigned blocks,
                       double *per_turn_mb, double *held, double *top_mb,
                       double *kernel_mb)
{
    struct driver d;
    driver_init(&d, s->port, &b->tools, &b->empty);
    d.plan.hold = true;
    if (blocks) {
        d.plan.blocks = blocks;
        d.plan.run = run_frame("pass");
        d.plan.expect = "";
    }
    d.max_active = UINT_MAX;
    d.max_pending = 16;
    d.max_fail = n / 20 + 1; /* a few failures are reported; many mean the server is full */
    d.to_launch = n;
    long avail0 = meminfo_kb("MemAvailable:");
    uint64_t t0 = now_ns();
    driver_run(&d, now_ns() + 240ull * 1000000000u);
    double open_ms = ms_since(t0);
    sleep_ms(300); /* let the last sandboxes settle after ready */
    long avail1 = meminfo_kb("MemAvailable:");
    struct tree tr;
    server_tree(s, &tr);
    long sum = 0, top = 0;
    for (size_t i = 0; i < tr.nturns; i++) {
        long kb = shares_parent_mm(tr.turns[i]) ? 0 : pss_kb(tr.turns[i]);
        sum += kb > 0 ? kb : 0;
    }
    for (size_t i = 0; i < tr.ntop; i++) {
        long kb = pss_kb(tr.top[i]);
        top += kb > 0 ? kb : 0;
    }
    *held = d.held_now;
    *per_turn_mb = d.held_now ? (double)sum / 1024.0 / d.held_now : NAN;
    *top_mb = (double)top / 1024.0;
    *kernel_mb = d.held_now && avail0 > 0 && avail1 > 0
                     ? (double)(avail0 - avail1) / 1024.0 / d.held_now
                     : NAN;
    if (d.held_now < n)
        printf("note: %s held %u of %u idle turns: %s\n", s->name, d.held_now, n,
               d.turns_failed ? d.first_err : "(no failure reported)");
    progress("[%s] idle turns%s: %u of %u open in %.0f ms (%zu processes), Pss %.2f MB per "
             "turn, server top %.1f MB, MemAvailable drop %.2f MB per turn", s->name,
             blocks ? " after a block" : "", d.held_now, n, open_ms, tr.nturns, *per_turn_mb,
             *top_mb, *kernel_mb);
    tree_free(&tr);
    report_failures(b, s, "idle turns", &d, false);
    driver_release(&d, now_ns() + 120ull * 1000000000u);
    report_failures(b, s, "idle turns (release)", &d, true);
    driver_free(&d);
    server_wait_quiet(s, 30000);
}

void measure_pss(struct bench *b, struct server *s, unsigned n, double *per_turn_mb,
                 double *held, double *top_mb, double *kernel_mb)
{
    measure_pss_after(b, s, n, 0, per_turn_mb, held, top_mb, kernel_mb);
}

/* `import MODULE` timed inside a block of a fresh turn, median over `turns` turns (ms). */
double measure_import(struct bench *b, struct server *s, const char *module, unsigned turns)
{
    char code[256];
    snprintf(code, sizeof code,
             "import time\nt = time.perf_counter()\nimport %s\n"
             "print((time.perf_counter() - t) * 1e3)\n",
             module);
    struct samples sm = {0};
    for (unsigned i = 0; i < turns; i++) {
        struct driver d;
        run_one_block(b, s, code, 60, &d);
        if (d.out_stdout && d.out_code == 0)
            samples_add(&sm, atof(d.out_stdout));
        else if (d.out_stderr && i == 0) {
            /* numpy says why in "Original error was: ..."; otherwise the exception line */
            const char *why = strstr(d.out_stderr, "Original error was: ");
            size_t len = strlen(d.out_stderr);
            while (len && d.out_stderr[len - 1] == '\n')
                d.out_stderr[--len] = 0;
            if (why)
                why += strlen("Original error was: ");
            else
                why = strrchr(d.out_stderr, '\n') ? strrchr(d.out_stderr, '\n') + 1 : d.out_stderr;
            printf("note: %s: import %s failed in the turn: %.*s\n", s->name, module,
                   (int)strcspn(why, "\n"), why);
        }
        report_failures(b, s, "imports", &d, true);
        driver_free(&d);
    }
    double r = samples_pct(&sm, 50);
    progress("[%s] import %s: %.2f ms (median of %zu)", s->name, module, r, sm.n);
    samples_free(&sm);
    return r;
}
