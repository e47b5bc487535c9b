/* Runs in the supervisor (forkboxd's main.c) and in `forkbox sandbox`
 * (forkbox.c), before the fork server starts: a host id has one owner.
 *
 * Sandboxes run as host ids of --id-range (ids.h), and the kernel charges
 * per-user quotas to them: two daemons given overlapping ranges would put
 * sandboxes of both on one uid (seen under load: 52 times in a run), each
 * unaware. So the processes that hand ids out agree through record locks
 * (fcntl F_SETLK, whose holder F_GETLK names) on files under IDLOCK_DIR,
 * where the byte at offset N stands for host id N:
 *   - forkboxd write-locks its whole range in IDLOCK_RANGES;
 *   - `forkbox sandbox` read-locks its whole range there (forkbox sandboxes
 *     share a range: read locks agree with each other, not with a daemon's
 *     write lock) and write-locks one aligned pair of it in IDLOCK_PAIRS (the
 *     pair its one sandbox uses: config.c wants twice as many ids as live
 *     sandboxes).
 * A range that meets one held by another process is refused with that
 * process's pid and range. The locks die with their process (kill -9
 * included): nothing to clean up, and the files stay. The fork server
 * neither inherits nor needs them: the supervisor outlives it.
 *
 * Not locked: without isolation (no ids are used) and where we are not root
 * of the host's user namespace (a user namespace's ids are its own, and the
 * host's /run/forkbox is not ours to write); ids.c's random start still makes
 * a shared id unlikely there. Daemons in containers with a /run of their own
 * do not see each other's locks: one per node, as deploy/k8s runs it. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

#define IDLOCK_DIR "/run/forkbox"
#define IDLOCK_RANGES "id-ranges"
#define IDLOCK_PAIRS "id-pairs"

struct id_lock {
    int ranges_fd; /* owned: IDLOCK_RANGES, holding our lock; -1 when none */
    int pairs_fd;  /* owned: IDLOCK_PAIRS (forkbox sandbox), -1 when none */
    uint32_t first, count; /* what is ours: the range, or the pair */
};

#define ID_LOCK_INIT {.ranges_fd = -1, .pairs_fd = -1}

/* Whether cfg's ids are locked here: isolation, and root of the host's user
 * namespace. */
bool id_lock_wanted(const struct config *cfg);
/* forkboxd: [first, first + count) for this process alone, in dir (IDLOCK_DIR
 * but in tests). 0, or -EBUSY with the holder ("--id-range F:C overlaps ids
 * F2:C2 held by pid P (forkboxd)") in err, or -errno (the directory or file
 * cannot be made or opened: it must be root's and not writable by others). */
int id_lock_range(const char *dir, uint32_t first, uint32_t count, struct id_lock *lk, char *err,
                  size_t errlen);
/* forkbox sandbox: [first, first + count) shared with other forkbox
 * sandboxes, and a free aligned pair of it for this process alone, in
 * lk->first (count 2). Same errors (-EBUSY: a forkboxd holds part of the
 * range, or every pair is taken). */
int id_lock_pair(const char *dir, uint32_t first, uint32_t count, struct id_lock *lk, char *err,
                 size_t errlen);
/* Drop the locks (closing the files does). */
void id_lock_release(struct id_lock *lk);
