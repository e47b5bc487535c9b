/* Runs in the `forkbox sandbox` process (src/forkbox.c): one sandbox's turn
 * over a spec 8.2 stream (see relay.h).
 *
 * This process holds the host's fds (and, for TCP, sent the token); the
 * sandbox is a clone of the fork server, which was exec'd with a fixed
 * environment before the transport was connected, so user code never holds
 * either. Everything the sandbox sends comes over its channel (proto/chan.h)
 * and is checked here as forkboxd's session checks it: limits at the
 * envelope header per state, the incremental frame scanner, the per-kind
 * limits and output cap (proto/relay.h), the order of the kinds (ready once,
 * tool_call and log while a block runs, then done, output with the same
 * exit code, then the (empty) snapshot). What the host sends is decoded
 * (spec 3.2) and re-encoded; nothing the host sends reaches the sandbox as
 * it came.
 *
 * The wire to the host (spec 8.2): frames one per line. shutdown exits 0;
 * run runs the block (the channel's empty workspace archive, then the run
 * frame) and the host gets done, then output; no archives. A tool_result
 * while a block runs goes to the sandbox; any other kind is noted on stderr
 * and ignored. EOF, or a line that does not decode (an empty one included),
 * exits 1. */
#include "stream/relay.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <poll.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/buf.h"
#include "core/cleanup.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/utf8.h"
#include "core/util.h"
#include "loop/closer.h"
#include "loop/loop.h"
#include "proto/chan.h"
#include "proto/frame.h"
#include "proto/relay.h"
#include "sandbox/seccomp_notify.h"
#include "session/chan_conn.h"
#include "session/notify.h"

#define STREAM_TURN_ID 1
#define STREAM_TICK_MS 250
#define STREAM_READ_CHUNK (64 * KiB)     /* host bytes read per call */
#define STREAM_READ_BUDGET (256 * KiB)   /* ... per wakeup */
#define STREAM_DEATH_WAIT_MS 5000        /* as session/turn.c's DEATH_REPORT_WAIT_MS */
#define STREAM_FLUSH_AT_END_MS 2000      /* what is queued for the host, at the end */
#define STREAM_SANDBOX_LOG_LINES 20      /* sandbox log lines between blocks, to stderr */


struct stream {
    const struct config *cfg;      /* borrowed */
    struct loop *loop;             /* owned */
    struct fs_client *fs;          /* borrowed */
    struct transport *t;           /* borrowed: the host's fds */
    struct loop_watch in_w, out_w, chan_w, pid_w, ctl_w;
    struct budget budget;          /* --turn-buffer: every buffer below is charged to it */
    struct buf line;               /* host bytes not yet a whole line */
    size_t line_scanned;           /* bytes of line known to hold no '\n' */
    struct buf out;                /* bytes for the host, from out_off on */
    size_t out_off;
    struct chan_conn *chan;        /* owned: the sandbox's channel */
    int chan_fd;                   /* owned: our end of it, -1 */
    int pidfd;                     /* owned: the sandbox's init, -1 */
    pid_t child_pid;
    struct policy_notify *table;   /* owned: errno per syscall, NULL without isolation */
    struct notify_turn notify;     /* the seccomp listener: counted refusals */
    struct buf in;                 /* the sandbox message being read */
    struct frame_scan scan;
    enum relay_phase state;
    bool ready_seen;
    bool run_queued;               /* the host's next run went while the 'S' was due */
    int64_t done_exit_code;
    uint64_t turn_start_ms, block_start_ms;
    unsigned log_lines_left;
    bool ending;                   /* stream_end was called */
    int status;                    /* exit status, once ending */
    bool death_wait;               /* the sandbox is gone: waiting for its death report */
    uint64_t death_deadline_ms;
    char death_what[160];          /* what we knew when it went */
};

static void update_interest(struct stream *s);

/* The spec's frame classes (the reference's protocol module), for the
 * "unexpected frame kind" note. */
static const char *frame_class(enum frame_kind k)
{
    static const char *const names[FRAME_KIND_COUNT] = {
        [FRAME_READY] = "Ready", [FRAME_RUN] = "Run", [FRAME_TOOL_CALL] = "ToolCall",
        [FRAME_TOOL_RESULT] = "ToolResult", [FRAME_LOG] = "Log", [FRAME_DONE] = "Done",
        [FRAME_OUTPUT] = "Output", [FRAME_SHUTDOWN] = "Shutdown"};
    return (unsigned)k < FRAME_KIND_COUNT ? names[k] : "?";
}

static void kill_sandbox(struct stream *s)
{
    if (s->pidfd >= 0) {
        syscall(SYS_pidfd_send_signal, s->pidfd, SIGKILL, NULL, 0);
        loop_unwatch(s->loop, &s->pid_w);
        close_and_reset(&s->pidfd);
    }
    if (s->chan_fd >= 0) {
        loop_unwatch(s->loop, &s->chan_w);
        chan_conn_close(s->chan);
        chan_conn_close_fd(steal_fd(&s->chan_fd));
    }
    notify_close(&s->notify); /* logs the refused calls' count */
}

/* The end: why on stderr (NULL: nothing to say), the sandbox killed, the
 * loop stopped. The first call wins. */
static void __attribute__((format(printf, 3, 4)))
stream_end(struct stream *s, int status, const char *fmt, ...)
{
    if (s->ending)
        return;
    s->ending = true;
    s->status = status;
    if (fmt) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        fprintf(stderr, "forkbox sandbox: %s\n", msg);
    }
    kill_sandbox(s);
    loop_stop(s->loop);
}

/* ------------------------------------------------------------ to the host */

static void host_flush(struct stream *s)
{
    while (s->out_off < s->out.len) {
        ssize_t w = write(s->t->out_fd, s->out.data + s->out_off, s->out.len - s->out_off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (w <= 0) {
            s->out_off = s->out.len = 0;
            stream_end(s, STREAM_EXIT_FAILED, "the host's connection failed: %s",
                       w < 0 ? strerror(errno) : "closed");
            return;
        }
        s->out_off += (size_t)w;
    }
    if (s->out_off == s->out.len) {
        buf_reset(&s->out);
        s->out_off = 0;
    }
}

/* Queue one frame's bytes (a whole line, trailing \n included) for the host. */
static int host_send(struct stream *s, const uint8_t *p, size_t n)
{
    int r = buf_append(&s->out, p, n);
    if (r < 0) {
        stream_end(s, STREAM_EXIT_FAILED, "cannot queue a frame for the host: %s", strerror(-r));
        return -1;
    }
    host_flush(s);
    return s->ending ? -1 : 0;
}

static int host_send_frame(struct stream *s, const struct frame *f)
{
    struct buf b;
    buf_init_budget(&b, SIZE_MAX, &s->budget);
    int r = frame_encode(f, &b);
    if (r == 0)
        r = host_send(s, b.data, b.len);
    else
        stream_end(s, STREAM_EXIT_FAILED, "cannot encode a frame: %s", strerror(-r));
    buf_free(&b);
    return r < 0 ? -1 : 0;
}

/* --------------------------------------------------------- to the sandbox */

static int sandbox_send(struct stream *s, enum chan_type type, const struct frame *f)
{
    struct buf b;
    buf_init_budget(&b, SIZE_MAX, &s->budget);
    int r = f ? frame_encode(f, &b) : 0;
    if (r == 0)
        r = chan_conn_send(s->chan, type, &b);
    else
        buf_free(&b);
    if (r == 0 && s->chan_fd >= 0 && chan_conn_flush(s->chan) < 0)
        r = -EPIPE;
    if (r < 0 && r != -EPIPE) {
        stream_end(s, STREAM_EXIT_FAILED, "cannot queue a message for the sandbox: %s",
                   strerror(-r));
        return -1;
    }
    return 0; /* -EPIPE: the sandbox is gone; its pidfd says so */
}

/* ----------------------------------------------------- the host's frames */

static void on_host_line(struct stream *s, const uint8_t *p, size_t n)
{
    struct frame f;
    const char *why = "not valid UTF-8";
    if (!utf8_valid(p, n) || frame_decode(p, n, FRAME_FROM_CLIENT, &f, &why) < 0) {
        stream_end(s, STREAM_EXIT_FAILED, "undecodable frame from the host (%s)", why);
        return;
    }
    bool ok = false;
    switch (f.kind) {
    case FRAME_SHUTDOWN:
        stream_end(s, STREAM_EXIT_SHUTDOWN, NULL);
        ok = true;
        break;
    case FRAME_RUN:
        /* The host sends its next run once it has read output, which may be
         * before the sandbox's (empty) snapshot that follows it has come in:
         * the channel keeps the order, so the block starts when it has. */
        if (s->state != RELAY_BETWEEN && (s->state != RELAY_WANT_SNAPSHOT || s->run_queued))
            break;
        /* The channel's order for a block: a workspace archive (empty: the
         * workspace is the host's own directory), then run. */
        if (sandbox_send(s, CHAN_WORKSPACE, NULL) == 0 && sandbox_send(s, CHAN_FRAME, &f) == 0) {
            if (s->state == RELAY_BETWEEN) {
                s->state = RELAY_RUNNING;
                s->block_start_ms = now_ms();
            } else {
                s->run_queued = true;
            }
        }
        ok = true;
        break;
    case FRAME_TOOL_RESULT:
        if (s->state != RELAY_RUNNING)
            break;
        sandbox_send(s, CHAN_FRAME, &f);
        ok = true;
        break;
    default:
        break;
    }
    if (!ok)
        fprintf(stderr, "[adk-code-mode-sandbox] unexpected frame kind: %s\n", frame_class(f.kind));
    frame_free(&f);
}

/* Split what arrived into lines. 0, or -1 once ending. */
static int host_lines(struct stream *s)
{
    while (!s->ending) {
        uint8_t *nl = memchr(s->line.data + s->line_scanned, '\n', s->line.len - s->line_scanned);
        if (!nl) {
            s->line_scanned = s->line.len;
            return 0;
        }
        size_t n = (size_t)(nl - s->line.data) + 1;
        on_host_line(s, s->line.data, n);
        buf_consume(&s->line, n);
        s->line_scanned = 0;
        /* Backpressure: a sandbox that does not read its channel stops us
         * reading the host (the rest stays in the kernel's buffers). */
        if (chan_conn_queued(s->chan) > RELAY_WINDOW)
            return 0;
    }
    return -1;
}

static void on_host_in(struct loop_watch *w, uint32_t events)
{
    struct stream *s = w->ud;
    (void)events;
    for (size_t got = 0; got < STREAM_READ_BUDGET && !s->ending;) {
        int r = buf_reserve(&s->line, STREAM_READ_CHUNK);
        if (r < 0) {
            stream_end(s, STREAM_EXIT_FAILED, "undecodable frame from the host (%s)",
                       r == -ENOBUFS ? "a line longer than 256 MiB" : strerror(-r));
            return;
        }
        ssize_t n = read(s->t->in_fd, s->line.data + s->line.len, STREAM_READ_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) {
            /* A last line without its \n is still a line (as readline()
             * returns it); then EOF. */
            if (s->line.len && host_lines(s) == 0 && s->line.len)
                on_host_line(s, s->line.data, s->line.len);
            stream_end(s, STREAM_EXIT_FAILED, "end of file from the host%s",
                       n < 0 ? " (read error)" : "");
            return;
        }
        s->line.len += (size_t)n;
        got += (size_t)n;
        if (host_lines(s) < 0)
            return;
        if (chan_conn_queued(s->chan) > RELAY_WINDOW)
            break;
    }
    update_interest(s);
}

static void on_host_out(struct loop_watch *w, uint32_t events)
{
    struct stream *s = w->ud;
    (void)events;
    host_flush(s);
    if (!s->ending)
        update_interest(s);
}

/* ----------------------------------------------------- the sandbox's side */

static void sandbox_error(struct stream *s, const char *what)
{
    stream_end(s, STREAM_EXIT_FAILED, "sandbox protocol error: %s", what);
}

static int on_sandbox_begin(void *ud, const struct chan_msg *m, struct buf **into)
{
    struct stream *s = ud;
    uint64_t limit = m->type == CHAN_FRAME      ? relay_frame_max(s->state, s->cfg->output_cap)
                     : m->type == CHAN_SNAPSHOT ? (s->state == RELAY_WANT_SNAPSHOT ? UINT32_MAX : 0)
                     : m->type == CHAN_NOTIFY   ? (m->first ? 1 : 0)
                                                : 0;
    char what[120];
    if (limit == 0 || m->len > limit) {
        snprintf(what, sizeof what, "'%c' message of %" PRIu32 " bytes not allowed now",
                 (int)m->type, m->len);
        sandbox_error(s, what);
        return -1;
    }
    *into = NULL;
    if (m->type != CHAN_FRAME)
        return 0; /* N has no body; S is dropped unread: the host shares the workspace */
    int r = m->len ? buf_reserve_exact(&s->in, m->len) : 0;
    if (r < 0) {
        stream_end(s, STREAM_EXIT_FAILED, "sandbox message over --turn-buffer: %s",
                   strerror(-r));
        return -1;
    }
    *into = &s->in;
    frame_scan_init(&s->scan, FRAME_FROM_CHILD, relay_items_max(s->state));
    return 0;
}

static int on_sandbox_data(void *ud, const struct chan_msg *m)
{
    struct stream *s = ud;
    const char *why = NULL;
    if (m->type == CHAN_FRAME && frame_scan_feed(&s->scan, s->in.data, s->in.len, &why) < 0) {
        sandbox_error(s, why);
        return -1;
    }
    return 0;
}

/* A log between blocks: the host reads none then; an error one (a setup or
 * runtime failure, before the sandbox exits) goes to our stderr, escaped
 * (its JSON text), cut, and only so many. */
static void sandbox_log_line(struct stream *s, const struct frame *f)
{
    const struct frame_field *level = frame_get(f, "level"), *msg = frame_get(f, "msg");
    if (s->log_lines_left == 0 || level->len != 7 || memcmp(level->json, "\"error\"", 7) != 0)
        return;
    s->log_lines_left--;
    LOG_W("sandbox log: %.*s", (int)(msg->len > 300 ? 300 : msg->len), msg->json);
}

static int handle_child_frame(struct stream *s, struct frame *f)
{
    const char *misfit = relay_frame_misfit(f, s->scan.js.items);
    if (misfit) {
        sandbox_error(s, misfit);
        return -1;
    }
    bool legal = false;
    enum relay_phase next = s->state;
    switch (f->kind) {
    case FRAME_READY:
        legal = !s->ready_seen;
        s->ready_seen = true;
        break;
    case FRAME_TOOL_CALL:
        legal = s->state == RELAY_RUNNING && s->ready_seen;
        break;
    case FRAME_LOG:
        if (s->state != RELAY_RUNNING) {
            sandbox_log_line(s, f);
            return 0;
        }
        legal = true;
        break;
    case FRAME_DONE:
        legal = s->state == RELAY_RUNNING && s->ready_seen;
        next = RELAY_WANT_OUTPUT;
        s->done_exit_code = f->exit_code;
        break;
    case FRAME_OUTPUT:
        legal = s->state == RELAY_WANT_OUTPUT && f->exit_code == s->done_exit_code;
        next = RELAY_WANT_SNAPSHOT;
        break;
    default:
        break;
    }
    if (!legal) {
        char what[120];
        snprintf(what, sizeof what, "unexpected %s frame", frame_kind_name(f->kind));
        sandbox_error(s, what);
        return -1;
    }
    if (f->kind == FRAME_OUTPUT) {
        int a = relay_cap_stream(f, "stdout", s->cfg->output_cap);
        int b = a < 0 ? a : relay_cap_stream(f, "stderr", s->cfg->output_cap);
        if (a < 0 || b < 0) {
            stream_end(s, STREAM_EXIT_FAILED, "out of memory");
            return -1;
        }
        if (a || b)
            f->canonical = false;
    }
    s->state = next;
    /* Byte-exact when it already is our encoding (a line: it ends in \n). */
    if (f->canonical)
        return host_send(s, s->in.data, s->in.len);
    return host_send_frame(s, f);
}

static int on_sandbox_end(void *ud, struct chan_msg *m)
{
    struct stream *s = ud;
    if (m->type == CHAN_NOTIFY) {
        if (m->fd < 0 || m->len != 0) {
            closer_close(m->fd, CLOSER_ABORT | CLOSER_DRAIN);
            sandbox_error(s, "unexpected listener message");
            return -1;
        }
        notify_adopt(&s->notify, m->fd);
        return 0;
    }
    if (m->fd >= 0) { /* an fd with a first message that is not the listener */
        closer_close(m->fd, CLOSER_ABORT | CLOSER_DRAIN);
        sandbox_error(s, chan_conn_error(-EPERM));
        return -1;
    }
    if (m->type == CHAN_SNAPSHOT) {
        s->state = s->run_queued ? RELAY_RUNNING : RELAY_BETWEEN;
        s->block_start_ms = now_ms();
        s->run_queued = false;
        return 0;
    }
    struct frame f;
    const char *why = NULL;
    int r = frame_scan_finish(&s->scan, s->in.data, s->in.len, FRAME_FROM_CHILD, &f, &why);
    if (r < 0) {
        buf_free(&s->in);
        sandbox_error(s, why ? why : "bad frame");
        return -1;
    }
    r = handle_child_frame(s, &f);
    frame_free(&f);
    buf_free(&s->in);
    if (r < 0)
        return -1;
    /* Backpressure: a host that does not read stops the sandbox. */
    return s->out.len - s->out_off > RELAY_WINDOW ? 1 : 0;
}

static const struct chan_conn_handlers sandbox_handlers = {
    .on_begin = on_sandbox_begin,
    .on_data = on_sandbox_data,
    .on_end = on_sandbox_end,
};

/* Why the sandbox ended, from the fork server's death report (facts it and
 * its cgroup helper own, never the sandbox's words). */
static void sandbox_gone(struct stream *s, const struct fs_reply *d)
{
    char how[124];
    fs_death_reason(d, s->cfg, STREAM_DEATH_WAIT_MS, how, sizeof how);
    stream_end(s, STREAM_EXIT_FAILED, "the sandbox ended %s: %s", s->death_what, how);
}

/* The sandbox's channel hit EOF or its init exited: wait for the death
 * report, with nothing more read from it. */
static void sandbox_ended(struct stream *s)
{
    if (s->death_wait || s->ending)
        return;
    snprintf(s->death_what, sizeof s->death_what, "%s",
             s->state == RELAY_BETWEEN ? "between blocks" : "while a block ran");
    s->death_wait = true;
    s->death_deadline_ms = now_ms() + STREAM_DEATH_WAIT_MS;
    loop_unwatch(s->loop, &s->chan_w);
    loop_unwatch(s->loop, &s->pid_w);
}

static void on_chan(struct loop_watch *w, uint32_t events)
{
    struct stream *s = w->ud;
    if ((events & EPOLLOUT) && chan_conn_flush(s->chan) < 0) {
        sandbox_ended(s);
        return;
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        int r = chan_conn_read(s->chan);
        if (r == -EMFILE) { /* its listener did not fit in our fd table */
            char why[120];
            fs_spawn_failure(-EMFILE, why, sizeof why);
            stream_end(s, STREAM_EXIT_USAGE, "%s", why);
            return;
        }
        if (chan_conn_error(r)) {
            sandbox_error(s, chan_conn_error(r));
            return;
        }
        if (r == -EPIPE) {
            sandbox_ended(s);
            return;
        }
    }
    if (!s->ending)
        update_interest(s);
}

static void on_pidfd(struct loop_watch *w, uint32_t events)
{
    (void)events;
    sandbox_ended(w->ud);
}

/* The fork server's control socket: the spawn reply, then (once the
 * sandbox is reaped) its death report. */
static void on_ctl(struct loop_watch *w, uint32_t events)
{
    struct stream *s = w->ud;
    (void)events;
    for (;;) {
        struct fs_reply rep;
        int chan_fd = -1, pidfd = -1;
        int r = fs_client_reply(s->fs, &rep, &chan_fd, &pidfd);
        if (r == 0)
            return;
        if (r < 0) {
            loop_unwatch(s->loop, &s->ctl_w);
            if (s->death_wait)
                sandbox_gone(s, NULL);
            else
                stream_end(s, STREAM_EXIT_FAILED, "the fork server died");
            return;
        }
        if (rep.kind == FS_REPLY_DEATH) {
            if (s->death_wait)
                sandbox_gone(s, &rep);
            continue;
        }
        if (rep.kind == FS_REPLY_CGROUPS)
            continue;
        if (rep.status < 0) {
            char why[120];
            fs_spawn_failure(rep.status, why, sizeof why);
            stream_end(s, STREAM_EXIT_USAGE, "%s", why);
            return;
        }
        s->chan_fd = chan_fd;
        s->pidfd = pidfd;
        s->child_pid = rep.pid;
        chan_conn_set_fd(s->chan, chan_fd);
        s->chan_w = (struct loop_watch){.fd = chan_fd, .cb = on_chan, .ud = s};
        s->pid_w = (struct loop_watch){.fd = pidfd, .cb = on_pidfd, .ud = s};
        loop_watch(s->loop, &s->pid_w, EPOLLIN);
        (void)chan_conn_flush(s->chan);
        update_interest(s);
    }
}

static void update_interest(struct stream *s)
{
    if (s->ending)
        return;
    bool host_backlog = s->out.len - s->out_off > RELAY_WINDOW;
    bool chan_backlog = chan_conn_queued(s->chan) > RELAY_WINDOW;
    loop_watch(s->loop, &s->in_w, chan_backlog ? 0 : EPOLLIN);
    loop_watch(s->loop, &s->out_w, s->out_off < s->out.len ? EPOLLOUT : 0);
    if (s->chan_fd >= 0 && !s->death_wait)
        loop_watch(s->loop, &s->chan_w, (host_backlog ? 0 : EPOLLIN) |
                                            (chan_conn_queued(s->chan) ? EPOLLOUT : 0));
}

/* Timeouts (docs/operating.md "Timeouts"): a block past --block-timeout or a turn
 * past --turn-timeout ends as a WebSocket turn's does: the sandbox is
 * stopped, the host gets done and output with exit code 124 and a stderr
 * line naming the limit, and forkbox exits 1. */
static void on_tick(void *ud)
{
    struct stream *s = ud;
    uint64_t now = now_ms();
    if (s->death_wait && now >= s->death_deadline_ms) {
        sandbox_gone(s, NULL);
        return;
    }
    const char *what = NULL;
    uint64_t limit = 0;
    if (s->cfg->turn_timeout_ms && now - s->turn_start_ms >= s->cfg->turn_timeout_ms) {
        what = "turn-timeout";
        limit = s->cfg->turn_timeout_ms;
    } else if (s->state == RELAY_RUNNING && s->cfg->block_timeout_ms &&
               now - s->block_start_ms >= s->cfg->block_timeout_ms) {
        what = "block-timeout";
        limit = s->cfg->block_timeout_ms;
    }
    if (!what || s->death_wait)
        return;
    kill_sandbox(s);
    if (s->state == RELAY_RUNNING) {
        char msg[160];
        snprintf(msg, sizeof msg, "[forkbox: the block was stopped: --%s of %" PRIu64 " s]\n",
                 what, limit / 1000);
        struct frame f;
        frame_init(&f, FRAME_DONE);
        frame_set_int(&f, "exit_code", 124);
        host_send_frame(s, &f);
        frame_free(&f);
        frame_init(&f, FRAME_OUTPUT);
        frame_set_int(&f, "exit_code", 124);
        frame_set_string(&f, "stderr", msg);
        host_send_frame(s, &f);
        frame_free(&f);
    }
    stream_end(s, STREAM_EXIT_FAILED, "--%s of %" PRIu64 " s reached", what, limit / 1000);
}

/* What is still queued for the host goes, within a bound (done and output
 * after a timeout). */
static void flush_at_end(struct stream *s)
{
    uint64_t deadline = now_ms() + STREAM_FLUSH_AT_END_MS;
    while (s->out_off < s->out.len && now_ms() < deadline) {
        ssize_t w = write(s->t->out_fd, s->out.data + s->out_off, s->out.len - s->out_off);
        if (w > 0) {
            s->out_off += (size_t)w;
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            struct pollfd p = {.fd = s->t->out_fd, .events = POLLOUT};
            poll(&p, 1, 100);
            continue;
        }
        break;
    }
}

int stream_run(const struct config *cfg, struct fs_client *fs, struct transport *t)
{
    struct stream st = {
        .cfg = cfg, .fs = fs, .t = t, .chan_fd = -1, .pidfd = -1,
        .budget = {.max = cfg->turn_buffer},
        .log_lines_left = STREAM_SANDBOX_LOG_LINES,
        .turn_start_ms = now_ms(),
    };
    struct stream *s = &st;
    char err[512];
    s->loop = loop_new();
    if (!s->loop) {
        fprintf(stderr, "forkbox sandbox: out of memory\n");
        return STREAM_EXIT_USAGE;
    }
    if (cfg->isolate && policy_notify_load(cfg->policy_file, &s->table, err, sizeof err) < 0) {
        fprintf(stderr, "forkbox sandbox: %s\n", err);
        loop_free(s->loop);
        return STREAM_EXIT_USAGE;
    }
    notify_turn_init(&s->notify, STREAM_TURN_ID, s->loop, s->table);
    notify_turn_workspace(&s->notify, cfg->workdir);
    buf_init_budget(&s->line, CHAN_MAX_MESSAGE_BYTES + STREAM_READ_CHUNK, &s->budget);
    buf_init_budget(&s->out, SIZE_MAX, &s->budget);
    buf_init_budget(&s->in, SIZE_MAX, &s->budget);
    s->chan = chan_conn_new(-1, &s->budget, &sandbox_handlers, s);
    s->in_w = (struct loop_watch){.fd = t->in_fd, .cb = on_host_in, .ud = s};
    s->out_w = (struct loop_watch){.fd = t->out_fd, .cb = on_host_out, .ud = s};
    s->ctl_w = (struct loop_watch){.fd = fs->ctl_fd, .cb = on_ctl, .ud = s};
    int r = s->chan ? fs_client_request(fs, STREAM_TURN_ID, 0) : -ENOMEM;
    /* The tools are the host's, bound read-only: an empty tools archive
     * gets the runtime to its ready frame. Queued until the sandbox exists. */
    if (r == 0)
        r = sandbox_send(s, CHAN_TOOLS, NULL) < 0 ? -EIO : 0;
    if (r < 0) {
        fprintf(stderr, "forkbox sandbox: cannot ask for a sandbox: %s\n", strerror(-r));
        s->status = STREAM_EXIT_USAGE;
    } else {
        loop_watch(s->loop, &s->ctl_w, EPOLLIN);
        update_interest(s);
        loop_set_tick(s->loop, STREAM_TICK_MS, on_tick, s);
        if (loop_run(s->loop) < 0 && !s->ending)
            stream_end(s, STREAM_EXIT_FAILED, "event loop failed");
        flush_at_end(s);
    }
    kill_sandbox(s);
    chan_conn_free(s->chan);
    buf_free(&s->line);
    buf_free(&s->out);
    buf_free(&s->in);
    policy_notify_free(s->table);
    loop_free(s->loop);
    return s->status;
}
