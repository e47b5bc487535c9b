/* Runs in the fork server (the plan, the root) and the sandbox child (entering
 * it): the sandbox's filesystem, a read-only tmpfs root holding read-only binds of
 * the interpreter's files, a private /workspace, /tmp and /dev/shm sharing one
 * size-limited tmpfs, a minimal /dev, a fresh /proc and a read-only /tools
 * whose writable side is reachable only through an fd.
 *
 * Like bubblewrap's SetupOp list, the host-dependent part is data: the fork
 * server looks at the host once (mounts_prepare) and builds the root from
 * that list once (mounts_build), in a namespace a child's is a copy of; a
 * child only mounts what is its own (mounts_enter), with no lookups of host
 * directories. */
#pragma once
#include <stddef.h>
#include <stdint.h>

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

/* Stream mode, before mounts_prepare: make the host's workdir if it is
 * missing (and its parents), 0755, ours (root's): the sandbox writes it as
 * its owner (hostfs.h). An existing one is left as it is. 0 or -errno with
 * a reason. */
int mounts_make_workdir(const char *path, char *err, size_t errlen);
/* Stream mode, before mounts_build: the workspace's mount (takes tree, the
 * detached FUSE mount of hostfs_start), which mounts_build attaches at the
 * workdir's path. */
void mounts_set_workspace(struct mount_plan *mp, int tree);

/* In the fork server, once, before the first sandbox: enter a mount
 * namespace of our own and build the sandbox root in it from the plan (see
 * mounts.c), read-only, then the template namespace every sandbox's is a
 * copy of (mounts_template.c); we stay in ours. The workspace's mount (mounts_set_workspace) is attached and its fd
 * closed. 0, or -errno with a reason in err. */
int mounts_build(const struct config *cfg, struct mount_plan *mp, char *err, size_t errlen);

/* In the fork server, around each sandbox's clone (or the fork path's
 * fork): enter the template mount namespace mounts_build made, which the
 * clone's CLONE_NEWNS copies, and come back to ours (and our cwd) as soon as
 * the child exists. enter: 0, or -errno with a reason; leave cannot fail
 * (it aborts rather than go on in the template). */
int mounts_clone_enter(const struct mount_plan *mp, char *err, size_t errlen);
void mounts_clone_leave(const struct mount_plan *mp);

/* In the child (its step 3), in its own user and mount namespace (a copy
 * of the template mounts_build made from mp, rooted at the root) with
 * uid/gid 0 there: adds to the root what is the turn's own: the
 * scratch tmpfs, the tools tmpfs, /proc with its host-wide files covered;
 * cwd is "/" afterwards. On success *tools_fd is an O_DIRECTORY|O_CLOEXEC fd
 * on the writable side of the tools dir (the caller owns it). 0 or -errno
 * with what failed in err. Allocation-free. */
int mounts_enter(const struct config *cfg, const struct mount_plan *mp, int *tools_fd,
                 char *err, size_t errlen);
