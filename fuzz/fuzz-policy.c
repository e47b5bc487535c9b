/* The seccomp policy parser (sandbox/policy.h) on arbitrary text, and, for
 * text it accepts, the rest of what forkboxd does at start: policy_load()
 * reads the same bytes from a file (a memfd, through /proc/self/fd),
 * builds the libseccomp filters and exports the BPF. Nothing is installed.
 *
 * Properties:
 *   - policy_parse() returns 0, -EINVAL or -ENOMEM; an error message starts
 *     with the path and a line number ("path:line: reason");
 *   - accepted rules are within the documented ranges: a default that
 *     refuses, syscall numbers below POLICY_NR_MAX, at most six conditions
 *     on arguments 0..5, masks only with ==, group names starting with '@',
 *     ceilings on groups and `when` rules; policy_deny_errno() agrees with
 *     the rules;
 *   - what the parser accepts, the daemon can load: policy_load() on the
 *     same bytes succeeds and yields a non-empty BPF program, or refuses
 *     with "file:line: reason" where libseccomp checks something the parser
 *     does not model (e.g. two `when` rules with the same condition and
 *     different actions), or reports -ETIMEDOUT where libseccomp 2.5.4
 *     loops forever on some `when` rules (policy_load compiles in a child
 *     with a deadline; see tests/fuzz/regressions/policy/); what the parser
 *     refuses, policy_load() refuses too. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"
#include "sandbox/policy.h"
#include "sandbox/seccomp.h"

static const char path[] = "fuzz.policy";

static bool refusing(enum policy_action a)
{
    return a == POLICY_DENY || a == POLICY_ERRNO || a == POLICY_KILL;
}

static void check_rules(const struct policy_rules *r)
{
    FUZZ_ASSERT(refusing(r->def), "default action %d", (int)r->def);
    FUZZ_ASSERT(r->n_when <= POLICY_MAX_WHEN, "%zu when rules", r->n_when);
    FUZZ_ASSERT(r->n_groups <= POLICY_MAX_GROUPS, "%zu groups", r->n_groups);
    for (int nr = 0; nr < POLICY_NR_MAX; nr++) {
        const struct policy_sys *s = &r->sys[nr];
        FUZZ_ASSERT(s->act >= POLICY_NONE && s->act <= POLICY_SUPERVISE, "action %d",
                    (int)s->act);
        if (s->act == POLICY_DENY)
            FUZZ_ASSERT(policy_deny_errno(r, nr) == s->err, "deny errno of %d", nr);
        if (s->act == POLICY_SUPERVISE)
            FUZZ_ASSERT(policy_supervisable(nr), "supervise on %d, which has no handler", nr);
    }
    for (size_t i = 0; i < r->n_when; i++) {
        const struct policy_when *w = &r->when[i];
        FUZZ_ASSERT(w->nr >= 0 && w->nr < POLICY_NR_MAX, "when rule on syscall %d", w->nr);
        FUZZ_ASSERT(w->act >= POLICY_ALLOW && w->act <= POLICY_NOOP, "when action %d",
                    (int)w->act);
        FUZZ_ASSERT(w->ncond >= 1 && w->ncond <= 6, "%u conditions", (unsigned)w->ncond);
        for (unsigned k = 0; k < w->ncond; k++) {
            const struct policy_cond *c = &w->cond[k];
            FUZZ_ASSERT(c->arg <= 5, "condition on arg%u", (unsigned)c->arg);
            FUZZ_ASSERT(c->op >= SCMP_CMP_NE && c->op <= SCMP_CMP_MASKED_EQ, "operator %d",
                        (int)c->op);
            if (c->op != SCMP_CMP_MASKED_EQ)
                FUZZ_ASSERT(c->mask == 0, "mask %llx without &", (unsigned long long)c->mask);
        }
    }
    for (size_t g = 0; g < r->n_groups; g++) {
        const struct policy_group *grp = &r->groups[g];
        FUZZ_ASSERT(grp->name[0] == '@' && memchr(grp->name, '\0', sizeof grp->name),
                    "group name");
        for (size_t k = 0; k < grp->n; k++)
            FUZZ_ASSERT(grp->nrs[k] >= 0 && grp->nrs[k] < POLICY_NR_MAX, "group member %d",
                        grp->nrs[k]);
    }
    for (int nr = 0; nr < POLICY_NR_MAX; nr += 37) {
        char buf[64];
        (void)policy_deny_errno(r, nr);
        FUZZ_ASSERT(policy_action_str(r->sys[nr].act, r->sys[nr].err, buf, sizeof buf) != NULL,
                    "policy_action_str");
    }
}

/* The error must name the file and a line: "fuzz.policy:N: ...". */
static void check_message(const char *err)
{
    size_t n = strlen(path);
    FUZZ_ASSERT(strncmp(err, path, n) == 0 && err[n] == ':', "error without path: %s", err);
    const char *p = err + n + 1;
    FUZZ_ASSERT(*p >= '0' && *p <= '9', "error without line: %s", err);
}

/* policy_load() as forkboxd calls it, on the same bytes in a memfd. */
static int load(const uint8_t *data, size_t size, size_t *bpf_len, bool *line_reason)
{
    char fdpath[64], err[512];
    struct sbx_policy *p = NULL;
    int fd = memfd_create(path, MFD_CLOEXEC), rc;

    FUZZ_ASSERT(fd >= 0, "memfd_create: %s", strerror(errno));
    for (size_t off = 0; off < size;) {
        ssize_t w = write(fd, data + off, size - off);
        FUZZ_ASSERT(w > 0, "write: %s", strerror(errno));
        off += (size_t)w;
    }
    snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", fd);
    rc = policy_load(fdpath, &p, err, sizeof err);
    /* A refusal the parser does not model (libseccomp's own checks) must
     * still name the file and the line. */
    size_t n = strlen(fdpath);
    *line_reason = rc < 0 && strncmp(err, fdpath, n) == 0 && err[n] == ':' &&
                   err[n + 1] >= '0' && err[n + 1] <= '9';
    if (rc == 0) {
        *bpf_len = policy_bpf_len(p);
        FUZZ_ASSERT(policy_summary(p) != NULL, "no summary");
        policy_free(p);
    } else {
        FUZZ_ASSERT(p == NULL, "policy_load failed (%d) but set *out", rc);
    }
    close(fd);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Inputs that make libseccomp loop end at this deadline (-ETIMEDOUT),
     * well under libFuzzer's slow-unit report. */
    policy_set_compile_timeout(1000);

    struct policy_rules *r = NULL;
    char err[512];
    size_t bpf_len = 0;
    int rc, lrc;

    memset(err, 'x', sizeof err);
    err[sizeof err - 1] = '\0';
    rc = policy_parse(path, (const char *)data, size, &r, err, sizeof err);
    FUZZ_ASSERT(rc == 0 || rc == -EINVAL || rc == -ENOMEM, "policy_parse: %d", rc);
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "policy_parse: %d %s\n", rc, rc ? err : "");
    if (rc < 0) {
        FUZZ_ASSERT(r == NULL, "policy_parse failed but set *out");
        if (rc == -EINVAL)
            check_message(err);
    } else {
        check_rules(r);
        policy_rules_free(r);
    }

    bool line_reason = false;
    lrc = load(data, size, &bpf_len, &line_reason);
    if (rc == 0)
        FUZZ_ASSERT(lrc == 0 || lrc == -ETIMEDOUT || (lrc == -EINVAL && line_reason),
                    "policy_parse accepts what policy_load refuses without file:line (%d)", lrc);
    else
        FUZZ_ASSERT(lrc != 0, "policy_load accepts what policy_parse refuses");
    if (lrc == 0)
        FUZZ_ASSERT(bpf_len > 0, "empty BPF program");
    return 0;
}
