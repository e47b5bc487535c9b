/* Runs in the fork server: once at start (mounts_template, from mounts_build)
 * and around each sandbox's clone (mounts_clone_enter/leave): the template
 * mount namespace every sandbox's namespace is a copy of.
 *
 * Why: copied from the fork server's own namespace, a sandbox had to bind
 * the prepared root, pivot_root into it and detach the old root; the detach
 * waits for an RCU grace period (synchronize_rcu_expedited in
 * namespace_unlock): 120-170 us of a fresh start's wall time, measured
 * (forkbox-bench --rows steps), with nothing for the CPU to do meanwhile.
 * The template did all of it once: its root *is* the sandbox root, and
 * nothing of the host is in it, so a copy has nothing to pivot or detach.
 * The fork server itself stays in its own namespace (the host's proc for the
 * id maps, /run/forkbox, the interpreter's host paths): it enters the
 * template for the clone only, as it enters a sandbox's network namespace
 * (netns.c), one setns() each way.
 *
 * What the template holds besides the root: a proc mount, hidden at
 * /dev/shm, which every sandbox covers with its scratch tmpfs and the bind
 * of its shm directory at once (mounts_enter, step 4). The kernel lets a
 * user namespace mount a proc of its own only while its mount namespace
 * holds a fully visible one (mount_too_revealing); the old root's proc was
 * that until the detach. This one belongs to a pid namespace made for it,
 * whose only process mounted it and exited: it lists no process, and its
 * host-wide files are those every sandbox's own proc holds under its
 * covers. No path reaches it (unmounting what covers it needs
 * CAP_SYS_ADMIN, which user code never holds); /proc/self/mountinfo names
 * it. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/util.h"
#include "sandbox/mounts.h"
#include "sandbox/mounts_int.h"

/* Under the scratch of every sandbox (mounts_enter.c's SCRATCH_AT). */
#define HIDDEN_PROC ROOT_AT "/dev/shm"

/* A proc of a pid namespace of its own on path, in our mount namespace: a
 * child that is that namespace's pid 1 mounts it and exits. The clone copies
 * nothing but our address space (exit signal 0: no SIGCHLD for the fork
 * server's loop to see). */
static int mount_lone_proc(const char *path)
{
    long pid = syscall(SYS_clone, CLONE_NEWPID, 0L, 0L, 0L, 0L);
    if (pid == 0)
        _exit(mount("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0 ? errno
                                                                                     : 0);
    if (pid < 0)
        return -errno;
    int st = 0;
    while (waitpid((pid_t)pid, &st, __WALL) < 0)
        if (errno != EINTR)
            return -errno;
    if (!WIFEXITED(st))
        return -EIO;
    return -WEXITSTATUS(st);
}

int mounts_template(struct mount_plan *mp, char *err, size_t errlen)
{
    mp->home_ns = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    mp->home_cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (mp->home_ns < 0 || mp->home_cwd < 0)
        return err_errno(err, errlen, "template: open our namespace and cwd");
    if (unshare(CLONE_NEWNS) < 0)
        return err_errno(err, errlen, "template: unshare(CLONE_NEWNS)");
    mp->tmpl_ns = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    int r = mp->tmpl_ns < 0 ? err_errno(err, errlen, "template: open its namespace") : 0;
    if (r == 0 && (r = mount_lone_proc(HIDDEN_PROC)) < 0)
        r = err_fmt(err, errlen, r, "template: mount a proc on %s: %s", HIDDEN_PROC,
                    strerror(-r));
    /* pivot_root(".", "."): the old root lands on top of the new one, and
     * the detach takes it and everything of the host below it away. */
    if (r == 0 && (chdir(ROOT_AT) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 ||
                   umount2(".", MNT_DETACH) < 0))
        r = err_errno(err, errlen, "template: pivot into %s, detach the old root", ROOT_AT);
    mounts_clone_leave(mp);
    return r;
}

int mounts_clone_enter(const struct mount_plan *mp, char *err, size_t errlen)
{
    return setns(mp->tmpl_ns, CLONE_NEWNS) < 0 ? err_errno(err, errlen, "setns (the template)")
                                                : 0;
}

void mounts_clone_leave(const struct mount_plan *mp)
{
    /* Our own namespace and cwd (setns moved both to the template's root);
     * never go on inside the template. */
    if (setns(mp->home_ns, CLONE_NEWNS) < 0 || fchdir(mp->home_cwd) < 0)
        abort();
}
