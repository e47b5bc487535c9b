/* A queue of byte runs to write to a non-blocking socket, oldest first.
 *
 * What a relay queues is written with one sendmsg() over several runs and
 * consumed by offset, so a large message is never moved or copied to be
 * sent (a buffer that shifted its tail to the front after every partial
 * send cost the supervisor O(n^2) for an upload). A message already in a
 * struct buf is queued by taking the buffer over (outq_take); small pieces
 * (envelope headers) are copied into the last run. Every run is charged to
 * the queue's budget until it has been written. */
#pragma once
#include <stddef.h>

#include "core/buf.h"

struct outq_run;

struct outq {
    struct outq_run *head, *tail; /* owned */
    size_t bytes;                 /* queued and not yet written */
    size_t held;                  /* memory the runs hold (what is charged): at least
                                     bytes; a window is counted in it */
    struct budget *budget;        /* borrowed, or NULL */
};

void outq_init(struct outq *q, struct budget *budget);
/* Copy n bytes to the end of the queue. 0, -ENOMEM or the budget's error. */
int outq_append(struct outq *q, const void *p, size_t n);
/* Queue b's bytes without copying them; b is left empty (even on error,
 * when its bytes are dropped). 0, -ENOMEM or the budget's error. */
int outq_take(struct outq *q, struct buf *b);
/* The same for b.data[off..off+len) only (a value inside a message): the
 * bytes after it may be overwritten by later appends. -EINVAL if the slice
 * is not inside b. */
int outq_take_slice(struct outq *q, struct buf *b, size_t off, size_t len);
/* Write what the socket takes: 0 when the queue is empty, 1 when bytes
 * remain (the socket is full), -errno on a fatal socket error. */
int outq_send(struct outq *q, int fd);
/* Move everything queued in from to the end of q (no copy; the runs keep
 * their budget charges: both queues must share one budget). from is left
 * empty. */
void outq_splice(struct outq *q, struct outq *from);
/* Copy up to n bytes from the front of the queue to p and drop them (for a
 * consumer that is not a socket): the count. */
size_t outq_read(struct outq *q, void *p, size_t n);
void outq_free(struct outq *q); /* drops what is queued; safe twice */
