/* Runs in the fork server (hostfs_start) and in the hostfs helper it forks
 * in stream mode (the rest): the FUSE server behind the workspace of
 * `forkbox sandbox`, the host's own directory (ADK_CODE_MODE_WORKDIR).
 *
 * Why a server between the block and the host's directory, rather than a
 * bind mount of it: a block's files land on a host inode, where the host
 * (not nosuid, not the sandbox's namespaces) is the reader. What must never
 * get there - a set-uid or set-gid bit, a FIFO, a socket, an ACL, a file
 * capability, a 0777 mode on the workspace itself - and the size the block
 * may add (--workspace-max) are decided per call, on arguments that the
 * kernel copied out of the sandbox's memory, by one process that holds
 * the directory. A bind mount leaves that to what seccomp can see of a
 * call (a mode, not an xattr's name nor a bind()'s path) and to sweeps
 * after the fact, and no kernel mechanism caps what a directory may take
 * on ext4, xfs and btrfs without an administrator turning quotas on. Costs
 * and other candidates: docs/embedding.md "The workspace is served, not bound".
 *
 * Why this process: the fork server is single-threaded and clones the
 * sandbox; its helper is forked before the interpreter imports anything
 * (as the cgroup placer), opens /dev/fuse only after the fork (no sandbox
 * clone could inherit the device), makes the mount with the new mount API
 * and hands the fork server only the detached mount, which mounts_build
 * attaches at the workdir's path in the sandbox root. Then it serves
 * (hostfs_ops.c), as the workspace's owner and group, until the fork
 * server goes (it dies with it; the mount then fails with
 * ENOTCONN). It is the workdir's owner from then on (uid and gid; for a
 * root-owned workdir, root with root's file capabilities alone), with
 * no_new_privs. */
#include "sandbox/hostfs.h"
#include "sandbox/hostfs_int.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/fsuid.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/log.h"
#include "core/util.h"

/* How long the fork server waits for the mount (the helper only opens and
 * mounts: a few ms). */
#define HOSTFS_START_MS 10000

/* The helper's one message: 0 and the mount fd, or -errno and why. */
struct hostfs_hello {
    int32_t status;
    char msg[300];
};

/* --- the helper ----------------------------------------------------------- */

static int fsconfig_str(int fs, const char *key, const char *value, char *err, size_t errlen)
{
    if (fsconfig(fs, value ? FSCONFIG_SET_STRING : FSCONFIG_SET_FLAG, key, value, 0) < 0)
        return err_errno(err, errlen, "workspace: FUSE option %s", key);
    return 0;
}

/* The workspace directory and a FUSE mount on /dev/fuse (*fuse_fd) for it:
 * *mount_fd, detached. */
static int make_mount(const struct config *cfg, struct hostfs_state *st, int *fuse_fd,
                      int *mount_fd, char *err, size_t errlen)
{
    struct stat s;
    struct statx x;
    st->root.fd = open(cfg->workdir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (st->root.fd < 0 || fstat(st->root.fd, &s) < 0 ||
        statx(st->root.fd, "", AT_EMPTY_PATH, STATX_MNT_ID, &x) < 0)
        return err_errno(err, errlen, "workspace %s", cfg->workdir);
    st->mnt_id = x.stx_mnt_id;
    st->root = (struct hnode){.fd = st->root.fd, .dev = s.st_dev, .ino = s.st_ino,
                              .type = S_IFDIR, .nlookup = 1};
    st->owner = s.st_uid;
    st->group = s.st_gid;
    *fuse_fd = open("/dev/fuse", O_RDWR | O_CLOEXEC | O_NOCTTY);
    if (*fuse_fd < 0 || fstat(*fuse_fd, &s) < 0 || !S_ISCHR(s.st_mode) ||
        s.st_rdev != makedev(10, 229)) {
        int e = *fuse_fd < 0 ? errno : ENODEV;
        return err_fmt(err, errlen, -e, "workspace %s is served through FUSE, which needs "
                       "/dev/fuse (the fuse module): %s", cfg->workdir,
                       e == ENODEV ? "not the FUSE device" : strerror(e));
    }
    char fdstr[16];
    snprintf(fdstr, sizeof fdstr, "%d", *fuse_fd);
    _cleanup_close_ int fs = fsopen("fuse", FSOPEN_CLOEXEC);
    if (fs < 0)
        return err_errno(err, errlen, "workspace: fsopen fuse");
    int r = 0;
    /* default_permissions: the kernel checks the sandbox's every access
     * against the attributes we report; allow_other: the sandbox is not
     * the mount's owner (root). */
    if ((r = fsconfig_str(fs, "source", "forkbox-workspace", err, errlen)) < 0 ||
        (r = fsconfig_str(fs, "fd", fdstr, err, errlen)) < 0 ||
        (r = fsconfig_str(fs, "rootmode", "40000", err, errlen)) < 0 ||
        (r = fsconfig_str(fs, "user_id", "0", err, errlen)) < 0 ||
        (r = fsconfig_str(fs, "group_id", "0", err, errlen)) < 0 ||
        (r = fsconfig_str(fs, "default_permissions", NULL, err, errlen)) < 0 ||
        (r = fsconfig_str(fs, "allow_other", NULL, err, errlen)) < 0)
        return r;
    if (fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
        return err_errno(err, errlen, "workspace: create the FUSE mount");
    *mount_fd = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
    if (*mount_fd < 0)
        return err_errno(err, errlen, "workspace: fsmount");
    return 0;
}

/* What serving needs of root, once the mount exists: as a root-owned
 * workdir's owner, root's file capabilities (the kernel has checked the
 * sandbox's access already: these only let us carry it out as root would);
 * as anyone else's, nothing (setresuid has dropped them all already). */
static int keep_only_fs_caps(bool root)
{
    static const cap_value_t fs_caps[] = {CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH,
                                          CAP_FOWNER};
    cap_t c = cap_init();
    int r = !c ? -1 : 0;
    if (r == 0 && root)
        r = cap_set_flag(c, CAP_EFFECTIVE, 4, fs_caps, CAP_SET) < 0 ||
                    cap_set_flag(c, CAP_PERMITTED, 4, fs_caps, CAP_SET) < 0
                ? -1 : 0;
    if (r == 0)
        r = cap_set_proc(c);
    if (c)
        cap_free(c);
    return r < 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ? -errno : 0;
}

_Noreturn static void helper_main(const struct config *cfg, uint32_t id, int sock)
{
    prctl(PR_SET_NAME, "forkbox-hostfs");
    raise_nofile(); /* an fd per inode the kernel holds */
    static struct hostfs_state st;
    st = (struct hostfs_state){.root.fd = -1, .id = id, .nbuckets = 1024,
                               .cap = (int64_t)(cfg->workspace_max ? cfg->workspace_max
                                                                   : cfg->tmpfs_size)};
    st.table = calloc(st.nbuckets, sizeof *st.table);
    struct hostfs_hello hello = {0};
    int fuse_fd = -1, mount_fd = -1;
    int r = st.table ? make_mount(cfg, &st, &fuse_fd, &mount_fd, hello.msg, sizeof hello.msg)
                     : err_fmt(hello.msg, sizeof hello.msg, -ENOMEM, "hostfs: out of memory");
    char *argv[] = {"forkbox-hostfs", NULL};
    struct fuse_args args = FUSE_ARGS_INIT(1, argv);
    struct fuse_session *se = NULL;
    char dev[32];
    snprintf(dev, sizeof dev, "/dev/fd/%d", fuse_fd);
    if (r == 0 && (!(se = fuse_session_new(&args, &hostfs_ops, sizeof hostfs_ops, &st)) ||
                   fuse_session_mount(se, dev) < 0))
        r = err_fmt(hello.msg, sizeof hello.msg, -EIO, "workspace: libfuse session");
    hello.status = r;
    if (fd_send(sock, &hello, sizeof hello, &mount_fd, r == 0 ? 1 : 0, 0) < 0 || r < 0)
        _exit(1);
    close(mount_fd);
    /* The block's files are the owner's, made with the owner's rights (the
     * kernel checked the sandbox's already, on what we report): for a user's
     * workdir we become that user (not only for files: no signal to a root
     * process either), for root's we keep root's file capabilities alone. */
    umask(0);
    int ids = setgroups(0, NULL);
    if (ids == 0 && st.owner != 0)
        ids = setresgid(st.group, st.group, st.group) < 0 ||
                      setresuid(st.owner, st.owner, st.owner) < 0 ? -1 : 0;
    else if (ids == 0)
        ids = (setfsgid(st.group), (gid_t)setfsgid((gid_t)-1) == st.group) ? 0 : -1;
    if (ids < 0 || keep_only_fs_caps(st.owner == 0) < 0) {
        LOG_E("workspace: cannot take the owner's ids %u:%u or drop capabilities",
              (unsigned)st.owner, (unsigned)st.group);
        _exit(1);
    }
    _exit(fuse_session_loop(se) == 0 ? 0 : 1);
}

/* --- the fork server -------------------------------------------------------- */

int hostfs_start(const struct config *cfg, uint32_t id, struct hostfs *h, int *mount_fd,
                 char *err, size_t errlen)
{
    *h = (struct hostfs){.sock = -1};
    *mount_fd = -1;
    int sock = -1;
    pid_t pid = fork_helper("workspace server", &sock, err, errlen);
    if (pid < 0)
        return pid;
    if (pid == 0) {
        close_range(4, ~0u, 0); /* stdio for the log, the socket (3) */
        log_init("forkserver/hostfs", cfg->log_level);
        helper_main(cfg, id, 3);
    }
    h->pid = pid;
    h->sock = sock;
    struct hostfs_hello hello;
    struct pollfd p = {.fd = sock, .events = POLLIN};
    size_t nfds = 0;
    int r = poll(&p, 1, HOSTFS_START_MS);
    ssize_t n = r <= 0 ? -1 : fd_recv(sock, &hello, sizeof hello, mount_fd, 1, &nfds, 0, NULL);
    if (n != (ssize_t)sizeof hello)
        return err_fmt(err, errlen, -EIO, "workspace: its FUSE server %s",
                       r == 0 ? "did not answer" : "exited");
    if (hello.status < 0 || nfds != 1) {
        if (nfds)
            close_and_reset(mount_fd);
        hello.msg[sizeof hello.msg - 1] = '\0';
        return err_fmt(err, errlen, hello.status < 0 ? hello.status : -EIO, "%s", hello.msg);
    }
    return 0;
}
