/* Internal to the mount plan's two halves: the fork server builds the plan
 * and the root (mounts.c), a sandbox child enters them (mounts_enter.c).
 * Nothing outside src/sandbox/mounts*.c includes this. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define OP_PATH_MAX 320
/* At least the entries of mounts.c's proc_entries (checked there). */
#define MOUNTS_COVERS_MAX 32
/* Where the root goes: over /tmp, in the fork server's own namespace only.
 * The fork server needs no /tmp once the interpreter has started. */
#define ROOT_AT "/tmp"

enum mop_kind {
    MOP_DIR,      /* mkdir dst (mode); an existing dir is fine */
    MOP_FILE,     /* create dst with data (mode) */
    MOP_SYMLINK,  /* symlink src -> dst */
    MOP_BIND_RO,  /* bind host src at dst, read-only, nosuid, nodev */
    MOP_BIND_DEV, /* bind a host device node at dst as is */
    MOP_BIND_RW,  /* stream mode's workspace at dst: the mount its FUSE server made
                     of host dir src (the plan's work_tree, nosuid, nodev; hostfs.h) */
};

struct mount_op {
    enum mop_kind kind;
    bool is_dir;           /* binds: the mountpoint is a directory (else a file) */
    mode_t mode;           /* DIR, FILE */
    const char *data;      /* FILE: contents (static, or owned below) */
    size_t len;            /* FILE: bytes of data */
    char *owned;           /* FILE: contents made by mounts_prepare, owned; else NULL */
    char src[OP_PATH_MAX]; /* BIND: host path; SYMLINK: link target */
    char dst[OP_PATH_MAX]; /* path in the new root */
};

/* One file or directory of a sandbox's fresh /proc covered by a bind of a
 * file or directory of the root's PROC_SRC (see proc_entries). */
struct proc_cover {
    char target[32]; /* relative to the proc mount: "meminfo", "sys/fs/file-nr" */
    char source[32]; /* its replacement: "/proc/meminfo", "/proc/.empty" */
};

struct mount_plan {
    struct mount_op *ops; /* owned */
    size_t n, cap;
    struct proc_cover covers[MOUNTS_COVERS_MAX]; /* in order; the child binds them */
    size_t n_covers;
    int work_tree;   /* owned: stream mode's workspace mount (mounts_set_workspace),
                        detached until mounts_build attaches it; -1 */
    int tmpl_ns;     /* owned: the template mount namespace (mounts_template.c); -1 */
    int home_ns;     /* owned: the fork server's own, built by mounts_build; -1 */
    int home_cwd;    /* owned: the fork server's cwd there (O_PATH); -1 */
};

/* In the fork server, at the end of mounts_build: make the template
 * namespace from ours and come back (mounts_template.c). 0, or -errno with
 * a reason in err. */
int mounts_template(struct mount_plan *mp, char *err, size_t errlen);

/* Whether path is dir or below it (both absolute, normalised). */
bool mounts_path_under(const char *path, const char *dir);
/* mkdir -p path (absolute, or relative to dfd), parents 0755; an existing
 * directory is fine. 0, or -1 with errno. */
int mounts_mkdir_p(int dfd, const char *path, mode_t mode);
