/* The frame decoder forkbox had before proto/jscan.c (lexer + cJSON), kept as
 * an oracle for fuzz-frame.c. Same contract as frame_decode() in
 * proto/frame.h, except that every field is an owned, NUL-terminated copy. */
#pragma once
#include "proto/frame.h"

struct oracle_field {
    char *json; /* owned, NUL-terminated compact JSON text of the value */
    size_t len;
};

struct oracle_frame {
    enum frame_kind kind;
    struct oracle_field field[FRAME_MAX_FIELDS];
    int64_t exit_code;
};

int oracle_frame_decode(const uint8_t *text, size_t len, enum frame_peer peer,
                        struct oracle_frame *out, const char **why);
void oracle_frame_free(struct oracle_frame *f);
