/* The snapshot check's verified-member cache (tarcheck.h): a member
 * verified earlier in the turn, kept under its digest with what it inflated
 * to, so that the same member in a later snapshot is hashed and replayed
 * into the tar layer's state instead of inflated again. Runs in the
 * supervisor; its bytes are charged to the turn's budget.
 *
 * Relies on tarcheck_gz.c, which looks members up as they start and adds
 * them at their end. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <nettle/sha2.h>

#include "core/budget.h"
#include "proto/tarcheck.h"
#include "proto/tarcheck_int.h"

static size_t bucket_of(const uint8_t *digest)
{
    size_t h;

    memcpy(&h, digest, sizeof h);
    return h & (CACHE_BUCKETS - 1);
}

struct cache_entry *cache_lookup(struct tarcheck_cache *c, const uint8_t *digest,
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
void cache_add(struct tarcheck *tc)
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
int cache_replay(struct tarcheck *tc, struct cache_entry *e)
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
bool digest_claimed(struct tarcheck *tc)
{
    uint8_t digest[SHA256_DIGEST_SIZE];
    sha256_digest(&tc->sha, sizeof digest, digest);
    return memcmp(digest, tc->claim, sizeof digest) == 0;
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
