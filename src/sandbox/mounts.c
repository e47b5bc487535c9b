/* The sandbox's filesystem (see mounts.h).
 *
 * The root is built once, in the fork server (mounts_build), in a mount
 * namespace of its own that every sandbox's namespace is then a copy of:
 *   a small tmpfs over /tmp (there, in that namespace only) holding the
 *   synthetic /etc files, the merged-/usr symlinks, the mountpoints, and
 *   read-only, nosuid, nodev binds of /usr, the chosen /etc files, the site
 *   dirs and the /dev nodes; then read-only, superblock and mount.
 * Every bind source is cloned (open_tree) before the tmpfs covers /tmp, so a
 * site dir under /tmp is bound too. The decisions about the host (which files
 * exist, which are directories) were made before, by mounts_prepare().
 *
 * Order in the child (mounts_setup), each step relying on the one before:
 *   1. make every mount private: nothing below propagates anywhere;
 *   2. a recursive bind of the prepared root onto itself: the copy our
 *      namespace came with is locked to the old root, and pivot_root wants a
 *      root of our own; its binds come along, still locked read-only;
 *   3. pivot_root(".", "."): the old root stays stacked on the new one, so
 *      bind sources and the host's proc stay in the namespace until step 7;
 *   4. one size-limited "scratch" tmpfs, bound at /workspace, /tmp and
 *      /dev/shm, so cfg->tmpfs_size caps the three together (site dirs under
 *      /tmp bound again inside it);
 *   5. /tools: a tmpfs whose only writable path is an fd; the visible path
 *      is a read-only bind (4 and 5 use the still empty /proc as their
 *      temporary mountpoint: the root is read-only);
 *   6. a fresh /proc (must precede 7: the kernel only lets a user namespace
 *      mount proc while a fully visible proc is still in its mount namespace);
 *   7. detach the old root: from here on no host path is reachable.
 * A sandbox thus makes 13 mount calls and no directory or file outside its
 * scratch; building the root itself (some 40 mount calls, 25 directories, 5
 * files and 9 symlinks) was most of a sandbox's filesystem set-up. */
#include "sandbox/mounts.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/cleanup.h"

#define OP_PATH_MAX 320

/* Synthetic /etc files: nothing about the host leaks through them, and the
 * NSS config loads no module that could reach outside (dbus, systemd). */
static const char etc_passwd[] =
    "root:x:0:0:root:/workspace:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
static const char etc_group[] =
    "root:x:0:\n"
    "nogroup:x:65534:\n";
static const char etc_hosts[] =
    "127.0.0.1\tlocalhost forkbox\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n";
static const char etc_nsswitch[] =
    "passwd: files\n"
    "group: files\n"
    "shadow: files\n"
    "hosts: files\n"
    "networks: files\n"
    "protocols: files\n"
    "services: files\n";
static const char etc_hostname[] = "forkbox\n";

/* The host's /etc files a sandbox sees, read-only: public configuration that
 * the interpreter, libc and common packages read, nothing else. Reviewed one
 * by one; a file missing on the host is skipped. Left out on purpose, among
 * others: shadow, gshadow, sudoers, ssh/, ssl/private/ (secrets); machine-id
 * (identifies the host); passwd, group, hosts, hostname, nsswitch.conf
 * (synthetic, above); resolv.conf, networks (the host's network, and the
 * sandbox has none); environment, profile, pip.conf, npmrc, gitconfig,
 * wgetrc (may hold proxies, internal URLs or credentials); fstab, subuid,
 * subgid (host mounts and accounts). /etc/python3* is added by prefix. */
static const char *const etc_host_files[] = {
    "/etc/ld.so.cache",     /* the dynamic loader's library index */
    "/etc/localtime",       /* the time zone (a symlink into /usr/share/zoneinfo) */
    "/etc/timezone",        /* its name, for tzlocal and the like */
    "/etc/alternatives",    /* Debian's library and program choices, symlinks
                               (libblas.so.3 for numpy, for one) */
    "/etc/mime.types",      /* mimetypes.guess_type() */
    "/etc/protocols",       /* socket.getprotobyname(), getaddrinfo() */
    "/etc/services",        /* socket.getservbyname(), getaddrinfo() with a service */
    "/etc/matplotlibrc",    /* matplotlib's defaults: Debian keeps them here, and
                               mpl-data/matplotlibrc is a symlink to it */
    "/etc/fonts",           /* fontconfig: fc-list (matplotlib), Pillow, cairo */
    "/etc/magic",           /* libmagic's local rules (python3-magic, file) */
    "/etc/magic.mime",      /* and its MIME-type rules */
    "/etc/ssl/certs",       /* CA certificates for ssl.create_default_context() */
    "/etc/ssl/openssl.cnf", /* OpenSSL's configuration (/usr/lib/ssl points here) */
};

enum mop_kind {
    MOP_DIR,      /* mkdir dst (mode); an existing dir is fine */
    MOP_FILE,     /* create dst with data (mode) */
    MOP_SYMLINK,  /* symlink src -> dst */
    MOP_BIND_RO,  /* bind host src at dst, read-only, nosuid, nodev */
    MOP_BIND_DEV, /* bind a host device node at dst as is */
};

struct mount_op {
    enum mop_kind kind;
    bool is_dir;           /* binds: the mountpoint is a directory (else a file) */
    mode_t mode;           /* DIR, FILE */
    const char *data;      /* FILE: static contents */
    char src[OP_PATH_MAX]; /* BIND: host path; SYMLINK: link target */
    char dst[OP_PATH_MAX]; /* path in the new root */
};

struct mount_plan {
    struct mount_op *ops; /* owned */
    size_t n, cap;
};

static int perr(char *err, size_t errlen, int e, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int perr(char *err, size_t errlen, int e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -e;
}

static struct mount_op *add(struct mount_plan *mp, enum mop_kind kind, const char *src,
                            const char *dst)
{
    if (mp->n == mp->cap) {
        size_t cap = mp->cap ? mp->cap * 2 : 32;
        struct mount_op *ops = realloc(mp->ops, cap * sizeof *ops);
        if (!ops)
            return NULL;
        mp->ops = ops;
        mp->cap = cap;
    }
    if ((src && strlen(src) >= OP_PATH_MAX) || strlen(dst) >= OP_PATH_MAX) {
        errno = ENAMETOOLONG;
        return NULL;
    }
    struct mount_op *op = &mp->ops[mp->n++];
    memset(op, 0, sizeof *op);
    op->kind = kind;
    if (src)
        snprintf(op->src, sizeof op->src, "%s", src);
    snprintf(op->dst, sizeof op->dst, "%s", dst);
    return op;
}

static int add_dir(struct mount_plan *mp, const char *dst, mode_t mode)
{
    struct mount_op *op = add(mp, MOP_DIR, NULL, dst);
    if (!op)
        return -errno;
    op->mode = mode;
    return 0;
}

static bool has_dir(const struct mount_plan *mp, const char *dst)
{
    for (size_t i = 0; i < mp->n; i++)
        if (mp->ops[i].kind == MOP_DIR && strcmp(mp->ops[i].dst, dst) == 0)
            return true;
    return false;
}

/* mkdir -p for every parent of path (not path itself) the plan lacks. */
static int add_parents(struct mount_plan *mp, const char *path)
{
    char buf[OP_PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return -ENAMETOOLONG;
    for (char *s = strchr(buf + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        int r = has_dir(mp, buf) ? 0 : add_dir(mp, buf, 0755);
        *s = '/';
        if (r < 0)
            return r;
    }
    return 0;
}

static int add_file(struct mount_plan *mp, const char *dst, const char *data)
{
    struct mount_op *op = add(mp, MOP_FILE, NULL, dst);
    if (!op)
        return -errno;
    op->mode = 0644;
    op->data = data;
    return 0;
}

static int add_symlink(struct mount_plan *mp, const char *target, const char *dst)
{
    return add(mp, MOP_SYMLINK, target, dst) ? 0 : -errno;
}

static int add_bind_ro(struct mount_plan *mp, const char *src, const char *dst, bool is_dir)
{
    struct mount_op *op = add(mp, MOP_BIND_RO, src, dst);
    if (!op)
        return -errno;
    op->is_dir = is_dir;
    return 0;
}

/* A host path that may not exist: a symlink into /usr is recreated as the
 * same symlink (the target is visible through the /usr bind); a file or
 * directory is bound read-only; anything else is skipped. */
static int add_host_entry(struct mount_plan *mp, const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0 : -errno;
    int r = add_parents(mp, path); /* "/etc/ssl/certs" needs /etc/ssl */
    if (r < 0)
        return r;
    if (S_ISLNK(st.st_mode)) {
        char target[OP_PATH_MAX];
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n < 0)
            return -errno;
        target[n] = '\0';
        if (strncmp(target, "/usr/", 5) == 0)
            return add_symlink(mp, target, path);
        if (stat(path, &st) < 0)
            return errno == ENOENT ? 0 : -errno;
    }
    if (S_ISDIR(st.st_mode)) {
        r = add_dir(mp, path, 0755);
        return r < 0 ? r : add_bind_ro(mp, path, path, true);
    }
    if (S_ISREG(st.st_mode))
        return add_bind_ro(mp, path, path, false);
    return 0;
}

static bool path_under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* Absolute, no empty, "." or ".." components, no trailing slash. */
static bool path_clean(const char *p)
{
    if (p[0] != '/' || p[1] == '\0')
        return false;
    for (const char *s = p; *s; ) {
        const char *c = s + 1, *e = strchr(c, '/');
        size_t n = e ? (size_t)(e - c) : strlen(c);
        if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
            return false;
        s = c + n;
    }
    return true;
}

/* Paths the sandbox builds itself; nothing from the host may land there. */
static const char *const reserved_dirs[] = {"/proc", "/dev", "/workspace", "/tmp", "/etc"};

static int check_tools_dir(const char *p, char *err, size_t errlen)
{
    const char *base = strrchr(p, '/');
    if (!path_clean(p) || !base || strcmp(base + 1, "tools") != 0)
        return perr(err, errlen, EINVAL,
                    "tools dir %s: must be a clean absolute path ending in /tools", p);
    for (size_t i = 0; i < sizeof reserved_dirs / sizeof *reserved_dirs; i++)
        if (path_under(p, reserved_dirs[i]))
            return perr(err, errlen, EINVAL, "tools dir %s: inside %s", p, reserved_dirs[i]);
    if (path_under(p, "/usr"))
        return perr(err, errlen, EINVAL, "tools dir %s: inside /usr", p);
    return 0;
}

int mounts_prepare(const struct config *cfg, struct mount_plan **out, char *err, size_t errlen)
{
    int r = check_tools_dir(cfg->tools_dir, err, errlen);
    if (r < 0)
        return r;

    struct mount_plan *mp = calloc(1, sizeof *mp);
    if (!mp)
        return perr(err, errlen, ENOMEM, "out of memory");

#define TRY(expr, ...)                                   \
    do {                                                 \
        r = (expr);                                      \
        if (r < 0) {                                     \
            perr(err, errlen, -r, __VA_ARGS__);          \
            goto fail;                                   \
        }                                                \
    } while (0)

    /* The interpreter, its stdlib and dist-packages, and every shared
     * library live under /usr. */
    TRY(add_dir(mp, "/usr", 0755), "plan /usr");
    TRY(add_bind_ro(mp, "/usr", "/usr", true), "/usr: %s", strerror(-r));

    /* Merged /usr (Debian 12): the top-level lib and bin dirs are symlinks;
     * recreate them. A host that still has real dirs gets read-only binds. */
    static const char *const toplevel[] = {"/bin", "/sbin", "/lib", "/lib32", "/lib64",
                                           "/libx32"};
    for (size_t i = 0; i < sizeof toplevel / sizeof *toplevel; i++) {
        struct stat st;
        if (lstat(toplevel[i], &st) < 0)
            continue;
        if (S_ISLNK(st.st_mode)) {
            char target[OP_PATH_MAX];
            ssize_t n = readlink(toplevel[i], target, sizeof target - 1);
            if (n < 0)
                continue;
            target[n] = '\0';
            TRY(add_symlink(mp, target, toplevel[i]), "plan %s", toplevel[i]);
        } else if (S_ISDIR(st.st_mode)) {
            TRY(add_dir(mp, toplevel[i], 0755), "plan %s", toplevel[i]);
            TRY(add_bind_ro(mp, toplevel[i], toplevel[i], true), "%s: %s", toplevel[i],
                strerror(-r));
        }
    }

    /* A minimal /etc: synthetic identity files, then the reviewed host
     * files of etc_host_files. */
    TRY(add_dir(mp, "/etc", 0755), "plan /etc");
    TRY(add_file(mp, "/etc/passwd", etc_passwd), "plan /etc/passwd");
    TRY(add_file(mp, "/etc/group", etc_group), "plan /etc/group");
    TRY(add_file(mp, "/etc/hosts", etc_hosts), "plan /etc/hosts");
    TRY(add_file(mp, "/etc/hostname", etc_hostname), "plan /etc/hostname");
    TRY(add_file(mp, "/etc/nsswitch.conf", etc_nsswitch), "plan /etc/nsswitch.conf");
    for (size_t i = 0; i < sizeof etc_host_files / sizeof *etc_host_files; i++)
        TRY(add_host_entry(mp, etc_host_files[i]), "%s: %s", etc_host_files[i], strerror(-r));
    struct stat st;
    DIR *d = opendir("/etc");
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            /* /etc/python3.11 (sitecustomize.py) and the like. */
            if (strncmp(de->d_name, "python3", 7) != 0)
                continue;
            char path[OP_PATH_MAX];
            snprintf(path, sizeof path, "/etc/%s", de->d_name);
            r = add_host_entry(mp, path);
            if (r < 0) {
                closedir(d);
                perr(err, errlen, -r, "%s: %s", path, strerror(-r));
                goto fail;
            }
        }
        closedir(d);
    }

    /* Operator-supplied site dirs, read-only at the same path. Those under
     * /usr are visible already. */
    for (unsigned i = 0; i < cfg->n_site_dirs; i++) {
        const char *p = cfg->site_dirs[i];
        if (!path_clean(p))
            TRY(-EINVAL, "site dir %s: not a clean absolute path", p);
        if (stat(p, &st) < 0 || !S_ISDIR(st.st_mode))
            TRY(-(errno ? errno : ENOTDIR), "site dir %s: %s", p,
                strerror(errno ? errno : ENOTDIR));
        if (path_under(p, "/usr"))
            continue;
        for (size_t j = 0; j < sizeof reserved_dirs / sizeof *reserved_dirs; j++)
            if (path_under(p, reserved_dirs[j]) && strcmp(reserved_dirs[j], "/tmp") != 0)
                TRY(-EINVAL, "site dir %s: inside %s", p, reserved_dirs[j]);
        if (path_under(cfg->tools_dir, p) || path_under(p, cfg->tools_dir))
            TRY(-EINVAL, "site dir %s: overlaps the tools dir", p);
        TRY(add_parents(mp, p), "plan %s", p);
        TRY(add_dir(mp, p, 0755), "plan %s", p);
        TRY(add_bind_ro(mp, p, p, true), "site dir %s: %s", p, strerror(-r));
    }

    /* /dev: the harmless nodes only; no tty, no pts, no block devices. */
    static const char *const devs[] = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random",
                                       "/dev/urandom"};
    for (size_t i = 0; i < sizeof devs / sizeof *devs; i++) {
        if (stat(devs[i], &st) < 0 || !S_ISCHR(st.st_mode))
            TRY(-ENODEV, "%s: not a character device on this host", devs[i]);
        struct mount_op *op = add(mp, MOP_BIND_DEV, devs[i], devs[i]);
        if (!op)
            TRY(-errno, "plan %s", devs[i]);
    }
    TRY(add_symlink(mp, "/proc/self/fd", "/dev/fd"), "plan /dev/fd");
    TRY(add_symlink(mp, "/proc/self/fd/0", "/dev/stdin"), "plan /dev/stdin");
    TRY(add_symlink(mp, "/proc/self/fd/1", "/dev/stdout"), "plan /dev/stdout");
    TRY(add_symlink(mp, "/proc/self/fd/2", "/dev/stderr"), "plan /dev/stderr");
#undef TRY

    *out = mp;
    return 0;
fail:
    mounts_free(mp);
    return r;
}

void mounts_free(struct mount_plan *mp)
{
    if (!mp)
        return;
    free(mp->ops);
    free(mp);
}

size_t mounts_len(const struct mount_plan *mp) { return mp ? mp->n : 0; }

/* --- shared helpers ------------------------------------------------------ */

/* What the fork server creates in the root belongs to the sandbox's ids, so
 * that inside it reads as root's, as in any container image; the superblock
 * is read-only for good once built, so owning it allows nothing. Only what
 * was created just now is chowned: an existing path may be a bind. */
struct owner {
    uid_t uid;
    gid_t gid;
};

static int own(int dfd, const char *path, const struct owner *o)
{
    return o ? fchownat(dfd, path, o->uid, o->gid, AT_SYMLINK_NOFOLLOW) : 0;
}

/* mkdir, relative to dfd; an existing directory is fine (and left as it is). */
static int make_dir(int dfd, const char *path, mode_t mode, const struct owner *o)
{
    if (mkdirat(dfd, path, mode) == 0)
        return own(dfd, path, o);
    return errno == EEXIST ? 0 : -1;
}

/* mkdir -p path (absolute, or relative to dfd), parents 0755. */
static int mkdir_p(int dfd, const char *path, mode_t mode, const struct owner *o)
{
    char buf[OP_PATH_MAX + 8];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *s = strchr(buf + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        int r = make_dir(dfd, buf, 0755, o);
        *s = '/';
        if (r < 0)
            return -1;
    }
    return make_dir(dfd, buf, mode, o);
}

/* --- the fork server: the sandbox root, built once ------------------------ */

static int write_file_owned(int root, const char *path, const char *data, mode_t mode,
                            const struct owner *o)
{
    int fd = openat(root, path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0)
        return -1;
    size_t n = strlen(data);
    ssize_t w = write(fd, data, n);
    int r = -1, e = w < 0 ? errno : EIO; /* a short write: EIO */
    if (w == (ssize_t)n) {
        r = fchown(fd, o->uid, o->gid);
        e = errno;
    }
    close(fd);
    errno = e;
    return r;
}

/* One operation of the plan, inside the new root (root: its directory fd).
 * tree: for a bind, the detached copy of its source (see mounts_build). */
static int build_op(int root, const struct mount_op *op, int tree, const struct owner *o)
{
    const char *dst = op->dst + 1; /* "/etc/passwd" -> "etc/passwd", relative to root */
    switch (op->kind) {
    case MOP_DIR:
        return make_dir(root, dst, op->mode, o);
    case MOP_FILE:
        return write_file_owned(root, dst, op->data, op->mode, o);
    case MOP_SYMLINK:
        return symlinkat(op->src, root, dst) < 0 ? -1 : own(root, dst, o);
    case MOP_BIND_RO:
    case MOP_BIND_DEV:
        /* The mountpoint's owner is hidden under the bind. */
        if (op->is_dir) {
            if (make_dir(root, dst, 0755, NULL) < 0)
                return -1;
        } else {
            int fd = openat(root, dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0444);
            if (fd < 0)
                return -1;
            close(fd);
        }
        return move_mount(tree, "", root, dst, MOVE_MOUNT_F_EMPTY_PATH);
    }
    errno = EINVAL;
    return -1;
}

/* Where the root goes: over /tmp, in the fork server's own namespace only.
 * The fork server needs no /tmp once the interpreter has started. */
#define ROOT_AT "/tmp"

int mounts_build(const struct config *cfg, const struct mount_plan *mp, char *err,
                 size_t errlen)
{
    if (unshare(CLONE_NEWNS) < 0)
        return perr(err, errlen, errno, "unshare(CLONE_NEWNS): %s", strerror(errno));
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        return perr(err, errlen, errno, "make-rprivate /: %s", strerror(errno));

    int *tree = malloc((mp->n ? mp->n : 1) * sizeof *tree);
    if (!tree)
        return perr(err, errlen, ENOMEM, "out of memory");
    for (size_t i = 0; i < mp->n; i++)
        tree[i] = -1;
    int r = 0, root = -1;

    /* Every bind source first, as a detached copy of its mount (not
     * recursive: submounts of a bound host dir stay hidden): the root is
     * about to cover /tmp, where a site dir may live. */
    for (size_t i = 0; i < mp->n && r == 0; i++) {
        const struct mount_op *op = &mp->ops[i];
        if (op->kind != MOP_BIND_RO && op->kind != MOP_BIND_DEV)
            continue;
        tree[i] = open_tree(AT_FDCWD, op->src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (tree[i] < 0) {
            r = perr(err, errlen, errno, "open_tree %s: %s", op->src, strerror(errno));
            break;
        }
        struct mount_attr ro = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID |
                                            MOUNT_ATTR_NODEV};
        if (op->kind == MOP_BIND_RO &&
            mount_setattr(tree[i], "", AT_EMPTY_PATH, &ro, sizeof ro) < 0)
            r = perr(err, errlen, errno, "read-only %s: %s", op->src, strerror(errno));
    }
    if (r < 0)
        goto out;

    if (mount("tmpfs", ROOT_AT, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "mode=0755,size=1m,nr_inodes=4096") < 0) {
        r = perr(err, errlen, errno, "mount the root tmpfs on " ROOT_AT ": %s", strerror(errno));
        goto out;
    }
    root = open(ROOT_AT, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) {
        r = perr(err, errlen, errno, "open " ROOT_AT ": %s", strerror(errno));
        goto out;
    }
    const struct owner o = {.uid = cfg->sandbox_uid, .gid = cfg->sandbox_gid};
    if (fchownat(root, "", o.uid, o.gid, AT_EMPTY_PATH) < 0) {
        r = perr(err, errlen, errno, "chown the root: %s", strerror(errno));
        goto out;
    }
    /* The mountpoints of what every sandbox mounts for itself. */
    static const struct {
        const char *path;
        mode_t mode;
    } points[] = {{"workspace", 0755}, {"tmp", 0755}, {"dev", 0755}, {"dev/shm", 0755},
                  {"proc", 0555}};
    for (size_t i = 0; i < sizeof points / sizeof *points; i++)
        if (make_dir(root, points[i].path, points[i].mode, &o) < 0) {
            r = perr(err, errlen, errno, "mkdir %s: %s", points[i].path, strerror(errno));
            goto out;
        }
    if (mkdir_p(root, cfg->tools_dir + 1, 0755, &o) < 0) {
        r = perr(err, errlen, errno, "mkdir %s: %s", cfg->tools_dir, strerror(errno));
        goto out;
    }
    for (size_t i = 0; i < mp->n; i++)
        if (build_op(root, &mp->ops[i], tree[i], &o) < 0) {
            r = perr(err, errlen, errno, "%s: %s", mp->ops[i].dst, strerror(errno));
            goto out;
        }
    /* Read-only for good: the superblock and our mount of it. */
    if (mount(NULL, ROOT_AT, NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
              NULL) < 0)
        r = perr(err, errlen, errno, "remount the root read-only: %s", strerror(errno));
out:
    if (root >= 0)
        close(root);
    for (size_t i = 0; i < mp->n; i++)
        if (tree[i] >= 0)
            close(tree[i]);
    free(tree);
    return r;
}

/* --- child side: no allocation, no stdio beyond snprintf into what --- */

static int cfail(char *what, size_t whatlen, const char *op, const char *path)
{
    int e = errno ? errno : EIO;
    snprintf(what, whatlen, "%s %s", op, path);
    return -e;
}

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

/* The scratch tmpfs, mounted on /proc for now: its three directories bound
 * at /workspace, /tmp and /dev/shm. */
static int scratch_binds(const struct config *cfg, char *what, size_t whatlen)
{
    static const struct {
        const char *src, *dst;
        mode_t mode;
    } scratch[] = {
        {"/proc/workspace", "/workspace", 0755},
        {"/proc/tmp", "/tmp", 01777},
        {"/proc/shm", "/dev/shm", 01777},
    };
    for (size_t i = 0; i < sizeof scratch / sizeof *scratch; i++)
        /* chmod after mkdir: the umask must not eat the sticky bit. */
        if (mkdir(scratch[i].src, 0700) < 0 || chmod(scratch[i].src, scratch[i].mode) < 0)
            return cfail(what, whatlen, "mkdir", scratch[i].src);
    /* A site dir under /tmp is in the root at /tmp/..., which the scratch is
     * about to cover: bind it again inside the scratch's tmp (hence the
     * recursive binds below). */
    for (unsigned i = 0; i < cfg->n_site_dirs; i++) {
        const char *p = cfg->site_dirs[i];
        char in_scratch[OP_PATH_MAX + 8];
        if (!path_under(p, "/tmp"))
            continue;
        snprintf(in_scratch, sizeof in_scratch, "/proc%s", p);
        if (mkdir_p(AT_FDCWD, in_scratch, 0755, NULL) < 0 ||
            mount(p, in_scratch, NULL, MS_BIND, NULL) < 0)
            return cfail(what, whatlen, "bind site dir", p);
    }
    for (size_t i = 0; i < sizeof scratch / sizeof *scratch; i++)
        if (mount(scratch[i].src, scratch[i].dst, NULL, MS_BIND | MS_REC, NULL) < 0)
            return cfail(what, whatlen, "bind", scratch[i].dst);
    return 0;
}

int mounts_setup(const struct config *cfg, int *tools_fd, char *what, size_t whatlen)
{
    *tools_fd = -1;

    /* 1. Our copy of the fork server's mounts is private already (it made
     * its namespace so); cheap insurance before mounting anything. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        return cfail(what, whatlen, "make-rprivate", "/");

    /* 2. A mount of the prepared root that is ours: the copy that came
     * with our namespace is locked to the old root (pivot_root refuses
     * it); a recursive bind brings its read-only binds along, still locked. */
    if (mount(ROOT_AT, ROOT_AT, NULL, MS_BIND | MS_REC, NULL) < 0)
        return cfail(what, whatlen, "bind the root", ROOT_AT);

    /* 3. pivot_root(".", "."): the old root ends up stacked on the new one,
     * until step 7; "/" and "." already resolve in the new root. */
    if (chdir(ROOT_AT) < 0)
        return cfail(what, whatlen, "chdir", ROOT_AT);
    if (syscall(SYS_pivot_root, ".", ".") < 0)
        return cfail(what, whatlen, "pivot_root", ROOT_AT);

    /* 4. One tmpfs for everything user code may write, so tmpfs_size bounds
     * the sum. /proc is the scratch's mountpoint until step 6 (the root is
     * read-only: it has no spare directory), then it is detached from there. */
    if (tmpfs_on("/proc", cfg->tmpfs_size, 0) < 0)
        return cfail(what, whatlen, "mount tmpfs", "scratch");
    int r = scratch_binds(cfg, what, whatlen);
    if (r < 0)
        return r;
    if (umount2("/proc", MNT_DETACH) < 0)
        return cfail(what, whatlen, "detach", "scratch");

    /* 5. /tools: read-only for user code; the runtime extracts the tools
     * archive through the fd, then closes it, and the writable mount is
     * gone with it. Also on /proc for a moment. */
    uint64_t tsize = cfg->max_unpacked ? cfg->max_unpacked + 4 * 1024 * 1024 : 0;
    uint64_t tinodes = cfg->max_members ? cfg->max_members + 64 : 0;
    if (tmpfs_on("/proc", tsize, tinodes) < 0)
        return cfail(what, whatlen, "mount tmpfs", cfg->tools_dir);
    int fd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return cfail(what, whatlen, "open", cfg->tools_dir);
    if (mount("/proc", cfg->tools_dir, NULL, MS_BIND, NULL) < 0 ||
        mount(NULL, cfg->tools_dir, NULL,
              MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0 ||
        umount2("/proc", MNT_DETACH) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return cfail(what, whatlen, "bind read-only", cfg->tools_dir);
    }

    /* 6. Our pid namespace's proc (the old root's proc, still in our
     * namespace, makes this permitted: see the comment at the top). No
     * hidepid needed: only our own processes are in this pid namespace. */
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return cfail(what, whatlen, "mount", "/proc");
    }

    /* 7. Lazily detach the whole host tree: the mount on top of "." is the
     * old root. The new root was read-only from the start. */
    if (umount2(".", MNT_DETACH) < 0 || chdir("/") < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return cfail(what, whatlen, "detach", "the old root");
    }
    *tools_fd = fd;
    return 0;
}
