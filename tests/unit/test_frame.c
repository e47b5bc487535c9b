/* Unit tests for proto/: the frame codec (frame.h) and the channel envelope
 * (chan.h). TAP output. */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/buf.h"
#include "core/limits.h"
#include "proto/chan.h"
#include "proto/frame.h"
#include "proto/jscan.h"
#include "tap.h"

/* ---- helpers ------------------------------------------------------------ */

static int dec(const char *text, enum frame_peer peer, struct frame *f)
{
    const char *why = NULL;
    return frame_decode((const uint8_t *)text, strlen(text), peer, f, &why);
}

/* Decode then encode; returns the encoding (caller frees) or NULL. */
static char *relay_n(const char *text, size_t len, enum frame_peer peer)
{
    struct frame f;
    const char *why = NULL;
    if (frame_decode((const uint8_t *)text, len, peer, &f, &why) < 0)
        return NULL;
    struct buf b;
    buf_init(&b, WS_MAX_MESSAGE_BYTES);
    int r = frame_encode(&f, &b);
    frame_free(&f);
    if (r < 0 || buf_append(&b, "", 1) < 0) {
        buf_free(&b);
        return NULL;
    }
    return (char *)buf_steal(&b, NULL);
}

static char *relay(const char *text, enum frame_peer peer)
{
    return relay_n(text, strlen(text), peer);
}

static void is_relay(const char *in, enum frame_peer peer, const char *want, const char *name)
{
    char *got = relay(in, peer);
    is_str(got, want, "%s", name);
    free(got);
}

static void is_err(const char *in, enum frame_peer peer, int want, const char *name)
{
    struct frame f;
    const char *why = NULL;
    int r = frame_decode((const uint8_t *)in, strlen(in), peer, &f, &why);
    is_int(r, want, "%s (%s)", name, why ? why : "accepted");
    if (r == 0)
        frame_free(&f);
}

static char *encode(const struct frame *f)
{
    struct buf b;
    buf_init(&b, WS_MAX_MESSAGE_BYTES);
    if (frame_encode(f, &b) < 0 || buf_append(&b, "", 1) < 0) {
        buf_free(&b);
        return NULL;
    }
    return (char *)buf_steal(&b, NULL);
}

static bool frames_equal(const struct frame *a, const struct frame *b)
{
    if (a->kind != b->kind || a->exit_code != b->exit_code)
        return false;
    size_t n;
    frame_field_names(a->kind, &n);
    for (size_t i = 0; i < n; i++)
        if (a->field[i].len != b->field[i].len ||
            memcmp(a->field[i].json, b->field[i].json, a->field[i].len) != 0)
            return false;
    return true;
}

/* The JSON text of one field of a decoded message. */
static char *field_of(const char *in, enum frame_peer peer, const char *name)
{
    struct frame f;
    if (dec(in, peer, &f) < 0)
        return NULL;
    const struct frame_field *fld = frame_get(&f, name);
    char *s = fld ? strndup(fld->json, fld->len) : NULL;
    frame_free(&f);
    return s;
}

static void is_field(const char *in, enum frame_peer peer, const char *name,
                     const char *want, const char *what)
{
    char *got = field_of(in, peer, name);
    is_str(got, want, "%s", what);
    free(got);
}

/* ---- tests -------------------------------------------------------------- */

static void test_tables(void)
{
    size_t n;
    const char *const *names = frame_field_names(FRAME_OUTPUT, &n);
    ok(n == 3 && !strcmp(names[0], "stdout") && !strcmp(names[1], "stderr") &&
           !strcmp(names[2], "exit_code"),
       "output field order is the spec's");
    names = frame_field_names(FRAME_TOOL_RESULT, &n);
    ok(n == 4 && !strcmp(names[0], "id") && !strcmp(names[3], "error"), "tool_result fields");
    frame_field_names(FRAME_SHUTDOWN, &n);
    is_int(n, 0, "shutdown has no fields");
    is_str(frame_kind_name(FRAME_TOOL_CALL), "tool_call", "kind name");
    ok(frame_kind_name(FRAME_KIND_COUNT) == NULL, "kind name out of range is NULL");
}

/* Every kind, built with the setters, survives encode -> decode unchanged. */
static void test_round_trip(void)
{
    struct frame f[FRAME_KIND_COUNT];
    for (int k = 0; k < FRAME_KIND_COUNT; k++)
        frame_init(&f[k], (enum frame_kind)k);
    frame_set_string(&f[FRAME_READY], "python_version", "3.13.5");
    frame_set_string(&f[FRAME_RUN], "code", "print('h\xc3\xa9')\n\tx = \"q\\\"\"\n");
    frame_set_string(&f[FRAME_TOOL_CALL], "id", "9b2f");
    frame_set_string(&f[FRAME_TOOL_CALL], "name", "slack.send");
    frame_set_string(&f[FRAME_TOOL_RESULT], "id", "9b2f");
    frame_set_string(&f[FRAME_LOG], "level", "warning");
    frame_set_string(&f[FRAME_LOG], "msg", "low\x01disk");
    frame_set_int(&f[FRAME_DONE], "exit_code", -7);
    frame_set_string(&f[FRAME_OUTPUT], "stdout", "a\nb");
    frame_set_string(&f[FRAME_OUTPUT], "stderr", "\xe2\x80\xa8");
    frame_set_int(&f[FRAME_OUTPUT], "exit_code", INT64_MAX);
    is_int(f[FRAME_DONE].exit_code, -7, "frame_set_int sets exit_code");

    for (int k = 0; k < FRAME_KIND_COUNT; k++) {
        char *e = encode(&f[k]);
        struct frame d;
        int r = e ? dec(e, FRAME_FROM_CLIENT, &d) : -1;
        /* the client path does not decode exit_code; compare it separately */
        if (r == 0)
            d.exit_code = f[k].exit_code;
        ok(r == 0 && frames_equal(&f[k], &d), "round trip (client) %s",
           frame_kind_name(k));
        if (r == 0) {
            char *e2 = encode(&d);
            is_str(e2, e, "re-encoding %s is byte-identical", frame_kind_name(k));
            free(e2);
            frame_free(&d);
        }
        bool child_kind = k != FRAME_RUN && k != FRAME_TOOL_RESULT && k != FRAME_SHUTDOWN;
        if (child_kind) {
            r = e ? dec(e, FRAME_FROM_CHILD, &d) : -1;
            ok(r == 0 && frames_equal(&f[k], &d), "round trip (child) %s", frame_kind_name(k));
            if (r == 0)
                frame_free(&d);
        }
        free(e);
    }
    for (int k = 0; k < FRAME_KIND_COUNT; k++)
        frame_free(&f[k]);
}

static void test_defaults(void)
{
    static const struct {
        const char *in, *want;
    } t[] = {
        {"{\"kind\":\"ready\"}",
         "{\"protocol_version\":2,\"python_version\":\"\",\"packages\":{},\"kind\":\"ready\"}\n"},
        {"{\"kind\":\"run\"}", "{\"code\":\"\",\"kind\":\"run\"}\n"},
        {"{\"kind\":\"tool_call\"}",
         "{\"id\":\"\",\"name\":\"\",\"args\":{},\"timeout\":null,\"kind\":\"tool_call\"}\n"},
        {"{\"kind\":\"tool_result\"}",
         "{\"id\":\"\",\"ok\":true,\"value\":null,\"error\":null,\"kind\":\"tool_result\"}\n"},
        {"{\"kind\":\"log\"}", "{\"level\":\"info\",\"msg\":\"\",\"kind\":\"log\"}\n"},
        {"{\"kind\":\"done\"}", "{\"exit_code\":0,\"kind\":\"done\"}\n"},
        {"{\"kind\":\"output\"}",
         "{\"stdout\":\"\",\"stderr\":\"\",\"exit_code\":0,\"kind\":\"output\"}\n"},
        {"{\"kind\":\"shutdown\"}", "{\"kind\":\"shutdown\"}\n"},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        is_relay(t[i].in, FRAME_FROM_CLIENT, t[i].want, t[i].in);
    /* frame_init gives the same defaults */
    struct frame f;
    frame_init(&f, FRAME_TOOL_RESULT);
    char *e = encode(&f);
    is_str(e, t[3].want, "frame_init defaults");
    free(e);
    frame_free(&f);
    bool cleared = true; /* what makes a second frame_free harmless */
    for (size_t i = 0; i < FRAME_MAX_FIELDS; i++)
        cleared = cleared && !f.field[i].json && !f.field[i].len && !f.field[i].owned;
    ok(cleared, "frame_free clears every field");
    frame_free(&f); /* safe twice (a double free would abort under ASan) */
    struct frame z = {0};
    frame_free(&z); /* safe on zeroed */
    is_relay("{\"kind\":\"tool_result\",\"id\":\"x\"}", FRAME_FROM_CLIENT,
             "{\"id\":\"x\",\"ok\":true,\"value\":null,\"error\":null,\"kind\":\"tool_result\"}\n",
             "spec 3.3: {kind:tool_result,id:x} fills the rest");
}

static void test_byte_exact(void)
{
    const char *in =
        "{\"id\":\"a\",\"ok\":true,\"value\":{\"n\":1180591620717411303424,\"x\":NaN,"
        "\"y\":-Infinity,\"s\":\"a\\u0000b\"},\"error\":null,\"kind\":\"tool_result\"}";
    char *want = malloc(strlen(in) + 2);
    strcpy(want, in);
    strcat(want, "\n");
    is_relay(in, FRAME_FROM_CLIENT, want, "tool_result with 2**70, NaN, -Infinity, \\u0000 is byte-exact");
    free(want);
    is_field(in, FRAME_FROM_CLIENT, "value",
             "{\"n\":1180591620717411303424,\"x\":NaN,\"y\":-Infinity,\"s\":\"a\\u0000b\"}",
             "value text kept verbatim");

    /* the spec 3.3 examples, all in reference order */
    static const char *const ex[] = {
        "{\"id\":\"a1\",\"name\":\"slack.send_message\",\"args\":{\"channel\":\"C1\",\"text\":\"hi\"},\"timeout\":null,\"kind\":\"tool_call\"}\n",
        "{\"id\":\"a1\",\"ok\":true,\"value\":{\"ts\":\"171.2\"},\"error\":null,\"kind\":\"tool_result\"}\n",
        "{\"id\":\"a2\",\"ok\":false,\"value\":null,\"error\":{\"type\":\"ToolNotFound\",\"message\":\"\\\"no tool registered for 'nope'\\\"\",\"trace\":null},\"kind\":\"tool_result\"}\n",
        "{\"level\":\"warning\",\"msg\":\"low disk\",\"kind\":\"log\"}\n",
        "{\"stdout\":\"\",\"stderr\":\"Traceback (most recent call last):\\n ...\\nValueError: bad\\n\",\"exit_code\":1,\"kind\":\"output\"}\n",
        "{\"kind\":\"ready\",\"protocol_version\":2,\"python_version\":\"3.13.5\",\"packages\":{\"yaml\":{\"PyYAML\":\"6.0.2\"}}}\n",
    };
    for (size_t i = 0; i < 5; i++)
        is_relay(ex[i], FRAME_FROM_CLIENT, ex[i], "spec 3.3 example relays unchanged");
    is_relay(ex[5], FRAME_FROM_CHILD,
             "{\"protocol_version\":2,\"python_version\":\"3.13.5\",\"packages\":{\"yaml\":{\"PyYAML\":\"6.0.2\"}},\"kind\":\"ready\"}\n",
             "spec 2.2 ready (kind first) is re-encoded in table order");

    /* numbers cJSON cannot read itself: long integers, huge exponents */
    char big[300] = "{\"kind\":\"tool_result\",\"value\":[";
    for (int i = 0; i < 120; i++)
        strcat(big, i == 0 ? "9" : "0");
    strcat(big, ",-1e400,1.5E+10,-0,0.000001,Infinity]}");
    char *v = field_of(big, FRAME_FROM_CLIENT, "value");
    char want_v[300];
    strcpy(want_v, strstr(big, "["));
    want_v[strlen(want_v) - 1] = '\0'; /* drop the closing '}' */
    is_str(v, want_v, "120-digit integer and friends relayed exactly");
    free(v);

    /* unicode: raw non-ASCII, escapes and surrogate pairs untouched */
    is_field("{\"kind\":\"run\",\"code\":\"h\xc3\xa9 \\u00e9 \\ud83d\\ude00 \\/ \\\\\"}",
             FRAME_FROM_CLIENT, "code", "\"h\xc3\xa9 \\u00e9 \\ud83d\\ude00 \\/ \\\\\"",
             "string escapes kept as sent");
}

static void test_whitespace(void)
{
    is_relay(" \t{ \"kind\" : \"tool_result\" ,\n \"value\" : { \"a\" : [ 1 , 2 , { } ] ,"
             " \"s\" : \"x  y \\\" z\" } , \"id\" :\r\"i\" }  \r\n",
             FRAME_FROM_CLIENT,
             "{\"id\":\"i\",\"ok\":true,\"value\":{\"a\":[1,2,{}],\"s\":\"x  y \\\" z\"},\"error\":null,\"kind\":\"tool_result\"}\n",
             "whitespace outside strings removed, inside kept");
    is_relay("{\"kind\":\"run\",\"code\":\"x\"}", FRAME_FROM_CLIENT,
             "{\"code\":\"x\",\"kind\":\"run\"}\n", "no trailing newline accepted");
    is_relay("{\"kind\":\"run\",\"code\":\"x\"}\n", FRAME_FROM_CLIENT,
             "{\"code\":\"x\",\"kind\":\"run\"}\n", "trailing \\n");
    is_relay("{\"kind\":\"run\",\"code\":\"x\"}\r\n\n\r\r", FRAME_FROM_CLIENT,
             "{\"code\":\"x\",\"kind\":\"run\"}\n", "all trailing \\r and \\n stripped");
}

static void test_keys(void)
{
    is_field("{\"kind\":\"run\",\"code\":\"a\",\"code\":\"b\"}", FRAME_FROM_CLIENT, "code",
             "\"b\"", "duplicate key: last wins");
    is_err("{\"kind\":\"nope\",\"code\":1,\"kind\":\"run\"}", FRAME_FROM_CLIENT, -EPROTO,
           "duplicate kind: last wins, then run.code type checked");
    is_relay("{\"kind\":\"nope\",\"kind\":\"run\"}", FRAME_FROM_CLIENT,
             "{\"code\":\"\",\"kind\":\"run\"}\n", "duplicate kind: last wins");
    is_err("{\"kind\":\"run\",\"kind\":\"nope\"}", FRAME_FROM_CLIENT, -EPROTO,
           "duplicate kind: last (unknown) wins");
    is_relay("{\"extra\":[1,{\"kind\":\"x\"}],\"kind\":\"run\",\"code\":\"x\",\"stdout\":\"y\"}",
             FRAME_FROM_CLIENT, "{\"code\":\"x\",\"kind\":\"run\"}\n",
             "unknown keys dropped (incl. other kinds' fields)");
    is_field("{\"\\u006bind\":\"run\",\"\\u0063ode\":\"y\"}", FRAME_FROM_CLIENT, "code", "\"y\"",
             "escaped keys are decoded like Python does");
    is_field("{\"kind\":\"run\",\"code\\u0000\":\"x\"}", FRAME_FROM_CLIENT, "code", "\"\"",
             "key with \\u0000 is not the field");
    is_err("{\"kind\\u0000\":\"run\"}", FRAME_FROM_CLIENT, -EPROTO, "kind\\u0000 key is not kind");
    is_err("{\"kind\":\"run\\u0000\"}", FRAME_FROM_CLIENT, -EPROTO, "run\\u0000 is not run");
    is_field("{\"kind\":\"run\",\"code\\\\u0000\":\"x\",\"code\":\"z\"}", FRAME_FROM_CLIENT,
             "code", "\"z\"", "escaped backslash before u0000 is not a NUL escape");
}

static void test_errors(void)
{
    struct { const char *in; int err; const char *name; } t[] = {
        {"", -EBADMSG, "empty"},
        {"\r\n\n", -EBADMSG, "only newlines"},
        {"   ", -EBADMSG, "only spaces"},
        {"[]", -EBADMSG, "array"},
        {"\"run\"", -EBADMSG, "string"},
        {"null", -EBADMSG, "null"},
        {"{}", -EPROTO, "no kind"},
        {"{\"kind\":\"nope\"}", -EPROTO, "unknown kind"},
        {"{\"kind\":\"Run\"}", -EPROTO, "kind is case sensitive"},
        {"{\"kind\":1}", -EPROTO, "kind not a string"},
        {"{\"kind\":null}", -EPROTO, "kind null"},
        {"{} {}", -EBADMSG, "two values"},
        {"{\"kind\":\"run\"}{\"kind\":\"run\"}", -EBADMSG, "two values, no space"},
        {"{\"kind\":\"run\"} x", -EBADMSG, "trailing junk"},
        {"{\"kind\":\"run\"", -EBADMSG, "unterminated object"},
        {"{\"kind\":\"run", -EBADMSG, "unterminated string"},
        {"{\"kind\":\"run\",}", -EBADMSG, "trailing comma"},
        {"{\"kind\":\"run\",\"code\":[1,]}", -EBADMSG, "trailing comma in array"},
        {"{'kind':'run'}", -EBADMSG, "single quotes"},
        {"{kind:\"run\"}", -EBADMSG, "bare key"},
        {"{\"kind\" \"run\"}", -EBADMSG, "missing colon"},
        {"{\"kind\":\"run\",\"code\":01}", -EBADMSG, "leading zero"},
        {"{\"kind\":\"run\",\"code\":1.}", -EBADMSG, "1."},
        {"{\"kind\":\"run\",\"code\":.5}", -EBADMSG, ".5"},
        {"{\"kind\":\"run\",\"code\":-}", -EBADMSG, "lone minus"},
        {"{\"kind\":\"run\",\"code\":+1}", -EBADMSG, "plus sign"},
        {"{\"kind\":\"run\",\"code\":1e}", -EBADMSG, "1e"},
        {"{\"kind\":\"run\",\"code\":0x10}", -EBADMSG, "hex"},
        {"{\"kind\":\"run\",\"code\":nan}", -EBADMSG, "nan lowercase"},
        {"{\"kind\":\"run\",\"code\":NaNa}", -EBADMSG, "NaNa"},
        {"{\"kind\":\"run\",\"code\":1NaN}", -EBADMSG, "1NaN"},
        {"{\"kind\":\"run\",\"code\":[1-Infinity]}", -EBADMSG, "1-Infinity"},
        {"{\"kind\":\"run\",\"code\":[Infinity1]}", -EBADMSG, "Infinity1"},
        {"{\"kind\":\"run\",\"code\":[NaN NaN]}", -EBADMSG, "NaN NaN"},
        {"{\"kind\":\"run\",\"code\":+Infinity}", -EBADMSG, "+Infinity"},
        {"{\"kind\":\"run\",\"code\":truex}", -EBADMSG, "truex"},
        {"{\"kind\":\"run\",\"code\":\"a\\qb\"}", -EBADMSG, "bad escape"},
        {"{\"kind\":\"run\",\"code\":\"\\u12G4\"}", -EBADMSG, "bad \\u hex"},
        {"{\"kind\":\"run\",\"code\":\"\\u12\"}", -EBADMSG, "short \\u"},
        {"{\"kind\":\"run\",\"code\":\"a\tb\"}", -EBADMSG, "raw tab in string"},
        {"{\"kind\":\"run\",\"code\":\"a\x01\"}", -EBADMSG, "raw control char in string"},
        {"\xef\xbb\xbf{\"kind\":\"run\"}", -EBADMSG, "UTF-8 BOM"},
        {"{\"kind\":\"run\"}\v", -EBADMSG, "vertical tab is not JSON whitespace"},
        {"{\"kind\":\"run\",\"code\":\"x\"}\\", -EBADMSG, "stray backslash"},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        is_err(t[i].in, FRAME_FROM_CLIENT, t[i].err, t[i].name);

    static const char nul_in[] = "{\"kind\":\"run\"}\0{}";
    struct frame f;
    is_int(frame_decode((const uint8_t *)nul_in, sizeof nul_in - 1, FRAME_FROM_CLIENT, &f, NULL),
           -EBADMSG, "NUL after the value is trailing data (why may be NULL)");
    static const char nul_str[] = "{\"kind\":\"run\",\"code\":\"a\0b\"}";
    is_int(frame_decode((const uint8_t *)nul_str, sizeof nul_str - 1, FRAME_FROM_CLIENT, &f, NULL),
           -EBADMSG, "raw NUL inside a string");

    /* *out untouched on failure */
    memset(&f, 0xA5, sizeof f);
    struct frame copy = f;
    dec("{\"kind\":\"run\",\"code\":5}", FRAME_FROM_CLIENT, &f);
    ok(memcmp(&f, &copy, sizeof f) == 0, "*out untouched on failure");
}

static void test_nan_strings(void)
{
    is_field("{\"kind\":\"run\",\"code\":\"NaN Infinity -Infinity\"}", FRAME_FROM_CLIENT,
             "code", "\"NaN Infinity -Infinity\"", "NaN inside a string untouched");
    is_field("{\"kind\":\"run\",\"code\":\"a\\\"NaN\\\\\"}", FRAME_FROM_CLIENT, "code",
             "\"a\\\"NaN\\\\\"", "NaN after an escaped quote is still inside the string");
    is_field("{\"kind\":\"tool_result\",\"value\":{\"NaN\":[NaN,\"NaN\",Infinity,-Infinity]}}",
             FRAME_FROM_CLIENT, "value", "{\"NaN\":[NaN,\"NaN\",Infinity,-Infinity]}",
             "NaN as key and value");
    is_field("{\"kind\":\"tool_call\",\"timeout\":NaN}", FRAME_FROM_CHILD, "timeout", "NaN",
             "NaN is a number for tool_call.timeout");
}

static void test_surrogates(void)
{
    is_field("{\"kind\":\"output\",\"stdout\":\"a\\udc80b\\ud800\"}", FRAME_FROM_CHILD, "stdout",
             "\"a\\udc80b\\ud800\"", "lone surrogate escapes accepted and kept (spec 9.2)");
    is_field("{\"kind\":\"run\",\"code\":\"\\uD800\\u0041\"}", FRAME_FROM_CLIENT, "code",
             "\"\\uD800\\u0041\"", "high surrogate followed by a non-low escape");
    is_field("{\"kind\":\"run\",\"code\":\"\\ud83d\\ude00\"}", FRAME_FROM_CLIENT, "code",
             "\"\\ud83d\\ude00\"", "surrogate pair");
    is_err("{\"kind\":\"run\",\"code\":\"\\ud800\\uzzzz\"}", FRAME_FROM_CLIENT, -EBADMSG,
           "bad hex after a high surrogate");
}

static void test_child_types(void)
{
    struct { const char *in; int err; const char *name; } t[] = {
        {"{\"kind\":\"run\",\"code\":\"x\"}", -EPROTO, "run not from child"},
        {"{\"kind\":\"tool_result\"}", -EPROTO, "tool_result not from child"},
        {"{\"kind\":\"shutdown\"}", -EPROTO, "shutdown not from child"},
        {"{\"kind\":\"ready\",\"protocol_version\":2,\"python_version\":\"3.13\",\"packages\":{}}", 0, "ready ok"},
        {"{\"kind\":\"ready\",\"protocol_version\":3}", -EPROTO, "protocol_version 3"},
        {"{\"kind\":\"ready\",\"protocol_version\":\"2\"}", -EPROTO, "protocol_version string"},
        {"{\"kind\":\"ready\",\"protocol_version\":2.0}", -EPROTO, "protocol_version 2.0 (child must send an int)"},
        {"{\"kind\":\"ready\",\"protocol_version\":true}", -EPROTO, "protocol_version bool"},
        {"{\"kind\":\"ready\",\"python_version\":3}", -EPROTO, "python_version number"},
        {"{\"kind\":\"ready\",\"packages\":[]}", -EPROTO, "packages array"},
        {"{\"kind\":\"ready\",\"packages\":null}", -EPROTO, "packages null"},
        {"{\"kind\":\"tool_call\",\"id\":\"1\",\"name\":\"n\",\"args\":{\"a\":[1]},\"timeout\":1.5}", 0, "tool_call ok"},
        {"{\"kind\":\"tool_call\",\"id\":1}", -EPROTO, "tool_call id number"},
        {"{\"kind\":\"tool_call\",\"name\":null}", -EPROTO, "tool_call name null"},
        {"{\"kind\":\"tool_call\",\"args\":[]}", -EPROTO, "tool_call args array"},
        {"{\"kind\":\"tool_call\",\"timeout\":\"1\"}", -EPROTO, "tool_call timeout string"},
        {"{\"kind\":\"tool_call\",\"timeout\":false}", -EPROTO, "tool_call timeout bool"},
        {"{\"kind\":\"tool_call\",\"timeout\":null}", 0, "tool_call timeout null"},
        {"{\"kind\":\"log\",\"level\":1}", -EPROTO, "log level number"},
        {"{\"kind\":\"log\",\"msg\":{}}", -EPROTO, "log msg object"},
        {"{\"kind\":\"done\",\"exit_code\":true}", -EPROTO, "exit_code bool"},
        {"{\"kind\":\"done\",\"exit_code\":1.0}", -EPROTO, "exit_code 1.0"},
        {"{\"kind\":\"done\",\"exit_code\":1e2}", -EPROTO, "exit_code 1e2"},
        {"{\"kind\":\"done\",\"exit_code\":\"1\"}", -EPROTO, "exit_code string"},
        {"{\"kind\":\"done\",\"exit_code\":NaN}", -EPROTO, "exit_code NaN"},
        {"{\"kind\":\"done\",\"exit_code\":9223372036854775807}", 0, "exit_code INT64_MAX"},
        {"{\"kind\":\"done\",\"exit_code\":9223372036854775808}", -EPROTO, "exit_code INT64_MAX+1"},
        {"{\"kind\":\"done\",\"exit_code\":-9223372036854775808}", 0, "exit_code INT64_MIN"},
        {"{\"kind\":\"done\",\"exit_code\":-9223372036854775809}", -EPROTO, "exit_code INT64_MIN-1"},
        {"{\"kind\":\"output\",\"stdout\":null}", -EPROTO, "stdout null"},
        {"{\"kind\":\"output\",\"stderr\":[]}", -EPROTO, "stderr array"},
        {"{\"kind\":\"output\",\"exit_code\":\"0\"}", -EPROTO, "output exit_code string"},
        {"{\"kind\":\"log\",\"junk\":[1,2],\"level\":\"debug\"}", 0, "unknown keys not type checked"},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        is_err(t[i].in, FRAME_FROM_CHILD, t[i].err, t[i].name);

    struct frame f;
    ok(dec("{\"kind\":\"done\",\"exit_code\":-9223372036854775808}", FRAME_FROM_CHILD, &f) == 0 &&
           f.exit_code == INT64_MIN, "done.exit_code INT64_MIN decoded");
    frame_free(&f);
    ok(dec("{\"exit_code\":3,\"stdout\":\"\",\"kind\":\"output\",\"exit_code\":-2}", FRAME_FROM_CHILD, &f) == 0 &&
           f.exit_code == -2, "output.exit_code decoded (last duplicate)");
    frame_free(&f);
    ok(dec("{\"kind\":\"done\"}", FRAME_FROM_CHILD, &f) == 0 && f.exit_code == 0,
       "missing exit_code is 0");
    frame_free(&f);
    ok(dec("{\"kind\":\"done\",\"exit_code\":5}", FRAME_FROM_CLIENT, &f) == 0 && f.exit_code == 0,
       "exit_code is only decoded from a child");
    frame_free(&f);

    is_err("{\"kind\":\"log\",\"msg\":\"\xc3\x28\"}", FRAME_FROM_CHILD, -EBADMSG,
           "invalid UTF-8 from a child");
    is_err("{\"kind\":\"log\",\"msg\":\"\xed\xa0\x80\"}", FRAME_FROM_CHILD, -EBADMSG,
           "raw UTF-8 surrogate from a child");
    is_err("{\"kind\":\"log\",\"msg\":\"\xc3\xa9\"}", FRAME_FROM_CHILD, 0, "valid UTF-8 from a child");
}

static void test_client_types(void)
{
    struct { const char *in; int err; const char *name; } t[] = {
        {"{\"kind\":\"tool_result\",\"error\":\"x\"}", -EPROTO, "error string"},
        {"{\"kind\":\"tool_result\",\"error\":[]}", -EPROTO, "error array"},
        {"{\"kind\":\"tool_result\",\"error\":0}", -EPROTO, "error number"},
        {"{\"kind\":\"tool_result\",\"error\":null}", 0, "error null"},
        {"{\"kind\":\"tool_result\",\"ok\":false,\"error\":{\"type\":1}}", 0, "error object (inner unchecked)"},
        {"{\"kind\":\"tool_result\",\"id\":5}", -EPROTO, "id number"},
        {"{\"kind\":\"tool_result\",\"id\":null}", -EPROTO, "id null"},
        {"{\"kind\":\"tool_result\",\"ok\":\"yes\",\"value\":[NaN]}", 0, "ok and value unchecked"},
        {"{\"kind\":\"run\",\"code\":5}", -EPROTO, "run.code number"},
        {"{\"kind\":\"run\",\"code\":null}", -EPROTO, "run.code null"},
        {"{\"kind\":\"tool_call\",\"args\":[],\"timeout\":\"x\"}", 0, "tool_call from client unchecked"},
        {"{\"kind\":\"ready\",\"protocol_version\":\"2\"}", 0, "ready from client unchecked"},
        {"{\"kind\":\"done\",\"exit_code\":1.5}", 0, "done from client unchecked"},
        {"{\"kind\":\"shutdown\",\"extra\":1}", 0, "shutdown"},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        is_err(t[i].in, FRAME_FROM_CLIENT, t[i].err, t[i].name);
}

/* Spec 3.1: escape only ", \ and < U+0020; named escapes where they apply,
 * \u00xx lowercase otherwise; everything else raw (U+007F, U+2028 too). */
static void test_escapes(void)
{
    struct frame f;
    frame_init(&f, FRAME_LOG);
    ok(frame_set_string(&f, "msg", "q\" b\\ \b\f\n\r\t \x01\x1f\x1b \x7f / \xc3\xa9 \xe2\x80\xa8 \xf0\x9f\x98\x80") == 0,
       "set_string");
    is_str(frame_get(&f, "msg")->json,
           "\"q\\\" b\\\\ \\b\\f\\n\\r\\t \\u0001\\u001f\\u001b \x7f / \xc3\xa9 \xe2\x80\xa8 \xf0\x9f\x98\x80\"",
           "cJSON escapes per spec 3.1");
    is_int(frame_get(&f, "msg")->len, strlen(frame_get(&f, "msg")->json), "len matches");

    /* frame_set_stringn is byte-identical to cJSON for every byte value */
    bool same = true;
    for (int c = 1; c < 256 && same; c++) {
        char s[4] = {'a', (char)c, 'z', 0};
        frame_set_string(&f, "msg", s);
        char *a = strdup(frame_get(&f, "msg")->json);
        frame_set_stringn(&f, "msg", s, 3);
        same = !strcmp(a, frame_get(&f, "msg")->json) && frame_get(&f, "msg")->len == strlen(a);
        if (!same)
            printf("# byte 0x%02x: cJSON %s, stringn %s\n", c, a, frame_get(&f, "msg")->json);
        free(a);
    }
    ok(same, "frame_set_stringn matches cJSON for bytes 1..255");
    ok(frame_set_stringn(&f, "msg", "a\0b", 3) == 0, "set_stringn with NUL");
    is_str(frame_get(&f, "msg")->json, "\"a\\u0000b\"", "NUL written as \\u0000");
    ok(frame_set_stringn(&f, "msg", NULL, 0) == 0, "set_stringn empty");
    is_str(frame_get(&f, "msg")->json, "\"\"", "empty string");

    is_int(frame_set_string(&f, "stdout", "x"), -EINVAL, "set_string: field of another kind");
    is_int(frame_set_int(&f, "nope", 1), -EINVAL, "set_int: no such field");
    ok(frame_get(&f, "kind") == NULL, "frame_get(kind) is NULL");
    frame_free(&f);

    /* decode(escaped) gives back the same text */
    frame_init(&f, FRAME_OUTPUT);
    frame_set_string(&f, "stdout", "\x01\"\\\n");
    char *e = encode(&f);
    is_str(e, "{\"stdout\":\"\\u0001\\\"\\\\\\n\",\"stderr\":\"\",\"exit_code\":0,\"kind\":\"output\"}\n",
           "encoded output frame");
    char *r = relay(e, FRAME_FROM_CHILD);
    is_str(r, e, "escaped output relays unchanged");
    free(e);
    free(r);
    frame_free(&f);
}

static void test_nesting(void)
{
    char deep[4200] = "{\"kind\":\"tool_result\",\"value\":";
    size_t n = strlen(deep);
    for (int i = 0; i < 2000; i++)
        deep[n++] = '[';
    for (int i = 0; i < 2000; i++)
        deep[n++] = ']';
    deep[n++] = '}';
    deep[n] = 0;
    is_err(deep, FRAME_FROM_CLIENT, -EBADMSG, "2000-deep nesting rejected");

    /* The limit counts the frame's own object: a value may nest one level
     * less, from either peer. */
    for (int extra = 0; extra < 2; extra++) {
        char *edge = malloc(2 * JSCAN_MAX_DEPTH + 64);
        n = (size_t)sprintf(edge, "{\"kind\":\"tool_call\",\"args\":{\"a\":");
        for (int i = 0; i < JSCAN_MAX_DEPTH - 2 + extra; i++)
            edge[n++] = '[';
        for (int i = 0; i < JSCAN_MAX_DEPTH - 2 + extra; i++)
            edge[n++] = ']';
        strcpy(edge + n, "}}");
        struct frame f;
        const char *why = NULL;
        int r = frame_decode((const uint8_t *)edge, strlen(edge), FRAME_FROM_CHILD, &f, &why);
        if (extra == 0) {
            ok(r == 0, "nesting of exactly JSCAN_MAX_DEPTH (%d) accepted", JSCAN_MAX_DEPTH);
            if (r == 0)
                frame_free(&f);
        } else {
            ok(r == -EBADMSG && why && strstr(why, "nested too deeply"),
               "one level more refused: %s", why ? why : "(accepted)");
        }
        free(edge);
    }

    char mid[400] = "{\"kind\":\"tool_result\",\"value\":";
    n = strlen(mid);
    for (int i = 0; i < 100; i++)
        mid[n++] = '[';
    for (int i = 0; i < 100; i++)
        mid[n++] = ']';
    mid[n] = 0;
    char *want = strdup(mid + strlen("{\"kind\":\"tool_result\",\"value\":"));
    mid[n++] = '}';
    mid[n] = 0;
    is_field(mid, FRAME_FROM_CLIENT, "value", want, "100-deep nesting relayed");
    free(want);
}

/* Python's json (the reference, the host) refuses an integer literal of more
 * than 4300 digits (sys.int_info.default_max_str_digits); a float of any
 * length is fine. Found by fuzz/fuzz-frame-diff.c: forkbox ended a turn on a
 * shutdown the reference ignores as undecodable. */
static void test_int_digits(void)
{
    static char m[6000];
    const char *pre = "{\"kind\":\"shutdown\",\"x\":";
    struct {
        const char *sign;
        int digits;
        const char *tail;
        int want;
        const char *name;
    } c[] = {
        {"", 4300, "", 0, "4300-digit integer accepted"},
        {"-", 4300, "", 0, "-4300-digit integer accepted (the sign is no digit)"},
        {"", 4301, "", -EBADMSG, "4301-digit integer refused, as Python's json does"},
        {"-", 4301, "", -EBADMSG, "-4301-digit integer refused"},
        {"", 4301, ".5", 0, "4301 digits with a fraction is a float: accepted"},
        {"", 4301, "e1", 0, "4301 digits with an exponent is a float: accepted"},
    };
    for (size_t k = 0; k < sizeof c / sizeof *c; k++) {
        size_t n = (size_t)sprintf(m, "%s%s", pre, c[k].sign);
        memset(m + n, '7', (size_t)c[k].digits);
        sprintf(m + n + c[k].digits, "%s}", c[k].tail);
        is_err(m, FRAME_FROM_CLIENT, c[k].want, c[k].name);
        is_err(m, FRAME_FROM_CHILD, c[k].want == 0 ? -EPROTO : c[k].want, c[k].name);
    }
    /* in pieces: the count survives feeds that cut the number */
    struct frame_scan fs;
    const char *why = NULL;
    size_t n = (size_t)sprintf(m, "%s", pre);
    memset(m + n, '7', 4301);
    strcpy(m + n + 4301, "}");
    frame_scan_init(&fs, FRAME_FROM_CLIENT, 0);
    int r = 0;
    for (size_t have = 1; have <= strlen(m) && r == 0; have += 97)
        r = frame_scan_feed(&fs, (const uint8_t *)m, have, &why);
    if (r == 0)
        r = frame_scan_feed(&fs, (const uint8_t *)m, strlen(m), &why);
    ok(r == -EBADMSG, "4301 digits fed in pieces refused (%s)", why ? why : "accepted");
}

static void test_large(void)
{
    /* Two 16 MiB strings in one output frame, through set/encode/decode. */
    const size_t big = 16 * MiB;
    char *s = malloc(big + 1);
    for (size_t i = 0; i < big; i++)
        s[i] = "abc\xc3\xa9\n\"\\xyz     "[i % 16]; /* 16 bytes, 3 to escape */
    s[big] = 0;
    struct frame f;
    frame_init(&f, FRAME_OUTPUT);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int r1 = frame_set_string(&f, "stdout", s);
    int r2 = frame_set_stringn(&f, "stderr", s, big);
    char *e = encode(&f);
    struct frame d;
    int r3 = e ? dec(e, FRAME_FROM_CHILD, &d) : -1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    ok(r1 == 0 && r2 == 0 && e && r3 == 0, "2 x 16 MiB output frame set, encoded, decoded");
    if (r3 == 0) {
        ok(frames_equal(&f, &d), "large frame round trip");
        ok(d.field[0].len == big + big / 16 * 3 + 2, "escaped length");
        frame_free(&d);
    }
    printf("# 2 x 16 MiB set+encode+decode: %.3f s\n", secs);
    ok(secs < 10, "large frame in reasonable time");
    free(e);
    free(s);
    frame_free(&f);

    /* too many items: "[0,0,...]" */
    size_t items = FRAME_MAX_ITEMS + 1;
    size_t len = strlen("{\"kind\":\"tool_result\",\"value\":[]}") + 2 * items;
    char *m = malloc(len + 1);
    size_t o = (size_t)sprintf(m, "{\"kind\":\"tool_result\",\"value\":[");
    for (size_t i = 0; i < items - 4; i++) { /* -4: kind, its value, the object, value key... */
        m[o++] = '0';
        m[o++] = ',';
    }
    m[o - 1] = ']';
    m[o++] = '}';
    m[o] = 0;
    const char *why = NULL;
    struct frame g;
    int r = frame_decode((const uint8_t *)m, o, FRAME_FROM_CLIENT, &g, &why);
    is_int(r, -EBADMSG, "more than FRAME_MAX_ITEMS items rejected (%s)", why ? why : "");
    /* just under the limit is fine */
    size_t cut = o - 20; /* drop a few zeros */
    while (m[cut] != ',')
        cut--;
    m[cut] = ']';
    m[cut + 1] = '}';
    r = frame_decode((const uint8_t *)m, cut + 2, FRAME_FROM_CLIENT, &g, &why);
    is_int(r, 0, "just under FRAME_MAX_ITEMS accepted");
    if (r == 0)
        frame_free(&g);
    free(m);
}

static void test_encode_limits(void)
{
    struct frame f;
    frame_init(&f, FRAME_RUN);
    frame_set_string(&f, "code", "print(1)");
    struct buf b;
    buf_init(&b, 10);
    buf_append(&b, "xy", 2);
    is_int(frame_encode(&f, &b), -ENOBUFS, "encode into a too-small buffer");
    is_int(b.len, 2, "buffer unchanged on -ENOBUFS");
    buf_free(&b);
    buf_init(&b, 1024);
    buf_append(&b, "xy", 2);
    ok(frame_encode(&f, &b) == 0 && b.len == 2 + strlen("{\"code\":\"print(1)\",\"kind\":\"run\"}\n") &&
           memcmp(b.data + 2, "{\"code\":\"print(1)\",\"kind\":\"run\"}\n", b.len - 2) == 0,
       "encode appends");
    buf_free(&b);
    frame_free(&f);
}

/* frame_encode_around: head + the value + tail is frame_encode()'s output,
 * for every field of every kind. */
static void test_encode_around(void)
{
    size_t bad = 0, checked = 0;
    for (int k = 0; k < FRAME_KIND_COUNT; k++) {
        size_t n;
        frame_field_names((enum frame_kind)k, &n);
        struct frame f;
        frame_init(&f, (enum frame_kind)k);
        struct buf whole;
        buf_init(&whole, 1 << 20);
        frame_encode(&f, &whole);
        for (size_t i = 0; i < n; i++) {
            struct buf head, tail;
            buf_init(&head, 1 << 20);
            buf_init(&tail, 1 << 20);
            buf_append(&head, "@", 1); /* appended to, not replaced */
            int r = frame_encode_around(&f, i, &head, &tail);
            bool same = r == 0 && head.len + f.field[i].len + tail.len == whole.len + 1 &&
                        head.data[0] == '@' && memcmp(head.data + 1, whole.data, head.len - 1) == 0 &&
                        memcmp(whole.data + head.len - 1, f.field[i].json, f.field[i].len) == 0 &&
                        memcmp(whole.data + head.len - 1 + f.field[i].len, tail.data, tail.len) == 0;
            bad += !same;
            checked++;
            buf_free(&head);
            buf_free(&tail);
        }
        buf_free(&whole);
        frame_free(&f);
    }
    ok(bad == 0 && checked > 10, "head + value + tail == the encoding (%zu fields)", checked);
}

static void test_chan(void)
{
    uint8_t h[CHAN_HDR_LEN];
    chan_hdr_encode(h, CHAN_WORKSPACE, 0x01020304);
    static const uint8_t want[] = {'W', 0, 0, 0, 4, 3, 2, 1};
    ok(memcmp(h, want, 8) == 0, "header layout: type, 3 zero bytes, LE length");
    enum chan_type t = 0;
    uint32_t len = 0;
    ok(chan_hdr_decode(h, 8, UINT32_MAX, &t, &len) == 1 && t == CHAN_WORKSPACE && len == 0x01020304,
       "decode round trip");
    is_int(chan_hdr_decode(h, 7, UINT32_MAX, &t, &len), 0, "short header: need more");
    is_int(chan_hdr_decode(h, 0, UINT32_MAX, &t, &len), 0, "no bytes: need more");
    is_int(chan_hdr_decode(h, 8, 0x01020303, &t, &len), -EMSGSIZE, "over max");
    ok(chan_hdr_decode(h, 8, 0x01020304, &t, &len) == 1, "exactly max");
    uint8_t bad[8];
    memcpy(bad, h, 8);
    bad[0] = 'X';
    is_int(chan_hdr_decode(bad, 8, UINT32_MAX, &t, &len), -EPROTO, "unknown type");
    memcpy(bad, h, 8);
    bad[2] = 1;
    is_int(chan_hdr_decode(bad, 8, UINT32_MAX, &t, &len), -EPROTO, "non-zero padding");
    const enum chan_type all[] = {CHAN_FRAME, CHAN_TOOLS, CHAN_WORKSPACE, CHAN_SNAPSHOT};
    bool good = true;
    for (size_t i = 0; i < 4; i++) {
        chan_hdr_encode(h, all[i], UINT32_MAX);
        good = good && chan_hdr_decode(h, 8, UINT32_MAX, &t, &len) == 1 && t == all[i] &&
               len == UINT32_MAX;
    }
    ok(good, "every type round trips with length UINT32_MAX");
}

/* ------------------------------------------------------------ incremental scanning */

/* Decode `in` fed one byte at a time; the result must equal frame_decode. */
static bool bytewise_same(const char *in, enum frame_peer peer)
{
    size_t n = strlen(in);
    struct frame a, b;
    struct frame_scan *fs = malloc(sizeof *fs);
    const char *why = NULL;
    int ra = frame_decode((const uint8_t *)in, n, peer, &a, NULL), rb = 0;
    frame_scan_init(fs, peer, 0);
    for (size_t i = 1; i <= n && rb == 0; i++)
        rb = frame_scan_feed(fs, (const uint8_t *)in, i, &why);
    if (rb == 0)
        rb = frame_scan_finish(fs, (const uint8_t *)in, n, peer, &b, &why);
    free(fs);
    if (ra != rb && !(ra == -EBADMSG && rb == -EBADMSG))
        return false;
    if (ra < 0)
        return true;
    bool same = frames_equal(&a, &b) && a.canonical == b.canonical;
    frame_free(&a);
    frame_free(&b);
    return same;
}

static void test_scan_chunked(void)
{
    static const char *const in[] = {
        "{\"kind\":\"run\",\"code\":\"print(1)\"}\n",
        " \t{ \"kind\" : \"tool_result\" ,\n \"value\" : { \"a\" : [ 1 , 2.5e-3 , { } ] } , \"id\" :\r\"i\" }  \r\n",
        "{\"id\":\"x\",\"name\":\"n\",\"args\":{\"n\":-Infinity,\"m\":[NaN,Infinity,-0.0]},\"timeout\":null,\"kind\":\"tool_call\"}\n",
        "{\"stdout\":\"h\xc3\xa9 \\u00e9 \\ud83d\\ude00 \\ud800 \xf0\x9f\x98\x80\",\"stderr\":\"\",\"exit_code\":3,\"kind\":\"output\"}\n",
        "{\"kind\":\"done\",\"exit_code\":-9223372036854775808}",
        "{\"kind\":\"run\",\"code\":\"a\\qb\"}",
        "{\"kind\":\"run\",\"code\":01}",
        "{\"kind\":\"run\"} x",
        "{\"level\":\"info\",\"msg\":\"x\",\"kind\":\"log\",\"level\":\"error\"}\n",
    };
    for (size_t i = 0; i < sizeof in / sizeof *in; i++) {
        ok(bytewise_same(in[i], FRAME_FROM_CLIENT), "byte by byte = whole, client #%zu", i);
        ok(bytewise_same(in[i], FRAME_FROM_CHILD), "byte by byte = whole, child #%zu", i);
    }
}

/* A message never held whole: each byte in a buffer of its own, freed once
 * fed, then frame_scan_end. The verdict, kind, exit code, canonical flag and
 * string lengths are the whole decode's; the values stay in the message. */
static void test_scan_streamed(void)
{
    static const char *const in[] = {
        "{\"stdout\":\"h\xc3\xa9 \\u00e9\",\"stderr\":\"\",\"exit_code\":-3,\"kind\":\"output\"}\n",
        "{\"id\":\"x\",\"name\":\"n\",\"args\":{\"a\":[1,2]},\"timeout\":null,\"kind\":\"tool_call\"}\n",
        "{\"kind\":\"done\", \"exit_code\" : 9223372036854775807 }",
        "{\"kind\":\"done\",\"exit_code\":9223372036854775808}",
        "{\"kind\":\"done\",\"exit_code\":00}",
        "{\"protocol_version\":2.0,\"kind\":\"ready\"}",
    };
    static const int want[] = {0, 0, 0, -EPROTO, -EBADMSG, -EPROTO};
    for (size_t i = 0; i < sizeof in / sizeof *in; i++) {
        size_t n = strlen(in[i]);
        struct frame whole, st;
        int rw = frame_decode((const uint8_t *)in[i], n, FRAME_FROM_CHILD, &whole, NULL);
        struct frame_scan fs;
        frame_scan_init(&fs, FRAME_FROM_CHILD, 0);
        int r = 0;
        for (size_t k = 0; k < n && r == 0; k++) {
            uint8_t *one = malloc(1);
            *one = (uint8_t)in[i][k];
            r = frame_scan_feed_at(&fs, one, k, 1, NULL);
            free(one);
        }
        if (r == 0)
            r = frame_scan_end(&fs, n, FRAME_FROM_CHILD, &st, NULL);
        ok(r == rw && r == want[i], "streamed #%zu: %d, whole %d", i, r, rw);
        if (r < 0 || rw < 0)
            continue;
        bool same = st.kind == whole.kind && st.exit_code == whole.exit_code &&
                    st.canonical == whole.canonical;
        for (size_t f = 0; f < FRAME_MAX_FIELDS; f++)
            same = same && st.field[f].str_bytes == whole.field[f].str_bytes;
        ok(same, "streamed #%zu: kind, exit code, canonical, lengths as whole", i);
        struct buf b;
        buf_init(&b, 1 << 20);
        is_int(frame_encode(&st, &b), -EINVAL, "a hollow frame is not encoded");
        buf_free(&b);
        frame_free(&st);
        frame_free(&whole);
    }
    struct frame_scan fs;
    frame_scan_init(&fs, FRAME_FROM_CHILD, 0);
    frame_scan_feed_at(&fs, (const uint8_t *)"{\"kind\"", 0, 7, NULL);
    is_int(frame_scan_feed_at(&fs, (const uint8_t *)":", 8, 1, NULL), -EBADMSG,
           "a gap between chunks is refused");
}

static void test_scan_canonical(void)
{
    struct { const char *in; bool canonical; const char *name; } t[] = {
        {"{\"code\":\"x\",\"kind\":\"run\"}\n", true, "run as encoded"},
        {"{\"code\":\"x\",\"kind\":\"run\"}", false, "no final newline"},
        {"{\"code\":\"x\",\"kind\":\"run\"}\n\n", false, "two newlines"},
        {"{\"kind\":\"run\",\"code\":\"x\"}\n", false, "kind first"},
        {"{\"code\":\"x\", \"kind\":\"run\"}\n", false, "a space"},
        {"{\"code\":\"x\",\"kind\":\"run\",\"extra\":1}\n", false, "unknown key"},
        {"{\"code\":\"x\",\"code\":\"y\",\"kind\":\"run\"}\n", false, "duplicate key"},
        {"{\"kind\":\"run\"}\n", false, "missing field"},
        {"{\"id\":\"a\",\"name\":\"b\",\"args\":{\"k\":[1,{\"x\":\"y z\"}]},\"timeout\":null,\"kind\":\"tool_call\"}\n",
         true, "tool_call with nested args"},
        {"{\"id\":\"a\",\"name\":\"b\",\"args\":{\"k\": 1},\"timeout\":null,\"kind\":\"tool_call\"}\n",
         false, "space inside args"},
        {"{\"\\u0063ode\":\"x\",\"kind\":\"run\"}\n", false, "escaped key"},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        struct frame f;
        int r = frame_decode((const uint8_t *)t[i].in, strlen(t[i].in), FRAME_FROM_CLIENT, &f, NULL);
        ok(r == 0 && f.canonical == t[i].canonical, "canonical: %s", t[i].name);
        if (r == 0 && f.canonical) {
            struct buf b;
            buf_init(&b, 1 << 20);
            frame_encode(&f, &b);
            ok(b.len == strlen(t[i].in) && memcmp(b.data, t[i].in, b.len) == 0,
               "canonical %s encodes to its input", t[i].name);
            buf_free(&b);
        }
        if (r == 0)
            frame_free(&f);
    }
    /* a compact value is borrowed, not copied */
    const char *in = "{\"code\":\"x\",\"kind\":\"run\"}\n";
    struct frame f;
    frame_decode((const uint8_t *)in, strlen(in), FRAME_FROM_CLIENT, &f, NULL);
    ok(f.field[0].json == in + 8 && f.field[0].owned == NULL, "compact value borrowed from the message");
    frame_free(&f);
}

static void test_scan_string_bytes(void)
{
    /* decoded UTF-8 length of top-level strings (output caps use it) */
    struct { const char *in; uint64_t bytes; const char *name; } t[] = {
        {"{\"kind\":\"output\",\"stdout\":\"abc\"}", 3, "ascii"},
        {"{\"kind\":\"output\",\"stdout\":\"\\n\\t\\\"\\\\\\/\"}", 5, "short escapes"},
        {"{\"kind\":\"output\",\"stdout\":\"\\u0041\\u00e9\\u20ac\"}", 1 + 2 + 3, "\\u escapes by UTF-8 width"},
        {"{\"kind\":\"output\",\"stdout\":\"\\ud83d\\ude00\"}", 4, "a pair is 4 bytes"},
        {"{\"kind\":\"output\",\"stdout\":\"\\ud800x\\udc00\"}", 3 + 1 + 3, "lone surrogates 3 each"},
        {"{\"kind\":\"output\",\"stdout\":\"\\ud800\\ud800\\udc00\"}", 3 + 4, "high, then a pair"},
        {"{\"kind\":\"output\",\"stdout\":\"\xc3\xa9\xf0\x9f\x98\x80\"}", 6, "raw UTF-8"},
        {"{\"kind\":\"output\",\"stdout\":\"\\u0000\"}", 1, "NUL"},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        struct frame f;
        int r = frame_decode((const uint8_t *)t[i].in, strlen(t[i].in), FRAME_FROM_CHILD, &f, NULL);
        is_int(r == 0 ? (long long)frame_get(&f, "stdout")->str_bytes : -1, (long long)t[i].bytes,
               "str_bytes: %s", t[i].name);
        if (r == 0)
            frame_free(&f);
    }
}

static void test_scan_limits(void)
{
    /* items: 1 object + (key, value) x 2 = 5 */
    const char *in = "{\"kind\":\"done\",\"exit_code\":1}";
    struct frame_scan fs;
    struct frame f;
    frame_scan_init(&fs, FRAME_FROM_CHILD, 5);
    is_int(frame_scan_finish(&fs, (const uint8_t *)in, strlen(in), FRAME_FROM_CHILD, &f, NULL), 0,
           "5 items within a ceiling of 5");
    frame_free(&f);
    frame_scan_init(&fs, FRAME_FROM_CHILD, 4);
    is_int(frame_scan_feed(&fs, (const uint8_t *)in, strlen(in), NULL), -EBADMSG,
           "the 5th item over a ceiling of 4 is refused while feeding");
    /* a non-object is refused at its first byte */
    frame_scan_init(&fs, FRAME_FROM_CHILD, 0);
    is_int(frame_scan_feed(&fs, (const uint8_t *)"[", 1, NULL), -EBADMSG, "'[' refused at once");
    frame_scan_init(&fs, FRAME_FROM_CHILD, 0);
    is_int(frame_scan_feed(&fs, (const uint8_t *)" \"", 2, NULL), -EBADMSG, "'\"' refused at once");
    /* invalid UTF-8 from a child, split across feeds */
    static const char *const bad[] = {
        "{\"kind\":\"log\",\"msg\":\"\xc0\x80\"}",     /* overlong */
        "{\"kind\":\"log\",\"msg\":\"\xed\xa0\x80\"}", /* surrogate */
        "{\"kind\":\"log\",\"msg\":\"\xf4\x90\x80\x80\"}", /* > U+10FFFF */
        "{\"kind\":\"log\",\"msg\":\"\xe2\x82\"}",     /* truncated */
        "{\"kind\":\"log\",\"msg\":\"\x80\"}",         /* stray continuation */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ok(bytewise_same(bad[i], FRAME_FROM_CHILD), "bad UTF-8 #%zu: same verdict byte by byte", i);
        is_int(frame_decode((const uint8_t *)bad[i], strlen(bad[i]), FRAME_FROM_CHILD, &f, NULL),
               -EBADMSG, "bad UTF-8 #%zu refused from a child", i);
    }
}


/* ---- the allocation-free log writer ----------------------------------- */

/* The writer src/sandbox/steps.c had (json_escape + send_log_frame), copied
 * as it was: frame_log_write must write the same bytes. Returns the frame's
 * length; *cut is set when json_escape dropped the end of msg. */
static size_t steps_log_frame(char *buf, size_t room, const char *level, const char *msg,
                              bool *cut)
{
    char esc[600];
    size_t n = 0;
    const char *s = msg;
    for (; *s && n + 7 < sizeof esc; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            esc[n++] = '\\';
            esc[n++] = (char)c;
        } else if (c < 0x20) {
            n += (size_t)snprintf(esc + n, sizeof esc - n, "\\u%04x", c);
        } else {
            esc[n++] = c < 0x80 ? (char)c : '?';
        }
    }
    esc[n] = '\0';
    *cut = *s != '\0';
    return (size_t)snprintf(buf, room, "{\"level\":\"%s\",\"msg\":\"%s\",\"kind\":\"log\"}\n",
                            level, esc);
}

/* The writer src/pyrt/pyrt.c had (send_log_error), for an ASCII message. */
static size_t pyrt_log_frame(char json[1024], const char *msg)
{
    size_t o = 0;
    o += (size_t)snprintf(json, 1024, "{\"level\":\"error\",\"msg\":\"");
    for (const char *p = msg; *p && o < 1024 - 32; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\')
            o += (size_t)snprintf(json + o, 1024 - o, "\\%c", c);
        else if (c < 0x20)
            o += (size_t)snprintf(json + o, 1024 - o, "\\u%04x", c);
        else
            json[o++] = (char)c;
    }
    o += (size_t)snprintf(json + o, 1024 - o, "\",\"kind\":\"log\"}\n");
    return o;
}

/* out[0..len) is a canonical log frame from a child whose msg decodes to
 * want (msg with each byte >= 0x80 as '?', maybe cut: then a prefix). */
static bool log_frame_reads_as(const char *out, size_t len, const char *level, const char *msg,
                               bool may_cut)
{
    struct frame f;
    if (frame_decode((const uint8_t *)out, len, FRAME_FROM_CHILD, &f, NULL) < 0)
        return false;
    bool good = f.kind == FRAME_LOG && f.canonical;
    const struct frame_field *lv = frame_get(&f, "level"), *mv = frame_get(&f, "msg");
    cJSON *l = cJSON_ParseWithLength(lv->json, lv->len);
    cJSON *m = cJSON_ParseWithLength(mv->json, mv->len);
    const char *ls = cJSON_GetStringValue(l), *ms = cJSON_GetStringValue(m);
    good = good && ls && ms && strcmp(ls, level) == 0;
    size_t i = 0;
    for (; good && ms[i]; i++)
        good = msg[i] && ms[i] == ((unsigned char)msg[i] < 0x80 ? msg[i] : '?');
    good = good && (may_cut || msg[i] == '\0');
    cJSON_Delete(l);
    cJSON_Delete(m);
    frame_free(&f);
    return good;
}

static void test_log_write(void)
{
    static const char *const msgs[] = {
        "",
        "sandbox setup: mounts: mount /tools: No such file or directory",
        "quote \" and backslash \\ and slash /",
        "controls \x01\x07\b\t\n\v\f\r\x1b\x1f and DEL \x7f",
        "non-ASCII: caf\xc3\xa9 \xe2\x80\xa8 \xf0\x9f\x98\x80, invalid \xff\xc0\x80",
    };
    static const char *const levels[] = {"error", "warning"};
    char got[FRAME_LOG_MAX], want[FRAME_LOG_MAX];
    bool cut;

    for (size_t l = 0; l < 2; l++)
        for (size_t i = 0; i < sizeof msgs / sizeof *msgs; i++) {
            size_t n = frame_log_write(got, sizeof got, levels[l], msgs[i]);
            size_t w = steps_log_frame(want, sizeof want, levels[l], msgs[i], &cut);
            ok(n == w && memcmp(got, want, n) == 0, "log frame %zu/%s: steps.c's bytes", i,
               levels[l]);
            ok(log_frame_reads_as(got, n, levels[l], msgs[i], false),
               "log frame %zu/%s: canonical, reads back", i, levels[l]);
        }
    /* An ASCII message: the same bytes pyrt.c wrote. */
    size_t n = frame_log_write(got, sizeof got, "error", msgs[3]);
    size_t w = pyrt_log_frame(want, msgs[3]);
    ok(n == w && memcmp(got, want, n) == 0, "log frame: pyrt.c's bytes");

    /* Messages of up to 399 bytes (setup_failed's buffer), any bytes: the
     * same as steps.c's writer whenever that one did not cut the message
     * (its escape buffer holds 592 bytes; FRAME_LOG_MAX holds more). */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    unsigned same = 0, compared = 0, cuts_ok = 0, cuts = 0;
    for (int t = 0; t < 5000; t++) {
        char msg[400];
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t len = x % sizeof msg;
        unsigned mix = (unsigned)(x >> 32) % 4; /* mostly text .. mostly controls */
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            unsigned r = (unsigned)(x >> 24);
            msg[i] = (char)((r & 7) < mix ? 1 + r % 0x1f
                          : (r & 0x30) == 0x30 ? (unsigned char)"\"\\\x80\xe9"[r >> 8 & 3]
                                               : 0x20 + r % 0x5f);
        }
        msg[len] = '\0';
        n = frame_log_write(got, sizeof got, "error", msg);
        w = steps_log_frame(want, sizeof want, "error", msg, &cut);
        if (!cut) {
            compared++;
            same += n == w && memcmp(got, want, n) == 0 &&
                    log_frame_reads_as(got, n, "error", msg, false);
        } else {
            cuts++;
            cuts_ok += n <= sizeof got && log_frame_reads_as(got, n, "error", msg, true);
        }
    }
    ok(compared > 2000 && same == compared, "random messages: steps.c's bytes (%u of %u)", same,
       compared);
    ok(cuts > 100 && cuts_ok == cuts, "random messages steps.c cut: fit, canonical (%u of %u)",
       cuts_ok, cuts);

    /* Cut where the room ends, at a whole escape; too little room: 0. */
    for (size_t room = 0; room <= 80; room++) {
        char small[80];
        n = frame_log_write(small, room, "error", "ab\ncd\"ef");
        if (room < strlen("{\"level\":\"error\",\"msg\":\"\",\"kind\":\"log\"}\n"))
            ok(n == 0, "room %zu: nothing written", room);
        else
            ok(n <= room && log_frame_reads_as(small, n, "error", "ab\ncd\"ef", true),
               "room %zu: %zu bytes, a canonical log frame", room, n);
    }
    n = frame_log_write(got, sizeof got, "error", "ab\ncd\"ef");
    is_int(n, 54, "whole message at 54 bytes (\\n as \\u000a, as steps.c wrote it)");
}

/* chan_write_log: one CHAN_FRAME message holding frame_log_write's frame. */
static void test_chan_write_log(void)
{
    int sv[2];
    char frame[FRAME_LOG_MAX];
    uint8_t got[CHAN_HDR_LEN + FRAME_LOG_MAX + 1];

    signal(SIGPIPE, SIG_IGN); /* as in the sandbox child: EPIPE, not death */
    ok(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
    is_int(chan_write_log(sv[0], "warning", "disk \"low\""), 0, "chan_write_log");
    size_t n = frame_log_write(frame, sizeof frame, "warning", "disk \"low\"");
    ssize_t r = read(sv[1], got, sizeof got);
    enum chan_type type;
    uint32_t len;
    ok(r == (ssize_t)(CHAN_HDR_LEN + n) &&
           chan_hdr_decode(got, (size_t)r, FRAME_LOG_MAX, &type, &len) == 1 &&
           type == CHAN_FRAME && len == n && memcmp(got + CHAN_HDR_LEN, frame, n) == 0,
       "one CHAN_FRAME message, the frame as written");
    close(sv[1]);
    is_int(chan_write_log(sv[0], "error", "x"), -EPIPE, "a closed peer: -EPIPE");
    close(sv[0]);
}

int main(void)
{
    test_tables();
    test_round_trip();
    test_defaults();
    test_byte_exact();
    test_whitespace();
    test_keys();
    test_errors();
    test_nan_strings();
    test_surrogates();
    test_child_types();
    test_client_types();
    test_escapes();
    test_nesting();
    test_int_digits();
    test_large();
    test_encode_limits();
    test_encode_around();
    test_chan();
    test_scan_chunked();
    test_scan_streamed();
    test_scan_canonical();
    test_scan_string_bytes();
    test_scan_limits();
    test_log_write();
    test_chan_write_log();
    return tap_done();
}
