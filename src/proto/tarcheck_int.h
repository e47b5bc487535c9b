/* Private to the snapshot check's files in src/proto/ (tarcheck*.c): the
 * check's state and what its files call in each other. Runs in the
 * supervisor. Nothing else includes this. The layers and their files are
 * listed in tarcheck.c's opening comment.
 *
 * The small helpers every layer calls on each byte it reads (fail, at,
 * more_may_come) are static inline here: they were static in one file. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <nettle/sha2.h>
#include <zlib.h>

#include "core/budget.h"
#include "proto/tarcheck.h"
#define BLOCK 512
/* Inflated bytes per inflate() call (and the output buffer). */
#define OUT_CHUNK (64 * 1024)
/* Compressed bytes offered per inflate() call. */
#define IN_CHUNK (64 * 1024)
#define GZ_HDR_LEN 10
/* The FB extra field: XLEN, then the subfield's SI1 SI2 LEN and its data. */
#define GZ_EXTRA_LEN (TARCHECK_GZ_HDR_LEN - GZ_HDR_LEN)
#define GZ_TRL_LEN 8
/* pax block bytes beyond the path: both records' length fields and keys,
 * the '\n's, and an mtime of up to 11 + 1 + 9 characters. */
#define PAX_OVERHEAD 64

/* Offsets and widths of the ustar header fields (POSIX.1-1988). */
#define F_NAME 0, 100
#define F_MODE 100, 8
#define F_UID 108, 8
#define F_GID 116, 8
#define F_SIZE 124, 12
#define F_MTIME 136, 12
#define F_CHKSUM 148, 8
#define F_TYPE 156
#define F_LINKNAME 157, 100
#define F_MAGIC 257 /* "ustar\0" then version "00" */
#define F_UNAME 265, 32
#define F_GNAME 297, 32
#define F_DEVMAJOR 329, 8
#define F_DEVMINOR 337, 8
#define F_PREFIX_OFF 345
#define F_PREFIX F_PREFIX_OFF, 155
#define F_PAD 500, 12

enum gz_state { GZ_HEADER, GZ_EXTRA, GZ_LOOKUP, GZ_VERIFY, GZ_BODY, GZ_TRAILER };

/* Buckets of the verified-member cache (a power of two). */
#define CACHE_BUCKETS 4096

/* A member verified earlier in the turn (see tarcheck.h). */
struct cache_entry {
    struct cache_entry *next; /* owned: the bucket's chain */
    uint8_t digest[SHA256_DIGEST_SIZE];
    uint32_t gz_len;    /* the member's bytes */
    uint64_t inflated;  /* what it inflates to */
    uint64_t hdr_off;   /* inflated bytes up to the end of its ustar header */
    uint64_t size;      /* the file's data bytes */
    uint32_t mode;
    uint64_t gen;       /* the last snapshot that used it */
    bool pax;           /* its path came from a pax record */
    size_t path_len;
    char path[];        /* NUL-terminated */
};

struct tarcheck_cache {
    struct cache_entry **bucket; /* owned, CACHE_BUCKETS chains; NULL until the first add */
    uint64_t bytes;              /* charged for the buckets and entries */
    uint64_t max_bytes;
    struct budget *budget;       /* borrowed, or NULL */
    uint64_t gen;                /* snapshots checked with this cache */
    uint64_t swept_gen;          /* the snapshot that last swept it */
};
enum tar_state { TAR_HEADER, TAR_PAX, TAR_DATA, TAR_PAD, TAR_END };

/* result while the check runs; VALID (0) and errors (< 0) end it. */
#define RUNNING 3 /* distinct from every enum tarcheck_result */

struct tarcheck {
    struct tarcheck_limits lim; /* copied, defaults filled in */
    size_t pax_max;             /* largest pax block accepted */
    tarcheck_member_fn fn;      /* borrowed, may be NULL */
    void *ud;                   /* borrowed */

    int result;      /* RUNNING, TARCHECK_VALID or -errno (sticky) */
    const char *why; /* static reason */
    size_t len;      /* message bytes the caller has said are there */
    bool finished;   /* len is the whole message */
    size_t pos;      /* message bytes consumed */
    /* what may be read in this call: the message's bytes [win_base, win_end)
     * at win (borrowed for the call; the whole message, or a chunk) */
    const uint8_t *win;
    size_t win_base, win_end;

    /* gzip layer */
    enum gz_state gz;
    uint8_t gzbuf[GZ_EXTRA_LEN]; /* member header, extra field or trailer being collected */
    size_t gz_got;
    size_t member_start; /* message offset of this member's first byte */
    uint32_t member_len; /* its length from the "FB" subfield, or 0: none */

    /* verified-member cache (tarcheck.h) */
    struct tarcheck_cache *cache; /* borrowed, or NULL */
    uint8_t claim[SHA256_DIGEST_SIZE]; /* this member's digest, as its FB subfield says */
    struct sha256_ctx sha;        /* of its bytes after its header, as they are consumed */
    bool hashing;                 /* ... its claim is checked at its end */
    bool cacheable;               /* ... and it may be remembered then */
    uint64_t m_members;           /* st.members when the member started */
    uint64_t m_tar_pos;           /* tar_pos when the member started */
    uint64_t tar_pos;             /* inflated bytes the tar layer has taken */
    uint64_t hdr_end;             /* tar_pos at the end of the last member header */
    bool last_pax;                /* the last member's path came from pax */
    uint32_t last_mode;           /* the last member's mode and size */
    uint64_t last_size;
    z_stream z;
    bool z_init;
    bool z_pending; /* the last inflate() filled its output: it may hold more */
    uint32_t crc;   /* of this member's inflated bytes */
    uint32_t isize; /* this member's inflated bytes mod 2^32 */

    /* tar layer */
    enum tar_state tar;
    uint8_t hdr[BLOCK]; /* header being collected */
    size_t hdr_got;
    uint8_t *pax;       /* owned, pax_max bytes: the pax block being collected */
    size_t pax_size, pax_got;
    uint64_t data_left; /* file data still to skip */
    size_t pad_left;    /* zero padding still to check */
    bool pax_pending;   /* a pax block was read; the next header is its member */
    char *pax_path;     /* owned, max_path + 2: the pending pax path */
    size_t pax_path_len;
    bool have_pax_path;
    char *prev; /* owned, max_path + 2: the last member's path */
    size_t prev_len;
    bool prev_dir;
    bool have_prev;
    char *cur;          /* owned, max(max_path, 256) + 2: path being built */
    uint64_t end_zeros; /* zero bytes after the first end block */

    uint8_t *out; /* owned, OUT_CHUNK: inflated bytes */
    struct tarcheck_stats st;
};
static inline int fail(struct tarcheck *tc, int err, const char *why)
{
    tc->result = err;
    tc->why = why;
    return err;
}

/* The message's byte at offset off, inside this call's window. */
static inline const uint8_t *at(const struct tarcheck *tc, size_t off)
{
    return tc->win + (off - tc->win_base);
}

/* No byte at the window's end: more may come (NEED_INPUT), or the message
 * ends there (the caller says finished, and the window reaches its end). */
static inline bool more_may_come(const struct tarcheck *tc)
{
    return !tc->finished || tc->win_end < tc->len;
}

static inline uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static inline uint64_t sat_mul(uint64_t a, uint64_t b)
{
    return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

static inline uint64_t round_block(uint64_t n)
{
    return (n + BLOCK - 1) / BLOCK * BLOCK;
}

static inline size_t pax_max_for(size_t max_path)
{
    return max_path + 1 + PAX_OVERHEAD; /* + 1: a directory's trailing '/' */
}

static inline bool all_zero(const uint8_t *p, size_t n)
{
    uint8_t acc = 0;

    for (size_t i = 0; i < n; i++)
        acc |= p[i];
    return acc == 0;
}

/* Work done by one call: compressed bytes consumed (or hashed), bytes
 * inflated. */
struct work {
    size_t in, out;
};

/* The tar layer is between entries: nothing of a header, pax block, data or
 * padding is pending, and the end has not been seen. */
static inline bool at_entry_boundary(const struct tarcheck *tc)
{
    return tc->tar == TAR_HEADER && tc->hdr_got == 0 && !tc->pax_pending &&
           !tc->have_pax_path;
}

/* tarcheck_tar.c */
int tar_consume(struct tarcheck *tc, const uint8_t *p, size_t n);
int tar_finish(struct tarcheck *tc);
int member_accept(struct tarcheck *tc, char type, uint64_t mode, uint64_t size,
                  const char *path, size_t len, bool pax);
/* tarcheck_cache.c */
struct cache_entry *cache_lookup(struct tarcheck_cache *c, const uint8_t *digest,
                                 uint32_t gz_len);
void cache_add(struct tarcheck *tc);
int cache_replay(struct tarcheck *tc, struct cache_entry *e);
bool digest_claimed(struct tarcheck *tc);
/* tarcheck_gz.c */
int step(struct tarcheck *tc);
