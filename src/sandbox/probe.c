/* Runs in the fork server, once at start, before the interpreter exists (a
 * fork is cheap then, and we are single-threaded): the isolation probes of
 * probe.h. Each failure is one line naming what is missing and how to fix
 * it; forkboxd prints it and exits non-zero. */
#include "sandbox/probe.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/util.h"
#include "sandbox/seccomp.h"

/* Every namespace a sandbox gets: the clone's (spawn.c) and the cgroup
 * namespace its step 1 unshares (steps.c). */
#define PROBE_NS_FLAGS (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | \
                        CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP)

/* waitpid's status of pid, retrying EINTR. */
static int reap_status(pid_t pid)
{
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return status;
}

int probe_seccomp_kernel(char *err, size_t errlen)
{
    uint32_t action = SECCOMP_RET_USER_NOTIF;
    if (syscall(SYS_seccomp, SECCOMP_GET_ACTION_AVAIL, 0, &action) == 0)
        return 0;
    int e = errno;
    return err_fmt(err, errlen, -e,
                   "seccomp is not available (seccomp(SECCOMP_GET_ACTION_AVAIL, "
                   "SECCOMP_RET_USER_NOTIF): %s): sandboxes cannot be confined; run forkboxd on "
                   "Linux 5.0 or later with CONFIG_SECCOMP_FILTER, and not under a seccomp "
                   "profile (a container's) that refuses seccomp(2)", strerror(e));
}

int probe_seccomp_policy(const struct sbx_policy *policy, char *err, size_t errlen)
{
    pid_t pid = fork();
    if (pid < 0)
        return err_errno(err, errlen, "seccomp probe: fork: %s", strerror(errno));
    if (pid == 0) {
        /* Our exit code says how it went: 0, or the errno. */
        int listener;
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
            _exit(errno & 0xff);
        int r = policy_install(policy, &listener);
        _exit(r < 0 ? -r & 0xff : 0);
    }
    int status = reap_status(pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    int e = WIFEXITED(status) ? WEXITSTATUS(status) : EINTR;
    char how[64];
    if (WIFEXITED(status))
        snprintf(how, sizeof how, "%s", strerror(e));
    else
        snprintf(how, sizeof how, "killed by signal %d", WTERMSIG(status));
    return err_fmt(err, errlen, -e,
                   "seccomp is not available: the policy's filter cannot be loaded "
                   "(seccomp(SECCOMP_SET_MODE_FILTER) in a probe child: %s): sandboxes cannot "
                   "be confined; run forkboxd on Linux 5.0 or later with "
                   "CONFIG_SECCOMP_FILTER, and not under a seccomp profile that refuses it",
                   how);
}

/* What to do about unshare(CLONE_NEWUSER...) failing with e. */
static const char *userns_hint(int e)
{
    switch (e) {
    case ENOSPC:
    case EUSERS:
        return "a namespace count limit is 0 or used up (sysctl user.max_user_namespaces, "
               "user.max_*_namespaces), or 32 user namespaces are nested: raise the limit";
    case EPERM:
        return "the kernel refuses it to an unprivileged id (Debian: sysctl "
               "kernel.unprivileged_userns_clone=1; Ubuntu: "
               "kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile), or a "
               "container's seccomp profile forbids it";
    case EINVAL:
        return "the kernel lacks a namespace type (CONFIG_USER_NS, CONFIG_PID_NS, "
               "CONFIG_NET_NS, ...)";
    default:
        return "the host does not allow it";
    }
}

int probe_userns(uint32_t id, char *err, size_t errlen)
{
    /* res: child -> us {step, errno}; go: us -> child, closed when we are done. */
    int res[2], go[2];
    if (pipe2(res, O_CLOEXEC) < 0)
        return err_errno(err, errlen, "user namespace probe: pipe: %s", strerror(errno));
    if (pipe2(go, O_CLOEXEC) < 0) {
        int e = errno;
        close(res[0]);
        close(res[1]);
        return err_fmt(err, errlen, -e, "user namespace probe: pipe: %s", strerror(e));
    }
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(res[0]);
        close(res[1]);
        close(go[0]);
        close(go[1]);
        return err_fmt(err, errlen, -e, "user namespace probe: fork: %s", strerror(e));
    }
    if (pid == 0) {
        close(res[0]);
        close(go[1]);
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        int rec[2] = {0, 0};
        if (setresgid(id, id, 0) < 0 || setresuid(id, id, 0) < 0)
            rec[0] = 1, rec[1] = errno;
        else if (unshare(PROBE_NS_FLAGS) < 0)
            rec[0] = 2, rec[1] = errno;
        if (write_all(res[1], rec, sizeof rec) < 0)
            _exit(1);
        char b;
        while (read(go[0], &b, 1) < 0 && errno == EINTR)
            ;
        _exit(0);
    }
    close(res[1]);
    close(go[0]);
    int rec[2] = {0, 0};
    int r = read_all(res[0], rec, sizeof rec);
    close(res[0]);
    char path[32], map[64];
    if (r == 0 && rec[0] == 0) {
        /* The maps a sandbox gets (spawn.c write_maps), written by us. */
        snprintf(path, sizeof path, "/proc/%d", (int)pid);
        snprintf(map, sizeof map, "0 %u 1\n", id);
        _cleanup_close_ int dfd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
        const char *const files[] = {"setgroups", "uid_map", "gid_map"};
        for (int i = 0; i < 3 && r == 0; i++) {
            _cleanup_close_ int fd = dfd < 0 ? -1 : openat(dfd, files[i], O_WRONLY | O_CLOEXEC);
            const char *text = i ? map : "deny";
            if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
                r = -errno, rec[0] = 3, rec[1] = errno;
        }
    }
    close(go[1]); /* the child exits */
    reap_status(pid);
    if (r < 0 && rec[0] == 0)
        return err_fmt(err, errlen, r, "user namespace probe: the child died (%s)",
                       strerror(-r));
    switch (rec[0]) {
    case 0:
        return 0;
    case 1:
        return err_fmt(err, errlen, -rec[1],
                       "cannot take host id %u of --id-range for a sandbox (setresuid: %s): "
                       "forkboxd must run as root, where the ids of --id-range exist",
                       id, strerror(rec[1]));
    case 2:
        return err_fmt(err, errlen, -rec[1],
                       "user namespaces are not available (unshare of a sandbox's namespaces "
                       "as host id %u: %s): sandboxes cannot be isolated; %s",
                       id, strerror(rec[1]), userns_hint(rec[1]));
    default:
        return err_fmt(err, errlen, -rec[1],
                       "user namespaces are not usable: writing a sandbox's id maps (0 -> host "
                       "id %u): %s: forkboxd must run as root where the ids of --id-range "
                       "can be mapped", id, strerror(rec[1]));
    }
}
