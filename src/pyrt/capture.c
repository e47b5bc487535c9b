/* fd-level output capture for one block (spec 9.2 "Python-level capture only").
 *
 * fds 1 and 2 are pointed at the write ends of two pipes for the duration of
 * a block, so print(), os.write(1, ...), C extensions and subprocesses all
 * land in the block's output, in the order they were written. The channel
 * reader thread (reader.c), which never touches the interpreter, polls both
 * pipes beside the channel and drains them into buffers that keep the first
 * half and the last half of cap bytes per stream and count the rest, so a
 * flood costs CPU but never memory.
 *
 * The main thread and the reader meet under cap_mu. capture_begin() makes
 * the capture current; the reader, which saw the block's run frame go by,
 * adopts it CAPTURE_ADOPT_MS later (or at once, woken by an eventfd, if it
 * saw none). If the block ends first, capture_end() takes the capture back
 * and drains it on the main thread: no other thread is woken for it, which
 * is most blocks. Else it asks the reader for the last drain and waits until
 * the reader lets go. While adopted, only the reader touches the capture.
 * (A thread per block, or a reader woken at each block's start and end, cost
 * ~5% of a one-block turn's CPU, measured.)
 *
 * A block's pipes outlive it a little. A write already in the kernel when
 * fds 1 and 2 are pointed elsewhere (a thread's print() of a large string
 * waiting for room in a full pipe) would fail with EPIPE, a BrokenPipeError
 * in a thread that did nothing wrong, if the read end were closed under it.
 * So the pipes are retired instead: the reader keeps reading them, dropping
 * the bytes (they come after the block's end), and closes each at EOF (no
 * writer left) or at the latest CAPTURE_RETIRE_MAX_MS after the block (a
 * child that outlives its block, or a background process holding fd 1,
 * gets EPIPE then). No "quiet for a while" rule: a writer just woken for
 * room may not get a CPU for tens of ms on a loaded machine (seen). Pipes
 * are retired only when a write may be in flight: the block ends with
 * another Python thread alive, or the capture was the reader's, or the last
 * drain found a lot (a writer that fills a pipe); a plain block's pipes are
 * closed at once, with no thread woken. */
#include "pyrt/pyrt_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/util.h"

#define CAPTURE_READ_CHUNK (64 * 1024)

static void stream_head_put(struct capture_stream *s, const uint8_t **p, size_t *n)
{
    size_t room = s->head_cap - s->head_len;
    size_t k = *n < room ? *n : room;
    if (k == 0)
        return;
    if (s->head_len + k > s->head_alloc) {
        size_t want = s->head_alloc ? s->head_alloc : 4096;
        while (want < s->head_len + k)
            want *= 2;
        if (want > s->head_cap)
            want = s->head_cap;
        uint8_t *h = realloc(s->head, want);
        if (!h) { /* keep going with what we have: count it as dropped */
            s->head_cap = s->head_len;
            return;
        }
        s->head = h;
        s->head_alloc = want;
    }
    memcpy(s->head + s->head_len, *p, k);
    s->head_len += k;
    *p += k;
    *n -= k;
}

static void stream_put(struct capture_stream *s, const uint8_t *p, size_t n)
{
    stream_head_put(s, &p, &n);
    if (n == 0)
        return;
    if (s->tail_cap && !s->tail) {
        s->tail = malloc(s->tail_cap);
        if (!s->tail)
            s->tail_cap = 0;
    }
    if (s->tail_cap == 0) {
        s->dropped += n;
        return;
    }
    if (n >= s->tail_cap) { /* the new bytes replace the whole ring */
        s->dropped += s->tail_len + (n - s->tail_cap);
        memcpy(s->tail, p + (n - s->tail_cap), s->tail_cap);
        s->tail_len = s->tail_cap;
        s->tail_pos = 0;
        return;
    }
    if (s->tail_len + n > s->tail_cap)
        s->dropped += s->tail_len + n - s->tail_cap;
    size_t first = s->tail_cap - s->tail_pos;
    if (first > n)
        first = n;
    memcpy(s->tail + s->tail_pos, p, first);
    memcpy(s->tail, p + first, n - first);
    s->tail_pos = (s->tail_pos + n) % s->tail_cap;
    s->tail_len = s->tail_len + n > s->tail_cap ? s->tail_cap : s->tail_len + n;
}

void capture_tail_copy(const struct capture_stream *s, uint8_t *out)
{
    if (s->tail_len == 0)
        return;
    size_t start = (s->tail_pos + s->tail_cap - s->tail_len) % s->tail_cap;
    size_t first = s->tail_cap - start;
    if (first > s->tail_len)
        first = s->tail_len;
    memcpy(out, s->tail + start, first);
    memcpy(out + first, s->tail, s->tail_len - first);
}

/* Read what the pipe holds now. Returns false once the stream is at EOF (or
 * broken). limit bounds the bytes taken in this call. */
static bool stream_drain(struct capture_stream *s, uint8_t *chunk, size_t limit)
{
    size_t taken = 0;
    while (s->rfd >= 0 && taken < limit) {
        ssize_t r = read(s->rfd, chunk, CAPTURE_READ_CHUNK);
        if (r > 0) {
            stream_put(s, chunk, (size_t)r);
            taken += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return true;
        close_and_reset(&s->rfd); /* EOF or error */
    }
    return s->rfd >= 0;
}

/* The reader's read buffer. Static, like the first 4 KiB of each stream's
 * head (capture_begin), so that a block with little output makes the reader
 * call malloc() not at all. */
static uint8_t capture_chunk[CAPTURE_READ_CHUNK];

/* How long a capture may go undrained: the reader takes over a block's pipes
 * this long after its run frame went by, so a block that ends sooner (most
 * do) is drained once, by the main thread, with no thread woken at all; a
 * writer that fills a pipe (64 KiB) before then waits at most this long. */
#define CAPTURE_ADOPT_MS 2

static pthread_mutex_t cap_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cap_cv = PTHREAD_COND_INITIALIZER;
/* All guarded by cap_mu. */
static struct capture *cap_current; /* the capture in progress */
static bool cap_adopted;            /* the reader polls and drains it */
static bool cap_ending;             /* capture_end() waits for the reader's last drain */
static bool cap_primed;             /* a run frame went by: a capture is about to begin */
static unsigned cap_primed_ticks;   /* timeouts spent primed without a capture */
static int cap_wake_fd = -1;        /* eventfd the reader polls */

/* Retired pipes (see the top of this file): capture_end() and the reader's
 * last drain fill a free slot (rfd -1); only the reader drains and closes
 * them. Slots guarded by cap_mu. */
struct retired_pipe {
    int rfd;           /* read end (owned); -1: a free slot */
    uint64_t deadline; /* closed by then whatever comes, ms */
};
static struct retired_pipe cap_retired[CAPTURE_RETIRED_MAX];
/* The reader's buffer for retired pipes: capture_chunk may be the main
 * thread's at the same time (capture_end's own last drain). */
static uint8_t retired_chunk[16 * 1024];

static void wake_reader(void)
{
    uint64_t one = 1;
    ssize_t w;
    do
        w = write(cap_wake_fd, &one, sizeof(one));
    while (w < 0 && errno == EINTR);
}

int capture_init(void)
{
    for (int i = 0; i < CAPTURE_RETIRED_MAX; i++)
        cap_retired[i].rfd = -1;
    cap_wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    return cap_wake_fd < 0 ? -errno : cap_wake_fd;
}

void capture_forget_in_child(void)
{
    /* A child holding a read end would keep a block's pipe open after the
     * runtime closed it: a writer that outlives the block would then block
     * on a full pipe instead of getting EPIPE. No lock: this process has one
     * thread, and cap_mu may have been held by the reader at the fork. */
    close_and_reset(&cap_wake_fd);
    for (int i = 0; i < 2; i++)
        close_and_reset(&g_pyrt.cap.s[i].rfd);
    for (int i = 0; i < CAPTURE_RETIRED_MAX; i++)
        close_and_reset(&cap_retired[i].rfd);
}

void capture_prime(void)
{
    pthread_mutex_lock(&cap_mu);
    cap_primed = true;
    cap_primed_ticks = 0;
    pthread_mutex_unlock(&cap_mu);
}

int capture_poll_fds(struct pollfd *p)
{
    pthread_mutex_lock(&cap_mu);
    struct capture *c = cap_adopted ? cap_current : NULL;
    for (int i = 0; i < 2; i++)
        p[i] = (struct pollfd){.fd = c ? c->s[i].rfd : -1, .events = POLLIN};
    uint64_t first = UINT64_MAX; /* the earliest deadline */
    for (int i = 0; i < CAPTURE_RETIRED_MAX; i++) {
        p[2 + i] = (struct pollfd){.fd = cap_retired[i].rfd, .events = POLLIN};
        if (cap_retired[i].rfd >= 0 && cap_retired[i].deadline < first)
            first = cap_retired[i].deadline;
    }
    bool soon = cap_primed || (cap_current && !cap_adopted);
    pthread_mutex_unlock(&cap_mu);
    if (soon)
        return CAPTURE_ADOPT_MS;
    if (first == UINT64_MAX)
        return -1;
    uint64_t now = now_ms();
    return first > now ? (int)(first - now) + 1 : 0; /* +1: not a few early wake-ups */
}

/* Hand stream s's read end to the reader (a free slot, under cap_mu).
 * False if every slot is taken: the caller closes it then. */
static bool retire_locked(struct capture_stream *s, uint64_t now)
{
    for (int i = 0; i < CAPTURE_RETIRED_MAX; i++) {
        if (cap_retired[i].rfd >= 0)
            continue;
        cap_retired[i] = (struct retired_pipe){.rfd = s->rfd, .deadline = now + CAPTURE_RETIRE_MAX_MS};
        s->rfd = -1;
        return true;
    }
    return false;
}

/* The reader, after every poll: drop what retired pipes hold, close those
 * that are done. The fds stay open meanwhile (only this thread closes
 * them), so reading them outside cap_mu is safe. */
static void service_retired(const struct pollfd *p)
{
    uint64_t now = now_ms();
    for (int i = 0; i < CAPTURE_RETIRED_MAX; i++) {
        int fd = p[i].fd;
        if (fd < 0)
            continue;
        bool done = false;
        if (p[i].revents) {
            size_t taken = 0;
            while (taken < 1024 * 1024) {
                ssize_t r = read(fd, retired_chunk, sizeof(retired_chunk));
                if (r > 0) {
                    taken += (size_t)r;
                    continue;
                }
                if (r < 0 && errno == EINTR)
                    continue;
                done = r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
                break;
            }
        }
        pthread_mutex_lock(&cap_mu);
        struct retired_pipe *rp = &cap_retired[i];
        if (rp->rfd == fd && (done || now >= rp->deadline))
            close_and_reset(&rp->rfd);
        pthread_mutex_unlock(&cap_mu);
    }
}

static uint64_t stream_total(const struct capture_stream *s)
{
    return s->head_len + s->tail_len + s->dropped; /* every byte put */
}

/* The last, bounded drain: fds 1 and 2 no longer lead here, so everything
 * this process wrote is already in the pipes. Take it, plus a bounded amount
 * of what writers that are still alive (a background subprocess holding a
 * copy of fd 1) may add meanwhile. Returns a bit per stream (1 << i) whose
 * drain took at least PIPE_BUF bytes: a writer may be waiting for room. */
static unsigned final_drain(struct capture *c)
{
    unsigned busy = 0;
    for (int i = 0; i < 2; i++) {
        if (c->s[i].rfd < 0)
            continue;
        int psz = fcntl(c->s[i].rfd, F_GETPIPE_SZ);
        size_t bound = psz > 0 ? 2 * (size_t)psz : 2 * 1024 * 1024;
        uint64_t before = stream_total(&c->s[i]);
        stream_drain(&c->s[i], capture_chunk, bound);
        if (stream_total(&c->s[i]) - before >= PIPE_BUF)
            busy |= 1u << i;
    }
    return busy;
}

void capture_service(const struct pollfd *p)
{
    service_retired(&p[2]);
    pthread_mutex_lock(&cap_mu);
    struct capture *c = cap_current;
    bool ending = cap_ending;
    if (c && !cap_adopted) {
        cap_adopted = true; /* from the next poll on */
        cap_primed = false;
        c = NULL;
    } else if (!c && cap_primed && ++cap_primed_ticks > 50) {
        cap_primed = false; /* no block came after all */
    }
    pthread_mutex_unlock(&cap_mu);
    if (!c)
        return;
    for (int i = 0; i < 2; i++)
        if (p[i].fd >= 0 && p[i].fd == c->s[i].rfd && p[i].revents)
            stream_drain(&c->s[i], capture_chunk, 1024 * 1024);
    if (!ending)
        return;
    final_drain(c);
    pthread_mutex_lock(&cap_mu);
    uint64_t now = now_ms();
    for (int i = 0; i < 2; i++) /* an adopted capture's pipes: always (see the top) */
        if (c->s[i].rfd >= 0)
            retire_locked(&c->s[i], now);
    cap_current = NULL;
    cap_adopted = cap_ending = false;
    pthread_cond_signal(&cap_cv);
    pthread_mutex_unlock(&cap_mu);
}

static int make_pipe(int *rfd, int *wfd)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return -errno;
    if (fcntl(p[0], F_SETFL, O_NONBLOCK) < 0) {
        int e = -errno;
        close(p[0]);
        close(p[1]);
        return e;
    }
    *rfd = p[0];
    *wfd = p[1];
    return 0;
}

int capture_begin(struct capture *c, uint64_t cap)
{
    if (cap_wake_fd < 0)
        return -EBADF; /* capture_init() first */
    memset(c, 0, sizeof(*c));
    c->s[0].rfd = c->s[1].rfd = -1;
    size_t half = (size_t)(cap / 2);
    for (int i = 0; i < 2; i++) {
        c->s[i].head_cap = half;
        c->s[i].tail_cap = (size_t)cap - half;
        /* Here, not on the reader (see capture_chunk); if it fails, the
         * first output allocates instead. */
        size_t first = half < 4096 ? half : 4096;
        if (first && (c->s[i].head = malloc(first)))
            c->s[i].head_alloc = first;
    }
    _cleanup_close_ int w0 = -1;
    _cleanup_close_ int w1 = -1;
    int r = make_pipe(&c->s[0].rfd, &w0);
    if (r == 0)
        r = make_pipe(&c->s[1].rfd, &w1);
    /* dup2 clears FD_CLOEXEC on 1 and 2, so subprocesses inherit them. */
    if (r == 0 && (dup2(w0, 1) < 0 || dup2(w1, 2) < 0))
        r = -errno;
    if (r < 0) {
        close_and_reset(&c->s[0].rfd);
        close_and_reset(&c->s[1].rfd);
        return r;
    }
    pthread_mutex_lock(&cap_mu);
    cap_current = c;
    cap_adopted = cap_ending = false;
    bool primed = cap_primed; /* else the reader sleeps with no timeout: wake it */
    pthread_mutex_unlock(&cap_mu);
    if (!primed)
        wake_reader();
    return 0; /* w0 and w1 are closed here: only fds 1 and 2 hold the write ends */
}

void capture_end(struct capture *c, int devnull_fd, bool threads)
{
    /* After these, this process holds no write end of either pipe. */
    dup2(devnull_fd, 1);
    dup2(devnull_fd, 2);
    pthread_mutex_lock(&cap_mu);
    if (cap_current == c && !cap_adopted) {
        /* The reader never touched it: take it back and drain it here. */
        cap_current = NULL;
        cap_primed = false;
        pthread_mutex_unlock(&cap_mu);
        unsigned busy = final_drain(c);
        if (threads)
            busy = 3;
        if (busy) {
            bool retired = false;
            pthread_mutex_lock(&cap_mu);
            uint64_t now = now_ms();
            for (int i = 0; i < 2; i++)
                if ((busy & (1u << i)) && c->s[i].rfd >= 0)
                    retired |= retire_locked(&c->s[i], now);
            pthread_mutex_unlock(&cap_mu);
            if (retired)
                wake_reader(); /* to poll them */
        }
    } else {
        if (cap_current == c) {
            cap_ending = true;
            wake_reader();
            while (cap_current == c)
                pthread_cond_wait(&cap_cv, &cap_mu);
        }
        pthread_mutex_unlock(&cap_mu);
    }
    close_and_reset(&c->s[0].rfd);
    close_and_reset(&c->s[1].rfd);
}

void capture_free(struct capture *c)
{
    for (int i = 0; i < 2; i++) {
        free(c->s[i].head);
        free(c->s[i].tail);
        c->s[i].head = c->s[i].tail = NULL;
        c->s[i].head_len = c->s[i].tail_len = c->s[i].head_alloc = 0;
    }
}
