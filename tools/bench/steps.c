/* forkbox-bench: what a fresh turn costs step by step (--rows steps) and forkbox beside the
 * floor of its design (--rows floor): the floor is ../shared/bench/floor, built where --floor
 * DIR says, whose bench_py this file runs and reads. Runs in the forkbox-bench process (and
 * forks the floor's bench_py).
 *
 * The step table comes from a forkboxd started with --step-times: for every fresh sandbox, the
 * fork server logs each step's wall and CPU time when it reaps it (core/steptime.h), and the
 * cgroup placer its placement. The turns run one at a time, each a tools archive, one print(1)
 * block and shutdown, as bench_py's `turn` mode runs its clones one at a time. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

/* The fork server's step names (core/steptime.h, in order) and what they are; each with the
 * floor's steps (bench_py turn: RESULT turn.step.NAME) that do the same work, summed. */
static const struct step_row {
    const char *name, *what, *floor[10];
} step_rows[] = {
    {"prepare", "fork server: id, socketpair, pipes", {NULL}},
    {"clone", "fork server: clone(), six namespaces", {"clone_ret"}},
    {"maps", "fork server: oom_score_adj, id maps", {NULL}},
    {"handoff", "fork server: placement queued, reply sent", {NULL}},
    {"start", "clone returned -> child running", {"child_start"}},
    {"placed", "cgroup placer: attach (its own wall/CPU)", {NULL}},
    {"ids", "child: wait for the maps, setresuid/gid", {"uid_gid_maps"}},
    {"root", "mounts: private (root: the template's)", {"mnt_rprivate", "root_tmpfs",
                                                         "skeleton", "bind_usr_ro",
                                                         "bind_etc_ro", "dev_nodes",
                                                         "pivot_root", "umount_oldroot",
                                                         "remount_root_ro"}},
    {"scratch", "mounts: scratch tmpfs, 3 binds", {"workspace_tmpfs"}},
    {"tools", "mounts: tools tmpfs, ro bind", {NULL}},
    {"proc", "mounts: fresh proc", {"mount_proc"}},
    {"covers", "mounts: /proc covers, move", {NULL}},
    {"go", "hostname, userns caps, wait for the placer", {"hostname"}},
    {"namespaces", "cgroup namespace", {NULL}},
    {"fds", "close fds, stdio on /dev/null", {NULL}},
    {"privs", "setsid, drop capabilities", {"caps_drop", "no_new_privs"}},
    {"seccomp", "load the filter, send listener", {"seccomp_load"}},
    {"rlimits", "rlimits", {NULL}},
    {"init", "init split off (clone CLONE_VM)", {NULL}},
    {"afterfork", "PyOS_AfterFork_Child", {"afterfork"}},
    {"serve", "runtime: stdio, workspace", {NULL}},
    {"tools_in", "runtime: until the tools archive is read", {NULL}},
    {"ready", "runtime: tools extracted (ready next)", {NULL}},
    {"run_in", "runtime: reader, Python loop, workspace, run", {NULL}},
    {"block", "runtime: print(1) ran, done sent", {"code"}},
    {"snapshot", "runtime: output sent, snapshot made", {NULL}},
    {"exit", "snapshot -> reaped; CPU: exit + teardown", {"exit", "reaped"}},
};
#define NSTEPS (sizeof step_rows / sizeof *step_rows)

/* Runs `dir`/bench_py with args (at most 240 s) and returns its stdout (malloc'd), or NULL;
 * *cpu_ns (may be NULL): the CPU it and its children used, from a cpuacct cgroup of its own
 * (NAN without one). */
static char *run_floor(const char *dir, const char *a1, const char *a2, const char *a3,
                       double *cpu_ns)
{
    char exe[512], cg[256];
    snprintf(exe, sizeof exe, "%s/bench_py", dir);
    if (cpu_ns)
        *cpu_ns = NAN;
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0)
        return NULL;
    cg_cpu_make(cg, sizeof cg);
    pid_t pid = fork();
    if (pid == 0) {
        if (cg[0])
            cg_cpu_enter(cg);
        dup2(pfd[1], 1);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 2);
        char *argv[] = {exe, (char *)a1, (char *)a2, (char *)a3, NULL};
        execv(exe, argv);
        _exit(127);
    }
    close(pfd[1]);
    if (pid < 0) {
        close(pfd[0]);
        cg_cpu_remove(cg);
        return NULL;
    }
    int status;
    char *out = child_output(pid, pfd[0], 240, &status);
    if (cpu_ns)
        *cpu_ns = cg_cpu_ns(cg);
    cg_cpu_remove(cg);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        progress("[floor] %s %s %s %s failed (status 0x%x)", exe, a1, a2, a3 ? a3 : "",
                 (unsigned)status);
        free(out);
        return NULL;
    }
    return out;
}

/* The median_us of the floor's `RESULT <name> ...` line, NAN if absent. */
static double floor_result(const char *out, const char *name)
{
    char key[128];
    snprintf(key, sizeof key, "RESULT %s ", name);
    const char *p = out ? strstr(out, key) : NULL;
    const char *m = p ? strstr(p, "median_us=") : NULL;
    return m ? atof(m + strlen("median_us=")) : NAN;
}

/* A key=value of the floor's `VALUE <name> ...` line, NAN if absent. */
static double floor_value(const char *out, const char *name, const char *k)
{
    char key[128];
    snprintf(key, sizeof key, "VALUE  %s ", name);
    const char *p = out ? strstr(out, key) : NULL;
    const char *e = p ? strchr(p, '\n') : NULL;
    snprintf(key, sizeof key, " %s=", k);
    const char *m = p ? strstr(p, key) : NULL;
    return m && (!e || m < e) ? atof(m + strlen(key)) : NAN;
}

/* One sandbox's "sandbox PID steps: name=WALL/CPU/FAULTS ..." line into per-step samples (us,
 * us, count); the wall from its clone to ready (ms: the fork server's clone, then the child's
 * steps from start, which counts from clone's return, to ready) into to_ready. */
static void parse_steps(const char *line, struct samples *wall, struct samples *cpu,
                        struct samples *flt, struct samples *to_ready)
{
    double sum = 0;
    bool child = false, ready = false;
    for (const char *p = line; (p = strchr(p, ' ')) != NULL;) {
        p++;
        const char *eq = strchr(p, '=');
        const char *nl = strchr(p, '\n');
        if (!eq || (nl && eq > nl))
            break;
        double w, c, f;
        if (sscanf(eq + 1, "%lf/%lf/%lf", &w, &c, &f) != 3)
            continue;
        size_t n = (size_t)(eq - p);
        for (size_t i = 0; i < NSTEPS; i++) {
            if (strlen(step_rows[i].name) != n || strncmp(p, step_rows[i].name, n))
                continue;
            samples_add(&wall[i], w);
            samples_add(&cpu[i], c);
            samples_add(&flt[i], f);
            if (!strcmp(step_rows[i].name, "start"))
                child = true;
            if ((child && !ready) || !strcmp(step_rows[i].name, "clone"))
                sum += w;
            if (!strcmp(step_rows[i].name, "ready"))
                ready = true;
        }
    }
    if (ready)
        samples_add(to_ready, sum / 1e3);
}

static size_t step_index(const char *name)
{
    for (size_t i = 0; i < NSTEPS; i++)
        if (!strcmp(step_rows[i].name, name))
            return i;
    return NSTEPS;
}

void measure_steps(struct bench *b, struct server *s, unsigned n)
{
    char *floor_out = NULL, count[16];
    snprintf(count, sizeof count, "%u", n);
    if (b->floor_dir)
        floor_out = run_floor(b->floor_dir, "turn", count, NULL, NULL);

    struct driver d;
    driver_init(&d, s->port, &b->tools, &b->empty);
    d.plan.blocks = 1;
    d.plan.run = run_frame("print(1)");
    d.plan.expect = "1\n";
    d.plan.pipeline = true;
    d.to_launch = 3; /* warm-up */
    driver_run(&d, now_ns() + 60ull * 1000000000u);
    server_wait_quiet(s, 2000);
    size_t mark = server_log_mark(s);
    d.to_launch = n;
    /* The last one reaped, as bench_py turn waits for it (--gap-ms: another gap). */
    unsigned gap_ms = b->gap_set ? b->gap_ms : 2;
    d.gap_ns = gap_ms * 1000000ull;
    uint64_t t0 = now_ns();
    driver_run(&d, now_ns() + 120ull * 1000000000u);
    server_wait_quiet(s, 2000);
    sleep_ms(100);
    progress("[%s] steps: %lu turns one at a time in %.0f ms", s->name, d.turns_ok, ms_since(t0));
    report_failures(b, s, "steps", &d, true);
    driver_free(&d);

    struct samples wall[NSTEPS] = {0}, cpu[NSTEPS] = {0}, flt[NSTEPS] = {0}, to_ready = {0},
                   ready = {0}, spawn = {0};
    size_t len;
    char *log = server_log(s, mark, &len);
    size_t placed = step_index("placed");
    for (char *p = log; (p = strstr(p, "sandbox ")) != NULL; p++) {
        char *l = strstr(p, " steps:");
        char *nl = strchr(p, '\n');
        if (l && (!nl || l < nl)) {
            parse_steps(l + 6, wall, cpu, flt, &to_ready);
            continue;
        }
        int pid;
        double w, c;
        if (sscanf(p, "sandbox %d placed in %lf us (cpu %lf us)", &pid, &w, &c) == 3) {
            samples_add(&wall[placed], w);
            samples_add(&cpu[placed], c);
        }
    }
    free(log);
    server_ready_times(s, mark, &ready, &spawn);

    printf("\nsteps of a fresh turn (--rows steps): %u turns one at a time, %u ms apart (tools, "
           "one print(1) block, shutdown) on forkboxd --pool 0 --step-times; p50 of each step's "
           "wall and CPU time since the step before it in the same process (us), and of its "
           "page faults. floor: %s/bench_py turn %u (raw clone, maps, tmpfs root, pivot_root, "
           "caps, seccomp, print(1)), p50 of its steps doing the same work (summed where "
           "several).\n\n", n, gap_ms,
           b->floor_dir ? b->floor_dir : "(no --floor)", n);
    printf("| %-11s | %-46s | %10s | %10s | %7s | %10s |\n", "step", "what", "wall [us]",
           "CPU [us]", "faults", "floor [us]");
    printf("|-------------|------------------------------------------------|------------|"
           "------------|---------|------------|\n");
    double cpu_sum = 0;
    for (size_t i = 0; i < NSTEPS; i++) {
        const struct step_row *r = &step_rows[i];
        double fl = NAN;
        for (int k = 0; r->floor[k] && floor_out; k++) {
            char name[64];
            snprintf(name, sizeof name, "turn.step.%s", r->floor[k]);
            double v = floor_result(floor_out, name);
            fl = k == 0 ? v : fl + v;
        }
        double c = samples_pct(&cpu[i], 50);
        if (!isnan(c) && i != placed)
            cpu_sum += c;
        char f[3][32], nf[16] = "";
        double fa = samples_pct(&flt[i], 50);
        if (!isnan(fa))
            snprintf(nf, sizeof nf, "%.0f", fa);
        printf("| %-11s | %-46s | %10s | %10s | %7s | %10s |\n", r->name, r->what,
               fmt_ms(f[0], sizeof f[0], samples_pct(&wall[i], 50)),
               fmt_ms(f[1], sizeof f[1], c), nf, fmt_ms(f[2], sizeof f[2], fl));
    }
    char f[4][32];
    printf("\nclone -> ready (ready sent), p50: %s ms; floor clone -> ready (turn.T_t0_to_ready): "
           "%s ms; server-side upgrade -> ready p50: %s ms (of which the fork server's spawn %s "
           "ms).\n",
           fmt_ms(f[0], sizeof f[0], samples_pct(&to_ready, 50)),
           fmt_ms(f[1], sizeof f[1], floor_result(floor_out, "turn.T_t0_to_ready") / 1e3),
           fmt_ms(f[2], sizeof f[2], samples_pct(&ready, 50)),
           fmt_ms(f[3], sizeof f[3], samples_pct(&spawn, 50)));
    printf("CPU of a turn outside the supervisor, summed p50s (fork server, child, runtime, "
           "exit; placer apart): %.0f us. Not counted anywhere: the kernel's deferred teardown "
           "of the namespaces (kworkers).\n", cpu_sum);
    printf("Page faults of the floor's child (bench_py turn): %.0f until after PyOS_AfterFork_Child, "
           "%.0f for the isolation, %.0f for print(1).\n",
           floor_result(floor_out, "turn.faults_child_start_to_afterfork(count,not_us)"),
           floor_result(floor_out, "turn.faults_isolation(count,not_us)"),
           floor_result(floor_out, "turn.faults_print1(count,not_us)"));
    for (size_t i = 0; i < NSTEPS; i++) {
        samples_free(&wall[i]);
        samples_free(&cpu[i]);
        samples_free(&flt[i]);
    }
    samples_free(&to_ready);
    samples_free(&ready);
    samples_free(&spawn);
    free(floor_out);
}

/* The goal of issue 30, from one run: rounds of the floor's throughput (8 in flight) and
 * fresh start beside forkboxd's (16 x 1 turns/s; server-side fresh start), interleaved so that
 * the machine's drift hits both alike. CPU per turn from each side's cgroup, split by process:
 * the floor's bench_py (its own figure) and its children; forkboxd, the fork server, its helper
 * and the rest (the sandboxes). */
void measure_floor(struct bench *b, struct server *s, unsigned rounds)
{
    if (!b->floor_dir) {
        printf("note: --rows floor needs --floor DIR (a build of ../shared/bench/floor)\n");
        return;
    }
    enum { R = 16 };
    double ftp[R], fready[R], tp[R], srv[R], ratio_tp[R], ratio_start[R], fcpu[R], fparent[R],
        ratio_cpu[R], sup[R], fs[R], helper[R], rest[R], cg[R];
    unsigned k = 0;
    for (unsigned r = 0; r < rounds && r < R; r++) {
        double ns;
        char *o = run_floor(b->floor_dir, "tput", "1000", "8", &ns);
        ftp[k] = floor_value(o, "tput.conc8", "turns_per_second");
        fparent[k] = floor_value(o, "tput.conc8", "parent_cpu_ms_per_turn");
        fcpu[k] = ns / 1e6 / 1000;
        free(o);
        double dummy;
        struct tp_cpu c;
        measure_throughput(b, s, 16, 1, b->fb.tp_secs, &tp[k], &dummy, &c);
        cg[k] = c.cgroup;
        sup[k] = c.sup;
        fs[k] = c.fs;
        helper[k] = c.helper;
        rest[k] = c.cgroup - c.sup - c.fs - c.helper;
        o = run_floor(b->floor_dir, "turn", "200", NULL, NULL);
        fready[k] = floor_result(o, "turn.T_t0_to_ready") / 1e3;
        free(o);
        struct samples cli = {0}, sv = {0}, sp = {0};
        measure_turn_start(b, s, b->fb.start_turns, b->gap_ms, &cli, &sv, &sp);
        srv[k] = samples_pct(&sv, 50);
        samples_free(&cli);
        samples_free(&sv);
        samples_free(&sp);
        ratio_tp[k] = tp[k] / ftp[k];
        ratio_start[k] = srv[k] / fready[k];
        ratio_cpu[k] = fcpu[k] / cg[k];
        printf("floor round %u: floor %.0f turns/s at 8, forkbox %.0f at 16 (%.2fx); CPU per "
               "turn (cgroups) floor %.2f ms, forkbox %.2f ms (floor/forkbox %.2fx); floor "
               "clone->ready %.3f ms, forkbox server-side start %.3f ms (%.2fx)\n", r + 1,
               ftp[k], tp[k], ratio_tp[k], fcpu[k], cg[k], ratio_cpu[k], fready[k], srv[k],
               ratio_start[k]);
        fflush(stdout);
        k++;
    }
    printf("floor (--rows floor, %u rounds, medians): forkbox 16 x 1 %.0f turns/s / floor at 8 "
           "%.0f = %.2f (goal >= 0.85); forkbox fresh start, server %.3f ms / floor clone->ready "
           "%.3f ms = %.2f (goal <= 1.5)\n", k, median_of(tp, k), median_of(ftp, k),
           median_of(ratio_tp, k), median_of(srv, k), median_of(fready, k),
           median_of(ratio_start, k));
    printf("floor CPU per turn, each from its own cgroup (the rest of the machine does not "
           "count; neither do kernel threads): floor %.2f ms, forkbox %.2f ms: floor/forkbox "
           "%.2f, the throughput ratio two CPUs busy with nothing else would give\n",
           median_of(fcpu, k), median_of(cg, k), median_of(ratio_cpu, k));
    double fchild[R];
    for (unsigned i = 0; i < k; i++)
        fchild[i] = fcpu[i] - fparent[i];
    printf("by process (medians, ms per turn): floor: bench_py %.3f (clone, network namespace "
           "included), its children %.3f; forkbox: supervisor %.3f, fork server %.3f (network "
           "namespaces, clone), its cgroup placer %.3f, sandboxes %.3f (setup, runtime, exit)\n",
           median_of(fparent, k), median_of(fchild, k), median_of(sup, k), median_of(fs, k),
           median_of(helper, k), median_of(rest, k));
}
