/* The supervisor's connections and turns.
 *
 * server.c owns the listener, the fork server's control socket, signals and
 * the list of sessions; session.c is one connection: the HTTP request, then
 * (if admitted) the WebSocket turn relayed to and from its sandbox.
 *
 * Lifetime: a session is freed only by server_reap(), run from the loop's
 * before-sleep hook, after session_end() marked it dead (loop callbacks never
 * free the object they were called for). */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "config/config.h"
#include "core/budget.h"
#include "core/buf.h"
#include "core/outq.h"
#include "core/ratelimit.h"
#include "loop/loop.h"
#include "proto/chan.h"
#include "sandbox/forkserver.h"
#include "session/preauth.h"
#include "session/notify.h"

struct chan_conn;
struct http_req;
struct ws_conn;
struct session;
struct policy_notify;
struct frame_scan;
struct tarcheck;
struct tarcheck_cache;

struct server {
    struct loop *loop;            /* borrowed */
    const struct config *cfg;     /* borrowed */
    char *token;                  /* owned; NULL = no auth */
    size_t token_len;
    int listen_fd;                /* owned */
    struct loop_watch listen_watch;
    int signal_fd;                /* owned; SIGINT, SIGTERM */
    struct loop_watch signal_watch;
    struct fs_client fs;          /* owned: the fork server */
    struct policy_notify *notify; /* owned: errno per syscall for counted refusals (the
                                     policy file, parsed); NULL without isolation */
    struct loop_watch fs_watch;
    struct session *sessions;     /* owned, doubly linked */
    unsigned n_sessions;          /* all connections */
    unsigned n_working;           /* sessions with a message still being checked */
    struct budget budget;         /* all turns' buffers together (--total-buffer) */
    unsigned n_turns;             /* admitted turns: the capacity count */
    struct preauth_pool preauth;  /* owned: connections not admitted (yet); entries borrowed */
    bool accept_paused;           /* out of fds or memory: the listener rests until the tick */
    uint64_t next_id;
    bool single_use_admitted;     /* --single-use: the one turn was admitted */
    bool stopping;                /* leave the loop once sessions are gone */
    uint64_t stop_deadline_ms;
    uint64_t turns_served;
};

/* Turn state (spec 2.3) merged with what the sandbox owes us. */
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
    PHASE_CLOSING, /* close frame queued; flushing before closing the socket */
    PHASE_DEAD,    /* waiting for server_reap() */
};

struct session {
    struct server *srv;
    struct session *prev, *next;
    uint64_t id;
    enum session_phase phase;

    int fd;                       /* owned: the client socket */
    struct loop_watch watch;
    struct preauth_entry pa;      /* in srv->preauth until admitted or closed */
    struct http_req *req;         /* owned while PHASE_HTTP, from the first byte */
    struct buf out;               /* raw bytes to write before any WebSocket data */
    uint64_t deadline_ms;         /* phase deadline (request, reply, close) */

    struct ws_conn *ws;           /* owned in PHASE_TURN/CLOSING */
    enum turn_state turn;
    bool holds_slot;              /* counted in srv->n_turns */
    uint64_t turn_started_ms, block_started_ms, idle_since_ms;
    uint64_t last_ping_ms;
    bool ping_outstanding;
    int64_t done_exit_code;
    bool ready_seen, tools_sent;
    /* wslay sends control frames ahead of queued messages, so a close is
     * held back until everything queued before it has been written. */
    bool close_pending;
    uint16_t close_code;
    char close_reason[124];

    /* What this turn makes the supervisor hold: every buffer of its messages
     * in both directions (--turn-buffer), charged to srv->budget too. */
    struct budget budget;
    /* the client's text message, scanned as it arrives */
    struct frame_scan *cscan;     /* owned (admitted turns) */
    bool cmsg_bad;                /* it can no longer decode */

    /* the sandbox */
    bool spawn_pending;           /* request sent, reply not yet received */
    pid_t child_pid;
    int chan_fd;                  /* owned */
    struct loop_watch chan_watch;
    int pidfd;                    /* owned */
    struct loop_watch pid_watch;
    struct chan_conn *chan;       /* owned (admitted turns): envelopes both ways */
    const char *child_error;      /* static: what the sandbox last reported failing */
    bool death_wait;              /* it ended on its own: the close waits for its death report */
    uint64_t death_deadline_ms;   /* ... until then at most (DEATH_REPORT_WAIT_MS) */
    bool death_known;             /* the fork server's death report arrived */
    struct fs_reply death;        /* that report (kind FS_REPLY_DEATH) */

    /* the sandbox's message being read (chan_conn.h) */
    bool in_token;                /* a log line may be written for it (log_rl) */
    bool in_complete;             /* all of it is in, its check still has work to do */
    struct buf in;                /* the body, room reserved at the header */
    struct frame_scan *sscan;     /* owned (admitted turns): an F body's scan */
    struct tarcheck *tc;          /* owned while an S body is checked */
    struct tarcheck_cache *tc_cache; /* owned: snapshot members verified this turn */
    struct ratelimit log_rl;      /* the sandbox's log lines in the operator log */

    struct notify_turn notify;    /* counted refusals and supervised calls (notify.c) */
    uint64_t spawn_ns;            /* from the fork server */
    uint64_t accept_ns;           /* when the upgrade was accepted */
};

/* server.c */
int server_init(struct server *srv, struct loop *loop, const struct config *cfg,
                char *token, size_t token_len, struct fs_client *fs, char *err, size_t errlen);
void server_free(struct server *srv);
/* Release a turn slot (single-use mode then starts shutting down). */
void server_release_slot(struct server *srv, struct session *s);
/* Ask the fork server for a sandbox for s. 0 or -errno. */
int server_request_sandbox(struct server *srv, struct session *s);

/* session.c */
struct session *session_new(struct server *srv, int fd);
void session_free(struct session *s);
/* The fork server answered the spawn request of s. Takes ownership of the fds. */
void session_sandbox_ready(struct session *s, const struct fs_reply *rep, int chan_fd, int pidfd);
/* The fork server's report that this turn's sandbox was reaped (wait status,
 * cgroup counters): the close reason, if the sandbox ended on its own. */
void session_sandbox_died(struct session *s, const struct fs_reply *rep);
/* Periodic checks: deadlines, pings, timeouts. */
void session_tick(struct session *s, uint64_t now);
/* One bounded step of a check still running on a complete message (loop
 * fairness: one step per session per loop round). True if work remains. */
bool session_work(struct session *s);
/* End s now: a server-side fault (reason non-NULL: logged, sent as a `log`
 * frame when one is legal, close 1011) or a normal end (reason NULL, close
 * 1000). Idempotent. reason is one of the supervisor's own static strings
 * (or built only from them): never bytes a client or sandbox sent, so a
 * close reason is always ASCII from a fixed vocabulary (ws_conn_close cuts it
 * to 123 bytes). */
void session_fail(struct session *s, uint16_t code, const char *reason);
