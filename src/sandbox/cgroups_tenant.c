/* The tenant level of the turn cgroups (--cpu-share tenant): a cgroup per
 * tenant between the sandboxes' parent and the turns, in the hierarchy with
 * the cpu controller. Runs in the fork server's cgroup helper.
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
 * stay until the helper exits.
 *
 * Called by cgroups.c, which moves a sandbox in (tenant_enter) when it
 * starts serving, out (tenant_leave) at its release, and removes the
 * tenant directories at exit (tenant_dirs_remove); relies on it for a
 * directory's making (turn_dir, v2_enable, set_limits, write_file). */
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


static void tenant_dir(const struct sbx_cgroups *cg, uint32_t tenant, char *out, size_t len)
{
    snprintf(out, len, "%s/" CG_TENANT_PREFIX "%u-%d-%u", cg->dir[CG_CPU], cg->id_first,
             (int)getpid(), (unsigned)tenant);
}

void tenant_turn_dir(const struct sbx_cgroups *cg, const struct cg_turn *t, char *out,
                     size_t len)
{
    snprintf(out, len, "%s/" CG_TENANT_PREFIX "%u-%d-%u/" CG_TURN_PREFIX "%u-%d-%llu",
             cg->dir[CG_CPU], cg->id_first, (int)getpid(), (unsigned)t->tenant, cg->id_first,
             (int)getpid(), (unsigned long long)t->seq);
}

/* Remove t's turn directory under its tenant; -EBUSY while a task of it is
 * still exiting. */
int tenant_leave(const struct sbx_cgroups *cg, const struct cg_turn *t)
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
int tenant_enter(struct sbx_cgroups *cg, struct cg_turn *t, uint32_t tenant,
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

/* Every tenant directory of ours (empty now, unless a turn directory in it
 * was still busy: then it stays, as that one does). */
void tenant_dirs_remove(const struct sbx_cgroups *cg)
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
