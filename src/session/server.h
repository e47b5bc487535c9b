/* The daemon: the listener, the fork server's control socket, signals,
 * admission (token, capacity, single use) and the set of connections
 * (session.h). Runs in the supervisor.
 *
 * server.c drives session.c; session.c reaches the server only through the
 * callbacks it is given (struct session_env), so neither reads the other's
 * struct. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "core/budget.h"
#include "loop/loop.h"
#include "sandbox/forkserver.h"
#include "session/preauth.h"

struct sessions;
struct policy_notify;

/* Fields are server.c's: main.c only holds the struct. */
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
    struct loop_watch fs_watch;
    struct policy_notify *notify; /* owned: errno per syscall for counted refusals (the
                                     policy file, parsed); NULL without isolation */
    struct sessions *sessions;    /* owned: every connection */
    struct budget budget;         /* all turns' buffers together (--total-buffer) */
    struct preauth_pool preauth;  /* owned: connections not admitted (yet); entries borrowed */
    unsigned n_turns;             /* admitted turns holding a slot: the capacity count */
    bool single_use_admitted;     /* --single-use: the one turn was admitted */
    bool accept_paused;           /* out of fds or memory: the listener rests until the tick */
    bool stopping;                /* leave the loop once sessions are gone */
    uint64_t stop_deadline_ms;
};

/* Listen, watch signals and the fork server, and register with loop.
 * Takes token (token_len bytes, NULL for no auth; scrubbed and freed by
 * server_free) and the fork server's client *fs (moved: the caller must no
 * longer use or stop its copy), on failure too: after a failure,
 * server_free() still releases both.
 * 0, or -errno with a reason in err. */
int server_init(struct server *srv, struct loop *loop, const struct config *cfg,
                char *token, size_t token_len, struct fs_client *fs, char *err, size_t errlen);
/* Frees every session, stops the fork server, closes the listener. */
void server_free(struct server *srv);
