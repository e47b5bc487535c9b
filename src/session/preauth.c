/* The pre-auth pool (see preauth.h). Runs in the supervisor.
 *
 * Every operation is O(1) expected: one intrusive list per class and one per
 * peer, each kept in order of activity by appending at the tail (the clock is
 * monotonic), and the peers in an open-addressing table allocated once, at
 * least twice the pool's size, so it is at most half full. */
#include "session/preauth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "core/limits.h"
#include "core/util.h"

/* ---------------------------------------------------------------- peer table */

/* Peers are chosen by the clients, so their slots must not be: the hash is
 * keyed with a random per-process seed (murmur3's 64-bit finaliser around
 * the seed, applied twice). Debian 12's nettle (3.8) has no SipHash, and a
 * flood of collisions could at worst make a lookup walk the whole table,
 * which is bounded (2 * the pool size). */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static size_t home_slot(const struct preauth_pool *p, const uint8_t key[PREAUTH_KEY_LEN])
{
    uint64_t a, b;
    memcpy(&a, key, 8);
    memcpy(&b, key + 8, 8);
    return (size_t)(mix64(mix64(a ^ p->seed[0]) ^ b ^ p->seed[1]) & (p->nslots - 1));
}

static struct preauth_peer *peer_find(const struct preauth_pool *p,
                                      const uint8_t key[PREAUTH_KEY_LEN])
{
    size_t mask = p->nslots - 1;
    for (size_t i = home_slot(p, key);; i = (i + 1) & mask) {
        struct preauth_peer *pp = &p->peers[i];
        if (pp->count == 0)
            return NULL;
        if (memcmp(pp->key, key, PREAUTH_KEY_LEN) == 0)
            return pp;
    }
}

/* A free slot for key (the table is never more than half full). */
static struct preauth_peer *peer_insert(struct preauth_pool *p, const uint8_t key[PREAUTH_KEY_LEN])
{
    size_t mask = p->nslots - 1;
    size_t i = home_slot(p, key);
    while (p->peers[i].count != 0)
        i = (i + 1) & mask;
    struct preauth_peer *pp = &p->peers[i];
    memcpy(pp->key, key, PREAUTH_KEY_LEN);
    pp->head = pp->tail = NULL;
    p->n_peers++;
    return pp;
}

/* Free the slot of a peer whose count fell to 0: linear probing's backward
 * shift, so no tombstones pile up under churn. */
static void peer_delete(struct preauth_pool *p, struct preauth_peer *pp)
{
    size_t mask = p->nslots - 1;
    size_t hole = (size_t)(pp - p->peers);
    for (size_t j = (hole + 1) & mask; p->peers[j].count != 0; j = (j + 1) & mask) {
        size_t home = home_slot(p, p->peers[j].key);
        /* j stays if its home lies cyclically in (hole, j]. */
        bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            p->peers[hole] = p->peers[j];
            hole = j;
        }
    }
    memset(&p->peers[hole], 0, sizeof p->peers[hole]);
    p->n_peers--;
}

/* ---------------------------------------------------------------- lists */

static void class_append(struct preauth_list *l, struct preauth_entry *e)
{
    e->next = NULL;
    e->prev = l->tail;
    if (l->tail)
        l->tail->next = e;
    else
        l->head = e;
    l->tail = e;
}

static void class_unlink(struct preauth_list *l, struct preauth_entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        l->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        l->tail = e->prev;
    e->prev = e->next = NULL;
}

static void peer_append(struct preauth_peer *pp, struct preauth_entry *e)
{
    e->peer_next = NULL;
    e->peer_prev = pp->tail;
    if (pp->tail)
        pp->tail->peer_next = e;
    else
        pp->head = e;
    pp->tail = e;
}

static void peer_unlink(struct preauth_peer *pp, struct preauth_entry *e)
{
    if (e->peer_prev)
        e->peer_prev->peer_next = e->peer_next;
    else
        pp->head = e->peer_next;
    if (e->peer_next)
        e->peer_next->peer_prev = e->peer_prev;
    else
        pp->tail = e->peer_prev;
    e->peer_prev = e->peer_next = NULL;
}

/* ---------------------------------------------------------------- the pool */

int preauth_init(struct preauth_pool *p, unsigned max, unsigned per_peer)
{
    memset(p, 0, sizeof *p);
    if (max == 0 || max > PREAUTH_MAX_CONNECTIONS_BOUND)
        return -EINVAL;
    p->max = max;
    p->per_peer = per_peer == 0 || per_peer > max ? max : per_peer;
    p->nslots = 2;
    while (p->nslots < 2 * (size_t)max)
        p->nslots *= 2;
    p->peers = calloc(p->nslots, sizeof *p->peers);
    if (!p->peers)
        return -ENOMEM;
    if (getrandom(p->seed, sizeof p->seed, GRND_NONBLOCK) != sizeof p->seed) {
        /* Early boot only; the seed still differs per process and start. */
        p->seed[0] = now_ns() ^ ((uint64_t)getpid() << 32);
        p->seed[1] = mix64(p->seed[0] ^ (uintptr_t)p);
    }
    return 0;
}

void preauth_free(struct preauth_pool *p)
{
    free(p->peers);
    p->peers = NULL;
}

void preauth_key(const struct sockaddr *sa, socklen_t len, uint8_t key[PREAUTH_KEY_LEN])
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    memset(key, 0, PREAUTH_KEY_LEN);
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in4 = (const struct sockaddr_in *)sa;
        memcpy(key, v4mapped, sizeof v4mapped);
        memcpy(key + 12, &in4->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        if (memcmp(in6->sin6_addr.s6_addr, v4mapped, sizeof v4mapped) == 0)
            memcpy(key, in6->sin6_addr.s6_addr, PREAUTH_KEY_LEN); /* IPv4 on a [::] socket */
        else
            memcpy(key, in6->sin6_addr.s6_addr, 8); /* the /64 */
    }
}

void preauth_key_str(const uint8_t key[PREAUTH_KEY_LEN], char out[PREAUTH_KEY_STR])
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(key, v4mapped, sizeof v4mapped) == 0) {
        inet_ntop(AF_INET, key + 12, out, PREAUTH_KEY_STR);
        return;
    }
    char a[INET6_ADDRSTRLEN];
    inet_ntop(AF_INET6, key, a, sizeof a);
    snprintf(out, PREAUTH_KEY_STR, "%s/64", a);
}

struct preauth_entry *preauth_victim(struct preauth_pool *p, const uint8_t key[PREAUTH_KEY_LEN],
                                     uint64_t now_ms, enum preauth_reason *why)
{
    const struct preauth_peer *pp = peer_find(p, key);
    if (pp && pp->count >= p->per_peer) {
        *why = PREAUTH_PEER_FULL;
        return pp->head;
    }
    if (p->n < p->max) {
        *why = PREAUTH_ROOM;
        return NULL;
    }
    *why = PREAUTH_POOL_FULL;
    if (p->cls[PREAUTH_ANSWERED].head)
        return p->cls[PREAUTH_ANSWERED].head;
    struct preauth_entry *s = p->cls[PREAUTH_SILENT].head, *a = p->cls[PREAUTH_ACTIVE].head;
    if (s && now_ms - s->active_ms >= PREAUTH_SILENT_GRACE_MS)
        return s;
    if (s && a)
        return s->active_ms <= a->active_ms ? s : a;
    return s ? s : a;
}

int preauth_add(struct preauth_pool *p, struct preauth_entry *e,
                const uint8_t key[PREAUTH_KEY_LEN], uint64_t now_ms)
{
    struct preauth_peer *pp = peer_find(p, key);
    if (p->n >= p->max || (pp && pp->count >= p->per_peer))
        return -ENOSPC;
    if (!pp)
        pp = peer_insert(p, key);
    memcpy(e->key, key, PREAUTH_KEY_LEN);
    e->cls = PREAUTH_SILENT;
    e->active_ms = now_ms;
    e->in_pool = true;
    class_append(&p->cls[PREAUTH_SILENT], e);
    peer_append(pp, e);
    pp->count++;
    p->n++;
    return 0;
}

void preauth_touch(struct preauth_pool *p, struct preauth_entry *e, enum preauth_class cls,
                   uint64_t now_ms)
{
    if (!e->in_pool)
        return;
    struct preauth_peer *pp = peer_find(p, e->key);
    class_unlink(&p->cls[e->cls], e);
    e->cls = cls;
    e->active_ms = now_ms;
    class_append(&p->cls[cls], e);
    peer_unlink(pp, e);
    peer_append(pp, e);
}

void preauth_remove(struct preauth_pool *p, struct preauth_entry *e)
{
    if (!e->in_pool)
        return;
    struct preauth_peer *pp = peer_find(p, e->key);
    class_unlink(&p->cls[e->cls], e);
    peer_unlink(pp, e);
    e->in_pool = false;
    p->n--;
    if (--pp->count == 0)
        peer_delete(p, pp);
}

unsigned preauth_peer_count(const struct preauth_pool *p, const uint8_t key[PREAUTH_KEY_LEN])
{
    const struct preauth_peer *pp = peer_find(p, key);
    return pp ? pp->count : 0;
}
