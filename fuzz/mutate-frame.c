/* The custom mutator of the frame-sm variant: fuzz-frame.c's inputs are one
 * frame each, mutated as JSON (mutate-json.h) most of the time. */
#include "fuzz.h"
#include "mutate-json.h"

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    uint32_t rng = seed | 1;
    return mj_mutate(data, size, max_size, &rng);
}

size_t LLVMFuzzerCustomCrossOver(const uint8_t *d1, size_t n1, const uint8_t *d2, size_t n2,
                                 uint8_t *out, size_t max_out, unsigned int seed)
{
    uint32_t rng = seed | 1;
    size_t n = mj_cross(d1, n1, d2, n2, out, max_out, &rng);
    if (n)
        return n;
    /* Not two objects: the first input's head and the second's tail. */
    size_t a = n1 ? mj_rand(&rng) % (n1 + 1) : 0, b = n2 ? mj_rand(&rng) % (n2 + 1) : 0;
    if (a > max_out)
        a = max_out;
    if (n2 - b > max_out - a)
        b = n2 - (max_out - a);
    for (size_t i = 0; i < a; i++)
        out[i] = d1[i];
    for (size_t i = b; i < n2; i++)
        out[a + i - b] = d2[i];
    return a + n2 - b;
}
