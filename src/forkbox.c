/* forkbox: the commands for running sandboxes without a server.
 *
 *   forkbox sandbox [forkboxd's flags]   one sandbox on a spec 8.2 stream
 *                                        (stream/relay.h, README "Without a
 *                                        server: forkbox sandbox")
 *   forkbox run [...] FILE.py...         one turn, a block per file: execs the
 *                                        Python host (embed/run_cmd.c, README
 *                                        "Embedding forkbox")
 *
 * Like forkboxd it links no Python: the fork server is python3.11 running
 * forkbox-sandbox.so, started by sandbox/fsclient.c. Start-up order, as
 * forkboxd's (main.c), is a security property:
 *   1. read the spec 8.1 variables and move the host's inherited fds above
 *      the ones the fork server keeps across its exec (stream/transport.h);
 *   2. parse the settings: forkboxd's flags, --config file and environment
 *      (config.c), plus ADK_CODE_MODE_WORKDIR, and lease a pair of host ids
 *      no other forkbox sandbox holds (stream/lease.h);
 *   3. start the fork server: fork + execve of python3.11 with a fixed
 *      environment, so its fresh address space never held the host's fds or
 *      the token, and neither does any sandbox cloned from it;
 *   4. only then connect (TCP, Unix socket) and send the token line, which
 *      is then scrubbed from our environment;
 *   5. relay until the turn ends. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/util.h"
#include "embed/run_cmd.h"
#include "sandbox/forkserver.h"
#include "stream/lease.h"
#include "stream/relay.h"
#include "stream/transport.h"

#define ENV_WORKDIR "ADK_CODE_MODE_WORKDIR"

static void usage(FILE *f)
{
    fprintf(f, "usage: forkbox sandbox [forkboxd's flags: --memory, --pids, --cpu, "
               "--block-timeout, --policy, --allow-no-cgroups, ...]\n"
               "  runs one sandbox speaking the stream transports (spec 8.2), chosen by\n"
               "  ADK_CODE_MODE_CONTROL_TCP / _SOCKET / _FD (default fd 3), with the host's\n"
               "  ADK_CODE_MODE_WORKDIR (default /workspace) bound read-write and\n"
               "  ADK_CODE_MODE_TOOLS_DIR (default /tools) read-only\n"
               "usage: forkbox run [--workspace DIR] [--tools host_tools.py] FILE.py...\n"
               "  runs the files as the blocks of one turn in a local sandbox (forkbox run --help)\n");
}

static int sandbox_main(int argc, char **argv)
{
    char err[512] = "";
    struct transport t;
    int r = transport_select(&t, err, sizeof err);
    if (r < 0) {
        fprintf(stderr, "forkbox sandbox: %s\n", err);
        return STREAM_EXIT_USAGE;
    }
    struct config cfg;
    r = config_parse(argc, argv, &cfg, err, sizeof err);
    if (r == 1)
        return 0;
    if (r < 0) {
        fprintf(stderr, "forkbox sandbox: %s\n", err);
        return STREAM_EXIT_USAGE;
    }
    /* The relay holds a whole message each way (stream/relay.c): unless
     * --turn-buffer says otherwise, room for the largest each way. */
    if (cfg.turn_buffer == TURN_BUFFER_DEFAULT)
        cfg.turn_buffer = STREAM_TURN_BUFFER_DEFAULT;
    /* One sandbox, fresh: no pool, one turn. */
    cfg.capacity = 1;
    cfg.pool_size = 0;
    cfg.single_use = true;
    const char *w = getenv(ENV_WORKDIR);
    if (!w || !w[0])
        w = "/workspace";
    if (strlen(w) >= sizeof cfg.workdir) {
        fprintf(stderr, "forkbox sandbox: " ENV_WORKDIR ": too long\n");
        return STREAM_EXIT_USAGE;
    }
    snprintf(cfg.workdir, sizeof cfg.workdir, "%s", w);
    log_init("forkbox", cfg.log_level);
    log_set_format(cfg.log_format, cfg.log_journal);
    /* Held until we exit, after the fork server has reaped the sandbox.
     * Without root the fork server refuses isolation itself, and says so. */
    struct id_lease lease = {.fd = -1};
    if (cfg.isolate && geteuid() == 0) {
        uint32_t first = cfg.id_range_set ? cfg.id_first : STREAM_ID_FIRST;
        uint32_t count = cfg.id_range_set ? cfg.id_count : 65536;
        if (id_lease_take(first, count, &lease, err, sizeof err) < 0) {
            fprintf(stderr, "forkbox sandbox: %s\n", err);
            transport_close(&t);
            return STREAM_EXIT_USAGE;
        }
        cfg.id_first = lease.first;
        cfg.id_count = 2;
    }
    /* A host that goes away is an error on the write, not a signal. */
    signal(SIGPIPE, SIG_IGN);

    struct fs_client fs;
    if (fs_client_start(&cfg, &fs, err, sizeof err) < 0) {
        fprintf(stderr, "forkbox sandbox: cannot start the sandbox: %s\n", err);
        transport_close(&t);
        id_lease_release(&lease);
        return STREAM_EXIT_USAGE;
    }
    if (transport_connect(&t, err, sizeof err) < 0) {
        fprintf(stderr, "forkbox sandbox: %s\n", err);
        fs_client_stop(&fs);
        transport_close(&t);
        id_lease_release(&lease);
        return STREAM_EXIT_USAGE;
    }
    int status = stream_run(&cfg, &fs, &t);
    transport_close(&t);
    fs_client_stop(&fs);
    id_lease_release(&lease);
    return status;
}

int main(int argc, char **argv)
{
    log_init("forkbox", LOG_LEVEL_INFO);
    if (argc >= 2 && strcmp(argv[1], "sandbox") == 0)
        return sandbox_main(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "run") == 0)  /* embed/run_cmd.c */
        return run_cmd_main(argc - 1, argv + 1);
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        usage(stdout);
        return 0;
    }
    usage(stderr);
    return STREAM_EXIT_USAGE;
}
