/* The sandbox's filesystem: a read-only tmpfs root holding read-only binds of
 * the interpreter's files, a private /workspace, /tmp and /dev/shm sharing one
 * size-limited tmpfs, a minimal /dev, a fresh /proc and a read-only /tools
 * whose writable side is reachable only through an fd.
 *
 * Like bubblewrap's SetupOp list, the host-dependent part is data: the fork
 * server looks at the host once (mounts_prepare) and every child replays the
 * same list of operations (mounts_setup) without stat'ing or reading host
 * directories per turn. */
#pragma once
#include <stddef.h>

#include "config/config.h"

struct mount_plan; /* opaque: the operation list */

/* In the fork server, once: inspect the host (merged /usr, which /etc files
 * exist, site dirs, mount flags that a bind must keep) and build the list.
 * 0, or -errno with a reason in err (a bad site dir or tools dir stops
 * forkboxd at start). */
int mounts_prepare(const struct config *cfg, struct mount_plan **out, char *err, size_t errlen);
void mounts_free(struct mount_plan *mp);
/* Number of operations (for logs). */
size_t mounts_len(const struct mount_plan *mp);

/* In the child: in its own user and mount namespace with uid/gid 0 there.
 * Builds the new root and pivots into it; cwd is "/" afterwards. On success
 * *tools_fd is an O_DIRECTORY|O_CLOEXEC fd on the writable side of the tools
 * dir (owned by the caller). 0 or -errno with what failed in what.
 * Allocation-free. */
int mounts_setup(const struct config *cfg, const struct mount_plan *mp, int *tools_fd,
                 char *what, size_t whatlen);
