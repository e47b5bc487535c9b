/* forkbox-bench: starting and stopping a server (forkboxd or the baseline launcher) in its own
 * process group with its output in a memfd, reading that log (the port, the server-side turn
 * start times), and killing every server when the bench is interrupted. Runs in the
 * forkbox-bench process (and, between fork and exec, in the server's). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

static struct server *live_servers[8];

void on_fatal_signal(int sig)
{
    for (size_t i = 0; i < sizeof live_servers / sizeof *live_servers; i++)
        if (live_servers[i] && live_servers[i]->pid > 0)
            kill(-live_servers[i]->pid, SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* The log from byte `from` to its current end, NUL-terminated. */
char *server_log(const struct server *s, size_t from, size_t *len)
{
    struct stat st;
    size_t n = fstat(s->log_fd, &st) == 0 && (size_t)st.st_size > from ? (size_t)st.st_size - from
                                                                          : 0;
    char *buf = xmalloc(n + 1);
    ssize_t r = n ? pread(s->log_fd, buf, n, (off_t)from) : 0;
    n = r > 0 ? (size_t)r : 0;
    buf[n] = 0;
    if (len)
        *len = n;
    return buf;
}

size_t server_log_mark(const struct server *s)
{
    struct stat st;
    return fstat(s->log_fd, &st) == 0 ? (size_t)st.st_size : 0;
}

void server_stop(struct server *s)
{
    if (s->pid <= 0)
        return;
    kill(s->baseline ? -s->pid : s->pid, SIGTERM);
    int status;
    bool gone = false;
    for (int i = 0; i < 1000 && !gone; i++) { /* up to 10 s for an orderly exit */
        if (waitpid(s->pid, &status, WNOHANG) == s->pid)
            gone = true;
        else
            sleep_ms(10);
    }
    /* Whatever is left of the group (fork server, sandboxes, baseline turns) goes too. */
    kill(-s->pid, SIGKILL);
    if (!gone)
        waitpid(s->pid, &status, 0);
    cg_cpu_remove(s->cg);
    s->cg[0] = 0;
    for (size_t i = 0; i < sizeof live_servers / sizeof *live_servers; i++)
        if (live_servers[i] == s)
            live_servers[i] = NULL;
    s->pid = 0;
}

/* Starts argv with stdout/stderr in a memfd, in its own process group, and waits (at most
 * 30 s) for its "listening on 127.0.0.1:PORT" line. On failure, `why` holds the reason (for a
 * rejected flag: the server's own message). */
int server_start(struct server *s, const char *name, bool baseline, char *const argv[],
                 char *why, size_t whylen)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->baseline = baseline;
    size_t off = 0;
    for (size_t i = 0; argv[i] && off < sizeof s->cmd; i++)
        off += (size_t)snprintf(s->cmd + off, sizeof s->cmd - off, "%s%s", i ? " " : "", argv[i]);
    cg_cpu_make(s->cg, sizeof s->cg);
    s->log_fd = memfd_create("forkbox-bench-log", MFD_CLOEXEC);
    if (s->log_fd < 0) {
        snprintf(why, whylen, "memfd_create: %s", strerror(errno));
        cg_cpu_remove(s->cg);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, whylen, "fork: %s", strerror(errno));
        cg_cpu_remove(s->cg);
        return -1;
    }
    if (pid == 0) {
        if (s->cg[0])
            cg_cpu_enter(s->cg);
        setpgid(0, 0);
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        dup2(s->log_fd, 1);
        dup2(s->log_fd, 2);
        signal(SIGPIPE, SIG_DFL);
        execv(argv[0], argv);
        dprintf(2, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    s->pid = pid;
    for (size_t i = 0; i < sizeof live_servers / sizeof *live_servers; i++)
        if (!live_servers[i]) {
            live_servers[i] = s;
            break;
        }
    uint64_t deadline = now_ns() + 30ull * 1000000000u;
    while (now_ns() < deadline) {
        char *log = server_log(s, 0, NULL);
        char *l = strstr(log, "listening on 127.0.0.1:");
        unsigned port = 0;
        if (l && sscanf(l, "listening on 127.0.0.1:%u", &port) == 1 && port && port < 65536) {
            s->port = (uint16_t)port;
            free(log);
            if (!baseline)
                server_find_infra(s);
            return 0;
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            /* the last non-empty line says why */
            size_t n = strlen(log);
            while (n && (log[n - 1] == '\n' || log[n - 1] == ' '))
                log[--n] = 0;
            char *last = strrchr(log, '\n');
            snprintf(why, whylen, "exited with status %d: %s", WIFEXITED(status) ?
                     WEXITSTATUS(status) : 128 + WTERMSIG(status), last ? last + 1 : log);
            free(log);
            s->pid = 0;
            server_stop(s);
            close(s->log_fd);
            s->log_fd = -1;
            return -1;
        }
        free(log);
        sleep_ms(5);
    }
    snprintf(why, whylen, "no \"listening on\" line within 30 s");
    server_stop(s);
    close(s->log_fd);
    s->log_fd = -1;
    return -1;
}

/* Server-side turn start from forkboxd's debug log after `mark`. */
void server_ready_times(const struct server *s, size_t mark, struct samples *ready,
                        struct samples *spawn)
{
    char *log = server_log(s, mark, NULL);
    for (char *p = log; (p = strstr(p, ": ready ")) != NULL; p++) {
        double r, sp;
        if (sscanf(p, ": ready %lf ms after the upgrade (spawn %lf ms)", &r, &sp) == 2) {
            samples_add(ready, r);
            samples_add(spawn, sp);
        }
    }
    free(log);
}
