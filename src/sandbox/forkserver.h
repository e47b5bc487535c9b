/* Used in the supervisor (fs_client_*, fsclient.c) and the fork server
 * (forkserver_main, forkserver.c): the control socket between them.
 *
 * The fork server: the clean process sandboxes are cloned from.
 *
 * forkboxd starts it first, before it reads the token or accepts anything,
 * by fork + execve of forkbox-sandbox (a separate executable: the static,
 * non-PIE interpreter; forkboxd itself links no Python) with a minimal
 * environment, so the fork server's address space never held a secret or a
 * connection buffer. It initialises the embedded interpreter once, compiles
 * the seccomp policy, and then clones one sandbox per request. Sandboxes
 * are its children: it reaps them. The supervisor receives, per sandbox,
 * the supervisor end of the channel socketpair and a pidfd, and kills with
 * pidfd_send_signal().
 *
 * Control protocol (SOCK_SEQPACKET, one record per message):
 *   supervisor -> fork server   first, once: its struct config
 *                               (config_for_forkserver), then
 *                               struct fs_request
 *   fork server -> supervisor   struct fs_reply, with SCM_RIGHTS
 *                               {chan_fd, pidfd} when status == 0
 *                               (kind FS_REPLY_SPAWN), or unsolicited, once
 *                               a sandbox handed to a turn has been reaped,
 *                               a death report (kind FS_REPLY_DEATH, no fds)
 * Spawn replies come in request order. A death report carries only facts
 * the fork server and its cgroup helper own: the wait status of the
 * sandbox's init and the turn cgroup's counters (memory OOM kills, forks
 * refused at pids.max) over that sandbox's life; never bytes the sandbox
 * wrote. */
#pragma once
#include <stdint.h>
#include <sys/types.h>

#include "config/config.h"

enum fs_op { FS_OP_SPAWN = 1 };

struct fs_request {
    uint32_t op;      /* enum fs_op */
    uint32_t reserved;
    uint64_t turn_id; /* echoed in the reply */
};

enum fs_reply_kind { FS_REPLY_SPAWN = 0, FS_REPLY_DEATH = 1 };

struct fs_reply {
    int32_t status;   /* 0 or -errno */
    int32_t pid;      /* host pid of the sandbox (pid 1 of its namespace) */
    uint64_t turn_id;
    uint64_t spawn_ns; /* time the fork server spent (clone + parent-side setup) */
    uint32_t kind;     /* enum fs_reply_kind */
    int32_t wait_status; /* death: waitpid() status of the sandbox's init, which
                            exits with the runtime's status (steps.c, step 9) */
    uint32_t oom_kills;  /* death: OOM kills in its turn cgroup during its life */
    uint32_t pids_max;   /* death: forks refused at its pids.max during its life */
};

/* Start-up (sync 0): once the fork server has loaded the policy, prepared
 * the mounts, probed cgroups and initialised the interpreter, it sends one
 * "ready" record: a struct fs_reply with turn_id 0, pid = its own pid,
 * spawn_ns = its start-up time, status 0 or -errno; a failed start appends
 * the reason ("file:line: reason" for a policy error) as text after the
 * struct in the same record, at most FS_READY_MAX_MSG bytes, no NUL. */
#define FS_READY_MAX_MSG 1024

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
/* Read one reply. 1 with *rep filled (and *chan_fd, *pidfd owned by the
 * caller when rep->status == 0), 0 if none is ready, or -errno if the fork
 * server is gone (fatal for the daemon). */
int fs_client_reply(struct fs_client *fs, struct fs_reply *rep, int *chan_fd, int *pidfd);
void fs_client_stop(struct fs_client *fs);


/* --- fork server side (forkbox-sandbox only) --- */

/* forkbox-sandbox's entry point: ctl_fd is the control socket, on which the
 * configuration arrives first. Never returns. */
_Noreturn void forkserver_main(int ctl_fd);
