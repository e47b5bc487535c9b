/* libforkbox-embed: start `forkbox sandbox` on a socketpair and speak frames
 * with it (include/forkbox/embed.h). Runs in the embedding host's process,
 * and briefly in its forked child, up to the exec.
 *
 * Self-contained on purpose: an installed static library whose objects land
 * in someone else's program, so it links none of forkbox's internal
 * libraries (their symbols would join the host's namespace) and uses only
 * libc, cJSON and the header-only cleanup.h and limits.h. */
#include "forkbox/embed.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"

#ifndef FORKBOX_EMBED_BIN
#define FORKBOX_EMBED_BIN "/usr/bin/forkbox"
#endif

extern char **environ;

struct forkbox_sandbox {
    pid_t pid;          /* the child; reaped (0) once waited for */
    int pidfd;          /* owned: the child, for poll and kill without a pid-reuse race */
    int sock;           /* owned: the host's end of the socketpair */
    int status;         /* wait status once reaped */
    char *buf;          /* owned: bytes read and not yet returned as frames */
    size_t len, cap;    /* bytes in buf, its size */
    size_t scanned;     /* buf[0..scanned) holds no '\n' (a long line is scanned once) */
};

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The poll timeout left of timeout_ms since start (-1 stays -1). */
static int left_ms(int timeout_ms, uint64_t start)
{
    if (timeout_ms < 0)
        return -1;
    uint64_t spent = mono_ms() - start;
    return spent >= (uint64_t)timeout_ms ? 0 : (int)((uint64_t)timeout_ms - spent);
}

/* Variables the child never inherits: the transport and mount choice is ours
 * (spec 8.1: CONTROL_HTTP, _TCP or _SOCKET in the host's environment would
 * win over the fd and send the sandbox elsewhere), and FORKBOX names a binary
 * for this library only. */
static bool env_dropped(const char *kv)
{
    return strncmp(kv, "ADK_CODE_MODE_", 14) == 0 || strncmp(kv, "FORKBOX=", 8) == 0;
}

static void child_env_free(char **env)
{
    if (!env)
        return;
    for (int i = 0; i < 3; i++)
        free(env[i]);
    free(env);
}

static char *env_kv(const char *name, const char *value)
{
    size_t n = strlen(name) + strlen(value) + 1;
    char *kv = malloc(n);
    if (kv)
        snprintf(kv, n, "%s%s", name, value);
    return kv;
}

/* The child's environment: the three variables (env[0..3), ours), then the
 * host's less env_dropped (borrowed from environ). Built before fork: the
 * child only execs. NULL on ENOMEM. */
static char **child_env(const char *workdir, const char *tools_dir)
{
    size_t n = 0;
    for (char **e = environ; e && *e; e++)
        n++;
    char **env = calloc(n + 4, sizeof *env);
    if (!env)
        return NULL;
    env[0] = env_kv("ADK_CODE_MODE_CONTROL_FD=", "3");
    env[1] = env_kv("ADK_CODE_MODE_WORKDIR=", workdir);
    env[2] = env_kv("ADK_CODE_MODE_TOOLS_DIR=", tools_dir);
    if (!env[0] || !env[1] || !env[2]) {
        child_env_free(env);
        return NULL;
    }
    size_t k = 3;
    for (char **e = environ; e && *e; e++)
        if (!env_dropped(*e))
            env[k++] = *e;
    return env;
}

/* Between fork and exec: async-signal-safe calls only (the host may have
 * threads). Any failure exits 127, which the host sees as an early EOF. */
static __attribute__((noreturn)) void child_exec(int sock, int devnull, const char *bin,
                                                 char *const *argv, char *const *envp)
{
    /* Signals the host ignores would stay ignored across exec, and its
     * blocked mask would stay blocked: the sandbox starts from defaults. */
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    for (int s = 1; s < NSIG; s++)
        sigaction(s, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);

    /* Lift both fds above the ones being placed, so that no dup2 below
     * overwrites the other (a host with stdin closed gets devnull as 0). */
    sock = fcntl(sock, F_DUPFD_CLOEXEC, 10);
    devnull = fcntl(devnull, F_DUPFD_CLOEXEC, 10);
    /* fd 3 is the channel (CONTROL_FD=3); dup2 leaves the copies without
     * close-on-exec, the originals close at exec. */
    if (sock < 0 || devnull < 0 || dup2(sock, 3) < 0 || dup2(devnull, 0) < 0 || dup2(2, 1) < 0)
        _exit(127);
    /* No other fd of the host's reaches the sandbox binary. */
    if (syscall(SYS_close_range, 4U, ~0U, 0U) < 0)
        for (int fd = 4; fd < 1024; fd++)
            close(fd);
    execve(bin, argv, envp);
    _exit(127);
}

int forkbox_sandbox_start(const struct forkbox_sandbox_opts *opts, struct forkbox_sandbox **out,
                          char *err, size_t errlen)
{
    *out = NULL;
    if (!opts || !opts->workdir || !opts->tools_dir)
        return fail(err, errlen, -EINVAL, "forkbox_sandbox_start: workdir and tools_dir are required");
    const char *bin = opts->forkbox ? opts->forkbox : getenv("FORKBOX");
    if (!bin || !*bin)
        bin = FORKBOX_EMBED_BIN;
    if (access(bin, X_OK) < 0)
        return fail(err, errlen, -errno, "%s: %s", bin, strerror(errno));

    size_t nargs = 0;
    while (opts->args && opts->args[nargs])
        nargs++;
    _cleanup_free_ char **argv = calloc(nargs + 3, sizeof *argv);
    if (!argv)
        return fail(err, errlen, -ENOMEM, "out of memory");
    argv[0] = (char *)bin;
    argv[1] = (char *)"sandbox";
    for (size_t i = 0; i < nargs; i++)
        argv[2 + i] = opts->args[i];
    char **envp = child_env(opts->workdir, opts->tools_dir);
    if (!envp)
        return fail(err, errlen, -ENOMEM, "out of memory");

    struct forkbox_sandbox *sb = calloc(1, sizeof *sb);
    _cleanup_close_ int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int sv[2] = {-1, -1};
    int rc = 0;
    if (!sb) {
        rc = fail(err, errlen, -ENOMEM, "out of memory");
        goto out;
    }
    sb->pidfd = sb->sock = -1;
    /* Both ends close-on-exec: the child dup2s its end to fd 3, and no
     * other process the host starts inherits either. */
    if (devnull < 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        rc = fail(err, errlen, -errno, "socketpair: %s", strerror(errno));
        goto out;
    }
    sb->pid = fork();
    if (sb->pid < 0) {
        rc = fail(err, errlen, -errno, "fork: %s", strerror(errno));
        sb->pid = 0;
        goto out;
    }
    if (sb->pid == 0)
        child_exec(sv[1], devnull, bin, argv, envp);
    close_and_reset(&sv[1]);
    sb->sock = steal_fd(&sv[0]);
    /* The child is not reaped until forkbox_sandbox_wait, so its pid cannot
     * be reused before pidfd_open: the pidfd is this child's. */
    sb->pidfd = (int)syscall(SYS_pidfd_open, sb->pid, 0);
    if (sb->pidfd < 0) {
        rc = fail(err, errlen, -errno, "pidfd_open: %s", strerror(errno));
        kill(sb->pid, SIGKILL);
        waitpid(sb->pid, NULL, 0);
        sb->pid = 0;
        goto out;
    }
    *out = steal_pointer(&sb);
out:
    close_and_reset(&sv[0]);
    close_and_reset(&sv[1]);
    child_env_free(envp);
    forkbox_sandbox_free(sb);
    return rc;
}

int forkbox_sandbox_send(struct forkbox_sandbox *sb, const cJSON *frame, char *err, size_t errlen)
{
    if (!cJSON_IsObject(frame))
        return fail(err, errlen, -EINVAL, "a frame is a JSON object");
    /* Compact, raw UTF-8, one line (spec 3.1): cJSON escapes every control
     * character in strings, so the text holds no newline of its own. */
    _cleanup_free_ char *text = cJSON_PrintUnformatted(frame);
    if (!text)
        return fail(err, errlen, -ENOMEM, "cannot print the frame");
    size_t n = strlen(text);
    text[n] = '\n';  /* overwrites the NUL: written by length from here on */
    for (size_t off = 0; off < n + 1;) {
        ssize_t w = send(sb->sock, text + off, n + 1 - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return fail(err, errlen, -errno, "send: %s", strerror(errno));
        off += (size_t)w;
    }
    return 0;
}

/* A complete line at the front of buf: its length without the '\n', or -1. */
static ssize_t find_line(struct forkbox_sandbox *sb)
{
    /* Not memchr on an empty buffer: buf is NULL before the first read. */
    char *nl = sb->len > sb->scanned ? memchr(sb->buf + sb->scanned, '\n', sb->len - sb->scanned)
                                     : NULL;
    if (!nl) {
        sb->scanned = sb->len;
        return -1;
    }
    return nl - sb->buf;
}

/* Decode and drop the line buf[0..n] (n: its length, '\n' at buf[n]). */
static int take_line(struct forkbox_sandbox *sb, size_t n, cJSON **frame, char *err, size_t errlen)
{
    cJSON *obj = cJSON_ParseWithLength(sb->buf, n);
    memmove(sb->buf, sb->buf + n + 1, sb->len - n - 1);
    sb->len -= n + 1;
    sb->scanned = 0;
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(obj, "kind");
    if (!cJSON_IsObject(obj) || !cJSON_IsString(kind)) {
        cJSON_Delete(obj);
        return fail(err, errlen, -EBADMSG, "a line that is not a frame (%zu bytes)", n);
    }
    *frame = obj;
    return 0;
}

int forkbox_sandbox_recv(struct forkbox_sandbox *sb, int timeout_ms, cJSON **frame, char *err,
                         size_t errlen)
{
    *frame = NULL;
    uint64_t start = mono_ms();
    for (;;) {
        ssize_t n = find_line(sb);
        if (n >= 0)
            return take_line(sb, (size_t)n, frame, err, errlen);
        /* One frame may be as large as a WebSocket message (256 MiB): the
         * buffer grows to that and no further. */
        if (sb->len > EMBED_FRAME_MAX_BYTES)
            return fail(err, errlen, -EMSGSIZE, "a frame over %llu bytes",
                        (unsigned long long)EMBED_FRAME_MAX_BYTES);
        if (sb->cap - sb->len < 64 * KiB) {
            size_t cap = sb->cap ? sb->cap * 2 : 64 * KiB;
            char *p = realloc(sb->buf, cap);
            if (!p)
                return fail(err, errlen, -ENOMEM, "out of memory");
            sb->buf = p;
            sb->cap = cap;
        }
        struct pollfd pfd = {.fd = sb->sock, .events = POLLIN};
        int pr = poll(&pfd, 1, left_ms(timeout_ms, start));
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            return fail(err, errlen, -errno, "poll: %s", strerror(errno));
        if (pr == 0)
            return fail(err, errlen, -ETIMEDOUT, "no frame within %d ms", timeout_ms);
        ssize_t r = recv(sb->sock, sb->buf + sb->len, sb->cap - sb->len, MSG_DONTWAIT);
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r < 0 && errno != ECONNRESET)
            return fail(err, errlen, -errno, "recv: %s", strerror(errno));
        if (r <= 0)  /* a partial last line is a sandbox that died mid-frame */
            return fail(err, errlen, -EPIPE, "the sandbox closed the channel%s",
                        sb->len ? " in the middle of a frame" : "");
        sb->len += (size_t)r;
    }
}

int forkbox_sandbox_wait(struct forkbox_sandbox *sb, int timeout_ms, int *status)
{
    if (sb->pid == 0) {
        *status = sb->status;
        return 0;
    }
    uint64_t start = mono_ms();
    for (;;) {
        struct pollfd pfd = {.fd = sb->pidfd, .events = POLLIN};
        int pr = poll(&pfd, 1, left_ms(timeout_ms, start));
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            return -errno;
        if (pr == 0)
            return -ETIMEDOUT;
        pid_t w = waitpid(sb->pid, &sb->status, 0);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        sb->pid = 0;
        close_and_reset(&sb->pidfd);
        *status = sb->status;
        return 0;
    }
}

int forkbox_sandbox_kill(struct forkbox_sandbox *sb)
{
    if (sb->pid == 0)
        return 0;
    if (syscall(SYS_pidfd_send_signal, sb->pidfd, SIGKILL, NULL, 0) < 0 && errno != ESRCH)
        return -errno;
    return 0;
}

int forkbox_sandbox_fd(const struct forkbox_sandbox *sb)
{
    return sb->sock;
}

void forkbox_sandbox_free(struct forkbox_sandbox *sb)
{
    if (!sb)
        return;
    close_and_reset(&sb->sock);  /* EOF first: a sandbox at a read exits on its own */
    if (sb->pid > 0) {
        int st;
        forkbox_sandbox_kill(sb);
        forkbox_sandbox_wait(sb, -1, &st);
    }
    close_and_reset(&sb->pidfd);
    free(sb->buf);
    free(sb);
}
