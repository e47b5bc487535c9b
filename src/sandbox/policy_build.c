/* The filter builder: struct policy_rules -> the two libseccomp filters (the
 * main one, and the exceptions filter that holds the conditional rules).
 * Runs in the fork server (policy_load, seccomp.c, compiles once at start),
 * in forkbox-policy and in the fuzzer; never in the sandbox child, which
 * only loads what was compiled. One query runs in the supervisor:
 * policy_deny_errno, the errno it answers a counted refusal with, which is
 * the other half of scmp_action's choice of a notification for `deny`.
 *
 * Relies on policy.c for the rules, checked so that what the file says is
 * what the filter does. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "sandbox/policy.h"
#include "sandbox/policy_int.h"

/* The action of a rule. A counted refusal is a user notification (answered
 * by whoever holds the listener) only in the main filter and only without
 * `when`: conditional refusals live in the exceptions filter, which cannot
 * have a listener of its own (one per filter stack), so they are plain
 * ERRNO there, and the same in the main filter's copy. `noop` is ERRNO 0:
 * the kernel skips the call and returns 0. `supervise` is a notification
 * the holder carries out (always unconditional, in the main filter). */
static uint32_t scmp_action(enum policy_action act, uint16_t err, bool conditional)
{
    switch (act) {
    case POLICY_ALLOW: return SCMP_ACT_ALLOW;
    case POLICY_DENY: return conditional ? SCMP_ACT_ERRNO(err) : SCMP_ACT_NOTIFY;
    case POLICY_ERRNO: return SCMP_ACT_ERRNO(err);
    case POLICY_NOOP: return SCMP_ACT_ERRNO(0);
    case POLICY_SUPERVISE: return SCMP_ACT_NOTIFY;
    default: return SCMP_ACT_KILL_PROCESS;
    }
}

uint16_t policy_deny_errno(const struct policy_rules *r, int nr)
{
    if (nr >= 0 && nr < POLICY_NR_MAX && r->sys[nr].act == POLICY_DENY)
        return r->sys[nr].err;
    return r->def == POLICY_DENY ? r->def_err : EPERM;
}

/* A filter for arch alone. The rules' numbers are that architecture's. */
static scmp_filter_ctx new_filter(uint32_t def, uint32_t arch)
{
    /* The filter is exported, never loaded by libseccomp, and it may be for
     * another kernel than this one (forkbox-policy --arch, qemu-user, which
     * has no seccomp(2)): say which actions it may use instead of letting
     * libseccomp ask the running kernel (it would refuse SCMP_ACT_NOTIFY
     * where seccomp(2) is missing). The kernel that runs sandboxes is
     * checked where they run: probe_seccomp_kernel and probe_seccomp_policy
     * (which loads this very filter) before any turn. Level 5: KILL_PROCESS
     * (3) and USER_NOTIF (5). */
    if (seccomp_api_get() < 5 && seccomp_api_set(5) < 0)
        return NULL;
    scmp_filter_ctx ctx = seccomp_init(def);
    if (!ctx)
        return NULL;
    if (arch != seccomp_arch_native() &&
        (seccomp_arch_add(ctx, arch) < 0 || seccomp_arch_remove(ctx, SCMP_ARCH_NATIVE) < 0)) {
        seccomp_release(ctx);
        return NULL;
    }
    /* Only arch is in the filter; every other ABI takes the bad-arch
     * action. On x86-64: i386 (int 0x80) and x32 (nr | __X32_SYSCALL_BIT,
     * which libseccomp checks for in the x86_64 arch). On aarch64: 32-bit
     * ARM (AArch32 EL0, AUDIT_ARCH_ARM), where the kernel has it. */
    if (seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS) < 0 ||
        seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2) < 0 || /* binary tree */
        seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0) < 0) {     /* we export, never load */
        seccomp_release(ctx);
        return NULL;
    }
    return ctx;
}

/* libseccomp reads a rule's number as the native architecture's and
 * translates it by name for each architecture in the filter, so a rule for
 * another one passes its name's native number: a negative pseudo-number
 * where this machine has no such call, which libseccomp maps back. */
static int scmp_nr(const struct policy_rules *r, int nr)
{
    if (r->arch == seccomp_arch_native())
        return nr;
    char *name = seccomp_syscall_resolve_num_arch(r->arch, nr);
    int n = name ? seccomp_syscall_resolve_name_arch(SCMP_ARCH_NATIVE, name) : __NR_SCMP_ERROR;
    free(name);
    return n;
}

static int add_when(scmp_filter_ctx ctx, const struct policy_rules *r,
                    const struct policy_when *w)
{
    struct scmp_arg_cmp cmp[6];
    for (uint8_t k = 0; k < w->ncond; k++) {
        const struct policy_cond *c = &w->cond[k];
        cmp[k] = (struct scmp_arg_cmp){
            .arg = c->arg, .op = c->op,
            .datum_a = c->op == SCMP_CMP_MASKED_EQ ? c->mask : c->value,
            .datum_b = c->op == SCMP_CMP_MASKED_EQ ? c->value : 0,
        };
    }
    int nr = scmp_nr(r, w->nr);
    if (nr == __NR_SCMP_ERROR)
        return -EFAULT;
    return seccomp_rule_add_array(ctx, scmp_action(w->act, w->err, true), nr, w->ncond, cmp);
}

int policy_build(const struct policy_rules *r, scmp_filter_ctx *mainp, scmp_filter_ctx *exceptp,
                 char *err, size_t errlen)
{
    char name[64];
    uint32_t def = scmp_action(r->def, r->def_err, false);
    scmp_filter_ctx m = new_filter(def, r->arch), x = NULL;
    int rc;
    *mainp = *exceptp = NULL;
    if (!m) {
        return err_fmt(err, errlen, -ENOMEM, "%s: libseccomp: cannot create a filter", r->path);
    }
    for (int nr = 0; nr < POLICY_NR_MAX; nr++) {
        const struct policy_sys *s = &r->sys[nr];
        uint32_t a = scmp_action(s->act, s->err, false);
        if (s->act == POLICY_NONE || a == def) /* the default already does it */
            continue;
        int n = scmp_nr(r, nr);
        if ((rc = n == __NR_SCMP_ERROR ? -EFAULT : seccomp_rule_add(m, a, n, 0)) < 0) {
            snprintf(err, errlen, "%s:%u: libseccomp refused the rule for '%s': %s", r->path,
                     s->line, rule_name(r, nr, name), strerror(-rc));
            goto fail;
        }
    }
    for (size_t i = 0; i < r->n_when; i++) {
        const struct policy_when *w = &r->when[i];
        rc = 0;
        if (refusing(w->act)) {
            if (!x && !(x = new_filter(SCMP_ACT_ALLOW, r->arch))) {
                rc = -ENOMEM;
                snprintf(err, errlen, "%s: libseccomp: cannot create a filter", r->path);
                goto fail;
            }
            rc = add_when(x, r, w);
            /* The kernel takes the most restrictive result of all filters
             * (KILL > ERRNO > USER_NOTIF), and of two ERRNO results the
             * main filter's (loaded last, run first). Without an
             * unconditional rule the main filter would send these calls to
             * its default, so it must return the same refusal for them. */
            if (rc == 0 && r->sys[w->nr].act == POLICY_NONE &&
                scmp_action(w->act, w->err, true) != def)
                rc = add_when(m, r, w);
        } else {
            rc = add_when(m, r, w);
        }
        if (rc < 0) {
            snprintf(err, errlen, "%s:%u: libseccomp refused the rule for '%s': %s", r->path,
                     w->line, rule_name(r, w->nr, name), strerror(-rc));
            goto fail;
        }
    }
    *mainp = m;
    *exceptp = x;
    return 0;
fail:
    seccomp_release(m);
    if (x)
        seccomp_release(x);
    return rc;
}
