/* One connection and the set of them: a session's creation and freeing,
 * the client socket's events (by phase: the request to admission.c, a
 * turn's WebSocket to net/ws.c) and what both of a session's sockets wait
 * for. Runs in the supervisor.
 *
 * What arrives is handled by the file of its kind (session_int.h lists
 * them); this one relies on admission.c for the request (request_read,
 * flush_out), on from_sandbox.c for a snapshot's check still running
 * (session_work) and on turn.c for timers and ends (session_tick,
 * session_end, mark_dead, kill_sandbox). */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/buf.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/util.h"
#include "net/http.h"
#include "net/ws.h"
#include "session/chan_conn.h"
#include "session/metrics.h"
#include "session/notify.h"
#include "session/preauth.h"
#include "session/session.h"
#include "session/session_int.h"
#include "session/tenants.h"

/* ---------------------------------------------------------------- socket events */

int client_read(struct session *s)
{
    int rr = ws_conn_read(s->ws);
    int refused = ws_conn_refused(s->ws);
    if (refused && s->phase == PHASE_TURN) {
        /* net/ws.c queued its close (1002, 1007, 1009, 1013 or 1011) and
         * goes on with the handshake: the turn ends, its close is ws.c's. */
        turn_stats_end(&s->stats, refused == -ENOSPC ? TURN_END_OVERLOAD : TURN_END_CLIENT_ERROR);
        LOG_I("turn %" PRIu64 ": client message refused (%s); closing", s->id,
              refused == -EMSGSIZE ? "over its limit or the turn's memory budget"
              : refused == -ENOSPC ? "server memory budget exhausted"
              : refused == -EPROTO ? "WebSocket protocol error"
                                   : strerror(-refused));
        session_end(s, 1002, NULL);
    }
    if (rr < 0) {
        /* The client is gone, or the closing handshake is over. */
        turn_stats_end(&s->stats, rr == -EPIPE ? TURN_END_CLIENT_ERROR : TURN_END_CLIENT_CLOSED);
        mark_dead(s);
        return -1;
    }
    return 0;
}

/* The client may be read now: its 101 is out, it is not closing, paused or
 * over its own window (ws.c), and not more than the window waits for its
 * sandbox. */
static bool client_readable(const struct session *s)
{
    return !s->out.len && ws_conn_want_read(s->ws) && chan_conn_held(s->chan) < s->window;
}

static void on_client_io(struct loop_watch *w, uint32_t events)
{
    struct session *s = w->ud;
    switch (s->phase) {
    case PHASE_HTTP:
        request_read(s);
        break;
    case PHASE_REPLY:
        if (flush_out(s) < 0) {
            mark_dead(s);
            break;
        }
        if (s->out.len == 0) {
            /* Answered: from now on the first to go when the pre-auth pool
             * is full (preauth.h). */
            if (s->pa.cls != PREAUTH_ANSWERED)
                preauth_touch(s->env->preauth, &s->pa, PREAUTH_ANSWERED, now_ms());
            /* Half-close, then drain until the peer closes, so the reply is
             * not lost to a reset caused by unread request bytes. */
            uint8_t tmp[1024];
            shutdown(s->fd, SHUT_WR);
            ssize_t n = recv(s->fd, tmp, sizeof tmp, 0);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
                mark_dead(s);
        }
        break;
    case PHASE_TURN:
    case PHASE_CLOSING: {
        /* The 101 first: nothing of the WebSocket is written, nor read and
         * judged, before it is all out (bytes that came with the request
         * wait in the ws_conn: ws_conn_read_more). */
        int r = flush_out(s);
        if (r < 0) {
            mark_dead(s);
            break;
        }
        if (r == 0 && (events & EPOLLOUT) && ws_conn_write(s->ws) < 0) {
            mark_dead(s);
            break;
        }
        /* Reading stopped with bytes already read or due (its budget, a
         * pause, the client's window, the 101 not yet out) and may go on
         * now: within the sandbox's window, as the EPOLLIN interest is. */
        if (r == 0 && ws_conn_read_more(s->ws) && client_readable(s))
            events |= EPOLLIN;
        if (r == 0 && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && client_read(s) < 0)
            break;
        /* Likewise, pass what the client sent straight on to the sandbox. An
         * error stays for on_sandbox_io, which reports it where it belongs. */
        if (s->chan_fd >= 0 && chan_conn_queued(s->chan))
            (void)chan_conn_flush(s->chan);
        if (s->phase == PHASE_CLOSING) {
            send_close_when_flushed(s);
            if (!s->close_pending && ws_conn_finished(s->ws))
                mark_dead(s);
        }
        break;
    }
    case PHASE_DEAD:
        break;
    }
    update_interest(s);
}

void client_resume(struct session *s)
{
    uint64_t now = now_ns();
    if (s->phase != PHASE_TURN || !s->client_paused || !bucket_ok(&s->client_pings, now) ||
        !bucket_ok(&s->client_ignored, now))
        return;
    s->client_paused = false;
    ws_conn_pause(s->ws, false);
    on_client_io(&s->watch, 0); /* what it sent meanwhile (ws_conn_read_more) */
}

void update_interest(struct session *s)
{
    struct loop *l = s->env->loop;
    if (s->phase == PHASE_DEAD)
        return;
    uint32_t ev = 0;
    switch (s->phase) {
    case PHASE_HTTP:
        ev = EPOLLIN;
        break;
    case PHASE_REPLY:
        ev = s->out.len ? EPOLLOUT : EPOLLIN;
        break;
    default:
        if (s->out.len || ws_conn_want_write(s->ws))
            ev |= EPOLLOUT;
        if (client_readable(s))
            ev |= EPOLLIN;
        break;
    }
    loop_watch(l, &s->watch, ev);

    if (s->chan_fd >= 0 && !s->death_wait) {
        uint32_t cev = 0;
        if (chan_conn_queued(s->chan))
            cev |= EPOLLOUT;
        /* Backpressure: a client that does not read stops its sandbox (the
         * supervisor does not grow); a message still being checked is
         * finished first (session_work). */
        if ((!s->ws || ws_conn_queued(s->ws) < s->window) && !s->in_checking &&
            !s->sandbox_paused)
            cev |= EPOLLIN;
        loop_watch(l, &s->chan_watch, cev);
    }
}

/* ---------------------------------------------------------------- the connection */

struct session *session_new(struct sessions *set, int fd, const uint8_t key[PREAUTH_KEY_LEN])
{
    const struct session_env *env = &set->env;
    struct session *s = calloc(1, sizeof *s);
    if (!s) {
        close(fd);
        return NULL;
    }
    s->set = set;
    s->env = env;
    s->id = set->next_id++;
    s->fd = fd;
    s->chan_fd = s->pidfd = -1;
    notify_turn_init(&s->notify, s->id, env->loop, env->notify);
    s->phase = PHASE_HTTP;
    s->budget = (struct budget){.max = env->cfg->turn_buffer, .up = env->budget};
    s->window = env->cfg->turn_buffer / 4 < RELAY_WINDOW ? env->cfg->turn_buffer / 4 : RELAY_WINDOW;
    s->sandbox_logs = (struct bucket)BUCKET_INIT(SANDBOX_LOG_BURST * SANDBOX_LOG_LINE_COST,
                                                 SANDBOX_LOG_PER_MINUTE);
    s->client_pings = (struct bucket)BUCKET_INIT(CLIENT_PINGS_BURST, CLIENT_PINGS_PER_SEC);
    s->client_ignored = (struct bucket)BUCKET_INIT(CLIENT_IGNORED_BURST, CLIENT_IGNORED_PER_SEC);
    buf_init(&s->out, 64 * KiB);
    buf_init_budget(&s->in, CHAN_MAX_MESSAGE_BYTES, &s->budget);
    s->deadline_ms = now_ms() + HTTP_REQUEST_TIMEOUT_MS;
    s->watch = (struct loop_watch){.fd = fd, .cb = on_client_io, .ud = s, .name = "client",
                                   .turn = s->id};
    if (loop_watch(env->loop, &s->watch, EPOLLIN) < 0) {
        buf_free(&s->out);
        buf_free(&s->in);
        free(s);
        close(fd);
        return NULL;
    }
    s->next = set->head;
    if (set->head)
        set->head->prev = s;
    set->head = s;
    set->n++;
    if (preauth_add(env->preauth, &s->pa, key, now_ms()) < 0) {
        /* Cannot happen after preauth_make_room; never hold an
         * unaccounted connection. */
        session_end(s, 1000, NULL);
    }
    return s;
}

struct session *session_of_preauth(struct preauth_entry *e)
{
    return (struct session *)((char *)e - offsetof(struct session, pa));
}

const struct budget *session_budget(const struct session *s)
{
    return &s->budget;
}

static void session_free(struct session *s)
{
    if (!s)
        return;
    kill_sandbox(s);
    preauth_remove(s->env->preauth, &s->pa);
    loop_unwatch(s->env->loop, &s->watch);
    ws_conn_free(s->ws);
    chan_conn_free(s->chan);
    http_req_free(s->req);
    if (s->fd >= 0) {
        /* Drain unread input first: closing with unread bytes makes the
         * kernel send a reset, and the peer could lose our last bytes. */
        uint8_t tmp[4096];
        shutdown(s->fd, SHUT_WR);
        for (int i = 0; i < 16 && recv(s->fd, tmp, sizeof tmp, MSG_DONTWAIT) > 0; i++)
            ;
        close(s->fd);
    }
    buf_free(&s->out);
    free(s->cscan);
    free(s->sscan);
    /* Last: the buffers freed above were charged to the tenant. */
    tenants_drop(s->env->tenants, s->tenant);
    free(s);
}

/* ---------------------------------------------------------------- the set */

struct sessions *sessions_new(const struct session_env *env)
{
    struct sessions *set = calloc(1, sizeof *set);
    if (!set)
        return NULL;
    set->env = *env;
    set->next_id = 1;
    return set;
}

void sessions_free(struct sessions *set)
{
    if (!set)
        return;
    while (set->head) {
        struct session *s = set->head;
        set->head = s->next;
        session_free(s);
    }
    free(set);
}

unsigned sessions_count(const struct sessions *set)
{
    return set->n;
}

struct session *sessions_find(struct sessions *set, uint64_t turn_id)
{
    for (struct session *s = set->head; s; s = s->next)
        if (s->id == turn_id)
            return s;
    return NULL;
}

void sessions_end_all(struct sessions *set, uint16_t code, const char *reason)
{
    for (struct session *s = set->head; s; s = s->next)
        session_end(s, code, reason);
}

void sessions_forkserver_lost(struct sessions *set)
{
    for (struct session *s = set->head; s; s = s->next) {
        if (s->spawn_pending) {
            /* Its request went to the fork server that died: ask the next
             * one. A dead session's is dropped, so it can be reaped. */
            s->spawn_pending = false;
            s->spawn_deferred = s->phase == PHASE_TURN;
        } else if (s->phase == PHASE_TURN && s->child_pid > 0) {
            /* Its sandbox died with the fork server (parent-death signal),
             * or dies now (kill_sandbox, by its pidfd); no death report
             * will come for it. */
            session_end(s, 1011, SESSION_REASON_FORKSERVER_DIED);
        }
    }
}

void sessions_sandbox_retry(struct sessions *set)
{
    for (struct session *s = set->head; s; s = s->next) {
        if (!s->spawn_deferred || s->phase != PHASE_TURN)
            continue;
        int r = set->env.request_sandbox(set->env.host, s->id, s->tenant);
        if (r == -EAGAIN)
            return; /* still none, or its socket is full: the next tick */
        s->spawn_deferred = false;
        if (r < 0)
            session_end(s, 1011, SESSION_REASON_NO_SANDBOX_SERVICE);
        else
            s->spawn_pending = true;
    }
}

void sessions_tick(struct sessions *set, uint64_t now)
{
    for (struct session *s = set->head; s; s = s->next)
        session_tick(s, now);
}

bool sessions_work(struct sessions *set)
{
    bool more = false;
    if (set->n_working == 0)
        return false;
    for (struct session *s = set->head; s; s = s->next)
        if (s->in_checking)
            more |= session_work(s);
    return more;
}

void sessions_reap(struct sessions *set)
{
    struct session *s = set->head;
    while (s) {
        struct session *next = s->next;
        if (s->phase == PHASE_DEAD && !s->spawn_pending) {
            if (s->prev)
                s->prev->next = s->next;
            else
                set->head = s->next;
            if (s->next)
                s->next->prev = s->prev;
            set->n--;
            session_free(s);
        }
        s = next;
    }
}
