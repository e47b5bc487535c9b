/* Runs in the fork server, the sandbox child and its runtime: the record of
 * when each step of one fresh spawn ran and what CPU it took, for
 * benchmarks only (--step-times; forkbox-bench --rows steps).
 *
 * Off (the default), steptime_mark() is one test of a static int. On, the
 * fork server keeps the read end of a pipe per spawn; the child marks its
 * steps (steps.c, mounts_enter.c) and the runtime its start and first block
 * (pyrt) in a static record, and writes the record to the pipe once, as the
 * first block's snapshot is about to go (or never), then closes it. The fork
 * server reads it when it reaps the sandbox (one non-blocking read of exactly
 * one record, else nothing), adds its own marks and the reap, and logs one
 * debug line (forkserver.c). The record is numbers the sandbox wrote: the
 * fork server prints them and trusts nothing else of it. The first block's
 * code can reach the pipe (it is an fd of the runtime until the snapshot): a
 * benchmark setting, not for production.
 *
 * Times are CLOCK_MONOTONIC (one clock for every process); CPU is the
 * marking process's (CLOCK_PROCESS_CPUTIME_ID), and so are its page faults
 * (minor: copy-on-write and first touch), both made cumulative across the
 * split of init and runtime (steptime_split). */
#pragma once
#include <stdint.h>

/* The marks of one spawn, in the order they happen. P_: the fork server;
 * C_: the child, before the runtime; R_: the runtime. A step's cost is the
 * difference to the mark before it in the same process. */
enum steptime_mark {
    ST_P_REQUEST,   /* fork server: the spawn request was read */
    ST_P_CLONE,     /* ... about to clone (ids, socketpair, pipes done) */
    ST_P_CLONED,    /* ... clone returned */
    ST_P_MAPS,      /* ... id maps written */
    ST_P_HANDOFF,   /* ... placement queued, channel and pidfd sent to the supervisor */
    ST_C_START,     /* child: clone returned in it */
    ST_C_IDS,       /* step 2 done: the id maps waited for, ids, dumpable */
    ST_C_ROOT,      /* step 3: our copy of the template's mounts made private */
    ST_C_SCRATCH,   /* ... the scratch tmpfs and its binds */
    ST_C_TOOLS,     /* ... the tools tmpfs and its read-only bind */
    ST_C_PROC,      /* ... a fresh proc */
    ST_C_COVERS,    /* ... its covers, moved to /proc: step 3 done */
    ST_C_GO,        /* step 4: hostname, per-userns caps, then the placer's go read
                       (cgroups in place) */
    ST_C_NAMESPACES, /* ... the cgroup namespace: step 4 done */
    ST_C_FDS,       /* step 6 */
    ST_C_PRIVS,     /* step 7: setsid, capabilities */
    ST_C_SECCOMP,   /* step 8: filter loaded, listener sent */
    ST_C_RLIMITS,   /* step 5 (runs after 8) */
    ST_C_INIT,      /* step 9: init split off; from here the runtime (pid 2) */
    ST_R_AFTERFORK, /* the interpreter re-armed (PyOS_AfterFork_Child) */
    ST_R_SERVE,     /* pyrt_serve: stdio, workspace */
    ST_R_TOOLS,     /* the tools archive was read (pyrt_tools_and_ready) */
    ST_R_READY,     /* tools extracted (ready is sent next) */
    ST_R_RUN,       /* the first run came: reader thread, the interpreter's loop,
                       the workspace archive */
    ST_R_DONE,      /* its code ran, done sent */
    ST_R_SNAPSHOT,  /* output sent, snapshot made: the record goes (then the snapshot) */
    ST_N
};

/* Name of a mark in the log line (forkserver.c), forkbox-bench reads them. */
extern const char *const steptime_names[ST_N];

struct steptime_rec {
    uint64_t wall[ST_N]; /* CLOCK_MONOTONIC ns; 0: not reached */
    uint64_t cpu[ST_N];  /* CPU ns of the marking process (cumulative in the child) */
    uint64_t flt[ST_N];  /* its minor page faults (likewise) */
};

/* The child's pipe end; -1: off (the default, and in the fork server). */
extern int steptime_fd;

/* Child: mark `m` now, if on. */
void steptime_mark(enum steptime_mark m);
/* Child, step 9: the runtime is a new process whose CPU starts at 0; carry
 * the setup's CPU over (init and the runtime share this memory). */
void steptime_split(void);
/* Runtime: write the record (once) and close the pipe. */
void steptime_send(void);
/* Fork server: mark `m` of a spawn in its copy, rec. */
void steptime_mark_rec(struct steptime_rec *rec, enum steptime_mark m);
