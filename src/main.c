/* forkboxd: the supervisor. It links no Python: the fork server is
 * python3.11 running forkbox-sandbox.so (sandbox_module.c).
 *
 * Start-up order is a security property:
 *   1. parse the configuration (flags, --config file, environment), lock
 *      the id range (sandbox/idlock.h: no other daemon hands out its ids),
 *      and take systemd's variables ($NOTIFY_SOCKET, $WATCHDOG_*) out of
 *      the environment (core/sdnotify.h);
 *   2. start the fork server: fork + execve of python3.11 with a fixed,
 *      minimal environment, so its fresh address space never held the token
 *      or anything else the supervisor will learn;
 *   3. only then read the token (file or environment) and scrub it from this
 *      process's environment block;
 *   4. listen, tell systemd READY=1 (when started by it), and serve.
 * The supervisor's threads (loop/closer.h, loop/logq.h, the loop's
 * watchdog) start after step 2: they only close fds, write stderr and
 * watch the loop, and hold nothing of a turn's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "config/config.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/sdnotify.h"
#include "core/util.h"
#include "loop/closer.h"
#include "loop/logq.h"
#include "loop/loop.h"
#include "loop/watchdog.h"
#include "net/auth.h"
#include "sandbox/forkserver.h"
#include "sandbox/idlock.h"
#include "session/chan_conn.h"
#include "session/server.h"

#define TOKEN_ENV "ADK_CODE_MODE_AUTH_TOKEN"
/* Read the bearer tokens: the file's (net/auth.h), else the environment's
 * one. Returns 0 with *tokens NULL when none is configured, 0 with an owned
 * set, or -errno with a message. */
static int read_tokens(const struct config *cfg, struct tokens **tokens, char *err, size_t errlen)
{
    *tokens = NULL;
    if (cfg->token_file[0]) {
        char why[512];
        int r = tokens_read_file(cfg->token_file, tokens, why, sizeof why);
        if (r < 0)
            return err_fmt(err, errlen, r, "--token-file %s", why);
    } else {
        char *v = getenv(TOKEN_ENV);
        if (!v)
            return 0;
        /* Set but empty: spec 1.2 quirk, no header can match (every upgrade
         * gets 401). Kept for compatibility; logged. */
        size_t len = strlen(v);
        if (tokens_one(v, len, tokens) < 0)
            return err_fmt(err, errlen, -ENOMEM, "out of memory");
        if (len == 0)
            LOG_W("%s is set but empty: every upgrade will get 401", TOKEN_ENV);
        /* Scrub the original bytes so /proc/<pid>/environ no longer shows it. */
        explicit_bzero(v, len);
    }
    unsetenv(TOKEN_ENV);
    return 0;
}

int main(int argc, char **argv)
{
    raise_nofile();

    struct config cfg;
    char err[512] = "";
    log_init("forkboxd", LOG_LEVEL_INFO);
    int r = config_parse(argc, argv, &cfg, err, sizeof err);
    if (r == 1)
        return 0;
    if (r < 0) {
        fprintf(stderr, "forkboxd: %s\n", err);
        return 2;
    }
    log_init("forkboxd", cfg.log_level);
    log_set_format(cfg.log_format, cfg.log_journal);
    if (cfg.config_file[0])
        LOG_I("settings from %s (flags given override it)", cfg.config_file);
    /* The OOM killer takes sandboxes first, us last (core/limits.h); as
     * root, so the fork server and sandboxes can be given theirs. */
    r = oom_score_adj_set(OOM_ADJ_SUPERVISOR, true);
    if (r < 0)
        LOG_D("oom_score_adj not lowered to %d: %s", OOM_ADJ_SUPERVISOR, strerror(-r));
    /* fds to recover with once the table is full (core/limits.h). */
    r = fd_reserve_keep(FD_RESERVE);
    if (r < 0)
        LOG_W("no fd reserve (%d fds below the hard RLIMIT_NOFILE): %s; out of fds, new "
              "connections wait unanswered", FD_RESERVE,
              r == -ERANGE ? "the hard limit is too low" : strerror(-r));
    struct rlimit nofile;
    unsigned long long fds_wanted = (unsigned long long)cfg.capacity * 3 + cfg.preauth_max + 64;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && fds_wanted > nofile.rlim_cur)
        LOG_W("--capacity %u and --preauth-max %u need about %llu fds (3 per turn, 1 per "
              "connection not admitted); RLIMIT_NOFILE is %llu: raise the hard limit (ulimit -Hn, "
              "LimitNOFILE=)", cfg.capacity, cfg.preauth_max, fds_wanted,
              (unsigned long long)nofile.rlim_cur);

    /* Before the fork server, which hands the range's ids out: they are
     * ours alone until we exit. */
    struct id_lock ids = ID_LOCK_INIT;
    if (id_lock_wanted(&cfg)) {
        if (id_lock_range(IDLOCK_DIR, cfg.id_first, cfg.id_count, &ids, err, sizeof err) < 0) {
            LOG_E("%s", err);
            return 1;
        }
        cfg.ids_locked = true;
    }

    /* Before the fork server starts: it is exec'd with a fixed environment
     * anyway, but nothing after this point should find these variables. */
    struct sdnotify sd;
    if (sdnotify_open(&sd, err, sizeof err) < 0)
        LOG_W("%s: not notifying systemd", err);

    /* The fork server's stderr is a pipe we read (loop/logq.h): its log
     * lines never wait for our stderr's reader, nor do ours. */
    int fs_log_fd;
    if (logq_open(&fs_log_fd, err, sizeof err) < 0) {
        LOG_E("%s", err);
        return 1;
    }
    struct fs_client fs;
    if (fs_client_start(&cfg, fs_log_fd, &fs, err, sizeof err) < 0) {
        LOG_E("cannot start the fork server: %s", err);
        return 1;
    }
    logq_drain();

    /* Threads only now: the fork server's first start forked a process
     * with none (later restarts fork only async-signal-safe calls before
     * their exec: fs_client_launch). */
    if (closer_start(err, sizeof err) < 0 || logq_start(err, sizeof err) < 0) {
        LOG_E("%s", err);
        fs_client_stop(&fs);
        return 1;
    }
    chan_conn_init();

    struct tokens *tokens;
    if (read_tokens(&cfg, &tokens, err, sizeof err) < 0) {
        LOG_E("%s", err);
        fs_client_stop(&fs);
        return 2;
    }

    struct loop *loop = loop_new();
    struct server srv;
    if (!loop || logq_watch(loop) < 0 ||
        server_init(&srv, loop, &cfg, tokens, &fs, err, sizeof err) < 0) {
        LOG_E("%s", err[0] ? err : "out of memory");
        return 1;
    }
    if (loop_watchdog_start(loop, err, sizeof err) < 0)
        LOG_W("%s: a stuck event loop will not be noticed", err);
    server_notify_ready(&srv, &sd);
    r = loop_run(loop);
    int status = r < 0 ? 1 : server_exit_status(&srv);
    server_free(&srv);
    loop_free(loop);
    sdnotify_close(&sd);
    id_lock_release(&ids);
    return status;
}
