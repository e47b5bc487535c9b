/* Runs in the fork server (probe) and its cgroup helper (every write, placer.c):
 * per-turn cgroups (v2 where the host has controllers, else the v1 memory,
 * pids and cpu controllers): probed by the fork server at start, then
 * written only by its cgroup helper (placer.c). The child's own rlimits are
 * rlimits.h. */
#pragma once
#include <stdint.h>
#include <sys/types.h>

#include "config/config.h"

struct sbx_cgroups; /* opaque: what this host offers, probed once at start */

/* Prepare a parent cgroup for forkbox under each usable hierarchy and probe
 * it for real (a turn cgroup made, limited, entered by a process, removed).
 * Fails closed: if a limit the configuration asks for (non-zero --memory,
 * --pids, --cpu or --cpu-weight) cannot be enforced, -EOPNOTSUPP with one
 * line in err saying what is missing and how to fix it. With
 * cfg->allow_no_cgroups (or without cfg->isolate) such a controller is
 * left out with a warning instead. 0 or -errno. */
int cgroups_init(const struct config *cfg, struct sbx_cgroups **out, char *err, size_t errlen);
/* Create the turn's cgroup(s) with the configured limits and move pid into
 * them (called by the fork server right after clone, before the child is
 * released). 0 or -errno. */
int cgroups_attach(struct sbx_cgroups *cg, pid_t pid, const struct config *cfg);
/* What a turn cgroup counted during one sandbox's life (0 where the
 * controller is not enforced). */
struct cg_events {
    uint32_t oom_kills; /* v2 memory.events / v1 memory.oom_control oom_kill */
    uint32_t oom_own;   /* its own limit reached: v2 memory.events oom; v1 (cgroups_events):
                           its peak at memory.limit_in_bytes */
    uint32_t pids_max;  /* pids.events max: forks refused at pids.max */
    uint64_t mem_peak;  /* v1 memory.max_usage_in_bytes / v2 memory.peak: most memory held
                           (cgroups_events: this sandbox's, 0 if unknown) */
    uint64_t oom_limit; /* cgroups_events, OOM kills without its own limit reached: the limit
                           of the cgroup above that was (cgroups_above.h); 0: none, the
                           host's OOM */
};
/* What pid's turn cgroup counted since pid was placed in it; call once pid
 * has been reaped, before cgroups_release (which may hand the cgroup
 * to the next sandbox). */
void cgroups_events(struct sbx_cgroups *cg, pid_t pid, struct cg_events *ev);
/* Remove the turn's cgroup(s) once pid has been reaped, or keep them as a
 * spare. Never blocks: a cgroup whose tasks are still exiting is kept for
 * cgroups_retry(). */
void cgroups_release(struct sbx_cgroups *cg, pid_t pid);
/* pid's sandbox now serves a turn of tenant number tenant (0: none): it
 * counts in the sandboxes' CPU weight (cgroups.c) until it is released, and
 * with --cpu-share tenant its CPU moves under its tenant's cgroup (limits
 * from cfg). Unknown pids (gone before placement) are ignored. */
void cgroups_serving(struct sbx_cgroups *cg, pid_t pid, uint32_t tenant, const struct config *cfg);
/* The CPU weight last written to the sandboxes' parent (cgroup v2 units; 0
 * if none was: no cpu controller, or the write failed). */
unsigned cgroups_cpu_weight(const struct sbx_cgroups *cg);
/* Try again to remove released cgroups that were busy; returns how many are
 * still waiting (call again a little later while non-zero). */
size_t cgroups_retry(struct sbx_cgroups *cg);
void cgroups_free(struct sbx_cgroups *cg);
