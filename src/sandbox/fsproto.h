/* The records on the control socket between the supervisor (fsclient.c)
 * and the fork server (forkserver.c, and its cgroup placer, placer.c, which
 * writes the death reports): used by all three.
 *
 * The fork server: the clean process sandboxes are cloned from.
 *
 * forkboxd starts it first, before it reads the token or accepts anything,
 * by fork + execve of python3.11, which loads forkbox-sandbox.so (forkboxd
 * itself links no Python), with a minimal environment, so the fork
 * server's address space never held a secret or a connection buffer. Its
 * interpreter starts once, it compiles
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
 *                               a death report (kind FS_REPLY_DEATH, no fds),
 *                               and when their number changes, how many
 *                               turn cgroups wait to be removed (kind
 *                               FS_REPLY_CGROUPS, no fds; the cgroup helper
 *                               sends both)
 * Spawn replies come in request order. A death report carries only facts
 * the fork server and its cgroup helper own: the wait status of the
 * sandbox's init and the turn cgroup's counters (memory OOM kills, forks
 * refused at pids.max) and its peak memory over that sandbox's life; never
 * bytes the sandbox wrote. */
#pragma once
#include <errno.h>
#include <stdint.h>
#include <sys/types.h>


enum fs_op { FS_OP_SPAWN = 1 };

struct fs_request {
    uint32_t op;      /* enum fs_op */
    uint32_t tenant;  /* the turn's tenant's number (session/tenants.h), never its name;
                         0 = none. Only the cgroup helper uses it (--cpu-share tenant) */
    uint64_t turn_id; /* echoed in the reply */
};

enum fs_reply_kind { FS_REPLY_SPAWN = 0, FS_REPLY_DEATH = 1, FS_REPLY_CGROUPS = 2 };

/* A spawn reply's status when every id of --id-range is held by a sandbox
 * not yet reaped ("too many users"; clone itself never gives it here). */
#define FS_NO_FREE_ID (-EUSERS)

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
    uint64_t mem_peak;   /* death: the most memory its turn cgroup held during its life, in
                            bytes (v1 memory.max_usage_in_bytes, v2 memory.peak); 0 =
                            unknown (no memory cgroup, or cgroups.c says why) */
    uint32_t oom_own;    /* death: its turn cgroup reached its own memory limit */
    uint32_t cgroups_waiting; /* FS_REPLY_CGROUPS: turn cgroups not removable yet (retried) */
    uint64_t oom_limit;  /* death, OOM kills without oom_own: the limit of the memory cgroup
                            above that was reached, in bytes (cgroups_above.h); 0: none
                            was, the host ran out of memory */
};

/* Start-up (sync 0): once the fork server has loaded the policy, prepared
 * the mounts, probed cgroups and initialised the interpreter, it sends one
 * "ready" record: a struct fs_reply with turn_id 0, pid = its own pid,
 * spawn_ns = its start-up time, status 0 or -errno; a failed start appends
 * the reason ("file:line: reason" for a policy error) as text after the
 * struct in the same record, at most FS_READY_MAX_MSG bytes, no NUL. */
#define FS_READY_MAX_MSG 1024
