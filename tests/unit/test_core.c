/* Unit tests for core/: buf, budget, outq, util (fds, fd passing, clocks, the
 * reason buffer, array growth), utf8, log, ratelimit. TAP output. */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sys/socket.h>

#include "core/budget.h"
#include "core/buf.h"
#include "core/outq.h"
#include "core/cleanup.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/ratelimit.h"
#include "core/utf8.h"
#include "core/util.h"
#include "tap.h"

/* ---- buf ---------------------------------------------------------------- */

static void test_buf(void)
{
    struct buf b;
    buf_init(&b, 8);
    ok(b.data == NULL && b.len == 0 && b.max == 8, "init: empty, no allocation");
    is_int(buf_append(&b, "abcde", 5), 0, "append 5");
    is_int(buf_append(&b, "fgh", 3), 0, "append up to exactly max");
    ok(b.len == 8 && memcmp(b.data, "abcdefgh", 8) == 0, "contents");
    is_int(buf_append(&b, "i", 1), -ENOBUFS, "append past max");
    is_int(b.len, 8, "nothing appended on -ENOBUFS");
    is_int(buf_append(&b, "", 0), 0, "empty append at max is fine");
    ok(b.cap <= 8, "capacity clamped to max (cap %zu)", b.cap);

    buf_consume(&b, 3);
    ok(b.len == 5 && memcmp(b.data, "defgh", 5) == 0, "consume 3");
    buf_consume(&b, 5);
    is_int(b.len, 0, "consume all");
    is_int(buf_reserve(&b, 9), -ENOBUFS, "reserve past max");
    is_int(buf_reserve(&b, 8), 0, "reserve up to max");

    is_int(buf_printf(&b, "%d-%s", 42, "xy"), 0, "printf");
    ok(b.len == 5 && memcmp(b.data, "42-xy", 5) == 0, "printf contents, NUL not counted");
    is_int(buf_printf(&b, "%s", "abcd"), -ENOBUFS, "printf past max");
    is_int(b.len, 5, "nothing appended on printf -ENOBUFS");
    is_int(buf_printf(&b, "%s", "abc"), 0, "printf up to exactly max");
    ok(b.len == 8 && memcmp(b.data, "42-xyabc", 8) == 0, "printf fills to max");

    size_t cap = b.cap;
    buf_reset(&b);
    ok(b.len == 0 && b.cap == cap && b.data, "reset keeps memory");

    buf_append(&b, "zz", 2);
    size_t n = 0;
    uint8_t *p = buf_steal(&b, &n);
    ok(p && n == 2 && memcmp(p, "zz", 2) == 0, "steal hands over the data");
    ok(b.data == NULL && b.len == 0 && b.cap == 0 && b.max == 8, "steal leaves it empty");
    free(p);
    ok(buf_steal(&b, &n) == NULL && n == 0, "steal from empty buffer");

    buf_append(&b, "q", 1);
    buf_free(&b);
    buf_free(&b);
    ok(b.data == NULL && b.len == 0 && b.max == 8, "free twice, max kept");

    /* growth: many small appends to a large max stay correct */
    buf_init(&b, 1 << 20);
    int bad = 0;
    for (int i = 0; i < 100000; i++)
        bad |= buf_append(&b, &(uint8_t){(uint8_t)i}, 1);
    int mismatch = 0;
    for (int i = 0; i < 100000; i++)
        mismatch |= b.data[i] != (uint8_t)i;
    ok(!bad && !mismatch && b.len == 100000, "100000 appends");
    buf_free(&b);

    buf_init(&b, 0);
    is_int(buf_append(&b, "x", 1), -ENOBUFS, "max 0 holds nothing");
    buf_free(&b);
}

/* ---- util --------------------------------------------------------------- */

static void test_ct_equal(void)
{
    ok(ct_equal("Bearer abc", 10, "Bearer abc", 10), "equal");
    ok(!ct_equal("Bearer abc", 10, "Bearer abd", 10), "last byte differs");
    ok(!ct_equal("Bearer abc", 10, "bearer abc", 10), "first byte differs");
    ok(!ct_equal("Bearer abc", 10, "Bearer ab", 9), "prefix is not equal");
    ok(!ct_equal("Bearer ab", 9, "Bearer abc", 10), "longer is not equal");
    ok(ct_equal("", 0, "", 0), "empty equal");
    ok(!ct_equal("", 0, "x", 1), "empty vs one byte");
    ok(!ct_equal("x", 1, "", 0), "one byte vs empty");
    ok(ct_equal("a\0b", 3, "a\0b", 3), "binary equal");
    ok(!ct_equal("a\0b", 3, "a\0c", 3), "binary differs after NUL");
    ok(ct_equal(NULL, 0, NULL, 0), "NULL with zero lengths");
}

static void test_parse_u64(void)
{
    uint64_t v = 99;
    ok(parse_u64("0", UINT64_MAX, &v) == 0 && v == 0, "0");
    ok(parse_u64("8080", 65535, &v) == 0 && v == 8080, "8080");
    ok(parse_u64("007", 10, &v) == 0 && v == 7, "leading zeros");
    ok(parse_u64("18446744073709551615", UINT64_MAX, &v) == 0 && v == UINT64_MAX, "UINT64_MAX");
    v = 5;
    is_int(parse_u64("18446744073709551616", UINT64_MAX, &v), -ERANGE, "UINT64_MAX + 1");
    is_int(parse_u64("99999999999999999999999", UINT64_MAX, &v), -ERANGE, "way over");
    is_int(parse_u64("65536", 65535, &v), -ERANGE, "over the bound");
    ok(parse_u64("65535", 65535, &v) == 0 && v == 65535, "exactly the bound");
    is_int(v, 65535, "value");
    is_int(parse_u64("", 10, &v), -EINVAL, "empty");
    is_int(parse_u64(NULL, 10, &v), -EINVAL, "NULL");
    is_int(parse_u64("-1", 10, &v), -EINVAL, "negative");
    is_int(parse_u64("+1", 10, &v), -EINVAL, "plus sign");
    is_int(parse_u64(" 1", 10, &v), -EINVAL, "leading space");
    is_int(parse_u64("1 ", 10, &v), -EINVAL, "trailing space");
    is_int(parse_u64("12a", 100, &v), -EINVAL, "trailing junk");
    is_int(parse_u64("0x10", 100, &v), -EINVAL, "hex");
    is_int(parse_u64("99999999999999999999999x", UINT64_MAX, &v), -EINVAL, "junk after overflow");
    is_int(v, 65535, "value untouched on error");
}

static void test_grow_array(void)
{
    uint64_t *a = NULL;
    size_t cap = 0;
    is_int(GROW_ARRAY(a, &cap, 1, 4, SIZE_MAX), 0, "grow: first allocation");
    ok(a && cap == 4, "grow: first capacity");
    for (size_t i = 0; i < cap; i++)
        a[i] = i; /* sizeof *a bytes each: ASan checks the size */
    uint64_t *before = a;
    is_int(GROW_ARRAY(a, &cap, 4, 4, SIZE_MAX), 0, "grow: room already");
    ok(a == before && cap == 4, "grow: room already: nothing done");
    is_int(GROW_ARRAY(a, &cap, 5, 4, SIZE_MAX), 0, "grow: one more");
    ok(cap == 8 && a[3] == 3, "grow: doubled, contents kept");
    is_int(GROW_ARRAY(a, &cap, 100, 4, SIZE_MAX), 0, "grow: more than double");
    ok(cap == 100 && a[3] == 3, "grow: at least need");
    a[99] = 99;
    is_int(GROW_ARRAY(a, &cap, 101, 4, 150), 0, "grow: near max");
    ok(cap == 150, "grow: doubling capped at max");
    before = a;
    is_int(GROW_ARRAY(a, &cap, 151, 4, 150), -E2BIG, "grow: need > max");
    ok(a == before && cap == 150 && a[99] == 99, "grow: need > max: array unchanged");
    free(a);

    /* Overflow: the byte size would not fit a size_t; refused before realloc. */
    char *c = malloc(1);
    size_t ccap = SIZE_MAX / 2 + 1; /* a lie: never reached by realloc */
    is_int(grow_array(&c, &ccap, ccap + 1, 2, 1, SIZE_MAX), -ENOMEM, "grow: doubling overflows");
    ok(ccap == SIZE_MAX / 2 + 1, "grow: overflow: capacity unchanged");
    size_t zcap = 0;
    char *z = NULL;
    is_int(grow_array(&z, &zcap, 3, SIZE_MAX / 2, 1, SIZE_MAX), -ENOMEM,
           "grow: elem * need overflows");
    ok(z == NULL && zcap == 0, "grow: overflow: array unchanged");
    free(c);
}

static void test_fd(void)
{
    int p[2];
    if (pipe(p) < 0) {
        ok(0, "pipe");
        return;
    }
    _cleanup_close_ int r = p[0], w = p[1];

    ok(fd_set_nonblock(r, true) == 0 && (fcntl(r, F_GETFL) & O_NONBLOCK), "nonblock on");
    ok(fd_set_nonblock(r, false) == 0 && !(fcntl(r, F_GETFL) & O_NONBLOCK), "nonblock off");
    ok(fd_set_cloexec(w, true) == 0 && (fcntl(w, F_GETFD) & FD_CLOEXEC), "cloexec on");
    ok(fd_set_cloexec(w, false) == 0 && !(fcntl(w, F_GETFD) & FD_CLOEXEC), "cloexec off");
    is_int(fd_set_nonblock(-1, true), -EBADF, "nonblock on a bad fd");
    is_int(fd_set_cloexec(-1, true), -EBADF, "cloexec on a bad fd");

    is_int(write_all(w, "hello world", 11), 0, "write_all");
    char got[16] = {0};
    ok(read_all(r, got, 11) == 0 && memcmp(got, "hello world", 11) == 0, "read_all");
    write_all(w, "ab", 2);
    close_and_reset(&w);
    is_int(read_all(r, got, 3), -EPIPE, "read_all: EOF before n bytes");
    is_int(write_all(-1, "x", 1), -EBADF, "write_all on a bad fd");
    is_int(read_all(-1, got, 1), -EBADF, "read_all on a bad fd");
}

/* ---- the reason buffer ---------------------------------------------------- */

static void test_err(void)
{
    char err[16];
    is_int(err_fmt(err, sizeof err, -EINVAL, "bad %s: %d", "value", 7), -EINVAL,
           "err_fmt returns its code");
    is_str(err, "bad value: 7", "err_fmt writes the reason");
    err_fmt(err, sizeof err, -E2BIG, "%s", "a reason longer than the buffer");
    ok(strlen(err) == sizeof err - 1 && !strncmp(err, "a reason longer", 15),
       "err_fmt cuts to fit, NUL-terminated");
    is_int(err_fmt(NULL, 0, -ENOMEM, "%s", "nobody reads this"), -ENOMEM, "no buffer: only the code");
    err[0] = 'x';
    is_int(err_fmt(err, 0, -ENOMEM, "%s", "no room"), -ENOMEM, "errlen 0: nothing written");
    ok(err[0] == 'x', "errlen 0 leaves the buffer alone");

    errno = ENOENT;
    is_int(err_errno(err, sizeof err, "open %s", "/x"), -ENOENT, "err_errno returns -errno");
    ok(!strcmp(err, "open /x") && errno == ENOENT, "err_errno writes the reason, keeps errno");
    errno = 0;
    is_int(err_errno(err, sizeof err, "odd"), -EIO, "err_errno with errno 0: -EIO");
}

/* ---- fd passing ------------------------------------------------------------ */

static int count_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    for (struct dirent *de; (de = readdir(d));)
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

static void test_fdpass(void)
{
    int sv[2], p1[2], p2[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0 || pipe(p1) < 0 || pipe(p2) < 0) {
        ok(0, "socketpair, pipes");
        return;
    }
    _cleanup_close_ int a = sv[0], b = sv[1];
    _cleanup_close_ int r1 = p1[0], w1 = p1[1], r2 = p2[0], w2 = p2[1];

    /* Two fds with the bytes; they arrive as new fds on the same pipes,
     * close-on-exec, and the sender keeps its own. */
    int out[2] = {w1, w2}, in[FDPASS_MAX_FDS];
    size_t nin = 99;
    int mf = -1;
    char got[8] = {0};
    is_int(fd_send(a, "abc", 3, out, 2, 0), 3, "fd_send: bytes and two fds");
    is_int(fd_recv(b, got, sizeof got, in, FDPASS_MAX_FDS, &nin, 0, &mf), 3, "fd_recv: the bytes");
    ok(!memcmp(got, "abc", 3) && nin == 2 && mf == 0, "two fds, no truncation");
    ok(nin == 2 && in[0] != w1 && in[1] != w2 && (fcntl(in[0], F_GETFD) & FD_CLOEXEC) &&
           (fcntl(in[1], F_GETFD) & FD_CLOEXEC), "new fds, close-on-exec");
    ok(fcntl(w1, F_GETFD) >= 0 && fcntl(w2, F_GETFD) >= 0, "the sender's fds are still its own");
    if (nin == 2) {
        ok(write(in[1], "y", 1) == 1 && read(r2, got, 1) == 1 && got[0] == 'y',
           "the second fd is the second pipe");
        close(in[0]);
        close(in[1]);
    }

    /* maxfds 1: the second fd is closed by fd_recv, not leaked. */
    int before = count_fds();
    fd_send(a, "d", 1, out, 2, 0);
    is_int(fd_recv(b, got, sizeof got, in, 1, &nin, 0, NULL), 1, "fd_recv with room for one");
    is_int(nin, 1, "one fd taken");
    is_int(count_fds(), before + 1, "the other one closed, not leaked");
    if (nin == 1)
        close(in[0]);

    /* Plain bytes, too many fds, nothing there, EOF. */
    is_int(fd_send(a, "e", 1, NULL, 0, 0), 1, "fd_send without fds");
    ok(fd_recv(b, got, sizeof got, in, FDPASS_MAX_FDS, &nin, 0, NULL) == 1 && nin == 0 &&
           got[0] == 'e', "fd_recv without fds");
    int many[FDPASS_MAX_FDS + 1];
    for (size_t i = 0; i <= FDPASS_MAX_FDS; i++)
        many[i] = w1;
    is_int(fd_send(a, "f", 1, many, FDPASS_MAX_FDS + 1, 0), -EINVAL, "more than FDPASS_MAX_FDS");
    is_int(fd_recv(b, got, sizeof got, in, 1, &nin, MSG_DONTWAIT, NULL), -EAGAIN,
           "MSG_DONTWAIT with nothing there: -EAGAIN");
    close_and_reset(&a);
    is_int(fd_recv(b, got, sizeof got, in, 1, &nin, 0, NULL), 0, "EOF: 0");
    is_int(fd_send(b, "g", 1, NULL, 0, 0), -EPIPE, "fd_send to a closed peer: -EPIPE, no SIGPIPE");
    is_int(fd_send(-1, "g", 1, NULL, 0, 0), -EBADF, "fd_send on a bad fd");
    (void)r1;
}

static void test_time(void)
{
    uint64_t a = now_ns(), ma = now_ms();
    usleep(20000);
    uint64_t b = now_ns(), mb = now_ms();
    ok(b - a >= 20000000ULL, "now_ns advances (%llu ns)", (unsigned long long)(b - a));
    ok(mb - ma >= 19 && mb - ma < 5000, "now_ms advances (%llu ms)", (unsigned long long)(mb - ma));
    ok(ma > 0 && a > 0, "monotonic clock is non-zero");
}

/* ---- utf8 --------------------------------------------------------------- */

static bool v(const char *s) { return utf8_valid((const uint8_t *)s, strlen(s)); }
static bool vn(const void *s, size_t n) { return utf8_valid(s, n); }

/* Reference decoder: the definition, one code point at a time, slowly. */
static bool ref_valid(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                   : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!len || i + len > n)
            return false;
        uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (p[i + k] & 0x3F);
        }
        static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += len;
    }
    return true;
}

static void test_utf8(void)
{
    ok(vn("", 0), "empty");
    ok(v("plain ascii, longer than eight bytes"), "ascii");
    ok(vn("a\0b", 3), "NUL is valid UTF-8");
    ok(v("\x7f"), "U+007F");
    ok(v("\xc2\x80"), "U+0080");
    ok(v("\xdf\xbf"), "U+07FF");
    ok(v("\xe0\xa0\x80"), "U+0800");
    ok(v("\xed\x9f\xbf"), "U+D7FF");
    ok(v("\xee\x80\x80"), "U+E000");
    ok(v("\xef\xbf\xbf"), "U+FFFF");
    ok(v("\xf0\x90\x80\x80"), "U+10000");
    ok(v("\xf4\x8f\xbf\xbf"), "U+10FFFF ok");
    ok(v("h\xc3\xa9llo \xe2\x80\xa8 \xf0\x9f\x98\x80"), "mixed");

    ok(!v("\xc0\x80"), "overlong NUL C0 80");
    ok(!v("\xc1\xbf"), "overlong C1 BF");
    ok(!v("\xe0\x80\x80"), "overlong E0 80 80");
    ok(!v("\xe0\x9f\xbf"), "overlong E0 9F BF");
    ok(!v("\xf0\x80\x80\x80"), "overlong F0 80 80 80");
    ok(!v("\xf0\x8f\xbf\xbf"), "overlong F0 8F BF BF");
    ok(!v("\xed\xa0\x80"), "surrogate U+D800");
    ok(!v("\xed\xbf\xbf"), "surrogate U+DFFF");
    ok(!v("\xed\xa0\xbd\xed\xb8\x80"), "CESU-8 surrogate pair");
    ok(!v("\xf4\x90\x80\x80"), "U+110000 bad");
    ok(!v("\xf5\x80\x80\x80"), "F5 lead");
    ok(!v("\xff"), "FF");
    ok(!v("\xfe"), "FE");
    ok(!v("\x80"), "lone continuation");
    ok(!v("a\xbf"), "continuation after ascii");
    ok(!v("\xc3"), "truncated 2-byte at end");
    ok(!v("\xe2\x82"), "truncated 3-byte at end");
    ok(!v("\xf0\x9f\x98"), "truncated 4-byte at end");
    ok(!v("\xc3x"), "truncated 2-byte before ascii");
    ok(!v("\xe2\x82x"), "truncated 3-byte before ascii");
    ok(!v("\xf0\x9f\x98x"), "truncated 4-byte before ascii");
    ok(!v("\xe2\x82\xc3\xa9"), "3-byte cut by a new lead");
    ok(!vn("\xc3\xa9", 1), "length cuts a sequence");

    /* the fast path: a bad byte at every offset of a long ASCII run */
    char run[40];
    bool all = true;
    for (size_t pos = 0; pos < 33; pos++) {
        memset(run, 'a', sizeof run);
        run[pos] = (char)0x80;
        all = all && !vn(run, 33) && vn(run, pos);
    }
    ok(all, "bad byte found at every offset of an ASCII run");
    memset(run, 'a', sizeof run);
    memcpy(run + 7, "\xe2\x82\xac", 3); /* across a word boundary */
    ok(vn(run, sizeof run), "sequence straddling the 8-byte word");

    /* exhaustive 1..3-byte sequences against the reference decoder */
    size_t mism = 0;
    uint8_t s[4];
    for (unsigned a = 0; a < 256; a++) {
        s[0] = (uint8_t)a;
        mism += utf8_valid(s, 1) != ref_valid(s, 1);
        for (unsigned b = 0; b < 256; b++) {
            s[1] = (uint8_t)b;
            mism += utf8_valid(s, 2) != ref_valid(s, 2);
            for (unsigned c = 0; c < 256; c++) {
                s[2] = (uint8_t)c;
                mism += utf8_valid(s, 3) != ref_valid(s, 3);
            }
        }
    }
    is_int(mism, 0, "all 1-, 2- and 3-byte inputs agree with the reference");
    /* 4-byte leads with every second byte and a spread of the rest */
    mism = 0;
    for (unsigned a = 0xEF; a < 256; a++)
        for (unsigned b = 0; b < 256; b++)
            for (unsigned c = 0x70; c < 0xD0; c += 7)
                for (unsigned d = 0x70; d < 0xD0; d += 5) {
                    s[0] = (uint8_t)a, s[1] = (uint8_t)b, s[2] = (uint8_t)c, s[3] = (uint8_t)d;
                    mism += utf8_valid(s, 4) != ref_valid(s, 4);
                }
    is_int(mism, 0, "4-byte inputs agree with the reference");
}

/* The streaming check fed in two or three pieces agrees with the whole-text
 * check wherever the cuts fall (inside a sequence too). */
static bool stream_valid(const uint8_t *p, size_t n, size_t cut1, size_t cut2)
{
    struct utf8_stream st = {0};
    return utf8_stream_feed(&st, p, cut1) && utf8_stream_feed(&st, p + cut1, cut2 - cut1) &&
           utf8_stream_feed(&st, p + cut2, n - cut2) && utf8_stream_end(&st);
}

static void test_utf8_stream(void)
{
    static const char *const texts[] = {
        "plain ascii, longer than eight bytes",
        "h\xc3\xa9llo \xe2\x80\xa8 \xf0\x9f\x98\x80 and more ascii after it",
        "\xf4\x8f\xbf\xbf\xef\xbf\xbf\xdf\xbf", "\xe2\x82\xc3\xa9", "a\xbf", "\xed\xa0\x80",
        "\xf0\x9f\x98", "\xc3", "abcdefg\xe2\x82\xac" "abcdefgh", "\xf0\x8f\xbf\xbf", "\xc0\x80",
    };
    size_t mism = 0;
    for (size_t t = 0; t < sizeof texts / sizeof *texts; t++) {
        const uint8_t *p = (const uint8_t *)texts[t];
        size_t n = strlen(texts[t]);
        for (size_t a = 0; a <= n; a++)
            for (size_t b = a; b <= n; b++)
                mism += stream_valid(p, n, a, b) != ref_valid(p, n);
    }
    is_int(mism, 0, "streamed in three pieces, cut anywhere: same verdict as the reference");

    /* every 2- and 3-byte input, cut after each byte */
    mism = 0;
    uint8_t s[3];
    for (unsigned a = 0x80; a < 256; a++)
        for (unsigned b = 0; b < 256; b++)
            for (unsigned c = 0x70; c < 0xD0; c += 3) {
                s[0] = (uint8_t)a, s[1] = (uint8_t)b, s[2] = (uint8_t)c;
                bool want = ref_valid(s, 3);
                mism += stream_valid(s, 3, 1, 1) != want;
                mism += stream_valid(s, 3, 1, 2) != want;
                mism += stream_valid(s, 3, 2, 2) != want;
            }
    is_int(mism, 0, "3-byte inputs cut after each byte agree with the reference");
    struct utf8_stream st = {0};
    ok(utf8_stream_feed(&st, (const uint8_t *)"\xe2\x82", 2) && !utf8_stream_end(&st),
       "a cut sequence: nothing wrong yet, but the text may not end there");
}

/* ---- log ---------------------------------------------------------------- */

/* Run fn with stderr redirected to a pipe; return what it wrote. */
static char *capture_stderr(void (*fn)(void))
{
    int p[2];
    if (pipe(p) < 0)
        return NULL;
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(p[1], STDERR_FILENO);
    close(p[1]);
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    char *out = calloc(1, 4096);
    ssize_t n = read(p[0], out, 4095);
    (void)n;
    close(p[0]);
    return out;
}

static int log_line_no;
static void log_some(void)
{
    log_init("forkboxd", LOG_LEVEL_INFO);
    LOG_D("hidden %d", 1);
    log_line_no = __LINE__ + 1;
    LOG_I("hello %s", "world");
    errno = ENOENT;
    PLOG_E("open %s", "/x");
    is_int(errno, ENOENT, "log_write preserves errno");
    LOG_W("warn");
}

static void log_long(void)
{
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    LOG_E("%s", big);
}

static void test_log(void)
{
    char *out = capture_stderr(log_some);
    char want[512];
    snprintf(want, sizeof want,
             "forkboxd: INFO log_some:%d: hello world\n"
             "forkboxd: ERROR log_some:%d: open /x: No such file or directory\n"
             "forkboxd: WARN log_some:%d: warn\n",
             log_line_no, log_line_no + 2, log_line_no + 4);
    is_str(out, want, "format, level filter and errno suffix");
    free(out);
    is_int(log_min_level(), LOG_LEVEL_INFO, "log_min_level");

    out = capture_stderr(log_long);
    size_t n = out ? strlen(out) : 0;
    ok(n > 100 && n <= 1024 && out[n - 1] == '\n' && strchr(out, '\n') == out + n - 1,
       "long message cut to one line (%zu bytes)", n);
    free(out);
    log_init("forkbox", LOG_LEVEL_DEBUG);
    is_int(log_min_level(), LOG_LEVEL_DEBUG, "log_init sets the level");
}

/* ---- log formats: json, journal ------------------------------------------ */

static int fmt_line_no;
static void log_json_lines(void)
{
    log_init("forkboxd", LOG_LEVEL_INFO);
    log_set_format(LOG_FORMAT_JSON, false);
    fmt_line_no = __LINE__ + 1;
    LOG_I("peer sent \"%s\"", "a\\b\n\x01\xff\xc3\xa9");
    errno = ENOENT;
    PLOG_E("open");
    log_set_format(LOG_FORMAT_JSON, true);
    LOG_W("in the journal");
    log_set_format(LOG_FORMAT_TEXT, true);
    LOG_D("hidden");
    LOG_I("text");
    LOG_W("text");
    LOG_E("text");
    log_init("forkboxd", LOG_LEVEL_DEBUG);
    LOG_D("text");
    log_set_format(LOG_FORMAT_TEXT, false);
    log_init("forkboxd", LOG_LEVEL_INFO);
}

static void log_json_long(void)
{
    /* 1000 control bytes: each escapes to 6, far past one PIPE_BUF line */
    char big[1001];
    memset(big, 1, sizeof big - 1);
    big[sizeof big - 1] = 0;
    log_set_format(LOG_FORMAT_JSON, false);
    LOG_E("%s", big);
    log_set_format(LOG_FORMAT_TEXT, false);
}

static void test_log_formats(void)
{
    char *out = capture_stderr(log_json_lines);
    char want[512];
    char *nl = out ? strchr(out, '\n') : NULL;
    ok(out && !strncmp(out, "{\"ts\":\"", 7) && nl, "json: a timestamp first");
    /* 2024-01-02T03:04:05.678Z */
    ok(out && strlen(out) > 32 && out[11] == '-' && out[17] == 'T' && out[26] == '.' &&
           out[30] == 'Z' && out[31] == '"',
       "json: RFC 3339 UTC with ms (%.40s)", out ? out : "");
    snprintf(want, sizeof want,
             "\"level\":\"info\",\"proc\":\"forkboxd\",\"pid\":%d,\"src\":\"log_json_lines:%d\","
             "\"msg\":\"peer sent \\\"a\\\\b\\n\\u0001\\ufffd\xc3\xa9\\\"\"}\n",
             (int)getpid(), fmt_line_no);
    ok(out && strstr(out, want), "json: fields, escapes, U+FFFD for a stray byte, valid UTF-8 kept");
    ok(out && strstr(out, "\"level\":\"error\"") &&
           strstr(out, "\"msg\":\"open: No such file or directory\"}\n"),
       "json: errno text in msg");
    ok(out && strstr(out, "\n<4>{\"level\":\"warn\",\"proc\":\"forkboxd\""),
       "json in the journal: priority prefix, no ts");
    ok(out && !strstr(out, "hidden") && strstr(out, "\n<6>forkboxd: INFO ") &&
           strstr(out, "\n<4>forkboxd: WARN ") && strstr(out, "\n<3>forkboxd: ERROR ") &&
           strstr(out, "\n<7>forkboxd: DEBUG "),
       "text in the journal: <6> <4> <3> <7> (sd-daemon.h)");
    free(out);

    out = capture_stderr(log_json_long);
    size_t n = out ? strlen(out) : 0;
    ok(n > 3000 && n <= 4096 && !strcmp(out + n - 3, "\"}\n") && strchr(out, '\n') == out + n - 1,
       "json: a long escaped line is cut to one PIPE_BUF line, still closed (%zu bytes)", n);
    ok(out && !strstr(out, "\\u000\"") && !strstr(out, "\\u00\""), "cut between escapes");
    free(out);

    char esc[64];
    size_t el = log_json_escape(esc, 7, "\x01\x02", 2);
    is_int(el, 6, "json escape: only whole escapes fit");
    el = log_json_escape(esc, sizeof esc, "\xe2\x82", 2); /* a cut 3-byte sequence */
    esc[el] = 0;
    is_str(esc, "\\ufffd\\ufffd", "a cut sequence: one U+FFFD per byte");
    el = log_json_escape(esc, sizeof esc, "\xed\xa0\x80\xc0\xaf", 5); /* surrogate, overlong */
    esc[el] = 0;
    is_str(esc, "\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd", "surrogates and overlongs replaced");
    el = log_json_escape(esc, sizeof esc, "\xf0\x9f\x98\x80\x7f", 5);
    esc[el] = 0;
    is_str(esc, "\xf0\x9f\x98\x80\\u007f", "a 4-byte character kept, DEL escaped");

    char pr[16];
    log_printable(pr, sizeof pr, "/a\"b\\\xff\n", 7);
    is_str(pr, "/a\\x22b\\x5c\\xff", "printable: quote, backslash and bytes as \\xHH, cut whole");

    struct stat st;
    char js[64];
    ok(fstat(STDERR_FILENO, &st) == 0, "fstat stderr");
    snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    ok(log_journal_stream_matches(js, STDERR_FILENO), "JOURNAL_STREAM of stderr matches");
    snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino + 1);
    ok(!log_journal_stream_matches(js, STDERR_FILENO), "another inode does not");
    ok(!log_journal_stream_matches(NULL, STDERR_FILENO) &&
           !log_journal_stream_matches("", STDERR_FILENO) &&
           !log_journal_stream_matches("12", STDERR_FILENO) &&
           !log_journal_stream_matches("-1:2", STDERR_FILENO) &&
           !log_journal_stream_matches("1:2x", STDERR_FILENO),
       "absent or malformed: not the journal");
}

/* ---- ratelimit ---------------------------------------------------------- */

#define MS 1000000ULL
#define SEC (1000 * MS)

static void test_ratelimit_bucket(void)
{
    struct ratelimit rl = RATELIMIT_INIT(3, 1, 1000);
    uint64_t t0 = 5 * SEC, span = 0;
    int passed = 0;
    for (int i = 0; i < 5; i++)
        passed += ratelimit_take(&rl, t0);
    is_int(passed, 3, "a burst of 3 passes at once, the rest is dropped");
    is_int(rl.suppressed, 2, "the drops are counted");
    ok(!ratelimit_take(&rl, t0 + 999 * MS), "no token 999 ms later");
    ok(ratelimit_take(&rl, t0 + 1000 * MS), "one token back after 1 s");
    is_int(ratelimit_take_report(&rl, t0 + 1000 * MS, &span), 3, "report: 3 dropped before it");
    is_int(span, 1000 * MS, "report: since the first drop");
    is_int(ratelimit_take_report(&rl, t0 + 1000 * MS, &span), 0, "report resets");
    is_int(span, 0, "no span without drops");

    /* steady pressure: 1000 attempts a second for 10 s */
    passed = 0;
    for (uint64_t t = t0 + 2 * SEC; t < t0 + 12 * SEC; t += MS)
        passed += ratelimit_take(&rl, t);
    is_int(passed, 10, "10 s of pressure on an empty bucket: the refill rate, 1 a second");
    is_int(rl.suppressed, 10000 - passed, "everything else counted");

    /* a long quiet time refills the bucket to the burst, not beyond */
    passed = 0;
    for (int i = 0; i < 10; i++)
        passed += ratelimit_take(&rl, t0 + 1000 * SEC);
    is_int(passed, 3, "after an hour: still a burst of 3");

    /* several lines per interval, no burst */
    struct ratelimit fast = RATELIMIT_INIT(1, 10, 1000);
    passed = 0;
    for (uint64_t t = 0; t < SEC; t += 10 * MS)
        passed += ratelimit_take(&fast, t);
    is_int(passed, 10, "10 per second with a burst of 1: 10 of 100 in one second");
    ok(ratelimit_take(&fast, 0) == false && ratelimit_take(&fast, SEC) == true,
       "clock in ns from 0 works");

    /* degenerate settings are clamped, never divide by zero or stall */
    struct ratelimit zero = RATELIMIT_INIT(0, 0, 0);
    ok(ratelimit_take(&zero, 1) && ratelimit_take(&zero, 2), "zero settings: one per ns");
}

static struct ratelimit flush_rl = RATELIMIT_INIT(2, 1, 10000);
static uint64_t flush_t0;
static int flush_line;

static void flush_steps(void)
{
    log_init("forkboxd", LOG_LEVEL_INFO);
    flush_t0 = now_ns();
    for (int i = 0; i < 50; i++) {
        flush_line = __LINE__ + 1;
        ratelimit_log(&flush_rl, LOG_LEVEL_WARN, "site", 7, 0, "line %d", i);
    }
    /* 48 dropped; no token yet: the flush writes nothing and counts nothing */
    ratelimit_flush(&flush_rl, flush_t0 + 1 * SEC);
    is_int(flush_rl.suppressed, 48, "a flush without a token is not a dropped line");
    ratelimit_flush(&flush_rl, flush_t0 + 12 * SEC);
    is_int(flush_rl.suppressed, 0, "the flush reported the count");
    ratelimit_flush(&flush_rl, flush_t0 + 40 * SEC);
    ratelimit_log(&flush_rl, LOG_LEVEL_DEBUG, "site", 8, 0, "below the level");
}

static void test_ratelimit_flush(void)
{
    char *out = capture_stderr(flush_steps);
    is_str(out,
           "forkboxd: WARN site:7: line 0\n"
           "forkboxd: WARN site:7: line 1\n"
           "forkboxd: WARN site:7: 48 similar messages suppressed in the last 12 s\n",
           "burst, then one report line from the flush, nothing more");
    free(out);
    ok(flush_rl.suppressed == 0, "lines below the log level are not counted");
}

static int rl_site_line;
static void rl_sites(void)
{
    log_init("forkboxd", LOG_LEVEL_INFO);
    for (int i = 0; i < 1000; i++) {
        rl_site_line = __LINE__ + 1;
        LOG_W_RL("refused %d", i);
    }
    ratelimit_flush_sites(now_ns() + 2 * SEC);
    ratelimit_flush_sites(now_ns() + 4 * SEC);
}

static void rl_suffix(void)
{
    static struct ratelimit rl = RATELIMIT_INIT(1, 1, 60000);
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    ratelimit_log(&rl, LOG_LEVEL_WARN, "f", 1, 0, "first");
    ratelimit_log(&rl, LOG_LEVEL_WARN, "f", 1, 0, "dropped");
    rl.tat_ns = 0; /* hand a token back, as the clock would a minute later */
    ratelimit_log(&rl, LOG_LEVEL_WARN, "f", 1, ENOENT, "%s", big);
}

static void test_ratelimit_log(void)
{
    char *out = capture_stderr(rl_sites);
    int lines = 0;
    for (char *p = out; p && *p; p++)
        lines += *p == '\n';
    is_int(lines, LOG_RATELIMIT_BURST + 1, "1000 lines from one site: the burst and one report");
    char want[160];
    snprintf(want, sizeof want, "forkboxd: WARN rl_sites:%d: %d similar messages suppressed in the last ",
             rl_site_line, 1000 - LOG_RATELIMIT_BURST);
    ok(out && strstr(out, want), "the flush names the site and the count");
    snprintf(want, sizeof want, "forkboxd: WARN rl_sites:%d: refused 0\n", rl_site_line);
    ok(out && strncmp(out, want, strlen(want)) == 0, "the first line passes as written");
    free(out);

    out = capture_stderr(rl_suffix);
    char *second = out ? strchr(out, '\n') : NULL;
    size_t n = second ? strlen(second + 1) : 0;
    ok(second && n <= 1024 && n > 900, "a long line is cut to one line (%zu bytes)", n);
    static const char tail[] = " (1 similar message suppressed in the last 1 s)\n";
    ok(n > sizeof tail && strstr(second + 1, ": No such file or directory") == NULL &&
           strcmp(second + 1 + n - (sizeof tail - 1), tail) == 0,
       "the count survives the cut");
    free(out);
}

/* ---- budget ------------------------------------------------------------- */

static void test_budget(void)
{
    struct budget all = {.max = 100}, a = {.max = 60, .up = &all}, b = {.max = 60, .up = &all};
    is_int(budget_take(&a, 50), 0, "a takes 50 of its 60");
    is_int(budget_take(&a, 11), -EDQUOT, "a's own ceiling: -EDQUOT");
    is_int(budget_take(&b, 51), -ENOSPC, "b within its 60 but past the 100 of all: -ENOSPC");
    ok(a.used == 50 && b.used == 0 && all.used == 50, "a refused take changes nothing");
    is_int(budget_take(&b, 50), 0, "b takes the 50 left");
    budget_give(&a, 50);
    ok(a.used == 0 && all.used == 50, "give returns it at every level");
    budget_give(&b, 80);
    ok(b.used == 0 && all.used == 0, "giving more than was taken stops at 0");

    /* a buffer charges what it allocates, and gives it back */
    struct budget t = {.max = 4096};
    struct buf x, y;
    buf_init_budget(&x, SIZE_MAX, &t);
    buf_init_budget(&y, SIZE_MAX, &t);
    is_int(buf_reserve_exact(&x, 1000), 0, "reserve exactly 1000");
    ok(x.cap == 1000 && t.used == 1000, "charged the capacity, no more (%zu)", x.cap);
    is_int(buf_reserve_exact(&y, 4000), -EDQUOT, "a second buffer over the budget: -EDQUOT");
    ok(y.data == NULL && t.used == 1000, "nothing allocated on refusal");
    buf_append(&x, "abc", 3);
    is_int(buf_move(&y, &x), 0, "move");
    ok(x.data == NULL && x.cap == 0 && y.len == 3 && memcmp(y.data, "abc", 3) == 0 && t.used == 1000,
       "move keeps the bytes and the charge");
    struct budget other = {.max = 10};
    struct buf z;
    buf_init_budget(&z, SIZE_MAX, &other);
    is_int(buf_move(&z, &y), -EDQUOT, "move into a budget that cannot hold it: refused");
    buf_free(&y);
    is_int(t.used, 0, "free gives back everything");
}

/* ---- outq --------------------------------------------------------------- */

static void test_outq(void)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) < 0) {
        ok(0, "socketpair");
        return;
    }
    struct budget t = {.max = 64 << 20};
    struct outq q;
    outq_init(&q, &t);
    /* a header, a large message taken over, another header, a small piece */
    struct buf big;
    buf_init_budget(&big, SIZE_MAX, &t);
    size_t n = 3 << 20;
    buf_reserve_exact(&big, n);
    for (size_t i = 0; i < n; i++)
        big.data[i] = (uint8_t)(i * 7);
    big.len = n;
    uint8_t *keep = big.data;
    ok(outq_append(&q, "HDR1", 4) == 0 && outq_take(&q, &big) == 0 && outq_append(&q, "HDR2", 4) == 0 &&
           outq_append(&q, "tail", 4) == 0,
       "queued");
    ok(big.data == NULL && q.bytes == n + 12, "taken over without a copy (%zu bytes queued)", q.bytes);
    (void)keep;
    /* drain the other end while sending: everything arrives once, in order */
    uint8_t *got = malloc(n + 12);
    size_t have = 0;
    int r = 1, rounds = 0;
    while ((r == 1 || have < n + 12) && rounds++ < 100000) {
        r = outq_send(&q, sv[0]);
        ssize_t k;
        while ((k = recv(sv[1], got + have, n + 12 - have, MSG_DONTWAIT)) > 0)
            have += (size_t)k;
        if (r < 0)
            break;
    }
    bool same = have == n + 12 && memcmp(got, "HDR1", 4) == 0 &&
                memcmp(got + 4 + n, "HDR2tail", 8) == 0;
    for (size_t i = 0; same && i < n; i++)
        same = got[4 + i] == (uint8_t)(i * 7);
    ok(r == 0 && same, "sent in order, every byte once (%zu bytes)", have);
    ok(q.bytes == 0 && q.head == NULL && t.used == 0, "sent runs are freed and given back");
    free(got);
    outq_append(&q, "x", 1);
    close(sv[1]);
    is_int(outq_send(&q, sv[0]), -EPIPE, "a closed peer: -EPIPE");
    outq_free(&q);
    is_int(t.used, 0, "outq_free gives back what is queued");
    close(sv[0]);

    /* a slice of a message: only its bytes go, and an append after it
     * follows it on the wire (it may land in the message's spare bytes) */
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) < 0)
        return;
    struct buf m;
    buf_init_budget(&m, SIZE_MAX, &t);
    buf_append(&m, "{\"result\": \"VALUE\", \"x\": 1}", 27);
    ok(outq_append(&q, "<", 1) == 0 && outq_take_slice(&q, &m, 11, 7) == 0 &&
           outq_append(&q, ">", 1) == 0 && q.bytes == 9,
       "slice queued (%zu bytes)", q.bytes);
    char out[32] = {0};
    ok(outq_send(&q, sv[0]) == 0 && recv(sv[1], out, sizeof out, MSG_DONTWAIT) == 9 &&
           strcmp(out, "<\"VALUE\">") == 0,
       "only the slice is sent: %s", out);
    buf_append(&m, "abc", 3);
    is_int(outq_take_slice(&q, &m, 2, 2), -EINVAL, "a slice outside the buffer: -EINVAL");
    outq_free(&q);
    is_int(t.used, 0, "slices give back what they held");
    close(sv[0]);
    close(sv[1]);
}

int main(void)
{
    test_buf();
    test_budget();
    test_outq();
    test_ct_equal();
    test_parse_u64();
    test_grow_array();
    test_fd();
    test_time();
    test_err();
    test_fdpass();
    test_utf8();
    test_utf8_stream();
    test_log();
    test_log_formats();
    test_ratelimit_bucket();
    test_ratelimit_flush();
    test_ratelimit_log();
    return tap_done();
}
