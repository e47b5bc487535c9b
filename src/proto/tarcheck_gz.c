/* The snapshot check's gzip layer: the member header (with the writer's FB
 * subfield, if FEXTRA) and trailer parsed here, the deflate data through
 * zlib's raw inflate within the step budget, and step(), which drives both
 * layers over one call's window. Runs in the supervisor, on sandbox bytes.
 *
 * Relies on tarcheck_tar.c for the inflated bytes' meaning (tar_consume,
 * tar_finish) and on tarcheck_cache.c for members recognised by their
 * digest (cache_lookup, cache_replay, cache_add). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <nettle/sha2.h>
#include <zlib.h>

#include "proto/tarcheck.h"
#include "proto/tarcheck_int.h"

static int gz_body_start(struct tarcheck *tc, bool hashing);

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
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

int step(struct tarcheck *tc)
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
