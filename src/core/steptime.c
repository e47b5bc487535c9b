/* Runs in the fork server, the sandbox child and its runtime: the step-time
 * record of one spawn (see steptime.h). */
#include "core/steptime.h"

#include <errno.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

const char *const steptime_names[ST_N] = {
    [ST_P_REQUEST] = "request",     [ST_P_CLONE] = "prepare",   [ST_P_CLONED] = "clone",
    [ST_P_MAPS] = "maps",           [ST_P_HANDOFF] = "handoff", [ST_C_START] = "start",
    [ST_C_GO] = "go",               [ST_C_IDS] = "ids",         [ST_C_ROOT] = "root",
    [ST_C_SCRATCH] = "scratch",     [ST_C_TOOLS] = "tools",     [ST_C_PROC] = "proc",
    [ST_C_COVERS] = "covers",       [ST_C_NAMESPACES] = "namespaces",
    [ST_C_FDS] = "fds",             [ST_C_PRIVS] = "privs",     [ST_C_SECCOMP] = "seccomp",
    [ST_C_RLIMITS] = "rlimits",     [ST_C_INIT] = "init",       [ST_R_AFTERFORK] = "afterfork",
    [ST_R_SERVE] = "serve",         [ST_R_TOOLS] = "tools_in",  [ST_R_READY] = "ready",
    [ST_R_RUN] = "run_in",          [ST_R_DONE] = "block",      [ST_R_SNAPSHOT] = "snapshot",
};

int steptime_fd = -1;

static struct steptime_rec rec;
static uint64_t cpu_base, flt_base; /* the setup's, once the runtime is a process of its own */

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void steptime_mark_rec(struct steptime_rec *r, enum steptime_mark m)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    r->flt[m] = (uint64_t)ru.ru_minflt;
    r->cpu[m] = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    r->wall[m] = clock_ns(CLOCK_MONOTONIC);
}

void steptime_mark(enum steptime_mark m)
{
    if (steptime_fd < 0)
        return;
    steptime_mark_rec(&rec, m);
    rec.cpu[m] += cpu_base;
    rec.flt[m] += flt_base;
}

void steptime_split(void)
{
    if (steptime_fd < 0)
        return;
    /* The mark before the split is the setup process's last. */
    for (int m = ST_C_INIT - 1; m >= 0; m--) {
        if (rec.wall[m]) {
            cpu_base = rec.cpu[m];
            flt_base = rec.flt[m];
            break;
        }
    }
    steptime_mark(ST_C_INIT);
}

void steptime_send(void)
{
    if (steptime_fd < 0)
        return;
    ssize_t w;
    do
        w = write(steptime_fd, &rec, sizeof rec);
    while (w < 0 && errno == EINTR);
    close(steptime_fd);
    steptime_fd = -1;
}
