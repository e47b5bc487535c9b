/* Runs in the fork server (at start, cgroups_init) and its cgroup helper
 * (retries, cgroups_retry): the turn cgroups an earlier daemon on the same
 * id range left behind.
 *
 * A turn cgroup is named after the first id of its daemon's --id-range
 * (CG_TURN_PREFIX "<first id>-<placer pid>-<n>", cgroups.c), a range that
 * daemon alone held while it ran (idlock.h). So at start, the turn cgroups
 * of a parent named after our range are an earlier instance's: a daemon
 * killed with -9, or one whose turn cgroups could not be removed as it
 * exited (a frozen task, a read-only hierarchy). Daemons started in the same
 * cgroup share the parent, and none of them touches another's. Only empty
 * ones can go (rmdir refuses the rest); those that cannot go yet are kept
 * and retried by the helper while the daemon runs. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define CG_TURN_PREFIX "turn-"
/* --cpu-share tenant: a tenant's cgroup, CG_TENANT_PREFIX "<first id>-<placer
 * pid>-<n>", holding its turns' (cgroups_tenant.c); an earlier daemon's
 * are removed with the turn cgroups in them. */
#define CG_TENANT_PREFIX "tenant-"

struct cg_stale {
    char **path; /* owned: directories to remove */
    size_t n, cap;
};

/* Remove parent's turn cgroups of the range starting at id_first; keep those
 * that cannot be removed yet. Logs what it found. */
void cg_stale_scan(struct cg_stale *st, const char *parent, uint32_t id_first);
/* Try the kept ones again: how many are left. */
size_t cg_stale_retry(struct cg_stale *st);
void cg_stale_free(struct cg_stale *st);
