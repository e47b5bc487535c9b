/* forkbox-bench's internal header: the types every part shares and the functions each file
 * offers the others. Everything runs in the one forkbox-bench process (see main.c for what the
 * tool does). The files of tools/bench/, by job:
 *
 *   main.c         the command line, main(), the counts
 *   run.c          one server configuration: start it, run the groups, fill a column
 *   measure.c      the plain groups' measurements (turn start, blocks, tool calls, throughput,
 *                  Pss, imports)
 *   measure_big.c  the bigdata group's measurements
 *   bigdata.c      the bigdata group's data and upload archives
 *   steps.c        the step table of a fresh turn and the floor beside forkbox (../shared/bench)
 *   report.c       the row labels and the tables
 *   client.c       one turn's connection: HTTP upgrade, WebSocket (wslay), the protocol
 *   driver.c       the epoll loop that launches and runs turns
 *   server.c       starting and stopping a server, reading its log
 *   procstat.c     /proc: process trees, Pss, CPU time, machine load
 *   archive.c      gzip tar archives (libarchive) and run frames
 *   stats.c        samples and percentiles
 *   util.c         clock, allocation, progress lines */
#ifndef FORKBOX_BENCH_H
#define FORKBOX_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <netinet/in.h>
#include <wslay/wslay.h>

#define NS_PER_MS 1000000.0
#define MiB_D 1048576.0

struct bench;
struct bigdata;
struct counts;

/* util.c */

extern uint64_t t_begin; /* when main() started, for the progress lines */

uint64_t now_ns(void);
void sleep_ms(unsigned ms);
void *xmalloc(size_t n);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
double ms_since(uint64_t t0);
const char *fmt_ms(char *buf, size_t n, double v);
unsigned scale_u(unsigned v, double f);
bool fd_readable(int fd, unsigned ms);
/* What child pid writes on fd, until EOF or for at most secs (then it is killed), malloc'd and
 * NUL-terminated; fd is closed and the child reaped (*status: its wait status). */
char *child_output(pid_t pid, int fd, unsigned secs, int *status);

/* stats.c */

struct samples {
    double *v;
    size_t n, cap;
};

void samples_add(struct samples *s, double x);
double samples_pct_from(const struct samples *s, size_t from, double p);
double samples_pct(const struct samples *s, double p);
void samples_reset(struct samples *s);
void samples_free(struct samples *s);
double median_of(double *v, size_t n);

/* archive.c */

struct blob {
    uint8_t *p;
    size_t n;
};

struct member {
    const char *name, *data;
    size_t len;           /* bytes of data; 0: strlen(data) */
};

int make_targz_level(const struct member *m, size_t nm, int level, struct blob *out);
int make_targz(const struct member *m, size_t nm, struct blob *out);
int make_tools_targz(struct blob *out);
struct blob run_frame(const char *code);

/* client.c and driver.c */

enum cstate { C_CONNECTING, C_HTTP, C_OPEN, C_CLOSING };
/* Within a block: waiting for done, then output, then the workspace archive (§2.4). */
enum bstate { B_IDLE, B_WANT_DONE, B_WANT_OUTPUT, B_WANT_ARCHIVE };

/* What each turn of a driver does. */
struct plan {
    unsigned blocks;       /* blocks per turn, one run each */
    struct blob run;       /* the run frame of every block */
    bool pipeline;         /* first block right after the tools archive, like the host */
    bool hold;             /* after ready and the blocks, stay open until driver_release() */
    const char *expect;    /* expected stdout of each block, or NULL */
    bool capture;          /* keep the last output's stdout/stderr in the driver */
    const struct blob *upload; /* workspace archive of each block (borrowed); NULL: empty */
};

struct driver;

/* One turn's connection (client.c; driver.c walks the live list and reads its state). */
struct conn {
    struct driver *d;
    struct conn *prev, *next; /* the driver's live list */
    int fd;
    uint32_t ev;              /* current epoll interest */
    enum cstate st;
    enum bstate bs;
    wslay_event_context_ptr ws;
    char req[384];
    size_t req_len, req_off;
    char accept[64];           /* expected Sec-WebSocket-Accept */
    char hbuf[4096];           /* the HTTP response; after the upgrade, bytes past the header */
    size_t hlen, pre_off;      /* go to wslay first, from pre_off */
    unsigned blocks_done;
    bool ready, held, eof, failed, dead;
    int64_t done_code;
    unsigned replies;          /* tool_results queued while handling the current event */
    uint64_t t_start, t_ready, t_block, t_evt;
    char why[200];
};

/* Turns launched and run together by one epoll loop (driver.c), and what they measured. */
struct driver {
    int ep;
    struct sockaddr_in addr;
    struct plan plan;
    const struct blob *tools, *empty;
    /* launching: at most max_active live turns, at most max_pending not yet ready */
    unsigned long to_launch;
    uint64_t launch_until;
    unsigned max_active, max_pending;
    uint64_t gap_ns;       /* sequential runs: idle time between one turn's end and the next */
    unsigned max_fail;     /* stop launching after this many failed turns (0: never) */
    struct conn *live, *graveyard;
    unsigned active, ready_now, held_now;
    /* results */
    struct samples turn_start, block_rtt, handling;
    unsigned long turns_ok, turns_failed, blocks_ok, tool_calls, launched;
    uint64_t t_first, t_last_done;
    char first_err[240];
    char *out_stdout, *out_stderr;
    size_t out_stdout_len;     /* bytes of out_stdout (UTF-8) */
    int64_t out_code;
    size_t last_archive;       /* bytes of the last workspace archive received */
    const char *tool_value;    /* big data: every tool_result's value is this string (borrowed, */
    size_t tool_value_n;       /*  JSON-safe text, tool_value_n bytes); NULL: {"echoed": message} */
};

/* client.c: one turn's connection */
void conn_fail(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void conn_start(struct driver *d);
void conn_event(struct conn *c, uint32_t ev);
void conn_pump_ws(struct conn *c, bool readable);
void conn_finish(struct conn *c);
void start_block(struct conn *c);
void end_turn(struct conn *c);

/* driver.c */
int driver_init(struct driver *d, uint16_t port, const struct blob *tools,
                const struct blob *empty);
void driver_run(struct driver *d, uint64_t deadline);
void driver_release(struct driver *d, uint64_t deadline);
double driver_block(struct driver *d, const struct blob *upload, const char *code,
                    uint64_t deadline);
void driver_free(struct driver *d);

/* server.c */

struct server {
    char name[64];
    pid_t pid;   /* forkboxd, or the baseline launcher; each leads its own process group */
    int log_fd;  /* memfd with the server's stdout and stderr */
    uint16_t port;
    bool baseline;
    bool pooled;       /* keeps idle sandboxes: never quiet */
    pid_t infra[8];    /* forkboxd: the fork server's helpers, present before any turn */
    size_t ninfra;
    char cmd[1024];
    char cg[256];      /* the cpuacct cgroup it runs in (cg_cpu_make), "" without one */
};

void on_fatal_signal(int sig);
int server_start(struct server *s, const char *name, bool baseline, char *const argv[],
                 char *why, size_t whylen);
void server_stop(struct server *s);
size_t server_log_mark(const struct server *s);
char *server_log(const struct server *s, size_t from, size_t *len);
void server_ready_times(const struct server *s, size_t mark, struct samples *ready,
                        struct samples *spawn);

/* procstat.c */

/* The processes that serve turns: below forkboxd's fork server (every child of forkboxd), or
 * below the baseline launcher. `top` gets the fork server(s) or the launcher itself. */
struct tree {
    pid_t *turns;
    size_t nturns;
    pid_t *top;
    size_t ntop;
};

/* The CPU of a server's processes at one moment: the supervisor (forkboxd itself) and every
 * process that serves turns (fork server and its helper, sandboxes; for the baseline, the
 * launcher and its per-turn processes). */
struct cpu_mark {
    long long sup;      /* forkboxd's own, ns; 0 for the baseline */
    pid_t *pid;         /* the other processes (owned) */
    long long *ns;      /* their CPU, ns (owned) */
    size_t n;
};

void server_tree(const struct server *s, struct tree *tr);
void tree_free(struct tree *tr);
void server_find_infra(struct server *s);
void server_wait_quiet(const struct server *s, unsigned max_ms);
long pss_kb(pid_t pid);
bool shares_parent_mm(pid_t pid);
bool cgroup_favordynmods(void);
long meminfo_kb(const char *key);
double self_cpu_s(void);
void loadavg(char *out, size_t n);
void machine_jiffies(unsigned long long *busy, unsigned long long *total);
void cpu_mark(const struct server *s, struct cpu_mark *m);
/* A cgroup v1 cpuacct group of the bench's own for one server (or the floor's bench_py) and
 * everything it starts: its usage counts their CPU however busy the rest of the machine is. */
bool cg_cpu_make(char *path, size_t n);   /* false (path "") where there is no v1 cpuacct */
void cg_cpu_enter(const char *path);      /* the calling process moves in (after fork) */
double cg_cpu_ns(const char *path);       /* CPU used by its processes so far; NAN without */
void cg_cpu_remove(const char *path);     /* once its processes are gone */
void cpu_since(const struct server *s, struct cpu_mark *m, double *sup, double *all);
/* ns[0]: forkboxd's CPU so far, ns[1] its fork server's, ns[2] the fork server's helpers'
 * (each without children); -1 where not known (the baseline, a process gone). */
void server_own_cpu(const struct server *s, long long ns[3]);

/* bigdata.c */

#define NBIGSZ 3
enum { K_TEXT, K_RANDOM, NKINDS };
extern const unsigned big_mib[NBIGSZ];   /* MiB of the upload/download rows */
extern const char *const kind_name[NKINDS];
extern const unsigned tool_mib[NBIGSZ];  /* MiB of the tool-result rows */
#define STDOUT_BYTES (16u << 20)
#define CHANGE_FILES 50 /* the changed-workspace row: 50 files of 1 MiB, one rewritten per block */
#define LOOP_N 3000000  /* iterations of the pure-Python loop */
#define MM_N 500        /* the numpy matmul: MM_N x MM_N float64 */

struct bigdata {
    char *text, *rnd;              /* BIG_MAX MiB of each kind, made once */
    char *json;                    /* JSON-safe text for tool results (no newline, quote, backslash) */
    struct blob up[NKINDS][NBIGSZ]; /* one member "up.dat" of big_mib[i] MiB, gzip level 1 */
    struct blob change;            /* CHANGE_FILES members c00.txt.. of 1 MiB of text */
    unsigned reps[NBIGSZ];         /* blocks per upload / download row */
    unsigned tool_calls[NBIGSZ];   /* calls per tool-result row */
    unsigned stdout_reps, change_reps, py_reps, py_rounds;
    size_t snap[3][NKINDS][NBIGSZ]; /* bytes of the snapshot each column got in the download rows */
};

void bigdata_init(struct bigdata *bd, bool quick, double scale);
const struct blob *bigdata_upload(struct bigdata *bd, int kind, int sz);
const struct blob *bigdata_change(struct bigdata *bd);
void bigdata_free(struct bigdata *bd);

/* report.c */

enum col { COL_ISO, COL_NOISO, COL_BASE, NCOLS };

enum row {
    R_SRV_P50, R_SRV_P99, R_SPAWN_P50, R_CLI_P50, R_CLI_P99, R_PY_P50,
    R_POOL_SRV_P50, R_POOL_SRV_P99, R_POOL_CLI_P50, R_POOL_PY_P50, R_POOL_B2B_P50,
    R_PRE_SRV_P50, R_PRE_CLI_P50,
    R_RTT_P50, R_RTT_P99,
    R_TC_INSIDE, R_TC_CLIENT, R_TC_ADDED,
    R_TP4, R_TP16, R_TP64, R_TP4x5, R_BP4x5, R_TP16x5, R_BP16x5, R_CPU1, R_CPU5, R_CGCPU1,
    R_PSS_S, R_PSS_B, R_PSS_BLK, R_HELD_B, R_KMEM_B, R_TOP_PSS, R_PRE_PSS_S, R_PRE_PSS_B, R_PRE_TOP_PSS,
    R_NUMPY, R_PANDAS, R_NUMPY_PRE, R_PANDAS_PRE,
    /* bigdata, printed as a table of its own; [kind * NBIGSZ + size] where there are sizes */
    R_BIG_FIRST,
    R_UP_WALL = R_BIG_FIRST,
    R_UP_SUP = R_UP_WALL + NKINDS * NBIGSZ,
    R_DN_WALL = R_UP_SUP + NKINDS * NBIGSZ,
    R_DN_SUP = R_DN_WALL + NKINDS * NBIGSZ,
    R_DN_SRV = R_DN_SUP + NKINDS * NBIGSZ,
    R_CHG_WALL = R_DN_SRV + NKINDS * NBIGSZ, R_CHG_SRV,
    R_TR_WALL, R_TR_SUP = R_TR_WALL + NBIGSZ, R_TR_SRV = R_TR_SUP + NBIGSZ,
    R_SO_WALL = R_TR_SRV + NBIGSZ, R_SO_SUP, R_SO_SRV,
    R_LOOP, R_LOOP_PY3, R_LOOP_RATIO, R_MM, R_MM_PY3, R_MM_RATIO,
    NROWS
};

extern double val[NROWS][NCOLS]; /* the table's values; NAN: not measured */

void rows_init(const struct counts *fb);
void print_table(int first, int last);
void print_big(const struct bench *b);

/* the run: counts, groups, the bench as a whole (main.c, run.c) */

struct counts {
    unsigned start_turns, py_turns, rtt_blocks, calls, pss_small, pss_big, import_turns;
    double tp_secs;
};

struct bench {
    struct blob tools, empty;
    struct counts fb, bl; /* forkbox and baseline */
    const char *bench_dir, *python;
    const char *floor_dir; /* --floor: a build of ../shared/bench/floor (bench_py); NULL: none */
    unsigned gap_ms;      /* idle time between sequential turn-start turns */
    bool gap_set;         /* --gap-ms given (the steps group's own default is 2 ms) */
    unsigned groups;      /* G_* bits: which measurements run (--rows) */
    struct bigdata *big;  /* the bigdata group's data, made once (owned); NULL without it */
    bool big_noiso;       /* bigdata also in the no-isolation column (--only noiso) */
    bool quick;           /* --quick */
    bool failed;          /* a turn broke the protocol somewhere */
};

/* Measurement groups, selectable with --rows (default: all). */
enum {
    G_START = 1 << 0,      /* turn start, fresh sandbox (C and Python client) */
    G_RTT = 1 << 1,        /* empty block round trip */
    G_TOOL = 1 << 2,       /* tool call round trip */
    G_THROUGHPUT = 1 << 3, /* throughput rows and CPU per turn */
    G_PSS = 1 << 4,        /* Pss per idle turn, turns held */
    G_IMPORT = 1 << 5,     /* import numpy / pandas, cold */
    G_POOL = 1 << 6,       /* the --pool rows */
    G_PRELOAD = 1 << 7,    /* the --preload numpy,pandas rows */
    G_BIG = 1 << 8,        /* big data: uploads, snapshots, big tool results, stdout, Python speed */
    G_STEPS = 1 << 9,      /* the steps of a fresh turn, beside the floor's (--step-times) */
    G_FLOOR = 1 << 10,     /* throughput and fresh start beside the floor's (--floor) */
    G_ALL = (1 << 11) - 1,
};

void run_forkbox(struct bench *b, const char *daemon, bool iso, enum col col, const char *tag);
void run_baseline(struct bench *b);

/* measure.c */

void report_failures(struct bench *b, const struct server *s, const char *what,
                     const struct driver *d, bool fatal);
void measure_turn_start(struct bench *b, struct server *s, unsigned n, unsigned gap_ms,
                        struct samples *cli, struct samples *srv, struct samples *spawn);
double measure_py_turn_start(struct bench *b, struct server *s, unsigned n, unsigned gap_ms);
void measure_rtt(struct bench *b, struct server *s, unsigned n, double *p50, double *p99);
void measure_tool_call(struct bench *b, struct server *s, unsigned calls, double *inside_us,
                       double *client_us);
/* CPU per turn of a throughput row, ms; NAN where not known. */
struct tp_cpu {
    double machine; /* every CPU's busy time, less the load generator's own */
    double cgroup;  /* the server's cgroup: it and everything it starts */
    /* forkboxd, its fork server and the fork server's helper (the cgroup placer), each
     * without its children: what is left of `cgroup` is the sandboxes' (their exits too) */
    double sup, fs, helper;
};
void measure_throughput(struct bench *b, struct server *s, unsigned conc, unsigned k,
                        double secs, double *turns_s, double *blocks_s, struct tp_cpu *cpu);
void measure_pss_after(struct bench *b, struct server *s, unsigned n, unsigned blocks,
                       double *per_turn_mb, double *held, double *top_mb, double *kernel_mb);
void measure_pss(struct bench *b, struct server *s, unsigned n, double *per_turn_mb,
                 double *held, double *top_mb, double *kernel_mb);
double measure_import(struct bench *b, struct server *s, const char *module, unsigned turns);

/* steps.c */

void measure_steps(struct bench *b, struct server *s, unsigned n);
void measure_floor(struct bench *b, struct server *s, unsigned rounds);

/* measure_big.c */

void measure_big(struct bench *b, struct server *s, enum col col);

#endif
