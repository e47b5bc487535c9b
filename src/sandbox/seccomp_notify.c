/* Runs in the supervisor (forkboxd): answering a sandbox's seccomp listener
 * (see seccomp_notify.h). The filter it answers for is compiled in the fork
 * server and installed in the child (seccomp.c); the holder only parses the
 * same policy file for its errno table and compiles nothing.
 *
 * Counted refusals are SECCOMP_RET_USER_NOTIF: the kernel parks the calling
 * task and queues a notification on the listener. We count it and reply
 * with the rule's errno; we never reply CONTINUE, so no refused call runs. */
#include "sandbox/seccomp_notify.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/util.h"
#include "sandbox/policy.h"

struct policy_notify {
    uint16_t err[POLICY_NR_MAX]; /* errno of a counted refusal, per native syscall */
    bool supervised[POLICY_NR_MAX]; /* `supervise`: the holder carries the call out */
    uint32_t arch;               /* AUDIT_ARCH_* of the native ABI (= SCMP_ARCH_NATIVE's) */
    size_t req_size, resp_size;  /* at least the kernel's sizes and ours */
    struct seccomp_notif *req;   /* owned */
    struct seccomp_notif_resp *resp; /* owned */
};

int policy_notify_load(const char *path, struct policy_notify **out, char *err, size_t errlen)
{
    *out = NULL;
    struct policy_rules *r = NULL;
    int rc = policy_parse_file(path, &r, err, errlen);
    if (rc < 0)
        return rc;
    struct seccomp_notif_sizes sz = {0};
    if (syscall(SYS_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &sz) < 0) {
        rc = -errno;
        snprintf(err, errlen, "seccomp(SECCOMP_GET_NOTIF_SIZES): %s", strerror(-rc));
        policy_rules_free(r);
        return rc;
    }
    struct policy_notify *n = calloc(1, sizeof *n);
    if (n) {
        n->req_size = sz.seccomp_notif > sizeof *n->req ? sz.seccomp_notif : sizeof *n->req;
        n->resp_size = sz.seccomp_notif_resp > sizeof *n->resp ? sz.seccomp_notif_resp
                                                               : sizeof *n->resp;
        n->req = calloc(1, n->req_size);
        n->resp = calloc(1, n->resp_size);
    }
    if (!n || !n->req || !n->resp) {
        policy_notify_free(n);
        policy_rules_free(r);
        return err_fmt(err, errlen, -ENOMEM, "%s: out of memory", path);
    }
    for (int nr = 0; nr < POLICY_NR_MAX; nr++) {
        n->err[nr] = policy_deny_errno(r, nr);
        n->supervised[nr] = r->sys[nr].act == POLICY_SUPERVISE;
    }
    n->arch = seccomp_arch_native();
    policy_rules_free(r);
    *out = n;
    return 0;
}

void policy_notify_free(struct policy_notify *n)
{
    if (!n)
        return;
    free(n->req);
    free(n->resp);
    free(n);
}

int policy_notify_errno(const struct policy_notify *n, int nr)
{
    int e = nr >= 0 && nr < POLICY_NR_MAX ? n->err[nr] : 0;
    return e > 0 && e < 4096 ? e : EPERM; /* never 0: that would fake a success */
}

int policy_notify_answer(struct policy_notify *n, int listener, int *nr, int *pid)
{
    *nr = -1;
    *pid = 0;
    /* RECV waits for a request when none is counted as pending, so look
     * first. POLLIN means a notification is queued that no one has received;
     * the kernel counts one pending request for each, and only RECV takes
     * them away: as the only reader we find ours without waiting (ENOENT if
     * its task went away meanwhile). */
    struct pollfd pfd = {.fd = listener, .events = POLLIN};
    int pr = poll(&pfd, 1, 0);
    if (pr < 0)
        return errno == EINTR ? POLICY_NOTIFY_NONE : -errno;
    if (pfd.revents & POLLNVAL)
        return -EBADF;
    if (!(pfd.revents & POLLIN))
        return (pfd.revents & POLLHUP) ? -EPIPE : POLICY_NOTIFY_NONE;

    memset(n->req, 0, n->req_size); /* the kernel refuses a dirty buffer */
    if (ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, n->req) < 0)
        return errno == ENOENT ? POLICY_NOTIFY_GONE
                               : errno == EINTR ? POLICY_NOTIFY_NONE : -errno;
    /* Foreign ABIs are killed by the filter and never get here; whatever
     * comes, it is refused. */
    int num = n->req->data.arch == n->arch && n->req->data.nr >= 0 ? n->req->data.nr : -1;
    *nr = num;
    *pid = (int)n->req->pid;
    if (num >= 0 && num < POLICY_NR_MAX && n->supervised[num])
        return POLICY_NOTIFY_SUPERVISE; /* the caller answers (policy_notify_reply) */
    int rc = policy_notify_reply(n, listener, n->req->id, 0, policy_notify_errno(n, num));
    if (rc != 0) {
        *nr = -1;
        *pid = 0;
        return rc;
    }
    return POLICY_NOTIFY_ANSWERED;
}

const struct seccomp_notif *policy_notify_request(const struct policy_notify *n)
{
    return n->req;
}

int policy_notify_reply(struct policy_notify *n, int listener, uint64_t id, int64_t val, int err)
{
    memset(n->resp, 0, n->resp_size);
    n->resp->id = id;
    n->resp->error = err ? -err : 0;
    n->resp->val = err ? 0 : val;
    n->resp->flags = 0; /* never SECCOMP_USER_NOTIF_FLAG_CONTINUE */
    if (ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, n->resp) < 0)
        return errno == ENOENT ? POLICY_NOTIFY_GONE : -errno;
    return 0;
}

bool policy_notify_valid(int listener, uint64_t id)
{
    return ioctl(listener, SECCOMP_IOCTL_NOTIF_ID_VALID, &id) == 0;
}

#ifndef PIDFD_THREAD
#define PIDFD_THREAD O_EXCL /* Linux 6.9: a pidfd for a thread, not only a leader */
#endif

/* The thread group of task pid, from /proc: for pidfd_open() on kernels
 * before 6.9, which take only a thread-group leader. -1 if unknown. */
static pid_t tgid_of(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t k = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
    if (k <= 0)
        return -1;
    buf[k] = '\0';
    const char *t = strstr(buf, "\nTgid:");
    return t ? (pid_t)strtol(t + 6, NULL, 10) : -1;
}

int policy_notify_getfd(int listener, const struct seccomp_notif *req, int target_fd)
{
    pid_t pid = (pid_t)req->pid;
    if (pid <= 0)
        return -ESRCH; /* the caller is in no pid namespace of ours */
    int pidfd = (int)syscall(SYS_pidfd_open, pid, PIDFD_THREAD);
    if (pidfd < 0 && errno == EINVAL) {
        pid_t tgid = tgid_of(pid); /* before 6.9: the leader's fd table (shared by threads) */
        pidfd = tgid > 0 ? (int)syscall(SYS_pidfd_open, tgid, 0) : -1;
        if (tgid <= 0)
            errno = ESRCH;
    }
    if (pidfd < 0)
        return -errno;
    /* The request is still pending, so its task is alive and blocked in the
     * call: the pid was not reused between RECV and pidfd_open, and the
     * pidfd is that task's (or, before 6.9, its thread group's). */
    if (!policy_notify_valid(listener, req->id)) {
        close(pidfd);
        return -ESRCH;
    }
    int fd = (int)syscall(SYS_pidfd_getfd, pidfd, target_fd, 0);
    int e = errno;
    close(pidfd);
    return fd < 0 ? -e : fd;
}
