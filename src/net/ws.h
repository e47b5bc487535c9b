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

struct ws_handlers {
    /* A complete message; msg is borrowed for the duration of the call. */
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
 * Handlers may run during ws_conn_read(). */
int ws_conn_read(struct ws_conn *c);
int ws_conn_write(struct ws_conn *c);

/* Queue a message (copied). 0, or negative if closing or out of memory. */
int ws_conn_send_text(struct ws_conn *c, const uint8_t *p, size_t n);
int ws_conn_send_binary(struct ws_conn *c, const uint8_t *p, size_t n);
int ws_conn_send_ping(struct ws_conn *c);
/* Queue a close frame (code, short reason); further sends fail. */
int ws_conn_close(struct ws_conn *c, uint16_t code, const char *reason);

/* Interest for the loop. */
bool ws_conn_want_read(const struct ws_conn *c);
bool ws_conn_want_write(const struct ws_conn *c);
/* Bytes queued for sending and not yet written (for backpressure). */
size_t ws_conn_queued(const struct ws_conn *c);
/* True once a close frame has been received or sent and nothing remains. */
bool ws_conn_finished(const struct ws_conn *c);
