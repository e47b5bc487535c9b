/* Runs in the fork server (and test_sandbox, which spawns as it does): the
 * network namespaces sandboxes are cloned into, made ahead of the spawns
 * that take them (netns.c says why and what that changes).
 *
 * A spawn enters one (netns_enter: a spare, or one made on the spot), clones
 * without CLONE_NEWNET so that the sandbox lives in it, and goes home
 * (netns_leave) before anything else. Each namespace serves one sandbox and
 * goes with it: none is ever handed out twice. */
#pragma once
#include <stddef.h>

struct netns_spares;

/* Up to max (>= 1) spares, the first made here, so that a host where none
 * can be made stops at start. 0 or -errno with the reason in err. */
int netns_spares_new(unsigned max, struct netns_spares **out, char *err, size_t errlen);
void netns_spares_free(struct netns_spares *s);
/* Spares ready, and how many netns_refill keeps. */
size_t netns_spares_ready(const struct netns_spares *s);
size_t netns_spares_max(const struct netns_spares *s);
/* Make one spare if there are fewer than max. 0 or -errno with err. */
int netns_refill(struct netns_spares *s, char *err, size_t errlen);
/* Move the calling thread into a fresh namespace with its loopback up: the
 * oldest spare, else one made now. 0 or -errno with err (then still home). */
int netns_enter(struct netns_spares *s, char *err, size_t errlen);
/* Back to the namespace netns_spares_new was called in. Cannot fail (it
 * aborts if the kernel says otherwise: nothing may be made in a sandbox's
 * namespace by mistake). */
void netns_leave(struct netns_spares *s);
