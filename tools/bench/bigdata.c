/* forkbox-bench: the big-data group's data, made once: prose-like text and random bytes
 * (deterministic), a JSON-safe string for big tool results, the upload archives of each kind
 * and size and the 50-file workspace, and how many blocks or calls each row runs. Runs in the
 * forkbox-bench process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* One size of the upload/download rows: MiB of file content, and how many blocks measure it
 * (more for the small sizes, so that each row covers several MiB). */
const unsigned big_mib[NBIGSZ] = {1, 10, 50};
const char *const kind_name[NKINDS] = {"text", "random"};
const unsigned tool_mib[NBIGSZ] = {1, 10, 40};

/* xorshift64*: fast, deterministic, and its output does not compress. */
static uint64_t xs_next(uint64_t *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 2685821657736338717ull;
}

static void fill_random(char *p, size_t n, uint64_t seed)
{
    uint64_t x = seed | 1;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = xs_next(&x);
        memcpy(p + i, &v, n - i < 8 ? n - i : 8);
    }
}

/* Text that compresses and deflates like prose (zlib -6: about 2.6:1, at about the speed it
 * does Python source): words drawn from a vocabulary of 1024 made-up words with English
 * letter frequencies, by Zipf's law (word k with weight 1/k), now and then a number or a
 * comma, in lines of 40-100 bytes (`nl` ' ' in place of '\n' when the text must be a JSON
 * string as is). A small vocabulary would make deflate's match search much slower than on
 * real text. */
#define VOCAB 1024
static void fill_text(char *p, size_t n, uint64_t seed, char nl)
{
    static const char letters[] = "eeeeeeeeeeeetttttttttaaaaaaaaooooooooiiiiiiinnnnnnnsssssss"
                                  "hhhhhhrrrrrrddddllllcccuuummwwffggyyppbbvkjxqz";
    static char vocab[VOCAB][16];
    static double cum[VOCAB];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    if (!vocab[0][0]) {
        double tot = 0;
        for (int i = 0; i < VOCAB; i++) {
            int len = 1 + (int)(xs_next(&x) % 4) + (int)(xs_next(&x) % 6) * (i > 64);
            for (int j = 0; j < len; j++)
                vocab[i][j] = letters[xs_next(&x) % (sizeof letters - 1)];
            cum[i] = tot += 1.0 / (i + 1);
        }
        for (int i = 0; i < VOCAB; i++)
            cum[i] /= tot;
    }
    x = seed | 1;
    size_t i = 0, line = 0, want = 60;
    while (i < n) {
        uint64_t r = xs_next(&x);
        double u = (double)(r >> 11) / 9007199254740992.0;
        size_t lo = 0, hi = VOCAB - 1;
        while (lo < hi) { /* the first word whose cumulative weight reaches u */
            size_t mid = (lo + hi) / 2;
            if (cum[mid] < u)
                lo = mid + 1;
            else
                hi = mid;
        }
        char word[24];
        int k = (r & 31) == 0 ? snprintf(word, sizeof word, "%u", (unsigned)(r >> 5) % 100000)
                              : snprintf(word, sizeof word, "%s%s", vocab[lo],
                                         (r & 31) == 1 ? "," : "");
        for (int j = 0; j < k && i < n; j++, line++)
            p[i++] = word[j];
        if (i == n)
            break;
        if (line >= want) {
            p[i++] = nl;
            line = 0;
            want = 40 + (size_t)(xs_next(&x) % 61);
        } else {
            p[i++] = ' ';
            line++;
        }
    }
}

void bigdata_init(struct bigdata *bd, bool quick, double scale)
{
    memset(bd, 0, sizeof *bd);
    size_t max = (size_t)big_mib[NBIGSZ - 1] << 20, tmax = (size_t)tool_mib[NBIGSZ - 1] << 20;
    bd->text = xmalloc(max);
    bd->rnd = xmalloc(max);
    bd->json = xmalloc(tmax);
    fill_text(bd->text, max, 0x5eed, '\n');
    fill_random(bd->rnd, max, 0x5eed);
    fill_text(bd->json, tmax, 0xca11, ' ');
    static const unsigned reps[NBIGSZ] = {5, 3, 2}, reps_q[NBIGSZ] = {3, 2, 1};
    static const unsigned calls[NBIGSZ] = {10, 5, 3}, calls_q[NBIGSZ] = {4, 2, 2};
    for (int i = 0; i < NBIGSZ; i++) {
        bd->reps[i] = scale_u(quick ? reps_q[i] : reps[i], scale);
        bd->tool_calls[i] = scale_u(quick ? calls_q[i] : calls[i], scale);
    }
    bd->stdout_reps = scale_u(quick ? 2 : 3, scale);
    bd->change_reps = scale_u(quick ? 1 : 3, scale);
    /* This VM's pure-Python speed drifts by +-10% over seconds, for python3 as for a block:
     * 2 rounds put the same build at 1.08 and 1.16 in two runs, 8 interleaved rounds of 8
     * at 1.006 (best) and 0.997 (median). */
    bd->py_reps = scale_u(quick ? 3 : 5, scale);
    bd->py_rounds = quick ? 2 : 8;
}

/* The upload archive of one kind and size, built on first use (gzip level 1: only the bench's
 * own build time depends on the level, the server inflates any level at about the same speed). */
const struct blob *bigdata_upload(struct bigdata *bd, int kind, int sz)
{
    struct blob *u = &bd->up[kind][sz];
    if (!u->p) {
        struct member m = {"up.dat", kind == K_TEXT ? bd->text : bd->rnd,
                           (size_t)big_mib[sz] << 20};
        if (make_targz_level(&m, 1, 1, u) < 0)
            return NULL;
    }
    return u;
}

const struct blob *bigdata_change(struct bigdata *bd)
{
    if (!bd->change.p) {
        struct member m[CHANGE_FILES];
        char names[CHANGE_FILES][16];
        for (int i = 0; i < CHANGE_FILES; i++) {
            snprintf(names[i], sizeof names[i], "c%02d.txt", i);
            m[i] = (struct member){names[i], bd->text + ((size_t)i << 20), 1u << 20};
        }
        if (make_targz_level(m, CHANGE_FILES, 1, &bd->change) < 0)
            return NULL;
    }
    return &bd->change;
}

void bigdata_free(struct bigdata *bd)
{
    for (int k = 0; k < NKINDS; k++)
        for (int i = 0; i < NBIGSZ; i++)
            free(bd->up[k][i].p);
    free(bd->change.p);
    free(bd->text);
    free(bd->rnd);
    free(bd->json);
}
