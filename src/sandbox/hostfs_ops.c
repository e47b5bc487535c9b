/* Runs in the hostfs helper (hostfs.c starts it and says why it exists): the
 * FUSE operations that serve the host's workspace directory to the one
 * sandbox of `forkbox sandbox`.
 *
 * Every request names inodes by node id; each node holds an O_PATH fd on
 * its inode (as libfuse's passthrough_ll does), and every call is relative
 * to such an fd with a single name that is never followed: lookups go
 * through openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
 * RESOLVE_NO_XDEV, creation and renames through *at calls that do not
 * follow their last component, attributes through the fd itself. So no
 * symlink a block made, and no host mount inside the directory, leads this
 * process anywhere else, whatever the names.
 *
 * What the kernel checks: the mount has default_permissions, so the
 * sandbox's permission to each operation is checked by the kernel against
 * the attributes we report (the workspace owner's files as the sandbox's
 * own, see as_seen), before a request reaches us. What we refuse, because a
 * host inode must not get it, whatever the kernel would allow:
 *   - set-uid and set-gid bits (chmod, create, mknod), and the set-gid bit a
 *     new directory inherits from a set-gid parent (cleared at once);
 *   - any inode but a regular file, a directory or a symlink: no FIFO, no
 *     socket (a bind() of a Unix socket is a mknod), no device node;
 *   - extended attributes outside user.* (so no ACL, no file capability);
 *   - changing the workspace directory's own mode;
 *   - growing past --workspace-max: the space the block's files take is
 *     charged as tmpfs charges it (a regular file's size rounded up to
 *     HOSTFS_BLOCK, at least one block; HOSTFS_BLOCK per directory or
 *     symlink; an xattr's name and value), and what does not fit is
 *     ENOSPC: a write gets what fits, then ENOSPC.
 * Locks (flock, fcntl) are left to the kernel: it keeps them among the
 * mount's users (the block's processes) when the server offers none.
 *
 * Single-threaded: requests are answered one at a time, in the order the
 * kernel queues them. No attribute or entry is cached by the kernel
 * (timeouts 0) and no page cache survives an open, so the block sees the
 * host's changes as the host makes them; writes go through at once (no
 * writeback cache), so the host sees the block's.
 *
 * One job in one file (~950 lines): the FUSE operation table. Every
 * operation goes through the same few helpers (a node's fd, the charge
 * against --workspace-max, the refusals above); the helper's start, its
 * nodes and its loop are already apart (hostfs.c, hostfs_int.h). */
#include "sandbox/hostfs_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

_Static_assert(sizeof(fuse_ino_t) >= sizeof(uintptr_t), "node ids are node addresses");

static struct hostfs_state *state(fuse_req_t req) { return fuse_req_userdata(req); }

static struct hnode *node(struct hostfs_state *st, fuse_ino_t ino)
{
    return ino == FUSE_ROOT_ID ? &st->root : (struct hnode *)(uintptr_t)ino;
}

/* The inode of an O_PATH fd as a path to open or change it by: a magic link
 * that ends at that inode (never following it further, even to a symlink's
 * target). */
#define PROC_FD_MAX sizeof "/proc/self/fd/-2147483648"
static const char *proc_fd(char buf[PROC_FD_MAX], int fd)
{
    snprintf(buf, PROC_FD_MAX, "/proc/self/fd/%d", fd);
    return buf;
}

static int stat_fd(int fd, struct stat *s)
{
    return fstatat(fd, "", s, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}

/* What the sandbox sees: the workspace owner's files (and group) as its
 * own host id, which its user namespace maps to its root; any other id is
 * unmapped there (nobody). The kernel checks permissions on these. */
static void as_seen(const struct hostfs_state *st, struct stat *s)
{
    if (s->st_uid == st->owner)
        s->st_uid = st->id;
    if (s->st_gid == st->group)
        s->st_gid = st->id;
}

/* A name the kernel sends is one component; anything else is refused. */
static bool name_ok(const char *name)
{
    return name[0] && strcmp(name, ".") != 0 && strcmp(name, "..") != 0 && !strchr(name, '/');
}

/* ----------------------------------------------------------- charges */

static int64_t charge(mode_t type, off_t size)
{
    if (!S_ISREG(type))
        return HOSTFS_BLOCK;
    int64_t blocks = (size + HOSTFS_BLOCK - 1) / HOSTFS_BLOCK;
    return (blocks ? blocks : 1) * HOSTFS_BLOCK;
}

static bool fits(const struct hostfs_state *st, int64_t more)
{
    return more <= 0 || st->used + more <= st->cap;
}

/* The largest size a regular file now charged `cur` may grow to. */
static off_t size_limit(const struct hostfs_state *st, int64_t cur)
{
    int64_t room = st->cap - st->used;
    return room < 0 ? 0 : (cur + room) / HOSTFS_BLOCK * HOSTFS_BLOCK;
}

/* ------------------------------------------------------------- nodes */

static size_t bucket(const struct hostfs_state *st, dev_t dev, ino_t ino)
{
    uint64_t h = ((uint64_t)ino * 0x9e3779b97f4a7c15ull) ^ (uint64_t)dev;
    return (size_t)(h >> 17) & (st->nbuckets - 1);
}

static struct hnode *find(struct hostfs_state *st, dev_t dev, ino_t ino)
{
    if (dev == st->root.dev && ino == st->root.ino)
        return &st->root;
    for (struct hnode *n = st->table[bucket(st, dev, ino)]; n; n = n->next)
        if (n->dev == dev && n->ino == ino)
            return n;
    return NULL;
}

static int table_grow(struct hostfs_state *st)
{
    size_t nb = st->nbuckets * 2;
    struct hnode **t = calloc(nb, sizeof *t);
    if (!t)
        return -ENOMEM;
    struct hnode **old = st->table;
    size_t oldn = st->nbuckets;
    st->table = t;
    st->nbuckets = nb;
    for (size_t i = 0; i < oldn; i++)
        for (struct hnode *n = old[i], *next; n; n = next) {
            next = n->next;
            size_t b = bucket(st, n->dev, n->ino);
            n->next = t[b];
            t[b] = n;
        }
    free(old);
    return 0;
}

/* The node of the inode fd is open on (fd: O_PATH, taken: kept by a new
 * node, else closed), with one more lookup. */
static struct hnode *adopt(struct hostfs_state *st, int fd, const struct stat *s)
{
    struct hnode *n = find(st, s->st_dev, s->st_ino);
    if (n) {
        close(fd);
        if (n != &st->root)
            n->nlookup++;
        return n;
    }
    if (st->count >= st->nbuckets * 2 && table_grow(st) < 0) {
        close(fd);
        return NULL;
    }
    n = calloc(1, sizeof *n);
    if (!n) {
        close(fd);
        return NULL;
    }
    *n = (struct hnode){.fd = fd, .dev = s->st_dev, .ino = s->st_ino,
                        .type = s->st_mode & S_IFMT, .nlookup = 1};
    size_t b = bucket(st, n->dev, n->ino);
    n->next = st->table[b];
    st->table[b] = n;
    st->count++;
    return n;
}

static void forget_one(struct hostfs_state *st, fuse_ino_t ino, uint64_t nlookup)
{
    struct hnode *n = node(st, ino);
    if (n == &st->root)
        return;
    n->nlookup = nlookup < n->nlookup ? n->nlookup - nlookup : 0;
    if (n->nlookup)
        return;
    for (struct hnode **p = &st->table[bucket(st, n->dev, n->ino)]; *p; p = &(*p)->next)
        if (*p == n) {
            *p = n->next;
            break;
        }
    st->count--;
    close(n->fd);
    free(n);
}

/* openat2 of one name below dir: never through a symlink or into another
 * mount (a mount on a name in the workspace stays the host's). */
static int open_below(int dir, const char *name, int flags, mode_t mode)
{
    struct open_how how = {.flags = (uint64_t)(flags | O_NOFOLLOW | O_CLOEXEC), .mode = mode,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV |
                                      RESOLVE_NO_MAGICLINKS};
    long fd = syscall(SYS_openat2, dir, name, &how, sizeof how);
    if (fd < 0)
        return errno == EXDEV ? -EACCES : -errno;
    return (int)fd;
}

/* The kernel may keep a directory's entry and attributes this long (s):
 * its path is walked again at every open and stat below it, and the host
 * moving or chmod'ing a directory under a running block is rare. A file's
 * or symlink's are not kept at all (0): a block sees the host's writes,
 * renames and appends at once. */
#define DIR_CACHE_S 1.0

/* stat of name below dir (not following it), and the mount it is on. */
static int stat_name(int dir, const char *name, struct stat *s, uint64_t *mnt)
{
    struct statx x;
    if (statx(dir, name, AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS | STATX_MNT_ID, &x) < 0)
        return -errno;
    *s = (struct stat){
        .st_dev = makedev(x.stx_dev_major, x.stx_dev_minor), .st_ino = x.stx_ino,
        .st_mode = x.stx_mode, .st_nlink = x.stx_nlink, .st_uid = x.stx_uid,
        .st_gid = x.stx_gid, .st_rdev = makedev(x.stx_rdev_major, x.stx_rdev_minor),
        .st_size = (off_t)x.stx_size, .st_blksize = x.stx_blksize,
        .st_blocks = (blkcnt_t)x.stx_blocks,
        .st_atim = {x.stx_atime.tv_sec, x.stx_atime.tv_nsec},
        .st_mtim = {x.stx_mtime.tv_sec, x.stx_mtime.tv_nsec},
        .st_ctim = {x.stx_ctime.tv_sec, x.stx_ctime.tv_nsec},
    };
    *mnt = x.stx_mnt_id;
    return 0;
}

/* Look name up below parent: its entry (a new reference to its node). A
 * name whose inode is a node already (the kernel revalidating what it
 * holds) costs a statx; a new one, or one on another mount (a host mount
 * inside the workspace), is opened beneath parent (open_below), and only
 * such an open makes a node, so no node lies across a mount. */
static int lookup(struct hostfs_state *st, struct hnode *parent, const char *name,
                  struct fuse_entry_param *e)
{
    if (!name_ok(name))
        return -EINVAL;
    memset(e, 0, sizeof *e);
    struct hnode *n = NULL;
    uint64_t mnt;
    int r = stat_name(parent->fd, name, &e->attr, &mnt);
    if (r < 0)
        return r;
    if (mnt == st->mnt_id && (n = find(st, e->attr.st_dev, e->attr.st_ino)) && n != &st->root)
        n->nlookup++;
    if (!n) {
        int fd = open_below(parent->fd, name, O_PATH, 0);
        r = fd < 0 ? fd : stat_fd(fd, &e->attr);
        if (r < 0) {
            if (fd >= 0)
                close(fd);
            return r;
        }
        if (!(n = adopt(st, fd, &e->attr)))
            return -ENOMEM;
    }
    e->ino = n == &st->root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)n;
    if (S_ISDIR(e->attr.st_mode))
        e->entry_timeout = e->attr_timeout = DIR_CACHE_S;
    as_seen(st, &e->attr);
    return 0;
}

static void reply_entry(fuse_req_t req, int r, const struct fuse_entry_param *e)
{
    if (r < 0)
        fuse_reply_err(req, -r);
    else
        fuse_reply_entry(req, e);
}

/* -------------------------------------------------------- operations */

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
    (void)userdata;
    /* Locks stay in the kernel (none offered); no ACLs; writes through; the
     * kernel applies the caller's umask (we run with 0) and clears set-uid
     * bits on a write itself, with a SETATTR we see (no KILLPRIV). */
    conn->want &= ~(unsigned)(FUSE_CAP_POSIX_LOCKS | FUSE_CAP_FLOCK_LOCKS | FUSE_CAP_POSIX_ACL |
                              FUSE_CAP_WRITEBACK_CACHE | FUSE_CAP_EXPORT_SUPPORT |
                              FUSE_CAP_HANDLE_KILLPRIV | FUSE_CAP_DONT_MASK |
                              FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
    conn->max_write = HOSTFS_MAX_WRITE;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct fuse_entry_param e;
    struct hostfs_state *st = state(req);
    reply_entry(req, lookup(st, node(st, parent), name, &e), &e);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
    forget_one(state(req), ino, nlookup);
    fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *f)
{
    for (size_t i = 0; i < count; i++)
        forget_one(state(req), f[i].ino, f[i].nlookup);
    fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    struct hostfs_state *st = state(req);
    struct stat s;
    int r = stat_fd(node(st, ino)->fd, &s);
    if (r < 0) {
        fuse_reply_err(req, -r);
        return;
    }
    as_seen(st, &s);
    fuse_reply_attr(req, &s, S_ISDIR(s.st_mode) ? DIR_CACHE_S : 0);
}


static int set_size(struct hostfs_state *st, struct hnode *n, struct fuse_file_info *fi,
                    off_t size)
{
    struct stat s;
    int r = stat_fd(n->fd, &s);
    if (r < 0)
        return r;
    if (!S_ISREG(s.st_mode))
        return -EINVAL;
    int64_t before = charge(s.st_mode, s.st_size), more = charge(s.st_mode, size) - before;
    if (!fits(st, more))
        return -ENOSPC;
    char p[PROC_FD_MAX];
    if ((fi ? ftruncate((int)fi->fh, size) : truncate(proc_fd(p, n->fd), size)) < 0)
        return -errno;
    st->used += more;
    return 0;
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi)
{
    struct hostfs_state *st = state(req);
    struct hnode *n = node(st, ino);
    char p[PROC_FD_MAX];
    int r = 0;
    if (to_set & FUSE_SET_ATTR_MODE) {
        /* The workspace's own mode is the host's (a 0777 workspace would let
         * every local user into it: only a chmod to its mode as it is passes);
         * no set-uid or set-gid bit on a host inode, whoever owns it.
         * Clearing them (the kernel does so on a write) is fine. */
        struct stat cur;
        if (n == &st->root)
            r = stat_fd(n->fd, &cur) < 0 || ((cur.st_mode ^ attr->st_mode) & 07777) ? -EPERM : 0;
        else if (attr->st_mode & (S_ISUID | S_ISGID))
            r = -EPERM;
        else if (S_ISLNK(n->type))
            r = -EOPNOTSUPP;
        else if ((fi ? fchmod((int)fi->fh, attr->st_mode & 07777)
                     : chmod(proc_fd(p, n->fd), attr->st_mode & 07777)) < 0)
            r = -errno;
    }
    if (r == 0 && (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))) {
        /* The only id the kernel lets the sandbox give is its own: on disk,
         * the workspace's owner or group. */
        bool uid = to_set & FUSE_SET_ATTR_UID, gid = to_set & FUSE_SET_ATTR_GID;
        if ((uid && attr->st_uid != st->id) || (gid && attr->st_gid != st->id))
            r = -EPERM;
        else if (fchownat(n->fd, "", uid ? st->owner : (uid_t)-1, gid ? st->group : (gid_t)-1,
                          AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0)
            r = -errno;
    }
    if (r == 0 && (to_set & FUSE_SET_ATTR_SIZE))
        r = set_size(st, n, fi, attr->st_size);
    if (r == 0 && (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME))) {
        struct timespec tv[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_nsec = UTIME_OMIT}};
        if (to_set & FUSE_SET_ATTR_ATIME_NOW)
            tv[0].tv_nsec = UTIME_NOW;
        else if (to_set & FUSE_SET_ATTR_ATIME)
            tv[0] = attr->st_atim;
        if (to_set & FUSE_SET_ATTR_MTIME_NOW)
            tv[1].tv_nsec = UTIME_NOW;
        else if (to_set & FUSE_SET_ATTR_MTIME)
            tv[1] = attr->st_mtim;
        if (utimensat(n->fd, "", tv, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0)
            r = -errno;
    }
    if (r < 0) {
        fuse_reply_err(req, -r);
        return;
    }
    op_getattr(req, ino, fi);
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
    char buf[PATH_MAX + 1];
    ssize_t n = readlinkat(node(state(req), ino)->fd, "", buf, sizeof buf);
    if (n < 0 || (size_t)n >= sizeof buf) {
        fuse_reply_err(req, n < 0 ? errno : ENAMETOOLONG);
        return;
    }
    buf[n] = '\0';
    fuse_reply_readlink(req, buf);
}

/* After a new inode was made as name below parent: its entry, charged. */
static void made(fuse_req_t req, struct hnode *parent, const char *name, int r)
{
    struct hostfs_state *st = state(req);
    struct fuse_entry_param e;
    if (r == 0)
        r = lookup(st, parent, name, &e);
    if (r == 0)
        st->used += charge(e.attr.st_mode & S_IFMT, e.attr.st_size);
    reply_entry(req, r, &e);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
    struct hostfs_state *st = state(req);
    struct hnode *dir = node(st, parent);
    /* Regular files only: a FIFO a host reader would hang on, a socket, a
     * device node do not reach a host directory. */
    int r = !S_ISREG(mode) || (mode & (S_ISUID | S_ISGID)) ? -EPERM
            : !name_ok(name)                                ? -EINVAL
            : !fits(st, HOSTFS_BLOCK)                       ? -ENOSPC
            : mknodat(dir->fd, name, mode & 07777, rdev) < 0 ? -errno : 0;
    made(req, dir, name, r);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
    struct hostfs_state *st = state(req);
    struct hnode *dir = node(st, parent);
    int r = !name_ok(name) ? -EINVAL : !fits(st, HOSTFS_BLOCK) ? -ENOSPC : 0;
    if (r == 0 && mkdirat(dir->fd, name, mode & 01777) < 0)
        r = -errno;
    if (r == 0) {
        /* Made in a set-gid directory it is set-gid too: cleared before the
         * block can see it (whatever its mode lets us open it for). */
        char p[PROC_FD_MAX];
        int fd = open_below(dir->fd, name, O_PATH | O_DIRECTORY, 0);
        struct stat s;
        if (fd < 0 || fstat(fd, &s) < 0 ||
            ((s.st_mode & S_ISGID) && chmod(proc_fd(p, fd), s.st_mode & 01777) < 0)) {
            r = fd < 0 ? fd : -errno;
            unlinkat(dir->fd, name, AT_REMOVEDIR);
        }
        if (fd >= 0)
            close(fd);
    }
    made(req, dir, name, r);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
    struct hostfs_state *st = state(req);
    struct hnode *dir = node(st, parent);
    int r = !name_ok(name) ? -EINVAL : !fits(st, HOSTFS_BLOCK) ? -ENOSPC
            : symlinkat(link, dir->fd, name) < 0 ? -errno : 0;
    made(req, dir, name, r);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
    struct hostfs_state *st = state(req);
    struct hnode *dir = node(st, newparent);
    char p[PROC_FD_MAX];
    int r = !name_ok(newname) ? -EINVAL
            : linkat(AT_FDCWD, proc_fd(p, node(st, ino)->fd), dir->fd, newname,
                     AT_SYMLINK_FOLLOW) < 0 ? -errno : 0;
    struct fuse_entry_param e;
    if (r == 0)
        r = lookup(st, dir, newname, &e); /* another name: no new charge */
    reply_entry(req, r, &e);
}

/* What removing name (unlink, rmdir, or a rename over it) gives back: its
 * charge once its last name goes. 0 if there is nothing there. */
static int64_t refund(int dir, const char *name)
{
    struct stat s;
    if (fstatat(dir, name, &s, AT_SYMLINK_NOFOLLOW) < 0)
        return 0;
    return S_ISDIR(s.st_mode) || s.st_nlink <= 1 ? charge(s.st_mode, s.st_size) : 0;
}

static void remove_name(fuse_req_t req, fuse_ino_t parent, const char *name, int flags)
{
    struct hostfs_state *st = state(req);
    int dir = node(st, parent)->fd;
    if (!name_ok(name)) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    int64_t back = refund(dir, name);
    if (unlinkat(dir, name, flags) < 0) {
        fuse_reply_err(req, errno);
        return;
    }
    st->used -= back;
    fuse_reply_err(req, 0);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    remove_name(req, parent, name, 0);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    remove_name(req, parent, name, AT_REMOVEDIR);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                      const char *newname, unsigned int flags)
{
    struct hostfs_state *st = state(req);
    int from = node(st, parent)->fd, to = node(st, newparent)->fd;
    /* A whiteout is a device node. */
    if ((flags & ~(unsigned)(RENAME_NOREPLACE | RENAME_EXCHANGE)) || !name_ok(name) ||
        !name_ok(newname)) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    struct stat a, b;
    bool same = fstatat(from, name, &a, AT_SYMLINK_NOFOLLOW) == 0 &&
                fstatat(to, newname, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_dev == b.st_dev &&
                a.st_ino == b.st_ino;
    int64_t back = flags & RENAME_EXCHANGE || same ? 0 : refund(to, newname);
    if (renameat2(from, name, to, newname, flags) < 0) {
        fuse_reply_err(req, errno);
        return;
    }
    st->used -= back;
    fuse_reply_err(req, 0);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct hostfs_state *st = state(req);
    struct hnode *n = node(st, ino);
    char p[PROC_FD_MAX];
    struct stat s;
    if (!S_ISREG(n->type)) {
        fuse_reply_err(req, S_ISDIR(n->type) ? EISDIR : EACCES);
        return;
    }
    /* O_TRUNC comes here (atomic_o_trunc): its refund once it is done. */
    int64_t before = (fi->flags & O_TRUNC) && stat_fd(n->fd, &s) == 0 ? charge(s.st_mode, s.st_size)
                                                                       : 0;
    int fd = open(proc_fd(p, n->fd), (fi->flags & ~(O_CREAT | O_EXCL | O_NOCTTY)) | O_CLOEXEC);
    if (fd < 0) {
        fuse_reply_err(req, errno);
        return;
    }
    if (before)
        st->used -= before - charge(S_IFREG, 0);
    fi->fh = (uint64_t)fd;
    fi->keep_cache = 0;
    fuse_reply_open(req, fi);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi)
{
    struct hostfs_state *st = state(req);
    struct hnode *dir = node(st, parent);
    struct stat s;
    bool existed = fstatat(dir->fd, name, &s, AT_SYMLINK_NOFOLLOW) == 0;
    int64_t before = existed ? charge(s.st_mode, s.st_size) : 0;
    int r = (mode & (S_ISUID | S_ISGID)) ? -EPERM : !name_ok(name) ? -EINVAL
            : !existed && !fits(st, HOSTFS_BLOCK) ? -ENOSPC : 0;
    int fd = r < 0 ? r : open_below(dir->fd, name, (fi->flags | O_CREAT) & ~O_NOCTTY, mode & 07777);
    struct fuse_entry_param e;
    if (fd >= 0)
        r = lookup(st, dir, name, &e);
    else
        r = fd;
    if (r < 0) {
        if (fd >= 0)
            close(fd);
        fuse_reply_err(req, -r);
        return;
    }
    st->used += charge(e.attr.st_mode & S_IFMT, e.attr.st_size) - before;
    fi->fh = (uint64_t)fd;
    fi->keep_cache = 0;
    if (fuse_reply_create(req, &e, fi) < 0)
        close(fd); /* the caller gave up: the kernel forgets the entry itself */
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    (void)ino;
    struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
    buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
    buf.buf[0].fd = (int)fi->fh;
    buf.buf[0].pos = off;
    fuse_reply_data(req, &buf, 0);
}

static void op_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *in, off_t off,
                         struct fuse_file_info *fi)
{
    (void)ino;
    struct hostfs_state *st = state(req);
    int fd = (int)fi->fh;
    struct stat s;
    if (fstat(fd, &s) < 0) {
        fuse_reply_err(req, errno);
        return;
    }
    /* What fits: tmpfs writes up to a full device, then says ENOSPC. */
    size_t len = fuse_buf_size(in);
    off_t start = fi->flags & O_APPEND ? s.st_size : off;
    int64_t before = charge(s.st_mode, s.st_size);
    if (start + (off_t)len > s.st_size && !fits(st, charge(s.st_mode, start + (off_t)len) - before)) {
        off_t limit = size_limit(st, before);
        if (limit <= start) {
            fuse_reply_err(req, ENOSPC);
            return;
        }
        len = (size_t)(limit - start);
    }
    struct fuse_bufvec out = FUSE_BUFVEC_INIT(len);
    out.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
    out.buf[0].fd = fd;
    out.buf[0].pos = off;
    ssize_t n = fuse_buf_copy(&out, in, 0);
    if (n >= 0 && fstat(fd, &s) == 0)
        st->used += charge(s.st_mode, s.st_size) - before;
    if (n < 0)
        fuse_reply_err(req, (int)-n);
    else
        fuse_reply_write(req, (size_t)n);
}

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
                         struct fuse_file_info *fi)
{
    (void)ino;
    struct hostfs_state *st = state(req);
    struct stat s;
    /* Only plain allocation: KEEP_SIZE (and PUNCH_HOLE, which needs it)
     * would take space that no size shows. Refused as filesystems without
     * them refuse them. */
    if (mode != 0) {
        fuse_reply_err(req, EOPNOTSUPP);
        return;
    }
    if (fstat((int)fi->fh, &s) < 0) {
        fuse_reply_err(req, errno);
        return;
    }
    int64_t before = charge(s.st_mode, s.st_size);
    if (off + len > s.st_size && !fits(st, charge(s.st_mode, off + len) - before)) {
        fuse_reply_err(req, ENOSPC);
        return;
    }
    int r = fallocate((int)fi->fh, 0, off, len) < 0 ? errno : 0;
    if (r == 0 && fstat((int)fi->fh, &s) == 0)
        st->used += charge(s.st_mode, s.st_size) - before;
    fuse_reply_err(req, r);
}

static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino;
    /* A close of a copy: what the filesystem reports at close (NFS). */
    int fd = dup((int)fi->fh);
    fuse_reply_err(req, fd < 0 ? errno : close(fd) < 0 ? errno : 0);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino;
    close((int)fi->fh);
    fuse_reply_err(req, 0);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    (void)ino;
    int r = datasync ? fdatasync((int)fi->fh) : fsync((int)fi->fh);
    fuse_reply_err(req, r < 0 ? errno : 0);
}

/* -------------------------------------------------------- directories */

struct hdir {
    DIR *dp;
    off_t offset;        /* where dp is */
    struct dirent *held; /* read but not yet given (did not fit) */
};

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    char p[PROC_FD_MAX];
    struct hnode *n = node(state(req), ino);
    struct hdir *d = calloc(1, sizeof *d);
    int fd = !d ? -1 : open(proc_fd(p, n->fd), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || !(d->dp = fdopendir(fd))) {
        int e = d ? errno : ENOMEM;
        if (fd >= 0)
            close(fd);
        free(d);
        fuse_reply_err(req, e);
        return;
    }
    fi->fh = (uint64_t)(uintptr_t)d;
    fuse_reply_open(req, fi);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    (void)ino;
    struct hdir *d = (struct hdir *)(uintptr_t)fi->fh;
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    if (off != d->offset) {
        seekdir(d->dp, off);
        d->held = NULL;
        d->offset = off;
    }
    size_t used = 0;
    int err = 0;
    for (;;) {
        if (!d->held) {
            errno = 0;
            d->held = readdir(d->dp);
            if (!d->held) {
                err = errno;
                break;
            }
        }
        struct stat s = {.st_ino = d->held->d_ino, .st_mode = (mode_t)d->held->d_type << 12};
        off_t next = telldir(d->dp);
        size_t n = fuse_add_direntry(req, buf + used, size - used, d->held->d_name, &s, next);
        if (n > size - used)
            break;
        used += n;
        d->held = NULL;
        d->offset = next;
    }
    if (err && used == 0)
        fuse_reply_err(req, err);
    else
        fuse_reply_buf(req, buf, used);
    free(buf);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino;
    struct hdir *d = (struct hdir *)(uintptr_t)fi->fh;
    closedir(d->dp);
    free(d);
    fuse_reply_err(req, 0);
}

static void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    (void)ino;
    int fd = dirfd(((struct hdir *)(uintptr_t)fi->fh)->dp);
    int r = datasync ? fdatasync(fd) : fsync(fd);
    fuse_reply_err(req, r < 0 ? errno : 0);
}

/* The room --workspace-max leaves, as a filesystem of that size reports it. */
static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
    (void)ino;
    struct hostfs_state *st = state(req);
    int64_t free_bytes = st->cap - (st->used > 0 ? st->used : 0);
    struct statvfs v = {
        .f_bsize = HOSTFS_BLOCK, .f_frsize = HOSTFS_BLOCK,
        .f_blocks = (fsblkcnt_t)(st->cap / HOSTFS_BLOCK),
        .f_bfree = (fsblkcnt_t)(free_bytes > 0 ? free_bytes / HOSTFS_BLOCK : 0),
        .f_namemax = NAME_MAX,
    };
    v.f_bavail = v.f_bfree;
    v.f_files = v.f_blocks; /* every inode takes a block at least */
    v.f_ffree = v.f_favail = v.f_bfree;
    fuse_reply_statfs(req, &v);
}

/* ------------------------------------------------------------- xattrs */

static bool user_xattr(const char *name) { return strncmp(name, "user.", 5) == 0; }

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    struct hnode *n = node(state(req), ino);
    char p[PROC_FD_MAX];
    if (!user_xattr(name) || S_ISLNK(n->type)) {
        fuse_reply_err(req, ENODATA);
        return;
    }
    char *buf = size ? malloc(size) : NULL;
    ssize_t r = size && !buf ? (errno = ENOMEM, -1) : getxattr(proc_fd(p, n->fd), name, buf, size);
    if (r < 0)
        fuse_reply_err(req, errno);
    else if (size == 0)
        fuse_reply_xattr(req, (size_t)r);
    else
        fuse_reply_buf(req, buf, (size_t)r);
    free(buf);
}

/* Only the user.* names are the block's to see. */
static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
    struct hnode *n = node(state(req), ino);
    char p[PROC_FD_MAX];
    ssize_t len = S_ISLNK(n->type) ? 0 : listxattr(proc_fd(p, n->fd), NULL, 0);
    char *all = len > 0 ? malloc((size_t)len) : NULL;
    if (len > 0 && (!all || (len = listxattr(p, all, (size_t)len)) < 0)) {
        fuse_reply_err(req, all ? errno : ENOMEM);
        free(all);
        return;
    }
    if (len < 0) {
        fuse_reply_err(req, errno);
        return;
    }
    size_t kept = 0;
    for (ssize_t i = 0; i < len; i += (ssize_t)strlen(all + i) + 1)
        if (user_xattr(all + i)) {
            size_t l = strlen(all + i) + 1;
            memmove(all + kept, all + i, l);
            kept += l;
        }
    if (size == 0)
        fuse_reply_xattr(req, kept);
    else if (kept > size)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, all, kept);
    free(all);
}

static int64_t xattr_charge(const char *path, const char *name)
{
    ssize_t n = getxattr(path, name, NULL, 0);
    return n < 0 ? 0 : (int64_t)strlen(name) + n;
}

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
                        size_t size, int flags)
{
    struct hostfs_state *st = state(req);
    struct hnode *n = node(st, ino);
    char p[PROC_FD_MAX];
    /* No ACL (a default ACL would make the host's later files world-
     * writable), no security.* (a file capability), no trusted.*. */
    if (!user_xattr(name)) {
        fuse_reply_err(req, EOPNOTSUPP);
        return;
    }
    if (S_ISLNK(n->type)) {
        fuse_reply_err(req, EPERM);
        return;
    }
    proc_fd(p, n->fd);
    int64_t more = (int64_t)(strlen(name) + size) - xattr_charge(p, name);
    if (!fits(st, more)) {
        fuse_reply_err(req, ENOSPC);
        return;
    }
    if (setxattr(p, name, value, size, flags) < 0) {
        fuse_reply_err(req, errno);
        return;
    }
    st->used += more;
    fuse_reply_err(req, 0);
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
    struct hostfs_state *st = state(req);
    struct hnode *n = node(st, ino);
    char p[PROC_FD_MAX];
    if (!user_xattr(name) || S_ISLNK(n->type)) {
        fuse_reply_err(req, ENODATA);
        return;
    }
    int64_t back = xattr_charge(proc_fd(p, n->fd), name);
    if (removexattr(p, name) < 0) {
        fuse_reply_err(req, errno);
        return;
    }
    st->used -= back;
    fuse_reply_err(req, 0);
}

/* Not offered, so the kernel does the work itself: locks (kept among the
 * mount's users), copy_file_range (falls back to reads and writes, which
 * are charged), lseek (SEEK_DATA/SEEK_HOLE: all data), ioctl, poll. */
const struct fuse_lowlevel_ops hostfs_ops = {
    .init = op_init,
    .lookup = op_lookup,
    .forget = op_forget,
    .forget_multi = op_forget_multi,
    .getattr = op_getattr,
    .setattr = op_setattr,
    .readlink = op_readlink,
    .mknod = op_mknod,
    .mkdir = op_mkdir,
    .symlink = op_symlink,
    .link = op_link,
    .unlink = op_unlink,
    .rmdir = op_rmdir,
    .rename = op_rename,
    .open = op_open,
    .create = op_create,
    .read = op_read,
    .write_buf = op_write_buf,
    .fallocate = op_fallocate,
    .flush = op_flush,
    .release = op_release,
    .fsync = op_fsync,
    .opendir = op_opendir,
    .readdir = op_readdir,
    .releasedir = op_releasedir,
    .fsyncdir = op_fsyncdir,
    .statfs = op_statfs,
    .getxattr = op_getxattr,
    .listxattr = op_listxattr,
    .setxattr = op_setxattr,
    .removexattr = op_removexattr,
};
