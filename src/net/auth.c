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
    size_t off, len; /* in bytes[] */
};

struct tokens {
    size_t alloc;                       /* bytes allocated for the whole struct (scrubbed) */
    size_t n;                           /* tokens */
    struct token_span tok[TOKENS_MAX];
    char bytes[];                       /* the tokens, each NUL-terminated */
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
        for (size_t k = a; k < b; k++) {
            unsigned char c = (unsigned char)text[k];
            /* A header value cannot hold these (http-parser refuses them),
             * so such a token could never match: say so now. */
            if ((c < 0x20 && c != '\t') || c == 0x7f) {
                tokens_free(t);
                return err_fmt(err, errlen, -EINVAL, "line %u: a control character", line + 1);
            }
        }
        if (t->n == TOKENS_MAX) {
            tokens_free(t);
            return err_fmt(err, errlen, -EINVAL, "more than %d tokens", TOKENS_MAX);
        }
        t->tok[t->n++] = (struct token_span){.off = used, .len = b - a};
        memcpy(t->bytes + used, text + a, b - a);
        used += b - a + 1; /* and the NUL calloc left */
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

bool tokens_match(const struct tokens *t, const char *authorization)
{
    /* No early exit: every token is compared whatever matched before. */
    bool any = false;
    for (size_t i = 0; i < t->n; i++)
        any |= http_auth_ok(authorization, t->bytes + t->tok[i].off, t->tok[i].len);
    return any;
}
