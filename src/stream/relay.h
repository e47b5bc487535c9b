/* Runs in the `forkbox sandbox` process: one sandbox's turn over a spec 8.2
 * stream (relay.c). The counterpart of forkboxd's session (session.c) for
 * a host that talks newline-separated frames instead of WebSocket messages,
 * with the workspace shared instead of shipped: the same fork server, the
 * same channel, and the same checks of everything the sandbox sends. */
#pragma once
#include "config/config.h"
#include "sandbox/forkserver.h"
#include "stream/transport.h"

/* Exit statuses of `forkbox sandbox` (docs/embedding.md, "Without a server"). */
#define STREAM_EXIT_SHUTDOWN 0 /* the host sent shutdown */
#define STREAM_EXIT_FAILED 1   /* EOF, an undecodable line, the sandbox failed or timed out */
#define STREAM_EXIT_USAGE 2    /* bad settings, or the sandbox could not start */

/* Spawn the one sandbox on fs (started, borrowed) and relay between it and
 * the host on t (connected, borrowed) until the turn ends; the sandbox is
 * killed then. Returns the exit status. cfg is borrowed. */
int stream_run(const struct config *cfg, struct fs_client *fs, struct transport *t);
