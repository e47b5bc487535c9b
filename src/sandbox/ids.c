/* Runs in the fork server: host ids for sandboxes (see ids.h).
 *
 * A bitmap over the range (8 KiB for the default 65536 ids) and a cursor:
 * ids_take() scans forward from the id after the last one taken, so ids go
 * round robin and a freed id comes back only after every other free id has
 * been used once. The scan is short: the range holds at least twice as many
 * ids as can be live (config.c), so about every other bit is free. */
#include "sandbox/ids.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "core/util.h"

struct sbx_ids {
    uint32_t first;  /* first id of the range */
    uint32_t count;  /* ids in the range */
    uint32_t next;   /* index the next scan starts at */
    size_t live;     /* bits set */
    uint64_t *used;  /* owned: one bit per id, set while a sandbox holds it */
};

int ids_new(uint32_t first, uint32_t count, struct sbx_ids **out)
{
    *out = NULL;
    if (count == 0 || (uint64_t)first + count > UINT32_MAX)
        return -EINVAL;
    struct sbx_ids *ids = calloc(1, sizeof *ids);
    if (!ids)
        return -ENOMEM;
    ids->used = calloc(((size_t)count + 63) / 64, sizeof *ids->used);
    if (!ids->used) {
        free(ids);
        return -ENOMEM;
    }
    ids->first = first;
    ids->count = count;
    /* A random start: two daemons given the same range (a misconfiguration
     * that sandbox/idlock.h refuses) then seldom hand out the same id at the same time. */
    uint32_t r;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
        r = (uint32_t)time(NULL);
    ids->next = r % count;
    *out = ids;
    return 0;
}

void ids_free(struct sbx_ids *ids)
{
    if (!ids)
        return;
    free(ids->used);
    free(ids);
}

static bool bit(const struct sbx_ids *ids, uint32_t i)
{
    return ids->used[i / 64] >> (i % 64) & 1;
}

int ids_take(struct sbx_ids *ids, uint32_t *id)
{
    if (ids->live >= ids->count)
        return -EAGAIN;
    uint32_t i = ids->next;
    /* At most one lap; whole words at a time where they are full. */
    for (uint64_t seen = 0; seen < ids->count;) {
        if (i % 64 == 0 && ids->used[i / 64] == UINT64_MAX && ids->count - i >= 64) {
            seen += 64;
            i = i + 64 == ids->count ? 0 : i + 64;
            continue;
        }
        if (!bit(ids, i)) {
            ids->used[i / 64] |= 1ull << (i % 64);
            ids->live++;
            ids->next = i + 1 == ids->count ? 0 : i + 1;
            *id = ids->first + i;
            return 0;
        }
        seen++;
        i = i + 1 == ids->count ? 0 : i + 1;
    }
    return -EAGAIN; /* not reached: live < count */
}

void ids_put(struct sbx_ids *ids, uint32_t id)
{
    if (id < ids->first || id - ids->first >= ids->count)
        return;
    uint32_t i = id - ids->first;
    if (bit(ids, i)) {
        ids->used[i / 64] &= ~(1ull << (i % 64));
        ids->live--;
    }
}

size_t ids_live(const struct sbx_ids *ids) { return ids->live; }

uint32_t ids_next(const struct sbx_ids *ids) { return ids->first + ids->next; }

/* --- the host's user database ---------------------------------------------- */

/* Field n (0-based) of a ':'-separated line, as a number; false if absent
 * or not a number. */
static bool field_u64(const char *line, unsigned n, uint64_t *out)
{
    const char *s = line;
    for (unsigned i = 0; i < n; i++) {
        s = strchr(s, ':');
        if (!s)
            return false;
        s++;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno || (*end && *end != ':' && *end != '\n'))
        return false;
    *out = v;
    return true;
}

/* Scan etc_dir/name for an id (field id_field) or, with count_field, a range
 * [field, field + count) that meets [first, first + count). */
static int check_file(const char *etc_dir, const char *name, unsigned id_field,
                      int count_field, uint32_t first, uint32_t count, char *err,
                      size_t errlen)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", etc_dir, name);
    FILE *f = fopen(path, "re");
    if (!f) {
        if (errno == ENOENT)
            return 0;
        int e = errno;
        return err_fmt(err, errlen, -e, "%s: %s", path, strerror(e));
    }
    uint64_t lo = first, hi = (uint64_t)first + count; /* [lo, hi) */
    char line[4096];
    unsigned lineno = 0;
    int r = 0;
    while (r == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        uint64_t a, n = 1;
        if (line[0] == '#' || !field_u64(line, id_field, &a))
            continue;
        if (count_field >= 0 && !field_u64(line, (unsigned)count_field, &n))
            continue;
        if (a < hi && a + n > lo) {
            snprintf(err, errlen, "%s:%u: the host already uses id %" PRIu64 "%s inside "
                     "--id-range %" PRIu32 ":%" PRIu32 "; give forkboxd a range of its own",
                     path, lineno, a, n > 1 ? " (and the ids after it)" : "", first, count);
            r = -EEXIST;
        }
    }
    fclose(f);
    return r;
}

int ids_check_host(const char *etc_dir, uint32_t first, uint32_t count, char *err,
                   size_t errlen)
{
    /* passwd: name:pw:uid:gid:...; group: name:pw:gid:...;
     * subuid/subgid: name:start:count. */
    int r = check_file(etc_dir, "passwd", 2, -1, first, count, err, errlen);
    if (r == 0)
        r = check_file(etc_dir, "passwd", 3, -1, first, count, err, errlen);
    if (r == 0)
        r = check_file(etc_dir, "group", 2, -1, first, count, err, errlen);
    if (r == 0)
        r = check_file(etc_dir, "subuid", 1, 2, first, count, err, errlen);
    if (r == 0)
        r = check_file(etc_dir, "subgid", 1, 2, first, count, err, errlen);
    return r;
}
