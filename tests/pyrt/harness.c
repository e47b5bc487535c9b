/* pyrt test harness: one sandbox turn without the sandbox.
 *
 *   pyrt_harness [--output-cap N] [--snapshot-max N] [--max-unpacked N]
 *                [--max-members N] [--preload LIST] [--site DIR] [--clone]
 *                [--warm FD] CHAN_FD TOOLS_DIR WORKSPACE_DIR
 *
 * Fills a struct config by hand, runs pyrt_init() as the fork server would,
 * then pyrt_serve() directly in this process on CHAN_FD, an fd inherited from
 * the test. With --clone, the turn runs instead in a child made with the raw
 * clone syscall (as the sandbox does), which calls pyrt_after_fork() first;
 * the harness then exits with the child's status. With --warm FD, the turn
 * runs as a pooled sandbox's does: warm-up first, reported on FD (another
 * inherited socket). Exit status 2 means bad usage or a failed pyrt_init
 * (reason on stderr). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config/config.h"
#include "core/limits.h"
#include "pyrt/pyrt.h"

static int usage(void)
{
    fprintf(stderr, "usage: pyrt_harness [--output-cap N] [--snapshot-max N] "
                    "[--max-unpacked N] [--max-members N] [--preload LIST] [--site DIR] "
                    "[--clone] [--warm FD] CHAN_FD TOOLS_DIR WORKSPACE_DIR\n");
    return 2;
}

static int parse_num(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || !*s || *end)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    static struct config cfg;
    cfg.max_upload_tools = ARCHIVE_DEFAULT_MAX_UPLOAD;
    cfg.max_upload_workspace = ARCHIVE_DEFAULT_MAX_UPLOAD;
    cfg.max_unpacked = ARCHIVE_DEFAULT_MAX_UNPACKED;
    cfg.max_members = ARCHIVE_DEFAULT_MAX_MEMBERS;
    cfg.snapshot_max = SNAPSHOT_DEFAULT_MAX_BYTES;
    cfg.output_cap = OUTPUT_DEFAULT_CAP;
    snprintf(cfg.tools_dir, sizeof(cfg.tools_dir), "/tools");

    int i = 1;
    int use_clone = 0;
    int warm_fd = -1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        if (!strcmp(argv[i], "--clone")) {
            use_clone = 1;
            i--;
            continue;
        }
        if (i + 1 >= argc)
            return usage();
        const char *opt = argv[i], *val = argv[i + 1];
        int bad = 0;
        if (!strcmp(opt, "--output-cap"))
            bad = parse_num(val, &cfg.output_cap);
        else if (!strcmp(opt, "--snapshot-max"))
            bad = parse_num(val, &cfg.snapshot_max);
        else if (!strcmp(opt, "--max-unpacked"))
            bad = parse_num(val, &cfg.max_unpacked);
        else if (!strcmp(opt, "--max-members"))
            bad = parse_num(val, &cfg.max_members);
        else if (!strcmp(opt, "--preload"))
            snprintf(cfg.preload, sizeof(cfg.preload), "%s", val);
        else if (!strcmp(opt, "--warm")) {
            uint64_t w;
            bad = parse_num(val, &w) || w < 3 || w > 1024;
            warm_fd = bad ? -1 : (int)w;
        } else if (!strcmp(opt, "--site") && cfg.n_site_dirs < CONFIG_MAX_SITE_DIRS)
            snprintf(cfg.site_dirs[cfg.n_site_dirs++], sizeof(cfg.site_dirs[0]), "%s", val);
        else
            bad = -1;
        if (bad)
            return usage();
    }
    if (argc - i != 3)
        return usage();
    uint64_t fd64;
    if (parse_num(argv[i], &fd64) || fd64 > 1024)
        return usage();
    const char *tools_dir = argv[i + 1], *ws_dir = argv[i + 2];

    char err[512];
    if (pyrt_init(&cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "pyrt_harness: %s\n", err);
        return 2;
    }
    /* A second call is refused as the error convention says: -EALREADY with
     * a reason, not -1. Checked on every run, so every pyrt test fails if
     * that changes. */
    err[0] = '\0';
    int again = pyrt_init(&cfg, err, sizeof(err));
    if (again != -EALREADY || !strstr(err, "already initialised")) {
        fprintf(stderr, "pyrt_harness: a second pyrt_init returned %d (%s), not -EALREADY\n",
                again, err);
        return 2;
    }
    int tools_fd = open(tools_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (tools_fd < 0) {
        fprintf(stderr, "pyrt_harness: %s: %s\n", tools_dir, strerror(errno));
        return 2;
    }
    if (use_clone) {
        /* Like the fork server: raw clone, no glibc fork handlers. */
        long pid = syscall(SYS_clone, (unsigned long)SIGCHLD, 0L, 0L, 0L, 0L);
        if (pid < 0) {
            perror("pyrt_harness: clone");
            return 2;
        }
        if (pid == 0) {
            pyrt_after_fork();
            pyrt_serve((int)fd64, tools_fd, warm_fd, tools_dir, ws_dir);
        }
        close(tools_fd);
        close((int)fd64);
        if (warm_fd >= 0)
            close(warm_fd);
        int status;
        while (waitpid((pid_t)pid, &status, 0) < 0)
            if (errno != EINTR)
                return 2;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    pyrt_serve((int)fd64, tools_fd, warm_fd, tools_dir, ws_dir);
}
