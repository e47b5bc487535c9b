/* Compile once, install in each child (habit 2: nsjail preparePolicy /
 * applyPolicy, crun libcrun_generate_seccomp / libcrun_apply_seccomp).
 *
 * policy_load() runs in the fork server at start: policy file -> rules
 * (policy.c) -> libseccomp -> BPF exported into memory we own. The child
 * inherits that memory through clone() and policy_install() only issues
 * seccomp(2): no libseccomp, no allocation, about 0.1 ms. */
#include "sandbox/seccomp.h"

#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "sandbox/policy.h"

#ifndef SYS_SECCOMP
#define SYS_SECCOMP 1 /* si_code of a seccomp SIGSYS */
#endif

struct sbx_policy {
    struct sock_fprog main;   /* .filter owned: the allowlist */
    struct sock_fprog except; /* .filter owned, .len 0 if none: refusing `when` rules */
    uint16_t deny_errno[POLICY_NR_MAX]; /* errno of a counted denial, per syscall */
    char summary[512];
};

/* Export a filter into an owned sock_fprog. libseccomp 2.5 has no in-memory
 * export, so go through a memfd. */
static int export_bpf(scmp_filter_ctx ctx, struct sock_fprog *out)
{
    _cleanup_close_ int fd = memfd_create("forkbox-bpf", MFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = seccomp_export_bpf(ctx, fd);
    if (rc < 0)
        return rc;
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
    scmp_filter_ctx m = NULL, x = NULL;
    struct sbx_policy *p = NULL;
    int rc = policy_parse_file(path, &r, err, errlen);
    if (rc < 0)
        return rc;
    if ((rc = policy_build(r, &m, &x, err, errlen)) < 0)
        goto out;
    if (!(p = calloc(1, sizeof *p))) {
        rc = -ENOMEM;
        snprintf(err, errlen, "%s: out of memory", path);
        goto out;
    }
    if ((rc = export_bpf(m, &p->main)) < 0 || (x && (rc = export_bpf(x, &p->except)) < 0)) {
        snprintf(err, errlen, "%s: exporting the filter: %s", path, strerror(-rc));
        goto out;
    }
    for (int nr = 0; nr < POLICY_NR_MAX; nr++)
        p->deny_errno[nr] = policy_deny_errno(r, nr);
    summarize(p, r);
    *out = steal_pointer(&p);
    rc = 0;
out:
    policy_free(p);
    if (m)
        seccomp_release(m);
    if (x)
        seccomp_release(x);
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

/* --- child side ---
 *
 * The only mutable globals of this module, and they exist only in a sandbox
 * child: a signal handler has no other way to reach its data. The fork server
 * never installs the handler, so every child starts from 0. */
static const struct sbx_policy *installed;
static uint64_t denied_count;
static int denied_last = -1;

/* SIGSYS from SECCOMP_RET_TRAP: the kernel skipped the syscall; what we put
 * in the return register is what the caller sees. Async-signal-safe: two
 * atomics and a table read. */
static void on_sigsys(int sig, siginfo_t *si, void *ucv)
{
    (void)sig;
    if (si->si_code != SYS_SECCOMP)
        return; /* kill(getpid(), SIGSYS) from user code: nothing to answer */
    ucontext_t *uc = ucv;
    int nr = si->si_syscall;
    const struct sbx_policy *p = installed;
    long e = (p && nr >= 0 && nr < POLICY_NR_MAX) ? p->deny_errno[nr] : EPERM;
    __atomic_fetch_add(&denied_count, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&denied_last, nr, __ATOMIC_RELAXED);
#if defined(__x86_64__)
    uc->uc_mcontext.gregs[REG_RAX] = -e;
#elif defined(__aarch64__)
    uc->uc_mcontext.regs[0] = (unsigned long long)-e;
#else
#error "set the syscall return register for this architecture"
#endif
}

int policy_install(const struct sbx_policy *p)
{
    /* The kernel refuses an unprivileged filter without no_new_privs; check
     * so that a missing step is named rather than showing up as EACCES. */
    if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1)
        return -EPERM;
    installed = p;
    struct sigaction sa = { .sa_sigaction = on_sigsys, .sa_flags = SA_SIGINFO };
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSYS, &sa, NULL) < 0)
        return -errno;
    /* Exceptions first: the main filter refuses seccomp(2) itself, so it
     * must be the last one loaded. No TSYNC: the child has one thread. */
    if (p->except.len &&
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &p->except) < 0)
        return -errno;
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &p->main) < 0)
        return -errno;
    return 0;
}

uint64_t policy_denied_count(void) { return __atomic_load_n(&denied_count, __ATOMIC_RELAXED); }

int policy_denied_last(void) { return __atomic_load_n(&denied_last, __ATOMIC_RELAXED); }

const char *policy_syscall_name(int nr, char *buf, size_t len)
{
    char *s = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, nr);
    snprintf(buf, len, "%s", s ? s : "?");
    free(s);
    return buf;
}
