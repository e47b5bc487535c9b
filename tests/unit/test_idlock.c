/* sandbox/idlock.c: an id range has one owner. Record locks belong to a
 * process, so each holder here is a child that takes its lock, says so on a
 * pipe and waits; the test process is the second comer. The lock files are
 * in a directory of the test's own. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sandbox/idlock.h"
#include "tap.h"

static char dir[64];

struct holder {
    pid_t pid;
    int stop; /* write end: closing it lets the child exit */
};

/* A child that holds [first, first + count) as forkboxd (pair false) or as
 * a forkbox sandbox (pair true); its pair in *pair_first. */
static struct holder hold(bool pair, uint32_t first, uint32_t count, uint32_t *pair_first)
{
    int ready[2], stop[2];
    if (pipe(ready) < 0 || pipe(stop) < 0)
        exit(1);
    pid_t pid = fork();
    if (pid == 0) {
        /* Only our own pipes: another holder's stop end held here would keep
         * that holder waiting. */
        for (int fd = 3; fd < 1024; fd++)
            if (fd != ready[1] && fd != stop[0])
                close(fd);
        struct id_lock lk;
        char err[256];
        int r = pair ? id_lock_pair(dir, first, count, &lk, err, sizeof err)
                     : id_lock_range(dir, first, count, &lk, err, sizeof err);
        uint32_t got = r == 0 ? lk.first : 0;
        if (write(ready[1], &got, sizeof got) != sizeof got)
            _exit(1);
        char b;
        while (read(stop[0], &b, 1) < 0 && errno == EINTR)
            ;
        _exit(0);
    }
    close(ready[1]);
    close(stop[0]);
    uint32_t got = 0;
    if (read(ready[0], &got, sizeof got) != sizeof got)
        got = 0;
    close(ready[0]);
    if (pair_first)
        *pair_first = got;
    return (struct holder){.pid = pid, .stop = stop[1]};
}

static void release(struct holder *h)
{
    close(h->stop);
    waitpid(h->pid, NULL, 0);
}

static void test_ranges(void)
{
    struct id_lock lk;
    char err[512], want[64];
    struct holder a = hold(false, 3000000, 1000, NULL);

    is_int(id_lock_range(dir, 3000500, 1000, &lk, err, sizeof err), -EBUSY,
           "an overlapping range is refused");
    snprintf(want, sizeof want, "pid %d", (int)a.pid);
    ok(strstr(err, want) && strstr(err, "holds ids 3000000:1000") &&
           strstr(err, "--id-range 3000500:1000 is not free"),
       "the refusal names the holder's pid and range: %s", err);
    is_int(id_lock_range(dir, 3000999, 1, &lk, err, sizeof err), -EBUSY, "its last id too");
    is_int(id_lock_range(dir, 3001000, 1000, &lk, err, sizeof err), 0, "the next range is free");
    ok(lk.ranges_fd >= 0 && lk.first == 3001000 && lk.count == 1000, "held: %u:%u", lk.first,
       lk.count);
    id_lock_release(&lk);
    ok(lk.ranges_fd < 0 && lk.pairs_fd < 0, "released");

    /* A forkbox sandbox in a forkboxd's range: refused too. */
    is_int(id_lock_pair(dir, 2999000, 4000, &lk, err, sizeof err), -EBUSY,
           "a forkbox sandbox's range over a daemon's is refused");
    ok(strstr(err, want) != NULL, "and names the daemon: %s", err);

    release(&a);
    is_int(id_lock_range(dir, 3000500, 1000, &lk, err, sizeof err), 0,
           "free once its holder has exited");
    id_lock_release(&lk);
}

static void test_pairs(void)
{
    struct id_lock lk;
    char err[512], want[64];
    uint32_t p1 = 0, p2 = 0;
    struct holder a = hold(true, 5000000, 4, &p1);
    ok(p1 == 5000000 || p1 == 5000002, "a forkbox sandbox holds an aligned pair (%u)", p1);

    /* Sandboxes share their range; each has a pair of its own. */
    is_int(id_lock_pair(dir, 5000000, 4, &lk, err, sizeof err), 0, "a second one gets a pair");
    p2 = lk.first;
    ok(lk.count == 2 && (p2 == 5000000 || p2 == 5000002) && p2 != p1, "another pair: %u, %u", p1,
       p2);
    id_lock_release(&lk);

    struct holder b = hold(true, 5000000, 4, &p2);
    ok(p2 != 0 && p2 != p1, "a third process gets the pair left (%u)", p2);
    is_int(id_lock_pair(dir, 5000000, 4, &lk, err, sizeof err), -EBUSY,
           "every pair taken: refused");
    ok(strstr(err, "held by another forkbox sandbox") != NULL, "says so: %s", err);

    /* A daemon over a range where forkbox sandboxes run: refused. */
    is_int(id_lock_range(dir, 4999999, 2, &lk, err, sizeof err), -EBUSY,
           "a daemon's range over a forkbox sandbox's is refused");
    snprintf(want, sizeof want, "pid %d", (int)a.pid);
    char want_b[64];
    snprintf(want_b, sizeof want_b, "pid %d", (int)b.pid);
    ok(strstr(err, want) || strstr(err, want_b), "and names one of them: %s", err);
    release(&a);
    release(&b);
    is_int(id_lock_range(dir, 4999999, 2, &lk, err, sizeof err), 0, "free once they are gone");
    id_lock_release(&lk);
}

static void test_files_of_ours(void)
{
    struct id_lock lk;
    char err[512], path[128];
    snprintf(path, sizeof path, "%s/%s", dir, IDLOCK_RANGES);
    ok(chmod(path, 0666) == 0, "the lock file made writable by others");
    is_int(id_lock_range(dir, 7000000, 10, &lk, err, sizeof err), -EPERM,
           "a lock file others may write is refused");
    ok(strstr(err, "mode 0600") != NULL, "says why: %s", err);
    chmod(path, 0600);
    ok(chmod(dir, 0777) == 0, "the directory made writable by others");
    is_int(id_lock_range(dir, 7000000, 10, &lk, err, sizeof err), -EPERM,
           "refused in a directory others may write");
    chmod(dir, 0755);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/test_idlock.XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    chmod(dir, 0755);
    test_ranges();
    test_pairs();
    test_files_of_ours();
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, IDLOCK_RANGES);
    unlink(path);
    snprintf(path, sizeof path, "%s/%s", dir, IDLOCK_PAIRS);
    unlink(path);
    rmdir(dir);
    return tap_done();
}
