/* Checks every relay of a sandbox's frames applies once a frame is
 * decoded (proto/frame.h), whoever relays it: forkboxd's session
 * (session/from_sandbox.c) and `forkbox sandbox` (stream/relay.c). Runs in the
 * process that holds the peer's connection, never in a sandbox. */
#include "proto/relay.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/limits.h"

/* Only a block's tool_call (and a ready pipelined into it) may be large; an
 * output frame holds two capped streams, each at most 6 bytes of JSON per
 * byte (\u00XX). */
uint64_t relay_frame_max(enum relay_phase p, uint64_t output_cap)
{
    switch (p) {
    case RELAY_BETWEEN:
        return SANDBOX_SMALL_FRAME_MAX; /* ready, log */
    case RELAY_RUNNING:
        return CHAN_MAX_MESSAGE_BYTES; /* tool_call, log, done, a late ready */
    case RELAY_WANT_OUTPUT:
        return 2 * 6 * (output_cap + OUTPUT_NOTE_ALLOWANCE) + 256;
    case RELAY_WANT_SNAPSHOT:
        return 0;
    }
    return 0;
}

uint64_t relay_items_max(enum relay_phase p)
{
    switch (p) {
    case RELAY_RUNNING:
        return FRAME_MAX_ITEMS;
    case RELAY_WANT_OUTPUT:
        return SANDBOX_OUTPUT_ITEMS;
    default:
        return SANDBOX_READY_ITEMS;
    }
}

/* Structural limits per kind, once the kind is known (a log frame needs a
 * handful of items, not millions). NULL if f fits, else why not. */
const char *relay_frame_misfit(const struct frame *f, uint64_t items)
{
    switch (f->kind) {
    case FRAME_LOG:
        if (items > SANDBOX_LOG_ITEMS || frame_get(f, "msg")->str_bytes > SANDBOX_LOG_MSG_MAX ||
            frame_get(f, "level")->str_bytes > 64)
            return "log frame too large";
        return NULL;
    case FRAME_DONE:
    case FRAME_OUTPUT:
        return items > SANDBOX_OUTPUT_ITEMS ? "frame has unexpected members" : NULL;
    case FRAME_READY:
        return items > SANDBOX_READY_ITEMS ? "ready frame too large" : NULL;
    default:
        return NULL;
    }
}

/* The 4 hex digits at p (already checked by the scanner). */
static unsigned hex4(const char *p)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k];
        v = v << 4 | (unsigned)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
}

/* One unit (a character or an escape) of the JSON string text p[i..n):
 * its length in the text, and in *dec its decoded length in UTF-8 bytes
 * (a lone surrogate escape: 3). The text was scanned: it is valid. */
static size_t json_unit(const char *p, size_t i, size_t n, uint64_t *dec)
{
    uint8_t c = (uint8_t)p[i];
    if (c != '\\') {
        size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        *dec = k;
        return k;
    }
    if (p[i + 1] != 'u') {
        *dec = 1;
        return 2;
    }
    unsigned u = hex4(p + i + 2);
    if (u >= 0xD800 && u <= 0xDBFF && i + 12 <= n && p[i + 6] == '\\' && p[i + 7] == 'u') {
        unsigned v = hex4(p + i + 8);
        if (v >= 0xDC00 && v <= 0xDFFF) {
            *dec = 4;
            return 12;
        }
    }
    *dec = u < 0x80 ? 1 : u < 0x800 ? 2 : 3;
    return 6;
}

/* Whether 8 bytes at p hold a '\\' or a byte with its top bit set. */
static inline bool plain_stop(const char *p)
{
    uint64_t w, ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    memcpy(&w, p, 8);
    uint64_t b = w ^ (ones * '\\');
    return (((b - ones) & ~b) | w) & highs;
}

/* Hold one stream of an output frame to --output-cap: if the string decodes
 * to more than cap (plus the sandbox's own notes), keep its first and last
 * cap/2 bytes, cut between characters, with a note between, as the sandbox
 * itself does. 1 if the field was cut, 0 if it fits, -ENOMEM. */
int relay_cap_stream(struct frame *f, const char *name, uint64_t cap)
{
    const struct frame_field *fld = frame_get(f, name);
    if (fld->str_bytes <= cap + OUTPUT_NOTE_ALLOWANCE)
        return 0;
    const char *t = fld->json;
    size_t n = fld->len - 1; /* the closing quote */
    uint64_t total = fld->str_bytes, head = cap / 2, dec = 0, dec_head = 0;
    size_t head_end = 0, tail_start = n;
    for (size_t i = 1; i < n;) {
        /* A run of plain ASCII decodes byte for byte: crossed in bulk. */
        size_t j = i;
        while (j + 8 <= n && !plain_stop(t + j))
            j += 8;
        while (j < n && t[j] != '\\' && (uint8_t)t[j] < 0x80)
            j++;
        if (j > i) {
            uint64_t k = j - i, skip = total - (cap - head) > dec ? total - (cap - head) - dec : 0;
            if (!head_end && dec + k > head) {
                head_end = i + (size_t)(head - dec);
                dec_head = head;
            }
            if (skip <= k) {
                tail_start = i + (size_t)skip;
                dec += skip;
                break;
            }
            dec += k;
            i = j;
            continue;
        }
        uint64_t d;
        size_t k = json_unit(t, i, n, &d);
        if (!head_end && dec + d > head) {
            head_end = i;
            dec_head = dec;
        }
        if (total - dec <= cap - head) {
            tail_start = i;
            break;
        }
        dec += d;
        i += k;
    }
    if (!head_end)
        head_end = tail_start;
    char note[96];
    int nl = snprintf(note, sizeof note, "\\n[forkbox: %" PRIu64 " bytes of %s dropped]\\n",
                      dec - dec_head, name);
    size_t len = 1 + (head_end - 1) + (size_t)nl + (n - tail_start) + 1;
    char *json = malloc(len + 1);
    if (!json)
        return -ENOMEM;
    char *o = json;
    *o++ = '"';
    memcpy(o, t + 1, head_end - 1);
    o += head_end - 1;
    memcpy(o, note, (size_t)nl);
    o += nl;
    memcpy(o, t + tail_start, n - tail_start);
    o += n - tail_start;
    *o++ = '"';
    *o = '\0';
    return frame_set_json(f, name, json, len) < 0 ? -ENOMEM : 1;
}
