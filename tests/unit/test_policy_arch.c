/* The seccomp policy on another architecture, checked without running it:
 * policy/default.policy is compiled for aarch64 and for x86-64 (one of them
 * foreign to this machine: policy_parse_file_arch, policy_build), both
 * filters are exported as BPF and run here by a small classic-BPF
 * interpreter on made-up seccomp_data, combined as the kernel combines the
 * two filters of a sandbox. No privilege, no seccomp(2): it also runs under
 * qemu-aarch64-static (tools/cross-arm64), where aarch64 is the native one.
 *
 * What it holds to:
 *   - every call of another ABI is killed: 32-bit ARM (AUDIT_ARCH_ARM) and
 *     x86-64 numbers in the aarch64 filter; i386 and x32 in the x86-64 one;
 *   - every syscall name the two architectures share gets the same result
 *     from both filters, for argument values at and around every `when`
 *     condition of the policy (so skipping names that are not syscalls on
 *     arm64, such as open or fork, and translating numbers by name weakens
 *     nothing);
 *   - an aarch64 syscall x86-64 lacks (none in libseccomp 2.5.4) is not
 *     allowed. */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sandbox/policy.h"
#include "tap.h"

#define BAD_OPCODE 0xdeadbeefu

struct prog {
    struct sock_filter *f;  /* owned */
    size_t n;
};

/* A classic BPF program as the kernel runs a seccomp filter: only what
 * libseccomp emits; anything else returns BAD_OPCODE, which no check
 * accepts. */
static uint32_t run_bpf(const struct prog *p, const struct seccomp_data *d)
{
    uint32_t a = 0;
    for (size_t pc = 0; pc < p->n; pc++) {
        const struct sock_filter *i = &p->f[pc];
        switch (i->code) {
        case BPF_LD | BPF_W | BPF_ABS:
            if (i->k + 4 > sizeof *d)
                return BAD_OPCODE;
            memcpy(&a, (const char *)d + i->k, 4);
            break;
        case BPF_ALU | BPF_AND | BPF_K: a &= i->k; break;
        case BPF_JMP | BPF_JA: pc += i->k; break;
        case BPF_JMP | BPF_JEQ | BPF_K: pc += a == i->k ? i->jt : i->jf; break;
        case BPF_JMP | BPF_JGT | BPF_K: pc += a > i->k ? i->jt : i->jf; break;
        case BPF_JMP | BPF_JGE | BPF_K: pc += a >= i->k ? i->jt : i->jf; break;
        case BPF_JMP | BPF_JSET | BPF_K: pc += (a & i->k) ? i->jt : i->jf; break;
        case BPF_RET | BPF_K: return i->k;
        default: return BAD_OPCODE;
        }
    }
    return BAD_OPCODE; /* fell off the end */
}

/* The kernel's combination (kernel/seccomp.c, seccomp_run_filters): the
 * lowest action as a signed value wins (KILL_PROCESS lowest, ALLOW
 * highest); on a tie, the filter run first, the main one (installed last,
 * seccomp_install.c). */
static uint32_t run_both(const struct prog *m, const struct prog *x, const struct seccomp_data *d)
{
    uint32_t rm = run_bpf(m, d);
    if (!x->n || rm == BAD_OPCODE)
        return rm;
    uint32_t rx = run_bpf(x, d);
    if (rx == BAD_OPCODE)
        return rx;
    return (int32_t)(rx & SECCOMP_RET_ACTION_FULL) < (int32_t)(rm & SECCOMP_RET_ACTION_FULL) ? rx
                                                                                              : rm;
}

static int export(scmp_filter_ctx ctx, struct prog *out)
{
    out->f = NULL;
    out->n = 0;
    if (!ctx)
        return 0;
    int fd = memfd_create("bpf", MFD_CLOEXEC);
    if (fd < 0 || seccomp_export_bpf(ctx, fd) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    off_t size = lseek(fd, 0, SEEK_END);
    out->f = malloc(size > 0 ? (size_t)size : 1);
    int rc = size > 0 && out->f && pread(fd, out->f, (size_t)size, 0) == size ? 0 : -1;
    out->n = rc == 0 ? (size_t)size / sizeof *out->f : 0;
    close(fd);
    return rc;
}

struct compiled {
    uint32_t arch;          /* SCMP_ARCH_* */
    struct policy_rules *r; /* owned */
    struct prog main, except;
};

static int compile(const char *path, uint32_t arch, struct compiled *c)
{
    char err[512];
    scmp_filter_ctx m = NULL, x = NULL;
    c->arch = arch;
    int rc = policy_parse_file_arch(path, arch, &c->r, err, sizeof err);
    if (rc == 0)
        rc = policy_build(c->r, &m, &x, err, sizeof err);
    if (rc == 0)
        rc = export(m, &c->main) < 0 || export(x, &c->except) < 0 ? -EIO : 0;
    if (rc < 0)
        printf("# %s\n", err);
    if (m)
        seccomp_release(m);
    if (x)
        seccomp_release(x);
    return rc;
}

static uint32_t eval(const struct compiled *c, uint32_t audit_arch, int nr, const uint64_t *args)
{
    struct seccomp_data d = {.nr = nr, .arch = audit_arch};
    memcpy(d.args, args, sizeof d.args);
    return run_both(&c->main, &c->except, &d);
}

static void test_foreign_abis(const struct compiled *a64, const struct compiled *x86)
{
    static const uint64_t zero[6];
    unsigned bad = 0, first = 0;
    for (int nr = 0; nr < 1024; nr++) {
        const struct {
            const struct compiled *c;
            uint32_t arch;
            int nr;
        } probes[] = {
            {a64, AUDIT_ARCH_ARM, nr},
            {a64, AUDIT_ARCH_X86_64, nr},
            {a64, AUDIT_ARCH_I386, nr},
            {x86, AUDIT_ARCH_I386, nr},
            {x86, AUDIT_ARCH_AARCH64, nr},
            {x86, AUDIT_ARCH_X86_64, nr | 0x40000000 /* __X32_SYSCALL_BIT */},
        };
        for (size_t i = 0; i < sizeof probes / sizeof *probes; i++)
            if (eval(probes[i].c, probes[i].arch, probes[i].nr, zero) != SECCOMP_RET_KILL_PROCESS &&
                !bad++)
                first = (unsigned)(i * 10000 + (unsigned)nr);
    }
    ok(bad == 0, "32-bit ARM, i386, x32 and the other 64-bit ABI are killed, every number "
       "(%u not; first: probe %u nr %u)", bad, first / 10000, first % 10000);
    /* The one a reader asks about, spelled out: ARM's getpid (20). */
    is_int(eval(a64, AUDIT_ARCH_ARM, 20, zero), SECCOMP_RET_KILL_PROCESS,
           "aarch64 filter: AArch32 getpid kills");
}

/* Argument vectors that sit on and beside every condition of the policy. */
static size_t arg_vectors(const struct policy_rules *r, uint64_t (*v)[6], size_t max)
{
    size_t n = 0;
    memset(v[n++], 0, sizeof v[0]);
    memset(v[n++], 0xff, sizeof v[0]);
    for (size_t i = 0; i < r->n_when && n + 3 <= max; i++)
        for (int delta = -1; delta <= 1; delta++) {
            memset(v[n], 0, sizeof v[0]);
            for (uint8_t k = 0; k < r->when[i].ncond; k++)
                v[n][r->when[i].cond[k].arg] = r->when[i].cond[k].value + (uint64_t)delta;
            n++;
        }
    return n;
}

static void test_same_by_name(const struct compiled *a64, const struct compiled *x86)
{
    static uint64_t v[3 * POLICY_MAX_WHEN + 2][6];
    size_t nv = arg_vectors(x86->r, v, sizeof v / sizeof *v);
    unsigned shared = 0, differ = 0;
    char first[160] = "";
    for (int nx = 0; nx < POLICY_NR_MAX; nx++) {
        char *name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_X86_64, nx);
        int na = name ? seccomp_syscall_resolve_name_arch(SCMP_ARCH_AARCH64, name) : -1;
        if (na >= 0) {
            shared++;
            for (size_t i = 0; i < nv; i++) {
                uint32_t rx = eval(x86, AUDIT_ARCH_X86_64, nx, v[i]);
                uint32_t ra = eval(a64, AUDIT_ARCH_AARCH64, na, v[i]);
                if (rx != ra || rx == BAD_OPCODE) {
                    if (!differ++)
                        snprintf(first, sizeof first, "%s (x86-64 %d, aarch64 %d), vector %zu: "
                                 "%#x vs %#x", name, nx, na, i, rx, ra);
                    break;
                }
            }
        }
        free(name);
    }
    ok(shared > 250 && differ == 0,
       "the %u syscalls both have get the same result by name, over %zu argument vectors "
       "(%u differ%s%s)", shared, nv, differ, first[0] ? "; first: " : "", first);

    /* Calls only aarch64 has (none in libseccomp 2.5.4's table): not allowed. */
    static const uint64_t zero[6];
    unsigned own = 0, allowed = 0;
    for (int na = 0; na < POLICY_NR_MAX; na++) {
        char *name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_AARCH64, na);
        if (name && seccomp_syscall_resolve_name_arch(SCMP_ARCH_X86_64, name) < 0) {
            own++;
            allowed += eval(a64, AUDIT_ARCH_AARCH64, na, zero) == SECCOMP_RET_ALLOW;
        }
        free(name);
    }
    is_int(allowed, 0, "none of the %u calls only aarch64 has is allowed", own);

    /* The names skipped on aarch64 exist there as *at / 2 / p variants the
     * policy rules the same way; the count is what policy/README.md lists. */
    ok(a64->r->n_foreign > x86->r->n_foreign,
       "aarch64 skips the legacy names (%u) x86-64 has (x86-64 skips %u)", a64->r->n_foreign,
       x86->r->n_foreign);
}

int main(void)
{
    const char *src = getenv("FORKBOX_SRCDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/policy/default.policy", src ? src : ".");

    struct compiled a64 = {0}, x86 = {0};
    is_int(compile(path, SCMP_ARCH_AARCH64, &a64), 0, "default.policy compiles for aarch64");
    is_int(compile(path, SCMP_ARCH_X86_64, &x86), 0, "default.policy compiles for x86-64");
    if (a64.main.n && x86.main.n) {
        test_foreign_abis(&a64, &x86);
        test_same_by_name(&a64, &x86);
    }
    free(a64.main.f);
    free(a64.except.f);
    free(x86.main.f);
    free(x86.except.f);
    policy_rules_free(a64.r);
    policy_rules_free(x86.r);
    return tap_done();
}
