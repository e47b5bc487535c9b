/* Runs in the sandbox child (its rlimits step, see steps.c): the rlimits a
 * sandbox sets on itself (see rlimits.h). The cgroups, the limits relied on,
 * are placed from outside (cgroups.c).
 *
 * The per-user rlimits count per sandbox: each has a host uid of its own
 * (ids.h), in a user namespace that uid owns. RLIMIT_NPROC (processes of the
 * uid: per (user namespace, uid) from Linux 5.14, per host uid before) is a
 * backstop to pids.max, the limit relied on. RLIMIT_SIGPENDING and
 * RLIMIT_MSGQUEUE bound the queued signals and message queue bytes one turn
 * may pin (core/limits.h). RLIMIT_NOFILE also bounds the fds one turn can
 * hold in flight in unix socket messages: the kernel refuses to queue more
 * once the sender's host user has more in flight than the sender's nofile
 * limit; that count is per host user, i.e. per sandbox, as are pipe buffers
 * (fs.pipe-user-pages-*) and epoll watches. */
#include "sandbox/rlimits.h"

#include <errno.h>
#include <sys/resource.h>

#include "core/limits.h"

#define LIMITS_NOFILE 1024

static int set_rlimit(int res, rlim_t v)
{
    struct rlimit cur;
    if (getrlimit(res, &cur) == 0 && cur.rlim_max != RLIM_INFINITY && cur.rlim_max < v)
        v = cur.rlim_max; /* never try to raise: only lower */
    struct rlimit rl = { .rlim_cur = v, .rlim_max = v };
    if (setrlimit(res, &rl) < 0)
        return -errno;
    return 0;
}

int rlimits_apply(const struct config *cfg)
{
    int rc;
    if ((rc = set_rlimit(RLIMIT_CORE, 0)) < 0)
        return rc;
    /* No single file may outgrow the tmpfs; writes past it fail with EFBIG
     * (CPython ignores SIGXFSZ) instead of filling the disk. */
    if (cfg->tmpfs_size && (rc = set_rlimit(RLIMIT_FSIZE, cfg->tmpfs_size)) < 0)
        return rc;
    if ((rc = set_rlimit(RLIMIT_NOFILE, LIMITS_NOFILE)) < 0)
        return rc;
    if ((rc = set_rlimit(RLIMIT_SIGPENDING, SBX_RLIMIT_SIGPENDING)) < 0 ||
        (rc = set_rlimit(RLIMIT_MSGQUEUE, SBX_RLIMIT_MSGQUEUE)) < 0)
        return rc;
    /* Isolated only: without isolation (benchmarks) as a non-root user,
     * every sandbox runs as that user, whose other processes count too. */
    /* One above pids.max: the kernel checks the rlimit first, and at the
     * same value it refused every fork before pids.max could count it
     * (pids.events), which is how the close reason knows a turn hit its
     * process limit. */
    if (cfg->isolate && cfg->pids_max && (rc = set_rlimit(RLIMIT_NPROC, cfg->pids_max + 1)) < 0)
        return rc;
    return 0;
}
