/* Private to the WebSocket connection's files in src/net/ (ws.c, ws_in.c,
 * ws_out.c): struct ws_conn and what the files call in each other. Runs in
 * the supervisor. Nothing else includes this; the files are listed in
 * ws.c's opening comment. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <wslay/wslay.h>

#include "core/budget.h"
#include "core/buf.h"
#include "core/outq.h"
#include "core/utf8.h"
#include "net/ws.h"

/* An outgoing message read by wslay in fragments: a large one queued whole
 * (ended at once), or one whose bytes come as they are produced. */
struct ws_stream {
    struct ws_stream *next;
    struct outq q;   /* owned, charged: bytes not yet handed to wslay */
    bool ended;      /* no more bytes come: the last may go, with FIN */
    bool aborted;    /* it will never be finished (ws_conn_stream_abort) */
    bool done;       /* wslay has read it to the end: reaped */
};

struct ws_conn {
    int fd;                       /* borrowed: the caller closes it */
    wslay_event_context_ptr ctx;  /* owned */
    struct ws_handlers h;
    void *ud;
    struct budget *budget;        /* borrowed, may be NULL */

    /* input */
    uint8_t *rbuf;                /* owned: bytes read and not yet taken (rbuf[roff..rlen)),
                                     first the bytes read past the HTTP request; NULL while
                                     empty (an idle connection holds none) */
    size_t rcap, roff, rlen;
    size_t read_left;             /* byte budget left in the current ws_conn_read */
    bool read_more;               /* the last read stopped on the budget, not EAGAIN, or
                                     the initial bytes wait for the first read */
    bool reading;                 /* the socket is read: until the client's close frame, its
                                     EOF, or (closing) the drain budget is spent */
    bool closing;                 /* our close is queued: what arrives is discarded, frame by
                                     frame, until the client's close (drain_frames) */
    uint64_t drain_left;          /* closing: socket bytes that may still be discarded */
    bool close_received;          /* the client's close frame arrived (answered, unless ours
                                     went first) */

    /* the frame being received (in_payload: its header is taken) */
    bool in_payload;
    uint8_t opcode;
    bool fin;
    uint8_t mask[4];
    uint64_t payload_len, payload_got;
    uint8_t ctrl[125];            /* a control frame's payload */
    bool msg_open;                /* a data message is between its frames */

    /* the current data message */
    bool msg_text, msg_drop;
    bool msg_stream;              /* handed over in chunks (msg is the one being filled) */
    uint64_t msg_limit;
    uint64_t msg_announced;       /* its frames' lengths so far, dropped or not */
    struct utf8_stream msg_utf8;  /* text: the UTF-8 check so far */
    struct buf msg;               /* owned, charged: the message so far, or a streamed
                                     message's chunk being filled */

    /* output */
    struct ws_stream *srcs;       /* owned: fragmented messages not yet fully read */
    bool stalled;                 /* wslay's message is a stream with no byte to give: nothing
                                     to write until a byte, its end or a control frame comes */
    bool stuck;                   /* ... and it was aborted: it never ends, and nothing queued
                                     behind it can go (only a close, between fragments) */
    size_t charged_copy;          /* charged for what wslay holds of queued messages
                                     (wslay_held: copies, control frames, records) */
    size_t charged_io;            /* charged for rbuf and wbuf while they exist */
    size_t window;                /* read nothing while more than this is queued; 0: no limit */
    bool paused;                  /* the handler stopped reading (ws_conn_pause) */
    bool chunk_stop;              /* on_msg_chunk asked to stop for this read */
    uint8_t *wbuf;                /* owned, WS_WBUF bytes while writes are gathered, else NULL
                                     (an idle connection holds none) */
    size_t wlen, woff;            /* wbuf[woff..wlen) is waiting for the socket */

    int err;                      /* why this module closed (ws_conn_read's return) */
    char reason[124];             /* a close reason with figures in it */
    bool io_failed;               /* EOF or a socket error: nothing more can move */
    uint64_t bytes_in, bytes_out; /* socket bytes after the HTTP request (metrics) */
    bool failed;                  /* wslay gave up writing (I/O or memory) */
};

/* ws.c */
int charge(struct ws_conn *c, size_t *acct, size_t n);
void uncharge(struct ws_conn *c, size_t *acct, size_t n);
void copies_settle(struct ws_conn *c);
int queue_close(struct ws_conn *c, uint16_t code, const uint8_t *reason, size_t len);
int ws_queue(struct ws_conn *c, uint8_t opcode, const uint8_t *p, size_t n);
void begin_closing(struct ws_conn *c);
void refuse(struct ws_conn *c, int err, uint16_t code, const char *reason);
int ws_status(const struct ws_conn *c);
/* ws_in.c */
bool held(const struct ws_conn *c);
/* ws_out.c */
int wflush(struct ws_conn *c);
ssize_t ws_send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags,
                   void *user_data);
void stream_free(struct ws_stream *st);
