/* Daemon configuration: flags and environment -> one immutable struct.
 *
 * The supervisor parses it once at start. The fork server is exec'd with the
 * argv produced by config_to_argv(), which carries every setting but the
 * token, so both processes see the same values and the fork server never
 * sees a secret. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/log.h"

#define CONFIG_MAX_SITE_DIRS 16

struct config {
    /* front door */
    char listen_host[64];       /* numeric IPv4/IPv6 address */
    uint16_t listen_port;       /* 0 = ephemeral */
    unsigned capacity;          /* concurrent turns (default 64) */
    bool single_use;            /* capacity 1; exit 0 when the turn ends */
    char token_file[256];       /* "" = use ADK_CODE_MODE_AUTH_TOKEN */
    bool allow_no_token;        /* informational: no token configured */
    unsigned preauth_max;       /* connections not yet admitted, at most (1024) */
    unsigned preauth_per_peer;  /* of them from one IPv4 address or IPv6 /64 (128) */

    /* per-turn limits (spec 4.5, 9.2) */
    uint64_t max_upload_tools;     /* compressed bytes; env ADK_CODE_MODE_MAX_UPLOAD_TOOLS */
    uint64_t max_upload_workspace; /* env ADK_CODE_MODE_MAX_UPLOAD_WORKSPACE */
    uint64_t max_unpacked;         /* decompressed bytes per archive */
    uint64_t max_members;          /* members per archive */
    uint64_t snapshot_max;         /* data bytes in the returned snapshot */
    uint64_t output_cap;           /* bytes kept per stream per block */

    /* sandbox */
    char tools_dir[256];        /* env ADK_CODE_MODE_TOOLS_DIR, default /tools */
    bool isolate;               /* false only with --no-isolation (benchmarks) */
    unsigned sandbox_uid;       /* host uid the sandbox maps to (65534) */
    unsigned sandbox_gid;
    char policy_file[256];      /* seccomp policy */
    char site_dirs[CONFIG_MAX_SITE_DIRS][256]; /* --site-packages, repeatable */
    unsigned n_site_dirs;
    char preload[1024];         /* comma-separated module names */
    unsigned pool_size;         /* pre-forked sandboxes (0 = none) */

    /* resources and time */
    uint64_t memory_max;        /* bytes per turn */
    uint64_t pids_max;
    uint64_t cpu_millis;        /* CPU per second of wall time, in ms (1000 = 1 CPU) */
    uint64_t tmpfs_size;        /* bytes for /workspace and /tmp together */
    uint64_t block_timeout_ms;  /* 0 = none */
    uint64_t turn_timeout_ms;   /* 0 = none */
    uint64_t idle_timeout_ms;   /* between blocks; default 600 s */

    enum log_level log_level;
};

/* Parse argv and the environment. Returns 0; on a bad value returns -EINVAL
 * with a message in err. Prints help and returns 1 for --help. */
int config_parse(int argc, char **argv, struct config *cfg, char *err, size_t errlen);

/* A NULL-terminated argv (malloc'd strings; free with config_argv_free) that
 * makes config_parse() in another process produce the same struct, without
 * the token and without reading the environment. */
char **config_to_argv(const struct config *cfg, const char *argv0, const char *first_flag);
void config_argv_free(char **argv);
