/* Checks every relay of a sandbox's frames applies (relay.c): the limits
 * per block phase and per kind, and the output cap. Used by forkboxd's
 * session and by `forkbox sandbox`. */
#pragma once
#include <stdint.h>

#include "proto/frame.h"

/* Where the block stands, as far as the sandbox's frames are concerned. */
enum relay_phase {
    RELAY_BETWEEN,       /* no block runs */
    RELAY_RUNNING,       /* run sent to the sandbox, its done not yet back */
    RELAY_WANT_OUTPUT,   /* done relayed: output must come next */
    RELAY_WANT_SNAPSHOT, /* output relayed: the workspace snapshot must come next */
};

/* The longest 'F' message legal from the sandbox in phase p, 0 if none is. */
uint64_t relay_frame_max(enum relay_phase p, uint64_t output_cap);
/* The most JSON items such a message may hold (bounded before the kind is
 * known: "kind" may come last). */
uint64_t relay_items_max(enum relay_phase p);

/* Structural limits per kind, once the kind is known (items: what the
 * scanner counted in the message). NULL if f fits, else why not. */
const char *relay_frame_misfit(const struct frame *f, uint64_t items);

/* Hold one stream ("stdout", "stderr") of an output frame to cap: if the
 * string decodes to more than cap (plus OUTPUT_NOTE_ALLOWANCE for the
 * sandbox's own notes), keep its first and last cap/2 bytes, cut between
 * characters, with a note between. 1 if the field was cut (f is then no
 * longer canonical), 0 if it fits, -ENOMEM. */
int relay_cap_stream(struct frame *f, const char *name, uint64_t cap);
