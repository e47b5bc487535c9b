/* Reading the supervisor's frames by their shape, in the sandbox (no Python).
 *
 * The supervisor decodes every frame a client sends and re-encodes it with
 * frame_encode() (proto/frame.c): every field in table order, "kind" last,
 * compact, one trailing \n. Two frames are read here, in C, by that shape:
 * the run frame every block starts with (module.c) and a tool_result, which
 * the channel reader hands straight to the call waiting for it (calls.c).
 * Whatever does not have the shape is left to the runtime's Python decoder,
 * so a peer other than the supervisor is still read correctly, only slower.
 *
 * The literals they match are built from the field table (frame_fields.h),
 * and shape.c asserts at compile time that the positions they rely on (run:
 * code alone; tool_result: id first) still hold. Both functions read only
 * data[0..len) and may be given any bytes; the fuzz target
 * fuzz/fuzz-inbox.c holds them to the supervisor's encoder. */
#pragma once
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The code of a run frame in the supervisor's form
 *     {"code":"<JSON string>","kind":"run"}\n
 * as UTF-8, or NULL: not that form, a \u0000 in the code (a C string cannot
 * hold it), or a string cJSON refuses. On success *root owns the code (free
 * with cJSON_Delete); on NULL *root is NULL. */
const char *shape_run_code(const uint8_t *data, size_t len, cJSON **root);

/* The id of a tool_result in the supervisor's form
 *     {"id":"<JSON string>",...,"kind":"tool_result"}\n
 * true with *id / *id_len set (not NUL-terminated), or false: not that form,
 * or an id with a \u0000 in it or that cJSON refuses (a lone surrogate). An
 * id without escapes is a slice of data (*root NULL); one with escapes is
 * decoded by cJSON, the id's token alone, and *root owns it (free with
 * cJSON_Delete; NULL is fine). The rest of the frame is not read: the caller
 * decodes the payload later, with the same decoder either way. */
bool shape_result_id(const uint8_t *data, size_t len, const char **id, size_t *id_len,
                     cJSON **root);
