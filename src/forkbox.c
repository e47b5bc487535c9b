/* forkbox: the commands for running sandboxes without a server.
 *
 *   forkbox sandbox [forkboxd's flags]   one sandbox on a spec 8.2 stream
 *                                        (stream/relay.h, docs/embedding.md
 *                                        "Without a server")
 *   forkbox run [...] FILE.py...         one turn, a block per file: execs the
 *                                        Python host (embed/run_cmd.c,
 *                                        docs/embedding.md)
 *
 * Like forkboxd it links no Python: the fork server is python3.11 running
 * forkbox-sandbox.so, started by sandbox/fsclient.c. Start-up order, as
 * forkboxd's (main.c), is a security property:
 *   1. read the spec 8.1 variables and move the host's inherited fds above
 *      the ones the fork server keeps across its exec (stream/transport.h);
 *   2. parse the settings: forkboxd's flags, --config file and environment
 *      (config.c), plus ADK_CODE_MODE_WORKDIR, and lock a pair of host ids
 *      that no other forkbox sandbox nor any forkboxd holds (sandbox/idlock.h);
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
#include "loop/closer.h"
#include "sandbox/forkserver.h"
#include "sandbox/idlock.h"
#include "session/chan_conn.h"
#include "stream/relay.h"
#include "stream/transport.h"

#define ENV_WORKDIR "ADK_CODE_MODE_WORKDIR"
/* Default first id of `forkbox sandbox`: the 65536 ids after forkboxd's
 * default range, so that neither shares an id with the other unless an
 * --id-range says so (and then the one started second refuses). */
#define STREAM_ID_FIRST 2013331456u

#define SANDBOX_WHAT \
    "  runs one sandbox speaking the stream transports (spec 8.2), chosen by\n" \
    "  ADK_CODE_MODE_CONTROL_TCP / _SOCKET / _FD (default fd 3), with the host's\n" \
    "  ADK_CODE_MODE_WORKDIR (default /workspace) read-write (served as its\n" \
    "  owner's, at most --workspace-max more) and\n" \
    "  ADK_CODE_MODE_TOOLS_DIR (default /tools) read-only\n"

static void usage(FILE *f)
{
    fprintf(f, "usage: forkbox sandbox [forkboxd's flags: --memory, --pids, --cpu, "
               "--block-timeout, --policy, --allow-no-cgroups, ...]\n"
               SANDBOX_WHAT
               "usage: forkbox run [--workspace DIR] [--tools host_tools.py] FILE.py...\n"
               "  runs the files as the blocks of one turn in a local sandbox (forkbox run --help)\n");
}

/* `forkbox sandbox --help` needs no transport: it is answered before one is
 * looked for (fd 3 need not be open). */
static bool wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--help") == 0)
            return true;
    return false;
}

static int sandbox_main(int argc, char **argv)
{
    char err[512] = "";
    if (wants_help(argc, argv)) {
        fputs("usage: forkbox sandbox [options]\n" SANDBOX_WHAT
              "options: forkboxd's (those of the server alone have no effect here; "
              "forkbox(1))\n", stdout);
        config_print_options(stdout);
        return 0;
    }
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
    /* As forkboxd's (main.c): the OOM killer takes the sandbox first and
     * us last (lowering it needs root: else it stays), and fds kept to
     * recover with (core/limits.h). */
    (void)oom_score_adj_set(OOM_ADJ_SUPERVISOR, true);
    (void)fd_reserve_keep(FD_RESERVE);
    /* Held until we exit, after the fork server has reaped the sandbox.
     * Without root the fork server refuses isolation itself, and says so. */
    struct id_lock ids = ID_LOCK_INIT;
    if (id_lock_wanted(&cfg)) {
        uint32_t first = cfg.id_range_set ? cfg.id_first : STREAM_ID_FIRST;
        uint32_t count = cfg.id_range_set ? cfg.id_count : 65536;
        if (id_lock_pair(IDLOCK_DIR, first, count, &ids, err, sizeof err) < 0) {
            fprintf(stderr, "forkbox sandbox: %s\n", err);
            transport_close(&t);
            return STREAM_EXIT_USAGE;
        }
        cfg.id_first = ids.first;
        cfg.id_count = ids.count;
        cfg.ids_locked = true;
    }
    /* A host that goes away is an error on the write, not a signal. */
    signal(SIGPIPE, SIG_IGN);

    struct fs_client fs;
    if (fs_client_start(&cfg, -1, &fs, err, sizeof err) < 0) {
        fprintf(stderr, "forkbox sandbox: cannot start the sandbox: %s\n", err);
        transport_close(&t);
        id_lock_release(&ids);
        return STREAM_EXIT_USAGE;
    }
    if (closer_start(err, sizeof err) < 0) { /* threads only once the fork server runs */
        fprintf(stderr, "forkbox sandbox: %s\n", err);
        fs_client_stop(&fs);
        transport_close(&t);
        id_lock_release(&ids);
        return STREAM_EXIT_USAGE;
    }
    chan_conn_init();
    if (transport_connect(&t, err, sizeof err) < 0) {
        fprintf(stderr, "forkbox sandbox: %s\n", err);
        fs_client_stop(&fs);
        transport_close(&t);
        id_lock_release(&ids);
        return STREAM_EXIT_USAGE;
    }
    int status = stream_run(&cfg, &fs, &t);
    transport_close(&t);
    fs_client_stop(&fs);
    id_lock_release(&ids);
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
