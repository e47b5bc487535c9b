/* Structure-aware mutation of JSON frames (see mutate-json.h). */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "mutate-json.h"
#include "proto/jscan.h"

#define PICK(a) ((a)[mj_rand(rng) % (sizeof(a) / sizeof *(a))])

static const char *const kinds[] = {
    "ready", "run", "tool_call", "tool_result", "log", "done", "output", "shutdown",
    "Run", "run ", "", "tool_results",
};

/* Every field of every kind, the error object's keys, and a few others. */
static const char *const keys[] = {
    "kind",   "protocol_version", "python_version", "packages", "code",      "id",
    "name",   "args",             "timeout",        "ok",       "value",     "error",
    "level",  "msg",              "exit_code",      "stdout",   "stderr",    "type",
    "message", "trace",           "x",              "Kind",     "kind\u00e9", "",
};

/* Values as JSON text: what the reference's json treats specially. */
static const char *const atoms[] = {
    "NaN", "Infinity", "-Infinity", "-0.0", "0", "-0", "1", "-1", "2", "2.0", "1.5e3",
    "1e400", "-1e-400", "1E+2", "9223372036854775807", "9223372036854775808",
    "-9223372036854775809", "18446744073709551616", "true", "false", "null", "\"\"",
    "\"2\"", "\"x\"", "\"\\ud800\"", "\"\\udc00\\ud800\"", "\"\\ud83d\\ude00\"",
    "\"\\u0000\"", "\"h\xc3\xa9\"", "\"\xf0\x9f\x98\x80\"", "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"",
    "\"\\u00e9\\u2028\"", "\"\x7f\"", "[]", "{}", "[1,[2,[3]]]", "{\"a\":1,\"a\":2}",
    "{\"type\":\"E\",\"message\":\"m\",\"trace\":null}", "{\"type\":1,\"message\":[NaN]}",
    "{\"trace\":\"t\"}",
};

/* A random JSON value as a cJSON item (raw where cJSON cannot print it). */
static cJSON *gen_value(uint32_t *rng, int depth)
{
    char *s;
    cJSON *v;
    switch (mj_rand(rng) % 10) {
    case 0: { /* a long integer; one in eight at or just past Python's limit */
        size_t n = mj_rand(rng) % 8 ? 15 + mj_rand(rng) % 30 : 4299 + mj_rand(rng) % 3;
        s = malloc(n + 2);
        if (!s)
            return cJSON_CreateNull();
        s[0] = '-';
        memset(s + 1, '7', n);
        s[n + 1] = '\0';
        v = cJSON_CreateRaw(s + (mj_rand(rng) & 1));
        free(s);
        return v;
    }
    case 1: { /* nesting around the depth limits (forkbox's, JSCAN_MAX_DEPTH; Python's ~993) */
        int n = mj_rand(rng) % 16 ? 1 + (int)(mj_rand(rng) % 20)
                : mj_rand(rng) & 1 ? JSCAN_MAX_DEPTH - 10 + (int)(mj_rand(rng) % 20)
                                   : 985 + (int)(mj_rand(rng) % 20);
        s = malloc(2 * (size_t)n + 1);
        if (!s)
            return cJSON_CreateNull();
        for (int i = 0; i < n; i++) {
            s[i] = '[';
            s[2 * n - 1 - i] = ']';
        }
        s[2 * n] = '\0';
        v = cJSON_CreateRaw(s);
        free(s);
        return v;
    }
    case 2:
        if (depth < 3) {
            v = cJSON_CreateArray();
            for (uint32_t i = mj_rand(rng) % 4; i > 0; i--)
                cJSON_AddItemToArray(v, gen_value(rng, depth + 1));
            return v;
        }
        /* fall through */
    case 3:
        if (depth < 3) {
            v = cJSON_CreateObject();
            for (uint32_t i = mj_rand(rng) % 4; i > 0; i--)
                cJSON_AddItemToObject(v, PICK(keys), gen_value(rng, depth + 1));
            return v;
        }
        /* fall through */
    case 4:
        return cJSON_CreateString(PICK(kinds));
    case 5: {
        char num[32];
        snprintf(num, sizeof num, "%d", (int)(mj_rand(rng) % 600) - 300);
        return cJSON_CreateRaw(num);
    }
    default:
        return cJSON_CreateRaw(PICK(atoms));
    }
}

/* The i-th member of an object, or NULL. */
static cJSON *member(cJSON *o, size_t i)
{
    cJSON *c = o->child;
    while (c && i--)
        c = c->next;
    return c;
}

static size_t members(const cJSON *o)
{
    size_t n = 0;
    for (const cJSON *c = o->child; c; c = c->next)
        n++;
    return n;
}

/* A random node of the tree under v (v itself included). */
static cJSON *random_node(cJSON *v, uint32_t *rng)
{
    while ((cJSON_IsArray(v) || cJSON_IsObject(v)) && v->child && mj_rand(rng) % 3)
        v = member(v, mj_rand(rng) % members(v));
    return v;
}

/* node takes nv's value and type in place, keeping its key and its place in
 * its parent's list (cJSON_ReplaceItemViaPointer drops the key and, in
 * cJSON 1.7.15, can leave the list's tail pointing at the freed item). */
static void become(cJSON *node, cJSON *nv)
{
    if (!nv)
        return;
    cJSON_Delete(node->child);
    if (!(node->type & cJSON_IsReference))
        free(node->valuestring);
    node->type = (node->type & cJSON_StringIsConst) | (nv->type & ~cJSON_StringIsConst);
    node->child = nv->child;
    node->valuestring = nv->valuestring;
    node->valueint = nv->valueint;
    node->valuedouble = nv->valuedouble;
    nv->child = NULL;
    nv->valuestring = NULL;
    cJSON_Delete(nv);
}

/* One change to the object root. */
static void mutate_object(cJSON *root, uint32_t *rng)
{
    size_t n = members(root);
    cJSON *m = n ? member(root, mj_rand(rng) % n) : NULL;

    switch (mj_rand(rng) % 9) {
    case 0: /* another kind, or kind of another type */
        cJSON_DeleteItemFromObjectCaseSensitive(root, "kind");
        cJSON_AddItemToObject(root, "kind",
                              mj_rand(rng) % 4 ? cJSON_CreateString(PICK(kinds))
                                               : gen_value(rng, 0));
        break;
    case 1: /* a field set to a new value */
    case 2: {
        const char *k = PICK(keys);
        cJSON_DeleteItemFromObjectCaseSensitive(root, k);
        cJSON_AddItemToObject(root, k, gen_value(rng, 0));
        break;
    }
    case 3: /* a member dropped */
        if (m)
            cJSON_Delete(cJSON_DetachItemViaPointer(root, m));
        break;
    case 4: /* a duplicate key, before or after: the last one wins */
        if (m) {
            cJSON *dup = mj_rand(rng) & 1 ? cJSON_Duplicate(m, true) : gen_value(rng, 0);
            if (dup && mj_rand(rng) & 1) {
                cJSON_AddItemToObject(root, m->string, dup);
            } else if (dup) {
                if (!dup->string) /* a generated value; a duplicate has its key */
                    dup->string = strdup(m->string);
                dup->type &= ~cJSON_StringIsConst;
                cJSON_InsertItemInArray(root, 0, dup);
            }
        }
        break;
    case 5: /* a value, or one deep inside it, replaced */
        if (m)
            become(random_node(m, rng), gen_value(rng, 1));
        break;
    case 6: /* a value wrapped: [v] or {"<key>": v} */
        if (m) {
            cJSON *w = mj_rand(rng) & 1 ? cJSON_CreateArray() : cJSON_CreateObject();
            cJSON *inner = cJSON_Duplicate(m, true);
            if (w && inner) {
                if (cJSON_IsArray(w))
                    cJSON_AddItemToArray(w, inner);
                else
                    cJSON_AddItemToObject(w, PICK(keys), inner);
                become(m, w);
            } else {
                cJSON_Delete(w);
                cJSON_Delete(inner);
            }
        }
        break;
    case 7: /* order: a member moved to the front */
        if (m && n > 1) {
            cJSON_DetachItemViaPointer(root, m);
            cJSON_InsertItemInArray(root, 0, m);
        }
        break;
    default: /* an unknown key */
        cJSON_AddItemToObject(root, "x", gen_value(rng, 0));
        break;
    }
}

/* Byte-level touches that keep the text a frame: an escaped letter in a
 * string (a key "\u006bind"), whitespace, a trailing \r\n. */
static size_t touch_text(char *t, size_t len, size_t max, uint32_t *rng)
{
    switch (mj_rand(rng) % 6) {
    case 0: { /* a letter inside a string as \u00XX */
        size_t at = mj_rand(rng) % (len ? len : 1), i;
        bool in = false;
        for (i = 0; i < len; i++) {
            if (t[i] == '\\') {
                i++;
                continue;
            }
            if (t[i] == '"')
                in = !in;
            else if (in && i >= at && t[i] >= 'a' && t[i] <= 'z')
                break;
        }
        if (i >= len || len + 5 > max)
            return len;
        char esc[7];
        snprintf(esc, sizeof esc, "\\u%04x", (unsigned char)t[i]);
        memmove(t + i + 6, t + i + 1, len - i - 1);
        memcpy(t + i, esc, 6);
        return len + 5;
    }
    case 1: { /* trailing line ends, as the spec strips them */
        static const char *const tails[] = {"\n", "\r\n", "\n\r\n\r", " \n", "\n\n"};
        const char *tail = PICK(tails);
        size_t k = strlen(tail);
        if (len + k > max)
            return len;
        memcpy(t + len, tail, k);
        return len + k;
    }
    case 2: { /* whitespace after a ':' or ',' */
        for (size_t tries = 0; tries < 8; tries++) {
            size_t i = mj_rand(rng) % (len ? len : 1);
            if ((t[i] == ':' || t[i] == ',') && len + 1 <= max) {
                memmove(t + i + 2, t + i + 1, len - i - 1);
                t[i + 1] = " \t\n\r"[mj_rand(rng) % 4];
                return len + 1;
            }
        }
        return len;
    }
    case 3: { /* leading whitespace (fuzz-frame.c also cuts by the first byte) */
        if (len + 1 > max)
            return len;
        memmove(t + 1, t, len);
        t[0] = " \t\n\r"[mj_rand(rng) % 4];
        return len + 1;
    }
    default:
        return len;
    }
}

/* Print root into out (max bytes), touched; 0 if it does not fit. */
static size_t print_into(cJSON *root, uint8_t *out, size_t max, uint32_t *rng)
{
    char *t = cJSON_PrintUnformatted(root);
    if (!t)
        return 0;
    size_t len = strlen(t);
    if (len > max) {
        free(t);
        return 0;
    }
    char *buf = malloc(max + 1);
    if (!buf) {
        free(t);
        return 0;
    }
    memcpy(buf, t, len);
    free(t);
    len = touch_text(buf, len, max, rng);
    memcpy(out, buf, len);
    free(buf);
    return len;
}

size_t mj_mutate(uint8_t *data, size_t size, size_t max, uint32_t *rng)
{
    /* One in eight, and whatever cJSON cannot read: libFuzzer's own. */
    cJSON *root = mj_rand(rng) % 8 ? cJSON_ParseWithLength((const char *)data, size) : NULL;
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        if (mj_rand(rng) % 4 == 0) {
            size_t n = mj_new_frame(data, max, rng);
            if (n)
                return n;
        }
        return LLVMFuzzerMutate(data, size, max);
    }
    for (uint32_t k = 1 + mj_rand(rng) % 3; k > 0; k--)
        mutate_object(root, rng);
    size_t n = print_into(root, data, max, rng);
    cJSON_Delete(root);
    return n ? n : LLVMFuzzerMutate(data, size, max);
}

size_t mj_new_frame(uint8_t *out, size_t max, uint32_t *rng)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return 0;
    for (uint32_t k = mj_rand(rng) % 4; k > 0; k--)
        cJSON_AddItemToObject(root, PICK(keys), gen_value(rng, 1));
    cJSON_AddItemToObject(root, "kind", cJSON_CreateString(PICK(kinds)));
    size_t n = print_into(root, out, max, rng);
    cJSON_Delete(root);
    return n;
}

size_t mj_cross(const uint8_t *a, size_t na, const uint8_t *b, size_t nb, uint8_t *out, size_t max,
                uint32_t *rng)
{
    cJSON *ra = cJSON_ParseWithLength((const char *)a, na);
    cJSON *rb = cJSON_ParseWithLength((const char *)b, nb);
    size_t n = 0;
    if (cJSON_IsObject(ra) && cJSON_IsObject(rb) && rb->child) {
        cJSON *m = member(rb, mj_rand(rng) % members(rb));
        cJSON *copy = cJSON_Duplicate(m, true);
        if (copy) {
            cJSON_DeleteItemFromObjectCaseSensitive(ra, m->string);
            cJSON_AddItemToObject(ra, m->string, copy);
            n = print_into(ra, out, max, rng);
        }
    }
    cJSON_Delete(ra);
    cJSON_Delete(rb);
    return n;
}
