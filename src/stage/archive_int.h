/* Private to src/stage/: the snapshot's state and what the archive's
 * files call in each other. Runs in the sandbox child (and in the fork
 * server, for the empty tree). Nothing else includes this.
 *
 * The archive's code is cut by job:
 *   extract.c         the archives a sandbox is sent, extracted (spec 4.2);
 *   snapshot.c        the walk and the writer: one gzip member per file;
 *   snapshot_cache.c  the members kept from one snapshot for the next.
 */
#pragma once
#include <archive.h>
#include <archive_entry.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <zlib.h>

#include "core/buf.h"
#include "core/limits.h"
#include "stage/archive.h"
#define SNAPSHOT_IO_CHUNK (64 * KiB)

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

/* The archive of an empty tree (snapshot.c). */
extern struct buf empty_tree;

/* snapshot_cache.c */
void entries_free(struct snap_entry *e, size_t n);
struct snap_key key_of(const struct stat *sb);
struct snap_entry *cache_find(struct snap *s, const char *path, const struct snap_key *k);
bool cache_keep(struct snap *s, const char *path, const struct snap_key *k, uint8_t *gz,
                size_t gz_len, bool racy, uint32_t crc);
bool cacheable(const struct snap *s, const struct snap_key *k);
bool racy_now(const struct snap *s, const struct snap_key *k);
bool data_crc_of(struct snap *s, int fd, uint64_t size, uint32_t *crc);
void scan_mappings(struct snap *s);
