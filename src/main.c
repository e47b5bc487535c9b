/* forkboxd: the supervisor, and (re-exec'd) the fork server.
 *
 * Start-up order is a security property:
 *   1. parse the configuration (flags and environment);
 *   2. start the fork server: fork + execve of this binary with a fixed,
 *      minimal environment, so its fresh address space never held the token
 *      or anything else the supervisor will learn;
 *   3. only then read the token (file or environment) and scrub it from this
 *      process's environment block;
 *   4. listen and serve. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "config/config.h"
#include "core/log.h"
#include "loop/loop.h"
#include "sandbox/forkserver.h"
#include "session/session.h"

#define TOKEN_ENV "ADK_CODE_MODE_AUTH_TOKEN"
#define TOKEN_MAX 4096
#define NOFILE_WANT (1u << 20)

/* Thousands of idle turns need fds: the supervisor holds three per turn
 * (client socket, channel, pidfd), the fork server three per pooled sandbox.
 * Raise the soft RLIMIT_NOFILE to the hard one, and as root the hard one to
 * 1M (capped by fs.nr_open). Sandboxes lower theirs again (limits.c). Runs
 * in both processes: the fork server is this binary too. */
static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return;
    rlim_t want = NOFILE_WANT;
    if (geteuid() == 0 && rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) {
        FILE *f = fopen("/proc/sys/fs/nr_open", "re");
        unsigned long nr_open = 0;
        if (f) {
            if (fscanf(f, "%lu", &nr_open) != 1)
                nr_open = 0;
            fclose(f);
        }
        if (nr_open && nr_open < want)
            want = nr_open;
        if (want > rl.rlim_max) {
            struct rlimit up = {.rlim_cur = want, .rlim_max = want};
            if (setrlimit(RLIMIT_NOFILE, &up) == 0)
                return;
        }
    }
    if (rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* Read the bearer token. Returns 0 with *token NULL when none is configured,
 * 0 with an owned copy, or -errno with a message. */
static int read_token(const struct config *cfg, char **token, size_t *len, char *err, size_t errlen)
{
    *token = NULL;
    *len = 0;
    if (cfg->token_file[0]) {
        FILE *f = fopen(cfg->token_file, "re");
        if (!f) {
            snprintf(err, errlen, "--token-file %s: %s", cfg->token_file, strerror(errno));
            return -errno;
        }
        char *t = calloc(1, TOKEN_MAX + 1);
        size_t n = t ? fread(t, 1, TOKEN_MAX + 1, f) : 0;
        fclose(f);
        if (!t)
            return -ENOMEM;
        if (n > TOKEN_MAX) {
            free(t);
            snprintf(err, errlen, "--token-file %s: longer than %d bytes", cfg->token_file, TOKEN_MAX);
            return -EINVAL;
        }
        while (n && (t[n - 1] == '\n' || t[n - 1] == '\r' || t[n - 1] == ' ' || t[n - 1] == '\t'))
            t[--n] = '\0';
        if (n == 0 || memchr(t, '\0', n)) {
            free(t);
            snprintf(err, errlen, "--token-file %s: empty or binary token", cfg->token_file);
            return -EINVAL;
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

/* Sandboxes are clones of the fork server, and /proc/self/cmdline reads
 * the argument strings from memory: there they would show the daemon's whole
 * configuration (host paths, the listen address). Once parsed, the strings
 * are overwritten with the fork server's role; the last byte of the area is
 * left non-zero, which makes the kernel return only the first string
 * (setproctitle's convention), not the zero padding. Needs the strings laid
 * out back to back, as execve does (getopt may have reordered the pointers,
 * not the strings); anything else is left alone. */
static void hide_argv(int argc, char **argv)
{
    static const char title[] = "forkboxd --internal-forkserver";
    char *start = argv[0], *end = argv[0];
    size_t sum = 0;
    for (int i = 0; i < argc; i++) {
        size_t n = strlen(argv[i]) + 1;
        if (argv[i] < start)
            start = argv[i];
        if (argv[i] + n > end)
            end = argv[i] + n;
        sum += n;
    }
    size_t len = (size_t)(end - start);
    if (len != sum || len < sizeof title + 1)
        return;
    memset(start, 0, len);
    memcpy(start, title, sizeof title);
    end[-1] = ' ';
}

/* argv: our whole argv, argv[1] being --internal-forkserver. */
static int run_forkserver(int argc, char **argv)
{
    struct config cfg;
    char err[512];
    log_init("forkserver", LOG_LEVEL_INFO);
    if (config_parse(argc - 1, argv + 1, &cfg, err, sizeof err) != 0) {
        LOG_E("bad configuration from the supervisor: %s", err);
        return 2;
    }
    hide_argv(argc, argv); /* cfg holds copies */
    log_init("forkserver", cfg.log_level);
    forkserver_main(&cfg, 3);
}

int main(int argc, char **argv)
{
    raise_nofile();
    if (argc > 1 && strcmp(argv[1], "--internal-forkserver") == 0)
        return run_forkserver(argc, argv);

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
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 &&
        (rlim_t)cfg.capacity * 3 + 64 > nofile.rlim_cur)
        LOG_W("--capacity %u needs about %u fds (3 per turn); RLIMIT_NOFILE is %llu: raise "
              "the hard limit (ulimit -Hn, LimitNOFILE=)", cfg.capacity, cfg.capacity * 3 + 64,
              (unsigned long long)nofile.rlim_cur);

    char **fs_argv = config_to_argv(&cfg, "forkboxd", "--internal-forkserver");
    struct fs_client fs;
    if (!fs_argv || fs_client_start(&cfg, fs_argv, &fs, err, sizeof err) < 0) {
        fprintf(stderr, "forkboxd: cannot start the fork server: %s\n", err);
        config_argv_free(fs_argv);
        return 1;
    }
    config_argv_free(fs_argv);

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
    r = loop_run(loop);
    server_free(&srv);
    loop_free(loop);
    return r < 0 ? 1 : 0;
}
