/* session/tenants.c: a record per name the token file lists (the default
 * tenant alone without auth), kept while a turn refers to it, found again
 * when the name comes back meanwhile, numbers never reused; its budget sits
 * between the turn's and the daemon's; its metrics row lives with it. */
#include <errno.h>
#include <string.h>

#include "core/buf.h"
#include "core/budget.h"
#include "net/auth.h"
#include "session/metrics.h"
#include "session/tenants.h"
#include "tap.h"

static struct tokens *toks(const char *text)
{
    struct tokens *t = NULL;
    char err[256];
    if (tokens_parse(text, strlen(text), &t, err, sizeof err) < 0)
        return NULL;
    return t;
}

/* Whether /metrics shows a row for name. */
static bool shown(const char *name)
{
    char want[128];
    struct buf b;
    buf_init(&b, 1 << 20);
    metrics_write(&b);
    buf_append(&b, "", 1);
    snprintf(want, sizeof want, "forkbox_turns_active{tenant=\"%s\"}", name);
    bool found = strstr((const char *)b.data, want) != NULL;
    buf_free(&b);
    return found;
}

int main(void)
{
    metrics_init(0);
    struct budget daemon = {.max = 1000};
    struct tenants ts;
    tenants_init(&ts, &daemon, 100);

    is_int(tenants_sync(&ts, NULL), 0, "no auth");
    struct tenant *d = tenants_find(&ts, TENANT_DEFAULT);
    ok(d && d->id == 1 && ts.n == 1, "the default tenant alone, number 1");

    struct tokens *t1 = toks("team-a tok1\nteam-a tok2\nteam-b tok3\n");
    is_int(tenants_sync(&ts, t1), 0, "two named tenants");
    struct tenant *a = tenants_find(&ts, "team-a"), *b = tenants_find(&ts, "team-b");
    ok(a && b && a->id == 2 && b->id == 3 && ts.n == 2, "one record per name (%zu)", ts.n);
    ok(tenants_find(&ts, TENANT_DEFAULT) == NULL && !shown(TENANT_DEFAULT),
       "the default tenant, named no more and held by no turn, is gone with its row");
    ok(shown("team-a") && shown("team-b"), "each has its metrics row");

    /* turn -> tenant -> daemon */
    struct budget turn = {.max = 80, .up = &a->budget};
    is_int(budget_take(&turn, 70), 0, "a turn takes 70");
    struct budget turn2 = {.max = 80, .up = &a->budget};
    is_int(budget_take(&turn2, 40), -ENOSPC, "another turn of the tenant: over its 100");
    ok(a->budget.used == 70 && daemon.used == 70, "nothing charged by the refusal");
    struct budget turn3 = {.max = 80, .up = &b->budget};
    is_int(budget_take(&turn3, 40), 0, "another tenant's turn is not refused");
    budget_give(&turn, 70);
    budget_give(&turn3, 40);
    is_int((int)daemon.used, 0, "all given back");

    /* team-a leaves the file while a turn holds it */
    tenant_hold(a);
    struct tokens *t2 = toks("team-b tok3\n");
    is_int(tenants_sync(&ts, t2), 0, "team-a removed");
    ok(tenants_find(&ts, "team-a") == NULL, "not found for new turns");
    ok(shown("team-a"), "its row stays while its turn runs");
    is_int(tenants_sync(&ts, t1), 0, "team-a back");
    ok(tenants_find(&ts, "team-a") == a && a->id == 2, "the same record, the same number");
    is_int(tenants_sync(&ts, t2), 0, "team-a removed again");
    tenants_drop(&ts, a);
    ok(!shown("team-a") && ts.n == 1, "gone with its last turn, row and all");
    is_int(tenants_sync(&ts, t1), 0, "team-a back once more");
    a = tenants_find(&ts, "team-a");
    ok(a && a->id == 4, "a new record: numbers are not reused (%u)", a ? a->id : 0);
    tenants_drop(&ts, NULL);

    tenants_free(&ts);
    ok(!shown("team-a") && !shown("team-b"), "freed, rows and all");
    tokens_free(t1);
    tokens_free(t2);
    metrics_reset();
    return tap_done();
}
