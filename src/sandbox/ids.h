/* Runs in the fork server: host ids for sandboxes, one uid, used as the gid
 * too, per live sandbox, from the range forkboxd owns (--id-range).
 *
 * The kernel counts many resources per user: per host user (user_struct:
 * pipe buffers, fds in flight over unix sockets, epoll watches) and per
 * (user namespace, uid), charged up the chain of user namespaces to the
 * namespace owner's uid in the parent (ucounts: processes, pending signals,
 * message queue bytes, inotify instances and watches, namespaces). A sandbox
 * that maps to a host id no other process uses, in a user namespace that id
 * owns, is charged alone: it can exhaust its own quotas, never another
 * sandbox's or host root's.
 *
 * An id is taken when a sandbox is cloned (pooled ones included) and given
 * back only once that sandbox has been reaped. Ids are handed out round robin
 * from a random starting point, so a just-freed id (whose last charges, e.g.
 * of a namespace the kernel frees asynchronously, may still be draining) is
 * reused as late as possible. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct sbx_ids; /* opaque: the range and which ids are live */

/* A free list for [first, first + count). 0 or -ENOMEM/-EINVAL. */
int ids_new(uint32_t first, uint32_t count, struct sbx_ids **out);
void ids_free(struct sbx_ids *ids);
/* Take the next free id after the last one taken. 0 with *id set, or
 * -EAGAIN when every id of the range is live. */
int ids_take(struct sbx_ids *ids, uint32_t *id);
/* Give back an id taken before (its sandbox has been reaped). */
void ids_put(struct sbx_ids *ids, uint32_t id);
/* The id the next ids_take() returns, while none is live (at start). */
uint32_t ids_next(const struct sbx_ids *ids);
/* How many ids are taken now. */
size_t ids_live(const struct sbx_ids *ids);

/* At start, once: refuse a range that the host's user database already uses
 * (etc_dir/passwd, etc_dir/group) or hands out as subordinate ids
 * (etc_dir/subuid, etc_dir/subgid): a process of such a user could share the
 * sandboxes' quotas and, running as a namespace's owner, would hold every
 * capability over that sandbox's namespaces. Only these local files are read
 * (users from a directory service are the operator's to keep out). Missing
 * files are fine. 0, or -EEXIST with the file, line and id in err (-errno
 * for a file that exists but cannot be read). */
int ids_check_host(const char *etc_dir, uint32_t first, uint32_t count, char *err,
                   size_t errlen);
