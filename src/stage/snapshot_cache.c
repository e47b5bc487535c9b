/* The snapshot's member cache: the gzip members of the last snapshot,
 * kept with what proves each file unchanged (struct snap_key), so that the
 * next snapshot copies them instead of compressing the files again. Runs in
 * the sandbox child, between its blocks.
 *
 * snapshot.c walks the tree and asks this file, file by file, for the
 * member it kept (cache_find) and to keep the new one (cache_keep); both
 * lists are in the walk's order.
 */
#include "stage/archive.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <zlib.h>

#include "core/util.h"
#include "stage/archive_int.h"

struct snapshot_cache *snapshot_cache_new(uint64_t max_bytes)
{
    struct snapshot_cache *c = calloc(1, sizeof *c);

    if (c)
        c->max_bytes = max_bytes;
    return c;
}

void entries_free(struct snap_entry *e, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(e[i].path);
        free(e[i].gz);
    }
    free(e);
}

void snapshot_cache_clear(struct snapshot_cache *c)
{
    if (!c)
        return;
    entries_free(c->e, c->n);
    c->e = NULL;
    c->n = c->cap = 0;
    c->bytes = 0;
}

void snapshot_cache_free(struct snapshot_cache *c)
{
    snapshot_cache_clear(c);
    free(c);
}

/* The walk's order (names sorted with strcmp in each directory, depth
 * first): byte order with '/' below every other byte (a name holds no NUL,
 * so '/' as 0 is exact) and a path before the paths it prefixes. A wrong
 * answer here would only cost reuse, never correctness: a member is reused
 * only for the very same path and key. */
static int walk_cmp(const char *a, const char *b)
{
    for (;; a++, b++) {
        unsigned ca = (unsigned char)*a, cb = (unsigned char)*b;

        if (!ca || !cb)
            return ca == cb ? 0 : ca ? 1 : -1;
        ca = ca == '/' ? 0 : ca;
        cb = cb == '/' ? 0 : cb;
        if (ca != cb)
            return ca < cb ? -1 : 1;
    }
}

static bool key_eq(const struct snap_key *a, const struct snap_key *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mode == b->mode &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec &&
           a->ctime.tv_sec == b->ctime.tv_sec && a->ctime.tv_nsec == b->ctime.tv_nsec;
}

struct snap_key key_of(const struct stat *sb)
{
    struct snap_key k = {
        .dev = sb->st_dev, .ino = sb->st_ino, .size = sb->st_size, .mode = sb->st_mode,
        .mtime = sb->st_mtim, .ctime = sb->st_ctim,
    };
    return k;
}

/* The cached member for path with this key, or NULL. Entries before path
 * are passed for good (both lists are in walk order). */
struct snap_entry *cache_find(struct snap *s, const char *path, const struct snap_key *k)
{
    struct snapshot_cache *c = s->cache;

    if (!c || s->no_reuse)
        return NULL;
    while (s->cur < c->n) {
        struct snap_entry *e = &c->e[s->cur];
        int cmp = walk_cmp(e->path, path);

        if (cmp > 0)
            return NULL;
        s->cur++;
        if (cmp == 0)
            return key_eq(&e->key, k) ? e : NULL;
    }
    return NULL;
}

/* Keep (path, key, member) for the next snapshot, taking gz: true. Over
 * the cap, or out of memory: false, and gz is still the caller's. racy and
 * crc: see struct snap_entry. */
bool cache_keep(struct snap *s, const char *path, const struct snap_key *k, uint8_t *gz,
                       size_t gz_len, bool racy, uint32_t crc)
{
    char *p;

    if (s->next_bytes + gz_len > s->cache->max_bytes)
        return false;
    if (GROW_ARRAY(s->next, &s->next_cap, s->next_n + 1, 64, SIZE_MAX) < 0)
        return false;
    p = strdup(path);
    if (!p)
        return false;
    s->next[s->next_n++] = (struct snap_entry){
        .path = p, .key = *k, .gz = gz, .gz_len = gz_len, .racy = racy, .data_crc = crc};
    s->next_bytes += gz_len;
    s->st->cached++;
    return true;
}

/* Whether a member compressed now may be reused later: no process maps the
 * file shared and writable (a write through a page already mapped writable
 * changes the data without touching the times). */
bool cacheable(const struct snap *s, const struct snap_key *k)
{
    if (s->no_reuse)
        return false;
    for (size_t i = 0; i < s->mapped_n; i++)
        if (s->mapped[i].dev == k->dev && s->mapped[i].ino == k->ino)
            return false;
    return true;
}

/* Whether the file's ctime is in the clock tick this snapshot began in, or
 * later: a write in the same tick as the one we saw could leave the key
 * unchanged (any later write moves ctime). Such a member is kept racy: its
 * data is compared before it is reused (git's "racily clean" entries). A
 * file written just before its block ended, the common case, is then not
 * compressed twice. */
bool racy_now(const struct snap *s, const struct snap_key *k)
{
    return k->ctime.tv_sec > s->t0.tv_sec ||
           (k->ctime.tv_sec == s->t0.tv_sec && k->ctime.tv_nsec >= s->t0.tv_nsec);
}

/* CRC-32 of fd's first size bytes (read with pread: the offset is left for
 * the writer), or false if they cannot all be read. */
bool data_crc_of(struct snap *s, int fd, uint64_t size, uint32_t *crc)
{
    uint32_t c = (uint32_t)crc32(0L, Z_NULL, 0);
    for (uint64_t off = 0; off < size;) {
        size_t want = size - off < SNAPSHOT_IO_CHUNK ? (size_t)(size - off) : SNAPSHOT_IO_CHUNK;
        ssize_t got;
        do
            got = pread(fd, s->io, want, (off_t)off);
        while (got < 0 && errno == EINTR);
        if (got <= 0)
            return false;
        c = (uint32_t)crc32(c, s->io, (uInt)got);
        off += (uint64_t)got;
    }
    *crc = c;
    return true;
}

/* Every (device, inode) that a process of the sandbox maps shared and
 * writable, from /proc/<pid>/maps. If one of them cannot be read (another
 * process that is not dumpable), reuse is off for this snapshot. Pid 1 is
 * not read: in a sandbox it is init, which shares the runtime's address
 * space (docs/internals.md, "Init and runtime"), so the runtime's own maps
 * cover it; outside one (--no-isolation, tests) it is the host's init,
 * whose maps only root may read and which maps nothing of a workspace. */
void scan_mappings(struct snap *s)
{
    DIR *d = opendir("/proc");
    struct dirent *de;
    if (!d) {
        s->no_reuse = true;
        return;
    }
    while (!s->no_reuse && (de = readdir(d))) {
        char path[64], line[512];
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        FILE *f;

        if (*end || pid <= 1)
            continue;
        snprintf(path, sizeof path, "/proc/%ld/maps", pid);
        f = fopen(path, "re");
        if (!f) {
            if (errno != ENOENT && errno != ESRCH)
                s->no_reuse = true; /* gone: fine; unreadable: unknown */
            continue;
        }
        while (fgets(line, sizeof line, f)) {
            unsigned long maj, min, ino;
            char perms[8];
            size_t ll = strlen(line);

            /* start-end perms offset maj:min inode [path] */
            if (sscanf(line, "%*s %7s %*s %lx:%lx %lu", perms, &maj, &min, &ino) == 4 &&
                perms[1] == 'w' && perms[3] == 's' && ino != 0) {
                if (GROW_ARRAY(s->mapped, &s->mapped_cap, s->mapped_n + 1, 16, SIZE_MAX) < 0) {
                    s->no_reuse = true;
                    break;
                }
                s->mapped[s->mapped_n++] = (struct snap_key){
                    .dev = makedev(maj, min), .ino = (ino_t)ino};
            }
            /* A line longer than the buffer (a long path): skip its rest. */
            while (ll && line[ll - 1] != '\n' && fgets(line, sizeof line, f))
                ll = strlen(line);
        }
        /* A process that exited while its maps were read (ESRCH) maps
         * nothing any more; any other error leaves its mappings unknown. */
        if (ferror(f) && errno != ESRCH && errno != ENOENT)
            s->no_reuse = true;
        fclose(f);
    }
    closedir(d);
}
