/* The supervisor's connections: one session per connection, the HTTP
 * request, then (if admitted) the WebSocket turn relayed to and from its
 * sandbox. Runs in the supervisor.
 *
 * One way: server.c owns a `struct sessions` and drives it through this
 * API; the session's files (session_int.h lists them) never call server.c.
 * What a session needs of the daemon (admission, a sandbox) it asks through
 * the callbacks in struct session_env, which the server fills in.
 *
 * Lifetime: a session is freed only by sessions_reap(), run from the loop's
 * before-sleep hook, after session_end() marked it dead (loop callbacks never
 * free the object they were called for). */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "core/budget.h"
#include "loop/loop.h"
#include "sandbox/forkserver.h"
#include "session/preauth.h"

struct session;
struct sessions;
struct policy_notify;
struct tenant;
struct tenants;

/* What every session shares, and the daemon's side of admission. */
struct session_env {
    struct loop *loop;            /* borrowed */
    const struct config *cfg;     /* borrowed */
    struct budget *budget;        /* borrowed: all turns' buffers together (--total-buffer) */
    struct preauth_pool *preauth; /* borrowed: connections not admitted (yet) */
    struct policy_notify *notify; /* borrowed: errno per syscall for counted refusals; NULL
                                     without isolation */
    struct tenants *tenants;      /* borrowed: a turn holds its tenant's record (tenants.h)
                                     until the session is freed */
    void *host;                   /* borrowed: the callbacks' argument */
    /* Whether a turn may be admitted now, for a request with this
     * Authorization header (NULL: none), and for which tenant: *tenant
     * (borrowed) is set for 0 and -EUSERS. Takes nothing. 0, -ESHUTDOWN
     * (draining), -EBUSY (at capacity, or the single-use turn was admitted),
     * -EACCES (token) or -EUSERS (the tenant holds --tenant-capacity turns). */
    int (*may_admit)(void *host, const char *authorization, struct tenant **tenant);
    /* Take a turn slot for tenant (after may_admit said yes): the turns now
     * admitted. */
    unsigned (*admit)(void *host, struct tenant *tenant);
    /* Give tenant's slot back (single-use mode then starts shutting down). */
    void (*release)(void *host, struct tenant *tenant);
    /* Ask the fork server for a sandbox for turn_id of tenant; the answer
     * comes as session_sandbox_ready(). 0, -EAGAIN (no fork server now, or
     * it is busy: asked again by sessions_sandbox_retry) or -errno. */
    int (*request_sandbox)(void *host, uint64_t turn_id, const struct tenant *tenant);
    /* GET /ready: NULL when the daemon takes turns, else the 503's body (a
     * static string ending in a newline). */
    const char *(*not_ready)(void *host);
};

/* Every connection. env is copied (what it points to is borrowed). NULL on
 * ENOMEM. */
struct sessions *sessions_new(const struct session_env *env);
/* Frees every session, dead or not (kills their sandboxes). NULL is fine. */
void sessions_free(struct sessions *set);
/* All connections, dead ones not yet reaped included. */
unsigned sessions_count(const struct sessions *set);
/* The session of turn_id, if it is still there (dead or not). */
struct session *sessions_find(struct sessions *set, uint64_t turn_id);
/* End every session (session_end). */
void sessions_end_all(struct sessions *set, uint16_t code, const char *reason);
/* The fork server died: turns whose sandbox died with it end with 1011;
 * turns still waiting for one are asked for again (sessions_sandbox_retry)
 * from the next fork server. */
void sessions_forkserver_lost(struct sessions *set);
/* Ask again for the sandboxes of turns whose request was deferred
 * (request_sandbox gave -EAGAIN), in order, until it says -EAGAIN again. */
void sessions_sandbox_retry(struct sessions *set);
/* Periodic checks of every session: deadlines, pings, timeouts. */
void sessions_tick(struct sessions *set, uint64_t now);
/* One bounded step of every check still running on a complete message
 * (loop fairness: one step per session per loop round). True if work
 * remains. */
bool sessions_work(struct sessions *set);
/* Free the sessions marked dead whose sandbox is not still being made. */
void sessions_reap(struct sessions *set);

/* A new connection on fd from the peer with this pre-auth key: counted in
 * the pre-auth pool (room was made first). Takes fd, on failure too (NULL:
 * out of memory; fd is closed). */
struct session *session_new(struct sessions *set, int fd, const uint8_t key[PREAUTH_KEY_LEN]);
/* The connection the pre-auth pool holds as e. */
struct session *session_of_preauth(struct preauth_entry *e);
/* The fork server answered the spawn request of s. True if s took the fds
 * (or the reply was a failure): false if its turn ended while the sandbox
 * was being made, and the caller kills that sandbox and closes the fds. */
bool session_sandbox_ready(struct session *s, const struct fs_reply *rep, int chan_fd, int pidfd);
/* The fork server's report that this turn's sandbox was reaped (wait status,
 * cgroup counters): the close reason, if the sandbox ended on its own. */
void session_sandbox_died(struct session *s, const struct fs_reply *rep);
/* The close reasons of turns that cannot get a sandbox (the fork server is
 * gone) and of turns whose sandbox died with the fork server: both ends
 * are counted as forkserver_lost (metrics.h). */
#define SESSION_REASON_NO_SANDBOX_SERVICE "sandbox service unavailable"
#define SESSION_REASON_FORKSERVER_DIED "sandbox lost: the fork server died"
/* End s now, in every case: a normal end (reason NULL, or a limit's message
 * with code 1000) or a server-side fault (reason non-NULL: logged, sent as
 * a `log` frame when one is legal, close 1011). Idempotent. reason is one of
 * the supervisor's own static strings (or built only from them): never
 * bytes a client or sandbox sent, so a close reason is always ASCII from a
 * fixed vocabulary (ws_conn_close cuts it to 123 bytes). A connection that
 * is not a turn is closed without a reply. */
void session_end(struct session *s, uint16_t code, const char *reason);
/* The turn's memory budget (for checks: the fuzz target's). */
const struct budget *session_budget(const struct session *s);
