/* Used in the supervisor (fs_client_*, fsclient.c) and the fork server
 * (forkserver_main, forkserver.c): starting the fork server and talking to
 * it (the records: fsproto.h, which says what the fork server is). */
#pragma once
#include <sys/types.h>

#include "config/config.h"
#include "sandbox/fsproto.h"

/* --- supervisor side --- */

struct fs_client {
    int ctl_fd;  /* owned; non-blocking SEQPACKET to the fork server */
    pid_t pid;   /* the fork server */
};

/* The fork server's whole command line (and so every sandbox's
 * /proc/self/cmdline): a marker forkbox-sandbox checks, nothing configured.
 * argv[0] stays "forkboxd": what sandboxes see did not change when the fork
 * server became an executable of its own. */
#define FS_ARGV_FLAG "--internal-forkserver"
#define FS_ARGV {"forkboxd", FS_ARGV_FLAG, NULL}

/* Start the fork server (forkbox-sandbox, opened and checked here, exec'd
 * by its fd with FS_ARGV: --sandbox-exe, else the build tree's when this is
 * the build tree's forkboxd, else the installed one), send it
 * config_for_forkserver(cfg), and wait until it reports that it is ready
 * (interpreter initialised, policy compiled) or failed. 0, or -errno with a
 * message in err (the fork server's own reason when it sent one). */
int fs_client_start(const struct config *cfg, struct fs_client *fs, char *err, size_t errlen);
/* Queue one spawn request; 0, -EAGAIN if the socket is full, or -errno. */
int fs_client_request(struct fs_client *fs, uint64_t turn_id);
/* Read one reply. 1 with *rep filled (and, when rep->status == 0, the
 * caller owns *chan_fd and *pidfd), 0 if none is ready, or -errno if the fork
 * server is gone (fatal for the daemon). */
int fs_client_reply(struct fs_client *fs, struct fs_reply *rep, int *chan_fd, int *pidfd);
void fs_client_stop(struct fs_client *fs);


/* --- fork server side (forkbox-sandbox only) --- */

/* forkbox-sandbox's entry point: ctl_fd is the control socket, on which the
 * configuration arrives first. Never returns. */
_Noreturn void forkserver_main(int ctl_fd);
