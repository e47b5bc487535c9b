/* forkbox/embed.h: run a forkbox sandbox from a C host program, with no server.
 *
 * The host (the caller's process) starts `forkbox sandbox` on a socketpair,
 * the stream transport of the wire protocol (spec 8.2: ADK_CODE_MODE_CONTROL_FD),
 * with a workspace mounted read-write as the sandbox's cwd and a tools
 * package (a directory named `tools`) mounted read-only, and speaks the
 * ordinary frames with it, one JSON object a line, as cJSON objects:
 *
 *     recv  ready                                  (once, first)
 *     send  {"kind":"run","code":"..."}
 *     recv  tool_call*  ->  send tool_result       (for each, in any order)
 *     recv  done, then output                      (stdout, stderr, exit_code)
 *     ...   more runs: globals carry over
 *     send  {"kind":"shutdown"}, then forkbox_sandbox_wait
 *
 * This is not a second protocol: the frames are spec section 3's, the order
 * spec 8.2's. What the sandbox isolates is what a forkboxd turn isolates.
 * The library calls no tool itself and keeps no state but the process, the
 * socket and a read buffer. Link: pkg-config --cflags --libs forkbox-embed.
 *
 * Errors: every function returning int gives 0 or a negative errno, and
 * writes a one-line reason into err[0..errlen) when err is not NULL.
 * Not thread-safe per sandbox: one thread sends and receives on one sandbox
 * at a time (distinct sandboxes are independent). */
#pragma once
#include <stddef.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One running sandbox: its process (held by a pidfd) and the host's end of
 * the socketpair. Opaque. */
struct forkbox_sandbox;

struct forkbox_sandbox_opts {
    const char *forkbox;    /* the forkbox binary; NULL: $FORKBOX, else the installed one */
    const char *workdir;    /* host directory, mounted read-write as the cwd (required) */
    const char *tools_dir;  /* host directory whose basename is "tools", mounted read-only
                             * (required; may hold only an empty __init__.py) */
    char *const *args;      /* extra `forkbox sandbox` flags, NULL-terminated; NULL: none */
};

/* Start the sandbox. The child gets the socket as fd 3, /dev/null as stdin,
 * the host's stderr as stdout and stderr (its own diagnostics, never user
 * output: that comes in frames), default signal dispositions, an empty signal
 * mask and no other fd of the host's; ADK_CODE_MODE_* variables of the
 * host's environment are not inherited. Returns 0 with *out set, or -errno:
 * -EINVAL (a required option missing), -ENOENT/-EACCES (the binary), or
 * what socketpair/fork/pidfd_open failed with. Does not wait for ready. */
int forkbox_sandbox_start(const struct forkbox_sandbox_opts *opts, struct forkbox_sandbox **out,
                          char *err, size_t errlen);

/* Send one frame (printed compact, plus "\n"). Blocks until written.
 * -EPIPE: the sandbox has closed its end (exited); -EINVAL: not an object. */
int forkbox_sandbox_send(struct forkbox_sandbox *sb, const cJSON *frame, char *err, size_t errlen);

/* Read the next frame, waiting at most timeout_ms (-1: no limit). *frame is
 * the caller's (cJSON_Delete), a JSON object with a string "kind".
 * -ETIMEDOUT: nothing complete in time (call again); -EPIPE: the sandbox
 * closed the channel (it exited: forkbox_sandbox_wait gives the status);
 * -EBADMSG: a line that is not a frame; -EMSGSIZE: a line over 256 MiB. */
int forkbox_sandbox_recv(struct forkbox_sandbox *sb, int timeout_ms, cJSON **frame, char *err,
                         size_t errlen);

/* Wait for the sandbox to exit, at most timeout_ms (-1: no limit), and reap
 * it. *status is the wait status (WIFEXITED ...). -ETIMEDOUT: still running. */
int forkbox_sandbox_wait(struct forkbox_sandbox *sb, int timeout_ms, int *status);

/* SIGKILL the sandbox (through its pidfd: never another process). 0 also
 * if it has exited already. Reap it with forkbox_sandbox_wait. */
int forkbox_sandbox_kill(struct forkbox_sandbox *sb);

/* The host's end of the channel, for poll()/epoll: readable when a frame
 * may be there (then call forkbox_sandbox_recv with timeout 0). Borrowed. */
int forkbox_sandbox_fd(const struct forkbox_sandbox *sb);

/* Kill and reap the sandbox if still running, close everything, free.
 * NULL is a no-op. */
void forkbox_sandbox_free(struct forkbox_sandbox *sb);

#ifdef __cplusplus
}
#endif
