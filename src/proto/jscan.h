/* A resumable, strict JSON scanner for one message (runs in the supervisor).
 *
 * Why not a library parser: the supervisor must stay responsive while a peer
 * sends a 256 MiB message, so a message is scanned as its bytes arrive, a
 * bounded slice per event-loop round, and must cost no allocation per item
 * (cJSON spends ~64 bytes and a malloc per value). Relaying is byte-exact
 * (big integers, NaN, lone surrogate escapes travel unchanged), so what the
 * scanner returns is *where* things are, not decoded values: the span of the
 * top-level value and of each top-level member the caller asked for. cJSON
 * stays the oracle this scanner is fuzzed against (fuzz/fuzz-frame.c).
 *
 * Grammar: RFC 8259 plus the tokens NaN, Infinity and -Infinity (spec 3.1),
 * numbers of any length but integers of at most JSCAN_MAX_INT_DIGITS digits
 * (what Python's json reads), any \uXXXX escape (a lone surrogate included, as
 * Python's json accepts), no raw control characters in strings, whitespace
 * only ' ', \t, \n, \r, nesting up to JSCAN_MAX_DEPTH.
 * Optionally strings are checked to be UTF-8 (bytes from a sandbox; text
 * from the WebSocket was checked by the WebSocket layer).
 *
 * Usage: jscan_init(); then jscan_feed() with the message buffer and how many
 * bytes of it exist so far, as often as bytes arrive (the buffer may move:
 * only offsets are kept); then jscan_finish() once the message is complete.
 * Each call scans only bytes it has not seen, so the total cost is one pass.
 * A message that is never held whole (a relay that passes each chunk on as
 * it comes) is fed a chunk at a time with its offset, jscan_feed_at(), and
 * ended with jscan_end(): nothing of a chunk is read after the call. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The deepest nesting of objects and arrays in a frame, the frame's own
 * object included: forkbox's one limit, for every peer (forkboxd, the stream
 * relay of forkbox sandbox and so the embedding hosts behind it). What the
 * host decodes sets it: the reference's json.loads recurses per level
 * against the interpreter's recursion limit, shared with the caller's stack.
 * CPython 3.11 with the default limit of 1000 decodes 993 levels called at
 * the bottom of a stack and 993 - d called d frames deep (measured:
 * 993/943/893/793 at 0/50/100/200 frames; 3.12+ decode deeper). A decode in
 * forkbox's own hosts sits 11 frames deep (forkbox_client.py's and
 * forkbox_embed.py's receive paths, asyncio included, measured); the
 * reference's RemoteBackend.frames() runs under the agent framework's runner,
 * agent and flow coroutines and maybe a web server's, well under 200 (an
 * estimate: not measured here). 512 leaves a host ~480 frames of its own
 * stack: a deeper frame is refused before any host sees it, rather than
 * ending the host's turn with a RecursionError (cJSON's own limit, 1000,
 * is above it). */
#define JSCAN_MAX_DEPTH 512
/* The longest integer literal (digits, without the sign): Python's
 * sys.int_info.default_max_str_digits. The reference's json.loads (and the
 * host's) fails on a longer one, so such a message is not a frame (spec 3.2:
 * a parse failure), and a sandbox must not make the host fail on one.
 * Fractions and exponents are floats there: no limit. */
#define JSCAN_MAX_INT_DIGITS 4300
#define JSCAN_SHORT 24       /* decoded bytes kept of a top-level key or string */
#define JSCAN_ORDER 8        /* top-level members whose order is recorded */

enum jscan_type {
    JT_NONE, /* not seen */
    JT_OBJECT,
    JT_ARRAY,
    JT_STRING,
    JT_NUMBER, /* an RFC 8259 number, of any length */
    JT_NAN,    /* NaN, Infinity or -Infinity */
    JT_TRUE,
    JT_FALSE,
    JT_NULL,
};

/* One value: the top-level one, or the value of a top-level member. */
struct jscan_value {
    size_t a, b;          /* its bytes, [a, b) in the message */
    enum jscan_type type;
    bool compact;         /* no whitespace outside strings within [a, b) */
    bool integer;         /* JT_NUMBER without fraction or exponent */
    bool short_ok;        /* JT_STRING of at most JSCAN_SHORT decoded bytes, or
                             (a top-level member's) JT_NUMBER of at most
                             JSCAN_SHORT bytes of text: */
    uint8_t short_len;    /*   its decoded bytes, or its text, are in short_[] */
    uint64_t str_bytes;   /* JT_STRING: decoded length in UTF-8 bytes (a lone
                             surrogate escape counts 3, as WTF-8) */
    char short_[JSCAN_SHORT];
};

struct jscan {
    /* Set by jscan_init(), read-only afterwards. */
    const char *const *names;  /* borrowed: top-level keys to record */
    size_t nnames;
    struct jscan_value *slot;  /* borrowed, nnames entries: the value of the
                                  last member with that key (type JT_NONE if
                                  none); keys are compared after decoding */
    uint64_t max_items;
    bool check_utf8;
    bool object_only;          /* fail at the first byte of a non-object */

    /* Results (complete after jscan_finish() returned 0). */
    struct jscan_value top;    /* the top-level value */
    uint64_t items;            /* strings (keys too), numbers, literals, containers */
    uint32_t members;          /* members of a top-level object */
    int8_t order[JSCAN_ORDER]; /* slot of the first members' keys; -1 for other
                                  keys and for keys written with escapes */
    bool compact;              /* no whitespace outside strings up to top.b */
    const char *why;           /* static reason after an error */

    /* Scanning state (private). */
    size_t pos;                /* next byte to scan (a message offset) */
    size_t base;               /* the message offset of the chunk being scanned */
    uint8_t state, tok, sub;
    uint8_t u8_need, u8_lo, u8_hi; /* UTF-8 sequence in progress */
    uint8_t hex_left;
    uint16_t hex;              /* \u escape being read */
    uint16_t high;             /* pending high surrogate, or 0 */
    const char *lit;           /* literal being matched */
    uint8_t role;              /* what the current string is */
    uint32_t depth;
    uint64_t digits;           /* of the integer part of the number being read */
    int key_slot;              /* slot of the current top-level key, -1 */
    struct jscan_value key;    /* the current top-level key (short_ only) */
    struct jscan_value cur;    /* the current top-level member's value */
    uint8_t stack[JSCAN_MAX_DEPTH / 8 + 1]; /* bit set: object */
};

/* Start scanning a message. slot must have nnames entries (they are cleared).
 * max_items bounds items (0: no bound). */
void jscan_init(struct jscan *s, const char *const *names, size_t nnames,
                struct jscan_value *slot, uint64_t max_items, bool check_utf8, bool object_only);

/* Scan buf[s->pos .. len). buf holds the message from its first byte.
 * 0, or -EBADMSG with s->why set (the message can never be valid). */
int jscan_feed(struct jscan *s, const uint8_t *buf, size_t len);
/* The same for a chunk: chunk[0 .. len) holds the message's bytes from
 * offset base on, and base <= s->pos <= base + len (the bytes from s->pos
 * on are scanned; none before base is needed). Offsets in the results are
 * the message's. 0, -EBADMSG, or -EINVAL if the chunk starts past s->pos
 * or ends before it. */
int jscan_feed_at(struct jscan *s, const uint8_t *chunk, size_t base, size_t len);

/* The message is complete at len bytes: scan the rest and check that exactly
 * one value was seen, followed only by whitespace. 0 or -EBADMSG. */
int jscan_finish(struct jscan *s, const uint8_t *buf, size_t len);
/* The same when every byte was fed already (s->pos == len, else -EINVAL):
 * no buffer needed. */
int jscan_end(struct jscan *s, size_t len);
