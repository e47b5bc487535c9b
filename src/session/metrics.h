/* The daemon's metrics and the per-turn end line. Runs in the supervisor.
 *
 * One process-wide struct (metrics.c) holds every counter: what the
 * supervisor itself sees (turns, refusals, bytes, tool calls, seccomp
 * refusals it answers) and what the fork server's death reports tell (peak
 * memory); the turn counters are by tenant, in rows each tenant's record
 * holds (session/tenants.h) and the struct lists. A session fills a struct turn_stats while its turn runs and hands
 * it over when the turn ends (metrics_turn_end); the totals are bumped at
 * once, and the turn's log line is written when its sandbox's death report
 * has arrived (it carries the peak memory), or after METRICS_PENDING_WAIT_MS
 * without it.
 *
 * metrics_write() renders everything in the Prometheus text exposition
 * format, version 0.0.4 (hand-written: Debian packages no C client library;
 * prometheus-cpp is C++). The HTTP side is metrics_http.h.
 *
 * Global rather than passed around: the counters are bumped from the
 * session's files, notify.c and server.c (and the fork server's restart
 * path), which share nothing else; a single-threaded loop needs no locking. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/limits.h"

struct policy_notify;

/* How a turn ended: the `end` label and the end line's end=. A small fixed
 * set (never text from a peer); docs/operating.md "Metrics" lists what each means. */
enum turn_end {
    TURN_END_NONE = 0,        /* not ended (yet) */
    TURN_END_OK,              /* the client's shutdown, or its normal close */
    TURN_END_CLIENT_CLOSED,   /* the client went away (EOF, reset, no pong) */
    TURN_END_CLIENT_ERROR,    /* the client broke the protocol or a limit (1002, 1009, ...) */
    TURN_END_TIMEOUT,         /* --block-timeout, --turn-timeout or --idle-timeout */
    TURN_END_MEMORY,          /* its sandbox was OOM-killed at --memory */
    TURN_END_PIDS,            /* its sandbox died after reaching --pids */
    TURN_END_CRASH,           /* its sandbox crashed (SIGSEGV, SIGABRT, SIGSYS, ...) */
    TURN_END_KILLED,          /* its sandbox was killed by another signal */
    TURN_END_EXITED,          /* its sandbox exited, or stopped with no death report */
    TURN_END_SANDBOX_ERROR,   /* its sandbox reported a setup or archive error */
    TURN_END_PROTOCOL_ERROR,  /* its sandbox broke the channel protocol (or its snapshot) */
    TURN_END_OVERLOAD,        /* the daemon's buffer budget was exhausted (1013) */
    TURN_END_FORKSERVER_LOST, /* no sandbox service (the fork server is gone) */
    TURN_END_DRAINED,         /* closed as the daemon stopped (1001) */
    TURN_END_ERROR,           /* any other server-side failure (1011) */
    TURN_END_COUNT
};
const char *turn_end_name(enum turn_end e);

/* One tenant's row of the `tenant` label: its turn counters, embedded in
 * its record (session/tenants.h), which adds it when made and removes it
 * when it goes; /metrics shows the rows there are, in that order. */
struct metrics_tenant {
    const char *name;             /* borrowed: the record's */
    uint64_t active;              /* turns admitted and not ended */
    uint64_t turns[TURN_END_COUNT]; /* turns ended, by how */
    uint64_t refused;             /* upgrades refused 429 at --tenant-capacity */
    struct metrics_tenant *prev, *next; /* in the rows shown */
};

/* What one turn did, filled by its session (session_int.h, turn.c). */
struct turn_stats {
    uint64_t id;                  /* the turn's (connection's) id */
    char peer[64];                /* the client's address:port, as the socket says */
    char tenant[TENANT_NAME_MAX + 1]; /* its tenant's name (tenants.h), for the end line */
    uint64_t started_ns;          /* upgrade accepted */
    uint64_t ready_ns;            /* its sandbox's ready frame (0: none) */
    uint64_t block_started_ns;    /* the block running now (0: none) */
    uint64_t blocks;              /* blocks run (each `run` forwarded) */
    uint64_t tool_calls;          /* tool_call frames relayed to the client */
    uint64_t bytes_in, bytes_out; /* the client's WebSocket stream, both ways */
    uint64_t refusals;            /* system calls refused by the policy (counted ones) */
    enum turn_end end;            /* how it ended: the first cause set wins */
    bool sandbox;                 /* a sandbox was handed to it: a death report will come */
    bool peak_known;              /* mem_peak holds the death report's figure */
    uint64_t mem_peak;            /* bytes, from the death report (0: unknown) */
};

/* Set the configuration's facts (pool size), once at start. */
void metrics_init(unsigned pool_size);

/* Set e as st's end unless one is set already (the first cause wins). */
void turn_stats_end(struct turn_stats *st, enum turn_end e);
/* Show mt (borrowed until metrics_tenant_remove) as the row of the tenant
 * called name (borrowed as long), zeros to begin with. */
void metrics_tenant_add(struct metrics_tenant *mt, const char *name);
void metrics_tenant_remove(struct metrics_tenant *mt);
/* A turn of mt's tenant was admitted / its sandbox said ready (ready
 * latency) / a block ended after dur_ns (its duration histogram). */
void metrics_turn_begin(struct metrics_tenant *mt);
void metrics_turn_ready(uint64_t latency_ns);
void metrics_block_done(uint64_t dur_ns);
/* A turn of mt's tenant ended (st->end set, TURN_END_ERROR if not): the
 * totals move now; its log line is written now if no death report is due
 * (no sandbox, or the report came already), else when
 * metrics_death_report() brings it. st is copied. */
void metrics_turn_end(const struct turn_stats *st, struct metrics_tenant *mt);
/* An upgrade of mt's tenant was refused with 429 (--tenant-capacity). */
void metrics_tenant_refused(struct metrics_tenant *mt);
/* The fork server's death report for turn_id: its sandbox's peak memory.
 * Writes the pending end line of that turn, if one waits. */
void metrics_death_report(uint64_t turn_id, uint64_t mem_peak);
/* Write the end lines that waited too long for their death report
 * (UINT64_MAX: all of them, at exit). */
void metrics_tick(uint64_t now_ns);
/* End lines still waiting for a death report. */
size_t metrics_pending(void);

void metrics_http_refusal(int status);  /* a non-101, non-200 answer on the public port */
void metrics_sandbox_spawned(void);     /* the fork server handed a sandbox to a turn */
void metrics_tool_call(void);
void metrics_seccomp_refusal(int nr);   /* a counted refusal of native syscall nr */
/* The fork server was started again after it died (the restart path calls
 * this; nothing else does). */
void metrics_forkserver_restart(void);
/* One event-loop iteration's busy time (loop_set_stats). */
void metrics_loop_iteration(uint64_t busy_ns);
/* The supervisor's helper threads' counts, copied in by the server's tick
 * (loop/closer.h, loop/logq.h): fds waiting to be closed, closes that took
 * long, fds left open for good, log lines dropped. */
void metrics_helpers(uint64_t close_pending, uint64_t close_slow, uint64_t close_leaked,
                     uint64_t log_dropped);
/* How many turn cgroups the fork server's cgroup helper could not remove yet
 * (its FS_REPLY_CGROUPS report). */
void metrics_cgroups_waiting(unsigned n);

/* Append the exposition text (format 0.0.4) of every metric to out. 0 or
 * buf_append's error (-ENOBUFS past out's ceiling, -ENOMEM). */
int metrics_write(struct buf *out);

/* The text format's pieces (for the unit test). Label values and HELP text
 * are escaped as the format says: \\ and \n, and in label values also \". */
int prom_escape(struct buf *out, const char *s, bool label_value);
/* A float as the format writes it: the shortest text that reads back as v,
 * "+Inf", "-Inf" or "NaN". */
void prom_float(char out[32], double v);
/* Back to zero (for the unit test). */
void metrics_reset(void);
