/* Per-turn limits: the cgroups the fork server's helper places (cgroups.c)
 * and the rlimits a sandbox sets on itself (rlimits.c).
 *
 * rlimits (no privileges): a child with them applied has no core, hits
 * EFBIG at the tmpfs size and a low nofile.
 * cgroups (needs root and a v1/v2 memory controller): a child over a tiny
 * memory limit is OOM-killed; pids.max stops a fork bomb; released cgroups
 * are reused, leftovers of an earlier daemon handled (its placer's pid
 * ours now; or an earlier daemon's on our id range), the CPU weight follows
 * the turns served; with --cpu-share tenant a serving sandbox's tasks move
 * under its tenant's cgroup, limited, and leave no directory behind.
 * Skipped otherwise. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
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
    cgroups_serving(cg, kids[0], 0, cfg);
    cgroups_serving(cg, kids[1], 0, cfg);
    cgroups_serving(cg, kids[1], 0, cfg);
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

/* The path of pid's cgroup in the hierarchy with the cpu controller (v1
 * "N:...cpu...:/path", else v2 "0::/path"), and that hierarchy's mount point
 * (the cgroup's directory is mnt + path). false if there is none. */
static bool cpu_cgroup(pid_t pid, char *path, size_t plen, char *mnt, size_t mlen)
{
    char line[4096], file[64];
    bool v1 = false, v2 = false;
    snprintf(file, sizeof file, "/proc/%d/cgroup", (int)pid);
    FILE *f = fopen(file, "re");
    while (f && fgets(line, sizeof line, f)) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        bool cpu = false;
        for (char *w = strtok(c1 + 1, ","); w; w = strtok(NULL, ","))
            cpu |= strcmp(w, "cpu") == 0;
        if (cpu || (!v1 && strncmp(line, "0:", 2) == 0)) {
            snprintf(path, plen, "%.*s", (int)strcspn(c2 + 1, "\n"), c2 + 1);
            v1 |= cpu;
            v2 = !cpu;
        }
    }
    if (f)
        fclose(f);
    f = fopen("/proc/self/mountinfo", "re");
    bool found = false;
    while (f && (v1 || v2) && !found && fgets(line, sizeof line, f)) {
        char m[4096], type[32], opts[1024], *sep = strstr(line, " - ");
        if (!sep || sscanf(line, "%*s %*s %*s %*s %4095s", m) != 1 ||
            sscanf(sep + 3, "%31s %*s %1023s", type, opts) != 2)
            continue;
        bool cpu = false;
        for (char *w = strtok(opts, ","); w; w = strtok(NULL, ","))
            cpu |= strcmp(w, "cpu") == 0;
        if (v1 ? strcmp(type, "cgroup") == 0 && cpu : strcmp(type, "cgroup2") == 0) {
            snprintf(mnt, mlen, "%s", m);
            found = true;
        }
    }
    if (f)
        fclose(f);
    return found;
}

static pid_t fork_pausing(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        pause();
        _exit(0);
    }
    return pid;
}

/* A process with a child of its own (forked once it is placed, as a
 * sandbox's are): both must move. */
static int fork_child_and_pause(void)
{
    if (fork_pausing() < 0)
        return 1;
    pause();
    return 0;
}

/* --cpu-share tenant: serving moves every task of a sandbox's cpu cgroup
 * into <parent>/tenant-<first id>-<helper>-<tenant>/turn-<first id>-<helper>-<n>,
 * which has the
 * turn's CPU quota; tenant 0 (none) stays; the release removes the turn
 * directory, the helper's exit its tenants'. */
static void test_tenant_cpu(void)
{
    struct config cfg = { .memory_max = 64 << 20, .pids_max = 16, .cpu_millis = 500,
                          .tmpfs_size = 512 << 20, .isolate = true,
                          .cpu_share = CPU_SHARE_TENANT, .id_first = 3100000000u + (uint32_t)getpid() };
    struct sbx_cgroups *cg = NULL;
    char err[1024] = "", path[4096], mnt[4096], want[128], dir[8300], a_dir[8300] = "";
    if (cgroups_init(&cfg, &cg, err, sizeof err) < 0 || !cpu_cgroup(getpid(), path, sizeof path,
                                                                     mnt, sizeof mnt)) {
        printf("ok %d - # SKIP no cpu controller for the tenant test (%s)\n", ++tap_n, err);
        cgroups_free(cg);
        return;
    }
    int go;
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    pid_t kids[3] = {fork_held(fork_child_and_pause, &go), fork_pausing(), fork_pausing()};
    uint32_t tenant[3] = {1, 2, 0};
    for (int i = 0; i < 3; i++)
        is_int(cgroups_attach(cg, kids[i], &cfg), 0, "sandbox %d placed", i);
    start_held(go);
    usleep(100 * 1000); /* the first one's child exists by now */
    for (int i = 0; i < 3; i++)
        cgroups_serving(cg, kids[i], tenant[i], &cfg);
    for (int i = 0; i < 3; i++) {
        snprintf(want, sizeof want, "/forkbox/tenant-%u-%d-%u/turn-%u-%d-", cfg.id_first,
                 (int)getpid(), (unsigned)tenant[i], cfg.id_first, (int)getpid());
        ok(cpu_cgroup(kids[i], path, sizeof path, mnt, sizeof mnt) &&
               (strstr(path, want) != NULL) == (tenant[i] != 0),
           "sandbox %d (tenant %u): its cpu cgroup is %s", i, (unsigned)tenant[i], path);
        if (i == 0)
            snprintf(a_dir, sizeof a_dir, "%s%s", mnt, path);
    }
    char procs[8400], buf[256] = "";
    snprintf(procs, sizeof procs, "%s/cgroup.procs", a_dir);
    FILE *f = fopen(procs, "re");
    int n = 0;
    pid_t moved[4] = {0};
    while (f && fgets(buf, sizeof buf, f))
        if (n < 4)
            moved[n++] = (pid_t)atoi(buf);
    if (f)
        fclose(f);
    is_int(n, 2, "the sandbox's child moved with it");
    bool v2 = strstr(mnt, "cpu") == NULL;
    snprintf(dir, sizeof dir, "%s/%s", a_dir, v2 ? "cpu.max" : "cpu.cfs_quota_us");
    f = fopen(dir, "re");
    buf[0] = '\0';
    if (f && !fgets(buf, sizeof buf, f))
        buf[0] = '\0';
    if (f)
        fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
    ok(strncmp(buf, "50000", 5) == 0, "its quota there: --cpu 500 (%s)", buf);
    cgroups_serving(cg, kids[0], 2, &cfg);
    ok(cpu_cgroup(kids[0], path, sizeof path, mnt, sizeof mnt) &&
           strstr(path, "/tenant-") && strstr(path, "-1/turn-"),
       "serving twice moves nothing");
    for (int i = 0; i < 3; i++) {
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
    }
    for (int i = 0; i < n; i++)
        if (moved[i] != kids[0]) { /* the orphaned child, ours (subreaper) */
            kill(moved[i], SIGKILL);
            waitpid(moved[i], NULL, 0);
        }
    for (int i = 0; i < 3; i++)
        cgroups_release(cg, kids[i]);
    for (int i = 0; i < 100 && cgroups_retry(cg) > 0; i++)
        usleep(10000);
    ok(access(a_dir, F_OK) < 0, "its tenant's turn directory is removed at its release");
    char *slash = strrchr(a_dir, '/');
    *slash = '\0';
    ok(access(a_dir, F_OK) == 0, "the tenant's directory stays while the helper runs");
    cgroups_free(cg);
    ok(access(a_dir, F_OK) < 0, "and goes when it exits");
}

static void test_cgroups(void)
{
    if (geteuid() != 0) {
        printf("ok %d - # SKIP cgroup limits need root\n", ++tap_n);
        return;
    }
    /* First, with its own helper state: both name turn cgroups by our pid
     * from 1 on, and the later one's would replace the earlier's spares. */
    test_tenant_cpu();
    /* A first id of this run's own: turn cgroups are named after it. */
    struct config cfg = { .memory_max = 32 << 20, .pids_max = 16, .cpu_millis = 500,
                          .tmpfs_size = 512 << 20, .isolate = true, .ids_locked = true,
                          .id_first = 3000000000u + (uint32_t)getpid() };
    struct sbx_cgroups *cg = NULL;
    char err[1024] = "";
    char base[4096], stale[5][4200];
    pid_t busy = -1;
    if (memory_parent(base, sizeof base)) {
        /* An earlier daemon on our range left an empty turn cgroup and a busy
         * one; another daemon's is there too. */
        snprintf(stale[0], sizeof stale[0], "%s/turn-%u-1-1", base, cfg.id_first);
        snprintf(stale[1], sizeof stale[1], "%s/turn-%u-1-2", base, cfg.id_first);
        snprintf(stale[2], sizeof stale[2], "%s/turn-%u-1-1", base, cfg.id_first + 1);
        /* and a tenant's cgroup (--cpu-share tenant) with an empty turn in it */
        snprintf(stale[3], sizeof stale[3], "%s/tenant-%u-1-7", base, cfg.id_first);
        snprintf(stale[4], sizeof stale[4], "%s/tenant-%u-1-7/turn-%u-1-3", base, cfg.id_first,
                 cfg.id_first);
        for (int i = 0; i < 5; i++)
            mkdir(stale[i], 0755);
        busy = sleeper_in(stale[1]);
    }
    is_int(cgroups_init(&cfg, &cg, err, sizeof err), 0, "cgroups probed %s", err);
    if (busy > 0) {
        ok(access(stale[0], F_OK) < 0 && errno == ENOENT,
           "an earlier daemon's empty turn cgroup on our range is removed at start");
        ok(access(stale[2], F_OK) == 0, "another range's is left alone");
        ok(access(stale[3], F_OK) < 0 && errno == ENOENT,
           "an earlier daemon's tenant cgroup is removed, the turn cgroup in it first");
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
