/* Runs in `forkbox sandbox`: id leases through flock() (see lease.h). */
#include "stream/lease.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"

/* The directory is root's and 0700: a user who could create files in it
 * could hold every lease and stop stream sandboxes from starting. */
static int lease_dir(char *err, size_t errlen)
{
    if (mkdir("/run/forkbox", 0755) < 0 && errno != EEXIST)
        return err_fmt(err, errlen, -errno, "/run/forkbox: %s", strerror(errno));
    if (mkdir(IDS_LEASE_DIR, 0700) < 0 && errno != EEXIST)
        return err_fmt(err, errlen, -errno, IDS_LEASE_DIR ": %s", strerror(errno));
    struct stat st;
    if (lstat(IDS_LEASE_DIR, &st) < 0)
        return err_fmt(err, errlen, -errno, IDS_LEASE_DIR ": %s", strerror(errno));
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 0077))
        return err_fmt(err, errlen, -EPERM, IDS_LEASE_DIR ": not a directory of ours with "
                       "mode 0700");
    return 0;
}

/* Lock the pair at first: 1 when it is ours, 0 when someone holds it. The
 * inode check closes the race with a holder unlinking the file as it
 * releases: a lock won on the unlinked inode is no lease. */
static int try_pair(uint32_t first, struct id_lease *lease)
{
    snprintf(lease->path, sizeof lease->path, IDS_LEASE_DIR "/%u", first);
    int fd = open(lease->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        close(fd);
        return e == EWOULDBLOCK ? 0 : -e;
    }
    struct stat held, now;
    if (fstat(fd, &held) < 0 || stat(lease->path, &now) < 0 || held.st_ino != now.st_ino ||
        held.st_dev != now.st_dev) {
        close(fd);
        return 0;
    }
    lease->fd = fd;
    lease->first = first;
    return 1;
}

int id_lease_take(uint32_t first, uint32_t count, struct id_lease *lease, char *err,
                  size_t errlen)
{
    *lease = (struct id_lease){.fd = -1};
    int r = lease_dir(err, errlen);
    if (r < 0)
        return r;
    uint32_t pairs = count / 2;
    if (pairs == 0)
        return err_fmt(err, errlen, -EINVAL, "--id-range: needs at least 2 ids");
    /* A random start: a pair just released (its sandbox's last processes
     * may still be on their way out) is seldom the next one taken. */
    uint32_t start;
    if (getrandom(&start, sizeof start, GRND_NONBLOCK) != (ssize_t)sizeof start)
        start = (uint32_t)time(NULL);
    for (uint32_t i = 0; i < pairs; i++) {
        uint32_t pair = first + 2 * ((start + i) % pairs);
        r = try_pair(pair, lease);
        if (r < 0)
            return err_fmt(err, errlen, r, IDS_LEASE_DIR "/%u: %s", pair, strerror(-r));
        if (r == 1)
            return 0;
    }
    return err_fmt(err, errlen, -EBUSY, "every id of --id-range %u:%u is leased by another "
                   "forkbox sandbox", first, count);
}

void id_lease_release(struct id_lease *lease)
{
    if (lease->fd < 0)
        return;
    unlink(lease->path);
    close(lease->fd);
    lease->fd = -1;
}
