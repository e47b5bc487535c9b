/* Runs in the fork server's cgroup helper (placer.c), which makes every
 * cgroup write; the fork server only probes at start, before it forks the
 * helper (cgroups_init, cgroups_probe.c). Per-turn cgroups, see cgroups.h.
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
 * cgroup per tenant (cgroups_tenant.c).
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
 * memory.
 *
 * The files, by job (cgroups_int.h: struct sbx_cgroups, and what they call
 * in each other):
 *   cgroups.c         the helper's placement: turn cgroups made, limited,
 *                     attached, counted, recycled, removed;
 *   cgroups_probe.c   the fork server's start-up probe (cgroups_init): which
 *                     hierarchies, which controllers, a turn cgroup tried;
 *   cgroups_tenant.c  the tenant level (--cpu-share tenant). */
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
#include "sandbox/cgroups_int.h"
#include "sandbox/cgroups_stale.h"

#define CPU_PERIOD_US 100000ULL

const char *const ctl_name[CG_N] = { "memory", "pids", "cpu" };

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

int write_file(const char *path, const char *s)
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

int read_file(const char *path, char *buf, size_t len)
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
int write_at(const char *dir, const char *file, const char *val, char *why, size_t whylen)
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

bool word_in(const char *list, const char *word, char sep)
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

int make_dir(const char *path)
{
    if (mkdir(path, 0755) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* v2: the controllers must be enabled in every ancestor's subtree_control.
 * A non-root cgroup with processes cannot enable them ("no internal
 * processes"); then move the processes of our cgroup into a leaf beside
 * forkbox/, as delegated managers do. */
int v2_enable(const char *dir, const char *ctls, char *why, size_t whylen)
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

/* The parent's CPU weight (see the top): --cpu-weight, or 100 per sandbox
 * serving a turn. Written only when it changes; a failure is logged once
 * (the turns still run, at the weight the parent has; an explicit
 * --cpu-weight that cannot be written at all stops the start, cgroups_init). */
int set_parent_weight(struct sbx_cgroups *cg, char *why, size_t whylen)
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

void turn_dir(const struct sbx_cgroups *cg, int c, uint64_t seq, char *out, size_t len)
{
    snprintf(out, len, "%s/" CG_TURN_PREFIX "%u-%d-%llu", cg->dir[c], cg->id_first, (int)getpid(),
             (unsigned long long)seq);
}

bool turn_enforced(const struct sbx_cgroups *cg, int c)
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
void v2_ctls(const struct sbx_cgroups *cg, char *out, size_t len)
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
int set_limits(const struct sbx_cgroups *cg, int c, const char *dir,
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
int make_turn_dir(const struct sbx_cgroups *cg, int c, const char *dir)
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
            /* Moved (cgroups_tenant.c): the turn ran in its tenant's turn
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
