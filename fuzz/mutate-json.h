/* Structure-aware mutation of JSON frames (spec 3), for the custom mutators
 * of the -sm target variants (fuzz/mutate-frame.c, fuzz/mutate-session.c).
 *
 * libFuzzer's byte mutations turn most frames into non-JSON after a few
 * steps, so the decoder's later stages (kinds, fields, types, defaults,
 * duplicates, the relay) see few inputs. These keep most inputs well-formed
 * frames: the frame is parsed with cJSON, one member's key, value or type
 * changes (kinds swapped, escapes, big and special numbers, NaN, nesting,
 * duplicates, unknown keys, error objects), and it is printed again, with
 * tokens cJSON cannot print (NaN, 4301-digit integers, lone surrogate
 * escapes) as raw items. What cJSON cannot parse goes to LLVMFuzzerMutate().
 * Only the libFuzzer builds link these (LLVMFuzzerMutate is libFuzzer's). */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* A small PRNG seeded from libFuzzer's seed. */
static inline uint32_t mj_rand(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* Mutate the frame data[0..size) in place; returns the new size (<= max). */
size_t mj_mutate(uint8_t *data, size_t size, size_t max, uint32_t *rng);

/* Write a new frame of a random kind, fields and values into out[0..max);
 * returns its size (0 if it did not fit). */
size_t mj_new_frame(uint8_t *out, size_t max, uint32_t *rng);

/* Cross two frames: the members of a with one member of b added (or
 * replacing a's member of that key); returns the size, or 0 if either does
 * not parse or the result does not fit. */
size_t mj_cross(const uint8_t *a, size_t na, const uint8_t *b, size_t nb, uint8_t *out, size_t max,
                uint32_t *rng);
