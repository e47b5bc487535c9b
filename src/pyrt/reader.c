/* The channel reader: one C thread per sandbox, for the whole turn. It
 * also drains a running block's output pipes (capture.c).
 *
 * It reads every message the supervisor sends. A tool_result in the
 * supervisor's form goes straight to the call waiting for it (calls.c), or is
 * dropped if none waits (late, or for a block that has ended); every other
 * message (archives, run frames) is queued, in order, for the main loop,
 * which takes them with reader_next(). When the supervisor closes the channel
 * the turn is over, and the reader ends the process.
 *
 * A frame in any other form while calls wait (only a peer other than the
 * supervisor writes one, or a client's large frame the supervisor relayed
 * as it came: CHAN_RAW) could still be the result they wait for, and the
 * main loop is busy with the block: the reader then takes the GIL and has
 * Python decode it (forkbox_runtime._reader_offer). Otherwise it never
 * touches the interpreter: a Python thread did all this before, and starting
 * one and running its first lines cost each sandbox ~100 copied pages and
 * ~0.3 ms (measured).
 *
 * A message the supervisor relays as it arrives comes in parts (chan.h):
 * they are put together here, in the sandbox's own memory (its cgroup's
 * --memory), one part per wakeup, so the capture's pipes are drained
 * between parts however slowly the client sends; an aborted one is
 * dropped. */
#include "pyrt/pyrt_int.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/limits.h"
#include "proto/chan.h"

struct inbox_msg {
    struct inbox_msg *next;
    enum chan_type type;
    size_t len;
    uint8_t *data; /* owned */
};

static pthread_mutex_t inbox_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t inbox_cv = PTHREAD_COND_INITIALIZER;
static struct inbox_msg *inbox_head, **inbox_tail = &inbox_head; /* guarded by inbox_mu */

/* 0, or -1 at EOF (also in the middle of a message). */
static int chan_read(int fd, void *p, size_t n)
{
    uint8_t *d = p;
    while (n > 0) {
        ssize_t r = read(fd, d, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        d += r;
        n -= (size_t)r;
    }
    return 0;
}

static void inbox_put(struct inbox_msg *m)
{
    pthread_mutex_lock(&inbox_mu);
    *inbox_tail = m;
    inbox_tail = &m->next;
    pthread_mutex_unlock(&inbox_mu);
    /* After the unlock: woken under it, the main thread slept again on the
     * mutex (two more futex calls and switches a message). */
    pthread_cond_signal(&inbox_cv);
}

/* True if Python took the frame (a tool result, delivered or dropped, or
 * undecodable and dropped); false: it is for the main loop. */
static bool offer_to_python(const uint8_t *data, size_t len)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallMethod(g_pyrt.runtime, "_reader_offer", "y#", (const char *)data,
                                      (Py_ssize_t)len);
    bool taken = !r || PyObject_IsTrue(r) != 0;
    Py_XDECREF(r);
    PyErr_Clear();
    PyGILState_Release(g);
    return taken;
}

/* A message coming in parts: what came of it so far (the reader's only). */
static struct {
    uint8_t *data; /* owned */
    size_t len, cap;
    enum chan_type type;
    bool open;
} parts;

/* Read one envelope from the channel, waiting for it: a whole message, or a
 * part of one (CHAN_MORE, put together here; CHAN_ABORT drops the parts so
 * far). True with *type, *flags, *data (malloc'd, the caller's) and *len
 * once a message is complete; false after a part or an abort. */
static bool read_envelope(enum chan_type *type, unsigned *flags, uint8_t **data, uint32_t *len)
{
    uint8_t hdr[CHAN_HDR_LEN];
    uint32_t n;
    if (chan_read(g_pyrt.chan_fd, hdr, sizeof hdr) < 0)
        _exit(0); /* the supervisor closed the channel: the turn is over */
    if (chan_hdr_decode_flags(hdr, sizeof hdr, CHAN_MAX_MESSAGE_BYTES, type, flags, &n) != 1 ||
        (parts.open && *type != parts.type) || (!parts.open && (*flags & CHAN_ABORT)))
        _exit(3); /* the supervisor never sends this: the stream is out of step */
    if (*flags & CHAN_ABORT) {
        free(parts.data);
        memset(&parts, 0, sizeof parts);
        return false;
    }
    size_t have = parts.open ? parts.len : 0;
    if (n > CHAN_MAX_MESSAGE_BYTES - have)
        _exit(3);
    if (have + n > parts.cap || !parts.data) {
        /* A whole message gets its size; parts grow by doubling. */
        size_t cap = parts.open && 2 * parts.cap > have + n ? 2 * parts.cap : have + n;
        uint8_t *p = realloc(parts.data, cap ? cap : 1);
        if (!p)
            _exit(3); /* cannot keep the message, and must not lose it */
        parts.data = p;
        parts.cap = cap;
    }
    if (chan_read(g_pyrt.chan_fd, parts.data + have, n) < 0)
        _exit(0);
    parts.len = have + n;
    if (*flags & CHAN_MORE) {
        parts.open = true;
        parts.type = *type;
        return false;
    }
    *data = parts.data;
    *len = (uint32_t)parts.len;
    memset(&parts, 0, sizeof parts);
    return true;
}

void reader_read_first(enum chan_type *type, uint8_t **data, size_t *len)
{
    unsigned flags;
    uint32_t n;
    while (!read_envelope(type, &flags, data, &n))
        ; /* the tools archive, in parts when it was large */
    *len = n;
}

/* One envelope from the channel, which poll() found readable: a whole
 * message, or a part of one. */
static void read_message(void)
{
    enum chan_type type;
    unsigned flags;
    uint32_t len;
    uint8_t *data;
    if (!read_envelope(&type, &flags, &data, &len))
        return;
    if (type == CHAN_FRAME && (flags & CHAN_RAW)) { /* not in the supervisor's form */
        if (calls_waiting() && offer_to_python(data, len)) {
            free(data);
            return;
        }
    } else if (type == CHAN_FRAME) {
        enum calls_offer o = calls_deliver_frame(data, len);
        if (o == CALLS_TAKEN)
            return;
        if (o == CALLS_UNCLAIMED || (calls_waiting() && offer_to_python(data, len))) {
            free(data);
            return;
        }
    }
    struct inbox_msg *m = malloc(sizeof *m);
    if (!m)
        _exit(3);
    *m = (struct inbox_msg){.type = type, .len = len, .data = data};
    if (type == CHAN_FRAME)
        capture_prime(); /* most likely a run frame: a block's capture follows */
    inbox_put(m);
}

/* The channel, the capture's wake-up eventfd and, while a block runs, its
 * output pipes (capture.c). A message is read whole once it starts to
 * arrive: during a block only small frames come, so the pipes wait little. */
static void *reader_main(void *arg)
{
    int wake_fd = (int)(intptr_t)arg;
    for (;;) {
        struct pollfd p[2 + CAPTURE_POLL_FDS] = {
            {.fd = g_pyrt.chan_fd, .events = POLLIN},
            {.fd = wake_fd, .events = POLLIN},
        };
        int timeout = capture_poll_fds(&p[2]);
        if (poll(p, 2 + CAPTURE_POLL_FDS, timeout) < 0) {
            if (errno == EINTR)
                continue;
            _exit(3);
        }
        if (p[1].revents) {
            uint64_t v;
            (void)!read(wake_fd, &v, sizeof v); /* the count is all there is */
        }
        capture_service(&p[2]);
        if (p[0].revents)
            read_message();
    }
    return NULL;
}

int reader_start(void)
{
    int wake_fd = capture_init();
    if (wake_fd < 0)
        return wake_fd;
    pthread_t t;
    pthread_attr_t a;
    int e = pthread_attr_init(&a);
    if (e == 0)
        e = pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (e == 0)
        e = pthread_create(&t, &a, reader_main, (void *)(intptr_t)wake_fd);
    pthread_attr_destroy(&a);
    return -e;
}

void reader_next(enum chan_type *type, uint8_t **data, size_t *len)
{
    pthread_mutex_lock(&inbox_mu);
    while (!inbox_head)
        pthread_cond_wait(&inbox_cv, &inbox_mu);
    struct inbox_msg *m = inbox_head;
    inbox_head = m->next;
    if (!inbox_head)
        inbox_tail = &inbox_head;
    pthread_mutex_unlock(&inbox_mu);
    *type = m->type;
    *data = m->data;
    *len = m->len;
    free(m);
}
