/* The snapshot: the archive of a sandbox's /workspace at the end of each
 * block (spec 4.3), written as the pieces of a vector the runtime sends
 * without copying. Runs in the sandbox child, after isolation; the fork
 * server makes the archive of an empty tree once (archive_snapshot_prepare)
 * and every sandbox inherits it.
 *
 * libarchive only produces the tar headers here. It never touches the
 * filesystem: the snapshot walks the tree with openat/fdopendir, never
 * following a link.
 *
 * Relies on snapshot_cache.c for the members kept from the last snapshot
 * (cache_find, cache_keep) and for what may be kept (the mappings, the racy
 * clock tick).
 *
 * Why the snapshot is written this way (issue 13):
 *   - one gzip member per file, so a file's compressed entry can be kept and
 *     copied into the next snapshot while the file is unchanged: a block
 *     that changes nothing costs a walk and a copy, not a compression of the
 *     whole workspace. A gzip stream may be members back to back (RFC 1952
 *     2.2); CPython's gzip and libarchive read them as one stream.
 *   - libarchive still writes every tar header (the canonical subset the
 *     supervisor checks is what its restricted pax writer produces), but no
 *     compression: its output goes to our callback, which deflates it with
 *     zlib into the current member (libarchive's gzip filter writes one
 *     member per archive and cannot be restarted per entry).
 *   - level 1: ~4.5x faster than level 6 on text for ~12% more bytes; for a
 *     file whose first SNAPSHOT_SAMPLE bytes do not shrink by 1/16 at level
 *     1, level 0 (stored blocks: a copy and a CRC, ~20x cheaper than
 *     deflating data that does not compress). Decided per file: a file is
 *     mostly of one kind, and a sample costs only SNAPSHOT_SAMPLE bytes of
 *     level-1 work; a file that starts compressible and turns random later
 *     stays at level 1 (correct, only slower).
 *   - each member's header carries its own length and the SHA-256 of its
 *     bytes after the header (FEXTRA "FB", tarcheck.h), so that the
 *     supervisor can recognise a member it has verified earlier in the turn
 *     as it starts, and not inflate it again (it hashes it to hold it to
 *     that). A member kept for the next snapshot keeps its digest. */
#include "stage/archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <nettle/sha2.h>
#include <zlib.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/util.h"
#include "proto/tarcheck.h"
#include "stage/archive_int.h"
#define SNAPSHOT_MAX_DEPTH 256
/* The largest mtime the ustar field holds in octal with its terminator
 * (11 digits). Past it, or below 0, libarchive writes base-256, which the
 * supervisor's check refuses: the writer clamps instead. */
#define SNAPSHOT_MAX_MTIME 077777777777LL
/* The largest size the ustar field holds the same way (8 GiB - 1): beyond
 * it libarchive adds a pax "size" record. --snapshot-max is far below. */
#define SNAPSHOT_MAX_FILE 077777777777ULL

/* A file is sampled (its first bytes compressed at level 1 on the side) if
 * it has at least SNAPSHOT_SAMPLE_MIN bytes; smaller ones take level 1. */
#define SNAPSHOT_SAMPLE (16 * KiB)
#define SNAPSHOT_SAMPLE_MIN 512
#define SNAPSHOT_LEVEL 1
/* Room made in a member's buffer before each deflate call. */
#define GZW_ROOM (64 * KiB)

/* The archive of an empty tree, made once (archive_snapshot_prepare): most
 * blocks leave the workspace empty, and libarchive's gzip writer takes ~0.1
 * ms and ~40 fresh pages (zlib's deflate state) to say so. Made in the fork
 * server, every sandbox inherits it; a host that sends it back as the next
 * workspace has nothing to extract either. */
struct buf empty_tree = {0};

/* libarchive's pax writer converts names from the thread's locale to UTF-8;
 * in the C locale a non-ASCII name fails and it writes hdrcharset=BINARY,
 * which the supervisor refuses. The writer runs under this locale instead
 * (uselocale: per thread, so user code calling setlocale() changes nothing),
 * made in the fork server by archive_snapshot_prepare() or on first use. */
static locale_t utf8_locale = (locale_t)0;

static locale_t snapshot_locale(void)
{
    if (utf8_locale == (locale_t)0)
        utf8_locale = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    return utf8_locale;
}

/* Names the supervisor's check accepts (tarcheck_path_ok: valid UTF-8,
 * clean, at most SNAPSHOT_MAX_PATH bytes); without a UTF-8 locale, ASCII
 * only. A file whose name fails is skipped, a directory with its tree. */
static bool snap_name_ok(const struct snap *s, const char *path)
{
    size_t n = strlen(path);

    if (!tarcheck_path_ok(path, n, SNAPSHOT_MAX_PATH))
        return false;
    if (s->ascii_only)
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)path[i] >= 0x80)
                return false;
    return true;
}

/* ---- gzip members ------------------------------------------------------ */

static void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static int gzw_begin(struct gzw *g, int level)
{
    /* MTIME 0 (same tree, same bytes), XFL 0, OS 3 (Unix). */
    /* the length and the digest are filled in at the end (gzw_end) */
    static const uint8_t hdr[TARCHECK_GZ_HDR_LEN] = {
        0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 3, TARCHECK_GZ_XLEN, 0,
        TARCHECK_GZ_SI1, TARCHECK_GZ_SI2, TARCHECK_GZ_FB_LEN, 0,
    };

    if (!g->z_init) {
        if (deflateInit2(&g->z, level, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
            return -ENOMEM;
        g->z_init = true;
        g->level = level;
    } else {
        if (deflateReset(&g->z) != Z_OK)
            return -EIO;
        /* Right after a reset nothing is flushed: this only sets the level. */
        if (level != g->level && deflateParams(&g->z, level, Z_DEFAULT_STRATEGY) != Z_OK)
            return -EIO;
        g->level = level;
    }
    g->crc = (uint32_t)crc32(0, Z_NULL, 0);
    g->isize = 0;
    buf_reset(&g->m);
    return buf_append(&g->m, hdr, sizeof hdr);
}

static int gzw_deflate(struct gzw *g, const uint8_t *p, size_t n, int flush)
{
    g->z.next_in = (Bytef *)p;
    g->z.avail_in = (uInt)n;
    for (;;) {
        size_t room;
        int r = buf_reserve(&g->m, GZW_ROOM), zr;

        if (r < 0)
            return r;
        room = g->m.cap - g->m.len;
        if (room > UINT32_MAX)
            room = UINT32_MAX;
        g->z.next_out = g->m.data + g->m.len;
        g->z.avail_out = (uInt)room;
        zr = deflate(&g->z, flush);
        g->m.len += room - g->z.avail_out;
        if (zr == Z_STREAM_END)
            return 0;
        if (zr != Z_OK && zr != Z_BUF_ERROR)
            return -EIO;
        if (flush != Z_FINISH && g->z.avail_in == 0 && g->z.avail_out != 0)
            return 0;
    }
}

static int gzw_feed(struct gzw *g, const void *p, size_t n)
{
    g->crc = (uint32_t)crc32(g->crc, p, (uInt)n);
    g->isize += (uint32_t)n;
    return gzw_deflate(g, p, n, Z_NO_FLUSH);
}

/* Finish the member: trailer, and its length and digest in the header (the
 * SHA-256 of its bytes after the header: the supervisor knows a member it
 * checked before by it, and hashes the bytes to hold the member to it). */
static int gzw_end(struct gzw *g)
{
    uint8_t trl[8];
    int r = gzw_deflate(g, NULL, 0, Z_FINISH);

    if (r < 0)
        return r;
    put_le32(trl, g->crc);
    put_le32(trl + 4, g->isize);
    r = buf_append(&g->m, trl, sizeof trl);
    if (r < 0)
        return r;
    if (g->m.len > UINT32_MAX)
        return -EFBIG; /* never: a member holds at most one file of --snapshot-max */
    uint8_t *fb = g->m.data + TARCHECK_GZ_HDR_LEN - TARCHECK_GZ_FB_LEN;
    put_le32(fb, (uint32_t)g->m.len);
    if (g->level == 0)
        return 0; /* stored blocks: never looked up, the digest is not read (zeros) */
    struct sha256_ctx sha;
    sha256_init(&sha);
    sha256_update(&sha, g->m.len - TARCHECK_GZ_HDR_LEN, g->m.data + TARCHECK_GZ_HDR_LEN);
    sha256_digest(&sha, SHA256_DIGEST_SIZE, fb + 4);
    return 0;
}

static void gzw_free(struct gzw *g)
{
    if (g->z_init)
        deflateEnd(&g->z);
    g->z_init = false;
    buf_free(&g->m);
}

/* The level for a file that starts with p[0, n): 0 if level 1 does not
 * save a sixteenth of the sample. */
static int pick_level(struct snap *s, const uint8_t *p, size_t n)
{
    if (n > SNAPSHOT_SAMPLE)
        n = SNAPSHOT_SAMPLE;
    if (n < SNAPSHOT_SAMPLE_MIN)
        return SNAPSHOT_LEVEL;
    if (!s->probe_init) {
        if (deflateInit2(&s->probe, SNAPSHOT_LEVEL, Z_DEFLATED, -MAX_WBITS, 8,
                         Z_DEFAULT_STRATEGY) != Z_OK)
            return SNAPSHOT_LEVEL;
        s->probe_init = true;
        s->probe_cap = deflateBound(&s->probe, SNAPSHOT_SAMPLE);
        s->probe_out = malloc(s->probe_cap);
    } else if (deflateReset(&s->probe) != Z_OK) {
        return SNAPSHOT_LEVEL;
    }
    if (!s->probe_out)
        return SNAPSHOT_LEVEL;
    s->probe.next_in = (Bytef *)p;
    s->probe.avail_in = (uInt)n;
    s->probe.next_out = s->probe_out;
    s->probe.avail_out = (uInt)s->probe_cap;
    if (deflate(&s->probe, Z_FINISH) != Z_STREAM_END)
        return SNAPSHOT_LEVEL;
    return s->probe.total_out * 16 > n * 15 ? 0 : SNAPSHOT_LEVEL;
}

/* libarchive's output: the tar stream, into the member being written. */
static la_ssize_t snap_write(struct archive *a, void *client, const void *buff, size_t n)
{
    struct snap *s = client;
    int rc = gzw_feed(&s->gz, buff, n);

    if (rc < 0) {
        if (!s->out_err)
            s->out_err = rc;
        archive_set_error(a, -rc, "snapshot output: %s", strerror(-rc));
        return -1;
    }
    return (la_ssize_t)n;
}

static int snap_error(struct snap *s)
{
    return s->out_err ? s->out_err : -EIO;
}

/* ---- output ------------------------------------------------------------- */

static int emit(struct snap *s, const uint8_t *p, size_t off, size_t len)
{
    struct piece *last = s->pc_n ? &s->pc[s->pc_n - 1] : NULL;

    if (!p && last && !last->p && last->off + last->len == off) {
        last->len += len; /* contiguous in extra: one piece */
        return 0;
    }
    int r = GROW_ARRAY(s->pc, &s->pc_cap, s->pc_n + 1, 64, SIZE_MAX);

    if (r < 0)
        return r;
    s->pc[s->pc_n++] = (struct piece){.p = p, .off = off, .len = len};
    return 0;
}

/* A copy of p[0, n) in extra, as the next piece. */
static int emit_copy(struct snap *s, const uint8_t *p, size_t n)
{
    size_t off = s->out->extra.len;
    int r = buf_append(&s->out->extra, p, n);

    return r < 0 ? r : emit(s, NULL, off, n);
}

static ssize_t read_some(int fd, void *p, size_t n)
{
    ssize_t r;

    do
        r = read(fd, p, n);
    while (r < 0 && errno == EINTR);
    return r;
}

/* One regular file, opened by name from its directory. Whatever goes wrong
 * with the file itself only skips it; only the archive or out failing is
 * fatal. */
static int snap_file(struct snap *s, int dirfd, const char *name, const char *path)
{
    _cleanup_close_ int fd = -1;
    struct stat sb;
    struct snap_key key;
    struct snap_entry *hit;
    uint64_t size, left;
    ssize_t first = 0;
    int r;

    /* O_NONBLOCK: if a FIFO replaced the file since the listing, opening it
     * must not hang; the fstat below then rejects it. */
    fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
        s->st->skipped++;
        return 0;
    }
    size = sb.st_size > 0 ? (uint64_t)sb.st_size : 0;
    if (size > s->max_bytes - s->st->bytes || size > SNAPSHOT_MAX_FILE) {
        s->st->over_cap++;
        return 0;
    }
    key = key_of(&sb);
    hit = cache_find(s, path, &key);
    uint32_t crc = 0;
    if (hit && hit->racy && (!data_crc_of(s, fd, size, &crc) || crc != hit->data_crc))
        hit = NULL; /* written in the tick its member was made in: compressed again */
    if (hit) {
        /* The same file, unchanged since its member was made: the member
         * (header and data) is what compressing it again would give. A racy
         * one whose data matched stays racy only if ctime is still fresh. */
        if (cache_keep(s, path, &key, hit->gz, hit->gz_len, hit->racy && racy_now(s, &key),
                       hit->data_crc)) {
            r = emit(s, hit->gz, 0, hit->gz_len); /* not copied */
            hit->gz = NULL;                        /* the new entry's now */
        } else {
            r = emit_copy(s, hit->gz, hit->gz_len); /* freed with the old entries */
        }
        if (r < 0)
            return r;
        s->st->files++;
        s->st->bytes += size;
        s->st->reused++;
        s->st->reused_bytes += hit->gz_len;
        return 0;
    }
    /* Read before the header is out: a file that cannot be read at all is
     * skipped cleanly. After the header, its size is a promise. */
    if (size > 0) {
        first = read_some(fd, s->io, size < SNAPSHOT_IO_CHUNK ? size : SNAPSHOT_IO_CHUNK);
        if (first < 0) {
            s->st->skipped++;
            return 0;
        }
    }
    int level = pick_level(s, s->io, (size_t)first);
    bool racy = s->cache && racy_now(s, &key);
    crc = (uint32_t)crc32(0L, Z_NULL, 0);

    r = gzw_begin(&s->gz, level);
    if (r < 0)
        return r;

    /* Exactly what the supervisor's check accepts (proto/tarcheck.h): mode
     * rw-r--r-- plus the file's execute bits, never setuid/setgid/sticky or
     * group/other write (the host applies the mode bits); owner 0 with no
     * names; an mtime the ustar field holds in octal. */
    time_t mtime = sb.st_mtim.tv_sec;
    long nsec = sb.st_mtim.tv_nsec;

    if (mtime < 0 || mtime > SNAPSHOT_MAX_MTIME) {
        mtime = mtime < 0 ? 0 : SNAPSHOT_MAX_MTIME;
        nsec = 0;
    }
    archive_entry_clear(s->e);
    archive_entry_copy_pathname(s->e, path);
    archive_entry_set_filetype(s->e, AE_IFREG);
    archive_entry_set_perm(s->e, (0644 | sb.st_mode) & 0755);
    archive_entry_set_size(s->e, (la_int64_t)size);
    archive_entry_set_mtime(s->e, mtime, nsec);
    archive_entry_set_uid(s->e, 0);
    archive_entry_set_gid(s->e, 0);
    r = archive_write_header(s->a, s->e);
    if (r == ARCHIVE_FAILED) {
        /* This entry only (e.g. a name the format cannot hold); the member
         * begun for it is dropped. */
        s->st->skipped++;
        return 0;
    }
    if (r < ARCHIVE_WARN)
        return snap_error(s);
    if (r == ARCHIVE_WARN) {
        /* A name libarchive could not convert to UTF-8 despite the checks
         * above: the header it wrote says hdrcharset=BINARY and the whole
         * snapshot would be refused. Fail it here instead (the host then
         * keeps its files, and the block's stderr says why). */
        return -EILSEQ;
    }

    /* Exactly `size` bytes: a file that grew is cut, one that shrank (or
     * stopped being readable) is padded with zeros. */
    left = size;
    while (left > 0) {
        size_t n;

        if (first > 0) {
            n = (size_t)first < left ? (size_t)first : (size_t)left;
            first = 0;
        } else {
            ssize_t got = fd >= 0 ? read_some(fd, s->io, left < SNAPSHOT_IO_CHUNK
                                                             ? left
                                                             : SNAPSHOT_IO_CHUNK)
                                  : 0;

            if (got <= 0) {
                close_and_reset(&fd); /* pad from here on */
                n = left < SNAPSHOT_IO_CHUNK ? left : SNAPSHOT_IO_CHUNK;
                memset(s->io, 0, n);
            } else {
                n = (size_t)got;
            }
        }
        if (racy)
            crc = (uint32_t)crc32(crc, s->io, (uInt)n);
        if (archive_write_data(s->a, s->io, n) < 0)
            return snap_error(s);
        left -= n;
    }
    /* The entry's padding, into this member. */
    if (archive_write_finish_entry(s->a) != ARCHIVE_OK)
        return snap_error(s);
    r = gzw_end(&s->gz);
    if (r < 0)
        return r;
    s->st->files++;
    s->st->bytes += size;
    s->st->stored += level == 0;
    if (s->cache && cacheable(s, &key) &&
        cache_keep(s, path, &key, s->gz.m.data, s->gz.m.len, racy, crc)) {
        size_t len;
        uint8_t *gz = buf_steal(&s->gz.m, &len); /* now the cache's */

        return emit(s, gz, 0, len);
    }
    return emit_copy(s, s->gz.m.data, s->gz.m.len);
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* Every name in the directory but "." and "..", sorted (deterministic
 * archives). On error, the names read so far are freed. */
static int list_dir(DIR *d, char ***names_out, size_t *n_out)
{
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;

    for (;;) {
        errno = 0;
        de = readdir(d);
        if (!de)
            break;
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (GROW_ARRAY(names, &cap, n + 1, 16, SIZE_MAX) < 0)
            goto nomem;
        names[n] = strdup(de->d_name);
        if (!names[n])
            goto nomem;
        n++;
    }
    if (errno) {
        int err = errno;

        free_names(names, n);
        return -err;
    }
    if (n > 1)
        qsort(names, n, sizeof *names, cmp_names);
    *names_out = names;
    *n_out = n;
    return 0;
nomem:
    free_names(names, n);
    return -ENOMEM;
}

static char *join(const char *prefix, const char *name)
{
    char *p;

    if (!prefix[0])
        return strdup(name);
    if (asprintf(&p, "%s/%s", prefix, name) < 0)
        return NULL;
    return p;
}

/* Walk the directory fd (owned) whose path relative to root is prefix.
 * Returns 0, or a fatal -errno (archive/output failure, ENOMEM; and any
 * failure to list the root itself). */
static int snap_dir(struct snap *s, int fd, const char *prefix, unsigned depth)
{
    DIR *d = fdopendir(fd);
    char **names = NULL;
    size_t n = 0;
    int rc;

    if (!d) {
        rc = -errno;
        close(fd);
        return depth == 0 ? rc : (s->st->skipped++, 0);
    }
    rc = list_dir(d, &names, &n);
    if (rc < 0) {
        closedir(d);
        if (rc == -ENOMEM || depth == 0)
            return rc;
        s->st->skipped++;
        return 0;
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        _cleanup_free_ char *path = join(prefix, names[i]);
        struct stat sb;

        if (!path) {
            rc = -ENOMEM;
            break;
        }
        if (fstatat(dirfd(d), names[i], &sb, AT_SYMLINK_NOFOLLOW) < 0) {
            s->st->skipped++; /* vanished */
        } else if ((S_ISREG(sb.st_mode) || S_ISDIR(sb.st_mode)) && !snap_name_ok(s, path)) {
            s->st->skipped++; /* a name the supervisor would refuse */
            s->st->bad_names++;
        } else if (S_ISREG(sb.st_mode)) {
            rc = snap_file(s, dirfd(d), names[i], path);
        } else if (S_ISDIR(sb.st_mode)) {
            int cfd;

            if (depth + 1 >= SNAPSHOT_MAX_DEPTH) {
                s->st->skipped++;
                continue;
            }
            cfd = openat(dirfd(d), names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (cfd < 0)
                s->st->skipped++;
            else
                rc = snap_dir(s, cfd, path, depth + 1);
        } else {
            s->st->skipped++; /* symlink, FIFO, socket, device */
        }
    }
    free_names(names, n);
    closedir(d);
    return rc;
}

/* The archive of the directory fd (owned), or of an empty tree (fd -1). */
static int snapshot_write(struct snap *s, int fd)
{
    locale_t loc = snapshot_locale(), saved = (locale_t)0;
    int rc;

    if (loc != (locale_t)0)
        saved = uselocale(loc);
    else
        s->ascii_only = true;
    buf_init(&s->gz.m, CHAN_MAX_MESSAGE_BYTES);
    if (s->cache) {
        clock_gettime(CLOCK_REALTIME_COARSE, &s->t0);
        scan_mappings(s);
    }
    s->io = malloc(SNAPSHOT_IO_CHUNK);
    s->a = archive_write_new();
    s->e = archive_entry_new();
    if (!s->io || !s->a || !s->e ||
        archive_write_set_format_pax_restricted(s->a) != ARCHIVE_OK) {
        rc = -ENOMEM;
        goto out;
    }
    /* No blocking: every byte libarchive writes reaches snap_write at once,
     * so each entry's bytes land in its own member, and nothing pads the
     * stream after the end blocks. */
    archive_write_set_bytes_per_block(s->a, 0);
    if (archive_write_open(s->a, s, NULL, snap_write, NULL) != ARCHIVE_OK) {
        rc = snap_error(s);
        goto out;
    }
    rc = fd >= 0 ? snap_dir(s, fd, "", 0) : 0;
    fd = -1; /* snap_dir closed it */
    /* The end-of-archive blocks in a last member of their own. */
    if (rc == 0)
        rc = gzw_begin(&s->gz, SNAPSHOT_LEVEL);
    if (rc == 0 && archive_write_close(s->a) != ARCHIVE_OK)
        rc = snap_error(s);
    if (rc == 0)
        rc = gzw_end(&s->gz);
    if (rc == 0)
        rc = emit_copy(s, s->gz.m.data, s->gz.m.len);
out:
    if (fd >= 0)
        close(fd);
    if (s->e)
        archive_entry_free(s->e);
    if (s->a)
        archive_write_free(s->a);
    free(s->io);
    gzw_free(&s->gz);
    if (s->probe_init)
        deflateEnd(&s->probe);
    free(s->probe_out);
    free(s->mapped);
    if (s->cache) {
        /* This snapshot's members replace the last one's; after an error
         * nothing is kept. */
        snapshot_cache_clear(s->cache);
        if (rc == 0) {
            s->cache->e = s->next;
            s->cache->n = s->next_n;
            s->cache->cap = s->next_cap;
            s->cache->bytes = s->next_bytes;
        } else {
            entries_free(s->next, s->next_n);
            s->st->cached = 0;
        }
    }
    if (saved != (locale_t)0)
        uselocale(saved);
    return rc;
}

/* 1 if the directory fd has no entry but . and .., 0 if it has, or -errno;
 * fd is back at its start after. */
static int dir_is_empty(int fd)
{
    char b[1024] __attribute__((aligned(8)));
    ssize_t n;
    int empty = 1;

    while (empty == 1 && (n = getdents64(fd, b, sizeof b)) > 0)
        for (ssize_t off = 0; off < n;) {
            const struct dirent64 *d = (const void *)(b + off);
            if (strcmp(d->d_name, ".") != 0 && strcmp(d->d_name, "..") != 0) {
                empty = 0;
                break;
            }
            off += d->d_reclen;
        }
    if (empty == 1 && n < 0)
        empty = -errno;
    if (lseek(fd, 0, SEEK_SET) < 0 && empty >= 0)
        empty = -errno;
    return empty;
}

void snapshot_iov_free(struct snapshot_iov *o)
{
    free(o->iov);
    o->iov = NULL;
    o->n = 0;
    o->len = 0;
    buf_free(&o->extra);
}

/* The pieces as iovecs, now that extra has stopped moving. */
static int pieces_to_iov(struct snap *s)
{
    struct snapshot_iov *o = s->out;

    o->iov = calloc(s->pc_n ? s->pc_n : 1, sizeof *o->iov);
    if (!o->iov)
        return -ENOMEM;
    for (size_t i = 0; i < s->pc_n; i++) {
        const struct piece *pc = &s->pc[i];

        o->iov[i].iov_base = (void *)(pc->p ? pc->p : o->extra.data + pc->off);
        o->iov[i].iov_len = pc->len;
        o->len += pc->len;
    }
    o->n = s->pc_n;
    return 0;
}

int archive_snapshot_iov(int root_fd, uint64_t max_bytes, struct snapshot_cache *cache,
                         struct snapshot_iov *out, struct snapshot_stats *st)
{
    struct snapshot_stats local;
    struct snap s = { .out = out, .max_bytes = max_bytes, .st = st ? st : &local,
                      .cache = cache };
    int fd, rc;

    memset(s.st, 0, sizeof *s.st);
    snapshot_iov_free(out);
    buf_init(&out->extra, CHAN_MAX_MESSAGE_BYTES);
    fd = openat(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
        snapshot_cache_clear(cache);
        return rc;
    }
    rc = dir_is_empty(fd);
    if (rc != 0 && empty_tree.len) {
        /* Empty, or an error: no walk. */
        close(fd);
        snapshot_cache_clear(cache);
        if (rc < 0)
            return rc;
        rc = emit(&s, empty_tree.data, 0, empty_tree.len);
    } else if (rc < 0) {
        close(fd);
        snapshot_cache_clear(cache);
        return rc;
    } else {
        rc = snapshot_write(&s, fd);
    }
    if (rc == 0)
        rc = pieces_to_iov(&s);
    free(s.pc);
    if (rc < 0)
        snapshot_iov_free(out);
    return rc;
}

int archive_snapshot_cached(int root_fd, uint64_t max_bytes, struct snapshot_cache *cache,
                            struct buf *out, struct snapshot_stats *st)
{
    struct snapshot_iov o = {0};
    int rc = archive_snapshot_iov(root_fd, max_bytes, cache, &o, st);

    if (rc == 0)
        rc = buf_reserve(out, (size_t)o.len);
    for (size_t i = 0; rc == 0 && i < o.n; i++)
        rc = buf_append(out, o.iov[i].iov_base, o.iov[i].iov_len);
    snapshot_iov_free(&o);
    return rc;
}

int archive_snapshot(int root_fd, uint64_t max_bytes, struct buf *out,
                     struct snapshot_stats *st)
{
    return archive_snapshot_cached(root_fd, max_bytes, NULL, out, st);
}

int archive_snapshot_prepare(void)
{
    (void)snapshot_locale(); /* here, while the fork server can read locales */
    if (empty_tree.len)
        return 0;
    struct snapshot_stats st = {0};
    struct snapshot_iov o = {0};
    struct snap s = { .out = &o, .max_bytes = 0, .st = &st };
    int rc;

    buf_init(&o.extra, 4096);
    rc = snapshot_write(&s, -1);
    buf_init(&empty_tree, 4096);
    if (rc == 0 && s.pc_n == 1 && !s.pc[0].p)
        rc = buf_move(&empty_tree, &o.extra);
    else if (rc == 0)
        rc = -EIO; /* never: the end member is one piece in extra */
    free(s.pc);
    snapshot_iov_free(&o);
    return rc;
}
