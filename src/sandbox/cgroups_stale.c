/* Runs in the fork server and its cgroup helper: an earlier daemon's turn
 * cgroups (see cgroups_stale.h). */
#include "sandbox/cgroups_stale.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"

/* name is kind "<id_first>-<pid>-<n>", all of it (kind: CG_TURN_PREFIX or
 * CG_TENANT_PREFIX). */
static bool ours(const char *name, const char *kind, uint32_t id_first)
{
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "%s%" PRIu32 "-", kind, id_first);
    if (strncmp(name, prefix, (size_t)n) != 0)
        return false;
    const char *p = name + n;
    for (int field = 0; field < 2; field++) {
        size_t digits = strspn(p, "0123456789");
        if (digits == 0 || p[digits] != (field ? '\0' : '-'))
            return false;
        p += digits + !field;
    }
    return true;
}

static void keep(struct cg_stale *st, const char *path)
{
    if (st->n == st->cap) {
        size_t cap = st->cap ? 2 * st->cap : 16;
        char **p = realloc(st->path, cap * sizeof *p);
        if (!p)
            return;
        st->path = p;
        st->cap = cap;
    }
    char *copy = strdup(path);
    if (copy)
        st->path[st->n++] = copy;
}

void cg_stale_scan(struct cg_stale *st, const char *parent, uint32_t id_first)
{
    DIR *d = opendir(parent);
    if (!d)
        return;
    unsigned removed = 0, kept = 0;
    int why = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[PATH_MAX];
        bool tenant = ours(e->d_name, CG_TENANT_PREFIX, id_first);
        if (e->d_type != DT_DIR || (!tenant && !ours(e->d_name, CG_TURN_PREFIX, id_first)) ||
            snprintf(path, sizeof path, "%s/%s", parent, e->d_name) >= (int)sizeof path)
            continue;
        if (tenant) /* its turn cgroups first (kept ones are retried before it) */
            cg_stale_scan(st, path, id_first);
        if (rmdir(path) == 0 || errno == ENOENT) {
            removed++;
            continue;
        }
        why = errno;
        kept++;
        keep(st, path);
    }
    closedir(d);
    if (removed || kept)
        LOG_W("cgroup: %u turn cgroups an earlier daemon on --id-range %" PRIu32 "... left in %s: "
              "%u removed, %u not yet (%s; retried)", removed + kept, id_first, parent, removed,
              kept, kept ? strerror(why) : "-");
}

size_t cg_stale_retry(struct cg_stale *st)
{
    size_t left = 0;
    for (size_t i = 0; i < st->n; i++) {
        if (rmdir(st->path[i]) == 0 || errno == ENOENT) {
            LOG_I("cgroup: %s removed at last", st->path[i]);
            free(st->path[i]);
        } else {
            st->path[left++] = st->path[i];
        }
    }
    st->n = left;
    return left;
}

void cg_stale_free(struct cg_stale *st)
{
    for (size_t i = 0; i < st->n; i++)
        free(st->path[i]);
    free(st->path);
    *st = (struct cg_stale){0};
}
