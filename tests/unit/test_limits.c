/* Per-turn limits: the cgroups the fork server's helper places (cgroups.c)
 * and the rlimits a sandbox sets on itself (rlimits.c).
 *
 * rlimits (no privileges): a child with them applied has no core, hits
 * EFBIG at the tmpfs size and a low nofile.
 * cgroups (needs root and a v1/v2 memory controller): a child over a tiny
 * memory limit is OOM-killed; pids.max stops a fork bomb; released cgroups
 * are reused, leftovers of an earlier daemon handled (its placer's pid
 * ours now; or an earlier daemon's on our id range), the CPU weight follows
 * the turns served. Skipped otherwise. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "config/config.h"
#include "sandbox/cgroups.h"
#include "sandbox/rlimits.h"
#include "tap.h"

/* The turn cgroups' parent in the v1 memory hierarchy (as on this host), made
 * if missing: false if there is none. */
static bool memory_parent(char *base, size_t len)
{
    char line[4096];
    base[0] = '\0';
    FILE *f = fopen("/proc/self/cgroup", "re");
    while (f && fgets(line, sizeof line, f)) {
        char *ctl = strchr(line, ':'), *path = ctl ? strchr(ctl + 1, ':') : NULL;
        if (path && strncmp(ctl + 1, "memory:", 7) == 0) {
            path[strcspn(path, "\n")] = '\0';
            snprintf(base, len, "/sys/fs/cgroup/memory%s/forkbox", path + 1);
        }
    }
    if (f)
        fclose(f);
    return base[0] && (mkdir(base, 0755) == 0 || errno == EEXIST);
}

/* A child in cgroup dir (cgroup.procs), waiting to be killed. */
static pid_t sleeper_in(const char *dir)
{
    char procs[4300];
    snprintf(procs, sizeof procs, "%s/cgroup.procs", dir);
    pid_t pid = fork();
    if (pid == 0) {
        pause();
        _exit(0);
    }
    FILE *pf = fopen(procs, "we");
    if (pf) {
        fprintf(pf, "%d", (int)pid);
        fclose(pf);
    }
    return pid;
}

/* Turn cgroups are named turn-<first id>-<placer pid>-<n>. A daemon killed
 * earlier may have left such directories behind under a pid we now have: an
 * empty one is replaced, a busy one skipped (v1 memory hierarchy). */
static void test_cgroup_leftovers(struct sbx_cgroups *cg, const struct config *cfg)
{
    char base[4096];
    if (!memory_parent(base, sizeof base)) {
        printf("ok %d - # SKIP no v1 memory hierarchy for the leftover test\n", ++tap_n);
        return;
    }
    char empty[4200], busy[4200];
    snprintf(empty, sizeof empty, "%s/turn-%u-%d-1", base, cfg->id_first, (int)getpid());
    snprintf(busy, sizeof busy, "%s/turn-%u-%d-2", base, cfg->id_first, (int)getpid());
    mkdir(empty, 0755);
    mkdir(busy, 0755);
    pid_t sleeper = sleeper_in(busy);
    pid_t turn[2];
    char want[4300];
    for (int i = 0; i < 2; i++) {
        turn[i] = fork();
        if (turn[i] == 0) {
            pause();
            _exit(0);
        }
        is_int(cgroups_attach(cg, turn[i], cfg), 0, "attach %d next to leftovers", i + 1);
    }
    snprintf(want, sizeof want, "%s/turn-%u-%d-1/cgroup.procs", base, cfg->id_first,
             (int)getpid());
    ok(access(want, F_OK) == 0, "an empty leftover of the same name is replaced");
    snprintf(want, sizeof want, "%s/turn-%u-%d-3/cgroup.procs", base, cfg->id_first,
             (int)getpid());
    ok(access(want, F_OK) == 0, "a busy leftover is skipped (the next number is used)");
    for (int i = 0; i < 2; i++) {
        kill(turn[i], SIGKILL);
        waitpid(turn[i], NULL, 0);
        cgroups_release(cg, turn[i]);
    }
    kill(sleeper, SIGKILL);
    waitpid(sleeper, NULL, 0);
    for (int i = 0; i < 100 && cgroups_retry(cg) > 0; i++)
        usleep(10000);
    rmdir(busy);
    rmdir(empty);
}

/* The sandboxes' parent cgroup weighs 100 per sandbox serving a turn, at
 * least one's worth: pooled sandboxes do not count. Checked by what the
 * helper wrote, not by reading the parent's file: other daemons (tests run
 * in parallel) share that parent and write their own weight to it. */
static void test_cpu_weight(struct sbx_cgroups *cg, const struct config *cfg)
{
    unsigned one = cgroups_cpu_weight(cg);
    if (one == 0) {
        printf("ok %d - # SKIP no cpu controller for the weight test\n", ++tap_n);
        return;
    }
    is_int((int)one, 100, "the sandboxes' parent starts at one process's CPU weight");
    pid_t kids[3];
    for (int i = 0; i < 3; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            pause();
            _exit(0);
        }
        is_int(cgroups_attach(cg, kids[i], cfg), 0, "sandbox %d placed", i);
    }
    is_int((int)cgroups_cpu_weight(cg), 100, "placed but idle (pooled): no more weight");
    cgroups_serving(cg, kids[0]);
    cgroups_serving(cg, kids[1]);
    cgroups_serving(cg, kids[1]);
    is_int((int)cgroups_cpu_weight(cg), 200, "two turns running: twice the weight");
    for (int i = 0; i < 3; i++) {
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
        cgroups_release(cg, kids[i]);
    }
    is_int((int)cgroups_cpu_weight(cg), 100, "every turn ended: one process's weight again");
}

/* A child held until start_held(*go) (so that it is in its cgroup before it
 * runs), then exiting with body()'s status (2 if the pipe broke). */
static pid_t fork_held(int (*body)(void), int *go)
{
    int p[2];
    if (pipe(p) < 0)
        abort();
    pid_t pid = fork();
    if (pid == 0) {
        char c;
        close(p[1]);
        _exit(read(p[0], &c, 1) == 1 ? body() : 2);
    }
    close(p[0]);
    *go = p[1];
    return pid;
}

static void start_held(int go)
{
    if (write(go, "g", 1) != 1)
        abort();
    close(go);
}

static int eat_256_mib(void)
{
    size_t n = 256 << 20;
    char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return 3;
    for (size_t i = 0; i < n; i += 4096)
        m[i] = 1;
    return 0;
}

static int exit_at_once(void)
{
    return 0;
}

/* 16 tasks: this one plus at most 15 children, the other 25 forks EAGAIN */
static int fork_40(void)
{
    int failed = 0, n = 0;
    pid_t kids[40];
    for (int i = 0; i < 40; i++) {
        pid_t k = fork();
        if (k == 0) {
            pause();
            _exit(0);
        }
        if (k > 0)
            kids[n++] = k;
        else if (errno == EAGAIN)
            failed++;
    }
    for (int i = 0; i < n; i++) {
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
    }
    return failed == 40 - 15 && n == 15 ? 0 : 1;
}

static void test_cgroups(void)
{
    if (geteuid() != 0) {
        printf("ok %d - # SKIP cgroup limits need root\n", ++tap_n);
        return;
    }
    /* A first id of this run's own: turn cgroups are named after it. */
    struct config cfg = { .memory_max = 32 << 20, .pids_max = 16, .cpu_millis = 500,
                          .tmpfs_size = 512 << 20, .isolate = true, .ids_locked = true,
                          .id_first = 3000000000u + (uint32_t)getpid() };
    struct sbx_cgroups *cg = NULL;
    char err[1024] = "";
    char base[4096], stale[3][4200];
    pid_t busy = -1;
    if (memory_parent(base, sizeof base)) {
        /* An earlier daemon on our range left an empty turn cgroup and a busy
         * one; another daemon's is there too. */
        snprintf(stale[0], sizeof stale[0], "%s/turn-%u-1-1", base, cfg.id_first);
        snprintf(stale[1], sizeof stale[1], "%s/turn-%u-1-2", base, cfg.id_first);
        snprintf(stale[2], sizeof stale[2], "%s/turn-%u-1-1", base, cfg.id_first + 1);
        for (int i = 0; i < 3; i++)
            mkdir(stale[i], 0755);
        busy = sleeper_in(stale[1]);
    }
    is_int(cgroups_init(&cfg, &cg, err, sizeof err), 0, "cgroups probed %s", err);
    if (busy > 0) {
        ok(access(stale[0], F_OK) < 0 && errno == ENOENT,
           "an earlier daemon's empty turn cgroup on our range is removed at start");
        ok(access(stale[2], F_OK) == 0, "another range's is left alone");
        is_int((int)cgroups_retry(cg), 1, "its busy one waits");
        kill(busy, SIGKILL);
        waitpid(busy, NULL, 0);
        size_t left = 1;
        for (int i = 0; i < 100 && left; i++) {
            usleep(10000);
            left = cgroups_retry(cg);
        }
        ok(left == 0 && access(stale[1], F_OK) < 0, "and is removed once its task is gone");
        rmdir(stale[2]);
    }
    test_cgroup_leftovers(cg, &cfg);
    test_cpu_weight(cg, &cfg);

    /* memory: allocate 256 MiB in a turn limited to 32 MiB */
    int go;
    pid_t pid = fork_held(eat_256_mib, &go);
    int rc = cgroups_attach(cg, pid, &cfg);
    if (rc == -ENOENT || rc == -EROFS) {
        printf("ok %d - # SKIP no usable memory cgroup (%s)\n", ++tap_n, strerror(-rc));
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(go);
        cgroups_free(cg);
        return;
    }
    is_int(rc, 0, "turn cgroup created, child attached");
    start_held(go);
    int st;
    waitpid(pid, &st, 0);
    ok(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child over memory limit is OOM-killed");
    struct cg_events ev;
    cgroups_events(cg, pid, &ev);
    cgroups_release(cg, pid);
    ok(ev.oom_kills >= 1, "the release reports the OOM kill (%u)", ev.oom_kills);

    /* The next turn in that (reused) cgroup starts from zero: a child that
     * only exits reports no OOM kill. Checked on its own, since the pids
     * test below may itself be OOM-killed at 32 MiB under ASan (15 forked
     * copies of an ASan process). */
    pid = fork_held(exit_at_once, &go);
    is_int(cgroups_attach(cg, pid, &cfg), 0, "the next turn attached");
    start_held(go);
    waitpid(pid, &st, 0);
    cgroups_events(cg, pid, &ev);
    cgroups_release(cg, pid);
    ok(ev.oom_kills == 0 && ev.pids_max == 0,
       "the next turn does not report the earlier turn's OOM kill (%u, %u)", ev.oom_kills,
       ev.pids_max);

    /* pids: a turn limited to 16 tasks cannot start 40 */
    pid = fork_held(fork_40, &go);
    is_int(cgroups_attach(cg, pid, &cfg), 0, "second turn attached");
    start_held(go);
    waitpid(pid, &st, 0);
    ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "pids.max 16: the 16th fork fails with EAGAIN");
    cgroups_events(cg, pid, &ev);
    cgroups_release(cg, pid);
    ok(ev.pids_max >= 1, "the release reports the refused forks (%u)", ev.pids_max);
    cgroups_free(cg);
}

static void test_rlimits(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        struct config cfg = { .tmpfs_size = 1 << 20, .pids_max = 64, .isolate = false };
        if (rlimits_apply(&cfg) < 0)
            _exit(2);
        struct rlimit c, f, n;
        getrlimit(RLIMIT_CORE, &c);
        getrlimit(RLIMIT_FSIZE, &f);
        getrlimit(RLIMIT_NOFILE, &n);
        if (c.rlim_max != 0 || f.rlim_max != 1 << 20 || n.rlim_max > 1024)
            _exit(3);
        signal(SIGXFSZ, SIG_IGN);
        char tmpl[] = "/tmp/fbfszXXXXXX";
        int fd = mkstemp(tmpl);
        unlink(tmpl);
        static char buf[1 << 20];
        if (fd < 0 || write(fd, buf, sizeof buf) != sizeof buf)
            _exit(4);
        errno = 0;
        _exit(write(fd, buf, 1) == -1 && errno == EFBIG ? 0 : 5);
    }
    int st;
    waitpid(pid, &st, 0);
    ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rlimits: core 0, fsize enforced (EFBIG), nofile");
}

int main(void)
{
    test_rlimits();
    test_cgroups();
    return tap_done();
}
