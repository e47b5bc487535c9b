/* Flags and environment -> struct config. Every knob has a default, a bound
 * and one line of help; a bad value stops forkboxd with a message. */
#include "config/config.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/limits.h"
#include "core/util.h"

#ifndef FORKBOX_DEFAULT_POLICY
#define FORKBOX_DEFAULT_POLICY "/usr/share/forkbox/default.policy"
#endif

enum {
    OPT_LISTEN = 1000, OPT_CAPACITY, OPT_SINGLE_USE, OPT_TOKEN_FILE, OPT_MAX_UP_TOOLS,
    OPT_MAX_UP_WS, OPT_MAX_UNPACKED, OPT_MAX_MEMBERS, OPT_SNAPSHOT_MAX, OPT_OUTPUT_CAP,
    OPT_TOOLS_DIR, OPT_NO_ISOLATION, OPT_UID, OPT_GID, OPT_ID_RANGE, OPT_POLICY, OPT_SITE,
    OPT_PRELOAD, OPT_POOL, OPT_MEMORY, OPT_PIDS, OPT_CPU, OPT_TMPFS, OPT_BLOCK_TO, OPT_TURN_TO,
    OPT_IDLE_TO, OPT_LOG_LEVEL, OPT_PREAUTH_MAX, OPT_PREAUTH_PER_PEER, OPT_TURN_BUF,
    OPT_TOTAL_BUF, OPT_CPU_WEIGHT, OPT_SANDBOX_EXE, OPT_HELP,
};

static const struct option long_opts[] = {
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"capacity", required_argument, NULL, OPT_CAPACITY},
    {"single-use", no_argument, NULL, OPT_SINGLE_USE},
    {"token-file", required_argument, NULL, OPT_TOKEN_FILE},
    {"max-upload-tools", required_argument, NULL, OPT_MAX_UP_TOOLS},
    {"max-upload-workspace", required_argument, NULL, OPT_MAX_UP_WS},
    {"max-unpacked", required_argument, NULL, OPT_MAX_UNPACKED},
    {"max-members", required_argument, NULL, OPT_MAX_MEMBERS},
    {"snapshot-max", required_argument, NULL, OPT_SNAPSHOT_MAX},
    {"output-cap", required_argument, NULL, OPT_OUTPUT_CAP},
    {"tools-dir", required_argument, NULL, OPT_TOOLS_DIR},
    {"no-isolation", no_argument, NULL, OPT_NO_ISOLATION},
    {"uid", required_argument, NULL, OPT_UID},
    {"gid", required_argument, NULL, OPT_GID},
    {"id-range", required_argument, NULL, OPT_ID_RANGE},
    {"policy", required_argument, NULL, OPT_POLICY},
    {"site-packages", required_argument, NULL, OPT_SITE},
    {"preload", required_argument, NULL, OPT_PRELOAD},
    {"pool", required_argument, NULL, OPT_POOL},
    {"memory", required_argument, NULL, OPT_MEMORY},
    {"pids", required_argument, NULL, OPT_PIDS},
    {"cpu", required_argument, NULL, OPT_CPU},
    {"tmpfs-size", required_argument, NULL, OPT_TMPFS},
    {"block-timeout", required_argument, NULL, OPT_BLOCK_TO},
    {"turn-timeout", required_argument, NULL, OPT_TURN_TO},
    {"idle-timeout", required_argument, NULL, OPT_IDLE_TO},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"preauth-max", required_argument, NULL, OPT_PREAUTH_MAX},
    {"preauth-per-peer", required_argument, NULL, OPT_PREAUTH_PER_PEER},
    {"turn-buffer", required_argument, NULL, OPT_TURN_BUF},
    {"total-buffer", required_argument, NULL, OPT_TOTAL_BUF},
    {"cpu-weight", required_argument, NULL, OPT_CPU_WEIGHT},
    {"sandbox-exe", required_argument, NULL, OPT_SANDBOX_EXE},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

static const char usage[] =
    "usage: forkboxd [options]\n"
    "  --listen ADDR:PORT         address to serve (default 127.0.0.1:8080; with only\n"
    "                             $PORT set: 0.0.0.0:$PORT). Port 0 picks a free port.\n"
    "  --capacity N               concurrent turns (default 64); more get 503 Busy\n"
    "  --single-use               one turn, then exit 0 (the reference's behaviour)\n"
    "  --token-file PATH          bearer token file (else $ADK_CODE_MODE_AUTH_TOKEN)\n"
    "  --preauth-max N            connections not yet admitted (1024); when full, the\n"
    "                             least valuable is closed for a new one\n"
    "  --preauth-per-peer N       of them from one IPv4 address or IPv6 /64 (128; 0 = no\n"
    "                             limit, e.g. behind a proxy)\n"
    "  --max-upload-tools SIZE    tools archive limit ($ADK_CODE_MODE_MAX_UPLOAD_TOOLS, 100M)\n"
    "  --max-upload-workspace SIZE  workspace archive limit ($..._WORKSPACE, 100M)\n"
    "  --max-unpacked SIZE        decompressed bytes per archive (1G)\n"
    "  --max-members N            members per archive (100000)\n"
    "  --snapshot-max SIZE        file data in a returned snapshot (100M)\n"
    "  --output-cap SIZE          bytes kept per stream per block (16M)\n"
    "  --tools-dir DIR            tools package dir ($ADK_CODE_MODE_TOOLS_DIR, /tools)\n"
    "  --no-isolation             no namespaces/seccomp (benchmarks only)\n"
    "  --id-range FIRST:COUNT     host uids/gids for sandboxes, one per live sandbox\n"
    "                             (2013265920:65536); no other user may use them\n"
    "  --policy FILE              seccomp policy (" FORKBOX_DEFAULT_POLICY ")\n"
    "  --sandbox-exe PATH         the fork server's executable (default: the build tree's\n"
    "                             for the build tree's forkboxd, else the installed one)\n"
    "  --site-packages DIR        extra read-only package dir (repeatable)\n"
    "  --preload a,b,c            modules imported once before forking\n"
    "  --pool N                   pre-forked sandboxes kept ready (4; 0 = always fresh)\n"
    "  --memory SIZE              memory per turn (1G)\n"
    "  --pids N                   processes/threads per turn (256)\n"
    "  --cpu MILLIS               CPU ms per second per turn (1000 = one CPU)\n"
    "  --cpu-weight N             CPU weight of all sandboxes together against the host's\n"
    "                             processes (1-10000; a process has 100; 0 = 100 per running\n"
    "                             turn, the default)\n"
    "  --tmpfs-size SIZE          /workspace and /tmp size each (512M)\n"
    "  --block-timeout SEC        wall clock per block (900; 0 = none)\n"
    "  --turn-timeout SEC         wall clock per turn (7200; 0 = none)\n"
    "  --idle-timeout SEC         idle time between blocks (600)\n"
    "  --turn-buffer SIZE         supervisor memory one turn's messages may hold (528M)\n"
    "  --total-buffer SIZE        ... all turns together (a quarter of RAM, >= 528M)\n"
    "  --log-level LEVEL          debug, info, warn, error (info)\n"
    "SIZE accepts K, M and G suffixes (powers of 1024).\n";

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -EINVAL;
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

static int copy_str(char *dst, size_t dstlen, const char *src)
{
    size_t n = strlen(src);
    if (n >= dstlen)
        return -ENAMETOOLONG;
    memcpy(dst, src, n + 1);
    return 0;
}

static int parse_listen(struct config *cfg, const char *s)
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
    if (hl >= sizeof cfg->listen_host)
        return -EINVAL;
    if (parse_u64(colon + 1, 65535, &port) < 0)
        return -EINVAL;
    memcpy(cfg->listen_host, host, hl);
    cfg->listen_host[hl] = '\0';
    cfg->listen_port = (uint16_t)port;
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

/* A quarter of the machine's memory: what the supervisor may hold of all
 * turns' messages at once, by default. */
static uint64_t default_total_buffer(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    uint64_t quarter = pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size / 4 : 0;
    return quarter > TOTAL_BUFFER_MIN ? quarter : TOTAL_BUFFER_MIN;
}

static void set_defaults(struct config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    strcpy(cfg->listen_host, "127.0.0.1");
    cfg->listen_port = 8080;
    cfg->capacity = 64;
    cfg->preauth_max = PREAUTH_DEFAULT_MAX;
    cfg->preauth_per_peer = PREAUTH_DEFAULT_PER_PEER;
    cfg->max_upload_tools = ARCHIVE_DEFAULT_MAX_UPLOAD;
    cfg->max_upload_workspace = ARCHIVE_DEFAULT_MAX_UPLOAD;
    cfg->max_unpacked = ARCHIVE_DEFAULT_MAX_UNPACKED;
    cfg->max_members = ARCHIVE_DEFAULT_MAX_MEMBERS;
    cfg->snapshot_max = SNAPSHOT_DEFAULT_MAX_BYTES;
    cfg->output_cap = OUTPUT_DEFAULT_CAP;
    strcpy(cfg->tools_dir, "/tools");
    cfg->isolate = true;
    /* Four warm sandboxes (~14 MB) absorb small bursts; a refill takes ~18 ms,
     * so a larger pool only helps bursts bigger than that. */
    cfg->pool_size = 4;
    /* One host uid and gid per live sandbox, so that nothing the kernel
     * counts per user (processes, pending signals, inotify, pipe buffers,
     * fds in flight, ...) is shared between sandboxes or with root. The
     * default block lies in 1879048192..2147352575, which systemd's
     * UIDS-GIDS.md leaves unused: above its container range (524288..) and
     * Debian's subordinate ids (100000..600100000), below its foreign range
     * (2147352576..) and below 2^31 (ids that look negative to signed code).
     * Regular users (1000..60000), systemd's dynamic users (61184..65519)
     * and nobody (65534) are far away. */
    cfg->id_first = 2013265920; /* 0x78000000 */
    cfg->id_count = 65536;
    copy_str(cfg->policy_file, sizeof cfg->policy_file, FORKBOX_DEFAULT_POLICY);
    cfg->memory_max = 1024 * MiB;
    cfg->pids_max = 256;
    cfg->cpu_millis = 1000;
    cfg->tmpfs_size = 512 * MiB;
    /* Finite, so that a looping or stopped block, or a client that keeps a
     * turn busy forever, gives its CPU and turn slot back (README,
     * "Timeouts"). The idle limit is the host's own reaper (spec 7.5). */
    cfg->block_timeout_ms = 900 * 1000;
    cfg->turn_timeout_ms = 7200 * 1000;
    cfg->idle_timeout_ms = 600 * 1000;
    cfg->turn_buffer = TURN_BUFFER_DEFAULT;
    cfg->total_buffer = default_total_buffer();
    cfg->log_level = LOG_LEVEL_INFO;
}

/* Environment settings of the reference (spec 8.3); flags given later win. */
static int apply_env(struct config *cfg, char *err, size_t errlen)
{
    const char *v;
    if ((v = getenv("PORT")) && *v) {
        uint64_t port;
        if (parse_u64(v, 65535, &port) < 0)
            return fail(err, errlen, "PORT: not a port number: %s", v);
        strcpy(cfg->listen_host, "0.0.0.0");
        cfg->listen_port = (uint16_t)port;
    }
    if ((v = getenv("ADK_CODE_MODE_MAX_UPLOAD_TOOLS")) && *v &&
        parse_u64(v, WS_MAX_MESSAGE_BYTES, &cfg->max_upload_tools) < 0)
        return fail(err, errlen, "ADK_CODE_MODE_MAX_UPLOAD_TOOLS: bad size: %s", v);
    if ((v = getenv("ADK_CODE_MODE_MAX_UPLOAD_WORKSPACE")) && *v &&
        parse_u64(v, WS_MAX_MESSAGE_BYTES, &cfg->max_upload_workspace) < 0)
        return fail(err, errlen, "ADK_CODE_MODE_MAX_UPLOAD_WORKSPACE: bad size: %s", v);
    if ((v = getenv("ADK_CODE_MODE_TOOLS_DIR")) && *v &&
        copy_str(cfg->tools_dir, sizeof cfg->tools_dir, v) < 0)
        return fail(err, errlen, "ADK_CODE_MODE_TOOLS_DIR: too long");
    return 0;
}

static int parse_level(const char *s, enum log_level *out)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    for (unsigned i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (enum log_level)i;
            return 0;
        }
    return -EINVAL;
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
        return fail(err, errlen, "--id-range %" PRIu64 ":%u: must be non-empty and end below "
                    "4294967295", first, cfg->id_count);
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        if (special[i] >= first && special[i] < end)
            return fail(err, errlen, "--id-range %" PRIu64 ":%u: holds %" PRIu64
                        " (root, nobody or -1)", first, cfg->id_count, special[i]);
    uint64_t need = 2 * ((uint64_t)cfg->capacity + cfg->pool_size);
    if (cfg->id_count < need)
        return fail(err, errlen, "--id-range %" PRIu64 ":%u: too small for --capacity %u and "
                    "--pool %u: needs at least %" PRIu64 " ids (twice capacity + pool)",
                    first, cfg->id_count, cfg->capacity, cfg->pool_size, need);
    return 0;
}

static int check(const struct config *cfg, char *err, size_t errlen)
{
    const char *base = strrchr(cfg->tools_dir, '/');
    if (cfg->tools_dir[0] != '/' || !base || strcmp(base, "/tools") != 0)
        return fail(err, errlen, "tools dir must be an absolute path ending in /tools: %s",
                    cfg->tools_dir);
    if (cfg->capacity == 0)
        return fail(err, errlen, "--capacity must be at least 1");
    if (cfg->preauth_max == 0)
        return fail(err, errlen, "--preauth-max must be at least 1");
    if (cfg->output_cap < 1024)
        return fail(err, errlen, "--output-cap must be at least 1K");
    if (cfg->turn_buffer < MiB || cfg->total_buffer < cfg->turn_buffer)
        return fail(err, errlen, "--turn-buffer must be at least 1M and --total-buffer at least "
                                 "--turn-buffer");
    return check_id_range(cfg, err, errlen);
}

int config_parse(int argc, char **argv, struct config *cfg, char *err, size_t errlen)
{
    set_defaults(cfg);
    int r = apply_env(cfg, err, errlen);
    if (r < 0)
        return r;

    optind = 1;
    opterr = 0;
    for (;;) {
        int c = getopt_long(argc, argv, "", long_opts, NULL);
        if (c == -1)
            break;
        const char *a = optarg;
        uint64_t v;
        switch (c) {
        case OPT_LISTEN:
            if (parse_listen(cfg, a) < 0)
                return fail(err, errlen, "--listen: expected ADDR:PORT, got %s", a);
            break;
        case OPT_CAPACITY:
            if (parse_u64(a, 1000000, &v) < 0 || v == 0)
                return fail(err, errlen, "--capacity: expected 1..1000000, got %s", a);
            cfg->capacity = (unsigned)v;
            break;
        case OPT_SINGLE_USE: cfg->single_use = true; break;
        case OPT_TOKEN_FILE:
            if (copy_str(cfg->token_file, sizeof cfg->token_file, a) < 0)
                return fail(err, errlen, "--token-file: path too long");
            break;
#define SIZE_OPT(OPT, FIELD, MAX)                                                   \
        case OPT:                                                                   \
            if (parse_size(a, MAX, &cfg->FIELD) < 0)                                \
                return fail(err, errlen, "--%s: bad size %s", long_opts[OPT - OPT_LISTEN].name, a); \
            break;
        SIZE_OPT(OPT_MAX_UP_TOOLS, max_upload_tools, WS_MAX_MESSAGE_BYTES)
        SIZE_OPT(OPT_MAX_UP_WS, max_upload_workspace, WS_MAX_MESSAGE_BYTES)
        SIZE_OPT(OPT_MAX_UNPACKED, max_unpacked, 1ULL << 40)
        SIZE_OPT(OPT_SNAPSHOT_MAX, snapshot_max, 200 * MiB)
        SIZE_OPT(OPT_OUTPUT_CAP, output_cap, 100 * MiB)
        SIZE_OPT(OPT_MEMORY, memory_max, 1ULL << 40)
        SIZE_OPT(OPT_TMPFS, tmpfs_size, 1ULL << 40)
        SIZE_OPT(OPT_TURN_BUF, turn_buffer, 1ULL << 40)
        SIZE_OPT(OPT_TOTAL_BUF, total_buffer, 1ULL << 44)
#undef SIZE_OPT
#define NUM_OPT(OPT, FIELD, MAX, MULT)                                              \
        case OPT:                                                                   \
            if (parse_u64(a, MAX, &v) < 0)                                          \
                return fail(err, errlen, "--%s: bad number %s", long_opts[OPT - OPT_LISTEN].name, a); \
            cfg->FIELD = v * (MULT);                                                \
            break;
        NUM_OPT(OPT_MAX_MEMBERS, max_members, 100000000, 1)
        NUM_OPT(OPT_POOL, pool_size, 100000, 1)
        NUM_OPT(OPT_PIDS, pids_max, 1000000, 1)
        NUM_OPT(OPT_CPU, cpu_millis, 1000000, 1)
        NUM_OPT(OPT_CPU_WEIGHT, cpu_weight, 10000, 1)
        NUM_OPT(OPT_BLOCK_TO, block_timeout_ms, 31536000, 1000)
        NUM_OPT(OPT_TURN_TO, turn_timeout_ms, 31536000, 1000)
        NUM_OPT(OPT_IDLE_TO, idle_timeout_ms, 31536000, 1000)
        NUM_OPT(OPT_PREAUTH_MAX, preauth_max, PREAUTH_MAX_CONNECTIONS_BOUND, 1)
        NUM_OPT(OPT_PREAUTH_PER_PEER, preauth_per_peer, PREAUTH_MAX_CONNECTIONS_BOUND, 1)
#undef NUM_OPT
        case OPT_TOOLS_DIR:
            if (copy_str(cfg->tools_dir, sizeof cfg->tools_dir, a) < 0)
                return fail(err, errlen, "--tools-dir: path too long");
            break;
        case OPT_NO_ISOLATION: cfg->isolate = false; break;
        case OPT_UID:
        case OPT_GID:
            return fail(err, errlen, "--uid and --gid are gone: every sandbox gets a host id of "
                        "its own from --id-range FIRST:COUNT");
        case OPT_ID_RANGE:
            if (parse_id_range(cfg, a) < 0)
                return fail(err, errlen, "--id-range: expected FIRST:COUNT, got %s", a);
            break;
        case OPT_POLICY:
            if (copy_str(cfg->policy_file, sizeof cfg->policy_file, a) < 0)
                return fail(err, errlen, "--policy: path too long");
            break;
        case OPT_SANDBOX_EXE:
            if (a[0] != '/' || copy_str(cfg->sandbox_exe, sizeof cfg->sandbox_exe, a) < 0)
                return fail(err, errlen, "--sandbox-exe: expected an absolute path: %s", a);
            break;
        case OPT_SITE:
            if (cfg->n_site_dirs >= CONFIG_MAX_SITE_DIRS)
                return fail(err, errlen, "--site-packages: at most %d", CONFIG_MAX_SITE_DIRS);
            if (a[0] != '/' || copy_str(cfg->site_dirs[cfg->n_site_dirs], 256, a) < 0)
                return fail(err, errlen, "--site-packages: expected an absolute path: %s", a);
            cfg->n_site_dirs++;
            break;
        case OPT_PRELOAD:
            if (copy_str(cfg->preload, sizeof cfg->preload, a) < 0)
                return fail(err, errlen, "--preload: list too long");
            break;
        case OPT_LOG_LEVEL:
            if (parse_level(a, &cfg->log_level) < 0)
                return fail(err, errlen, "--log-level: expected debug, info, warn or error");
            break;
        case OPT_HELP:
            fputs(usage, stdout);
            return 1;
        default:
            return fail(err, errlen, "unknown or incomplete option: %s (see --help)",
                        argv[optind - 1]);
        }
    }
    if (optind < argc)
        return fail(err, errlen, "unexpected argument: %s", argv[optind]);
    if (cfg->single_use)
        cfg->capacity = 1;
    return check(cfg, err, errlen);
}

void config_for_forkserver(const struct config *cfg, struct config *out)
{
    *out = *cfg;
    /* The front door, the token and the turn clock are the supervisor's. */
    memset(out->listen_host, 0, sizeof out->listen_host);
    out->listen_port = 0;
    out->single_use = false;
    memset(out->token_file, 0, sizeof out->token_file);
    memset(out->sandbox_exe, 0, sizeof out->sandbox_exe);
    out->allow_no_token = false;
    out->max_upload_tools = out->max_upload_workspace = 0;
    out->block_timeout_ms = out->turn_timeout_ms = out->idle_timeout_ms = 0;
    out->preauth_max = out->preauth_per_peer = 0;
    out->turn_buffer = out->total_buffer = 0;
}
