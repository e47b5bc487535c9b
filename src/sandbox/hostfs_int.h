/* Internal to the hostfs helper: its start (hostfs.c) and its FUSE operations
 * (hostfs_ops.c). Nothing else includes this. */
#pragma once
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <stdint.h>
#include <sys/types.h>

/* Charges are counted in these, as tmpfs counts pages. */
#define HOSTFS_BLOCK 4096
/* A write request carries at most this much (the kernel's default is 128 KiB:
 * fewer round trips for large writes; within libfuse's 1 MiB buffer). */
#define HOSTFS_MAX_WRITE (1024 * 1024)

/* One inode of the workspace that the kernel holds a reference to (a
 * lookup not yet forgotten). Its FUSE node id is its address; the root's is
 * FUSE_ROOT_ID. */
struct hnode {
    struct hnode *next; /* the hash chain */
    int fd;             /* owned: O_PATH | O_NOFOLLOW on the inode, never on a name */
    dev_t dev;
    ino_t ino;
    mode_t type;        /* S_IFMT bits, as first seen */
    uint64_t nlookup;   /* the kernel's references */
};

struct hostfs_state {
    struct hnode root;      /* the workspace directory itself */
    uint64_t mnt_id;        /* the mount it is on (statx), which every node is on */
    struct hnode **table;   /* owned: every other hnode, by (dev, ino) */
    size_t nbuckets, count;
    uid_t owner;            /* the workspace's owner and group on disk: what the */
    gid_t group;            /* block's files get, and what the sandbox sees as its own */
    uid_t id;               /* the sandbox's host id (its uid and gid) */
    int64_t cap;            /* --workspace-max */
    int64_t used;           /* bytes charged since the start (below 0 once the block
                               deleted more than it wrote) */
};

extern const struct fuse_lowlevel_ops hostfs_ops;
