/* proto/tarcheck: the supervisor's check of a workspace snapshot.
 *
 * Archives are built byte by byte here (ustar headers, pax records, gzip
 * members with zlib), so each refused shape is spelled out; every verdict is
 * checked in many chunkings and step budgets, which must all agree. The end
 * of the file checks the other half of the contract: whatever tree
 * archive_snapshot() (the sandbox's writer) is given, its archive passes.
 * Runs as root (it makes files of every mode). */
#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "../../fuzz/fuzz.h" /* fuzz_chunker */
#include "core/budget.h"
#include "core/buf.h"
#include "proto/tarcheck.h"
#include "stage/archive.h"
#include "mem.h"
#include "tap.h"

#define MiB_ (1024ULL * 1024ULL)

/* fuzz.h declares the fuzz entry point; this program has none. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)data;
    (void)size;
    return 0;
}

/* ---- byte building ------------------------------------------------------ */

static void mem_zeros(struct mem *m, size_t n)
{
    static const uint8_t z[4096];

    while (n) {
        size_t k = n < sizeof z ? n : sizeof z;
        mem_add(m, z, k);
        n -= k;
    }
}

static void mem_free(struct mem *m)
{
    free(m->p);
    memset(m, 0, sizeof *m);
}

static void octal(uint8_t *h, size_t off, size_t w, uint64_t v)
{
    /* libarchive's form: w-2 digits, ' ', NUL (for size/mtime: w-1 digits, ' '). */
    size_t digits = w == 12 ? 11 : 6;
    char tmp[32];

    snprintf(tmp, sizeof tmp, "%0*llo", (int)digits, (unsigned long long)v);
    memcpy(h + off, tmp, digits);
    h[off + digits] = ' ';
    if (digits + 1 < w)
        h[off + digits + 1] = '\0';
}

static void set_checksum(uint8_t *h)
{
    unsigned sum = 0;
    char tmp[16];

    memset(h + 148, ' ', 8);
    for (int i = 0; i < 512; i++)
        sum += h[i];
    snprintf(tmp, sizeof tmp, "%06o", sum);
    memcpy(h + 148, tmp, 6);
    h[154] = '\0';
    h[155] = ' ';
}

/* A header as libarchive's pax writer makes it. name goes into the name
 * field (at most 100 bytes), prefix (may be NULL) into the prefix field. */
static void make_header(uint8_t *h, const char *name, const char *prefix, char type,
                        unsigned mode, uint64_t size)
{
    memset(h, 0, 512);
    memcpy(h, name, strnlen(name, 100));
    octal(h, 100, 8, mode);
    octal(h, 108, 8, 0);
    octal(h, 116, 8, 0);
    octal(h, 124, 12, size);
    octal(h, 136, 12, 1700000000);
    h[156] = (uint8_t)type;
    memcpy(h + 257, "ustar\0" "00", 8);
    octal(h, 329, 8, 0);
    octal(h, 337, 8, 0);
    if (prefix)
        memcpy(h + 345, prefix, strnlen(prefix, 155));
    set_checksum(h);
}

static void tar_header(struct mem *t, const char *name, char type, unsigned mode, uint64_t size)
{
    uint8_t h[512];

    make_header(h, name, NULL, type, mode, size);
    mem_add(t, h, 512);
}

static void tar_data(struct mem *t, const void *p, size_t n)
{
    mem_add(t, p, n);
    mem_zeros(t, (512 - n % 512) % 512);
}

static void tar_file(struct mem *t, const char *name, const char *data)
{
    tar_header(t, name, '0', 0644, strlen(data));
    tar_data(t, data, strlen(data));
}

/* One pax record, length computed as libarchive's add_pax_attr does. */
static void pax_rec(struct mem *b, const char *key, const void *val, size_t vlen)
{
    size_t len = 1 + strlen(key) + 1 + vlen + 1, digits = 0, next = 1;
    char num[24];

    for (size_t i = len; i; i /= 10)
        digits++, next *= 10;
    if (len + digits >= next)
        digits++;
    snprintf(num, sizeof num, "%zu ", len + digits);
    mem_add(b, num, strlen(num));
    mem_add(b, key, strlen(key));
    mem_add(b, "=", 1);
    mem_add(b, val, vlen);
    mem_add(b, "\n", 1);
}

static void tar_pax(struct mem *t, const struct mem *recs)
{
    tar_header(t, "PaxHeader/x", 'x', 0644, recs->len);
    tar_data(t, recs->p, recs->len);
}

/* A file whose name comes from a pax path record. */
static void tar_pax_file(struct mem *t, const char *path, const char *data)
{
    struct mem r = {0};

    pax_rec(&r, "path", path, strlen(path));
    pax_rec(&r, "mtime", "1700000000.5", 12);
    tar_pax(t, &r);
    mem_free(&r);
    tar_header(t, "truncated-name-ignored", '0', 0644, strlen(data));
    tar_data(t, data, strlen(data));
}

static void tar_end(struct mem *t)
{
    mem_zeros(t, 1024);
}

/* A gzip member (zlib: FLG 0, MTIME 0, OS 3) of p[0, n). */
static void gz_member(struct mem *out, const void *p, size_t n, int level)
{
    z_stream z = {0};
    uint8_t buf[65536];
    int r;

    if (deflateInit2(&z, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        abort();
    z.next_in = (Bytef *)p;
    z.avail_in = (uInt)n;
    do {
        z.next_out = buf;
        z.avail_out = sizeof buf;
        r = deflate(&z, Z_FINISH);
        mem_add(out, buf, sizeof buf - z.avail_out);
    } while (r == Z_OK);
    if (r != Z_STREAM_END)
        abort();
    deflateEnd(&z);
}

static struct mem gz(const struct mem *tar)
{
    struct mem g = {0};

    gz_member(&g, tar->p, tar->len, 6);
    return g;
}

/* ---- running the check ------------------------------------------------- */

struct seen {
    int n;
    char last[4200];
    char type[64];
    uint32_t mode[64];
    uint64_t size[64];
    char names[64][160];
};

static void on_member(void *ud, const struct tarcheck_member *m)
{
    struct seen *s = ud;

    if (s->n < 64) {
        s->type[s->n] = m->type;
        s->mode[s->n] = m->mode;
        s->size[s->n] = m->size;
        snprintf(s->names[s->n], sizeof s->names[0], "%s", m->path);
    }
    snprintf(s->last, sizeof s->last, "%s", m->path);
    s->n++;
}

struct run {
    int rc;
    const char *why;
    struct tarcheck_stats st;
    struct seen seen;
};

/* Feed msg in the chunking given by seed (fuzz_chunker: 0 = one chunk) with
 * the given budget, moving the buffer between calls (the caller's buffer
 * may be reallocated). */
static struct run run_cached(const uint8_t *msg, size_t len, const struct tarcheck_limits *lim,
                             uint8_t seed, struct tarcheck_cache *cache)
{
    struct tarcheck *tc = tarcheck_new(lim);
    struct fuzz_chunker ch;
    struct run out = {0};
    uint8_t *copy = malloc(len ? len : 1);
    size_t got = 0;
    int r = TARCHECK_NEED_INPUT;

    if (!tc || !copy)
        abort();
    tarcheck_set_member_fn(tc, on_member, &out.seen);
    tarcheck_set_cache(tc, cache);
    fuzz_chunker_init(&ch, seed);
    while (got < len && r >= 0) {
        got += fuzz_chunker_next(&ch, len - got);
        /* A fresh buffer each time, holding only what has "arrived". */
        uint8_t *moved = malloc(got);
        memcpy(moved, msg, got);
        free(copy);
        copy = moved;
        do
            r = tarcheck_feed(tc, copy, got);
        while (r == TARCHECK_AGAIN);
    }
    while (r >= 0 && (r = tarcheck_finish(tc, copy, len)) == TARCHECK_AGAIN)
        ;
    out.rc = r;
    out.why = tarcheck_reason(tc);
    tarcheck_get_stats(tc, &out.st);
    tarcheck_free(tc);
    free(copy);
    return out;
}

static struct run run_once(const uint8_t *msg, size_t len, const struct tarcheck_limits *lim,
                           uint8_t seed)
{
    return run_cached(msg, len, lim, seed, NULL);
}

static const struct tarcheck_limits default_lim = {
    .max_data = 100 * MiB_, .max_members = 1000, .max_path = 4095,
};

/* The verdict on msg, required to be the same in every chunking and
 * budget; also checks that no call worked past its budget. */
static struct run check_lim(const struct mem *m, const struct tarcheck_limits *lim)
{
    static const size_t budgets[] = { 0, 1, 7, 512, 4096, 100000 };
    struct run first = run_once(m->p, m->len, lim, 0);
    bool same = true, bounded = true;

    for (size_t b = 0; b < sizeof budgets / sizeof *budgets; b++) {
        struct tarcheck_limits l = *lim;

        l.step_budget = budgets[b];
        for (int seed = 0; seed < (budgets[b] == 1 ? 4 : 24); seed++) {
            struct run r = run_once(m->p, m->len, &l, (uint8_t)(seed * 11));
            size_t cap = budgets[b] ? budgets[b] : TARCHECK_STEP_BUDGET;

            if (r.rc != first.rc || strcmp(r.why, first.why) || r.seen.n != first.seen.n ||
                strcmp(r.seen.last, first.seen.last)) {
                if (same)
                    printf("# budget %zu seed %d: %d '%s' vs %d '%s'\n", budgets[b], seed, r.rc,
                           r.why, first.rc, first.why);
                same = false;
            }
            /* A step may finish the header, extra field or trailer it
             * started (<= 42 bytes) and the inflate call that reached the
             * budget. */
            if (r.st.max_step_in > cap + TARCHECK_GZ_HDR_LEN - 10 || r.st.max_step_out > cap)
                bounded = false;
        }
    }
    ok(same, "every chunking and budget gives the same verdict (%d, %s)", first.rc, first.why);
    ok(bounded, "no call works past its budget");
    return first;
}

static struct run check(const struct mem *m)
{
    return check_lim(m, &default_lim);
}

static void expect_ok(const struct mem *tar, const char *what)
{
    struct mem g = gz(tar);
    struct run r = check(&g);

    is_int(r.rc, TARCHECK_VALID, "accepted: %s (%s)", what, r.why);
    mem_free(&g);
}

/* Refused with err and a reason that starts with why. */
static void expect_gz(const struct mem *g, int err, const char *why, const char *what)
{
    struct run r = check(g);

    ok(r.rc == err && strncmp(r.why, why, strlen(why)) == 0, "refused: %s", what);
    if (r.rc != err || strncmp(r.why, why, strlen(why)))
        printf("#   got %d '%s', expected %d '%s'\n", r.rc, r.why, err, why);
}

static void expect_bad(const struct mem *tar, int err, const char *why, const char *what)
{
    struct mem g = gz(tar);

    expect_gz(&g, err, why, what);
    mem_free(&g);
}

/* ---- accepted shapes ---------------------------------------------------- */

static void test_accept(void)
{
    struct mem t = {0}, g = {0};
    struct run r;

    /* Zero-length message: "no archive" (spec 4.4). */
    r = check(&g);
    is_int(r.rc, TARCHECK_VALID, "zero-length message is valid");
    is_int(r.seen.n, 0, "... with no members");

    tar_end(&t);
    expect_ok(&t, "empty archive (two zero blocks)");
    mem_free(&t);

    tar_file(&t, "a.txt", "hello");
    tar_file(&t, "b/c.txt", "");
    tar_header(&t, "b/d/", '5', 0755, 0);
    tar_file(&t, "b/d/e", "x");
    tar_header(&t, "exec.sh", '0', 0755, 3);
    tar_data(&t, "#!\n", 3);
    tar_end(&t);
    g = gz(&t);
    r = check(&g);
    is_int(r.rc, TARCHECK_VALID, "files, a directory, an executable");
    is_int(r.seen.n, 5, "five members seen");
    if (r.seen.n == 5) {
        is_str(r.seen.names[2], "b/d", "directory reported without its '/'");
        ok(r.seen.type[2] == '5' && r.seen.type[0] == '0', "types reported");
        is_int(r.seen.mode[4], 0755, "mode reported");
        is_int(r.seen.size[0], 5, "size reported");
    }
    is_int(r.st.members, 5, "stats: members");
    is_int(r.st.data, 9, "stats: data bytes");
    is_int(r.st.gz_members, 1, "stats: one gzip member");
    mem_free(&g);

    /* Two gzip members, split in the middle of a header. */
    g.len = 0;
    gz_member(&g, t.p, 700, 1);
    gz_member(&g, t.p + 700, t.len - 700, 9);
    r = check(&g);
    is_int(r.rc, TARCHECK_VALID, "two gzip members back to back, split inside a header");
    is_int(r.st.gz_members, 2, "stats: two gzip members");
    mem_free(&g);
    /* An empty gzip member between them. */
    gz_member(&g, t.p, 700, 1);
    gz_member(&g, "", 0, 6);
    gz_member(&g, t.p + 700, t.len - 700, 9);
    r = check(&g);
    is_int(r.rc, TARCHECK_VALID, "an empty gzip member in between");
    mem_free(&g);
    mem_free(&t);

    /* pax paths: long, non-ASCII, with a newline, a prefix/name split. */
    char longname[300], deep[4096];
    memset(longname, 'L', 255); /* NAME_MAX */
    longname[255] = '\0';
    uint8_t h[512];
    memset(deep, 0, sizeof deep);
    for (int i = 0; i < 40; i++)
        strcat(deep, "ddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd/");
    strcat(deep, "leaf");
    /* In the writer's order: 'L' < 'd' < 'h' < 'n' < 'p'. */
    tar_pax_file(&t, longname, "long");
    tar_pax_file(&t, deep, "deep");
    tar_pax_file(&t, "h\xc3\xa9llo/\xe2\x82\xac\xf0\x9f\x98\x80", "utf8");
    tar_pax_file(&t, "nl\nname", "newline");
    make_header(h, "nnnnnnnnnn", "pppp/qqqq", '0', 0644, 2);
    mem_add(&t, h, 512);
    tar_data(&t, "pq", 2);
    tar_end(&t);
    g = gz(&t);
    r = check(&g);
    is_int(r.rc, TARCHECK_VALID, "pax paths: long, non-ASCII, newline; prefix+name; deep (%s)",
           r.why);
    if (r.seen.n == 5) {
        is_str(r.seen.last, "pppp/qqqq/nnnnnnnnnn", "prefix joined with '/'");
        ok(strlen(r.seen.names[1]) == 159 && !strncmp(r.seen.names[1], deep, 159),
           "the deep path (as far as kept here)");
        is_int(r.seen.size[1], 4, "... its size");
    }
    mem_free(&g);
    mem_free(&t);
    memset(longname, 'L', 256);
    longname[256] = '\0';
    tar_pax_file(&t, longname, "long");
    tar_end(&t);
    expect_bad(&t, -EBADMSG, "tar: path not relative", "a component over NAME_MAX");
    mem_free(&t);

    /* Trailing zeros: CPython pads to a 10240-byte record. */
    tar_file(&t, "a", "a");
    tar_end(&t);
    mem_zeros(&t, 10240 - t.len % 10240);
    expect_ok(&t, "zeros after the end blocks (10240-byte record)");
    mem_zeros(&t, TARCHECK_MAX_TRAILER - (t.len - 2048));
    expect_ok(&t, "exactly TARCHECK_MAX_TRAILER zeros after the end blocks");
    mem_free(&t);

    /* Numbers as CPython writes them (7 digits + NUL) read the same. */
    make_header(h, "py", NULL, '0', 0644, 1);
    memcpy(h + 100, "0000644\0", 8);
    memcpy(h + 124, "00000000001\0", 12);
    set_checksum(h);
    mem_add(&t, h, 512);
    tar_data(&t, "p", 1);
    tar_end(&t);
    expect_ok(&t, "numeric fields in CPython's form");
    mem_free(&t);

    /* A pax header with only mtime (libarchive: an mtime past 2038). */
    struct mem rec = {0};
    pax_rec(&rec, "mtime", "8589934591", 10);
    tar_pax(&t, &rec);
    tar_file(&t, "future", "f");
    tar_end(&t);
    expect_ok(&t, "pax mtime without a path");
    mem_free(&t);
    mem_free(&rec);

    /* Every file mode the writer makes. */
    static const unsigned modes[] = { 0644, 0645, 0654, 0655, 0744, 0745, 0754, 0755 };
    for (size_t i = 0; i < 8; i++) {
        char name[8];
        snprintf(name, sizeof name, "m%zu", i);
        tar_header(&t, name, '0', modes[i], 0);
    }
    tar_end(&t);
    expect_ok(&t, "modes 0644..0755");
    mem_free(&t);
}

/* ---- refused shapes ----------------------------------------------------- */

/* A valid two-file archive; mutate(h) edits the second member's header
 * (the checksum is fixed after unless the mutation is about it). */
static void expect_header(void (*mutate)(uint8_t *h), bool fix_sum, int err, const char *why,
                          const char *what)
{
    struct mem t = {0};
    uint8_t h[512];

    tar_file(&t, "first", "1");
    make_header(h, "second", NULL, '0', 0644, 1);
    mutate(h);
    if (fix_sum)
        set_checksum(h);
    mem_add(&t, h, 512);
    tar_data(&t, "2", 1);
    tar_end(&t);
    expect_bad(&t, err, why, what);
    mem_free(&t);
}

static void m_sum(uint8_t *h) { h[150] ^= 1; }
static void m_signed_sum(uint8_t *h)
{
    /* A high byte in an ignored place and the *signed* sum: both readers
     * accept it, the writer never makes it. */
    unsigned sum = 0;
    char tmp[16];
    h[99] = 0xff;
    memset(h + 148, ' ', 8);
    for (int i = 0; i < 512; i++)
        sum += (unsigned)(int)(int8_t)h[i];
    snprintf(tmp, sizeof tmp, "%06o", sum);
    memcpy(h + 148, tmp, 6);
    h[154] = '\0';
}
static void m_sum_spaces(uint8_t *h)
{
    set_checksum(h);
    memmove(h + 149, h + 148, 6); /* " 0NNNNN\0": a leading blank */
    h[148] = ' ';
}
static void m_gnu_magic(uint8_t *h) { memcpy(h + 257, "ustar  \0", 8); }
static void m_v7(uint8_t *h) { memset(h + 257, 0, 8); }
static void m_version(uint8_t *h) { memcpy(h + 263, " \0", 2); }
static void m_b256_size(uint8_t *h) { memset(h + 124, 0, 12); h[124] = 0x80; h[135] = 1; }
static void m_b256_mtime(uint8_t *h) { memset(h + 136, 0xff, 12); }
static void m_blank_size(uint8_t *h) { memcpy(h + 124, " 0000000001 ", 12); }
static void m_plus_size(uint8_t *h) { memcpy(h + 124, "+0000000001 ", 12); }
static void m_underscore(uint8_t *h) { memcpy(h + 124, "0000000_001 ", 12); }
static void m_no_term(uint8_t *h) { memcpy(h + 100, "00000644", 8); }
static void m_empty_num(uint8_t *h) { memset(h + 100, 0, 8); }
static void m_digit_after(uint8_t *h) { memcpy(h + 100, "000644 1", 8); }
static void m_type1(uint8_t *h) { h[156] = '1'; memcpy(h + 157, "first", 5); }
static void m_type2(uint8_t *h) { h[156] = '2'; memcpy(h + 157, "/etc/passwd", 11); }
static void m_type3(uint8_t *h) { h[156] = '3'; }
static void m_type4(uint8_t *h) { h[156] = '4'; }
static void m_type6(uint8_t *h) { h[156] = '6'; }
static void m_type7(uint8_t *h) { h[156] = '7'; }
static void m_typenul(uint8_t *h) { h[156] = '\0'; }
static void m_typeS(uint8_t *h) { h[156] = 'S'; }
static void m_typeD(uint8_t *h) { h[156] = 'D'; }
static void m_typeV(uint8_t *h) { h[156] = 'V'; }
static void m_linkname(uint8_t *h) { memcpy(h + 157, "x", 1); }
static void m_uid(uint8_t *h) { memcpy(h + 108, "000001 \0", 8); }
static void m_gid(uint8_t *h) { memcpy(h + 116, "001750 \0", 8); }
static void m_uname(uint8_t *h) { memcpy(h + 265, "root", 4); }
static void m_gname(uint8_t *h) { memcpy(h + 297, "root", 4); }
static void m_devmajor(uint8_t *h) { memcpy(h + 329, "000001 \0", 8); }
static void m_suid(uint8_t *h) { memcpy(h + 100, "004755 \0", 8); }
static void m_sgid(uint8_t *h) { memcpy(h + 100, "002755 \0", 8); }
static void m_sticky(uint8_t *h) { memcpy(h + 100, "001755 \0", 8); }
static void m_ww(uint8_t *h) { memcpy(h + 100, "000666 \0", 8); }
static void m_gw(uint8_t *h) { memcpy(h + 100, "000664 \0", 8); }
static void m_private(uint8_t *h) { memcpy(h + 100, "000600 \0", 8); }
static void m_ifreg(uint8_t *h) { memcpy(h + 100, "0100644", 8); }
static void m_name_junk(uint8_t *h) { h[50] = 'x'; }
static void m_prefix_junk(uint8_t *h) { h[345 + 20] = 'x'; }
static void m_tail(uint8_t *h) { h[505] = 1; }
static void m_abs(uint8_t *h) { memcpy(h, "/etc/cron.d/x\0", 14); }
static void m_dotdot(uint8_t *h) { memcpy(h, "a/../../x\0", 10); }
static void m_dot(uint8_t *h) { memcpy(h, "./x\0\0\0", 6); }
static void m_dslash(uint8_t *h) { memcpy(h, "a//x\0\0", 6); }
static void m_tslash(uint8_t *h) { memcpy(h, "second/", 7); }
static void m_emptyname(uint8_t *h) { memset(h, 0, 100); }
static void m_prefix_slash(uint8_t *h) { memcpy(h + 345, "dir/", 4); }
static void m_prefix_only(uint8_t *h) { memset(h, 0, 100); memcpy(h + 345, "dir", 3); }
static void m_nonascii(uint8_t *h) { memcpy(h, "s\xc3\xa9", 3); }
static void m_hdrcharset(uint8_t *h) { memcpy(h, "a hdrcharset=x", 14); }
static void m_dir_noslash(uint8_t *h) { h[156] = '5'; memcpy(h + 100, "000755 \0", 8); memcpy(h + 124, "00000000000 ", 12); }
static void m_dir_size(uint8_t *h) { h[156] = '5'; memcpy(h, "second/", 7); memcpy(h + 100, "000755 \0", 8); }
static void m_dir_mode(uint8_t *h) { h[156] = '5'; memcpy(h, "second/", 7); memcpy(h + 100, "000700 \0", 8); memcpy(h + 124, "00000000000 ", 12); }
static void m_first(uint8_t *h) { memcpy(h, "first\0", 6); }
static void m_before(uint8_t *h) { memcpy(h, "aaa\0\0\0", 6); }
static void m_beneath(uint8_t *h) { memcpy(h, "first/x", 7); }

static void test_refuse_header(void)
{
    const int B = -EBADMSG;

    expect_header(m_sum, false, B, "tar: header checksum mismatch", "bad checksum");
    expect_header(m_signed_sum, false, B, "tar: header checksum mismatch", "signed checksum");
    expect_header(m_sum_spaces, false, B, "tar: checksum field not canonical", "checksum with a leading blank");
    expect_header(m_gnu_magic, true, B, "tar: header is not POSIX ustar", "GNU magic");
    expect_header(m_v7, true, B, "tar: header is not POSIX ustar", "v7 header (no magic)");
    expect_header(m_version, true, B, "tar: header is not POSIX ustar", "ustar version ' \\0'");
    expect_header(m_b256_size, true, B, "tar: numeric field", "base-256 size");
    expect_header(m_b256_mtime, true, B, "tar: numeric field", "base-256 negative mtime");
    expect_header(m_blank_size, true, B, "tar: numeric field", "size with a leading blank");
    expect_header(m_plus_size, true, B, "tar: numeric field", "size with a sign");
    expect_header(m_underscore, true, B, "tar: numeric field", "size with an underscore (int() takes it)");
    expect_header(m_no_term, true, B, "tar: numeric field", "mode without a terminator");
    expect_header(m_empty_num, true, B, "tar: numeric field", "empty mode field");
    expect_header(m_digit_after, true, B, "tar: numeric field", "digit after the terminator");
    expect_header(m_type1, true, B, "tar: link name not empty", "hard link");
    expect_header(m_type2, true, B, "tar: link name not empty", "symlink");
    expect_header(m_type3, true, B, "tar: member type", "character device");
    expect_header(m_type4, true, B, "tar: member type", "block device");
    expect_header(m_type6, true, B, "tar: member type", "FIFO");
    expect_header(m_type7, true, B, "tar: member type", "contiguous file '7'");
    expect_header(m_typenul, true, B, "tar: member type", "old regular file (NUL type)");
    expect_header(m_typeS, true, B, "tar: member type", "GNU sparse");
    expect_header(m_typeD, true, B, "tar: member type", "GNU dump dir");
    expect_header(m_typeV, true, B, "tar: member type", "GNU volume header");
    expect_header(m_linkname, true, B, "tar: link name not empty", "file with a link name");
    expect_header(m_uid, true, B, "tar: owner not uid/gid 0", "uid 1");
    expect_header(m_gid, true, B, "tar: owner not uid/gid 0", "gid 1000");
    expect_header(m_uname, true, B, "tar: owner names not empty", "uname root");
    expect_header(m_gname, true, B, "tar: owner names not empty", "gname root");
    expect_header(m_devmajor, true, B, "tar: device numbers not 0", "devmajor 1");
    expect_header(m_suid, true, B, "tar: mode has bits outside 0755", "setuid 04755");
    expect_header(m_sgid, true, B, "tar: mode has bits outside 0755", "setgid 02755");
    expect_header(m_sticky, true, B, "tar: mode has bits outside 0755", "sticky 01755");
    expect_header(m_ww, true, B, "tar: mode has bits outside 0755", "world-writable 0666");
    expect_header(m_gw, true, B, "tar: mode has bits outside 0755", "group-writable 0664");
    expect_header(m_private, true, B, "tar: file mode not within", "mode 0600");
    expect_header(m_ifreg, true, B, "tar: mode has bits outside 0755", "mode with S_IFREG bits");
    expect_header(m_name_junk, true, B, "tar: name fields not NUL-padded", "bytes after the name's NUL");
    expect_header(m_prefix_junk, true, B, "tar: name fields not NUL-padded", "bytes after the prefix's NUL");
    expect_header(m_tail, true, B, "tar: name fields not NUL-padded", "bytes 500-511 not zero");
    expect_header(m_abs, true, B, "tar: path not relative", "absolute path");
    expect_header(m_dotdot, true, B, "tar: path not relative", "'..' component");
    expect_header(m_dot, true, B, "tar: path not relative", "'.' component");
    expect_header(m_dslash, true, B, "tar: path not relative", "empty component");
    expect_header(m_tslash, true, B, "tar: path not relative", "file with a trailing '/'");
    expect_header(m_emptyname, true, B, "tar: path not relative", "empty name");
    expect_header(m_prefix_slash, true, B, "tar: path not relative",
                  "prefix ending in '/' (tarfile doubles it, libarchive does not)");
    expect_header(m_prefix_only, true, B, "tar: path not relative", "prefix with an empty name");
    expect_header(m_nonascii, true, B, "tar: non-ASCII name outside a pax record",
                  "non-ASCII ustar name");
    expect_header(m_hdrcharset, true, B, "tar: path not relative", "'hdrcharset=' in a name");
    expect_header(m_dir_noslash, true, B, "tar: directory name without", "directory without '/'");
    expect_header(m_dir_size, true, B, "tar: directory not mode 0755 and size 0", "directory with a size");
    expect_header(m_dir_mode, true, B, "tar: directory not mode 0755 and size 0", "directory mode 0700");
    expect_header(m_first, true, B, "tar: members out of order or repeated", "repeated name");
    expect_header(m_before, true, B, "tar: members out of order or repeated", "names out of order");
    expect_header(m_beneath, true, B, "tar: member beneath a file", "member beneath a file");
}

/* A pax block with the given raw records before a file "f". */
static void expect_pax(const void *recs, size_t n, int err, const char *why, const char *what)
{
    struct mem t = {0}, r = {0};

    mem_add(&r, recs, n);
    tar_pax(&t, &r);
    tar_file(&t, "f", "data");
    tar_end(&t);
    expect_bad(&t, err, why, what);
    mem_free(&t);
    mem_free(&r);
}
#define PAX(s, err, why, what) expect_pax(s, sizeof(s) - 1, err, why, what)

static void test_refuse_pax(void)
{
    const int B = -EBADMSG;
    struct mem t = {0}, r = {0};

    PAX("13 size=1000\n", B, "pax: record other than", "pax size record");
    PAX("17 linkpath=/etc\n", B, "pax: record other than", "pax linkpath");
    PAX("8 uid=0\n", B, "pax: record other than", "pax uid");
    PAX("14 uname=root\n", B, "pax: record other than", "pax uname");
    PAX("21 hdrcharset=BINARY\n", B, "pax: record other than", "pax hdrcharset");
    PAX("22 GNU.sparse.major=1\n", B, "pax: record other than", "GNU sparse record");
    PAX("26 SCHILY.xattr.user.a=bb\n", B, "pax: record other than", "SCHILY xattr");
    PAX("29 LIBARCHIVE.creationtime=1\n", B, "pax: record other than", "LIBARCHIVE record");
    PAX("12 ctime=17\n", B, "pax: record other than", "ctime");
    PAX("10 path=a\n10 path=b\n", B, "pax: records repeated", "path twice");
    PAX("12 mtime=17\n10 path=a\n", B, "pax: records repeated or out of order", "mtime before path");
    PAX("010 path=a\n", B, "pax: record length not canonical", "length with a leading zero");
    PAX("11 path=a\n", B, "pax: record", "length one too long");
    PAX("9 path=ab\n", B, "pax: record length does not end", "length one too short");
    PAX("10 path=a ", B, "pax: record length does not end", "no newline");
    PAX("10 path=a\n\n", B, "pax: record length not canonical", "stray byte after the records");
    PAX("10 path=a\n\0\0\0", B, "pax: NUL byte", "NULs inside the declared size");
    PAX("12 path=a\0b\n", B, "pax: NUL byte", "NUL inside a path value");
    PAX("5 =x\n", B, "pax: record without key=value", "empty key");
    PAX("8 pathx\n", B, "pax: record without key=value", "no '='");
    PAX("10  path=a\n", B, "pax: record", "two spaces");
    PAX("13 path=/etc\n", B, "tar: path not relative", "absolute pax path");
    PAX("15 path=a/../b\n", B, "tar: path not relative", "pax path with ..");
    PAX("11 path=a/\n", B, "tar: path not relative", "pax path of a file with '/'");
    PAX("12 path=\xff\xfe" "a\n", B, "tar: path not relative", "pax path not UTF-8");
    PAX("13 path=\xed\xa0\x80" "a\n", B, "tar: path not relative", "pax path with a surrogate");
    PAX("12 path=\xc0\xaf" "a\n", B, "tar: path not relative", "pax path with an overlong");
    PAX("31 path=x 21 hdrcharset=BINARY\n", B, "tar: path not relative",
        "'hdrcharset=' inside a pax path (3.11's raw search)");
    PAX("12 mtime=-1\n", B, "pax: mtime", "negative mtime");
    PAX("14 mtime=1.50\n", B, "pax: mtime", "mtime fraction with a trailing zero");
    PAX("12 mtime=01\n", B, "pax: mtime", "mtime with a leading zero");
    PAX("14 mtime=1e10\n", B, "pax: mtime", "mtime in float syntax");
    PAX("12 mtime=1.\n", B, "pax: mtime", "mtime with an empty fraction");
    PAX("22 mtime=1.0000000001\n", B, "pax: mtime", "mtime with 10 fraction digits");
    PAX("22 mtime=123456789012\n", B, "pax: mtime", "mtime with 12 digits");
    PAX("13 mtime=nan\n", B, "pax: mtime", "mtime nan");

    /* pax header shapes. */
    pax_rec(&r, "path", "a", 1);
    tar_pax(&t, &r);
    tar_pax(&t, &r);
    tar_file(&t, "f", "x");
    tar_end(&t);
    expect_bad(&t, B, "tar: two pax headers", "two pax headers in a row");
    mem_free(&t);
    tar_pax(&t, &r);
    tar_end(&t);
    expect_bad(&t, B, "tar: pax header without its member", "pax header before the end");
    mem_free(&t);
    tar_header(&t, "PaxHeader/x", 'x', 0644, 0);
    tar_file(&t, "f", "x");
    tar_end(&t);
    expect_bad(&t, B, "tar: pax header size out of range", "empty pax header");
    mem_free(&t);
    tar_header(&t, "PaxHeader/x", 'g', 0644, r.len);
    tar_data(&t, r.p, r.len);
    tar_file(&t, "f", "x");
    tar_end(&t);
    expect_bad(&t, B, "tar: member type", "global 'g' header");
    mem_free(&t);
    tar_header(&t, "././@LongLink", 'L', 0644, 2);
    tar_data(&t, "a", 2);
    tar_file(&t, "f", "x");
    tar_end(&t);
    expect_bad(&t, B, "tar: member type", "GNU long name 'L'");
    mem_free(&t);
    tar_header(&t, "././@LongLink", 'K', 0644, 2);
    tar_data(&t, "a", 2);
    tar_file(&t, "f", "x");
    tar_end(&t);
    expect_bad(&t, B, "tar: member type", "GNU long link 'K'");
    mem_free(&t);
    tar_header(&t, "PaxHeader/x", 'X', 0644, r.len);
    tar_data(&t, r.p, r.len);
    tar_file(&t, "f", "x");
    tar_end(&t);
    expect_bad(&t, B, "tar: member type", "Solaris 'X' header");
    mem_free(&t);
    tar_header(&t, "PaxHeader/x", 'x', 04755, r.len);
    tar_data(&t, r.p, r.len);
    tar_file(&t, "f", "x");
    tar_end(&t);
    expect_bad(&t, B, "tar: mode has bits outside 0755", "pax header with a setuid mode");
    mem_free(&t);
    mem_free(&r);
    /* pax path too long for the limit (and the block past pax_max). */
    char big[5000];
    memset(big, 'b', sizeof big);
    pax_rec(&r, "path", big, 4096);
    tar_pax(&t, &r);
    tar_file(&t, "f", "x");
    tar_end(&t);
    expect_bad(&t, -ENAMETOOLONG, "tar: path longer than the limit", "pax path of 4096 bytes");
    mem_free(&t);
    mem_free(&r);
    pax_rec(&r, "path", big, sizeof big);
    tar_pax(&t, &r);
    tar_file(&t, "f", "x");
    tar_end(&t);
    expect_bad(&t, B, "tar: pax header size out of range", "pax block larger than any path");
    mem_free(&t);
    mem_free(&r);
}

static void test_refuse_stream(void)
{
    const int B = -EBADMSG;
    struct mem t = {0}, g;

    tar_file(&t, "a", "aaaa");
    tar_file(&t, "b", "bbbb");
    tar_end(&t);

    /* gzip header fields. */
    static const struct { int byte; uint8_t v; const char *why, *what; } gzh[] = {
        { 0, 0x1e, "gzip: not gzip", "bad magic" },
        { 2, 7, "gzip: compression method", "method 7" },
        { 3, 0x01, "gzip: header flags set", "FTEXT" },
        { 3, 0x02, "gzip: header flags set", "FHCRC" },
        { 3, 0x04, "gzip: extra field", "FEXTRA without the length subfield" },
        { 3, 0x08, "gzip: header flags set", "FNAME" },
        { 3, 0x10, "gzip: header flags set", "FCOMMENT" },
        { 3, 0x20, "gzip: header flags set", "reserved flag" },
    };
    for (size_t i = 0; i < sizeof gzh / sizeof *gzh; i++) {
        g = gz(&t);
        g.p[gzh[i].byte] = gzh[i].v;
        expect_gz(&g, B, gzh[i].why, gzh[i].what);
        mem_free(&g);
    }
    g = gz(&t);
    g.p[4] = 0x12; /* MTIME: free */
    g.p[9] = 0xff; /* OS: free */
    expect_gz(&g, TARCHECK_VALID, "ok", "MTIME and OS fields are free");
    g.p[g.len - 8] ^= 1;
    expect_gz(&g, B, "gzip: CRC mismatch", "bad CRC");
    g.p[g.len - 8] ^= 1;
    g.p[g.len - 1] ^= 1;
    expect_gz(&g, B, "gzip: length mismatch", "bad ISIZE");
    g.p[g.len - 1] ^= 1;
    g.p[14] ^= 0x55;
    struct run r = check(&g);
    ok(r.rc == B, "corrupt deflate data is refused (%s)", r.why);
    g.p[14] ^= 0x55;

    /* Truncations at every kind of place. */
    static const size_t cuts[] = { 1, 5, 9, 10, 11, 20 };
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        struct mem c = { .p = g.p, .len = cuts[i] };
        r = check(&c);
        ok(r.rc == B, "truncated to %zu bytes: refused (%s)", cuts[i], r.why);
    }
    for (size_t cut = 1; cut <= 8; cut++) {
        struct mem c = { .p = g.p, .len = g.len - cut };
        r = check(&c);
        ok(r.rc == B, "last %zu bytes cut: refused (%s)", cut, r.why);
    }

    /* After the last member. */
    mem_add(&g, "\0", 1);
    expect_gz(&g, B, "gzip: bytes after the last member", "a zero byte after the member");
    g.len--;
    mem_add(&g, "\x1f\x8b", 2);
    expect_gz(&g, B, "gzip: member header truncated", "half a member header after");
    g.len -= 2;
    mem_add(&g, "garbage!garbage!", 16);
    expect_gz(&g, B, "gzip: bytes after the last member", "garbage after the member");
    g.len -= 16;
    /* A second member with more tar after the end blocks. */
    struct mem more = {0};
    tar_file(&more, "c", "c");
    gz_member(&g, more.p, more.len, 6);
    expect_gz(&g, B, "tar: data after the end-of-archive blocks", "a member after the end blocks");
    mem_free(&more);
    mem_free(&g);
    mem_free(&t);

    /* Tar stream ends. */
    tar_file(&t, "a", "a");
    expect_bad(&t, B, "tar: no end-of-archive blocks", "no end blocks");
    mem_zeros(&t, 512);
    expect_bad(&t, B, "tar: one end-of-archive block", "one end block");
    mem_zeros(&t, 100);
    expect_bad(&t, B, "tar: one end-of-archive block", "one and a bit");
    mem_free(&t);
    tar_file(&t, "a", "a");
    t.len -= 200;
    expect_bad(&t, B, "tar: archive truncated inside a member", "truncated in the padding");
    mem_free(&t);
    tar_header(&t, "a", '0', 0644, 1000);
    mem_zeros(&t, 100);
    expect_bad(&t, B, "tar: archive truncated inside a member", "truncated in the data");
    mem_free(&t);
    tar_file(&t, "a", "a");
    t.p[t.len - 1] = 'x';
    tar_end(&t);
    expect_bad(&t, B, "tar: padding not zero", "data padding not zero");
    mem_free(&t);
    tar_file(&t, "a", "a");
    tar_end(&t);
    mem_add(&t, "x", 1);
    expect_bad(&t, B, "tar: data after the end", "a byte after the end blocks");
    mem_free(&t);
    tar_file(&t, "a", "a");
    mem_zeros(&t, 512);
    tar_file(&t, "b", "b");
    tar_end(&t);
    expect_bad(&t, B, "tar: data after the end", "a member after one zero block");
    mem_free(&t);
    tar_file(&t, "a", "a");
    tar_end(&t);
    mem_zeros(&t, TARCHECK_MAX_TRAILER + 1);
    expect_bad(&t, B, "tar: too many zeros after the end", "one zero too many after the end");
    mem_free(&t);
}

/* ---- limits and bombs --------------------------------------------------- */

static void test_limits(void)
{
    struct mem t = {0}, g;
    struct tarcheck_limits lim = default_lim;
    struct run r;

    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof name, "f%d", i);
        tar_file(&t, name, "0123456789");
    }
    tar_end(&t);
    g = gz(&t);
    lim.max_members = 4;
    lim.max_data = 40;
    r = check_lim(&g, &lim);
    is_int(r.rc, TARCHECK_VALID, "4 members, 40 bytes: at the limits");
    lim.max_members = 3;
    r = check_lim(&g, &lim);
    is_int(r.rc, -E2BIG, "max_members 3: -E2BIG (%s)", r.why);
    lim.max_members = 4;
    lim.max_data = 39;
    r = check_lim(&g, &lim);
    is_int(r.rc, -EFBIG, "max_data 39: -EFBIG (%s)", r.why);
    is_int(r.seen.n, 3, "refused at the fourth header, before its data");
    lim.max_data = 40;
    lim.max_path = 1;
    r = check_lim(&g, &lim);
    is_int(r.rc, -ENAMETOOLONG, "max_path 1: -ENAMETOOLONG (%s)", r.why);
    lim.max_path = 2;
    lim.max_inflated = t.len - 1;
    r = check_lim(&g, &lim);
    is_int(r.rc, -EFBIG, "max_inflated one short: -EFBIG (%s)", r.why);
    ok(r.st.inflated == t.len, "inflated no further than one byte past (%llu)",
       (unsigned long long)r.st.inflated);
    lim.max_inflated = t.len;
    r = check_lim(&g, &lim);
    is_int(r.rc, TARCHECK_VALID, "max_inflated exactly the stream: valid");
    mem_free(&g);
    mem_free(&t);

    /* The derived bound. */
    ok(tarcheck_inflated_bound(100, 0, 4095) == 100 + 1024 + TARCHECK_MAX_TRAILER,
       "inflated bound with no members: data + end + trailer");
    ok(tarcheck_inflated_bound(UINT64_MAX, 2, 4095) == UINT64_MAX, "inflated bound saturates");
}

/* One gzip member of `header` followed by n zero bytes, made without
 * holding n bytes. */
static struct mem zero_bomb(const struct mem *head, uint64_t n)
{
    static uint8_t zeros[1 << 20];
    uint8_t buf[65536];
    z_stream z = {0};
    struct mem g = {0};
    int r;

    deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 9, Z_DEFAULT_STRATEGY);
    z.next_in = head->p;
    z.avail_in = (uInt)head->len;
    for (;;) {
        int flush = Z_NO_FLUSH;
        if (z.avail_in == 0) {
            size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
            z.next_in = zeros;
            z.avail_in = (uInt)k;
            n -= k;
            if (n == 0)
                flush = Z_FINISH;
        }
        do {
            z.next_out = buf;
            z.avail_out = sizeof buf;
            r = deflate(&z, flush);
            mem_add(&g, buf, sizeof buf - z.avail_out);
        } while (z.avail_out == 0);
        if (r == Z_STREAM_END)
            break;
    }
    deflateEnd(&z);
    return g;
}

static void test_bomb(void)
{
    struct mem head = {0}, g;
    struct tarcheck_limits lim = default_lim;
    struct run r;

    /* 256 MiB of zeros after the end blocks: ~250 KiB compressed. */
    tar_file(&head, "a", "a");
    tar_end(&head);
    g = zero_bomb(&head, 256 * MiB_);
    r = run_once(g.p, g.len, &lim, 0);
    is_int(r.rc, -EBADMSG, "256 MiB of zeros after the end (%zu bytes compressed): refused (%s)",
           g.len, r.why);
    ok(r.st.inflated <= 2048 + 1024 + TARCHECK_MAX_TRAILER + 65536,
       "... after inflating %llu bytes", (unsigned long long)r.st.inflated);
    ok(r.st.max_step_out <= TARCHECK_STEP_BUDGET, "... at most one budget per call");
    mem_free(&g);
    mem_free(&head);

    /* A file claiming 256 MiB past max_data: refused at its header. */
    tar_header(&head, "big", '0', 0644, 256 * MiB_);
    g = zero_bomb(&head, 256 * MiB_);
    r = run_once(g.p, g.len, &lim, 0);
    is_int(r.rc, -EFBIG, "a 256 MiB member over max_data: -EFBIG (%s)", r.why);
    ok(r.st.inflated <= 65536, "... before its data is inflated (%llu)",
       (unsigned long long)r.st.inflated);
    mem_free(&g);
    mem_free(&head);

    /* Legal data, but the caller's max_inflated is lower: stops there,
     * one budget per call. */
    tar_header(&head, "big", '0', 0644, 64 * MiB_);
    g = zero_bomb(&head, 64 * MiB_);
    lim.max_inflated = 8 * MiB_;
    lim.step_budget = 256 * 1024;
    r = run_once(g.p, g.len, &lim, 0);
    is_int(r.rc, -EFBIG, "64 MiB of data, max_inflated 8 MiB: -EFBIG (%s)", r.why);
    ok(r.st.inflated == 8 * MiB_ + 1, "... stopped one byte past the limit");
    ok(r.st.max_step_out <= 256 * 1024 && r.st.calls >= 32,
       "... in %llu calls of at most 256 KiB inflated (max %llu)",
       (unsigned long long)r.st.calls, (unsigned long long)r.st.max_step_out);
    mem_free(&g);

    /* Within the limits it all goes through, still one budget per call. */
    lim.max_inflated = 0;
    g = zero_bomb(&head, 64 * MiB_ + 1024);
    r = run_once(g.p, g.len, &lim, 0);
    is_int(r.rc, TARCHECK_VALID, "64 MiB of zeros as file data: valid (%s)", r.why);
    ok(r.st.max_step_out <= 256 * 1024 && r.st.calls >= 256,
       "... in %llu calls of at most 256 KiB", (unsigned long long)r.st.calls);
    mem_free(&g);
    mem_free(&head);

    /* Input that inflates to nothing: empty stored blocks. Each call still
     * consumes at most one budget. */
    struct mem s = {0};
    uint8_t gzh[10] = { 0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3 };
    static const uint8_t stored_empty[5] = { 0x00, 0x00, 0x00, 0xff, 0xff };
    mem_add(&s, gzh, 10);
    for (int i = 0; i < 400000; i++)
        mem_add(&s, stored_empty, 5);
    lim = default_lim;
    lim.step_budget = 64 * 1024;
    r = run_once(s.p, s.len, &lim, 0);
    is_int(r.rc, -EBADMSG, "2 MB of empty stored blocks, no end: refused (%s)", r.why);
    ok(r.st.max_step_in <= 64 * 1024 + 10 && r.st.calls >= 30,
       "... consuming at most one budget per call (%llu calls, max %llu)",
       (unsigned long long)r.st.calls, (unsigned long long)r.st.max_step_in);
    mem_free(&s);
}

/* ---- the API contract --------------------------------------------------- */

static void test_api(void)
{
    struct mem t = {0}, g;
    struct tarcheck *tc;
    int r;

    tar_file(&t, "a", "a");
    tar_end(&t);
    g = gz(&t);

    tc = tarcheck_new(&default_lim);
    is_str(tarcheck_reason(tc), "incomplete", "a fresh checker is incomplete");
    is_int(tarcheck_feed(tc, g.p, 0), TARCHECK_NEED_INPUT, "no bytes: need input");
    is_int(tarcheck_feed(tc, g.p, 5), TARCHECK_NEED_INPUT, "5 bytes: need input");
    is_int(tarcheck_feed(tc, g.p, 5), TARCHECK_NEED_INPUT, "the same 5 again: need input");
    is_int(tarcheck_feed(tc, g.p, 4), -EINVAL, "length going back: -EINVAL");
    is_int(tarcheck_feed(tc, g.p, g.len), -EINVAL, "... and sticky");
    tarcheck_free(tc);

    tc = tarcheck_new(&default_lim);
    is_int(tarcheck_feed(tc, g.p, g.len), TARCHECK_NEED_INPUT,
           "whole message fed: need input (another member could follow)");
    is_int(tarcheck_finish(tc, g.p, g.len), TARCHECK_VALID, "finish: valid");
    is_int(tarcheck_finish(tc, g.p, g.len), TARCHECK_VALID, "valid is sticky");
    is_str(tarcheck_reason(tc), "ok", "reason ok");
    tarcheck_free(tc);

    tc = tarcheck_new(&default_lim);
    is_int(tarcheck_finish(tc, g.p, g.len - 1), -EBADMSG, "finish short: refused");
    tarcheck_free(tc);

    tc = tarcheck_new(&default_lim);
    is_int(tarcheck_finish(tc, g.p, 10), -EBADMSG, "finish after a header only: refused");
    tarcheck_free(tc);

    struct tarcheck_limits lim = default_lim;
    lim.step_budget = 16;
    tc = tarcheck_new(&lim);
    r = tarcheck_finish(tc, g.p, g.len);
    is_int(r, TARCHECK_AGAIN, "a small budget: again");
    int calls = 1;
    while (r == TARCHECK_AGAIN && calls < 10000)
        r = tarcheck_finish(tc, g.p, g.len), calls++;
    is_int(r, TARCHECK_VALID, "pumping finish reaches valid (%d calls)", calls);
    is_int(tarcheck_finish(tc, g.p, g.len + 1), TARCHECK_VALID, "sticky even on a bad call");
    tarcheck_free(tc);
    tarcheck_free(NULL);

    ok(tarcheck_path_ok("a/b.c", 5, 4095), "path_ok: a/b.c");
    ok(!tarcheck_path_ok("a/b.c", 5, 4), "path_ok: length limit");
    ok(!tarcheck_path_ok("a\0b", 3, 4095), "path_ok: NUL");
    ok(tarcheck_path_ok("..a/.b/...", 10, 4095), "path_ok: dots inside names are fine");
    mem_free(&g);
    mem_free(&t);
}

/* ---- the writer: every snapshot passes ---------------------------------- */

static char base[64];
static unsigned dir_seq;

static char *new_dir(const char *tag)
{
    char *p;

    if (asprintf(&p, "%s/%s-%u", base, tag, dir_seq++) < 0 || mkdir(p, 0755) < 0)
        abort();
    return p;
}

/* Create root/rel with its parents, one component at a time (paths may be
 * longer than PATH_MAX). false if a component is in the way (random trees
 * make a file and a directory of the same name now and then). */
static bool put(const char *root, const char *rel, const void *data, size_t n, mode_t mode)
{
    char path[8192], *comp = path, *slash;
    int dfd = open(root, O_RDONLY | O_DIRECTORY), fd;

    snprintf(path, sizeof path, "%s", rel);
    while (dfd >= 0 && (slash = strchr(comp, '/'))) {
        int next;

        *slash = '\0';
        mkdirat(dfd, comp, 0755);
        next = openat(dfd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
        close(dfd);
        dfd = next;
        comp = slash + 1;
    }
    fd = dfd >= 0 ? openat(dfd, comp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600) : -1;
    if (dfd >= 0)
        close(dfd);
    if (fd < 0)
        return false;
    if (n && write(fd, data, n) != (ssize_t)n)
        abort();
    fchmod(fd, mode);
    close(fd);
    return true;
}

/* archive_snapshot of root, then the check; returns the run. */
static struct run snap_check(const char *root, struct snapshot_stats *st)
{
    struct buf out;
    struct mem m;
    struct run r;
    int fd = open(root, O_RDONLY | O_DIRECTORY);

    buf_init(&out, 256 * MiB_);
    if (archive_snapshot(fd, 100 * MiB_, &out, st) != 0)
        printf("# archive_snapshot failed\n");
    close(fd);
    m.p = out.data;
    m.len = out.len;
    r = run_once(m.p, m.len, &default_lim, 7);
    buf_free(&out);
    return r;
}

static void test_snapshot_odd(void)
{
    char *ws = new_dir("odd"), longc[256], name[8192];
    struct snapshot_stats st;
    struct run r;
    static uint8_t big[3 * 1024 * 1024];

    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 2654435761u >> 13);
    put(ws, "plain.txt", "plain", 5, 0644);
    put(ws, "world-writable", "ww", 2, 0666);
    put(ws, "all-bits", "777", 3, 0777);
    put(ws, "setuid", "su", 2, 04755);
    put(ws, "setgid-sticky", "sg", 2, 03775);
    put(ws, "private", "pr", 2, 0600);
    put(ws, "nothing", "", 0, 0000);
    put(ws, "empty", "", 0, 0644);
    put(ws, "big.bin", big, sizeof big, 0644);
    put(ws, "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80.txt", "u", 1, 0644);
    put(ws, "nl\nname", "n", 1, 0644);
    put(ws, "tab\tand space", "t", 1, 0644);
    put(ws, "back\\slash", "b", 1, 0644);
    put(ws, "\x01\x7f", "c", 1, 0644);
    put(ws, "a=b", "e", 1, 0644);
    put(ws, "bad\xff\xfe", "skipped", 7, 0644);         /* not UTF-8: skipped */
    put(ws, "x hdrcharset=BINARY", "skipped", 7, 0644); /* skipped */
    put(ws, "dir-\xc3\x28/inside", "skipped", 7, 0644);  /* whole dir skipped */
    put(ws, "..dots", "d", 1, 0644);
    put(ws, ".hidden", "h", 1, 0644);
    memset(longc, 'c', 255);
    longc[255] = '\0';
    put(ws, longc, "255", 3, 0644);
    snprintf(name, sizeof name, "sub/%s", longc);
    put(ws, name, "sub", 3, 0644);
    snprintf(name, sizeof name, "%.100s/%.100s", longc, longc);
    put(ws, name, "split", 5, 0644);
    snprintf(name, sizeof name, "\xc3\xa9%.98s/%.99s", longc, longc);
    put(ws, name, "utf8 split", 10, 0644);
    /* Deep: 15 x 255 + leaf ~ 3.9 KiB, and one past 4095 (skipped). */
    char deepc[256];
    memset(deepc, 'e', 255);
    deepc[255] = '\0';
    name[0] = '\0';
    for (int i = 0; i < 15; i++)
        strcat(name, deepc), strcat(name, "/");
    strcat(name, "leaf");
    ok(put(ws, name, "deep", 4, 0644), "made a %zu-byte path", strlen(name));
    name[strlen(name) - 4] = '\0';
    strcat(name, longc);
    strcat(name, "/x"); /* 4097 bytes */
    ok(put(ws, name, "too deep", 8, 0644), "made a %zu-byte path", strlen(name));
    /* Times: negative, past 2038, past 8^11, with nanoseconds. The last
     * one's name needs a pax record (long), so its mtime goes in one. */
    put(ws, "t-neg", "1", 1, 0644);
    put(ws, "t-2040", "2", 1, 0644);
    put(ws, "t-far", "3", 1, 0644);
    put(ws, "t-ns", "4", 1, 0644);
    snprintf(name, sizeof name, "%s/%.250s-ns", ws, longc);
    put(ws, strrchr(name, '/') + 1, "5", 1, 0644);
    struct { const char *n; time_t s; long ns; } times[] = {
        { "t-neg", -100, 0 }, { "t-2040", 2200000000, 5 }, { "t-far", 9000000000, 1 },
        { "t-ns", 1700000000, 123456789 }, { strrchr(name, '/') + 1, 1700000000, 1 },
    };
    for (size_t i = 0; i < sizeof times / sizeof *times; i++) {
        char p[1024];
        struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT }, { times[i].s, times[i].ns } };
        snprintf(p, sizeof p, "%s/%s", ws, times[i].n);
        utimensat(AT_FDCWD, p, ts, 0);
    }
    /* A hard link and a symlink. */
    char a[1024], b[1024];
    snprintf(a, sizeof a, "%s/plain.txt", ws);
    snprintf(b, sizeof b, "%s/hardlink", ws);
    link(a, b);
    snprintf(b, sizeof b, "%s/symlink", ws);
    symlink("/etc/passwd", b);

    static const char *const locales[] = { "C", "C.UTF-8", "POSIX" };
    for (size_t l = 0; l < 3; l++) {
        setlocale(LC_ALL, locales[l]);
        r = snap_check(ws, &st);
        is_int(r.rc, TARCHECK_VALID, "odd tree, global locale %s: the snapshot passes (%s)",
               locales[l], r.why);
        is_int(r.seen.n, (int)st.files, "... with every file written (%llu)",
               (unsigned long long)st.files);
        is_int(st.skipped, 5, "... skipping the non-UTF-8 name, the hdrcharset one, the "
                              "non-UTF-8 directory, the path over 4095 bytes and the symlink");
        is_int(st.bad_names, 4, "... four of them for their names");
        bool modes = true, found_utf8 = false, found_ww = false;
        for (int i = 0; i < r.seen.n && i < 64; i++) {
            if ((r.seen.mode[i] & 0644) != 0644 || (r.seen.mode[i] & ~0755u))
                modes = false;
            if (!strcmp(r.seen.names[i], "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80.txt"))
                found_utf8 = true;
            if (!strcmp(r.seen.names[i], "world-writable"))
                found_ww = r.seen.mode[i] == 0644;
        }
        ok(modes, "... every mode within 0644..0755");
        ok(found_ww, "... the 0666 file as 0644");
        ok(found_utf8, "... the UTF-8 name as itself");
    }
    setlocale(LC_ALL, "C");
    free(ws);
}

/* Random trees of random names (ASCII, UTF-8, control characters, dots,
 * long components), sizes and modes: every snapshot passes, and holds
 * every file whose path is under the limit. */
static void test_snapshot_random(void)
{
    static const char *const parts[] = {
        "a", "b", "Z", "-", "_", ".", "..", "...", " ", "\t", "\n", "=", "\\", "\xc3\xa9",
        "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\x01", "\x7f", "\xef\xbf\xbe", "\xf4\x8f\xbf\xbf",
        "0", "~", "%", "*", "?", "#",
    };
    static const mode_t modes[] = { 0644, 0600, 0666, 0777, 04755, 02700, 01777, 0, 0444, 0711 };
    uint32_t seed = 12345;
    int bad = 0, files_off = 0;

#define RND() (seed = seed * 1103515245u + 12345u, (seed >> 8))
    for (int tree = 0; tree < 40; tree++) {
        char *ws = new_dir("rand");
        int nfiles = 1 + (int)(RND() % 40), made = 0;
        struct snapshot_stats st;

        for (int f = 0; f < nfiles; f++) {
            char rel[2048] = "";
            int depth = 1 + (int)(RND() % 4);

            for (int d = 0; d < depth; d++) {
                char comp[300] = "";
                int len = 1 + (int)(RND() % 6);

                if (RND() % 16 == 0)
                    len = 40 + (int)(RND() % 30); /* long components */
                for (int k = 0; k < len && strlen(comp) < 250; k++)
                    strcat(comp, parts[RND() % (sizeof parts / sizeof *parts)]);
                if (!strcmp(comp, ".") || !strcmp(comp, ".."))
                    strcat(comp, "x");
                if (d)
                    strcat(rel, "/");
                strcat(rel, comp);
            }
            size_t size = RND() % 8 == 0 ? RND() % 200000 : RND() % 700;
            static uint8_t data[200000];
            for (size_t i = 0; i < size; i++)
                data[i] = (uint8_t)RND();
            put(ws, rel, data, size, modes[RND() % 10]);
            made++;
        }
        struct run r = snap_check(ws, &st);
        if (r.rc != TARCHECK_VALID) {
            bad++;
            printf("# tree %d: %d %s\n", tree, r.rc, r.why);
        }
        if ((int)st.files != r.seen.n || st.skipped != 0)
            files_off++;
        (void)made;
        free(ws);
    }
    ok(bad == 0, "40 random trees: every snapshot passes the check");
    ok(files_off == 0, "... with every file in it and none skipped");
#undef RND
}

static void cleanup(void)
{
    char cmd[128];

    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd) != 0)
        printf("# could not remove %s\n", base);
}

/* ---- the verified-member cache ----------------------------------------- */

static size_t fb_len(const uint8_t *h)
{
    return (size_t)h[16] | (size_t)h[17] << 8 | (size_t)h[18] << 16 | (size_t)h[19] << 24;
}

/* Split a snapshot into its gzip members (by their FB lengths). */
static int split_members(const struct mem *m, size_t *off, size_t *len, int max)
{
    size_t o = 0;
    int n = 0;

    while (o < m->len && n < max) {
        off[n] = o;
        len[n] = fb_len(m->p + o);
        o += len[n++];
    }
    return o == m->len ? n : -1;
}

static struct mem cat_members(const struct mem *m, const size_t *off, const size_t *len,
                              const int *order, int n)
{
    struct mem out = {0};

    for (int i = 0; i < n; i++)
        mem_add(&out, m->p + off[order[i]], len[order[i]]);
    return out;
}

/* The same verdict and members with a cache (warmed by msg0) as without. */
static void expect_same(const struct mem *msg0, const struct mem *m,
                        const struct tarcheck_limits *lim, const char *what, bool want_hits)
{
    struct tarcheck_cache *c = tarcheck_cache_new(MiB_, NULL);
    struct run warm = run_cached(msg0->p, msg0->len, &default_lim, 0, c);
    struct run plain = run_once(m->p, m->len, lim, 3);
    struct run cached = run_cached(m->p, m->len, lim, 3, c);

    /* A refusal's reason may differ when a member was replayed: one that is
     * not what its digest says is known as it starts (tarcheck.h). */
    bool same = plain.rc == cached.rc && !strcmp(plain.why, cached.why) &&
                plain.seen.n == cached.seen.n && !strcmp(plain.seen.last, cached.seen.last);
    ok(warm.rc == 0 && (same || (plain.rc < 0 && cached.rc < 0 && cached.st.cache_hits > 0)),
       "cache: %s: %d (%s) without, %d (%s) with (%llu hits)", what, plain.rc, plain.why,
       cached.rc, cached.why, (unsigned long long)cached.st.cache_hits);
    if (want_hits)
        ok(cached.st.cache_hits > 0, "cache: %s: members came from the cache", what);
    tarcheck_cache_free(c);
}

static void test_cache(void)
{
    char *ws = new_dir("cache");
    struct buf out;
    struct mem msg, m;
    size_t off[16], len[16];
    struct budget turn = {.max = 100 * MiB_};
    struct tarcheck_cache *c = tarcheck_cache_new(MiB_, &turn);
    struct tarcheck_limits lim;
    int fd, n;
    static uint8_t rnd[20000];

    for (size_t i = 0; i < sizeof rnd; i++)
        rnd[i] = (uint8_t)(i * 2654435761u >> 13);
    put(ws, "a.txt", "alpha alpha alpha", 17, 0644);
    put(ws, "b.txt", "bravo", 5, 0755);
    put(ws, "c.bin", rnd, sizeof rnd, 0644);
    put(ws, "d.txt", "delta", 5, 0644);
    fd = open(ws, O_RDONLY | O_DIRECTORY);
    buf_init(&out, 256 * MiB_);
    is_int(archive_snapshot(fd, 100 * MiB_, &out, NULL), 0, "cache: snapshot");
    close(fd);
    msg = (struct mem){.p = out.data, .len = out.len};
    n = split_members(&msg, off, len, 16);
    is_int(n, 5, "cache: four file members and the end");

    struct run r1 = run_cached(msg.p, msg.len, &default_lim, 0, c);
    ok(r1.rc == 0 && r1.st.cache_hits == 0 && r1.st.cache_added == 4,
       "cache: first check inflates all, remembers 4 (%d, %llu)", r1.rc,
       (unsigned long long)r1.st.cache_added);
    ok(turn.used > 0, "cache: its memory is charged to the turn (%llu)",
       (unsigned long long)turn.used);
    struct run r2 = run_cached(msg.p, msg.len, &default_lim, 5, c);
    ok(r2.rc == 0 && r2.st.cache_hits == 4 && r2.seen.n == 4 &&
           r2.st.inflated == r1.st.inflated && r2.st.data == r1.st.data,
       "cache: second check, chunked: 4 hits, same members and counts");
    bool same = r1.seen.n == r2.seen.n;
    for (int i = 0; same && i < r1.seen.n; i++)
        same = !strcmp(r1.seen.names[i], r2.seen.names[i]) &&
               r1.seen.mode[i] == r2.seen.mode[i] && r1.seen.size[i] == r2.seen.size[i];
    ok(same, "cache: members reported the same (path, mode, size)");
    ok(r2.st.max_step_in <= TARCHECK_STEP_BUDGET + TARCHECK_GZ_HDR_LEN - 10,
       "cache: hashing keeps the step budget");
    tarcheck_cache_free(c);
    is_int((int)turn.used, 0, "cache: its charge is given back when freed");

    /* What depends on a member's place is checked again. */
    int swapped[] = {0, 2, 1, 3, 4}, twice[] = {0, 0, 1, 2, 3, 4}, no_end[] = {0, 1, 2, 3};
    m = cat_members(&msg, off, len, swapped, 5);
    expect_same(&msg, &m, &default_lim, "two members swapped", true);
    mem_free(&m);
    m = cat_members(&msg, off, len, twice, 6);
    expect_same(&msg, &m, &default_lim, "a member twice", true);
    mem_free(&m);
    m = cat_members(&msg, off, len, no_end, 4);
    expect_same(&msg, &m, &default_lim, "no end member", true);
    mem_free(&m);
    lim = default_lim;
    lim.max_members = 2;
    expect_same(&msg, &msg, &lim, "over max_members", true);
    lim = default_lim;
    lim.max_data = 100;
    expect_same(&msg, &msg, &lim, "over max_data", true);
    for (uint64_t mi = 1000; mi < 30000; mi += 2900) {
        lim = default_lim;
        lim.max_inflated = mi;
        expect_same(&msg, &msg, &lim, "over max_inflated", false);
    }
    /* Different bytes are never taken for a cached member. */
    m = (struct mem){0};
    mem_add(&m, msg.p, msg.len);
    m.p[off[1] + len[1] - 9] ^= 1; /* the CRC's last byte */
    expect_same(&msg, &m, &default_lim, "a CRC changed", true);
    memcpy(m.p, msg.p, msg.len);
    m.p[off[2] + 16] += 1; /* the FB length */
    expect_same(&msg, &m, &default_lim, "a length field off by one", true);
    memcpy(m.p, msg.p, msg.len);
    m.p[off[2] + TARCHECK_GZ_HDR_LEN + 10] ^= 0x40; /* deflate data of c.bin */
    expect_same(&msg, &m, &default_lim, "deflate data changed", true);
    mem_free(&m);
    m = (struct mem){0};
    mem_add(&m, msg.p, off[2] + len[2] / 2);
    expect_same(&msg, &m, &default_lim, "truncated inside a cached member", true);
    mem_free(&m);

    /* A full cache, or a budget that refuses, only means inflating. */
    c = tarcheck_cache_new(100, NULL);
    run_cached(msg.p, msg.len, &default_lim, 0, c);
    r2 = run_cached(msg.p, msg.len, &default_lim, 0, c);
    ok(r2.rc == 0 && r2.st.cache_hits == 0, "cache: a cache too small for one entry: no hits");
    tarcheck_cache_free(c);
    turn = (struct budget){.max = 1};
    c = tarcheck_cache_new(MiB_, &turn);
    run_cached(msg.p, msg.len, &default_lim, 0, c);
    r2 = run_cached(msg.p, msg.len, &default_lim, 0, c);
    ok(r2.rc == 0 && r2.st.cache_hits == 0 && turn.used == 0,
       "cache: a budget that refuses: nothing kept, no hits");
    tarcheck_cache_free(c);

    /* The FB subfield has one form. */
    static const struct { size_t at; uint8_t v; const char *why; } fb[] = {
        { 10, 9, "gzip: extra field" },  /* XLEN */
        { 12, 'G', "gzip: extra field" }, /* SI1 */
        { 13, 'C', "gzip: extra field" }, /* SI2 */
        { 14, 5, "gzip: extra field" },  /* LEN */
        { 16, 0, "gzip: member length field" }, /* length (low byte) */
    };
    for (size_t i = 0; i < sizeof fb / sizeof *fb; i++) {
        struct run r;

        m = (struct mem){0};
        mem_add(&m, msg.p, msg.len);
        m.p[off[0] + fb[i].at] = fb[i].v;
        r = run_once(m.p, m.len, &default_lim, 0);
        ok(r.rc == -EBADMSG && !strncmp(r.why, fb[i].why, strlen(fb[i].why)),
           "FB subfield byte %zu = %u refused: %s", fb[i].at, fb[i].v, r.why);
        mem_free(&m);
    }
    m = (struct mem){0};
    mem_add(&m, msg.p, msg.len);
    m.p[off[0] + 19] = 0x10; /* the length far past the member */
    struct run r3 = run_once(m.p, m.len, &default_lim, 0);
    ok(r3.rc == -EBADMSG && !strcmp(r3.why, "gzip: member length field wrong"),
       "a length past the member refused: %s", r3.why);
    mem_free(&m);
    /* A digest that is not the member's: refused, with or without a cache
     * (a member of level 1: its digest is read). */
    m = (struct mem){0};
    mem_add(&m, msg.p, msg.len);
    m.p[off[0] + 20] ^= 1;
    r3 = run_once(m.p, m.len, &default_lim, 0);
    ok(r3.rc == -EBADMSG && !strcmp(r3.why, "gzip: member digest wrong"),
       "a digest that lies refused: %s", r3.why);
    c = tarcheck_cache_new(MiB_, NULL);
    run_cached(msg.p, msg.len, &default_lim, 0, c);
    memcpy(m.p, msg.p, msg.len);
    m.p[off[1] + len[1] - 12] ^= 1; /* b.txt's deflate data: its claim is now a lie */
    r3 = run_cached(m.p, m.len, &default_lim, 0, c);
    ok(r3.rc == -EBADMSG && r3.st.cache_hits >= 2 && !strcmp(r3.why, "gzip: member digest wrong"),
       "a member not what its digest says, replayed, refused at its end: %s", r3.why);
    tarcheck_cache_free(c);
    mem_free(&m);
    buf_free(&out);
    free(ws);
}

int main(void)
{
    snprintf(base, sizeof base, "/tmp/test_tarcheck.XXXXXX");
    if (!mkdtemp(base))
        return 1;
    umask(0);
    test_accept();
    test_refuse_header();
    test_refuse_pax();
    test_refuse_stream();
    test_limits();
    test_bomb();
    test_api();
    test_snapshot_odd();
    test_snapshot_random();
    test_cache();
    cleanup();
    return tap_done();
}
