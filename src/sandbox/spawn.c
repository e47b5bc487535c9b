/* Runs in the fork server (and in test_sandbox, which spawns as it does):
 * the parent's half of spawning one sandbox (see spawn.h). sbx_child_go()
 * also runs in the fork server's cgroup helper (placer.c).
 *
 * socketpair + sync pipe (+ the warm socket for a pooled spawn) -> into the
 * sandbox's network namespace, made ahead (netns.h) -> ONE clone() with
 * every other namespace flag and CLONE_PIDFD, made as the sandbox's own host
 * id (clone_as) -> back to our network namespace -> write
 * setgroups/uid_map/gid_map -> cgroup placement -> "go" byte (sync 1) ->
 * hand the channel end and the pidfd to the caller. What the child does from
 * clone's return is steps.c. */
#include "sandbox/spawn.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/util.h"
#include "sandbox/arch.h"
#include "sandbox/cgroups.h"
#include "sandbox/mounts.h"
#include "sandbox/netns.h"
#include "sandbox/steps.h"


int sbx_tid_probe(pid_t **out)
{
    *out = NULL;
    pid_t tid = (pid_t)syscall(SYS_gettid);
    uintptr_t self = (uintptr_t)pthread_self(), end = self + 2048;
    /* Never read past the mapping that holds our struct pthread. */
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return -errno;
    char line[512];
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && self >= lo && self < hi) {
            if (end > hi)
                end = hi;
            found = true;
            break;
        }
    }
    fclose(f);
    if (!found)
        return -ENOENT;
    pid_t *hit = NULL;
    int matches = 0;
    for (uintptr_t a = self; a + sizeof(pid_t) <= end; a += sizeof(pid_t)) {
        if (*(pid_t *)a == tid) {
            hit = (pid_t *)a;
            matches++;
        }
    }
    if (matches == 0)
        return -ENOENT;
    if (matches > 1)
        return -EEXIST;
    *out = hit;
    return 0;
}

static int write_proc(int dirfd, const char *name, const char *text)
{
    int fd = openat(dirfd, name, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t n = strlen(text);
    ssize_t w = write(fd, text, n);
    int e = errno;
    close(fd);
    if (w != (ssize_t)n)
        return w < 0 ? -e : -EIO;
    return 0;
}

/* Written by us, the parent, as root again, before the child's step 2:
 * - its oom_score_adj, OOM_ADJ_SANDBOX (core/limits.h): the OOM killer takes
 *   sandboxes first. Written with CAP_SYS_RESOURCE, which also makes it the
 *   floor (oom_score_adj_min) of the sandbox and of every process it makes:
 *   a value the sandbox wrote itself, or inherited from us, it could lower
 *   again to ours;
 * - isolated (maps), its id maps, exactly one id each way: 0 in the
 *   namespace is the sandbox's own unprivileged host id (mapping an id
 *   needs CAP_SETUID/CAP_SETGID over the parent namespace in the writer; the
 *   child could only map the id it runs as, but must not choose). */
static int write_proc_files(pid_t pid, uint32_t id, bool maps, char *err, size_t errlen)
{
    if (maps && id == 0) {
        return err_fmt(err, errlen, -EPERM, "refusing to map host root into a sandbox");
    }
    char path[32], map[64];
    snprintf(path, sizeof path, "/proc/%d", (int)pid);
    _cleanup_close_ int dfd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        return err_fmt(err, errlen, -errno, "open %s: %s", path, strerror(errno));
    }
    snprintf(map, sizeof map, "%d", OOM_ADJ_SANDBOX);
    int r = write_proc(dfd, "oom_score_adj", map);
    if (r < 0)
        return err_fmt(err, errlen, r, "writing the oom_score_adj of %d: %s", (int)pid,
                       strerror(-r));
    if (!maps)
        return 0;
    r = write_proc(dfd, "setgroups", "deny");
    if (r == 0) {
        snprintf(map, sizeof map, "0 %u 1\n", id);
        r = write_proc(dfd, "uid_map", map);
    }
    if (r == 0) {
        r = write_proc(dfd, "gid_map", map);
    }
    if (r < 0)
        snprintf(err, errlen, "writing the id maps of %d: %s", (int)pid, strerror(-r));
    return r;
}

static int send_sync(int fd, char c)
{
    ssize_t w;
    do
        w = write(fd, &c, 1);
    while (w < 0 && errno == EINTR);
    return w == 1 ? 0 : -EPIPE;
}

int sbx_child_go(int go_fd, int err)
{
    unsigned char c[2] = {SBX_NO_GO, (unsigned char)(err > 0 && err < 256 ? err : EIO)};
    ssize_t w;
    do
        w = err ? write(go_fd, c, 2) : write(go_fd, &(char){SBX_GO}, 1);
    while (w < 0 && errno == EINTR);
    int e = errno;
    close(go_fd);
    errno = e;
    return w == (err ? 2 : 1) ? 0 : -EPIPE;
}

/* The cgroup placement, when it is not deferred to whoever calls
 * sbx_child_go. */
static int place_child(const struct sbx_plan *p, pid_t pid, char *err, size_t errlen)
{
    int r = p->cgroups ? cgroups_attach(p->cgroups, pid, p->cfg) : 0;
    if (r < 0)
        snprintf(err, errlen, "cgroup placement of %d: %s", (int)pid, strerror(-r));
    return r;
}

/* Sync 1: /proc files (oom_score_adj, the maps if isolated) in place ->
 * "mapped"; sync 2: cgroups in place -> go. Deferred (SBX_SPAWN_DEFER_GO):
 * only the /proc files here; the go pipe's write end (*go_wr) moves to
 * out->go_fd and the caller places and releases the child (sbx_child_go)
 * while it runs its steps 2-4. */
static int place_and_go(const struct sbx_plan *p, struct sbx_child *out, bool maps,
                        unsigned spawn_flags, int *go_wr, char *err, size_t errlen)
{
    bool defer = spawn_flags & SBX_SPAWN_DEFER_GO;
    int ret = write_proc_files(out->pid, out->id, maps, err, errlen);
    if (ret == 0 && (ret = send_sync(*go_wr, SBX_MAPPED)) < 0)
        snprintf(err, errlen, "releasing the child: %s", strerror(-ret));
    if (ret == 0 && defer) {
        out->go_fd = *go_wr;
        *go_wr = -1;
    } else if (ret == 0) {
        ret = place_child(p, out->pid, err, errlen);
        if (ret == 0 && (ret = send_sync(*go_wr, SBX_GO)) < 0)
            snprintf(err, errlen, "releasing the child: %s", strerror(-ret));
    }
    return ret;
}

static void kill_child(struct sbx_child *c)
{
    if (c->pidfd >= 0)
        pidfd_send_signal(c->pidfd, SIGKILL, NULL, 0);
    else if (c->pid > 0)
        kill(c->pid, SIGKILL);
}

static int spawn_forked(const struct sbx_plan *p, uint32_t id, unsigned spawn_flags,
                        struct sbx_child *out, int chan[2], int sync[2], int warm_child,
                        int times_child, char *err, size_t errlen)
{
    int ack[2];
    if (pipe2(ack, O_CLOEXEC) < 0) {
        return err_fmt(err, errlen, -errno, "pipe: %s", strerror(errno));
    }
    uint64_t t0 = now_ns();
    if (times_child >= 0)
        steptime_mark_rec(out->times, ST_P_CLONE);
    pid_t pid = fork();
    if (pid != 0)
        mounts_clone_leave(p->mounts);
    if (pid < 0) {
        int e = errno;
        close(ack[0]);
        close(ack[1]);
        return err_fmt(err, errlen, -e, "fork: %s", strerror(e));
    }
    if (pid == 0) {
        close(ack[0]);
        close(sync[1]);
        close(chan[0]);
        if (out->warm_fd >= 0)
            close(out->warm_fd);
        if (out->times_fd >= 0)
            close(out->times_fd);
        struct sbx_state st = {.chan_fd = chan[1], .sync_fd = sync[0], .tools_fd = -1,
                               .warm_fd = warm_child, .times_fd = times_child, .id = id};
        sbx_middle_main(p, &st, ack[1]);
    }
    if (times_child >= 0)
        steptime_mark_rec(out->times, ST_P_CLONED);
    close(ack[1]);
    out->pid = pid;
    out->pidfd = pidfd_open(pid, 0);
    char c = 0;
    ssize_t r;
    do
        r = read(ack[0], &c, 1);
    while (r < 0 && errno == EINTR);
    close(ack[0]);
    if (out->pidfd < 0 || r != 1 || c != SBX_UNSHARED) {
        return err_fmt(err, errlen, -ECHILD, "fork path: the child did not unshare");
    }
    int ret = place_and_go(p, out, true, spawn_flags, &sync[1], err, errlen);
    out->spawn_ns = now_ns() - t0;
    if (times_child >= 0)
        steptime_mark_rec(out->times, ST_P_MAPS);
    return ret;
}

/* Non-isolated mode: a per-turn directory under /tmp with tools/ and
 * workspace/, removed when the child is reaped. */
static int make_turn_dir(uint32_t id, char **out, char *err, size_t errlen)
{
    char tmpl[] = "/tmp/forkbox-turn-XXXXXX";
    if (!mkdtemp(tmpl)) {
        return err_fmt(err, errlen, -errno, "mkdtemp: %s", strerror(errno));
    }
    char sub[sizeof tmpl + 16] = "";
    int r = 0;
    if (chmod(tmpl, 0755) < 0)
        r = -errno;
    for (int i = 0; r == 0 && i < 2; i++) {
        snprintf(sub, sizeof sub, "%s/%s", tmpl, i ? "workspace" : "tools");
        if (mkdir(sub, 0755) < 0 ||
            (geteuid() == 0 && chown(sub, id, id) < 0))
            r = -errno;
    }
    if (r == 0 && !(*out = strdup(tmpl)))
        r = -ENOMEM;
    if (r < 0) {
        snprintf(err, errlen, "turn dir %s: %s", tmpl, strerror(-r));
        if (sub[0])
            rmdir(sub);
        rmdir(tmpl);
    }
    return r;
}

/* rm -r below dirfd/name without following symlinks; the tree was written
 * by untrusted code. Depth-bounded (each level holds an fd). */
static int rm_tree_at(int at, const char *name, int depth)
{
    if (unlinkat(at, name, 0) == 0 || errno == ENOENT)
        return 0;
    if (errno != EISDIR || depth > 128)
        return -errno;
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -ENOMEM;
    }
    int r = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        int rr = rm_tree_at(dirfd(d), de->d_name, depth + 1);
        if (rr < 0 && r == 0)
            r = rr;
    }
    closedir(d);
    if (unlinkat(at, name, AT_REMOVEDIR) < 0 && r == 0)
        r = -errno;
    return r;
}

static void drop_turn_dir(struct sbx_child *c)
{
    if (c->turn_dir) {
        rm_tree_at(AT_FDCWD, c->turn_dir, 0);
        free(c->turn_dir);
        c->turn_dir = NULL;
    }
}

/* The clone of an isolated sandbox is made with the sandbox's host id as
 * our real and effective uid and gid; the saved ids stay host root, so we can
 * come back (clone_done). The kernel makes the creator's effective uid the
 * owner of a new user namespace, and charges what it counts per user to the
 * chain (namespace, uid) -> (parent namespace, owner): created by root, every
 * sandbox's processes, pending signals, inotify instances and watches were
 * also host root's, and one turn could exhaust root's share (and with it the
 * other turns'). Created by the sandbox's id, they are that id's alone.
 * The child starts with these credentials: its host id as real and effective
 * ids (unmapped until we write the maps) and host root only as saved ids,
 * which step 2 replaces. Until then no set*id call in it can name host root
 * (unmapped in its namespace), and no permission check grants anything on
 * the strength of a saved id.
 * Side effects on us: an euid change clears the parent-death signal
 * (clone_done re-arms it) and makes us non-dumpable (it stays so; a sandbox
 * undoes it for itself in step 2). We are single-threaded (CLONE_NEWUSER
 * requires it): no other thread ever runs with these ids. */
static int clone_as(uint32_t id, int *pdeath)
{
    if (prctl(PR_GET_PDEATHSIG, pdeath, 0, 0, 0) < 0 || setresgid(id, id, 0) < 0)
        return -errno;
    if (setresuid(id, id, 0) < 0) {
        int e = errno;
        if (setresgid(0, 0, 0) < 0)
            abort(); /* saved gid 0: cannot happen; never go on as the sandbox's gid */
        return -e;
    }
    return 0;
}

static void clone_done(int pdeath)
{
    /* Cannot fail (the saved ids are root); never go on as the sandbox's id. */
    if (setresuid(0, 0, 0) < 0 || setresgid(0, 0, 0) < 0)
        abort();
    if (pdeath)
        prctl(PR_SET_PDEATHSIG, pdeath, 0, 0, 0);
}

int sbx_spawn(const struct sbx_plan *p, uint32_t id, unsigned spawn_flags,
              struct sbx_child *out, char *err, size_t errlen)
{
    *out = (struct sbx_child){.pid = 0, .id = id, .pidfd = -1, .chan_fd = -1, .warm_fd = -1,
                              .go_fd = -1, .times_fd = -1};
    const struct config *cfg = p->cfg;
    if (cfg->isolate && !p->mounts) {
        return err_fmt(err, errlen, -EINVAL, "no sandbox root (mounts_build)");
    }
    if (cfg->isolate && (id == 0 || geteuid() != 0)) {
        return err_fmt(err, errlen, -EPERM, id ? "isolation needs root" : "refusing host id 0 for a sandbox");
    }

    char tools_dir[64] = "", workspace_dir[64] = "";
    if (!cfg->isolate) {
        int r = make_turn_dir(id, &out->turn_dir, err, errlen);
        if (r < 0)
            return r;
        snprintf(tools_dir, sizeof tools_dir, "%s/tools", out->turn_dir);
        snprintf(workspace_dir, sizeof workspace_dir, "%s/workspace", out->turn_dir);
    }

    int chan[2], sync[2], warm[2] = {-1, -1};
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) < 0) {
        int e = errno;
        snprintf(err, errlen, "socketpair: %s", strerror(e));
        drop_turn_dir(out);
        return -e;
    }
    if (pipe2(sync, O_CLOEXEC) < 0) {
        int e = errno;
        close(chan[0]);
        close(chan[1]);
        snprintf(err, errlen, "pipe: %s", strerror(e));
        drop_turn_dir(out);
        return -e;
    }
    /* Pooled: a socket (not a pipe: the child sends with MSG_NOSIGNAL, and
     * the fork server may close its end first, when it hands the child out
     * before the warm-up is over). */
    if ((spawn_flags & SBX_SPAWN_POOLED) &&
        socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, warm) < 0) {
        int e = errno;
        close(chan[0]);
        close(chan[1]);
        close(sync[0]);
        close(sync[1]);
        snprintf(err, errlen, "socketpair: %s", strerror(e));
        drop_turn_dir(out);
        return -e;
    }
    out->warm_fd = warm[0];
    /* --step-times, fresh spawns: the child's record comes back on a pipe
     * (core/steptime.h); without one (pipe2 failed) it just is not timed. */
    int times[2] = {-1, -1};
    if (cfg->step_times && !(spawn_flags & SBX_SPAWN_POOLED) &&
        (out->times = calloc(1, sizeof *out->times)) != NULL) {
        steptime_mark_rec(out->times, ST_P_REQUEST);
        if (pipe2(times, O_CLOEXEC | O_NONBLOCK) < 0) {
            times[0] = times[1] = -1;
            free(out->times);
            out->times = NULL;
        }
        out->times_fd = times[0];
    }

    /* The sandbox's network namespace is the one we are in when we clone
     * (or fork, on the fork path); we go home once the child exists. Its
     * mount namespace is a copy of the template's: we are in that one from
     * here until the clone (or fork) returns, not a moment longer. */
    int ret = cfg->isolate ? netns_enter(p->netns, err, errlen) : 0;
    if (ret == 0 && cfg->isolate)
        ret = mounts_clone_enter(p->mounts, err, errlen);
    if (ret < 0) {
        ; /* nothing cloned */
    } else if (cfg->isolate && (!p->tid_addr || (p->flags & SBX_PLAN_FORCE_FORK))) {
        ret = spawn_forked(p, id, spawn_flags, out, chan, sync, warm[1], times[1], err, errlen);
    } else {
        /* ONE clone: every namespace at once is far cheaper than fork +
         * unshare + fork (ARCHITECTURE.md). CLONE_CHILD_SETTID repairs
         * glibc's cached tid in the child's copy of our TCB. */
        unsigned long flags = SIGCHLD | CLONE_PIDFD;
        if (cfg->isolate)
            flags |= CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS;
        if (p->tid_addr)
            flags |= CLONE_CHILD_SETTID;
        int pidfd = -1, pdeath = 0, r;
        uint64_t t0 = now_ns();
        if (times[1] >= 0)
            steptime_mark_rec(out->times, ST_P_CLONE);
        long pid;
        if (!cfg->isolate && !p->tid_addr) {
            /* Without the tid address only glibc's own fork is safe. */
            pid = _Fork();
            if (pid > 0 && (pidfd = pidfd_open((pid_t)pid, 0)) < 0)
                kill((pid_t)pid, SIGKILL); /* reaped and released by the caller */
        } else if (cfg->isolate && (r = clone_as(id, &pdeath)) < 0) {
            mounts_clone_leave(p->mounts);
            errno = -r;
            pid = -1;
        } else {
            pid = arch_clone(flags, &pidfd, p->tid_addr);
            if (pid != 0 && cfg->isolate) {
                int e = errno;
                clone_done(pdeath);
                mounts_clone_leave(p->mounts);
                errno = e;
            }
        }
        if (pid == 0) {
            close(sync[1]);
            close(chan[0]);
            if (warm[0] >= 0)
                close(warm[0]);
            if (times[0] >= 0)
                close(times[0]);
            struct sbx_state st = {.chan_fd = chan[1], .sync_fd = sync[0], .tools_fd = -1,
                                   .warm_fd = warm[1], .times_fd = times[1], .id = id,
                                   .tools_dir = tools_dir, .workspace_dir = workspace_dir};
            sbx_child_main(p, &st);
        }
        if (times[1] >= 0)
            steptime_mark_rec(out->times, ST_P_CLONED);
        if (pid < 0) {
            ret = -errno;
            snprintf(err, errlen, "clone as id %u: %s", id, strerror(errno));
        } else {
            out->pid = (pid_t)pid;
            out->pidfd = pidfd;
            ret = place_and_go(p, out, cfg->isolate, spawn_flags, &sync[1], err, errlen);
            out->spawn_ns = now_ns() - t0;
            if (times[1] >= 0)
                steptime_mark_rec(out->times, ST_P_MAPS);
        }
    }
    if (cfg->isolate)
        netns_leave(p->netns); /* also where netns_enter failed: a no-op */
    if (times[1] >= 0)
        close(times[1]);
    close(sync[0]);
    if (sync[1] >= 0)
        close(sync[1]);
    close(chan[1]);
    if (warm[1] >= 0)
        close(warm[1]);
    if (ret < 0) {
        kill_child(out);
        close(chan[0]);
        close_and_reset(&out->warm_fd);
        close_and_reset(&out->times_fd);
        free(out->times);
        out->times = NULL;
        if (out->pid <= 0)
            drop_turn_dir(out);
        return ret;
    }
    out->chan_fd = chan[0];
    return 0;
}

void sbx_child_release(const struct sbx_plan *p, struct sbx_child *c)
{
    if (p->cgroups && c->pid > 0)
        cgroups_release(p->cgroups, c->pid);
    close_and_reset(&c->pidfd);
    close_and_reset(&c->chan_fd);
    close_and_reset(&c->warm_fd);
    close_and_reset(&c->go_fd);
    close_and_reset(&c->times_fd);
    free(c->times);
    c->times = NULL;
    drop_turn_dir(c);
}
