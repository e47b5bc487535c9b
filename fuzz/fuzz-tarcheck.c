/* The supervisor's snapshot check (proto/tarcheck.h) against libarchive,
 * which is linked into this target only (the supervisor never runs it).
 *
 * Input: byte 0 seeds the chunking (fuzz_chunker), byte 1 holds flags, the
 * rest is the message or what it is made from:
 *   0x03  0: the rest is the message as it is (fuzzes the gzip layer);
 *         1: the rest is a tar stream, gzip-compressed here in one member,
 *         so mutations land in the tar headers and not in deflate's bits;
 *         2: the same in two members, split at 61 x byte 0 (mod size);
 *         3: one member at level 0 (stored blocks) plus an empty member
 *   0x04  small limits (4 KiB of data, 8 members, paths of 200 bytes)
 *         instead of 1 MiB, 1000 and 4095
 *   0x08  a small step budget (1 + 3 * byte 0) in the chunked run
 *   0x10  (shapes 1 to 3) the tar stream is cut at 512-byte blocks into
 *         members of 1 to 4 blocks (byte 0 picks), each with the writer's
 *         FB length subfield, so that members line up with tar entries and
 *         the verified-member cache (tarcheck_cache) is exercised
 *
 * Properties:
 *   - the verdict (result, reason, every member reported) is the same fed
 *     in one piece with the default budget and in the chunking and budget
 *     the input picks; only documented results come back; and the same
 *     streamed (tarcheck_feed_at: each chunk a buffer of its own, only the
 *     chunks from tarcheck_keep_from() on kept, at most max_hold and two
 *     chunks), with and without a warm cache;
 *   - the limits hold: members, data, and bytes inflated within their caps
 *     (inflated at most one byte past max_inflated), and no call inflates or
 *     consumes more than its budget (plus a member header's extra field,
 *     collected whole);
 *   - with a cache: checked again with a cache warmed by the message
 *     itself, and a variant of it (two of its FB members swapped, one
 *     dropped or one repeated, byte 0 picks) checked with and without
 *     that cache: the same verdict; the same reason and members, but a
 *     refusal's reason may differ when a member was replayed (one whose
 *     FB digest lies is refused either way); and the cache's budget
 *     charge is all given back when it is freed;
 *   - when the check accepts, libarchive (gzip + tar, C.UTF-8) reads exactly
 *     the members the check reported, in order: the same path (a
 *     directory's with its one trailing '/'), type, permission bits and
 *     size; no link, no owner, no device; every data block reads without
 *     error and the archive ends in ARCHIVE_EOF, through exactly one gzip
 *     filter. */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <locale.h>
#include <string.h>
#include <zlib.h>

#include "core/budget.h"
#include <nettle/sha2.h>
#include "fuzz.h"
#include "proto/tarcheck.h"

#define MAX_SEEN 2048

enum {
    F_SHAPE = 0x03,
    F_SMALL = 0x04,
    F_BUDGET = 0x08,
    F_FB = 0x10,
};

struct seen_member {
    char *path;
    char type;
    uint32_t mode;
    uint64_t size;
};

struct seen {
    size_t n;
    struct seen_member m[MAX_SEEN];
};

static void on_member(void *ud, const struct tarcheck_member *m)
{
    struct seen *s = ud;

    FUZZ_ASSERT(strlen(m->path) == m->path_len, "path_len %zu", m->path_len);
    FUZZ_ASSERT(m->type == '0' || m->type == '5', "type %d", m->type);
    FUZZ_ASSERT((m->mode & ~0755u) == 0, "mode %o", m->mode);
    if (s->n < MAX_SEEN) {
        s->m[s->n].path = strdup(m->path);
        s->m[s->n].type = m->type;
        s->m[s->n].mode = m->mode;
        s->m[s->n].size = m->size;
    }
    s->n++;
}

static void seen_free(struct seen *s)
{
    for (size_t i = 0; i < s->n && i < MAX_SEEN; i++)
        free(s->m[i].path);
    s->n = 0;
}

struct outcome {
    int rc;
    const char *why;
    struct tarcheck_stats st;
};

static struct outcome run_c(const uint8_t *msg, size_t len, const struct tarcheck_limits *lim,
                            uint8_t seed, struct seen *seen, struct tarcheck_cache *cache)
{
    struct tarcheck *tc = tarcheck_new(lim);
    struct fuzz_chunker ch;
    struct outcome o;
    size_t got = 0;
    int r = TARCHECK_NEED_INPUT;

    FUZZ_ASSERT(tc, "tarcheck_new failed");
    tarcheck_set_member_fn(tc, on_member, seen);
    tarcheck_set_cache(tc, cache);
    fuzz_chunker_init(&ch, seed);
    while (got < len && r >= 0) {
        got += fuzz_chunker_next(&ch, len - got);
        do
            r = tarcheck_feed(tc, msg, got);
        while (r == TARCHECK_AGAIN);
        FUZZ_ASSERT(r == TARCHECK_NEED_INPUT || r < 0, "feed returned %d", r);
    }
    while (r >= 0 && (r = tarcheck_finish(tc, msg, len)) == TARCHECK_AGAIN)
        ;
    o.rc = r;
    o.why = tarcheck_reason(tc);
    tarcheck_get_stats(tc, &o.st);
    tarcheck_free(tc);
    FUZZ_ASSERT(o.rc == TARCHECK_VALID || o.rc == -EBADMSG || o.rc == -EFBIG ||
                    o.rc == -E2BIG || o.rc == -ENAMETOOLONG,
                "undocumented result %d (%s)", o.rc, o.why);
    return o;
}

static struct outcome run(const uint8_t *msg, size_t len, const struct tarcheck_limits *lim,
                          uint8_t seed, struct seen *seen)
{
    return run_c(msg, len, lim, seed, seen, NULL);
}

/* Streamed, as a relay checks a message it passes on: the message arrives
 * in chunks (byte 0 picks), each copied into a buffer of its own; only the
 * chunks from tarcheck_next() on are kept (at most two: nothing is read
 * twice), and each call gets the one holding it. */
struct kept {
    uint8_t *p;
    size_t base, n;
};

static struct outcome run_w(const uint8_t *msg, size_t len, const struct tarcheck_limits *lim,
                            uint8_t seed, struct seen *seen, struct tarcheck_cache *cache)
{
    static struct kept *k;
    static size_t kcap;
    struct tarcheck *tc = tarcheck_new(lim);
    struct fuzz_chunker ch;
    struct outcome o;
    size_t nk = 0, got = 0, biggest = 0;
    int r = TARCHECK_NEED_INPUT;

    FUZZ_ASSERT(tc, "tarcheck_new failed");
    tarcheck_set_member_fn(tc, on_member, seen);
    tarcheck_set_cache(tc, cache);
    fuzz_chunker_init(&ch, seed | 1);
    while (r == TARCHECK_NEED_INPUT || r == TARCHECK_AGAIN) {
        size_t nx = tarcheck_next(tc), i = 0;
        while (i < nk && !(k[i].base <= nx && nx < k[i].base + k[i].n))
            i++;
        if (i == nk && nx == got && got < len) { /* more arrives */
            size_t n = fuzz_chunker_next(&ch, len - got);
            if (nk == kcap) {
                kcap = kcap ? 2 * kcap : 64;
                k = realloc(k, kcap * sizeof *k);
                FUZZ_ASSERT(k, "realloc");
            }
            k[nk] = (struct kept){malloc(n), got, n};
            FUZZ_ASSERT(k[nk].p, "malloc");
            memcpy(k[nk].p, msg + got, n);
            got += n;
            biggest = n > biggest ? n : biggest;
            i = nk++;
        }
        FUZZ_ASSERT(i < nk || nx == got, "the check wants byte %zu, dropped (kept from %zu)", nx,
                    nk ? k[0].base : got);
        const uint8_t *p = i < nk ? k[i].p : NULL;
        size_t base = i < nk ? k[i].base : got, n = i < nk ? k[i].n : 0;
        r = got == len ? tarcheck_finish_at(tc, p, base, n, len)
                       : tarcheck_feed_at(tc, p, base, n, got);
        size_t keep = tarcheck_next(tc), j = 0, held = 0;
        while (j < nk && k[j].base + k[j].n <= keep)
            free(k[j++].p);
        if (j) /* (k may still be NULL: nothing kept yet) */
            memmove(k, k + j, (nk - j) * sizeof *k);
        nk -= j;
        for (j = 0; j < nk; j++)
            held += k[j].n;
        FUZZ_ASSERT(held <= 2 * biggest, "kept %zu bytes (chunks %zu)", held, biggest);
    }
    for (size_t j = 0; j < nk; j++)
        free(k[j].p);
    o.rc = r;
    o.why = tarcheck_reason(tc);
    tarcheck_get_stats(tc, &o.st);
    tarcheck_free(tc);
    return o;
}

static void gz_append(uint8_t **out, size_t *len, size_t *cap, const uint8_t *p, size_t n,
                      int level)
{
    z_stream z = {0};
    size_t bound;

    FUZZ_ASSERT(deflateInit2(&z, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) ==
                    Z_OK, "deflateInit2");
    bound = deflateBound(&z, n) + 32;
    if (*len + bound > *cap) {
        *cap = *len + bound;
        *out = realloc(*out, *cap);
        FUZZ_ASSERT(*out, "realloc");
    }
    z.next_in = (Bytef *)p;
    z.avail_in = (uInt)n;
    z.next_out = *out + *len;
    z.avail_out = (uInt)(*cap - *len);
    FUZZ_ASSERT(deflate(&z, Z_FINISH) == Z_STREAM_END, "deflate");
    *len += (*cap - *len) - z.avail_out;
    deflateEnd(&z);
}

/* One member like gz_append's, with the writer's FB subfield (tarcheck.h:
 * its length and the digest of its bytes after the header) after its
 * 10-byte header. */
static void gz_append_fb(uint8_t **out, size_t *len, size_t *cap, const uint8_t *p, size_t n,
                         int level)
{
    const size_t extra = TARCHECK_GZ_HDR_LEN - 10;
    size_t start = *len, mlen;

    gz_append(out, len, cap, p, n, level);
    mlen = *len - start + extra;
    if (*len + extra > *cap) {
        *cap = *len + extra;
        *out = realloc(*out, *cap);
        FUZZ_ASSERT(*out, "realloc");
    }
    memmove(*out + start + TARCHECK_GZ_HDR_LEN, *out + start + 10, *len - start - 10);
    (*out)[start + 3] = 4; /* FLG.FEXTRA */
    uint8_t x[TARCHECK_GZ_HDR_LEN - 10] = {TARCHECK_GZ_XLEN, 0, TARCHECK_GZ_SI1, TARCHECK_GZ_SI2,
                                           TARCHECK_GZ_FB_LEN, 0, (uint8_t)mlen,
                                           (uint8_t)(mlen >> 8), (uint8_t)(mlen >> 16),
                                           (uint8_t)(mlen >> 24)};
    struct sha256_ctx sha;
    sha256_init(&sha);
    sha256_update(&sha, mlen - TARCHECK_GZ_HDR_LEN, *out + start + TARCHECK_GZ_HDR_LEN);
    sha256_digest(&sha, SHA256_DIGEST_SIZE, x + 10);
    memcpy(*out + start + 10, x, sizeof x);
    *len += extra;
}

/* The FB members of msg (offsets and lengths), or -1 if it is not made of
 * them exactly. */
static int fb_split(const uint8_t *msg, size_t len, size_t *off, size_t *mlen, int max)
{
    size_t o = 0;
    int n = 0;

    while (o < len) {
        if (n == max || len - o < TARCHECK_GZ_HDR_LEN || msg[o + 3] != 4)
            return -1;
        off[n] = o;
        mlen[n] = (size_t)msg[o + 16] | (size_t)msg[o + 17] << 8 | (size_t)msg[o + 18] << 16 |
                  (size_t)msg[o + 19] << 24;
        if (mlen[n] == 0 || mlen[n] > len - o)
            return -1;
        o += mlen[n++];
    }
    return n;
}

/* What a cache may change: nothing of an accepted message, and of a refused
 * one only the reason, when the cached run replayed a member (one whose FB
 * digest lies is known as it starts and refused at its end for its digest
 * or its truncation; inflated, it may fail first for another reason). */
static bool same_outcome_or_lie(const struct outcome *a, const struct seen *sa,
                                const struct outcome *b, const struct seen *sb);

static bool same_outcome(const struct outcome *a, const struct seen *sa, const struct outcome *b,
                         const struct seen *sb)
{
    if (a->rc != b->rc || strcmp(a->why, b->why) || sa->n != sb->n)
        return false;
    for (size_t i = 0; i < sa->n && i < MAX_SEEN; i++)
        if (strcmp(sa->m[i].path, sb->m[i].path) || sa->m[i].size != sb->m[i].size ||
            sa->m[i].mode != sb->m[i].mode || sa->m[i].type != sb->m[i].type)
            return false;
    return true;
}

static bool same_outcome_or_lie(const struct outcome *a, const struct seen *sa,
                                const struct outcome *b, const struct seen *sb)
{
    return same_outcome(a, sa, b, sb) ||
           (a->rc < 0 && b->rc < 0 && (a->st.cache_hits > 0 || b->st.cache_hits > 0));
}

/* The cache property (see the top): warmed by msg, the same verdicts. */
static void check_cache(const uint8_t *msg, size_t len, const struct tarcheck_limits *lim,
                        uint8_t seed, const struct outcome *plain, const struct seen *plain_seen)
{
    static struct seen s1, s2, s3;
    struct budget turn = {.max = 1 << 20};
    struct tarcheck_cache *c = tarcheck_cache_new(1 << 20, &turn);
    size_t off[256], mlen[256];
    int n = fb_split(msg, len, off, mlen, 256);

    FUZZ_ASSERT(c, "tarcheck_cache_new");
    struct outcome w = run_c(msg, len, lim, 0, &s1, c);
    FUZZ_ASSERT(same_outcome_or_lie(plain, plain_seen, &w, &s1), "a cold cache changed the verdict");
    struct outcome h = run_c(msg, len, lim, seed, &s2, c);
    FUZZ_ASSERT(same_outcome_or_lie(plain, plain_seen, &h, &s2),
                "a warm cache changed the verdict: %d '%s' vs %d '%s' (%llu hits)", plain->rc,
                plain->why, h.rc, h.why, (unsigned long long)h.st.cache_hits);
    seen_free(&s2);
    h = run_w(msg, len, lim, seed, &s2, c);
    FUZZ_ASSERT(same_outcome_or_lie(plain, plain_seen, &h, &s2),
                "a warm cache changed the streamed verdict: %d '%s' vs %d '%s' (%llu hits)",
                plain->rc, plain->why, h.rc, h.why, (unsigned long long)h.st.cache_hits);
    seen_free(&s1);
    seen_free(&s2);
    if (n >= 2) {
        /* A variant built from the same members. */
        int i = seed % n, j = (seed / 7) % n, op = (seed / 3) % 3;
        uint8_t *v = malloc(len * 2);
        size_t vl = 0;

        FUZZ_ASSERT(v, "malloc");
        for (int k = 0; k < n; k++) {
            int src = op == 0 ? (k == i ? j : k == j ? i : k) : k;

            if (op == 1 && k == i)
                continue; /* dropped */
            memcpy(v + vl, msg + off[src], mlen[src]);
            vl += mlen[src];
            if (op == 2 && k == i) { /* repeated */
                memcpy(v + vl, msg + off[src], mlen[src]);
                vl += mlen[src];
            }
        }
        struct outcome p = run(v, vl, lim, 0, &s3);
        struct outcome q = run_c(v, vl, lim, seed, &s1, c);
        FUZZ_ASSERT(same_outcome_or_lie(&p, &s3, &q, &s1),
                    "the cache changed the verdict on a variant: %d '%s' vs %d '%s'", p.rc,
                    p.why, q.rc, q.why);
        seen_free(&s1);
        seen_free(&s3);
        free(v);
    }
    tarcheck_cache_free(c);
    FUZZ_ASSERT(turn.used == 0, "the cache kept %llu bytes of its charge",
                (unsigned long long)turn.used);
}

/* libarchive's reading of an accepted message. */
static void compare_libarchive(const uint8_t *msg, size_t len, const struct seen *seen)
{
    struct archive *a = archive_read_new();
    struct archive_entry *e;
    size_t i = 0;
    int r;

    FUZZ_ASSERT(a, "archive_read_new");
    archive_read_support_filter_gzip(a);
    archive_read_support_format_tar(a);
    if (len == 0) {
        FUZZ_ASSERT(seen->n == 0, "empty message with members");
        archive_read_free(a);
        return;
    }
    r = archive_read_open_memory(a, msg, len);
    FUZZ_ASSERT(r == ARCHIVE_OK, "libarchive cannot open an accepted archive: %s",
                archive_error_string(a));
    for (;;) {
        const char *path, *want;
        size_t plen;
        const void *buf;
        size_t n;
        la_int64_t off;

        r = archive_read_next_header(a, &e);
        if (r == ARCHIVE_EOF)
            break;
        FUZZ_ASSERT(r == ARCHIVE_OK, "libarchive header %zu: %d %s", i, r,
                    archive_error_string(a));
        FUZZ_ASSERT(i < seen->n, "libarchive reads more members than the check saw (%zu)",
                    seen->n);
        if (i >= MAX_SEEN) {
            i++;
            continue;
        }
        const struct seen_member *m = &seen->m[i];
        path = archive_entry_pathname(e);
        want = m->path;
        FUZZ_ASSERT(path, "member %zu without a path", i);
        plen = strlen(path);
        if (m->type == '5') {
            FUZZ_ASSERT(archive_entry_filetype(e) == AE_IFDIR, "member %zu: type %o, check: dir",
                        i, (unsigned)archive_entry_filetype(e));
            FUZZ_ASSERT(plen == strlen(want) + 1 && path[plen - 1] == '/' &&
                            !memcmp(path, want, plen - 1),
                        "dir %zu: libarchive '%s', check '%s'", i, path, want);
        } else {
            FUZZ_ASSERT(archive_entry_filetype(e) == AE_IFREG, "member %zu: type %o, check: file",
                        i, (unsigned)archive_entry_filetype(e));
            FUZZ_ASSERT(!strcmp(path, want), "file %zu: libarchive '%s', check '%s'", i, path,
                        want);
        }
        FUZZ_ASSERT((uint32_t)archive_entry_perm(e) == m->mode, "member %zu: mode %o vs %o", i,
                    (unsigned)archive_entry_perm(e), m->mode);
        FUZZ_ASSERT(archive_entry_size_is_set(e) && (uint64_t)archive_entry_size(e) == m->size,
                    "member %zu: size %lld vs %llu", i, (long long)archive_entry_size(e),
                    (unsigned long long)m->size);
        FUZZ_ASSERT(!archive_entry_hardlink(e) && !archive_entry_symlink(e),
                    "member %zu has a link", i);
        const char *un = archive_entry_uname(e), *gn = archive_entry_gname(e);
        FUZZ_ASSERT(archive_entry_uid(e) == 0 && archive_entry_gid(e) == 0 && (!un || !un[0]) &&
                        (!gn || !gn[0]),
                    "member %zu has an owner", i);
        FUZZ_ASSERT(archive_entry_rdev(e) == 0, "member %zu has a device number", i);
        FUZZ_ASSERT(archive_entry_sparse_count(e) == 0 && archive_entry_xattr_count(e) == 0,
                    "member %zu: sparse map or xattrs", i);
        uint64_t total = 0;
        while ((r = archive_read_data_block(a, &buf, &n, &off)) == ARCHIVE_OK)
            total += n;
        FUZZ_ASSERT(r == ARCHIVE_EOF, "member %zu data: %s", i, archive_error_string(a));
        FUZZ_ASSERT(total == m->size, "member %zu: %llu data bytes read, size %llu", i,
                    (unsigned long long)total, (unsigned long long)m->size);
        i++;
    }
    FUZZ_ASSERT(i == seen->n, "libarchive read %zu members, the check saw %zu", i, seen->n);
    FUZZ_ASSERT(archive_filter_count(a) == 2 && archive_filter_code(a, 0) == ARCHIVE_FILTER_GZIP,
                "not exactly one gzip filter");
    archive_read_free(a);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* libarchive converts pax paths (UTF-8) to the locale's charset. */
    setlocale(LC_ALL, "C.UTF-8");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct tarcheck_limits lim = {
        .max_data = 1024 * 1024, .max_members = 1000, .max_path = 4095,
    };
    static struct seen one, chunked;
    uint8_t *msg = NULL, seed, flags;
    size_t len = 0, cap = 0;

    if (size < 2)
        return 0;
    seed = data[0];
    flags = data[1];
    data += 2;
    size -= 2;
    if ((flags & F_FB) && (flags & F_SHAPE)) {
        /* Members of 1 to 4 blocks, sizes from byte 0's bits. */
        size_t o = 0;
        unsigned bits = seed;

        while (o < size) {
            size_t n = (size_t)(1 + (bits & 3)) * 512;

            bits = bits >> 2 | (bits & 3) << 6;
            if (n > size - o)
                n = size - o;
            gz_append_fb(&msg, &len, &cap, data + o, n, (flags & F_SHAPE) == 3 ? 0 : 1);
            o += n;
        }
        if (size == 0)
            gz_append_fb(&msg, &len, &cap, data, 0, 1);
    } else switch (flags & F_SHAPE) {
    case 0:
        msg = malloc(size ? size : 1);
        FUZZ_ASSERT(msg, "malloc");
        memcpy(msg, data, size);
        len = size;
        break;
    case 1:
        gz_append(&msg, &len, &cap, data, size, 1);
        break;
    case 2: {
        size_t cut = (size_t)seed * 61 % (size + 1);
        gz_append(&msg, &len, &cap, data, cut, 1);
        gz_append(&msg, &len, &cap, data + cut, size - cut, 6);
        break;
    }
    default:
        gz_append(&msg, &len, &cap, data, size, 0);
        gz_append(&msg, &len, &cap, data, 0, 6);
        break;
    }
    if (flags & F_SMALL) {
        lim.max_data = 4096;
        lim.max_members = 8;
        lim.max_path = 200;
    }

    struct outcome a = run(msg, len, &lim, 0, &one);
    struct tarcheck_limits lim2 = lim;
    if (flags & F_BUDGET)
        lim2.step_budget = 1 + 3 * (size_t)seed;
    struct outcome b = run(msg, len, &lim2, seed, &chunked);

    FUZZ_ASSERT(a.rc == b.rc && !strcmp(a.why, b.why),
                "chunking changed the verdict: %d '%s' vs %d '%s'", a.rc, a.why, b.rc, b.why);
    FUZZ_ASSERT(one.n == chunked.n, "chunking changed the members: %zu vs %zu", one.n,
                chunked.n);
    for (size_t i = 0; i < one.n && i < MAX_SEEN; i++)
        FUZZ_ASSERT(!strcmp(one.m[i].path, chunked.m[i].path) &&
                        one.m[i].size == chunked.m[i].size && one.m[i].mode == chunked.m[i].mode,
                    "chunking changed member %zu", i);
    FUZZ_ASSERT(one.n <= lim.max_members + 0 && a.st.members <= lim.max_members,
                "members past the limit");
    FUZZ_ASSERT(a.st.data <= lim.max_data, "data past the limit");
    uint64_t max_infl = tarcheck_inflated_bound(lim.max_data, lim.max_members, lim.max_path);
    FUZZ_ASSERT(a.st.inflated <= max_infl + 1 && b.st.inflated <= max_infl + 1,
                "inflated %llu past the bound %llu", (unsigned long long)a.st.inflated,
                (unsigned long long)max_infl);
    size_t budget = lim2.step_budget ? lim2.step_budget : TARCHECK_STEP_BUDGET;
    FUZZ_ASSERT(b.st.max_step_out <= budget &&
                    b.st.max_step_in <= budget + TARCHECK_GZ_HDR_LEN - 10,
                "a call worked past its budget %zu: in %llu out %llu", budget,
                (unsigned long long)b.st.max_step_in, (unsigned long long)b.st.max_step_out);

    static struct seen streamed;
    struct outcome w = run_w(msg, len, &lim, seed, &streamed, NULL);
    FUZZ_ASSERT(same_outcome(&a, &one, &w, &streamed),
                "streaming changed the verdict: %d '%s' vs %d '%s'", a.rc, a.why, w.rc, w.why);
    seen_free(&streamed);
    check_cache(msg, len, &lim, seed, &a, &one);
    if (a.rc == TARCHECK_VALID)
        compare_libarchive(msg, len, &one);
    seen_free(&one);
    seen_free(&chunked);
    free(msg);
    return 0;
}
