/* Extraction: the archives a sandbox is sent (the tools archive, the
 * workspace), written beneath its /workspace (spec 4.2). Runs in the sandbox
 * child, after isolation: a libarchive bug then lands in the sandbox, not in
 * the supervisor.
 *
 * libarchive only parses the tar stream here. It never touches the
 * filesystem: archive_write_disk would resolve paths by itself, with
 * check-then-write windows and root-only ownership logic. Extraction writes
 * every member with openat2(RESOLVE_BENEATH) from the destination fd.
 *
 * Relies on snapshot.c for the archive of an empty tree (empty_tree, made
 * in the fork server), which needs no extraction when a host sends it back.
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
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/util.h"
#include "stage/archive_int.h"

/* Compressed bytes handed to libarchive per read callback. The callback is
 * where the decompressed-stream budget is enforced (see struct src), so this
 * bounds how far past the budget one inflate step can run: ~1032x at most. */
#define EXTRACT_READ_CHUNK (16 * KiB)
/* Decompressed tar bytes allowed per member on top of max_unpacked: headers,
 * pax records, padding, and the data of members the filter drops. */
#define EXTRACT_HEADER_ALLOWANCE (8 * KiB)
/* One libarchive header call may chain up to 32 special headers of <= 1 MiB. */
#define EXTRACT_STREAM_SLACK (64 * MiB)

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
