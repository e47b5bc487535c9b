/* A queue of byte runs written with sendmsg (see outq.h). */
#include "core/outq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "core/limits.h"

#define OUTQ_IOV 16              /* runs per sendmsg */
#define OUTQ_RUN_MIN (4 * KiB)   /* a run made for copied pieces */

struct outq_run {
    struct outq_run *next;
    struct buf b;  /* the bytes; charged to the queue's budget */
    size_t off;    /* b.data[0..off) is written */
};

void outq_init(struct outq *q, struct budget *budget)
{
    *q = (struct outq){.budget = budget};
}

static struct outq_run *run_new(struct outq *q)
{
    struct outq_run *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    buf_init_budget(&r->b, SIZE_MAX, q->budget);
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    return r;
}

int outq_append(struct outq *q, const void *p, size_t n)
{
    if (n == 0)
        return 0;
    struct outq_run *r = q->tail;
    if (!r || r->b.cap - r->b.len < n) {
        r = run_new(q);
        if (!r)
            return -ENOMEM;
        int e = buf_reserve_exact(&r->b, n > OUTQ_RUN_MIN ? n : OUTQ_RUN_MIN);
        if (e < 0)
            return e; /* the empty run is dropped when sent or freed */
        q->held += r->b.cap;
    }
    int e = buf_append(&r->b, p, n);
    if (e == 0)
        q->bytes += n;
    return e;
}

int outq_take(struct outq *q, struct buf *b)
{
    if (b->len == 0) {
        buf_free(b);
        return 0;
    }
    struct outq_run *r = run_new(q);
    if (!r) {
        buf_free(b);
        return -ENOMEM;
    }
    int e = buf_move(&r->b, b);
    if (e < 0) {
        buf_free(b);
        return e;
    }
    q->bytes += r->b.len;
    q->held += r->b.cap;
    return 0;
}

int outq_take_slice(struct outq *q, struct buf *b, size_t off, size_t len)
{
    if (off > b->len || len > b->len - off) {
        buf_free(b);
        return -EINVAL;
    }
    if (len == 0) {
        buf_free(b);
        return 0;
    }
    b->len = off + len; /* what follows the slice is never sent */
    int e = outq_take(q, b);
    if (e == 0) {
        q->tail->off = off; /* as if its head were written */
        q->bytes -= off;
    }
    return e;
}

static void run_pop(struct outq *q)
{
    struct outq_run *r = q->head;
    q->head = r->next;
    if (!q->head)
        q->tail = NULL;
    q->held -= r->b.cap;
    buf_free(&r->b);
    free(r);
}

int outq_send(struct outq *q, int fd)
{
    while (q->head) {
        struct iovec iov[OUTQ_IOV];
        int n = 0;
        for (struct outq_run *r = q->head; r && n < OUTQ_IOV; r = r->next)
            if (r->b.len > r->off)
                iov[n++] = (struct iovec){r->b.data + r->off, r->b.len - r->off};
        if (n == 0) { /* only empty runs left */
            while (q->head)
                run_pop(q);
            break;
        }
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 1 : -errno;
        }
        q->bytes -= (size_t)w;
        while (q->head) {
            struct outq_run *r = q->head;
            size_t left = r->b.len - r->off;
            if ((size_t)w < left) {
                r->off += (size_t)w;
                break;
            }
            w -= (ssize_t)left;
            run_pop(q);
        }
    }
    return 0;
}

void outq_splice(struct outq *q, struct outq *from)
{
    if (!from->head)
        return;
    if (q->tail)
        q->tail->next = from->head;
    else
        q->head = from->head;
    q->tail = from->tail;
    q->bytes += from->bytes;
    q->held += from->held;
    from->head = from->tail = NULL;
    from->bytes = from->held = 0;
}

size_t outq_read(struct outq *q, void *p, size_t n)
{
    size_t got = 0;
    while (q->head && got < n) {
        struct outq_run *r = q->head;
        size_t k = r->b.len - r->off;
        if (k > n - got)
            k = n - got;
        memcpy((uint8_t *)p + got, r->b.data + r->off, k);
        r->off += k;
        got += k;
        if (r->off == r->b.len)
            run_pop(q);
    }
    q->bytes -= got;
    return got;
}

void outq_free(struct outq *q)
{
    while (q->head)
        run_pop(q);
    q->bytes = q->held = 0;
}
