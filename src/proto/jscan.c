/* A resumable, strict JSON scanner (see jscan.h).
 *
 * A push-down automaton over bytes: `state` says what the grammar expects
 * next, `tok` which token is open (a string, number or literal may end in a
 * later feed), and a bit stack the kind of each open container. Everything
 * about a value that the frame codec needs is collected on the way: spans,
 * types, whether the value holds whitespace (a compact value can be relayed
 * as it is), and, for top-level keys and strings, their decoded length and
 * first bytes (to match keys and kinds after escapes are decoded, as Python's
 * json does). Nothing here recurses or allocates. */
#include "proto/jscan.h"

#include <errno.h>
#include <string.h>

#include "core/utf8.h"

enum {
    ST_VALUE,          /* a value: at the start, after ':' or after ',' in an array */
    ST_VALUE_OR_CLOSE, /* after '[' */
    ST_KEY_OR_CLOSE,   /* after '{' */
    ST_KEY,            /* after ',' in an object */
    ST_COLON,          /* after a key */
    ST_AFTER,          /* after a value in a container: ',' or its closing bracket */
    ST_END,            /* after the top-level value: whitespace only */
    ST_ERROR,
};

enum { TOK_NONE, TOK_STRING, TOK_NUMBER, TOK_LITERAL };

/* TOK_STRING sub-states */
enum { STR_PLAIN, STR_ESCAPE, STR_HEX };
/* TOK_NUMBER sub-states; the ones marked * may end the number */
enum { N_MINUS, N_ZERO /* * */, N_INT /* * */, N_DOT, N_FRAC /* * */, N_E, N_ESIGN, N_EXP /* * */ };

/* What the open string is, which decides what is collected. */
enum { R_OTHER, R_KEY /* a top-level key */, R_KEY_NESTED, R_VALUE /* a top-level member's value */ };

#define BAD ((size_t)-1)

static inline bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static inline bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

static size_t fail(struct jscan *s, const char *why)
{
    s->state = ST_ERROR;
    s->why = why;
    return BAD;
}

static bool top_is_object(const struct jscan *s) { return s->top.type == JT_OBJECT; }

static bool stack_is_object(const struct jscan *s)
{
    uint32_t d = s->depth - 1;
    return (s->stack[d / 8] >> (d % 8)) & 1;
}

/* ---------------------------------------------------------------- values */

static void value_reset(struct jscan_value *v, size_t a, enum jscan_type type)
{
    *v = (struct jscan_value){.a = a, .type = type, .compact = true, .short_ok = true};
}

/* n more bytes of v's short_, as far as JSCAN_SHORT holds them. */
static void short_append(struct jscan_value *v, const void *p, size_t n)
{
    if (!v->short_ok)
        return;
    if (v->short_len + n > JSCAN_SHORT) {
        v->short_ok = false;
        return;
    }
    memcpy(v->short_ + v->short_len, p, n);
    v->short_len = (uint8_t)(v->short_len + n);
}

/* A top-level member's number: its text in short_ (an exit code is read
 * from there when the message is gone). */
static void number_text(struct jscan *s, const uint8_t *p, size_t n)
{
    if (s->depth == 1 && top_is_object(s))
        short_append(&s->cur, p, n);
}

/* A value starts at buf[i] (first byte c). */
static size_t value_begin(struct jscan *s, uint8_t c, size_t i)
{
    static const struct { char c; const char *text; enum jscan_type type; } lits[] = {
        {'t', "true", JT_TRUE}, {'f', "false", JT_FALSE}, {'n', "null", JT_NULL},
        {'N', "NaN", JT_NAN},   {'I', "Infinity", JT_NAN},
    };
    enum jscan_type type;
    if (c == '{')
        type = JT_OBJECT;
    else if (c == '[')
        type = JT_ARRAY;
    else if (c == '"')
        type = JT_STRING;
    else if (c == '-' || is_digit(c))
        type = JT_NUMBER;
    else {
        type = JT_NONE;
        for (size_t k = 0; k < sizeof lits / sizeof *lits; k++)
            if (c == lits[k].c) {
                type = lits[k].type;
                s->lit = lits[k].text;
            }
        if (type == JT_NONE)
            return fail(s, "invalid JSON token");
    }
    if (s->max_items && ++s->items > s->max_items)
        return fail(s, "too many JSON values");
    if (!s->max_items)
        s->items++;
    if (s->depth == 0) {
        if (s->object_only && type != JT_OBJECT)
            return fail(s, "not a JSON object");
        value_reset(&s->top, s->base + i, type);
    } else if (s->depth == 1 && top_is_object(s)) {
        value_reset(&s->cur, s->base + i, type);
    }

    switch (type) {
    case JT_OBJECT:
    case JT_ARRAY:
        if (s->depth >= JSCAN_MAX_DEPTH)
            return fail(s, "JSON nested too deeply");
        if (type == JT_OBJECT)
            s->stack[s->depth / 8] |= (uint8_t)(1u << (s->depth % 8));
        else
            s->stack[s->depth / 8] &= (uint8_t)~(1u << (s->depth % 8));
        s->depth++;
        s->state = type == JT_OBJECT ? ST_KEY_OR_CLOSE : ST_VALUE_OR_CLOSE;
        return i + 1;
    case JT_STRING:
        s->tok = TOK_STRING;
        s->sub = STR_PLAIN;
        s->role = s->depth == 1 && top_is_object(s) ? R_VALUE : R_OTHER;
        return i + 1;
    case JT_NUMBER:
        s->tok = TOK_NUMBER;
        s->sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        s->digits = c != '-';
        number_text(s, &c, 1);
        return i + 1;
    default:
        s->tok = TOK_LITERAL;
        s->sub = 1; /* bytes of s->lit matched */
        return i + 1;
    }
}

/* The value that began last at this depth ends at `end` (a message offset). */
static void value_end(struct jscan *s, size_t end)
{
    s->tok = TOK_NONE;
    if (s->depth == 0) {
        s->top.b = end;
        s->state = ST_END;
        return;
    }
    if (s->depth == 1 && top_is_object(s)) {
        s->cur.b = end;
        if (s->key_slot >= 0)
            s->slot[s->key_slot] = s->cur;
    }
    s->state = ST_AFTER;
}

/* ---------------------------------------------------------------- strings */

static void emit(struct jscan *s, const void *p, size_t n)
{
    struct jscan_value *v = s->role == R_KEY ? &s->key : s->role == R_VALUE ? &s->cur : NULL;
    if (!v)
        return;
    v->str_bytes += n;
    short_append(v, p, n);
}

/* One code point from an escape, as UTF-8; a lone surrogate as WTF-8. */
static void emit_cp(struct jscan *s, uint32_t u)
{
    uint8_t b[4];
    size_t n;
    if (u < 0x80) {
        b[0] = (uint8_t)u;
        n = 1;
    } else if (u < 0x800) {
        b[0] = (uint8_t)(0xC0 | u >> 6);
        b[1] = (uint8_t)(0x80 | (u & 0x3F));
        n = 2;
    } else if (u < 0x10000) {
        b[0] = (uint8_t)(0xE0 | u >> 12);
        b[1] = (uint8_t)(0x80 | ((u >> 6) & 0x3F));
        b[2] = (uint8_t)(0x80 | (u & 0x3F));
        n = 3;
    } else {
        b[0] = (uint8_t)(0xF0 | u >> 18);
        b[1] = (uint8_t)(0x80 | ((u >> 12) & 0x3F));
        b[2] = (uint8_t)(0x80 | ((u >> 6) & 0x3F));
        b[3] = (uint8_t)(0x80 | (u & 0x3F));
        n = 4;
    }
    emit(s, b, n);
}

/* A high surrogate not followed by a low one stands alone. */
static void flush_high(struct jscan *s)
{
    if (s->high) {
        emit_cp(s, s->high);
        s->high = 0;
    }
}

static void unit(struct jscan *s, uint16_t u)
{
    if (s->high && u >= 0xDC00 && u <= 0xDFFF) {
        emit_cp(s, 0x10000 + (((uint32_t)s->high - 0xD800) << 10) + (u - 0xDC00));
        s->high = 0;
        return;
    }
    flush_high(s);
    if (u >= 0xD800 && u <= 0xDBFF)
        s->high = u;
    else
        emit_cp(s, u);
}

/* True if 8 bytes hold a '"', a '\\', a byte below 0x20 or (if high) one
 * with its top bit set: the bytes that end a run of plain string content.
 * No false negatives; a false positive only sends a word to the byte loop. */
static inline bool swar_special(uint64_t w, bool high)
{
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
    uint64_t zq = (q - ones) & ~q, zb = (b - ones) & ~b, lt = (w - ones * 0x20) & ~w;
    return ((zq | zb | lt | (high ? w : 0)) & highs) != 0;
}

static int hexval(uint8_t c)
{
    return is_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
         : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
}

/* Length of the well-formed UTF-8 sequence at p (n > 0 bytes available), or
 * 0 if it is malformed or cut short (the byte loop then decides which). */
static size_t utf8_seq(const uint8_t *p, size_t n)
{
    uint8_t need, lo, hi;
    if (!utf8_lead(p[0], &need, &lo, &hi) || n < (size_t)need + 1 || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t k = 2; k <= need; k++)
        if ((p[k] & 0xC0) != 0x80)
            return 0;
    return (size_t)need + 1;
}

static size_t scan_string(struct jscan *s, const uint8_t *buf, size_t len, size_t i,
                          bool *closed)
{
    *closed = false;
    while (i < len) {
        if (s->sub == STR_PLAIN && s->u8_need == 0) {
            size_t run = i;
            while (run + 8 <= len) {
                uint64_t w;
                memcpy(&w, buf + run, 8);
                if (swar_special(w, s->check_utf8))
                    break;
                run += 8;
            }
            while (run < len) {
                uint8_t c = buf[run];
                if (c == '"' || c == '\\' || c < 0x20)
                    break;
                if (c >= 0x80 && s->check_utf8) {
                    /* A whole sequence in the buffer is checked here; one
                     * cut by the end of the buffer goes to the byte loop. */
                    size_t k = utf8_seq(buf + run, len - run);
                    if (k == 0)
                        break;
                    run += k;
                    continue;
                }
                run++;
                if (run + 8 <= len) { /* back to words after a special byte */
                    uint64_t w;
                    memcpy(&w, buf + run, 8);
                    if (!swar_special(w, s->check_utf8))
                        run += 8;
                }
            }
            if (run > i) {
                flush_high(s);
                emit(s, buf + i, run - i);
                i = run;
                continue;
            }
        }
        uint8_t c = buf[i];
        switch (s->sub) {
        case STR_PLAIN:
            if (s->u8_need) {
                if (c < s->u8_lo || c > s->u8_hi)
                    return fail(s, "invalid UTF-8");
                s->u8_lo = 0x80;
                s->u8_hi = 0xBF;
                s->u8_need--;
                emit(s, &c, 1);
                i++;
                continue;
            }
            if (c == '"') {
                flush_high(s);
                *closed = true;
                return i + 1;
            }
            if (c == '\\') {
                s->sub = STR_ESCAPE;
                i++;
                continue;
            }
            if (c < 0x20)
                return fail(s, "invalid JSON string");
            /* c >= 0x80 with check_utf8 */
            if (!utf8_lead(c, &s->u8_need, &s->u8_lo, &s->u8_hi))
                return fail(s, "invalid UTF-8");
            flush_high(s);
            emit(s, &c, 1);
            i++;
            continue;
        case STR_ESCAPE: {
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            const char *p = c ? strchr(from, c) : NULL;
            if (c == 'u') {
                s->sub = STR_HEX;
                s->hex = 0;
                s->hex_left = 4;
            } else if (p) {
                flush_high(s);
                emit(s, &to[p - from], 1);
                s->sub = STR_PLAIN;
            } else {
                return fail(s, "invalid JSON string");
            }
            i++;
            continue;
        }
        default: { /* STR_HEX */
            int d = hexval(c);
            if (d < 0)
                return fail(s, "invalid JSON string");
            s->hex = (uint16_t)(s->hex << 4 | d);
            if (--s->hex_left == 0) {
                unit(s, s->hex);
                s->sub = STR_PLAIN;
            }
            i++;
            continue;
        }
        }
    }
    return i; /* the string goes on in a later feed */
}

/* A string (opened by its quote) ended just before `end` (a message offset). */
static void string_end(struct jscan *s, size_t end)
{
    if (s->role == R_KEY || s->role == R_KEY_NESTED) {
        if (s->role == R_KEY) {
            s->key_slot = -1;
            if (s->key.short_ok)
                for (size_t k = 0; k < s->nnames; k++)
                    if (strlen(s->names[k]) == s->key.short_len &&
                        memcmp(s->names[k], s->key.short_, s->key.short_len) == 0)
                        s->key_slot = (int)k;
            /* The order records keys written out verbatim only (an escape
             * always makes the literal longer than what it decodes to). */
            bool verbatim = end - s->key.a - 2 == s->key.str_bytes;
            if (s->members <= JSCAN_ORDER)
                s->order[s->members - 1] = (int8_t)(verbatim ? s->key_slot : -1);
        }
        s->tok = TOK_NONE;
        s->state = ST_COLON;
        return;
    }
    value_end(s, end);
}

/* ---------------------------------------------------------------- numbers */

/* Python's json.loads raises ValueError past the int digit limit. */
static const char too_many_digits[] = "integer of more than 4300 digits";
_Static_assert(JSCAN_MAX_INT_DIGITS == 4300, "too_many_digits names the limit");

static size_t scan_number(struct jscan *s, const uint8_t *buf, size_t len, size_t i)
{
    while (i < len) {
        uint8_t c = buf[i];
        switch (s->sub) {
        case N_MINUS:
            if (c == 'I') { /* -Infinity */
                s->tok = TOK_LITERAL;
                s->lit = "-Infinity";
                s->sub = 2;
                if (s->depth == 0)
                    s->top.type = JT_NAN;
                else if (s->depth == 1 && top_is_object(s))
                    s->cur.type = JT_NAN;
                return i + 1;
            }
            if (!is_digit(c))
                return fail(s, "invalid JSON token");
            s->sub = c == '0' ? N_ZERO : N_INT;
            s->digits = 1;
            break;
        case N_ZERO:
        case N_INT:
        case N_FRAC:
        case N_EXP:
            if (is_digit(c) && s->sub != N_ZERO) {
                size_t from = i;
                do
                    i++;
                while (i < len && is_digit(buf[i]));
                if (s->sub == N_INT)
                    s->digits += i - from;
                number_text(s, buf + from, i - from);
                continue;
            }
            if (c == '.' && s->sub <= N_INT)
                s->sub = N_DOT;
            else if ((c == 'e' || c == 'E') && s->sub != N_EXP)
                s->sub = N_E;
            else {
                bool integer = s->sub <= N_INT;
                if (integer && s->digits > JSCAN_MAX_INT_DIGITS)
                    return fail(s, too_many_digits);
                if (s->depth == 1 && top_is_object(s))
                    s->cur.integer = integer;
                else if (s->depth == 0)
                    s->top.integer = integer;
                value_end(s, s->base + i); /* c is not part of the number */
                return i;
            }
            break;
        case N_DOT:
            if (!is_digit(c))
                return fail(s, "invalid JSON token");
            s->sub = N_FRAC;
            break;
        case N_E:
            if (c == '+' || c == '-') {
                s->sub = N_ESIGN;
                break;
            }
            /* fall through */
        default: /* N_ESIGN */
            if (!is_digit(c))
                return fail(s, "invalid JSON token");
            s->sub = N_EXP;
            break;
        }
        number_text(s, &c, 1);
        i++;
    }
    return i;
}

static size_t scan_literal(struct jscan *s, const uint8_t *buf, size_t len, size_t i)
{
    while (i < len) {
        if (buf[i] != (uint8_t)s->lit[s->sub])
            return fail(s, "invalid JSON token");
        i++;
        if (s->lit[++s->sub] == '\0') {
            value_end(s, s->base + i);
            return i;
        }
    }
    return i;
}

/* ---------------------------------------------------------------- the automaton */

void jscan_init(struct jscan *s, const char *const *names, size_t nnames,
                struct jscan_value *slot, uint64_t max_items, bool check_utf8, bool object_only)
{
    memset(s, 0, offsetof(struct jscan, stack));
    s->names = names;
    s->nnames = nnames;
    s->slot = slot;
    s->max_items = max_items;
    s->check_utf8 = check_utf8;
    s->object_only = object_only;
    s->compact = true;
    s->key_slot = -1;
    s->state = ST_VALUE;
    for (size_t k = 0; k < nnames; k++)
        slot[k] = (struct jscan_value){.type = JT_NONE};
}

/* One byte outside any token: structure and whitespace. */
static size_t scan_structure(struct jscan *s, const uint8_t *buf, size_t len, size_t i)
{
    uint8_t c = buf[i];
    if (is_ws(c)) {
        if (s->state != ST_END) {
            s->compact = false;
            if (s->depth >= 2 && top_is_object(s))
                s->cur.compact = false;
        }
        do
            i++;
        while (i < len && is_ws(buf[i]));
        return i;
    }
    switch (s->state) {
    case ST_VALUE_OR_CLOSE:
        if (c == ']')
            goto close;
        /* fall through */
    case ST_VALUE:
        return value_begin(s, c, i);
    case ST_KEY_OR_CLOSE:
        if (c == '}')
            goto close;
        /* fall through */
    case ST_KEY:
        if (c != '"')
            return fail(s, "invalid JSON");
        if (s->max_items && ++s->items > s->max_items)
            return fail(s, "too many JSON values");
        if (!s->max_items)
            s->items++;
        s->tok = TOK_STRING;
        s->sub = STR_PLAIN;
        if (s->depth == 1) {
            s->role = R_KEY;
            s->members++;
            value_reset(&s->key, s->base + i, JT_STRING);
        } else {
            s->role = R_KEY_NESTED;
        }
        return i + 1;
    case ST_COLON:
        if (c != ':')
            return fail(s, "invalid JSON");
        s->state = ST_VALUE;
        return i + 1;
    case ST_AFTER:
        if (c == ',') {
            s->state = stack_is_object(s) ? ST_KEY : ST_VALUE;
            return i + 1;
        }
        if (c == '}' || c == ']')
            goto close;
        return fail(s, "invalid JSON");
    case ST_END:
        return fail(s, "trailing data after the JSON value");
    default:
        return fail(s, "invalid JSON");
    }
close:
    if ((c == '}') != stack_is_object(s))
        return fail(s, "invalid JSON");
    s->depth--;
    value_end(s, s->base + i + 1);
    return i + 1;
}

int jscan_feed_at(struct jscan *s, const uint8_t *buf, size_t base, size_t len)
{
    if (s->state == ST_ERROR)
        return -EBADMSG;
    if (s->pos < base || s->pos - base > len)
        return -EINVAL; /* the caller skipped or dropped bytes not yet scanned */
    s->base = base;
    size_t i = s->pos - base;
    while (i < len) {
        switch (s->tok) {
        case TOK_STRING: {
            bool closed;
            i = scan_string(s, buf, len, i, &closed);
            if (i != BAD && closed)
                string_end(s, s->base + i);
            break;
        }
        case TOK_NUMBER:
            i = scan_number(s, buf, len, i);
            break;
        case TOK_LITERAL:
            i = scan_literal(s, buf, len, i);
            break;
        default:
            i = scan_structure(s, buf, len, i);
            break;
        }
        if (i == BAD)
            return -EBADMSG;
    }
    s->pos = base + i;
    return 0;
}

int jscan_feed(struct jscan *s, const uint8_t *buf, size_t len)
{
    return jscan_feed_at(s, buf, 0, len);
}

int jscan_end(struct jscan *s, size_t len)
{
    if (s->state == ST_ERROR)
        return -EBADMSG;
    if (s->pos != len)
        return -EINVAL; /* not every byte was fed */
    if (s->tok == TOK_NUMBER && s->sub != N_MINUS && s->sub != N_DOT && s->sub != N_E &&
        s->sub != N_ESIGN) {
        if (s->sub <= N_INT && s->digits > JSCAN_MAX_INT_DIGITS) {
            fail(s, too_many_digits);
            return -EBADMSG;
        }
        if (s->depth == 0)
            s->top.integer = s->sub <= N_INT;
        value_end(s, len);
    }
    if (s->state == ST_END)
        return 0;
    fail(s, s->top.type == JT_NONE ? "empty message" : "invalid JSON");
    return -EBADMSG;
}

int jscan_finish(struct jscan *s, const uint8_t *buf, size_t len)
{
    if (jscan_feed(s, buf, len) < 0)
        return -EBADMSG;
    return jscan_end(s, len);
}
