/* The snapshot check's tar layer: every inflated byte is a header, pax
 * records, file data, padding or end zeros; headers and pax blocks are
 * copied out whole (they may straddle inflate calls), file data is skipped
 * without a copy. Also the name rule the writer shares (tarcheck_path_ok).
 * Runs in the supervisor, on sandbox bytes (and in the sandbox, for the
 * name rule).
 *
 * Relies on tarcheck_gz.c for the inflated bytes (it calls tar_consume and,
 * at the message's end, tar_finish). Where each rule draws its line is in
 * tarcheck.c's opening comment. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/utf8.h"
#include "proto/tarcheck.h"
#include "proto/tarcheck_int.h"

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
int member_accept(struct tarcheck *tc, char type, uint64_t mode, uint64_t size,
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
int tar_consume(struct tarcheck *tc, const uint8_t *p, size_t n)
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
int tar_finish(struct tarcheck *tc)
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
