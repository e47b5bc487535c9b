/* Runs in the fork server's cgroup helper (placer.c), which makes every
 * cgroup write; the fork server only probes at start, before it forks the
 * helper (cgroups_init). Per-turn cgroups, see cgroups.h.
 *
 * Kernel-enforced, per turn:
 *   memory  cgroup v2 memory.max (+ memory.swap.max 0), or v1 memory.limit_in_bytes
 *           (+ memory.memsw.limit_in_bytes when swap accounting exists). tmpfs pages
 *           the sandbox writes are charged to it too.
 *   pids    v2 or v1 pids.max: the real cap on processes and threads.
 *   cpu     v2 cpu.max, or v1 cpu.cfs_quota_us/cfs_period_us where the v1 cpu
 *           controller is mounted.
 *
 * CPU weight, all sandboxes together: the scheduler weighs their parent
 * cgroup ("<own>/forkbox") as one entity against the host's processes, so
 * with the default weight (that of one process) every sandbox together got
 * one process's share of a contended host. The parent's weight is therefore
 * 100 (v2 cpu.weight; v1 cpu.shares 1024) per sandbox serving a turn (at
 * least 1, at most 10000), rewritten as turns start and end, so that a busy
 * sandbox gets what a plain busy process would; pooled sandboxes, idle until
 * a turn takes them, do not count. --cpu-weight fixes it instead.
 * --cpu-share tenant adds a level between the parent and the turns: a
 * cgroup per tenant (see "tenants" below).
 *
 * (The rlimits a sandbox sets on itself are rlimits.c.)
 *
 * Cgroups are created under the fork server's own cgroup in each hierarchy
 * (read from /proc/self/cgroup), so the daemon's own limits still bound all
 * sandboxes together:  <own>/forkbox/turn-<first id>-<placer pid>-<sequence>.
 * A cgroup is keyed by its sequence number, never by a pid: a turn's cgroup
 * can outlive its pid (the runtime, pid 2 of the sandbox, is reaped after the
 * sandbox's init), and a recycled pid must not find a busy directory in its
 * way. The first id names the daemon, which alone holds its --id-range: what
 * cannot be removed yet is retried until it goes, and what is left at exit
 * goes at the next start on that range (cgroups_stale.h).
 *
 * Released cgroups are recycled: once no task is left in any of its
 * controllers, a turn's cgroup (limits already written) goes to a small spare
 * list and the next turn is only moved in. Creating, limiting and removing
 * three cgroups cost ~7% of the CPU of a one-block turn (mkdir, rmdir and the
 * v1 cpu quota write); the counters a cgroup keeps are not data of a turn, and
 * nothing in a sandbox can read them. A cgroup that is still busy when
 * released is retried later (cgroups_retry) instead of blocking the
 * caller. Spares are kept up to the most turn cgroups that can be live at
 * once (capacity + pool, within [SPARE_MIN, SPARE_MAX]); beyond that they are
 * removed. A lower cap churned under a steady load whose number of live turns
 * swings by more than the cap (64 concurrent turns: a third of all turns made
 * and removed a cgroup, measured); an empty cgroup holds ~100 KiB of kernel
 * memory. */
#include "sandbox/cgroups.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/util.h"
#include "sandbox/cgroups_above.h"
#include "sandbox/cgroups_stale.h"

#define SPARE_MIN 32  /* empty turn cgroups kept for reuse: at least */
#define SPARE_MAX 256 /* and at most */
#define CPU_PERIOD_US 100000ULL

enum cg_ctl { CG_MEMORY, CG_PIDS, CG_CPU, CG_N };
static const char *const ctl_name[CG_N] = { "memory", "pids", "cpu" };

struct sbx_cgroups {
    bool v2;
    char dir[CG_N][PATH_MAX]; /* parent ("<own>/forkbox") per controller; "" = not enforced.
                                 v2: the same directory for every enforced controller */
    bool swap_file;           /* v1 memory.memsw.limit_in_bytes / v2 memory.swap.max exists */
    size_t spare_max;         /* spares kept (see the top) */
    unsigned cpu_weight;      /* --cpu-weight, or 0: 100 per sandbox serving a turn */
    bool per_tenant;          /* --cpu-share tenant (and a cpu controller): see "tenants" */
    unsigned weight_set;      /* the parent's weight last written (0: none yet) */
    bool weight_failed;       /* writing it failed once (logged once) */
    uint64_t next_seq;        /* last turn cgroup number handed out */
    uint32_t id_first;        /* the --id-range's first id: in every turn cgroup's name */
    struct cg_stale stale;    /* an earlier daemon's turn cgroups, not removed yet */
    struct cg_turn {
        pid_t pid;            /* the sandbox's host pid */
        uint64_t seq;         /* its cgroup number */
        bool complete;        /* every directory made, limited and entered: reusable */
        bool serving;         /* its sandbox serves a turn (counted in the CPU weight) */
        uint32_t tenant;      /* per_tenant: the tenant whose cgroup its CPU moved under (the
                                 tenant's turn directory is removed at its release); 0: none */
        bool stuck;           /* its removal failed for more than busy tasks (logged once) */
        struct cg_events base; /* its counters when the sandbox in it was placed (they
                                  only grow, and survive reuse) */
    } *live, *busy, *spare;   /* owned: placed turns; released, tasks still exiting;
                                 released, empty and ready for the next turn */
    size_t n_live, cap_live, n_busy, cap_busy, n_spare, cap_spare;
};

static int turn_push(struct cg_turn **v, size_t *n, size_t *cap, struct cg_turn t)
{
    if (*n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 64;
        struct cg_turn *nv = realloc(*v, ncap * sizeof *nv);
        if (!nv)
            return -ENOMEM;
        *v = nv;
        *cap = ncap;
    }
    (*v)[(*n)++] = t;
    return 0;
}

static int write_file(const char *path, const char *s)
{
    _cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t n = strlen(s);
    ssize_t w = write(fd, s, n);
    if (w < 0)
        return -errno;
    return (size_t)w == n ? 0 : -EIO;
}

static int read_file(const char *path, char *buf, size_t len)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, len - 1);
    if (n < 0)
        return -errno;
    buf[n] = '\0';
    return 0;
}

/* Write val to dir/file. A failure is logged, or with why (the start-up
 * probe) said there instead, to become part of its one line. */
static int write_at(const char *dir, const char *file, const char *val, char *why, size_t whylen)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int rc = write_file(path, val);
    if (rc < 0 && why)
        err_fmt(why, whylen, 0, "writing '%s' to %s: %s", val, path, strerror(-rc));
    else if (rc < 0)
        LOG_W("cgroup: writing '%s' to %s: %s", val, path, strerror(-rc));
    return rc;
}

static bool file_exists(const char *dir, const char *file)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return access(path, F_OK) == 0;
}

static bool word_in(const char *list, const char *word, char sep)
{
    size_t n = strlen(word);
    for (const char *s = list; s && *s;) {
        const char *e = strchr(s, sep);
        size_t len = e ? (size_t)(e - s) : strcspn(s, "\n");
        if (len == n && strncmp(s, word, n) == 0)
            return true;
        s = e ? e + 1 : NULL;
    }
    return false;
}

/* Our cgroup path in the hierarchy that has ctl (v1), or the v2 one (ctl NULL). */
static int own_cgroup(const char *ctl, char *out, size_t len)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return -errno;
    char line[PATH_MAX + 128];
    int rc = -ENOENT;
    while (fgets(line, sizeof line, f)) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        bool match = ctl ? word_in(c1 + 1, ctl, ',') : (c1[1] == '\0' && strncmp(line, "0:", 2) == 0);
        if (match) {
            c2[1 + strcspn(c2 + 1, "\n")] = '\0';
            snprintf(out, len, "%s", strcmp(c2 + 1, "/") == 0 ? "" : c2 + 1);
            rc = 0;
            break;
        }
    }
    fclose(f);
    return rc;
}

/* Mount point of the v1 hierarchy carrying ctl, or of cgroup2 (ctl NULL);
 * with ctl "" the first cgroup or cgroup2 mount whose options include
 * favordynmods. */
static int cgroup_mount(const char *ctl, char *out, size_t len)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return -errno;
    char line[4096];
    int rc = -ENOENT;
    while (fgets(line, sizeof line, f)) {
        /* id parent maj:min root mountpoint opts... - fstype source superopts */
        char *sep = strstr(line, " - ");
        if (!sep)
            continue;
        char mnt[PATH_MAX], fstype[32], src[256], sopts[1024];
        if (sscanf(line, "%*s %*s %*s %*s %4095s", mnt) != 1 ||
            sscanf(sep + 3, "%31s %255s %1023s", fstype, src, sopts) != 3)
            continue;
        bool v1 = strcmp(fstype, "cgroup") == 0, v2 = strcmp(fstype, "cgroup2") == 0;
        bool match = !ctl      ? v2
                     : !ctl[0] ? (v1 || v2) && word_in(sopts, "favordynmods", ',')
                               : v1 && word_in(sopts, ctl, ',');
        if (match) {
            snprintf(out, len, "%s", mnt);
            rc = 0;
            break;
        }
    }
    fclose(f);
    return rc;
}

static int make_dir(const char *path)
{
    if (mkdir(path, 0755) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* v2: the controllers must be enabled in every ancestor's subtree_control.
 * A non-root cgroup with processes cannot enable them ("no internal
 * processes"); then move the processes of our cgroup into a leaf beside
 * forkbox/, as delegated managers do. */
static int v2_enable(const char *dir, const char *ctls, char *why, size_t whylen)
{
    char want[64];
    int rc = 0;
    for (const char *s = ctls; *s;) {
        size_t n = strcspn(s, " ");
        snprintf(want, sizeof want, "+%.*s", (int)n, s);
        if ((rc = write_at(dir, "cgroup.subtree_control", want, why, whylen)) < 0)
            return rc;
        s += n;
        s += *s == ' ';
    }
    return 0;
}

#define WHY_LEN 512 /* why a controller is not usable (the probe's reasons) */

/* cgroup v2 with memory and pids (and cpu where offered) delegated to
 * <own>/forkbox. false with the reason in why when it is not usable here. */
static bool v2_init(struct sbx_cgroups *cg, char *why, size_t whylen)
{
    char mnt[PATH_MAX], own[PATH_MAX], dir[PATH_MAX], ctlrs[256];
    if (cgroup_mount(NULL, mnt, sizeof mnt) < 0 || own_cgroup(NULL, own, sizeof own) < 0) {
        err_fmt(why, whylen, 0, "no cgroup v2 hierarchy is mounted");
        return false;
    }
    if (snprintf(dir, sizeof dir, "%s%s", mnt, own) >= (int)sizeof dir) {
        err_fmt(why, whylen, 0, "cgroup v2: path too long");
        return false;
    }
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/cgroup.controllers", dir);
    int rc = read_file(path, ctlrs, sizeof ctlrs);
    if (rc < 0 || !word_in(ctlrs, "memory", ' ') || !word_in(ctlrs, "pids", ' ')) {
        if (rc < 0)
            err_fmt(why, whylen, 0, "cgroup v2: reading %s: %s", path, strerror(-rc));
        else
            err_fmt(why, whylen, 0, "cgroup v2 offers only '%.*s' in %s", (int)strcspn(ctlrs, "\n"),
                     ctlrs, dir);
        return false;
    }
    bool cpu = word_in(ctlrs, "cpu", ' ');
    const char *ctls = cpu ? "memory pids cpu" : "memory pids";

    rc = v2_enable(dir, ctls, why, whylen);
    /* EBUSY: processes in dir ("no internal processes"). They move to a
     * leaf, unless dir is the host's root cgroup (exempt from the rule; it
     * has no cgroup.type): own is "/" there, but also at the root of a
     * cgroup namespace (a container's), which is an ordinary cgroup. */
    if (rc == -EBUSY && (own[0] || file_exists(dir, "cgroup.type"))) {
        char leaf[PATH_MAX + 32], procs[PATH_MAX + 32], pid[32];
        snprintf(leaf, sizeof leaf, "%s/forkbox-daemon", dir);
        snprintf(procs, sizeof procs, "%s/cgroup.procs", dir);
        if ((rc = make_dir(leaf)) < 0) {
            err_fmt(why, whylen, 0, "cgroup v2: cannot create %s: %s", leaf, strerror(-rc));
            return false;
        }
        FILE *f = fopen(procs, "re");
        if (!f) {
            err_fmt(why, whylen, 0, "cgroup v2: reading %s: %s", procs, strerror(errno));
            return false;
        }
        while (fgets(pid, sizeof pid, f)) /* best effort: a process may be exiting */
            write_at(leaf, "cgroup.procs", pid, NULL, 0);
        fclose(f);
        LOG_I("cgroup v2: moved the processes of %s into forkbox-daemon/ to delegate "
              "controllers", dir);
        rc = v2_enable(dir, ctls, why, whylen);
    }
    if (rc < 0)
        return false;
    char parent[PATH_MAX];
    if (snprintf(parent, sizeof parent, "%s/forkbox", dir) >= (int)sizeof parent) {
        err_fmt(why, whylen, 0, "cgroup v2: path too long");
        return false;
    }
    if ((rc = make_dir(parent)) < 0) {
        err_fmt(why, whylen, 0, "cannot create %s: %s", parent, strerror(-rc));
        return false;
    }
    if (v2_enable(parent, ctls, why, whylen) < 0)
        return false;
    cg->v2 = true;
    snprintf(cg->dir[CG_MEMORY], PATH_MAX, "%s", parent);
    snprintf(cg->dir[CG_PIDS], PATH_MAX, "%s", parent);
    if (cpu)
        snprintf(cg->dir[CG_CPU], PATH_MAX, "%s", parent);
    return true;
}

/* The v1 hierarchies: <own>/forkbox in each controller's. A controller
 * that is not usable gets its reason in why[c] (v2why: why v2 was not used
 * either, said where the controller has no v1 hierarchy). */
static void v1_init(struct sbx_cgroups *cg, char why[CG_N][WHY_LEN], const char *v2why)
{
    for (int c = 0; c < CG_N; c++) {
        char mnt[PATH_MAX], own[PATH_MAX], parent[PATH_MAX];
        if (cgroup_mount(ctl_name[c], mnt, sizeof mnt) < 0 ||
            own_cgroup(ctl_name[c], own, sizeof own) < 0) {
            err_fmt(why[c], WHY_LEN, 0, "no cgroup v1 hierarchy with it is mounted, and %s", v2why);
            continue;
        }
        if (snprintf(parent, sizeof parent, "%s%s/forkbox", mnt, own) >= (int)sizeof parent) {
            err_fmt(why[c], WHY_LEN, 0, "cgroup v1 %s: path too long", ctl_name[c]);
            continue;
        }
        int rc = make_dir(parent);
        if (rc < 0) {
            err_fmt(why[c], WHY_LEN, 0, "cannot create %s: %s%s", parent, strerror(-rc),
                     rc == -ENOENT ? " (not mounted?)" : "");
            continue;
        }
        snprintf(cg->dir[c], PATH_MAX, "%s", parent);
    }
}

/* The parent's CPU weight (see the top): --cpu-weight, or 100 per sandbox
 * serving a turn. Written only when it changes; a failure is logged once
 * (the turns still run, at the weight the parent has; an explicit
 * --cpu-weight that cannot be written at all stops the start, cgroups_init). */
static int set_parent_weight(struct sbx_cgroups *cg, char *why, size_t whylen)
{
    if (!cg->dir[CG_CPU][0])
        return 0;
    unsigned w = cg->cpu_weight;
    if (!w) {
        size_t n = 0;
        for (size_t i = 0; i < cg->n_live; i++)
            n += cg->live[i].serving;
        w = n < 1 ? 100 : n > 100 ? 10000 : (unsigned)n * 100;
    }
    if (w == cg->weight_set)
        return 0;
    char v[32];
    snprintf(v, sizeof v, "%u", cg->v2 ? w : w * 1024 / 100 < 2 ? 2 : w * 1024 / 100);
    int rc = write_at(cg->dir[CG_CPU], cg->v2 ? "cpu.weight" : "cpu.shares", v, why, whylen);
    if (rc < 0) {
        if (!cg->weight_failed && !why)
            LOG_W("cgroup: cannot set the sandboxes' CPU weight in %s: %s", cg->dir[CG_CPU],
                  strerror(-rc));
        cg->weight_failed = true;
        return rc;
    }
    cg->weight_set = w;
    return 0;
}

static void turn_dir(const struct sbx_cgroups *cg, int c, uint64_t seq, char *out, size_t len)
{
    snprintf(out, len, "%s/" CG_TURN_PREFIX "%u-%d-%llu", cg->dir[c], cg->id_first, (int)getpid(),
             (unsigned long long)seq);
}

static bool turn_enforced(const struct sbx_cgroups *cg, int c)
{
    if (!cg->dir[c][0])
        return false;
    /* v2: one directory for all controllers, made for the first enforced */
    for (int k = 0; cg->v2 && k < c; k++)
        if (cg->dir[k][0])
            return false;
    return true;
}

/* The v2 controllers to enable in the parent: those enforced. */
static void v2_ctls(const struct sbx_cgroups *cg, char *out, size_t len)
{
    out[0] = '\0';
    for (int c = 0; c < CG_N; c++)
        if (cg->dir[c][0])
            snprintf(out + strlen(out), len - strlen(out), "%s%s", out[0] ? " " : "",
                     ctl_name[c]);
}

/* True if no task is left in any of the turn's directories. */
static bool turn_empty(const struct sbx_cgroups *cg, uint64_t seq)
{
    for (int c = 0; c < CG_N; c++) {
        if (!turn_enforced(cg, c))
            continue;
        char dir[PATH_MAX + 48], path[PATH_MAX + 64], buf[16];
        turn_dir(cg, c, seq, dir, sizeof dir);
        snprintf(path, sizeof path, "%s/cgroup.procs", dir);
        if (read_file(path, buf, sizeof buf) < 0 || buf[0] != '\0')
            return false;
    }
    return true;
}

/* The value of "key N" in a flat-keyed cgroup file; 0 if absent. */
static uint32_t read_key(const char *dir, const char *file, const char *key)
{
    char path[PATH_MAX + 128], buf[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (read_file(path, buf, sizeof buf) < 0)
        return 0;
    size_t klen = strlen(key);
    for (char *line = buf; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        if (strncmp(line, key, klen) == 0 && line[klen] == ' ')
            return (uint32_t)strtoul(line + klen + 1, NULL, 10);
    return 0;
}

/* A file holding one number; 0 if absent. */
static uint64_t read_u64(const char *dir, const char *file)
{
    char path[PATH_MAX + 128], buf[32];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (read_file(path, buf, sizeof buf) < 0)
        return 0;
    return strtoull(buf, NULL, 10);
}

/* What turn cgroup seq has counted since it was made: OOM kills (the
 * kernel's memory.events in v2, memory.oom_control in v1, both "oom_kill"),
 * forks refused at pids.max ("max" in pids.events), and the most memory it
 * held (v1 memory.max_usage_in_bytes: since the last reset; v2 memory.peak:
 * since it was made). */
static struct cg_events read_events(const struct sbx_cgroups *cg, uint64_t seq)
{
    struct cg_events ev = {0};
    char dir[PATH_MAX + 48];
    if (cg->dir[CG_MEMORY][0]) {
        turn_dir(cg, CG_MEMORY, seq, dir, sizeof dir);
        ev.oom_kills = read_key(dir, cg->v2 ? "memory.events" : "memory.oom_control", "oom_kill");
        if (cg->v2)
            ev.oom_own = read_key(dir, "memory.events", "oom");
        ev.mem_peak = read_u64(dir, cg->v2 ? "memory.peak" : "memory.max_usage_in_bytes");
    }
    if (cg->dir[CG_PIDS][0]) {
        turn_dir(cg, CG_PIDS, seq, dir, sizeof dir);
        ev.pids_max = read_key(dir, "pids.events", "max");
    }
    return ev;
}

/* Remove a turn's directories; -EAGAIN while one is left: a task of it is
 * still exiting (or frozen), or its hierarchy refuses (read-only): either
 * way it is kept and retried (cgroups_retry), never forgotten. */
static int remove_turn(const struct sbx_cgroups *cg, struct cg_turn *t)
{
    int left = 0;
    for (int c = 0; c < CG_N; c++) {
        if (!turn_enforced(cg, c))
            continue;
        char dir[PATH_MAX + 48];
        turn_dir(cg, c, t->seq, dir, sizeof dir);
        if (rmdir(dir) == 0 || errno == ENOENT)
            continue;
        left = -EAGAIN;
        if (errno != EBUSY && !t->stuck) {
            LOG_W("cgroup: cannot remove %s: %s; retried until it goes", dir, strerror(errno));
            t->stuck = true;
        }
    }
    if (!left && t->stuck)
        LOG_I("cgroup: turn cgroup %llu removed at last", (unsigned long long)t->seq);
    return left;
}

/* Write controller c's limit into turn cgroup dir (why: see write_at). */
static int set_limits(const struct sbx_cgroups *cg, int c, const char *dir,
                      const struct config *cfg, char *why, size_t whylen)
{
    char v[64];
    int rc = 0;
    switch (c) {
    case CG_MEMORY:
        if (!cfg->memory_max)
            break;
        snprintf(v, sizeof v, "%llu", (unsigned long long)cfg->memory_max);
        if (cg->v2) {
            if ((rc = write_at(dir, "memory.max", v, why, whylen)) < 0)
                return rc;
            if (cg->swap_file && (rc = write_at(dir, "memory.swap.max", "0", why, whylen)) < 0)
                return rc;
        } else {
            /* memsw (memory + swap) may not go below limit_in_bytes: set that first. */
            if ((rc = write_at(dir, "memory.limit_in_bytes", v, why, whylen)) < 0)
                return rc;
            if (cg->swap_file &&
                (rc = write_at(dir, "memory.memsw.limit_in_bytes", v, why, whylen)) < 0)
                return rc;
        }
        break;
    case CG_PIDS:
        if (!cfg->pids_max)
            break;
        snprintf(v, sizeof v, "%llu", (unsigned long long)cfg->pids_max);
        rc = write_at(dir, "pids.max", v, why, whylen);
        break;
    case CG_CPU: {
        if (!cfg->cpu_millis)
            break;
        unsigned long long quota = (unsigned long long)cfg->cpu_millis * CPU_PERIOD_US / 1000;
        if (quota < 1000)
            quota = 1000; /* the kernel's minimum quota is 1 ms */
        if (cg->v2) {
            snprintf(v, sizeof v, "%llu %llu", quota, CPU_PERIOD_US);
            rc = write_at(dir, "cpu.max", v, why, whylen);
        } else {
            snprintf(v, sizeof v, "%llu", CPU_PERIOD_US);
            if ((rc = write_at(dir, "cpu.cfs_period_us", v, why, whylen)) < 0)
                return rc;
            snprintf(v, sizeof v, "%llu", quota);
            rc = write_at(dir, "cpu.cfs_quota_us", v, why, whylen);
        }
        break;
    }
    }
    return rc;
}

/* Recreate the parent of controller c's turn cgroups (an operator removed
 * it, or an older forkboxd that removed it at exit): v2 needs the
 * controllers enabled in it again. */
static int remake_parent(const struct sbx_cgroups *cg, int c)
{
    char ctls[64];
    v2_ctls(cg, ctls, sizeof ctls);
    int rc = make_dir(cg->dir[c]);
    if (rc == 0 && cg->v2)
        rc = v2_enable(cg->dir[c], ctls, NULL, 0);
    if (rc == 0)
        LOG_W("cgroup: %s was removed under us; recreated it", cg->dir[c]);
    return rc;
}

/* mkdir a turn cgroup. A directory of the same name can only be a leftover
 * of an earlier daemon whose placer had our pid (it was killed, or a cgroup
 * was still busy when it exited): remove it if it is empty, else -EEXIST. */
static int make_turn_dir(const struct sbx_cgroups *cg, int c, const char *dir)
{
    if (mkdir(dir, 0755) == 0)
        return 0;
    if (errno == ENOENT && remake_parent(cg, c) == 0 && mkdir(dir, 0755) == 0)
        return 0;
    if (errno != EEXIST)
        return -errno;
    if (rmdir(dir) < 0 || mkdir(dir, 0755) < 0)
        return -EEXIST;
    return 0;
}

/* --- tenants (--cpu-share tenant) ----------------------------------------
 *
 * The scheduler shares the CPU between sibling cgroups by weight. With every
 * turn cgroup a child of the sandboxes' parent, a tenant with ten busy turns
 * had ten shares to another's one. Per tenant, the helper moves a sandbox
 * that starts serving one level down, into
 *     <parent>/tenant-<first id>-<helper pid>-<tenant>/turn-<first id>-<helper pid>-<seq>
 * of the hierarchy with the cpu controller. Tenants' cgroups keep the
 * default weight: every tenant with a busy turn weighs alike, and its busy
 * turns share its part (an idle turn takes nothing). On v1 only the cpu
 * hierarchy moves (memory and pids stay in the turn's own cgroups); on v2
 * the one directory does, so the tenant's turn directory gets every limit,
 * and what the sandbox charged before (its warm-up in the pool: nothing of
 * a turn) stays charged to the directory it left, which is kept until its
 * release. The move happens at serving because a pooled sandbox's tenant is
 * not known before; until the helper gets to it, the sandbox runs in its
 * own turn cgroup, with every limit: only its weight is not yet its
 * tenant's. A tenant is a number (session/tenants.h): names never reach the
 * fork server, whose memory every sandbox starts from. Tenant directories
 * stay until the helper exits. */

static void tenant_dir(const struct sbx_cgroups *cg, uint32_t tenant, char *out, size_t len)
{
    snprintf(out, len, "%s/" CG_TENANT_PREFIX "%u-%d-%u", cg->dir[CG_CPU], cg->id_first,
             (int)getpid(), (unsigned)tenant);
}

static void tenant_turn_dir(const struct sbx_cgroups *cg, const struct cg_turn *t, char *out,
                            size_t len)
{
    snprintf(out, len, "%s/" CG_TENANT_PREFIX "%u-%d-%u/" CG_TURN_PREFIX "%u-%d-%llu",
             cg->dir[CG_CPU], cg->id_first, (int)getpid(), (unsigned)t->tenant, cg->id_first,
             (int)getpid(), (unsigned long long)t->seq);
}

/* Remove t's turn directory under its tenant; -EBUSY while a task of it is
 * still exiting. */
static int tenant_leave(const struct sbx_cgroups *cg, const struct cg_turn *t)
{
    char dir[PATH_MAX + 96];
    if (!t->tenant)
        return 0;
    tenant_turn_dir(cg, t, dir, sizeof dir);
    if (rmdir(dir) == 0 || errno == ENOENT)
        return 0;
    if (errno != EBUSY)
        LOG_W("cgroup: cannot remove %s: %s", dir, strerror(errno));
    return errno == EBUSY ? -EBUSY : 0;
}

/* Move every task of t's own cpu directory into a new one under its
 * tenant's, limited as the one it leaves. Tasks exit or fork meanwhile:
 * until none is left (pids.max bounds them; a few rounds at most). */
static int tenant_enter(struct sbx_cgroups *cg, struct cg_turn *t, uint32_t tenant,
                        const struct config *cfg)
{
    char tdir[PATH_MAX + 48], dir[PATH_MAX + 96], home[PATH_MAX + 48], path[PATH_MAX + 112];
    tenant_dir(cg, tenant, tdir, sizeof tdir);
    if (mkdir(tdir, 0755) == 0) {
        char ctls[64];
        v2_ctls(cg, ctls, sizeof ctls);
        int rc = cg->v2 ? v2_enable(tdir, ctls, NULL, 0) : 0;
        if (rc < 0)
            return rc;
    } else if (errno != EEXIST) {
        return -errno;
    }
    t->tenant = tenant; /* from here on, its release removes what is made */
    tenant_turn_dir(cg, t, dir, sizeof dir);
    if (mkdir(dir, 0755) < 0 && (errno != EEXIST || rmdir(dir) < 0 || mkdir(dir, 0755) < 0))
        return -errno;
    for (int c = 0; c < CG_N; c++) {
        int rc = (cg->v2 ? cg->dir[c][0] != '\0' : c == CG_CPU)
                     ? set_limits(cg, c, dir, cfg, NULL, 0) : 0;
        if (rc < 0)
            return rc;
    }
    turn_dir(cg, CG_CPU, t->seq, home, sizeof home);
    snprintf(path, sizeof path, "%s/cgroup.procs", home);
    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/cgroup.procs");
    for (int round = 0; round < 16; round++) {
        FILE *f = fopen(path, "re");
        if (!f)
            return -errno;
        char pid[32];
        bool any = false;
        while (fgets(pid, sizeof pid, f)) {
            int rc = write_file(dir, pid);
            if (rc < 0 && rc != -ESRCH) {
                fclose(f);
                return rc;
            }
            any = true;
        }
        fclose(f);
        if (!any)
            return 0;
    }
    return -EAGAIN;
}

/* A released turn cgroup: spare if it is empty and there is room, else
 * removed; -EAGAIN while it cannot be (remove_turn). */
static int recycle_turn(struct sbx_cgroups *cg, struct cg_turn *t)
{
    if (tenant_leave(cg, t) == -EBUSY)
        return -EAGAIN; /* a task of it is still exiting: retried */
    t->tenant = 0;
    if (t->complete && cg->n_spare < cg->spare_max && turn_empty(cg, t->seq) &&
        turn_push(&cg->spare, &cg->n_spare, &cg->cap_spare, *t) == 0)
        return 0;
    return remove_turn(cg, t);
}

/* pid's turn cgroup leaves the live list: recycled if complete, else removed. */
static void drop_live(struct sbx_cgroups *cg, pid_t pid)
{
    for (size_t i = 0; i < cg->n_live; i++) {
        if (cg->live[i].pid != pid)
            continue;
        struct cg_turn t = cg->live[i];
        cg->live[i] = cg->live[--cg->n_live];
        if (recycle_turn(cg, &t) == -EAGAIN &&
            turn_push(&cg->busy, &cg->n_busy, &cg->cap_busy, t) < 0)
            LOG_W("cgroup: out of memory; turn cgroup %llu left behind",
                  (unsigned long long)t.seq);
        return;
    }
}

/* Move pid into every directory of turn cgroup seq. -ESRCH, unlogged, if
 * pid is gone (reaped before its placement: the cgroup is not at fault). */
static int move_in(const struct sbx_cgroups *cg, uint64_t seq, const char *pidstr)
{
    for (int c = 0; c < CG_N; c++) {
        if (!turn_enforced(cg, c))
            continue;
        char dir[PATH_MAX + 48], path[PATH_MAX + 64];
        turn_dir(cg, c, seq, dir, sizeof dir);
        snprintf(path, sizeof path, "%s/cgroup.procs", dir);
        int rc = write_file(path, pidstr);
        if (rc == -ESRCH)
            return rc;
        if (rc < 0) {
            LOG_W("cgroup: writing '%s' to %s: %s", pidstr, path, strerror(-rc));
            return rc;
        }
    }
    return 0;
}

/* v2: a spare keeps its limits only while the parent delegates their
 * controllers: an operator who disables one in the parent's
 * cgroup.subtree_control takes its limit files away from every child, and a
 * sandbox moved in would run without that limit. (v1: a spare whose
 * hierarchy went away fails the move itself.) */
static bool spare_intact(const struct sbx_cgroups *cg, uint64_t seq)
{
    if (!cg->v2)
        return true;
    char dir[PATH_MAX + 48], path[PATH_MAX + 72], buf[256];
    for (int c = 0; c < CG_N; c++) {
        if (!turn_enforced(cg, c))
            continue;
        turn_dir(cg, c, seq, dir, sizeof dir);
        snprintf(path, sizeof path, "%s/cgroup.controllers", dir);
        if (read_file(path, buf, sizeof buf) < 0)
            return false;
        for (int k = 0; k < CG_N; k++)
            if (cg->dir[k][0] && !word_in(buf, ctl_name[k], ' '))
                return false;
    }
    return true;
}

/* An empty, limited turn cgroup from the spare list; -ENOENT if none works,
 * -ESRCH if pid is gone. A sandbox that died before its placement (killed by
 * the supervisor as its client left, a failed early step) leaves the spare it
 * was given in the list: a reaped pid is in no cgroup, so the spare is as
 * empty as it was. Only a spare that itself fails (removed by an operator) is
 * dropped, and the cause is logged once per placement, not per spare. */
static int attach_spare(struct sbx_cgroups *cg, pid_t pid, const char *pidstr)
{
    unsigned dropped = 0;
    int why = 0;
    while (cg->n_spare) {
        struct cg_turn t = cg->spare[--cg->n_spare];
        t.pid = pid;
        t.serving = false;
        if (turn_push(&cg->live, &cg->n_live, &cg->cap_live, t) < 0) {
            cg->n_spare++;
            return -ENOMEM;
        }
        int rc = spare_intact(cg, t.seq) ? move_in(cg, t.seq, pidstr) : -ENODEV;
        if (rc == 0 || rc == -ESRCH) {
            if (rc == -ESRCH) {
                cg->n_live--; /* back where it was: the last spare */
                cg->n_spare++;
            }
            if (dropped)
                LOG_W("cgroup: %u spare turn cgroup%s unusable (%s): removed", dropped,
                      dropped == 1 ? "" : "s", strerror(-why));
            return rc;
        }
        /* Broken (an operator removed it?): drop it, try the next. */
        dropped++;
        why = rc;
        cg->live[cg->n_live - 1].complete = false;
        drop_live(cg, pid);
    }
    if (dropped)
        LOG_W("cgroup: %u spare turn cgroup%s unusable (%s): removed", dropped,
              dropped == 1 ? "" : "s", strerror(-why));
    return -ENOENT;
}

/* --- start-up: the probe ------------------------------------------------- */

/* Whether the configuration asks for controller c's limit. A limit of 0
 * asks for none, so a host without that controller is fine for it. */
static bool wanted(const struct config *cfg, int c)
{
    switch (c) {
    case CG_MEMORY:
        return cfg->memory_max != 0;
    case CG_PIDS:
        return cfg->pids_max != 0;
    default:
        return cfg->cpu_millis != 0 || cfg->cpu_weight != 0 || cfg->cpu_share == CPU_SHARE_TENANT;
    }
}

/* Say why for every controller that shares turn cgroup directory c's fate:
 * all enforced ones on v2 (one directory), c alone on v1. */
static void fail_group(const struct sbx_cgroups *cg, int c, char why[CG_N][WHY_LEN],
                       const char *what, const char *path, int rc)
{
    for (int k = 0; k < CG_N; k++)
        if ((k == c || (cg->v2 && cg->dir[k][0])) && !why[k][0])
            err_fmt(why[k], WHY_LEN, 0, "%s %s: %s", what, path, strerror(-rc));
}

/* Do once, at start, what every turn needs, rather than trust that files
 * exist: make a turn cgroup in each enforced hierarchy, write the configured
 * limits into it, move a process into it (a child that only waits), then
 * remove it. A controller that fails a step gets the reason in why[c]. Runs
 * in the fork server, single-threaded, before its cgroup helper exists. The
 * turn cgroup is not kept as a spare: turn cgroups are named by the pid of
 * the helper, which is not us. */
static void probe_turn(struct sbx_cgroups *cg, const struct config *cfg,
                       char why[CG_N][WHY_LEN])
{
    uint64_t seq = ++cg->next_seq;
    char dir[PATH_MAX + 48], path[PATH_MAX + 64];
    bool made[CG_N] = {false};
    for (int c = 0; c < CG_N; c++) {
        if (!turn_enforced(cg, c))
            continue;
        turn_dir(cg, c, seq, dir, sizeof dir);
        int rc = make_turn_dir(cg, c, dir);
        if (rc < 0) {
            fail_group(cg, c, why, "cannot create", dir, rc);
            continue;
        }
        made[c] = true;
        for (int k = 0; k < CG_N; k++)
            if ((k == c || (cg->v2 && cg->dir[k][0])) && !why[k][0])
                set_limits(cg, k, dir, cfg, why[k], WHY_LEN);
    }

    int hold[2] = {-1, -1};
    pid_t pid = pipe2(hold, O_CLOEXEC) < 0 ? -1 : fork();
    if (pid == 0) {
        char b;
        close(hold[1]);
        while (read(hold[0], &b, 1) < 0 && errno == EINTR)
            ;
        _exit(0);
    }
    int fork_rc = pid < 0 ? -errno : 0;
    char pidstr[32];
    snprintf(pidstr, sizeof pidstr, "%d", (int)pid);
    for (int c = 0; c < CG_N; c++) {
        if (!made[c])
            continue;
        turn_dir(cg, c, seq, dir, sizeof dir);
        snprintf(path, sizeof path, "%s/cgroup.procs", dir);
        int rc = pid < 0 ? fork_rc : write_file(path, pidstr);
        if (rc < 0)
            fail_group(cg, c, why, pid < 0 ? "fork for" : "cannot move a process into",
                       path, rc);
    }
    if (hold[0] >= 0) {
        close(hold[0]);
        close(hold[1]); /* the child exits */
    }
    if (pid > 0)
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
    for (int c = 0; c < CG_N; c++) {
        if (!made[c])
            continue;
        turn_dir(cg, c, seq, dir, sizeof dir);
        /* The child's exit can lag its reaping by a moment (EBUSY). */
        for (int tries = 0; rmdir(dir) < 0 && errno == EBUSY && tries < 100; tries++)
            nanosleep(&(struct timespec){.tv_nsec = 1000 * 1000}, NULL);
    }
}

/* The one line that stops the start: what is missing, and the ways out. */
static int refuse(int c, const char *why, char *err, size_t errlen)
{
    static const char *const flag[CG_N] = {"--memory", "--pids",
                                           "--cpu/--cpu-weight/--cpu-share tenant"};
    static const char *const off[CG_N] = {"--memory 0", "--pids 0",
                                          "--cpu 0 without --cpu-weight or --cpu-share tenant"};
    return err_fmt(err, errlen, -EOPNOTSUPP,
                   "cgroup controller '%s' is not usable (%s): the per-turn %s limit cannot be "
                   "enforced; mount the controller or make its hierarchy writable (systemd: "
                   "Delegate=yes), pass %s to ask for no such limit, or --allow-no-cgroups to "
                   "run without per-turn limits", ctl_name[c], why, flag[c], off[c]);
}

int cgroups_init(const struct config *cfg, struct sbx_cgroups **out, char *err, size_t errlen)
{
    *out = NULL;
    struct sbx_cgroups *cg = calloc(1, sizeof *cg);
    if (!cg)
        return err_fmt(err, errlen, -ENOMEM, "cgroups: out of memory");
    char why[CG_N][WHY_LEN] = {{0}}, v2why[WHY_LEN] = "";
    if (!v2_init(cg, v2why, sizeof v2why))
        v1_init(cg, why, v2why);
    for (int c = 0; c < CG_N; c++)
        if (!cg->dir[c][0] && !why[c][0])
            err_fmt(why[c], WHY_LEN, 0, "cgroup v2 does not offer it to forkbox's cgroup");
    cg->cpu_weight = cfg->cpu_weight;
    cg->id_first = cfg->id_first;
    size_t live_max = (size_t)cfg->capacity + cfg->pool_size;
    cg->spare_max = live_max < SPARE_MIN ? SPARE_MIN : live_max > SPARE_MAX ? SPARE_MAX : live_max;
    if (cg->dir[CG_MEMORY][0])
        cg->swap_file = file_exists(cg->dir[CG_MEMORY],
                                    cg->v2 ? "memory.swap.max" : "memory.memsw.limit_in_bytes");
    probe_turn(cg, cfg, why);

    /* Fail closed: a limit the configuration asks for and this host cannot
     * enforce stops the start, unless --allow-no-cgroups (or --no-isolation,
     * benchmarks) says to run without it. A controller no limit asks for
     * may be missing. */
    bool strict = cfg->isolate && !cfg->allow_no_cgroups;
    for (int c = 0; c < CG_N; c++) {
        if (!why[c][0])
            continue;
        if (wanted(cfg, c) && strict) {
            int rc = refuse(c, why[c], err, errlen);
            free(cg);
            return rc;
        }
        cg->dir[c][0] = '\0';
        if (wanted(cfg, c))
            LOG_W("cgroups: the per-turn %s limit is NOT enforced (%s): %s", ctl_name[c],
                  cfg->isolate ? "--allow-no-cgroups" : "--no-isolation", why[c]);
    }
    char wwhy[WHY_LEN] = "";
    if (set_parent_weight(cg, wwhy, sizeof wwhy) < 0) {
        if (cfg->cpu_weight && strict) {
            int rc = err_fmt(err, errlen, -EOPNOTSUPP,
                             "cannot set the sandboxes' CPU weight (%s): --cpu-weight %u cannot "
                             "be enforced; make the cgroup hierarchy writable, pass "
                             "--cpu-weight 0, or --allow-no-cgroups", wwhy, cfg->cpu_weight);
            free(cg);
            return rc;
        }
        LOG_W("cgroup: cannot set the sandboxes' CPU weight: %s", wwhy);
    }

    cg->per_tenant = cfg->cpu_share == CPU_SHARE_TENANT && cg->dir[CG_CPU][0];
    char what[128] = "";
    for (int c = 0; c < CG_N; c++)
        if (cg->dir[c][0])
            snprintf(what + strlen(what), sizeof what - strlen(what), "%s%s",
                     what[0] ? "+" : "", ctl_name[c]);
    if (!what[0])
        LOG_I("cgroups: none used (no per-turn limit asked for, or --allow-no-cgroups)");
    else
        LOG_I("cgroups: %s %s under %s (memory %llu bytes%s, pids %llu, cpu %llu ms/s%s)",
              cg->v2 ? "v2" : "v1", what, cg->dir[CG_MEMORY][0] ? cg->dir[CG_MEMORY] : cg->dir[CG_PIDS],
              (unsigned long long)cfg->memory_max, cg->swap_file ? ", no swap" : "",
              (unsigned long long)cfg->pids_max, (unsigned long long)cfg->cpu_millis,
              cg->per_tenant ? ", shared per tenant" : "");
    /* An earlier daemon's on our range (cgroups_stale.h): the range is ours
     * now, so are they. */
    for (int c = 0; c < CG_N && cfg->ids_locked; c++)
        if (turn_enforced(cg, c))
            cg_stale_scan(&cg->stale, cg->dir[c], cg->id_first);
    char mnt[PATH_MAX];
    if (what[0] && cgroup_mount("", mnt, sizeof mnt) < 0)
        LOG_I("cgroups: moving a sandbox into its cgroups waits for an RCU grace period "
              "(5-20 ms) unless a cgroup hierarchy is mounted with favordynmods; the pool "
              "hides it, fresh sandboxes do not (README: Tuning the host)");
    *out = cg;
    return 0;
}

int cgroups_attach(struct sbx_cgroups *cg, pid_t pid, const struct config *cfg)
{
    char pidstr[32];
    snprintf(pidstr, sizeof pidstr, "%d", (int)pid);
    int rc = attach_spare(cg, pid, pidstr);
    if (rc != -ENOENT)
        return rc;
    struct cg_turn t = {.pid = pid};
    rc = -EEXIST;
    /* A busy leftover of the same name is skipped by taking the next number. */
    for (int attempt = 0; attempt < 8 && rc == -EEXIST; attempt++) {
        t.seq = ++cg->next_seq;
        if (turn_push(&cg->live, &cg->n_live, &cg->cap_live, t) < 0)
            return -ENOMEM;
        rc = 0;
        for (int c = 0; c < CG_N && rc == 0; c++) {
            if (!turn_enforced(cg, c))
                continue;
            char dir[PATH_MAX + 48];
            turn_dir(cg, c, t.seq, dir, sizeof dir);
            rc = make_turn_dir(cg, c, dir);
            if (rc < 0) {
                LOG_W("cgroup: mkdir %s: %s", dir, strerror(-rc));
                break;
            }
            if (cg->v2) {
                for (int k = 0; k < CG_N && rc == 0; k++)
                    if (cg->dir[k][0])
                        rc = set_limits(cg, k, dir, cfg, NULL, 0);
            } else {
                rc = set_limits(cg, c, dir, cfg, NULL, 0);
            }
        }
        /* Made and limited: reusable, even if pid is gone by now. */
        if (rc == 0)
            cg->live[cg->n_live - 1].complete = true;
        if (rc == 0)
            rc = move_in(cg, t.seq, pidstr);
        if (rc < 0)
            drop_live(cg, pid); /* recycled if complete, else removed */
    }
    return rc;
}

void cgroups_events(struct sbx_cgroups *cg, pid_t pid, struct cg_events *ev)
{
    *ev = (struct cg_events){0};
    for (size_t i = 0; cg && i < cg->n_live; i++) {
        struct cg_turn *t = &cg->live[i];
        if (t->pid != pid || !t->complete)
            continue;
        /* Counters only grow and survive reuse: the next sandbox's start is now. */
        struct cg_events now = read_events(cg, t->seq);
        ev->oom_kills = now.oom_kills - t->base.oom_kills;
        ev->oom_own = now.oom_own - t->base.oom_own;
        ev->pids_max = now.pids_max - t->base.pids_max;
        /* The peak is a maximum, not a count: no difference gives this
         * sandbox's share. v1 resets it (writing 0 sets it to the usage now:
         * what the cgroup still holds, page cache charged to it, which the
         * next sandbox is charged for too). v2's memory.peak cannot be reset
         * before Linux 6.12 (and then only as seen through one open file):
         * it is the cgroup's since mkdir, so this sandbox's only if it rose
         * while this sandbox ran; in a reused cgroup that stayed below an
         * earlier sandbox's peak it is unknown (0). */
        if (cg->v2 && t->tenant) {
            /* Moved (see "tenants"): the turn ran in its tenant's turn
             * directory, made for it alone; add what that one counted. */
            char dir[PATH_MAX + 96];
            tenant_turn_dir(cg, t, dir, sizeof dir);
            ev->oom_kills += read_key(dir, "memory.events", "oom_kill");
            ev->pids_max += read_key(dir, "pids.events", "max");
            ev->mem_peak = read_u64(dir, "memory.peak");
        } else if (cg->v2) {
            ev->mem_peak = now.mem_peak > t->base.mem_peak ? now.mem_peak : 0;
        } else if (now.mem_peak) {
            char dir[PATH_MAX + 48];
            ev->mem_peak = now.mem_peak;
            turn_dir(cg, CG_MEMORY, t->seq, dir, sizeof dir);
            /* v1 counts no OOM of the cgroup's own (memory.failcnt stays 0
             * on Linux 6.18): its peak at its limit is the limit reached. */
            ev->oom_own = now.mem_peak >= read_u64(dir, "memory.limit_in_bytes");
            (void)write_at(dir, "memory.max_usage_in_bytes", "0", NULL, 0);
        }
        if (ev->oom_kills && !ev->oom_own) /* for another cgroup's limit */
            ev->oom_limit = cg_limit_hit_above(cg->dir[CG_MEMORY], cg->v2);
        t->base = now;
        return;
    }
}

void cgroups_release(struct sbx_cgroups *cg, pid_t pid)
{
    if (!cg)
        return;
    drop_live(cg, pid);
    set_parent_weight(cg, NULL, 0);
}

unsigned cgroups_cpu_weight(const struct sbx_cgroups *cg)
{
    return cg ? cg->weight_set : 0;
}

void cgroups_serving(struct sbx_cgroups *cg, pid_t pid, uint32_t tenant, const struct config *cfg)
{
    for (size_t i = 0; cg && i < cg->n_live; i++) {
        struct cg_turn *t = &cg->live[i];
        if (t->pid != pid || t->serving)
            continue;
        t->serving = true;
        set_parent_weight(cg, NULL, 0);
        int rc = cg->per_tenant && tenant && t->complete ? tenant_enter(cg, t, tenant, cfg) : 0;
        /* It stays where it is, limits and all: only the weight is off. */
        if (rc < 0)
            LOG_W("cgroup: sandbox %d stays out of its tenant's cgroup (tenant %u): %s",
                  (int)pid, (unsigned)tenant, strerror(-rc));
        return;
    }
}

size_t cgroups_retry(struct sbx_cgroups *cg)
{
    if (!cg)
        return 0;
    size_t kept = 0;
    for (size_t i = 0; i < cg->n_busy; i++)
        if (recycle_turn(cg, &cg->busy[i]) == -EAGAIN)
            cg->busy[kept++] = cg->busy[i];
    cg->n_busy = kept;
    return kept + cg_stale_retry(&cg->stale);
}

/* Every tenant directory of ours (empty now, unless a turn directory in it
 * was still busy: then it stays, as that one does). */
static void tenant_dirs_remove(const struct sbx_cgroups *cg)
{
    char prefix[32], path[PATH_MAX + 320];
    DIR *d = cg->per_tenant ? opendir(cg->dir[CG_CPU]) : NULL;
    if (!d)
        return;
    snprintf(prefix, sizeof prefix, CG_TENANT_PREFIX "%u-%d-", cg->id_first, (int)getpid());
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", cg->dir[CG_CPU], e->d_name);
        if (rmdir(path) < 0)
            LOG_W("cgroup: cannot remove %s: %s", path, strerror(errno));
    }
    closedir(d);
}

void cgroups_free(struct sbx_cgroups *cg)
{
    if (!cg)
        return;
    /* Everything goes: spares at once, live turns (their sandboxes die with
     * the fork server) and busy ones as their last tasks exit, for at most a
     * second. */
    struct cg_turn *lists[] = {cg->spare, cg->live};
    size_t counts[] = {cg->n_spare, cg->n_live};
    for (int l = 0; l < 2; l++)
        for (size_t i = 0; i < counts[l]; i++)
            if (turn_push(&cg->busy, &cg->n_busy, &cg->cap_busy, lists[l][i]) < 0)
                LOG_W("cgroup: out of memory; turn cgroup %llu left behind",
                      (unsigned long long)lists[l][i].seq);
    cg->n_spare = cg->n_live = 0;
    for (size_t i = 0; i < cg->n_busy; i++)
        cg->busy[i].complete = false; /* removed, not recycled */
    size_t left = cgroups_retry(cg);
    for (int tries = 0; left && tries < 100; tries++) {
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
        left = cgroups_retry(cg);
    }
    if (left)
        LOG_W("cgroup: %zu turn cgroups not removable at exit: the next start on --id-range "
              "%u... removes them", left, cg->id_first);
    tenant_dirs_remove(cg);
    cg_stale_free(&cg->stale);
    free(cg->live);
    free(cg->busy);
    free(cg->spare);
    /* The parents (<own cgroup>/forkbox) stay: other daemons started in the
     * same cgroup share them, and one that has no turn cgroup at this moment
     * (just started, or --pool 0 between turns) would lose its next
     * sandbox's placement if we removed them. */
    free(cg);
}
