/* Flags and environment -> struct config (runs in forkboxd, once at start).
 *
 * Every knob is one row of opts[] below, in the manner of redis's
 * standardConfig: its name, the kind of argument, the struct config field(s)
 * it sets, its default, its bounds, its line of --help, the environment
 * variable of the reference that sets it too, and whether the fork server
 * gets it. Parsing, defaults, --help and config_for_forkserver() are loops
 * over that table; what is left by hand is only what relates two knobs
 * (check()). A bad value stops forkboxd with a message naming the flag.
 *
 * --config FILE holds the same settings as lines "name value" or
 * "name = value" (a flag alone: "single-use"), '#' comments: each line means
 * what --name value means, and goes through the same row. */
#include "config/config.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/limits.h"
#include "core/util.h"

#ifndef FORKBOX_DEFAULT_POLICY /* the installed policy (<datadir>/forkbox, src/meson.build) */
#define FORKBOX_DEFAULT_POLICY "/usr/share/forkbox/default.policy"
#endif
#ifndef FORKBOX_SOURCE_POLICY   /* the source tree's, for the build tree's forkboxd */
#define FORKBOX_SOURCE_POLICY FORKBOX_DEFAULT_POLICY
#endif
#ifndef FORKBOX_BUILD_DAEMON    /* the build tree's forkboxd */
#define FORKBOX_BUILD_DAEMON ""
#endif

enum opt_kind {
    K_FLAG,      /* no argument: sets the field to !def */
    K_UINT,      /* decimal number in [min, max] */
    K_SIZE,      /* bytes: decimal with an optional K, M or G suffix (powers of 1024) */
    K_SECONDS,   /* decimal seconds in [min, max], stored in ms */
    K_PATH,      /* a string that must fit the field */
    K_ABSPATH,   /* ... and start with '/' */
    K_ABSPATHS,  /* repeatable K_ABSPATH: an array of fields plus a count */
    K_NAMES,     /* comma-separated names (one string) */
    K_LISTEN,    /* ADDR:PORT or [ADDR6]:PORT -> host string + port */
    K_ID_RANGE,  /* FIRST:COUNT -> two uint32 */
    K_ENUM,      /* one of .names, stored as its index (an enum field) */
    K_GONE,      /* a removed flag: refused with .help as the reason */
    K_CONFIG,    /* --config FILE: read before the environment and the other flags */
    K_HELP,
};

/* A place in struct config: offset and size, so one parser serves fields of
 * any integer width and the fork server's share is copied field by field. */
struct field {
    size_t off, size;
};
#define FIELD(f) {offsetof(struct config, f), sizeof(((struct config *)0)->f)}

struct opt {
    const char *name;       /* the long flag, without "--" */
    enum opt_kind kind;
    struct field f;         /* the field it sets (K_LISTEN: the host) */
    struct field f2;        /* K_LISTEN: the port; K_ID_RANGE: the count; K_ABSPATHS: the count */
    uint64_t def;           /* numeric default, in the flag's own unit (seconds for K_SECONDS);
                               K_FLAG: the value without the flag */
    uint64_t (*def_fn)(void); /* a default computed at start, instead of .def */
    const char *sdef;       /* default of string-like kinds, parsed like an argument */
    const char *(*sdef_fn)(void); /* a string default chosen at start, instead of .sdef */
    uint64_t min, max;      /* bounds of numeric kinds, in the flag's own unit */
    const char *env;        /* the reference's environment variable, read before the flags */
    bool forkserver;        /* the fork server gets this setting (config_for_forkserver) */
    const char *arg;        /* the argument's name in --help */
    const char *help;       /* --help text; '\n' starts an indented line. K_GONE: the refusal */
    const char *const *names; /* K_ENUM: the values, NULL-terminated, in the enum's order */
};

#define HELP_COLUMN 29 /* where the help text starts in --help */

/* A quarter of the machine's memory: what the supervisor may hold of all
 * turns' messages at once, by default. */
static uint64_t default_total_buffer(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    uint64_t quarter = pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size / 4 : 0;
    return quarter > TOTAL_BUFFER_MIN ? quarter : TOTAL_BUFFER_MIN;
}

static const char *const level_names[] = {"debug", "info", "warn", "error", NULL};
static const char *const log_format_names[] = {"text", "json", NULL};
static const char *const cpu_share_names[] = {"turn", "tenant", NULL}; /* enum cpu_share */

#ifndef FORKBOX_BUILD_TOOL      /* the build tree's forkbox (`forkbox sandbox`) */
#define FORKBOX_BUILD_TOOL ""
#endif

static bool is_self(const char *path)
{
    struct stat self, built;
    return path[0] && stat("/proc/self/exe", &self) == 0 && stat(path, &built) == 0 &&
           self.st_dev == built.st_dev && self.st_ino == built.st_ino;
}

bool config_built_here(void)
{
    return is_self(FORKBOX_BUILD_DAEMON) || is_self(FORKBOX_BUILD_TOOL) ||
           is_self(FORKBOX_BUILD_POLICY_TOOL);
}

/* The build tree's forkboxd runs with the source tree's policy (what is
 * being tested), an installed one with the installed copy. */
const char *config_default_policy(void)
{
    return config_built_here() ? FORKBOX_SOURCE_POLICY : FORKBOX_DEFAULT_POLICY;
}

/* In --help order. Supervisor-only settings (forkserver = false) are never
 * sent to the fork server: sandboxes are its clones and could read them. */
static const struct opt opts[] = {
    /* the front door */
    {"listen", K_LISTEN, FIELD(listen_host), FIELD(listen_port), .sdef = "127.0.0.1:8080",
     .arg = "ADDR:PORT", .help = "address to serve (default 127.0.0.1:8080; with only\n"
                                 "$PORT set: 0.0.0.0:$PORT). Port 0 picks a free port."},
    {"capacity", K_UINT, FIELD(capacity), .def = 64, .min = 1, .max = 1000000, .forkserver = true,
     .arg = "N", .help = "concurrent turns (default 64); more get 503 Busy"},
    /* Tenants are the token file's names (net/auth.h); a tenant's turn
     * beyond this gets 429, while others are still admitted. */
    {"tenant-capacity", K_UINT, FIELD(tenant_capacity), .def = 0, .max = 1000000,
     .arg = "N", .help = "of them, one tenant's at most (0 = no such limit, the\n"
                         "default); more get 429 Too Many Requests"},
    {"single-use", K_FLAG, FIELD(single_use), .def = false,
     .help = "one turn, then exit 0 (the reference's behaviour)"},
    {"token-file", K_PATH, FIELD(token_file), .sdef = "",
     .arg = "PATH", .help = "bearer token file (else $ADK_CODE_MODE_AUTH_TOKEN)"},
    {"preauth-max", K_UINT, FIELD(preauth_max), .def = PREAUTH_DEFAULT_MAX, .min = 1,
     .max = PREAUTH_MAX_CONNECTIONS_BOUND,
     .arg = "N", .help = "connections not yet admitted (1024); when full, the\n"
                         "least valuable is closed for a new one"},
    {"preauth-per-peer", K_UINT, FIELD(preauth_per_peer), .def = PREAUTH_DEFAULT_PER_PEER,
     .max = PREAUTH_MAX_CONNECTIONS_BOUND,
     .arg = "N", .help = "of them from one IPv4 address or IPv6 /64 (128; 0 = no\n"
                         "limit, e.g. behind a proxy)"},

    /* per-turn limits (spec 4.5, 9.2) */
    {"max-upload-tools", K_SIZE, FIELD(max_upload_tools), .def = ARCHIVE_DEFAULT_MAX_UPLOAD,
     .max = WS_MAX_MESSAGE_BYTES, .env = "ADK_CODE_MODE_MAX_UPLOAD_TOOLS",
     .arg = "SIZE", .help = "tools archive limit ($ADK_CODE_MODE_MAX_UPLOAD_TOOLS, 100M)"},
    {"max-upload-workspace", K_SIZE, FIELD(max_upload_workspace), .def = ARCHIVE_DEFAULT_MAX_UPLOAD,
     .max = WS_MAX_MESSAGE_BYTES, .env = "ADK_CODE_MODE_MAX_UPLOAD_WORKSPACE",
     .arg = "SIZE", .help = "workspace archive limit ($..._WORKSPACE, 100M)"},
    {"max-unpacked", K_SIZE, FIELD(max_unpacked), .def = ARCHIVE_DEFAULT_MAX_UNPACKED,
     .max = 1ULL << 40, .forkserver = true,
     .arg = "SIZE", .help = "decompressed bytes per archive (1G)"},
    {"max-members", K_UINT, FIELD(max_members), .def = ARCHIVE_DEFAULT_MAX_MEMBERS,
     .max = 100000000, .forkserver = true,
     .arg = "N", .help = "members per archive (100000)"},
    {"snapshot-max", K_SIZE, FIELD(snapshot_max), .def = SNAPSHOT_DEFAULT_MAX_BYTES,
     .max = 200 * MiB, .forkserver = true,
     .arg = "SIZE", .help = "file data in a returned snapshot (100M)"},
    {"output-cap", K_SIZE, FIELD(output_cap), .def = OUTPUT_DEFAULT_CAP, .min = KiB,
     .max = 100 * MiB, .forkserver = true,
     .arg = "SIZE", .help = "bytes kept per stream per block (16M)"},

    /* the sandbox */
    {"tools-dir", K_PATH, FIELD(tools_dir), .sdef = "/tools", .env = "ADK_CODE_MODE_TOOLS_DIR",
     .forkserver = true,
     .arg = "DIR", .help = "tools package dir ($ADK_CODE_MODE_TOOLS_DIR, /tools)"},
    {"no-isolation", K_FLAG, FIELD(isolate), .def = true, .forkserver = true,
     .help = "no namespaces/seccomp (benchmarks only)"},
    /* Fail closed by default: a host where the per-turn cgroup limits
     * cannot be enforced stops forkboxd at start (cgroups_probe.c); this turns
     * that refusal into a warning. */
    {"allow-no-cgroups", K_FLAG, FIELD(allow_no_cgroups), .def = false, .forkserver = true,
     .help = "start even where per-turn cgroup limits cannot be\n"
             "enforced (a warning instead of a refusal)"},
    /* One host uid and gid per live sandbox, so that nothing the kernel
     * counts per user (processes, pending signals, inotify, pipe buffers,
     * fds in flight, ...) is shared between sandboxes or with root. The
     * default block lies in 1879048192..2147352575, which systemd's
     * UIDS-GIDS.md leaves unused: above its container range (524288..) and
     * Debian's subordinate ids (100000..600100000), below its foreign range
     * (2147352576..) and below 2^31 (ids that look negative to signed code).
     * Regular users (1000..60000), systemd's dynamic users (61184..65519)
     * and nobody (65534) are far away. 2013265920 = 0x78000000. */
    {"id-range", K_ID_RANGE, FIELD(id_first), FIELD(id_count), .sdef = "2013265920:65536",
     .forkserver = true,
     .arg = "FIRST:COUNT", .help = "host uids/gids for sandboxes, one per live sandbox\n"
                                   "(2013265920:65536); no other user may use them"},
    {"uid", K_GONE, .help = "--uid and --gid are gone: every sandbox gets a host id of its own "
                            "from --id-range FIRST:COUNT"},
    {"gid", K_GONE, .help = "--uid and --gid are gone: every sandbox gets a host id of its own "
                            "from --id-range FIRST:COUNT"},
    {"policy", K_PATH, FIELD(policy_file), .sdef_fn = config_default_policy, .forkserver = true,
     .arg = "FILE", .help = "seccomp policy (" FORKBOX_DEFAULT_POLICY ";\n"
                            "the build tree's forkboxd: the source tree's)"},
    /* Not for the fork server: it is that module, and its sandboxes
     * need not learn where the daemon is installed. */
    {"sandbox-module", K_ABSPATH, FIELD(sandbox_module), .sdef = "",
     .arg = "PATH", .help = "the fork server's module, forkbox-sandbox.so (default: the\n"
                            "build tree's for the build tree's forkboxd, else the installed one)"},
    {"sandbox-exe", K_GONE, .help = "--sandbox-exe is gone: the fork server is python3.11 running "
                                    "forkbox-sandbox.so; name that with --sandbox-module PATH"},
    {"site-packages", K_ABSPATHS, FIELD(site_dirs), FIELD(n_site_dirs), .max = CONFIG_MAX_SITE_DIRS,
     .forkserver = true,
     .arg = "DIR", .help = "extra read-only package dir (repeatable)"},
    {"preload", K_NAMES, FIELD(preload), .sdef = "", .forkserver = true,
     .arg = "a,b,c", .help = "modules imported once before forking"},
    /* Four warm sandboxes (~14 MB) absorb small bursts; a refill takes ~18 ms,
     * so a larger pool only helps bursts bigger than that. */
    {"pool", K_UINT, FIELD(pool_size), .def = 4, .max = 100000, .forkserver = true,
     .arg = "N", .help = "pre-forked sandboxes kept ready (4; 0 = always fresh)"},
    /* forkbox-bench --rows steps: what each step of a fresh spawn costs. A
     * pipe per spawn, which the first block's code can write to. */
    {"step-times", K_FLAG, FIELD(step_times), .def = false, .forkserver = true,
     .help = "log the time and CPU of each step of every fresh sandbox\n"
             "at debug level (benchmarks only)"},

    /* resources and time */
    {"memory", K_SIZE, FIELD(memory_max), .def = 1024 * MiB, .max = 1ULL << 40, .forkserver = true,
     .arg = "SIZE", .help = "memory per turn (1G)"},
    {"pids", K_UINT, FIELD(pids_max), .def = 256, .max = 1000000, .forkserver = true,
     .arg = "N", .help = "processes/threads per turn (256)"},
    {"cpu", K_UINT, FIELD(cpu_millis), .def = 1000, .max = 1000000, .forkserver = true,
     .arg = "MILLIS", .help = "CPU ms per second per turn (1000 = one CPU)"},
    {"cpu-weight", K_UINT, FIELD(cpu_weight), .def = 0, .max = 10000, .forkserver = true,
     .arg = "N", .help = "CPU weight of all sandboxes together against the host's\n"
                         "processes (1-10000; a process has 100; 0 = 100 per running\n"
                         "turn, the default)"},
    /* The cgroup helper puts a serving sandbox's CPU under a cgroup of its
     * tenant (cgroups_tenant.c): each tenant with a busy turn weighs alike. */
    {"cpu-share", K_ENUM, FIELD(cpu_share), .sdef = "turn", .forkserver = true,
     .names = cpu_share_names, .arg = "BY",
     .help = "turn: every busy turn gets a like share of the CPU (turn);\n"
             "tenant: every tenant with a busy turn does"},
    {"tmpfs-size", K_SIZE, FIELD(tmpfs_size), .def = 512 * MiB, .max = 1ULL << 40,
     .forkserver = true,
     .arg = "SIZE", .help = "/workspace, /tmp and /dev/shm together (512M)"},
    /* The host directory is not a tmpfs: its server (sandbox/hostfs.c)
     * charges what the block adds to it against this. */
    {"workspace-max", K_SIZE, FIELD(workspace_max), .def = 0, .max = 1ULL << 40,
     .forkserver = true,
     .arg = "SIZE", .help = "forkbox sandbox: how much a turn may add to the host's\n"
                          "workspace directory (0 = --tmpfs-size, the default)"},
    /* Finite, so that a looping or stopped block, or a client that keeps a
     * turn busy forever, gives its CPU and turn slot back (docs/operating.md,
     * "Timeouts"). The idle limit is the host's own reaper (spec 7.5). The
     * turn clock is the supervisor's alone. */
    {"block-timeout", K_SECONDS, FIELD(block_timeout_ms), .def = 900, .max = 31536000,
     .arg = "SEC", .help = "wall clock per block (900; 0 = none)"},
    {"turn-timeout", K_SECONDS, FIELD(turn_timeout_ms), .def = 7200, .max = 31536000,
     .arg = "SEC", .help = "wall clock per turn (7200; 0 = none)"},
    {"idle-timeout", K_SECONDS, FIELD(idle_timeout_ms), .def = 600, .max = 31536000,
     .arg = "SEC", .help = "idle time between blocks (600; 0 = none)"},
    /* SIGTERM/SIGINT: running turns go on for at most this long, then are
     * closed with 1001 (docs/operating.md, "Stopping and restarts"). */
    {"drain-timeout", K_SECONDS, FIELD(drain_timeout_ms), .def = 30, .max = 31536000,
     .arg = "SEC", .help = "on SIGTERM, how long running turns may go on\n"
                         "(30; 0 = close them at once)"},
    /* Behind a load balancer that polls /ready: its health check needs a
     * moment to see the 503; turns it routes here meanwhile are admitted. */
    {"drain-admit", K_SECONDS, FIELD(drain_admit_ms), .def = 0, .max = 3600,
     .arg = "SEC", .help = "on SIGTERM, keep admitting new turns this long while\n"
                         "/ready already answers 503 (0: refuse them at once)"},
    {"turn-buffer", K_SIZE, FIELD(turn_buffer), .def = TURN_BUFFER_DEFAULT, .min = MiB,
     .max = 1ULL << 40,
     .arg = "SIZE", .help = "supervisor memory one turn's messages may hold (32M)"},
    {"tenant-buffer", K_SIZE, FIELD(tenant_buffer), .def = 0, .max = 1ULL << 44,
     .arg = "SIZE", .help = "... all turns of one tenant together (0 = no such limit)"},
    {"total-buffer", K_SIZE, FIELD(total_buffer), .def_fn = default_total_buffer,
     .max = 1ULL << 44,
     .arg = "SIZE", .help = "... all turns together (a quarter of RAM, >= 32M)"},
    /* Its own listener, never the public one: what it tells (load, refusals
     * by cause) is for the operator, not for every client. */
    {"metrics-listen", K_LISTEN, FIELD(metrics_host), FIELD(metrics_port), .sdef = "",
     .arg = "ADDR:PORT", .help = "serve Prometheus metrics at GET /metrics there (off);\n"
                                 "not the --listen address and port"},
    {"config", K_CONFIG, FIELD(config_file), .sdef = "",
     .arg = "FILE", .help = "settings file: \"name value\" lines, # comments; flags\n"
                            "given here override it"},
    {"log-level", K_ENUM, FIELD(log_level), .sdef = "info", .forkserver = true,
     .names = level_names, .arg = "LEVEL", .help = "debug, info, warn, error (info)"},
    /* The fork server logs to the same stderr, in the same format. */
    {"log-format", K_ENUM, FIELD(log_format), .sdef = "text", .forkserver = true,
     .names = log_format_names, .arg = "FORMAT",
     .help = "text, or json: one JSON object per line (text)"},
    {"help", K_HELP, {0, 0}},
};
#define N_OPTS (sizeof opts / sizeof opts[0])

static void *at(struct config *cfg, struct field f) { return (char *)cfg + f.off; }

/* Store v in an unsigned field of any width (bool and enum included). The
 * table's bounds keep v within the field: config_table_check() proves it. */
static void put_uint(struct config *cfg, struct field f, uint64_t v)
{
    void *p = at(cfg, f);
    switch (f.size) {
    case 1: { uint8_t x = (uint8_t)v; memcpy(p, &x, 1); break; }
    case 2: { uint16_t x = (uint16_t)v; memcpy(p, &x, 2); break; }
    case 4: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); break; }
    default: memcpy(p, &v, 8); break;
    }
}

static uint64_t get_uint(const struct config *cfg, struct field f)
{
    const void *p = (const char *)cfg + f.off;
    switch (f.size) {
    case 1: { uint8_t x; memcpy(&x, p, 1); return x; }
    case 2: { uint16_t x; memcpy(&x, p, 2); return x; }
    case 4: { uint32_t x; memcpy(&x, p, 4); return x; }
    default: { uint64_t x; memcpy(&x, p, 8); return x; }
    }
}

/* "123", "64K", "1M", "2G" -> bytes. */
static int parse_size(const char *s, uint64_t max, uint64_t *out)
{
    char num[32];
    size_t n = strlen(s);
    uint64_t mult = 1;
    if (n == 0 || n >= sizeof num)
        return -EINVAL;
    memcpy(num, s, n + 1);
    switch (num[n - 1]) {
    case 'k': case 'K': mult = KiB; break;
    case 'm': case 'M': mult = MiB; break;
    case 'g': case 'G': mult = 1024 * MiB; break;
    default: break;
    }
    if (mult != 1)
        num[n - 1] = '\0';
    uint64_t v;
    int r = parse_u64(num, max / mult, &v);
    if (r < 0)
        return r;
    *out = v * mult;
    return 0;
}

/* Bytes as --help writes them: 16M, not 16777216. */
static const char *fmt_size(char *buf, size_t len, uint64_t v)
{
    static const char suffix[] = "GMK";
    static const uint64_t unit[] = {1024 * MiB, MiB, KiB};
    for (size_t i = 0; i < 3; i++)
        if (v && v % unit[i] == 0) {
            snprintf(buf, len, "%" PRIu64 "%c", v / unit[i], suffix[i]);
            return buf;
        }
    snprintf(buf, len, "%" PRIu64, v);
    return buf;
}

static int copy_str(char *dst, size_t dstlen, const char *src)
{
    size_t n = strlen(src);
    if (n >= dstlen)
        return -ENAMETOOLONG;
    memcpy(dst, src, n + 1);
    return 0;
}

/* ADDR:PORT or [ADDR6]:PORT into the host field f and the port field f2. */
static int parse_listen(struct config *cfg, struct field f, struct field f2, const char *s)
{
    const char *colon = strrchr(s, ':');
    uint64_t port;
    if (!colon || colon == s)
        return -EINVAL;
    size_t hl = (size_t)(colon - s);
    const char *host = s;
    if (s[0] == '[' && colon[-1] == ']') { /* [::1]:8080 */
        host++;
        hl -= 2;
    }
    if (hl >= f.size)
        return -EINVAL;
    if (parse_u64(colon + 1, 65535, &port) < 0)
        return -EINVAL;
    memcpy(at(cfg, f), host, hl);
    ((char *)at(cfg, f))[hl] = '\0';
    put_uint(cfg, f2, port);
    return 0;
}

static int parse_id_range(struct config *cfg, const char *s)
{
    const char *colon = strchr(s, ':');
    char first[16];
    uint64_t f, n;
    if (!colon || (size_t)(colon - s) >= sizeof first)
        return -EINVAL;
    memcpy(first, s, (size_t)(colon - s));
    first[colon - s] = '\0';
    if (parse_u64(first, UINT32_MAX, &f) < 0 || parse_u64(colon + 1, UINT32_MAX, &n) < 0)
        return -EINVAL;
    cfg->id_first = (uint32_t)f;
    cfg->id_count = (uint32_t)n;
    return 0;
}

/* The index of s in the NULL-terminated names, or -EINVAL. */
static int parse_enum(const char *s, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -EINVAL;
}

/* Set o's field(s) from the text a (a flag's argument or a string default). */
static int set_opt(struct config *cfg, const struct opt *o, const char *a, char *err, size_t errlen)
{
    char lo[24], hi[24];
    uint64_t v;
    switch (o->kind) {
    case K_FLAG:
        put_uint(cfg, o->f, !o->def);
        return 0;
    case K_UINT:
        if (parse_u64(a, o->max, &v) < 0 || v < o->min)
            return err_fmt(err, errlen, -EINVAL,
                           "--%s: expected %" PRIu64 "..%" PRIu64 ", got %s", o->name,
                           o->min, o->max, a);
        put_uint(cfg, o->f, v);
        return 0;
    case K_SIZE:
        if (parse_size(a, o->max, &v) < 0 || v < o->min)
            return err_fmt(err, errlen, -EINVAL,
                           "--%s: expected a size in %s..%s (K, M, G suffixes), got %s",
                           o->name, fmt_size(lo, sizeof lo, o->min),
                           fmt_size(hi, sizeof hi, o->max), a);
        put_uint(cfg, o->f, v);
        return 0;
    case K_SECONDS:
        if (parse_u64(a, o->max, &v) < 0 || v < o->min)
            return err_fmt(err, errlen, -EINVAL,
                           "--%s: expected seconds in %" PRIu64 "..%" PRIu64 ", got %s",
                           o->name, o->min, o->max, a);
        put_uint(cfg, o->f, v * 1000);
        return 0;
    case K_PATH:
    case K_NAMES:
    case K_CONFIG:
        if (copy_str(at(cfg, o->f), o->f.size, a) < 0)
            return err_fmt(err, errlen, -EINVAL, "--%s: %s too long (at most %zu bytes)", o->name,
                        o->kind == K_NAMES ? "list" : "path", o->f.size - 1);
        return 0;
    case K_ABSPATH:
        if (a[0] != '/' || copy_str(at(cfg, o->f), o->f.size, a) < 0)
            return err_fmt(err, errlen, -EINVAL, "--%s: expected an absolute path: %s", o->name, a);
        return 0;
    case K_ABSPATHS: {
        uint64_t n = get_uint(cfg, o->f2);
        size_t each = o->f.size / o->max;
        if (n >= o->max)
            return err_fmt(err, errlen, -EINVAL, "--%s: at most %" PRIu64, o->name, o->max);
        if (a[0] != '/' || copy_str((char *)at(cfg, o->f) + n * each, each, a) < 0)
            return err_fmt(err, errlen, -EINVAL, "--%s: expected an absolute path: %s", o->name, a);
        put_uint(cfg, o->f2, n + 1);
        return 0;
    }
    case K_LISTEN:
        if (parse_listen(cfg, o->f, o->f2, a) < 0)
            return err_fmt(err, errlen, -EINVAL, "--%s: expected ADDR:PORT, got %s", o->name, a);
        return 0;
    case K_ID_RANGE:
        if (parse_id_range(cfg, a) < 0)
            return err_fmt(err, errlen, -EINVAL, "--%s: expected FIRST:COUNT, got %s", o->name, a);
        cfg->id_range_set = true;
        return 0;
    case K_ENUM: {
        int i = parse_enum(a, o->names);
        if (i < 0) {
            char list[128] = "";
            for (size_t k = 0, n = 0; o->names[k] && n < sizeof list; k++)
                n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", k ? ", " : "",
                                      o->names[k]);
            return err_fmt(err, errlen, -EINVAL, "--%s: expected one of %s, got %s", o->name,
                           list, a);
        }
        put_uint(cfg, o->f, (uint64_t)i);
        return 0;
    }
    case K_GONE:
        return err_fmt(err, errlen, -EINVAL, "%s", o->help);
    case K_HELP:
        break;
    }
    return err_fmt(err, errlen, -EINVAL, "--%s: not a setting", o->name);
}

/* Every field at its default: the table's, so --help, the bounds and the
 * value cannot drift apart (config_table_check() holds them together). */
static int set_defaults(struct config *cfg, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        int r = 0;
        switch (o->kind) {
        case K_FLAG:
        case K_UINT:
        case K_SIZE:
            put_uint(cfg, o->f, o->def_fn ? o->def_fn() : o->def);
            break;
        case K_SECONDS:
            put_uint(cfg, o->f, o->def * 1000);
            break;
        case K_PATH: case K_ABSPATH: case K_NAMES: case K_LISTEN: case K_ID_RANGE: case K_ENUM: {
            const char *sd = o->sdef_fn ? o->sdef_fn() : o->sdef;
            if (sd[0]) /* "" is the memset's */
                r = set_opt(cfg, o, sd, err, errlen);
            break;
        }
        case K_ABSPATHS: case K_GONE: case K_HELP: case K_CONFIG:
            break;
        }
        if (r < 0)
            return r;
    }
    return 0;
}

/* Environment settings of the reference (spec 8.3); flags given later win.
 * The reference reads sizes as plain integers: no suffixes here. */
static int apply_env(struct config *cfg, char *err, size_t errlen)
{
    const char *v;
    if ((v = getenv("PORT")) && *v) {
        uint64_t port;
        if (parse_u64(v, 65535, &port) < 0)
            return err_fmt(err, errlen, -EINVAL, "PORT: not a port number: %s", v);
        strcpy(cfg->listen_host, "0.0.0.0");
        cfg->listen_port = (uint16_t)port;
    }
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        uint64_t n;
        if (!o->env || !(v = getenv(o->env)) || !*v)
            continue;
        if (o->kind == K_SIZE) {
            if (parse_u64(v, o->max, &n) < 0 || n < o->min)
                return err_fmt(err, errlen, -EINVAL, "%s: bad size: %s", o->env, v);
            put_uint(cfg, o->f, n);
        } else if (copy_str(at(cfg, o->f), o->f.size, v) < 0) { /* K_PATH */
            return err_fmt(err, errlen, -EINVAL, "%s: too long", o->env);
        }
    }
    return 0;
}

void config_print_options(FILE *out)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        if (o->kind == K_GONE || o->kind == K_HELP)
            continue;
        int w = fprintf(out, "  --%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(out, "%*s", w < HELP_COLUMN - 1 ? HELP_COLUMN - w : 2, "");
        for (const char *h = o->help; *h;) {
            size_t n = strcspn(h, "\n");
            fprintf(out, "%.*s\n", (int)n, h);
            h += n;
            if (*h == '\n' && *++h)
                fprintf(out, "%*s", HELP_COLUMN, "");
        }
    }
    fputs("SIZE accepts K, M and G suffixes (powers of 1024).\n", out);
}

static void print_usage(FILE *out)
{
    fputs("usage: forkboxd [options]\n", out);
    config_print_options(out);
}

/* The id range: no special id inside (root, nobody, the two -1s), and room
 * for every sandbox that can hold an id at once. That is capacity + pool
 * live ones, plus up to one dying per turn slot and per pool slot: a slot is
 * free again as soon as its sandbox is killed, while the id stays taken
 * until the fork server has reaped it. Twice (capacity + pool) covers that,
 * and leaves as many free ids again, so a freed id waits at least that many
 * spawns before it is reused (ids are handed out round robin). */
static int check_id_range(const struct config *cfg, char *err, size_t errlen)
{
    uint64_t first = cfg->id_first, end = first + cfg->id_count; /* exclusive */
    static const uint64_t special[] = {0, 65534, 65535, 4294967295ULL};
    if (cfg->id_count == 0 || end > 4294967295ULL)
        return err_fmt(err, errlen, -EINVAL,
                       "--id-range %" PRIu64 ":%u: must be non-empty and end below "
                       "4294967295", first, cfg->id_count);
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        if (special[i] >= first && special[i] < end)
            return err_fmt(err, errlen, -EINVAL, "--id-range %" PRIu64 ":%u: holds %" PRIu64
                           " (root, nobody or -1)", first, cfg->id_count, special[i]);
    uint64_t need = 2 * ((uint64_t)cfg->capacity + cfg->pool_size);
    if (cfg->id_count < need)
        return err_fmt(err, errlen, -EINVAL,
                       "--id-range %" PRIu64 ":%u: too small for --capacity %u and "
                       "--pool %u: needs at least %" PRIu64 " ids (twice capacity + pool)",
                       first, cfg->id_count, cfg->capacity, cfg->pool_size, need);
    return 0;
}

/* --metrics-listen never shares the public listener: the same port on the
 * same address, or on a wildcard address that covers the other, is refused
 * here rather than left to bind() (which SO_REUSEADDR and the order of the
 * two binds make unreliable as a check). Port 0 picks a free port: never
 * the same. */
static int check_metrics(const struct config *cfg, char *err, size_t errlen)
{
    if (!cfg->metrics_host[0] || cfg->metrics_port == 0 || cfg->metrics_port != cfg->listen_port)
        return 0;
    bool any = strcmp(cfg->metrics_host, "0.0.0.0") == 0 || strcmp(cfg->metrics_host, "::") == 0 ||
               strcmp(cfg->listen_host, "0.0.0.0") == 0 || strcmp(cfg->listen_host, "::") == 0;
    if (any || strcmp(cfg->metrics_host, cfg->listen_host) == 0)
        return err_fmt(err, errlen, -EINVAL,
                       "--metrics-listen %s:%u: that is the public listener's port (--listen "
                       "%s:%u); metrics need a port of their own", cfg->metrics_host,
                       cfg->metrics_port, cfg->listen_host, cfg->listen_port);
    return 0;
}

/* What one row's bounds cannot say: the rules that relate settings. */
static int check(const struct config *cfg, char *err, size_t errlen)
{
    char a[24], b[24];
    const char *base = strrchr(cfg->tools_dir, '/');
    if (cfg->tools_dir[0] != '/' || !base || strcmp(base, "/tools") != 0)
        return err_fmt(err, errlen, -EINVAL,
                       "tools dir must be an absolute path ending in /tools: %s",
                       cfg->tools_dir);
    if (cfg->total_buffer < cfg->turn_buffer)
        return err_fmt(err, errlen, -EINVAL,
                       "--total-buffer (%s) must be at least --turn-buffer (%s)",
                       fmt_size(a, sizeof a, cfg->total_buffer),
                       fmt_size(b, sizeof b, cfg->turn_buffer));
    /* Between the two: below a turn's, one turn would meet its tenant's
     * ceiling (1013, try later) before its own (1009); above the total's,
     * it would limit nothing. */
    if (cfg->tenant_buffer && (cfg->tenant_buffer < cfg->turn_buffer ||
                               cfg->tenant_buffer > cfg->total_buffer))
        return err_fmt(err, errlen, -EINVAL,
                       "--tenant-buffer (%s) must be 0 or between --turn-buffer (%s) and "
                       "--total-buffer", fmt_size(a, sizeof a, cfg->tenant_buffer),
                       fmt_size(b, sizeof b, cfg->turn_buffer));
    int r = check_metrics(cfg, err, errlen);
    return r < 0 ? r : check_id_range(cfg, err, errlen);
}

static const struct opt *find_opt(const char *name)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (strcmp(opts[i].name, name) == 0)
            return &opts[i];
    return NULL;
}

/* One line of the --config file: "name", "name value" or "name = value",
 * surrounding blanks and a comment ('#' at the start or after a blank)
 * removed. A flag takes no value, or true / false. 0, or -EINVAL. */
static int config_line(struct config *cfg, char *line, char *err, size_t errlen)
{
    for (char *h = line; (h = strchr(h, '#')); h++)
        if (h == line || h[-1] == ' ' || h[-1] == '\t') {
            *h = '\0';
            break;
        }
    char *name = line + strspn(line, " \t");
    size_t n = strcspn(name, " \t=");
    char *v = name + n;
    v += strspn(v, " \t");
    if (*v == '=')
        v += 1 + strspn(v + 1, " \t");
    name[n] = '\0';
    for (size_t e = strlen(v); e && (v[e - 1] == ' ' || v[e - 1] == '\t' || v[e - 1] == '\r');)
        v[--e] = '\0';
    if (!*name)
        return 0;
    const struct opt *o = find_opt(name);
    if (!o || o->kind == K_HELP || o->kind == K_CONFIG)
        return err_fmt(err, errlen, -EINVAL, "%s: not a setting", name);
    if (o->kind == K_FLAG) {
        if (*v && strcmp(v, "true") != 0 && strcmp(v, "false") != 0)
            return err_fmt(err, errlen, -EINVAL, "%s: a flag takes no value, or true or false", name);
        return strcmp(v, "false") == 0 ? 0 : set_opt(cfg, o, v, err, errlen);
    }
    if (!*v && o->kind != K_GONE)
        return err_fmt(err, errlen, -EINVAL, "%s: no value", name);
    return set_opt(cfg, o, v, err, errlen);
}

/* Every line of the --config file f (named path) through config_line(). A
 * reason names the file and the line. */
static int config_lines(struct config *cfg, FILE *f, const char *path, char *err, size_t errlen)
{
    char line[CONFIG_LINE_MAX + 2], why[384];
    size_t total = 0;
    for (unsigned no = 1; fgets(line, sizeof line, f); no++) {
        size_t len = strlen(line);
        total += len;
        if (total > CONFIG_FILE_MAX_BYTES)
            return err_fmt(err, errlen, -EFBIG, "--config %s: longer than %llu bytes", path,
                           (unsigned long long)CONFIG_FILE_MAX_BYTES);
        if (len && line[len - 1] == '\n')
            line[--len] = '\0';
        else if (len > CONFIG_LINE_MAX)
            return err_fmt(err, errlen, -EINVAL, "%s:%u: line longer than %d bytes", path, no,
                           CONFIG_LINE_MAX);
        if (config_line(cfg, line, why, sizeof why) < 0)
            return err_fmt(err, errlen, -EINVAL, "%s:%u: %s", path, no, why);
    }
    return ferror(f) ? err_fmt(err, errlen, -EIO, "--config %s: read error", path) : 0;
}

static int read_config(struct config *cfg, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return err_fmt(err, errlen, -errno, "--config %s: %s", path, strerror(errno));
    int r = config_lines(cfg, f, path, err, errlen);
    fclose(f);
    return r;
}

int config_parse(int argc, char **argv, struct config *cfg, char *err, size_t errlen)
{
    int r = set_defaults(cfg, err, errlen);
    if (r < 0)
        return r;
    cfg->id_range_set = false; /* the default went through set_opt() too */

    struct option long_opts[N_OPTS + 1];
    for (size_t i = 0; i < N_OPTS; i++) {
        long_opts[i] = (struct option){
            .name = opts[i].name,
            .has_arg = opts[i].kind == K_FLAG || opts[i].kind == K_HELP ? no_argument
                                                                         : required_argument,
            .val = 1000 + (int)i,
        };
    }
    long_opts[N_OPTS] = (struct option){0};
    opterr = 0;

    /* Two passes over argv: the first only finds --config, whose file comes
     * before the environment and the other flags (getopt, so an argument
     * that happens to read "--config" is not taken for the flag). Errors are
     * the second pass's to report. optind 0: glibc starts getopt afresh. */
    const char *config_path = NULL;
    optind = 0;
    for (int c; (c = getopt_long(argc, argv, "", long_opts, NULL)) != -1;)
        if (c >= 1000 && c < 1000 + (int)N_OPTS && opts[c - 1000].kind == K_CONFIG)
            config_path = optarg;
    if (config_path) {
        r = read_config(cfg, config_path, err, errlen);
        if (r < 0)
            return r;
    }
    r = apply_env(cfg, err, errlen);
    if (r < 0)
        return r;

    optind = 0;
    for (;;) {
        int c = getopt_long(argc, argv, "", long_opts, NULL);
        if (c == -1)
            break;
        if (c < 1000 || c >= 1000 + (int)N_OPTS)
            return err_fmt(err, errlen, -EINVAL, "unknown or incomplete option: %s (see --help)",
                        argv[optind - 1]);
        const struct opt *o = &opts[c - 1000];
        if (o->kind == K_HELP) {
            print_usage(stdout);
            return 1;
        }
        r = set_opt(cfg, o, optarg, err, errlen);
        if (r < 0)
            return r;
    }
    if (optind < argc)
        return err_fmt(err, errlen, -EINVAL, "unexpected argument: %s", argv[optind]);
    if (cfg->single_use)
        cfg->capacity = 1;
    /* Not a flag: systemd says so through the environment (log.h). */
    cfg->log_journal = log_journal_stream_matches(getenv("JOURNAL_STREAM"), STDERR_FILENO);
    return check(cfg, err, errlen);
}

/* An allow-list: the fork server starts from zeros and gets the fields of
 * the rows marked forkserver, nothing else (not even padding), so a new
 * setting stays the supervisor's until its row says otherwise. */
void config_for_forkserver(const struct config *cfg, struct config *out)
{
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        if (!o->forkserver)
            continue;
        memcpy(at(out, o->f), (const char *)cfg + o->f.off, o->f.size);
        if (o->f2.size)
            memcpy(at(out, o->f2), (const char *)cfg + o->f2.off, o->f2.size);
    }
    /* Found by config_parse, not a row: the fork server shares our stderr. */
    out->log_journal = cfg->log_journal;
    /* Set by `forkbox sandbox` (stream/), not a row. */
    memcpy(out->workdir, cfg->workdir, sizeof out->workdir);
    /* Set once the supervisor holds the id range's lock, not a row. */
    out->ids_locked = cfg->ids_locked;
}

/* Is the text of n, as a whole word, in s? */
static bool mentions(const char *s, const char *n)
{
    size_t len = strlen(n);
    for (const char *p = s; (p = strstr(p, n)); p++) {
        bool left = p == s || !(p[-1] >= '0' && p[-1] <= '9');
        char r = p[len];
        bool right = !((r >= '0' && r <= '9') || r == 'K' || r == 'M' || r == 'G');
        if (left && right)
            return true;
    }
    return false;
}

int config_table_check(char *err, size_t errlen)
{
    struct config cfg;
    char num[24];
    int r = set_defaults(&cfg, err, errlen);
    if (r < 0)
        return r;
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *o = &opts[i];
        for (size_t j = 0; j < i; j++)
            if (strcmp(opts[j].name, o->name) == 0)
                return err_fmt(err, errlen, -EINVAL, "--%s: two rows", o->name);
        if (o->kind == K_HELP)
            continue;
        if (!o->help)
            return err_fmt(err, errlen, -EINVAL, "--%s: no help", o->name);
        if (o->kind == K_GONE)
            continue;
        if (o->f.size == 0)
            return err_fmt(err, errlen, -EINVAL, "--%s: no field", o->name);
        if ((o->kind == K_LISTEN || o->kind == K_ID_RANGE || o->kind == K_ABSPATHS) && !o->f2.size)
            return err_fmt(err, errlen, -EINVAL, "--%s: no second field", o->name);
        if (o->kind == K_ENUM && (!o->names || o->f.size != sizeof(enum log_level)))
            return err_fmt(err, errlen, -EINVAL, "--%s: no names, or not an enum field", o->name);
        if (o->kind == K_ABSPATHS && (o->max == 0 || o->f.size % o->max))
            return err_fmt(err, errlen, -EINVAL, "--%s: max is not the array's length", o->name);
        if ((o->kind == K_UINT || o->kind == K_SIZE || o->kind == K_SECONDS) && !o->def_fn) {
            uint64_t unit = o->kind == K_SECONDS ? 1000 : 1;
            unsigned bits = (unsigned)o->f.size * 8;
            if (o->min > o->max || (bits < 64 && o->max * unit >> bits))
                return err_fmt(err, errlen, -EINVAL, "--%s: bounds do not fit the field", o->name);
            if (o->def < o->min || o->def > o->max)
                return err_fmt(err, errlen, -EINVAL, "--%s: default out of bounds", o->name);
            if (o->kind == K_SIZE)
                fmt_size(num, sizeof num, o->def);
            else
                snprintf(num, sizeof num, "%" PRIu64, o->def);
            if (!mentions(o->help, num))
                return err_fmt(err, errlen, -EINVAL,
                               "--%s: help does not say the default %s", o->name, num);
        }
        if (o->sdef && o->sdef[0] && !strstr(o->help, o->sdef))
            return err_fmt(err, errlen, -EINVAL,
                           "--%s: help does not say the default %s", o->name, o->sdef);
    }
    return 0;
}
