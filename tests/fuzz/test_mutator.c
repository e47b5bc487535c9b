/* The structure-aware mutators of the -sm fuzz variants (fuzz/mutate-*.c)
 * outside libFuzzer: `test_mutator[_session] CORPUS_DIR` mutates every seed
 * in chains of mutations and checks, in TAP, that
 *   - an output never exceeds the size it was given;
 *   - most outputs stay JSON objects: frame_decode() accepts them or refuses
 *     only the kind or a type (-EPROTO), not the JSON (-EBADMSG); and many
 *     more than byte mutations alone keep (LLVMFuzzerMutate is stubbed here
 *     with byte flips, insertions and erasures, as libFuzzer's are);
 *   - for the session variant (-DMUTATOR_SESSION), the same for the frames
 *     inside its operation list, which stays parseable. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../fuzz/fuzz.h"
#include "proto/frame.h"
#include "../unit/tap.h"

#define MAX 4096
#define CHAIN 8      /* mutations in a row from one seed */
#define ROUNDS 400   /* chains per seed */

static uint32_t stub_rng = 12345;

/* libFuzzer's own mutation, roughly: flip, insert or erase a byte. */
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size)
{
    stub_rng = stub_rng * 1103515245u + 12345u;
    uint32_t r = stub_rng >> 8;
    size_t at = size ? r % size : 0;
    switch (r % 3) {
    case 0:
        if (size)
            data[at] ^= (uint8_t)(1u << (r >> 20) % 8);
        return size;
    case 1:
        if (size >= max_size)
            return size;
        memmove(data + at + 1, data + at, size - at);
        data[at] = (uint8_t)(r >> 12);
        return size + 1;
    default:
        if (!size)
            return size;
        memmove(data + at, data + at + 1, size - at - 1);
        return size - 1;
    }
}

/* Is p[0..n) a JSON object (accepted, or refused for its kind or a type)? */
static bool json_object(const uint8_t *p, size_t n)
{
    struct frame f;
    int r = frame_decode(p, n, FRAME_FROM_CLIENT, &f, NULL);
    if (r == 0)
        frame_free(&f);
    return r == 0 || r == -EPROTO;
}

struct tally {
    unsigned frames, objects, too_big;
};

#ifdef MUTATOR_SESSION
/* The frames of an operation list (fuzz-session.c's format): client text
 * messages and sandbox F envelopes. */
static void count(const uint8_t *d, size_t size, struct tally *t)
{
    size_t i = 0;
    while (i + 4 <= size) {
        uint8_t op = d[i], param = d[i + 1];
        size_t n = (size_t)d[i + 2] | (size_t)d[i + 3] << 8;
        i += 4;
        if (n > size - i)
            n = size - i;
        if (op % 10 == 0 || (op % 10 == 3 && param % 5 == 0)) {
            t->frames++;
            t->objects += json_object(d + i, n);
        }
        i += n;
    }
}
#else
static void count(const uint8_t *d, size_t size, struct tally *t)
{
    t->frames++;
    t->objects += json_object(d, size);
}
#endif

static size_t read_seed(const char *path, uint8_t *buf)
{
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, MAX, f) : 0;
    if (f)
        fclose(f);
    return n;
}

/* Chains of mutations from every well-formed seed, with the custom mutator
 * or without. */
static void run(const char *dir, bool custom, struct tally *t)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    static uint8_t seed[MAX], buf[MAX + 64];
    unsigned s = 1;

    if (!d) {
        printf("Bail out! cannot open %s\n", dir);
        exit(1);
    }
    while ((de = readdir(d))) {
        char path[4096];
        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        size_t n0 = read_seed(path, seed);
        /* From well-formed seeds only: a corpus grown by libFuzzer also
         * holds inputs that are not JSON at all, which any mutator can only
         * mutate bytewise, and their share changes with every --merge. */
        struct tally st = {0};
        count(seed, n0, &st);
        if (st.frames == 0 || st.objects != st.frames)
            continue;
        for (unsigned round = 0; round < ROUNDS; round++) {
            size_t n = n0;
            memcpy(buf, seed, n);
            for (unsigned k = 0; k < CHAIN; k++) {
                size_t max = MAX - (s % 7) * 100; /* a shrinking room, as lim: */
                if (n > max)
                    break;
                memset(buf + max, 0xa5, 64);
                n = custom ? LLVMFuzzerCustomMutator(buf, n, max, s++)
                           : LLVMFuzzerMutate(buf, n, max);
                for (size_t i = max; i < max + 64; i++) /* nothing written past max */
                    if (buf[i] != 0xa5 || n > max) {
                        t->too_big++;
                        break;
                    }
                count(buf, n, t);
            }
        }
    }
    closedir(d);
}

int main(int argc, char **argv)
{
    struct tally sm = {0}, bytes = {0};

    if (argc != 2) {
        printf("Bail out! usage: %s CORPUS_DIR\n", argv[0]);
        return 1;
    }
    run(argv[1], true, &sm);
    run(argv[1], false, &bytes);
    double p_sm = sm.frames ? (double)sm.objects / sm.frames : 0;
    double p_bytes = bytes.frames ? (double)bytes.objects / bytes.frames : 0;
    printf("# %u of %u frames JSON objects with the custom mutator (%.0f%%), %u of %u with byte "
         "mutations alone (%.0f%%)\n", sm.objects, sm.frames, 100 * p_sm, bytes.objects,
         bytes.frames, 100 * p_bytes);
    ok(sm.frames > 1000, "the mutator produced frames (%u)", sm.frames);
    ok(sm.too_big == 0, "no output larger than its room (%u)", sm.too_big);
    ok(p_sm >= 0.6, "most mutated frames stay JSON objects (%.0f%%)", 100 * p_sm);
    ok(p_sm >= p_bytes + 0.15, "clearly more than byte mutations keep (%.0f%% vs %.0f%%)",
       100 * p_sm, 100 * p_bytes);
    return tap_done();
}
