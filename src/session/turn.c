/* A turn's lifecycle: its timers (session_tick: the request, reply and
 * close deadlines, keepalive, the block, turn and idle timeouts), how it
 * ends (session_end with a close, mark_dead without one: the sandbox
 * killed, the slot given back), why a sandbox that ended on its own ended
 * (its death report, in words of fsclient.c's fs_death_reason) and the
 * turn's statistics (metrics.h).
 * Runs in the supervisor.
 *
 * Every other file of the session ends turns through here. Relies on
 * from_sandbox.c to send the supervisor's own frames to the client
 * (client_send_frame) and to read what a dead sandbox sent last
 * (sandbox_read), on admission.c to log a request that did not come in
 * time (log_refused) and on session.c for what the sockets wait for
 * (update_interest). */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/util.h"
#include "net/ws.h"
#include "proto/frame.h"
#include "proto/tarcheck.h"
#include "session/chan_conn.h"
#include "session/metrics.h"
#include "session/notify.h"
#include "session/preauth.h"
#include "session/session.h"
#include "session/session_int.h"
#include "session/tenants.h"

#define CLOSE_LINGER_MS 5000   /* ending a turn: flush what is queued, then close */
/* A sandbox that ended on its own: how long the close waits for the fork
 * server's death report (it comes once the sandbox is reaped and its cgroup
 * helper has read the counters, behind the placements queued before it). */
#define DEATH_REPORT_WAIT_MS 5000

/* ---------------------------------------------------------------- the block */

static int ws_send_frame(struct session *s, const struct frame *f)
{
    return client_send_frame(s, f, NULL);
}

/* A `log` error frame for the client; only sent while a block runs (the host
 * reads by position after `done`, spec 2.4). */
static void send_error_log(struct session *s, const char *msg)
{
    if (s->turn != TURN_RUNNING || !s->ws)
        return;
    struct frame f;
    frame_init(&f, FRAME_LOG);
    if (frame_set_string(&f, "level", "error") == 0 && frame_set_string(&f, "msg", msg) == 0)
        ws_send_frame(s, &f);
    frame_free(&f);
}

/* The block that was running is over (relayed, refused or timed out): its
 * duration goes to the histogram. */
void block_over(struct session *s)
{
    if (!s->stats.block_started_ns)
        return;
    metrics_block_done(now_ns() - s->stats.block_started_ns);
    s->stats.block_started_ns = 0;
}

/* A block overran its wall clock: the sandbox cannot be trusted to answer,
 * so the supervisor completes the block itself (done, output with a clear
 * stderr, and a zero-length archive, which leaves the host's files as they
 * were; spec 4.4), then ends the turn. */
static void finish_block_for_timeout(struct session *s, const char *what, uint64_t limit_ms)
{
    enum { TIMEOUT_EXIT = 124 };
    char msg[160];
    snprintf(msg, sizeof msg, "forkbox: %s exceeded its time limit of %" PRIu64
             " s; the sandbox was stopped\n", what, limit_ms / 1000);
    struct frame done, out;
    frame_init(&done, FRAME_DONE);
    frame_init(&out, FRAME_OUTPUT);
    /* Behind a message being relayed as it arrives nothing can go (its end
     * never comes): the close says why. */
    if (!s->out_stream && frame_set_int(&done, "exit_code", TIMEOUT_EXIT) == 0 &&
        frame_set_int(&out, "exit_code", TIMEOUT_EXIT) == 0 &&
        frame_set_string(&out, "stderr", msg) == 0 && ws_send_frame(s, &done) == 0 &&
        ws_send_frame(s, &out) == 0)
        ws_conn_send_binary(s->ws, (const uint8_t *)"", 0);
    frame_free(&done);
    frame_free(&out);
    s->turn = TURN_BETWEEN;
    block_over(s);
}

/* ---------------------------------------------------------------- the sandbox's end */

/* How a turn whose sandbox ended on its own counts (metrics.h). */
static enum turn_end death_end(enum fs_death d)
{
    static const enum turn_end end[] = {
        [FS_DEATH_MEMORY] = TURN_END_MEMORY, [FS_DEATH_PIDS] = TURN_END_PIDS,
        [FS_DEATH_CRASH] = TURN_END_CRASH,   [FS_DEATH_KILLED] = TURN_END_KILLED,
        [FS_DEATH_EXITED] = TURN_END_EXITED, [FS_DEATH_UNKNOWN] = TURN_END_EXITED,
    };
    return end[d];
}

/* The sandbox ended on its own (its channel closed or its init exited):
 * end the turn with the reason its death report gives, waiting for that
 * report (at most DEATH_REPORT_WAIT_MS, session_tick) with the channel and
 * pidfd unwatched. A setup or archive error it reported before it exited
 * says more than its exit status, and is kept. */
void sandbox_gone(struct session *s)
{
    if (s->phase != PHASE_TURN) {
        kill_sandbox(s);
        return;
    }
    if (s->child_error) {
        turn_stats_end(&s->stats, TURN_END_SANDBOX_ERROR);
        session_end(s, 1011, s->child_error);
        return;
    }
    if (!s->death_known) {
        if (!s->death_wait) {
            s->death_wait = true;
            s->death_deadline_ms = now_ms() + DEATH_REPORT_WAIT_MS;
            loop_unwatch(s->env->loop, &s->chan_watch);
            loop_unwatch(s->env->loop, &s->pid_watch);
        }
        return;
    }
    char reason[124];
    turn_stats_end(&s->stats, death_end(fs_death_reason(&s->death, s->env->cfg, 0, reason,
                                                        sizeof reason)));
    session_end(s, 1011, reason);
}

void session_sandbox_died(struct session *s, const struct fs_reply *rep)
{
    if (s->phase != PHASE_TURN || s->death_known || rep->pid != s->child_pid)
        return; /* the turn ended first (we killed it), or not this sandbox */
    s->death = *rep;
    s->death_known = true;
    if (s->death_wait) {
        sandbox_gone(s);
        return;
    }
    /* The report came before the pidfd or the channel's EOF was handled:
     * take what the sandbox managed to send, then end. */
    loop_unwatch(s->env->loop, &s->pid_watch);
    if (s->chan_fd >= 0 && sandbox_read(s) < 0)
        return;
    sandbox_gone(s);
}

void kill_sandbox(struct session *s)
{
    struct loop *l = s->env->loop;
    if (s->pidfd >= 0) {
        syscall(SYS_pidfd_send_signal, s->pidfd, SIGKILL, NULL, 0);
        loop_unwatch(l, &s->pid_watch);
        close_and_reset(&s->pidfd);
    }
    if (s->chan_fd >= 0)
        loop_unwatch(l, &s->chan_watch);
    notify_close(&s->notify);
    if (s->out_stream) /* its message being relayed will never end */
        ws_conn_stream_abort(s->ws, s->out_stream);
    s->out_stream = NULL;
    held_free(s);
    if (s->in_checking)
        s->set->n_working--;
    s->in_checking = false;
    chan_conn_close(s->chan); /* its queue, a pending fd, a partial message */
    if (s->chan_fd >= 0)
        chan_conn_close_fd(steal_fd(&s->chan_fd));
    tarcheck_free(s->tc);
    s->tc = NULL;
    tarcheck_cache_free(s->tc_cache);
    s->tc_cache = NULL;
    buf_free(&s->in);
}

/* ---------------------------------------------------------------- statistics */

/* The turn was admitted: its stats start (metrics.h). */
void turn_stats_begin(struct session *s)
{
    union {
        struct sockaddr sa;
        struct sockaddr_in in4;
        struct sockaddr_in6 in6;
    } a;
    socklen_t alen = sizeof a;
    s->stats = (struct turn_stats){.id = s->id, .started_ns = s->accept_ns};
    snprintf(s->stats.tenant, sizeof s->stats.tenant, "%s", s->tenant->name);
    if (getpeername(s->fd, &a.sa, &alen) == 0) {
        char host[INET6_ADDRSTRLEN] = "?";
        bool v6 = a.sa.sa_family == AF_INET6;
        inet_ntop(a.sa.sa_family, v6 ? (void *)&a.in6.sin6_addr : (void *)&a.in4.sin_addr, host,
                  sizeof host);
        snprintf(s->stats.peer, sizeof s->stats.peer, v6 ? "[%s]:%u" : "%s:%u", host,
                 ntohs(v6 ? a.in6.sin6_port : a.in4.sin_port));
    }
    metrics_turn_begin(&s->tenant->metrics);
}

/* The turn is over (once: session_end or mark_dead, before the sandbox is
 * killed, which closes the seccomp listener and its count): its figures
 * go to the metrics, and its end line is written (metrics.c). end is used
 * if no more precise cause was set where the turn ended. */
static void turn_stats_finish(struct session *s, enum turn_end end)
{
    struct turn_stats *st = &s->stats;
    block_over(s); /* cut short: counted with its time so far */
    st->refusals = s->notify.refused;
    ws_conn_bytes(s->ws, &st->bytes_in, &st->bytes_out);
    if (s->death_known) {
        st->peak_known = true;
        st->mem_peak = s->death.mem_peak;
    }
    turn_stats_end(st, end);
    metrics_turn_end(st, &s->tenant->metrics);
}

/* ---------------------------------------------------------------- ending */

/* Give the turn's slot back, once. */
static void release_slot(struct session *s)
{
    if (!s->holds_slot)
        return;
    s->holds_slot = false;
    s->env->release(s->env->host, s->tenant);
}

/* Queue the pending close once every message queued before it is out. */
void send_close_when_flushed(struct session *s)
{
    if (!s->close_pending || ws_conn_pending(s->ws))
        return;
    s->close_pending = false;
    ws_conn_close(s->ws, s->close_code, s->close_reason);
}

void mark_dead(struct session *s)
{
    if (s->phase == PHASE_DEAD)
        return;
    if (s->phase == PHASE_TURN) /* the client went away without a close */
        turn_stats_finish(s, TURN_END_CLIENT_CLOSED);
    kill_sandbox(s);
    release_slot(s);
    preauth_remove(s->env->preauth, &s->pa);
    loop_unwatch(s->env->loop, &s->watch);
    s->phase = PHASE_DEAD;
}

void session_end(struct session *s, uint16_t code, const char *reason)
{
    if (s->phase == PHASE_DEAD || s->phase == PHASE_CLOSING)
        return;
    if (s->phase != PHASE_TURN) {
        mark_dead(s);
        return;
    }
    /* The per-turn log line: the close reason, as the client gets it. */
    if (reason && code != 1000)
        LOG_W("turn %" PRIu64 ": ended: %s", s->id, reason);
    else if (reason)
        LOG_I("turn %" PRIu64 ": ended: %s", s->id, reason);
    else
        LOG_D("turn %" PRIu64 ": ended (%u)", s->id, code);
    if (reason && code == 1011)
        send_error_log(s, reason);
    turn_stats_finish(s, code == 1000 && !reason ? TURN_END_OK
                         : code == 1001         ? TURN_END_DRAINED
                         : code == 1013         ? TURN_END_OVERLOAD
                         : reason && (strcmp(reason, SESSION_REASON_NO_SANDBOX_SERVICE) == 0 ||
                                      strcmp(reason, SESSION_REASON_FORKSERVER_DIED) == 0)
                             ? TURN_END_FORKSERVER_LOST
                             : TURN_END_ERROR);
    kill_sandbox(s);
    release_slot(s);
    /* RFC 6455 limits a close reason to 123 bytes (ws_conn_close trims). */
    s->close_pending = true;
    s->close_code = code;
    snprintf(s->close_reason, sizeof s->close_reason, "%s", reason ? reason : "");
    send_close_when_flushed(s);
    s->phase = PHASE_CLOSING;
    s->deadline_ms = now_ms() + CLOSE_LINGER_MS;
    update_interest(s);
}

/* ---------------------------------------------------------------- timers */

void session_tick(struct session *s, uint64_t now)
{
    const struct config *cfg = s->env->cfg;
    switch (s->phase) {
    case PHASE_HTTP: /* slow or silent client: closed, never answered */
        if (now >= s->deadline_ms)
            log_refused(s, "timeout", "%s within %d s, closed unanswered",
                        s->req ? "request incomplete" : "no request",
                        HTTP_REQUEST_TIMEOUT_MS / 1000);
        /* fall through */
    case PHASE_REPLY:
    case PHASE_CLOSING:
        if (now >= s->deadline_ms)
            mark_dead(s);
        return;
    case PHASE_DEAD:
        return;
    case PHASE_TURN:
        break;
    }

    client_resume(s); /* a client paused for its floods, if it may go on */
    sandbox_resume(s); /* a sandbox paused at its log rate: its waiting header again */
    if (s->phase != PHASE_TURN)
        return;
    /* Keepalive: a pong must arrive within WS_PONG_TIMEOUT_MS of our ping. */
    if (s->ping_outstanding && now - s->last_ping_ms >= WS_PONG_TIMEOUT_MS) {
        LOG_I("turn %" PRIu64 ": no pong from the client; dropping it", s->id);
        turn_stats_end(&s->stats, TURN_END_CLIENT_CLOSED);
        mark_dead(s);
        return;
    }
    if (!s->ping_outstanding && now - s->last_ping_ms >= WS_PING_INTERVAL_MS) {
        ws_conn_send_ping(s->ws);
        s->ping_outstanding = true;
        s->last_ping_ms = now;
        update_interest(s);
    }

    /* The sandbox is dead: only its death report (or its absence) decides. */
    if (s->death_wait) {
        if (now >= s->death_deadline_ms) {
            char reason[124];
            turn_stats_end(&s->stats, death_end(fs_death_reason(NULL, cfg, DEATH_REPORT_WAIT_MS,
                                                                reason, sizeof reason)));
            session_end(s, 1011, reason);
        }
        return;
    }

    char reason[124];
    if (s->turn == TURN_RUNNING && cfg->block_timeout_ms &&
        now - s->block_started_ms >= cfg->block_timeout_ms) {
        finish_block_for_timeout(s, "the block", cfg->block_timeout_ms);
        snprintf(reason, sizeof reason, "block timeout: the block ran longer than %" PRIu64
                 " s (--block-timeout)", cfg->block_timeout_ms / 1000);
        turn_stats_end(&s->stats, TURN_END_TIMEOUT);
        session_end(s, 1000, reason);
    } else if (cfg->turn_timeout_ms && now - s->turn_started_ms >= cfg->turn_timeout_ms) {
        if (s->turn == TURN_RUNNING)
            finish_block_for_timeout(s, "the turn", cfg->turn_timeout_ms);
        snprintf(reason, sizeof reason, "turn timeout: the turn lasted longer than %" PRIu64
                 " s (--turn-timeout)", cfg->turn_timeout_ms / 1000);
        turn_stats_end(&s->stats, TURN_END_TIMEOUT);
        session_end(s, 1000, reason);
    } else if ((s->turn == TURN_BETWEEN || s->turn == TURN_TOOLS) && cfg->idle_timeout_ms &&
               now - s->idle_since_ms >= cfg->idle_timeout_ms) {
        snprintf(reason, sizeof reason, "idle timeout: no block for %" PRIu64
                 " s (--idle-timeout)", cfg->idle_timeout_ms / 1000);
        turn_stats_end(&s->stats, TURN_END_TIMEOUT);
        session_end(s, 1000, reason);
    }
}
