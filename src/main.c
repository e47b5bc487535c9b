/* forkboxd: the supervisor. It links no Python: the fork server is
 * forkbox-sandbox (sandbox_main.c).
 *
 * Start-up order is a security property:
 *   1. parse the configuration (flags, --config file, environment), and
 *      take systemd's variables ($NOTIFY_SOCKET, $WATCHDOG_*) out of the
 *      environment (core/sdnotify.h);
 *   2. start the fork server: fork + execve of forkbox-sandbox with a fixed,
 *      minimal environment, so its fresh address space never held the token
 *      or anything else the supervisor will learn;
 *   3. only then read the token (file or environment) and scrub it from this
 *      process's environment block;
 *   4. listen, tell systemd READY=1 (when started by it), and serve. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "config/config.h"
#include "core/log.h"
#include "core/sdnotify.h"
#include "core/util.h"
#include "loop/loop.h"
#include "sandbox/forkserver.h"
#include "session/server.h"

#define TOKEN_ENV "ADK_CODE_MODE_AUTH_TOKEN"
#define TOKEN_MAX 4096
/* Read the bearer token. Returns 0 with *token NULL when none is configured,
 * 0 with an owned copy, or -errno with a message. */
static int read_token(const struct config *cfg, char **token, size_t *len, char *err, size_t errlen)
{
    *token = NULL;
    *len = 0;
    if (cfg->token_file[0]) {
        FILE *f = fopen(cfg->token_file, "re");
        if (!f) {
            return err_fmt(err, errlen, -errno, "--token-file %s: %s", cfg->token_file, strerror(errno));
        }
        char *t = calloc(1, TOKEN_MAX + 1);
        size_t n = t ? fread(t, 1, TOKEN_MAX + 1, f) : 0;
        fclose(f);
        if (!t)
            return -ENOMEM;
        if (n > TOKEN_MAX) {
            free(t);
            return err_fmt(err, errlen, -EINVAL, "--token-file %s: longer than %d bytes", cfg->token_file, TOKEN_MAX);
        }
        while (n && (t[n - 1] == '\n' || t[n - 1] == '\r' || t[n - 1] == ' ' || t[n - 1] == '\t'))
            t[--n] = '\0';
        if (n == 0 || memchr(t, '\0', n)) {
            free(t);
            return err_fmt(err, errlen, -EINVAL, "--token-file %s: empty or binary token", cfg->token_file);
        }
        *token = t;
        *len = n;
    } else {
        char *v = getenv(TOKEN_ENV);
        if (!v)
            return 0;
        /* Set but empty: spec 1.2 quirk, no header can match (every upgrade
         * gets 401). Kept for compatibility; logged. */
        *len = strlen(v);
        *token = strdup(v);
        if (!*token)
            return -ENOMEM;
        if (*len == 0)
            LOG_W("%s is set but empty: every upgrade will get 401", TOKEN_ENV);
        /* Scrub the original bytes so /proc/<pid>/environ no longer shows it. */
        explicit_bzero(v, *len);
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
    if (cfg.config_file[0])
        LOG_I("settings from %s (flags given override it)", cfg.config_file);
    struct rlimit nofile;
    unsigned long long fds_wanted = (unsigned long long)cfg.capacity * 3 + cfg.preauth_max + 64;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && fds_wanted > nofile.rlim_cur)
        LOG_W("--capacity %u and --preauth-max %u need about %llu fds (3 per turn, 1 per "
              "connection not admitted); RLIMIT_NOFILE is %llu: raise the hard limit (ulimit -Hn, "
              "LimitNOFILE=)", cfg.capacity, cfg.preauth_max, fds_wanted,
              (unsigned long long)nofile.rlim_cur);

    /* Before the fork server starts: it is exec'd with a fixed environment
     * anyway, but nothing after this point should find these variables. */
    struct sdnotify sd;
    if (sdnotify_open(&sd, err, sizeof err) < 0)
        LOG_W("%s: not notifying systemd", err);

    struct fs_client fs;
    if (fs_client_start(&cfg, &fs, err, sizeof err) < 0) {
        fprintf(stderr, "forkboxd: cannot start the fork server: %s\n", err);
        return 1;
    }

    char *token;
    size_t token_len;
    if (read_token(&cfg, &token, &token_len, err, sizeof err) < 0) {
        fprintf(stderr, "forkboxd: %s\n", err);
        fs_client_stop(&fs);
        return 2;
    }

    struct loop *loop = loop_new();
    struct server srv;
    if (!loop || server_init(&srv, loop, &cfg, token, token_len, &fs, err, sizeof err) < 0) {
        fprintf(stderr, "forkboxd: %s\n", err[0] ? err : "out of memory");
        return 1;
    }
    server_notify_ready(&srv, &sd);
    r = loop_run(loop);
    server_free(&srv);
    loop_free(loop);
    sdnotify_close(&sd);
    return r < 0 ? 1 : 0;
}
