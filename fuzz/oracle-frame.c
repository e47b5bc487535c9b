/* The oracle for fuzz-frame: forkbox's frame decoder as it was before the
 * incremental scanner (proto/jscan.c) replaced it: a strict lexer, then cJSON
 * for the grammar, nesting and member list. Kept here only so that the new
 * decoder can be held to the old one's verdict on every input (see
 * fuzz-frame.c); it is not linked into forkboxd.
 *
 * Original description follows.
 *
 * Decoding a message takes four steps:
 *
 *   1. lex_check(): one pass over the raw text that checks every token
 *      strictly (RFC 8259 numbers, string escapes, no raw control characters
 *      in strings, only JSON whitespace) and counts them. Tokens cJSON 1.7.15
 *      cannot read are rewritten, in a copy made on first need, to tokens of
 *      the same length and the same grammatical role, so byte offsets in the
 *      copy and in the original stay identical:
 *        NaN, Infinity, -Infinity        -> "0" + spaces (spec 3.1 "Numbers")
 *        numbers over 63 characters      -> "0" + spaces (cJSON copies numbers
 *                                           into a 64-byte buffer and would
 *                                           stop half way through a big int)
 *        lone UTF-16 surrogate escapes   -> \ufffd (Python's json accepts and
 *                                           emits them; cJSON rejects them)
 *      A bare token must be followed by whitespace, ',', ']', '}' or the end,
 *      so a "0" put in its place cannot merge with a neighbour.
 *   2. cJSON parses the (possibly rewritten) text: the grammar check, nesting
 *      limit (CJSON_NESTING_LIMIT), and the member list with value types.
 *      (Since forkbox's limit went below cJSON's, lex_check also counts
 *      the nesting outside strings against JSCAN_MAX_DEPTH.)
 *   3. obj_next_member() walks the top-level members of the *original* text
 *      in order, yielding each key's and value's byte span; cJSON's child list
 *      has the same order, so the two are zipped. This walk trusts the
 *      structure cJSON just validated but still never reads past the end.
 *   4. Each known field's value span is copied out compactly (whitespace
 *      outside strings dropped). Strings and bare tokens are copied as they
 *      are; only objects and arrays need the compacting loop.
 *
 * Nothing in here recurses on the input, so nesting depth costs no stack. */
#include "oracle-frame.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cleanup.h"
#include "core/utf8.h"
#include "proto/jscan.h"

/* cJSON's parse_number() reads at most this many characters. */
#define CJSON_NUMBER_MAX 63

/* ---------------------------------------------------------------------------
 * Kind and field tables (spec 3.3, in the reference's field order). */

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

static const char *const ready_names[] = {"protocol_version", "python_version", "packages"};
static const char *const run_names[] = {"code"};
static const char *const tool_call_names[] = {"id", "name", "args", "timeout"};
static const char *const tool_result_names[] = {"id", "ok", "value", "error"};
static const char *const log_names[] = {"level", "msg"};
static const char *const done_names[] = {"exit_code"};
static const char *const output_names[] = {"stdout", "stderr", "exit_code"};
static const char *const shutdown_names[] = {NULL}; /* never NULL for callers */

static const struct kind_def kinds[FRAME_KIND_COUNT] = {
    [FRAME_READY] = {"ready", true, 3, ready_names,
                     {{"2", J_INT, J_ANY}, {"\"\"", J_STRING, J_ANY}, {"{}", J_OBJECT, J_ANY}}},
    [FRAME_RUN] = {"run", false, 1, run_names, {{"\"\"", J_ANY, J_STRING}}},
    [FRAME_TOOL_CALL] = {"tool_call", true, 4, tool_call_names,
                         {{"\"\"", J_STRING, J_ANY},
                          {"\"\"", J_STRING, J_ANY},
                          {"{}", J_OBJECT, J_ANY},
                          {"null", J_NUMBER | J_NULL, J_ANY}}},
    [FRAME_TOOL_RESULT] = {"tool_result", false, 4, tool_result_names,
                           {{"\"\"", J_ANY, J_STRING},
                            {"true", J_ANY, J_ANY},
                            {"null", J_ANY, J_ANY},
                            {"null", J_ANY, J_OBJECT | J_NULL}}},
    [FRAME_LOG] = {"log", true, 2, log_names,
                   {{"\"info\"", J_STRING, J_ANY}, {"\"\"", J_STRING, J_ANY}}},
    [FRAME_DONE] = {"done", true, 1, done_names, {{"0", J_INT, J_ANY}}},
    [FRAME_OUTPUT] = {"output", true, 3, output_names,
                      {{"\"\"", J_STRING, J_ANY}, {"\"\"", J_STRING, J_ANY}, {"0", J_INT, J_ANY}}},
    [FRAME_SHUTDOWN] = {"shutdown", false, 0, shutdown_names, {{0}}},
};

static int field_index(enum frame_kind kind, const char *name)
{
    if ((unsigned)kind >= FRAME_KIND_COUNT || !name)
        return -1;
    for (size_t i = 0; i < kinds[kind].n; i++)
        if (strcmp(kinds[kind].names[i], name) == 0)
            return (int)i;
    return -1;
}

/* ---------------------------------------------------------------------------
 * Lexical helpers on raw JSON text. */

static inline bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static inline bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
/* What may follow a number or literal in valid JSON. */
static inline bool is_delim(uint8_t c) { return is_ws(c) || c == ',' || c == ']' || c == '}'; }

static size_t skip_ws(const uint8_t *s, size_t n, size_t i)
{
    while (i < n && is_ws(s[i]))
        i++;
    return i;
}

/* Value of the 4 hex digits at s[i..i+4), or -1. */
static long hex4(const uint8_t *s, size_t n, size_t i)
{
    if (i + 4 > n)
        return -1;
    long v = 0;
    for (size_t k = i; k < i + 4; k++) {
        uint8_t c = s[k];
        int d = is_digit(c) ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v << 4 | d;
    }
    return v;
}

/* Index just past the closing quote of the string opening at s[i], or n if
 * it is unterminated. Only for text already lexed: a quote is the closing
 * one iff an even number of backslashes precedes it. memchr does the
 * scanning, so multi-megabyte strings cost one fast pass. */
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

/* Does the lexed string literal s[a..b) (quotes included) contain the escape
 * \u0000? cJSON hands keys and values over as C strings, which end at such a
 * NUL, so "kind\u0000x" would otherwise be mistaken for "kind". */
static bool string_has_nul(const uint8_t *s, size_t a, size_t b)
{
    for (size_t i = a + 1; i + 1 < b; i++) {
        if (s[i] != '\\')
            continue;
        if (s[i + 1] == 'u' && hex4(s, b, i + 2) == 0)
            return true;
        i++; /* skip the escaped character (a backslash may be it) */
    }
    return false;
}

/* ---------------------------------------------------------------------------
 * Step 1: strict lexical check with same-length rewrites. */

struct lex {
    const uint8_t *s; /* borrowed: the message */
    size_t n;
    uint8_t *copy;    /* owned: rewritten copy, NULL while none was needed */
    size_t items;     /* strings, numbers, literals and containers seen */
};

static int lex_rewrite(struct lex *lx, size_t at, const char *with, size_t len)
{
    if (!lx->copy) {
        lx->copy = malloc(lx->n);
        if (!lx->copy)
            return -ENOMEM;
        memcpy(lx->copy, lx->s, lx->n);
    }
    memcpy(lx->copy + at, with, len);
    return 0;
}

/* Replace the bare token s[a..b) by "0" padded with spaces. */
static int lex_zero(struct lex *lx, size_t a, size_t b)
{
    int r = lex_rewrite(lx, a, "0", 1);
    if (r == 0)
        memset(lx->copy + a + 1, ' ', b - a - 1);
    return r;
}

/* True if 8 bytes hold a '"', a '\\' or a byte below 0x20: the only bytes
 * that end a run of plain string content. Exact (no false negatives), which
 * is all the fast path needs. */
static inline bool swar_special(uint64_t w)
{
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
    uint64_t zq = (q - ones) & ~q, zb = (b - ones) & ~b, lt = (w - ones * 0x20) & ~w;
    return ((zq | zb | lt) & highs) != 0;
}

/* Check the string literal opening at s[*pi]; on success *pi is just past it. */
static int lex_string(struct lex *lx, size_t *pi)
{
    const uint8_t *s = lx->s;
    size_t n = lx->n, i = *pi + 1;
    for (;;) {
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (swar_special(w))
                break;
            i += 8;
        }
        if (i >= n)
            return -EBADMSG; /* unterminated */
        uint8_t c = s[i];
        if (c == '"') {
            *pi = i + 1;
            return 0;
        }
        if (c < 0x20)
            return -EBADMSG; /* raw control character: JSON requires an escape */
        if (c != '\\') {
            i++;
            continue;
        }
        if (i + 1 >= n)
            return -EBADMSG;
        switch (s[i + 1]) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
            i += 2;
            continue;
        case 'u':
            break;
        default:
            return -EBADMSG;
        }
        long u = hex4(s, n, i + 2);
        if (u < 0)
            return -EBADMSG;
        if (u >= 0xD800 && u <= 0xDBFF && i + 8 <= n && s[i + 6] == '\\' && s[i + 7] == 'u') {
            long v = hex4(s, n, i + 8);
            if (v >= 0xDC00 && v <= 0xDFFF) {
                i += 12; /* a proper pair, which cJSON reads itself */
                continue;
            }
        }
        if (u >= 0xD800 && u <= 0xDFFF) {
            int r = lex_rewrite(lx, i + 2, "fffd", 4);
            if (r < 0)
                return r;
        }
        i += 6;
    }
}

/* RFC 8259 number at s[*pi]: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
 * An integer (no fraction, no exponent) has at most JSCAN_MAX_INT_DIGITS
 * digits: added with that limit in proto/jscan.c (Python's json refuses
 * longer ones; found by the frame-diff target). */
static bool lex_number(const uint8_t *s, size_t n, size_t *pi)
{
    size_t i = *pi, first;
    if (i < n && s[i] == '-')
        i++;
    if (i >= n || !is_digit(s[i]))
        return false;
    first = i;
    if (s[i++] != '0')
        while (i < n && is_digit(s[i]))
            i++;
    if (i - first > JSCAN_MAX_INT_DIGITS &&
        !(i < n && (s[i] == '.' || s[i] == 'e' || s[i] == 'E')))
        return false;
    if (i < n && s[i] == '.') {
        if (++i >= n || !is_digit(s[i]))
            return false;
        while (i < n && is_digit(s[i]))
            i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        if (++i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= n || !is_digit(s[i]))
            return false;
        while (i < n && is_digit(s[i]))
            i++;
    }
    *pi = i;
    return true;
}

static const struct literal {
    const char *text;
    size_t len;
    bool rewrite; /* cJSON cannot read it */
} literals[] = {
    {"true", 4, false},  {"false", 5, false},    {"null", 4, false},
    {"NaN", 3, true},    {"Infinity", 8, true},  {"-Infinity", 9, true},
};

static int lex_check(struct lex *lx, const char **why)
{
    const uint8_t *s = lx->s;
    size_t n = lx->n, depth = 0;
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        if (is_ws(c) || c == ',' || c == ':' || c == ']' || c == '}') {
            if ((c == ']' || c == '}') && depth > 0) /* a stray one is cJSON's to refuse */
                depth--;
            i++;
            continue;
        }
        if (++lx->items > FRAME_MAX_ITEMS) {
            *why = "too many JSON values";
            return -EBADMSG;
        }
        if (c == '{' || c == '[') {
            if (++depth > JSCAN_MAX_DEPTH) {
                *why = "JSON nested too deeply";
                return -EBADMSG;
            }
            i++;
            continue;
        }
        if (c == '"') {
            int r = lex_string(lx, &i);
            if (r < 0) {
                *why = r == -ENOMEM ? "out of memory" : "invalid JSON string";
                return r;
            }
            continue;
        }
        size_t start = i;
        bool rewrite = false, found = false;
        for (size_t k = 0; k < sizeof literals / sizeof *literals; k++) {
            const struct literal *l = &literals[k];
            if (n - i >= l->len && memcmp(s + i, l->text, l->len) == 0) {
                i += l->len;
                rewrite = l->rewrite;
                found = true;
                break;
            }
        }
        if (!found) {
            if (!lex_number(s, n, &i)) {
                *why = "invalid JSON token";
                return -EBADMSG;
            }
            rewrite = i - start > CJSON_NUMBER_MAX;
        }
        if (i < n && !is_delim(s[i])) {
            *why = "invalid JSON token";
            return -EBADMSG;
        }
        if (rewrite && lex_zero(lx, start, i) < 0) {
            *why = "out of memory";
            return -ENOMEM;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------
 * Step 3: spans of top-level members in the original text. */

struct span {
    size_t a, b; /* s[a..b) */
};

/* End of the (validated) value starting at s[i]. */
static size_t value_end(const uint8_t *s, size_t n, size_t i)
{
    if (i >= n)
        return n;
    if (s[i] == '"')
        return string_end(s, n, i);
    if (s[i] != '{' && s[i] != '[') {
        while (i < n && !is_delim(s[i]))
            i++;
        return i;
    }
    size_t depth = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c == '"') {
            i = string_end(s, n, i);
            continue;
        }
        if (c == '{' || c == '[')
            depth++;
        else if ((c == '}' || c == ']') && --depth == 0)
            return i + 1;
        i++;
    }
    return n;
}

/* Walk to the next member of the object whose '{' was consumed; *pi is just
 * after '{' or after the previous member's ','. Returns false at '}' or on a
 * mismatch with what cJSON validated (which would be a bug here). */
static bool obj_next_member(const uint8_t *s, size_t n, size_t *pi,
                            struct span *key, struct span *val)
{
    size_t i = skip_ws(s, n, *pi);
    if (i >= n || s[i] != '"')
        return false;
    key->a = i;
    key->b = i = string_end(s, n, i);
    i = skip_ws(s, n, i);
    if (i >= n || s[i] != ':')
        return false;
    val->a = i = skip_ws(s, n, i + 1);
    val->b = i = value_end(s, n, i);
    i = skip_ws(s, n, i);
    if (i >= n || (s[i] != ',' && s[i] != '}'))
        return false;
    *pi = i + 1;
    return true;
}

/* ---------------------------------------------------------------------------
 * Step 4: values. */

/* Allocate the compact text of the value s[a..b). */
static char *compact_copy(const uint8_t *s, size_t a, size_t b, size_t *len)
{
    char *out = malloc(b - a + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    if (s[a] != '{' && s[a] != '[') {
        /* A string or bare token holds no whitespace outside a string. */
        memcpy(out, s + a, b - a);
        o = b - a;
    } else {
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
    }
    out[o] = '\0';
    *len = o;
    return out;
}

/* Parse an integer literal that fits int64 (no fraction, no exponent). */
static bool parse_i64(const uint8_t *s, size_t a, size_t b, int64_t *out)
{
    bool neg = a < b && s[a] == '-';
    size_t i = a + neg;
    if (i >= b)
        return false;
    uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (; i < b; i++) {
        if (!is_digit(s[i]))
            return false;
        unsigned d = s[i] - '0';
        if (v > (lim - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

static bool type_ok(unsigned mask, const cJSON *item, const uint8_t *s, struct span v)
{
    if (mask == J_ANY)
        return true;
    int64_t dummy;
    return ((mask & J_STRING) && cJSON_IsString(item)) ||
           ((mask & J_OBJECT) && cJSON_IsObject(item)) ||
           ((mask & J_NULL) && cJSON_IsNull(item)) ||
           ((mask & J_NUMBER) && cJSON_IsNumber(item)) ||
           ((mask & J_INT) && cJSON_IsNumber(item) && parse_i64(s, v.a, v.b, &dummy));
}

/* ---------------------------------------------------------------------------
 * Decode. */

static void fields_free(struct oracle_field *f)
{
    for (size_t i = 0; i < FRAME_MAX_FIELDS; i++) {
        free(f[i].json);
        f[i].json = NULL;
        f[i].len = 0;
    }
}

static void cjson_deletep(cJSON **p) { cJSON_Delete(*p); }

int oracle_frame_decode(const uint8_t *text, size_t len, enum frame_peer peer,
                        struct oracle_frame *out, const char **why)
{
    static const char *unused;
    if (!why)
        why = &unused;
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r'))
        len--;
    if (len == 0) {
        *why = "empty message";
        return -EBADMSG;
    }
    /* A child's bytes reach the client unchanged; nothing else checks them. */
    if (peer == FRAME_FROM_CHILD && !utf8_valid(text, len)) {
        *why = "invalid UTF-8";
        return -EBADMSG;
    }

    struct lex lx = {.s = text, .n = len};
    _cleanup_free_ uint8_t *copy = NULL;
    int r = lex_check(&lx, why);
    copy = lx.copy;
    if (r < 0)
        return r;

    const char *src = (const char *)(copy ? copy : text), *end = NULL;
    __attribute__((cleanup(cjson_deletep))) cJSON *root =
        cJSON_ParseWithLengthOpts(src, len, &end, false);
    if (!root) {
        *why = "invalid JSON";
        return -EBADMSG;
    }
    if (skip_ws(text, len, (size_t)(end - src)) != len) {
        *why = "trailing data after the JSON value";
        return -EBADMSG;
    }
    if (!cJSON_IsObject(root)) {
        *why = "not a JSON object";
        return -EBADMSG;
    }

    /* Zip cJSON's members with their raw spans. For each kind's fields keep
     * the last occurrence (last duplicate wins) before the kind is known. */
    struct member {
        const cJSON *item;
        struct span v;
    } kind_m = {0}, fm[FRAME_KIND_COUNT][FRAME_MAX_FIELDS] = {{{0}}};
    size_t i = skip_ws(text, len, 0) + 1; /* past '{' */
    for (const cJSON *c = root->child; c; c = c->next) {
        struct span k, v;
        if (!obj_next_member(text, len, &i, &k, &v)) {
            *why = "internal error: member spans disagree with cJSON";
            return -EBADMSG;
        }
        if (strcmp(c->string, "kind") == 0) {
            if (!string_has_nul(text, k.a, k.b))
                kind_m = (struct member){c, v};
            continue;
        }
        bool nul_checked = false;
        for (size_t kd = 0; kd < FRAME_KIND_COUNT; kd++) {
            int fi = field_index((enum frame_kind)kd, c->string);
            if (fi < 0)
                continue;
            if (!nul_checked && string_has_nul(text, k.a, k.b))
                break; /* a key with U+0000 in it is no known field */
            nul_checked = true;
            fm[kd][fi] = (struct member){c, v};
        }
    }

    const cJSON *kj = kind_m.item;
    int kind = -1;
    if (kj && cJSON_IsString(kj) && !string_has_nul(text, kind_m.v.a, kind_m.v.b))
        for (size_t kd = 0; kd < FRAME_KIND_COUNT; kd++)
            if (strcmp(kj->valuestring, kinds[kd].name) == 0)
                kind = (int)kd;
    if (kind < 0) {
        *why = !kj ? "missing kind" : !cJSON_IsString(kj) ? "kind is not a string" : "unknown kind";
        return -EPROTO;
    }
    const struct kind_def *kd = &kinds[kind];
    if (peer == FRAME_FROM_CHILD && !kd->from_child) {
        *why = "kind not accepted from the sandbox";
        return -EPROTO;
    }

    struct oracle_frame f = {.kind = (enum frame_kind)kind};
    for (size_t fi = 0; fi < kd->n; fi++) {
        const struct member *m = &fm[kind][fi];
        if (!m->item)
            continue; /* default filled in below */
        unsigned mask = peer == FRAME_FROM_CHILD ? kd->f[fi].child_type : kd->f[fi].client_type;
        if (!type_ok(mask, m->item, text, m->v)) {
            *why = "field has the wrong type";
            fields_free(f.field);
            return -EPROTO;
        }
        if (peer == FRAME_FROM_CHILD && (mask & J_INT)) {
            int64_t v = 0;
            parse_i64(text, m->v.a, m->v.b, &v); /* checked by type_ok */
            if (kind == FRAME_READY && v != 2) {
                *why = "protocol_version is not 2";
                fields_free(f.field);
                return -EPROTO;
            }
            if (kind == FRAME_DONE || kind == FRAME_OUTPUT)
                f.exit_code = v;
        }
        f.field[fi].json = compact_copy(text, m->v.a, m->v.b, &f.field[fi].len);
        if (!f.field[fi].json) {
            *why = "out of memory";
            fields_free(f.field);
            return -ENOMEM;
        }
    }
    for (size_t fi = 0; fi < kd->n; fi++) {
        if (f.field[fi].json)
            continue;
        f.field[fi].json = strdup(kd->f[fi].def);
        if (!f.field[fi].json) {
            *why = "out of memory";
            fields_free(f.field);
            return -ENOMEM;
        }
        f.field[fi].len = strlen(kd->f[fi].def);
    }
    *out = f;
    return 0;
}


void oracle_frame_free(struct oracle_frame *f)
{
    fields_free(f->field);
}
