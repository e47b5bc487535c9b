/* Archive extraction (stage/archive.h) with the production filter, into a
 * fresh directory per input, with small caps (1 MiB, 100 members).
 *
 * Input: byte 0 holds flags, the rest is the archive:
 *   0x01  the rest is passed as it is (a gzip stream, to fuzz the gzip layer
 *         and the "gzip exactly once" check); otherwise the rest is a tar
 *         stream that is gzip-compressed here first, so mutations land in
 *         the tar headers and not in deflate's bit stream
 *   0x02  also snapshot the result (archive_snapshot) and extract the
 *         snapshot again: it must be a valid archive that extracts cleanly
 *   0x04  with 0x02: the snapshot's byte cap is 4 KiB, so files are left out
 *
 * Layout of the scratch tree (one mkdtemp per input, removed after it;
 * under $FUZZ_TMPDIR, /dev/shm or /tmp, see scratch_root()):
 *
 *   base/outside/            must stay empty
 *   base/a/b/dest/           the extraction root (dest_fd)
 *            up -> ../../../outside    symlinks a previous block could have
 *            abs -> <base>/outside     left in the workspace
 *            self -> .
 *            loop -> loop
 *            sub/keep                  an existing directory and file
 *
 * Three levels of ".." from dest still land inside base, so an escape by a
 * relative path is seen by the walk of base below.
 *
 * Properties:
 *   - archive_extract() returns 0 or a documented error and a message;
 *   - nothing is created, changed or removed outside dest: base holds only
 *     a/ and outside/, a/ only b/, b/ only dest/, outside/ stays empty, and
 *     the planted links are untouched;
 *   - inside dest only regular files and directories appear (besides the
 *     planted links); files carry no setuid/setgid/sticky bit, no group or
 *     other write bit, and at least 0600; new directories are 0755;
 *   - the caps hold: bytes written and the files' apparent sizes are within
 *     max_unpacked, members counted within max_members;
 *   - (0x02) the snapshot of whatever was extracted is a valid archive that
 *     extracts again with no error and as many files as it holds; the
 *     snapshot of an empty directory extracts as a no-op;
 *   - (0x02) both pass the supervisor's check (proto/tarcheck.h) with the
 *     members and bytes the writer counted: whatever names and modes a
 *     workspace holds, an honest snapshot is never refused.
 *
 * The empty tree's archive is prepared once, as in the fork server, so
 * every input also goes through archive_extract()'s check for it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/buf.h"
#include "fuzz.h"
#include "proto/tarcheck.h"
#include "stage/archive.h"

enum {
    F_RAW = 0x01,
    F_SNAPSHOT = 0x02,
    F_SMALL_SNAPSHOT = 0x04,
};

#define MAX_UNPACKED (1024 * 1024)
#define MAX_MEMBERS 100
#define PLANTED_BYTES 5 /* sub/keep */

static const struct archive_limits limits = {
    .max_unpacked = MAX_UNPACKED,
    .max_members = MAX_MEMBERS,
};

/* Where the scratch trees go: $FUZZ_TMPDIR, else /dev/shm when it is a
 * tmpfs we can write (several times faster than a disk-backed /tmp: each
 * input creates and removes a dozen entries), else /tmp. */
static const char *scratch_root(void)
{
    static const char *root;
    const char *env = getenv("FUZZ_TMPDIR");

    if (root)
        return root;
    if (env && *env && strlen(env) < 32)
        root = env;
    else if (access("/dev/shm", W_OK | X_OK) == 0)
        root = "/dev/shm";
    else
        root = "/tmp";
    return root;
}

static uint8_t *gzip(const uint8_t *p, size_t n, size_t *out_len)
{
    z_stream z = {0};
    uLong cap;
    uint8_t *out;

    FUZZ_ASSERT(deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) ==
                    Z_OK,
                "deflateInit2");
    cap = deflateBound(&z, n) + 32;
    out = malloc(cap);
    FUZZ_ASSERT(out != NULL, "malloc");
    z.next_in = (Bytef *)p;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    FUZZ_ASSERT(deflate(&z, Z_FINISH) == Z_STREAM_END, "deflate");
    *out_len = z.total_out;
    deflateEnd(&z);
    return out;
}

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    if (remove(path) < 0) {
        /* A directory left without search permission: open it up and retry. */
        if (type == FTW_DP && chmod(path, 0700) == 0 && remove(path) == 0)
            return 0;
        fprintf(stderr, "cannot remove %s: %s\n", path, strerror(errno));
    }
    return 0;
}

static void rm_rf(const char *path)
{
    /* FTW_PHYS: never follow the planted links out of the tree. */
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Names in dir other than "." and "..", which must be exactly `want`
 * (NULL-terminated). */
static void expect_entries(const char *dir, const char *const *want)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    size_t nwant = 0, seen = 0;

    FUZZ_ASSERT(d != NULL, "opendir %s: %s", dir, strerror(errno));
    while (want[nwant])
        nwant++;
    while ((de = readdir(d))) {
        bool ok = false;
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        for (size_t i = 0; i < nwant; i++)
            ok |= strcmp(de->d_name, want[i]) == 0;
        FUZZ_ASSERT(ok, "extraction wrote outside its destination: %s/%s", dir, de->d_name);
        seen++;
    }
    closedir(d);
    FUZZ_ASSERT(seen == nwant, "an entry outside the destination vanished in %s", dir);
}

static void expect_link(const char *path, const char *target)
{
    char buf[4096];
    ssize_t n = readlink(path, buf, sizeof buf - 1);

    FUZZ_ASSERT(n >= 0, "planted link %s: %s", path, strerror(errno));
    buf[n] = '\0';
    FUZZ_ASSERT(strcmp(buf, target) == 0, "planted link %s now points at %s", path, buf);
}

struct walk {
    size_t dest_len;      /* strlen of dest's path */
    uint64_t apparent;    /* sum of regular files' st_size */
    uint64_t files;
};

static struct walk *walk_state;

static int check_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    struct walk *w = walk_state;
    const char *rel = path + w->dest_len;

    if (ftw->level == 0)
        return 0;
    if (!strcmp(rel, "/up") || !strcmp(rel, "/abs") || !strcmp(rel, "/self") ||
        !strcmp(rel, "/loop")) {
        FUZZ_ASSERT(S_ISLNK(sb->st_mode), "planted link %s replaced", rel);
        return 0;
    }
    if (S_ISREG(sb->st_mode)) {
        FUZZ_ASSERT((sb->st_mode & 07000) == 0, "file %s has mode %o", rel,
                    (unsigned)sb->st_mode & 07777);
        FUZZ_ASSERT((sb->st_mode & 022) == 0, "file %s is group/other writable (%o)", rel,
                    (unsigned)sb->st_mode & 07777);
        FUZZ_ASSERT((sb->st_mode & 0600) == 0600, "file %s is not 0600 for its owner (%o)", rel,
                    (unsigned)sb->st_mode & 07777);
        FUZZ_ASSERT(sb->st_nlink == 1, "file %s has %lu links", rel,
                    (unsigned long)sb->st_nlink);
        w->apparent += (uint64_t)sb->st_size;
        w->files++;
    } else if (S_ISDIR(sb->st_mode)) {
        FUZZ_ASSERT((sb->st_mode & 07777) == 0755, "directory %s has mode %o", rel,
                    (unsigned)sb->st_mode & 07777);
    } else {
        FUZZ_ASSERT(false, "extraction created %s of type %o", rel, (unsigned)sb->st_mode & S_IFMT);
    }
    return 0;
}

static bool dir_is_empty(int fd)
{
    DIR *d = fdopendir(dup(fd));
    struct dirent *de;
    bool empty = true;

    FUZZ_ASSERT(d != NULL, "fdopendir: %s", strerror(errno));
    while ((de = readdir(d)))
        empty &= !strcmp(de->d_name, ".") || !strcmp(de->d_name, "..");
    closedir(d);
    return empty;
}

static int open_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    FUZZ_ASSERT(fd >= 0, "open %s: %s", path, strerror(errno));
    return fd;
}

static void check_rc(int rc, const char *msg)
{
    FUZZ_ASSERT(rc == 0 || rc == -EBADMSG || rc == -EFBIG || rc == -E2BIG,
                "archive_extract: %d (%s): %s", rc, strerror(-rc), msg);
    FUZZ_ASSERT(memchr(msg, '\0', 256) != NULL, "message not terminated");
}

/* The supervisor's check accepts a snapshot with what the writer counted. */
static void check_tarcheck(const struct buf *out, const struct snapshot_stats *sst,
                           uint64_t max_bytes)
{
    struct tarcheck_limits tl = {.max_data = max_bytes, .max_members = sst->files};
    struct tarcheck *tc = tarcheck_new(&tl);
    struct tarcheck_stats ts;
    int rc;

    FUZZ_ASSERT(tc, "tarcheck_new");
    while ((rc = tarcheck_finish(tc, out->data, out->len)) == TARCHECK_AGAIN)
        ;
    tarcheck_get_stats(tc, &ts);
    FUZZ_ASSERT(rc == TARCHECK_VALID, "the supervisor refuses our own snapshot: %d %s", rc,
                tarcheck_reason(tc));
    FUZZ_ASSERT(ts.members == sst->files && ts.data == sst->bytes,
                "tarcheck saw %llu members/%llu bytes, the writer %llu/%llu",
                (unsigned long long)ts.members, (unsigned long long)ts.data,
                (unsigned long long)sst->files, (unsigned long long)sst->bytes);
    tarcheck_free(tc);
}

/* The empty directory fd: its snapshot is the prepared empty tree
 * (archive_snapshot_prepare), which extracts as a no-op and leaves fd empty. */
static void check_empty_snapshot(int fd, const struct archive_limits *lim)
{
    struct buf out;
    struct snapshot_stats sst;
    struct extract_stats est;
    char msg[256];
    int rc;

    buf_init(&out, 1024 * 1024);
    rc = archive_snapshot(fd, MAX_UNPACKED, &out, &sst);
    FUZZ_ASSERT(rc == 0 && sst.files == 0 && sst.bytes == 0 && out.len > 0,
                "snapshot of an empty directory: %d, %llu files", rc,
                (unsigned long long)sst.files);
    check_tarcheck(&out, &sst, MAX_UNPACKED);
    rc = archive_extract(out.data, out.len, fd, lim, &est, msg, sizeof msg);
    FUZZ_ASSERT(rc == 0 && est.files == 0 && est.dirs == 0, "empty tree extracts as %d: %s",
                rc, msg);
    FUZZ_ASSERT(dir_is_empty(fd), "extracting the empty tree wrote something");
    buf_free(&out);
}

/* Snapshot dest and extract the snapshot into a fresh directory. */
static void check_snapshot(const char *base, int dest_fd, uint64_t max_bytes)
{
    struct buf out;
    struct snapshot_stats sst;
    struct extract_stats est;
    struct archive_limits lim = {.max_unpacked = MAX_UNPACKED + PLANTED_BYTES,
                                 .max_members = 10 * MAX_MEMBERS};
    char path[256], msg[256];
    int rc, fd;

    buf_init(&out, 64 * 1024 * 1024);
    rc = archive_snapshot(dest_fd, max_bytes, &out, &sst);
    FUZZ_ASSERT(rc == 0, "archive_snapshot: %d", rc);
    FUZZ_ASSERT(sst.bytes <= max_bytes, "snapshot holds %llu bytes over its cap %llu",
                (unsigned long long)sst.bytes, (unsigned long long)max_bytes);
    check_tarcheck(&out, &sst, max_bytes);

    snprintf(path, sizeof path, "%s/snap", base);
    FUZZ_ASSERT(mkdir(path, 0700) == 0, "mkdir %s", path);
    fd = open_dir(path);
    check_empty_snapshot(fd, &lim);
    rc = archive_extract(out.data, out.len, fd, &lim, &est, msg, sizeof msg);
    FUZZ_ASSERT(rc == 0, "our own snapshot does not extract: %d: %s", rc, msg);
    FUZZ_ASSERT(est.files == sst.files && est.skipped == 0 && est.bytes == sst.bytes,
                "snapshot of %llu files/%llu bytes extracted as %llu files/%llu bytes, "
                "%llu skipped",
                (unsigned long long)sst.files, (unsigned long long)sst.bytes,
                (unsigned long long)est.files, (unsigned long long)est.bytes,
                (unsigned long long)est.skipped);
    close(fd);
    buf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char base[64], path[256], dest[128], msg[256];
    static const char *const base_want[] = {"a", "outside", NULL};
    static const char *const base_snap_want[] = {"a", "outside", "snap", NULL};
    static const char *const a_want[] = {"b", NULL};
    static const char *const b_want[] = {"dest", NULL};
    static const char *const none[] = {NULL};
    struct extract_stats st;
    uint8_t *gz;
    size_t gz_len;
    uint8_t flags;
    int dest_fd, rc;

    if (size < 1)
        return 0;
    /* As the fork server does: the empty tree's archive is made once, and
     * archive_snapshot / archive_extract take their shortcuts for it. */
    static bool prepared;
    if (!prepared) {
        FUZZ_ASSERT(archive_snapshot_prepare() == 0, "archive_snapshot_prepare");
        prepared = true;
    }
    flags = data[0];
    if (flags & F_RAW) {
        gz_len = size - 1;
        gz = malloc(gz_len ? gz_len : 1);
        FUZZ_ASSERT(gz != NULL, "malloc");
        memcpy(gz, data + 1, gz_len);
    } else {
        gz = gzip(data + 1, size - 1, &gz_len);
    }

    snprintf(base, sizeof base, "%s/fuzz-archive-XXXXXX", scratch_root());
    FUZZ_ASSERT(mkdtemp(base) != NULL, "mkdtemp: %s", strerror(errno));
    snprintf(path, sizeof path, "%s/outside", base);
    FUZZ_ASSERT(mkdir(path, 0755) == 0, "mkdir outside");
    snprintf(path, sizeof path, "%s/a", base);
    FUZZ_ASSERT(mkdir(path, 0755) == 0, "mkdir a");
    snprintf(path, sizeof path, "%s/a/b", base);
    FUZZ_ASSERT(mkdir(path, 0755) == 0, "mkdir b");
    snprintf(dest, sizeof dest, "%s/a/b/dest", base);
    FUZZ_ASSERT(mkdir(dest, 0755) == 0, "mkdir dest");
    chmod(dest, 0755);
    char abs_target[128];
    snprintf(abs_target, sizeof abs_target, "%s/outside", base);
    dest_fd = open_dir(dest);
    FUZZ_ASSERT(symlinkat("../../../outside", dest_fd, "up") == 0, "symlink up");
    FUZZ_ASSERT(symlinkat(abs_target, dest_fd, "abs") == 0, "symlink abs");
    FUZZ_ASSERT(symlinkat(".", dest_fd, "self") == 0, "symlink self");
    FUZZ_ASSERT(symlinkat("loop", dest_fd, "loop") == 0, "symlink loop");
    FUZZ_ASSERT(mkdirat(dest_fd, "sub", 0755) == 0, "mkdir sub");
    int keep = openat(dest_fd, "sub/keep", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    FUZZ_ASSERT(keep >= 0 && write(keep, "keep\n", PLANTED_BYTES) == PLANTED_BYTES, "sub/keep");
    close(keep);
    snprintf(path, sizeof path, "%s/sub", dest);
    chmod(path, 0755);

    memset(&st, 0xa5, sizeof st);
    memset(msg, 'x', sizeof msg);
    rc = archive_extract(gz, gz_len, dest_fd, &limits, &st, msg, sizeof msg);
    check_rc(rc, msg);
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "archive_extract: %d (%s): files %llu dirs %llu skipped %llu bytes %llu\n",
                rc, msg, (unsigned long long)st.files, (unsigned long long)st.dirs,
                (unsigned long long)st.skipped, (unsigned long long)st.bytes);
    FUZZ_ASSERT(st.bytes <= MAX_UNPACKED, "wrote %llu bytes", (unsigned long long)st.bytes);
    /* Each member is written as a file, skipped, or is a directory (which
     * may create several directories, or none): files + skipped <= members. */
    FUZZ_ASSERT(st.files + st.skipped <= MAX_MEMBERS, "counted %llu members",
                (unsigned long long)(st.files + st.skipped));

    /* Nothing outside dest. */
    expect_entries(base, base_want);
    snprintf(path, sizeof path, "%s/a", base);
    expect_entries(path, a_want);
    snprintf(path, sizeof path, "%s/a/b", base);
    expect_entries(path, b_want);
    snprintf(path, sizeof path, "%s/outside", base);
    expect_entries(path, none);
    snprintf(path, sizeof path, "%s/up", dest);
    expect_link(path, "../../../outside");
    snprintf(path, sizeof path, "%s/abs", dest);
    expect_link(path, abs_target);
    snprintf(path, sizeof path, "%s/self", dest);
    expect_link(path, ".");
    snprintf(path, sizeof path, "%s/loop", dest);
    expect_link(path, "loop");

    /* Only files and directories, with the filter's modes, within caps. */
    struct walk w = {.dest_len = strlen(dest)};
    walk_state = &w;
    FUZZ_ASSERT(nftw(dest, check_entry, 16, FTW_PHYS) == 0, "walk dest: %s", strerror(errno));
    walk_state = NULL;
    FUZZ_ASSERT(w.apparent <= MAX_UNPACKED + PLANTED_BYTES,
                "files in dest add up to %llu bytes", (unsigned long long)w.apparent);

    if (flags & F_SNAPSHOT) {
        check_snapshot(base, dest_fd,
                       (flags & F_SMALL_SNAPSHOT) ? 4096 : MAX_UNPACKED + PLANTED_BYTES);
        expect_entries(base, base_snap_want);
    }

    close(dest_fd);
    rm_rf(base);
    free(gz);
    return 0;
}
