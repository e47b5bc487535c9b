/* The frame format's field table (spec 3.3): each kind's fields, without
 * "kind", in the order frame_encode() writes them (the reference's order);
 * "kind" always comes last. Header only, no code: used by every process.
 *
 * This is the one place that order is written. proto/frame.c builds its
 * name and default tables from these lists, and every piece of code that
 * writes or reads a frame by its literal text instead of through the codec
 * (proto/shape.c, the log-frame writer in proto/frame.c, pyrt/output.c)
 * builds its literals from the same names (FRAME_KEY) and pins the position
 * it relies on with a static assertion on the FRAME_FIELD_<KIND>_<name>
 * constants below. So renaming a field makes those constants disappear and
 * reordering one fails the assertion: the build breaks, not only a fuzzer.
 *
 * Each list is X(KIND, name) per field; the names are C identifiers spelled
 * as the JSON keys. */
#pragma once

#define FRAME_FIELDS_READY(X)       X(READY, protocol_version) X(READY, python_version) \
                                    X(READY, packages)
#define FRAME_FIELDS_RUN(X)         X(RUN, code)
#define FRAME_FIELDS_TOOL_CALL(X)   X(TOOL_CALL, id) X(TOOL_CALL, name) X(TOOL_CALL, args) \
                                    X(TOOL_CALL, timeout)
#define FRAME_FIELDS_TOOL_RESULT(X) X(TOOL_RESULT, id) X(TOOL_RESULT, ok) X(TOOL_RESULT, value) \
                                    X(TOOL_RESULT, error)
#define FRAME_FIELDS_LOG(X)         X(LOG, level) X(LOG, msg)
#define FRAME_FIELDS_DONE(X)        X(DONE, exit_code)
#define FRAME_FIELDS_OUTPUT(X)      X(OUTPUT, stdout) X(OUTPUT, stderr) X(OUTPUT, exit_code)
#define FRAME_FIELDS_SHUTDOWN(X)

/* FRAME_FIELD_<KIND>_<name>: the field's index in its kind (and in
 * struct frame's field[]); FRAME_FIELD_<KIND>_COUNT: how many fields. */
#define FRAME_FIELD_ENUM_(kind, name) FRAME_FIELD_##kind##_##name,
/* (stdout and stderr are also <stdio.h> macros; # and ## do not expand
 * their operands, so they stay the tokens written here.) */
enum { FRAME_FIELDS_READY(FRAME_FIELD_ENUM_) FRAME_FIELD_READY_COUNT };
enum { FRAME_FIELDS_RUN(FRAME_FIELD_ENUM_) FRAME_FIELD_RUN_COUNT };
enum { FRAME_FIELDS_TOOL_CALL(FRAME_FIELD_ENUM_) FRAME_FIELD_TOOL_CALL_COUNT };
enum { FRAME_FIELDS_TOOL_RESULT(FRAME_FIELD_ENUM_) FRAME_FIELD_TOOL_RESULT_COUNT };
enum { FRAME_FIELDS_LOG(FRAME_FIELD_ENUM_) FRAME_FIELD_LOG_COUNT };
enum { FRAME_FIELDS_DONE(FRAME_FIELD_ENUM_) FRAME_FIELD_DONE_COUNT };
enum { FRAME_FIELDS_OUTPUT(FRAME_FIELD_ENUM_) FRAME_FIELD_OUTPUT_COUNT };
enum { FRAME_FIELDS_SHUTDOWN(FRAME_FIELD_ENUM_) FRAME_FIELD_SHUTDOWN_COUNT };

/* The JSON text of a key and its colon, "\"name\":", from the token. */
#define FRAME_KEY(name) "\"" #name "\":"
/* What closes every encoded frame: the kind, last, and the newline. kind is
 * a string literal ("run"). */
#define FRAME_TAIL(kind) "\"kind\":\"" kind "\"}\n"
