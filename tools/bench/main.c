/* forkbox-bench: load generator and benchmark for forkboxd.
 *
 *   forkbox-bench [--quick] [--forkboxd PATH] [--bench-dir DIR] [--python PATH]
 *                 [--no-baseline] [--only iso|noiso|baseline] [--scale F] [--keep-logs DIR]
 *
 * Speaks the Code Mode wire protocol v2 (shared/spec/wire-protocol.md) over real loopback
 * sockets: its own HTTP upgrade (OpenSSL libcrypto for the key/accept check), WebSocket framing
 * with wslay on non-blocking sockets driven by one epoll loop, frames parsed with cJSON, gzip tar
 * archives built with libarchive. It starts every server itself, on 127.0.0.1 port 0:
 *
 *   forkboxd (full isolation), forkboxd --no-isolation, each also with --pool 8 and with
 *   --preload numpy,pandas (shown as n/a where the daemon rejects the flag), and the baseline
 *   in tools/bench/ (a fresh python3 process per turn: the reference's model minus its container)
 *
 * and prints one table: metric | forkbox (isolated) | forkbox (no isolation) | baseline | ratio |
 * target, and for --rows bigdata (uploads, snapshots, big tool results and stdout, Python speed
 * against python3) a second one with the same columns. Server-side turn-start times come from
 * forkboxd's debug log ("turn N: ready X ms after the upgrade (spawn Y ms)"). Memory is Pss from /proc/PID/smaps_rollup of every process below
 * the server. Timing never changes the exit status: it is 0 unless a server could not be started
 * or a turn broke the protocol (then 1), 2 on usage errors. Every loop is bounded in count and
 * time; all traffic goes to 127.0.0.1. */
#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <linux/kcmp.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>
#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <wslay/wslay.h>

#ifndef FORKBOX_DAEMON_PATH
#define FORKBOX_DAEMON_PATH "forkboxd"
#endif
#ifndef FORKBOX_BENCH_DIR
#define FORKBOX_BENCH_DIR "tools/bench"
#endif

#define MAX_MSG (256u * 1024 * 1024) /* §1.4 */
#define WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
#define NS_PER_MS 1000000.0
#define POOL_GAP_MS 20 /* between pooled turns, so that the pool refills: 8 x ~2 ms spawns */

/* ------------------------------------------------------------------------------------------ */
/* small helpers                                                                              */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "forkbox-bench: out of memory\n");
        exit(1);
    }
    return p;
}

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p) {
        fprintf(stderr, "forkbox-bench: out of memory\n");
        exit(1);
    }
    return p;
}

static char *xstrdup(const char *s) { return strcpy(xmalloc(strlen(s) + 1), s); }

static uint64_t t_begin;

static void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void progress(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "forkbox-bench: %6.1fs ", (double)(now_ns() - t_begin) / 1e9);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ------------------------------------------------------------------------------------------ */
/* samples                                                                                    */

struct samples {
    double *v;
    size_t n, cap;
};

static void samples_add(struct samples *s, double x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->v = xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile over samples [from, n); NAN when there are none. */
static double samples_pct_from(const struct samples *s, size_t from, double p)
{
    if (from >= s->n)
        return NAN;
    size_t n = s->n - from;
    double *c = xmalloc(n * sizeof *c);
    memcpy(c, s->v + from, n * sizeof *c);
    qsort(c, n, sizeof *c, cmp_double);
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    double r = c[k ? k - 1 : 0];
    free(c);
    return r;
}

static double samples_pct(const struct samples *s, double p) { return samples_pct_from(s, 0, p); }

static void samples_reset(struct samples *s) { s->n = 0; }

static void samples_free(struct samples *s)
{
    free(s->v);
    memset(s, 0, sizeof *s);
}

/* ------------------------------------------------------------------------------------------ */
/* randomness: WebSocket masks and keys come from getrandom(), a page at a time               */

static uint8_t rnd_pool[4096];
static size_t rnd_left;

static void rnd_bytes(uint8_t *out, size_t n)
{
    while (n) {
        if (!rnd_left) {
            size_t got = 0;
            while (got < sizeof rnd_pool) {
                ssize_t r = getrandom(rnd_pool + got, sizeof rnd_pool - got, 0);
                if (r < 0 && errno != EINTR) {
                    perror("forkbox-bench: getrandom");
                    exit(1);
                }
                got += r > 0 ? (size_t)r : 0;
            }
            rnd_left = sizeof rnd_pool;
        }
        size_t k = n < rnd_left ? n : rnd_left;
        memcpy(out, rnd_pool + sizeof rnd_pool - rnd_left, k);
        rnd_left -= k;
        out += k;
        n -= k;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* archives and frames                                                                        */

struct blob {
    uint8_t *p;
    size_t n;
};

struct member {
    const char *name, *data;
    size_t len;           /* bytes of data; 0: strlen(data) */
};

/* A gzip-compressed pax tar of the members (mode 0644, mtime 0, uid/gid 0; §4.2, §5.1), at
 * gzip `level` (-1: zlib's default). */
static int make_targz_level(const struct member *m, size_t nm, int level, struct blob *out)
{
    size_t total = 0;
    for (size_t i = 0; i < nm; i++)
        total += m[i].len ? m[i].len : strlen(m[i].data);
    /* stored deflate blocks add 5 bytes per 64 KiB; tar adds a header and padding per member */
    size_t cap = (1 << 16) + total + total / 64 + nm * 4096, used = 0;
    uint8_t *buf = xmalloc(cap);
    struct archive *a = archive_write_new();
    char lv[4];
    snprintf(lv, sizeof lv, "%d", level);
    int ok = a && archive_write_add_filter_gzip(a) == ARCHIVE_OK &&
             (level < 0 || archive_write_set_filter_option(a, "gzip", "compression-level", lv) ==
                               ARCHIVE_OK) &&
             archive_write_set_format_pax_restricted(a) == ARCHIVE_OK &&
             archive_write_open_memory(a, buf, cap, &used) == ARCHIVE_OK;
    for (size_t i = 0; ok && i < nm; i++) {
        struct archive_entry *e = archive_entry_new();
        size_t len = m[i].len ? m[i].len : strlen(m[i].data);
        archive_entry_set_pathname(e, m[i].name);
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_perm(e, 0644);
        archive_entry_set_size(e, (la_int64_t)len);
        archive_entry_set_mtime(e, 0, 0);
        archive_entry_set_uid(e, 0);
        archive_entry_set_gid(e, 0);
        ok = archive_write_header(a, e) == ARCHIVE_OK &&
             archive_write_data(a, m[i].data, len) == (la_ssize_t)len;
        archive_entry_free(e);
    }
    if (a) {
        if (!ok)
            fprintf(stderr, "forkbox-bench: libarchive: %s\n", archive_error_string(a));
        ok = archive_write_close(a) == ARCHIVE_OK && ok;
        archive_write_free(a);
    }
    if (!ok) {
        free(buf);
        return -1;
    }
    out->p = buf;
    out->n = used;
    return 0;
}

static int make_targz(const struct member *m, size_t nm, struct blob *out)
{
    return make_targz_level(m, nm, -1, out);
}

static const char tools_init_py[] = "# Generated by forkbox-bench.\n"
                                    "from .echo import echo\n"
                                    "__all__ = ['echo']\n";
static const char tools_echo_py[] = "from adk_code_mode_sandbox._rpc_client import call as _call\n"
                                    "\n"
                                    "def echo(*, message):\n"
                                    "    return _call('echo', {'message': message})\n";

/* The text of a run frame for this code: compact JSON, one trailing newline (§3.1). */
static struct blob run_frame(const char *code)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "code", code);
    cJSON_AddStringToObject(o, "kind", "run");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) {
        fprintf(stderr, "forkbox-bench: cJSON: out of memory\n");
        exit(1);
    }
    struct blob b = {.n = strlen(s) + 1};
    b.p = xmalloc(b.n + 1);
    memcpy(b.p, s, b.n - 1);
    b.p[b.n - 1] = '\n';
    b.p[b.n] = 0;
    cJSON_free(s);
    return b;
}

static const char shutdown_frame[] = "{\"kind\":\"shutdown\"}\n";

/* ------------------------------------------------------------------------------------------ */
/* the client: one epoll loop drives every turn                                              */

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

static void conn_fail(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void conn_fail(struct conn *c, const char *fmt, ...)
{
    if (c->failed)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    c->failed = true;
}

static ssize_t ws_recv_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags,
                          void *user)
{
    struct conn *c = user;
    if (c->pre_off < c->hlen) { /* frames that arrived with the 101 */
        size_t k = c->hlen - c->pre_off < len ? c->hlen - c->pre_off : len;
        memcpy(buf, c->hbuf + c->pre_off, k);
        c->pre_off += k;
        return (ssize_t)k;
    }
    ssize_t r;
    while ((r = recv(c->fd, buf, len, 0)) < 0 && errno == EINTR)
        ;
    if (r > 0)
        return r;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
        return -1;
    }
    c->eof = true;
    if (r < 0 && c->st != C_CLOSING)
        conn_fail(c, "recv: %s", strerror(errno));
    wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
    return -1;
}

static ssize_t ws_send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len,
                          int flags, void *user)
{
    struct conn *c = user;
    ssize_t r;
    while ((r = send(c->fd, data, len, MSG_NOSIGNAL)) < 0 && errno == EINTR)
        ;
    if (r >= 0)
        return r;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
    else {
        if (c->st != C_CLOSING)
            conn_fail(c, "send: %s", strerror(errno));
        wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
    }
    return -1;
}

static int ws_genmask_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, void *user)
{
    rnd_bytes(buf, len);
    return 0;
}

static void queue(struct conn *c, uint8_t opcode, const void *p, size_t n)
{
    struct wslay_event_msg m = {.opcode = opcode, .msg = p, .msg_length = n};
    int r = wslay_event_queue_msg(c->ws, &m);
    if (r != 0)
        conn_fail(c, "wslay_event_queue_msg: %d", r);
}

static void start_block(struct conn *c)
{
    const struct blob *up = c->d->plan.upload ? c->d->plan.upload : c->d->empty;
    queue(c, WSLAY_BINARY_FRAME, up->p, up->n);
    queue(c, WSLAY_TEXT_FRAME, c->d->plan.run.p, c->d->plan.run.n);
    c->bs = B_WANT_DONE;
    c->t_block = now_ns();
}

static void end_turn(struct conn *c)
{
    if (c->st == C_CLOSING)
        return;
    if (c->held) {
        c->held = false;
        c->d->held_now--;
    }
    queue(c, WSLAY_TEXT_FRAME, shutdown_frame, sizeof shutdown_frame - 1);
    int r = wslay_event_queue_close(c->ws, 1000, NULL, 0);
    if (r != 0)
        conn_fail(c, "wslay_event_queue_close: %d", r);
    c->st = C_CLOSING;
}

/* The turn is between blocks with nothing left to run: end it or hold it. */
static void turn_idle(struct conn *c)
{
    if (c->d->plan.hold) {
        if (!c->held) {
            c->held = true;
            c->d->held_now++;
        }
    } else
        end_turn(c);
}

/* A tool_result whose value is the driver's big string: assembled by hand around it (the id
 * is printed by cJSON), so that the client's own cost is two copies, not a JSON encoding. */
static void reply_big_value(struct conn *c, cJSON *id)
{
    static const char mid[] = ",\"ok\":true,\"value\":\"";
    static const char tail[] = "\",\"error\":null,\"kind\":\"tool_result\"}\n";
    cJSON *o = cJSON_CreateString(cJSON_IsString(id) ? id->valuestring : "");
    char *ids = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!ids) {
        conn_fail(c, "cJSON: out of memory");
        return;
    }
    size_t nid = strlen(ids), n = 6 + nid + sizeof mid - 1 + c->d->tool_value_n + sizeof tail - 1;
    char *t = xmalloc(n), *w = t;
    memcpy(w, "{\"id\":", 6);
    memcpy(w += 6, ids, nid);
    memcpy(w += nid, mid, sizeof mid - 1);
    memcpy(w += sizeof mid - 1, c->d->tool_value, c->d->tool_value_n);
    memcpy(w += c->d->tool_value_n, tail, sizeof tail - 1);
    queue(c, WSLAY_TEXT_FRAME, t, n); /* wslay copies it */
    free(t);
    cJSON_free(ids);
    c->replies++;
    c->d->tool_calls++;
}

static void reply_tool_call(struct conn *c, cJSON *f)
{
    cJSON *id = cJSON_GetObjectItemCaseSensitive(f, "id");
    if (c->d->tool_value) {
        reply_big_value(c, id);
        return;
    }
    cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "args");
    cJSON *msg = cJSON_GetObjectItemCaseSensitive(args, "message");
    cJSON *o = cJSON_CreateObject(), *v = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", cJSON_IsString(id) ? id->valuestring : "");
    cJSON_AddTrueToObject(o, "ok");
    if (cJSON_IsString(msg))
        cJSON_AddStringToObject(v, "echoed", msg->valuestring);
    cJSON_AddItemToObject(o, "value", v);
    cJSON_AddNullToObject(o, "error");
    cJSON_AddStringToObject(o, "kind", "tool_result");
    char buf[512];
    if (!cJSON_PrintPreallocated(o, buf, (int)sizeof buf - 2, 0)) {
        char *s = cJSON_PrintUnformatted(o);
        size_t n = s ? strlen(s) : 0;
        char *t = xmalloc(n + 1);
        memcpy(t, s ? s : "", n);
        t[n] = '\n';
        queue(c, WSLAY_TEXT_FRAME, t, n + 1);
        free(t);
        cJSON_free(s);
    } else {
        size_t n = strlen(buf);
        buf[n] = '\n';
        queue(c, WSLAY_TEXT_FRAME, buf, n + 1);
    }
    cJSON_Delete(o);
    c->replies++;
    c->d->tool_calls++;
}

static void on_text(struct conn *c, const uint8_t *p, size_t n)
{
    struct driver *d = c->d;
    while (n && (p[n - 1] == '\n' || p[n - 1] == '\r')) /* §3.2 step 1 */
        n--;
    cJSON *f = cJSON_ParseWithLength((const char *)p, n);
    cJSON *kind = cJSON_GetObjectItemCaseSensitive(f, "kind");
    if (!cJSON_IsString(kind)) {
        conn_fail(c, "undecodable text frame: %.60s", (const char *)p);
        cJSON_Delete(f);
        return;
    }
    const char *k = kind->valuestring;
    if (!strcmp(k, "ready")) {
        cJSON *pv = cJSON_GetObjectItemCaseSensitive(f, "protocol_version");
        if (c->ready)
            conn_fail(c, "a second ready");
        else if (!cJSON_IsNumber(pv) || pv->valuedouble != 2)
            conn_fail(c, "ready with protocol_version other than 2");
        else {
            c->ready = true;
            c->t_ready = now_ns();
            d->ready_now++;
            samples_add(&d->turn_start, (double)(c->t_ready - c->t_start) / NS_PER_MS);
            if (c->bs == B_IDLE) {
                if (c->blocks_done < d->plan.blocks)
                    start_block(c);
                else
                    turn_idle(c);
            }
        }
    } else if (!strcmp(k, "tool_call")) {
        if (c->bs != B_WANT_DONE)
            conn_fail(c, "tool_call outside a block");
        else
            reply_tool_call(c, f);
    } else if (!strcmp(k, "log")) {
        /* relayed sandbox logs: nothing to do */
    } else if (!strcmp(k, "done")) {
        cJSON *ec = cJSON_GetObjectItemCaseSensitive(f, "exit_code");
        if (c->bs != B_WANT_DONE || !c->ready)
            conn_fail(c, "done out of order");
        c->done_code = cJSON_IsNumber(ec) ? (int64_t)ec->valuedouble : 0;
        c->bs = B_WANT_OUTPUT;
    } else if (!strcmp(k, "output")) {
        cJSON *ec = cJSON_GetObjectItemCaseSensitive(f, "exit_code");
        cJSON *so = cJSON_GetObjectItemCaseSensitive(f, "stdout");
        cJSON *se = cJSON_GetObjectItemCaseSensitive(f, "stderr");
        const char *out = cJSON_IsString(so) ? so->valuestring : "";
        const char *err = cJSON_IsString(se) ? se->valuestring : "";
        if (c->bs != B_WANT_OUTPUT)
            conn_fail(c, "output out of order");
        else if (!cJSON_IsNumber(ec) || (int64_t)ec->valuedouble != c->done_code)
            conn_fail(c, "output.exit_code differs from done.exit_code");
        else if (d->plan.expect && (strcmp(out, d->plan.expect) || c->done_code != 0))
            conn_fail(c, "unexpected output: exit %" PRId64 ", stdout %.40s, stderr %.120s",
                      c->done_code, out, err);
        if (d->plan.capture) {
            free(d->out_stdout);
            free(d->out_stderr);
            d->out_stdout = xstrdup(out);
            d->out_stdout_len = strlen(out);
            d->out_stderr = xstrdup(err);
            d->out_code = c->done_code;
        }
        c->bs = B_WANT_ARCHIVE;
    } else if (strcmp(k, "tool_result") && strcmp(k, "run") && strcmp(k, "shutdown")) {
        conn_fail(c, "unknown frame kind %.40s", k);
    } else {
        conn_fail(c, "host-side frame kind %s from the server", k);
    }
    cJSON_Delete(f);
}

static void on_binary(struct conn *c, size_t len)
{
    struct driver *d = c->d;
    if (c->bs == B_WANT_OUTPUT) {
        conn_fail(c, "binary message in place of output");
        return;
    }
    if (c->bs != B_WANT_ARCHIVE)
        return; /* the host ignores binary messages before done (§2.4) */
    uint64_t t = now_ns();
    d->last_archive = len;
    /* A pipelined first block also waits for the sandbox to start: not a block round trip. */
    if (!(d->plan.pipeline && c->blocks_done == 0))
        samples_add(&d->block_rtt, (double)(t - c->t_block) / NS_PER_MS);
    c->blocks_done++;
    d->blocks_ok++;
    c->bs = B_IDLE;
    if (c->blocks_done < d->plan.blocks)
        start_block(c);
    else
        turn_idle(c);
}

static void ws_msg_cb(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg,
                      void *user)
{
    struct conn *c = user;
    if (c->failed)
        return;
    if (arg->opcode == WSLAY_TEXT_FRAME)
        on_text(c, arg->msg, arg->msg_length);
    else if (arg->opcode == WSLAY_BINARY_FRAME)
        on_binary(c, arg->msg_length);
    else if (arg->opcode == WSLAY_CONNECTION_CLOSE && c->st != C_CLOSING)
        conn_fail(c, "server closed the turn: %u %.*s", arg->status_code,
                  (int)(arg->msg_length > 2 && arg->msg_length < 130 ? arg->msg_length - 2 : 0),
                  arg->msg_length > 2 ? (const char *)arg->msg + 2 : "");
}

static const struct wslay_event_callbacks ws_callbacks = {
    .recv_callback = ws_recv_cb,
    .send_callback = ws_send_cb,
    .genmask_callback = ws_genmask_cb,
    .on_msg_recv_callback = ws_msg_cb,
};

static void conn_set_events(struct conn *c, uint32_t ev)
{
    if (ev == c->ev)
        return;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    if (epoll_ctl(c->d->ep, EPOLL_CTL_MOD, c->fd, &e) < 0)
        conn_fail(c, "epoll_ctl: %s", strerror(errno));
    c->ev = ev;
}

/* Ends the turn's connection; the memory goes to the graveyard until the event batch is over. */
static void conn_finish(struct conn *c)
{
    struct driver *d = c->d;
    if (c->dead)
        return;
    c->dead = true;
    epoll_ctl(d->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->ws)
        wslay_event_context_free(c->ws);
    c->ws = NULL;
    if (c->ready)
        d->ready_now--;
    if (c->held)
        d->held_now--;
    d->active--;
    if (c->failed || !c->ready) {
        d->turns_failed++;
        if (!d->first_err[0])
            snprintf(d->first_err, sizeof d->first_err, "%s", c->failed ? c->why : "closed early");
        if (d->max_fail && d->turns_failed >= d->max_fail)
            d->to_launch = 0;
    } else {
        d->turns_ok++;
        d->t_last_done = now_ns();
    }
    if (c->prev)
        c->prev->next = c->next;
    else
        d->live = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->next = d->graveyard;
    d->graveyard = c;
}

static void conn_start(struct driver *d)
{
    struct conn *c = xmalloc(sizeof *c);
    memset(c, 0, sizeof *c);
    c->d = d;
    c->t_start = now_ns();
    c->next = d->live;
    if (d->live)
        d->live->prev = c;
    d->live = c;
    d->active++;
    d->launched++;
    if (d->to_launch)
        d->to_launch--;
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        conn_fail(c, "socket: %s", strerror(errno));
        c->fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        conn_finish(c);
        return;
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

    uint8_t key[16], sha[EVP_MAX_MD_SIZE];
    char key64[32], cat[96];
    unsigned shalen = 0;
    rnd_bytes(key, sizeof key);
    EVP_EncodeBlock((unsigned char *)key64, key, sizeof key);
    snprintf(cat, sizeof cat, "%s" WS_GUID, key64);
    EVP_Digest(cat, strlen(cat), sha, &shalen, EVP_sha1(), NULL);
    EVP_EncodeBlock((unsigned char *)c->accept, sha, (int)shalen);
    int n = snprintf(c->req, sizeof c->req,
                     "GET / HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                     "Sec-WebSocket-Version: 13\r\n\r\n",
                     ntohs(d->addr.sin_port), key64);
    c->req_len = (size_t)n;

    struct epoll_event e = {.events = EPOLLOUT, .data.ptr = c};
    c->ev = EPOLLOUT;
    if (epoll_ctl(d->ep, EPOLL_CTL_ADD, c->fd, &e) < 0) {
        conn_fail(c, "epoll_ctl: %s", strerror(errno));
        conn_finish(c);
        return;
    }
    if (connect(c->fd, (struct sockaddr *)&d->addr, sizeof d->addr) < 0 && errno != EINPROGRESS) {
        conn_fail(c, "connect: %s", strerror(errno));
        conn_finish(c);
    }
}

/* Reads the 101; on success the connection becomes a wslay client. Returns false while the
 * response is incomplete. */
static bool http_response(struct conn *c)
{
    for (;;) {
        if (c->hlen == sizeof c->hbuf - 1) {
            conn_fail(c, "HTTP response header too long");
            return false;
        }
        ssize_t r = recv(c->fd, c->hbuf + c->hlen, sizeof c->hbuf - 1 - c->hlen, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return false;
        if (r <= 0) {
            /* A refusal (503 Busy, 401) comes with Connection: close: report its status line. */
            c->hbuf[c->hlen] = 0;
            char *eol = strpbrk(c->hbuf, "\r\n");
            conn_fail(c, "connection closed before the 101%s%.*s", c->hlen ? ": " : "",
                      (int)(eol ? eol - c->hbuf : (ptrdiff_t)c->hlen), c->hbuf);
            return false;
        }
        c->hlen += (size_t)r;
        c->hbuf[c->hlen] = 0;
        char *end = strstr(c->hbuf, "\r\n\r\n");
        if (!end)
            continue;
        unsigned status = 0;
        if (sscanf(c->hbuf, "HTTP/1.1 %u", &status) != 1 || status != 101) {
            char *eol = strpbrk(c->hbuf, "\r\n");
            conn_fail(c, "upgrade refused: %.*s", (int)(eol - c->hbuf), c->hbuf);
            return false;
        }
        bool accept_ok = false;
        for (char *line = strstr(c->hbuf, "\r\n") + 2; line < end;) {
            char *eol = strstr(line, "\r\n");
            if (!strncasecmp(line, "Sec-WebSocket-Accept:", 21)) {
                char *v = line + 21;
                while (*v == ' ' || *v == '\t')
                    v++;
                size_t vl = (size_t)(eol - v);
                while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
                    vl--;
                accept_ok = vl == strlen(c->accept) && !memcmp(v, c->accept, vl);
            }
            line = eol + 2;
        }
        if (!accept_ok) {
            conn_fail(c, "bad or missing Sec-WebSocket-Accept");
            return false;
        }
        c->pre_off = (size_t)(end + 4 - c->hbuf);
        return true;
    }
}

static void conn_open_ws(struct conn *c)
{
    struct driver *d = c->d;
    if (wslay_event_context_client_init(&c->ws, &ws_callbacks, c) != 0) {
        conn_fail(c, "wslay_event_context_client_init failed");
        return;
    }
    wslay_event_config_set_max_recv_msg_length(c->ws, MAX_MSG);
    c->st = C_OPEN;
    queue(c, WSLAY_BINARY_FRAME, d->tools->p, d->tools->n);
    if (d->plan.pipeline && d->plan.blocks)
        start_block(c);
}

/* Lets wslay read (when `readable`) and write, then sets the epoll interest from what it wants. */
static void conn_pump_ws(struct conn *c, bool readable)
{
    c->replies = 0;
    if (!c->failed && (readable || c->pre_off < c->hlen) && wslay_event_want_read(c->ws)) {
        int r = wslay_event_recv(c->ws);
        if (r != 0 && !c->eof)
            conn_fail(c, "wslay_event_recv: %d", r);
    }
    if (!c->failed && !c->eof && wslay_event_want_write(c->ws)) {
        int r = wslay_event_send(c->ws);
        if (r != 0)
            conn_fail(c, "wslay_event_send: %d", r);
    }
    if (c->replies) { /* the client's own time to answer a tool_call: read to written */
        double us = (double)(now_ns() - c->t_evt) / 1000.0;
        for (unsigned i = 0; i < c->replies; i++)
            samples_add(&c->d->handling, us);
    }
    if (c->failed || c->eof) {
        if (c->eof && c->st != C_CLOSING && !c->failed)
            conn_fail(c, "server closed the connection mid-turn");
        conn_finish(c);
        return;
    }
    bool rd = wslay_event_want_read(c->ws), wr = wslay_event_want_write(c->ws);
    if (!rd && !wr) { /* close frames exchanged */
        conn_finish(c);
        return;
    }
    conn_set_events(c, (rd ? EPOLLIN : 0) | (wr ? EPOLLOUT : 0));
}

static void conn_event(struct conn *c, uint32_t ev)
{
    c->t_evt = now_ns();
    if (c->st == C_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
            conn_fail(c, "connect: %s", strerror(err));
            conn_finish(c);
            return;
        }
        c->st = C_HTTP;
        ev |= EPOLLOUT;
    }
    if (c->st == C_HTTP) {
        while (c->req_off < c->req_len) {
            ssize_t r = send(c->fd, c->req + c->req_off, c->req_len - c->req_off, MSG_NOSIGNAL);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                break;
            if (r < 0) {
                conn_fail(c, "send: %s", strerror(errno));
                conn_finish(c);
                return;
            }
            c->req_off += (size_t)r;
        }
        if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR) && http_response(c))
            conn_open_ws(c);
        if (c->failed) {
            conn_finish(c);
            return;
        }
        if (c->st == C_HTTP) {
            conn_set_events(c, EPOLLIN | (c->req_off < c->req_len ? EPOLLOUT : 0));
            return;
        }
        ev |= EPOLLIN; /* bytes after the 101 may already be buffered: read now */
    }
    conn_pump_ws(c, ev & (EPOLLIN | EPOLLHUP | EPOLLERR));
}

static int driver_init(struct driver *d, uint16_t port, const struct blob *tools,
                       const struct blob *empty)
{
    memset(d, 0, sizeof *d);
    d->ep = epoll_create1(EPOLL_CLOEXEC);
    if (d->ep < 0)
        return -1;
    d->addr.sin_family = AF_INET;
    d->addr.sin_port = htons(port);
    d->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    d->tools = tools;
    d->empty = empty;
    d->max_active = 1;
    d->max_pending = 1;
    d->launch_until = UINT64_MAX;
    return 0;
}

static void driver_bury(struct driver *d)
{
    while (d->graveyard) {
        struct conn *c = d->graveyard;
        d->graveyard = c->next;
        free(c);
    }
}

/* Runs until nothing is left to launch and every live turn is held idle (or gone), or until
 * the deadline, when every turn still busy is failed. */
static void driver_run(struct driver *d, uint64_t deadline)
{
    struct epoll_event evs[256];
    if (!d->t_first)
        d->t_first = now_ns();
    for (;;) {
        uint64_t t = now_ns();
        while (d->to_launch && t < d->launch_until && d->active < d->max_active &&
               d->active - d->ready_now < d->max_pending &&
               (!d->gap_ns || !d->t_last_done || t >= d->t_last_done + d->gap_ns))
            conn_start(d);
        driver_bury(d);
        bool launching = d->to_launch && t < d->launch_until;
        if (!launching && d->active == d->held_now)
            return;
        if (t >= deadline) {
            for (struct conn *c = d->live; c; c = d->live) {
                conn_fail(c, "timed out (bench deadline)");
                conn_finish(c);
            }
            driver_bury(d);
            return;
        }
        uint64_t wait_ms = (deadline - t) / 1000000 + 1;
        if (d->gap_ns && d->to_launch && d->active == 0)
            wait_ms = 1;
        int n = epoll_wait(d->ep, evs, 256, wait_ms > 100 ? 100 : (int)wait_ms);
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (!c->dead)
                conn_event(c, evs[i].events);
        }
    }
}

/* Ends every held turn (shutdown + close 1000) and waits for them to finish. */
static void driver_release(struct driver *d, uint64_t deadline)
{
    d->plan.hold = false;
    for (struct conn *c = d->live, *next; c; c = next) {
        next = c->next;
        if (c->held) {
            end_turn(c);
            c->t_evt = now_ns();
            conn_pump_ws(c, false);
        }
    }
    driver_run(d, deadline);
}

/* Runs one more block on the driver's one held turn, which stays open and held after it:
 * `upload` as the block's workspace archive (NULL: the empty one), `code` as its code. Returns
 * the block's round trip in ms (workspace archive sent -> snapshot received), NAN when the turn
 * failed (d->first_err says why). */
static double driver_block(struct driver *d, const struct blob *upload, const char *code,
                           uint64_t deadline)
{
    struct conn *c = d->live;
    if (!c || c->next || !c->held || c->failed)
        return NAN;
    free(d->plan.run.p);
    d->plan.run = run_frame(code);
    d->plan.upload = upload;
    d->plan.blocks = c->blocks_done + 1;
    c->held = false;
    d->held_now--;
    size_t n0 = d->block_rtt.n;
    start_block(c);
    c->t_evt = now_ns();
    conn_pump_ws(c, false);
    driver_run(d, deadline); /* returns once the turn is held again, or gone */
    if (d->live != c || c->failed || d->block_rtt.n == n0)
        return NAN;
    return d->block_rtt.v[d->block_rtt.n - 1];
}

static void driver_free(struct driver *d)
{
    for (struct conn *c = d->live; c; c = d->live)
        conn_finish(c);
    driver_bury(d);
    if (d->ep >= 0)
        close(d->ep);
    samples_free(&d->turn_start);
    samples_free(&d->block_rtt);
    samples_free(&d->handling);
    free(d->out_stdout);
    free(d->out_stderr);
    free(d->plan.run.p);
    d->ep = -1;
}

/* ------------------------------------------------------------------------------------------ */
/* servers                                                                                    */

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
};

static struct server *live_servers[8];

static void server_find_infra(struct server *s);

static void on_fatal_signal(int sig)
{
    for (size_t i = 0; i < sizeof live_servers / sizeof *live_servers; i++)
        if (live_servers[i] && live_servers[i]->pid > 0)
            kill(-live_servers[i]->pid, SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* The log from byte `from` to its current end, NUL-terminated. */
static char *server_log(const struct server *s, size_t from, size_t *len)
{
    struct stat st;
    size_t n = fstat(s->log_fd, &st) == 0 && (size_t)st.st_size > from ? (size_t)st.st_size - from
                                                                          : 0;
    char *buf = xmalloc(n + 1);
    ssize_t r = n ? pread(s->log_fd, buf, n, (off_t)from) : 0;
    n = r > 0 ? (size_t)r : 0;
    buf[n] = 0;
    if (len)
        *len = n;
    return buf;
}

static size_t server_log_mark(const struct server *s)
{
    struct stat st;
    return fstat(s->log_fd, &st) == 0 ? (size_t)st.st_size : 0;
}

static void server_stop(struct server *s)
{
    if (s->pid <= 0)
        return;
    kill(s->baseline ? -s->pid : s->pid, SIGTERM);
    int status;
    bool gone = false;
    for (int i = 0; i < 1000 && !gone; i++) { /* up to 10 s for an orderly exit */
        if (waitpid(s->pid, &status, WNOHANG) == s->pid)
            gone = true;
        else
            sleep_ms(10);
    }
    /* Whatever is left of the group (fork server, sandboxes, baseline turns) goes too. */
    kill(-s->pid, SIGKILL);
    if (!gone)
        waitpid(s->pid, &status, 0);
    for (size_t i = 0; i < sizeof live_servers / sizeof *live_servers; i++)
        if (live_servers[i] == s)
            live_servers[i] = NULL;
    s->pid = 0;
}

/* Starts argv with stdout/stderr in a memfd, in its own process group, and waits (at most
 * 30 s) for its "listening on 127.0.0.1:PORT" line. On failure, `why` holds the reason (for a
 * rejected flag: the server's own message). */
static int server_start(struct server *s, const char *name, bool baseline, char *const argv[],
                        char *why, size_t whylen)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->baseline = baseline;
    size_t off = 0;
    for (size_t i = 0; argv[i] && off < sizeof s->cmd; i++)
        off += (size_t)snprintf(s->cmd + off, sizeof s->cmd - off, "%s%s", i ? " " : "", argv[i]);
    s->log_fd = memfd_create("forkbox-bench-log", MFD_CLOEXEC);
    if (s->log_fd < 0) {
        snprintf(why, whylen, "memfd_create: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, whylen, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        dup2(s->log_fd, 1);
        dup2(s->log_fd, 2);
        signal(SIGPIPE, SIG_DFL);
        execv(argv[0], argv);
        dprintf(2, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    s->pid = pid;
    for (size_t i = 0; i < sizeof live_servers / sizeof *live_servers; i++)
        if (!live_servers[i]) {
            live_servers[i] = s;
            break;
        }
    uint64_t deadline = now_ns() + 30ull * 1000000000u;
    while (now_ns() < deadline) {
        char *log = server_log(s, 0, NULL);
        char *l = strstr(log, "listening on 127.0.0.1:");
        unsigned port = 0;
        if (l && sscanf(l, "listening on 127.0.0.1:%u", &port) == 1 && port && port < 65536) {
            s->port = (uint16_t)port;
            free(log);
            if (!baseline)
                server_find_infra(s);
            return 0;
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            /* the last non-empty line says why */
            size_t n = strlen(log);
            while (n && (log[n - 1] == '\n' || log[n - 1] == ' '))
                log[--n] = 0;
            char *last = strrchr(log, '\n');
            snprintf(why, whylen, "exited with status %d: %s", WIFEXITED(status) ?
                     WEXITSTATUS(status) : 128 + WTERMSIG(status), last ? last + 1 : log);
            free(log);
            s->pid = 0;
            server_stop(s);
            close(s->log_fd);
            s->log_fd = -1;
            return -1;
        }
        free(log);
        sleep_ms(5);
    }
    snprintf(why, whylen, "no \"listening on\" line within 30 s");
    server_stop(s);
    close(s->log_fd);
    s->log_fd = -1;
    return -1;
}

/* Server-side turn start from forkboxd's debug log after `mark`. */
static void server_ready_times(const struct server *s, size_t mark, struct samples *ready,
                               struct samples *spawn)
{
    char *log = server_log(s, mark, NULL);
    for (char *p = log; (p = strstr(p, ": ready ")) != NULL; p++) {
        double r, sp;
        if (sscanf(p, ": ready %lf ms after the upgrade (spawn %lf ms)", &r, &sp) == 2) {
            samples_add(ready, r);
            samples_add(spawn, sp);
        }
    }
    free(log);
}

/* ------------------------------------------------------------------------------------------ */
/* /proc                                                                                      */

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
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t r = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (r <= 0)
            continue;
        buf[r] = 0;
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
static long pss_kb(pid_t pid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/smaps_rollup", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r <= 0)
        return -1;
    buf[r] = 0;
    char *p = strstr(buf, "\nPss:");
    return p ? strtol(p + 5, NULL, 10) : -1;
}

/* True if `pid` shares its address space with its parent (a sandbox's init and runtime are
 * two processes with one mm): its Pss is then already in the parent's. */
static bool shares_parent_mm(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t r = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
    if (fd >= 0)
        close(fd);
    if (r <= 0)
        return false;
    buf[r] = 0;
    char *rp = strrchr(buf, ')');
    int ppid;
    if (!rp || sscanf(rp + 2, "%*c %d", &ppid) != 1 || ppid <= 1)
        return false;
    return syscall(SYS_kcmp, ppid, pid, KCMP_VM, 0, 0) == 0;
}

/* Whether some cgroup hierarchy is mounted with favordynmods: without it, moving a task into a
 * cgroup (every fresh sandbox) waits for an RCU grace period (README, "Tuning the host"). */
static bool cgroup_favordynmods(void)
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

static long meminfo_kb(const char *key)
{
    char buf[4096];
    int fd = open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
    ssize_t r = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
    if (fd >= 0)
        close(fd);
    if (r <= 0)
        return -1;
    buf[r] = 0;
    char *p = strstr(buf, key);
    return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

/* The processes that serve turns: below forkboxd's fork server (every child of forkboxd), or
 * below the baseline launcher. `top` gets the fork server(s) or the launcher itself. */
struct tree {
    pid_t *turns;
    size_t nturns;
    pid_t *top;
    size_t ntop;
};

static void server_tree(const struct server *s, struct tree *tr)
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
static void server_find_infra(struct server *s)
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

static void tree_free(struct tree *tr)
{
    free(tr->turns);
    free(tr->top);
}

/* Waits (bounded) until no turn process is left below the server, so that one measurement's
 * teardown does not run into the next one. */
static void server_wait_quiet(const struct server *s, unsigned max_ms)
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

/* ------------------------------------------------------------------------------------------ */
/* the measurements                                                                           */

struct counts {
    unsigned start_turns, py_turns, rtt_blocks, calls, pss_small, pss_big, import_turns;
    double tp_secs;
};

struct bench {
    struct blob tools, empty;
    struct counts fb, bl; /* forkbox and baseline */
    const char *bench_dir, *python;
    unsigned gap_ms;      /* idle time between sequential turn-start turns */
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
    G_ALL = (1 << 9) - 1,
};
static const char *const group_names[] = {"start", "rtt",  "tool", "throughput", "pss",
                                          "import", "pool", "preload", "bigdata"};

static int parse_groups(const char *list, unsigned *out)
{
    char *copy = strdup(list), *save = NULL;
    unsigned g = 0;
    int r = 0;
    for (char *w = strtok_r(copy, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        size_t i = 0;
        while (i < sizeof group_names / sizeof *group_names && strcmp(w, group_names[i]))
            i++;
        if (i == sizeof group_names / sizeof *group_names) {
            fprintf(stderr, "forkbox-bench: --rows: no group '%s'\n", w);
            r = -1;
            break;
        }
        g |= 1u << i;
    }
    free(copy);
    *out = g;
    return g ? r : -1;
}

static double ms_since(uint64_t t0) { return (double)(now_ns() - t0) / NS_PER_MS; }

/* This process's CPU time (user + system) in seconds: the load generator must not be the
 * bottleneck of a throughput row. */
static double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static void loadavg(char *out, size_t n)
{
    int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    ssize_t r = fd < 0 ? -1 : read(fd, out, n - 1);
    if (fd >= 0)
        close(fd);
    out[r > 0 ? r : 0] = 0;
    char *sp = out;
    for (int i = 0; i < 3 && sp; i++)
        sp = strchr(sp + 1, ' ');
    if (sp)
        *sp = 0;
}

static void report_failures(struct bench *b, const struct server *s, const char *what,
                            const struct driver *d, bool fatal)
{
    if (!d->turns_failed)
        return;
    progress("[%s] %s: %lu of %lu turns failed; first: %s", s->name, what, d->turns_failed,
             d->turns_failed + d->turns_ok, d->first_err);
    if (fatal)
        b->failed = true;
}

/* Turn start, one turn at a time: connect -> 101 -> tools archive -> ready, then shutdown and
 * close. Client-side samples in `cli`, server-side (forkboxd only) in `srv`/`spawn`. */
static void measure_turn_start(struct bench *b, struct server *s, unsigned n, unsigned gap_ms,
                               struct samples *cli, struct samples *srv, struct samples *spawn)
{
    struct driver d;
    driver_init(&d, s->port, &b->tools, &b->empty);
    d.to_launch = 3; /* warm-up, not counted */
    driver_run(&d, now_ns() + 60ull * 1000000000u);
    samples_reset(&d.turn_start);
    if (!s->baseline)
        server_wait_quiet(s, 2000);
    size_t mark = server_log_mark(s);
    uint64_t t0 = now_ns();
    d.gap_ns = (uint64_t)gap_ms * 1000000u;
    d.to_launch = n;
    driver_run(&d, now_ns() + (s->baseline ? 120ull : 60ull) * 1000000000u);
    for (size_t i = 0; i < d.turn_start.n; i++)
        samples_add(cli, d.turn_start.v[i]);
    if (srv && !s->baseline)
        server_ready_times(s, mark, srv, spawn);
    progress("[%s] turn start: %zu turns %u ms apart in %.0f ms, p50 %.3f ms", s->name,
             d.turn_start.n, gap_ms, ms_since(t0), samples_pct(cli, 50));
    report_failures(b, s, "turn start", &d, true);
    driver_free(&d);
}

/* Turn start as a Python (websockets) client sees it: tools/bench/py_turnstart.py. */
static double measure_py_turn_start(struct bench *b, struct server *s, unsigned n, unsigned gap_ms)
{
    char script[PATH_MAX], url[64], count[16], gap[16];
    snprintf(gap, sizeof gap, "%u", gap_ms);
    snprintf(script, sizeof script, "%s/py_turnstart.py", b->bench_dir);
    snprintf(url, sizeof url, "ws://127.0.0.1:%u/", s->port);
    snprintf(count, sizeof count, "%u", n + 3);
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0)
        return NAN;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        char *argv[] = {(char *)b->python, script, url, count, "90", gap, NULL};
        execv(b->python, argv);
        _exit(127);
    }
    close(pfd[1]);
    struct samples sm = {0};
    char buf[8192];
    size_t len = 0;
    uint64_t deadline = now_ns() + 120ull * 1000000000u;
    for (;;) {
        struct timeval tv = {1, 0};
        fd_set rs;
        FD_ZERO(&rs);
        FD_SET(pfd[0], &rs);
        if (now_ns() > deadline) {
            kill(pid, SIGKILL);
            break;
        }
        if (select(pfd[0] + 1, &rs, NULL, NULL, &tv) <= 0)
            continue;
        ssize_t r = read(pfd[0], buf + len, sizeof buf - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
        buf[len] = 0;
        char *nl;
        while ((nl = strchr(buf, '\n')) != NULL) {
            *nl = 0;
            samples_add(&sm, atof(buf));
            len -= (size_t)(nl + 1 - buf);
            memmove(buf, nl + 1, len + 1);
        }
        if (len == sizeof buf - 1)
            len = 0;
    }
    close(pfd[0]);
    int status;
    waitpid(pid, &status, 0);
    double p50 = samples_pct_from(&sm, 3, 50); /* the first three warm up */
    progress("[%s] Python client turn start: %zu turns, p50 %.3f ms", s->name,
             sm.n > 3 ? sm.n - 3 : 0, p50);
    samples_free(&sm);
    return p50;
}

/* Empty-block round trip: one turn, `n` blocks of `pass` after ready (empty archive + run, until
 * the workspace archive after output). */
static void measure_rtt(struct bench *b, struct server *s, unsigned n, double *p50, double *p99)
{
    struct driver d;
    driver_init(&d, s->port, &b->tools, &b->empty);
    d.plan.blocks = n + 10;
    d.plan.run = run_frame("pass");
    d.plan.expect = "";
    d.to_launch = 1;
    driver_run(&d, now_ns() + 120ull * 1000000000u);
    *p50 = samples_pct_from(&d.block_rtt, 10, 50);
    *p99 = samples_pct_from(&d.block_rtt, 10, 99);
    progress("[%s] empty block: %zu blocks, p50 %.3f ms, p99 %.3f ms", s->name,
             d.block_rtt.n > 10 ? d.block_rtt.n - 10 : 0, *p50, *p99);
    report_failures(b, s, "empty blocks", &d, true);
    driver_free(&d);
}

/* Tool-call round trip timed inside the sandbox; the client answers every call at once and
 * times its own answer (read to written). */
/* One turn with one block running code, output captured, within secs; the caller reads d and
 * frees it with driver_free. */
static void run_one_block(struct bench *b, struct server *s, const char *code, unsigned secs,
                          struct driver *d)
{
    driver_init(d, s->port, &b->tools, &b->empty);
    d->plan.blocks = 1;
    d->plan.run = run_frame(code);
    d->plan.capture = true;
    d->to_launch = 1;
    driver_run(d, now_ns() + (uint64_t)secs * 1000000000u);
}

/* Tool-call round trip timed inside the sandbox: the median call of each of TOOL_TURNS turns,
 * then the median over the turns (where the scheduler puts the four parties of a call on two
 * CPUs changes a turn's figure by a third; one turn is not a measurement). */
#define TOOL_TURNS 5
static void measure_tool_call(struct bench *b, struct server *s, unsigned calls, double *inside_us,
                              double *client_us)
{
    char code[640];
    unsigned per_turn = calls / TOOL_TURNS ? calls / TOOL_TURNS : 1;
    snprintf(code, sizeof code,
             "import time\n"
             "from tools import echo\n"
             "for _ in range(50):\n"
             "    echo(message='x')\n"
             "ts = []\n"
             "for _ in range(%u):\n"
             "    t = time.perf_counter()\n"
             "    echo(message='x')\n"
             "    ts.append(time.perf_counter() - t)\n"
             "ts.sort()\n"
             "print(ts[len(ts) // 2] * 1e6)\n",
             per_turn);
    struct samples inside = {0}, client = {0};
    unsigned long answered = 0;
    for (int i = 0; i < TOOL_TURNS; i++) {
        struct driver d;
        run_one_block(b, s, code, 120, &d);
        if (d.out_stdout && d.out_code == 0)
            samples_add(&inside, atof(d.out_stdout));
        else if (d.out_stderr)
            progress("[%s] tool-call block failed: %.300s", s->name, d.out_stderr);
        for (size_t k = 50 < d.handling.n ? 50 : d.handling.n; k < d.handling.n; k++)
            samples_add(&client, d.handling.v[k]);
        answered += d.tool_calls;
        report_failures(b, s, "tool calls", &d, true);
        driver_free(&d);
    }
    *inside_us = samples_pct(&inside, 50);
    *client_us = samples_pct(&client, 50);
    progress("[%s] tool calls: %lu answered in %d turns, median call %.1f us inside (turns: "
             "%.1f..%.1f), client %.1f us", s->name, answered, TOOL_TURNS, *inside_us,
             samples_pct(&inside, 0), samples_pct(&inside, 100), *client_us);
    samples_free(&inside);
    samples_free(&client);
}

/* Throughput: `conc` turns in flight, each `k` blocks of print(1) (pipelined like the host: tools,
 * archive and run back to back), a new turn as soon as one ends; new turns for `secs`, then the
 * ones in flight finish. Rates are over the time to the last completed turn. */
/* All CPUs' busy and total jiffies from /proc/stat (busy: everything but idle and iowait). */
static void machine_jiffies(unsigned long long *busy, unsigned long long *total)
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

static void measure_throughput(struct bench *b, struct server *s, unsigned conc, unsigned k,
                               double secs, double *turns_s, double *blocks_s, double *cpu_ms)
{
    struct driver d;
    driver_init(&d, s->port, &b->tools, &b->empty);
    d.plan.blocks = k;
    d.plan.run = run_frame("print(1)");
    d.plan.expect = "1\n";
    d.plan.pipeline = true;
    d.max_active = d.max_pending = conc;
    d.to_launch = 1000000;
    uint64_t t0 = now_ns();
    double cpu0 = self_cpu_s();
    unsigned long long busy0, total0, busy1, total1;
    machine_jiffies(&busy0, &total0);
    d.t_first = t0;
    d.launch_until = t0 + (uint64_t)(secs * 1e9);
    driver_run(&d, d.launch_until + 60ull * 1000000000u);
    double el = d.t_last_done > t0 ? (double)(d.t_last_done - t0) / 1e9 : NAN;
    *turns_s = (double)d.turns_ok / el;
    *blocks_s = (double)d.blocks_ok / el;
    machine_jiffies(&busy1, &total1);
    progress("[%s] throughput %ux%u: %lu turns in %.2f s: %.1f turns/s, %.1f blocks/s "
             "(load generator CPU %.0f%%, machine busy %.0f%%)", s->name, conc, k, d.turns_ok,
             el, *turns_s, *blocks_s, 100.0 * (self_cpu_s() - cpu0) / ms_since(t0) * 1000.0,
             total1 > total0 ? 100.0 * (double)(busy1 - busy0) / (double)(total1 - total0) : NAN);
    report_failures(b, s, "throughput", &d, true);
    /* CPU per turn: every CPU's busy time from the first turn until every sandbox is reaped
     * (and the kernel's deferred teardown had a moment), less the load generator's own. Not the
     * server's rusage: a pid namespace's init that is killed auto-reaps the rest of the
     * namespace (zap_pid_ns_processes ignores SIGCHLD), so the runtime's CPU never reaches any
     * cutime, and kernel threads (namespace teardown, RCU) are nobody's child. Assumes nothing
     * else runs on the machine, like every other row. */
    server_wait_quiet(s, 10000);
    sleep_ms(200);
    machine_jiffies(&busy1, &total1);
    double busy_s = (double)(busy1 - busy0) / (double)sysconf(_SC_CLK_TCK);
    double per = d.turns_ok ? (busy_s - (self_cpu_s() - cpu0)) * 1e3 / (double)d.turns_ok : NAN;
    if (cpu_ms)
        *cpu_ms = per;
    progress("[%s] throughput %ux%u: CPU %.2f ms per turn (whole machine, less the load "
             "generator)", s->name, conc, k, per);
    driver_free(&d);
}

/* Memory per idle turn: open n turns (each after ready, or after `blocks` `pass` blocks, between
 * blocks) at most 16 starting at once, then sum Pss over every process that serves them. */
static void measure_pss_after(struct bench *b, struct server *s, unsigned n, unsigned blocks,
                              double *per_turn_mb, double *held, double *top_mb,
                              double *kernel_mb)
{
    struct driver d;
    driver_init(&d, s->port, &b->tools, &b->empty);
    d.plan.hold = true;
    if (blocks) {
        d.plan.blocks = blocks;
        d.plan.run = run_frame("pass");
        d.plan.expect = "";
    }
    d.max_active = UINT_MAX;
    d.max_pending = 16;
    d.max_fail = n / 20 + 1; /* a few failures are reported; many mean the server is full */
    d.to_launch = n;
    long avail0 = meminfo_kb("MemAvailable:");
    uint64_t t0 = now_ns();
    driver_run(&d, now_ns() + 240ull * 1000000000u);
    double open_ms = ms_since(t0);
    sleep_ms(300); /* let the last sandboxes settle after ready */
    long avail1 = meminfo_kb("MemAvailable:");
    struct tree tr;
    server_tree(s, &tr);
    long sum = 0, top = 0;
    for (size_t i = 0; i < tr.nturns; i++) {
        long kb = shares_parent_mm(tr.turns[i]) ? 0 : pss_kb(tr.turns[i]);
        sum += kb > 0 ? kb : 0;
    }
    for (size_t i = 0; i < tr.ntop; i++) {
        long kb = pss_kb(tr.top[i]);
        top += kb > 0 ? kb : 0;
    }
    *held = d.held_now;
    *per_turn_mb = d.held_now ? (double)sum / 1024.0 / d.held_now : NAN;
    *top_mb = (double)top / 1024.0;
    *kernel_mb = d.held_now && avail0 > 0 && avail1 > 0
                     ? (double)(avail0 - avail1) / 1024.0 / d.held_now
                     : NAN;
    if (d.held_now < n)
        printf("note: %s held %u of %u idle turns: %s\n", s->name, d.held_now, n,
               d.turns_failed ? d.first_err : "(no failure reported)");
    progress("[%s] idle turns%s: %u of %u open in %.0f ms (%zu processes), Pss %.2f MB per "
             "turn, server top %.1f MB, MemAvailable drop %.2f MB per turn", s->name,
             blocks ? " after a block" : "", d.held_now, n, open_ms, tr.nturns, *per_turn_mb,
             *top_mb, *kernel_mb);
    tree_free(&tr);
    report_failures(b, s, "idle turns", &d, false);
    driver_release(&d, now_ns() + 120ull * 1000000000u);
    report_failures(b, s, "idle turns (release)", &d, true);
    driver_free(&d);
    server_wait_quiet(s, 30000);
}

static void measure_pss(struct bench *b, struct server *s, unsigned n, double *per_turn_mb,
                        double *held, double *top_mb, double *kernel_mb)
{
    measure_pss_after(b, s, n, 0, per_turn_mb, held, top_mb, kernel_mb);
}

/* `import MODULE` timed inside a block of a fresh turn, median over `turns` turns (ms). */
static double measure_import(struct bench *b, struct server *s, const char *module, unsigned turns)
{
    char code[256];
    snprintf(code, sizeof code,
             "import time\nt = time.perf_counter()\nimport %s\n"
             "print((time.perf_counter() - t) * 1e3)\n",
             module);
    struct samples sm = {0};
    for (unsigned i = 0; i < turns; i++) {
        struct driver d;
        run_one_block(b, s, code, 60, &d);
        if (d.out_stdout && d.out_code == 0)
            samples_add(&sm, atof(d.out_stdout));
        else if (d.out_stderr && i == 0) {
            /* numpy says why in "Original error was: ..."; otherwise the exception line */
            const char *why = strstr(d.out_stderr, "Original error was: ");
            size_t len = strlen(d.out_stderr);
            while (len && d.out_stderr[len - 1] == '\n')
                d.out_stderr[--len] = 0;
            if (why)
                why += strlen("Original error was: ");
            else
                why = strrchr(d.out_stderr, '\n') ? strrchr(d.out_stderr, '\n') + 1 : d.out_stderr;
            printf("note: %s: import %s failed in the turn: %.*s\n", s->name, module,
                   (int)strcspn(why, "\n"), why);
        }
        report_failures(b, s, "imports", &d, true);
        driver_free(&d);
    }
    double r = samples_pct(&sm, 50);
    progress("[%s] import %s: %.2f ms (median of %zu)", s->name, module, r, sm.n);
    samples_free(&sm);
    return r;
}

/* ------------------------------------------------------------------------------------------ */
/* big data (--rows bigdata): uploads, snapshots, big tool results and stdout, Python speed    */

/* One size of the upload/download rows: MiB of file content, and how many blocks measure it
 * (more for the small sizes, so that each row covers several MiB). */
static const unsigned big_mib[] = {1, 10, 50};
#define NBIGSZ 3
enum { K_TEXT, K_RANDOM, NKINDS };
static const char *const kind_name[] = {"text", "random"};
static const unsigned tool_mib[] = {1, 10, 40};
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

/* xorshift64*: fast, deterministic, and its output does not compress. */
static uint64_t xs_next(uint64_t *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 2685821657736338717ull;
}

static void fill_random(char *p, size_t n, uint64_t seed)
{
    uint64_t x = seed | 1;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = xs_next(&x);
        memcpy(p + i, &v, n - i < 8 ? n - i : 8);
    }
}

/* Text that compresses and deflates like prose (zlib -6: about 2.6:1, at about the speed it
 * does Python source): words drawn from a vocabulary of 1024 made-up words with English
 * letter frequencies, by Zipf's law (word k with weight 1/k), now and then a number or a
 * comma, in lines of 40-100 bytes (`nl` ' ' in place of '\n' when the text must be a JSON
 * string as is). A small vocabulary would make deflate's match search much slower than on
 * real text. */
#define VOCAB 1024
static void fill_text(char *p, size_t n, uint64_t seed, char nl)
{
    static const char letters[] = "eeeeeeeeeeeetttttttttaaaaaaaaooooooooiiiiiiinnnnnnnsssssss"
                                  "hhhhhhrrrrrrddddllllcccuuummwwffggyyppbbvkjxqz";
    static char vocab[VOCAB][16];
    static double cum[VOCAB];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    if (!vocab[0][0]) {
        double tot = 0;
        for (int i = 0; i < VOCAB; i++) {
            int len = 1 + (int)(xs_next(&x) % 4) + (int)(xs_next(&x) % 6) * (i > 64);
            for (int j = 0; j < len; j++)
                vocab[i][j] = letters[xs_next(&x) % (sizeof letters - 1)];
            cum[i] = tot += 1.0 / (i + 1);
        }
        for (int i = 0; i < VOCAB; i++)
            cum[i] /= tot;
    }
    x = seed | 1;
    size_t i = 0, line = 0, want = 60;
    while (i < n) {
        uint64_t r = xs_next(&x);
        double u = (double)(r >> 11) / 9007199254740992.0;
        size_t lo = 0, hi = VOCAB - 1;
        while (lo < hi) { /* the first word whose cumulative weight reaches u */
            size_t mid = (lo + hi) / 2;
            if (cum[mid] < u)
                lo = mid + 1;
            else
                hi = mid;
        }
        char word[24];
        int k = (r & 31) == 0 ? snprintf(word, sizeof word, "%u", (unsigned)(r >> 5) % 100000)
                              : snprintf(word, sizeof word, "%s%s", vocab[lo],
                                         (r & 31) == 1 ? "," : "");
        for (int j = 0; j < k && i < n; j++, line++)
            p[i++] = word[j];
        if (i == n)
            break;
        if (line >= want) {
            p[i++] = nl;
            line = 0;
            want = 40 + (size_t)(xs_next(&x) % 61);
        } else {
            p[i++] = ' ';
            line++;
        }
    }
}

static unsigned scale_u(unsigned v, double f);

static void bigdata_init(struct bigdata *bd, bool quick, double scale)
{
    memset(bd, 0, sizeof *bd);
    size_t max = (size_t)big_mib[NBIGSZ - 1] << 20, tmax = (size_t)tool_mib[NBIGSZ - 1] << 20;
    bd->text = xmalloc(max);
    bd->rnd = xmalloc(max);
    bd->json = xmalloc(tmax);
    fill_text(bd->text, max, 0x5eed, '\n');
    fill_random(bd->rnd, max, 0x5eed);
    fill_text(bd->json, tmax, 0xca11, ' ');
    static const unsigned reps[NBIGSZ] = {5, 3, 2}, reps_q[NBIGSZ] = {3, 2, 1};
    static const unsigned calls[NBIGSZ] = {10, 5, 3}, calls_q[NBIGSZ] = {4, 2, 2};
    for (int i = 0; i < NBIGSZ; i++) {
        bd->reps[i] = scale_u(quick ? reps_q[i] : reps[i], scale);
        bd->tool_calls[i] = scale_u(quick ? calls_q[i] : calls[i], scale);
    }
    bd->stdout_reps = scale_u(quick ? 2 : 3, scale);
    bd->change_reps = scale_u(quick ? 1 : 3, scale);
    bd->py_reps = scale_u(quick ? 3 : 5, scale);
    bd->py_rounds = quick ? 1 : 2;
}

/* The upload archive of one kind and size, built on first use (gzip level 1: only the bench's
 * own build time depends on the level, the server inflates any level at about the same speed). */
static const struct blob *bigdata_upload(struct bigdata *bd, int kind, int sz)
{
    struct blob *u = &bd->up[kind][sz];
    if (!u->p) {
        struct member m = {"up.dat", kind == K_TEXT ? bd->text : bd->rnd,
                           (size_t)big_mib[sz] << 20};
        if (make_targz_level(&m, 1, 1, u) < 0)
            return NULL;
    }
    return u;
}

static const struct blob *bigdata_change(struct bigdata *bd)
{
    if (!bd->change.p) {
        struct member m[CHANGE_FILES];
        char names[CHANGE_FILES][16];
        for (int i = 0; i < CHANGE_FILES; i++) {
            snprintf(names[i], sizeof names[i], "c%02d.txt", i);
            m[i] = (struct member){names[i], bd->text + ((size_t)i << 20), 1u << 20};
        }
        if (make_targz_level(m, CHANGE_FILES, 1, &bd->change) < 0)
            return NULL;
    }
    return &bd->change;
}

static void bigdata_free(struct bigdata *bd)
{
    for (int k = 0; k < NKINDS; k++)
        for (int i = 0; i < NBIGSZ; i++)
            free(bd->up[k][i].p);
    free(bd->change.p);
    free(bd->text);
    free(bd->rnd);
    free(bd->json);
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
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t r = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
    if (fd >= 0)
        close(fd);
    if (r <= 0)
        return -1;
    buf[r] = 0;
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
        int f2 = open(p2, O_RDONLY | O_CLOEXEC);
        ssize_t r2 = f2 < 0 ? -1 : read(f2, buf, sizeof buf - 1);
        if (f2 >= 0)
            close(f2);
        if (r2 > 0) {
            buf[r2] = 0;
            live += strtoll(buf, NULL, 10);
        }
    }
    if (dir)
        closedir(dir);
    return live > from_stat ? live : from_stat;
}

/* The CPU of a server's processes at one moment: the supervisor (forkboxd itself) and every
 * process that serves turns (fork server and its helper, sandboxes; for the baseline, the
 * launcher and its per-turn processes). */
struct cpu_mark {
    long long sup;      /* forkboxd's own, ns; 0 for the baseline */
    pid_t *pid;         /* the other processes (owned) */
    long long *ns;      /* their CPU, ns (owned) */
    size_t n;
};

static void cpu_mark(const struct server *s, struct cpu_mark *m)
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

/* CPU used since `m` in ms: the supervisor's (`sup`, NAN for the baseline) and the whole
 * server's (`all`: the supervisor plus every process of `m` or born since; a process that
 * exited since `m` is lost, and none of the blocks measured here starts one). Frees `m`. */
static void cpu_since(const struct server *s, struct cpu_mark *m, double *sup, double *all)
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

/* Opens one turn and holds it after ready; false (reason in `why`) if it did not get there. */
static bool big_open(struct bench *b, struct server *s, struct driver *d, char *why, size_t n)
{
    server_wait_quiet(s, 10000); /* only this turn's processes below the server */
    driver_init(d, s->port, &b->tools, &b->empty);
    d->plan.hold = true;
    d->plan.capture = true;
    d->to_launch = 1;
    driver_run(d, now_ns() + 60ull * 1000000000u);
    if (d->held_now == 1)
        return true;
    snprintf(why, n, "the turn did not open: %s", d->first_err[0] ? d->first_err : "?");
    return false;
}

/* One block on the held turn; the block must exit 0 (and print `expect`, if given). Returns
 * its round trip in ms, or NAN with the reason in `why`. */
static double big_block(struct driver *d, const struct blob *up, const char *code,
                        const char *expect, unsigned secs, char *why, size_t n)
{
    double ms = driver_block(d, up, code, now_ns() + (uint64_t)secs * 1000000000u);
    if (isnan(ms)) {
        snprintf(why, n, "turn failed: %s", d->first_err[0] ? d->first_err : "?");
        return NAN;
    }
    if (d->out_code != 0 || (expect && strcmp(d->out_stdout, expect))) {
        const char *e = d->out_stderr ? d->out_stderr : "";
        size_t len = strlen(e);
        while (len && e[len - 1] == '\n')
            len--;
        const char *last = e + len;
        while (last > e && last[-1] != '\n')
            last--;
        snprintf(why, n, "block exited %" PRId64 ", stdout %.40s, stderr: %.*s", d->out_code,
                 d->out_stdout ? d->out_stdout : "", (int)(e + len - last), last);
        return NAN;
    }
    return ms;
}

/* The row failed: say why on stdout (before the table) and leave it n/a. */
static void big_note(struct bench *b, const struct server *s, const char *row, const char *why)
{
    printf("note: %s: bigdata %s: n/a: %s\n", s->name, row, why);
    progress("[%s] bigdata %s: n/a: %s", s->name, row, why);
    fflush(stdout);
    (void)b;
}

/* "12.34" or "n/a", for progress lines (the baseline has no supervisor figure). */
static const char *fmt_ms(char *buf, size_t n, double v)
{
    if (isnan(v))
        snprintf(buf, n, "n/a");
    else
        snprintf(buf, n, "%.2f", v);
    return buf;
}

static double median_of(double *v, size_t n)
{
    struct samples sm = {.v = v, .n = n, .cap = n};
    return samples_pct(&sm, 50);
}

/* ------------------------------------------------------------------------------------------ */
/* the table                                                                                  */

enum col { COL_ISO, COL_NOISO, COL_BASE, NCOLS };

enum row {
    R_SRV_P50, R_SRV_P99, R_SPAWN_P50, R_CLI_P50, R_CLI_P99, R_PY_P50,
    R_POOL_SRV_P50, R_POOL_SRV_P99, R_POOL_CLI_P50, R_POOL_PY_P50, R_POOL_B2B_P50,
    R_PRE_SRV_P50, R_PRE_CLI_P50,
    R_RTT_P50, R_RTT_P99,
    R_TC_INSIDE, R_TC_CLIENT, R_TC_ADDED,
    R_TP4, R_TP16, R_TP64, R_TP4x5, R_BP4x5, R_TP16x5, R_BP16x5, R_CPU1, R_CPU5,
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

struct rowdef {
    char name[64];
    int higher_better;   /* for the ratio: rates are forkbox/baseline, the rest baseline/forkbox */
    const char *target;  /* printed as is */
    int cmp;             /* 0: no check; -1: value <= thr; +1: value >= thr; -2: <= baseline */
    bool no_ratio;       /* the value is itself a ratio, or the baseline's is the same thing */
    double thr;
    enum row base_row;   /* where the baseline value comes from (rows the baseline lacks) */
    int prec;            /* decimals */
};

static struct rowdef rows[NROWS];
static double val[NROWS][NCOLS];

static void row_def(enum row r, const char *name, int hb, const char *target, int cmp,
                    double thr, int prec)
{
    snprintf(rows[r].name, sizeof rows[r].name, "%s", name);
    rows[r].higher_better = hb;
    rows[r].target = target;
    rows[r].cmp = cmp;
    rows[r].thr = thr;
    rows[r].base_row = r;
    rows[r].prec = prec;
}

static void rows_init(const struct counts *fb)
{
    char n1[64], n2[64], n3[64], n4[64], n5[64], n6[64], n7[64];
    row_def(R_SRV_P50, "turn start p50, server: upgrade->ready [ms]", 0, "<= 2", -1, 2, 3);
    row_def(R_SRV_P99, "turn start p99, server [ms]", 0, "<= 10", -1, 10, 3);
    row_def(R_SPAWN_P50, "  of which spawn (clone+isolation) p50 [ms]", 0, "", 0, 0, 3);
    row_def(R_CLI_P50, "turn start p50, C client: connect->ready [ms]", 0, "", 0, 0, 3);
    row_def(R_CLI_P99, "turn start p99, C client [ms]", 0, "<= 10", -1, 10, 3);
    row_def(R_PY_P50, "turn start p50, Python websockets client [ms]", 0, "<= 3", -1, 3, 3);
    row_def(R_POOL_SRV_P50, "turn start p50, server, --pool 8, turns apart [ms]", 0, "<= 2", -1,
            2, 3);
    row_def(R_POOL_SRV_P99, "turn start p99, server, --pool 8, turns apart [ms]", 0, "<= 10", -1,
            10, 3);
    row_def(R_POOL_CLI_P50, "turn start p50, C client, --pool 8, turns apart [ms]", 0, "", 0, 0,
            3);
    row_def(R_POOL_PY_P50, "turn start p50, Python client, --pool 8, apart [ms]", 0, "<= 3", -1,
            3, 3);
    row_def(R_POOL_B2B_P50, "turn start p50, server, --pool 8, back to back [ms]", 0, "", 0, 0,
            3);
    row_def(R_PRE_SRV_P50, "turn start p50, server, --preload numpy,pandas [ms]", 0, "", 0, 0,
           3);
    row_def(R_PRE_CLI_P50, "turn start p50, C client, --preload numpy,pandas [ms]", 0, "", 0, 0,
           3);
    row_def(R_RTT_P50, "empty block round trip p50 [ms]", 0, "", 0, 0, 3);
    row_def(R_RTT_P99, "empty block round trip p99 [ms]", 0, "", 0, 0, 3);
    row_def(R_TC_INSIDE, "tool call round trip, timed in the sandbox [us]", 0, "", 0, 0, 1);
    row_def(R_TC_CLIENT, "  client's own time to answer, p50 [us]", 0, "", 0, 0, 1);
    row_def(R_TC_ADDED, "  added by the server (inside - client) [us]", 0, "<= 100", -1, 100,
           1);
    row_def(R_TP4, "throughput 4 x 1 block [turns/s]", 1, ">= 500", +1, 500, 0);
    row_def(R_TP16, "throughput 16 x 1 block [turns/s]", 1, ">= 500", +1, 500, 0);
    row_def(R_TP64, "throughput 64 x 1 block [turns/s]", 1, ">= 500", +1, 500, 0);
    row_def(R_TP4x5, "throughput 4 x 5 blocks [turns/s]", 1, "", 0, 0, 1);
    row_def(R_BP4x5, "throughput 4 x 5 blocks [blocks/s]", 1, "", 0, 0, 0);
    row_def(R_TP16x5, "throughput 16 x 5 blocks [turns/s]", 1, "", 0, 0, 1);
    row_def(R_BP16x5, "throughput 16 x 5 blocks [blocks/s]", 1, "", 0, 0, 0);
    row_def(R_CPU1, "CPU per 1-block turn, machine less client (16x1) [ms]", 0, "", 0, 0, 2);
    row_def(R_CPU5, "CPU per 5-block turn, machine less client (16x5) [ms]", 0, "", 0, 0, 2);
    snprintf(n1, sizeof n1, "Pss per idle turn, %u open [MB]", fb->pss_small);
    snprintf(n2, sizeof n2, "Pss per idle turn, %u open [MB]", fb->pss_big);
    snprintf(n3, sizeof n3, "idle turns held (of %u)", fb->pss_big);
    snprintf(n4, sizeof n4, "MemAvailable drop per idle turn, %u open [MB]", fb->pss_big);
    snprintf(n5, sizeof n5, "Pss per idle turn, %u open, pandas preloaded [MB]", fb->pss_small);
    snprintf(n6, sizeof n6, "Pss per idle turn, %u open, pandas preloaded [MB]", fb->pss_big);
    row_def(R_PSS_S, n1, 0, "<= 2", -1, 2, 3);
    row_def(R_PSS_B, n2, 0, "<= 2", -1, 2, 3);
    snprintf(n7, sizeof n7, "Pss per idle turn, %u open, after one block [MB]", fb->pss_small);
    row_def(R_PSS_BLK, n7, 0, "", 0, 0, 3);
    row_def(R_HELD_B, n3, 1, ">= 2000", +1, 2000, 0);
    row_def(R_KMEM_B, n4, 0, "", 0, 0, 3);
    row_def(R_TOP_PSS, "Pss of the fork server (+helper) / launcher [MB]", 0, "", 0, 0, 1);
    row_def(R_PRE_PSS_S, n5, 0, "<= 2", -1, 2, 3);
    row_def(R_PRE_PSS_B, n6, 0, "<= 2", -1, 2, 3);
    row_def(R_PRE_TOP_PSS, "Pss of the fork server, pandas preloaded [MB]", 0, "", 0, 0, 1);
    row_def(R_NUMPY, "import numpy in a turn [ms]", 0, "", 0, 0, 2);
    row_def(R_PANDAS, "import pandas in a turn [ms]", 0, "", 0, 0, 2);
    row_def(R_NUMPY_PRE, "import numpy, --preload numpy,pandas [ms]", 0, "", 0, 0, 3);
    row_def(R_PANDAS_PRE, "import pandas, --preload numpy,pandas [ms]", 0, "<= 1", -1, 1, 3);
    /* the baseline cannot pool or preload: compare those rows with its plain numbers */
    rows[R_POOL_SRV_P50].base_row = R_SRV_P50;
    rows[R_POOL_SRV_P99].base_row = R_SRV_P99;
    rows[R_POOL_CLI_P50].base_row = R_CLI_P50;
    rows[R_POOL_PY_P50].base_row = R_PY_P50;
    rows[R_POOL_B2B_P50].base_row = R_SRV_P50;
    rows[R_PRE_SRV_P50].base_row = R_SRV_P50;
    rows[R_PRE_CLI_P50].base_row = R_CLI_P50;
    rows[R_PRE_PSS_S].base_row = R_PSS_S;
    rows[R_PRE_PSS_B].base_row = R_PSS_S;
    rows[R_PRE_TOP_PSS].base_row = R_TOP_PSS;
    rows[R_NUMPY_PRE].base_row = R_NUMPY;
    rows[R_PANDAS_PRE].base_row = R_PANDAS;
    char nm[64];
    for (int k = 0; k < NKINDS; k++)
        for (int z = 0; z < NBIGSZ; z++) {
            int i = k * NBIGSZ + z;
            unsigned mib = big_mib[z];
            snprintf(nm, sizeof nm, "upload %u MiB %s: wall per block [ms]", mib, kind_name[k]);
            row_def(R_UP_WALL + i, nm, 0, "", 0, 0, 1);
            snprintf(nm, sizeof nm, "upload %u MiB %s: supervisor CPU per MiB [ms]", mib,
                     kind_name[k]);
            row_def(R_UP_SUP + i, nm, 0, "", 0, 0, 2);
            snprintf(nm, sizeof nm, "download %u MiB %s (pass block): wall [ms]", mib,
                     kind_name[k]);
            row_def(R_DN_WALL + i, nm, 0, "", 0, 0, 1);
            snprintf(nm, sizeof nm, "download %u MiB %s: supervisor CPU per MiB [ms]", mib,
                     kind_name[k]);
            row_def(R_DN_SUP + i, nm, 0, "", 0, 0, 2);
            snprintf(nm, sizeof nm, "pass block, %u MiB %s unchanged: server CPU [ms]", mib,
                     kind_name[k]);
            row_def(R_DN_SRV + i, nm, 0, "", 0, 0, 1);
        }
    row_def(R_CHG_WALL, "block rewriting 1 MiB of 50 MiB (50 files): wall [ms]", 0, "", 0, 0, 1);
    row_def(R_CHG_SRV, "block rewriting 1 MiB of 50 MiB: server CPU [ms]", 0, "", 0, 0, 1);
    for (int z = 0; z < NBIGSZ; z++) {
        snprintf(nm, sizeof nm, "tool result %u MiB: wall per call, in the sandbox [ms]",
                 tool_mib[z]);
        row_def(R_TR_WALL + z, nm, 0, "<= baseline", -2, 0, 1);
        snprintf(nm, sizeof nm, "tool result %u MiB: supervisor CPU per call [ms]", tool_mib[z]);
        row_def(R_TR_SUP + z, nm, 0, "", 0, 0, 1);
        snprintf(nm, sizeof nm, "tool result %u MiB: server CPU per call [ms]", tool_mib[z]);
        row_def(R_TR_SRV + z, nm, 0, "", 0, 0, 1);
    }
    row_def(R_SO_WALL, "16 MiB of stdout from one block: wall [ms]", 0, "<= baseline", -2, 0, 1);
    row_def(R_SO_SUP, "16 MiB of stdout: supervisor CPU [ms]", 0, "", 0, 0, 1);
    row_def(R_SO_SRV, "16 MiB of stdout: server CPU [ms]", 0, "", 0, 0, 1);
    row_def(R_LOOP, "pure-Python loop, 3e6 iterations, in a block [ms]", 0, "", 0, 0, 1);
    row_def(R_LOOP_PY3, "  the same code under python3, no turn [ms]", 0, "", 0, 0, 1);
    row_def(R_LOOP_RATIO, "  in a block / under python3", 0, "<= 1.05", -1, 1.05, 3);
    row_def(R_MM, "numpy 500x500 float64 matmul, in a block [ms]", 0, "", 0, 0, 2);
    row_def(R_MM_PY3, "  the same code under python3, no turn [ms]", 0, "", 0, 0, 2);
    row_def(R_MM_RATIO, "  in a block / under python3", 0, "", 0, 0, 3);
    rows[R_LOOP_PY3].no_ratio = rows[R_LOOP_RATIO].no_ratio = true;
    rows[R_MM_PY3].no_ratio = rows[R_MM_RATIO].no_ratio = true;
    for (int r = 0; r < NROWS; r++)
        for (int c = 0; c < NCOLS; c++)
            val[r][c] = NAN;
}

static void fmt_val(char *out, size_t n, enum row r, double v, bool borrowed)
{
    if (isnan(v))
        snprintf(out, n, "n/a");
    else {
        snprintf(out, n, "%.*f", rows[r].prec, v);
        if (borrowed)
            strncat(out, "*", n - strlen(out) - 1);
    }
}

static void print_table(int first, int last)
{
    printf("| %-55s | %-18s | %-22s | %-10s | %-8s | %-14s |\n", "metric", "forkbox (isolated)",
           "forkbox (no isolation)", "baseline", "ratio", "target");
    printf("|%s|%s|%s|%s|%s|%s|\n", "---------------------------------------------------------",
           "--------------------", "------------------------", "------------", "----------",
           "----------------");
    for (int r = first; r < last; r++) {
        char a[32], b2[32], c[32], ratio[32] = "", target[40] = "";
        enum row br = rows[r].base_row;
        double base = val[br][COL_BASE], iso = val[r][COL_ISO];
        fmt_val(a, sizeof a, r, iso, false);
        fmt_val(b2, sizeof b2, r, val[r][COL_NOISO], false);
        fmt_val(c, sizeof c, br, base, br != (enum row)r && !isnan(base));
        if (!isnan(base) && !isnan(iso) && iso > 0 && base > 0 && r != R_HELD_B &&
            r != R_TC_CLIENT && r != R_TOP_PSS && r != R_PRE_TOP_PSS && !rows[r].no_ratio)
        {
            double x = rows[r].higher_better ? iso / base : base / iso;
            snprintf(ratio, sizeof ratio, x >= 100 ? "%.0fx" : "%.1fx", x);
        }
        if (rows[r].target[0]) {
            const char *mark = "";
            if (rows[r].cmp == -2 && !isnan(iso) && !isnan(base))
                mark = iso <= base ? " ok" : " MISS";
            else if (rows[r].cmp && rows[r].cmp != -2 && !isnan(iso))
                mark = (rows[r].cmp < 0 ? iso <= rows[r].thr : iso >= rows[r].thr) ? " ok"
                                                                                   : " MISS";
            snprintf(target, sizeof target, "%s%s", rows[r].target, mark);
        }
        printf("| %-55s | %18s | %22s | %10s | %8s | %-14s |\n", rows[r].name, a, b2, c, ratio,
               target);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* big data: the measurements (one fresh turn per row, blocks run one by one on it)           */

#define MiB_D 1048576.0

/* Ends the row's turn; a turn the server broke counts like in every other row. */
static void big_close(struct bench *b, struct server *s, const char *row, struct driver *d)
{
    driver_release(d, now_ns() + 30ull * 1000000000u);
    report_failures(b, s, row, d, true);
    driver_free(d);
}

/* Upload and download of one kind and size, in one turn: `reps` blocks whose workspace archive
 * holds up.dat and whose code checks its size and removes it (the snapshot back is empty), then
 * one block that keeps it, then `reps` `pass` blocks with the empty archive, each answered with
 * the whole workspace: that is the download, and the unchanged-workspace snapshot row. */
static void measure_updown(struct bench *b, struct server *s, enum col col, int kind, int sz)
{
    struct bigdata *bd = b->big;
    int i = kind * NBIGSZ + sz;
    unsigned mib = big_mib[sz], reps = bd->reps[sz];
    char row[64], why[400] = "", code[200], expect[32];
    snprintf(row, sizeof row, "upload/download %u MiB %s", mib, kind_name[kind]);
    const struct blob *up = bigdata_upload(bd, kind, sz);
    if (!up) {
        big_note(b, s, row, "libarchive could not build the upload");
        return;
    }
    double *wall = xmalloc(reps * sizeof *wall), sup, all;
    struct driver d;
    struct cpu_mark m;
    if (!big_open(b, s, &d, why, sizeof why))
        goto out;
    snprintf(code, sizeof code,
             "import os\nn = os.path.getsize('up.dat')\nos.remove('up.dat')\nprint(n)\n");
    snprintf(expect, sizeof expect, "%zu\n", (size_t)mib << 20);
    cpu_mark(s, &m);
    for (unsigned r = 0; r < reps; r++)
        if (isnan(wall[r] = big_block(&d, up, code, expect, 120, why, sizeof why))) {
            cpu_since(s, &m, NULL, NULL);
            goto out;
        }
    cpu_since(s, &m, &sup, &all);
    val[R_UP_WALL + i][col] = median_of(wall, reps);
    val[R_UP_SUP + i][col] = sup / ((double)reps * (double)up->n / MiB_D);
    char f1[32];
    progress("[%s] upload %u MiB %s (%.2f MiB archive): %u blocks, p50 %.1f ms, supervisor "
             "%s ms per MiB", s->name, mib, kind_name[kind], (double)up->n / MiB_D, reps,
             val[R_UP_WALL + i][col], fmt_ms(f1, sizeof f1, val[R_UP_SUP + i][col]));

    if (s->baseline && b->quick && kind == K_TEXT && sz == NBIGSZ - 1) {
        snprintf(why, sizeof why, "download skipped with --quick: the baseline's snapshot "
                 "(tarfile, gzip -9) of 50 MiB of text takes ~10 s per block");
        goto out;
    }
    if (isnan(big_block(&d, up, "pass", "", 120, why, sizeof why)))
        goto out;
    cpu_mark(s, &m);
    for (unsigned r = 0; r < reps; r++)
        if (isnan(wall[r] = big_block(&d, NULL, "pass", "", 120, why, sizeof why))) {
            cpu_since(s, &m, NULL, NULL);
            goto out;
        }
    cpu_since(s, &m, &sup, &all);
    size_t snap = d.last_archive;
    if (snap < (kind == K_RANDOM ? (size_t)mib << 20 : 4096)) {
        snprintf(why, sizeof why, "the snapshot has %zu bytes: the workspace did not come back",
                 snap);
        goto out;
    }
    bd->snap[col][kind][sz] = snap;
    val[R_DN_WALL + i][col] = median_of(wall, reps);
    val[R_DN_SUP + i][col] = sup / ((double)reps * (double)snap / MiB_D);
    val[R_DN_SRV + i][col] = all / reps;
    progress("[%s] download %u MiB %s (%.2f MiB snapshot): %u pass blocks, p50 %.1f ms, "
             "supervisor %s ms per MiB, server %.1f ms per block", s->name, mib,
             kind_name[kind], (double)snap / MiB_D, reps, val[R_DN_WALL + i][col],
             fmt_ms(f1, sizeof f1, val[R_DN_SUP + i][col]), val[R_DN_SRV + i][col]);
out:
    if (why[0])
        big_note(b, s, row, why);
    free(wall);
    big_close(b, s, row, &d);
}

/* A 50 MiB workspace of 50 files (uploaded by an untimed first block); each measured block
 * rewrites one of them (1 MiB, reversed: new content that compresses alike). */
static void measure_change(struct bench *b, struct server *s, enum col col)
{
    struct bigdata *bd = b->big;
    const char *row = "rewrite 1 of 50 MiB";
    char why[400] = "", code[200];
    const struct blob *up = bigdata_change(bd);
    if (!up) {
        big_note(b, s, row, "libarchive could not build the upload");
        return;
    }
    unsigned reps = bd->change_reps;
    double *wall = xmalloc(reps * sizeof *wall), all = 0;
    struct driver d;
    driver_init(&d, s->port, &b->tools, &b->empty);
    if (s->baseline && b->quick) {
        snprintf(why, sizeof why, "skipped with --quick: each of the baseline's snapshots "
                 "(tarfile, gzip -9) of 50 MiB of text takes ~10 s");
        goto out;
    }
    driver_free(&d);
    if (!big_open(b, s, &d, why, sizeof why) ||
        isnan(big_block(&d, up, "pass", "", 120, why, sizeof why)))
        goto out;
    for (unsigned r = 0; r < reps; r++) {
        struct cpu_mark m;
        double a;
        snprintf(code, sizeof code,
                 "p = 'c%02u.txt'\nd = open(p, 'rb').read()\nopen(p, 'wb').write(d[::-1])\n",
                 (r * 7 + 3) % CHANGE_FILES);
        cpu_mark(s, &m);
        wall[r] = big_block(&d, NULL, code, "", 120, why, sizeof why);
        cpu_since(s, &m, NULL, &a);
        if (isnan(wall[r]))
            goto out;
        all += a;
    }
    if (d.last_archive < (1u << 20)) {
        snprintf(why, sizeof why, "the snapshot has %zu bytes: the workspace did not come back",
                 d.last_archive);
        goto out;
    }
    val[R_CHG_WALL][col] = median_of(wall, reps);
    val[R_CHG_SRV][col] = all / reps;
    progress("[%s] %s: %u blocks, p50 %.1f ms, server %.1f ms per block", s->name, row, reps,
             val[R_CHG_WALL][col], val[R_CHG_SRV][col]);
out:
    if (why[0])
        big_note(b, s, row, why);
    free(wall);
    big_close(b, s, row, &d);
}

/* Tool results of 1 / 10 / 40 MiB: one turn per size, one block calling echo() `calls` times;
 * the client answers each call with a JSON string of that many bytes. The block times each
 * call (perf_counter) and checks the length; CPU is over the block, divided by the calls. */
static void measure_tool_results(struct bench *b, struct server *s, enum col col)
{
    struct bigdata *bd = b->big;
    for (int sz = 0; sz < NBIGSZ; sz++) {
        char row[64], why[400] = "", code[600];
        size_t n = (size_t)tool_mib[sz] << 20;
        unsigned calls = bd->tool_calls[sz];
        snprintf(row, sizeof row, "tool result %u MiB", tool_mib[sz]);
        snprintf(code, sizeof code,
                 "import time\nfrom tools import echo\nts = []\nfor _ in range(%u):\n"
                 "    t = time.perf_counter()\n    v = echo(message='big')\n"
                 "    ts.append(time.perf_counter() - t)\n"
                 "    assert isinstance(v, str) and len(v) == %zu, (type(v), len(v))\n"
                 "    del v\nts.sort()\nprint(ts[len(ts) // 2] * 1e3)\n", calls, n);
        struct driver d;
        struct cpu_mark m;
        double sup, all;
        if (!big_open(b, s, &d, why, sizeof why))
            goto next;
        d.tool_value = bd->json;
        d.tool_value_n = n;
        cpu_mark(s, &m);
        double ms = big_block(&d, NULL, code, NULL, 120, why, sizeof why);
        cpu_since(s, &m, &sup, &all);
        if (isnan(ms))
            goto next;
        val[R_TR_WALL + sz][col] = atof(d.out_stdout);
        val[R_TR_SUP + sz][col] = sup / calls;
        val[R_TR_SRV + sz][col] = all / calls;
        char f1[32];
        progress("[%s] %s: %u calls, median %.1f ms in the sandbox, supervisor %s ms and "
                 "server %.1f ms per call", s->name, row, calls, val[R_TR_WALL + sz][col],
                 fmt_ms(f1, sizeof f1, val[R_TR_SUP + sz][col]), val[R_TR_SRV + sz][col]);
    next:
        if (why[0])
            big_note(b, s, row, why);
        big_close(b, s, row, &d);
    }
}

/* 16 MiB of stdout from one block, `reps` blocks in one turn; the output must come back whole
 * (at most --output-cap, 16M by default, is kept per stream). */
static void measure_stdout(struct bench *b, struct server *s, enum col col)
{
    struct bigdata *bd = b->big;
    const char *row = "16 MiB of stdout";
    char why[400] = "", code[300];
    /* 64-byte lines: the sandbox's JSON encoder escapes each newline */
    snprintf(code, sizeof code,
             "import sys\nsys.stdout.write('%-63.63s\\n' * %u)\n",
             "forkbox-bench: sixteen MiB of stdout, in lines of 64 bytes ...........",
             STDOUT_BYTES / 64);
    unsigned reps = bd->stdout_reps;
    double *wall = xmalloc(reps * sizeof *wall), sup, all;
    struct driver d;
    struct cpu_mark m;
    if (!big_open(b, s, &d, why, sizeof why))
        goto out;
    cpu_mark(s, &m);
    for (unsigned r = 0; r < reps; r++) {
        wall[r] = big_block(&d, NULL, code, NULL, 120, why, sizeof why);
        if (!isnan(wall[r]) && d.out_stdout_len != STDOUT_BYTES)
            snprintf(why, sizeof why, "stdout came back as %zu bytes, not %u (--output-cap?)",
                     d.out_stdout_len, STDOUT_BYTES);
        if (why[0]) {
            cpu_since(s, &m, NULL, NULL);
            goto out;
        }
    }
    cpu_since(s, &m, &sup, &all);
    val[R_SO_WALL][col] = median_of(wall, reps);
    val[R_SO_SUP][col] = sup / reps;
    val[R_SO_SRV][col] = all / reps;
    char f1[32];
    progress("[%s] %s: %u blocks, p50 %.1f ms, supervisor %s ms, server %.1f ms per block",
             s->name, row, reps, val[R_SO_WALL][col], fmt_ms(f1, sizeof f1, val[R_SO_SUP][col]),
             val[R_SO_SRV][col]);
out:
    if (why[0])
        big_note(b, s, row, why);
    free(wall);
    big_close(b, s, row, &d);
}

/* `python -c code` as a plain subprocess of the bench (not in any turn); its stdout as a number,
 * NAN (reason in `why`) on failure or after `secs`. */
static double run_python3(struct bench *b, const char *code, unsigned secs, char *why, size_t n)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0) {
        snprintf(why, n, "pipe: %s", strerror(errno));
        return NAN;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, n, "fork: %s", strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        return NAN;
    }
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        signal(SIGPIPE, SIG_DFL);
        char *argv[] = {(char *)b->python, "-c", (char *)code, NULL};
        execv(b->python, argv);
        _exit(127);
    }
    close(pfd[1]);
    char buf[4096];
    size_t len = 0;
    uint64_t deadline = now_ns() + (uint64_t)secs * 1000000000u;
    bool killed = false;
    for (;;) {
        fd_set rs;
        FD_ZERO(&rs);
        FD_SET(pfd[0], &rs);
        struct timeval tv = {0, 200000};
        if (now_ns() > deadline && !killed) {
            kill(pid, SIGKILL);
            killed = true;
        }
        if (select(pfd[0] + 1, &rs, NULL, NULL, &tv) <= 0)
            continue;
        ssize_t r = read(pfd[0], buf + len, sizeof buf - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
        if (len == sizeof buf - 1)
            len = 0; /* keep the tail */
    }
    buf[len] = 0;
    close(pfd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (killed || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        size_t l = strlen(buf);
        while (l && buf[l - 1] == '\n')
            buf[--l] = 0;
        const char *last = strrchr(buf, '\n');
        snprintf(why, n, "%s %s: %s", b->python, killed ? "timed out" : "failed",
                 last ? last + 1 : buf);
        return NAN;
    }
    return atof(buf);
}

/* A pure-Python loop and a numpy matmul, the same code in a block and under python3, in
 * alternation (`py_rounds` rounds); each run prints its fastest of `py_reps` repetitions (the
 * minimum: other work on the machine only ever adds time), timed with time.thread_time(), the
 * thread's CPU time: the interpreter's speed, not how the host's scheduler shares the CPUs
 * between the sandbox's cgroup and the bench's (perf_counter on a busy 2-CPU host put the
 * sandbox 17% ahead of python3 in one run). BLAS is held to one thread in both, as a
 * sandbox's CPU count (its cgroup's quota) would have it. */
static void measure_pyspeed(struct bench *b, struct server *s, enum col col)
{
    struct bigdata *bd = b->big;
    char loop[600], mm[800];
    snprintf(loop, sizeof loop,
             "import time\n"
             "def f(n):\n    s = 0\n    for i in range(n):\n        s += i * i %% 7\n    return s\n"
             "ts = []\nfor _ in range(%u):\n    t = time.thread_time()\n    f(%u)\n"
             "    ts.append(time.thread_time() - t)\nprint(min(ts) * 1e3)\n",
             bd->py_reps, LOOP_N);
    snprintf(mm, sizeof mm,
             "import os\n"
             "for v in ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS'):\n"
             "    os.environ[v] = '1'\n"
             "import time\nimport numpy as np\n"
             "a = np.random.default_rng(0).random((%u, %u))\nb = a.T.copy()\na @ b\n"
             "ts = []\nfor _ in range(%u):\n    t = time.thread_time()\n    a @ b\n"
             "    ts.append(time.thread_time() - t)\nprint(min(ts) * 1e3)\n",
             MM_N, MM_N, bd->py_reps * 2);
    const char *codes[2] = {loop, mm};
    const char *names[2] = {"pure-Python loop", "numpy matmul"};
    enum row inside[2] = {R_LOOP, R_MM}, ref[2] = {R_LOOP_PY3, R_MM_PY3},
             ratio[2] = {R_LOOP_RATIO, R_MM_RATIO};
    for (int k = 0; k < 2; k++) {
        char why[400] = "";
        double best_in = INFINITY, best_ref = INFINITY;
        struct driver d;
        if (!big_open(b, s, &d, why, sizeof why))
            goto next;
        for (unsigned r = 0; r < bd->py_rounds; r++) {
            double x = run_python3(b, codes[k], 120, why, sizeof why);
            if (isnan(x))
                goto next;
            best_ref = x < best_ref ? x : best_ref;
            if (isnan(big_block(&d, NULL, codes[k], NULL, 120, why, sizeof why)))
                goto next;
            x = atof(d.out_stdout);
            best_in = x < best_in ? x : best_in;
        }
        val[inside[k]][col] = best_in;
        val[ref[k]][col] = best_ref;
        val[ratio[k]][col] = best_in / best_ref;
        progress("[%s] %s: %.1f ms in a block, %.1f ms under %s: %.3f", s->name, names[k],
                 best_in, best_ref, b->python, best_in / best_ref);
    next:
        if (why[0])
            big_note(b, s, names[k], why);
        big_close(b, s, names[k], &d);
    }
}

static void measure_big(struct bench *b, struct server *s, enum col col)
{
    for (int kind = 0; kind < NKINDS; kind++)
        for (int sz = 0; sz < NBIGSZ; sz++)
            measure_updown(b, s, col, kind, sz);
    measure_change(b, s, col);
    measure_tool_results(b, s, col);
    measure_stdout(b, s, col);
    measure_pyspeed(b, s, col);
}

/* ------------------------------------------------------------------------------------------ */
/* running one server configuration                                                           */

static int start_forkboxd(struct server *s, const char *name, const char *daemon, bool iso,
                          const char *extra1, const char *extra2, unsigned capacity, char *why,
                          size_t whylen)
{
    char cap[32];
    snprintf(cap, sizeof cap, "--capacity=%u", capacity);
    char *argv[12];
    size_t n = 0;
    argv[n++] = (char *)daemon;
    argv[n++] = "--listen=127.0.0.1:0";
    argv[n++] = "--log-level=debug";
    argv[n++] = cap;
    if (!iso)
        argv[n++] = "--no-isolation";
    if (extra1)
        argv[n++] = (char *)extra1;
    if (extra2)
        argv[n++] = (char *)extra2;
    /* Fresh sandboxes per turn unless a pool is asked for: --pool 0, as forkboxd keeps a small
     * pool by default. A daemon that rejects the flag has no pool: start it without. */
    bool pool0 = !(extra1 && !strncmp(extra1, "--pool", 6)) &&
                 !(extra2 && !strncmp(extra2, "--pool", 6));
    if (pool0)
        argv[n++] = "--pool=0";
    argv[n] = NULL;
    int r = server_start(s, name, false, argv, why, whylen);
    if (r < 0 && pool0 && strstr(why, "pool")) {
        argv[--n] = NULL;
        r = server_start(s, name, false, argv, why, whylen);
    }
    if (r == 0)
        progress("[%s] %s (port %u)", name, s->cmd, s->port);
    else
        progress("[%s] %s: %s", name, s->cmd, why);
    return r;
}

/* Everything measured on a plain server (forkboxd or the baseline) into column `col`. */
static void measure_all(struct bench *b, struct server *s, enum col col, const struct counts *n)
{
    if (b->groups & G_START) {
        struct samples cli = {0}, srv = {0}, spawn = {0};
        measure_turn_start(b, s, n->start_turns, b->gap_ms, &cli, &srv, &spawn);
        val[R_CLI_P50][col] = samples_pct(&cli, 50);
        val[R_CLI_P99][col] = samples_pct(&cli, 99);
        val[R_SRV_P50][col] = samples_pct(&srv, 50);
        val[R_SRV_P99][col] = samples_pct(&srv, 99);
        val[R_SPAWN_P50][col] = samples_pct(&spawn, 50);
        samples_free(&cli);
        samples_free(&srv);
        samples_free(&spawn);
        val[R_PY_P50][col] = measure_py_turn_start(b, s, n->py_turns, b->gap_ms);
    }
    if (b->groups & G_RTT)
        measure_rtt(b, s, n->rtt_blocks, &val[R_RTT_P50][col], &val[R_RTT_P99][col]);
    if (b->groups & G_TOOL) {
        measure_tool_call(b, s, n->calls, &val[R_TC_INSIDE][col], &val[R_TC_CLIENT][col]);
        val[R_TC_ADDED][col] = val[R_TC_INSIDE][col] - val[R_TC_CLIENT][col];
    }

    double dummy;
    if (b->groups & G_THROUGHPUT) {
        measure_throughput(b, s, 4, 1, n->tp_secs, &val[R_TP4][col], &dummy, NULL);
        measure_throughput(b, s, 16, 1, n->tp_secs, &val[R_TP16][col], &dummy,
                           &val[R_CPU1][col]);
        measure_throughput(b, s, 64, 1, n->tp_secs, &val[R_TP64][col], &dummy, NULL);
        measure_throughput(b, s, 4, 5, n->tp_secs, &val[R_TP4x5][col], &val[R_BP4x5][col], NULL);
        measure_throughput(b, s, 16, 5, n->tp_secs, &val[R_TP16x5][col], &val[R_BP16x5][col],
                           &val[R_CPU5][col]);
    }
    if (b->groups & G_PSS) {
        double held, kmem;
        measure_pss(b, s, n->pss_small, &val[R_PSS_S][col], &held, &val[R_TOP_PSS][col], &kmem);
        measure_pss_after(b, s, n->pss_small, 1, &val[R_PSS_BLK][col], &held, &dummy, &kmem);
        if (n->pss_big)
            measure_pss(b, s, n->pss_big, &val[R_PSS_B][col], &val[R_HELD_B][col], &dummy,
                        &val[R_KMEM_B][col]);
    }
    if (b->groups & G_IMPORT) {
        val[R_NUMPY][col] = measure_import(b, s, "numpy", n->import_turns);
        val[R_PANDAS][col] = measure_import(b, s, "pandas", n->import_turns);
    }
    if ((b->groups & G_BIG) && (col != COL_NOISO || b->big_noiso))
        measure_big(b, s, col);
}

static void run_forkbox(struct bench *b, const char *daemon, bool iso, enum col col,
                        const char *tag)
{
    struct server s;
    char why[512], name[64];
    unsigned cap = b->fb.pss_big + 64 > 4096 ? b->fb.pss_big + 64 : 4096;
    if (start_forkboxd(&s, tag, daemon, iso, NULL, NULL, cap, why, sizeof why) < 0) {
        b->failed = true;
        return;
    }
    measure_all(b, &s, col, &b->fb);
    server_stop(&s);
    close(s.log_fd);

    snprintf(name, sizeof name, "%s pool", tag);
    if (!(b->groups & G_POOL))
        ;
    else if (start_forkboxd(&s, name, daemon, iso, "--pool=8", NULL, 256, why, sizeof why) == 0) {
        s.pooled = true;
        sleep_ms(300); /* let the pool fill */
        struct samples cli = {0}, srv = {0}, spawn = {0};
        /* Apart: the pool refills between turns (the best case for a pooled turn). */
        measure_turn_start(b, &s, b->fb.start_turns, POOL_GAP_MS, &cli, &srv, &spawn);
        val[R_POOL_CLI_P50][col] = samples_pct(&cli, 50);
        val[R_POOL_SRV_P50][col] = samples_pct(&srv, 50);
        val[R_POOL_SRV_P99][col] = samples_pct(&srv, 99);
        samples_reset(&cli);
        samples_reset(&srv);
        /* Back to back: turns arrive faster than the pool refills. */
        measure_turn_start(b, &s, b->fb.start_turns, b->gap_ms, &cli, &srv, &spawn);
        val[R_POOL_B2B_P50][col] = samples_pct(&srv, 50);
        samples_free(&cli);
        samples_free(&srv);
        samples_free(&spawn);
        val[R_POOL_PY_P50][col] = measure_py_turn_start(b, &s, b->fb.py_turns, POOL_GAP_MS);
        server_stop(&s);
        close(s.log_fd);
    } else
        printf("note: %s: --pool 8 not available: %s\n", tag, why);

    snprintf(name, sizeof name, "%s preload", tag);
    if (!(b->groups & G_PRELOAD))
        ;
    else if (start_forkboxd(&s, name, daemon, iso, "--preload=numpy,pandas", NULL, cap, why,
                            sizeof why) == 0) {
        struct samples cli = {0}, srv = {0}, spawn = {0};
        measure_turn_start(b, &s, b->fb.start_turns / 2, b->gap_ms, &cli, &srv, &spawn);
        val[R_PRE_CLI_P50][col] = samples_pct(&cli, 50);
        val[R_PRE_SRV_P50][col] = samples_pct(&srv, 50);
        samples_free(&cli);
        samples_free(&srv);
        samples_free(&spawn);
        val[R_NUMPY_PRE][col] = measure_import(b, &s, "numpy", b->fb.import_turns);
        val[R_PANDAS_PRE][col] = measure_import(b, &s, "pandas", b->fb.import_turns);
        double held, kmem;
        measure_pss(b, &s, b->fb.pss_small, &val[R_PRE_PSS_S][col], &held,
                    &val[R_PRE_TOP_PSS][col], &kmem);
        /* Pss divides each shared page among the processes mapping it: with
         * a large preloaded heap, per turn shrinks as turns are added. */
        if (b->fb.pss_big) {
            double top;
            measure_pss(b, &s, b->fb.pss_big, &val[R_PRE_PSS_B][col], &held, &top, &kmem);
        }
        server_stop(&s);
        close(s.log_fd);
    } else
        printf("note: %s: --preload numpy,pandas not available: %s\n", tag, why);
}

static void run_baseline(struct bench *b)
{
    char launcher[PATH_MAX], why[512];
    snprintf(launcher, sizeof launcher, "%s/baseline-server", b->bench_dir);
    char *argv[] = {(char *)b->python, launcher, "--python", (char *)b->python, NULL};
    struct server s;
    if (server_start(&s, "baseline", true, argv, why, sizeof why) < 0) {
        progress("[baseline] %s: %s", launcher, why);
        b->failed = true;
        return;
    }
    progress("[baseline] %s (port %u)", s.cmd, s.port);
    measure_all(b, &s, COL_BASE, &b->bl);
    server_stop(&s);
    close(s.log_fd);
}

/* ------------------------------------------------------------------------------------------ */

/* The bigdata table, with a header saying what its columns are and a footer with the archive
 * sizes and how flat the supervisor's CPU per MiB is from 1 to 50 MiB. */
static void print_big(const struct bench *b)
{
    const struct bigdata *bd = b->big;
    printf("\nbig data (--rows bigdata): one fresh turn (--pool 0) per row, its blocks run one "
           "at a time.\n"
           "  wall: at the client, workspace archive sent -> snapshot received, median of the "
           "blocks; tool results: each call timed in the block (perf_counter), median.\n"
           "  supervisor CPU: forkboxd's own (not the fork server's or a sandbox's), per MiB of "
           "the archive on the wire (the upload; the snapshot) or per call / block. The "
           "baseline has no supervisor.\n"
           "  server CPU: the supervisor and every process serving the turn (fork server, "
           "sandbox init and runtime; baseline: launcher and the turn's python3), from /proc "
           "between blocks, when all of them wait: the live threads' schedstat (ns), or "
           "utime+stime+cutime+cstime (10 ms ticks; counts exited threads and reaped children) "
           "where larger.\n"
           "  upload: the archive holds one file of N MiB (gzip -1), which the block checks and "
           "removes. download: `pass` blocks after a block that kept it: each snapshot carries "
           "it, unchanged (the pass-block rows). text: made-up words, ~2.6:1 at gzip -6.\n"
           "  Python rows: thread CPU time, the fastest of %u runs per round, %u round(s), "
           "alternating with %s -c (BLAS at one thread in both). ratio: baseline / forkbox "
           "(isolated).\n\n", bd->py_reps, bd->py_rounds, b->python);
    print_table(R_BIG_FIRST, NROWS);
    printf("\nbigdata counts: blocks per upload/download row %u / %u / %u (1 / 10 / 50 MiB), "
           "tool calls %u / %u / %u (1 / 10 / 40 MiB), blocks of stdout %u, rewrite blocks %u.\n",
           bd->reps[0], bd->reps[1], bd->reps[2], bd->tool_calls[0], bd->tool_calls[1],
           bd->tool_calls[2], bd->stdout_reps, bd->change_reps);
    for (int k = 0; k < NKINDS; k++) {
        printf("%s: upload archives", kind_name[k]);
        char f1[32];
        for (int z = 0; z < NBIGSZ; z++)
            printf(" %s", fmt_ms(f1, sizeof f1, bd->up[k][z].p ? (double)bd->up[k][z].n / MiB_D
                                                                : NAN));
        for (int c = 0; c < NCOLS; c++) {
            static const char *const cn[] = {"isolated", "no isolation", "baseline"};
            if (!bd->snap[c][k][0] && !bd->snap[c][k][1] && !bd->snap[c][k][2])
                continue;
            printf("; %s snapshots", cn[c]);
            for (int z = 0; z < NBIGSZ; z++)
                printf(" %s", fmt_ms(f1, sizeof f1, bd->snap[c][k][z]
                                                        ? (double)bd->snap[c][k][z] / MiB_D
                                                        : NAN));
        }
        printf(" MiB (at 1 / 10 / 50 MiB of content)\n");
    }
    if (isnan(val[R_UP_SUP][COL_ISO]))
        return;
    printf("supervisor CPU per MiB, 50 MiB / 1 MiB (flat: <= 1.5), isolated:");
    for (int k = 0; k < NKINDS; k++) {
        int i = k * NBIGSZ;
        char f1[32], f2[32];
        printf(" upload %s %s, download %s %s%s", kind_name[k],
               fmt_ms(f1, sizeof f1, val[R_UP_SUP + i + 2][COL_ISO] / val[R_UP_SUP + i][COL_ISO]),
               kind_name[k],
               fmt_ms(f2, sizeof f2, val[R_DN_SUP + i + 2][COL_ISO] / val[R_DN_SUP + i][COL_ISO]),
               k + 1 < NKINDS ? ";" : "\n");
    }
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: forkbox-bench [options]\n"
            "  --forkboxd PATH   daemon to start (default: %s, or $FORKBOXD)\n"
            "  --bench-dir DIR   baseline server and helpers (default: %s)\n"
            "  --python PATH     interpreter for the baseline and the Python client "
            "(/usr/bin/python3)\n"
            "  --quick           smaller counts (about a minute)\n"
            "  --scale F         multiply every count by F (after --quick)\n"
            "  --no-baseline     skip the baseline\n"
            "  --only WHICH      iso, noiso or baseline: measure only that column\n"
            "  --gap-ms N        idle time between the sequential turn-start turns (0)\n"
            "  --rows LIST       measure only these groups (comma-separated): start, rtt, tool,\n"
            "                    throughput, pss, import, pool, preload, bigdata (default: all;\n"
            "                    bigdata is measured for the isolated column and the baseline,\n"
            "                    and for no isolation only with --only noiso)\n",
            FORKBOX_DAEMON_PATH, FORKBOX_BENCH_DIR);
}

static unsigned scale_u(unsigned v, double f)
{
    double x = (double)v * f;
    return x < 1 ? 1 : (unsigned)x;
}

int main(int argc, char **argv)
{
    enum { O_DAEMON = 256, O_DIR, O_PY, O_QUICK, O_SCALE, O_NOBASE, O_ONLY, O_GAP, O_ROWS, O_HELP };
    static const struct option opts[] = {
        {"forkboxd", required_argument, NULL, O_DAEMON},
        {"bench-dir", required_argument, NULL, O_DIR},
        {"python", required_argument, NULL, O_PY},
        {"quick", no_argument, NULL, O_QUICK},
        {"scale", required_argument, NULL, O_SCALE},
        {"no-baseline", no_argument, NULL, O_NOBASE},
        {"only", required_argument, NULL, O_ONLY},
        {"gap-ms", required_argument, NULL, O_GAP},
        {"rows", required_argument, NULL, O_ROWS},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    const char *daemon = getenv("FORKBOXD") ? getenv("FORKBOXD") : FORKBOX_DAEMON_PATH;
    const char *only = NULL;
    bool quick = false, baseline = true;
    double scale = 1;
    struct bench b = {.bench_dir = FORKBOX_BENCH_DIR, .python = "/usr/bin/python3",
                      .groups = G_ALL};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case O_DAEMON: daemon = optarg; break;
        case O_DIR: b.bench_dir = optarg; break;
        case O_PY: b.python = optarg; break;
        case O_QUICK: quick = true; break;
        case O_SCALE:
            scale = atof(optarg);
            if (!(scale > 0 && scale <= 100)) {
                fprintf(stderr, "forkbox-bench: --scale: expected a number in (0, 100]\n");
                return 2;
            }
            break;
        case O_NOBASE: baseline = false; break;
        case O_ONLY:
            only = optarg;
            if (strcmp(only, "iso") && strcmp(only, "noiso") && strcmp(only, "baseline")) {
                fprintf(stderr, "forkbox-bench: --only: iso, noiso or baseline\n");
                return 2;
            }
            break;
        case O_GAP: b.gap_ms = (unsigned)strtoul(optarg, NULL, 10); break;
        case O_ROWS:
            if (parse_groups(optarg, &b.groups) < 0)
                return 2;
            break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }

    /* counts: forkbox / baseline (the baseline spends ~100 ms of CPU per turn) */
    b.fb = (struct counts){.start_turns = 200, .py_turns = 50, .rtt_blocks = 500, .calls = 2000,
                           .pss_small = 100, .pss_big = 2000, .import_turns = 3, .tp_secs = 3};
    b.bl = (struct counts){.start_turns = 30, .py_turns = 10, .rtt_blocks = 500, .calls = 1000,
                           .pss_small = 100, .pss_big = 0, .import_turns = 3, .tp_secs = 3};
    if (quick) {
        b.fb = (struct counts){.start_turns = 60, .py_turns = 20, .rtt_blocks = 150,
                               .calls = 500, .pss_small = 50, .pss_big = 500,
                               .import_turns = 1, .tp_secs = 1};
        b.bl = (struct counts){.start_turns = 10, .py_turns = 5, .rtt_blocks = 150, .calls = 300,
                               .pss_small = 20, .pss_big = 0, .import_turns = 1, .tp_secs = 1.5};
    }
    struct counts *cs[] = {&b.fb, &b.bl};
    for (int i = 0; i < 2 && scale != 1; i++) {
        struct counts *c = cs[i];
        c->start_turns = scale_u(c->start_turns, scale);
        c->py_turns = scale_u(c->py_turns, scale);
        c->rtt_blocks = scale_u(c->rtt_blocks, scale);
        c->calls = scale_u(c->calls, scale);
        c->pss_small = scale_u(c->pss_small, scale);
        c->pss_big = c->pss_big ? scale_u(c->pss_big, scale) : 0;
        c->import_turns = scale_u(c->import_turns, scale);
        c->tp_secs *= scale;
    }

    t_begin = now_ns();
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_fatal_signal);
    signal(SIGTERM, on_fatal_signal);
    /* 2000 idle turns need ~2000 sockets here and ~3 fds each in forkboxd, which inherits this */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    struct member tools[] = {{"__init__.py", tools_init_py, 0}, {"echo.py", tools_echo_py, 0}};
    if (make_targz(tools, 2, &b.tools) < 0 || make_targz(NULL, 0, &b.empty) < 0)
        return 1;
    rows_init(&b.fb);
    struct bigdata bd;
    if (b.groups & G_BIG) {
        bigdata_init(&bd, quick, scale);
        b.big = &bd;
        b.big_noiso = only && !strcmp(only, "noiso");
        b.quick = quick;
    }

    printf("command:");
    for (int i = 0; i < argc; i++)
        printf(" %s", argv[i]);
    struct utsname u;
    uname(&u);
    printf("\nmachine: %ld CPUs, %.1f GiB, Linux %s, cgroup favordynmods %s; forkboxd: %s; "
           "archives: tools %zu B, empty %zu B\n",
           sysconf(_SC_NPROCESSORS_ONLN), (double)meminfo_kb("MemTotal:") / 1048576.0, u.release,
           cgroup_favordynmods() ? "on" : "off", daemon, b.tools.n, b.empty.n);
    fflush(stdout);

    char la[64];
    loadavg(la, sizeof la);
    printf("load average at start: %s\n", la);
    fflush(stdout);
    uint64_t t0 = now_ns();
    if (!only || !strcmp(only, "iso"))
        run_forkbox(&b, daemon, true, COL_ISO, "isolated");
    if (!only || !strcmp(only, "noiso"))
        run_forkbox(&b, daemon, false, COL_NOISO, "no-isolation");
    if (baseline && (!only || !strcmp(only, "baseline")))
        run_baseline(&b);

    printf("\n");
    if (b.groups & ~G_BIG)
        print_table(0, R_BIG_FIRST);
    printf("\nforkbox counts: %u turns for turn start (%u with the Python client), %u empty "
           "blocks, %u tool calls, throughput %.1f s per row, Pss at %u and %u idle turns, "
           "imports median of %u turns.\n"
           "baseline counts: %u turns for turn start (%u Python client), %u empty blocks, %u tool "
           "calls, throughput %.1f s per row, Pss at %u idle turns.\n",
           b.fb.start_turns, b.fb.py_turns, b.fb.rtt_blocks, b.fb.calls, b.fb.tp_secs,
           b.fb.pss_small, b.fb.pss_big, b.fb.import_turns, b.bl.start_turns, b.bl.py_turns,
           b.bl.rtt_blocks, b.bl.calls, b.bl.tp_secs, b.bl.pss_small);
    printf("ratio: how many times better forkbox (isolated) is than the baseline: baseline/forkbox "
           "for times and memory, forkbox/baseline for rates. * = the baseline's number without "
           "pool/preload (it has neither). Server-side times are forkboxd's own log (upgrade -> "
           "ready); the baseline has no such log. CPU per turn = busy time of every CPU over the "
           "row, until the last turn is reaped, less the load generator's own, / turns (kernel "
           "threads included: namespace teardown runs in kworkers). Targets are checked against "
           "the isolated column and never change the exit status.\n");
    if (b.groups & G_BIG)
        print_big(&b);
    loadavg(la, sizeof la);
    printf("total time: %.0f s; load average at the end: %s (other work on this machine skews "
           "every number)\n", ms_since(t0) / 1000.0, la);
    free(b.tools.p);
    free(b.empty.p);
    if (b.big)
        bigdata_free(b.big);
    return b.failed ? 1 : 0;
}
