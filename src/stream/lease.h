/* Runs in `forkbox sandbox`: a lease on host ids, so that stream sandboxes
 * running at the same time never share a uid.
 *
 * forkboxd hands out ids from its range inside one fork server, which knows
 * every live sandbox. Each `forkbox sandbox` has a fork server of its own,
 * so the processes agree through the filesystem instead: an aligned pair of
 * ids [first + 2k, first + 2k + 2) belongs to whoever holds flock() on
 * IDS_LEASE_DIR/<first + 2k>. The lock dies with the process (kill -9
 * included), so a lease never leaks; the file is unlinked on release. A
 * pair, because config.c wants twice as many ids as live sandboxes. */
#ifndef FORKBOX_STREAM_LEASE_H
#define FORKBOX_STREAM_LEASE_H

#include <stddef.h>
#include <stdint.h>

#define IDS_LEASE_DIR "/run/forkbox/sandbox-ids"

/* Default first id of `forkbox sandbox`: the 65536 ids after forkboxd's
 * default range, so that neither shares an id with the other unless an
 * --id-range says so. */
#define STREAM_ID_FIRST 2013331456u

struct id_lease {
    int fd;         /* owned: the locked file, -1 when none */
    uint32_t first; /* the pair's first id */
    char path[64];  /* the locked file */
};

/* Take a free pair from [first, first + count). 0, or -errno with a reason
 * in err (-EBUSY: every pair is leased). */
int id_lease_take(uint32_t first, uint32_t count, struct id_lease *lease, char *err,
                  size_t errlen);
/* Unlink the file while still holding the lock, then drop it. */
void id_lease_release(struct id_lease *lease);

#endif
