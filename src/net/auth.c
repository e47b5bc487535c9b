/* The bearer tokens (see auth.h). Runs in the supervisor only. */
#include "net/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/util.h"
#include "net/http.h"

struct token_span {
    size_t off, len;           /* the token, in bytes[] */
    size_t name_off, name_len; /* its tenant's name, in bytes[]; len 0: TENANT_DEFAULT */
};

struct tokens {
    size_t alloc;                       /* bytes allocated for the whole struct (scrubbed) */
    size_t n;                           /* tokens */
    struct token_span tok[TOKENS_MAX];
    char bytes[];                       /* the tokens and names, each NUL-terminated */
};

static struct tokens *tokens_alloc(size_t bytes)
{
    size_t alloc = sizeof(struct tokens) + bytes;
    struct tokens *t = calloc(1, alloc);
    if (t)
        t->alloc = alloc;
    return t;
}

void tokens_free(struct tokens *t)
{
    if (!t)
        return;
    explicit_bzero(t, t->alloc);
    free(t);
}

/* The blanks http_auth_ok strips around the Authorization value. */
static bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* A tenant's name: 1..TENANT_NAME_MAX of [A-Za-z0-9._-] (a cgroup, a
 * metrics label and a log field can all carry it as is). */
static bool name_ok(const char *s, size_t n)
{
    if (n == 0 || n > TENANT_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* Append text[a..b) and a NUL to t->bytes at *used: its offset. */
static size_t put(struct tokens *t, size_t *used, const char *text, size_t a, size_t b)
{
    size_t off = *used;
    memcpy(t->bytes + off, text + a, b - a);
    *used += b - a + 1; /* and the NUL calloc left */
    return off;
}

/* One line, stripped of the blanks around it: "TOKEN" or "NAME TOKEN" into
 * t. 0, or -EINVAL with the reason by line number (never a token's bytes). */
static int parse_line(struct tokens *t, size_t *used, const char *text, size_t a, size_t b,
                      unsigned line, char *err, size_t errlen)
{
    size_t k = a;
    while (k < b && !is_blank(text[k]))
        k++;
    size_t name_a = a, name_b = a, tok_a = a;
    if (k < b) { /* a blank inside: the name, then the token */
        name_b = k;
        tok_a = k;
        while (is_blank(text[tok_a]))
            tok_a++;
        if (!name_ok(text + name_a, name_b - name_a))
            return err_fmt(err, errlen, -EINVAL, "line %u: the tenant name before the token must "
                           "be 1-%d of A-Z a-z 0-9 . _ -", line, TENANT_NAME_MAX);
    }
    for (size_t i = tok_a; i < b; i++) {
        unsigned char c = (unsigned char)text[i];
        /* A header value cannot hold these (http-parser refuses them),
         * so such a token could never match: say so now. */
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return err_fmt(err, errlen, -EINVAL, "line %u: a control character", line);
    }
    /* Which tenant a token is for must be one answer. */
    for (size_t i = 0; i < t->n; i++)
        if (t->tok[i].len == b - tok_a && memcmp(t->bytes + t->tok[i].off, text + tok_a,
                                                  b - tok_a) == 0)
            return err_fmt(err, errlen, -EINVAL, "line %u: a token already listed above", line);
    if (t->n == TOKENS_MAX)
        return err_fmt(err, errlen, -EINVAL, "more than %d tokens", TOKENS_MAX);
    struct token_span *sp = &t->tok[t->n++];
    sp->len = b - tok_a;
    sp->off = put(t, used, text, tok_a, b);
    sp->name_len = name_b - name_a;
    sp->name_off = sp->name_len ? put(t, used, text, name_a, name_b) : 0;
    return 0;
}

int tokens_parse(const char *text, size_t len, struct tokens **out, char *err, size_t errlen)
{
    *out = NULL;
    if (memchr(text, '\0', len))
        return err_fmt(err, errlen, -EINVAL, "a NUL byte: not a text file");
    struct tokens *t = tokens_alloc(len + 1);
    if (!t)
        return err_fmt(err, errlen, -ENOMEM, "out of memory");

    size_t used = 0;
    unsigned line = 0;
    for (size_t i = 0; i < len; line++) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - text) : len, a = i, b = end;
        i = nl ? end + 1 : len;
        while (a < b && is_blank(text[a]))
            a++;
        while (b > a && is_blank(text[b - 1]))
            b--;
        if (a == b || text[a] == '#')
            continue;
        int r = parse_line(t, &used, text, a, b, line + 1, err, errlen);
        if (r < 0) {
            tokens_free(t);
            return r;
        }
    }
    if (t->n == 0) {
        tokens_free(t);
        return err_fmt(err, errlen, -EINVAL, "no token (only blank or '#' lines)");
    }
    *out = t;
    return 0;
}

int tokens_read_file(const char *path, struct tokens **out, char *err, size_t errlen)
{
    *out = NULL;
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        int e = errno;
        return err_fmt(err, errlen, -e, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode))
        return err_fmt(err, errlen, -EINVAL, "%s: not a regular file", path);
    size_t cap = TOKEN_FILE_MAX_BYTES + 1;
    char *buf = malloc(cap);
    if (!buf)
        return err_fmt(err, errlen, -ENOMEM, "%s: out of memory", path);
    size_t n = 0;
    int r = 0;
    while (n < cap) {
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int e = errno;
            r = err_fmt(err, errlen, -e, "%s: read: %s", path, strerror(e));
            break;
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    if (r == 0 && n > TOKEN_FILE_MAX_BYTES)
        r = err_fmt(err, errlen, -EFBIG, "%s: longer than %llu bytes", path,
                    (unsigned long long)TOKEN_FILE_MAX_BYTES);
    if (r == 0) {
        char why[128];
        r = tokens_parse(buf, n, out, why, sizeof why);
        if (r < 0)
            err_fmt(err, errlen, r, "%s: %s", path, why);
    }
    explicit_bzero(buf, n);
    free(buf);
    return r;
}

int tokens_one(const char *token, size_t len, struct tokens **out)
{
    struct tokens *t = tokens_alloc(len + 1);
    if (!t)
        return -ENOMEM;
    memcpy(t->bytes, token, len);
    t->tok[0] = (struct token_span){.off = 0, .len = len};
    t->n = 1;
    *out = t;
    return 0;
}

size_t tokens_count(const struct tokens *t)
{
    return t ? t->n : 0;
}

int tokens_match(const struct tokens *t, const char *authorization)
{
    /* No early exit and no branch on a result: every token is compared
     * whatever matched before, and the index is kept by a mask. */
    unsigned found = ~0u;
    for (size_t i = 0; i < t->n; i++) {
        unsigned hit = -(unsigned)http_auth_ok(authorization, t->bytes + t->tok[i].off,
                                               t->tok[i].len);
        found = (found & ~hit) | ((unsigned)i & hit);
    }
    return (int)found; /* ~0u: -1 */
}

const char *tokens_name(const struct tokens *t, size_t i)
{
    return t->tok[i].name_len ? t->bytes + t->tok[i].name_off : TENANT_DEFAULT;
}
