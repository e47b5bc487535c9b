/* Tenants: whose turns are whose. Runs in the supervisor.
 *
 * A tenant is the name the token file gives a token (net/auth.h: "NAME
 * TOKEN"); unnamed tokens, the environment's token and, without auth, every
 * turn are TENANT_DEFAULT's. The server finds a request's tenant by the
 * token that matched and admits by the tenant's share (--tenant-capacity:
 * turns at once, else 429); a turn's buffers are charged to its tenant's
 * budget (--tenant-buffer), which is charged to the daemon's
 * (--total-buffer): turn -> tenant -> daemon; the metrics count turns by
 * tenant (the record's struct metrics_tenant); and the fork server's cgroup
 * helper puts a turn's CPU under its tenant's cgroup by the tenant's number
 * (--cpu-share tenant, sandbox/cgroups_tenant.c), never its name: sandboxes are
 * clones of the fork server and must not learn other tenants' names.
 *
 * A record lives while the token file names it (listed) or a session refers
 * to it (from its admission until the session is freed, which is after its
 * slot was given back: its buffers are charged to the tenant until then).
 * After SIGHUP, tenants_sync: a tenant that left the file is not found any
 * more (its new turns get 401), its running turns go on with their record,
 * which goes with the last of them. A name that comes back meanwhile gets
 * that record again: one name is never two records (two counts, two metrics
 * series). At most TOKENS_MAX listed, plus those still running turns. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/budget.h"
#include "core/limits.h"
#include "session/metrics.h"

struct tokens;

struct tenant {
    char name[TENANT_NAME_MAX + 1];
    uint32_t id;                   /* its number for the fork server (1, 2, ...): never reused
                                      while the daemon runs */
    unsigned turns;                /* turns holding a slot (--tenant-capacity): the server's */
    unsigned refs;                 /* sessions admitted for it and not yet freed */
    bool listed;                   /* the token file names it */
    struct budget budget;          /* its turns' buffers together (--tenant-buffer; 0 = no
                                      ceiling of its own), charged to the daemon's too */
    struct metrics_tenant metrics; /* its row of the tenant label (metrics.h) */
};

struct tenants {
    struct tenant **t;             /* owned, each one */
    size_t n, cap;
    uint32_t last_id;              /* the last number handed out */
    struct budget *up;             /* borrowed: the daemon's budget */
    uint64_t buffer_max;           /* --tenant-buffer */
};

/* An empty table whose tenants' budgets have the ceiling buffer_max (0:
 * none) and are charged to up (borrowed, outlives ts). */
void tenants_init(struct tenants *ts, struct budget *up, uint64_t buffer_max);
/* Frees every record (sessions must be gone). */
void tenants_free(struct tenants *ts);
/* From now on the listed tenants are those tok names (NULL: no auth, the
 * default tenant alone); the others are not, and go once no session refers
 * to them. 0, or -ENOMEM with nothing changed. */
int tenants_sync(struct tenants *ts, const struct tokens *tok);
/* The listed tenant called name, or NULL. */
struct tenant *tenants_find(struct tenants *ts, const char *name);
/* A session refers to t from now on (its admission): t. */
struct tenant *tenant_hold(struct tenant *t);
/* ... no more (it is freed): t goes if it is not listed and nothing else
 * refers to it. NULL is fine. */
void tenants_drop(struct tenants *ts, struct tenant *t);
