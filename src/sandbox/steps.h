/* Runs in the sandbox child: its half of a spawn (steps.c), from
 * the moment clone (or the fork path's fork) returns 0 in spawn.c. Internal
 * to spawn.c and steps.c; the spawn API is spawn.h. spawn.c includes this
 * header, never the other way round: the child's half reads only the plan
 * (plan.h). */
#pragma once
#include <stdint.h>

#include "sandbox/plan.h"

/* Exit status of a sandbox whose setup step `step` failed (habit 4):
 * SBX_EXIT_STEP_BASE + step. */
#define SBX_EXIT_STEP_BASE 70

/* The sync pipe, fork server -> child: SBX_MAPPED once the id maps are
 * written (sync 1: step 2 goes on), then SBX_GO once the child's cgroups are
 * in place (sync 2, at the end of step 4), or SBX_NO_GO plus one byte (the
 * errno of the failed cgroup placement), which makes it fail its setup.
 * SBX_UNSHARED: the fork path's middle process tells the fork server its
 * namespaces exist (the id maps can be written). */
#define SBX_MAPPED 'M'
#define SBX_GO 'G'
#define SBX_NO_GO 'E'
#define SBX_UNSHARED 'U'

/* The child's mutable state while the steps run. */
struct sbx_state {
    int chan_fd;        /* the child's end of the channel */
    int sync_fd;        /* read end of the parent's "go" pipe; -1 once consumed */
    int tools_fd;       /* writable tools dir (O_DIRECTORY), from step 3 */
    int warm_fd;        /* pooled spawns: the child's end of the warm socket, else -1 */
    int times_fd;       /* --step-times, fresh spawns: the step-time pipe's write end, else -1 */
    uint32_t id;        /* the sandbox's host uid and gid */
    const char *tools_dir;     /* borrowed: /tools (isolated) or the turn dir's tools/ */
    const char *workspace_dir; /* borrowed: /workspace or the turn dir's workspace/ */
    char what[256];     /* what failed, for the error frame */
};

/* The child: the step table for p (isolated or plain), then the hooks. A
 * failed step exits 70 + its id after a `log` frame; never returns. */
_Noreturn void sbx_child_main(const struct sbx_plan *p, struct sbx_state *st);

/* The fork path (plan without the tid address, or SBX_PLAN_FORCE_FORK): the
 * forked middle process becomes the sandbox's id, unshares, acks on ack_fd
 * (SBX_UNSHARED), waits for go, forks the sandbox (sbx_child_main) and
 * mirrors its exit status. Never returns. */
_Noreturn void sbx_middle_main(const struct sbx_plan *p, struct sbx_state *st, int ack_fd);
