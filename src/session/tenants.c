/* The tenants (see tenants.h). Runs in the supervisor. */
#include "session/tenants.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/auth.h"

void tenants_init(struct tenants *ts, struct budget *up, uint64_t buffer_max)
{
    *ts = (struct tenants){.up = up, .buffer_max = buffer_max};
}

static void tenant_free(struct tenant *t)
{
    metrics_tenant_remove(&t->metrics);
    free(t);
}

void tenants_free(struct tenants *ts)
{
    for (size_t i = 0; i < ts->n; i++)
        tenant_free(ts->t[i]);
    free(ts->t);
    *ts = (struct tenants){0};
}

/* Any record called name, listed or not. */
static struct tenant *lookup(const struct tenants *ts, const char *name)
{
    for (size_t i = 0; i < ts->n; i++)
        if (strcmp(ts->t[i]->name, name) == 0)
            return ts->t[i];
    return NULL;
}

struct tenant *tenants_find(struct tenants *ts, const char *name)
{
    struct tenant *t = lookup(ts, name);
    return t && t->listed ? t : NULL;
}

/* A new record for name (at most TENANT_NAME_MAX bytes: auth.c checked),
 * not listed yet. NULL on ENOMEM. */
static struct tenant *add(struct tenants *ts, const char *name)
{
    if (ts->n == ts->cap) {
        size_t cap = ts->cap ? ts->cap * 2 : 8;
        struct tenant **v = realloc(ts->t, cap * sizeof *v);
        if (!v)
            return NULL;
        ts->t = v;
        ts->cap = cap;
    }
    struct tenant *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->id = ++ts->last_id;
    t->budget = (struct budget){.max = ts->buffer_max, .up = ts->up};
    metrics_tenant_add(&t->metrics, t->name);
    ts->t[ts->n++] = t;
    return t;
}

/* Remove records that are neither listed nor referred to. */
static void prune(struct tenants *ts)
{
    size_t kept = 0;
    for (size_t i = 0; i < ts->n; i++) {
        if (ts->t[i]->listed || ts->t[i]->refs)
            ts->t[kept++] = ts->t[i];
        else
            tenant_free(ts->t[i]);
    }
    ts->n = kept;
}

int tenants_sync(struct tenants *ts, const struct tokens *tok)
{
    size_t n = tok ? tokens_count(tok) : 1;
    /* Every name gets a record first, so that a failure changes nothing:
     * the records made for it are dropped again (unlisted, unreferred). */
    for (size_t i = 0; i < n; i++) {
        const char *name = tok ? tokens_name(tok, i) : TENANT_DEFAULT;
        if (!lookup(ts, name) && !add(ts, name)) {
            prune(ts);
            return -ENOMEM;
        }
    }
    for (size_t i = 0; i < ts->n; i++)
        ts->t[i]->listed = false;
    for (size_t i = 0; i < n; i++)
        lookup(ts, tok ? tokens_name(tok, i) : TENANT_DEFAULT)->listed = true;
    prune(ts);
    return 0;
}

struct tenant *tenant_hold(struct tenant *t)
{
    t->refs++;
    return t;
}

void tenants_drop(struct tenants *ts, struct tenant *t)
{
    if (!t)
        return;
    t->refs--;
    if (!t->listed && t->refs == 0)
        prune(ts);
}
