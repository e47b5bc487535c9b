/* Rate limits for log lines, with aggregation of what was dropped.
 *
 * A struct ratelimit is a token bucket: `burst` lines at once, refilled at
 * `per_interval` lines per `interval_ms`. A line that finds the bucket empty
 * is dropped and counted; the next line that passes carries the count
 * ("... (1234 similar messages suppressed in the last 10 s)"), and so does a
 * periodic flush (ratelimit_flush, ratelimit_flush_sites) once the flood has
 * stopped, so no count is left behind unreported. Nothing allocates.
 *
 * Two ways to hold the state:
 *   - per call site: LOG_W_RL(...) and friends keep a static struct at the
 *     site, so a call site stays one line. Static sites link themselves into
 *     one process-wide list the first time they drop a line, and
 *     ratelimit_flush_sites() (the supervisor's tick) reports them.
 *   - per object (e.g. one per turn for a sandbox's log frames): embed a
 *     struct ratelimit initialised with RATELIMIT_INIT, log through
 *     ratelimit_log(), and call ratelimit_flush() from the object's own tick
 *     and before freeing it.
 *
 * The state is per process and NOT thread-safe: the supervisor is one thread.
 * The fork server is another process and has its own static sites. */
#pragma once
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/limits.h"
#include "core/log.h"

struct ratelimit {
    uint32_t interval_ms;         /* the rate is per_interval lines per interval_ms */
    uint32_t per_interval;        /* >= 1 */
    uint32_t burst;               /* lines that may pass at once after a quiet time, >= 1 */
    bool is_site;                 /* static call-site state (may join the flush list) */
    uint64_t tat_ns;              /* GCRA "theoretical arrival time": the bucket is full
                                     again at tat_ns; 0 = never used */
    uint64_t suppressed;          /* lines dropped since the last report */
    uint64_t suppressed_since_ns; /* when the first of them was dropped */
    /* where reports go (set by ratelimit_log from its call) */
    enum log_level level;
    const char *func;             /* borrowed: __func__ of the site */
    int line;
    struct ratelimit *next_site;  /* flush list of static sites; borrowed */
    bool listed;                  /* on the flush list */
};

#define RATELIMIT_INIT(BURST, PER_INTERVAL, INTERVAL_MS)                                   \
    {.interval_ms = (INTERVAL_MS), .per_interval = (PER_INTERVAL), .burst = (BURST)}

/* Take a token at now_ns. True: the line may be written (then
 * ratelimit_take_report() says what was dropped before it). False: dropped
 * and counted. Pure accounting, no output. */
bool ratelimit_take(struct ratelimit *rl, uint64_t now_ns);

/* The number of lines dropped since the last report, and how long ago the
 * first of them was (ns, at least 1); both reset. 0 if none. */
uint64_t ratelimit_take_report(struct ratelimit *rl, uint64_t now_ns, uint64_t *span_ns);

/* log_write() behind rl, at CLOCK_MONOTONIC: the line is written if a token
 * is left, with " (N similar messages suppressed in the last S s)" appended
 * when lines were dropped before it. Lines below the log level neither
 * consume tokens nor count. */
void ratelimit_log(struct ratelimit *rl, enum log_level lvl, const char *func, int line,
                   int errnum, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* If rl dropped lines and a token is free at now_ns, write one line at the
 * site's level, function and line saying how many. Call it periodically for
 * embedded states, and once more before freeing one. */
void ratelimit_flush(struct ratelimit *rl, uint64_t now_ns);
/* The same for every static call site that ever dropped a line. */
void ratelimit_flush_sites(uint64_t now_ns);

/* One-line, rate-limited logging with a static state per call site: at most
 * LOG_RATELIMIT_BURST lines at once, then LOG_RATELIMIT_PER_INTERVAL per
 * LOG_RATELIMIT_INTERVAL_MS (core/limits.h). */
#define LOG_RL_AT(LVL, ERRNUM, ...)                                                        \
    do {                                                                                   \
        static struct ratelimit rl_site_ = {                                               \
            .interval_ms = LOG_RATELIMIT_INTERVAL_MS,                                      \
            .per_interval = LOG_RATELIMIT_PER_INTERVAL,                                    \
            .burst = LOG_RATELIMIT_BURST,                                                  \
            .is_site = true,                                                               \
        };                                                                                 \
        ratelimit_log(&rl_site_, (LVL), __func__, __LINE__, (ERRNUM), __VA_ARGS__);        \
    } while (0)
#define LOG_I_RL(...) LOG_RL_AT(LOG_LEVEL_INFO, 0, __VA_ARGS__)
#define LOG_W_RL(...) LOG_RL_AT(LOG_LEVEL_WARN, 0, __VA_ARGS__)
#define LOG_E_RL(...) LOG_RL_AT(LOG_LEVEL_ERROR, 0, __VA_ARGS__)
#define PLOG_W_RL(...) LOG_RL_AT(LOG_LEVEL_WARN, errno, __VA_ARGS__)
#define PLOG_E_RL(...) LOG_RL_AT(LOG_LEVEL_ERROR, errno, __VA_ARGS__)
