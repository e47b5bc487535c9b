/* The closer thread (see closer.h). Runs in forkboxd and in forkbox
 * sandbox's relay. */
#include "loop/closer.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/limits.h"
#include "core/log.h"
#include "core/util.h"

struct closer_item {
    int fd;
    unsigned flags;
};

/* The queue: a ring of CLOSER_QUEUE_MAX items, head..tail under mu. The
 * thread takes a batch, closes it without the lock, and only then counts it
 * closed, so `pending` covers the close in progress. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool started;
    struct closer_item ring[CLOSER_QUEUE_MAX];
    size_t head, n;      /* oldest item, items queued */
    uint64_t queued, closed, slow, dropped;
} q = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void close_one(int fd, unsigned flags, int depth);

/* Take out what is queued in a unix socket we are about to close, so that
 * each of those fds' last close is a close of ours (with its own flags)
 * rather than part of the socket's release. Bounded: the sandbox that could
 * refill it is being killed. */
static void drain(int fd, int depth)
{
    uint8_t junk[4096];
    int fds[FDPASS_MAX_FDS];
    for (int round = 0; round < CLOSER_DRAIN_ROUNDS; round++) {
        size_t n = 0;
        ssize_t r = fd_recv(fd, junk, sizeof junk, fds, FDPASS_MAX_FDS, &n, MSG_DONTWAIT, NULL);
        for (size_t i = 0; i < n; i++)
            close_one(fds[i], CLOSER_ABORT | CLOSER_DRAIN, depth + 1);
        if (r <= 0)
            return; /* empty, EOF, or not a socket that can be read */
    }
}

static void close_one(int fd, unsigned flags, int depth)
{
    if (flags & CLOSER_ABORT) {
        struct linger l = {.l_onoff = 1, .l_linger = 0};
        (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l); /* ENOTSOCK: fine */
    }
    if ((flags & CLOSER_DRAIN) && depth < CLOSER_DRAIN_DEPTH)
        drain(fd, depth);
    close(fd);
}

static void *closer_main(void *arg)
{
    (void)arg;
    struct closer_item batch[64];
    pthread_mutex_lock(&q.mu);
    for (;;) {
        while (q.n == 0)
            pthread_cond_wait(&q.cv, &q.mu);
        size_t k = 0;
        while (q.n > 0 && k < sizeof batch / sizeof *batch) {
            batch[k++] = q.ring[q.head];
            q.head = (q.head + 1) % CLOSER_QUEUE_MAX;
            q.n--;
        }
        pthread_mutex_unlock(&q.mu);
        unsigned slow = 0;
        uint64_t worst = 0;
        for (size_t i = 0; i < k; i++) {
            uint64_t t0 = now_ms();
            close_one(batch[i].fd, batch[i].flags, 0);
            uint64_t took = now_ms() - t0;
            if (took >= CLOSER_SLOW_MS) {
                slow++;
                worst = took > worst ? took : worst;
            }
        }
        if (slow)
            LOG_W("%u close%s of fds a sandbox chose took up to %" PRIu64 " ms (on the closer "
                  "thread; the event loop did not wait)", slow, slow == 1 ? "" : "s", worst);
        pthread_mutex_lock(&q.mu);
        q.closed += k;
        q.slow += slow;
    }
    return NULL;
}

int closer_start(char *err, size_t errlen)
{
    int r = thread_start("forkbox-closer", CLOSER_STACK_BYTES, closer_main, NULL, err, errlen);
    if (r < 0)
        return r;
    pthread_mutex_lock(&q.mu);
    q.started = true;
    pthread_mutex_unlock(&q.mu);
    return 0;
}

void closer_close(int fd, unsigned flags)
{
    if (fd < 0)
        return;
    pthread_mutex_lock(&q.mu);
    if (!q.started) {
        pthread_mutex_unlock(&q.mu);
        close_one(fd, flags, 0);
        return;
    }
    bool full = q.n == CLOSER_QUEUE_MAX;
    if (full) {
        q.dropped++;
    } else {
        q.ring[(q.head + q.n) % CLOSER_QUEUE_MAX] = (struct closer_item){fd, flags};
        q.n++;
        q.queued++;
    }
    uint64_t dropped = q.dropped;
    pthread_mutex_unlock(&q.mu);
    if (!full) /* after the unlock, as logq_push does (why: there) */
        pthread_cond_signal(&q.cv);
    /* Once, then at every power of two: the log line must not become a
     * flood of its own. */
    if (full && (dropped & (dropped - 1)) == 0)
        LOG_E("the closer thread is %d fds behind (one close of a sandbox's object has been "
              "waiting): fd %d is left open for good (%" PRIu64 " so far)",
              CLOSER_QUEUE_MAX, fd, dropped);
}

void closer_get_counts(struct closer_counts *out)
{
    pthread_mutex_lock(&q.mu);
    *out = (struct closer_counts){.queued = q.queued, .pending = q.queued - q.closed,
                                  .slow = q.slow, .dropped = q.dropped};
    pthread_mutex_unlock(&q.mu);
}
