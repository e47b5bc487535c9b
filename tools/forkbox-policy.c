/* forkbox-policy: check a seccomp policy file the way forkboxd will, and show
 * what it compiles to.
 *
 *   forkbox-policy [--summary|--pfc|--groups] [--arch ARCH] [FILE]
 *         (default FILE: the policy forkboxd loads without --policy: the
 *          installed one, or the source tree's for the build tree's copy)
 *
 * --arch (aarch64, x86_64...: libseccomp's names) resolves the names and
 * builds the filter for that architecture instead of this machine's, as
 * forkboxd would there: a policy can be checked for arm64 on an x86-64
 * build machine (docs/compatibility.md, "aarch64").
 *
 * Exit 0 if the policy compiles, 1 with "file:line: reason" on stderr if not,
 * 2 on usage errors. --pfc prints libseccomp's pseudo filter code for both
 * filters; in it, NOTIFY is a counted denial (a user notification the
 * supervisor answers with the rule's errno and counts). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "sandbox/policy.h"
#include "sandbox/seccomp.h"

static void print_groups(const struct policy_rules *r)
{
    for (size_t i = 0; i < r->n_groups; i++) {
        const struct policy_group *g = &r->groups[i];
        printf("%s (line %u, %zu syscalls%s):", g->name, g->line, g->n,
               g->used ? "" : ", unused");
        for (size_t k = 0; k < g->n; k++) {
            char name[64];
            printf(" %s", policy_syscall_name_arch(r->arch, g->nrs[k], name, sizeof name));
        }
        printf("\n");
    }
}

static void print_rules(const struct policy_rules *r)
{
    char a[32], name[64];
    printf("default: %s\n", policy_action_str(r->def, r->def_err, a, sizeof a));
    for (int nr = 0; nr < POLICY_NR_MAX; nr++)
        if (r->sys[nr].act != POLICY_NONE)
            printf("%-24s %s\n", policy_syscall_name_arch(r->arch, nr, name, sizeof name),
                   policy_action_str(r->sys[nr].act, r->sys[nr].err, a, sizeof a));
    for (size_t i = 0; i < r->n_when; i++) {
        const struct policy_when *w = &r->when[i];
        printf("%-24s %s when", policy_syscall_name_arch(r->arch, w->nr, name, sizeof name),
               policy_action_str(w->act, w->err, a, sizeof a));
        for (uint8_t k = 0; k < w->ncond; k++) {
            const struct policy_cond *c = &w->cond[k];
            static const char *const op[] = { [SCMP_CMP_NE] = "!=", [SCMP_CMP_LT] = "<",
                [SCMP_CMP_LE] = "<=", [SCMP_CMP_EQ] = "==", [SCMP_CMP_GE] = ">=",
                [SCMP_CMP_GT] = ">", [SCMP_CMP_MASKED_EQ] = "==" };
            printf("%s arg%u", k ? " and" : "", c->arg);
            if (c->op == SCMP_CMP_MASKED_EQ)
                printf(" & 0x%llx", (unsigned long long)c->mask);
            printf(" %s 0x%llx", op[c->op], (unsigned long long)c->value);
        }
        printf("   (line %u)\n", w->line);
    }
    if (r->n_foreign)
        printf("# %u names are not syscalls on this architecture and were skipped\n",
               r->n_foreign);
}

static void print_pfc(scmp_filter_ctx m, scmp_filter_ctx x)
{
    printf("# main filter (default: %s)\n", "see summary");
    fflush(stdout);
    seccomp_export_pfc(m, STDOUT_FILENO);
    if (x) {
        printf("# exceptions filter (default allow; the stricter result wins)\n");
        fflush(stdout);
        seccomp_export_pfc(x, STDOUT_FILENO);
    }
}

/* --arch: parse and build for another architecture, in this process (the
 * compile deadline of policy_load is for the daemon). */
static int foreign(const char *path, uint32_t arch, const char *mode)
{
    char err[512];
    struct policy_rules *r;
    if (policy_parse_file_arch(path, arch, &r, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    scmp_filter_ctx m, x;
    if (policy_build(r, &m, &x, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        policy_rules_free(r);
        return 1;
    }
    if (strcmp(mode, "--summary") == 0)
        printf("%s: compiles for arch 0x%x; %u names are not syscalls there and were skipped; "
               "foreign ABIs kill\n", r->path, arch, r->n_foreign);
    else if (strcmp(mode, "--groups") == 0)
        print_groups(r);
    else if (strcmp(mode, "--rules") == 0)
        print_rules(r);
    else
        print_pfc(m, x);
    seccomp_release(m);
    if (x)
        seccomp_release(x);
    policy_rules_free(r);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = "--summary", *path = config_default_policy();
    uint32_t arch = seccomp_arch_native();
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--arch") == 0) {
            arch = i + 1 < argc ? seccomp_arch_resolve_name(argv[++i]) : 0;
            if (!arch) {
                fprintf(stderr, "%s: --arch wants an architecture libseccomp knows (aarch64, "
                        "x86_64...)\n", argv[0]);
                return 2;
            }
            continue;
        }
        if (strcmp(argv[i], "--summary") == 0 || strcmp(argv[i], "--pfc") == 0 ||
            strcmp(argv[i], "--groups") == 0 || strcmp(argv[i], "--rules") == 0)
            mode = argv[i];
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: %s [--summary|--rules|--groups|--pfc] [--arch ARCH] [FILE]\n", argv[0]);
            return 0;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "%s: unknown option %s\n", argv[0], argv[i]);
            return 2;
        } else
            path = argv[i];
    }

    char err[512];
    struct sbx_policy *pol = NULL;
    if (arch != seccomp_arch_native())
        return foreign(path, arch, mode);
    if (policy_load(path, &pol, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    struct policy_rules *r;
    if (policy_parse_file(path, &r, err, sizeof err) < 0) { /* cannot fail after load */
        fprintf(stderr, "%s\n", err);
        policy_free(pol);
        return 1;
    }

    int rc = 0;
    if (strcmp(mode, "--summary") == 0) {
        printf("%s\n", policy_summary(pol));
    } else if (strcmp(mode, "--groups") == 0) {
        print_groups(r);
    } else if (strcmp(mode, "--rules") == 0) {
        print_rules(r);
    } else {
        scmp_filter_ctx m, x;
        if (policy_build(r, &m, &x, err, sizeof err) < 0) {
            fprintf(stderr, "%s\n", err);
            rc = 1;
        } else {
            print_pfc(m, x);
            if (x)
                seccomp_release(x);
            seccomp_release(m);
        }
    }
    policy_rules_free(r);
    policy_free(pol);
    return rc;
}
