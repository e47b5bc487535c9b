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

/* 0, or -errno with a reason in err: -EALREADY (called before), -ENOMEM,
 * -EIO (the interpreter or the runtime failed to start; the traceback, if
 * any, went to stderr), -EINVAL (the preloads left threads running). Must
 * run in a single-threaded process, at most once. Uses cfg->output_cap,
 * snapshot_max, max_unpacked, max_members (0 = the limits.h default),
 * site_dirs and preload; cfg is not kept.
 * A preload that fails to import is logged to stderr and skipped; a preload
 * that leaves a thread running makes pyrt_init fail (clone(CLONE_NEWUSER)
 * needs a single-threaded caller). Signal dispositions are not touched.
 * Afterwards the calling thread holds the GIL for good: the fork server must
 * not run Python code on another thread. */
int pyrt_init(const struct config *cfg, char *err, size_t errlen);

/* In the child after clone(), before any Python code runs there (the sandbox
 * calls it after its isolation steps, in the runtime process, right before
 * pyrt_serve): re-arm the interpreter (PyOS_AfterFork_Child:
 * GIL, import lock, thread states, os.register_at_fork child hooks such as
 * random's reseed). Does not rely on glibc's cached pid/tid. */
void pyrt_after_fork(void);

/* Serve one turn over the channel fd (see proto/chan.h) until the
 * supervisor closes it.
 *
 * tools_fd: an O_DIRECTORY fd (taken) into which the tools archive is
 *   extracted; it may refer to a writable mount whose visible path, tools_dir,
 *   is a read-only bind (the sandbox builds /tools that way, so no privilege
 *   is needed to fill it). pyrt_serve closes it right after extraction, so no
 *   writable path to the tools remains for user code.
 * warm_fd: -1, or (a pooled sandbox, made before any turn asked for it) a
 *   socket on which one byte is sent, and which is then closed, once a
 *   warm-up has run: a representative block compiled and run against a
 *   throwaway namespace with its output captured and discarded, a tool call
 *   encoded and refused locally, a result decoded, the output frame encoded
 *   and an (empty) workspace snapshot built and dropped. Nothing is sent on
 *   the channel and nothing the warm-up did stays visible to user code (the
 *   turn's __main__, stdio objects, signal handlers, the workspace and
 *   sys.modules are as without it); it only takes the copy-on-write faults
 *   and first-use costs that the first block would otherwise pay. A tools
 *   archive arriving meanwhile waits until the warm-up is over.
 * tools_dir: the path user code imports and lists (for the `tools` finder; kept
 *   for the whole turn, so it must live as long as the process).
 * workspace_dir: the workspace root as the child sees it (exists, empty); the
 *   cwd is set to it here.
 * On entry fds 0, 1 and 2 are open on /dev/null and chan_fd/tools_fd (and
 * warm_fd) are the only other fds. Never returns: exits the process with _exit().
 *
 * What it does to the process: chan_fd and tools_fd are made close-on-exec
 * (and moved off 0-2 if they were there); fds 0-2 are re-pointed at
 * /dev/null, and during a block fds 1 and 2 are pipes drained by the
 * channel reader thread; the environment is reduced to the spec 6.4 allowlist (also wiped
 * from the initial environment block); SIGPIPE and SIGXFSZ are ignored and
 * SIGINT raises KeyboardInterrupt in user code (the environment and signal
 * dispositions are set up once in pyrt_init(), inherited by every sandbox).
 * It starts one thread (the channel reader, which also drains a block's
 * output). /dev/null must be openable.
 * Exit statuses: 0 channel EOF or write error (the supervisor is gone),
 * 3 archive or setup error (a `log` error frame was sent first), 4 internal
 * runtime error (a `log` frame with the traceback was sent first). */
/* (noreturn as an attribute, not _Noreturn: clang makes it part of the
 * function's type only then, and sbx_hooks.serve's type has it.) */
void pyrt_serve(int chan_fd, int tools_fd, int warm_fd, const char *tools_dir,
                const char *workspace_dir) __attribute__((noreturn));
