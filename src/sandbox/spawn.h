/* Runs in the fork server (and test_sandbox): the spawn API, spawning one
 * sandbox. The fork server's half (clone, id maps, cgroup placement,
 * release) is spawn.c; the child's half (the ordered isolation steps, then
 * the runtime's serve loop) is steps.c; what both read, the plan and the
 * hooks, is plan.h.
 *
 * Nothing here talks to the supervisor or touches turn data: the channel is a
 * fresh socketpair whose far end the caller hands on. The interpreter is
 * reached only through struct sbx_hooks (plan.h), so tests can spawn real sandboxes
 * without linking pyrt. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "config/config.h"
#include "core/steptime.h"
#include "sandbox/plan.h"

enum sbx_spawn_flags {
    /* For the fork server's pool: the child gets a warm socket (see
     * sbx_hooks.serve) and reports on it when it is warmed up and waiting. */
    SBX_SPAWN_POOLED = 1u << 0,
    /* No cgroup placement and no release here: the child waits at sync 1
     * until someone attaches it to its cgroups and calls sbx_child_go() on
     * out->go_fd (the fork server hands both to its cgroup helper, so the
     * slow cgroup write never blocks it). */
    SBX_SPAWN_DEFER_GO = 1u << 1,
};

/* One spawned sandbox, as the fork server keeps it. */
struct sbx_child {
    pid_t pid;         /* host pid; > 0 whenever a process exists to be reaped */
    uint32_t id;       /* host uid and gid of the sandbox (its root inside); the
                          caller's to give back once pid has been reaped */
    int pidfd;         /* owned; -1 after hand-off */
    int chan_fd;       /* owned: the supervisor's end of the channel; -1 after hand-off */
    int warm_fd;       /* owned, pooled spawns only (else -1): SOCK_SEQPACKET, one byte
                          arrives once the child is warmed up and waits for its tools */
    int go_fd;         /* owned, SBX_SPAWN_DEFER_GO only (else -1): see sbx_child_go() */
    char *turn_dir;    /* owned; non-isolated mode: per-turn dir to remove at reap */
    uint64_t spawn_ns; /* clone until the child was released */
    uint64_t turn_id;  /* fork server: the turn it was handed to; 0 while pooled */
    int times_fd;      /* owned, --step-times and fresh spawns only (else -1): the read
                          end of the child's step-time pipe (core/steptime.h) */
    struct steptime_rec *times; /* owned, with times_fd: the fork server's marks (else NULL) */
};

/* Find glibc's cached thread id inside our struct pthread: the one int at
 * pthread_self() equal to gettid(). Call once, single-threaded. 0 with *out
 * set, or -ENOENT/-EEXIST (none / ambiguous: use the fork path). */
int sbx_tid_probe(pid_t **out);

/* Spawn one sandbox per plan as host uid and gid `id` (never 0; one that no
 * other live sandbox holds, see ids.h); flags: enum sbx_spawn_flags. 0 with
 * *out filled, or -errno with a reason in err. Even on failure out->pid may
 * be > 0: that child has been killed but still has to be reaped and released
 * with sbx_child_release(). Isolated, the caller must be root and
 * single-threaded: the clone is made with `id` as our real and effective ids
 * (restored before returning, with our parent-death signal; we stay
 * non-dumpable after, as any process that changed its ids). */
int sbx_spawn(const struct sbx_plan *plan, uint32_t id, unsigned flags, struct sbx_child *out,
              char *err, size_t errlen);

/* Release a child spawned with SBX_SPAWN_DEFER_GO once its cgroups are in
 * place (err == 0), or make it fail its setup with err (an errno: "cgroup
 * placement" and strerror(err) in its log frame, exit 72). Takes go_fd
 * (closed here, on failure too). 0, or -EPIPE if the child is gone.
 * Async-signal-safe. */
int sbx_child_go(int go_fd, int err);

/* After out->pid was reaped: remove its cgroups and turn dir, close what is
 * still owned. */
void sbx_child_release(const struct sbx_plan *plan, struct sbx_child *c);

/* --- the interpreter glue (child.c): the only place that calls pyrt --- */

/* In the fork server: pyrt_init(). 0 or -errno with a reason in err. */
int sbx_runtime_init(const struct config *cfg, char *err, size_t errlen);
/* Hooks that run the real runtime (pyrt_after_fork, pyrt_serve). */
extern const struct sbx_hooks sbx_runtime_hooks;
