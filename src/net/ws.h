/* WebSocket server connection: glue between the event loop and wslay (runs
 * in the supervisor).
 *
 * wslay frames and queues what we send and keeps the close handshake's
 * sending side. What we receive is read here (ws.c says why): RFC 6455
 * framing, masking, UTF-8 of text (checked once, as it arrives), pong
 * replies to pings and the echo of a client's close. This module owns the
 * non-blocking socket and the messages:
 *  - Incoming messages are assembled in one buffer per message, charged to
 *    the connection's budget, whose size is reserved when each frame's
 *    header announces it; large payloads are received straight into it. The
 *    handler says at a message's start how large it may be (or that it is
 *    dropped unread), so an upload over its limit is refused at the header
 *    that announces it (close 1009), before its bytes arrive. Or it asks for
 *    the message as a stream: its payload handed over in chunks of at most
 *    WS_STREAM_CHUNK as they arrive (each chunk charged until the handler
 *    frees it), nothing of it kept here.
 *  - Protocol errors close with 1002 and a reason: reserved bits, unknown
 *    opcodes, fragment sequencing, an unmasked frame, control frames over
 *    125 bytes or fragmented, a non-minimal or 2^63+ length, a close frame
 *    with a 1-byte payload or an invalid code. Text that is not UTF-8, and
 *    a close reason that is not, close with 1007.
 *  - The closing handshake (RFC 6455 7.1.1): once our close is queued, by
 *    ws_conn_close() or for a reason of this module's, nothing more is
 *    delivered and nothing but the close is written; the socket is read on
 *    and discarded until the client's close frame or EOF (at most
 *    WS_CLOSE_DRAIN_BYTES past the frame being received), and only then is
 *    the connection finished, so that a client still sending reads the
 *    close and its reason instead of a reset.
 *  - Outgoing messages over WS_SEND_COPY_MAX are sent as fragments read
 *    straight from the caller's buffer (no copy of the message, and pongs and
 *    a close can go out between fragments); small ones are copied. Writes are
 *    gathered in a small buffer so that many small frames cost one send().
 *  - Everything held is charged to the budget: incoming messages, the copies
 *    wslay keeps of queued ones, control frames (pongs, the close) with
 *    WS_MSG_OVERHEAD each for wslay's records, the read and write buffers.
 *    With a window set, nothing is read while more than the window waits to
 *    be sent: a peer that does not read stops being read. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"

struct ws_conn; /* opaque */
struct ws_stream; /* opaque: an outgoing message whose bytes come later */
struct budget;

/* Most socket bytes one ws_conn_read() takes, so one busy client cannot
 * starve the rest of the loop: a 256 MiB upload takes 1024 loop turns. */
#define WS_READ_BUDGET (256 * 1024)
/* Outgoing messages up to this size are copied into wslay's queue; larger
 * ones are sent as fragments from the caller's buffer. */
#define WS_SEND_COPY_MAX (64 * 1024)
/* Closing: bytes discarded while waiting for the client's close frame,
 * beyond the rest of the frame that was being received (a pipelined
 * message, at most WS_MAX_MESSAGE_BYTES); past them the socket is closed
 * anyway. */
#define WS_CLOSE_DRAIN_BYTES (1024 * 1024)
/* Every message queued costs its payload plus about this much of wslay's
 * own memory (the message record, its queue entry, malloc's headers):
 * charged too, so that a flood of empty pongs is paid for like any other
 * bytes. */
#define WS_MSG_OVERHEAD 128
/* The connection's own buffers, each allocated (and charged) only while it
 * is in use: bytes read and not yet taken, and writes being gathered so that
 * many small frames cost one send(). */
#define WS_RBUF (16 * 1024)
#define WS_WBUF (64 * 1024)

#define WS_MSG_DROP UINT64_MAX
/* A streamed message's chunks: at most this many bytes each. */
#define WS_STREAM_CHUNK (256 * 1024)

/* A message starts: what its first frame's header says. */
struct ws_msg_start {
    bool text;
    bool fin;      /* the message is this one frame */
    uint64_t len;  /* this frame's length */
    bool stream;   /* set by on_msg_begin: hand its payload over as it comes
                      (on_msg_chunk) instead of assembling it */
};

struct ws_handlers {
    /* A text or binary message starts. Returns the most bytes it may have
     * (frames announcing more in all are refused: close 1009), or
     * WS_MSG_DROP to drop it unread: its bytes are read and discarded and
     * on_msg_end is not called. May set m->stream. May send or
     * ws_conn_close(), never ws_conn_free(). */
    uint64_t (*on_msg_begin)(void *ud, struct ws_msg_start *m);
    /* More of the message arrived: msg[0..len) is all of it so far (the
     * buffer may move between calls). NULL = not wanted. Not for streams. */
    void (*on_msg_data)(void *ud, const uint8_t *msg, size_t len);
    /* The message is complete; text is valid UTF-8 (a stream's too, as a
     * whole). The handler may take the bytes with buf_move(); what it leaves
     * is freed. A stream's msg is empty: its bytes went by on_msg_chunk. */
    void (*on_msg_end)(void *ud, bool text, struct buf *msg);
    void (*on_pong)(void *ud); /* NULL = not wanted */
    /* A ping arrived (its pong is queued). NULL = not wanted. May pause. */
    void (*on_ping)(void *ud);
    /* n more payload bytes of a dropped message were read and discarded.
     * NULL = not wanted. May pause. */
    void (*on_dropped)(void *ud, size_t n);
    /* The next chunk of a streamed message (its bytes in order, unmasked;
     * text may end inside a character: its UTF-8 is checked as a whole).
     * The handler may take it with buf_move(); what it leaves is freed. May
     * pause or close. Returns false to stop reading for now (backpressure:
     * the rest waits for the next ws_conn_read()). NULL: no message is
     * streamed. */
    bool (*on_msg_chunk)(void *ud, struct buf *chunk);
};

/* fd: a connected, non-blocking socket (borrowed: the caller closes it).
 * budget: what incoming messages and queued outgoing ones are charged to
 * (borrowed, may be NULL). initial: bytes already read past the HTTP request
 * (copied). Returns NULL on allocation failure. */
struct ws_conn *ws_conn_new(int fd, struct budget *budget, const uint8_t *initial,
                            size_t initial_len, const struct ws_handlers *h, void *ud);
void ws_conn_free(struct ws_conn *c); /* NULL is fine */

/* Drive I/O when the loop says the socket is readable / writable.
 * 0 to continue (a close under way included), or negative when the
 * connection is finished: the caller then closes the socket.
 *   -ECONNRESET  EOF or a socket error
 *   -EPIPE       wslay gave up writing (out of memory)
 *   -ESHUTDOWN   the closing handshake is over: both close frames went, or
 *                ours went and the client's EOF came or the drain's budget
 *                ran out
 * A close this module decides (ws_conn_refused) is queued and, as far as
 * the socket takes it, written at once; the connection then goes on
 * through the handshake like any other close.
 * Handlers may run during ws_conn_read(); they may queue messages or close.
 * ws_conn_read() stops after WS_READ_BUDGET socket bytes even if more are
 * waiting: with level-triggered epoll the fd simply stays readable. The
 * initial bytes are not on the socket: call ws_conn_read() once after
 * ws_conn_new() (ws_conn_read_more() is true until they are consumed). */
int ws_conn_read(struct ws_conn *c);
int ws_conn_write(struct ws_conn *c);
/* True if the last ws_conn_read() stopped on its budget, a pause or the
 * window (or initial bytes are still pending) and reading is wanted now, so
 * there may be input without a new readiness event: call ws_conn_read(). */
bool ws_conn_read_more(const struct ws_conn *c);

/* Queue a message (copied). 0, or negative if closing, out of memory or over
 * the budget (-EDQUOT / -ENOSPC). */
int ws_conn_send_text(struct ws_conn *c, const uint8_t *p, size_t n);
int ws_conn_send_binary(struct ws_conn *c, const uint8_t *p, size_t n);
/* Queue the message in *b, taking the buffer over (b is left empty, also on
 * error): large messages are sent from it without a copy, and it is freed
 * once sent. Same errors. */
int ws_conn_send_buf(struct ws_conn *c, bool text, struct buf *b);
int ws_conn_send_ping(struct ws_conn *c);

/* A message sent as its bytes are produced (a relay passing each chunk on as
 * it arrives, checking the message as it goes): begun, fed chunks, then
 * ended once it passed its check. Its last byte is held back until
 * ws_conn_stream_end(), so the peer never has the message whole before;
 * a message found bad is aborted and the connection closed instead: the
 * close goes out between its fragments. The stream belongs to the
 * connection: *out is valid until ws_conn_stream_end() or _abort() (one of
 * them, once), or ws_conn_free(). A stream must carry at least one byte.
 * begin: 0, -EPIPE (closing or failed), -ENOMEM or the budget's error. */
int ws_conn_stream_begin(struct ws_conn *c, bool text, struct ws_stream **out);
/* Queue *chunk's bytes (taken over, also on error; charged as they are:
 * ws_conn_queued counts them until wslay has read them). 0, -ENOMEM or the
 * budget's error. */
int ws_conn_stream_push(struct ws_conn *c, struct ws_stream *st, struct buf *chunk);
/* No more bytes come: the last goes, with FIN. */
void ws_conn_stream_end(struct ws_conn *c, struct ws_stream *st);
/* The message will never be finished (its check failed, its producer is
 * gone): what is queued of it is dropped, and nothing queued after it can go
 * any more (ws_conn_pending no longer counts it): close the connection. */
void ws_conn_stream_abort(struct ws_conn *c, struct ws_stream *st);
/* Queue a close frame (code, short reason: cut to 123 bytes on a UTF-8
 * boundary); further sends fail and no more messages are delivered. The
 * connection is finished once the handshake is over (ws_conn_read). */
int ws_conn_close(struct ws_conn *c, uint16_t code, const char *reason);
/* Why this module closed the connection, 0 if it did not:
 *   -EPROTO      a protocol error (close 1002, or 1007 for text or a close
 *                reason that is not UTF-8)
 *   -EMSGSIZE    a message over its limit or the turn's budget (close 1009)
 *   -ENOSPC      the daemon's budget is exhausted (close 1013, try again)
 *   -ENOMEM      out of memory (close 1011) */
int ws_conn_refused(const struct ws_conn *c);

/* Read nothing while more than window bytes (ws_conn_queued) wait to be
 * sent; 0 (the default): no limit. */
void ws_conn_set_window(struct ws_conn *c, size_t window);
/* Stop reading (paused) or read again. Safe from a handler: reading stops
 * before the next frame's bytes are taken. After reading resumes, bytes
 * already read may be waiting: ws_conn_read_more() says so. */
void ws_conn_pause(struct ws_conn *c, bool paused);

/* Interest for the loop: reading is wanted unless closing, paused or over
 * the window. */
bool ws_conn_want_read(const struct ws_conn *c);
bool ws_conn_want_write(const struct ws_conn *c);
/* The memory what is queued for sending holds, and not yet written (for
 * backpressure, a window: charged memory, not only bytes): wslay's copies
 * with WS_MSG_OVERHEAD each, the streams' chunks, the gathered writes. A
 * message counts in full until its last byte is written. */
size_t ws_conn_queued(const struct ws_conn *c);
/* True while any message (an empty one too) is queued and not written, and
 * can still be (nothing behind an aborted stream can). */
bool ws_conn_pending(const struct ws_conn *c);
/* True once the closing handshake is over (see ws_conn_read), or nothing
 * more can be written. */
bool ws_conn_finished(const struct ws_conn *c);
/* Bytes read from and written to the socket so far (the WebSocket stream,
 * from the first byte after the HTTP request); c may be NULL (0, 0). */
void ws_conn_bytes(const struct ws_conn *c, uint64_t *in, uint64_t *out);
