/* The daemon's metrics and the per-turn end line (see metrics.h). Runs in
 * the supervisor. */
#include "session/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/limits.h"
#include "core/log.h"
#include "core/util.h"
#include "sandbox/policy.h"

/* Bucket bounds in the unit observed (ns or bytes); the text says seconds. */
#define HIST_MAX_BUCKETS 20

struct hist {
    const char *name, *help;
    double scale;                 /* observed unit -> exposed unit (1e-9: ns -> s) */
    size_t n;                     /* bounds used */
    uint64_t le[HIST_MAX_BUCKETS]; /* upper bounds, ascending, in the observed unit */
    uint64_t count[HIST_MAX_BUCKETS]; /* observations <= le[i] and > le[i-1] */
    uint64_t total;               /* every observation (the +Inf bucket) */
    double sum;                   /* in the exposed unit */
};

#define MS 1000000ULL /* ns */
#define SEC (1000 * MS)

/* One pending end line: a turn whose sandbox's death report is due. */
struct pending {
    struct turn_stats st;
    uint64_t deadline_ns;
};

enum kill_cause { KILL_TIMEOUT, KILL_MEMORY, KILL_PIDS, KILL_COUNT };
static const char *const kill_cause_name[KILL_COUNT] = {"timeout", "memory", "pids"};

#define HTTP_STATUS_MAX 600

static struct metrics {
    unsigned pool_size;               /* --pool: what the fork server is asked to keep */
    struct metrics_tenant *tenants;   /* borrowed: the rows of the tenant label (turns) */
    struct metrics_tenant *tenants_tail;
    uint64_t http_refusals[HTTP_STATUS_MAX]; /* by status */
    uint64_t spawned;                 /* sandboxes handed to turns */
    uint64_t killed[KILL_COUNT];      /* sandboxes killed, by cause */
    uint64_t seccomp[POLICY_NR_MAX];  /* counted refusals by native syscall number */
    uint64_t seccomp_other;           /* ... of a number outside the table */
    uint64_t tool_calls, blocks;
    uint64_t bytes_in, bytes_out;     /* client <-> supervisor, counted as turns end */
    uint64_t forkserver_restarts;
    uint64_t close_pending, close_slow, close_leaked, log_dropped; /* metrics_helpers */
    uint64_t cgroups_waiting;         /* the cgroup helper's last count (FS_REPLY_CGROUPS) */
    struct hist ready, block, peak, loop;
    struct pending *pending;          /* owned: end lines waiting for a death report */
    size_t n_pending, cap_pending;
} m;

static const char *const end_names[TURN_END_COUNT] = {
    [TURN_END_NONE] = "none",
    [TURN_END_OK] = "ok",
    [TURN_END_CLIENT_CLOSED] = "client_closed",
    [TURN_END_CLIENT_ERROR] = "client_error",
    [TURN_END_TIMEOUT] = "timeout",
    [TURN_END_MEMORY] = "memory",
    [TURN_END_PIDS] = "pids",
    [TURN_END_CRASH] = "crash",
    [TURN_END_KILLED] = "killed",
    [TURN_END_EXITED] = "exited",
    [TURN_END_SANDBOX_ERROR] = "sandbox_error",
    [TURN_END_PROTOCOL_ERROR] = "protocol_error",
    [TURN_END_OVERLOAD] = "overload",
    [TURN_END_FORKSERVER_LOST] = "forkserver_lost",
    [TURN_END_DRAINED] = "drained",
    [TURN_END_ERROR] = "error",
};

const char *turn_end_name(enum turn_end e)
{
    return e < TURN_END_COUNT ? end_names[e] : "error";
}

static void hist_init(struct hist *h, const char *name, const char *help, double scale,
                      const uint64_t *le, size_t n)
{
    *h = (struct hist){.name = name, .help = help, .scale = scale, .n = n};
    memcpy(h->le, le, n * sizeof *le);
}

static void hist_observe(struct hist *h, uint64_t v)
{
    size_t i = 0;
    while (i < h->n && v > h->le[i])
        i++;
    if (i < h->n)
        h->count[i]++;
    h->total++;
    h->sum += (double)v * h->scale;
}

void metrics_reset(void)
{
    free(m.pending);
    memset(&m, 0, sizeof m); /* the tenants' rows are theirs: forgotten, not freed */
    /* From 1 ms (a pooled sandbox's ready) to a minute (a fresh clone on a
     * host thrashing); blocks up to the default --block-timeout and past. */
    static const uint64_t ready_le[] = {
        1 * MS, 2 * MS + MS / 2, 5 * MS, 10 * MS, 25 * MS, 50 * MS, 100 * MS, 250 * MS,
        500 * MS, 1 * SEC, 2 * SEC + SEC / 2, 5 * SEC, 10 * SEC, 30 * SEC, 60 * SEC};
    static const uint64_t block_le[] = {
        1 * MS, 5 * MS, 10 * MS, 50 * MS, 100 * MS, 500 * MS, 1 * SEC, 5 * SEC, 10 * SEC,
        30 * SEC, 60 * SEC, 300 * SEC, 900 * SEC, 3600 * SEC};
    /* An iteration of the event loop: tens of microseconds usually; from
     * LOOP_SLOW_MS on it is logged, and everything waited that long. */
    static const uint64_t loop_le[] = {
        MS / 20, MS / 10, MS / 4, MS / 2, 1 * MS, 2 * MS + MS / 2, 5 * MS, 10 * MS, 25 * MS,
        50 * MS, 100 * MS, 250 * MS, 500 * MS, 1 * SEC, 5 * SEC};
    /* Powers of 4 from 1 MiB to 64 GiB, whatever --memory is. */
    static const uint64_t peak_le[] = {
        MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB, 4096 * MiB,
        16384 * MiB, 65536 * MiB};
#define N(a) (sizeof a / sizeof *a)
    hist_init(&m.ready, "forkbox_turn_ready_seconds",
              "Time from a turn's upgrade to its sandbox's ready frame.", 1e-9, ready_le,
              N(ready_le));
    hist_init(&m.block, "forkbox_block_duration_seconds",
              "Time from a block's run to its last frame (or its timeout).", 1e-9, block_le,
              N(block_le));
    hist_init(&m.peak, "forkbox_turn_peak_memory_bytes",
              "Most memory a turn's cgroup held during the turn (turns whose peak is known).",
              1, peak_le, N(peak_le));
    hist_init(&m.loop, "forkbox_loop_iteration_seconds",
              "Busy time of one event-loop iteration (everything waits while it runs).", 1e-9,
              loop_le, N(loop_le));
#undef N
}

void metrics_init(unsigned pool_size)
{
    metrics_reset();
    m.pool_size = pool_size;
}

/* ---------------------------------------------------------------- counting */

void turn_stats_end(struct turn_stats *st, enum turn_end e)
{
    if (st->end == TURN_END_NONE)
        st->end = e;
}

void metrics_tenant_add(struct metrics_tenant *mt, const char *name)
{
    *mt = (struct metrics_tenant){.name = name, .prev = m.tenants_tail};
    if (m.tenants_tail)
        m.tenants_tail->next = mt;
    else
        m.tenants = mt;
    m.tenants_tail = mt;
}

void metrics_tenant_remove(struct metrics_tenant *mt)
{
    if (mt->prev)
        mt->prev->next = mt->next;
    else if (m.tenants == mt)
        m.tenants = mt->next;
    if (mt->next)
        mt->next->prev = mt->prev;
    else if (m.tenants_tail == mt)
        m.tenants_tail = mt->prev;
    mt->prev = mt->next = NULL;
}

void metrics_turn_begin(struct metrics_tenant *mt) { mt->active++; }
void metrics_tenant_refused(struct metrics_tenant *mt) { mt->refused++; }
void metrics_turn_ready(uint64_t latency_ns) { hist_observe(&m.ready, latency_ns); }
void metrics_loop_iteration(uint64_t busy_ns) { hist_observe(&m.loop, busy_ns); }

void metrics_helpers(uint64_t close_pending, uint64_t close_slow, uint64_t close_leaked,
                     uint64_t log_dropped)
{
    m.close_pending = close_pending;
    m.close_slow = close_slow;
    m.close_leaked = close_leaked;
    m.log_dropped = log_dropped;
}
void metrics_sandbox_spawned(void) { m.spawned++; }
void metrics_tool_call(void) { m.tool_calls++; }
void metrics_forkserver_restart(void) { m.forkserver_restarts++; }
void metrics_cgroups_waiting(unsigned n) { m.cgroups_waiting = n; }

void metrics_block_done(uint64_t dur_ns)
{
    m.blocks++;
    hist_observe(&m.block, dur_ns);
}

void metrics_http_refusal(int status)
{
    if (status >= 100 && status < HTTP_STATUS_MAX)
        m.http_refusals[status]++;
}

void metrics_seccomp_refusal(int nr)
{
    if (nr >= 0 && nr < POLICY_NR_MAX)
        m.seccomp[nr]++;
    else
        m.seccomp_other++;
}

/* The end line (item 6 of issue 15): one per turn, at info, with the same
 * end and tenant values as the labels. Never the token, nor anything a peer
 * wrote: the peer is the socket's address, the tenant a name from the token
 * file. */
static void log_turn_end(const struct turn_stats *st)
{
    char peak[32] = "unknown";
    if (st->peak_known && st->mem_peak)
        snprintf(peak, sizeof peak, "%" PRIu64, st->mem_peak);
    LOG_I("turn %" PRIu64 ": end=%s tenant=%s peer=%s duration=%.3fs blocks=%" PRIu64
          " tool_calls=%" PRIu64 " peak_memory=%s refused_syscalls=%" PRIu64 " bytes_in=%" PRIu64
          " bytes_out=%" PRIu64,
          st->id, turn_end_name(st->end), st->tenant[0] ? st->tenant : "unknown",
          st->peer[0] ? st->peer : "unknown",
          (double)(now_ns() - st->started_ns) / 1e9, st->blocks, st->tool_calls, peak,
          st->refusals, st->bytes_in, st->bytes_out);
}

static void peak_done(struct turn_stats *st)
{
    if (st->peak_known && st->mem_peak)
        hist_observe(&m.peak, st->mem_peak);
    log_turn_end(st);
}

void metrics_turn_end(const struct turn_stats *in, struct metrics_tenant *mt)
{
    struct turn_stats st = *in;
    if (st.end == TURN_END_NONE)
        st.end = TURN_END_ERROR;
    if (mt->active)
        mt->active--;
    mt->turns[st.end]++;
    m.bytes_in += st.bytes_in;
    m.bytes_out += st.bytes_out;
    if (st.sandbox) {
        if (st.end == TURN_END_TIMEOUT)
            m.killed[KILL_TIMEOUT]++;
        else if (st.end == TURN_END_MEMORY)
            m.killed[KILL_MEMORY]++;
        else if (st.end == TURN_END_PIDS)
            m.killed[KILL_PIDS]++;
    }
    if (!st.sandbox || st.peak_known) {
        peak_done(&st);
        return;
    }
    /* The line waits for the peak: the report comes once the fork server
     * has reaped the sandbox (milliseconds after its kill). Bounded: when
     * full, the oldest goes out without it. */
    if (m.n_pending == METRICS_PENDING_MAX) {
        peak_done(&m.pending[0].st);
        memmove(m.pending, m.pending + 1, --m.n_pending * sizeof *m.pending);
    }
    if (m.n_pending == m.cap_pending) {
        size_t cap = m.cap_pending ? m.cap_pending * 2 : 16;
        struct pending *p = realloc(m.pending, cap * sizeof *p);
        if (!p) {
            peak_done(&st);
            return;
        }
        m.pending = p;
        m.cap_pending = cap;
    }
    m.pending[m.n_pending++] =
        (struct pending){.st = st, .deadline_ns = now_ns() + METRICS_PENDING_WAIT_MS * MS};
}

static void pending_drop(size_t i)
{
    memmove(m.pending + i, m.pending + i + 1, (m.n_pending - i - 1) * sizeof *m.pending);
    m.n_pending--;
}

void metrics_death_report(uint64_t turn_id, uint64_t mem_peak)
{
    for (size_t i = 0; i < m.n_pending; i++) {
        if (m.pending[i].st.id != turn_id)
            continue;
        m.pending[i].st.peak_known = true;
        m.pending[i].st.mem_peak = mem_peak;
        peak_done(&m.pending[i].st);
        pending_drop(i);
        return;
    }
}

size_t metrics_pending(void)
{
    return m.n_pending;
}

void metrics_tick(uint64_t now)
{
    /* In deadline order: appended as turns end. */
    while (m.n_pending && now >= m.pending[0].deadline_ns) {
        peak_done(&m.pending[0].st);
        pending_drop(0);
    }
}

/* ---------------------------------------------------------------- the text format */

int prom_escape(struct buf *out, const char *s, bool label_value)
{
    int r = 0;
    for (const char *p = s; *p && r == 0; p++) {
        if (*p == '\\')
            r = buf_append(out, "\\\\", 2);
        else if (*p == '\n')
            r = buf_append(out, "\\n", 2);
        else if (*p == '"' && label_value)
            r = buf_append(out, "\\\"", 2);
        else
            r = buf_append(out, p, 1);
    }
    return r;
}

void prom_float(char out[32], double v)
{
    if (isnan(v)) {
        strcpy(out, "NaN");
        return;
    }
    if (isinf(v)) {
        strcpy(out, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    /* The shortest of %.1g .. %.17g that reads back as v: 0.0025, not
     * 0.0025000000000000001; 1048576, not 1.04858e+06. */
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, 32, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

static int family(struct buf *out, const char *name, const char *type, const char *help)
{
    int r = buf_printf(out, "# HELP %s ", name);
    r = r ? r : prom_escape(out, help, false);
    return r ? r : buf_printf(out, "\n# TYPE %s %s\n", name, type);
}

/* One sample: name, n label pairs kv[0..2n) (key, value: escaped), a value. */
static int sample_kv(struct buf *out, const char *name, const char *const *kv, size_t n, double v)
{
    char num[32];
    prom_float(num, v);
    int r = buf_printf(out, "%s", name);
    for (size_t i = 0; i < n && r == 0; i++) {
        r = buf_printf(out, "%s%s=\"", i ? "," : "{", kv[2 * i]);
        r = r ? r : prom_escape(out, kv[2 * i + 1], true);
        r = r ? r : buf_printf(out, "\"%s", i + 1 == n ? "}" : "");
    }
    return r ? r : buf_printf(out, " %s\n", num);
}

/* One sample with one label (key NULL: none). */
static int sample(struct buf *out, const char *name, const char *key, const char *val, double v)
{
    const char *kv[2] = {key, val};
    return sample_kv(out, name, kv, key ? 1 : 0, v);
}

static int counter(struct buf *out, const char *name, const char *help, uint64_t v)
{
    int r = family(out, name, "counter", help);
    return r ? r : sample(out, name, NULL, NULL, (double)v);
}

static int gauge(struct buf *out, const char *name, const char *help, uint64_t v)
{
    int r = family(out, name, "gauge", help);
    return r ? r : sample(out, name, NULL, NULL, (double)v);
}

static int histogram(struct buf *out, const struct hist *h)
{
    char le[32], name[96];
    int r = family(out, h->name, "histogram", h->help);
    snprintf(name, sizeof name, "%s_bucket", h->name);
    uint64_t cum = 0;
    for (size_t i = 0; i < h->n && r == 0; i++) {
        cum += h->count[i];
        prom_float(le, (double)h->le[i] * h->scale);
        r = sample(out, name, "le", le, (double)cum);
    }
    r = r ? r : sample(out, name, "le", "+Inf", (double)h->total);
    snprintf(name, sizeof name, "%s_sum", h->name);
    r = r ? r : sample(out, name, NULL, NULL, h->sum);
    snprintf(name, sizeof name, "%s_count", h->name);
    return r ? r : sample(out, name, NULL, NULL, (double)h->total);
}

/* Label texts of the labelled families: NULL to leave index i out. */
static const char *status_label(size_t i, char *tmp, size_t len)
{
    snprintf(tmp, len, "%zu", i);
    return tmp;
}

static const char *cause_label(size_t i, char *tmp, size_t len)
{
    return kill_cause_name[i];
}

static const char *syscall_label(size_t i, char *tmp, size_t len)
{
    return policy_syscall_name((int)i, tmp, len);
}

/* A counter family with one label, a sample per index of v[0..n): every
 * index (zeros) or only those counted at least once, so that a label set
 * as large as the syscall table lists only what happened. */
static int labelled(struct buf *out, const char *name, const char *help, const char *key,
                    const uint64_t *v, size_t n, bool zeros,
                    const char *(*label)(size_t i, char *tmp, size_t len))
{
    int r = family(out, name, "counter", help);
    for (size_t i = 0; i < n && r == 0; i++) {
        char tmp[64];
        const char *l = (v[i] || zeros) ? label(i, tmp, sizeof tmp) : NULL;
        if (l)
            r = sample(out, name, key, l, (double)v[i]);
    }
    return r;
}

/* The turn families, a row per tenant (bounded by the token file's
 * TOKENS_MAX, and the tenants removed from it that still run turns). */
static int tenant_families(struct buf *out)
{
    const struct metrics_tenant *t;
    int r = family(out, "forkbox_turns_active", "gauge", "Turns admitted and not ended, by tenant.");
    for (t = m.tenants; t && r == 0; t = t->next)
        r = sample(out, "forkbox_turns_active", "tenant", t->name, (double)t->active);
    r = r ? r : family(out, "forkbox_turns_total", "counter",
                       "Turns ended, by tenant and how they ended.");
    for (t = m.tenants; t && r == 0; t = t->next)
        for (size_t e = TURN_END_NONE + 1; e < TURN_END_COUNT && r == 0; e++) {
            const char *kv[4] = {"tenant", t->name, "end", end_names[e]};
            r = sample_kv(out, "forkbox_turns_total", kv, 2, (double)t->turns[e]);
        }
    r = r ? r : family(out, "forkbox_tenant_refusals_total", "counter",
                       "Upgrades refused with 429 at --tenant-capacity, by tenant.");
    for (t = m.tenants; t && r == 0; t = t->next)
        r = sample(out, "forkbox_tenant_refusals_total", "tenant", t->name, (double)t->refused);
    return r;
}

int metrics_write(struct buf *out)
{
    int r = tenant_families(out);
    r = r ? r : labelled(out, "forkbox_http_refusals_total",
                         "Requests on the public port answered with an error status.", "status",
                         m.http_refusals, HTTP_STATUS_MAX, false, status_label);
    r = r ? r : histogram(out, &m.ready);
    r = r ? r : histogram(out, &m.block);
    r = r ? r : histogram(out, &m.peak);
    r = r ? r : histogram(out, &m.loop);
    r = r ? r : counter(out, "forkbox_blocks_total", "Blocks ended.", m.blocks);
    r = r ? r : gauge(out, "forkbox_pool_size",
                      "Sandboxes the fork server is configured to keep warm (--pool; the "
                      "supervisor is not told how many are ready now).", m.pool_size);
    r = r ? r : counter(out, "forkbox_sandboxes_spawned_total",
                        "Sandboxes the fork server handed to turns.", m.spawned);
    r = r ? r : labelled(out, "forkbox_sandboxes_killed_total",
                         "Sandboxes that ended their turn at a limit, by the limit.", "cause",
                         m.killed, KILL_COUNT, true, cause_label);
    /* Refusals of a number outside the table (none on x86_64: foreign ABIs
     * are killed) are summed as "other". */
    r = r ? r : labelled(out, "forkbox_seccomp_refusals_total",
                         "System calls refused by the policy's counted (deny) rules, by call.",
                         "syscall", m.seccomp, POLICY_NR_MAX, false, syscall_label);
    if (r == 0 && m.seccomp_other)
        r = sample(out, "forkbox_seccomp_refusals_total", "syscall", "other",
                   (double)m.seccomp_other);
    r = r ? r : counter(out, "forkbox_tool_calls_total", "Tool calls relayed to clients.",
                        m.tool_calls);
    r = r ? r : counter(out, "forkbox_client_received_bytes_total",
                        "WebSocket bytes read from clients (counted as each turn ends).",
                        m.bytes_in);
    r = r ? r : counter(out, "forkbox_client_sent_bytes_total",
                        "WebSocket bytes written to clients (counted as each turn ends).",
                        m.bytes_out);
    r = r ? r : counter(out, "forkbox_forkserver_restarts_total",
                        "Times the fork server was started again after it died.",
                        m.forkserver_restarts);
    r = r ? r : gauge(out, "forkbox_closer_pending",
                      "fds a sandbox chose (or could have) waiting for the closer thread.",
                      m.close_pending);
    r = r ? r : counter(out, "forkbox_closer_slow_total",
                        "Closes on the closer thread that took 100 ms or more.", m.close_slow);
    r = r ? r : counter(out, "forkbox_closer_leaked_total",
                        "fds left open for good: the closer thread's queue was full.",
                        m.close_leaked);
    r = r ? r : counter(out, "forkbox_log_lines_dropped_total",
                        "Operator log lines dropped: stderr was not read fast enough.",
                        m.log_dropped);
    r = r ? r : gauge(out, "forkbox_turn_cgroups_waiting",
                      "Turn cgroups not removed yet (tasks still in them, a read-only hierarchy, "
                      "an earlier daemon's): retried until they go.", m.cgroups_waiting);
    return r;
}
