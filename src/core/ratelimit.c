/* Rate limits for log lines (see ratelimit.h). Runs in the supervisor (and
 * in any other process that logs; each has its own static sites).
 *
 * The bucket is kept as GCRA (the "generic cell rate algorithm" of ATM, also
 * used by Redis-cell and nginx's limit_req): one timestamp, tat_ns, the time
 * at which the bucket would be full again. A line at `now` passes if
 * tat_ns - now <= (burst - 1) * T, T being the time one token takes to come
 * back, and then pushes tat_ns forward by T. That is exactly a token bucket of
 * `burst` tokens refilled every T, with integer arithmetic and no refill
 * step to run. */
#include "core/ratelimit.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "core/util.h"

#define NS_PER_MS 1000000ULL
#define NS_PER_S 1000000000ULL

/* Static call sites that dropped a line at least once: reported by
 * ratelimit_flush_sites(). Sites live as long as the process, so the list
 * only grows, by at most the number of rate-limited call sites. */
static struct ratelimit *sites;

static uint64_t emission_ns(const struct ratelimit *rl)
{
    uint32_t per = rl->per_interval ? rl->per_interval : 1;
    uint64_t t = (uint64_t)rl->interval_ms * NS_PER_MS / per;
    return t ? t : 1;
}

/* Take a token if one is free; no counting. */
static bool gcra_take(struct ratelimit *rl, uint64_t now_ns)
{
    uint64_t t = emission_ns(rl);
    uint64_t tau = t * (rl->burst ? rl->burst - 1 : 0);
    uint64_t tat = rl->tat_ns > now_ns ? rl->tat_ns : now_ns;
    if (tat - now_ns > tau)
        return false;
    rl->tat_ns = tat + t;
    return true;
}

bool ratelimit_take(struct ratelimit *rl, uint64_t now_ns)
{
    if (!gcra_take(rl, now_ns)) {
        if (rl->suppressed++ == 0)
            rl->suppressed_since_ns = now_ns;
        if (rl->is_site && !rl->listed) {
            rl->listed = true;
            rl->next_site = sites;
            sites = rl;
        }
        return false;
    }
    return true;
}

uint64_t ratelimit_take_report(struct ratelimit *rl, uint64_t now_ns, uint64_t *span_ns)
{
    uint64_t n = rl->suppressed;
    uint64_t span = now_ns > rl->suppressed_since_ns ? now_ns - rl->suppressed_since_ns : 0;
    *span_ns = n ? (span ? span : 1) : 0;
    rl->suppressed = 0;
    rl->suppressed_since_ns = 0;
    return n;
}

/* " (N similar messages suppressed in the last S s)", seconds rounded up. */
static void format_report(char *out, size_t outlen, uint64_t n, uint64_t span_ns, bool paren)
{
    uint64_t s = (span_ns + NS_PER_S - 1) / NS_PER_S;
    snprintf(out, outlen, "%s%" PRIu64 " similar message%s suppressed in the last %" PRIu64 " s%s",
             paren ? " (" : "", n, n == 1 ? "" : "s", s ? s : 1, paren ? ")" : "");
}

void ratelimit_log(struct ratelimit *rl, enum log_level lvl, const char *func, int line,
                   int errnum, const char *fmt, ...)
{
    if (lvl < log_min_level())
        return;
    rl->level = lvl;
    rl->func = func;
    rl->line = line;
    uint64_t now = now_ns();
    if (!ratelimit_take(rl, now))
        return;
    char suffix[128] = "";
    uint64_t span;
    uint64_t n = ratelimit_take_report(rl, now, &span);
    if (n)
        format_report(suffix, sizeof suffix, n, span, true);
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(lvl, func, line, errnum, suffix, fmt, ap);
    va_end(ap);
}

void ratelimit_flush(struct ratelimit *rl, uint64_t now_ns)
{
    /* The report is a line too: it needs a token (and not getting one is
     * not a dropped line). */
    if (rl->suppressed == 0 || !gcra_take(rl, now_ns))
        return;
    char msg[128];
    uint64_t span;
    uint64_t n = ratelimit_take_report(rl, now_ns, &span);
    format_report(msg, sizeof msg, n, span, false);
    log_write(rl->level, rl->func, rl->line, 0, "%s", msg);
}

void ratelimit_flush_sites(uint64_t now_ns)
{
    for (struct ratelimit *rl = sites; rl; rl = rl->next_site)
        ratelimit_flush(rl, now_ns);
}
