/* forkbox-bench: what /proc (and getrusage) says: the processes below a server (its turns, its
 * fork server and helper), their Pss and CPU time (stat, task schedstat), the machine's busy
 * jiffies, MemAvailable, the load average, whether cgroups run with favordynmods, and the
 * cpuacct cgroups the servers run in. Runs in the forkbox-bench process. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/kcmp.h>

#include "bench.h"

/* Reads a small /proc file in one read() into buf, NUL-terminated ("" when it is gone or
 * empty); returns the bytes read, <= 0 when there were none. */
static ssize_t read_proc(const char *path, char *buf, size_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t r = fd < 0 ? -1 : read(fd, buf, n - 1);
    if (fd >= 0)
        close(fd);
    buf[r > 0 ? r : 0] = 0;
    return r;
}

struct proc_table {
    pid_t *pid, *ppid;
    size_t n;
};

static void proc_scan(struct proc_table *t)
{
    size_t cap = 1024;
    t->n = 0;
    t->pid = xmalloc(cap * sizeof *t->pid);
    t->ppid = xmalloc(cap * sizeof *t->ppid);
    DIR *dir = opendir("/proc");
    struct dirent *de;
    while (dir && (de = readdir(dir)) != NULL) {
        if (!isdigit((unsigned char)de->d_name[0]))
            continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", de->d_name);
        if (read_proc(path, buf, sizeof buf) <= 0)
            continue;
        char *rp = strrchr(buf, ')'); /* the comm may hold spaces and parentheses */
        int ppid;
        char state;
        if (!rp || sscanf(rp + 1, " %c %d", &state, &ppid) != 2)
            continue;
        if (t->n == cap) {
            cap *= 2;
            t->pid = xrealloc(t->pid, cap * sizeof *t->pid);
            t->ppid = xrealloc(t->ppid, cap * sizeof *t->ppid);
        }
        t->pid[t->n] = (pid_t)atoi(de->d_name);
        t->ppid[t->n] = (pid_t)ppid;
        t->n++;
    }
    if (dir)
        closedir(dir);
}

/* Every descendant of `root` (not root itself), breadth first; returns how many. */
static size_t proc_descendants(const struct proc_table *t, pid_t root, pid_t **out)
{
    size_t n = 0, cap = 64, head = 0;
    pid_t *v = xmalloc(cap * sizeof *v);
    pid_t cur = root;
    for (;;) {
        for (size_t i = 0; i < t->n; i++)
            if (t->ppid[i] == cur) {
                if (n == cap)
                    v = xrealloc(v, (cap *= 2) * sizeof *v);
                v[n++] = t->pid[i];
            }
        if (head == n)
            break;
        cur = v[head++];
    }
    *out = v;
    return n;
}

static void proc_free(struct proc_table *t)
{
    free(t->pid);
    free(t->ppid);
}

/* Pss of one process in kB, from smaps_rollup; -1 if it is gone. */
long pss_kb(pid_t pid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/smaps_rollup", (int)pid);
    if (read_proc(path, buf, sizeof buf) <= 0)
        return -1;
    char *p = strstr(buf, "\nPss:");
    return p ? strtol(p + 5, NULL, 10) : -1;
}

/* True if `pid` shares its address space with its parent (a sandbox's init and runtime are
 * two processes with one mm): its Pss is then already in the parent's. */
bool shares_parent_mm(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (read_proc(path, buf, sizeof buf) <= 0)
        return false;
    char *rp = strrchr(buf, ')');
    int ppid;
    if (!rp || sscanf(rp + 2, "%*c %d", &ppid) != 1 || ppid <= 1)
        return false;
    return syscall(SYS_kcmp, ppid, pid, KCMP_VM, 0, 0) == 0;
}

/* Whether some cgroup hierarchy is mounted with favordynmods: without it, moving a task into a
 * cgroup (every fresh sandbox) waits for an RCU grace period (docs/operating.md, "Tuning the host"). */
bool cgroup_favordynmods(void)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return false;
    char line[4096];
    bool on = false;
    while (!on && fgets(line, sizeof line, f)) {
        char *sep = strstr(line, " - ");
        on = sep && (!strncmp(sep + 3, "cgroup ", 7) || !strncmp(sep + 3, "cgroup2 ", 8)) &&
             strstr(sep, "favordynmods");
    }
    fclose(f);
    return on;
}

long meminfo_kb(const char *key)
{
    char buf[4096];
    if (read_proc("/proc/meminfo", buf, sizeof buf) <= 0)
        return -1;
    char *p = strstr(buf, key);
    return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

void server_tree(const struct server *s, struct tree *tr)
{
    struct proc_table t;
    proc_scan(&t);
    memset(tr, 0, sizeof *tr);
    if (s->baseline) {
        tr->top = xmalloc(sizeof *tr->top);
        tr->top[0] = s->pid;
        tr->ntop = 1;
        tr->nturns = proc_descendants(&t, s->pid, &tr->turns);
    } else {
        tr->top = xmalloc((t.n + 1) * sizeof *tr->top);
        for (size_t i = 0; i < t.n; i++)
            if (t.ppid[i] == s->pid)
                tr->top[tr->ntop++] = t.pid[i];
        size_t nfs = tr->ntop;
        tr->turns = xmalloc(sizeof *tr->turns);
        for (size_t i = 0; i < t.n; i++) {
            bool below_fs = false, infra = false;
            for (size_t k = 0; k < nfs; k++)
                below_fs |= t.ppid[i] == tr->top[k];
            for (size_t k = 0; k < s->ninfra; k++)
                infra |= t.pid[i] == s->infra[k];
            if (!below_fs)
                continue;
            if (infra) { /* the fork server's helper counts with the fork server */
                tr->top[tr->ntop++] = t.pid[i];
                continue;
            }
            pid_t *d;
            size_t n = proc_descendants(&t, t.pid[i], &d);
            tr->turns = xrealloc(tr->turns, (tr->nturns + n + 2) * sizeof *tr->turns);
            tr->turns[tr->nturns++] = t.pid[i];
            memcpy(tr->turns + tr->nturns, d, n * sizeof *d);
            tr->nturns += n;
            free(d);
        }
    }
    proc_free(&t);
}

/* Before any turn: the fork server's own children (its cgroup helper) are not sandboxes. */
void server_find_infra(struct server *s)
{
    struct proc_table t;
    proc_scan(&t);
    for (size_t i = 0; i < t.n; i++) {
        if (t.ppid[i] != s->pid)
            continue;
        for (size_t k = 0; k < t.n && s->ninfra < sizeof s->infra / sizeof *s->infra; k++)
            if (t.ppid[k] == t.pid[i])
                s->infra[s->ninfra++] = t.pid[k];
    }
    proc_free(&t);
}

void tree_free(struct tree *tr)
{
    free(tr->turns);
    free(tr->top);
}

/* Waits (bounded) until no turn process is left below the server, so that one measurement's
 * teardown does not run into the next one. */
void server_wait_quiet(const struct server *s, unsigned max_ms)
{
    if (s->pooled)
        return;
    /* A /proc scan with thousands of processes costs tens of ms of CPU: poll gently. */
    for (unsigned waited = 0, step = 10; waited < max_ms; waited += step, step = step < 200 ? step * 2 : 200) {
        struct tree tr;
        server_tree(s, &tr);
        size_t n = tr.nturns;
        tree_free(&tr);
        if (n == 0)
            return;
        sleep_ms(step);
    }
}

/* This process's CPU time (user + system) in seconds: the load generator must not be the
 * bottleneck of a throughput row. */
double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

void loadavg(char *out, size_t n)
{
    read_proc("/proc/loadavg", out, n);
    char *sp = out;
    for (int i = 0; i < 3 && sp; i++)
        sp = strchr(sp + 1, ' ');
    if (sp)
        *sp = 0;
}

/* All CPUs' busy and total jiffies from /proc/stat (busy: everything but idle and iowait). */
void machine_jiffies(unsigned long long *busy, unsigned long long *total)
{
    unsigned long long v[10] = {0};
    FILE *f = fopen("/proc/stat", "re");
    *busy = *total = 0;
    if (!f)
        return;
    if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
               &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]) >= 8) {
        for (int i = 0; i < 8; i++)
            *total += v[i];
        *busy = *total - v[3] - v[4];
    }
    fclose(f);
}

/* CPU time of one process in ns: the larger of the sum of its live threads' run time
 * (/proc/PID/task/TID/schedstat, exact for a thread that is not running at that moment: every
 * process is read between blocks, when all of them wait) and utime + stime (+ cutime + cstime
 * with `children`) from /proc/PID/stat, which also counts exited threads and reaped children but
 * only in clock ticks (10 ms). -1 if the process is gone. */
static long long proc_cpu_ns(pid_t pid, bool children)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (read_proc(path, buf, sizeof buf) <= 0)
        return -1;
    char *rp = strrchr(buf, ')');
    unsigned long long ut, st;
    long long cut, cst;
    if (!rp || sscanf(rp + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %lld %lld",
                      &ut, &st, &cut, &cst) != 4)
        return -1;
    long long ticks = (long long)(ut + st) + (children ? cut + cst : 0);
    long long from_stat = ticks * (1000000000ll / sysconf(_SC_CLK_TCK)), live = 0;
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *dir = opendir(path);
    struct dirent *de;
    while (dir && (de = readdir(dir)) != NULL) {
        if (!isdigit((unsigned char)de->d_name[0]))
            continue;
        char p2[300];
        snprintf(p2, sizeof p2, "/proc/%d/task/%s/schedstat", (int)pid, de->d_name);
        if (read_proc(p2, buf, sizeof buf) > 0)
            live += strtoll(buf, NULL, 10);
    }
    if (dir)
        closedir(dir);
    return live > from_stat ? live : from_stat;
}

void cpu_mark(const struct server *s, struct cpu_mark *m)
{
    struct tree tr;
    server_tree(s, &tr);
    m->sup = s->baseline ? 0 : proc_cpu_ns(s->pid, false);
    m->n = 0;
    m->pid = xmalloc((tr.ntop + tr.nturns + 1) * sizeof *m->pid);
    m->ns = xmalloc((tr.ntop + tr.nturns + 1) * sizeof *m->ns);
    /* tr.top: the fork server(s) and helper, or the baseline's launcher */
    /* The fork server and the launcher without their children: a turn that ended before this
     * one (its sandbox reaped now) would land in their cutime. The turn's own processes with
     * theirs: a helper a sandbox forks and waits for is part of its turn. */
    for (size_t i = 0; i < tr.ntop + tr.nturns; i++) {
        bool top = i < tr.ntop;
        pid_t pid = top ? tr.top[i] : tr.turns[i - tr.ntop];
        long long ns = proc_cpu_ns(pid, !top);
        if (ns < 0)
            continue;
        m->pid[m->n] = top ? -pid : pid; /* negative: read without children */
        m->ns[m->n++] = ns;
    }
    tree_free(&tr);
}

void server_own_cpu(const struct server *s, long long ns[3])
{
    ns[0] = ns[1] = ns[2] = -1;
    if (s->baseline)
        return;
    ns[0] = proc_cpu_ns(s->pid, false);
    struct tree tr;
    server_tree(s, &tr);
    for (size_t i = 0; i < tr.ntop; i++) {
        bool helper = false;
        for (size_t k = 0; k < s->ninfra; k++)
            helper |= tr.top[i] == s->infra[k];
        long long v = proc_cpu_ns(tr.top[i], false);
        long long *slot = &ns[helper ? 2 : 1];
        if (v >= 0)
            *slot = (*slot < 0 ? 0 : *slot) + v;
    }
    tree_free(&tr);
}

/* CPU used since `m` in ms: the supervisor's (`sup`, NAN for the baseline) and the whole
 * server's (`all`: the supervisor plus every process of `m` or born since; a process that
 * exited since `m` is lost, and none of the blocks measured here starts one). Frees `m`. */
void cpu_since(const struct server *s, struct cpu_mark *m, double *sup, double *all)
{
    struct cpu_mark now;
    cpu_mark(s, &now);
    long long total = now.sup - m->sup;
    for (size_t i = 0; i < now.n; i++) {
        long long before = 0;
        for (size_t k = 0; k < m->n; k++)
            if (m->pid[k] == now.pid[i])
                before = m->ns[k];
        total += now.ns[i] - before;
    }
    if (sup)
        *sup = s->baseline ? NAN : (double)(now.sup - m->sup) / 1e6;
    if (all)
        *all = (double)total / 1e6;
    free(now.pid);
    free(now.ns);
    free(m->pid);
    free(m->ns);
}

/* Where cgroup v1's cpuacct is mounted, "" when it is not (cgroup v2 alone, or no cgroups). */
static void cpuacct_root(char *out, size_t n)
{
    out[0] = 0;
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        char *sep = strstr(line, " - cgroup ");
        char mnt[1024];
        if (!sep || !strstr(sep, "cpuacct") || sscanf(line, "%*s %*s %*s %*s %1023s", mnt) != 1)
            continue;
        snprintf(out, n, "%s", mnt);
        break;
    }
    fclose(f);
}

bool cg_cpu_make(char *path, size_t n)
{
    static unsigned seq;
    char root[1024];
    cpuacct_root(root, sizeof root);
    path[0] = 0;
    if (!root[0])
        return false;
    snprintf(path, n, "%s/forkbox-bench-%d-%u", root, (int)getpid(), seq++);
    if (mkdir(path, 0755) < 0) {
        path[0] = 0;
        return false;
    }
    return true;
}

void cg_cpu_enter(const char *path)
{
    char f[300];
    snprintf(f, sizeof f, "%s/cgroup.procs", path);
    int fd = open(f, O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        (void)!write(fd, "0\n", 2);
        close(fd);
    }
}

double cg_cpu_ns(const char *path)
{
    if (!path || !path[0])
        return NAN;
    char f[300], buf[64];
    snprintf(f, sizeof f, "%s/cpuacct.usage", path);
    return read_proc(f, buf, sizeof buf) > 0 ? strtod(buf, NULL) : NAN;
}

void cg_cpu_remove(const char *path)
{
    if (!path || !path[0])
        return;
    for (int i = 0; i < 200 && rmdir(path) < 0 && errno == EBUSY; i++)
        sleep_ms(10); /* the last sandboxes are still exiting */
}
