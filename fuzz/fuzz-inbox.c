/* Frames as a sandbox receives them: the C shape readers (proto/shape.h) that
 * take a run frame's code and a tool_result's id without Python, held to
 * what the supervisor really sends. A client's frame reaches a sandbox as
 * frame_decode(FRAME_FROM_CLIENT) then frame_encode(); the readers must agree
 * with a plain JSON decode of the same field, or decline and leave the frame
 * to the runtime's Python decoder.
 *
 * Properties, for every input:
 *   - on the bytes as they are (any peer): the readers read only the input,
 *     and what they return is a NUL-free C string or a slice of the input;
 *   - through the supervisor (the input as a client's message, when it is
 *     UTF-8 and decodes): a reader answers exactly when the frame is of its
 *     kind and the field, decoded by cJSON on its own, is a string without
 *     "\u0000" (which a C string cannot hold) that cJSON accepts (not a lone
 *     surrogate); and its answer is that string;
 *   - the input as a run frame's code and as a tool_result's id, set with
 *     frame_set_stringn() (any UTF-8, NULs included): read back byte for
 *     byte, or declined if it holds a NUL (or the text "\u0000"). */
#include <errno.h>
#include <string.h>

#include "core/buf.h"
#include "core/utf8.h"
#include "fuzz.h"
#include "proto/frame.h"
#include "proto/shape.h"

#define ENCODE_MAX (64u * 1024 * 1024)

/* A field's JSON text decoded on its own: the string, or NULL if it is not
 * a string, holds "\u0000", or cJSON refuses it. Free *root after. */
static const char *field_string(const struct frame *f, const char *name, cJSON **root)
{
    const struct frame_field *fld = frame_get(f, name);

    *root = NULL;
    if (!fld || memmem(fld->json, fld->len, "\\u0000", 6))
        return NULL;
    *root = cJSON_ParseWithLength(fld->json, fld->len);
    return cJSON_GetStringValue(*root);
}

static void check_raw(const uint8_t *data, size_t size)
{
    cJSON *root;
    const char *s;
    size_t n;

    s = shape_run_code(data, size, &root);
    FUZZ_ASSERT((s != NULL) == (root != NULL), "run: root and code disagree");
    if (s)
        FUZZ_ASSERT(strlen(s) < size, "run: code longer than the frame");
    cJSON_Delete(root);

    if (shape_result_id(data, size, &s, &n, &root)) {
        FUZZ_ASSERT(n < size, "result: id longer than the frame");
        if (root)
            FUZZ_ASSERT(strlen(s) == n, "result: decoded id is not its length");
        else
            FUZZ_ASSERT((const uint8_t *)s > data && (const uint8_t *)s + n < data + size,
                        "result: id slice outside the frame");
    } else {
        FUZZ_ASSERT(root == NULL, "result: declined but kept a tree");
    }
    cJSON_Delete(root);
}

/* The sandbox's view of the frame f the supervisor sends. */
static void check_sent(const struct frame *f)
{
    struct buf e;
    cJSON *root, *ref_root;
    const char *got, *want;
    size_t n;

    buf_init(&e, ENCODE_MAX);
    FUZZ_ASSERT(frame_encode(f, &e) == 0, "frame_encode");

    got = shape_run_code(e.data, e.len, &root);
    want = f->kind == FRAME_RUN ? field_string(f, "code", &ref_root) : (ref_root = NULL, NULL);
    if (got || want)
        FUZZ_ASSERT(got && want && strcmp(got, want) == 0,
                    "run frame read as %s, decodes as %s: %.*s", got ? "code" : "nothing",
                    want ? "code" : "nothing", (int)(e.len > 400 ? 400 : e.len),
                    (const char *)e.data);
    cJSON_Delete(root);
    cJSON_Delete(ref_root);

    bool taken = shape_result_id(e.data, e.len, &got, &n, &root);
    want = f->kind == FRAME_TOOL_RESULT ? field_string(f, "id", &ref_root) : (ref_root = NULL, NULL);
    if (taken || want)
        FUZZ_ASSERT(taken && want && strlen(want) == n && memcmp(got, want, n) == 0,
                    "tool_result id read as %.*s, decodes as %s: %.*s", taken ? (int)n : 9,
                    taken ? got : "(nothing)", want ? want : "(nothing)",
                    (int)(e.len > 400 ? 400 : e.len), (const char *)e.data);
    cJSON_Delete(root);
    cJSON_Delete(ref_root);
    buf_free(&e);
}

static void check_client(const uint8_t *data, size_t size)
{
    struct frame f;

    if (!utf8_valid(data, size) || frame_decode(data, size, FRAME_FROM_CLIENT, &f, NULL) < 0)
        return;
    check_sent(&f);
    frame_free(&f);
}

/* The text set as field `name` of f reads back, decoded on its own, as the
 * same bytes, or not at all if it holds a NUL (or the text "\u0000", which
 * escaped reads the same). check_sent() holds the readers to that decode. */
static void check_read_back(const struct frame *f, const char *name, const uint8_t *data,
                            size_t size)
{
    bool nul = memchr(data, 0, size) != NULL;
    cJSON *root;
    const char *got = field_string(f, name, &root);

    FUZZ_ASSERT(got ? !nul : nul || memmem(data, size, "\\u0000", 6),
                "a %s %s a NUL was %s", name, nul ? "with" : "without",
                got ? "read" : "left to Python");
    if (got)
        FUZZ_ASSERT(strlen(got) == size && memcmp(got, data, size) == 0,
                    "%s not read back as set", name);
    cJSON_Delete(root);
}

static void check_string(const uint8_t *data, size_t size)
{
    struct frame f;

    if (!utf8_valid(data, size))
        return;
    frame_init(&f, FRAME_RUN);
    FUZZ_ASSERT(frame_set_stringn(&f, "code", (const char *)data, size) == 0, "set code");
    check_sent(&f);
    check_read_back(&f, "code", data, size);
    frame_free(&f);

    frame_init(&f, FRAME_TOOL_RESULT);
    FUZZ_ASSERT(frame_set_stringn(&f, "id", (const char *)data, size) == 0, "set id");
    FUZZ_ASSERT(frame_set_stringn(&f, "value", (const char *)data, size) == 0, "set value");
    check_sent(&f);
    check_read_back(&f, "id", data, size);
    frame_free(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_raw(data, size);
    check_client(data, size);
    check_string(data, size);
    return 0;
}
