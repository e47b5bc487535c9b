/* The supervisor's check of a workspace snapshot (channel message 'S')
 * before it is relayed to the host. Runs in the supervisor, on bytes a
 * sandbox wrote; uses zlib for inflation and nothing else (no libarchive:
 * a lenient multi-format parser in the process that holds the token is
 * attack surface, and it could read bytes differently from the host's
 * Python tarfile).
 *
 * What is accepted is a *canonical subset* of gzip + tar: exactly the shapes
 * archive_snapshot() (src/stage/snapshot.c, libarchive's restricted pax
 * writer) produces for an honest workspace, each of which libarchive and
 * CPython's tarfile (3.11 to 3.13) read the same way. Everything else is
 * refused, and the caller ends the turn. The subset:
 *
 *   gzip    one or more members back to back, nothing before, between or
 *           after them; each: ID 1f 8b, CM 8, FLG 0 (no FEXTRA, FNAME,
 *           FCOMMENT, FHCRC, FTEXT or reserved bits; MTIME, XFL, OS are
 *           free) or FLG FEXTRA with exactly the writer's "FB" subfield
 *           (TARCHECK_GZ_*, below), a raw deflate stream, CRC-32 and ISIZE
 *           correct, the FB length the member's length and (unless its
 *           first deflate block is stored) the FB digest its digest.
 *           Both readers skip FEXTRA whatever it holds.
 *   tar     512-byte POSIX ustar headers (magic "ustar\0", version "00"),
 *           unsigned checksum; every numeric field 1 to width-1 octal
 *           digits from its first byte, then only NUL or space (no
 *           base-256, no signs, no leading blanks); uid, gid 0; devmajor,
 *           devminor 0 or all NUL (as CPython writes them for files);
 *           uname, gname, linkname empty; every string field
 *           NUL-padded after its first NUL; bytes 500-511 zero.
 *   types   '0' regular file (mode 0644 to 0755: the bits 0644 set, none
 *           outside 0755), '5' directory (mode 0755, size 0, name with
 *           one trailing '/'), and 'x' pax header (at most one, directly
 *           before a '0' or '5'; mode within 0755).
 *   pax     records "LEN key=value\n" filling the header's size exactly,
 *           LEN decimal without leading zeros; keys "path" then "mtime",
 *           each at most once, nothing else (no hdrcharset, size,
 *           linkpath, uid, gid, uname, gname, GNU.sparse.*, SCHILY.*,
 *           LIBARCHIVE.*); mtime as libarchive writes it,
 *           (0|[1-9][0-9]{0,10})(\.[0-9]{0,8}[1-9])?; no NUL anywhere.
 *   names   the pax path if present, else prefix "/" name (the ustar
 *           fields then ASCII), must pass tarcheck_path_ok(); members in
 *           strictly increasing order of path components (the writer's
 *           walk order), so no name repeats and no file is followed by
 *           a member beneath it.
 *   data    exactly size bytes, then zeros up to the next 512 boundary.
 *   end     two zero blocks, then at most TARCHECK_MAX_TRAILER zero
 *           bytes to the end of the inflated stream.
 * A zero-length message is valid (spec 4.4: the host keeps its files).
 *
 * Ownership and use. The caller owns the message buffer and may move or
 * grow it between calls (realloc): the checker keeps offsets, never
 * pointers into it, and needs only that msg[0, len) holds the same bytes at
 * every call (len never shrinks). Each call does a bounded amount of work:
 * it consumes at most step_budget compressed bytes and inflates at most
 * step_budget bytes (under 1 ms at the default), so a gzip bomb cannot
 * hold the event loop; the rest is done by further calls.
 *
 *   tc = tarcheck_new(&limits);               // NULL: out of memory
 *   while bytes arrive:
 *       r = tarcheck_feed(tc, msg, got);      // NEED_INPUT, AGAIN or < 0
 *   when the whole message (len bytes) is in:
 *       do r = tarcheck_finish(tc, msg, len); // AGAIN until VALID or < 0
 *       while (r == TARCHECK_AGAIN);          // (one call per loop round)
 *   relay only after TARCHECK_VALID; tarcheck_free(tc).
 *
 * A result that ends the check (VALID or an error) is sticky: later calls
 * return it again without work. Errors are negative errno values with a
 * fixed reason (tarcheck_reason(), a static string that never contains
 * input bytes):
 *   -EBADMSG  not in the subset (corrupt gzip, bad CRC, bad header, a
 *             refused type, mode, field, pax record or name, bad order,
 *             trailing bytes, truncated message)
 *   -EFBIG    file data past max_data, or the inflated stream past
 *             max_inflated (the bomb guard)
 *   -E2BIG    more than max_members members
 *   -ENAMETOOLONG  a path longer than max_path bytes
 *   -ENOMEM   zlib could not allocate its state
 *   -EINVAL   a caller error: len shrank, or finish's len changed
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/limits.h"

enum tarcheck_result {
    TARCHECK_VALID = 0,      /* finished: the whole message is in the subset */
    TARCHECK_NEED_INPUT = 1, /* every byte given is checked; feed more, or finish */
    TARCHECK_AGAIN = 2,      /* the step budget is used up; call again */
};

/* The gzip member header the snapshot writer puts before every member, and
 * the one form with FLG.FEXTRA the check accepts: ID, CM 8, FLG FEXTRA (4),
 * MTIME, XFL, OS, then XLEN 40 and one subfield SI1 'F' SI2 'B' of 36
 * bytes: the member's whole length (header to trailer, 4 bytes little-
 * endian), then the SHA-256 of its bytes after this header (deflate data
 * and trailer). The length lets the check find a member's end without
 * inflating it, the digest lets it know a member it verified before as it
 * starts (see tarcheck_cache below); like BGZF's "BC" subfield. A digest is
 * a claim: the check hashes the bytes as they come and refuses a member
 * that is not what it claims, whether it looked it up or inflated it. */
#define TARCHECK_GZ_FB_LEN 36
#define TARCHECK_GZ_XLEN (4 + TARCHECK_GZ_FB_LEN)
#define TARCHECK_GZ_SI1 'F'
#define TARCHECK_GZ_SI2 'B'
#define TARCHECK_GZ_HDR_LEN (10 + 2 + TARCHECK_GZ_XLEN)

struct tarcheck_limits {
    uint64_t max_data;     /* file data bytes, all members (--snapshot-max) */
    uint64_t max_members;  /* files and directories (--max-members) */
    uint64_t max_inflated; /* tar stream bytes; 0: tarcheck_inflated_bound() */
    size_t max_path;       /* bytes of one path; 0: TARCHECK_DEFAULT_MAX_PATH,
                              at most TARCHECK_MAX_PATH_CEILING */
    size_t step_budget;    /* per call, at most this many compressed bytes consumed
                              and this many inflated; 0: TARCHECK_STEP_BUDGET */
};

/* One member as the host will see it, for callers that want to look. */
struct tarcheck_member {
    const char *path; /* borrowed for the call; NUL-terminated, no trailing '/' */
    size_t path_len;
    char type;        /* '0' file, '5' directory */
    uint32_t mode;    /* permission bits, within 0755 */
    uint64_t size;    /* data bytes (0 for a directory) */
    bool pax;         /* the path came from a pax record */
};
typedef void (*tarcheck_member_fn)(void *ud, const struct tarcheck_member *m);

struct tarcheck_stats {
    uint64_t members;    /* files + directories accepted so far */
    uint64_t dirs;       /* of which directories */
    uint64_t data;       /* file data bytes */
    uint64_t inflated;   /* tar stream bytes inflated */
    uint64_t consumed;   /* compressed bytes consumed */
    uint64_t gz_members; /* complete gzip members */
    uint64_t cache_hits;   /* gzip members recognised in the cache, not inflated */
    uint64_t cache_bytes;  /* their compressed bytes */
    uint64_t cache_added;  /* members added to the cache */
    uint64_t calls;        /* feed/finish calls that did work */
    uint64_t max_step_in;  /* most compressed bytes consumed by one call */
    uint64_t max_step_out; /* most bytes inflated by one call */
};

struct tarcheck;
struct tarcheck_cache;
struct budget;

/* Members verified earlier in the turn (one cache per turn, in the
 * supervisor). A gzip member with the "FB" subfield whose first deflate
 * block is not stored (stored blocks inflate faster than they hash), that
 * starts where a tar entry starts and ends where exactly one file or
 * directory entry ends (its pax header, ustar header, data and padding),
 * is remembered by its digest (SHA-256 of its bytes after the header, as
 * hashed while it was inflated: the sandbox chooses them, so a
 * cryptographic hash) with what the check learnt from it: the member's
 * path, type, mode and size, and how many bytes it inflates to. A later
 * member whose FB subfield claims the same digest and length, at a tar
 * entry boundary again, is not inflated: what it holds is checked against
 * its neighbours and the snapshot's caps (order, members, data, inflated
 * bytes) as if it had been inflated, as it starts, and its bytes are hashed
 * as they come: one that is not what it claims is refused at its end. So
 * nothing of a member is kept to be read twice, and the verdict and the
 * members reported for an honest snapshot are the same with or without a
 * cache (fuzz/fuzz-tarcheck.c); one whose digest lies is refused either
 * way, maybe for another reason (without the cache, inflating it may fail
 * first). Hashing runs at ~1 GB/s here (SHA-NI), inflating text at ~150
 * MB/s of output.
 *
 * At most max_bytes of entries (their paths included) are held, each
 * charged to budget (borrowed, may be NULL) and given back when the cache is
 * freed; when an entry does not fit, entries not used by this snapshot or
 * the one before are dropped once, then nothing more is added. */
struct tarcheck_cache *tarcheck_cache_new(uint64_t max_bytes, struct budget *budget);
void tarcheck_cache_free(struct tarcheck_cache *c); /* NULL is fine */
/* Use c (borrowed, may be NULL) for this message; before the first feed. */
void tarcheck_set_cache(struct tarcheck *tc, struct tarcheck_cache *c);

/* A checker for one message. lim is copied. NULL when out of memory. */
struct tarcheck *tarcheck_new(const struct tarcheck_limits *lim);
/* Call fn for every member once its header is checked (before its data;
 * a later refusal can still follow). Optional; before the first feed. */
void tarcheck_set_member_fn(struct tarcheck *tc, tarcheck_member_fn fn, void *ud);
void tarcheck_free(struct tarcheck *tc); /* NULL is fine */

/* msg[0, len) has arrived (more may follow). Checks what it can within one
 * step budget. TARCHECK_NEED_INPUT, TARCHECK_AGAIN, or an error. */
int tarcheck_feed(struct tarcheck *tc, const uint8_t *msg, size_t len);
/* msg[0, len) is the whole message. Checks within one step budget.
 * TARCHECK_VALID, TARCHECK_AGAIN (call tarcheck_finish again, with the same
 * len), or an error. */
int tarcheck_finish(struct tarcheck *tc, const uint8_t *msg, size_t len);

/* A message that is not held whole (a relay that passes it on as it
 * arrives): each call is given a window of it, chunk[0, n) holding the
 * message's bytes [base, base + n), with len the bytes arrived so far (the
 * whole message's length for finish); the window must hold the byte the
 * check reads next (base <= tarcheck_next() <= base + n, else -EINVAL).
 * The check reads only inside the window, keeps no pointer into it and
 * never reads a byte before tarcheck_next() again (the caller may drop
 * them); NEED_INPUT then means "give me the window from tarcheck_next()".
 * The results are those of the whole-message calls, whatever the windows. */
int tarcheck_feed_at(struct tarcheck *tc, const uint8_t *chunk, size_t base, size_t n,
                     size_t len);
int tarcheck_finish_at(struct tarcheck *tc, const uint8_t *chunk, size_t base, size_t n,
                       size_t len);
/* The offset of the next byte the check reads: every byte before it is
 * done with. */
size_t tarcheck_next(const struct tarcheck *tc);

/* Why the check failed (static), or "ok"/"incomplete". */
const char *tarcheck_reason(const struct tarcheck *tc);
void tarcheck_get_stats(const struct tarcheck *tc, struct tarcheck_stats *st);

/* The derived bomb guard: the most tar stream that max_members members of
 * paths up to max_path with max_data bytes of data can take (each member a
 * pax header, its records, a header and padding), plus the end blocks and
 * TARCHECK_MAX_TRAILER. Saturates at UINT64_MAX. */
uint64_t tarcheck_inflated_bound(uint64_t max_data, uint64_t max_members, size_t max_path);

/* The name rule, shared with the writer (which skips files it would fail):
 * p[0, n) is 1..max_path bytes of valid UTF-8 with no NUL, relative ('/'
 * separated, no leading or trailing '/', no empty, "." or ".." component,
 * none longer than NAME_MAX), and without the text "hdrcharset=" (an old
 * CPython 3.11 tarfile searched the raw pax block for that record, values
 * included). */
bool tarcheck_path_ok(const char *p, size_t n, size_t max_path);
