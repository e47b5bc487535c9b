/* Runs wherever a policy file is read (fork server, supervisor, forkbox-policy,
 * the fuzzer): the policy file format, parsed into plain data (policy_parse), and that data
 * turned into libseccomp filters (policy_build). Internal to the sandbox
 * module, the policy checker and the fuzzer; the daemon uses seccomp.h.
 *
 * Parsing does no I/O and takes (text, len), so it can be fed anything. The
 * format is described in policy/README.md; in short:
 *
 *   default deny EPERM | default errno EPERM | default kill
 *   define NAME VALUE
 *   group @name { syscall @other-group ... }        (may span lines)
 *   allow TARGETS [when COND [and COND]...]
 *   deny ERRNO TARGETS [when ...]     refused and counted (without `when`: see below)
 *   errno ERRNO TARGETS [when ...]    refused quietly
 *   noop TARGETS [when ...]           not made; returns 0 (hints that may do nothing)
 *   kill TARGETS [when ...]
 *   supervise TARGETS                 answered by the supervisor's own handler (flock)
 *   COND := argN [& VALUE] OP VALUE,  OP one of == != < <= > >=  (& only with ==)
 *
 * How rules become filters, so that libseccomp's rule semantics never
 * decide anything silently:
 *   - unconditional rules and `allow ... when` rules go into the main filter,
 *     whose default is the policy's default;
 *   - refusing `... when` rules go into a second, small "exceptions" filter
 *     whose default is allow. The kernel runs both and the most restrictive
 *     result wins, so an exception beats an allow whatever the rule order.
 *     When the syscall has no unconditional rule they also go into the main
 *     filter: otherwise its default could decide (a kill outranks ERRNO, and
 *     of two ERRNO results the main filter's, loaded last, wins).
 *
 * Counted refusals: unconditional `deny` rules and `default deny` compile to
 * SECCOMP_RET_USER_NOTIF in the main filter, which is loaded with
 * SECCOMP_FILTER_FLAG_NEW_LISTENER; the supervisor holds the listener,
 * counts each call and answers with the rule's errno (policy_deny_errno).
 * The kernel allows one listener per filter stack, so a `deny ... when` rule
 * (which lives in the exceptions filter) compiles to plain SECCOMP_RET_ERRNO:
 * refused with its errno, not counted.
 *
 * `noop` is SECCOMP_RET_ERRNO with errno 0: the kernel skips the call and
 * returns 0. For the rules that combine it is a refusal like `errno` (it
 * overrides an unconditional `allow` from the exceptions filter), and the
 * same masking advice applies: a caller must not slip past it with high bits.
 *
 * `supervise` is SECCOMP_RET_USER_NOTIF like a counted refusal, but the
 * holder of the listener carries the call out itself (on the caller's open
 * file, fetched with pidfd_getfd) instead of refusing it. Only syscalls the
 * supervisor has a handler for may be named (policy_supervisable); for the
 * rules that combine it is an unconditional `allow`.
 */
#pragma once
#include <seccomp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Ceilings: the parser refuses anything larger (it is also a fuzz target). */
#define POLICY_MAX_BYTES (1024 * 1024)
#define POLICY_MAX_LINE 4096
#define POLICY_MAX_GROUPS 256
#define POLICY_MAX_DEFINES 256
#define POLICY_MAX_WHEN 1024
#define POLICY_NR_MAX 1024 /* native syscall numbers are below this */

enum policy_action {
    POLICY_NONE = 0,
    POLICY_ALLOW,
    POLICY_DENY,  /* refused with an errno and counted (SECCOMP_RET_USER_NOTIF;
                     with `when`: SECCOMP_RET_ERRNO, not counted) */
    POLICY_ERRNO, /* refused with an errno, not counted (SECCOMP_RET_ERRNO) */
    POLICY_KILL,  /* SECCOMP_RET_KILL_PROCESS */
    POLICY_NOOP,  /* not made, returns 0 (SECCOMP_RET_ERRNO with errno 0) */
    POLICY_SUPERVISE, /* carried out by the listener's holder (SECCOMP_RET_USER_NOTIF);
                         unconditional only */
};

struct policy_cond {
    uint8_t arg;             /* 0..5 */
    enum scmp_compare op;    /* SCMP_CMP_* */
    uint64_t mask;           /* SCMP_CMP_MASKED_EQ only */
    uint64_t value;
};

/* A rule restricted by argument conditions (all must hold). */
struct policy_when {
    int nr;                  /* native syscall number */
    enum policy_action act;
    uint16_t err;            /* DENY/ERRNO */
    uint8_t ncond;
    struct policy_cond cond[6];
    unsigned line;
};

/* The unconditional rule for one syscall, if any. */
struct policy_sys {
    enum policy_action act;  /* POLICY_NONE: no unconditional rule */
    uint16_t err;
    unsigned line;           /* where it was set */
    bool direct;             /* named directly, not through a group */
};

struct policy_group {
    char name[64];           /* with the leading '@' */
    unsigned line;
    bool used;
    size_t n;
    int *nrs;                /* owned; native numbers, deduplicated */
};

struct policy_rules {
    char path[256];          /* for messages */
    enum policy_action def;  /* DENY, ERRNO or KILL */
    uint16_t def_err;
    unsigned def_line;
    struct policy_sys sys[POLICY_NR_MAX];
    size_t n_when;
    struct policy_when *when;    /* owned */
    size_t n_groups;
    struct policy_group *groups; /* owned */
    unsigned n_foreign;      /* names known to libseccomp but not on this arch, skipped */
    uint32_t arch;           /* SCMP_ARCH_* the numbers are for (the native one's value
                                unless parsed with policy_parse_arch) */
};

/* Parse text (len bytes, need not be NUL-terminated). path is used only in
 * messages. 0 and *out (free with policy_rules_free), or -EINVAL with
 * "path:line: reason" in err, or -ENOMEM. */
int policy_parse(const char *path, const char *text, size_t len, struct policy_rules **out,
                 char *err, size_t errlen);
void policy_rules_free(struct policy_rules *r);
/* The same for another architecture (SCMP_ARCH_AARCH64...): names resolve
 * to its numbers and policy_build makes a filter for it alone. For checking
 * a policy on a build machine; forkboxd only uses the native one. */
int policy_parse_arch(const char *path, const char *text, size_t len, uint32_t arch,
                      struct policy_rules **out, char *err, size_t errlen);
/* Read path (at most POLICY_MAX_BYTES) and policy_parse() it. As above, plus
 * -errno with "path: reason" when the file cannot be read. */
int policy_parse_file(const char *path, struct policy_rules **out, char *err, size_t errlen);
int policy_parse_file_arch(const char *path, uint32_t arch, struct policy_rules **out, char *err,
                           size_t errlen);

/* Build the libseccomp filters for r->arch (only that one): *main always,
 * *except only when the policy has refusing `when` rules (else NULL). Foreign
 * ABIs kill the process; the binary-tree optimisation is on. 0 or -errno with
 * "path:line: reason" in err. The caller releases both with seccomp_release. */
int policy_build(const struct policy_rules *r, scmp_filter_ctx *main, scmp_filter_ctx *except,
                 char *err, size_t errlen);

/* The errno a counted refusal of syscall nr returns (the supervisor's
 * answer): the errno of that syscall's unconditional `deny` rule, else the
 * default's (EPERM if the default does not count). */
uint16_t policy_deny_errno(const struct policy_rules *r, int nr);

/* Whether the supervisor has a handler for native syscall nr, so that
 * `supervise` may name it (today: flock). */
bool policy_supervisable(int nr);
/* The same for a number of arch (a policy_rules' arch). */
bool policy_supervisable_arch(uint32_t arch, int nr);

/* "allow", "deny EPERM", "errno ENOSYS", "kill", "noop", "supervise" into buf. */
const char *policy_action_str(enum policy_action act, uint16_t err, char *buf, size_t len);

/* Name of a native syscall number into buf ("?" if unknown). Uses libseccomp's
 * table (allocates). */
const char *policy_syscall_name(int nr, char *buf, size_t len);
/* The same for a number of arch. */
const char *policy_syscall_name_arch(uint32_t arch, int nr, char *buf, size_t len);
