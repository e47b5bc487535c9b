/* Reading the supervisor's frames by their shape (see shape.h). */
#include "pyrt/shape.h"

#include <string.h>

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
    static const char pre[] = "{\"code\":\"", suf[] = "\",\"kind\":\"run\"}\n";

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
    static const char pre[] = "{\"id\":\"", suf[] = ",\"kind\":\"tool_result\"}\n";
    const size_t pre_len = sizeof pre - 1, suf_len = sizeof suf - 1;

    *root = NULL;
    if (!has(data, len, pre, pre_len, suf, suf_len) || len == pre_len + suf_len)
        return false;
    /* The first '"' after the prefix ends the id unless a backslash came
     * first; the ',' after it is at worst the suffix's own. */
    const char *text = (const char *)data + pre_len;
    const char *quote = memchr(text, '"', len - pre_len - suf_len);
    if (quote && !memchr(text, '\\', (size_t)(quote - text)) && quote[1] == ',') {
        *id = text;
        *id_len = (size_t)(quote - text);
        return true;
    }
    cJSON *r = parse_whole(data, len);
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "id"));
    if (!s) {
        cJSON_Delete(r);
        return false;
    }
    *root = r;
    *id = s;
    *id_len = strlen(s);
    return true;
}
