/* Runs in the fork server and in the sandbox child: what both halves of a
 * spawn read. The fork server prepares a plan once (forkserver.c, or
 * test_sandbox) and spawns with it (spawn.c); the child it clones runs its
 * steps and then the hooks from the same plan (steps.c). Data only, so that
 * spawn.c -> steps.c -> plan.h and spawn.c -> plan.h point one way: the
 * child's half never includes the spawn API. */
#pragma once
#include <stddef.h>
#include <sys/types.h>

struct config;
struct sbx_policy;
struct sbx_cgroups;
struct mount_plan;
struct netns_spares;

/* What runs in the child around the isolation steps. */
struct sbx_hooks {
    /* In the runtime process after the last step (init has forked off),
     * right before serve: re-arms the inherited interpreter (thread state,
     * locks). The steps must not touch the interpreter. NULL = nothing. */
    void (*after_fork)(void);
    /* After the last step: serve the turn; never returns. Signature and fd
     * contract as pyrt_serve() (pyrt.h). warm_fd is -1 for a fresh spawn; for
     * a pooled one (SBX_SPAWN_POOLED, spawn.h) it is the child's end of the warm
     * socket: warm up, send one byte on it and close it, then wait for the
     * tools archive. */
    void (*serve)(int chan_fd, int tools_fd, int warm_fd, const char *tools_dir,
                  const char *workspace_dir) __attribute__((noreturn));
};

enum sbx_plan_flags {
    SBX_PLAN_NO_SECCOMP = 1u << 0, /* tests only: skip policy_install */
    SBX_PLAN_FORCE_FORK = 1u << 1, /* tests only: use the fork()+unshare path */
};

/* Everything a spawn needs, prepared once in the fork server. All borrowed. */
struct sbx_plan {
    const struct config *cfg;
    const struct sbx_policy *policy;  /* required when isolating (see flags) */
    struct sbx_cgroups *cgroups;      /* NULL = no cgroup placement */
    const struct mount_plan *mounts;  /* isolating only: the plan the root was built
                                         from, by mounts_build() in this process */
    struct netns_spares *netns;       /* isolating only: the network namespaces
                                         sandboxes are cloned into (netns.h) */
    const struct sbx_hooks *hooks;
    pid_t *tid_addr;   /* glibc's cached tid in our TCB (sbx_tid_probe), or NULL */
    void *robust_head; /* glibc's robust mutex list of our thread (get_robust_list) */
    size_t robust_len;
    unsigned flags;    /* enum sbx_plan_flags */
};
