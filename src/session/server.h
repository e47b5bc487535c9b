/* The daemon: the listener, the fork server's control socket, signals,
 * admission (token, capacity, single use) and the set of connections
 * (session.h). Runs in the supervisor.
 *
 * server.c drives the sessions (session.h); they reach the server only
 * through the callbacks they are given (struct session_env), so neither
 * reads the other's struct. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "core/budget.h"
#include "loop/loop.h"
#include "sandbox/forkserver.h"
#include "session/metrics_http.h"
#include "session/preauth.h"
#include "session/tenants.h"

struct sessions;
struct policy_notify;
struct tokens;

/* The fork server, as the server sees it (server.c, "the fork server"). */
enum server_fs_state {
    FS_UP,       /* ready: spawn requests go to it */
    FS_STARTING, /* launched, its ready record not yet read */
    FS_DOWN,     /* none: the next start is due at fs_next_start_ms */
};
struct sdnotify;

/* Fields are server.c's: main.c only holds the struct. */
struct server {
    struct loop *loop;            /* borrowed */
    const struct config *cfg;     /* borrowed */
    struct tokens *tokens;        /* owned: the bearer tokens; NULL = no auth */
    struct tenants tenants;       /* owned: whose turns are whose (the tokens' names) */
    int listen_fd;                /* owned */
    struct loop_watch listen_watch;
    int signal_fd;                /* owned; SIGINT, SIGTERM, SIGHUP */
    struct loop_watch signal_watch;
    struct fs_client fs;          /* owned: the fork server */
    struct loop_watch fs_watch;
    struct policy_notify *notify; /* owned: errno per syscall for counted refusals (the
                                     policy file, parsed); NULL without isolation */
    struct sessions *sessions;    /* owned: every connection */
    struct budget budget;         /* all turns' buffers together (--total-buffer); each
                                     tenant's (tenants) is charged to it */
    struct preauth_pool preauth;  /* owned: connections not admitted (yet); entries borrowed */
    struct metrics_http metrics;  /* owned: --metrics-listen (off: fd -1) */
    unsigned n_turns;             /* admitted turns holding a slot: the capacity count */
    bool single_use_admitted;     /* --single-use: the one turn was admitted */
    bool accept_paused;           /* out of fds or memory: the listener rests until the tick */
    bool draining;                /* SIGTERM/SIGINT: no new turns; running ones go on */
    uint64_t drain_deadline_ms;   /* ... until then (--drain-timeout) */
    uint64_t drain_admit_until_ms; /* new turns still admitted until then (--drain-admit) */
    bool stopping;                /* leave the loop once sessions are gone */
    uint64_t stop_deadline_ms;
    int exit_code;                /* forkboxd's exit status: 1 once the fork server is given up */
    enum server_fs_state fs_state;
    unsigned fs_failures;         /* deaths and failed starts in a row (backoff, giving up) */
    uint64_t fs_start_ms;         /* FS_STARTING: when it was launched */
    uint64_t fs_up_ms;            /* FS_UP: since when */
    uint64_t fs_next_start_ms;    /* FS_DOWN: when to launch the next one */
    struct sdnotify *sd;          /* borrowed (main.c's); NULL = no systemd notifications */
};

/* Listen, watch signals and the fork server, and register with loop.
 * Takes tokens (NULL for no auth; scrubbed and freed by server_free) and
 * the fork server's client *fs (moved: the caller must no longer use or
 * stop its copy), on failure too: after a failure, server_free() still
 * releases both.
 * 0, or -errno with a reason in err. */
int server_init(struct server *srv, struct loop *loop, const struct config *cfg,
                struct tokens *tokens, struct fs_client *fs, char *err, size_t errlen);
/* SIGTERM/SIGINT: stop admitting turns (503 with Retry-After, /ready 503),
 * let the admitted ones run until they end or --drain-timeout passes, then
 * close the rest with 1001 and leave the loop. Idempotent. */
void server_drain_start(struct server *srv);
/* Whether the daemon takes turns now (GET /ready 200): not draining, a fork
 * server ready, a turn slot free. */
bool server_ready(const struct server *srv);
/* What forkboxd exits with once the loop has ended: 0, or 1 when the fork
 * server could not be restarted. */
int server_exit_status(const struct server *srv);
/* SIGHUP: read --token-file again and use its tokens, and their tenants'
 * names, from the next request on. Turns already admitted are not touched
 * (a tenant no longer named keeps its running turns); on any error the
 * tokens in use stay and the reason is logged. Without a token file, only
 * logs that there is nothing to reload. */
void server_reload_tokens(struct server *srv);
/* Under systemd (Type=notify): keep sd (borrowed, outlives srv) and send
 * READY=1 with the first STATUS=. Call once server_init() has succeeded:
 * listening, and the fork server ready. From then on the tick refreshes
 * STATUS= and pings the watchdog, and the signal that starts the stop sends
 * STOPPING=1. */
void server_notify_ready(struct server *srv, struct sdnotify *sd);
/* Frees every session, stops the fork server, closes the listener. */
void server_free(struct server *srv);
