/* Runs in the `forkbox sandbox` process (src/forkbox.c): the spec 8.1 mode
 * selection and the spec 8.2 stream transports, from the environment:
 *   ADK_CODE_MODE_CONTROL_HTTP non-empty   refused (that is forkboxd)
 *   ADK_CODE_MODE_CONTROL_TCP=host:port    connect out (IPv4, split at the
 *                                          last ':'), then the token line
 *   ADK_CODE_MODE_CONTROL_SOCKET=path      connect to a Unix socket
 *   ADK_CODE_MODE_CONTROL_FD=N | R,W       inherited fds (default "3")
 * in that order. Selecting only reads the environment (and, for FD, moves
 * the host's fds out of the way, see transport_select); connecting is
 * separate, so that the fork server can be started in between, before the
 * token is read (src/forkbox.c says why). */
#pragma once
#include <stddef.h>

enum transport_kind { TRANSPORT_FD, TRANSPORT_SOCKET, TRANSPORT_TCP };

#define TRANSPORT_TOKEN_MAX 511 /* spec 8.2: the host reads at most 512 bytes with the \n */
#define TRANSPORT_HIGH_FD 10    /* the host's fds are moved to at least this */

struct transport {
    enum transport_kind kind;
    int in_fd;            /* owned: frames from the host; -1 until connected */
    int out_fd;           /* owned: frames to the host; once connected never == in_fd
                             (a dup of it for a socket or FD "N") */
    char where[256];      /* TCP: host; SOCKET: path; FD: the variable's value */
    char port[8];         /* TCP: the port's digits */
};

/* Read the spec 8.1 variables and pick the transport. For FD, the fds are
 * checked to be open and moved to close-on-exec fds >= TRANSPORT_HIGH_FD
 * (the originals closed; a 0 or 1 given up is reopened on /dev/null), so
 * that no host fd reaches the fork server, which keeps 0-4 across its exec.
 * fd 2 is refused: it is where our messages go. 0, or -errno with a reason
 * (-ENOTSUP: ADK_CODE_MODE_CONTROL_HTTP is set). */
int transport_select(struct transport *t, char *err, size_t errlen);

/* Connect a TCP or Unix socket transport (FD: nothing to do), in blocking
 * mode; for TCP write the token line (ADK_CODE_MODE_CONTROL_TOKEN, default
 * "", at most TRANSPORT_TOKEN_MAX bytes of ASCII), then scrub the token
 * from the environment and from our copy. Afterwards the two fds are
 * distinct (one socket both ways gets a dup for writing: each direction
 * has an epoll watch of its own) and non-blocking. 0, or -errno with a
 * reason. */
int transport_connect(struct transport *t, char *err, size_t errlen);

void transport_close(struct transport *t);
