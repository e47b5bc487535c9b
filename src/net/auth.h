/* The bearer tokens the front door accepts (spec 1.2). Runs in the
 * supervisor only: the fork server is started before any token is read
 * (main.c) and is never sent one, and a re-read on SIGHUP
 * (server.c) happens in the supervisor too.
 *
 * A token file holds one token a line, "TOKEN" or "NAME TOKEN": NAME is the
 * tenant the token admits turns for (1-64 of [A-Za-z0-9._-]; without one,
 * TENANT_DEFAULT), TOKEN the rest of the line after the blanks that follow
 * the name. Blank lines and lines whose first non-blank character is '#'
 * are skipped, and each line is stripped of the blanks around it (as the
 * Authorization value is, http_auth_ok). Several tokens make rotation
 * possible (add the new one, move the clients, remove the old one), and
 * several may name one tenant. Every token is compared on every request, in
 * constant time, so the time taken says neither which token matched nor how
 * close a guess came. The bytes are scrubbed (explicit_bzero) when a set is
 * freed; names are not secret (logs and metrics carry them). */
#pragma once
#include <stdbool.h>
#include <stddef.h>

struct tokens; /* opaque: one allocation holding every token */

/* The tenant of unnamed tokens, and of every turn when there is no token. */
#define TENANT_DEFAULT "default"

/* Parse a token file's text[0..len): 0 with *out owned by the caller, or
 * -EINVAL with a reason naming the line (never a token's bytes) in err: a
 * NUL or control byte, a name that is not one, a token already on an
 * earlier line, more than TOKENS_MAX tokens, or none at all. */
int tokens_parse(const char *text, size_t len, struct tokens **out, char *err, size_t errlen);
/* Read and parse a token file (a regular file of at most
 * TOKEN_FILE_MAX_BYTES; opened non-blocking, so a FIFO cannot stall the
 * caller). 0, or -errno with a reason in err. The read buffer is scrubbed. */
int tokens_read_file(const char *path, struct tokens **out, char *err, size_t errlen);
/* A set of exactly one token, copied (the environment's; len 0 is allowed
 * and matches nothing: spec 1.2's empty-token quirk), of TENANT_DEFAULT.
 * 0 or -ENOMEM. */
int tokens_one(const char *token, size_t len, struct tokens **out);

size_t tokens_count(const struct tokens *t);
/* Spec 1.2 against every token: the index of the token authorization
 * (NULL: absent) is "Bearer " + (0 <= i < tokens_count), or -1 if none. The
 * time depends only on the lengths. */
int tokens_match(const struct tokens *t, const char *authorization);
/* The tenant of token i (NUL-terminated, borrowed from t). */
const char *tokens_name(const struct tokens *t, size_t i);
/* Scrub and free (NULL is fine). */
void tokens_free(struct tokens *t);
