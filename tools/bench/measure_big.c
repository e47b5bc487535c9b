/* forkbox-bench: the big-data measurements (--rows bigdata): uploads and downloads of 1 / 10 /
 * 50 MiB, a changed workspace, big tool results, 16 MiB of stdout, and Python's speed in a block
 * against python3. One fresh turn per row, its blocks run one at a time with the CPU read
 * between them; the figures go straight into the table (report.c). Runs in the forkbox-bench
 * process (and forks python3 for the reference runs). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

/* Opens one turn and holds it after ready; false (reason in `why`) if it did not get there. */
static bool big_open(struct bench *b, struct server *s, struct driver *d, char *why, size_t n)
{
    server_wait_quiet(s, 10000); /* only this turn's processes below the server */
    driver_init(d, s->port, &b->tools, &b->empty);
    d->plan.hold = true;
    d->plan.capture = true;
    d->to_launch = 1;
    driver_run(d, now_ns() + 60ull * 1000000000u);
    if (d->held_now == 1)
        return true;
    snprintf(why, n, "the turn did not open: %s", d->first_err[0] ? d->first_err : "?");
    return false;
}

/* One block on the held turn; the block must exit 0 (and print `expect`, if given). Returns
 * its round trip in ms, or NAN with the reason in `why`. */
static double big_block(struct driver *d, const struct blob *up, const char *code,
                        const char *expect, unsigned secs, char *why, size_t n)
{
    double ms = driver_block(d, up, code, now_ns() + (uint64_t)secs * 1000000000u);
    if (isnan(ms)) {
        snprintf(why, n, "turn failed: %s", d->first_err[0] ? d->first_err : "?");
        return NAN;
    }
    if (d->out_code != 0 || (expect && strcmp(d->out_stdout, expect))) {
        const char *e = d->out_stderr ? d->out_stderr : "";
        size_t len = strlen(e);
        while (len && e[len - 1] == '\n')
            len--;
        const char *last = e + len;
        while (last > e && last[-1] != '\n')
            last--;
        snprintf(why, n, "block exited %" PRId64 ", stdout %.40s, stderr: %.*s", d->out_code,
                 d->out_stdout ? d->out_stdout : "", (int)(e + len - last), last);
        return NAN;
    }
    return ms;
}

/* The row failed: say why on stdout (before the table) and leave it n/a. */
static void big_note(struct bench *b, const struct server *s, const char *row, const char *why)
{
    printf("note: %s: bigdata %s: n/a: %s\n", s->name, row, why);
    progress("[%s] bigdata %s: n/a: %s", s->name, row, why);
    fflush(stdout);
    (void)b;
}

/* Ends the row's turn; a turn the server broke counts like in every other row. */
static void big_close(struct bench *b, struct server *s, const char *row, struct driver *d)
{
    driver_release(d, now_ns() + 30ull * 1000000000u);
    report_failures(b, s, row, d, true);
    driver_free(d);
}

/* Upload and download of one kind and size, in one turn: `reps` blocks whose workspace archive
 * holds up.dat and whose code checks its size and removes it (the snapshot back is empty), then
 * one block that keeps it, then `reps` `pass` blocks with the empty archive, each answered with
 * the whole workspace: that is the download, and the unchanged-workspace snapshot row. */
static void measure_updown(struct bench *b, struct server *s, enum col col, int kind, int sz)
{
    struct bigdata *bd = b->big;
    int i = kind * NBIGSZ + sz;
    unsigned mib = big_mib[sz], reps = bd->reps[sz];
    char row[64], why[400] = "", code[200], expect[32];
    snprintf(row, sizeof row, "upload/download %u MiB %s", mib, kind_name[kind]);
    const struct blob *up = bigdata_upload(bd, kind, sz);
    if (!up) {
        big_note(b, s, row, "libarchive could not build the upload");
        return;
    }
    double *wall = xmalloc(reps * sizeof *wall), sup, all;
    struct driver d;
    struct cpu_mark m;
    if (!big_open(b, s, &d, why, sizeof why))
        goto out;
    snprintf(code, sizeof code,
             "import os\nn = os.path.getsize('up.dat')\nos.remove('up.dat')\nprint(n)\n");
    snprintf(expect, sizeof expect, "%zu\n", (size_t)mib << 20);
    cpu_mark(s, &m);
    for (unsigned r = 0; r < reps; r++)
        if (isnan(wall[r] = big_block(&d, up, code, expect, 120, why, sizeof why))) {
            cpu_since(s, &m, NULL, NULL);
            goto out;
        }
    cpu_since(s, &m, &sup, &all);
    val[R_UP_WALL + i][col] = median_of(wall, reps);
    val[R_UP_SUP + i][col] = sup / ((double)reps * (double)up->n / MiB_D);
    char f1[32];
    progress("[%s] upload %u MiB %s (%.2f MiB archive): %u blocks, p50 %.1f ms, supervisor "
             "%s ms per MiB", s->name, mib, kind_name[kind], (double)up->n / MiB_D, reps,
             val[R_UP_WALL + i][col], fmt_ms(f1, sizeof f1, val[R_UP_SUP + i][col]));

    if (s->baseline && b->quick && kind == K_TEXT && sz == NBIGSZ - 1) {
        snprintf(why, sizeof why, "download skipped with --quick: the baseline's snapshot "
                 "(tarfile, gzip -9) of 50 MiB of text takes ~10 s per block");
        goto out;
    }
    if (isnan(big_block(&d, up, "pass", "", 120, why, sizeof why)))
        goto out;
    cpu_mark(s, &m);
    for (unsigned r = 0; r < reps; r++)
        if (isnan(wall[r] = big_block(&d, NULL, "pass", "", 120, why, sizeof why))) {
            cpu_since(s, &m, NULL, NULL);
            goto out;
        }
    cpu_since(s, &m, &sup, &all);
    size_t snap = d.last_archive;
    if (snap < (kind == K_RANDOM ? (size_t)mib << 20 : 4096)) {
        snprintf(why, sizeof why, "the snapshot has %zu bytes: the workspace did not come back",
                 snap);
        goto out;
    }
    bd->snap[col][kind][sz] = snap;
    val[R_DN_WALL + i][col] = median_of(wall, reps);
    val[R_DN_SUP + i][col] = sup / ((double)reps * (double)snap / MiB_D);
    val[R_DN_SRV + i][col] = all / reps;
    progress("[%s] download %u MiB %s (%.2f MiB snapshot): %u pass blocks, p50 %.1f ms, "
             "supervisor %s ms per MiB, server %.1f ms per block", s->name, mib,
             kind_name[kind], (double)snap / MiB_D, reps, val[R_DN_WALL + i][col],
             fmt_ms(f1, sizeof f1, val[R_DN_SUP + i][col]), val[R_DN_SRV + i][col]);
out:
    if (why[0])
        big_note(b, s, row, why);
    free(wall);
    big_close(b, s, row, &d);
}

/* A 50 MiB workspace of 50 files (uploaded by an untimed first block); each measured block
 * rewrites one of them (1 MiB, reversed: new content that compresses alike). */
static void measure_change(struct bench *b, struct server *s, enum col col)
{
    struct bigdata *bd = b->big;
    const char *row = "rewrite 1 of 50 MiB";
    char why[400] = "", code[200];
    const struct blob *up = bigdata_change(bd);
    if (!up) {
        big_note(b, s, row, "libarchive could not build the upload");
        return;
    }
    unsigned reps = bd->change_reps;
    double *wall = xmalloc(reps * sizeof *wall), all = 0;
    struct driver d;
    driver_init(&d, s->port, &b->tools, &b->empty);
    if (s->baseline && b->quick) {
        snprintf(why, sizeof why, "skipped with --quick: each of the baseline's snapshots "
                 "(tarfile, gzip -9) of 50 MiB of text takes ~10 s");
        goto out;
    }
    driver_free(&d);
    if (!big_open(b, s, &d, why, sizeof why) ||
        isnan(big_block(&d, up, "pass", "", 120, why, sizeof why)))
        goto out;
    for (unsigned r = 0; r < reps; r++) {
        struct cpu_mark m;
        double a;
        snprintf(code, sizeof code,
                 "p = 'c%02u.txt'\nd = open(p, 'rb').read()\nopen(p, 'wb').write(d[::-1])\n",
                 (r * 7 + 3) % CHANGE_FILES);
        cpu_mark(s, &m);
        wall[r] = big_block(&d, NULL, code, "", 120, why, sizeof why);
        cpu_since(s, &m, NULL, &a);
        if (isnan(wall[r]))
            goto out;
        all += a;
    }
    if (d.last_archive < (1u << 20)) {
        snprintf(why, sizeof why, "the snapshot has %zu bytes: the workspace did not come back",
                 d.last_archive);
        goto out;
    }
    val[R_CHG_WALL][col] = median_of(wall, reps);
    val[R_CHG_SRV][col] = all / reps;
    progress("[%s] %s: %u blocks, p50 %.1f ms, server %.1f ms per block", s->name, row, reps,
             val[R_CHG_WALL][col], val[R_CHG_SRV][col]);
out:
    if (why[0])
        big_note(b, s, row, why);
    free(wall);
    big_close(b, s, row, &d);
}

/* Tool results of 1 / 10 / 40 MiB: one turn per size, one block calling echo() `calls` times;
 * the client answers each call with a JSON string of that many bytes. The block times each
 * call (perf_counter) and checks the length; CPU is over the block, divided by the calls. */
static void measure_tool_results(struct bench *b, struct server *s, enum col col)
{
    struct bigdata *bd = b->big;
    for (int sz = 0; sz < NBIGSZ; sz++) {
        char row[64], why[400] = "", code[600];
        size_t n = (size_t)tool_mib[sz] << 20;
        unsigned calls = bd->tool_calls[sz];
        snprintf(row, sizeof row, "tool result %u MiB", tool_mib[sz]);
        snprintf(code, sizeof code,
                 "import time\nfrom tools import echo\nts = []\nfor _ in range(%u):\n"
                 "    t = time.perf_counter()\n    v = echo(message='big')\n"
                 "    ts.append(time.perf_counter() - t)\n"
                 "    assert isinstance(v, str) and len(v) == %zu, (type(v), len(v))\n"
                 "    del v\nts.sort()\nprint(ts[len(ts) // 2] * 1e3)\n", calls, n);
        struct driver d;
        struct cpu_mark m;
        double sup, all;
        if (!big_open(b, s, &d, why, sizeof why))
            goto next;
        d.tool_value = bd->json;
        d.tool_value_n = n;
        cpu_mark(s, &m);
        double ms = big_block(&d, NULL, code, NULL, 120, why, sizeof why);
        cpu_since(s, &m, &sup, &all);
        if (isnan(ms))
            goto next;
        val[R_TR_WALL + sz][col] = atof(d.out_stdout);
        val[R_TR_SUP + sz][col] = sup / calls;
        val[R_TR_SRV + sz][col] = all / calls;
        char f1[32];
        progress("[%s] %s: %u calls, median %.1f ms in the sandbox, supervisor %s ms and "
                 "server %.1f ms per call", s->name, row, calls, val[R_TR_WALL + sz][col],
                 fmt_ms(f1, sizeof f1, val[R_TR_SUP + sz][col]), val[R_TR_SRV + sz][col]);
    next:
        if (why[0])
            big_note(b, s, row, why);
        big_close(b, s, row, &d);
    }
}

/* 16 MiB of stdout from one block, `reps` blocks in one turn; the output must come back whole
 * (at most --output-cap, 16M by default, is kept per stream). */
static void measure_stdout(struct bench *b, struct server *s, enum col col)
{
    struct bigdata *bd = b->big;
    const char *row = "16 MiB of stdout";
    char why[400] = "", code[300];
    /* 64-byte lines: the sandbox's JSON encoder escapes each newline */
    snprintf(code, sizeof code,
             "import sys\nsys.stdout.write('%-63.63s\\n' * %u)\n",
             "forkbox-bench: sixteen MiB of stdout, in lines of 64 bytes ...........",
             STDOUT_BYTES / 64);
    unsigned reps = bd->stdout_reps;
    double *wall = xmalloc(reps * sizeof *wall), sup, all;
    struct driver d;
    struct cpu_mark m;
    if (!big_open(b, s, &d, why, sizeof why))
        goto out;
    cpu_mark(s, &m);
    for (unsigned r = 0; r < reps; r++) {
        wall[r] = big_block(&d, NULL, code, NULL, 120, why, sizeof why);
        if (!isnan(wall[r]) && d.out_stdout_len != STDOUT_BYTES)
            snprintf(why, sizeof why, "stdout came back as %zu bytes, not %u (--output-cap?)",
                     d.out_stdout_len, STDOUT_BYTES);
        if (why[0]) {
            cpu_since(s, &m, NULL, NULL);
            goto out;
        }
    }
    cpu_since(s, &m, &sup, &all);
    val[R_SO_WALL][col] = median_of(wall, reps);
    val[R_SO_SUP][col] = sup / reps;
    val[R_SO_SRV][col] = all / reps;
    char f1[32];
    progress("[%s] %s: %u blocks, p50 %.1f ms, supervisor %s ms, server %.1f ms per block",
             s->name, row, reps, val[R_SO_WALL][col], fmt_ms(f1, sizeof f1, val[R_SO_SUP][col]),
             val[R_SO_SRV][col]);
out:
    if (why[0])
        big_note(b, s, row, why);
    free(wall);
    big_close(b, s, row, &d);
}

/* `python -c code` as a plain subprocess of the bench (not in any turn); its stdout as a number,
 * NAN (reason in `why`) on failure or after `secs`. */
static double run_python3(struct bench *b, const char *code, unsigned secs, char *why, size_t n)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0) {
        snprintf(why, n, "pipe: %s", strerror(errno));
        return NAN;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, n, "fork: %s", strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        return NAN;
    }
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        signal(SIGPIPE, SIG_DFL);
        char *argv[] = {(char *)b->python, "-c", (char *)code, NULL};
        execv(b->python, argv);
        _exit(127);
    }
    close(pfd[1]);
    char buf[4096];
    size_t len = 0;
    uint64_t deadline = now_ns() + (uint64_t)secs * 1000000000u;
    bool killed = false;
    for (;;) {
        if (now_ns() > deadline && !killed) {
            kill(pid, SIGKILL);
            killed = true;
        }
        if (!fd_readable(pfd[0], 200))
            continue;
        ssize_t r = read(pfd[0], buf + len, sizeof buf - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
        if (len == sizeof buf - 1)
            len = 0; /* keep the tail */
    }
    buf[len] = 0;
    close(pfd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (killed || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        size_t l = strlen(buf);
        while (l && buf[l - 1] == '\n')
            buf[--l] = 0;
        const char *last = strrchr(buf, '\n');
        snprintf(why, n, "%s %s: %s", b->python, killed ? "timed out" : "failed",
                 last ? last + 1 : buf);
        return NAN;
    }
    return atof(buf);
}

/* A pure-Python loop and a numpy matmul, the same code in a block and under python3, in
 * alternation (`py_rounds` rounds); each run prints its fastest of `py_reps` repetitions (the
 * minimum: other work on the machine only ever adds time), timed with time.thread_time(), the
 * thread's CPU time: the interpreter's speed, not how the host's scheduler shares the CPUs
 * between the sandbox's cgroup and the bench's (perf_counter on a busy 2-CPU host put the
 * sandbox 17% ahead of python3 in one run). BLAS is held to one thread in both, as a
 * sandbox's CPU count (its cgroup's quota) would have it. */
static void measure_pyspeed(struct bench *b, struct server *s, enum col col)
{
    struct bigdata *bd = b->big;
    char loop[600], mm[800];
    snprintf(loop, sizeof loop,
             "import time\n"
             "def f(n):\n    s = 0\n    for i in range(n):\n        s += i * i %% 7\n    return s\n"
             "ts = []\nfor _ in range(%u):\n    t = time.thread_time()\n    f(%u)\n"
             "    ts.append(time.thread_time() - t)\nprint(min(ts) * 1e3)\n",
             bd->py_reps, LOOP_N);
    snprintf(mm, sizeof mm,
             "import os\n"
             "for v in ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS'):\n"
             "    os.environ[v] = '1'\n"
             "import time\nimport numpy as np\n"
             "a = np.random.default_rng(0).random((%u, %u))\nb = a.T.copy()\na @ b\n"
             "ts = []\nfor _ in range(%u):\n    t = time.thread_time()\n    a @ b\n"
             "    ts.append(time.thread_time() - t)\nprint(min(ts) * 1e3)\n",
             MM_N, MM_N, bd->py_reps * 2);
    const char *codes[2] = {loop, mm};
    const char *names[2] = {"pure-Python loop", "numpy matmul"};
    enum row inside[2] = {R_LOOP, R_MM}, ref[2] = {R_LOOP_PY3, R_MM_PY3},
             ratio[2] = {R_LOOP_RATIO, R_MM_RATIO};
    for (int k = 0; k < 2; k++) {
        char why[400] = "";
        double best_in = INFINITY, best_ref = INFINITY;
        struct driver d;
        if (!big_open(b, s, &d, why, sizeof why))
            goto next;
        for (unsigned r = 0; r < bd->py_rounds; r++) {
            double x = run_python3(b, codes[k], 120, why, sizeof why);
            if (isnan(x))
                goto next;
            best_ref = x < best_ref ? x : best_ref;
            if (isnan(big_block(&d, NULL, codes[k], NULL, 120, why, sizeof why)))
                goto next;
            x = atof(d.out_stdout);
            best_in = x < best_in ? x : best_in;
        }
        val[inside[k]][col] = best_in;
        val[ref[k]][col] = best_ref;
        val[ratio[k]][col] = best_in / best_ref;
        progress("[%s] %s: %.1f ms in a block, %.1f ms under %s: %.3f", s->name, names[k],
                 best_in, best_ref, b->python, best_in / best_ref);
    next:
        if (why[0])
            big_note(b, s, names[k], why);
        big_close(b, s, names[k], &d);
    }
}

void measure_big(struct bench *b, struct server *s, enum col col)
{
    for (int kind = 0; kind < NKINDS; kind++)
        for (int sz = 0; sz < NBIGSZ; sz++)
            measure_updown(b, s, col, kind, sz);
    measure_change(b, s, col);
    measure_tool_results(b, s, col);
    measure_stdout(b, s, col);
    measure_pyspeed(b, s, col);
}
