/* The fork server's start-up probe of cgroups (cgroups_init): its own
 * cgroup in each hierarchy, v2 or v1, which controllers can enforce the
 * limits asked for, and a turn cgroup made, limited, entered and removed
 * (probe_turn) rather than trust that files exist. Runs in the fork server,
 * single-threaded, before it forks its cgroup helper; where a limit asked
 * for cannot be enforced, it refuses to start.
 *
 * Relies on cgroups.c for the file helpers and a turn cgroup's making
 * (make_dir, write_at, turn_dir, set_limits, remove_turn), whose code the
 * probe runs once as every turn will. */
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
#include "sandbox/cgroups_int.h"
#include "sandbox/cgroups_stale.h"

static bool file_exists(const char *dir, const char *file)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return access(path, F_OK) == 0;
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
              "hides it, fresh sandboxes do not (docs/operating.md: Tuning the host)");
    *out = cg;
    return 0;
}
