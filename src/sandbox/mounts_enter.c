/* Runs in the sandbox child (its step 3): mounts_enter, into the root the
 * fork server built once (mounts.c says what the plan holds and why).
 * No allocation, no stdio beyond formatting into err. */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.h"
#include "core/steptime.h"
#include "core/util.h"
#include "sandbox/mounts.h"
#include "sandbox/mounts_int.h"

/* A tmpfs on path; options are "mode=...,size=...". */
static int tmpfs_on(const char *path, uint64_t size, uint64_t inodes)
{
    char opts[96];
    int n = snprintf(opts, sizeof opts, "mode=0755");
    if (size)
        n += snprintf(opts + n, sizeof opts - (size_t)n, ",size=%llu", (unsigned long long)size);
    if (inodes)
        snprintf(opts + n, sizeof opts - (size_t)n, ",nr_inodes=%llu",
                 (unsigned long long)inodes);
    return mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, opts);
}

/* Where the scratch tmpfs is mounted: its own shm directory is bound over
 * it last, so its root stays under that bind, out of every path's reach
 * (mounts_enter, step 2). */
#define SCRATCH_AT "/dev/shm"

/* A host dir the root holds under /tmp (a site dir; stream mode's workdir
 * and tools dir), which the scratch's /tmp is about to cover: bind it again
 * inside the scratch's tmp (hence the recursive binds below). A bind keeps
 * its source mount's flags (and the workdir's is its FUSE mount). */
static int rebind_in_scratch(const char *p, char *err, size_t errlen)
{
    char in_scratch[OP_PATH_MAX + sizeof SCRATCH_AT];
    if (!mounts_path_under(p, "/tmp"))
        return 0;
    snprintf(in_scratch, sizeof in_scratch, SCRATCH_AT "%s", p);
    if (mounts_mkdir_p(AT_FDCWD, in_scratch, 0755) < 0 ||
        mount(p, in_scratch, NULL, MS_BIND, NULL) < 0)
        return err_errno(err, errlen, "bind again under /tmp: %s", p);
    return 0;
}

/* The scratch tmpfs, mounted on SCRATCH_AT: its three directories bound at
 * /workspace (unless stream mode's workdir is there), /tmp and, last, over
 * the scratch's own root, /dev/shm. */
static int scratch_binds(const struct config *cfg, char *err, size_t errlen)
{
    static const struct {
        const char *src, *dst;
        mode_t mode;
    } scratch[] = {
        {SCRATCH_AT "/workspace", "/workspace", 0755},
        {SCRATCH_AT "/tmp", "/tmp", 01777},
        {SCRATCH_AT "/shm", "/dev/shm", 01777}, /* last: it covers SCRATCH_AT */
    };
    for (size_t i = 0; i < sizeof scratch / sizeof *scratch; i++)
        /* chmod after mkdir: the umask must not eat the sticky bit. */
        if (mkdir(scratch[i].src, 0700) < 0 || chmod(scratch[i].src, scratch[i].mode) < 0)
            return err_errno(err, errlen, "mkdir %s", scratch[i].src);
    /* A site dir under /tmp is in the root at /tmp/..., which the scratch is
     * about to cover: bind it again inside the scratch's tmp (hence the
     * recursive binds below). */
    int r = 0;
    for (unsigned i = 0; i < cfg->n_site_dirs && r == 0; i++)
        r = rebind_in_scratch(cfg->site_dirs[i], err, errlen);
    if (r == 0 && cfg->workdir[0])
        r = rebind_in_scratch(cfg->workdir, err, errlen);
    if (r == 0 && cfg->workdir[0])
        r = rebind_in_scratch(cfg->tools_dir, err, errlen);
    if (r < 0)
        return r;
    bool work_there = strcmp(cfg->workdir, scratch[0].dst) == 0;
    for (size_t i = work_there ? 1 : 0; i < sizeof scratch / sizeof *scratch; i++)
        if (mount(scratch[i].src, scratch[i].dst, NULL, MS_BIND | MS_REC, NULL) < 0)
            return err_errno(err, errlen, "bind %s", scratch[i].dst);
    return 0;
}

/* Where a sandbox's proc is mounted first: over the scratch's bind at
 * /workspace, for a moment (see mounts_enter, step 4). */
#define PROC_TMP "/workspace"

/* 4b. Cover the host-wide files of our fresh proc, mounted at PROC_TMP, with
 * the replacements the fork server made (proc_entries): a bind each, of a
 * file of the read-only root, so read-only too. */
static int proc_covers(const struct mount_plan *mp, char *err, size_t errlen)
{
    for (size_t i = 0; i < mp->n_covers; i++) {
        const struct proc_cover *c = &mp->covers[i];
        char to[sizeof PROC_TMP + sizeof c->target];
        snprintf(to, sizeof to, PROC_TMP "/%s", c->target);
        if (mount(c->source, to, NULL, MS_BIND, NULL) < 0)
            return err_errno(err, errlen, "cover in /proc: %s", c->target);
    }
    return 0;
}

int mounts_enter(const struct config *cfg, const struct mount_plan *mp, int *tools_fd,
                 char *err, size_t errlen)
{
    *tools_fd = -1;

    /* 1. Our namespace is a copy of the template's (mounts_template.c):
     * its root is the prepared root, and nothing of the host is in it. Its
     * mounts are private already (the template was made so); cheap
     * insurance before mounting anything. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        return err_errno(err, errlen, "make-rprivate %s", "/");
    if (chdir("/") < 0)
        return err_errno(err, errlen, "chdir %s", "/");
    steptime_mark(ST_C_ROOT);

    /* 2. One tmpfs for everything user code may write, so tmpfs_size bounds
     * the sum. The root is read-only, without a spare directory to mount it
     * on for a moment: it goes on /dev/shm and stays there, under the bind of
     * its own shm directory (both over the template's hidden proc). Nothing
     * is unmounted: each umount waits for an RCU grace period
     * (synchronize_rcu_expedited in namespace_unlock), 20-50 us alone and
     * ~0.5 ms with 16 sandboxes starting at once, measured. */
    if (tmpfs_on(SCRATCH_AT, cfg->tmpfs_size, 0) < 0)
        return err_errno(err, errlen, "mount tmpfs %s", "scratch");
    int r = scratch_binds(cfg, err, errlen);
    if (r < 0)
        return r;
    steptime_mark(ST_C_SCRATCH);

    /* 3. /tools: read-only for user code; the runtime extracts the tools
     * archive through the fd, then closes it: the writable mount stays
     * under a read-only bind of itself, out of every path's reach. In stream
     * mode the tools are the host's, bound read-only in the root already:
     * the fd is that read-only dir (the empty tools archive extracts nothing
     * into it). */
    int fd;
    if (cfg->workdir[0]) {
        fd = open(cfg->tools_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
            return err_errno(err, errlen, "open %s", cfg->tools_dir);
        goto proc;
    }
    uint64_t tsize = cfg->max_unpacked ? cfg->max_unpacked + 4 * 1024 * 1024 : 0;
    uint64_t tinodes = cfg->max_members ? cfg->max_members + 64 : 0;
    if (tmpfs_on(cfg->tools_dir, tsize, tinodes) < 0)
        return err_errno(err, errlen, "mount tmpfs %s", cfg->tools_dir);
    fd = open(cfg->tools_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return err_errno(err, errlen, "open %s", cfg->tools_dir);
    if (mount(cfg->tools_dir, cfg->tools_dir, NULL, MS_BIND, NULL) < 0 ||
        mount(NULL, cfg->tools_dir, NULL,
              MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return err_errno(err, errlen, "bind read-only %s", cfg->tools_dir);
    }
    steptime_mark(ST_C_TOOLS);

    /* 4. Our pid namespace's proc (the template's hidden proc, in our
     * namespace, makes this permitted: see mounts_template.c). No
     * hidepid needed: only our own processes are in this pid namespace.
     * Mounted at PROC_TMP first: the replacements of its host-wide files
     * are the root's own /proc directory, which the proc mount will cover.
     * 4b binds them by path, then the proc mount moves to /proc with its
     * covers (cheaper than a path through an fd for every cover). */
proc:
    if (mount("proc", PROC_TMP, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return err_errno(err, errlen, "mount %s", "/proc");
    }
    steptime_mark(ST_C_PROC);
    r = proc_covers(mp, err, errlen);
    if (r == 0 && mount(PROC_TMP, "/proc", NULL, MS_MOVE, NULL) < 0)
        r = err_errno(err, errlen, "move %s", "/proc");
    if (r < 0) {
        close(fd);
        return r;
    }
    steptime_mark(ST_C_COVERS);

    *tools_fd = fd;
    return 0;
}
