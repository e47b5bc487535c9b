/* Archives in and out of a sandbox (spec 4), with libarchive.
 *
 * libarchive only parses and produces the tar stream here. It never touches
 * the filesystem: archive_write_disk would resolve paths by itself, with
 * check-then-write windows and root-only ownership logic. Extraction writes
 * every member with openat2(RESOLVE_BENEATH) from the destination fd, and the
 * snapshot walks the tree with openat/fdopendir, never following a link.
 *
 * Where extraction differs from the reference filter (spec 4.2), always on
 * the safe side or by what libarchive lets us see:
 *   - libarchive does not expose the raw typeflag. It applies the POSIX rule
 *     "unknown type = regular file", gives a type-0 header's link name to no
 *     one, and calls a type-0 name ending in '/' (or GNU 'D') a directory.
 *     Such members are extracted as those kinds, through the same checks and
 *     mode masking as any other; the reference would drop the first two.
 *   - A symlink already at a member's final name is never written through
 *     (O_NOFOLLOW): the member is dropped, even if the link points inside.
 *   - RESOLVE_BENEATH refuses absolute symlinks, so an absolute link on disk
 *     is not followed even when it points back inside dest: dropped.
 *   - Directories that exist already keep their mode; directory mtimes are
 *     not applied (the snapshot carries no directories anyway).
 *   - Members that cannot be placed (a file where a directory is needed or
 *     the reverse, a name too long) are dropped instead of ending the turn.
 *   - libarchive does not check the gzip CRC; a corrupt deflate stream or a
 *     truncation before the tar end marker is an error (-EBADMSG).
 */
#include "stage/archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <locale.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>
#include <nettle/sha2.h>
#include <zlib.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/util.h"
#include "proto/tarcheck.h"

/* Compressed bytes handed to libarchive per read callback. The callback is
 * where the decompressed-stream budget is enforced (see struct src), so this
 * bounds how far past the budget one inflate step can run: ~1032x at most. */
#define EXTRACT_READ_CHUNK (16 * KiB)
/* Decompressed tar bytes allowed per member on top of max_unpacked: headers,
 * pax records, padding, and the data of members the filter drops. */
#define EXTRACT_HEADER_ALLOWANCE (8 * KiB)
/* One libarchive header call may chain up to 32 special headers of <= 1 MiB. */
#define EXTRACT_STREAM_SLACK (64 * MiB)

#define SNAPSHOT_MAX_DEPTH 256
#define SNAPSHOT_IO_CHUNK (64 * KiB)
/* The largest mtime the ustar field holds in octal with its terminator
 * (11 digits). Past it, or below 0, libarchive writes base-256, which the
 * supervisor's check refuses: the writer clamps instead. */
#define SNAPSHOT_MAX_MTIME 077777777777LL
/* The largest size the ustar field holds the same way (8 GiB - 1): beyond
 * it libarchive adds a pax "size" record. --snapshot-max is far below. */
#define SNAPSHOT_MAX_FILE 077777777777ULL

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

static int sys_openat2(int dirfd, const char *path, int flags, mode_t mode)
{
    struct open_how how = {
        .flags = (uint64_t)flags,
        .mode = (flags & O_CREAT) ? mode : 0,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
    };
    int fd;

    do
        fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
    while (fd < 0 && errno == EINTR);
    return fd;
}

/* ------------------------------------------------------------------------ */
/* Extraction                                                                */
/* ------------------------------------------------------------------------ */

/* Outcome of placing one member: 0 written, SKIP dropped, < 0 fatal -errno. */
#define SKIP 1

/* Errors that mean "this member cannot be placed where its name says", as
 * opposed to the filesystem failing: the member is dropped, like the spec's
 * filter drops members that resolve outside dest. EXDEV/ELOOP/EAGAIN come from
 * RESOLVE_BENEATH refusing an escape (or a racing rename), ENOTDIR/EISDIR/
 * EEXIST from a file where a directory is needed or the reverse, ENXIO from a
 * FIFO without a reader sitting at the name. */
static bool is_placement_error(int err)
{
    switch (err) {
    case EXDEV:
    case ELOOP:
    case EAGAIN:
    case ENOTDIR:
    case EISDIR:
    case EEXIST:
    case ENOENT:
    case ENAMETOOLONG:
    case ENXIO:
    case ETXTBSY:
    case EOPNOTSUPP:
        return true;
    default:
        return false;
    }
}

static int placement(int err)
{
    return is_placement_error(err) ? SKIP : -err;
}

/* Spec 4.2 steps 3 and 4, in place. Collapses "//" and ".", resolves ".."
 * against the preceding segment (lexically, as os.path.normpath does), strips
 * a trailing '/'. Returns false if the member must be dropped: absolute, or
 * the result starts with ".." (which also catches "..cfg" and any ".."
 * segment, since normalisation only leaves them at the front). An empty
 * result ("." or "a/..") becomes "". */
static bool normalise_path(char *path)
{
    char *out = path, *p = path;

    if (path[0] == '/')
        return false;
    while (*p) {
        char *seg = p;
        size_t n;

        while (*p && *p != '/')
            p++;
        n = (size_t)(p - seg);
        while (*p == '/')
            p++;
        if (n == 0 || (n == 1 && seg[0] == '.'))
            continue;
        if (n == 2 && seg[0] == '.' && seg[1] == '.') {
            /* Pop the previous segment unless there is none, or it is a
             * ".." itself (then this one stays too and the path is
             * dropped below). */
            char *prev = out;

            while (prev > path && prev[-1] != '/')
                prev--;
            if (out > path && !(out - prev == 2 && prev[0] == '.' && prev[1] == '.')) {
                out = prev > path ? prev - 1 : path;
                continue;
            }
        }
        if (out > path)
            *out++ = '/';
        memmove(out, seg, n);
        out += n;
    }
    *out = '\0';
    return strncmp(path, "..", 2) != 0;
}

struct extract_ctx {
    int dest_fd;                     /* borrowed */
    const struct archive_limits *lim;
    struct extract_stats *st;
    struct archive *a;
};

/* Make sure the directory `path` (normalised, relative, possibly "") exists
 * beneath dest, creating missing components with mode 0755. On 0, *dirfd is
 * an fd to it (owned by the caller; dest_fd itself is dup'ed for ""). Every
 * prefix is opened from dest_fd with RESOLVE_BENEATH, so a symlink on disk
 * is followed only while it stays inside dest (spec 4.2 step 5). */
static int ensure_dir(struct extract_ctx *x, char *path, int *dirfd)
{
    _cleanup_close_ int cur = -1;
    size_t len = strlen(path), i = 0;

    cur = fcntl(x->dest_fd, F_DUPFD_CLOEXEC, 3);
    if (cur < 0)
        return -errno;
    while (i < len) {
        size_t end = i;
        char saved;
        bool created;
        int next;

        while (end < len && path[end] != '/')
            end++;
        saved = path[end];
        path[end] = '\0';

        /* mkdirat never follows a symlink in its last component: an
         * existing link gives EEXIST and is resolved (beneath) below. */
        created = mkdirat(cur, path + i, 0755) == 0;
        if (!created && errno != EEXIST) {
            int err = errno;

            path[end] = saved;
            return placement(err);
        }
        if (created) {
            /* Our own new directory: open it for real (O_NOFOLLOW) to set
             * the mode without the umask; O_PATH fds refuse fchmod. */
            next = sys_openat2(x->dest_fd, path,
                               O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
            if (next >= 0 && fchmod(next, 0755) < 0) {
                int err = errno;

                close(next);
                path[end] = saved;
                return -err;
            }
            x->st->dirs++;
        } else {
            next = sys_openat2(x->dest_fd, path, O_PATH | O_DIRECTORY | O_CLOEXEC, 0);
        }
        path[end] = saved;
        if (next < 0)
            return placement(errno);
        close(cur);
        cur = next;
        i = end + 1;
    }
    *dirfd = steal_fd(&cur);
    return 0;
}

/* A directory member: create it and any missing parent, mode 0755. A
 * directory that already exists keeps its mode. */
static int extract_dir(struct extract_ctx *x, char *path)
{
    _cleanup_close_ int fd = -1;

    if (path[0] == '\0')
        return 0; /* dest itself */
    return ensure_dir(x, path, &fd);
}

static int pwrite_all(int fd, const void *p, size_t n, off_t off)
{
    const uint8_t *c = p;

    while (n > 0) {
        ssize_t w = pwrite(fd, c, n, off);

        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        c += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

/* Charge `end` (a file's new logical extent) against max_unpacked, given
 * that `*charged` bytes of this file were charged already. Holes count:
 * a sparse member cannot make a large file for free. */
static int charge(struct extract_ctx *x, uint64_t *charged, uint64_t end,
                  char *err, size_t errlen)
{
    uint64_t more;

    if (end <= *charged)
        return 0;
    more = end - *charged;
    if (more > x->lim->max_unpacked - x->st->bytes) {
        (void)err_fmt(err, errlen, 0, "archive unpacks to more than %llu bytes",
                (unsigned long long)x->lim->max_unpacked);
        return -EFBIG;
    }
    x->st->bytes += more;
    *charged = end;
    return 0;
}

static int archive_failure(struct archive *a, const char *what, char *err, size_t errlen)
{
    const char *why = archive_error_string(a);

    (void)err_fmt(err, errlen, 0, "corrupt gzip tar (%s): %s", what, why ? why : "unknown error");
    return -EBADMSG;
}

/* A regular-file member: write its data at its path beneath dest. */
static int extract_file(struct extract_ctx *x, struct archive_entry *e, char *path,
                        char *err, size_t errlen)
{
    _cleanup_close_ int dirfd = -1, fd = -1;
    mode_t mode = (archive_entry_perm(e) & 0777 & ~022) | 0600;
    int64_t size = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
    uint64_t charged = 0, extent = 0;
    char *slash = strrchr(path, '/');
    struct stat sb;
    int rc;

    if (path[0] == '\0')
        return SKIP; /* would be dest itself */
    if (size < 0)
        size = 0;
    /* Refuse a too-large member before writing any of it: a gzip bomb costs
     * one header, not a gigabyte of inflate and disk. */
    if ((uint64_t)size > x->lim->max_unpacked - x->st->bytes)
        return charge(x, &charged, (uint64_t)size, err, errlen);

    if (slash) {
        *slash = '\0';
        rc = ensure_dir(x, path, &dirfd);
        *slash = '/';
        if (rc != 0)
            return rc;
    }
    /* Resolved from dest_fd in one call: nothing can swap a component
     * between the check and the open. O_NOFOLLOW: a symlink at the final
     * name is never written through. O_NONBLOCK: a FIFO planted at the name
     * must not block us (it is rejected by the fstat below). */
    fd = sys_openat2(x->dest_fd, path,
                     O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC |
                         O_NOCTTY,
                     0600);
    if (fd < 0)
        return placement(errno);
    if (fstat(fd, &sb) < 0)
        return -errno;
    if (!S_ISREG(sb.st_mode))
        return SKIP;
    if (fchmod(fd, mode) < 0)
        return -errno;

    for (;;) {
        const void *block;
        size_t n;
        la_int64_t off;
        int r = archive_read_data_block(x->a, &block, &n, &off);

        if (r == ARCHIVE_EOF)
            break;
        if (r < ARCHIVE_WARN)
            return archive_failure(x->a, archive_entry_pathname(e), err, errlen);
        if (off < 0)
            return archive_failure(x->a, "negative data offset", err, errlen);
        if (n == 0)
            continue;
        rc = charge(x, &charged, sat_add((uint64_t)off, n), err, errlen);
        if (rc < 0)
            return rc;
        rc = pwrite_all(fd, block, n, (off_t)off);
        if (rc < 0)
            return rc;
        if ((uint64_t)off + n > extent)
            extent = (uint64_t)off + n;
    }
    /* A sparse file may end in a hole. */
    if ((uint64_t)size > extent) {
        rc = charge(x, &charged, (uint64_t)size, err, errlen);
        if (rc < 0)
            return rc;
        if (ftruncate(fd, (off_t)size) < 0)
            return -errno;
    }
    if (archive_entry_mtime_is_set(e)) {
        long nsec = archive_entry_mtime_nsec(e);
        struct timespec ts[2] = {
            { .tv_nsec = UTIME_OMIT },
            { .tv_sec = archive_entry_mtime(e),
              .tv_nsec = nsec >= 0 && nsec < 1000000000 ? nsec : 0 },
        };

        if (futimens(fd, ts) < 0)
            return -errno;
    }
    x->st->files++;
    return 0;
}

/* Spec 4.2 steps 1 and 2: what kind of member this is, from what libarchive
 * parsed. libarchive already maps tar types 0, NUL, 7 and GNU sparse to
 * AE_IFREG, 5 (and a NUL-type name ending in '/') to AE_IFDIR. */
enum member_kind { MEMBER_DROP, MEMBER_FILE, MEMBER_DIR };

static enum member_kind classify(struct archive_entry *e)
{
    const char *hl = archive_entry_hardlink(e), *sl = archive_entry_symlink(e);

    /* A hard link can come with data (pax) and then looks like AE_IFREG. */
    if ((hl && hl[0]) || (sl && sl[0]))
        return MEMBER_DROP;
    switch (archive_entry_filetype(e)) {
    case AE_IFREG:
        return MEMBER_FILE;
    case AE_IFDIR:
        return MEMBER_DIR;
    default:
        return MEMBER_DROP;
    }
}

/* Read callback state. Compressed bytes go to libarchive in small chunks so
 * that between two chunks we can look at how much decompressed tar stream
 * the format reader has consumed, and stop it. Without this, members the
 * filter drops (whose data libarchive skips by inflating it) and runs of
 * special headers would be free to inflate without bound. */
struct src {
    const uint8_t *data;
    size_t len, off;
    struct archive *a;
    uint64_t budget; /* decompressed tar bytes allowed */
    bool over;       /* budget exceeded: report -EFBIG */
};

static la_ssize_t src_read(struct archive *a, void *client, const void **buff)
{
    struct src *s = client;
    size_t n = s->len - s->off;
    la_int64_t pos = archive_filter_bytes(a, 0);

    if (pos > 0 && (uint64_t)pos > s->budget) {
        s->over = true;
        archive_set_error(a, EFBIG, "decompressed stream over budget");
        return -1;
    }
    if (n > EXTRACT_READ_CHUNK)
        n = EXTRACT_READ_CHUNK;
    *buff = s->data + s->off;
    s->off += n;
    return (la_ssize_t)n;
}

static int extract_loop(struct extract_ctx *x, struct src *s, char *err, size_t errlen)
{
    uint64_t members = 0;
    bool checked_filter = false;

    for (;;) {
        struct archive_entry *e;
        const char *name;
        _cleanup_free_ char *path = NULL;
        int r = archive_read_next_header(x->a, &e), rc;

        if (s->over) {
            (void)err_fmt(err, errlen, 0, "archive unpacks to more than %llu bytes of tar stream",
                    (unsigned long long)s->budget);
            return -EFBIG;
        }
        if (r == ARCHIVE_RETRY || r < ARCHIVE_WARN)
            return archive_failure(x->a, members ? "header" : "start", err, errlen);
        /* Gzip exactly once: libarchive would also take a plain tar (no
         * filter) or gzip inside gzip (two gzip filters). */
        if (!checked_filter) {
            if (archive_filter_count(x->a) != 2 ||
                archive_filter_code(x->a, 0) != ARCHIVE_FILTER_GZIP) {
                (void)err_fmt(err, errlen, 0, "not a gzip-compressed tar");
                return -EBADMSG;
            }
            checked_filter = true;
        }
        if (r == ARCHIVE_EOF)
            return 0;
        /* ARCHIVE_WARN (e.g. a UTF-8 name libarchive cannot convert to the
         * C locale; it keeps the raw bytes) still yields an entry, and the
         * filter below decides. */
        if (++members > x->lim->max_members) {
            (void)err_fmt(err, errlen, 0, "archive has more than %llu members",
                    (unsigned long long)x->lim->max_members);
            return -E2BIG;
        }

        enum member_kind kind = classify(e);
        name = archive_entry_pathname(e);
        if (!name)
            name = archive_entry_pathname_utf8(e);
        if (kind == MEMBER_DROP || !name || !name[0]) {
            x->st->skipped++;
            continue;
        }
        path = strdup(name);
        if (!path) {
            (void)err_fmt(err, errlen, 0, "out of memory");
            return -ENOMEM;
        }
        if (!normalise_path(path)) {
            x->st->skipped++;
            continue;
        }
        rc = kind == MEMBER_DIR ? extract_dir(x, path) : extract_file(x, e, path, err, errlen);
        if (rc == SKIP) {
            x->st->skipped++;
            continue;
        }
        if (rc < 0) {
            if (s->over) {
                (void)err_fmt(err, errlen, 0,
                        "archive unpacks to more than %llu bytes of tar stream",
                        (unsigned long long)s->budget);
                return -EFBIG;
            }
            if (rc != -EFBIG && rc != -EBADMSG)
                (void)err_fmt(err, errlen, 0, "writing %s: %s", path, strerror(-rc));
            return rc;
        }
    }
}

/* The archive of an empty tree, made once (archive_snapshot_prepare): most
 * blocks leave the workspace empty, and libarchive's gzip writer takes ~0.1
 * ms and ~40 fresh pages (zlib's deflate state) to say so. Made in the fork
 * server, every sandbox inherits it; a host that sends it back as the next
 * workspace has nothing to extract either. */
static struct buf empty_tree = {0};

static bool is_empty_tree(const uint8_t *data, size_t len)
{
    return empty_tree.len && len == empty_tree.len && memcmp(data, empty_tree.data, len) == 0;
}

int archive_extract(const uint8_t *data, size_t len, int dest_fd,
                    const struct archive_limits *lim, struct extract_stats *st,
                    char *err, size_t errlen)
{
    static const struct archive_limits defaults = {
        .max_unpacked = ARCHIVE_DEFAULT_MAX_UNPACKED,
        .max_members = ARCHIVE_DEFAULT_MAX_MEMBERS,
    };
    struct extract_stats local;
    struct extract_ctx x = { .dest_fd = dest_fd, .lim = lim ? lim : &defaults,
                             .st = st ? st : &local };
    struct src s = { .data = data, .len = len };
    int rc;

    memset(x.st, 0, sizeof *x.st);
    (void)err_fmt(err, errlen, 0, "ok");
    if (len == 0 || is_empty_tree(data, len))
        return 0;
    /* Cheap and clear up front; the filter check after the first header
     * stays the authority. */
    if (len < 2 || data[0] != 0x1f || data[1] != 0x8b) {
        (void)err_fmt(err, errlen, 0, "not gzip (archives must be gzip-compressed tar)");
        return -EBADMSG;
    }

    s.budget = sat_add(sat_add(x.lim->max_unpacked,
                               sat_mul(sat_add(x.lim->max_members, 1), EXTRACT_HEADER_ALLOWANCE)),
                       EXTRACT_STREAM_SLACK);
    x.a = archive_read_new();
    if (!x.a)
        return -ENOMEM;
    s.a = x.a;
    if (archive_read_support_filter_gzip(x.a) != ARCHIVE_OK ||
        archive_read_support_format_tar(x.a) != ARCHIVE_OK) {
        (void)err_fmt(err, errlen, 0, "libarchive: %s", archive_error_string(x.a));
        archive_read_free(x.a);
        return -ENOMEM;
    }
    if (archive_read_open(x.a, &s, NULL, src_read, NULL) != ARCHIVE_OK) {
        rc = s.over ? -EFBIG : archive_failure(x.a, "open", err, errlen);
        archive_read_free(x.a);
        return rc;
    }
    rc = extract_loop(&x, &s, err, errlen);
    archive_read_free(x.a);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Snapshot                                                                  */
/* ------------------------------------------------------------------------ */

/* Why the snapshot is written this way (issue 13):
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

/* A file is sampled (its first bytes compressed at level 1 on the side) if
 * it has at least SNAPSHOT_SAMPLE_MIN bytes; smaller ones take level 1. */
#define SNAPSHOT_SAMPLE (16 * KiB)
#define SNAPSHOT_SAMPLE_MIN 512
#define SNAPSHOT_LEVEL 1
/* Room made in a member's buffer before each deflate call. */
#define GZW_ROOM (64 * KiB)

/* What proves a cached member still holds the file's bytes: everything the
 * tar header encodes (path, mode, size, mtime) and what changes whenever
 * the data does (ctime, which the kernel sets on every write, truncate,
 * chmod or utimes and user code cannot set) or the file is another one
 * (device, inode: a rename over it, a replacement). */
struct snap_key {
    dev_t dev;
    ino_t ino;
    off_t size;
    mode_t mode;
    struct timespec mtime;
    struct timespec ctime;
};

/* One member of the last snapshot, kept for the next one. */
struct snap_entry {
    char *path;     /* owned, relative, as written */
    struct snap_key key;
    uint8_t *gz;    /* owned: the whole gzip member */
    size_t gz_len;
    bool racy;      /* its ctime was in the clock tick the snapshot began in: a
                       write in that tick may have left the key unchanged, so
                       the data is compared (data_crc) before it is reused */
    uint32_t data_crc; /* racy: CRC-32 of the file's data as written */
};

struct snapshot_cache {
    struct snap_entry *e; /* owned, walk order */
    size_t n, cap;
    uint64_t bytes;       /* sum of gz_len */
    uint64_t max_bytes;   /* at most this much is kept */
};

/* A gzip member being written: a raw deflate stream between our header and
 * trailer. */
struct gzw {
    z_stream z;
    bool z_init;
    int level;      /* of the member being written */
    uint32_t crc;   /* of its uncompressed bytes */
    uint32_t isize; /* its uncompressed bytes mod 2^32 */
    struct buf m;   /* owned: the member so far */
};

/* A piece of the snapshot: bytes at p (held by the cache or static), or,
 * with p NULL, at off in the snapshot's extra buffer (which may still
 * move while the snapshot is written). */
struct piece {
    const uint8_t *p;
    size_t off, len;
};

struct snap {
    struct archive *a;
    struct archive_entry *e;
    struct snapshot_iov *out; /* borrowed: its extra buffer takes what the cache does not hold */
    struct piece *pc;         /* owned */
    size_t pc_n, pc_cap;
    int out_err;         /* first error from the write callback */
    uint64_t max_bytes;
    struct snapshot_stats *st;
    uint8_t *io;         /* SNAPSHOT_IO_CHUNK bytes, owned */
    bool ascii_only;     /* no UTF-8 locale: non-ASCII names are skipped */
    struct gzw gz;       /* the member being written */
    z_stream probe;      /* level 1 on a sample, to pick the level */
    bool probe_init;
    uint8_t *probe_out;  /* owned, deflateBound(SNAPSHOT_SAMPLE) */
    size_t probe_cap;

    /* Reuse (all unused without a cache). */
    struct snapshot_cache *cache; /* borrowed, or NULL */
    struct snap_entry *next;      /* owned: this snapshot's entries, walk order */
    size_t next_n, next_cap;
    uint64_t next_bytes;
    size_t cur;                   /* first entry of cache->e not yet passed */
    struct timespec t0;           /* coarse clock at the start */
    struct snap_key *mapped;      /* owned: (dev, ino) mapped shared and writable */
    size_t mapped_n, mapped_cap;
    bool no_reuse;                /* the mappings could not all be read */
};

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

/* ---- the cache ----------------------------------------------------------- */

struct snapshot_cache *snapshot_cache_new(uint64_t max_bytes)
{
    struct snapshot_cache *c = calloc(1, sizeof *c);

    if (c)
        c->max_bytes = max_bytes;
    return c;
}

static void entries_free(struct snap_entry *e, size_t n)
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

static struct snap_key key_of(const struct stat *sb)
{
    struct snap_key k = {
        .dev = sb->st_dev, .ino = sb->st_ino, .size = sb->st_size, .mode = sb->st_mode,
        .mtime = sb->st_mtim, .ctime = sb->st_ctim,
    };
    return k;
}

/* The cached member for path with this key, or NULL. Entries before path
 * are passed for good (both lists are in walk order). */
static struct snap_entry *cache_find(struct snap *s, const char *path, const struct snap_key *k)
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
static bool cache_keep(struct snap *s, const char *path, const struct snap_key *k, uint8_t *gz,
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
static bool cacheable(const struct snap *s, const struct snap_key *k)
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
static bool racy_now(const struct snap *s, const struct snap_key *k)
{
    return k->ctime.tv_sec > s->t0.tv_sec ||
           (k->ctime.tv_sec == s->t0.tv_sec && k->ctime.tv_nsec >= s->t0.tv_nsec);
}

/* CRC-32 of fd's first size bytes (read with pread: the offset is left for
 * the writer), or false if they cannot all be read. */
static bool data_crc_of(struct snap *s, int fd, uint64_t size, uint32_t *crc)
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
static void scan_mappings(struct snap *s)
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
