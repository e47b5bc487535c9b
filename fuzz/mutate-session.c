/* The custom mutator of the session-sm variant. fuzz-session.c's input is a
 * list of operations (opcode, parameter, 2-byte little-endian length,
 * payload); the frames in it are client text messages (opcode 0) and
 * sandbox envelopes of type F (opcode 3, parameter % 5 == 0). Most mutations
 * change one of those frames as JSON (mutate-json.h) or add one, or insert,
 * drop, duplicate or move an operation; the rest are libFuzzer's own. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "mutate-json.h"

#define MAX_OPS 64 /* fuzz-session.c reads no more */

struct op {
    uint8_t code, param;
    const uint8_t *p; /* borrowed payload */
    size_t n;
};

static size_t parse_ops(const uint8_t *d, size_t size, struct op *ops)
{
    size_t i = 0, k = 0;
    while (k < MAX_OPS && i + 4 <= size) {
        size_t n = (size_t)d[i + 2] | (size_t)d[i + 3] << 8;
        ops[k] = (struct op){d[i], d[i + 1], d + i + 4, 0};
        i += 4;
        if (n > size - i)
            n = size - i;
        ops[k++].n = n;
        i += n;
    }
    return k;
}

static bool is_frame_op(const struct op *o)
{
    return o->code % 10 == 0 || (o->code % 10 == 3 && o->param % 5 == 0);
}

/* ops written to out (max bytes); 0 if they do not fit. */
static size_t write_ops(const struct op *ops, size_t k, uint8_t *out, size_t max)
{
    size_t o = 0;
    for (size_t i = 0; i < k; i++) {
        size_t n = ops[i].n > 0xffff ? 0xffff : ops[i].n;
        if (o + 4 + n > max)
            return 0;
        out[o] = ops[i].code;
        out[o + 1] = ops[i].param;
        out[o + 2] = (uint8_t)n;
        out[o + 3] = (uint8_t)(n >> 8);
        memmove(out + o + 4, ops[i].p, n);
        o += 4 + n;
    }
    return o;
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    uint32_t rng = seed | 1;
    struct op ops[MAX_OPS + 1];
    size_t k = parse_ops(data, size, ops), r = mj_rand(&rng) % 10;
    /* The payloads point into data, which is rewritten: work on a copy. */
    uint8_t *src = malloc(size + 1), *frame = malloc(max_size + 1), *out = malloc(max_size + 1);
    size_t n = 0;

    if (!src || !frame || !out || k == 0 || r < 3)
        goto bytes;
    memcpy(src, data, size);
    k = parse_ops(src, size, ops);

    size_t frames[MAX_OPS], nf = 0;
    for (size_t i = 0; i < k; i++)
        if (is_frame_op(&ops[i]))
            frames[nf++] = i;
    if (r < 7 && nf > 0) { /* one frame changed as JSON */
        struct op *o = &ops[frames[mj_rand(&rng) % nf]];
        size_t room = o->n + 512 < max_size ? o->n + 512 : max_size;
        memcpy(frame, o->p, o->n);
        o->n = mj_mutate(frame, o->n, room, &rng);
        o->p = frame;
    } else if (r < 9 && k < MAX_OPS) { /* a new frame, from the client or the sandbox */
        size_t at = mj_rand(&rng) % (k + 1);
        memmove(ops + at + 1, ops + at, (k - at) * sizeof *ops);
        k++;
        bool client = mj_rand(&rng) & 1;
        ops[at] = (struct op){client ? 0 : 3, client ? (uint8_t)mj_rand(&rng) : 0, frame,
                             mj_new_frame(frame, max_size < 1024 ? max_size : 1024, &rng)};
    } else { /* an operation dropped, duplicated or moved */
        size_t a = mj_rand(&rng) % k, b = mj_rand(&rng) % k;
        struct op t = ops[a];
        switch (mj_rand(&rng) % 3) {
        case 0:
            memmove(ops + a, ops + a + 1, (k - a - 1) * sizeof *ops);
            k--;
            break;
        case 1:
            if (k < MAX_OPS) {
                memmove(ops + b + 1, ops + b, (k - b) * sizeof *ops);
                ops[b] = t;
                k++;
            }
            break;
        default:
            ops[a] = ops[b];
            ops[b] = t;
            break;
        }
    }
    n = write_ops(ops, k, out, max_size);
    if (n == 0)
        goto bytes;
    memcpy(data, out, n);
    free(src);
    free(frame);
    free(out);
    return n;
bytes:
    free(src);
    free(frame);
    free(out);
    return LLVMFuzzerMutate(data, size, max_size);
}
