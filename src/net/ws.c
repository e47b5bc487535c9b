/* WebSocket server connection over wslay's event API (see ws.h).
 *
 * wslay owns framing, reassembly, the mask and UTF-8 checks, ping replies and
 * the close handshake. This file gives it non-blocking recv/send callbacks on
 * the socket, hands complete messages to the handlers, and decides when the
 * connection is over.
 *
 * Copies: wslay copies each frame's payload out of its 4 KiB read buffer into
 * a per-frame chunk and, when the message is complete, flattens the chunks
 * into one buffer (so a message briefly needs twice its size). The handlers
 * get that flattened buffer itself; nothing here copies a received message.
 * Outgoing messages are copied once, by wslay_event_queue_msg. */
#include "net/ws.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <wslay/wslay.h>

#include "core/utf8.h"

struct ws_conn {
    int fd;                       /* borrowed: the caller closes it */
    wslay_event_context_ptr ctx;  /* owned */
    struct ws_handlers h;
    void *ud;
    uint8_t *initial;             /* owned: bytes read past the HTTP request */
    size_t initial_len;
    size_t initial_off;           /* how much of initial wslay has taken */
    size_t read_left;             /* byte budget left in the current ws_conn_read */
    bool read_more;               /* the last read stopped on the budget, not EAGAIN */
    bool io_failed;               /* EOF or a socket error: nothing more can move */
    bool failed;                  /* wslay gave up (I/O, protocol or memory) */
};

static ssize_t ws_recv_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags,
                          void *user_data)
{
    struct ws_conn *c = user_data;

    /* Bytes that came in with the HTTP request precede anything on the
     * socket, and they are already in memory: no budget for them. */
    if (c->initial_off < c->initial_len) {
        size_t n = c->initial_len - c->initial_off;
        if (n > len)
            n = len;
        memcpy(buf, c->initial + c->initial_off, n);
        c->initial_off += n;
        if (c->initial_off == c->initial_len) {
            free(c->initial);
            c->initial = NULL;
            c->initial_len = c->initial_off = 0;
        }
        return (ssize_t)n;
    }

    if (c->read_left == 0) {
        /* Budget spent: pretend the socket is drained so wslay_event_recv
         * returns. wslay only asks for bytes once it has used up the ones it
         * holds, so nothing that could be processed is left waiting. */
        c->read_more = true;
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
        return -1;
    }
    if (len > c->read_left)
        len = c->read_left;

    for (;;) {
        ssize_t r = recv(c->fd, buf, len, 0);
        if (r > 0) {
            c->read_left -= (size_t)r;
            return r;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
            return -1;
        }
        /* EOF (r == 0) or a real error. Returning 0 would read as "would
         * block" to wslay, so EOF must be reported as a failure. */
        c->io_failed = true;
        wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
        return -1;
    }
}

static ssize_t ws_send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags,
                          void *user_data)
{
    struct ws_conn *c = user_data;
    /* MSG_MORE: wslay sends a frame header and its payload in separate calls;
     * let TCP put them in one segment. MSG_NOSIGNAL: a closed peer is an
     * error return, not SIGPIPE. */
    int sflags = MSG_NOSIGNAL | ((flags & WSLAY_MSG_MORE) ? MSG_MORE : 0);

    for (;;) {
        ssize_t r = send(c->fd, data, len, sflags);
        if (r >= 0)
            return r;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
            return -1;
        }
        c->io_failed = true;
        wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
        return -1;
    }
}

static void ws_msg_cb(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg,
                      void *user_data)
{
    struct ws_conn *c = user_data;
    static const uint8_t empty[1];
    /* wslay passes NULL for an empty message; handlers get a real pointer so
     * a memcpy(dst, msg, 0) downstream is not undefined behaviour. */
    const uint8_t *msg = arg->msg ? arg->msg : empty;

    /* Close: wslay has already queued the reply and stopped reading.
     * Ping: wslay has already queued the pong. */
    switch (arg->opcode) {
    case WSLAY_TEXT_FRAME:
        /* wslay validates text as it arrives and closes with 1007 itself;
         * checking again costs one pass and keeps the handler's promise of
         * valid UTF-8 independent of the library's version. */
        if (!utf8_valid(msg, arg->msg_length)) {
            ws_conn_close(c, WSLAY_CODE_INVALID_FRAME_PAYLOAD_DATA, NULL);
            return;
        }
        if (c->h.on_text)
            c->h.on_text(c->ud, msg, arg->msg_length);
        break;
    case WSLAY_BINARY_FRAME:
        if (c->h.on_binary)
            c->h.on_binary(c->ud, msg, arg->msg_length);
        break;
    case WSLAY_PONG:
        if (c->h.on_pong)
            c->h.on_pong(c->ud);
        break;
    default:
        break;
    }
}

struct ws_conn *ws_conn_new(int fd, size_t max_msg, const uint8_t *initial, size_t initial_len,
                            const struct ws_handlers *h, void *ud)
{
    const struct wslay_event_callbacks cbs = {
        .recv_callback = ws_recv_cb,
        .send_callback = ws_send_cb,
        /* genmask: only clients mask. */
        .on_msg_recv_callback = ws_msg_cb,
    };
    struct ws_conn *c = calloc(1, sizeof(*c));

    if (!c)
        return NULL;
    c->fd = fd;
    c->h = *h;
    c->ud = ud;
    if (initial_len > 0) {
        c->initial = malloc(initial_len);
        if (!c->initial) {
            free(c);
            return NULL;
        }
        memcpy(c->initial, initial, initial_len);
        c->initial_len = initial_len;
    }
    if (wslay_event_context_server_init(&c->ctx, &cbs, c) != 0) {
        free(c->initial);
        free(c);
        return NULL;
    }
    /* wslay's default is 2 GiB - 1. Over the limit it queues close 1009 and
     * stops reading, checking each frame header before it allocates. */
    wslay_event_config_set_max_recv_msg_length(c->ctx, max_msg);
    return c;
}

void ws_conn_free(struct ws_conn *c)
{
    if (!c)
        return;
    wslay_event_context_free(c->ctx);
    free(c->initial);
    free(c);
}

static int ws_status(const struct ws_conn *c)
{
    if (c->io_failed)
        return -ECONNRESET;
    if (c->failed)
        return -EPROTO;
    if (ws_conn_finished(c))
        return -ESHUTDOWN;
    return 0;
}

int ws_conn_read(struct ws_conn *c)
{
    if (c->failed || !wslay_event_want_read(c->ctx))
        return ws_status(c);

    c->read_left = WS_READ_BUDGET;
    c->read_more = false;
    int r = wslay_event_recv(c->ctx);
    if (r != 0) {
        c->failed = true;
        /* A frame-level protocol error (not I/O) leaves a close frame queued:
         * one best-effort attempt to send it, then the connection is over. */
        if (!c->io_failed && r == WSLAY_ERR_CALLBACK_FAILURE)
            wslay_event_send(c->ctx);
    }
    return ws_status(c);
}

int ws_conn_write(struct ws_conn *c)
{
    if (c->failed)
        return ws_status(c);
    if (wslay_event_send(c->ctx) != 0)
        c->failed = true;
    return ws_status(c);
}

static int ws_queue(struct ws_conn *c, uint8_t opcode, const uint8_t *p, size_t n)
{
    const struct wslay_event_msg msg = {.opcode = opcode, .msg = p, .msg_length = n};

    if (c->failed)
        return -EPIPE;
    switch (wslay_event_queue_msg(c->ctx, &msg)) {
    case 0:
        return 0;
    case WSLAY_ERR_NOMEM:
        return -ENOMEM;
    case WSLAY_ERR_INVALID_ARGUMENT:
        return -EINVAL;
    default: /* WSLAY_ERR_NO_MORE_MSG: a close is queued or sent */
        return -EPIPE;
    }
}

int ws_conn_send_text(struct ws_conn *c, const uint8_t *p, size_t n)
{
    return ws_queue(c, WSLAY_TEXT_FRAME, p, n);
}

int ws_conn_send_binary(struct ws_conn *c, const uint8_t *p, size_t n)
{
    return ws_queue(c, WSLAY_BINARY_FRAME, p, n);
}

int ws_conn_send_ping(struct ws_conn *c)
{
    return ws_queue(c, WSLAY_PING, NULL, 0);
}

/* Longest prefix of s, at most max bytes, that does not split a UTF-8
 * sequence (a close reason must be valid UTF-8: RFC 6455 5.5.1). */
static size_t utf8_prefix(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n <= max)
        return n;
    n = max;
    while (n > 0 && ((uint8_t)s[n] & 0xC0) == 0x80)
        n--;
    return n;
}

int ws_conn_close(struct ws_conn *c, uint16_t code, const char *reason)
{
    /* 125 bytes of control payload minus the 2-byte code. */
    size_t len = reason ? utf8_prefix(reason, 123) : 0;

    if (c->failed)
        return -EPIPE;
    int r = wslay_event_queue_close(c->ctx, code, (const uint8_t *)reason, len);
    if (r == WSLAY_ERR_NOMEM)
        return -ENOMEM;
    if (r == WSLAY_ERR_INVALID_ARGUMENT)
        return -EINVAL;
    if (r != 0)
        return -EPIPE;
    /* Once we have decided to close, messages still in flight from the peer
     * must not reach the handlers (this also ends a wslay_event_recv loop
     * that a handler closed from). We do not wait for the peer's close:
     * ws_conn_finished() turns true when ours is written. */
    wslay_event_shutdown_read(c->ctx);
    return 0;
}

bool ws_conn_want_read(const struct ws_conn *c)
{
    return !c->failed && wslay_event_want_read(c->ctx);
}

bool ws_conn_want_write(const struct ws_conn *c)
{
    return !c->failed && wslay_event_want_write(c->ctx);
}

bool ws_conn_read_more(const struct ws_conn *c)
{
    return (c->read_more || c->initial_off < c->initial_len) && ws_conn_want_read(c);
}

size_t ws_conn_queued(const struct ws_conn *c)
{
    return wslay_event_get_queued_msg_length(c->ctx);
}

bool ws_conn_finished(const struct ws_conn *c)
{
    if (c->failed)
        return true;
    /* wslay stops writing once its close frame is out. */
    if (wslay_event_get_close_sent(c->ctx))
        return true;
    /* A received close queues our reply; done once that is written (the
     * reply cannot be queued only if ours already was, caught above). */
    return wslay_event_get_close_received(c->ctx) && !wslay_event_want_write(c->ctx);
}
