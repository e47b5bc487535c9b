/* The daemon (see server.h): the listener, the fork server's replies,
 * signals, admission and the set of connections. Runs in the supervisor. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/ratelimit.h"
#include "core/sdnotify.h"
#include "core/util.h"
#include "net/http.h"
#include "sandbox/seccomp_notify.h"
#include "session/server.h"
#include "session/session.h"

#define SERVER_TICK_MS 250 /* deadlines, pings, log flushes, a paused listener */
#define SERVER_STATUS_INTERVAL_MS 1000 /* systemd's STATUS= is refreshed at most this often */

static int listen_on(const char *host, uint16_t port, uint16_t *bound_port)
{
    union {
        struct sockaddr sa;
        struct sockaddr_in in4;
        struct sockaddr_in6 in6;
        struct sockaddr_storage ss;
    } a = {0};
    socklen_t alen;
    if (inet_pton(AF_INET, host, &a.in4.sin_addr) == 1) {
        a.in4.sin_family = AF_INET;
        a.in4.sin_port = htons(port);
        alen = sizeof a.in4;
    } else if (inet_pton(AF_INET6, host, &a.in6.sin6_addr) == 1) {
        a.in6.sin6_family = AF_INET6;
        a.in6.sin6_port = htons(port);
        alen = sizeof a.in6;
    } else {
        return -EINVAL;
    }
    _cleanup_close_ int fd = socket(a.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, &a.sa, alen) < 0 || listen(fd, LISTEN_BACKLOG) < 0)
        return -errno;
    alen = sizeof a.ss;
    if (getsockname(fd, &a.sa, &alen) < 0)
        return -errno;
    *bound_port = ntohs(a.sa.sa_family == AF_INET ? a.in4.sin_port : a.in6.sin6_port);
    return steal_fd(&fd);
}

static const char *preauth_class_name(enum preauth_class c)
{
    static const char *const names[] = {"silent", "with part of a request", "answered"};
    return names[c];
}

/* A new connection from key always gets in: when its peer holds its share
 * of the pre-auth pool, or the pool is full, the connection worth least is
 * closed first (preauth.h). Warnings are rate-limited: under a flood this
 * runs for every connection. */
static void preauth_make_room(struct server *srv, const uint8_t key[PREAUTH_KEY_LEN])
{
    enum preauth_reason why;
    uint64_t now = now_ms();
    struct preauth_entry *e = preauth_victim(&srv->preauth, key, now, &why);
    if (!e)
        return;
    char peer[PREAUTH_KEY_STR];
    preauth_key_str(e->key, peer);
    if (why == PREAUTH_PEER_FULL)
        LOG_W_RL("%s holds %u connections not admitted (--preauth-per-peer): closed its least "
                 "recently active (%s, %" PRIu64 " ms)", peer, srv->preauth.per_peer,
                 preauth_class_name(e->cls), now - e->active_ms);
    else
        LOG_W_RL("%u connections not admitted (--preauth-max): closed one from %s (%s, %" PRIu64
                 " ms)", srv->preauth.n, peer, preauth_class_name(e->cls), now - e->active_ms);
    /* Leaves the pool now; the socket is closed by server_reap. */
    session_end(session_of_preauth(e), 1000, NULL);
}

static void on_accept(struct loop_watch *w, uint32_t events)
{
    struct server *srv = w->ud;
    /* Bounded batch per wakeup so a connect flood cannot starve turns; the
     * listener is level-triggered, so the rest waits for the next round. */
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        union {
            struct sockaddr sa;
            struct sockaddr_storage ss;
        } peer = {0};
        socklen_t plen = sizeof peer;
        int fd = accept4(srv->listen_fd, &peer.sa, &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)
                return;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* The pending connection stays queued and the listener
                 * readable: retrying at once would spin the loop. Rest
                 * until the next tick. */
                PLOG_W_RL("accept (pausing for %u ms)", SERVER_TICK_MS);
                loop_watch(srv->loop, &srv->listen_watch, 0);
                srv->accept_paused = true;
                return;
            }
            /* A network error of the connection being accepted (accept(2)):
             * that one is gone, the next may be fine. */
            PLOG_W_RL("accept");
            continue;
        }
        uint8_t key[PREAUTH_KEY_LEN];
        preauth_key(&peer.sa, plen, key);
        preauth_make_room(srv, key);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (!session_new(srv->sessions, fd, key))
            close(fd);
    }
}

/* ---------------------------------------------------------------- systemd
 *
 * What the service manager is told (core/sdnotify.h): READY=1 once, STATUS=
 * as the turn count changes (at most once a second), STOPPING=1 when the
 * stop starts, WATCHDOG=1 from the tick (so a stuck loop stops the pings).
 * Without $NOTIFY_SOCKET, srv->sd is NULL and none of this runs. */

static void server_status(const struct server *srv, char *buf, size_t len)
{
    snprintf(buf, len, "%sturns %u/%u, pool %u", srv->stopping ? "stopping, " : "",
             srv->n_turns, srv->cfg->capacity, srv->cfg->pool_size);
}

void server_notify_ready(struct server *srv, struct sdnotify *sd)
{
    char status[128];
    srv->sd = sd;
    server_status(srv, status, sizeof status);
    int r = sdnotify_ready(sd, status, now_ms());
    if (r < 0)
        LOG_W("NOTIFY_SOCKET: READY=1 not sent: %s", strerror(-r));
}

static void server_notify_stopping(struct server *srv)
{
    char status[128];
    if (!srv->sd)
        return;
    server_status(srv, status, sizeof status);
    sdnotify_stopping(srv->sd, status, now_ms());
}

static void server_notify_tick(struct server *srv, uint64_t now)
{
    char status[128];
    if (!srv->sd)
        return;
    server_status(srv, status, sizeof status);
    sdnotify_status(srv->sd, status, now, SERVER_STATUS_INTERVAL_MS);
    sdnotify_watchdog(srv->sd, now);
}

static void on_signal(struct loop_watch *w, uint32_t events)
{
    struct server *srv = w->ud;
    struct signalfd_siginfo si;
    if (read(srv->signal_fd, &si, sizeof si) != sizeof si)
        return;
    LOG_I("signal %u: stopping", si.ssi_signo);
    srv->stopping = true;
    server_notify_stopping(srv);
    srv->stop_deadline_ms = now_ms() + 2000;
    sessions_end_all(srv->sessions, 1001, NULL);
}

static void on_forkserver(struct loop_watch *w, uint32_t events)
{
    struct server *srv = w->ud;
    for (;;) {
        struct fs_reply rep;
        int chan_fd = -1, pidfd = -1;
        int r = fs_client_reply(&srv->fs, &rep, &chan_fd, &pidfd);
        if (r == 0)
            return;
        if (r < 0) {
            /* Without the fork server no turn can start: stop rather than
             * serve 101s that can never get a sandbox. */
            LOG_E("fork server is gone (%s); stopping", strerror(-r));
            loop_unwatch(srv->loop, &srv->fs_watch);
            srv->stopping = true;
            srv->stop_deadline_ms = now_ms() + 1000;
            sessions_end_all(srv->sessions, 1011, "sandbox service unavailable");
            return;
        }
        struct session *s = sessions_find(srv->sessions, rep.turn_id);
        if (rep.kind == FS_REPLY_DEATH) {
            if (s)
                session_sandbox_died(s, &rep);
            continue;
        }
        if (!s || !session_sandbox_ready(s, &rep, chan_fd, pidfd)) {
            /* The turn ended while its sandbox was being made: kill it. */
            if (pidfd >= 0)
                syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
            if (chan_fd >= 0)
                close(chan_fd);
            if (pidfd >= 0)
                close(pidfd);
        }
    }
}

/* ---------------------------------------------------------------- admission
 *
 * The session_env callbacks: the spec 1.1 order (503, then 401) is the
 * session's routing; what the answers are is the server's. */

static int server_may_admit(void *host, const char *authorization)
{
    struct server *srv = host;
    if (srv->n_turns >= srv->cfg->capacity || srv->single_use_admitted)
        return -EBUSY;
    if (srv->token && !http_auth_ok(authorization, srv->token, srv->token_len))
        return -EACCES;
    return 0;
}

/* Take a turn slot: the turns now admitted. */
static unsigned server_admit(void *host)
{
    struct server *srv = host;
    srv->n_turns++;
    srv->single_use_admitted = srv->single_use_admitted || srv->cfg->single_use;
    return srv->n_turns;
}

/* Give a turn slot back. */
static void server_release(void *host)
{
    struct server *srv = host;
    srv->n_turns--;
    if (srv->cfg->single_use && !srv->stopping) {
        /* Spec 1.3: after the one turn, stop listening and exit 0. */
        LOG_I("single-use turn ended; exiting");
        loop_unwatch(srv->loop, &srv->listen_watch);
        srv->stopping = true;
        srv->stop_deadline_ms = now_ms() + 1500;
    }
}

static int server_request_sandbox(void *host, uint64_t turn_id)
{
    struct server *srv = host;
    return fs_client_request(&srv->fs, turn_id);
}

static void server_tick(void *ud)
{
    struct server *srv = ud;
    uint64_t now = now_ms();
    sessions_tick(srv->sessions, now);
    ratelimit_flush_sites(now_ns());
    if (srv->accept_paused && !srv->stopping) {
        srv->accept_paused = false;
        loop_watch(srv->loop, &srv->listen_watch, EPOLLIN);
    }
    server_notify_tick(srv, now);
    if (srv->stopping && now >= srv->stop_deadline_ms)
        loop_stop(srv->loop);
}

/* One step of every check still running on a complete message
 * (sessions_work), each turn in turn: a snapshot that takes many steps to
 * inflate shares the loop with every other turn instead of holding it. */
static bool server_work(void *ud)
{
    struct server *srv = ud;
    return sessions_work(srv->sessions);
}

/* Before sleeping: free sessions marked dead; stop when asked and idle. */
static void server_reap(void *ud)
{
    struct server *srv = ud;
    sessions_reap(srv->sessions);
    if (srv->stopping && sessions_count(srv->sessions) == 0)
        loop_stop(srv->loop);
}

int server_init(struct server *srv, struct loop *loop, const struct config *cfg,
                char *token, size_t token_len, struct fs_client *fs, char *err, size_t errlen)
{
    memset(srv, 0, sizeof *srv);
    srv->loop = loop;
    srv->cfg = cfg;
    srv->token = token;
    srv->token_len = token_len;
    srv->fs = *fs;
    srv->signal_fd = -1;
    srv->budget = (struct budget){.max = cfg->total_buffer};
    srv->listen_fd = -1;
    int rp = preauth_init(&srv->preauth, cfg->preauth_max, cfg->preauth_per_peer);
    if (rp < 0) {
        return err_fmt(err, errlen, rp, "pre-auth pool: %s", strerror(-rp));
    }

    /* Counted refusals are answered here, with the errno the policy names:
     * parse the file the fork server compiled (it has loaded it already;
     * nothing is compiled or installed here). */
    if (cfg->isolate) {
        int rn = policy_notify_load(cfg->policy_file, &srv->notify, err, errlen);
        if (rn < 0)
            return rn;
    }
    const struct session_env env = {
        .loop = loop,
        .cfg = cfg,
        .budget = &srv->budget,
        .preauth = &srv->preauth,
        .notify = srv->notify,
        .host = srv,
        .may_admit = server_may_admit,
        .admit = server_admit,
        .release = server_release,
        .request_sandbox = server_request_sandbox,
    };
    srv->sessions = sessions_new(&env);
    if (!srv->sessions) {
        return err_fmt(err, errlen, -ENOMEM, "out of memory");
    }

    uint16_t port = 0;
    int fd = listen_on(cfg->listen_host, cfg->listen_port, &port);
    if (fd < 0) {
        return err_fmt(err, errlen, fd, "listen on %s:%u: %s", cfg->listen_host, cfg->listen_port,
                 fd == -EINVAL ? "not a numeric address" : strerror(-fd));
    }
    srv->listen_fd = fd;
    srv->listen_watch = (struct loop_watch){.fd = fd, .cb = on_accept, .ud = srv};

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    srv->signal_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (srv->signal_fd < 0) {
        return err_fmt(err, errlen, -errno, "signalfd: %s", strerror(errno));
    }
    srv->signal_watch = (struct loop_watch){.fd = srv->signal_fd, .cb = on_signal, .ud = srv};
    srv->fs_watch = (struct loop_watch){.fd = srv->fs.ctl_fd, .cb = on_forkserver, .ud = srv};

    int r = 0;
    r = r ? r : loop_watch(loop, &srv->listen_watch, EPOLLIN);
    r = r ? r : loop_watch(loop, &srv->signal_watch, EPOLLIN);
    r = r ? r : loop_watch(loop, &srv->fs_watch, EPOLLIN);
    if (r < 0) {
        return err_fmt(err, errlen, r, "epoll: %s", strerror(-r));
    }
    loop_set_tick(loop, SERVER_TICK_MS, server_tick, srv);
    loop_set_before_sleep(loop, server_reap, srv);
    loop_set_work(loop, server_work, srv);

    const char *h = cfg->listen_host;
    bool v6 = strchr(h, ':') != NULL;
    LOG_I("listening on %s%s%s:%u (capacity %u%s, %s, auth %s, pre-auth %u, %u per peer)",
          v6 ? "[" : "", h, v6 ? "]" : "", port, cfg->capacity,
          cfg->single_use ? ", single-use" : "", cfg->isolate ? "isolated" : "NOT isolated",
          token ? "on" : "off", srv->preauth.max, srv->preauth.per_peer);
    return 0;
}

void server_free(struct server *srv)
{
    sessions_free(srv->sessions);
    srv->sessions = NULL;
    if (srv->listen_fd >= 0)
        close(srv->listen_fd);
    if (srv->signal_fd >= 0)
        close(srv->signal_fd);
    fs_client_stop(&srv->fs);
    policy_notify_free(srv->notify);
    srv->notify = NULL;
    preauth_free(&srv->preauth);
    if (srv->token) {
        explicit_bzero(srv->token, srv->token_len);
        free(srv->token);
    }
}
