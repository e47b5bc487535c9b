/* Runs in the `forkbox sandbox` process: the spec 8.1/8.2 transports (see
 * transport.h). */
#include "stream/transport.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/util.h"

#define ENV_HTTP "ADK_CODE_MODE_CONTROL_HTTP"
#define ENV_TCP "ADK_CODE_MODE_CONTROL_TCP"
#define ENV_SOCKET "ADK_CODE_MODE_CONTROL_SOCKET"
#define ENV_FD "ADK_CODE_MODE_CONTROL_FD"
#define ENV_TOKEN "ADK_CODE_MODE_CONTROL_TOKEN"

/* One fd number of ADK_CODE_MODE_CONTROL_FD, open and not 2. */
static int parse_fd(const char *s, size_t n, char *err, size_t errlen)
{
    char digits[16];
    uint64_t v;
    if (n == 0 || n >= sizeof digits)
        return err_fmt(err, errlen, -EINVAL, ENV_FD ": expected N or R,W, got \"%s\"", s);
    memcpy(digits, s, n);
    digits[n] = '\0';
    if (parse_u64(digits, 1 << 20, &v) < 0)
        return err_fmt(err, errlen, -EINVAL, ENV_FD ": expected N or R,W, got \"%s\"", s);
    if (v == 2)
        return err_fmt(err, errlen, -EINVAL, ENV_FD ": fd 2 is forkbox's stderr");
    if (fcntl((int)v, F_GETFD) < 0)
        return err_fmt(err, errlen, -EBADF, ENV_FD ": fd %d is not open", (int)v);
    return (int)v;
}

/* Move a host fd to >= TRANSPORT_HIGH_FD, close-on-exec; the original is
 * closed, and 0 or 1 reopened on /dev/null (nothing else may land there). */
static int move_high(int fd, char *err, size_t errlen)
{
    int hi = fcntl(fd, F_DUPFD_CLOEXEC, TRANSPORT_HIGH_FD);
    if (hi < 0)
        return err_errno(err, errlen, ENV_FD ": dup %d", fd);
    close(fd);
    if (fd < 2) {
        int nul = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        if (nul >= 0 && nul != fd) {
            dup2(nul, fd);
            close(nul);
        }
    }
    return hi;
}

int transport_select(struct transport *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    t->in_fd = t->out_fd = -1;
    const char *v = getenv(ENV_HTTP);
    if (v && v[0])
        return err_fmt(err, errlen, -ENOTSUP,
                       ENV_HTTP " is set: the WebSocket server is forkboxd (`forkboxd --listen "
                       "ADDR:PORT`); `forkbox sandbox` speaks only the stream transports");
    if ((v = getenv(ENV_TCP))) {
        const char *colon = strrchr(v, ':');
        uint64_t port;
        if (!colon || colon == v || (size_t)(colon - v) >= sizeof t->where ||
            parse_u64(colon + 1, 65535, &port) < 0 || port == 0)
            return err_fmt(err, errlen, -EINVAL, ENV_TCP ": expected host:port, got \"%s\"", v);
        t->kind = TRANSPORT_TCP;
        snprintf(t->where, sizeof t->where, "%.*s", (int)(colon - v), v);
        snprintf(t->port, sizeof t->port, "%u", (unsigned)port);
        return 0;
    }
    if ((v = getenv(ENV_SOCKET))) {
        if (!v[0] || strlen(v) >= sizeof ((struct sockaddr_un *)0)->sun_path)
            return err_fmt(err, errlen, -EINVAL, ENV_SOCKET ": empty or too long a path");
        t->kind = TRANSPORT_SOCKET;
        snprintf(t->where, sizeof t->where, "%s", v);
        return 0;
    }
    v = getenv(ENV_FD);
    if (!v)
        v = "3";
    t->kind = TRANSPORT_FD;
    snprintf(t->where, sizeof t->where, "%s", v);
    const char *comma = strchr(v, ',');
    int r = parse_fd(v, comma ? (size_t)(comma - v) : strlen(v), err, errlen);
    int w = r < 0 || !comma ? r : parse_fd(comma + 1, strlen(comma + 1), err, errlen);
    if (r < 0 || w < 0)
        return r < 0 ? r : w;
    /* "R,W" with R == W is one fd, as "N" is. */
    t->in_fd = move_high(r, err, errlen);
    if (t->in_fd < 0)
        return t->in_fd;
    t->out_fd = w == r ? t->in_fd : move_high(w, err, errlen);
    if (t->out_fd < 0) {
        close_and_reset(&t->in_fd);
        return t->out_fd;
    }
    return 0;
}

static int connect_tcp(struct transport *t, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int g = getaddrinfo(t->where, t->port, &hints, &ai);
    if (g != 0)
        return err_fmt(err, errlen, -EHOSTUNREACH, ENV_TCP ": %s: %s", t->where,
                       gai_strerror(g));
    int fd = -1, e = 0;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) < 0) {
            e = errno;
            close_and_reset(&fd);
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return err_fmt(err, errlen, -(e ? e : EHOSTUNREACH), ENV_TCP ": connect %s:%s: %s",
                       t->where, t->port, strerror(e ? e : EHOSTUNREACH));
    /* The token line first (spec 8.2). Our copy and the environment's are
     * scrubbed once sent: nothing after this needs it. */
    char *tok = getenv(ENV_TOKEN);
    size_t n = tok ? strlen(tok) : 0;
    char line[TRANSPORT_TOKEN_MAX + 2];
    int r = 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)tok[i] < 0x20 || (unsigned char)tok[i] >= 0x7f)
            r = err_fmt(err, errlen, -EINVAL, ENV_TOKEN ": not printable ASCII");
    if (r == 0 && n > TRANSPORT_TOKEN_MAX)
        r = err_fmt(err, errlen, -EINVAL, ENV_TOKEN ": longer than %d bytes", TRANSPORT_TOKEN_MAX);
    if (r == 0) {
        memcpy(line, tok, n);
        line[n] = '\n';
        r = write_all(fd, line, n + 1);
        if (r < 0)
            err_fmt(err, errlen, r, ENV_TCP ": sending the token: %s", strerror(-r));
    }
    explicit_bzero(line, sizeof line);
    if (tok)
        explicit_bzero(tok, n);
    unsetenv(ENV_TOKEN);
    if (r < 0) {
        close(fd);
        return r;
    }
    t->in_fd = t->out_fd = fd;
    return 0;
}

static int connect_unix(struct transport *t, char *err, size_t errlen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(t->where); /* shorter than sun_path: transport_select */
    memcpy(sa.sun_path, t->where, n < sizeof sa.sun_path ? n : sizeof sa.sun_path - 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return err_fmt(err, errlen, -e, ENV_SOCKET ": connect %s: %s", t->where, strerror(e));
    }
    t->in_fd = t->out_fd = fd;
    return 0;
}

int transport_connect(struct transport *t, char *err, size_t errlen)
{
    int r = t->kind == TRANSPORT_TCP      ? connect_tcp(t, err, errlen)
            : t->kind == TRANSPORT_SOCKET ? connect_unix(t, err, errlen)
                                          : 0;
    if (r < 0)
        return r;
    /* One socket both ways: a second fd for writing. The relay watches
     * each direction on its own fd, and epoll takes an fd number once (a
     * second EPOLL_CTL_ADD of the same one fails with EEXIST, which left
     * EPOLLOUT unarmed and a frame longer than the socket buffer half
     * written for ever). */
    if (t->out_fd == t->in_fd && (t->out_fd = fcntl(t->in_fd, F_DUPFD_CLOEXEC,
                                                    TRANSPORT_HIGH_FD)) < 0) {
        t->out_fd = t->in_fd;
        return err_errno(err, errlen, "dup the host's fd");
    }
    if ((r = fd_set_nonblock(t->in_fd, true)) < 0 || (r = fd_set_nonblock(t->out_fd, true)) < 0)
        return err_fmt(err, errlen, r, "O_NONBLOCK on the host's fds: %s", strerror(-r));
    return 0;
}

void transport_close(struct transport *t)
{
    if (t->out_fd != t->in_fd)
        close_and_reset(&t->out_fd);
    close_and_reset(&t->in_fd);
    t->out_fd = -1;
}
