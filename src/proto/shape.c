/* Reading the supervisor's frames by their shape (see shape.h). */
#include "proto/shape.h"

#include "proto/frame_fields.h"

#include <string.h>

/* The literals below are frame_encode()'s output for these two kinds: the
 * field table (frame_fields.h) must keep code the run frame's only field and
 * id the tool_result's first, or these readers would take another field's
 * text; these assertions make a change there a build error. */
_Static_assert(FRAME_FIELD_RUN_code == 0 && FRAME_FIELD_RUN_COUNT == 1,
               "shape_run_code reads {\"code\":...,\"kind\":\"run\"}: "
               "code must be run's only field");
_Static_assert(FRAME_FIELD_TOOL_RESULT_id == 0,
               "shape_result_id reads {\"id\":...: id must be tool_result's first field");

static bool has(const uint8_t *data, size_t len, const char *pre, size_t pre_len,
                const char *suf, size_t suf_len)
{
    return len >= pre_len + suf_len && memcmp(data, pre, pre_len) == 0 &&
           memcmp(data + len - suf_len, suf, suf_len) == 0;
}

/* The frame as one JSON object followed by exactly its "\n", or NULL. A
 * "\u0000" anywhere sends the frame to Python: cJSON would cut a string
 * short there. */
static cJSON *parse_whole(const uint8_t *data, size_t len)
{
    const char *end = NULL;

    if (memmem(data, len, "\\u0000", 6))
        return NULL;
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)data, len, &end, false);
    if (root && end != (const char *)data + len - 1) {
        cJSON_Delete(root);
        root = NULL;
    }
    return root;
}

const char *shape_run_code(const uint8_t *data, size_t len, cJSON **root)
{
    static const char pre[] = "{" FRAME_KEY(code) "\"", suf[] = "\"," FRAME_TAIL("run");

    *root = NULL;
    if (!has(data, len, pre, sizeof pre - 1, suf, sizeof suf - 1))
        return NULL;
    cJSON *r = parse_whole(data, len);
    const char *code = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "code"));
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "kind"));
    if (!code || !kind || strcmp(kind, "run") != 0 || cJSON_GetArraySize(r) != 2) {
        cJSON_Delete(r);
        return NULL;
    }
    *root = r;
    return code;
}

bool shape_result_id(const uint8_t *data, size_t len, const char **id, size_t *id_len,
                     cJSON **root)
{
    static const char pre[] = "{" FRAME_KEY(id) "\"", suf[] = "," FRAME_TAIL("tool_result");
    const size_t pre_len = sizeof pre - 1, suf_len = sizeof suf - 1;

    *root = NULL;
    if (!has(data, len, pre, pre_len, suf, suf_len) || len == pre_len + suf_len)
        return false;
    /* The id's string token: from its opening quote to the first quote no
     * backslash escapes. The ',' after it may be the suffix's own. */
    const char *open = (const char *)data + pre_len - 1, *text = open + 1;
    const char *limit = (const char *)data + len - suf_len;
    const char *p = text;
    bool escaped = false;
    while (p < limit && *p != '"') {
        escaped |= *p == '\\';
        p += *p == '\\' ? 2 : 1;
    }
    if (p >= limit || p[1] != ',')
        return false;
    if (!escaped) {
        *id = text;
        *id_len = (size_t)(p - text);
        return true;
    }
    /* Only the token is decoded: what the rest of the frame holds is the
     * caller's to decode. A "\u0000" would cut the C string short. */
    size_t token_len = (size_t)(p + 1 - open);
    if (memmem(open, token_len, "\\u0000", 6))
        return false;
    cJSON *r = cJSON_ParseWithLength(open, token_len);
    const char *s = cJSON_GetStringValue(r);
    if (!s) {
        cJSON_Delete(r);
        return false;
    }
    *root = r;
    *id = s;
    *id_len = strlen(s);
    return true;
}
