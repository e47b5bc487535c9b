/* Runs in the fork server (mounts_prepare, mounts_build: once, at start):
 * the sandbox's filesystem (see mounts.h); a sandbox child enters it with
 * mounts_enter (mounts_enter.c, its step 3).
 *
 * The root is built once, in the fork server (mounts_build), in a mount
 * namespace of its own:
 *   a small tmpfs over /tmp (there, in that namespace only) holding the
 *   synthetic /etc files, the merged-/usr symlinks, the mountpoints, the
 *   replacements of host-wide /proc files (in its own /proc directory, which
 *   every sandbox's proc mount covers), and read-only, nosuid, nodev binds
 *   of /usr, the chosen /etc files, the site dirs and the /dev nodes; then
 *   read-only, superblock and mount.
 * Every bind source is cloned (open_tree) before the tmpfs covers /tmp, so a
 * site dir under /tmp is bound too. The decisions about the host (which files
 * exist, which are directories) were made before, by mounts_prepare(). From
 * that namespace the fork server makes the template every sandbox's is a
 * copy of (mounts_template.c): pivoted into the root, the host's tree
 * detached, a hidden proc kept at /dev/shm.
 *
 * Order in the child (mounts_enter), each step relying on the one before:
 *   1. make every mount private: nothing below propagates anywhere; the
 *      root is already the prepared one, and nothing of the host is there;
 *   2. one size-limited "scratch" tmpfs, bound at /workspace, /tmp and
 *      /dev/shm, so cfg->tmpfs_size caps the three together (site dirs under
 *      /tmp bound again inside it); mounted on /dev/shm, whose bind then
 *      covers the scratch's root (both cover the template's proc);
 *   3. /tools: a tmpfs whose only writable path is an fd; the visible path
 *      is a read-only bind of it over itself (2 and 3 unmount nothing: an
 *      unmount waits for an RCU grace period);
 *   4. a fresh proc (the kernel lets a user namespace mount proc only while
 *      a fully visible proc is in its mount namespace: the template's hidden
 *      one), first at /workspace, where its host-wide files are covered by
 *      read-only binds of the root's replacements (proc_entries; their path,
 *      the root's /proc directory, is still uncovered), then moved to /proc
 *      with its covers.
 * A sandbox thus makes 10 mount calls plus one per covered /proc entry (19 on
 * this kernel), no unmount and no directory or file outside its scratch;
 * building the root itself (some 40 mount calls, 25 directories, 5 files and
 * 9 symlinks) was most of a sandbox's filesystem set-up.
 *
 * One job in one file (~1,000 lines): making the root, in two halves run
 * once, one after the other, in the fork server. The plan (mounts_prepare:
 * which host files exist, the /proc replacements, the tools directory) is
 * what the build (mounts_build) carries out and nothing else reads; the
 * child's half is already apart (mounts_enter.c, through mounts_int.h). */
#include "sandbox/mounts.h"
#include "sandbox/mounts_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/util.h"
#include "core/limits.h"


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

/* --- /proc: what a sandbox sees of the host's ---------------------------
 *
 * A fresh proc instance lists the sandbox's own processes, but its
 * system-wide files are the host's: they move with the host's and every other
 * turn's activity (a channel between sandboxes: one turn's tmpfs use shows in
 * another's /proc/meminfo, its load in /proc/stat, its open files in
 * file-nr) or show the host's configuration. The entries below are covered,
 * read-only, in every sandbox by a bind of a file the fork server made once:
 * synthetic text (proc_text: what programs read, consistent with the turn's
 * limits) or an empty file or directory.
 *
 * Each entry costs every fresh sandbox one bind mount (~10 us of CPU on the
 * 2-vCPU VM, against ~3.4 ms for a one-block turn), so the list holds the
 * files another turn can move or that leak the host's configuration, not
 * every host-wide file: what stays readable, and why, is in docs/security.md ("What
 * a sandbox can still see"). Entries the host kernel lacks, and files only
 * host root may read (mode 0400: no sandbox can open them), are skipped. */
enum proc_kind {
    PROC_TEXT,      /* synthetic contents (proc_text) */
    PROC_EMPTY,     /* an empty file */
    PROC_EMPTY_DIR, /* an empty directory */
};

static const struct proc_entry {
    const char *path; /* under /proc */
    enum proc_kind kind;
} proc_entries[] = {
    /* Synthetic: the turn's memory limit, its CPU quota's CPUs, no load. */
    {"meminfo", PROC_TEXT},       /* host memory, every turn's tmpfs and page cache */
    {"stat", PROC_TEXT},          /* CPU times, forks, context switches of the host;
                                     glibc counts its cpuN lines for get_nprocs()
                                     (os.cpu_count) when /sys is absent, as here */
    {"cpuinfo", PROC_TEXT},       /* one block per host CPU, "cpu MHz" following
                                     load where frequency scales: trimmed to the
                                     quota's CPUs, as read at start */
    {"loadavg", PROC_TEXT},       /* the host's run queue */
    {"uptime", PROC_TEXT},        /* idle time summed over the host's CPUs */
    {"cmdline", PROC_TEXT},       /* the host kernel's command line (root device,
                                     on some clouds tokens) */
    /* Empty: host-wide counters that other turns move, which programs do
     * not need. */
    {"vmstat", PROC_EMPTY},       /* paging, reclaim and allocation counters */
    {"zoneinfo", PROC_EMPTY},     /* free and used pages per memory zone */
    {"buddyinfo", PROC_EMPTY},    /* free pages per order */
    {"pagetypeinfo", PROC_EMPTY}, /* the same by migrate type (0400 since 5.6) */
    {"diskstats", PROC_EMPTY},    /* disk I/O: other turns' page cache misses */
    {"interrupts", PROC_EMPTY},   /* per-CPU interrupt counts (timer ticks: load) */
    {"softirqs", PROC_EMPTY},     /* per-CPU softirq counts */
    {"schedstat", PROC_EMPTY},    /* per-CPU run and wait times (CONFIG_SCHEDSTATS) */
    {"locks", PROC_EMPTY},        /* every file lock on the host: a turn locking a
                                     file of its own signals every other turn */
    {"pressure", PROC_EMPTY_DIR}, /* PSI: CPU, memory and I/O stalls of the host */
    {"sys/fs/file-nr", PROC_EMPTY},      /* files open on the host: any open() */
    {"sys/fs/inode-nr", PROC_EMPTY},     /* inodes in use: any file created */
    {"sys/fs/inode-state", PROC_EMPTY},  /* the same, longer */
    {"sys/fs/dentry-state", PROC_EMPTY}, /* the dentry cache: any path looked up */
};

#define PROC_ENTRIES_MAX (sizeof proc_entries / sizeof *proc_entries)
_Static_assert(PROC_ENTRIES_MAX <= MOUNTS_COVERS_MAX, "mount_plan.covers holds every proc entry");
/* Where the replacements live: the root's own /proc directory, under every
 * sandbox's proc mount once that is in place (see mounts_enter, step 6). */
#define PROC_SRC "/proc"
#define PROC_EMPTY_FILE_NAME ".empty"
#define PROC_EMPTY_DIR_NAME ".empty-dir"

static struct mount_op *add(struct mount_plan *mp, enum mop_kind kind, const char *src,
                            const char *dst)
{
    int r = GROW_ARRAY(mp->ops, &mp->cap, mp->n + 1, 32, SIZE_MAX);
    if (r < 0) {
        errno = -r;
        return NULL;
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
    op->len = strlen(data);
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

/* The first max bytes of a host file, NUL-terminated (for text), malloc'd;
 * *len is how many were read, *whole whether that was all of it. NULL with
 * errno set on failure. */
static char *read_host_file(const char *path, size_t max, size_t *len, bool *whole)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return NULL;
    size_t cap = 16384, n = 0;
    char *buf = malloc(cap + 1);
    *whole = false;
    while (buf) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            errno = e;
            return NULL;
        }
        if (r == 0) {
            *whole = true;
            break;
        }
        n += (size_t)r;
        if (n == cap) {
            if (cap >= max)
                break;
            cap = cap * 2 > max ? max : cap * 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    if (!buf) {
        errno = ENOMEM;
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* A host path that may not exist: a symlink into /usr is recreated as the
 * same symlink (the target is visible through the /usr bind); a small
 * world-readable file is copied into the root, any other file or a
 * directory is bound read-only; anything else is skipped. A copy costs a sandbox nothing, a
 * bind two mounts to copy and one to detach; either shows the file as it
 * was when forkboxd started (dpkg replaces files, which a bind does not
 * follow either). */
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
    if (!S_ISREG(st.st_mode))
        return 0;
    /* Only what anyone may read: a copy belongs to the sandbox's root. */
    if (st.st_size <= (off_t)SBX_ETC_COPY_MAX && (st.st_mode & S_IROTH)) {
        size_t len;
        bool whole;
        char *data = read_host_file(path, SBX_ETC_COPY_MAX, &len, &whole);
        if (!data)
            return errno == ENOENT ? 0 : -errno;
        if (whole) {
            r = add_file(mp, path, data);
            if (r < 0) {
                free(data);
                return r;
            }
            mp->ops[mp->n - 1].owned = data;
            mp->ops[mp->n - 1].len = len;
            mp->ops[mp->n - 1].mode = st.st_mode & 0755;
            return 0;
        }
        free(data); /* grew while we read: bind it */
    }
    return add_bind_ro(mp, path, path, false);
}

bool mounts_path_under(const char *path, const char *dir)
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

/* stream: `forkbox sandbox`'s host tools dir, which may live under /tmp
 * (bound again inside the scratch, as a site dir there is). */
static int check_tools_dir(const char *p, bool stream, char *err, size_t errlen)
{
    const char *base = strrchr(p, '/');
    if (!path_clean(p) || !base || strcmp(base + 1, "tools") != 0)
        return err_fmt(err, errlen, -EINVAL,
                    "tools dir %s: must be a clean absolute path ending in /tools", p);
    for (size_t i = 0; i < sizeof reserved_dirs / sizeof *reserved_dirs; i++)
        if (mounts_path_under(p, reserved_dirs[i]) &&
            !(stream && strcmp(reserved_dirs[i], "/tmp") == 0))
            return err_fmt(err, errlen, -EINVAL, "tools dir %s: inside %s", p, reserved_dirs[i]);
    if (mounts_path_under(p, "/usr"))
        return err_fmt(err, errlen, -EINVAL, "tools dir %s: inside /usr", p);
    return 0;
}

/* What the synthetic /proc files are made from, read once from the host. */
struct proc_facts {
    uint64_t mem_kb;      /* the turn's memory limit, at most the host's RAM */
    unsigned ncpu;        /* CPUs the quota amounts to, at most those we may run on */
    long long btime;      /* the host's boot time (/proc/stat), seconds since the epoch */
    double uptime;        /* seconds since boot when forkboxd started */
    char *cpuinfo;        /* the host's /proc/cpuinfo, owned; NULL if unreadable */
};

static void proc_facts_read(const struct config *cfg, struct proc_facts *f)
{
    memset(f, 0, sizeof *f);
    struct sysinfo si;
    uint64_t host_kb = sysinfo(&si) == 0 ? (uint64_t)si.totalram * si.mem_unit / 1024 : 0;
    uint64_t limit_kb = cfg->memory_max / 1024;
    f->mem_kb = limit_kb && (!host_kb || limit_kb < host_kb) ? limit_kb : host_kb;

    /* The quota in whole CPUs, rounded up: --cpu 1500 lets a turn run 1.5
     * CPUs' worth of time, so two threads have work to do. */
    cpu_set_t set;
    unsigned avail = sched_getaffinity(0, sizeof set, &set) == 0 ? (unsigned)CPU_COUNT(&set) : 1;
    unsigned quota = cfg->cpu_millis ? (unsigned)((cfg->cpu_millis + 999) / 1000) : avail;
    f->ncpu = quota < avail ? quota : avail;
    if (f->ncpu == 0)
        f->ncpu = 1;

    struct timespec now, boot;
    clock_gettime(CLOCK_REALTIME, &now);
    clock_gettime(CLOCK_BOOTTIME, &boot);
    f->uptime = (double)boot.tv_sec + boot.tv_nsec / 1e9;
    f->btime = (long long)(now.tv_sec - boot.tv_sec);
    size_t len;
    bool whole;
    char *stat = read_host_file("/proc/stat", SBX_PROC_HOST_TEXT_MAX, &len, &whole);
    const char *b = stat ? strstr(stat, "\nbtime ") : NULL;
    if (b)
        f->btime = strtoll(b + 7, NULL, 10);
    free(stat);
    /* Cut at a block boundary later if it was longer. */
    f->cpuinfo = read_host_file("/proc/cpuinfo", SBX_PROC_HOST_TEXT_MAX, &len, &whole);
}

/* The synthetic contents of /proc/<name>, malloc'd; NULL on ENOMEM. Fixed
 * for the daemon's lifetime: the same limits apply to every turn, and a file
 * that moved would be a channel again. */
static char *proc_text(const char *name, const struct proc_facts *f)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m)
        return NULL;
    if (strcmp(name, "meminfo") == 0) {
        /* The fields free(1), psutil and the JVM read. Nothing used yet as
         * far as this file knows; the cgroup enforces the real limit. */
        static const char *const zero[] = {
            "Buffers", "Cached", "SwapCached", "Active", "Inactive", "Active(anon)",
            "Inactive(anon)", "Active(file)", "Inactive(file)", "Unevictable", "Mlocked",
            "SwapTotal", "SwapFree", "Dirty", "Writeback", "AnonPages", "Mapped", "Shmem",
            "KReclaimable", "Slab", "SReclaimable", "SUnreclaim", "KernelStack", "PageTables",
        };
        fprintf(m, "%-15s %8" PRIu64 " kB\n", "MemTotal:", f->mem_kb);
        fprintf(m, "%-15s %8" PRIu64 " kB\n", "MemFree:", f->mem_kb);
        fprintf(m, "%-15s %8" PRIu64 " kB\n", "MemAvailable:", f->mem_kb);
        for (size_t i = 0; i < sizeof zero / sizeof *zero; i++) {
            char label[32];
            snprintf(label, sizeof label, "%s:", zero[i]);
            fprintf(m, "%-15s %8d kB\n", label, 0);
        }
        fprintf(m, "%-15s %8" PRIu64 " kB\n", "CommitLimit:", f->mem_kb);
        fprintf(m, "%-15s %8d kB\n", "Committed_AS:", 0);
        fprintf(m, "HugePages_Total:       0\nHugePages_Free:        0\n"
                   "HugePages_Rsvd:        0\nHugePages_Surp:        0\n");
    } else if (strcmp(name, "stat") == 0) {
        fprintf(m, "cpu  0 0 0 0 0 0 0 0 0 0\n");
        for (unsigned i = 0; i < f->ncpu; i++)
            fprintf(m, "cpu%u 0 0 0 0 0 0 0 0 0 0\n", i);
        fprintf(m, "intr 0\nctxt 0\nbtime %lld\nprocesses 0\nprocs_running 1\n"
                   "procs_blocked 0\nsoftirq 0 0 0 0 0 0 0 0 0 0 0\n", f->btime);
    } else if (strcmp(name, "cpuinfo") == 0) {
        /* The first ncpu blocks ("processor : 0" ...), each ending in a
         * blank line, as the kernel prints them. */
        const char *p = f->cpuinfo ? f->cpuinfo : "", *end = p;
        for (unsigned i = 0; i < f->ncpu && *end; i++) {
            const char *blank = strstr(end, "\n\n");
            if (!blank)
                break;
            end = blank + 2;
        }
        fwrite(p, 1, (size_t)(end - p), m);
    } else if (strcmp(name, "loadavg") == 0) {
        fprintf(m, "0.00 0.00 0.00 1/1 1\n");
    } else if (strcmp(name, "uptime") == 0) {
        fprintf(m, "%.2f 0.00\n", f->uptime);
    } else if (strcmp(name, "cmdline") == 0) {
        fprintf(m, "\n");
    }
    if (fclose(m) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* The /proc part of the plan: the replacements as files of the root's
 * PROC_SRC directory, and the covers the child binds over its fresh proc. */
static int plan_proc(const struct config *cfg, struct mount_plan *mp, char *err, size_t errlen)
{
    struct proc_facts f;
    proc_facts_read(cfg, &f);
    int r = 0;
    bool need_file = false, need_dir = false;
    for (size_t i = 0; i < PROC_ENTRIES_MAX && r == 0; i++) {
        const struct proc_entry *e = &proc_entries[i];
        struct proc_cover *c = &mp->covers[mp->n_covers];
        char host[sizeof "/proc/" + sizeof c->target];
        struct stat st;
        if (snprintf(c->target, sizeof c->target, "%s", e->path) >= (int)sizeof c->target) {
            r = err_fmt(err, errlen, -ENAMETOOLONG, "plan /proc/%s", e->path);
            break;
        }
        snprintf(host, sizeof host, "/proc/%s", c->target);
        if (stat(host, &st) < 0)
            continue; /* not on this kernel */
        if (S_ISREG(st.st_mode) && !(st.st_mode & S_IROTH))
            continue; /* only host root may read it, and no sandbox is */
        mp->n_covers++;
        if (e->kind == PROC_TEXT) {
            snprintf(c->source, sizeof c->source, PROC_SRC "/%s", e->path);
            char *text = proc_text(e->path, &f);
            if (!text || add_file(mp, c->source, text) < 0) {
                free(text);
                r = err_fmt(err, errlen, -ENOMEM, "plan %s", c->source);
                break;
            }
            mp->ops[mp->n - 1].owned = text;
            mp->ops[mp->n - 1].mode = 0444;
        } else if (e->kind == PROC_EMPTY) {
            snprintf(c->source, sizeof c->source, PROC_SRC "/" PROC_EMPTY_FILE_NAME);
            need_file = true;
        } else {
            snprintf(c->source, sizeof c->source, PROC_SRC "/" PROC_EMPTY_DIR_NAME);
            need_dir = true;
        }
    }
    if (r == 0 && need_file && add_file(mp, PROC_SRC "/" PROC_EMPTY_FILE_NAME, "") < 0)
        r = err_fmt(err, errlen, -ENOMEM, "plan the empty file");
    if (r == 0 && need_file)
        mp->ops[mp->n - 1].mode = 0444;
    if (r == 0 && need_dir && add_dir(mp, PROC_SRC "/" PROC_EMPTY_DIR_NAME, 0555) < 0)
        r = err_fmt(err, errlen, -ENOMEM, "plan the empty directory");
    free(f.cpuinfo);
    return r;
}

/* Stream mode (`forkbox sandbox`, cfg->workdir set): the host's workdir,
 * read-write through its FUSE server (hostfs.h: the mount comes from
 * mounts_set_workspace), and its tools dir, read-only, each at its own
 * path. The
 * workdir may be /workspace itself (then it replaces the scratch's) or lie
 * under /tmp (bound again inside the scratch's, mounts_enter), nowhere else
 * the sandbox builds for itself, and not under /usr (the interpreter's). */
static int plan_stream(const struct config *cfg, struct mount_plan *mp, char *err, size_t errlen)
{
    const char *w = cfg->workdir, *t = cfg->tools_dir;
    struct stat st;
    if (!path_clean(w))
        return err_fmt(err, errlen, -EINVAL, "workdir %s: not a clean absolute path", w);
    for (size_t i = 0; i < sizeof reserved_dirs / sizeof *reserved_dirs; i++)
        if (mounts_path_under(w, reserved_dirs[i]) && strcmp(reserved_dirs[i], "/tmp") != 0 &&
            strcmp(w, "/workspace") != 0)
            return err_fmt(err, errlen, -EINVAL, "workdir %s: inside %s", w, reserved_dirs[i]);
    if (mounts_path_under(w, "/usr") || strcmp(w, "/tmp") == 0)
        return err_fmt(err, errlen, -EINVAL, "workdir %s: not a place for it", w);
    if (mounts_path_under(w, t) || mounts_path_under(t, w))
        return err_fmt(err, errlen, -EINVAL, "workdir %s: overlaps the tools dir %s", w, t);
    for (unsigned i = 0; i < cfg->n_site_dirs; i++)
        if (mounts_path_under(w, cfg->site_dirs[i]) || mounts_path_under(cfg->site_dirs[i], w))
            return err_fmt(err, errlen, -EINVAL, "workdir %s: overlaps a site dir", w);
    if (stat(w, &st) < 0 || !S_ISDIR(st.st_mode))
        return err_fmt(err, errlen, -(errno ? errno : ENOTDIR), "workdir %s: %s", w,
                       strerror(errno ? errno : ENOTDIR));
    if (stat(t, &st) < 0 || !S_ISDIR(st.st_mode))
        return err_fmt(err, errlen, -(errno ? errno : ENOTDIR), "tools dir %s: %s", t,
                       strerror(errno ? errno : ENOTDIR));
    int r = add_parents(mp, w);
    struct mount_op *op = r < 0 ? NULL : add(mp, MOP_BIND_RW, w, w);
    if (!op)
        return err_fmt(err, errlen, r < 0 ? r : -errno, "plan the workdir %s", w);
    op->is_dir = true;
    if ((r = add_parents(mp, t)) < 0 || (r = add_bind_ro(mp, t, t, true)) < 0)
        return err_fmt(err, errlen, r, "plan the tools dir %s", t);
    return 0;
}

int mounts_prepare(const struct config *cfg, struct mount_plan **out, char *err, size_t errlen)
{
    int r = check_tools_dir(cfg->tools_dir, cfg->workdir[0] != '\0', err, errlen);
    if (r < 0)
        return r;

    struct mount_plan *mp = calloc(1, sizeof *mp);
    if (!mp)
        return err_fmt(err, errlen, -ENOMEM, "out of memory");
    mp->work_tree = -1;
    mp->tmpl_ns = mp->home_ns = mp->home_cwd = -1;

#define TRY(expr, ...)                                   \
    do {                                                 \
        r = (expr);                                      \
        if (r < 0) {                                     \
            err_fmt(err, errlen, r, __VA_ARGS__);          \
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
                err_fmt(err, errlen, r, "%s: %s", path, strerror(-r));
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
        if (mounts_path_under(p, "/usr"))
            continue;
        for (size_t j = 0; j < sizeof reserved_dirs / sizeof *reserved_dirs; j++)
            if (mounts_path_under(p, reserved_dirs[j]) && strcmp(reserved_dirs[j], "/tmp") != 0)
                TRY(-EINVAL, "site dir %s: inside %s", p, reserved_dirs[j]);
        if (mounts_path_under(cfg->tools_dir, p) || mounts_path_under(p, cfg->tools_dir))
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

    if (cfg->workdir[0] && (r = plan_stream(cfg, mp, err, errlen)) < 0)
        goto fail;
    r = plan_proc(cfg, mp, err, errlen);
    if (r < 0)
        goto fail;

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
    mounts_set_workspace(mp, -1);
    close_and_reset(&mp->tmpl_ns);
    close_and_reset(&mp->home_ns);
    close_and_reset(&mp->home_cwd);
    for (size_t i = 0; i < mp->n; i++)
        free(mp->ops[i].owned);
    free(mp->ops);
    free(mp);
}

size_t mounts_len(const struct mount_plan *mp) { return mp ? mp->n : 0; }

/* --- shared helpers ------------------------------------------------------ */

/* What the fork server creates in the root (the tmpfs itself, the synthetic
 * /etc files, the mountpoints) is owned by host root, like /usr. Every
 * sandbox has a host id of its own, and the root is built once for all of
 * them, so no owner could read as root in each; inside, root-owned files
 * read as nobody (the overflow id), as /usr always did. Nothing is lost: the
 * root is read-only for good once built, and what a sandbox must own
 * (/workspace, /tmp, /dev/shm, /tools) is on tmpfs mounts it makes itself.
 * An idmapped mount of the root tmpfs (not of the /usr binds: that would
 * give sandbox root the owner bits of root's files) could make "/" read as
 * root's again, at the price of a tree copy, an idmap and an fd passed to
 * every sandbox by the fork server (open_tree of this root plus the idmap:
 * ~65 us, measured, moved into the fork server's serial path), with this as
 * the fallback anyway for kernels before 6.3 (Debian 12 runs 6.1), whose
 * tmpfs cannot be idmapped. */

/* mkdir, relative to dfd; an existing directory is fine (and left as it is). */
static int make_dir(int dfd, const char *path, mode_t mode)
{
    if (mkdirat(dfd, path, mode) == 0)
        return 0;
    return errno == EEXIST ? 0 : -1;
}

/* mkdir -p path (absolute, or relative to dfd), parents 0755. */
int mounts_mkdir_p(int dfd, const char *path, mode_t mode)
{
    char buf[OP_PATH_MAX + 8];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *s = strchr(buf + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        int r = make_dir(dfd, buf, 0755);
        *s = '/';
        if (r < 0)
            return -1;
    }
    return make_dir(dfd, buf, mode);
}

/* --- the fork server: the sandbox root, built once ------------------------ */

static int write_file(int root, const char *path, const char *data, size_t n, mode_t mode)
{
    int fd = openat(root, path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0)
        return -1;
    ssize_t w = write(fd, data, n);
    int e = w < 0 ? errno : EIO; /* a short write: EIO */
    close(fd);
    if (w == (ssize_t)n)
        return 0;
    errno = e;
    return -1;
}

void mounts_set_workspace(struct mount_plan *mp, int tree)
{
    if (mp->work_tree >= 0)
        close(mp->work_tree);
    mp->work_tree = tree;
}

int mounts_make_workdir(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (!path_clean(path))
        return err_fmt(err, errlen, -EINVAL, "workdir %s: not a clean absolute path", path);
    if (stat(path, &st) == 0)
        return S_ISDIR(st.st_mode) ? 0 : err_fmt(err, errlen, -ENOTDIR, "workdir %s: %s", path,
                                                 strerror(ENOTDIR));
    if (mounts_mkdir_p(AT_FDCWD, path, 0755) < 0)
        return err_fmt(err, errlen, -errno, "mkdir workdir %s: %s", path, strerror(errno));
    return 0;
}

/* One operation of the plan, inside the new root (root: its directory fd).
 * tree: for a bind, the detached copy of its source (see mounts_build). */
static int build_op(int root, const struct mount_op *op, int tree)
{
    const char *dst = op->dst + 1; /* "/etc/passwd" -> "etc/passwd", relative to root */
    switch (op->kind) {
    case MOP_DIR:
        return make_dir(root, dst, op->mode);
    case MOP_FILE:
        return write_file(root, dst, op->data, op->len, op->mode);
    case MOP_SYMLINK:
        return symlinkat(op->src, root, dst);
    case MOP_BIND_RO:
    case MOP_BIND_DEV:
    case MOP_BIND_RW:
        if (op->is_dir) {
            if (make_dir(root, dst, 0755) < 0)
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

/* "\040" in a mountinfo field is a space, and so on: decode in place. */
static void unescape_octal(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
            r[3] >= '0' && r[3] <= '7') {
            *w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
            r += 3;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

/* Detach from our namespace every host mount that neither we nor a sandbox
 * need: our namespace no longer holds (pins) host filesystems we never use,
 * and the template (mounts_template.c) has that much less to copy and
 * detach, once. What stays: "/", the host's proc (we write id maps through
 * it) and what is under keep (the root). The cgroup placer runs in the
 * original namespace. Best effort: a mount left here is only work for the
 * template's detach. */
static void prune_host_mounts(const char *keep)
{
    size_t len;
    bool whole;
    /* All of it first: the list changes as we detach. */
    _cleanup_free_ char *text =
        read_host_file("/proc/self/mountinfo", SBX_PROC_HOST_TEXT_MAX, &len, &whole);
    if (!text)
        return;
    char gone[OP_PATH_MAX] = "";
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        /* "id parent major:minor root mountpoint ...": the fifth field. */
        char *sp = line;
        for (int i = 0; i < 4 && sp; i++)
            sp = strchr(sp + 1, ' ');
        char *mp = sp ? sp + 1 : NULL, *end = mp ? strchr(mp, ' ') : NULL;
        if (!end)
            continue;
        *end = '\0';
        unescape_octal(mp);
        if (strcmp(mp, "/") == 0 || mounts_path_under(mp, "/proc") || mounts_path_under(mp, keep) ||
            mounts_path_under(keep, mp) || (gone[0] && mounts_path_under(mp, gone)))
            continue;
        /* Lazily, with everything below it (listed later: skipped). */
        if (umount2(mp, MNT_DETACH) == 0)
            snprintf(gone, sizeof gone, "%s", mp);
    }
}


int mounts_build(const struct config *cfg, struct mount_plan *mp, char *err, size_t errlen)
{
    if (unshare(CLONE_NEWNS) < 0)
        return err_fmt(err, errlen, -errno, "unshare(CLONE_NEWNS): %s", strerror(errno));
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        return err_fmt(err, errlen, -errno, "make-rprivate /: %s", strerror(errno));

    int *tree = malloc((mp->n ? mp->n : 1) * sizeof *tree);
    if (!tree)
        return err_fmt(err, errlen, -ENOMEM, "out of memory");
    for (size_t i = 0; i < mp->n; i++)
        tree[i] = -1;
    int r = 0, root = -1;

    /* Every bind source first, as a detached copy of its mount (not
     * recursive: submounts of a bound host dir stay hidden): the root is
     * about to cover /tmp, where a site dir may live. */
    for (size_t i = 0; i < mp->n && r == 0; i++) {
        const struct mount_op *op = &mp->ops[i];
        if (op->kind == MOP_BIND_RW) { /* made already, by the workspace's server */
            tree[i] = mp->work_tree;
            mp->work_tree = -1;
            if (tree[i] < 0)
                r = err_fmt(err, errlen, -EINVAL, "workspace %s: no mount for it", op->src);
            continue;
        }
        if (op->kind != MOP_BIND_RO && op->kind != MOP_BIND_DEV)
            continue;
        tree[i] = open_tree(AT_FDCWD, op->src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (tree[i] < 0) {
            r = err_fmt(err, errlen, -errno, "open_tree %s: %s", op->src, strerror(errno));
            break;
        }
        struct mount_attr ro = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID |
                                            MOUNT_ATTR_NODEV};
        if (op->kind == MOP_BIND_RO &&
            mount_setattr(tree[i], "", AT_EMPTY_PATH, &ro, sizeof ro) < 0)
            r = err_fmt(err, errlen, -errno, "read-only %s: %s", op->src, strerror(errno));
    }
    if (r < 0)
        goto out;

    if (mount("tmpfs", ROOT_AT, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "mode=0755,size=4m,nr_inodes=4096") < 0) {
        r = err_fmt(err, errlen, -errno, "mount the root tmpfs on " ROOT_AT ": %s", strerror(errno));
        goto out;
    }
    root = open(ROOT_AT, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) {
        r = err_fmt(err, errlen, -errno, "open " ROOT_AT ": %s", strerror(errno));
        goto out;
    }
    /* The mountpoints of what every sandbox mounts for itself. */
    static const struct {
        const char *path;
        mode_t mode;
    } points[] = {{"workspace", 0755}, {"tmp", 0755}, {"dev", 0755}, {"dev/shm", 0755},
                  {"proc", 0555}};
    for (size_t i = 0; i < sizeof points / sizeof *points; i++)
        if (make_dir(root, points[i].path, points[i].mode) < 0) {
            r = err_fmt(err, errlen, -errno, "mkdir %s: %s", points[i].path, strerror(errno));
            goto out;
        }
    if (mounts_mkdir_p(root, cfg->tools_dir + 1, 0755) < 0) {
        r = err_fmt(err, errlen, -errno, "mkdir %s: %s", cfg->tools_dir, strerror(errno));
        goto out;
    }
    for (size_t i = 0; i < mp->n; i++)
        if (build_op(root, &mp->ops[i], tree[i]) < 0) {
            r = err_fmt(err, errlen, -errno, "%s: %s", mp->ops[i].dst, strerror(errno));
            goto out;
        }
    /* Read-only for good: the superblock and our mount of it. */
    if (mount(NULL, ROOT_AT, NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
              NULL) < 0) {
        r = err_fmt(err, errlen, -errno, "remount the root read-only: %s", strerror(errno));
        goto out;
    }
    prune_host_mounts(ROOT_AT);
    r = mounts_template(mp, err, errlen);
out:
    if (root >= 0)
        close(root);
    for (size_t i = 0; i < mp->n; i++)
        if (tree[i] >= 0)
            close(tree[i]);
    free(tree);
    return r;
}
