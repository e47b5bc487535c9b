/* Runs in the supervisor and in `forkbox sandbox`: the id range's locks
 * (see idlock.h). */
#include "sandbox/idlock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/util.h"

bool id_lock_wanted(const struct config *cfg)
{
    if (!cfg->isolate || geteuid() != 0)
        return false;
    /* The host's user namespace maps every id to itself. */
    char map[64] = "";
    _cleanup_close_ int fd = open("/proc/self/uid_map", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, map, sizeof map - 1);
    unsigned long long inside, outside, len;
    return n > 0 && sscanf(map, "%llu %llu %llu", &inside, &outside, &len) == 3 && inside == 0 &&
           outside == 0 && len == 4294967295ULL;
}

/* dir/name, made if missing: a file of ours that no one else may write
 * (whoever could lock bytes in it could stop sandboxes from starting). */
static int open_lockfile(const char *dir, const char *name, char *err, size_t errlen)
{
    struct stat st;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return err_errno(err, errlen, "%s", dir);
    _cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0 || fstat(dfd, &st) < 0)
        return err_errno(err, errlen, "%s", dir);
    if (st.st_uid != geteuid() || (st.st_mode & 022))
        return err_fmt(err, errlen, -EPERM, "%s: not a directory of ours that only we write", dir);
    int fd = openat(dfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return err_errno(err, errlen, "%s/%s", dir, name);
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077)) {
        close(fd);
        return err_fmt(err, errlen, -EPERM, "%s/%s: not a file of ours with mode 0600", dir, name);
    }
    return fd;
}

/* Who holds a lock that [start, start + len) of type meets, as words: "pid
 * 123 (forkboxd) holds ids 2013265920:65536". False if none does now. */
static bool holder(int fd, short type, uint64_t start, uint64_t len, char *out, size_t outlen)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = (off_t)start,
                       .l_len = (off_t)len};
    if (fcntl(fd, F_GETLK, &fl) < 0 || fl.l_type == F_UNLCK)
        return false;
    char comm[32] = "";
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/comm", (int)fl.l_pid);
    _cleanup_close_ int cfd = fl.l_pid > 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    ssize_t n = cfd < 0 ? -1 : read(cfd, comm, sizeof comm - 1);
    if (n > 0)
        comm[strcspn(comm, "\n")] = '\0';
    if (fl.l_pid > 0)
        snprintf(out, outlen, "pid %d%s%s%s holds ids %lld:%lld", (int)fl.l_pid, n > 0 ? " (" : "",
                 n > 0 ? comm : "", n > 0 ? ")" : "", (long long)fl.l_start, (long long)fl.l_len);
    else /* in a pid namespace we cannot see */
        snprintf(out, outlen, "a process of another pid namespace holds ids %lld:%lld",
                 (long long)fl.l_start, (long long)fl.l_len);
    return true;
}

/* Lock [start, start + len) of fd: 0, -EBUSY with the holder in who (a lock
 * that meets it), or -errno. */
static int lock(int fd, short type, uint64_t start, uint64_t len, char *who, size_t wholen)
{
    /* A holder that leaves between F_SETLK and F_GETLK: try again. */
    for (int tries = 0; tries < 3; tries++) {
        struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = (off_t)start,
                           .l_len = (off_t)len};
        if (fcntl(fd, F_SETLK, &fl) == 0)
            return 0;
        if (errno != EAGAIN && errno != EACCES)
            return -errno;
        if (holder(fd, type, start, len, who, wholen))
            return -EBUSY;
    }
    snprintf(who, wholen, "processes that come and go hold ids in it");
    return -EBUSY;
}

/* Lock the range [first, first + count) of the file fd (dir/name): 0, or
 * -errno with the reason (-EBUSY: who holds part of it). */
static int lock_range(int fd, short type, uint32_t first, uint32_t count, const char *dir,
                      const char *name, char *err, size_t errlen)
{
    char who[160];
    int r = lock(fd, type, first, count, who, sizeof who);
    if (r == -EBUSY)
        return err_fmt(err, errlen, r, "--id-range %u:%u is not free: %s; give each forkboxd "
                       "(and forkbox sandbox) a range of its own", first, count, who);
    if (r < 0)
        return err_fmt(err, errlen, r, "locking --id-range %u:%u in %s/%s: %s", first, count, dir,
                       name, strerror(-r));
    return 0;
}

int id_lock_range(const char *dir, uint32_t first, uint32_t count, struct id_lock *lk, char *err,
                  size_t errlen)
{
    *lk = (struct id_lock)ID_LOCK_INIT;
    int fd = open_lockfile(dir, IDLOCK_RANGES, err, errlen);
    if (fd < 0)
        return fd;
    int r = lock_range(fd, F_WRLCK, first, count, dir, IDLOCK_RANGES, err, errlen);
    if (r < 0) {
        close(fd);
        return r;
    }
    lk->ranges_fd = fd;
    lk->first = first;
    lk->count = count;
    return 0;
}

int id_lock_pair(const char *dir, uint32_t first, uint32_t count, struct id_lock *lk, char *err,
                 size_t errlen)
{
    *lk = (struct id_lock)ID_LOCK_INIT;
    uint32_t pairs = count / 2;
    if (pairs == 0)
        return err_fmt(err, errlen, -EINVAL, "--id-range %u:%u: needs at least 2 ids", first,
                       count);
    int r = lk->ranges_fd = open_lockfile(dir, IDLOCK_RANGES, err, errlen);
    if (r >= 0)
        r = lock_range(lk->ranges_fd, F_RDLCK, first, count, dir, IDLOCK_RANGES, err, errlen);
    if (r >= 0)
        r = lk->pairs_fd = open_lockfile(dir, IDLOCK_PAIRS, err, errlen);
    if (r < 0) {
        id_lock_release(lk);
        return r;
    }
    /* A random start: a pair just released (its sandbox's last processes
     * may still be on their way out) is seldom the next one taken. */
    uint32_t start;
    if (getrandom(&start, sizeof start, GRND_NONBLOCK) != (ssize_t)sizeof start)
        start = (uint32_t)time(NULL);
    char who[160];
    for (uint32_t i = 0; i < pairs; i++) {
        uint32_t pair = first + 2 * ((start + i) % pairs);
        r = lock(lk->pairs_fd, F_WRLCK, pair, 2, who, sizeof who);
        if (r == 0) {
            lk->first = pair;
            lk->count = 2;
            return 0;
        }
        if (r != -EBUSY)
            break;
    }
    if (r == -EBUSY)
        err_fmt(err, errlen, r, "every id of --id-range %u:%u is held by another forkbox "
                "sandbox (%s)", first, count, who);
    else
        err_fmt(err, errlen, r, "locking a pair of --id-range %u:%u in %s/%s: %s", first, count,
                dir, IDLOCK_PAIRS, strerror(-r));
    id_lock_release(lk);
    return r;
}

void id_lock_release(struct id_lock *lk)
{
    close_and_reset(&lk->ranges_fd);
    close_and_reset(&lk->pairs_fd);
}
