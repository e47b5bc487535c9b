/* Used in the supervisor (fs_client_*, fsclient.c) and the fork server
 * (forkserver_main, forkserver.c): starting the fork server and talking to
 * it (the records: fsproto.h, which says what the fork server is). */
#pragma once
#include <sys/types.h>

#include "config/config.h"
#include "sandbox/fsproto.h"

/* --- supervisor side --- */

struct fs_client {
    int ctl_fd;  /* owned; non-blocking SEQPACKET to the fork server; -1 while none runs */
    pid_t pid;   /* the fork server; 0 while none runs */
    int exe_fd;  /* owned: forkbox-sandbox, opened and checked once (fs_client_open);
                    every start, restarts too, execs this very file */
};

/* The fork server's whole command line (and so every sandbox's
 * /proc/self/cmdline): a marker forkbox-sandbox checks, nothing configured.
 * argv[0] stays "forkboxd": what sandboxes see did not change when the fork
 * server became an executable of its own. */
#define FS_ARGV_FLAG "--internal-forkserver"
#define FS_ARGV {"forkboxd", FS_ARGV_FLAG, NULL}

/* Open and check forkbox-sandbox (--sandbox-exe, else the build tree's when
 * this is the build tree's forkboxd, else the installed one) into
 * fs->exe_fd; no fork server runs yet. Also makes sure fds 0-2 are open, so
 * that nothing the supervisor opens later lands there (a fork server keeps
 * 0-3). Call it before anything else is opened. 0, or -errno with a reason. */
int fs_client_open(const struct config *cfg, struct fs_client *fs, char *err, size_t errlen);
/* Start a fork server from fs->exe_fd: fork, execveat with FS_ARGV and a
 * fixed minimal environment (no fd but 0-2 and the control socket as 3, no
 * ignored signal, no blocked one cross), then send it
 * config_for_forkserver(cfg). Does not wait: fs->ctl_fd (non-blocking) is
 * readable once the ready record is there (fs_client_ready). 0, or -errno
 * with a reason (nothing left running). */
int fs_client_launch(const struct config *cfg, struct fs_client *fs, char *err, size_t errlen);
/* Take the ready record a launched fork server sends once its interpreter
 * is initialised and its policy compiled: 1 ready, 0 not yet, or -errno
 * with a reason (the fork server's own when it sent one); it has then been
 * stopped and reaped. */
int fs_client_ready(struct fs_client *fs, char *err, size_t errlen);
/* fs_client_open + fs_client_launch + wait (at most 30 s) for
 * fs_client_ready: the supervisor's first start, before it reads the
 * token. 0, or -errno with a reason (fs then holds nothing). */
int fs_client_start(const struct config *cfg, struct fs_client *fs, char *err, size_t errlen);
/* Queue one spawn request; 0, -EAGAIN if the socket is full, or -errno. */
int fs_client_request(struct fs_client *fs, uint64_t turn_id);
/* Read one reply. 1 with *rep filled (and, when rep->status == 0, the
 * caller owns *chan_fd and *pidfd), 0 if none is ready, or -errno if the fork
 * server is gone or broke the protocol (the supervisor then restarts it). */
int fs_client_reply(struct fs_client *fs, struct fs_reply *rep, int *chan_fd, int *pidfd);
/* A fork server that is gone or broken: SIGKILL it (if it still runs) and
 * reap it, close the control socket; exe_fd stays for the next launch. */
void fs_client_kill(struct fs_client *fs);
/* The end: close the control socket (the fork server then kills its
 * sandboxes and exits), wait up to 2 s for it, SIGKILL if need be; close
 * exe_fd. */
void fs_client_stop(struct fs_client *fs);


/* --- fork server side (forkbox-sandbox only) --- */

/* forkbox-sandbox's entry point: ctl_fd is the control socket, on which the
 * configuration arrives first. Never returns. */
_Noreturn void forkserver_main(int ctl_fd);
