/* The JSON frame codec (spec 3), shared by every frame in both directions.
 *
 * Design: the supervisor relays frames, it does not interpret values. A
 * strict scanner (proto/jscan.h) validates each message, as its bytes arrive
 * if the caller wants (frame_scan_*), and finds the top-level members; the
 * value of every field is then kept as its own *compact JSON text*, borrowed
 * from the message when it has no whitespace, else compacted into a copy.
 * Re-encoding concatenates those texts, so values travel byte-exact: large
 * integers, NaN/Infinity (spec 3.1 "Numbers"), strings holding U+0000 and
 * escapes all survive, and nothing is re-escaped. A message that already is
 * its own encoding is flagged canonical and can be relayed as it is.
 *
 * No I/O here: the decoders take (bytes, len) and return a result. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "proto/jscan.h"

enum frame_kind {
    FRAME_READY,
    FRAME_RUN,
    FRAME_TOOL_CALL,
    FRAME_TOOL_RESULT,
    FRAME_LOG,
    FRAME_DONE,
    FRAME_OUTPUT,
    FRAME_SHUTDOWN,
    FRAME_KIND_COUNT
};

/* Who sent the bytes: decides which kinds are accepted and how strict the
 * type checks are. */
enum frame_peer {
    FRAME_FROM_CLIENT, /* spec 3.2: the eight kinds; tool_result.error must be an
                          object or null; run.code must be a string; other
                          fields are not type checked */
    FRAME_FROM_CHILD,  /* only ready, tool_call, log, done, output; every field
                          present must have its spec type (3.3); exit codes must
                          be integers that fit int64; ready.protocol_version == 2 */
};

#define FRAME_MAX_FIELDS 4 /* fields besides "kind" */

/* Most JSON items (strings including keys, numbers, literals, objects,
 * arrays) one message may hold. The scanner allocates nothing per item, but
 * a dense message ("[0,0,0,...", 2 bytes per item) is its slowest input:
 * the ceiling keeps one message to ~70 ms of scanning here, spread over the
 * loop rounds its bytes arrive in; the session sets lower ones per state. */
#define FRAME_MAX_ITEMS (1u << 22)

struct frame_field {
    const char *json;   /* compact JSON text of the value: borrowed from the
                           decoded message, a static default, or `owned` */
    size_t len;
    char *owned;        /* owned copy (a compacted value, frame_set_*), or NULL */
    uint64_t str_bytes; /* a string decoded from a message: its decoded length
                           in UTF-8 bytes (lone surrogates count 3); else 0 */
};

struct frame {
    enum frame_kind kind;
    /* One entry per field of the kind, in the order of frame_field_names();
     * a field missing from the input holds its default's JSON text. */
    struct frame_field field[FRAME_MAX_FIELDS];
    /* Decoded conveniences, valid only for the kinds named: */
    int64_t exit_code; /* done, output (from a child; 0 otherwise) */
    bool canonical;    /* decoded from exactly frame_encode()'s output */
};

/* Incremental decoding: the scanner state for one message. */
#define FRAME_SCAN_KEYS 17 /* "kind" and every field name of every kind */
struct frame_scan {
    struct jscan js;
    struct jscan_value slot[FRAME_SCAN_KEYS];
    uint8_t last; /* the last byte fed (a canonical frame ends in '\n') */
};

/* Field names of a kind, without "kind", in spec table order; *n is set. */
const char *const *frame_field_names(enum frame_kind kind, size_t *n);
const char *frame_kind_name(enum frame_kind kind);

/* Decode one text message (spec 3.2: trailing \r and \n stripped, one JSON
 * value, an object, a known kind, last duplicate key wins, unknown keys
 * dropped, missing keys defaulted). Input from FRAME_FROM_CLIENT must already
 * be valid UTF-8 (the WebSocket layer checks text messages); input from
 * FRAME_FROM_CHILD is checked here, since it is relayed to the client.
 * JSON is read strictly (RFC 8259 plus NaN, Infinity, -Infinity; numbers of
 * any length; lone \udXXX escapes as Python's json allows; no raw control
 * characters in strings; nesting up to 1000, cJSON's limit).
 * Returns 0 and fills *out (release with frame_free), or a negative errno
 * with a static reason in *why (why may be NULL):
 *   -EBADMSG  not JSON, not an object, trailing data, empty, invalid UTF-8
 *             from a child, or more than FRAME_MAX_ITEMS items
 *   -EPROTO   unknown or missing kind, kind not accepted from this peer,
 *             or a field of the wrong type
 *   -ENOMEM
 * *out is untouched on failure. Fields may point into text: text must
 * outlive *out. */
int frame_decode(const uint8_t *text, size_t len, enum frame_peer peer,
                 struct frame *out, const char **why);

/* The same, fed as the message arrives: init, then feed with the bytes so far
 * (text[0..len), the buffer may have moved; each call scans only new bytes),
 * then finish once the message is complete (it may still be mostly unscanned).
 * max_items: 0 for FRAME_MAX_ITEMS, or a lower ceiling. feed returns 0 or
 * -EBADMSG (why set) as soon as the message can no longer be valid; finish
 * returns what frame_decode() does. */
void frame_scan_init(struct frame_scan *fs, enum frame_peer peer, uint64_t max_items);
int frame_scan_feed(struct frame_scan *fs, const uint8_t *text, size_t len, const char **why);
int frame_scan_finish(struct frame_scan *fs, const uint8_t *text, size_t len, enum frame_peer peer,
                      struct frame *out, const char **why);
/* A message that is never held whole (a relay that passes each chunk on as
 * it arrives): feed each chunk with its offset in the message (chunk[0..len)
 * is the message from base on, and follows what was fed before without a
 * gap; nothing of it is read after the call). 0 or -EBADMSG (why set). Then
 * frame_scan_end() once all len bytes are fed: what frame_decode() returns,
 * but the frame is *hollow*: each field's value stayed in the message (json
 * NULL, len its span, str_bytes for strings); kind, exit_code and canonical
 * are set, and a field the message lacks holds its default. frame_encode()
 * refuses a hollow frame (-EINVAL); relay_frame_misfit() can judge it. */
int frame_scan_feed_at(struct frame_scan *fs, const uint8_t *chunk, size_t base, size_t len,
                       const char **why);
int frame_scan_end(struct frame_scan *fs, size_t len, enum frame_peer peer, struct frame *out,
                   const char **why);

/* Append the compact encoding (every field, "kind" last, trailing \n). 0,
 * -ENOBUFS/-ENOMEM from the buffer, or -EINVAL for a hollow frame. */
int frame_encode(const struct frame *f, struct buf *out);
/* frame_encode()'s output cut around the value of field i (an index into
 * f->field): head + that value's JSON text + tail is the whole encoding
 * (appended to head and tail). For a relay that sends a large value from
 * where it already lies instead of copying it. */
int frame_encode_around(const struct frame *f, size_t i, struct buf *head, struct buf *tail);

/* Build a frame from scratch with every field at its default. */
void frame_init(struct frame *f, enum frame_kind kind);
/* Set a field from a C string (escaped with cJSON) or integer. The name must be
 * a field of the kind. 0, -EINVAL (no such field) or -ENOMEM. */
int frame_set_string(struct frame *f, const char *name, const char *value);
/* frame_set_int on "exit_code" of done/output also sets f->exit_code. */
int frame_set_int(struct frame *f, const char *name, int64_t value);
/* Like frame_set_string for a counted string that may hold NUL bytes (written
 * as \u0000); same escaping as cJSON (spec 3.1). value must be UTF-8. */
int frame_set_stringn(struct frame *f, const char *name, const char *value, size_t len);
/* Set a field to JSON text the caller made (json: malloc'd, taken over even on
 * error; must be valid JSON of the field's type). 0 or -EINVAL. */
int frame_set_json(struct frame *f, const char *name, char *json, size_t len);
/* Borrowed JSON text of a field, or NULL if the kind has no such field. */
const struct frame_field *frame_get(const struct frame *f, const char *name);

void frame_free(struct frame *f); /* safe on a zeroed or freed frame */

/* Room enough for any log frame frame_log_write() is given a message of a
 * few hundred bytes for, and what chan_write_log() uses. */
#define FRAME_LOG_MAX 1024

/* The canonical `log` frame {"level":"<level>","msg":"<msg>","kind":"log"}\n
 * written into out[0..room), for a process that must not allocate: the
 * sandbox child before its runtime runs, the runtime before its loop. No
 * malloc, no stdio, no locale: async-signal-safe. level and msg are C
 * strings, escaped as JSON with '"' and '\\' backslashed and the controls
 * below U+0020 as \u00xx; a byte >= 0x80 is written as '?', so the frame is
 * valid UTF-8 whatever the bytes (the supervisor refuses a child's frame that
 * is not). The message is cut, at a whole escape, where the frame would not
 * fit. Returns the frame's length (no NUL is written), or 0 if not even the
 * level fits. */
size_t frame_log_write(char *out, size_t room, const char *level, const char *msg);
