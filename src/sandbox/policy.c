/* The policy file parser: policy file -> struct policy_rules. Runs
 * wherever a policy file is read: the fork server (policy_load, seccomp.c),
 * the supervisor (policy_notify_load, seccomp_notify.c), forkbox-policy and
 * the fuzzer. See policy.h for the format and policy/README.md for the
 * reviewer's view of it.
 *
 * The policy's files, by job (policy_int.h: what they share):
 *   policy.c        the parser, its tokens, values, groups and rules;
 *   policy_build.c  struct policy_rules -> libseccomp filters (the fork
 *                   server, forkbox-policy and the fuzzer);
 *   policy_names.c  syscall and action names for messages and metrics, and
 *                   which calls the supervisor can carry out.
 *
 * Every error names the file and line and says what is wrong; forkboxd
 * refuses to start on any of them. The checks exist so that what the file
 * says is what the filter does: libseccomp silently lets an unconditional
 * rule override conditional ones for the same syscall, refuses two
 * comparisons on one argument, and resolves overlapping conditional rules by
 * insertion order, so those shapes are errors here rather than surprises. */
#include "sandbox/policy.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/prctl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/util.h"
#include "sandbox/policy_int.h"

#ifndef RWF_DONTCACHE
#define RWF_DONTCACHE 0x00000080 /* Linux 6.14: read, then drop the pages from the cache */
#endif

#define MAX_TOKENS 512

struct constant {
    const char *name;
    uint64_t value;
};

#define C(x) { #x, (uint64_t)(x) }
/* Names a `when` condition may use besides numbers and `define`s. */
static const struct constant builtin_constants[] = {
    C(AF_UNSPEC), C(AF_UNIX), C(AF_LOCAL), C(AF_INET), C(AF_INET6), C(AF_NETLINK),
    C(AF_PACKET), C(AF_VSOCK), C(AF_ALG), C(AF_BLUETOOTH),
    C(SOCK_STREAM), C(SOCK_DGRAM), C(SOCK_SEQPACKET), C(SOCK_RAW), C(SOCK_NONBLOCK),
    C(SOCK_CLOEXEC),
    C(CLONE_VM), C(CLONE_FS), C(CLONE_FILES), C(CLONE_SIGHAND), C(CLONE_PIDFD),
    C(CLONE_PTRACE), C(CLONE_VFORK), C(CLONE_PARENT), C(CLONE_THREAD), C(CLONE_NEWNS),
    C(CLONE_SYSVSEM), C(CLONE_SETTLS), C(CLONE_PARENT_SETTID), C(CLONE_CHILD_CLEARTID),
    C(CLONE_UNTRACED), C(CLONE_CHILD_SETTID), C(CLONE_NEWCGROUP), C(CLONE_NEWUTS),
    C(CLONE_NEWIPC), C(CLONE_NEWUSER), C(CLONE_NEWPID), C(CLONE_NEWNET), C(CLONE_IO),
    C(CLONE_NEWTIME),
    C(TIOCSTI), C(TIOCLINUX), C(TIOCSCTTY), C(TIOCCONS),
    C(SIGSYS), C(SIGKILL), C(SIGCHLD), C(SIGSEGV),
    C(PR_SET_PDEATHSIG), C(PR_GET_PDEATHSIG), C(PR_GET_DUMPABLE), C(PR_SET_DUMPABLE),
    C(PR_GET_KEEPCAPS), C(PR_SET_KEEPCAPS), C(PR_SET_NAME), C(PR_GET_NAME),
    C(PR_GET_SECCOMP), C(PR_SET_SECCOMP), C(PR_CAPBSET_READ), C(PR_CAPBSET_DROP),
    C(PR_GET_SECUREBITS), C(PR_SET_SECUREBITS), C(PR_GET_TIMERSLACK),
    C(PR_SET_TIMERSLACK), C(PR_SET_MM), C(PR_SET_PTRACER), C(PR_SET_CHILD_SUBREAPER),
    C(PR_GET_CHILD_SUBREAPER), C(PR_SET_NO_NEW_PRIVS), C(PR_GET_NO_NEW_PRIVS),
    C(PR_GET_TID_ADDRESS), C(PR_SET_THP_DISABLE), C(PR_GET_THP_DISABLE),
    C(PR_CAP_AMBIENT), C(PR_SET_VMA),
    C(PER_LINUX), C(PER_LINUX32), C(ADDR_NO_RANDOMIZE),
    C(IN_ACCESS), C(IN_MODIFY), C(IN_ATTRIB), C(IN_CLOSE_WRITE), C(IN_CLOSE_NOWRITE),
    C(IN_OPEN), C(IN_MOVED_FROM), C(IN_MOVED_TO), C(IN_CREATE), C(IN_DELETE),
    C(IN_DELETE_SELF), C(IN_MOVE_SELF), C(IN_ALL_EVENTS),
    C(F_NOTIFY), C(DN_ACCESS), C(DN_MODIFY), C(DN_CREATE), C(DN_DELETE), C(DN_RENAME),
    C(DN_ATTRIB), C(F_SETLK), C(F_SETLKW), C(F_GETLK), C(F_OFD_SETLK), C(F_OFD_SETLKW),
    C(F_OFD_GETLK),
    C(RWF_HIPRI), C(RWF_DSYNC), C(RWF_SYNC), C(RWF_NOWAIT), C(RWF_APPEND), C(RWF_DONTCACHE),
    C(POSIX_FADV_NORMAL), C(POSIX_FADV_RANDOM), C(POSIX_FADV_SEQUENTIAL),
    C(POSIX_FADV_WILLNEED), C(POSIX_FADV_DONTNEED), C(POSIX_FADV_NOREUSE),
    C(MADV_NORMAL), C(MADV_RANDOM), C(MADV_SEQUENTIAL), C(MADV_WILLNEED), C(MADV_DONTNEED),
    C(MADV_FREE), C(MADV_REMOVE), C(MADV_COLD), C(MADV_PAGEOUT),
};
#undef C

/* errno names strerrorname_np() does not return (aliases). */
static const struct constant errno_aliases[] = {
    { "ENOTSUP", ENOTSUP }, { "EWOULDBLOCK", EWOULDBLOCK }, { "EDEADLOCK", EDEADLOCK },
};

struct define {
    char name[64];
    uint64_t value;
    unsigned line;
};

struct parser {
    struct policy_rules *r;
    unsigned line;
    char *err;
    size_t errlen;
    struct define defs[POLICY_MAX_DEFINES];
    size_t n_defs;
    long open_group;         /* index into r->groups while inside { }, else -1 */
    unsigned open_line;
    bool direct_in_group[POLICY_NR_MAX]; /* named directly in the open group */
};

static int perr(struct parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(struct parser *p, const char *fmt, ...)
{
    int n = snprintf(p->err, p->errlen, "%s:%u: ", p->r->path, p->line);
    if (n >= 0 && (size_t)n < p->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}
/* --- tokens and values --- */

static int parse_errno(struct parser *p, const char *tok, uint16_t *out)
{
    for (size_t i = 0; i < sizeof errno_aliases / sizeof *errno_aliases; i++)
        if (strcmp(tok, errno_aliases[i].name) == 0) {
            *out = (uint16_t)errno_aliases[i].value;
            return 0;
        }
    for (int e = 1; e < 4096; e++) {
        const char *n = strerrorname_np(e);
        if (n && strcmp(n, tok) == 0) {
            *out = (uint16_t)e;
            return 0;
        }
    }
    return perr(p, "unknown errno '%s' (use a name such as EPERM)", tok);
}

static const struct define *find_define(const struct parser *p, const char *name)
{
    for (size_t i = 0; i < p->n_defs; i++)
        if (strcmp(p->defs[i].name, name) == 0)
            return &p->defs[i];
    return NULL;
}

static const struct constant *find_builtin(const char *name)
{
    for (size_t i = 0; i < sizeof builtin_constants / sizeof *builtin_constants; i++)
        if (strcmp(builtin_constants[i].name, name) == 0)
            return &builtin_constants[i];
    return NULL;
}

/* VALUE := TERM ('|' TERM)*, TERM := number | constant | define. */
static int parse_value(struct parser *p, const char *tok, uint64_t *out)
{
    uint64_t v = 0;
    const char *s = tok;
    for (;;) {
        const char *bar = strchr(s, '|');
        size_t n = bar ? (size_t)(bar - s) : strlen(s);
        char term[64];
        if (n == 0 || n >= sizeof term)
            return perr(p, "bad value '%s'", tok);
        memcpy(term, s, n);
        term[n] = '\0';
        if (isdigit((unsigned char)term[0])) {
            char *end;
            errno = 0;
            unsigned long long x = strtoull(term, &end, 0);
            if (errno || *end)
                return perr(p, "bad number '%s'", term);
            v |= x;
        } else {
            const struct define *d = find_define(p, term);
            const struct constant *c = d ? NULL : find_builtin(term);
            if (!d && !c)
                return perr(p, "unknown constant '%s'", term);
            v |= d ? d->value : c->value;
        }
        if (!bar)
            break;
        s = bar + 1;
    }
    *out = v;
    return 0;
}

/* 0 and *nr (-1: a name libseccomp knows only for other architectures,
 * skipped), or an error. */
static int resolve_syscall(struct parser *p, const char *name, int *nr)
{
    int n = seccomp_syscall_resolve_name_arch(p->r->arch, name);
    if (n == __NR_SCMP_ERROR)
        return perr(p, "unknown syscall '%s'", name);
    if (n < 0) {
        p->r->n_foreign++;
        *nr = -1;
        return 0;
    }
    if (n >= POLICY_NR_MAX)
        return perr(p, "syscall '%s' has number %d, beyond this build's table", name, n);
    *nr = n;
    return 0;
}

static long find_group(const struct policy_rules *r, const char *name)
{
    for (size_t i = 0; i < r->n_groups; i++)
        if (strcmp(r->groups[i].name, name) == 0)
            return (long)i;
    return -1;
}

static bool valid_group_name(const char *s)
{
    if (s[0] != '@' || !s[1] || strlen(s) >= sizeof ((struct policy_group *)0)->name)
        return false;
    for (s++; *s; s++)
        if (!islower((unsigned char)*s) && !isdigit((unsigned char)*s) && *s != '-' && *s != '_')
            return false;
    return true;
}

static bool valid_define_name(const char *s)
{
    if (!isupper((unsigned char)s[0]) && s[0] != '_')
        return false;
    if (strlen(s) >= sizeof ((struct define *)0)->name)
        return false;
    for (; *s; s++)
        if (!isupper((unsigned char)*s) && !isdigit((unsigned char)*s) && *s != '_')
            return false;
    return true;
}

/* --- groups --- */

static int group_add_nr(struct policy_group *g, int nr)
{
    for (size_t i = 0; i < g->n; i++)
        if (g->nrs[i] == nr)
            return 0;
    int *n = realloc(g->nrs, (g->n + 1) * sizeof *n);
    if (!n)
        return -ENOMEM;
    g->nrs = n;
    g->nrs[g->n++] = nr;
    return 0;
}

static int group_add_member(struct parser *p, const char *tok)
{
    struct policy_group *g = &p->r->groups[p->open_group];
    if (tok[0] == '@') {
        long i = find_group(p->r, tok);
        if (i < 0)
            return perr(p, "unknown group '%s' (groups must be defined before use)", tok);
        if (i == p->open_group)
            return perr(p, "group '%s' includes itself", tok);
        struct policy_group *sub = &p->r->groups[i];
        sub->used = true;
        for (size_t k = 0; k < sub->n; k++)
            if (group_add_nr(g, sub->nrs[k]) < 0)
                return -ENOMEM;
        return 0;
    }
    int nr, rc = resolve_syscall(p, tok, &nr);
    if (rc < 0 || nr < 0)
        return rc;
    if (p->direct_in_group[nr])
        return perr(p, "duplicate '%s' in group %s", tok, g->name);
    p->direct_in_group[nr] = true;
    return group_add_nr(g, nr);
}

/* Members of the open group, until '}'. */
static int group_body(struct parser *p, char **tok, size_t ntok)
{
    for (size_t i = 0; i < ntok; i++) {
        if (strcmp(tok[i], "}") == 0) {
            if (i + 1 < ntok)
                return perr(p, "unexpected '%s' after '}'", tok[i + 1]);
            p->open_group = -1;
            return 0;
        }
        if (strcmp(tok[i], "{") == 0)
            return perr(p, "unexpected '{' inside group %s", p->r->groups[p->open_group].name);
        int rc = group_add_member(p, tok[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int stmt_group(struct parser *p, char **tok, size_t ntok)
{
    struct policy_rules *r = p->r;
    if (ntok < 3 || strcmp(tok[2], "{") != 0)
        return perr(p, "expected 'group @name {'");
    if (!valid_group_name(tok[1]))
        return perr(p, "bad group name '%s' (want @ followed by a-z, 0-9, '-')", tok[1]);
    long dup = find_group(r, tok[1]);
    if (dup >= 0)
        return perr(p, "duplicate group '%s' (first at line %u)", tok[1], r->groups[dup].line);
    if (r->n_groups >= POLICY_MAX_GROUPS)
        return perr(p, "too many groups (at most %d)", POLICY_MAX_GROUPS);
    struct policy_group *g = realloc(r->groups, (r->n_groups + 1) * sizeof *g);
    if (!g)
        return -ENOMEM;
    r->groups = g;
    g = &r->groups[r->n_groups];
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "%s", tok[1]);
    g->line = p->line;
    p->open_group = (long)r->n_groups++;
    p->open_line = p->line;
    memset(p->direct_in_group, 0, sizeof p->direct_in_group);
    return group_body(p, tok + 3, ntok - 3);
}

/* --- rules --- */

static int apply_uncond(struct parser *p, int nr, enum policy_action act, uint16_t err,
                        bool direct)
{
    struct policy_rules *r = p->r;
    struct policy_sys *s = &r->sys[nr];
    char name[64], a[32], b[32];

    if (s->act != POLICY_NONE) {
        if (s->act == act && s->err == err) {
            if (direct || s->direct)
                return perr(p, "duplicate rule for '%s' (first at line %u)",
                            rule_name(p->r, nr, name), s->line);
            return 0; /* overlapping groups with the same action: fine */
        }
        return perr(p, "conflicting rules for '%s': %s (line %u) and %s",
                    rule_name(p->r, nr, name), policy_action_str(s->act, s->err, a, sizeof a),
                    s->line, policy_action_str(act, err, b, sizeof b));
    }
    for (size_t i = 0; i < r->n_when; i++) {
        const struct policy_when *w = &r->when[i];
        if (w->nr != nr)
            continue;
        if (w->act == POLICY_ALLOW)
            return perr(p, "conflicting rules for '%s': an unconditional rule would override "
                        "'allow ... when' at line %u", rule_name(p->r, nr, name), w->line);
        if (refusing(act))
            return perr(p, "conflicting rules for '%s': refused unconditionally and "
                        "conditionally (line %u)", rule_name(p->r, nr, name), w->line);
    }
    s->act = act;
    s->err = err;
    s->line = p->line;
    s->direct = direct;
    return 0;
}

static int apply_when(struct parser *p, const struct policy_when *w)
{
    struct policy_rules *r = p->r;
    const struct policy_sys *s = &r->sys[w->nr];
    char name[64], a[32], b[32];

    if (s->act != POLICY_NONE) {
        if (w->act == POLICY_ALLOW)
            return perr(p, "conflicting rules for '%s': 'allow ... when' cannot narrow the "
                        "unconditional rule at line %u", rule_name(p->r, w->nr, name),
                        s->line);
        if (refusing(s->act))
            return perr(p, "conflicting rules for '%s': refused unconditionally (line %u) and "
                        "conditionally", rule_name(p->r, w->nr, name), s->line);
    }
    for (size_t i = 0; i < r->n_when; i++) {
        const struct policy_when *o = &r->when[i];
        if (o->nr != w->nr)
            continue;
        if (o->act == w->act && o->err == w->err && o->ncond == w->ncond &&
            memcmp(o->cond, w->cond, sizeof o->cond) == 0)
            return perr(p, "duplicate rule for '%s' (first at line %u)",
                        rule_name(p->r, w->nr, name), o->line);
        if (refusing(w->act) && refusing(o->act) && (o->act != w->act || o->err != w->err))
            return perr(p, "conflicting rules for '%s': %s (line %u) and %s; conditional "
                        "refusals of one syscall must share one action",
                        rule_name(p->r, w->nr, name),
                        policy_action_str(o->act, o->err, a, sizeof a), o->line,
                        policy_action_str(w->act, w->err, b, sizeof b));
    }
    if (r->n_when >= POLICY_MAX_WHEN)
        return perr(p, "too many 'when' rules (at most %d)", POLICY_MAX_WHEN);
    struct policy_when *n = realloc(r->when, (r->n_when + 1) * sizeof *n);
    if (!n)
        return -ENOMEM;
    r->when = n;
    r->when[r->n_when++] = *w;
    return 0;
}

static const struct {
    const char *tok;
    enum scmp_compare op;
} ops[] = {
    { "==", SCMP_CMP_EQ }, { "!=", SCMP_CMP_NE }, { "<", SCMP_CMP_LT },
    { "<=", SCMP_CMP_LE }, { ">", SCMP_CMP_GT }, { ">=", SCMP_CMP_GE },
};

/* argN [& MASK] OP VALUE [and ...], starting at tok[0]. */
static int parse_conditions(struct parser *p, char **tok, size_t ntok, struct policy_when *w)
{
    size_t i = 0;
    if (ntok == 0)
        return perr(p, "'when' needs a condition such as 'arg0 == AF_UNIX'");
    for (;;) {
        if (w->ncond >= 6)
            return perr(p, "too many conditions");
        struct policy_cond *c = &w->cond[w->ncond];
        memset(c, 0, sizeof *c);
        const char *a = tok[i];
        if (strncmp(a, "arg", 3) != 0 || a[3] < '0' || a[3] > '5' || a[4])
            return perr(p, "expected arg0..arg5, got '%s'", a);
        c->arg = (uint8_t)(a[3] - '0');
        for (uint8_t k = 0; k < w->ncond; k++)
            if (w->cond[k].arg == c->arg)
                return perr(p, "%s is compared twice in one rule (libseccomp cannot combine "
                            "them); write two rules", a);
        i++;
        bool masked = false;
        if (i < ntok && strcmp(tok[i], "&") == 0) {
            if (i + 1 >= ntok)
                return perr(p, "expected a mask after '&'");
            int rc = parse_value(p, tok[i + 1], &c->mask);
            if (rc < 0)
                return rc;
            masked = true;
            i += 2;
        }
        if (i + 2 > ntok)
            return perr(p, "incomplete condition: expected '%s [& MASK] OP VALUE'", a);
        size_t k;
        for (k = 0; k < sizeof ops / sizeof *ops; k++)
            if (strcmp(tok[i], ops[k].tok) == 0)
                break;
        if (k == sizeof ops / sizeof *ops)
            return perr(p, "unknown operator '%s' (use == != < <= > >=)", tok[i]);
        c->op = ops[k].op;
        int rc = parse_value(p, tok[i + 1], &c->value);
        if (rc < 0)
            return rc;
        if (masked) {
            if (c->op != SCMP_CMP_EQ)
                return perr(p, "a mask ('&') can only be compared with '=='");
            if (c->value & ~c->mask)
                return perr(p, "value 0x%llx has bits outside the mask 0x%llx and never matches",
                            (unsigned long long)c->value, (unsigned long long)c->mask);
            c->op = SCMP_CMP_MASKED_EQ;
        }
        w->ncond++;
        i += 2;
        if (i == ntok)
            return 0;
        if (strcmp(tok[i], "and") != 0)
            return perr(p, "unexpected '%s' (join conditions with 'and')", tok[i]);
        if (++i == ntok)
            return perr(p, "expected a condition after 'and'");
    }
}

/* `supervise` hands a call to the supervisor: it must have a handler, or
 * the call would only ever be refused there. */
static int check_supervisable(struct parser *p, enum policy_action act, int nr)
{
    char name[64];
    if (act != POLICY_SUPERVISE || policy_supervisable_arch(p->r->arch, nr))
        return 0;
    return perr(p, "the supervisor has no handler for '%s' (supervise: flock only)",
                rule_name(p->r, nr, name));
}

/* allow|deny E|errno E|kill|noop|supervise TARGETS [when ...]; tok[0] is the
 * action word. */
static int stmt_rule(struct parser *p, char **tok, size_t ntok)
{
    enum policy_action act;
    uint16_t err = 0;
    size_t i = 1;
    if (strcmp(tok[0], "allow") == 0)
        act = POLICY_ALLOW;
    else if (strcmp(tok[0], "kill") == 0)
        act = POLICY_KILL;
    else if (strcmp(tok[0], "noop") == 0)
        act = POLICY_NOOP;
    else if (strcmp(tok[0], "supervise") == 0)
        act = POLICY_SUPERVISE;
    else {
        act = strcmp(tok[0], "deny") == 0 ? POLICY_DENY : POLICY_ERRNO;
        if (ntok < 2)
            return perr(p, "'%s' needs an errno name, e.g. '%s EPERM ptrace'", tok[0], tok[0]);
        int rc = parse_errno(p, tok[1], &err);
        if (rc < 0)
            return rc;
        i = 2;
    }
    size_t first = i;
    while (i < ntok && strcmp(tok[i], "when") != 0)
        i++;
    size_t ntargets = i - first;
    if (ntargets == 0)
        return perr(p, "'%s' names no syscall or group", tok[0]);

    if (i < ntok) { /* when */
        /* A conditional notification would have to sit in the main filter
         * next to `allow ... when` rules, ordered by libseccomp; the one
         * handler (flock) needs no condition. */
        if (act == POLICY_SUPERVISE)
            return perr(p, "'supervise' takes no 'when'");
        if (ntargets != 1 || tok[first][0] == '@')
            return perr(p, "a 'when' rule names exactly one syscall");
        struct policy_when w = { .act = act, .err = err, .line = p->line };
        int rc = resolve_syscall(p, tok[first], &w.nr);
        if (rc < 0)
            return rc;
        rc = parse_conditions(p, tok + i + 1, ntok - i - 1, &w);
        if (rc < 0 || w.nr < 0)
            return rc;
        return apply_when(p, &w);
    }

    for (size_t t = first; t < first + ntargets; t++) {
        int rc;
        if (tok[t][0] == '@') {
            long g = find_group(p->r, tok[t]);
            if (g < 0)
                return perr(p, "unknown group '%s'", tok[t]);
            struct policy_group *grp = &p->r->groups[g];
            grp->used = true;
            for (size_t k = 0; k < grp->n; k++)
                if ((rc = check_supervisable(p, act, grp->nrs[k])) < 0 ||
                    (rc = apply_uncond(p, grp->nrs[k], act, err, false)) < 0)
                    return rc;
        } else {
            int nr;
            if ((rc = resolve_syscall(p, tok[t], &nr)) < 0)
                return rc;
            if (nr >= 0 && ((rc = check_supervisable(p, act, nr)) < 0 ||
                            (rc = apply_uncond(p, nr, act, err, true)) < 0))
                return rc;
        }
    }
    return 0;
}

static int stmt_default(struct parser *p, char **tok, size_t ntok)
{
    struct policy_rules *r = p->r;
    if (r->def != POLICY_NONE)
        return perr(p, "duplicate 'default' (first at line %u)", r->def_line);
    if (ntok == 2 && strcmp(tok[1], "kill") == 0) {
        r->def = POLICY_KILL;
    } else if (ntok == 3 && (strcmp(tok[1], "deny") == 0 || strcmp(tok[1], "errno") == 0)) {
        int rc = parse_errno(p, tok[2], &r->def_err);
        if (rc < 0)
            return rc;
        r->def = tok[1][0] == 'd' ? POLICY_DENY : POLICY_ERRNO;
    } else if (ntok >= 2 && strcmp(tok[1], "allow") == 0) {
        return perr(p, "'default allow' is not a sandbox; use deny, errno or kill");
    } else if (ntok >= 2 && strcmp(tok[1], "noop") == 0) {
        return perr(p, "'default noop' would fake success for every unlisted call; use deny, "
                    "errno or kill");
    } else {
        return perr(p, "expected 'default deny ERRNO', 'default errno ERRNO' or 'default kill'");
    }
    r->def_line = p->line;
    return 0;
}

static int stmt_define(struct parser *p, char **tok, size_t ntok)
{
    if (ntok != 3)
        return perr(p, "expected 'define NAME VALUE'");
    if (!valid_define_name(tok[1]))
        return perr(p, "bad constant name '%s' (want A-Z, 0-9, '_')", tok[1]);
    const struct define *d = find_define(p, tok[1]);
    if (d)
        return perr(p, "duplicate define '%s' (first at line %u)", tok[1], d->line);
    if (find_builtin(tok[1]))
        return perr(p, "'%s' is a built-in constant", tok[1]);
    if (p->n_defs >= POLICY_MAX_DEFINES)
        return perr(p, "too many defines (at most %d)", POLICY_MAX_DEFINES);
    struct define *n = &p->defs[p->n_defs];
    int rc = parse_value(p, tok[2], &n->value);
    if (rc < 0)
        return rc;
    snprintf(n->name, sizeof n->name, "%s", tok[1]);
    n->line = p->line;
    p->n_defs++;
    return 0;
}

/* Split one line (comment already cut) into tokens in place; '{' and '}'
 * are tokens of their own even when written against a word. */
static int tokenize(struct parser *p, char *s, char **tok, size_t *ntok, char *spill,
                    size_t spill_len)
{
    size_t n = 0, sp = 0;
    *ntok = 0;
    while (*s) {
        if (*s == ' ' || *s == '\t' || *s == '\r') {
            s++;
            continue;
        }
        if (n >= MAX_TOKENS)
            return perr(p, "too many words on one line");
        if (*s == '{' || *s == '}') {
            if (sp + 2 > spill_len)
                return perr(p, "too many braces on one line");
            spill[sp] = *s;
            spill[sp + 1] = '\0';
            tok[n++] = &spill[sp];
            sp += 2;
            s++;
            continue;
        }
        tok[n++] = s;
        while (*s && *s != ' ' && *s != '\t' && *s != '\r' && *s != '{' && *s != '}')
            s++;
        if (*s == '{' || *s == '}') {
            /* terminate the word without losing the brace: re-scan it */
            char brace = *s;
            *s = '\0';
            if (n >= MAX_TOKENS || sp + 2 > spill_len)
                return perr(p, "too many words on one line");
            spill[sp] = brace;
            spill[sp + 1] = '\0';
            tok[n++] = &spill[sp];
            sp += 2;
            s++;
        } else if (*s) {
            *s++ = '\0';
        }
    }
    *ntok = n;
    return 0;
}

static int parse_line(struct parser *p, char *line)
{
    char *hash = strchr(line, '#');
    if (hash)
        *hash = '\0';
    for (const char *c = line; *c; c++)
        if ((unsigned char)*c < 0x20 && *c != '\t' && *c != '\r')
            return perr(p, "control character 0x%02x", (unsigned char)*c);
        else if ((unsigned char)*c >= 0x7f)
            return perr(p, "non-ASCII byte 0x%02x", (unsigned char)*c);

    char *tok[MAX_TOKENS], spill[MAX_TOKENS];
    size_t ntok;
    int rc = tokenize(p, line, tok, &ntok, spill, sizeof spill);
    if (rc < 0 || ntok == 0)
        return rc;

    if (p->open_group >= 0)
        return group_body(p, tok, ntok);
    if (strcmp(tok[0], "default") == 0)
        return stmt_default(p, tok, ntok);
    if (strcmp(tok[0], "define") == 0)
        return stmt_define(p, tok, ntok);
    if (strcmp(tok[0], "group") == 0)
        return stmt_group(p, tok, ntok);
    if (strcmp(tok[0], "allow") == 0 || strcmp(tok[0], "deny") == 0 ||
        strcmp(tok[0], "errno") == 0 || strcmp(tok[0], "kill") == 0 ||
        strcmp(tok[0], "noop") == 0 || strcmp(tok[0], "supervise") == 0)
        return stmt_rule(p, tok, ntok);
    if (strcmp(tok[0], "}") == 0)
        return perr(p, "'}' without an open group");
    return perr(p, "unknown statement '%s' (expected default, define, group, allow, deny, "
                "errno, noop, kill or supervise)", tok[0]);
}

void policy_rules_free(struct policy_rules *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n_groups; i++)
        free(r->groups[i].nrs);
    free(r->groups);
    free(r->when);
    free(r);
}

int policy_parse(const char *path, const char *text, size_t len, struct policy_rules **out,
                 char *err, size_t errlen)
{
    return policy_parse_arch(path, text, len, seccomp_arch_native(), out, err, errlen);
}

int policy_parse_arch(const char *path, const char *text, size_t len, uint32_t arch,
                      struct policy_rules **out, char *err, size_t errlen)
{
    struct policy_rules *r = calloc(1, sizeof *r);
    _cleanup_free_ struct parser *p = calloc(1, sizeof *p);
    if (!r || !p) {
        free(r);
        return err_fmt(err, errlen, -ENOMEM, "%s: out of memory", path);
    }
    snprintf(r->path, sizeof r->path, "%s", path);
    r->arch = arch;
    p->r = r;
    p->err = err;
    p->errlen = errlen;
    p->open_group = -1;

    int rc = 0;
    if (len > POLICY_MAX_BYTES) {
        p->line = 0;
        rc = perr(p, "file larger than %d bytes", POLICY_MAX_BYTES);
        goto fail;
    }
    char line[POLICY_MAX_LINE + 1];
    size_t pos = 0;
    while (pos < len) {
        p->line++;
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - (text + pos)) : len - pos;
        if (n > POLICY_MAX_LINE) {
            rc = perr(p, "line longer than %d bytes", POLICY_MAX_LINE);
            goto fail;
        }
        if (memchr(text + pos, '\0', n)) {
            rc = perr(p, "NUL byte");
            goto fail;
        }
        memcpy(line, text + pos, n);
        line[n] = '\0';
        pos += n + (nl ? 1 : 0);
        if ((rc = parse_line(p, line)) < 0)
            goto fail;
    }
    if (p->open_group >= 0) {
        p->line = p->line ? p->line : 1;
        rc = perr(p, "group '%s' opened at line %u is not closed",
                  r->groups[p->open_group].name, p->open_line);
        goto fail;
    }
    if (r->def == POLICY_NONE) {
        p->line = p->line ? p->line : 1;
        rc = perr(p, "no 'default' rule (say what happens to unlisted syscalls, e.g. "
                  "'default deny EPERM')");
        goto fail;
    }
    *out = r;
    return 0;
fail:
    if (rc == -ENOMEM)
        snprintf(err, errlen, "%s:%u: out of memory", path, p->line);
    policy_rules_free(r);
    return rc;
}

int policy_parse_file(const char *path, struct policy_rules **out, char *err, size_t errlen)
{
    return policy_parse_file_arch(path, seccomp_arch_native(), out, err, errlen);
}

int policy_parse_file_arch(const char *path, uint32_t arch, struct policy_rules **out, char *err,
                           size_t errlen)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        int e = errno;
        return err_fmt(err, errlen, -e, "%s: cannot open: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        return err_fmt(err, errlen, -EINVAL, "%s: not a regular file", path);
    }
    if (st.st_size > POLICY_MAX_BYTES) {
        return err_fmt(err, errlen, -EINVAL, "%s:0: file larger than %d bytes", path, POLICY_MAX_BYTES);
    }
    size_t len = (size_t)st.st_size;
    _cleanup_free_ char *text = malloc(len + 1);
    if (!text) {
        return err_fmt(err, errlen, -ENOMEM, "%s: out of memory", path);
    }
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, text + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            return err_fmt(err, errlen, -e, "%s: cannot read: %s", path, strerror(e));
        }
        if (n == 0)
            break; /* shrank while we read: parse what is there */
        got += (size_t)n;
    }
    return policy_parse_arch(path, text, got, arch, out, err, errlen);
}
