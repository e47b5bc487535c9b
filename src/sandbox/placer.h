/* Runs in the fork server's cgroup helper ("placer"), a process of its own:
 * the records the fork server queues for it on a SOCK_SEQPACKET socket, and its
 * loop (placer.c). The fork server starts it and sends it work
 * (forkserver.c: placer_start, placer_send).
 *
 * Moving a process into a cgroup (the first cgroup.procs write of a spawn)
 * can wait for an RCU grace period: 5-16 ms on cgroup v1 hosts here, while
 * everything else a spawn does in the fork server takes ~0.2 ms. So the
 * writes are made by a helper process, forked before the interpreter starts:
 * the fork server clones and writes the id maps, then passes the child's
 * pid and the write end of its "go" pipe to the helper, which attaches it,
 * limits set, and releases it (or makes it fail with the reason). Removing
 * a reaped sandbox's cgroups goes the same way. The fork server never waits
 * for either; the helper works through its queue in order (back-to-back
 * attaches mostly skip the grace period). */
#pragma once
#include <stdint.h>

#include "config/config.h"

struct sbx_cgroups;

enum placer_op {
    PLACER_ATTACH = 1,
    PLACER_RELEASE = 2,
    PLACER_RELEASE_REPORT = 3,
    PLACER_SERVING = 4, /* the sandbox was handed to a turn: it counts in the CPU weight,
                           and its CPU goes under its tenant's cgroup (--cpu-share tenant) */
};

struct placer_req {
    uint32_t op;         /* enum placer_op */
    int32_t pid;         /* ATTACH carries the child's go fd by SCM_RIGHTS */
    uint64_t turn_id;    /* RELEASE_REPORT: the turn the reaped sandbox served */
    int32_t wait_status; /* RELEASE_REPORT: its init's wait status */
    uint32_t tenant;     /* SERVING: the turn's tenant's number (fsproto.h), 0 = none */
};

/* The helper's loop, in the child of fork_helper (core/util.h): requests on fd, death
 * reports to the supervisor on ctl_fd (its copy of the control socket).
 * Uses cg (the fork server's probe, inherited) for every cgroup write. Exits
 * 0 on EOF, when the fork server is gone or done, after removing every turn
 * cgroup. */
_Noreturn void placer_main(const struct config *cfg, struct sbx_cgroups *cg, int fd, int ctl_fd);
