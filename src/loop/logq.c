/* The operator log's queue and writer thread (see logq.h). Runs in
 * forkboxd. */
#include "loop/logq.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/limits.h"
#include "core/log.h"
#include "core/util.h"
#include "loop/loop.h"

/* The queue: a ring of LOGQ_BYTES holding whole lines back to back, from
 * tail (the oldest byte) for n bytes. The writer writes straight from the
 * ring, without the lock, and only then frees what it wrote: producers
 * only ever write into the free part. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t more;  /* lines were queued */
    pthread_cond_t empty; /* the writer caught up (logq_flush) */
    uint8_t ring[LOGQ_BYTES];
    size_t tail, n;
    uint64_t lines, dropped, unreported; /* unreported: dropped since the last report */
    bool started;         /* the writer runs; before, lines are written at once */
} q = {.mu = PTHREAD_MUTEX_INITIALIZER, .more = PTHREAD_COND_INITIALIZER,
       .empty = PTHREAD_COND_INITIALIZER};

/* The fork server's pipe: the read end, its watch, a partial line. */
static struct {
    int fd;                        /* owned, -1 */
    struct loop_watch watch;
    char part[LOGQ_LINE_MAX];
    size_t part_len;
} fs = {.fd = -1};

/* Set on the writer thread: what it logs itself (the count of dropped
 * lines) it writes at once, rather than into a queue that may be full. */
static __thread bool on_writer;

void logq_push(const char *line, size_t len)
{
    pthread_mutex_lock(&q.mu);
    if (!q.started || on_writer) { /* start-up, an early exit, or the writer itself */
        pthread_mutex_unlock(&q.mu);
        (void)write_all(STDERR_FILENO, line, len);
        return;
    }
    bool queued = len <= LOGQ_BYTES - q.n;
    if (!queued) {
        q.dropped++;
        q.unreported++;
    } else {
        size_t head = (q.tail + q.n) % LOGQ_BYTES, first = LOGQ_BYTES - head;
        if (first > len)
            first = len;
        memcpy(q.ring + head, line, first);
        memcpy(q.ring, line + first, len - first);
        q.n += len;
        q.lines++;
    }
    pthread_mutex_unlock(&q.mu);
    /* After the unlock: woken while we held the mutex, the writer went
     * straight back to sleep on it, and the line cost two more futex calls
     * (35 -> 22 a turn at debug level, forkbox-bench's 16 x 1 row, strace
     * -c). It cannot miss the line: it tests q.n under the mutex before it
     * waits. */
    if (queued)
        pthread_cond_signal(&q.more);
}

static void *writer_main(void *arg)
{
    (void)arg;
    on_writer = true;
    pthread_mutex_lock(&q.mu);
    for (;;) {
        while (q.n == 0) {
            pthread_cond_broadcast(&q.empty);
            pthread_cond_wait(&q.more, &q.mu);
        }
        /* The contiguous run from tail: one write, or two at the wrap. */
        size_t span = q.n < LOGQ_BYTES - q.tail ? q.n : LOGQ_BYTES - q.tail;
        const uint8_t *p = q.ring + q.tail;
        pthread_mutex_unlock(&q.mu);
        int r = write_all(STDERR_FILENO, p, span); /* blocks this thread only */
        pthread_mutex_lock(&q.mu);
        q.tail = (q.tail + span) % LOGQ_BYTES;
        q.n -= span;
        /* The reader is back (or stderr is gone: then the count is lost
         * with the lines). */
        uint64_t lost = r == 0 ? q.unreported : 0;
        if (lost) {
            q.unreported = 0;
            pthread_mutex_unlock(&q.mu);
            LOG_W("%" PRIu64 " log line%s dropped: stderr was not read for a while (the queue "
                  "holds %u KiB)", lost, lost == 1 ? "" : "s", (unsigned)(LOGQ_BYTES / 1024));
            pthread_mutex_lock(&q.mu);
        }
    }
    return NULL;
}

/* What the fork server wrote: whole lines into the queue. Its lines are
 * written with one write(2) of at most PIPE_BUF bytes, so they arrive
 * whole; a read can still end inside one (kept for the next), and text
 * that is not a log line (an interpreter's traceback) is cut at
 * LOGQ_LINE_MAX. At most `reads` reads. */
static void read_fs_log(int reads)
{
    char buf[64 * 1024];
    for (int round = 0; fs.fd >= 0 && round < reads; round++) {
        ssize_t n = read(fs.fd, buf, sizeof buf);
        if (n <= 0)
            return; /* EAGAIN; EOF cannot happen: the write end stays ours */
        for (ssize_t i = 0; i < n;) {
            char *nl = memchr(buf + i, '\n', (size_t)(n - i));
            size_t take = nl ? (size_t)(nl - (buf + i)) + 1 : (size_t)(n - i);
            if (take > sizeof fs.part - fs.part_len - 1) /* too long: cut, as a line */
                take = sizeof fs.part - fs.part_len - 1;
            memcpy(fs.part + fs.part_len, buf + i, take);
            fs.part_len += take;
            i += (ssize_t)take;
            bool whole = fs.part[fs.part_len - 1] == '\n';
            if (whole || fs.part_len == sizeof fs.part - 1) {
                if (!whole)
                    fs.part[fs.part_len++] = '\n';
                logq_push(fs.part, fs.part_len);
                fs.part_len = 0;
            }
        }
    }
}

static void on_fs_log(struct loop_watch *w, uint32_t events)
{
    (void)w;
    (void)events;
    read_fs_log(LOGQ_READS_PER_WAKEUP);
}

void logq_drain(void)
{
    read_fs_log(LOGQ_PIPE_BYTES / (64 * 1024) + 1);
}

/* At exit (however main ends): what the fork server wrote last (it has
 * exited, or failed to start), then the queue, written if stderr takes it
 * within LOGQ_EXIT_FLUSH_MS. */
static void flush_at_exit(void)
{
    logq_drain();
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += LOGQ_EXIT_FLUSH_MS / 1000;
    until.tv_nsec += (long)(LOGQ_EXIT_FLUSH_MS % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&q.mu);
    while (q.started && q.n > 0 && pthread_cond_timedwait(&q.empty, &q.mu, &until) == 0)
        ;
    pthread_mutex_unlock(&q.mu);
}

int logq_open(int *fs_stderr, char *err, size_t errlen)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0)
        return err_errno(err, errlen, "the fork server's log pipe");
    /* Room for a burst (the fork server's start-up, a restart storm); the
     * default 64 KiB is enough otherwise, so a refusal is fine. */
    (void)fcntl(p[1], F_SETPIPE_SZ, (int)LOGQ_PIPE_BYTES);
    fs.fd = p[0];
    *fs_stderr = p[1];
    atexit(flush_at_exit);
    return 0;
}

int logq_start(char *err, size_t errlen)
{
    int r = thread_start("forkbox-log", LOGQ_STACK_BYTES, writer_main, NULL, err, errlen);
    if (r < 0)
        return r;
    pthread_mutex_lock(&q.mu);
    q.started = true;
    pthread_mutex_unlock(&q.mu);
    log_set_sink(logq_push);
    return 0;
}

int logq_watch(struct loop *l)
{
    if (fs.fd < 0)
        return -EBADF;
    fs.watch = (struct loop_watch){.fd = fs.fd, .cb = on_fs_log, .ud = NULL,
                                   .name = "fork server's log"};
    return loop_watch(l, &fs.watch, EPOLLIN);
}

void logq_get_counts(struct logq_counts *out)
{
    pthread_mutex_lock(&q.mu);
    *out = (struct logq_counts){.lines = q.lines, .dropped = q.dropped};
    pthread_mutex_unlock(&q.mu);
}
