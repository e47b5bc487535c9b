/* Tool calls waiting for their results (see pyrt_int.h, "calls").
 *
 * A thread in call() registers its id here, sends the tool_call and sleeps on
 * a semaphore without the GIL. The channel reader thread recognises the
 * tool_result in C and posts that semaphore, also without the GIL: the
 * caller then wakes to a free GIL and decodes its own result. Done in Python,
 * the reader took the GIL, decoded, woke the caller, and the caller woke a
 * second time when the reader let the GIL go: a fifth of a tool call's round
 * trip on this kind of machine.
 *
 * The reader's fast path only reads the frame's shape (shape.h): the
 * supervisor re-encodes every tool_result as
 *     {"id":<json>,"ok":<json>,"value":<json>,"error":<json>,"kind":"tool_result"}\n
 * While calls wait, any frame without that shape is decoded by Python on the
 * reader's thread, which hands a tool_result over by its decoded id
 * (calls_deliver_id). The caller decodes the payload with the same decoder
 * either way.
 *
 * Waiting on a semaphore, like CPython's own locks: a signal interrupts the
 * wait, so a handler that raises (SIGINT, an alarm used as a timeout) still
 * ends a call that is taking too long. */
#include "pyrt/pyrt_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto/shape.h"

static pthread_mutex_t calls_mu = PTHREAD_MUTEX_INITIALIZER;
static struct call_wait *calls_head; /* guarded by calls_mu */

int calls_register(struct call_wait *w, const char *id, size_t id_len)
{
    if (id_len == 0 || id_len > sizeof w->id)
        return -EINVAL;
    memset(w, 0, sizeof *w);
    memcpy(w->id, id, id_len);
    w->id_len = id_len;
    if (sem_init(&w->sem, 0, 0) < 0)
        return -errno;
    pthread_mutex_lock(&calls_mu);
    w->next = calls_head;
    calls_head = w;
    pthread_mutex_unlock(&calls_mu);
    return 0;
}

/* Unlink w; whatever was delivered stays in w for the caller. */
void calls_unregister(struct call_wait *w)
{
    pthread_mutex_lock(&calls_mu);
    for (struct call_wait **p = &calls_head; *p; p = &(*p)->next) {
        if (*p == w) {
            *p = w->next;
            break;
        }
    }
    pthread_mutex_unlock(&calls_mu);
    sem_destroy(&w->sem);
}

void calls_release(struct call_wait *w)
{
    free(w->result);
    free(w->error);
    w->result = NULL;
    w->error = NULL;
}

/* With calls_mu held: the waiting call with this id, or NULL. */
static struct call_wait *find(const char *id, size_t id_len)
{
    for (struct call_wait *w = calls_head; w; w = w->next)
        if (!w->done && w->id_len == id_len && memcmp(w->id, id, id_len) == 0)
            return w;
    return NULL;
}

/* With calls_mu held. */
static void finish(struct call_wait *w, uint8_t *result, size_t len, char *error)
{
    w->result = result;
    w->result_len = len;
    w->error = error;
    w->done = true;
    sem_post(&w->sem);
}

enum calls_offer calls_deliver_frame(uint8_t *frame, size_t len)
{
    const char *id;
    size_t id_len;
    cJSON *root;

    if (!shape_result_id(frame, len, &id, &id_len, &root))
        return CALLS_NOT_A_RESULT;
    pthread_mutex_lock(&calls_mu);
    struct call_wait *w = find(id, id_len);
    if (w)
        finish(w, frame, len, NULL);
    pthread_mutex_unlock(&calls_mu);
    cJSON_Delete(root);
    return w ? CALLS_TAKEN : CALLS_UNCLAIMED;
}

bool calls_deliver_id(const char *id, size_t id_len, const uint8_t *frame, size_t len)
{
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return false;
    memcpy(copy, frame, len);
    pthread_mutex_lock(&calls_mu);
    struct call_wait *w = find(id, id_len);
    if (w)
        finish(w, copy, len, NULL);
    pthread_mutex_unlock(&calls_mu);
    if (!w)
        free(copy);
    return w != NULL;
}

bool calls_waiting(void)
{
    pthread_mutex_lock(&calls_mu);
    bool any = calls_head != NULL;
    pthread_mutex_unlock(&calls_mu);
    return any;
}

void calls_fail_all(const char *message)
{
    pthread_mutex_lock(&calls_mu);
    for (struct call_wait *w = calls_head; w; w = w->next)
        if (!w->done)
            finish(w, NULL, 0, strdup(message)); /* NULL if out of memory: a generic message */
    pthread_mutex_unlock(&calls_mu);
}
