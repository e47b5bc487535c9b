/* Daemon configuration: flags and environment -> one immutable struct.
 *
 * The supervisor parses it once at start. The fork server gets its share,
 * config_for_forkserver(), as bytes on its control socket, not as argv:
 * sandboxes are clones of the fork server and can read its command line
 * (/proc/self/cmdline), so that holds nothing but a fixed marker. Settings
 * only the supervisor uses (listen address, token file, upload limits,
 * timeouts) are not sent at all. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/log.h"

#define CONFIG_MAX_SITE_DIRS 16

/* --cpu-share: what the scheduler weighs alike when sandboxes contend. */
enum cpu_share {
    CPU_SHARE_TURN,   /* every busy turn (its cgroup), whoever runs it */
    CPU_SHARE_TENANT, /* every tenant with a busy turn (a cgroup per tenant above its turns'),
                         so ten busy turns of one get what one of another gets */
};

struct config {
    char config_file[256];      /* --config: the file read (supervisor only; "" = none) */

    /* front door */
    char listen_host[64];       /* numeric IPv4/IPv6 address */
    uint16_t listen_port;       /* 0 = ephemeral */
    unsigned capacity;          /* concurrent turns (default 64) */
    unsigned tenant_capacity;   /* of them, held by one tenant at most (0 = no such limit) */
    bool single_use;            /* capacity 1; exit 0 when the turn ends */
    char token_file[256];       /* "" = use ADK_CODE_MODE_AUTH_TOKEN */
    unsigned preauth_max;       /* connections not yet admitted, at most (1024) */
    unsigned preauth_per_peer;  /* of them from one IPv4 address or IPv6 /64 (128) */
    char metrics_host[64];      /* --metrics-listen: numeric address; "" = no metrics */
    uint16_t metrics_port;      /* 0 = ephemeral */

    /* per-turn limits (spec 4.5, 9.2) */
    uint64_t max_upload_tools;     /* compressed bytes; env ADK_CODE_MODE_MAX_UPLOAD_TOOLS */
    uint64_t max_upload_workspace; /* env ADK_CODE_MODE_MAX_UPLOAD_WORKSPACE */
    uint64_t max_unpacked;         /* decompressed bytes per archive */
    uint64_t max_members;          /* members per archive */
    uint64_t snapshot_max;         /* data bytes in the returned snapshot */
    uint64_t output_cap;           /* bytes kept per stream per block */

    /* sandbox */
    char tools_dir[256];        /* env ADK_CODE_MODE_TOOLS_DIR, default /tools */
    char workdir[256];          /* `forkbox sandbox` only (not a flag: its spec 8.2
                                   ADK_CODE_MODE_WORKDIR): the host dir bound read-write
                                   at the same path, and the tools dir a host dir bound
                                   read-only (stream mode); "" = WebSocket turns */
    bool isolate;               /* false only with --no-isolation (benchmarks) */
    bool allow_no_cgroups;      /* --allow-no-cgroups: an unenforceable cgroup limit is a
                                   warning, not a refusal to start (cgroups_probe.c) */
    uint32_t id_first;          /* host uids/gids forkboxd owns: one per live sandbox, */
    uint32_t id_count;          /* from [id_first, id_first + id_count) (--id-range) */
    bool id_range_set;          /* --id-range given (flag, file or environment) */
    bool ids_locked;            /* not a setting: the supervisor holds the range's lock
                                   (sandbox/idlock.h), so turn cgroups named after it are
                                   ours (cgroups_stale.h) */
    char policy_file[256];      /* seccomp policy */
    char sandbox_module[256];   /* --sandbox-module; "" = the compiled-in one (fsclient.c) */
    char site_dirs[CONFIG_MAX_SITE_DIRS][256]; /* --site-packages, repeatable */
    unsigned n_site_dirs;
    char preload[1024];         /* comma-separated module names */
    unsigned pool_size;         /* pre-forked sandboxes (0 = none) */
    bool step_times;            /* --step-times: log each fresh spawn's step times at
                                   debug level (benchmarks; core/steptime.h) */

    /* resources and time */
    uint64_t memory_max;        /* bytes per turn */
    uint64_t pids_max;
    uint64_t cpu_millis;        /* CPU per second of wall time, in ms (1000 = 1 CPU) */
    unsigned cpu_weight;        /* the sandboxes' parent cgroup's CPU weight (cgroup v2 units,
                                   1..10000); 0 = 100 per turn running (cgroups.c) */
    enum cpu_share cpu_share;   /* --cpu-share turn|tenant (cgroups_tenant.c) */
    uint64_t tmpfs_size;        /* bytes for /workspace and /tmp together */
    uint64_t workspace_max;     /* `forkbox sandbox`: bytes a turn may add to the host's
                                   workdir (sandbox/hostfs.c); 0 = tmpfs_size */
    uint64_t block_timeout_ms;  /* default 900 s; 0 = none */
    uint64_t turn_timeout_ms;   /* default 7200 s; 0 = none */
    uint64_t idle_timeout_ms;   /* between blocks; default 600 s */
    uint64_t drain_timeout_ms;  /* SIGTERM: running turns' grace; default 30 s; 0 = close at once */
    uint64_t drain_admit_ms;    /* SIGTERM: new turns still admitted this long (/ready 503); 0 */
    uint64_t turn_buffer;       /* bytes of messages one turn may make the supervisor hold */
    uint64_t tenant_buffer;     /* ... all turns of one tenant together (0 = no such limit) */
    uint64_t total_buffer;      /* ... all turns together */

    enum log_level log_level;
    enum log_format log_format; /* --log-format text|json */
    bool log_journal;           /* stderr is the journal ($JOURNAL_STREAM matches it) */
};

/* Parse argv, the --config file and the environment: defaults, then the
 * file, then the environment, then the flags (each overrides the one
 * before). Returns 0; on a bad value returns -EINVAL
 * with a message in err. Prints help and returns 1 for --help. */
int config_parse(int argc, char **argv, struct config *cfg, char *err, size_t errlen);

/* The option list of --help, a line per flag with its default, without
 * the usage line: `forkbox sandbox --help`, which takes these flags, prints
 * it under its own. */
void config_print_options(FILE *out);

/* What the fork server is given: the settings whose row in config.c's table
 * says forkserver, every other byte zero (listen address, single-use, token
 * file, sandbox executable, upload limits, timeouts, buffers, pre-auth).
 * Sent as is on the control socket (forkbox-sandbox.so is built from the same
 * tree as forkboxd, so the layout is the same). */
void config_for_forkserver(const struct config *cfg, struct config *out);

/* Is this process the build tree's forkboxd, forkbox or forkbox-policy (the very file, by device and
 * inode: a copy or an installed forkboxd is not)? Then its defaults are the
 * trees' files (the source tree's policy, the build tree's forkbox-sandbox)
 * instead of the installed ones. */
bool config_built_here(void);

/* The policy file used without --policy: the source tree's for the build
 * tree's programs, else the installed one (forkbox-policy's default too). */
const char *config_default_policy(void);

/* The option table (config.c) checked against itself: one row per name,
 * every default within its bounds and said in its --help line, every bound
 * within its field. 0 or -EINVAL with the row at fault in err. For tests. */
int config_table_check(char *err, size_t errlen);
