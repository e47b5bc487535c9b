/* Shared helpers for the fuzz targets (fuzz-*.c).
 *
 * Every target defines LLVMFuzzerTestOneInput() and calls the production
 * code. Built with -Dfuzzing=true it links against libFuzzer; otherwise
 * fuzz-main.c replays files through it, so the same sources run as plain
 * regression tests under gcc (systemd's src/fuzz/ layout).
 *
 * Properties are checked with FUZZ_ASSERT, which prints and abort()s: both
 * libFuzzer and the replay driver treat that as a crash. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Optional hooks (libFuzzer finds them by name): set-up once before the
 * first input, and a custom mutator (fuzz/mutate-*.c) with its helper. */
int LLVMFuzzerInitialize(int *argc, char ***argv);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);
size_t LLVMFuzzerCustomCrossOver(const uint8_t *d1, size_t n1, const uint8_t *d2, size_t n2,
                                 uint8_t *out, size_t max_out, unsigned int seed);
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

#define FUZZ_ASSERT(cond, ...)                                                  \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: property violated: %s: ", __FILE__, __LINE__, \
                    #cond);                                                     \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
            abort();                                                            \
        }                                                                       \
    } while (0)

/* ASan hooks, for properties about what a parser may read. No-ops when the
 * build has no ASan (gcc defines __SANITIZE_ADDRESS__, clang __has_feature). */
#if defined(__SANITIZE_ADDRESS__)
#define FUZZ_HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FUZZ_HAVE_ASAN 1
#endif
#endif
#ifdef FUZZ_HAVE_ASAN
#include <sanitizer/asan_interface.h>
#define FUZZ_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define FUZZ_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define FUZZ_POISON(p, n) ((void)(p), (void)(n))
#define FUZZ_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* Chunking: how a byte stream is cut into feeds (wslay's scripted_data_feed
 * idea). The input's first byte is the seed: 0 gives one chunk of
 * everything; otherwise chunk sizes are pseudo-random in 1..seed, with an
 * occasional size of 1 and an occasional "everything left", so single-byte
 * feeds and large feeds both happen. */
struct fuzz_chunker {
    uint32_t state;
    uint8_t max;
};

static inline void fuzz_chunker_init(struct fuzz_chunker *c, uint8_t seed)
{
    c->state = 0x9e3779b9u ^ seed;
    c->max = seed;
}

static inline size_t fuzz_chunker_next(struct fuzz_chunker *c, size_t left)
{
    size_t n;

    if (c->max == 0 || left == 0)
        return left;
    c->state = c->state * 1103515245u + 12345u;
    switch ((c->state >> 16) & 15) {
    case 0:
        n = 1;
        break;
    case 1:
        n = left;
        break;
    default:
        n = 1 + ((c->state >> 20) % c->max);
        break;
    }
    return n < left ? n : left;
}

/* The server's side of a WebSocket stream as a client reads it: frames are
 * unmasked (a masked one is a property violation), each handed whole to a
 * callback (opcode, FIN, payload); payloads over max bytes are cut (the
 * callback sees the first max bytes and the frame's real length). */
struct fuzz_wsin {
    uint8_t hdr[10];
    size_t hdr_got;
    bool in_payload;
    uint8_t op, fin;
    uint64_t len, left;
    uint8_t *payload; /* owned, max bytes */
    size_t max, got;
};

typedef void (*fuzz_wsin_frame_fn)(void *ud, uint8_t op, bool fin, const uint8_t *p, size_t n,
                                   uint64_t len);

static inline void fuzz_wsin_init(struct fuzz_wsin *w, size_t max)
{
    *w = (struct fuzz_wsin){.max = max, .payload = malloc(max ? max : 1)};
}

static inline void fuzz_wsin_free(struct fuzz_wsin *w)
{
    free(w->payload);
    w->payload = NULL;
}

static inline void fuzz_wsin_feed(struct fuzz_wsin *w, const uint8_t *p, size_t n,
                                  fuzz_wsin_frame_fn fn, void *ud)
{
    while (n > 0) {
        if (!w->in_payload) {
            w->hdr[w->hdr_got++] = *p++;
            n--;
            if (w->hdr_got < 2)
                continue;
            uint8_t len7 = w->hdr[1] & 0x7f;
            size_t need = 2 + (len7 == 126 ? 2 : len7 == 127 ? 8 : 0);
            if (w->hdr_got < need)
                continue;
            FUZZ_ASSERT(!(w->hdr[1] & 0x80), "server frame masked");
            uint64_t len = len7;
            if (len7 == 126)
                len = (uint64_t)w->hdr[2] << 8 | w->hdr[3];
            else if (len7 == 127)
                for (int k = 0; k < 8; k++)
                    len = (k ? len << 8 : 0) | w->hdr[2 + k];
            w->op = w->hdr[0] & 0x0f;
            w->fin = w->hdr[0] >> 7;
            w->len = w->left = len;
            w->got = 0;
            w->hdr_got = 0;
            w->in_payload = true;
        }
        size_t k = w->left < n ? (size_t)w->left : n;
        for (size_t i = 0; i < k && w->got < w->max; i++)
            w->payload[w->got++] = p[i];
        p += k;
        n -= k;
        w->left -= k;
        if (w->left == 0) {
            w->in_payload = false;
            fn(ud, w->op, w->fin, w->payload, w->got, w->len);
        }
    }
}
