/* Private to the cgroup files in src/sandbox/ (cgroups*.c): the state they
 * share, struct sbx_cgroups, and what they call in each other. Runs in the
 * fork server (the probe, before it forks its cgroup helper) and in the
 * helper. Nothing else includes this; the files are listed in cgroups.c's
 * opening comment. */
#pragma once
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "sandbox/cgroups.h"
#include "sandbox/cgroups_stale.h"
#define SPARE_MIN 32  /* empty turn cgroups kept for reuse: at least */
#define SPARE_MAX 256 /* and at most */

enum cg_ctl { CG_MEMORY, CG_PIDS, CG_CPU, CG_N };
extern const char *const ctl_name[CG_N];

struct sbx_cgroups {
    bool v2;
    char dir[CG_N][PATH_MAX]; /* parent ("<own>/forkbox") per controller; "" = not enforced.
                                 v2: the same directory for every enforced controller */
    bool swap_file;           /* v1 memory.memsw.limit_in_bytes / v2 memory.swap.max exists */
    size_t spare_max;         /* spares kept (see the top) */
    unsigned cpu_weight;      /* --cpu-weight, or 0: 100 per sandbox serving a turn */
    bool per_tenant;          /* --cpu-share tenant (and a cpu controller): cgroups_tenant.c */
    unsigned weight_set;      /* the parent's weight last written (0: none yet) */
    bool weight_failed;       /* writing it failed once (logged once) */
    uint64_t next_seq;        /* last turn cgroup number handed out */
    uint32_t id_first;        /* the --id-range's first id: in every turn cgroup's name */
    struct cg_stale stale;    /* an earlier daemon's turn cgroups, not removed yet */
    struct cg_turn {
        pid_t pid;            /* the sandbox's host pid */
        uint64_t seq;         /* its cgroup number */
        bool complete;        /* every directory made, limited and entered: reusable */
        bool serving;         /* its sandbox serves a turn (counted in the CPU weight) */
        uint32_t tenant;      /* per_tenant: the tenant whose cgroup its CPU moved under (the
                                 tenant's turn directory is removed at its release); 0: none */
        bool stuck;           /* its removal failed for more than busy tasks (logged once) */
        struct cg_events base; /* its counters when the sandbox in it was placed (they
                                  only grow, and survive reuse) */
    } *live, *busy, *spare;   /* owned: placed turns; released, tasks still exiting;
                                 released, empty and ready for the next turn */
    size_t n_live, cap_live, n_busy, cap_busy, n_spare, cap_spare;
};

/* cgroups.c */
int write_file(const char *path, const char *s);
int read_file(const char *path, char *buf, size_t len);
int write_at(const char *dir, const char *file, const char *val, char *why, size_t whylen);
bool word_in(const char *list, const char *word, char sep);
int make_dir(const char *path);
int v2_enable(const char *dir, const char *ctls, char *why, size_t whylen);
int set_parent_weight(struct sbx_cgroups *cg, char *why, size_t whylen);
void turn_dir(const struct sbx_cgroups *cg, int c, uint64_t seq, char *out, size_t len);
bool turn_enforced(const struct sbx_cgroups *cg, int c);
void v2_ctls(const struct sbx_cgroups *cg, char *out, size_t len);
int set_limits(const struct sbx_cgroups *cg, int c, const char *dir,
               const struct config *cfg, char *why, size_t whylen);
int make_turn_dir(const struct sbx_cgroups *cg, int c, const char *dir);
/* cgroups_tenant.c */
void tenant_turn_dir(const struct sbx_cgroups *cg, const struct cg_turn *t, char *out,
                     size_t len);
int tenant_leave(const struct sbx_cgroups *cg, const struct cg_turn *t);
int tenant_enter(struct sbx_cgroups *cg, struct cg_turn *t, uint32_t tenant,
                 const struct config *cfg);
void tenant_dirs_remove(const struct sbx_cgroups *cg);
