/* The supervisor's end of a sandbox's channel (see chan_conn.h). Runs in the
 * supervisor. Everything read here comes from a sandbox, which is hostile:
 * nothing is kept that its handler did not reserve room for at the header,
 * and at most one fd (the first message's) outlives the read that brought it;
 * the loop thread never closes one (loop/closer.h). */
#include "session/chan_conn.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/outq.h"
#include "core/util.h"
#include "loop/closer.h"

#ifndef SO_PASSRIGHTS
#define SO_PASSRIGHTS 83 /* Linux 6.16, asm-generic/socket.h; Debian 12's headers predate it */
#endif

struct chan_conn {
    int fd;                           /* borrowed: the sandbox's channel, -1 */
    const struct chan_conn_handlers *h; /* borrowed */
    void *ud;                         /* borrowed: the handlers' argument */
    struct outq out;                  /* owned: envelopes queued for the sandbox */
    struct outq held;                 /* owned: what waits for the first message
                                         (a frame and what came after it) */

    /* the sandbox's message being read */
    uint8_t hdr[CHAN_HDR_LEN];        /* its envelope header, as far as it came */
    size_t hdr_got;
    bool active;                      /* a header was read: its body is coming */
    struct chan_msg msg;              /* that header, decoded */
    uint32_t got;                     /* body bytes read */
    struct buf *into;                 /* borrowed: where the body goes; NULL = dropped */
    int fd_pending;                   /* owned: an fd that came with the first message, -1 */
    bool first_done;                  /* the sandbox's first message is complete (and,
                                         where the kernel has it, SO_PASSRIGHTS is off) */
};

/* Whether this kernel has SO_PASSRIGHTS (Linux 6.16): 1 yes, -1 no, 0 not
 * asked yet (chan_conn_init). */
static int rights_state;

static bool rights_supported(void)
{
    return rights_state > 0;
}

void chan_conn_init(void)
{
    int sv[2], on = 1;
    if (rights_state)
        return;
    rights_state = -1;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0) {
        if (setsockopt(sv[0], SOL_SOCKET, SO_PASSRIGHTS, &on, sizeof on) == 0)
            rights_state = 1;
        close(sv[0]);
        close(sv[1]);
    }
    if (!rights_supported())
        LOG_I("the kernel has no SO_PASSRIGHTS (Linux 6.16): an fd a sandbox sends on its "
              "channel reaches the supervisor, which ends the turn and closes it off its event "
              "loop");
}

struct chan_conn *chan_conn_new(int fd, struct budget *budget, const struct chan_conn_handlers *h,
                                void *ud)
{
    struct chan_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->fd = fd;
    c->h = h;
    c->ud = ud;
    c->fd_pending = -1;
    outq_init(&c->out, budget);
    outq_init(&c->held, budget);
    return c;
}

void chan_conn_set_fd(struct chan_conn *c, int fd)
{
    c->fd = fd;
}

void chan_conn_close(struct chan_conn *c)
{
    if (!c)
        return;
    c->fd = -1;
    closer_close(steal_fd(&c->fd_pending), CLOSER_ABORT | CLOSER_DRAIN);
    c->active = false;
    c->into = NULL;
    outq_free(&c->out);
    outq_free(&c->held);
}

void chan_conn_close_fd(int fd)
{
    if (rights_supported())
        close(fd);
    else
        closer_close(fd, CLOSER_DRAIN);
}

const char *chan_conn_error(int r)
{
    switch (r) {
    case -EMSGSIZE:
        return "message too large";
    case -EBADMSG:
        return "bad envelope";
    case -EPERM:
        return "sandbox sent a file descriptor";
    default:
        return NULL;
    }
}

void chan_conn_free(struct chan_conn *c)
{
    if (!c)
        return;
    chan_conn_close(c);
    free(c);
}

/* ---------------------------------------------------------------- to the sandbox */

/* Where a message for the sandbox goes. User code starts only when the
 * sandbox reads a frame (`run`), so until its first message (the one that
 * may carry its listener) has been read and SO_PASSRIGHTS turned off, no
 * frame is written, nor anything queued after one (the channel keeps the
 * order): no code of the turn can send an fd before the kernel refuses it.
 * The archives before it go at once (a sandbox without a listener sends
 * `ready`, its first message, only after the tools archive). */
static struct outq *queue_for(struct chan_conn *c, enum chan_type type)
{
    return !c->first_done && (type == CHAN_FRAME || c->held.head) ? &c->held : &c->out;
}

int chan_conn_send(struct chan_conn *c, enum chan_type type, struct buf *body)
{
    return chan_conn_send_part(c, type, 0, body);
}

int chan_conn_send_part(struct chan_conn *c, enum chan_type type, unsigned flags,
                        struct buf *body)
{
    uint8_t hdr[CHAN_HDR_LEN];
    if (body->len > CHAN_MAX_MESSAGE_BYTES) {
        buf_free(body);
        return -EMSGSIZE;
    }
    struct outq *q = queue_for(c, type);
    chan_hdr_encode_flags(hdr, type, flags, (uint32_t)body->len);
    int r = outq_append(q, hdr, sizeof hdr);
    if (r == 0)
        r = outq_take(q, body);
    else
        buf_free(body);
    return r;
}

int chan_conn_send_around(struct chan_conn *c, enum chan_type type, const struct buf *head,
                          struct buf *msg, size_t off, size_t len, const struct buf *tail)
{
    uint64_t total = (uint64_t)head->len + len + tail->len;
    int r = total > CHAN_MAX_MESSAGE_BYTES ? -EMSGSIZE : 0;
    struct outq *q = queue_for(c, type);
    uint8_t hdr[CHAN_HDR_LEN];
    if (r == 0) {
        chan_hdr_encode(hdr, type, (uint32_t)total);
        r = outq_append(q, hdr, sizeof hdr);
    }
    if (r == 0)
        r = outq_append(q, head->data, head->len);
    if (r == 0)
        r = outq_take_slice(q, msg, off, len);
    if (r == 0)
        r = outq_append(q, tail->data, tail->len);
    buf_free(msg);
    return r;
}

int chan_conn_flush(struct chan_conn *c)
{
    return outq_send(&c->out, c->fd) < 0 ? -EPIPE : 0;
}

size_t chan_conn_queued(const struct chan_conn *c)
{
    return c ? c->out.bytes : 0;
}

size_t chan_conn_held(const struct chan_conn *c)
{
    return c ? c->out.held + c->held.held : 0; /* what waits for its first message too */
}

/* ---------------------------------------------------------------- from the sandbox */

/* recvmsg() on the channel: the only fd a sandbox may send is its seccomp
 * listener, attached to the first byte of its first message (CHAN_NOTIFY).
 * Such an fd is kept in fd_pending until that message is complete (then its
 * handler adopts it or hands it to the closer); any other fd marks the
 * sandbox as having broken the protocol, and goes to the closer at once
 * (abortive, drained: the sandbox chose what it is). Room for the most the
 * kernel attaches to one message, so it never drops (and closes here) what
 * did not fit; where fds can still come (no SO_PASSRIGHTS), the fd reserve
 * is lent for the call so that a full fd table does not make it drop them
 * either. MSG_CMSG_CLOEXEC: none may leak into a process we start. */
static ssize_t recv_with_fds(struct chan_conn *c, void *p, size_t len)
{
    int fds[FDPASS_MAX_FDS];
    size_t nfds;
    bool at_start = !c->first_done && !c->active && c->hdr_got == 0;
    bool lend = !rights_supported();
    if (lend)
        fd_reserve_lend(true);
    int flags;
    ssize_t n = fd_recv(c->fd, p, len, fds, FDPASS_MAX_FDS, &nfds, MSG_DONTWAIT, &flags);
    if (lend)
        fd_reserve_lend(false);
    /* Cut (MSG_CTRUNC): what came did not all fit in our fd table. At the
     * start, that is the listener of a sandbox still in setup: the turn
     * cannot go on without it (EMFILE); later, any fd is a stray one. */
    bool cut = n >= 0 && (flags & MSG_CTRUNC), stray = cut && !at_start;
    for (size_t i = 0; i < nfds; i++) {
        if (!cut && at_start && nfds == 1 && c->fd_pending < 0) {
            c->fd_pending = fds[i];
        } else {
            closer_close(fds[i], CLOSER_ABORT | CLOSER_DRAIN);
            stray = stray || !cut;
        }
    }
    if (n < 0 || stray || cut) {
        errno = cut ? EMFILE : stray ? EPERM : (int)-n;
        return -1;
    }
    return n;
}

/* A header arrived: decode it and let the handler decide, before any of its
 * body is read, whether the message may come and where it goes. 0, 1 if
 * the handler said "not now" (the header is kept: hdr_got stays whole), or
 * a chan_conn_read error. */
static int begin_message(struct chan_conn *c)
{
    enum chan_type type;
    uint32_t len;
    int r = chan_hdr_decode(c->hdr, CHAN_HDR_LEN, CHAN_MAX_MESSAGE_BYTES, &type, &len);
    if (r <= 0)
        return r == -EMSGSIZE ? -EMSGSIZE : -EBADMSG;
    c->msg = (struct chan_msg){.type = type, .len = len, .first = !c->first_done, .fd = -1};
    struct buf *into = NULL;
    r = c->h->on_begin(c->ud, &c->msg, &into);
    if (r < 0)
        return -ECANCELED;
    if (r == CHAN_BEGIN_WAIT)
        return 1;
    c->hdr_got = 0;
    c->msg.stream = r == CHAN_BEGIN_STREAM;
    c->into = c->msg.stream ? NULL : into;
    c->msg.dropped = !c->msg.stream && into == NULL;
    c->got = 0;
    c->active = true;
    return 0;
}

/* The whole body is in: hand it over, with the first message's fd. The
 * on_end result. */
static int end_message(struct chan_conn *c)
{
    c->msg.fd = c->fd_pending;
    c->fd_pending = -1;
    if (!c->first_done) {
        /* No fd is legitimate after this one: have the kernel refuse them
         * (EPERM to the sender; it was on by default), then let the frames
         * held back go. */
        int off = 0;
        if (rights_supported() &&
            setsockopt(c->fd, SOL_SOCKET, SO_PASSRIGHTS, &off, sizeof off) < 0)
            PLOG_W("setsockopt(SO_PASSRIGHTS) on a sandbox's channel");
        c->first_done = true;
        outq_splice(&c->out, &c->held);
    }
    c->active = false;
    c->into = NULL;
    return c->h->on_end(c->ud, &c->msg);
}

/* Read the next chunk of a streamed body into a buffer of its own and hand
 * it over: 0 or 1 (on_chunk's: 1 = stop), or a chan_conn_read error; *n is
 * recv's result (0 or -1 with errno as recv leaves them). */
static int read_chunk(struct chan_conn *c, size_t *budget, ssize_t *n)
{
    size_t want = c->msg.len - c->got;
    if (want > *budget)
        want = *budget;
    if (want > CHAN_CONN_CHUNK)
        want = CHAN_CONN_CHUNK;
    struct buf chunk;
    buf_init_budget(&chunk, SIZE_MAX, c->out.budget);
    int r = buf_reserve_exact(&chunk, want);
    if (r < 0)
        return r == -ENOBUFS ? -ENOMEM : r;
    *n = recv_with_fds(c, chunk.data, want);
    if (*n <= 0) {
        int e = errno;
        buf_free(&chunk);
        errno = e;
        return 0;
    }
    chunk.len = (size_t)*n;
    buf_fit(&chunk); /* what the socket had: charged for what it holds */
    *budget -= (size_t)*n;
    c->got += (uint32_t)*n;
    r = c->h->on_chunk(c->ud, &c->msg, &chunk);
    buf_free(&chunk); /* if the handler left it */
    return r < 0 ? -ECANCELED : r;
}

int chan_conn_read(struct chan_conn *c)
{
    static uint8_t scratch[64 * KiB]; /* dropped bodies (one thread) */
    size_t budget = CHAN_CONN_READ_BUDGET;
    while (budget > 0 && c->fd >= 0) {
        ssize_t n;
        bool stop = false; /* on_chunk asked to stop, once the message is over */
        if (!c->active) {
            /* A header the handler said "not now" to is asked about again. */
            n = c->hdr_got == CHAN_HDR_LEN
                    ? CHAN_HDR_LEN
                    : recv_with_fds(c, c->hdr + c->hdr_got, CHAN_HDR_LEN - c->hdr_got);
            if (n > 0) {
                if (c->hdr_got < CHAN_HDR_LEN) {
                    budget -= (size_t)n;
                    c->hdr_got += (size_t)n;
                    if (c->hdr_got < CHAN_HDR_LEN)
                        continue;
                }
                int r = begin_message(c);
                if (r < 0)
                    return r;
                if (r > 0)
                    return 0;
                if (c->msg.len > 0)
                    continue;
            }
        } else if (c->msg.stream) {
            int r = read_chunk(c, &budget, &n);
            if (r < 0)
                return r;
            if (r > 0 && c->got < c->msg.len)
                return 0; /* the handler stopped: the rest at the next read */
            stop = r > 0;
        } else {
            size_t want = c->msg.len - c->got;
            if (want > budget)
                want = budget;
            uint8_t *to = c->msg.dropped ? scratch : c->into->data + c->into->len;
            if (c->msg.dropped && want > sizeof scratch)
                want = sizeof scratch;
            n = recv_with_fds(c, to, want);
            if (n > 0) {
                budget -= (size_t)n;
                c->got += (uint32_t)n;
                if (!c->msg.dropped) {
                    c->into->len += (size_t)n; /* into the room reserved at the header */
                    if (c->h->on_data(c->ud, &c->msg) < 0)
                        return -ECANCELED;
                }
            }
        }
        if (n < 0)
            return errno == EAGAIN || errno == EINTR ? 0
                   : errno == EPERM || errno == EMFILE ? -errno
                                                        : -EPIPE;
        if (n == 0)
            return -EPIPE;
        if (c->active && c->got < c->msg.len)
            continue;
        int r = end_message(c);
        if (r < 0)
            return -ECANCELED;
        if (r > 0 || stop)
            return 0;
    }
    return 0;
}
