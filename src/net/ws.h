/* WebSocket server connection: glue between the event loop and wslay.
 *
 * wslay does the RFC 6455 framing, reassembly, masking checks, control frames
 * (pong replies to pings) and close handshake; this module owns only the
 * non-blocking socket callbacks and turns complete messages into callbacks.
 * Text messages that are not valid UTF-8 close the connection with 1007;
 * messages over max_msg are closed with 1009 (wslay). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ws_conn; /* opaque */

/* Most socket bytes one ws_conn_read() takes, so one busy client cannot
 * starve the rest of the loop. wslay reads at most 4 KiB per recv(), so this
 * is at most 64 recv() calls; a 256 MiB upload takes 1024 loop turns. */
#define WS_READ_BUDGET (256 * 1024)

struct ws_handlers {
    /* A complete message; msg is borrowed for the duration of the call.
     * Handlers may send or ws_conn_close(), never ws_conn_free(). Text is
     * valid UTF-8. Any handler may be NULL (the message is dropped). */
    void (*on_text)(void *ud, const uint8_t *msg, size_t len);
    void (*on_binary)(void *ud, const uint8_t *msg, size_t len);
    void (*on_pong)(void *ud);
};

/* fd: a connected, non-blocking socket (borrowed: the caller closes it).
 * initial: bytes already read past the HTTP request (copied). Returns NULL on
 * allocation failure. */
struct ws_conn *ws_conn_new(int fd, size_t max_msg, const uint8_t *initial, size_t initial_len,
                            const struct ws_handlers *h, void *ud);
void ws_conn_free(struct ws_conn *c); /* NULL is fine */

/* Drive I/O when the loop says the socket is readable / writable.
 * 0 to continue, or negative when the connection is finished (peer EOF or
 * error, or the close handshake has completed): the caller then ends it.
 *   -ECONNRESET  EOF or a socket error
 *   -EPROTO      wslay gave up (frame-level protocol error, out of memory)
 *   -ESHUTDOWN   a close frame was sent, or received and answered
 * Handlers may run during ws_conn_read(); they may queue messages or close.
 * ws_conn_read() stops after WS_READ_BUDGET socket bytes even if more are
 * waiting: with level-triggered epoll the fd simply stays readable; with
 * edge-triggered, call it again while ws_conn_read_more() says so. The
 * initial bytes are not on the socket: call ws_conn_read() once after
 * ws_conn_new() (ws_conn_read_more() is true until they are consumed). */
int ws_conn_read(struct ws_conn *c);
int ws_conn_write(struct ws_conn *c);
/* True if the last ws_conn_read() stopped on its budget (or initial bytes
 * are still pending), so there may be input without a new readiness event. */
bool ws_conn_read_more(const struct ws_conn *c);

/* Queue a message (copied). 0, or negative if closing or out of memory. */
int ws_conn_send_text(struct ws_conn *c, const uint8_t *p, size_t n);
int ws_conn_send_binary(struct ws_conn *c, const uint8_t *p, size_t n);
int ws_conn_send_ping(struct ws_conn *c);
/* Queue a close frame (code, short reason: cut to 123 bytes on a UTF-8
 * boundary); further sends fail and no more messages are delivered. */
int ws_conn_close(struct ws_conn *c, uint16_t code, const char *reason);

/* Interest for the loop. */
bool ws_conn_want_read(const struct ws_conn *c);
bool ws_conn_want_write(const struct ws_conn *c);
/* Bytes queued for sending and not yet written (for backpressure). A
 * message counts in full until its last byte is written. */
size_t ws_conn_queued(const struct ws_conn *c);
/* True once a close frame has been received or sent and nothing remains. */
bool ws_conn_finished(const struct ws_conn *c);
