/* The supervisor's incremental check of a workspace snapshot: gzip members
 * inflated with zlib, the tar stream read block by block, everything outside
 * the canonical subset refused. Runs in the supervisor, on sandbox bytes.
 * The subset and the API contract are in tarcheck.h.
 *
 * Two layers, each a small state machine that resumes where the last call
 * stopped:
 *   gzip  the 10-byte member header (with the writer's FB subfield, if
 *         FEXTRA) and the 8-byte trailer are parsed here (zlib's gzip mode
 *         would take FNAME/FCOMMENT and any FEXTRA, which we refuse); a
 *         member with an FB length may be hashed first and replayed from
 *         the turn's cache instead of inflated (tarcheck.h);
 *         the deflate data goes through zlib's raw inflate, in calls of at
 *         most IN_CHUNK bytes in and OUT_CHUNK out, so the step budget holds
 *         even for input that inflates to nothing (empty stored blocks);
 *   tar   every inflated byte is header, pax records, file data, padding or
 *         end zeros; headers and pax blocks are copied out whole (they may
 *         straddle inflate calls), file data is skipped without a copy.
 *
 * Where the subset draws its lines (each a place where libarchive 3.6 and
 * CPython's tarfile could read the same bytes differently, or where the
 * host would apply something we do not want):
 *   - numbers: tarfile's nti() takes int(text.strip(), 8), so " +7", "0_7"
 *     or "0o7" parse; libarchive's tar_atol stops at the first non-digit,
 *     and both take base-256. Only digits from the first byte, then
 *     NUL/space, are read the same by both.
 *   - checksums: both accept the signed sum too; we want the one the
 *     writer writes.
 *   - magic: tarfile never looks at it and joins prefix + "/" + name for
 *     any type but GNU's; libarchive ignores the prefix unless the magic
 *     says ustar, and does not add the '/' when the prefix ends in one.
 *     Exact "ustar\0" "00", and no empty components after the join.
 *   - pax: libarchive parses the block as a C string (a NUL ends it) and
 *     warns but keeps the entry on a malformed record; tarfile stops at a
 *     NUL and applies "size", "uid", ..., GNU sparse maps, and
 *     hdrcharset=BINARY switches its decoding. Only "path" and "mtime",
 *     exact syntax, no NUL, filling the block.
 *   - the end: tarfile stops at the first zero block and, at an offset
 *     other than 0, at the first *invalid* header too, silently; both stop
 *     reading there, so whatever follows would be unchecked by them. We
 *     require two zero blocks and only zeros after.
 *   - gzip: tarfile's gzip skips zero bytes between members, libarchive
 *     stops at anything that is not a member header; libarchive does not
 *     check the CRC. Members back to back only, CRC and ISIZE checked.
 *   - directories: tarfile does not skip a directory's data, libarchive
 *     does. Size 0.
 */
#include "proto/tarcheck.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <nettle/sha2.h>
#include <zlib.h>

#include "core/budget.h"
#include "core/utf8.h"

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

static int fail(struct tarcheck *tc, int err, const char *why)
{
    tc->result = err;
    tc->why = why;
    return err;
}

/* The message's byte at offset off, inside this call's window. */
static const uint8_t *at(const struct tarcheck *tc, size_t off)
{
    return tc->win + (off - tc->win_base);
}

/* No byte at the window's end: more may come (NEED_INPUT), or the message
 * ends there (the caller says finished, and the window reaches its end). */
static bool more_may_come(const struct tarcheck *tc)
{
    return !tc->finished || tc->win_end < tc->len;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

static uint64_t round_block(uint64_t n)
{
    return (n + BLOCK - 1) / BLOCK * BLOCK;
}

static size_t pax_max_for(size_t max_path)
{
    return max_path + 1 + PAX_OVERHEAD; /* + 1: a directory's trailing '/' */
}

uint64_t tarcheck_inflated_bound(uint64_t max_data, uint64_t max_members, size_t max_path)
{
    /* pax header, pax block, member header, data padding */
    uint64_t per_member = BLOCK + round_block(pax_max_for(max_path)) + BLOCK + (BLOCK - 1);

    return sat_add(sat_add(max_data, sat_mul(max_members, per_member)),
                   2 * BLOCK + TARCHECK_MAX_TRAILER);
}

static bool all_zero(const uint8_t *p, size_t n)
{
    uint8_t acc = 0;

    for (size_t i = 0; i < n; i++)
        acc |= p[i];
    return acc == 0;
}

/* ------------------------------------------------------------------------ */
/* Names                                                                     */
/* ------------------------------------------------------------------------ */

bool tarcheck_path_ok(const char *p, size_t n, size_t max_path)
{
    size_t start = 0;

    if (n == 0 || n > max_path || memchr(p, '\0', n))
        return false;
    if (!utf8_valid((const uint8_t *)p, n))
        return false;
    for (size_t i = 0; i <= n; i++) {
        size_t clen;

        if (i < n && p[i] != '/')
            continue;
        clen = i - start;
        if (clen == 0 || (clen == 1 && p[start] == '.') ||
            (clen == 2 && p[start] == '.' && p[start + 1] == '.'))
            return false; /* leading, trailing or double '/', ".", ".." */
        if (clen > NAME_MAX)
            return false; /* no file system holds it: the host's extraction fails */
        start = i + 1;
    }
    return memmem(p, n, "hdrcharset=", 11) == NULL;
}

/* The writer's walk order: paths compared component by component with
 * strcmp, which is byte order with '/' below every other byte and a prefix
 * before what it prefixes. */
static int path_cmp(const char *a, size_t an, const char *b, size_t bn)
{
    size_t n = an < bn ? an : bn;

    for (size_t i = 0; i < n; i++) {
        unsigned ca = a[i] == '/' ? 0 : (unsigned char)a[i];
        unsigned cb = b[i] == '/' ? 0 : (unsigned char)b[i];

        if (ca != cb)
            return ca < cb ? -1 : 1;
    }
    return an < bn ? -1 : an > bn ? 1 : 0;
}

/* ------------------------------------------------------------------------ */
/* Tar headers                                                               */
/* ------------------------------------------------------------------------ */

/* A numeric field in the one form both readers agree on: 1 to w-1 octal
 * digits from the first byte, then only NUL or space. */
static bool octal_field(const uint8_t *h, size_t off, size_t w, uint64_t *v)
{
    const uint8_t *f = h + off;
    uint64_t x = 0;
    size_t i = 0;

    while (i < w && f[i] >= '0' && f[i] <= '7')
        x = x * 8 + (uint64_t)(f[i++] - '0');
    if (i == 0 || i == w)
        return false;
    for (; i < w; i++)
        if (f[i] != '\0' && f[i] != ' ')
            return false;
    *v = x;
    return true;
}

/* Device numbers: 0 in canonical octal (libarchive), or all NUL (CPython
 * writes them empty for anything but a device; both readers take 0). */
static bool zero_or_empty(const uint8_t *h, size_t off, size_t w)
{
    uint64_t v;

    return all_zero(h + off, w) || (octal_field(h, off, w, &v) && v == 0);
}

/* A string field: anything up to the first NUL, only NULs after it. */
static bool nul_padded(const uint8_t *h, size_t off, size_t w)
{
    const uint8_t *f = h + off, *nul = memchr(f, '\0', w);

    return !nul || all_zero(nul, w - (size_t)(nul - f));
}

static bool empty_field(const uint8_t *h, size_t off, size_t w)
{
    return all_zero(h + off, w);
}

static size_t field_len(const uint8_t *h, size_t off, size_t w)
{
    const uint8_t *nul = memchr(h + off, '\0', w);

    return nul ? (size_t)(nul - (h + off)) : w;
}

static uint64_t unsigned_sum(const uint8_t *h)
{
    uint64_t sum = 8 * ' '; /* the checksum field counts as spaces */

    for (size_t i = 0; i < BLOCK; i++)
        if (i < 148 || i >= 156)
            sum += h[i];
    return sum;
}

/* The fields every header must have right, whatever its type. */
static int check_fields(struct tarcheck *tc, const uint8_t *h, uint64_t *mode, uint64_t *size)
{
    uint64_t v;

    if (!octal_field(h, F_CHKSUM, &v))
        return fail(tc, -EBADMSG, "tar: checksum field not canonical octal");
    if (v != unsigned_sum(h))
        return fail(tc, -EBADMSG, "tar: header checksum mismatch");
    if (memcmp(h + F_MAGIC, "ustar\0" "00", 8) != 0)
        return fail(tc, -EBADMSG, "tar: header is not POSIX ustar");
    if (!octal_field(h, F_MODE, mode) || !octal_field(h, F_SIZE, size) ||
        !octal_field(h, F_MTIME, &v))
        return fail(tc, -EBADMSG, "tar: numeric field not canonical octal");
    if (!octal_field(h, F_UID, &v) || v != 0 || !octal_field(h, F_GID, &v) || v != 0)
        return fail(tc, -EBADMSG, "tar: owner not uid/gid 0");
    if (!zero_or_empty(h, F_DEVMAJOR) || !zero_or_empty(h, F_DEVMINOR))
        return fail(tc, -EBADMSG, "tar: device numbers not 0");
    if (!empty_field(h, F_LINKNAME))
        return fail(tc, -EBADMSG, "tar: link name not empty");
    if (!empty_field(h, F_UNAME) || !empty_field(h, F_GNAME))
        return fail(tc, -EBADMSG, "tar: owner names not empty");
    if (!nul_padded(h, F_NAME) || !nul_padded(h, F_PREFIX) || !empty_field(h, F_PAD))
        return fail(tc, -EBADMSG, "tar: name fields not NUL-padded");
    if (*mode & ~(uint64_t)0755)
        return fail(tc, -EBADMSG, "tar: mode has bits outside 0755");
    return 0;
}

/* The member's path from the header's prefix and name fields, joined as
 * tarfile joins them; ASCII only (tarfile decodes these fields with the
 * host's filesystem encoding, pax paths always as UTF-8). */
static int ustar_path(struct tarcheck *tc, const uint8_t *h, size_t *len)
{
    size_t plen = field_len(h, F_PREFIX), nlen = field_len(h, F_NAME), n = 0;

    if (plen) {
        memcpy(tc->cur, h + F_PREFIX_OFF, plen);
        n = plen;
        tc->cur[n++] = '/';
    }
    memcpy(tc->cur + n, h, nlen);
    n += nlen;
    tc->cur[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)tc->cur[i] >= 0x80)
            return fail(tc, -EBADMSG, "tar: non-ASCII name outside a pax record");
    *len = n;
    return 0;
}

/* A file or directory member at path[0, len) (a directory's with its
 * trailing '/'): the checks that depend on where it is in the archive (its
 * order, the caps), then it is counted and reported. Shared by headers that
 * were inflated and members replayed from the cache. */
static int member_accept(struct tarcheck *tc, char type, uint64_t mode, uint64_t size,
                         const char *path, size_t len, bool pax)
{
    /* A directory's name ends in one '/' (libarchive's writer adds it;
     * tarfile strips it, libarchive keeps it). */
    if (type == '5') {
        if (len == 0 || path[len - 1] != '/')
            return fail(tc, -EBADMSG, "tar: directory name without its trailing '/'");
        len--;
    }
    if (len > tc->lim.max_path)
        return fail(tc, -ENAMETOOLONG, "tar: path longer than the limit");
    if (!tarcheck_path_ok(path, len, tc->lim.max_path))
        return fail(tc, -EBADMSG, "tar: path not relative, clean, UTF-8 text");

    if (tc->have_prev) {
        if (path_cmp(tc->prev, tc->prev_len, path, len) >= 0)
            return fail(tc, -EBADMSG, "tar: members out of order or repeated");
        if (!tc->prev_dir && len > tc->prev_len && path[tc->prev_len] == '/' &&
            memcmp(path, tc->prev, tc->prev_len) == 0)
            return fail(tc, -EBADMSG, "tar: member beneath a file");
    }
    if (tc->st.members >= tc->lim.max_members)
        return fail(tc, -E2BIG, "tar: more members than the limit");
    if (size > tc->lim.max_data - tc->st.data)
        return fail(tc, -EFBIG, "tar: more file data than the limit");

    memmove(tc->prev, path, len);
    tc->prev[len] = '\0';
    tc->prev_len = len;
    tc->prev_dir = type == '5';
    tc->have_prev = true;
    tc->st.members++;
    tc->st.dirs += type == '5';
    tc->st.data += size;
    tc->pax_pending = false;
    tc->last_pax = pax;
    tc->last_mode = (uint32_t)mode;
    tc->last_size = size;
    if (tc->fn) {
        struct tarcheck_member m = {
            .path = tc->prev, .path_len = len, .type = type, .mode = (uint32_t)mode,
            .size = size, .pax = pax,
        };
        tc->fn(tc->ud, &m);
    }
    tc->have_pax_path = false;

    tc->data_left = size;
    tc->pad_left = (size_t)(round_block(size) - size);
    tc->tar = size ? TAR_DATA : TAR_HEADER;
    return 0;
}

static int member_header(struct tarcheck *tc, const uint8_t *h, uint64_t mode, uint64_t size)
{
    char type = (char)h[F_TYPE];
    size_t len;
    int r;

    if (type == '0') {
        if ((mode & 0644) != 0644)
            return fail(tc, -EBADMSG, "tar: file mode not within 0644..0755");
    } else if (mode != 0755 || size != 0) {
        return fail(tc, -EBADMSG, "tar: directory not mode 0755 and size 0");
    }
    if (tc->have_pax_path)
        return member_accept(tc, type, mode, size, tc->pax_path, tc->pax_path_len, true);
    r = ustar_path(tc, h, &len);
    if (r < 0)
        return r;
    return member_accept(tc, type, mode, size, tc->cur, len, false);
}

static int header(struct tarcheck *tc)
{
    const uint8_t *h = tc->hdr;
    uint64_t mode, size;
    int r;

    if (all_zero(h, BLOCK)) {
        if (tc->pax_pending)
            return fail(tc, -EBADMSG, "tar: pax header without its member");
        tc->tar = TAR_END;
        tc->end_zeros = 0;
        return 0;
    }
    r = check_fields(tc, h, &mode, &size);
    if (r < 0)
        return r;
    switch (h[F_TYPE]) {
    case 'x':
        if (tc->pax_pending)
            return fail(tc, -EBADMSG, "tar: two pax headers for one member");
        if (size == 0 || size > tc->pax_max)
            return fail(tc, -EBADMSG, "tar: pax header size out of range");
        tc->pax_size = (size_t)size;
        tc->pax_got = 0;
        tc->tar = TAR_PAX;
        return 0;
    case '0':
    case '5':
        return member_header(tc, h, mode, size);
    default:
        return fail(tc, -EBADMSG, "tar: member type other than file, directory, pax");
    }
}

/* mtime as libarchive's add_pax_attr_time writes a non-negative time:
 * seconds without leading zeros, an optional fraction without trailing
 * zeros. The writer clamps mtimes to 0..8^11-1, so at most 11 digits. */
static bool mtime_ok(const uint8_t *v, size_t n)
{
    size_t i = 0, f;

    if (n == 0 || v[0] < '0' || v[0] > '9')
        return false;
    if (v[0] == '0')
        i = 1;
    else
        while (i < n && i < 11 && v[i] >= '0' && v[i] <= '9')
            i++;
    if (i == n)
        return true;
    if (v[i] != '.')
        return false;
    f = ++i;
    while (i < n && v[i] >= '0' && v[i] <= '9')
        i++;
    return i == n && n - f >= 1 && n - f <= 9 && v[n - 1] != '0';
}

/* The pax block is complete: records "LEN key=value\n" filling it. */
static int pax_parse(struct tarcheck *tc)
{
    const uint8_t *b = tc->pax;
    size_t n = tc->pax_size, pos = 0;
    int rank = 0; /* path 1, mtime 2: in this order, once each */

    if (memchr(b, '\0', n))
        return fail(tc, -EBADMSG, "pax: NUL byte in the records");
    while (pos < n) {
        size_t i = pos, len = 0, end, klen, vlen;
        const uint8_t *key, *eq, *val;

        if (b[i] < '1' || b[i] > '9')
            return fail(tc, -EBADMSG, "pax: record length not canonical decimal");
        while (i < n && b[i] >= '0' && b[i] <= '9') {
            len = len * 10 + (size_t)(b[i++] - '0');
            if (len > n)
                return fail(tc, -EBADMSG, "pax: record runs past the block");
        }
        if (i == n || b[i] != ' ')
            return fail(tc, -EBADMSG, "pax: record length not followed by a space");
        i++;
        if (len > n - pos)
            return fail(tc, -EBADMSG, "pax: record runs past the block");
        end = pos + len; /* one past the record's '\n' */
        if (end <= i || b[end - 1] != '\n')
            return fail(tc, -EBADMSG, "pax: record length does not end at a newline");
        key = b + i;
        eq = memchr(key, '=', end - 1 - i);
        if (!eq || eq == key)
            return fail(tc, -EBADMSG, "pax: record without key=value");
        klen = (size_t)(eq - key);
        val = eq + 1;
        vlen = (size_t)(b + end - 1 - val);
        if (klen == 4 && !memcmp(key, "path", 4) && rank < 1) {
            rank = 1;
            if (vlen > tc->lim.max_path + 1)
                return fail(tc, -ENAMETOOLONG, "tar: path longer than the limit");
            memcpy(tc->pax_path, val, vlen);
            tc->pax_path[vlen] = '\0';
            tc->pax_path_len = vlen;
            tc->have_pax_path = true;
        } else if (klen == 5 && !memcmp(key, "mtime", 5) && rank < 2) {
            rank = 2;
            if (!mtime_ok(val, vlen))
                return fail(tc, -EBADMSG, "pax: mtime not in the writer's form");
        } else if ((klen == 4 && !memcmp(key, "path", 4)) ||
                   (klen == 5 && !memcmp(key, "mtime", 5))) {
            return fail(tc, -EBADMSG, "pax: records repeated or out of order");
        } else {
            return fail(tc, -EBADMSG, "pax: record other than path or mtime");
        }
        pos = end;
    }
    tc->pax_pending = true;
    return 0;
}

/* Take n inflated bytes (n <= OUT_CHUNK: the work is bounded by the
 * caller's budget). */
static int tar_consume(struct tarcheck *tc, const uint8_t *p, size_t n)
{
    while (n > 0) {
        size_t k;
        int r;

        switch (tc->tar) {
        case TAR_HEADER:
            k = BLOCK - tc->hdr_got < n ? BLOCK - tc->hdr_got : n;
            memcpy(tc->hdr + tc->hdr_got, p, k);
            tc->hdr_got += k;
            if (tc->hdr_got == BLOCK) {
                tc->hdr_got = 0;
                tc->hdr_end = tc->tar_pos + k;
                r = header(tc);
                if (r < 0)
                    return r;
            }
            break;
        case TAR_PAX:
            k = tc->pax_size - tc->pax_got < n ? tc->pax_size - tc->pax_got : n;
            memcpy(tc->pax + tc->pax_got, p, k);
            tc->pax_got += k;
            if (tc->pax_got == tc->pax_size) {
                r = pax_parse(tc);
                if (r < 0)
                    return r;
                tc->pad_left = (size_t)(round_block(tc->pax_size) - tc->pax_size);
                tc->tar = tc->pad_left ? TAR_PAD : TAR_HEADER;
            }
            break;
        case TAR_DATA:
            k = tc->data_left < n ? (size_t)tc->data_left : n;
            tc->data_left -= k;
            if (tc->data_left == 0)
                tc->tar = tc->pad_left ? TAR_PAD : TAR_HEADER;
            break;
        case TAR_PAD:
            k = tc->pad_left < n ? tc->pad_left : n;
            if (!all_zero(p, k))
                return fail(tc, -EBADMSG, "tar: padding not zero");
            tc->pad_left -= k;
            if (tc->pad_left == 0)
                tc->tar = TAR_HEADER;
            break;
        case TAR_END:
        default:
            k = n;
            if (!all_zero(p, k))
                return fail(tc, -EBADMSG, "tar: data after the end-of-archive blocks");
            if (k > BLOCK + TARCHECK_MAX_TRAILER - tc->end_zeros)
                return fail(tc, -EBADMSG, "tar: too many zeros after the end");
            tc->end_zeros += k;
            break;
        }
        p += k;
        n -= k;
        tc->tar_pos += k;
    }
    return 0;
}

/* The whole message is consumed: the tar stream must have ended. */
static int tar_finish(struct tarcheck *tc)
{
    if (tc->tar != TAR_END)
        return fail(tc, -EBADMSG,
                    tc->tar == TAR_HEADER && tc->hdr_got == 0 && !tc->pax_pending
                        ? "tar: no end-of-archive blocks"
                        : "tar: archive truncated inside a member");
    if (tc->end_zeros < BLOCK)
        return fail(tc, -EBADMSG, "tar: one end-of-archive block, not two");
    tc->result = TARCHECK_VALID;
    tc->why = "ok";
    return TARCHECK_VALID;
}

/* ------------------------------------------------------------------------ */
/* Gzip                                                                      */
/* ------------------------------------------------------------------------ */

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int gz_body_start(struct tarcheck *tc, bool hashing);

/* Work done by one call: compressed bytes consumed (or hashed), bytes
 * inflated. */
struct work {
    size_t in, out;
};

/* The tar layer is between entries: nothing of a header, pax block, data or
 * padding is pending, and the end has not been seen. */
static bool at_entry_boundary(const struct tarcheck *tc)
{
    return tc->tar == TAR_HEADER && tc->hdr_got == 0 && !tc->pax_pending &&
           !tc->have_pax_path;
}

/* ---- the verified-member cache ------------------------------------------ */

static size_t bucket_of(const uint8_t *digest)
{
    size_t h;

    memcpy(&h, digest, sizeof h);
    return h & (CACHE_BUCKETS - 1);
}

static struct cache_entry *cache_lookup(struct tarcheck_cache *c, const uint8_t *digest,
                                        uint32_t gz_len)
{
    if (!c->bucket)
        return NULL;
    for (struct cache_entry *e = c->bucket[bucket_of(digest)]; e; e = e->next)
        if (e->gz_len == gz_len && memcmp(e->digest, digest, sizeof e->digest) == 0)
            return e;
    return NULL;
}

static uint64_t entry_bytes(size_t path_len)
{
    return sizeof(struct cache_entry) + path_len + 1;
}

/* Drop the entries no snapshot used since the one before this. */
static void cache_sweep(struct tarcheck_cache *c)
{
    c->swept_gen = c->gen;
    for (size_t b = 0; c->bucket && b < CACHE_BUCKETS; b++) {
        struct cache_entry **pp = &c->bucket[b];

        while (*pp) {
            struct cache_entry *e = *pp;

            if (e->gen + 1 >= c->gen) {
                pp = &e->next;
                continue;
            }
            *pp = e->next;
            c->bytes -= entry_bytes(e->path_len);
            if (c->budget)
                budget_give(c->budget, entry_bytes(e->path_len));
            free(e);
        }
    }
}

static bool cache_charge(struct tarcheck_cache *c, uint64_t n)
{
    if (n > c->max_bytes - c->bytes)
        return false;
    if (c->budget && budget_take(c->budget, n) < 0)
        return false;
    c->bytes += n;
    return true;
}

/* The member just verified (one file entry, from an entry boundary to the
 * next) is remembered; nothing happens if it does not fit. */
static void cache_add(struct tarcheck *tc)
{
    struct tarcheck_cache *c = tc->cache;
    uint64_t need = entry_bytes(tc->prev_len);
    struct cache_entry *e;

    if (cache_lookup(c, tc->claim, tc->member_len))
        return;
    if (!c->bucket) {
        if (!cache_charge(c, CACHE_BUCKETS * sizeof *c->bucket))
            return;
        c->bucket = calloc(CACHE_BUCKETS, sizeof *c->bucket);
        if (!c->bucket) {
            c->bytes -= CACHE_BUCKETS * sizeof *c->bucket;
            if (c->budget)
                budget_give(c->budget, CACHE_BUCKETS * sizeof *c->bucket);
            return;
        }
    }
    if (need > c->max_bytes - c->bytes && c->swept_gen != c->gen)
        cache_sweep(c);
    if (!cache_charge(c, need))
        return;
    e = malloc(need);
    if (!e) {
        c->bytes -= need;
        if (c->budget)
            budget_give(c->budget, need);
        return;
    }
    memcpy(e->digest, tc->claim, sizeof e->digest); /* checked: the member's own */
    e->gz_len = tc->member_len;
    e->inflated = tc->tar_pos - tc->m_tar_pos;
    e->hdr_off = tc->hdr_end - tc->m_tar_pos;
    e->size = tc->last_size;
    e->mode = tc->last_mode;
    e->pax = tc->last_pax;
    e->gen = c->gen;
    e->path_len = tc->prev_len;
    memcpy(e->path, tc->prev, tc->prev_len + 1);
    e->next = c->bucket[bucket_of(e->digest)];
    c->bucket[bucket_of(e->digest)] = e;
    tc->st.cache_added++;
}

/* A member that says it has the same bytes as e, at an entry boundary:
 * what inflating it would do, without inflating it. The tar layer would see
 * the same bytes from the same state, so only what depends on the rest of
 * the archive is checked again, in the order inflating it would meet it:
 * the bomb guard up to its header, the header's order and caps, then the
 * guard for the rest. Its bytes are then hashed as they come (GZ_VERIFY):
 * a member that is not what it says is refused at its end. */
static int cache_replay(struct tarcheck *tc, struct cache_entry *e)
{
    uint64_t room = tc->lim.max_inflated - tc->st.inflated;
    int r;

    if (e->hdr_off > room)
        return fail(tc, -EFBIG, "gzip: inflates past the limit");
    r = member_accept(tc, '0', e->mode, e->size, e->path, e->path_len, e->pax);
    if (r < 0)
        return r;
    if (e->inflated > room)
        return fail(tc, -EFBIG, "gzip: inflates past the limit");
    e->gen = tc->cache->gen;
    tc->tar = TAR_HEADER;
    tc->data_left = 0;
    tc->pad_left = 0;
    tc->tar_pos += e->inflated;
    tc->st.inflated += e->inflated;
    tc->st.cache_hits++;
    tc->st.cache_bytes += e->gz_len;
    tc->gz = GZ_VERIFY;
    return RUNNING;
}

/* The member's bytes after its header, all hashed: their digest is the one
 * its FB subfield claimed. */
static bool digest_claimed(struct tarcheck *tc)
{
    uint8_t digest[SHA256_DIGEST_SIZE];
    sha256_digest(&tc->sha, sizeof digest, digest);
    return memcmp(digest, tc->claim, sizeof digest) == 0;
}

/* Hash what is there of a member replayed from the cache, within the
 * budget, up to its end: then its digest must be the one it claimed. */
static int gz_verify(struct tarcheck *tc, struct work *w)
{
    size_t end = tc->member_start + tc->member_len;
    size_t n = (tc->win_end < end ? tc->win_end : end) - tc->pos;

    if (n > tc->lim.step_budget - w->in)
        n = tc->lim.step_budget - w->in;
    if (n == 0 && tc->pos < end) {
        if (more_may_come(tc))
            return TARCHECK_NEED_INPUT;
        /* what inflating the member's bytes would have found, if they are
         * the ones it claims */
        return fail(tc, -EBADMSG, tc->pos < end - GZ_TRL_LEN ? "gzip: deflate stream truncated"
                                                             : "gzip: member trailer truncated");
    }
    sha256_update(&tc->sha, n, at(tc, tc->pos));
    tc->pos += n;
    tc->st.consumed += n;
    w->in += n;
    if (tc->pos < end)
        return RUNNING;
    if (!digest_claimed(tc))
        return fail(tc, -EBADMSG, "gzip: member digest wrong");
    tc->st.gz_members++;
    tc->gz = GZ_HEADER;
    tc->gz_got = 0;
    return RUNNING;
}

/* The first byte of a member's deflate data is there: replay it from the
 * cache by its claimed digest (then verify), or inflate it (hashing its
 * bytes as they go, to check the claim and maybe remember it). */
static int gz_lookup(struct tarcheck *tc)
{
    struct cache_entry *e = NULL;

    if (tc->win_end <= tc->pos) {
        if (more_may_come(tc))
            return TARCHECK_NEED_INPUT;
        return gz_body_start(tc, false) < 0 ? tc->result : RUNNING; /* finds it truncated */
    }
    /* A member whose first deflate block is stored (BTYPE 00: the writer's
     * level 0) inflates as a copy and a CRC, cheaper than hashing it (~1.7
     * vs ~1 GB/s here): never looked up, its digest not read. */
    if ((*at(tc, tc->pos) & 6) == 0)
        return gz_body_start(tc, false) < 0 ? tc->result : RUNNING;
    sha256_init(&tc->sha);
    tc->cacheable = tc->cache && at_entry_boundary(tc);
    if (tc->cacheable)
        e = cache_lookup(tc->cache, tc->claim, tc->member_len);
    if (e)
        return cache_replay(tc, e);
    tc->m_members = tc->st.members;
    tc->m_tar_pos = tc->tar_pos;
    return gz_body_start(tc, true) < 0 ? tc->result : RUNNING;
}

static int gz_member_start(struct tarcheck *tc)
{
    const uint8_t *g = tc->gzbuf;

    if (g[2] != 8)
        return fail(tc, -EBADMSG, "gzip: compression method not deflate");
    if (g[3] != 0 && g[3] != 4)
        return fail(tc, -EBADMSG, "gzip: header flags set");
    tc->member_len = 0;
    if (g[3] == 4) {
        /* FEXTRA: only the writer's one subfield (tarcheck.h), collected
         * next; the member starts once it is in. */
        tc->gz = GZ_EXTRA;
        tc->gz_got = 0;
        return 0;
    }
    return gz_body_start(tc, false);
}

/* The "FB" subfield: XLEN, SI1 SI2, LEN, the member's length and the
 * digest of its bytes after its header. */
static int gz_extra(struct tarcheck *tc)
{
    const uint8_t *x = tc->gzbuf;
    uint32_t len = le32(x + 6);

    if (x[0] != TARCHECK_GZ_XLEN || x[1] != 0 || x[2] != TARCHECK_GZ_SI1 ||
        x[3] != TARCHECK_GZ_SI2 || x[4] != TARCHECK_GZ_FB_LEN || x[5] != 0)
        return fail(tc, -EBADMSG, "gzip: extra field not the writer's subfield");
    /* The shortest member: this header, a 2-byte deflate block, the trailer. */
    if (len < TARCHECK_GZ_HDR_LEN + 2 + GZ_TRL_LEN)
        return fail(tc, -EBADMSG, "gzip: member length field out of range");
    tc->member_len = len;
    memcpy(tc->claim, x + 10, sizeof tc->claim);
    tc->gz = GZ_LOOKUP;
    return 0;
}

/* Inflate the member from here; hashing: its bytes are hashed as they are
 * consumed (its claim checked at its end). */
static int gz_body_start(struct tarcheck *tc, bool hashing)
{
    tc->hashing = hashing;
    if (!tc->z_init) {
        if (inflateInit2(&tc->z, -MAX_WBITS) != Z_OK)
            return fail(tc, -ENOMEM, "gzip: out of memory");
        tc->z_init = true;
    } else if (inflateReset(&tc->z) != Z_OK) {
        return fail(tc, -ENOMEM, "gzip: cannot reset zlib");
    }
    tc->crc = (uint32_t)crc32(0, Z_NULL, 0);
    tc->isize = 0;
    tc->z_pending = false;
    tc->gz = GZ_BODY;
    tc->gz_got = 0;
    return 0;
}


/* One inflate() call within what is left of the budget. */
static int gz_inflate(struct tarcheck *tc, struct work *w)
{
    size_t in = tc->win_end - tc->pos, outn = OUT_CHUNK, used, made;
    size_t in_left = tc->lim.step_budget - w->in, out_left = tc->lim.step_budget - w->out;
    uint64_t room = tc->lim.max_inflated - tc->st.inflated;
    int zr, r;

    if (in > IN_CHUNK)
        in = IN_CHUNK;
    if (in > in_left)
        in = in_left;
    if (outn > out_left)
        outn = out_left;
    if (room < outn) /* one byte past the limit is enough to tell */
        outn = (size_t)room + 1;
    if (in == 0 && !tc->z_pending) {
        if (more_may_come(tc))
            return TARCHECK_NEED_INPUT;
        return fail(tc, -EBADMSG, "gzip: deflate stream truncated");
    }
    tc->z.next_in = (Bytef *)at(tc, tc->pos);
    tc->z.avail_in = (uInt)in;
    tc->z.next_out = tc->out;
    tc->z.avail_out = (uInt)outn;
    zr = inflate(&tc->z, Z_NO_FLUSH);
    used = in - tc->z.avail_in;
    made = outn - tc->z.avail_out;
    if (tc->hashing)
        sha256_update(&tc->sha, used, at(tc, tc->pos));
    tc->pos += used;
    tc->st.consumed += used;
    w->in += used;
    w->out += made;
    tc->z_pending = tc->z.avail_out == 0;
    if (made) {
        /* The tar layer sees exactly the first max_inflated bytes, however
         * the input was chunked: the verdict does not depend on it. */
        bool over = made > room;

        tc->st.inflated += made;
        tc->crc = (uint32_t)crc32(tc->crc, tc->out, (uInt)made);
        tc->isize += (uint32_t)made;
        r = tar_consume(tc, tc->out, over ? (size_t)room : made);
        if (r < 0)
            return r;
        if (over)
            return fail(tc, -EFBIG, "gzip: inflates past the limit");
    }
    switch (zr) {
    case Z_STREAM_END:
        tc->gz = GZ_TRAILER;
        tc->gz_got = 0;
        return RUNNING;
    case Z_OK:
        return RUNNING;
    case Z_BUF_ERROR: /* no progress: only when no input was offered */
        tc->z_pending = false;
        return RUNNING;
    case Z_MEM_ERROR:
        return fail(tc, -ENOMEM, "gzip: out of memory");
    default:
        return fail(tc, -EBADMSG, "gzip: corrupt deflate data");
    }
}

/* Collect up to want bytes of a member header or trailer into gzbuf.
 * RUNNING with gz_got == want when complete. */
static int gz_collect(struct tarcheck *tc, size_t want, struct work *w, const char *truncated)
{
    size_t k = tc->win_end - tc->pos;

    if (k == 0) {
        if (more_may_come(tc))
            return TARCHECK_NEED_INPUT;
        return fail(tc, -EBADMSG, truncated);
    }
    if (k > want - tc->gz_got)
        k = want - tc->gz_got;
    memcpy(tc->gzbuf + tc->gz_got, at(tc, tc->pos), k);
    if (tc->hashing && tc->gz == GZ_TRAILER) /* a member's bytes after its header */
        sha256_update(&tc->sha, k, at(tc, tc->pos));
    tc->gz_got += k;
    tc->pos += k;
    tc->st.consumed += k;
    w->in += k;
    return RUNNING;
}

static int step(struct tarcheck *tc)
{
    struct work w = {0};
    int r = RUNNING;

    while (r == RUNNING) {
        if (w.in >= tc->lim.step_budget || w.out >= tc->lim.step_budget) {
            r = TARCHECK_AGAIN;
            break;
        }
        switch (tc->gz) {
        case GZ_HEADER:
            if (tc->gz_got == 0 && tc->pos == tc->len && tc->finished && tc->st.gz_members) {
                r = tar_finish(tc);
                break;
            }
            if (tc->gz_got == 0)
                tc->member_start = tc->pos;
            r = gz_collect(tc, GZ_HDR_LEN, &w, "gzip: member header truncated");
            /* The magic is checked as soon as it is there: after the last
             * member, the first stray byte is the error. */
            if (r == RUNNING && ((tc->gz_got >= 1 && tc->gzbuf[0] != 0x1f) ||
                                 (tc->gz_got >= 2 && tc->gzbuf[1] != 0x8b)))
                r = fail(tc, -EBADMSG, tc->st.gz_members ? "gzip: bytes after the last member"
                                                         : "gzip: not gzip");
            else if (r == RUNNING && tc->gz_got == GZ_HDR_LEN)
                r = gz_member_start(tc) < 0 ? tc->result : RUNNING;
            break;
        case GZ_EXTRA:
            r = gz_collect(tc, GZ_EXTRA_LEN, &w, "gzip: member header truncated");
            if (r == RUNNING && tc->gz_got == GZ_EXTRA_LEN)
                r = gz_extra(tc) < 0 ? tc->result : RUNNING;
            break;
        case GZ_LOOKUP:
            r = gz_lookup(tc);
            break;
        case GZ_VERIFY:
            r = gz_verify(tc, &w);
            break;
        case GZ_BODY:
            r = gz_inflate(tc, &w);
            break;
        case GZ_TRAILER:
            r = gz_collect(tc, GZ_TRL_LEN, &w, "gzip: member trailer truncated");
            if (r != RUNNING || tc->gz_got < GZ_TRL_LEN)
                break;
            if (le32(tc->gzbuf) != tc->crc)
                r = fail(tc, -EBADMSG, "gzip: CRC mismatch");
            else if (le32(tc->gzbuf + 4) != tc->isize)
                r = fail(tc, -EBADMSG, "gzip: length mismatch (ISIZE)");
            else if (tc->member_len && tc->pos - tc->member_start != tc->member_len)
                r = fail(tc, -EBADMSG, "gzip: member length field wrong");
            else if (tc->hashing && !digest_claimed(tc))
                r = fail(tc, -EBADMSG, "gzip: member digest wrong");
            else {
                tc->st.gz_members++;
                tc->gz = GZ_HEADER;
                tc->gz_got = 0;
                /* Cacheable: from an entry boundary, and it held exactly
                 * one file entry, whole. */
                if (tc->hashing && tc->cacheable && at_entry_boundary(tc) &&
                    tc->st.members == tc->m_members + 1 && !tc->prev_dir)
                    cache_add(tc);
                tc->hashing = false;
            }
            break;
        }
    }
    if (w.in > tc->st.max_step_in)
        tc->st.max_step_in = w.in;
    if (w.out > tc->st.max_step_out)
        tc->st.max_step_out = w.out;
    return r;
}

/* ------------------------------------------------------------------------ */
/* API                                                                       */
/* ------------------------------------------------------------------------ */

static int run(struct tarcheck *tc, const uint8_t *chunk, size_t base, size_t n, size_t len,
               bool finish)
{
    if (tc->result != RUNNING)
        return tc->result;
    if (len < tc->len || (tc->finished && len != tc->len))
        return fail(tc, -EINVAL, "tarcheck: caller error: the message length went back");
    if (base > len || n > len - base || base > tarcheck_next(tc) ||
        base + n < tarcheck_next(tc))
        return fail(tc, -EINVAL, "tarcheck: caller error: the window misses the next byte");
    tc->len = len;
    tc->finished |= finish;
    if (tc->finished && len == 0) {
        /* Zero-length: "no archive", the host keeps its files (spec 4.4). */
        tc->result = TARCHECK_VALID;
        tc->why = "ok";
        return TARCHECK_VALID;
    }
    tc->win = chunk;
    tc->win_base = base;
    tc->win_end = base + n;
    tc->st.calls++;
    int r = step(tc);
    tc->win = NULL; /* borrowed for the call only */
    return r;
}

int tarcheck_feed(struct tarcheck *tc, const uint8_t *msg, size_t len)
{
    return run(tc, msg, 0, len, len, false);
}

int tarcheck_finish(struct tarcheck *tc, const uint8_t *msg, size_t len)
{
    return run(tc, msg, 0, len, len, true);
}

int tarcheck_feed_at(struct tarcheck *tc, const uint8_t *chunk, size_t base, size_t n,
                     size_t len)
{
    return run(tc, chunk, base, n, len, false);
}

int tarcheck_finish_at(struct tarcheck *tc, const uint8_t *chunk, size_t base, size_t n,
                       size_t len)
{
    return run(tc, chunk, base, n, len, true);
}

size_t tarcheck_next(const struct tarcheck *tc)
{
    return tc->pos;
}

const char *tarcheck_reason(const struct tarcheck *tc)
{
    return tc->why;
}

void tarcheck_get_stats(const struct tarcheck *tc, struct tarcheck_stats *st)
{
    *st = tc->st;
}

struct tarcheck_cache *tarcheck_cache_new(uint64_t max_bytes, struct budget *budget)
{
    struct tarcheck_cache *c = calloc(1, sizeof *c);

    if (!c)
        return NULL;
    c->max_bytes = max_bytes;
    c->budget = budget;
    return c;
}

void tarcheck_cache_free(struct tarcheck_cache *c)
{
    if (!c)
        return;
    for (size_t b = 0; c->bucket && b < CACHE_BUCKETS; b++)
        for (struct cache_entry *e = c->bucket[b], *next; e; e = next) {
            next = e->next;
            free(e);
        }
    free(c->bucket);
    if (c->budget)
        budget_give(c->budget, c->bytes);
    free(c);
}

void tarcheck_set_cache(struct tarcheck *tc, struct tarcheck_cache *c)
{
    tc->cache = c;
    if (c)
        c->gen++;
}

void tarcheck_set_member_fn(struct tarcheck *tc, tarcheck_member_fn fn, void *ud)
{
    tc->fn = fn;
    tc->ud = ud;
}

struct tarcheck *tarcheck_new(const struct tarcheck_limits *lim)
{
    struct tarcheck *tc = calloc(1, sizeof *tc);
    size_t path_buf, cur_buf;

    if (!tc)
        return NULL;
    tc->lim = *lim;
    if (tc->lim.max_path == 0)
        tc->lim.max_path = TARCHECK_DEFAULT_MAX_PATH;
    if (tc->lim.max_path > TARCHECK_MAX_PATH_CEILING)
        tc->lim.max_path = TARCHECK_MAX_PATH_CEILING;
    if (tc->lim.step_budget == 0)
        tc->lim.step_budget = TARCHECK_STEP_BUDGET;
    if (tc->lim.max_inflated == 0)
        tc->lim.max_inflated = tarcheck_inflated_bound(tc->lim.max_data, tc->lim.max_members,
                                                       tc->lim.max_path);
    tc->pax_max = pax_max_for(tc->lim.max_path);
    path_buf = tc->lim.max_path + 2;
    /* A ustar name is built before its length is checked: up to 155 + 1 + 100. */
    cur_buf = (tc->lim.max_path > 256 ? tc->lim.max_path : 256) + 2;
    tc->pax = malloc(tc->pax_max);
    tc->pax_path = malloc(path_buf);
    tc->prev = malloc(path_buf);
    tc->cur = malloc(cur_buf);
    tc->out = malloc(OUT_CHUNK);
    if (!tc->pax || !tc->pax_path || !tc->prev || !tc->cur || !tc->out) {
        tarcheck_free(tc);
        return NULL;
    }
    tc->result = RUNNING;
    tc->why = "incomplete";
    tc->gz = GZ_HEADER;
    tc->tar = TAR_HEADER;
    return tc;
}

void tarcheck_free(struct tarcheck *tc)
{
    if (!tc)
        return;
    if (tc->z_init)
        inflateEnd(&tc->z);
    free(tc->pax);
    free(tc->pax_path);
    free(tc->prev);
    free(tc->cur);
    free(tc->out);
    free(tc);
}
