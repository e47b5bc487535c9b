/* Private to the session's files in src/session/: one connection's state
 * and what those files call in each other. Runs in the supervisor. Nothing
 * else includes this: server.c and the fuzz target see session.h only.
 *
 * One connection: the HTTP request, then the WebSocket turn relayed between
 * the client and its sandbox (spec 2.3 state machine). Its code is cut by
 * what arrives:
 *   admission.c     the HTTP request: replies, refusals, routing, admission;
 *   from_client.c   the client's WebSocket messages, queued for the sandbox;
 *   from_sandbox.c  the sandbox's channel messages, checked and relayed;
 *   turn.c          the turn's lifecycle: timers, ending, death reasons,
 *                   statistics;
 *   session.c       the connection and the set: creation, freeing, the
 *                   client socket's events, what both sockets wait for.
 * The files call each other through this header, both ways: every one ends
 * a turn through turn.c, and turn.c sends the supervisor's own frames with
 * from_sandbox.c's client_send_frame. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/bucket.h"
#include "core/buf.h"
#include "core/budget.h"
#include "loop/loop.h"
#include "net/http.h"
#include "net/ws.h"
#include "proto/frame.h"
#include "proto/tarcheck.h"
#include "sandbox/forkserver.h"
#include "session/chan_conn.h"
#include "session/metrics.h"
#include "session/notify.h"
#include "session/preauth.h"
#include "session/session.h"

enum turn_state {
    TURN_TOOLS,        /* T: awaiting the tools archive */
    TURN_BETWEEN,      /* B: between blocks */
    TURN_ARCHIVED,     /* R: workspace archive received, awaiting run */
    TURN_RUNNING,      /* X: block running, until the sandbox's done */
    TURN_WANT_OUTPUT,  /* X: done relayed, awaiting output */
    TURN_WANT_SNAPSHOT,/* X: output relayed, awaiting the archive */
};

enum session_phase {
    PHASE_HTTP,    /* reading the request */
    PHASE_REPLY,   /* writing a non-101 response, then closing */
    PHASE_TURN,    /* WebSocket turn */
    PHASE_CLOSING, /* the turn is over: its close goes out after what was queued, then the
                      closing handshake (net/ws.c) before the socket is closed */
    PHASE_DEAD,    /* waiting for sessions_reap() */
};

struct session {
    struct sessions *set;         /* borrowed: the set it is in */
    const struct session_env *env; /* borrowed: &set->env */
    struct session *prev, *next;  /* in set->head */
    uint64_t id;                  /* the connection's, and its turn's (fork server requests) */
    enum session_phase phase;

    int fd;                       /* owned: the client socket */
    struct loop_watch watch;
    struct preauth_entry pa;      /* in env->preauth until admitted or closed */
    struct http_req *req;         /* owned while PHASE_HTTP, from the first byte */
    struct buf out;               /* raw bytes to write before any WebSocket data */
    uint64_t deadline_ms;         /* phase deadline (request, reply, close) */

    struct ws_conn *ws;           /* owned in PHASE_TURN/CLOSING */
    enum turn_state turn;
    struct tenant *tenant;        /* held from admission until freed (tenants.h); else NULL */
    bool holds_slot;              /* taken by env->admit, not yet released */
    uint64_t turn_started_ms, block_started_ms, idle_since_ms;
    uint64_t last_ping_ms;
    bool ping_outstanding;
    /* What the client makes us read only to ignore it (CLIENT_PINGS_*,
     * CLIENT_IGNORED_*): past either, it is not read (client_paused) until
     * both have refilled (session_tick). */
    struct bucket client_pings, client_ignored;
    bool client_paused;
    int64_t done_exit_code;
    bool ready_seen, tools_sent;
    /* wslay sends control frames ahead of queued messages, so a close is
     * held back until everything queued before it has been written. */
    bool close_pending;
    uint16_t close_code;
    char close_reason[124];

    /* What this turn makes the supervisor hold: every buffer of its messages
     * in both directions (--turn-buffer), charged to its tenant's budget and
     * env->budget too (up: set at admission, before anything is charged). */
    struct budget budget;
    /* What may wait for the slower side, each way, before the faster one is
     * no longer read: RELAY_WINDOW, or a quarter of --turn-buffer if that is
     * less (the window, not the budget, is then what a slow peer meets). */
    size_t window;
    /* the client's message: text scanned as it arrives */
    struct frame_scan *cscan;     /* owned (admitted turns) */
    bool cmsg_bad;                /* it can no longer decode */
    bool cmsg_stream;             /* streamed (over RELAY_WHOLE_MAX, or fragmented) */
    bool cmsg_parts;              /* ... and its chunks go to the sandbox as parts */
    bool cmsg_sent;               /* ... and some went */
    uint64_t cmsg_got;            /* its bytes so far */

    /* the sandbox */
    bool spawn_pending;           /* request sent, reply not yet received */
    bool spawn_deferred;          /* no fork server to ask (restarting) or its socket full:
                                     asked again by sessions_sandbox_retry */
    pid_t child_pid;              /* the sandbox's (a death report must name it) */
    int chan_fd;                  /* owned: the sandbox's channel (chan borrows it) */
    struct loop_watch chan_watch;
    int pidfd;                    /* owned: the sandbox's pidfd */
    struct loop_watch pid_watch;
    struct chan_conn *chan;       /* owned (admitted turns): envelopes both ways */
    const char *child_error;      /* static: what the sandbox last reported failing */
    bool death_wait;              /* it ended on its own: the close waits for its death report */
    uint64_t death_deadline_ms;   /* ... until then at most (DEATH_REPORT_WAIT_MS) */
    bool death_known;             /* the fork server's death report arrived */
    struct fs_reply death;        /* that report (kind FS_REPLY_DEATH) */

    /* the sandbox's message being read (chan_conn.h) */
    bool in_token;                /* a log line may be written for it (sandbox_logs) */
    bool in_checking;             /* its check has work to do before more is read
                                     (sessions_work): a snapshot's */
    struct buf in;                /* the body, room reserved at the header (held whole) */
    /* a message over RELAY_WHOLE_MAX, relayed as it arrives */
    struct ws_stream *out_stream; /* borrowed (the ws_conn's) until ended or aborted */
    uint64_t in_got;              /* its bytes so far */
    bool in_ended;                /* all of them are in */
    struct held_chunk *held;      /* owned: a snapshot's chunks its check may still read */
    struct frame_scan *sscan;     /* owned (admitted turns): an F body's scan */
    struct tarcheck *tc;          /* owned while an S body is checked */
    struct tarcheck_cache *tc_cache; /* owned: snapshot members verified this turn */
    /* The sandbox's log lines between blocks (SANDBOX_LOG_*): one over the
     * rate waits unread, the channel unwatched (sandbox_paused), until the
     * tick finds the bucket refilled (sandbox_resume). */
    struct bucket sandbox_logs;
    bool sandbox_paused;

    struct notify_turn notify;    /* counted refusals and supervised calls (notify.c) */
    uint64_t spawn_ns;            /* from the fork server */
    uint64_t accept_ns;           /* when the upgrade was accepted */
    struct turn_stats stats;      /* what the turn did (metrics.h), from admit() */
};

struct sessions {
    struct session_env env;       /* copied at sessions_new */
    struct session *head;         /* owned, doubly linked */
    unsigned n;                   /* all connections */
    unsigned n_working;           /* sessions with a message still being checked */
    uint64_t next_id;             /* the next connection's (and turn's) id */
};

/* ---------------------------------------------------------------- admission.c */

/* Read the request and answer it, or admit the turn (PHASE_HTTP). */
void request_read(struct session *s);
/* Write what is left of s->out (a reply, the 101) without blocking: -1 on a
 * fatal socket error, 0 when all of it is out, 1 if bytes remain. */
int flush_out(struct session *s);
/* The one log line of a refused request (also for one never completed). */
void __attribute__((format(printf, 3, 4)))
log_refused(const struct session *s, const char *status, const char *fmt, ...);

/* ---------------------------------------------------------------- from_client.c */

/* What an admitted turn's WebSocket calls with the client's messages. */
extern const struct ws_handlers client_handlers;

/* ---------------------------------------------------------------- from_sandbox.c */

/* What an admitted turn's channel calls with the sandbox's messages. */
extern const struct chan_conn_handlers sandbox_handlers;
/* Send f to the client: body (consumed, may be NULL) holds its bytes when it
 * is canonical and unchanged. 0 or -errno (-EPIPE: the client is gone). */
int client_send_frame(struct session *s, const struct frame *f, struct buf *body);
/* Read what the sandbox sent: 0 to continue, -1 if the session was failed,
 * 1 when the sandbox's end is closed. */
int sandbox_read(struct session *s);
/* One step of a complete snapshot's check (sessions_work). True if work
 * remains. */
bool session_work(struct session *s);
/* Drop a streamed snapshot's held chunks (kill_sandbox). */
void held_free(struct session *s);
/* Read the sandbox again after its log rate paused it (sandbox_paused),
 * from the tick: its waiting header is decided anew. */
void sandbox_resume(struct session *s);

/* ---------------------------------------------------------------- turn.c */

/* The turn was admitted (admit): its stats start. */
void turn_stats_begin(struct session *s);
/* The block that was running is over: its duration to the histogram. */
void block_over(struct session *s);
/* End s without a close frame (the client is gone, or the close handshake
 * is over): PHASE_DEAD, its socket closed when it is reaped. Idempotent. */
void mark_dead(struct session *s);
/* session_end's close, once the client's queue is out. */
void send_close_when_flushed(struct session *s);
/* Kill the sandbox (if any) and drop everything of its channel. */
void kill_sandbox(struct session *s);
/* The sandbox ended on its own: end the turn with why (its death report). */
void sandbox_gone(struct session *s);
/* Deadlines, keepalive and timeouts of s (sessions_tick). */
void session_tick(struct session *s, uint64_t now);

/* ---------------------------------------------------------------- session.c */

/* Watch the client socket and the channel for what s can use now. */
void update_interest(struct session *s);
/* Read what the client sent (net/ws.c; the handlers run), once the 101 is
 * out. A message ws.c refused ends the turn (its close is ws.c's). -1 if
 * the connection is over (s is marked dead), else 0. */
int client_read(struct session *s);
/* Read the client again after a pause (client_paused), if its buckets have
 * refilled (session_tick): what it sent meanwhile is taken now. */
void client_resume(struct session *s);
