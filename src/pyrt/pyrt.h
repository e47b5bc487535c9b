/* The embedded CPython runtime.
 *
 * pyrt_init() runs once in the fork server: it initialises an isolated
 * interpreter, installs the runtime modules (adk_code_mode_sandbox,
 * adk_code_mode_sandbox._rpc_client, adk_code_mode_sandbox.protocol and the
 * private _forkbox builtin), computes ready.packages once, preloads modules
 * and calls gc.freeze(). After clone, the child calls pyrt_after_fork() and,
 * once isolation is complete, pyrt_serve(), which runs the turn. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

/* 0, or -1 with a reason in err. Must run in a single-threaded process. */
int pyrt_init(const struct config *cfg, char *err, size_t errlen);

/* In the child right after clone(): re-arm the interpreter (PyOS_AfterFork_Child). */
void pyrt_after_fork(void);

/* Serve one turn over the channel fd (see proto/chan.h) until the
 * supervisor closes it. tools_dir and workspace_dir are paths as the child
 * sees them (they exist and are empty; the cwd is set to workspace_dir here).
 * Never returns: exits the process with _exit(). */
_Noreturn void pyrt_serve(int chan_fd, const char *tools_dir, const char *workspace_dir);
