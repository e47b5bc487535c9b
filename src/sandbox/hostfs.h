/* Runs in the fork server (hostfs_start) and in the hostfs helper it forks:
 * stream mode's workspace, the host's directory served to the one sandbox
 * of `forkbox sandbox` through FUSE (hostfs.c says why), as the directory's
 * owner, within --workspace-max. */
#pragma once
#include <stdint.h>
#include <sys/types.h>

#include "config/config.h"

struct hostfs {
    pid_t pid; /* the helper; 0 if none */
    int sock;  /* owned: our end of its socket; -1 */
};

/* Fork the helper for cfg->workdir, serving it to the sandbox whose host id
 * is id, and wait for the mount it makes: *mount_fd (the caller owns it), a
 * detached FUSE mount, nosuid and nodev, for mounts_build to attach. The
 * helper leaves when we do. 0, or -errno with a reason (no /dev/fuse, the
 * workdir not a directory). */
int hostfs_start(const struct config *cfg, uint32_t id, struct hostfs *h, int *mount_fd,
                 char *err, size_t errlen);
