/* The supervisor's end of one sandbox's channel (proto/chan.h envelopes over
 * a SOCK_STREAM socketpair): the counterpart of net/ws.h's ws_conn. Runs in
 * the supervisor.
 *
 * It owns bytes, envelopes and fds: the outgoing queue (envelopes written
 * without blocking), the reassembly of incoming envelope headers, the read
 * budget per wakeup, reading a body into the room its handler reserved (or
 * dropping it unread), and the one fd a sandbox may pass (its seccomp
 * listener, attached to the first byte of its first message). Once that
 * message is in, SO_PASSRIGHTS is turned off on our end (Linux 6.16: the
 * kernel refuses the sandbox's SCM_RIGHTS with EPERM), and no frame goes to
 * the sandbox before that (user code runs only after `run`). Where the
 * kernel lacks it, any other fd that comes ends the turn (chan_conn_read's
 * -EPERM) and, like every fd from a sandbox, is closed by the closer thread
 * (loop/closer.h), never by the loop. What a message means, whether it may
 * come in the turn's state, and how large it may be are its handler's
 * (from_sandbox.c): the handler decides at the header, before any body byte is
 * read. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/budget.h"
#include "core/buf.h"
#include "core/limits.h"
#include "proto/chan.h"

#define CHAN_CONN_READ_BUDGET (256 * KiB) /* bytes read from a sandbox per wakeup */

struct chan_conn;

/* What on_begin may answer besides 0 and -1 (chan_conn_handlers). */
enum {
    CHAN_BEGIN_WAIT = 1,   /* not now */
    CHAN_BEGIN_STREAM = 2, /* hand the body over a chunk at a time (on_chunk) */
};
/* A streamed body's chunks: at most this much each (and what the read
 * budget leaves), each a buffer of its own, charged. */
#define CHAN_CONN_CHUNK (64 * KiB)

/* The message being read. */
struct chan_msg {
    enum chan_type type;
    uint32_t len;  /* its body's length, as announced */
    bool first;    /* the sandbox's first message */
    bool dropped;  /* its body is read and dropped (on_begin gave no buffer) */
    bool stream;   /* its body is handed over in chunks (CHAN_BEGIN_STREAM) */
    int fd;        /* on_end only: the fd sent with the first message, or -1;
                      owned by on_end (which closes it with closer_close) */
};

struct chan_conn_handlers {
    /* A header arrived (its length within CHAN_MAX_MESSAGE_BYTES). Return 0
     * with *into a buffer holding room for m->len more bytes (the body is
     * appended to it), or with *into NULL to read the body and drop it;
     * CHAN_BEGIN_STREAM to have the body handed over as it arrives
     * (on_chunk), nothing of it kept here; CHAN_BEGIN_WAIT: not now
     * (backpressure: reading stops with the header kept, and the next
     * chan_conn_read() asks again before reading anything); or -1 after
     * ending the turn (reading stops). */
    int (*on_begin)(void *ud, const struct chan_msg *m, struct buf **into);
    /* More of a kept body is in *into: 0, or -1 after ending the turn. */
    int (*on_data)(void *ud, const struct chan_msg *m);
    /* The next chunk of a streamed body, taken (freed by the handler; it is
     * charged to the channel's budget): 0 to read on, 1 to stop reading
     * for now (backpressure; the message goes on at the next read), -1
     * after ending the turn. NULL if the handler never streams. */
    int (*on_chunk)(void *ud, const struct chan_msg *m, struct buf *chunk);
    /* The whole body is in (or was dropped). Return 0 to read on, 1 to stop
     * reading for this wakeup (backpressure, a check that needs more loop
     * rounds), -1 after ending the turn. */
    int (*on_end)(void *ud, struct chan_msg *m);
};

/* Once per process, before the first turn: learn whether the kernel has
 * SO_PASSRIGHTS; without it, the channel's reads borrow the fd reserve that
 * the process keeps (core/util.h, FD_RESERVE), and the log says so. */
void chan_conn_init(void);

/* fd (borrowed) may be -1 until the sandbox exists: what is queued waits.
 * Queued bytes are charged to budget (borrowed). NULL on ENOMEM. */
struct chan_conn *chan_conn_new(int fd, struct budget *budget, const struct chan_conn_handlers *h,
                                void *ud);
/* The sandbox is there: its end of the channel (borrowed). */
void chan_conn_set_fd(struct chan_conn *c, int fd);
/* The sandbox is gone: drop what is queued, a pending fd (closed) and a
 * partly read message, and forget the fd (reading stops). Safe from inside
 * a handler; idempotent; NULL is fine. */
void chan_conn_close(struct chan_conn *c);
/* chan_conn_close, then free. NULL is fine. */
void chan_conn_free(struct chan_conn *c);
/* Close the sandbox's end of a channel (fd, taken by its owner after
 * chan_conn_close). Without SO_PASSRIGHTS, fds the sandbox sent may still be
 * queued in it, and its release would be their last close: the closer does
 * it, draining them first. With it, only the setup's listener can ever have
 * been queued there: closed at once. */
void chan_conn_close_fd(int fd);

/* Queue one envelope whose body is *body, taken over (no copy; consumed on
 * error too). 0, -EMSGSIZE (over CHAN_MAX_MESSAGE_BYTES), -ENOMEM or the
 * budget's error. */
int chan_conn_send(struct chan_conn *c, enum chan_type type, struct buf *body);
/* The same with envelope flags (proto/chan.h): a part of a message relayed
 * as it arrives (CHAN_MORE), its last part (CHAN_RAW or 0), or its abort
 * (CHAN_ABORT, empty). The parts of one message must not be interleaved
 * with other messages (the caller sends nothing else meanwhile). */
int chan_conn_send_part(struct chan_conn *c, enum chan_type type, unsigned flags,
                        struct buf *body);
/* Queue one envelope whose body is head, msg[off..off+len), tail: head and
 * tail are copied, the slice is sent from msg, which is consumed (error or
 * not). Errors as chan_conn_send. */
int chan_conn_send_around(struct chan_conn *c, enum chan_type type, const struct buf *head,
                          struct buf *msg, size_t off, size_t len, const struct buf *tail);
/* Write what is queued: 0 when all of it went or the socket is full,
 * -EPIPE when the sandbox is gone. */
int chan_conn_flush(struct chan_conn *c);
/* Bytes queued and not yet written (0 for NULL). */
size_t chan_conn_queued(const struct chan_conn *c);
/* The memory they hold (charged: the runs' capacity), what a window is
 * counted in (0 for NULL). */
size_t chan_conn_held(const struct chan_conn *c);

/* Read what the sandbox sent, at most CHAN_CONN_READ_BUDGET bytes, calling
 * the handlers. 0 to continue (the socket is drained, the budget is spent
 * or a handler asked to stop); -EPIPE: end of file or a socket error (the
 * sandbox's end is closed); -EMSGSIZE: a header announced more than
 * CHAN_MAX_MESSAGE_BYTES; -EBADMSG: an unknown envelope type; -EPERM: an fd
 * came that is not the first message's one; -EMFILE: the first message's
 * fd did not fit in our fd table; -ECANCELED: a handler ended the turn (it
 * may have closed c, not freed it); -ENOMEM, -EDQUOT, -ENOSPC: a streamed
 * chunk could not be had or charged. */
int chan_conn_read(struct chan_conn *c);
/* The protocol error a chan_conn_read result stands for, in words for a
 * close reason ("bad envelope"...), or NULL when r is not one. */
const char *chan_conn_error(int r);
