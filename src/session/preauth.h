/* The pre-auth pool: connections the supervisor has accepted but not (yet)
 * admitted as turns. Runs in the supervisor.
 *
 * Anyone who can reach the port can open connections, and an idle one costs
 * nothing to hold open; refusing new connections once a limit is reached
 * would hand the front door to whoever opens them fastest. So the pool is
 * bounded, and a new connection always gets in: when the pool is full, the
 * least valuable connection in it is closed instead; when the new
 * connection's peer already holds its share, that peer's least recently
 * active connection is closed. One peer can therefore only ever push out its
 * own connections, and a real client's connection, which sends its request
 * at once, is always the freshest and the last to go.
 *
 * Value, lowest first (the victim when the pool is full):
 *   1. answered: the response is written, only the client's close is awaited;
 *   2. silent for PREAUTH_SILENT_GRACE_MS or more: not a byte since accept();
 *   3. everything else (silent for less than that, or part of a request
 *      received), least recent activity first.
 * A connection that sent part of a request is worth more than one that has
 * been silent, but not more than a newer one: a slowloris that trickles
 * bytes stays in class 3 and is still pushed out by fresher connections, and
 * every pre-auth connection ends HTTP_REQUEST_TIMEOUT_MS after its accept
 * anyway.
 *
 * A peer is an IPv4 address, or an IPv6 /64 (the smallest prefix a site is
 * normally given: counting single IPv6 addresses would let one host use 2^64
 * of them). IPv4-mapped IPv6 addresses count as IPv4.
 *
 * Turns never count here: a connection leaves the pool when it is admitted.
 * Nothing here knows about sessions; entries are embedded in them. Not
 * thread-safe (the supervisor is one thread). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define PREAUTH_KEY_LEN 16
#define PREAUTH_KEY_STR 56 /* an IPv6 text address and "/64", or a dotted quad; a NUL */

enum preauth_class {
    PREAUTH_SILENT,   /* nothing received yet */
    PREAUTH_ACTIVE,   /* part of a request received, or a response still being written */
    PREAUTH_ANSWERED, /* response written; waiting for the client to close */
    PREAUTH_NCLASS,
};

struct preauth_entry {
    struct preauth_entry *prev, *next;           /* class list, least recent first; borrowed */
    struct preauth_entry *peer_prev, *peer_next; /* the peer's list, least recent first; borrowed */
    uint8_t key[PREAUTH_KEY_LEN];                /* the peer */
    uint64_t active_ms;                          /* accept, last bytes received, or answered */
    enum preauth_class cls;
    bool in_pool;
};

struct preauth_list {
    struct preauth_entry *head, *tail; /* borrowed */
};

struct preauth_peer {
    uint8_t key[PREAUTH_KEY_LEN];
    unsigned count;                    /* entries of this peer in the pool; 0 = free slot */
    struct preauth_entry *head, *tail; /* its entries, least recent activity first; borrowed */
};

struct preauth_pool {
    unsigned max;                      /* connections in the pool at most */
    unsigned per_peer;                 /* of them from one peer at most */
    unsigned n;                        /* connections in the pool */
    unsigned n_peers;                  /* distinct peers in the pool */
    struct preauth_list cls[PREAUTH_NCLASS];
    struct preauth_peer *peers;        /* owned: open addressing, nslots slots */
    size_t nslots;                     /* a power of two, at least 2 * max */
    uint64_t seed[2];                  /* hash key, random per process */
};

/* max >= 1; per_peer 0 or > max means max. 0 or -ENOMEM/-EINVAL. */
int preauth_init(struct preauth_pool *p, unsigned max, unsigned per_peer);
void preauth_free(struct preauth_pool *p);

/* The peer key of a socket address (AF_INET, AF_INET6; anything else is one
 * peer of its own, all zeros). */
void preauth_key(const struct sockaddr *sa, socklen_t len, uint8_t key[PREAUTH_KEY_LEN]);
/* "192.0.2.1" or "2001:db8:1:2::/64". */
void preauth_key_str(const uint8_t key[PREAUTH_KEY_LEN], char out[PREAUTH_KEY_STR]);

/* Room for a new connection from key: the entry to close first, or NULL
 * when there is room. *why says which limit (per-peer or the pool). Closing
 * the one returned (and preauth_remove()) always makes room. */
enum preauth_reason { PREAUTH_ROOM, PREAUTH_PEER_FULL, PREAUTH_POOL_FULL };
struct preauth_entry *preauth_victim(struct preauth_pool *p, const uint8_t key[PREAUTH_KEY_LEN],
                                     uint64_t now_ms, enum preauth_reason *why);

/* Add e (not in the pool) for a connection from key, silent, accepted at
 * now_ms. Make room first (preauth_victim); 0, or -ENOSPC if there is none. */
int preauth_add(struct preauth_pool *p, struct preauth_entry *e,
                const uint8_t key[PREAUTH_KEY_LEN], uint64_t now_ms);
/* e showed activity at now_ms and is now of class cls. No-op if not in the pool. */
void preauth_touch(struct preauth_pool *p, struct preauth_entry *e, enum preauth_class cls,
                   uint64_t now_ms);
/* Take e out (admitted, closed). No-op if not in the pool. */
void preauth_remove(struct preauth_pool *p, struct preauth_entry *e);
/* Entries of this peer in the pool. */
unsigned preauth_peer_count(const struct preauth_pool *p, const uint8_t key[PREAUTH_KEY_LEN]);
