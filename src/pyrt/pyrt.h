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
 * supervisor closes it.
 *
 * tools_fd: an O_DIRECTORY fd (owned) into which the tools archive is
 *   extracted; it may refer to a writable mount whose visible path, tools_dir,
 *   is a read-only bind (the sandbox builds /tools that way, so no privilege
 *   is needed to fill it). pyrt_serve closes it right after extraction, so no
 *   writable path to the tools remains for user code.
 * tools_dir: the path user code imports and lists (for the `tools` finder).
 * workspace_dir: the workspace root as the child sees it (exists, empty); the
 *   cwd is set to it here.
 * On entry fds 0, 1 and 2 are open on /dev/null and chan_fd/tools_fd are the
 * only other fds. Never returns: exits the process with _exit(). */
_Noreturn void pyrt_serve(int chan_fd, int tools_fd, const char *tools_dir,
                          const char *workspace_dir);
