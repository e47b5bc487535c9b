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
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/buf.h"
#include "core/cleanup.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/ratelimit.h"
#include "core/sdnotify.h"
#include "core/util.h"
#include "loop/closer.h"
#include "loop/logq.h"
#include "net/auth.h"
#include "net/http.h"
#include "sandbox/seccomp_notify.h"
#include "session/metrics.h"
#include "session/server.h"
#include "session/session.h"

#define SERVER_TICK_MS 250 /* deadlines, pings, log flushes, a paused listener */
#define STOP_GRACE_MS 2000 /* turns closed: their close frames go out, then we leave */
#define SERVER_STATUS_INTERVAL_MS 1000 /* systemd's STATUS= is refreshed at most this often */

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

/* A connection that only the fd reserve had room for (core/util.h): told
 * why at once, without reading its request, and closed, so the reserve is
 * whole again before the next accept (one fd, for microseconds, whatever
 * the flood). The bytes of its request already here are read first, so
 * the close sends a FIN after the answer, not a reset over it. */
static void refuse_no_fds(int fd)
{
    struct buf out;
    buf_init(&out, 4 * KiB);
    if (http_write_response(&out, 503, "Service Unavailable",
                            "Out of file descriptors (RLIMIT_NOFILE)\n") == 0)
        (void)send(fd, out.data, out.len, MSG_DONTWAIT | MSG_NOSIGNAL);
    buf_free(&out);
    uint8_t sink[4096];
    for (int k = 0; k < 4 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; k++)
        ;
    shutdown(fd, SHUT_WR);
    close(fd);
    metrics_http_refusal(503);
    struct rlimit rl = {0};
    getrlimit(RLIMIT_NOFILE, &rl);
    LOG_W_RL("out of file descriptors (RLIMIT_NOFILE %llu): a new connection was answered 503",
             (unsigned long long)rl.rlim_cur);
}

static void on_accept(struct loop_watch *w, uint32_t events)
{
    struct server *srv = w->ud;
    /* Bounded batch per wakeup so a connect flood cannot starve turns; the
     * listener is level-triggered, so the rest waits for the next round. */
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        union sockaddr_any peer = {0};
        socklen_t plen = sizeof peer;
        bool reserved;
        int fd = accept_reserved(srv->listen_fd, &peer.sa, &plen, &reserved);
        if (fd == -EAGAIN || fd == -EINTR || fd == -ECONNABORTED)
            return;
        if (fd == -EMFILE || fd == -ENFILE || fd == -ENOBUFS || fd == -ENOMEM) {
            /* Not even the reserve had an fd: the pending connection stays
             * queued and the listener readable, and retrying at once would
             * spin the loop. Rest until the next tick. */
            LOG_W_RL("accept: %s (pausing for %u ms)", errno_reason(-fd), SERVER_TICK_MS);
            loop_watch(srv->loop, &srv->listen_watch, 0);
            srv->accept_paused = true;
            return;
        }
        if (fd < 0) {
            /* A network error of the connection being accepted (accept(2)):
             * that one is gone, the next may be fine. */
            LOG_W_RL("accept: %s", strerror(-fd));
            continue;
        }
        if (reserved) {
            refuse_no_fds(fd);
            continue;
        }
        uint8_t key[PREAUTH_KEY_LEN];
        preauth_key(&peer.sa, plen, key);
        preauth_make_room(srv, key);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        (void)session_new(srv->sessions, fd, key); /* NULL: closed, out of memory */
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
    snprintf(buf, len, "%sturns %u/%u, pool %u",
             srv->stopping ? "stopping, " : srv->draining ? "draining, " : "",
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

/* ---------------------------------------------------------------- stopping
 *
 * SIGTERM/SIGINT drain (docs/operating.md, "Stopping and restarts"): new upgrades get
 * 503 with Retry-After and /ready 503 at once, while the listener stays
 * open: a load balancer that probes /ready takes the daemon out of rotation
 * and a client that got there anyway is told to retry elsewhere, where a
 * closed port gives a connection refused, or a reset for connections already
 * queued in the kernel's backlog. Admitted turns, idle ones included, go on
 * until they end (their own timeouts still apply) or --drain-timeout
 * passes; then the rest are closed with 1001 and the daemon exits 0. A
 * second signal ends the drain at once. */

/* Close what is left (turns with code and reason, connections not admitted
 * without a reply), stop listening, and leave the loop once the closes are
 * out (at most STOP_GRACE_MS). */
static void server_stop(struct server *srv, uint16_t code, const char *reason)
{
    if (srv->stopping)
        return;
    srv->stopping = true;
    server_notify_stopping(srv);
    srv->stop_deadline_ms = now_ms() + STOP_GRACE_MS;
    if (srv->listen_fd >= 0) {
        loop_unwatch(srv->loop, &srv->listen_watch);
        close_and_reset(&srv->listen_fd);
    }
    sessions_end_all(srv->sessions, code, reason);
}

static void server_drain_end(struct server *srv)
{
    server_stop(srv, 1001, "server shutting down");
}

void server_drain_start(struct server *srv)
{
    if (srv->draining)
        return;
    srv->draining = true;
    server_notify_stopping(srv);
    uint64_t now = now_ms();
    srv->drain_deadline_ms = now + srv->cfg->drain_timeout_ms;
    srv->drain_admit_until_ms = now + srv->cfg->drain_admit_ms;
    LOG_I("draining: %u turns running, new upgrades get 503%s; closing what is left in %" PRIu64
          " s", srv->n_turns, srv->cfg->drain_admit_ms ? " once --drain-admit has passed" : "",
          srv->cfg->drain_timeout_ms / 1000);
    if (srv->cfg->drain_timeout_ms == 0)
        server_drain_end(srv);
    /* With no turn running, server_reap ends it before the loop sleeps. */
}

/* --drain-admit: the load balancer's health check has not yet seen /ready's
 * 503, and a turn it routes here now is better admitted (and drained like
 * the others) than refused. */
static bool server_drain_admits(const struct server *srv)
{
    return srv->draining && !srv->stopping && now_ms() < srv->drain_admit_until_ms;
}

/* The drain is over when no turn holds a slot and none is admitted any
 * more, or its time is up. */
static void server_drain_check(struct server *srv, uint64_t now)
{
    if (!srv->draining || srv->stopping)
        return;
    if (srv->n_turns == 0 && now >= srv->drain_admit_until_ms) {
        LOG_I("drained: no turn running; exiting");
        server_drain_end(srv);
    } else if (now >= srv->drain_deadline_ms) {
        LOG_W("--drain-timeout: closing the %u turns still running", srv->n_turns);
        server_drain_end(srv);
    }
}

static void on_signal(struct loop_watch *w, uint32_t events)
{
    struct server *srv = w->ud;
    struct signalfd_siginfo si;
    if (read(srv->signal_fd, &si, sizeof si) != sizeof si)
        return;
    if (si.ssi_signo == SIGHUP) {
        server_reload_tokens(srv);
        return;
    }
    if (si.ssi_signo != SIGTERM && si.ssi_signo != SIGINT)
        return;
    if (srv->draining || srv->stopping) {
        LOG_I("signal %u again: closing the %u turns still running now", si.ssi_signo,
              srv->n_turns);
        srv->draining = true;
        server_drain_end(srv);
        return;
    }
    LOG_I("signal %u: stopping", si.ssi_signo);
    server_drain_start(srv);
}

/* ---------------------------------------------------------------- the fork server
 *
 * When it dies (or breaks the protocol), the turns whose sandboxes died
 * with it end with 1011 (sessions_forkserver_lost); turns still waiting for
 * a sandbox keep waiting and are asked for again from the next one. A new
 * fork server is started the way the first was (fs_client_launch: the same
 * checked executable by its fd, the fixed environment, only the control
 * socket crosses), at once after a death, then after FS_RESTART_MIN_MS
 * doubling up to FS_RESTART_MAX_MS while starts fail or it dies again. After
 * FS_RESTART_TRIES deaths or failed starts in a row (a fork server that
 * stayed up FS_STABLE_MS resets the count) the daemon gives up: every
 * connection is closed and forkboxd exits 1, so that its own supervisor
 * (systemd's Restart=on-failure) can act. /ready says 503 meanwhile. */

static void on_forkserver(struct loop_watch *w, uint32_t events);

static void fs_give_up(struct server *srv)
{
    LOG_E("fork server: %u deaths or failed starts in a row; giving up (exit 1)",
          srv->fs_failures);
    srv->exit_code = 1;
    srv->draining = true;
    server_stop(srv, 1011, SESSION_REASON_NO_SANDBOX_SERVICE);
}

/* One more death or failed start: schedule the next start, or give up. */
static void fs_schedule(struct server *srv, uint64_t now)
{
    srv->fs_state = FS_DOWN;
    if (++srv->fs_failures > FS_RESTART_TRIES) {
        fs_give_up(srv);
        return;
    }
    uint64_t delay = 0;
    if (srv->fs_failures > 1) {
        unsigned k = srv->fs_failures - 2;
        delay = k < 16 ? (uint64_t)FS_RESTART_MIN_MS << k : FS_RESTART_MAX_MS;
        delay = delay < FS_RESTART_MAX_MS ? delay : FS_RESTART_MAX_MS;
    }
    srv->fs_next_start_ms = now + delay;
    LOG_I("fork server: starting a new one in %" PRIu64 " ms (attempt %u of %u)", delay,
          srv->fs_failures, FS_RESTART_TRIES);
}

static void fs_launch(struct server *srv, uint64_t now)
{
    char err[512] = "";
    /* With our fd table full, a restart still gets its control socket:
     * from the fd reserve (core/util.h). */
    fd_reserve_lend(true);
    int r = fs_client_launch(srv->cfg, &srv->fs, err, sizeof err);
    fd_reserve_lend(false);
    if (r < 0) {
        LOG_E("fork server: cannot start it: %s", err);
        fs_schedule(srv, now);
        return;
    }
    srv->fs_state = FS_STARTING;
    srv->fs_start_ms = now;
    srv->fs_watch = (struct loop_watch){.fd = srv->fs.ctl_fd, .cb = on_forkserver, .ud = srv,
                                        .name = "fork server"};
    r = loop_watch(srv->loop, &srv->fs_watch, EPOLLIN);
    if (r < 0) {
        LOG_E("fork server: epoll: %s", strerror(-r));
        fs_client_kill(&srv->fs);
        fs_schedule(srv, now);
    }
}

/* The fork server is gone (EOF: it and its cgroup helper have exited) or
 * broke the protocol. */
static void fs_lost(struct server *srv, int why)
{
    uint64_t now = now_ms();
    LOG_E("fork server is gone (%s): ending the turns whose sandboxes died with it",
          strerror(-why));
    loop_unwatch(srv->loop, &srv->fs_watch);
    fs_client_kill(&srv->fs);
    sessions_forkserver_lost(srv->sessions);
    if (srv->stopping)
        return;
    if (srv->fs_state == FS_UP && now - srv->fs_up_ms >= FS_STABLE_MS)
        srv->fs_failures = 0;
    fs_schedule(srv, now);
    if (srv->fs_state == FS_DOWN && now >= srv->fs_next_start_ms)
        fs_launch(srv, now);
}

/* A launched fork server's ready record (or its failure). */
static void fs_starting(struct server *srv)
{
    char err[512] = "";
    int r = fs_client_ready(&srv->fs, err, sizeof err);
    if (r == 0)
        return;
    uint64_t now = now_ms();
    if (r < 0) {
        LOG_E("fork server: the new one failed: %s", err);
        loop_unwatch(srv->loop, &srv->fs_watch);
        fs_client_kill(&srv->fs);
        fs_schedule(srv, now);
        return;
    }
    srv->fs_state = FS_UP;
    srv->fs_up_ms = now;
    LOG_I("fork server: a new one (pid %d) is ready after %" PRIu64 " ms", (int)srv->fs.pid,
          now - srv->fs_start_ms);
    metrics_forkserver_restart();
    sessions_sandbox_retry(srv->sessions);
}

/* From the tick: a start that is due, or one that never got ready. */
static void fs_tick(struct server *srv, uint64_t now)
{
    if (srv->stopping)
        return;
    if (srv->fs_state == FS_DOWN && now >= srv->fs_next_start_ms) {
        fs_launch(srv, now);
    } else if (srv->fs_state == FS_STARTING && now - srv->fs_start_ms >= FS_READY_TIMEOUT_MS) {
        LOG_E("fork server: the new one was not ready after %u ms", FS_READY_TIMEOUT_MS);
        loop_unwatch(srv->loop, &srv->fs_watch);
        fs_client_kill(&srv->fs);
        fs_schedule(srv, now);
    } else if (srv->fs_state == FS_UP) {
        sessions_sandbox_retry(srv->sessions); /* requests its full socket refused */
    }
}

static void on_forkserver(struct loop_watch *w, uint32_t events)
{
    struct server *srv = w->ud;
    if (srv->fs_state == FS_STARTING) {
        fs_starting(srv);
        return;
    }
    for (;;) {
        struct fs_reply rep;
        int chan_fd = -1, pidfd = -1;
        int r = fs_client_reply(&srv->fs, &rep, &chan_fd, &pidfd);
        if (r == 0)
            return;
        if (r < 0) {
            fs_lost(srv, r);
            return;
        }
        if (rep.kind == FS_REPLY_CGROUPS) {
            metrics_cgroups_waiting(rep.cgroups_waiting);
            continue;
        }
        struct session *s = sessions_find(srv->sessions, rep.turn_id);
        if (rep.kind == FS_REPLY_DEATH) {
            if (s)
                session_sandbox_died(s, &rep);
            /* After the session: a turn it ends now has the peak already. */
            metrics_death_report(rep.turn_id, rep.mem_peak);
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
 * The session_env callbacks: the spec 1.1 order (503, then 401, then the
 * tenant's 429) is the session's routing; what the answers are is the
 * server's. The daemon's capacity comes first: a client without a token
 * learns nothing of tenants. */

static int server_may_admit(void *host, const char *authorization, struct tenant **tenant)
{
    struct server *srv = host;
    if (srv->draining && !server_drain_admits(srv))
        return -ESHUTDOWN;
    if (srv->n_turns >= srv->cfg->capacity || srv->single_use_admitted)
        return -EBUSY;
    const char *name = TENANT_DEFAULT;
    if (srv->tokens) {
        int i = tokens_match(srv->tokens, authorization);
        if (i < 0)
            return -EACCES;
        name = tokens_name(srv->tokens, (size_t)i);
    }
    /* Every name of srv->tokens is listed (server_init, a reload). */
    struct tenant *t = tenants_find(&srv->tenants, name);
    if (!t)
        return -EACCES;
    *tenant = t;
    if (srv->cfg->tenant_capacity && t->turns >= srv->cfg->tenant_capacity)
        return -EUSERS;
    return 0;
}

/* Take a turn slot for t: the turns now admitted. */
static unsigned server_admit(void *host, struct tenant *t)
{
    struct server *srv = host;
    srv->n_turns++;
    t->turns++;
    srv->single_use_admitted = srv->single_use_admitted || srv->cfg->single_use;
    return srv->n_turns;
}

/* Give t's turn slot back. */
static void server_release(void *host, struct tenant *t)
{
    struct server *srv = host;
    srv->n_turns--;
    t->turns--;
    if (srv->cfg->single_use && !srv->stopping) {
        /* Spec 1.3: after the one turn, stop listening and exit 0. */
        LOG_I("single-use turn ended; exiting");
        loop_unwatch(srv->loop, &srv->listen_watch);
        srv->stopping = true;
        srv->stop_deadline_ms = now_ms() + 1500;
    }
}

static int server_request_sandbox(void *host, uint64_t turn_id, const struct tenant *t)
{
    struct server *srv = host;
    if (srv->fs_state != FS_UP)
        return srv->stopping ? -ESHUTDOWN : -EAGAIN; /* asked again once one is ready */
    return fs_client_request(&srv->fs, turn_id, t->id);
}

/* GET /ready (the 503's body), and server_ready(). */
static const char *server_not_ready(const struct server *srv)
{
    if (srv->draining || srv->stopping)
        return "Shutting down\n";
    if (srv->fs_state != FS_UP)
        return "Sandbox service starting\n";
    if (srv->n_turns >= srv->cfg->capacity || srv->single_use_admitted)
        return "Busy\n";
    return NULL;
}

bool server_ready(const struct server *srv)
{
    return server_not_ready(srv) == NULL;
}

static const char *server_env_not_ready(void *host)
{
    return server_not_ready(host);
}

int server_exit_status(const struct server *srv)
{
    return srv->exit_code;
}

/* What the helper threads count, for /metrics. */
static void helpers_counts(void)
{
    struct closer_counts c;
    struct logq_counts g;
    closer_get_counts(&c);
    logq_get_counts(&g);
    metrics_helpers(c.pending, c.slow, c.dropped, g.dropped);
}

static void loop_stats(void *ud, uint64_t busy_ns)
{
    (void)ud;
    metrics_loop_iteration(busy_ns);
}

static void server_tick(void *ud)
{
    struct server *srv = ud;
    uint64_t now = now_ms();
    sessions_tick(srv->sessions, now);
    helpers_counts();
    metrics_tick(now_ns());
    metrics_http_tick(&srv->metrics, now);
    ratelimit_flush_sites(now_ns());
    fs_tick(srv, now);
    server_drain_check(srv, now);
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
    server_drain_check(srv, now_ms());
    /* The last turns' end lines wait for their death reports (ms; the
     * stop deadline bounds it). */
    if (srv->stopping && sessions_count(srv->sessions) == 0 && metrics_pending() == 0)
        loop_stop(srv->loop);
}

/* The tenants admitted now, and their numbers (the fork server's cgroups
 * are named by number: docs/operating.md, "Tenants"). */
static void log_tenants(const struct server *srv)
{
    char list[TOKENS_MAX * (TENANT_NAME_MAX + 16)] = "";
    size_t len = 0;
    for (size_t i = 0; i < srv->tenants.n; i++) {
        const struct tenant *t = srv->tenants.t[i];
        if (t->listed && len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s (%" PRIu32 ")",
                                    len ? ", " : "", t->name, t->id);
    }
    LOG_I("tenants: %s", list);
}

void server_reload_tokens(struct server *srv)
{
    const char *path = srv->cfg->token_file;
    if (!path[0]) {
        LOG_I("SIGHUP: no --token-file (the token, if any, came from the environment): "
              "nothing to reload");
        return;
    }
    /* The file is read here, in the supervisor, as at start: the fork
     * server is long running and never learns a token (main.c). */
    char err[512];
    struct tokens *fresh = NULL;
    int r = tokens_read_file(path, &fresh, err, sizeof err);
    if (r == 0 && (r = tenants_sync(&srv->tenants, fresh)) < 0) {
        snprintf(err, sizeof err, "%s: tenants: %s", path, strerror(-r));
        tokens_free(fresh);
    }
    if (r < 0) {
        LOG_E("SIGHUP: --token-file %s; keeping the %zu tokens in use", err,
              tokens_count(srv->tokens));
        return;
    }
    /* Admission reads srv->tokens only when a request arrives: admitted
     * turns hold no reference to them and go on untouched, and hold their
     * tenant's record (tenants.h), named or not. */
    tokens_free(srv->tokens);
    srv->tokens = fresh;
    LOG_I("SIGHUP: %zu tokens from %s", tokens_count(fresh), path);
    log_tenants(srv);
}

int server_init(struct server *srv, struct loop *loop, const struct config *cfg,
                struct tokens *tokens, struct fs_client *fs, char *err, size_t errlen)
{
    memset(srv, 0, sizeof *srv);
    srv->loop = loop;
    srv->cfg = cfg;
    srv->tokens = tokens;
    srv->fs = *fs;
    srv->fs_state = FS_UP; /* main started it */
    srv->fs_up_ms = now_ms();
    srv->signal_fd = -1;
    srv->budget = (struct budget){.max = cfg->total_buffer};
    tenants_init(&srv->tenants, &srv->budget, cfg->tenant_buffer);
    srv->listen_fd = -1;
    metrics_http_init(&srv->metrics);
    metrics_init(cfg->pool_size);
    int rp = preauth_init(&srv->preauth, cfg->preauth_max, cfg->preauth_per_peer);
    if (rp < 0) {
        return err_fmt(err, errlen, rp, "pre-auth pool: %s", strerror(-rp));
    }
    rp = tenants_sync(&srv->tenants, tokens);
    if (rp < 0)
        return err_fmt(err, errlen, rp, "tenants: %s", strerror(-rp));

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
        .tenants = &srv->tenants,
        .host = srv,
        .may_admit = server_may_admit,
        .admit = server_admit,
        .release = server_release,
        .request_sandbox = server_request_sandbox,
        .not_ready = server_env_not_ready,
    };
    srv->sessions = sessions_new(&env);
    if (!srv->sessions) {
        return err_fmt(err, errlen, -ENOMEM, "out of memory");
    }

    uint16_t port = 0;
    int fd = tcp_listen(cfg->listen_host, cfg->listen_port, &port);
    if (fd < 0) {
        return err_fmt(err, errlen, fd, "listen on %s:%u: %s", cfg->listen_host, cfg->listen_port,
                 fd == -EINVAL ? "not a numeric address" : strerror(-fd));
    }
    srv->listen_fd = fd;
    srv->listen_watch = (struct loop_watch){.fd = fd, .cb = on_accept, .ud = srv,
                                            .name = "listener"};

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP); /* server_reload_tokens */
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    srv->signal_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (srv->signal_fd < 0) {
        return err_fmt(err, errlen, -errno, "signalfd: %s", strerror(errno));
    }
    srv->signal_watch = (struct loop_watch){.fd = srv->signal_fd, .cb = on_signal, .ud = srv,
                                            .name = "signals"};
    srv->fs_watch = (struct loop_watch){.fd = srv->fs.ctl_fd, .cb = on_forkserver, .ud = srv,
                                        .name = "fork server"};

    int r = 0;
    r = r ? r : loop_watch(loop, &srv->listen_watch, EPOLLIN);
    r = r ? r : loop_watch(loop, &srv->signal_watch, EPOLLIN);
    r = r ? r : loop_watch(loop, &srv->fs_watch, EPOLLIN);
    if (r < 0) {
        return err_fmt(err, errlen, r, "epoll: %s", strerror(-r));
    }
    if (cfg->metrics_host[0]) {
        uint16_t mport = 0;
        r = metrics_http_start(&srv->metrics, loop, cfg->metrics_host, cfg->metrics_port, &mport,
                               err, errlen);
        if (r < 0)
            return r;
        bool v6 = strchr(cfg->metrics_host, ':') != NULL;
        LOG_I("metrics at http://%s%s%s:%u/metrics", v6 ? "[" : "", cfg->metrics_host,
              v6 ? "]" : "", mport);
    }
    loop_set_tick(loop, SERVER_TICK_MS, server_tick, srv);
    loop_set_before_sleep(loop, server_reap, srv);
    loop_set_work(loop, server_work, srv);
    loop_set_stats(loop, loop_stats, NULL);

    const char *h = cfg->listen_host;
    bool v6 = strchr(h, ':') != NULL;
    LOG_I("listening on %s%s%s:%u (capacity %u%s, %s, auth %s, pre-auth %u, %u per peer)",
          v6 ? "[" : "", h, v6 ? "]" : "", port, cfg->capacity,
          cfg->single_use ? ", single-use" : "", cfg->isolate ? "isolated" : "NOT isolated",
          tokens ? "on" : "off", srv->preauth.max, srv->preauth.per_peer);
    log_tenants(srv);
    return 0;
}

void server_free(struct server *srv)
{
    metrics_http_stop(&srv->metrics);
    metrics_tick(UINT64_MAX); /* end lines whose report never came: without a peak */
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
    tenants_free(&srv->tenants); /* after the sessions, which hold theirs */
    tokens_free(srv->tokens);
    srv->tokens = NULL;
}
