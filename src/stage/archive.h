/* Archives in and out of a sandbox (spec 4), with libarchive.
 *
 * Runs inside the sandbox child, after isolation: a libarchive bug then lands
 * in the sandbox, not in the supervisor. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "core/buf.h"

struct archive_limits {
    uint64_t max_unpacked; /* total bytes of file data written */
    uint64_t max_members;  /* entries read, kept or not */
};

struct extract_stats {
    uint64_t files;   /* regular files written */
    uint64_t dirs;    /* directories created */
    uint64_t skipped; /* members dropped by the filter */
    uint64_t bytes;   /* file data written */
};

/* Extract a gzip-compressed tar held in memory into the directory dest_fd
 * (borrowed), applying the spec 4.2 filter:
 *   - only regular files (tar 0, NUL, 7, GNU sparse) and directories (5, or a
 *     NUL-type name ending in '/'); anything else, or a non-empty link name,
 *     is skipped;
 *   - the path is normalised lexically; absolute paths, a leading "..", or
 *     any ".." segment are skipped;
 *   - every component is opened with openat2(RESOLVE_BENEATH |
 *     RESOLVE_NO_MAGICLINKS) from dest_fd, so symlinks already on disk that
 *     lead outside dest make the member skipped, with no TOCTOU window;
 *   - files get mode (header mode & 0777 & ~022) | 0600,
 *     directories 0755; no setuid/setgid/sticky, no ownership, mtime applied.
 * len == 0 means "nothing to extract" and succeeds.
 * Returns 0, or:
 *   -EBADMSG  not gzip, or a corrupt gzip/tar stream (err says where)
 *   -EFBIG    more than max_unpacked bytes of file data
 *   -E2BIG    more than max_members members
 *   -errno    an I/O error writing a member that was not skipped
 * err (may be NULL) gets a human-readable reason of at most errlen bytes. */
int archive_extract(const uint8_t *data, size_t len, int dest_fd,
                    const struct archive_limits *lim, struct extract_stats *st,
                    char *err, size_t errlen);

struct snapshot_stats {
    uint64_t files;       /* members written */
    uint64_t bytes;       /* file data written */
    uint64_t skipped;     /* vanished, unreadable, non-regular, or bad_names */
    uint64_t bad_names;   /* files and directories left out for their names
                             (the supervisor's check would refuse them) */
    uint64_t over_cap;    /* regular files left out because of max_bytes */
    uint64_t reused;      /* members taken from the cache, not compressed */
    uint64_t reused_bytes; /* their compressed bytes */
    uint64_t stored;      /* members compressed with stored blocks (level 0:
                             their data did not compress) */
    uint64_t cached;      /* members the cache holds for the next snapshot */
};

/* The members of the last snapshot, kept for the next one (one per turn, in
 * the sandbox). Each file's tar entry is its own gzip member; while a file
 * is unchanged, its member is copied instead of being read and compressed
 * again. At most max_bytes of members are kept (the rest is compressed
 * again next time). Owned by the caller; NULL when out of memory. */
struct snapshot_cache;
struct snapshot_cache *snapshot_cache_new(uint64_t max_bytes);
void snapshot_cache_free(struct snapshot_cache *c); /* NULL is fine */
/* Forget every member (the next snapshot compresses everything). */
void snapshot_cache_clear(struct snapshot_cache *c);

/* Write a gzip-compressed tar (pax) of every regular file under the directory
 * root_fd (borrowed), recursively, hidden files included, into out. Names are
 * relative, '/'-separated, without "./"; no directory entries; symlinks are
 * neither included nor followed; a second link to an inode is written as a
 * regular file; a file that vanishes or cannot be read is skipped. Files that
 * would take the data total past max_bytes are left out (counted in
 * over_cap). Always produces a valid archive, possibly with zero members.
 *
 * The archive is in the canonical subset the supervisor checks before it
 * relays it (proto/tarcheck.h), for every tree: members in walk order
 * (sorted by name in each directory, depth first); mode 0644 plus the
 * file's execute bits (never more than 0755); uid/gid 0 without names;
 * mtimes clamped to 0..8^11-1 s; names written as UTF-8 whatever the
 * process locale. A file or directory whose path tarcheck_path_ok()
 * refuses (not UTF-8, over SNAPSHOT_MAX_PATH bytes, containing
 * "hdrcharset=") is skipped with everything below it.
 *
 * Gzip layout: one gzip member per file (its pax header if any, its ustar
 * header, data and padding), then one member holding the end-of-archive
 * blocks. Each member's header has FLG.FEXTRA with one subfield "FB" of 4
 * bytes: the member's whole length (header to trailer), little-endian, so
 * the supervisor can recognise a member it verified before without
 * inflating it (tarcheck.h). Level 1, or stored blocks (level 0) for a file
 * whose first SNAPSHOT_SAMPLE bytes do not compress. Deterministic: the same
 * tree gives the same bytes, with or without a cache.
 *
 * cache (may be NULL): members of the previous snapshot of this tree. A
 * file's member is reused when its path, device, inode, size, mtime, ctime
 * and mode are those it had when it was compressed, and updated otherwise
 * (the cache then holds this snapshot's members).
 * 0, or -ENOMEM / -errno if root itself cannot be read, -EILSEQ if
 * libarchive still could not write a name as UTF-8. On an error, the cache
 * is cleared. */
int archive_snapshot_cached(int root_fd, uint64_t max_bytes, struct snapshot_cache *cache,
                            struct buf *out, struct snapshot_stats *st);
/* The same, as pieces to write with writev: a member the cache holds is
 * not copied. iov[i] points into the cache (valid until its next snapshot,
 * clear or free), into extra, or at the prepared empty archive. */
struct snapshot_iov {
    struct iovec *iov; /* owned array */
    size_t n;
    uint64_t len;      /* bytes in all pieces */
    struct buf extra;  /* owned: the members the cache does not hold */
};
int archive_snapshot_iov(int root_fd, uint64_t max_bytes, struct snapshot_cache *cache,
                         struct snapshot_iov *out, struct snapshot_stats *st);
void snapshot_iov_free(struct snapshot_iov *o); /* safe twice */
/* The same without a cache. */
int archive_snapshot(int root_fd, uint64_t max_bytes, struct buf *out,
                     struct snapshot_stats *st);
/* Make (once) the archive of an empty tree: archive_snapshot() then copies
 * it instead of running libarchive for an empty root, and archive_extract()
 * given exactly these bytes has nothing to do. Also loads the C.UTF-8
 * locale the writer runs under. Optional; 0 or -ENOMEM. */
int archive_snapshot_prepare(void);
