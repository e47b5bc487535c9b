/* Runs in the fork server: policy_load, at start (the child installs what
 * it compiled: seccomp_install.c, its step 8).
 *
 * Compile once, install in each child (habit 2: nsjail preparePolicy /
 * applyPolicy, crun libcrun_generate_seccomp / libcrun_apply_seccomp).
 *
 * policy_load() runs in the fork server at start: policy file -> rules
 * (policy.c) -> libseccomp -> BPF exported into memory we own. The child
 * inherits that memory through clone() and policy_install() only issues
 * seccomp(2): no libseccomp, no allocation, about 0.1 ms.
 *
 * Counted refusals are SECCOMP_RET_USER_NOTIF: the kernel parks the calling
 * task and queues a notification on the listener fd that installing the
 * main filter returned. The sandbox hands that fd to the supervisor and
 * closes it before user code runs; the holder's side (count, then reply with
 * the rule's errno, never CONTINUE) is seccomp_notify.c. */
#include "sandbox/seccomp.h"

#include <errno.h>
#include <sys/wait.h>
#include <signal.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/util.h"
#include "sandbox/policy.h"
#include "sandbox/seccomp_int.h"


/* Whether any call compiles to SECCOMP_RET_USER_NOTIF (policy_build): a
 * counted refusal or a supervised call. */
static bool rules_count(const struct policy_rules *r)
{
    if (r->def == POLICY_DENY)
        return true;
    for (int nr = 0; nr < POLICY_NR_MAX; nr++)
        if (r->sys[nr].act == POLICY_DENY || r->sys[nr].act == POLICY_SUPERVISE)
            return true;
    return false;
}

/* Read a BPF program that libseccomp exported into fd (a memfd: libseccomp
 * 2.5 has no in-memory export) into an owned sock_fprog. */
static int read_bpf(int fd, struct sock_fprog *out)
{
    off_t size = lseek(fd, 0, SEEK_END);
    if (size < 0)
        return -errno;
    if (size == 0 || size % (off_t)sizeof(struct sock_filter) ||
        size / (off_t)sizeof(struct sock_filter) > BPF_MAXINSNS)
        return -E2BIG;
    struct sock_filter *f = malloc((size_t)size);
    if (!f)
        return -ENOMEM;
    for (off_t got = 0; got < size;) {
        ssize_t n = pread(fd, (char *)f + got, (size_t)(size - got), got);
        if (n <= 0) {
            free(f);
            return n < 0 ? -errno : -EIO;
        }
        got += n;
    }
    out->filter = f;
    out->len = (unsigned short)(size / (off_t)sizeof(struct sock_filter));
    return 0;
}

/* libseccomp 2.5.4 can loop forever inside seccomp_rule_add() on some
 * combinations of conditional rules for one syscall (found by fuzz-policy;
 * reproducer in tests/fuzz/regressions/policy/). A policy file must stop
 * forkboxd with a reason, never hang it, so the build runs in a child with a
 * deadline. Normal policies take about 2 ms. */
static unsigned compile_timeout_ms = 10000;

void policy_set_compile_timeout(unsigned ms) { compile_timeout_ms = ms ? ms : 1; }

_Noreturn static void compile_child(const struct policy_rules *r, int main_fd, int except_fd,
                                    int err_fd)
{
    char err[512] = "";
    scmp_filter_ctx m = NULL, x = NULL;
    int rc = policy_build(r, &m, &x, err, sizeof err);
    if (rc == 0 && (rc = seccomp_export_bpf(m, main_fd)) == 0 && x)
        rc = seccomp_export_bpf(x, except_fd);
    if (rc < 0 && !err[0])
        snprintf(err, sizeof err, "%s: exporting the filter: %s", r->path, strerror(-rc));
    if (rc < 0 && write(err_fd, err, strlen(err)) < 0)
        _exit(2);
    _exit(rc < 0 ? 1 : 0);
}

static int compile_bounded(const struct policy_rules *r, struct sbx_policy *p, char *err,
                           size_t errlen)
{
    _cleanup_close_ int main_fd = memfd_create("forkbox-bpf", MFD_CLOEXEC);
    _cleanup_close_ int except_fd = memfd_create("forkbox-bpf-except", MFD_CLOEXEC);
    int pipefd[2];
    if (main_fd < 0 || except_fd < 0 || pipe2(pipefd, O_CLOEXEC) < 0) {
        return err_fmt(err, errlen, -errno, "%s: compiling the filter: %s", r->path, strerror(errno));
    }
    _cleanup_close_ int rd = pipefd[0];
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(pipefd[1]);
        return err_fmt(err, errlen, -e, "%s: compiling the filter: fork: %s", r->path, strerror(e));
    }
    if (pid == 0) {
        close(rd);
        compile_child(r, main_fd, except_fd, pipefd[1]);
    }
    close(pipefd[1]);

    /* The pipe's write end closes when the child exits: wait for that. */
    struct pollfd pfd = {.fd = rd, .events = POLLIN};
    char msg[512];
    size_t got = 0;
    int rc = 0;
    for (;;) {
        int n = poll(&pfd, 1, (int)compile_timeout_ms);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            kill(pid, SIGKILL);
            rc = -ETIMEDOUT;
            break;
        }
        ssize_t k = read(rd, msg + got, sizeof msg - 1 - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0 || (got += (size_t)k) == sizeof msg - 1)
            break;
    }
    msg[got] = '\0';
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (rc == -ETIMEDOUT) {
        snprintf(err, errlen,
                 "%s: libseccomp did not finish compiling the filter within %.1f s (libseccomp "
                 "2.5 can loop forever on some combinations of `when` rules for one syscall; "
                 "simplify them)",
                 r->path, compile_timeout_ms / 1000.0);
        return rc;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        return err_fmt(err, errlen, -EINVAL, "%s", got ? msg : "compiling the filter failed");
    }
    if ((rc = read_bpf(main_fd, &p->main)) < 0 ||
        (lseek(except_fd, 0, SEEK_END) > 0 && (rc = read_bpf(except_fd, &p->except)) < 0)) {
        return err_fmt(err, errlen, rc, "%s: reading the compiled filter: %s", r->path, strerror(-rc));
    }
    return 0;
}

static void summarize(struct sbx_policy *p, const struct policy_rules *r)
{
    unsigned allowed = 0, refused = 0, cond_allow = 0, cond_refuse = 0;
    for (int nr = 0; nr < POLICY_NR_MAX; nr++) {
        if (r->sys[nr].act == POLICY_ALLOW)
            allowed++;
        else if (r->sys[nr].act != POLICY_NONE)
            refused++;
    }
    for (size_t i = 0; i < r->n_when; i++)
        if (r->when[i].act == POLICY_ALLOW)
            cond_allow++;
        else
            cond_refuse++;
    char def[32];
    snprintf(p->summary, sizeof p->summary,
             "%.200s: %u syscalls allowed, %u allow-when and %u refuse-when rules, %u refused "
             "by name, default %s, foreign ABIs kill; BPF %u+%u instructions",
             r->path, allowed, cond_allow, cond_refuse, refused,
             policy_action_str(r->def, r->def_err, def, sizeof def), p->main.len,
             p->except.len);
}

int policy_load(const char *path, struct sbx_policy **out, char *err, size_t errlen)
{
    struct policy_rules *r = NULL;
    struct sbx_policy *p = NULL;
    int rc = policy_parse_file(path, &r, err, errlen);
    if (rc < 0)
        return rc;
    if (!(p = calloc(1, sizeof *p))) {
        rc = -ENOMEM;
        snprintf(err, errlen, "%s: out of memory", path);
        goto out;
    }
    if ((rc = compile_bounded(r, p, err, errlen)) < 0)
        goto out;
    p->counts = rules_count(r);
    summarize(p, r);
    *out = steal_pointer(&p);
    rc = 0;
out:
    policy_free(p);
    policy_rules_free(r);
    return rc;
}

void policy_free(struct sbx_policy *p)
{
    if (!p)
        return;
    free(p->main.filter);
    free(p->except.filter);
    free(p);
}

size_t policy_bpf_len(const struct sbx_policy *p) { return (size_t)p->main.len + p->except.len; }

const char *policy_summary(const struct sbx_policy *p) { return p->summary; }
