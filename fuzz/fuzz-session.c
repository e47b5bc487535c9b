/* One supervisor session (src/session/, the production code) driven
 * by a hostile client and a hostile sandbox at once, over real sockets and the
 * real event loop: the client side writes an upgrade request and then
 * WebSocket frames, the sandbox side writes channel envelopes, and between
 * them the harness turns the loop, fires timer ticks (also far in the future:
 * idle, block and turn timeouts) and makes either side disappear.
 *
 * Input: a list of operations, each one byte of opcode, one byte of
 * parameter, a 2-byte little-endian length and that many payload bytes:
 *   0  client: a text message (payload), fragmented at the parameter
 *   1  client: a binary message (payload)
 *   2  client: raw bytes on the WebSocket stream (masked or not: anything)
 *   3  sandbox: an envelope of type "FTWSN"[param % 5] around the payload
 *   4  sandbox: raw bytes on the channel
 *   5  sandbox: a well-formed message from a template (param picks it; the
 *      payload, if any, is its variable part): ready, tool_call, log, done,
 *      output with a long stdout, an empty-tree snapshot, a small valid
 *      snapshot, a snapshot with a setuid member
 *   6  a timer tick, param seconds in the future (x 4)
 *   7  the sandbox dies (channel closed, its pidfd readable; maybe the fork
 *      server's death report, with a wait status and cgroup counters)
 *   8  the client half-closes
 *   9  a valid tools archive or workspace archive from the client (param)
 * Each operation is followed by a few rounds of the loop.
 *
 * Properties, checked on everything the host receives (a WebSocket client
 * model of spec 2.4) and on the supervisor's state:
 *   - every text message is valid UTF-8 and decodes as a frame a sandbox may
 *     send; ready at most once; tool_call and done only while a run relayed
 *     to the sandbox has no done yet; after done comes output (same exit
 *     code), then exactly one binary message, then nothing but the next
 *     block's frames; no binary message anywhere else;
 *   - stdout and stderr of an output frame decode to at most --output-cap
 *     plus the notes;
 *   - a non-empty archive relayed to the host passes the supervisor's own
 *     check (tarcheck): in particular, never a setuid, link or device member;
 *   - a close frame carries 1000, 1001, 1002, 1007, 1009, 1011 or 1013 and an
 *     ASCII reason of at most 123 bytes;
 *   - what the supervisor writes to the sandbox is run and tool_result
 *     frames (in its canonical form unless flagged CHAN_RAW) and archives,
 *     whole or in parts never interleaved with another message;
 *   - the turn's and the daemon's budgets are never exceeded, and every byte
 *     charged is given back once the session is freed. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config/config.h"
#include "core/budget.h"
#include "core/limits.h"
#include "core/utf8.h"
#include "core/util.h"
#include "fuzz.h"
#include "proto/chan.h"
#include "proto/frame.h"
#include "proto/tarcheck.h"
#include "net/auth.h"
#include "session/notify.h"
#include "session/session.h"
#include "session/tenants.h"
#include "stage/archive.h"

#include <archive.h>
#include <archive_entry.h>

#define OUTPUT_CAP 1024
#define MAX_OPS 64

/* ---------------------------------------------------------------- the rest of the supervisor */

static uint64_t spawn_wanted; /* the turn whose sandbox was asked for, 0 */
static unsigned n_turns;

static struct tenants tenants; /* the default tenant alone, as without auth */

static int may_admit(void *host, const char *authorization, struct tenant **tenant)
{
    *tenant = tenants_find(&tenants, TENANT_DEFAULT);
    return 0;
}

static unsigned admit(void *host, struct tenant *tenant)
{
    tenant->turns++;
    return ++n_turns;
}

static void release(void *host, struct tenant *tenant)
{
    tenant->turns--;
    n_turns--;
}

static const char *not_ready(void *host)
{
    return NULL;
}

static int request_sandbox(void *host, uint64_t turn_id, const struct tenant *tenant)
{
    spawn_wanted = turn_id;
    return 0;
}

/* Counted refusals need a seccomp listener: none here. */
void notify_turn_init(struct notify_turn *t, uint64_t turn_id, struct loop *loop,
                      struct policy_notify *table)
{
}

void notify_adopt(struct notify_turn *t, int fd)
{
    close(fd);
}

void notify_close(struct notify_turn *t)
{
}

/* ---------------------------------------------------------------- the host's view */

struct host {
    struct fuzz_wsin in; /* the server's frames */
    struct buf msg;      /* the message being reassembled */
    uint8_t msg_op;
    bool http_done;      /* the 101 response has been read */
    struct buf http;
    /* protocol model */
    enum { H_FRAMES, H_OUTPUT, H_ARCHIVE } slot;
    int64_t done_exit;
    unsigned readies, dones;
    bool closed;
};

/* Runs the client sent as messages: a block (and its done, its tool calls)
 * can only follow one. Not the runs relayed to the sandbox: a block's clock
 * starts when the supervisor takes the run, so a block that times out while
 * its run is still on its way (held for the sandbox's first message, or in
 * parts behind a full window) ends with a done of 124 the sandbox never
 * caused. Raw client bytes may hold runs the model cannot count. */
static unsigned runs_sent;
static bool client_wrote_raw;
static const struct config *g_cfg;
static bool verbose;          /* FUZZ_SESSION_VERBOSE=1: print what the host gets */

static void host_text(struct host *h, const uint8_t *p, size_t n)
{
    struct frame f;
    const char *why = NULL;
    FUZZ_ASSERT(utf8_valid(p, n), "text message to the host is not UTF-8");
    int r = frame_decode(p, n, FRAME_FROM_CHILD, &f, &why);
    FUZZ_ASSERT(r == 0, "the host got a frame no sandbox may send (%s): %.*s", why,
                (int)(n > 200 ? 200 : n), (const char *)p);
    if (verbose)
        fprintf(stderr, "host: text %.*s\n", (int)(n > 120 ? 120 : n), (const char *)p);
    switch (f.kind) {
    case FRAME_READY:
        FUZZ_ASSERT(h->slot == H_FRAMES && ++h->readies == 1, "ready twice or after done");
        break;
    case FRAME_TOOL_CALL:
        FUZZ_ASSERT(h->slot == H_FRAMES && (client_wrote_raw || runs_sent > h->dones),
                    "tool_call outside a block");
        break;
    case FRAME_LOG:
        FUZZ_ASSERT(h->slot == H_FRAMES, "log between done and the archive");
        break;
    case FRAME_DONE:
        FUZZ_ASSERT(h->slot == H_FRAMES && (client_wrote_raw || runs_sent > h->dones),
                    "done outside a block");
        h->dones++;
        h->done_exit = f.exit_code;
        h->slot = H_OUTPUT;
        break;
    case FRAME_OUTPUT:
        FUZZ_ASSERT(h->slot == H_OUTPUT, "output not right after done");
        FUZZ_ASSERT(f.exit_code == h->done_exit, "output.exit_code != done.exit_code");
        FUZZ_ASSERT(frame_get(&f, "stdout")->str_bytes <= OUTPUT_CAP + OUTPUT_NOTE_ALLOWANCE &&
                        frame_get(&f, "stderr")->str_bytes <= OUTPUT_CAP + OUTPUT_NOTE_ALLOWANCE,
                    "output stream over the cap reached the host");
        h->slot = H_ARCHIVE;
        break;
    default:
        FUZZ_ASSERT(0, "kind %s sent to the host", frame_kind_name(f.kind));
    }
    frame_free(&f);
}

static void host_binary(struct host *h, const uint8_t *p, size_t n, const struct config *cfg)
{
    if (verbose)
        fprintf(stderr, "host: binary of %zu bytes\n", n);
    FUZZ_ASSERT(h->slot == H_ARCHIVE, "a binary message outside the archive slot");
    h->slot = H_FRAMES;
    if (n == 0)
        return;
    const struct tarcheck_limits lim = {.max_data = cfg->snapshot_max,
                                        .max_members = cfg->max_members};
    struct tarcheck *tc = tarcheck_new(&lim);
    int r = tarcheck_feed(tc, p, n);
    while (r == TARCHECK_AGAIN || r == TARCHECK_NEED_INPUT)
        r = tarcheck_finish(tc, p, n);
    FUZZ_ASSERT(r == TARCHECK_VALID, "an archive the check refuses reached the host: %s",
                tarcheck_reason(tc));
    tarcheck_free(tc);
}

/* Everything the client wrote after its request, to find the first close
 * frame it sent: the server answers that with an echo of its code and
 * reason (RFC 6455 5.5.1), which are the client's, not the server's. */
static struct buf client_sent;

static bool client_close_echo(const uint8_t *p, size_t n)
{
    const uint8_t *b = client_sent.data;
    size_t len = client_sent.len, i = 0;
    while (i + 2 <= len) {
        uint8_t op = b[i] & 0x0f, len7 = b[i + 1] & 0x7f;
        bool masked = b[i + 1] & 0x80;
        size_t h = 2 + (len7 == 126 ? 2 : len7 == 127 ? 8 : 0) + (masked ? 4 : 0);
        if (i + h > len)
            return false;
        uint64_t plen = len7;
        if (len7 == 126)
            plen = (uint64_t)b[i + 2] << 8 | b[i + 3];
        else if (len7 == 127)
            for (int k = 0; k < 8; k++)
                plen = (k ? plen << 8 : 0) | b[i + 2 + k];
        if (plen > len - i - h)
            return false;
        if (op == 0x8) {
            if (plen != n)
                return false;
            const uint8_t *key = b + i + h - 4;
            for (size_t k = 0; k < n; k++)
                if ((uint8_t)(b[i + h + k] ^ (masked ? key[k & 3] : 0)) != p[k])
                    return false;
            return true;
        }
        i += h + (size_t)plen;
    }
    return false;
}

static void host_close(struct host *h, const uint8_t *p, size_t n)
{
    h->closed = true;
    if (verbose)
        fprintf(stderr, "host: close %.*s\n", (int)(n > 2 ? n - 2 : 0), (const char *)p + 2);
    if (n == 0 || client_close_echo(p, n))
        return;
    FUZZ_ASSERT(n >= 2, "close frame with a 1-byte payload");
    unsigned code = (unsigned)p[0] << 8 | p[1];
    FUZZ_ASSERT(code == 1000 || code == 1001 || code == 1002 || code == 1007 || code == 1009 ||
                    code == 1011 || code == 1013,
                "close code %u", code);
    FUZZ_ASSERT(n - 2 <= 123, "close reason of %zu bytes", n - 2);
    for (size_t i = 2; i < n; i++)
        FUZZ_ASSERT(p[i] >= 0x20 && p[i] < 0x7f, "close reason byte 0x%02x", p[i]);
}

/* One frame of the server's stream (fuzz_wsin): reassemble messages. */
static void host_frame(void *ud, uint8_t op, bool fin, const uint8_t *p, size_t n, uint64_t len)
{
    struct host *h = ud;
    FUZZ_ASSERT(len <= WS_MAX_MESSAGE_BYTES && n == len, "frame of %llu bytes",
                (unsigned long long)len);
    if (op == 0x8) {
        host_close(h, p, n);
        return;
    }
    if (op > 0x2)
        return; /* ping, pong */
    if (op != 0)
        h->msg_op = op;
    FUZZ_ASSERT(buf_append(&h->msg, p, n) == 0, "host message too large");
    if (!fin)
        return;
    if (h->msg_op == 1)
        host_text(h, h->msg.data ? h->msg.data : (const uint8_t *)"", h->msg.len);
    else
        host_binary(h, h->msg.data, h->msg.len, g_cfg);
    buf_reset(&h->msg);
}

static void host_bytes(struct host *h, const uint8_t *p, size_t n)
{
    while (n > 0 && !h->http_done) {
        buf_append(&h->http, p, 1);
        p++;
        n--;
        if (h->http.len >= 4 && memcmp(h->http.data + h->http.len - 4, "\r\n\r\n", 4) == 0)
            h->http_done = true;
    }
    fuzz_wsin_feed(&h->in, p, n, host_frame, h);
}

/* What the supervisor writes to the sandbox: count the run frames relayed. */
struct sbx_view {
    uint8_t hdr[CHAN_HDR_LEN];
    size_t hdr_got;
    uint32_t left;
    bool is_frame;
    unsigned flags;         /* the envelope's (chan.h) */
    enum chan_type type;
    bool open;              /* a message in parts is being put together */
    struct buf body;        /* a frame so far (all its parts) */
};

static void sandbox_bytes(struct sbx_view *v, const uint8_t *p, size_t n)
{
    while (n > 0) {
        if (v->hdr_got < CHAN_HDR_LEN) {
            v->hdr[v->hdr_got++] = *p++;
            n--;
            if (v->hdr_got < CHAN_HDR_LEN)
                continue;
            enum chan_type t;
            uint32_t len;
            FUZZ_ASSERT(chan_hdr_decode_flags(v->hdr, CHAN_HDR_LEN, CHAN_MAX_MESSAGE_BYTES, &t,
                                              &v->flags, &len) == 1,
                        "the supervisor wrote a bad envelope");
            FUZZ_ASSERT(t == CHAN_FRAME || t == CHAN_TOOLS || t == CHAN_WORKSPACE,
                        "the supervisor wrote a '%c' envelope", t);
            FUZZ_ASSERT(!v->open || t == v->type, "a message's parts interleaved with another");
            FUZZ_ASSERT(v->open || !(v->flags & CHAN_ABORT), "an abort of no message");
            if (!v->open)
                buf_reset(&v->body);
            v->left = len;
            v->type = t;
            v->is_frame = t == CHAN_FRAME;
            if (v->flags & CHAN_ABORT) { /* its parts dropped */
                v->open = false;
                v->hdr_got = 0;
                continue;
            }
        }
        size_t k = v->left < n ? v->left : n;
        if (v->is_frame)
            buf_append(&v->body, p, k);
        p += k;
        n -= k;
        v->left -= (uint32_t)k;
        if (v->left == 0) {
            v->hdr_got = 0;
            v->open = v->flags & CHAN_MORE;
            if (v->is_frame && !v->open) {
                struct frame f;
                int r = frame_decode(v->body.data, v->body.len, FRAME_FROM_CLIENT, &f, NULL);
                FUZZ_ASSERT(r == 0 && (f.kind == FRAME_RUN || f.kind == FRAME_TOOL_RESULT),
                            "the supervisor relayed something other than run or tool_result");
                /* The sandbox reads a frame by its shape unless it is flagged. */
                FUZZ_ASSERT(f.canonical || (v->flags & CHAN_RAW),
                            "a frame not in the supervisor's form, not flagged CHAN_RAW");
                frame_free(&f);
            }
        }
    }
}

/* ---------------------------------------------------------------- templates */

static struct buf empty_snapshot, tiny_snapshot, evil_snapshot;

static la_ssize_t to_buf(struct archive *a, void *ud, const void *p, size_t n)
{
    return buf_append(ud, p, n) == 0 ? (la_ssize_t)n : -1;
}

/* The snapshots a sandbox may send: of an empty workspace and of one file,
 * as the runtime writes them; and one with a setuid member, written by the
 * same libarchive writer as if a sandbox had forged it. */
static void make_snapshots(void)
{
    static bool made;
    if (made)
        return;
    made = true;
    archive_snapshot_prepare();
    char dir[] = "/tmp/fuzz-session-XXXXXX";
    FUZZ_ASSERT(mkdtemp(dir) != NULL, "mkdtemp");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    buf_init(&empty_snapshot, 1 << 20);
    FUZZ_ASSERT(archive_snapshot(dfd, 1 << 20, &empty_snapshot, NULL) == 0, "archive_snapshot");
    int f = openat(dfd, "hello.txt", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    FUZZ_ASSERT(f >= 0 && write(f, "hi\n", 3) == 3, "write");
    close(f);
    buf_init(&tiny_snapshot, 1 << 20);
    FUZZ_ASSERT(archive_snapshot(dfd, 1 << 20, &tiny_snapshot, NULL) == 0, "archive_snapshot");
    unlinkat(dfd, "hello.txt", 0);
    close(dfd);
    rmdir(dir);

    buf_init(&evil_snapshot, 1 << 20);
    struct archive *a = archive_write_new();
    struct archive_entry *e = archive_entry_new();
    archive_write_add_filter_gzip(a);
    archive_write_set_format_pax_restricted(a);
    archive_write_open(a, &evil_snapshot, NULL, to_buf, NULL);
    archive_entry_set_pathname(e, "evil");
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 04755);
    archive_entry_set_size(e, 2);
    archive_write_header(a, e);
    archive_write_data(a, "x\n", 2);
    archive_write_close(a);
    archive_write_free(a);
    archive_entry_free(e);
}

static void sandbox_template(int fd, uint8_t which, const uint8_t *p, size_t n)
{
    char text[512];
    size_t len;
    enum chan_type type = CHAN_FRAME;
    const uint8_t *body = (const uint8_t *)text;
    char var[64];
    size_t vn = n < sizeof var - 1 ? n : sizeof var - 1;
    for (size_t i = 0; i < vn; i++) /* a harmless variable part */
        var[i] = (char)('a' + p[i] % 26);
    var[vn] = '\0';
    switch (which % 8) {
    case 0:
        len = (size_t)snprintf(text, sizeof text,
                               "{\"protocol_version\":2,\"python_version\":\"3.11.2\",\"packages\":{},"
                               "\"kind\":\"ready\"}\n");
        break;
    case 1:
        len = (size_t)snprintf(text, sizeof text,
                               "{\"id\":\"%s\",\"name\":\"echo\",\"args\":{\"m\":\"%s\"},\"timeout\":null,"
                               "\"kind\":\"tool_call\"}\n", var, var);
        break;
    case 2:
        len = (size_t)snprintf(text, sizeof text, "{\"level\":\"error\",\"msg\":\"%s\",\"kind\":\"log\"}\n",
                               var);
        break;
    case 3:
        len = (size_t)snprintf(text, sizeof text, "{\"exit_code\":%d,\"kind\":\"done\"}\n",
                               n ? p[0] - 128 : 0);
        break;
    case 4: {
        /* stdout of var repeated past the cap */
        static char big[4 * OUTPUT_CAP + 256];
        size_t o = (size_t)snprintf(big, sizeof big, "{\"stdout\":\"");
        for (; o < 3 * OUTPUT_CAP; o++)
            big[o] = vn ? var[o % vn] : 'A';
        o += (size_t)snprintf(big + o, sizeof big - o,
                              "\",\"stderr\":\"\",\"exit_code\":%d,\"kind\":\"output\"}\n",
                              n ? p[0] - 128 : 0);
        body = (const uint8_t *)big;
        len = o;
        break;
    }
    case 5:
    case 6:
    case 7: {
        make_snapshots();
        type = CHAN_SNAPSHOT;
        const struct buf *b = which % 8 == 5 ? &empty_snapshot
                            : which % 8 == 6 ? &tiny_snapshot : &evil_snapshot;
        static uint8_t copy[1 << 16];
        len = b->len < sizeof copy ? b->len : sizeof copy;
        memcpy(copy, b->data, len);
        if (n > 0 && len > 0) /* a byte of it changed: mostly a corrupt archive */
            copy[(p[0] * 131u) % len] ^= (uint8_t)(n > 1 ? p[1] | 1 : 1);
        body = copy;
        break;
    }
    default:
        return;
    }
    uint8_t hdr[CHAN_HDR_LEN];
    chan_hdr_encode(hdr, type, (uint32_t)len);
    (void)!write(fd, hdr, sizeof hdr);
    (void)!write(fd, body, len);
}

/* ---------------------------------------------------------------- client frames */

static void client_frame(int fd, uint8_t opcode, bool fin, const uint8_t *p, size_t n)
{
    uint8_t hdr[14], key[4] = {0x12, 0x34, 0x56, 0x78};
    size_t h = 0;
    hdr[h++] = (uint8_t)((fin ? 0x80 : 0) | opcode);
    if (n < 126) {
        hdr[h++] = (uint8_t)(0x80 | n);
    } else {
        hdr[h++] = 0x80 | 126;
        hdr[h++] = (uint8_t)(n >> 8);
        hdr[h++] = (uint8_t)n;
    }
    memcpy(hdr + h, key, 4);
    h += 4;
    uint8_t *m = malloc(h + n + 1);
    memcpy(m, hdr, h);
    for (size_t i = 0; i < n; i++)
        m[h + i] = p[i] ^ key[i & 3];
    (void)!write(fd, m, h + n);
    buf_append(&client_sent, m, h + n);
    free(m);
}

static void client_message(int fd, uint8_t opcode, uint8_t split, const uint8_t *p, size_t n)
{
    struct frame f;
    if (opcode == 1 && frame_decode(p, n, FRAME_FROM_CLIENT, &f, NULL) == 0) {
        runs_sent += f.kind == FRAME_RUN;
        frame_free(&f);
    }
    size_t cut = split && split < n ? split : n;
    client_frame(fd, opcode, cut == n, p, cut);
    if (cut < n)
        client_frame(fd, 0, true, p + cut, n - cut);
}

/* ---------------------------------------------------------------- the run */

static void drain(int fd, void (*fn)(void *, const uint8_t *, size_t), void *ud)
{
    uint8_t b[65536];
    ssize_t n;
    while (fd >= 0 && (n = recv(fd, b, sizeof b, MSG_DONTWAIT)) > 0)
        fn(ud, b, (size_t)n);
}

static void host_cb(void *ud, const uint8_t *p, size_t n) { host_bytes(ud, p, n); }
static void sbx_cb(void *ud, const uint8_t *p, size_t n) { sandbox_bytes(ud, p, n); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct config cfg;
    static bool cfg_done;
    if (!cfg_done) {
        char err[256];
        char *argv[] = {"forkboxd", "--output-cap=1K", "--snapshot-max=64K", "--max-members=50",
                        "--max-upload-tools=64K", "--max-upload-workspace=64K",
                        "--turn-buffer=2M", "--total-buffer=3M", "--block-timeout=5",
                        "--turn-timeout=600", "--idle-timeout=60", "--log-level=error", NULL};
        FUZZ_ASSERT(config_parse(12, argv, &cfg, err, sizeof err) == 0, "config: %s", err);
        log_init("fuzz", LOG_LEVEL_ERROR);
        /* As forkboxd: a write to a peer that is gone is an error, not a
         * signal (a closing session keeps its client socket open, for the
         * handshake, after its sandbox's channel is closed). */
        signal(SIGPIPE, SIG_IGN);
        verbose = getenv("FUZZ_SESSION_VERBOSE") != NULL;
        cfg_done = true;
    }
    g_cfg = &cfg;

    struct loop *loop = loop_new();
    struct budget total = {.max = cfg.total_buffer};
    struct preauth_pool preauth;
    FUZZ_ASSERT(preauth_init(&preauth, 8, 0) == 0, "preauth_init");
    tenants_init(&tenants, &total, 0);
    FUZZ_ASSERT(tenants_sync(&tenants, NULL) == 0, "tenants_sync");
    const struct session_env env = {.loop = loop, .cfg = &cfg, .budget = &total,
                                    .preauth = &preauth, .tenants = &tenants,
                                    .may_admit = may_admit,
                                    .admit = admit, .release = release,
                                    .request_sandbox = request_sandbox,
                                    .not_ready = not_ready};
    struct sessions *set = sessions_new(&env);
    FUZZ_ASSERT(set != NULL, "sessions_new");
    int cs[2], chan[2] = {-1, -1}, pid_pipe[2] = {-1, -1};
    FUZZ_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, cs) == 0,
                "socketpair");
    uint8_t key[PREAUTH_KEY_LEN] = {0};
    struct session *s = session_new(set, cs[1], key);
    FUZZ_ASSERT(s != NULL, "session_new");
    const uint64_t id = 1; /* the first connection's */
    FUZZ_ASSERT(sessions_find(set, id) == s, "the first session's id");
    spawn_wanted = 0;
    n_turns = 0;
    runs_sent = 0;
    client_wrote_raw = false;

    struct host h = {.slot = H_FRAMES};
    fuzz_wsin_init(&h.in, 8 << 20);
    buf_init(&h.msg, 8 << 20);
    buf_init(&h.http, 4096);
    struct sbx_view v = {0};
    buf_init(&v.body, 8 << 20);

    static const char upgrade[] =
        "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
    (void)!write(cs[0], upgrade, sizeof upgrade - 1);
    buf_init(&client_sent, SIZE_MAX);

    size_t i = 0;
    bool dead = false;
    for (int ops = 0; ops < MAX_OPS && !dead; ops++) {
        /* one round or a few, then what each side received */
        for (int r = 0; r < 4; r++) {
            loop_run_once(loop, 0);
            if (spawn_wanted) {
                struct fs_reply rep = {.status = 0, .turn_id = spawn_wanted, .pid = 1};
                FUZZ_ASSERT(spawn_wanted == id, "a sandbox for turn %llu",
                            (unsigned long long)spawn_wanted);
                FUZZ_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) == 0 &&
                                pipe2(pid_pipe, O_CLOEXEC) == 0,
                            "socketpair/pipe");
                fd_set_nonblock(chan[0], true);
                spawn_wanted = 0;
                if (session_sandbox_ready(s, &rep, chan[1], pid_pipe[0])) {
                    chan[1] = pid_pipe[0] = -1; /* the session owns them now */
                } else { /* the turn ended first: the server kills that sandbox */
                    for (int k = 0; k < 2; k++) {
                        close(chan[k]);
                        close(pid_pipe[k]);
                        chan[k] = pid_pipe[k] = -1;
                    }
                }
            }
            drain(cs[0], host_cb, &h);
            drain(chan[0], sbx_cb, &v);
            const struct budget *tb = session_budget(s);
            FUZZ_ASSERT(tb->used <= tb->max && total.used <= total.max,
                        "budget exceeded: turn %llu of %llu, daemon %llu of %llu",
                        (unsigned long long)tb->used, (unsigned long long)tb->max,
                        (unsigned long long)total.used, (unsigned long long)total.max);
            sessions_reap(set); /* as the server's before-sleep hook */
            if (sessions_count(set) == 0) {
                dead = true;
                break;
            }
        }
        if (dead || i + 4 > size)
            break;
        uint8_t op = data[i], param = data[i + 1];
        size_t n = (size_t)data[i + 2] | (size_t)data[i + 3] << 8;
        i += 4;
        if (n > size - i)
            n = size - i;
        const uint8_t *p = data + i;
        i += n;
        switch (op % 10) {
        case 0:
            client_message(cs[0], 1, param, p, n);
            break;
        case 1:
            client_message(cs[0], 2, param, p, n);
            break;
        case 2:
            (void)!write(cs[0], p, n);
            buf_append(&client_sent, p, n);
            client_wrote_raw = true;
            break;
        case 3:
            if (chan[0] >= 0) {
                uint8_t hdr[CHAN_HDR_LEN];
                chan_hdr_encode(hdr, (enum chan_type)"FTWSN"[param % 5], (uint32_t)n);
                (void)!write(chan[0], hdr, sizeof hdr);
                (void)!write(chan[0], p, n);
            }
            break;
        case 4:
            if (chan[0] >= 0)
                (void)!write(chan[0], p, n);
            break;
        case 5:
            if (chan[0] >= 0)
                sandbox_template(chan[0], param, p, n);
            break;
        case 6:
            sessions_tick(set, now_ms() + (uint64_t)param * 4000);
            break;
        case 7:
            if (chan[0] >= 0) {
                close(chan[0]);
                chan[0] = -1;
            }
            if (pid_pipe[1] >= 0) {
                close(pid_pipe[1]);
                pid_pipe[1] = -1;
            }
            /* The fork server's death report: before or after the session
             * noticed, or never (then the session's own deadline). */
            if (param & 1) {
                struct fs_reply rep = {.kind = FS_REPLY_DEATH, .turn_id = id, .pid = 1,
                                       .wait_status = param & 2 ? (param >> 2) : (param << 6),
                                       .oom_kills = param >> 7, .pids_max = (param >> 6) & 1};
                session_sandbox_died(s, &rep);
            }
            break;
        case 8:
            shutdown(cs[0], SHUT_WR);
            break;
        case 9:
            make_snapshots();
            client_message(cs[0], 2, 0, tiny_snapshot.data, tiny_snapshot.len);
            break;
        }
    }
    drain(cs[0], host_cb, &h);
    FUZZ_ASSERT(!dead || n_turns == 0, "a dead session still holds its turn slot");
    sessions_free(set);
    preauth_free(&preauth);
    tenants_free(&tenants);
    FUZZ_ASSERT(total.used == 0, "%llu bytes still charged after the session was freed",
                (unsigned long long)total.used);

    loop_free(loop);
    if (chan[0] >= 0)
        close(chan[0]);
    if (pid_pipe[1] >= 0)
        close(pid_pipe[1]);
    close(cs[0]);
    buf_free(&h.msg);
    buf_free(&h.http);
    buf_free(&client_sent);
    fuzz_wsin_free(&h.in);
    buf_free(&v.body);
    return 0;
}
