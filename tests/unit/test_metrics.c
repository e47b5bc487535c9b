/* The metrics text writer (session/metrics.c): escaping, float text,
 * cumulative histogram buckets, label sets, the tenants' rows, and the end
 * line's wait for a death report. The daemon's real output is parsed by Prometheus's own
 * parser in tests/integration/test_metrics.py. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>

#include "core/buf.h"
#include "session/metrics.h"
#include "tap.h"

/* out's text as a C string (owned by out). */
static const char *text(struct buf *out)
{
    buf_append(out, "", 1);
    out->len--;
    return (const char *)out->data;
}

static void test_escape(void)
{
    struct buf b;
    buf_init(&b, 1024);
    prom_escape(&b, "a\\b\"c\nd", true);
    is_str(text(&b), "a\\\\b\\\"c\\nd", "label value: backslash, quote and newline escaped");
    buf_reset(&b);
    prom_escape(&b, "say \"hi\"\\\n", false);
    is_str(text(&b), "say \"hi\"\\\\\\n", "HELP text: backslash and newline only");
    buf_free(&b);
}

static void test_float(void)
{
    char s[32];
    prom_float(s, 0.001);
    is_str(s, "0.001", "0.001, not 0.0010000000000000000208");
    prom_float(s, 0.0025);
    is_str(s, "0.0025", "0.0025");
    prom_float(s, 1048576);
    is_str(s, "1048576", "a power of two in bytes, not 1.04858e+06");
    prom_float(s, 68719476736.0);
    is_str(s, "68719476736", "64 GiB");
    prom_float(s, INFINITY);
    is_str(s, "+Inf", "+Inf");
    prom_float(s, NAN);
    is_str(s, "NaN", "NaN");
    prom_float(s, 2.003);
    ok(strtod(s, NULL) == 2.003, "a sum reads back exactly (%s)", s);
}

static void test_write(void)
{
    metrics_init(4);
    metrics_block_done(3000000);          /* 3 ms */
    metrics_block_done(2000000000ULL);    /* 2 s */
    metrics_http_refusal(401);
    metrics_http_refusal(401);
    metrics_seccomp_refusal(SYS_setuid);
    metrics_forkserver_restart();
    struct buf b;
    buf_init(&b, 1 << 20);
    is_int(metrics_write(&b), 0, "written");
    const char *t = text(&b);
    ok(strstr(t, "# TYPE forkbox_block_duration_seconds histogram\n") != NULL, "histogram type");
    ok(strstr(t, "forkbox_block_duration_seconds_bucket{le=\"0.001\"} 0\n") != NULL,
       "3 ms is not <= 1 ms");
    ok(strstr(t, "forkbox_block_duration_seconds_bucket{le=\"0.005\"} 1\n") != NULL,
       "3 ms <= 5 ms");
    ok(strstr(t, "forkbox_block_duration_seconds_bucket{le=\"1\"} 1\n") != NULL,
       "buckets are cumulative: 1 at 1 s");
    ok(strstr(t, "forkbox_block_duration_seconds_bucket{le=\"5\"} 2\n") != NULL, "2 at 5 s");
    ok(strstr(t, "forkbox_block_duration_seconds_bucket{le=\"+Inf\"} 2\n") != NULL, "+Inf");
    ok(strstr(t, "forkbox_block_duration_seconds_count 2\n") != NULL, "_count");
    ok(strstr(t, "forkbox_block_duration_seconds_sum 2.003\n") != NULL, "_sum in seconds");
    ok(strstr(t, "forkbox_http_refusals_total{status=\"401\"} 2\n") != NULL, "refusals by status");
    ok(strstr(t, "status=\"503\"") == NULL, "a status never given is not listed");
    ok(strstr(t, "# TYPE forkbox_turns_total counter\n") != NULL &&
           strstr(t, "forkbox_turns_total{") == NULL, "no tenant yet: no turn row");
    ok(strstr(t, "forkbox_seccomp_refusals_total{syscall=\"setuid\"} 1\n") != NULL,
       "seccomp refusals by name");
    ok(strstr(t, "forkbox_forkserver_restarts_total 1\n") != NULL, "restarts");
    ok(strstr(t, "forkbox_pool_size 4\n") != NULL, "pool");
    /* Every non-comment line is "name{...} value" or "name value". */
    int bad = 0;
    for (const char *l = t; *l; l = strchr(l, '\n') + 1) {
        if (*l != '#' && !strchr(l, ' '))
            bad++;
        if (!strchr(l, '\n'))
            break;
    }
    is_int(bad, 0, "every sample line has a value");
    buf_free(&b);
}

/* Turns are counted by tenant: a row per tenant there is, in the order they
 * came, every end value listed; a tenant that goes takes its rows along. */
static void test_tenants(void)
{
    metrics_init(0);
    struct metrics_tenant a, b, c;
    metrics_tenant_add(&a, "team-a");
    metrics_tenant_add(&b, "te\"am b");
    metrics_tenant_add(&c, "team-c");
    metrics_turn_begin(&a);
    metrics_turn_begin(&a);
    metrics_turn_begin(&b);
    struct turn_stats st = {.id = 1, .end = TURN_END_MEMORY};
    metrics_turn_end(&st, &a);
    metrics_tenant_refused(&b);
    metrics_tenant_remove(&c);
    struct buf out;
    buf_init(&out, 1 << 20);
    is_int(metrics_write(&out), 0, "written");
    const char *t = text(&out);
    ok(strstr(t, "forkbox_turns_active{tenant=\"team-a\"} 1\nforkbox_turns_active{tenant="
                 "\"te\\\"am b\"} 1\n") != NULL,
       "active turns per tenant, in order, the label escaped");
    ok(strstr(t, "forkbox_turns_total{tenant=\"team-a\",end=\"memory\"} 1\n") != NULL &&
           strstr(t, "forkbox_turns_total{tenant=\"team-a\",end=\"ok\"} 0\n") != NULL &&
           strstr(t, "forkbox_turns_total{tenant=\"te\\\"am b\",end=\"error\"} 0\n") != NULL,
       "ended turns by tenant and end, at 0 too");
    ok(strstr(t, "end=\"none\"") == NULL, "not 'none'");
    ok(strstr(t, "forkbox_tenant_refusals_total{tenant=\"te\\\"am b\"} 1\n") != NULL &&
           strstr(t, "forkbox_tenant_refusals_total{tenant=\"team-a\"} 0\n") != NULL,
       "429s by tenant");
    ok(strstr(t, "team-c") == NULL, "a removed tenant is not shown");
    metrics_tenant_remove(&a);
    metrics_tenant_add(&c, "team-c");
    buf_reset(&out);
    metrics_write(&out);
    t = text(&out);
    ok(strstr(t, "team-a") == NULL &&
           strstr(t, "forkbox_turns_active{tenant=\"te\\\"am b\"} 1\nforkbox_turns_active{tenant="
                     "\"team-c\"} 0\n") != NULL,
       "the first one removed, one added again at the end");
    metrics_tenant_remove(&b);
    metrics_tenant_remove(&c);
    buf_free(&out);
}

/* The peak histogram's count, from a fresh write. */
static long peak_count(void)
{
    struct buf b;
    buf_init(&b, 1 << 20);
    metrics_write(&b);
    const char *p = strstr(text(&b), "forkbox_turn_peak_memory_bytes_count ");
    long n = p ? strtol(p + strlen("forkbox_turn_peak_memory_bytes_count "), NULL, 10) : -1;
    buf_free(&b);
    return n;
}

static void test_pending(void)
{
    metrics_init(0);
    struct metrics_tenant mt;
    metrics_tenant_add(&mt, "default");
    metrics_turn_begin(&mt);
    metrics_turn_begin(&mt);
    struct turn_stats a = {.id = 7, .sandbox = true, .end = TURN_END_OK};
    metrics_turn_end(&a, &mt);
    is_int(peak_count(), 0, "a turn whose death report is due waits for it");
    metrics_death_report(8, 1 << 20);
    is_int(peak_count(), 0, "another turn's report changes nothing");
    metrics_death_report(7, 5 << 20);
    is_int(peak_count(), 1, "its report brings the peak");
    metrics_death_report(7, 5 << 20);
    is_int(peak_count(), 1, "a second report is ignored");
    struct turn_stats b = {.id = 9, .sandbox = true, .end = TURN_END_MEMORY};
    metrics_turn_end(&b, &mt);
    metrics_tick(UINT64_MAX);
    metrics_death_report(9, 5 << 20);
    is_int(peak_count(), 1, "after the wait the line goes out without a peak");
    struct turn_stats c = {.id = 10, .sandbox = true, .peak_known = true, .mem_peak = 1 << 20};
    metrics_turn_end(&c, &mt);
    is_int(peak_count(), 2, "a peak already known is counted at once");
    is_str(turn_end_name(c.end), "none", "the caller's stats are not changed");
    metrics_tenant_remove(&mt);
}

int main(void)
{
    test_escape();
    test_float();
    test_write();
    test_tenants();
    test_pending();
    metrics_reset();
    return tap_done();
}
