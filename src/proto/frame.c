/* The JSON frame codec (see frame.h for the design).
 *
 * Decoding is jscan (proto/jscan.h) plus the spec 3.2/3.3 rules on top:
 * the scanner checks the grammar strictly and records, for every key a frame
 * can have (and "kind"), the span and type of the last top-level member with
 * that key, after decoding the key's escapes; this file then picks the kind,
 * applies the per-peer type rules and fills each field with its value's
 * compact JSON text. A compact value (the usual case) is borrowed from the
 * message, not copied; only a value with whitespace in it is compacted into
 * a copy. A message that is already exactly what frame_encode() would write
 * is marked canonical, so a relay can pass its bytes on unchanged.
 *
 * Nothing in here recurses on the input, so nesting depth costs no stack. */
#include "proto/frame.h"

#include "proto/frame_fields.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------
 * Kind and field tables (spec 3.3; the field order is proto/frame_fields.h's). */

enum jtype {              /* type requirements, as a mask of accepted types */
    J_ANY = 0,            /* not checked */
    J_STRING = 1 << 0,
    J_OBJECT = 1 << 1,
    J_NULL = 1 << 2,
    J_NUMBER = 1 << 3,    /* any number, NaN and Infinity included */
    J_INT = 1 << 4,       /* an integer literal (no fraction/exponent) in int64 */
};

struct field_def {
    const char *def;      /* default value as compact JSON text */
    unsigned child_type;  /* mask checked for FRAME_FROM_CHILD */
    unsigned client_type; /* mask checked for FRAME_FROM_CLIENT */
};

struct kind_def {
    const char *name;
    bool from_child;            /* accepted from a sandbox child */
    size_t n;
    const char *const *names;   /* n field names */
    struct field_def f[FRAME_MAX_FIELDS];
};

/* The names come from proto/frame_fields.h, the one place the order is
 * written; defaults and types are set by field index, so they follow a
 * reordering there. */
#define FIELD_NAME(kind, name) #name,
static const char *const ready_names[] = {FRAME_FIELDS_READY(FIELD_NAME)};
static const char *const run_names[] = {FRAME_FIELDS_RUN(FIELD_NAME)};
static const char *const tool_call_names[] = {FRAME_FIELDS_TOOL_CALL(FIELD_NAME)};
static const char *const tool_result_names[] = {FRAME_FIELDS_TOOL_RESULT(FIELD_NAME)};
static const char *const log_names[] = {FRAME_FIELDS_LOG(FIELD_NAME)};
static const char *const done_names[] = {FRAME_FIELDS_DONE(FIELD_NAME)};
static const char *const output_names[] = {FRAME_FIELDS_OUTPUT(FIELD_NAME)};
static const char *const shutdown_names[] = {NULL}; /* never NULL for callers */
#undef FIELD_NAME

_Static_assert(FRAME_FIELD_READY_COUNT <= FRAME_MAX_FIELDS &&
               FRAME_FIELD_RUN_COUNT <= FRAME_MAX_FIELDS &&
               FRAME_FIELD_TOOL_CALL_COUNT <= FRAME_MAX_FIELDS &&
               FRAME_FIELD_TOOL_RESULT_COUNT <= FRAME_MAX_FIELDS &&
               FRAME_FIELD_LOG_COUNT <= FRAME_MAX_FIELDS &&
               FRAME_FIELD_DONE_COUNT <= FRAME_MAX_FIELDS &&
               FRAME_FIELD_OUTPUT_COUNT <= FRAME_MAX_FIELDS && FRAME_FIELD_SHUTDOWN_COUNT == 0,
               "a kind has more fields than struct frame holds");

#define F(kind, name) [FRAME_FIELD_##kind##_##name]
static const struct kind_def kinds[FRAME_KIND_COUNT] = {
    [FRAME_READY] = {"ready", true, FRAME_FIELD_READY_COUNT, ready_names,
                     {F(READY, protocol_version) = {"2", J_INT, J_ANY},
                      F(READY, python_version) = {"\"\"", J_STRING, J_ANY},
                      F(READY, packages) = {"{}", J_OBJECT, J_ANY}}},
    [FRAME_RUN] = {"run", false, FRAME_FIELD_RUN_COUNT, run_names,
                   {F(RUN, code) = {"\"\"", J_ANY, J_STRING}}},
    [FRAME_TOOL_CALL] = {"tool_call", true, FRAME_FIELD_TOOL_CALL_COUNT, tool_call_names,
                         {F(TOOL_CALL, id) = {"\"\"", J_STRING, J_ANY},
                          F(TOOL_CALL, name) = {"\"\"", J_STRING, J_ANY},
                          F(TOOL_CALL, args) = {"{}", J_OBJECT, J_ANY},
                          F(TOOL_CALL, timeout) = {"null", J_NUMBER | J_NULL, J_ANY}}},
    [FRAME_TOOL_RESULT] = {"tool_result", false, FRAME_FIELD_TOOL_RESULT_COUNT, tool_result_names,
                           {F(TOOL_RESULT, id) = {"\"\"", J_ANY, J_STRING},
                            F(TOOL_RESULT, ok) = {"true", J_ANY, J_ANY},
                            F(TOOL_RESULT, value) = {"null", J_ANY, J_ANY},
                            F(TOOL_RESULT, error) = {"null", J_ANY, J_OBJECT | J_NULL}}},
    [FRAME_LOG] = {"log", true, FRAME_FIELD_LOG_COUNT, log_names,
                   {F(LOG, level) = {"\"info\"", J_STRING, J_ANY},
                    F(LOG, msg) = {"\"\"", J_STRING, J_ANY}}},
    [FRAME_DONE] = {"done", true, FRAME_FIELD_DONE_COUNT, done_names,
                    {F(DONE, exit_code) = {"0", J_INT, J_ANY}}},
    [FRAME_OUTPUT] = {"output", true, FRAME_FIELD_OUTPUT_COUNT, output_names,
                      {F(OUTPUT, stdout) = {"\"\"", J_STRING, J_ANY},
                       F(OUTPUT, stderr) = {"\"\"", J_STRING, J_ANY},
                       F(OUTPUT, exit_code) = {"0", J_INT, J_ANY}}},
    [FRAME_SHUTDOWN] = {"shutdown", false, FRAME_FIELD_SHUTDOWN_COUNT, shutdown_names, {{0}}},
};
#undef F

const char *const *frame_field_names(enum frame_kind kind, size_t *n)
{
    if ((unsigned)kind >= FRAME_KIND_COUNT) {
        *n = 0;
        return NULL;
    }
    *n = kinds[kind].n;
    return kinds[kind].names;
}

const char *frame_kind_name(enum frame_kind kind)
{
    return (unsigned)kind < FRAME_KIND_COUNT ? kinds[kind].name : NULL;
}

static int field_index(enum frame_kind kind, const char *name)
{
    if ((unsigned)kind >= FRAME_KIND_COUNT || !name)
        return -1;
    for (size_t i = 0; i < kinds[kind].n; i++)
        if (strcmp(kinds[kind].names[i], name) == 0)
            return (int)i;
    return -1;
}

/* Every key a frame of any kind can have, and "kind" (index 0): the keys the
 * scanner records. Kinds share names ("id", "exit_code"), so the kind can be
 * decided after the scan, wherever "kind" stands in the object. */
static const char *const frame_keys[] = {
    "kind",  "protocol_version", "python_version", "packages", "code",  "id",
    "name",  "args",             "timeout",        "ok",       "value", "error",
    "level", "msg",              "exit_code",      "stdout",   "stderr",
};
#define KEY_KIND 0
_Static_assert(sizeof frame_keys / sizeof *frame_keys == FRAME_SCAN_KEYS, "frame_keys");

static int key_index(const char *name)
{
    for (size_t k = 0; k < FRAME_SCAN_KEYS; k++)
        if (strcmp(frame_keys[k], name) == 0)
            return (int)k;
    return -1;
}

/* ---------------------------------------------------------------------------
 * Values. */

static inline bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Index just past the closing quote of the (already scanned) string literal
 * opening at s[i]: a quote closes it iff an even number of backslashes
 * precedes it. memchr does the scanning. */
static size_t string_end(const uint8_t *s, size_t n, size_t i)
{
    size_t j = i + 1;
    while (j < n) {
        const uint8_t *q = memchr(s + j, '"', n - j);
        if (!q)
            return n;
        size_t k = (size_t)(q - s), bs = 0;
        while (k - bs > i + 1 && s[k - bs - 1] == '\\')
            bs++;
        if (bs % 2 == 0)
            return k + 1;
        j = k + 1;
    }
    return n;
}

/* A copy of the scanned value s[a..b) without whitespace outside strings. */
static char *compact_copy(const uint8_t *s, size_t a, size_t b, size_t *len)
{
    char *out = malloc(b - a + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = a; i < b;) {
        if (s[i] == '"') {
            size_t e = string_end(s, b, i);
            memcpy(out + o, s + i, e - i);
            o += e - i;
            i = e;
        } else if (is_ws(s[i])) {
            i++;
        } else {
            out[o++] = (char)s[i++];
        }
    }
    out[o] = '\0';
    *len = o;
    return out;
}

/* An integer literal s[a..b) that fits int64 (no fraction, no exponent). */
static bool parse_i64(const uint8_t *s, size_t a, size_t b, int64_t *out)
{
    bool neg = a < b && s[a] == '-';
    size_t i = a + neg;
    if (i >= b)
        return false;
    uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (; i < b; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        unsigned d = s[i] - '0';
        if (v > (lim - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

/* A top-level integer member that fits int64, from its text as the scanner
 * kept it (short_: an int64 is at most 20 bytes of text, so a longer one
 * does not fit): the message itself is not needed. */
static bool member_i64(const struct jscan_value *v, int64_t *out)
{
    return v->type == JT_NUMBER && v->integer && v->short_ok &&
           parse_i64((const uint8_t *)v->short_, 0, v->short_len, out);
}

static bool type_ok(unsigned mask, const struct jscan_value *v)
{
    int64_t dummy;
    if (mask == J_ANY)
        return true;
    return ((mask & J_STRING) && v->type == JT_STRING) ||
           ((mask & J_OBJECT) && v->type == JT_OBJECT) ||
           ((mask & J_NULL) && v->type == JT_NULL) ||
           ((mask & J_NUMBER) && (v->type == JT_NUMBER || v->type == JT_NAN)) ||
           ((mask & J_INT) && member_i64(v, &dummy));
}

/* ---------------------------------------------------------------------------
 * Decode. */

static void fields_free(struct frame_field *f)
{
    for (size_t i = 0; i < FRAME_MAX_FIELDS; i++) {
        free(f[i].owned);
        f[i] = (struct frame_field){0};
    }
}

void frame_scan_init(struct frame_scan *fs, enum frame_peer peer, uint64_t max_items)
{
    jscan_init(&fs->js, frame_keys, FRAME_SCAN_KEYS, fs->slot,
               max_items ? max_items : FRAME_MAX_ITEMS, peer == FRAME_FROM_CHILD, true);
    fs->last = 0;
}

int frame_scan_feed(struct frame_scan *fs, const uint8_t *text, size_t len, const char **why)
{
    return frame_scan_feed_at(fs, text, 0, len, why);
}

int frame_scan_feed_at(struct frame_scan *fs, const uint8_t *chunk, size_t base, size_t len,
                       const char **why)
{
    int r = jscan_feed_at(&fs->js, chunk, base, len);
    if (r == -EBADMSG && why)
        *why = fs->js.why;
    else if (r == -EINVAL && why)
        *why = "scanner fed out of order";
    if (r == 0 && len)
        fs->last = chunk[len - 1];
    return r < 0 ? -EBADMSG : 0;
}

/* Is the message exactly frame_encode()'s output: kind's fields in table
 * order, each once, "kind" last, no whitespace, one final '\n'? */
static bool is_canonical(const struct frame_scan *fs, const struct kind_def *kd, size_t len)
{
    const struct jscan *js = &fs->js;
    if (!js->compact || js->members != kd->n + 1 || js->top.b + 1 != len || fs->last != '\n')
        return false;
    for (size_t fi = 0; fi < kd->n; fi++)
        if (js->order[fi] != key_index(kd->names[fi]))
            return false;
    return js->order[kd->n] == KEY_KIND;
}

/* The frame the scanned message is, from what the scanner kept (every byte
 * fed, jscan_end done): its kind, each field's type checked for peer, the
 * ints decoded, canonical; each field present has its span, json NULL. 0 or
 * -EPROTO (why set). */
static int frame_from_scan(const struct frame_scan *fs, size_t len, enum frame_peer peer,
                           struct frame *out, const char **why)
{
    const struct jscan_value *kv = &fs->slot[KEY_KIND];
    int kind = -1;
    if (kv->type == JT_STRING && kv->short_ok)
        for (size_t kd = 0; kd < FRAME_KIND_COUNT; kd++)
            if (strlen(kinds[kd].name) == kv->short_len &&
                memcmp(kinds[kd].name, kv->short_, kv->short_len) == 0)
                kind = (int)kd;
    if (kind < 0) {
        *why = kv->type == JT_NONE     ? "missing kind"
             : kv->type != JT_STRING ? "kind is not a string"
                                     : "unknown kind";
        return -EPROTO;
    }
    const struct kind_def *kd = &kinds[kind];
    if (peer == FRAME_FROM_CHILD && !kd->from_child) {
        *why = "kind not accepted from the sandbox";
        return -EPROTO;
    }

    struct frame f = {.kind = (enum frame_kind)kind, .canonical = is_canonical(fs, kd, len)};
    for (size_t fi = 0; fi < kd->n; fi++) {
        const struct jscan_value *v = &fs->slot[key_index(kd->names[fi])];
        struct frame_field *fld = &f.field[fi];
        if (v->type == JT_NONE) {
            fld->json = kd->f[fi].def;
            fld->len = strlen(kd->f[fi].def);
            continue;
        }
        unsigned mask = peer == FRAME_FROM_CHILD ? kd->f[fi].child_type : kd->f[fi].client_type;
        if (!type_ok(mask, v)) {
            *why = "field has the wrong type";
            return -EPROTO;
        }
        if (peer == FRAME_FROM_CHILD && (mask & J_INT)) {
            int64_t n = 0;
            member_i64(v, &n); /* checked by type_ok */
            if (kind == FRAME_READY && n != 2) {
                *why = "protocol_version is not 2";
                return -EPROTO;
            }
            if (kind == FRAME_DONE || kind == FRAME_OUTPUT)
                f.exit_code = n;
        }
        if (v->type == JT_STRING)
            fld->str_bytes = v->str_bytes;
        fld->len = v->b - v->a;
    }
    *out = f;
    return 0;
}

int frame_scan_end(struct frame_scan *fs, size_t len, enum frame_peer peer, struct frame *out,
                   const char **why)
{
    static const char *unused;
    if (!why)
        why = &unused;
    int r = jscan_end(&fs->js, len);
    if (r < 0) {
        *why = r == -EINVAL ? "message incomplete" : fs->js.why;
        return -EBADMSG;
    }
    return frame_from_scan(fs, len, peer, out, why);
}

int frame_scan_finish(struct frame_scan *fs, const uint8_t *text, size_t len, enum frame_peer peer,
                      struct frame *out, const char **why)
{
    static const char *unused;
    if (!why)
        why = &unused;
    if (frame_scan_feed(fs, text, len, why) < 0)
        return -EBADMSG;
    struct frame f;
    int r = frame_scan_end(fs, len, peer, &f, why);
    if (r < 0)
        return r;
    /* The values, from the message: borrowed where compact, else copied. */
    for (size_t fi = 0; fi < kinds[f.kind].n; fi++) {
        struct frame_field *fld = &f.field[fi];
        const struct jscan_value *v = &fs->slot[key_index(kinds[f.kind].names[fi])];
        if (fld->json) /* a default */
            continue;
        if (v->compact) {
            fld->json = (const char *)text + v->a;
            continue;
        }
        fld->owned = compact_copy(text, v->a, v->b, &fld->len);
        if (!fld->owned) {
            *why = "out of memory";
            fields_free(f.field);
            return -ENOMEM;
        }
        fld->json = fld->owned;
    }
    *out = f;
    return 0;
}

int frame_decode(const uint8_t *text, size_t len, enum frame_peer peer, struct frame *out,
                 const char **why)
{
    struct frame_scan fs;
    frame_scan_init(&fs, peer, 0);
    return frame_scan_finish(&fs, text, len, peer, out, why);
}

/* ---------------------------------------------------------------------------
 * Encode and build. */

/* Encode f into out, leaving out the value of field `skip` (none if it is
 * not a field index); *at is where that value belongs. */
static int encode(const struct frame *f, size_t skip, struct buf *out, size_t *at)
{
    if ((unsigned)f->kind >= FRAME_KIND_COUNT)
        return -EINVAL;
    const struct kind_def *kd = &kinds[f->kind];
    /* {"name":json,...,"kind":"<kind>"}\n, sized first so a 32 MiB output
     * frame is assembled with one allocation. */
    size_t total = 1 + strlen("\"kind\":\"\"}\n") + strlen(kd->name);
    for (size_t i = 0; i < kd->n; i++) {
        if (i != skip && !f->field[i].json)
            return -EINVAL; /* frame_scan_end's: its values stayed in the message */
        total += strlen(kd->names[i]) + 4 + (i == skip ? 0 : f->field[i].len);
    }
    int r = buf_reserve(out, total);
    if (r < 0)
        return r;
    /* The appends below cannot fail: the room is reserved. */
    buf_append(out, "{", 1);
    for (size_t i = 0; i < kd->n; i++) {
        buf_append(out, "\"", 1);
        buf_append(out, kd->names[i], strlen(kd->names[i]));
        buf_append(out, "\":", 2);
        if (i == skip)
            *at = out->len;
        else
            buf_append(out, f->field[i].json, f->field[i].len);
        buf_append(out, ",", 1);
    }
    buf_append(out, "\"kind\":\"", 8);
    buf_append(out, kd->name, strlen(kd->name));
    buf_append(out, "\"}\n", 3);
    return 0;
}

int frame_encode(const struct frame *f, struct buf *out)
{
    return encode(f, SIZE_MAX, out, NULL);
}

int frame_encode_around(const struct frame *f, size_t i, struct buf *head, struct buf *tail)
{
    size_t at = 0;
    if (i >= FRAME_MAX_FIELDS)
        return -EINVAL;
    int r = encode(f, i, head, &at);
    if (r == 0)
        r = buf_append(tail, head->data + at, head->len - at);
    if (r == 0)
        head->len = at;
    return r;
}

void frame_init(struct frame *f, enum frame_kind kind)
{
    *f = (struct frame){.kind = kind};
    if ((unsigned)kind >= FRAME_KIND_COUNT)
        return;
    for (size_t i = 0; i < kinds[kind].n; i++) {
        f->field[i].json = kinds[kind].f[i].def; /* static: nothing to free */
        f->field[i].len = strlen(kinds[kind].f[i].def);
    }
}

static void field_replace(struct frame_field *fld, char *json, size_t len)
{
    free(fld->owned);
    fld->owned = json;
    fld->json = json;
    fld->len = len;
    fld->str_bytes = 0;
}

int frame_set_string(struct frame *f, const char *name, const char *value)
{
    int fi = field_index(f->kind, name);
    if (fi < 0 || !value)
        return -EINVAL;
    /* A reference item: cJSON escapes straight from value, with no copy. */
    cJSON *item = cJSON_CreateStringReference(value);
    if (!item)
        return -ENOMEM;
    /* cJSON prints with the default hooks, i.e. malloc: free() releases it. */
    char *json = cJSON_PrintUnformatted(item);
    cJSON_Delete(item);
    if (!json)
        return -ENOMEM;
    field_replace(&f->field[fi], json, strlen(json));
    return 0;
}

int frame_set_stringn(struct frame *f, const char *name, const char *value, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    int fi = field_index(f->kind, name);
    if (fi < 0 || (!value && len))
        return -EINVAL;
    size_t need = 2;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)value[i];
        need += c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' ||
                c == '\r' || c == '\t' ? 2 : c < 0x20 ? 6 : 1;
    }
    char *json = malloc(need + 1), *o = json;
    if (!json)
        return -ENOMEM;
    *o++ = '"';
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)value[i];
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\b' ? "\\b"
                        : c == '\f' ? "\\f" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t" : NULL;
        if (esc) {
            *o++ = esc[0];
            *o++ = esc[1];
        } else if (c < 0x20) {
            memcpy(o, "\\u00", 4);
            o[4] = hex[c >> 4];
            o[5] = hex[c & 15];
            o += 6;
        } else {
            *o++ = (char)c;
        }
    }
    *o++ = '"';
    *o = '\0';
    field_replace(&f->field[fi], json, need);
    return 0;
}

int frame_set_json(struct frame *f, const char *name, char *json, size_t len)
{
    int fi = field_index(f->kind, name);
    if (fi < 0) {
        free(json);
        return -EINVAL;
    }
    field_replace(&f->field[fi], json, len);
    return 0;
}

int frame_set_int(struct frame *f, const char *name, int64_t value)
{
    int fi = field_index(f->kind, name);
    if (fi < 0)
        return -EINVAL;
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%" PRId64, value);
    char *json = strdup(tmp);
    if (!json)
        return -ENOMEM;
    field_replace(&f->field[fi], json, (size_t)n);
    if ((f->kind == FRAME_DONE || f->kind == FRAME_OUTPUT) && strcmp(name, "exit_code") == 0)
        f->exit_code = value;
    return 0;
}

const struct frame_field *frame_get(const struct frame *f, const char *name)
{
    int fi = field_index(f->kind, name);
    return fi < 0 ? NULL : &f->field[fi];
}

void frame_free(struct frame *f)
{
    fields_free(f->field);
}

/* ---------------------------------------------------------------------------
 * The allocation-free log writer. */

/* s escaped into out[o..lim) (see frame_log_write); stops before a byte whose
 * escape does not fit. Returns the new o; *rest is where it stopped. */
static size_t log_escape(char *out, size_t o, size_t lim, const char *s, const char **rest)
{
    static const char hex[] = "0123456789abcdef";
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char e[6];
        size_t n = 1;
        if (c == '"' || c == '\\') {
            e[0] = '\\';
            e[1] = (char)c;
            n = 2;
        } else if (c < 0x20) {
            memcpy(e, "\\u00", 4);
            e[4] = hex[c >> 4];
            e[5] = hex[c & 15];
            n = 6;
        } else {
            e[0] = c < 0x80 ? (char)c : '?';
        }
        if (n > lim - o)
            break;
        memcpy(out + o, e, n);
        o += n;
    }
    *rest = s;
    return o;
}

_Static_assert(FRAME_FIELD_LOG_level == 0 && FRAME_FIELD_LOG_msg == 1 && FRAME_FIELD_LOG_COUNT == 2,
               "frame_log_write writes {\"level\":...,\"msg\":...,\"kind\":\"log\"}");

size_t frame_log_write(char *out, size_t room, const char *level, const char *msg)
{
    static const char head[] = "{" FRAME_KEY(level) "\"", mid[] = "\"," FRAME_KEY(msg) "\"",
                      tail[] = "\"," FRAME_TAIL("log");
    const size_t fixed = sizeof head - 1 + sizeof mid - 1 + sizeof tail - 1;
    const char *rest;

    if (room < fixed)
        return 0;
    memcpy(out, head, sizeof head - 1);
    size_t o = log_escape(out, sizeof head - 1, room - (fixed - (sizeof head - 1)), level, &rest);
    if (*rest)
        return 0;
    memcpy(out + o, mid, sizeof mid - 1);
    o = log_escape(out, o + sizeof mid - 1, room - (sizeof tail - 1), msg, &rest);
    memcpy(out + o, tail, sizeof tail - 1);
    return o + sizeof tail - 1;
}
