/* Unit tests for session/preauth: peer keys, which connection the pool gives
 * up, and the peer table under churn against a plain model. TAP output. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/limits.h"
#include "session/preauth.h"
#include "tap.h"

static void key4(const char *a, uint8_t key[PREAUTH_KEY_LEN])
{
    struct sockaddr_in in4 = {.sin_family = AF_INET, .sin_port = htons(1234)};
    inet_pton(AF_INET, a, &in4.sin_addr);
    preauth_key((struct sockaddr *)&in4, sizeof in4, key);
}

static void key6(const char *a, uint8_t key[PREAUTH_KEY_LEN])
{
    struct sockaddr_in6 in6 = {.sin6_family = AF_INET6, .sin6_port = htons(1234)};
    inet_pton(AF_INET6, a, &in6.sin6_addr);
    preauth_key((struct sockaddr *)&in6, sizeof in6, key);
}

static void test_keys(void)
{
    uint8_t a[PREAUTH_KEY_LEN], b[PREAUTH_KEY_LEN];
    char s[PREAUTH_KEY_STR];

    key4("192.0.2.7", a);
    key6("::ffff:192.0.2.7", b);
    ok(memcmp(a, b, sizeof a) == 0, "IPv4 and IPv4-mapped IPv6 are the same peer");
    preauth_key_str(a, s);
    is_str(s, "192.0.2.7", "an IPv4 peer prints as its address");
    key4("192.0.2.8", b);
    ok(memcmp(a, b, sizeof a) != 0, "each IPv4 address is its own peer");

    key6("2001:db8:1:2::1", a);
    key6("2001:db8:1:2:ffff:eeee:dddd:cccc", b);
    ok(memcmp(a, b, sizeof a) == 0, "IPv6 addresses in one /64 are one peer");
    preauth_key_str(a, s);
    is_str(s, "2001:db8:1:2::/64", "an IPv6 peer prints as its /64");
    key6("2001:db8:1:3::1", b);
    ok(memcmp(a, b, sizeof a) != 0, "another /64 is another peer");

    struct sockaddr_un_like {
        sa_family_t family;
        char path[8];
    } un = {.family = AF_UNIX, .path = "x"};
    preauth_key((struct sockaddr *)&un, sizeof un, a);
    static const uint8_t zero[PREAUTH_KEY_LEN];
    ok(memcmp(a, zero, sizeof a) == 0, "another family is one peer (all zeros)");
    struct sockaddr_in short4 = {.sin_family = AF_INET};
    memset(b, 0xAA, sizeof b);
    preauth_key((struct sockaddr *)&short4, 4, b);
    ok(memcmp(b, zero, sizeof b) == 0, "a truncated address is not read past its length");
}

static void test_per_peer(void)
{
    struct preauth_pool p;
    struct preauth_entry e[8];
    uint8_t ka[PREAUTH_KEY_LEN], kb[PREAUTH_KEY_LEN];
    enum preauth_reason why;
    memset(e, 0, sizeof e);
    key4("10.0.0.1", ka);
    key4("10.0.0.2", kb);

    is_int(preauth_init(&p, 4, 2), 0, "init: 4 in all, 2 per peer");
    ok(preauth_victim(&p, ka, 0, &why) == NULL && why == PREAUTH_ROOM, "empty: room");
    is_int(preauth_add(&p, &e[0], ka, 100), 0, "A #1");
    is_int(preauth_add(&p, &e[1], ka, 200), 0, "A #2");
    is_int(preauth_peer_count(&p, ka), 2, "A holds 2");
    ok(preauth_victim(&p, kb, 300, &why) == NULL, "B still has room");
    ok(preauth_victim(&p, ka, 300, &why) == &e[0] && why == PREAUTH_PEER_FULL,
       "A at its share: A's least recently active goes");
    is_int(preauth_add(&p, &e[2], ka, 300), -ENOSPC, "adding past the share is refused");
    preauth_touch(&p, &e[0], PREAUTH_ACTIVE, 400);
    ok(preauth_victim(&p, ka, 500, &why) == &e[1], "activity moves A #1 to the back");
    preauth_remove(&p, &e[1]);
    ok(!e[1].in_pool && preauth_peer_count(&p, ka) == 1 && p.n == 1, "removed");
    preauth_remove(&p, &e[1]);
    is_int(p.n, 1, "removing twice is a no-op");
    preauth_touch(&p, &e[1], PREAUTH_ACTIVE, 600);
    ok(!e[1].in_pool && p.cls[PREAUTH_ACTIVE].head == &e[0] && p.cls[PREAUTH_ACTIVE].tail == &e[0],
       "touching an entry outside the pool is a no-op");
    preauth_remove(&p, &e[0]);
    ok(p.n == 0 && p.n_peers == 0 && preauth_peer_count(&p, ka) == 0, "empty again, peer gone");
    preauth_free(&p);

    is_int(preauth_init(&p, 3, 0), 0, "per_peer 0");
    is_int(p.per_peer, 3, "per_peer 0 means the whole pool");
    preauth_free(&p);
    is_int(preauth_init(&p, 0, 0), -EINVAL, "an empty pool is refused");
}

static void test_pool_order(void)
{
    struct preauth_pool p;
    struct preauth_entry e[8];
    uint8_t k[8][PREAUTH_KEY_LEN], knew[PREAUTH_KEY_LEN];
    enum preauth_reason why;
    memset(e, 0, sizeof e);
    for (int i = 0; i < 8; i++) {
        char a[32];
        snprintf(a, sizeof a, "10.1.0.%d", i + 1);
        key4(a, k[i]);
    }
    key4("10.2.0.1", knew);
    const uint64_t g = PREAUTH_SILENT_GRACE_MS;

    is_int(preauth_init(&p, 4, 4), 0, "init: 4, one per peer here");
    preauth_add(&p, &e[0], k[0], 1000);      /* will send part of a request */
    preauth_add(&p, &e[1], k[1], 1100);      /* silent */
    preauth_add(&p, &e[2], k[2], 1200);      /* will be answered */
    preauth_add(&p, &e[3], k[3], 1300);      /* silent */
    preauth_touch(&p, &e[0], PREAUTH_ACTIVE, 1400);
    preauth_touch(&p, &e[2], PREAUTH_ACTIVE, 1500);
    preauth_touch(&p, &e[2], PREAUTH_ANSWERED, 1600);
    ok(preauth_victim(&p, knew, 1700, &why) == &e[2] && why == PREAUTH_POOL_FULL,
       "full: an answered connection goes first");
    preauth_remove(&p, &e[2]);
    preauth_add(&p, &e[4], k[4], 1700);      /* silent, newest */

    /* nothing answered, no silent one past the grace time: least recent
     * activity among silent and active */
    ok(preauth_victim(&p, knew, 1800, &why) == &e[1], "then the least recently active (silent #1)");
    preauth_touch(&p, &e[1], PREAUTH_ACTIVE, 1900);
    ok(preauth_victim(&p, knew, 1950, &why) == &e[3], "a silent one older than an active one");
    preauth_touch(&p, &e[3], PREAUTH_ACTIVE, 1960);
    ok(preauth_victim(&p, knew, 1970, &why) == &e[0], "an active one older than a silent one");

    /* a silent connection past the grace time goes before any partial request */
    preauth_touch(&p, &e[0], PREAUTH_ACTIVE, 1700 + g);
    preauth_touch(&p, &e[1], PREAUTH_ACTIVE, 1700 + g);
    preauth_touch(&p, &e[3], PREAUTH_ACTIVE, 1700 + g);
    ok(preauth_victim(&p, knew, 1700 + g - 1, &why) == &e[4],
       "silent, the oldest even within the grace time");
    preauth_touch(&p, &e[0], PREAUTH_ACTIVE, 1700 + g + 1);
    ok(preauth_victim(&p, knew, 1700 + g, &why) == &e[4],
       "silent for the grace time: goes before requests that made progress since");
    preauth_remove(&p, &e[4]);
    preauth_add(&p, &e[5], k[5], 1800 + g); /* silent, the freshest */
    ok(preauth_victim(&p, knew, 1800 + g, &why) == &e[1],
       "a fresh silent one is kept over an older partial request");
    ok(preauth_victim(&p, k[1], 1800 + g, &why) == &e[1] && why == PREAUTH_POOL_FULL,
       "a peer below its share still meets a full pool");
    preauth_free(&p);
}

/* The peer table under random churn, against a plain count per peer: the
 * backward-shift deletion must keep every peer findable. */
static void test_churn(void)
{
    enum { MAX = 64, SLOTS = 96, PEERS = 40, OPS = 200000 };
    struct preauth_pool p;
    static struct preauth_entry e[SLOTS];
    static uint8_t keys[PEERS][PREAUTH_KEY_LEN];
    int owner[SLOTS];
    unsigned model[PEERS] = {0};
    unsigned seed = 12345;
    enum preauth_reason why;
    size_t bad = 0, evicted_peer = 0, evicted_pool = 0;

    memset(e, 0, sizeof e);
    for (int i = 0; i < PEERS; i++) {
        char a[48];
        snprintf(a, sizeof a, "2001:db8:%x:%x::1", i * 7919 & 0xffff, i);
        key6(a, keys[i]);
    }
    for (int i = 0; i < SLOTS; i++)
        owner[i] = -1;
    if (preauth_init(&p, MAX, 5) < 0) {
        ok(0, "init");
        return;
    }
    for (uint64_t t = 1; t <= OPS; t++) {
        int slot = (int)(rand_r(&seed) % SLOTS);
        int op = (int)(rand_r(&seed) % 4);
        if (owner[slot] >= 0 && op == 0) {
            model[owner[slot]]--;
            preauth_remove(&p, &e[slot]);
            owner[slot] = -1;
        } else if (owner[slot] >= 0) {
            preauth_touch(&p, &e[slot], (enum preauth_class)(op % PREAUTH_NCLASS), t);
        } else {
            int peer = (int)(rand_r(&seed) % PEERS);
            struct preauth_entry *v = preauth_victim(&p, keys[peer], t, &why);
            if (v) {
                int vi = (int)(v - e);
                evicted_peer += why == PREAUTH_PEER_FULL;
                evicted_pool += why == PREAUTH_POOL_FULL;
                bad += why == PREAUTH_PEER_FULL && owner[vi] != peer;
                model[owner[vi]]--;
                preauth_remove(&p, v);
                owner[vi] = -1;
            }
            bad += preauth_add(&p, &e[slot], keys[peer], t) != 0;
            owner[slot] = peer;
            model[peer]++;
        }
        if (t % 1000 == 0) {
            unsigned n = 0, peers = 0;
            for (int i = 0; i < PEERS; i++) {
                bad += preauth_peer_count(&p, keys[i]) != model[i];
                bad += model[i] > 5;
                n += model[i];
                peers += model[i] > 0;
            }
            bad += n != p.n || peers != p.n_peers;
        }
    }
    is_int(bad, 0, "%d random operations agree with the model", OPS);
    ok(evicted_peer > 0 && evicted_pool > 0, "both limits were reached (%zu per peer, %zu pool)",
       evicted_peer, evicted_pool);
    preauth_free(&p);
}

int main(void)
{
    test_keys();
    test_per_peer();
    test_pool_order();
    test_churn();
    return tap_done();
}
