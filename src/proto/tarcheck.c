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
 * The layers are cut by job, each in its file (tarcheck_int.h: the state
 * they share, and what they call in each other):
 *   tarcheck.c        the API: the windows a call may read, creation;
 *   tarcheck_gz.c     the gzip layer and the step that drives both;
 *   tarcheck_cache.c  the verified-member cache: a member recognised by
 *                     its digest is replayed instead of inflated;
 *   tarcheck_tar.c    the tar layer: names, header fields, pax records.
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
#include <stdlib.h>
#include <zlib.h>

#include "proto/tarcheck_int.h"

uint64_t tarcheck_inflated_bound(uint64_t max_data, uint64_t max_members, size_t max_path)
{
    /* pax header, pax block, member header, data padding */
    uint64_t per_member = BLOCK + round_block(pax_max_for(max_path)) + BLOCK + (BLOCK - 1);

    return sat_add(sat_add(max_data, sat_mul(max_members, per_member)),
                   2 * BLOCK + TARCHECK_MAX_TRAILER);
}

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
