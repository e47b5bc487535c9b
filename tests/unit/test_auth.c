/* net/auth.c: the token file's syntax (one token a line, "TOKEN" or "NAME
 * TOKEN", blanks and '#' lines skipped), its refusals (which never quote a
 * token), reading a file, and matching against every token: which one, and
 * so which tenant. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/limits.h"
#include "net/auth.h"
#include "tap.h"

static int parse(const char *text, struct tokens **t, char *err)
{
    err[0] = '\0';
    return tokens_parse(text, strlen(text), t, err, 256);
}

/* Whether authorization matches any token. */
static bool m(const struct tokens *t, const char *authorization)
{
    return tokens_match(t, authorization) >= 0;
}

/* The tenant authorization is for, or NULL. */
static const char *tenant(const struct tokens *t, const char *authorization)
{
    int i = tokens_match(t, authorization);
    return i < 0 ? NULL : tokens_name(t, (size_t)i);
}

static bool str_is(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

/* "NAME TOKEN": the name says whose turns the token admits; unnamed tokens
 * are the default tenant's; a name is checked, a token listed twice is
 * refused (which tenant would it be?). */
static void test_names(void)
{
    struct tokens *t = NULL;
    char err[256];
    is_int(parse("team-a tok-a1\nteam-a\ttok-a2\n  team_B.2   tok b with blanks \nplain-tok\n"
                 "default tok-d\n", &t, err), 0, "named and unnamed tokens (%s)", err);
    is_int(tokens_count(t), 5, "five tokens");
    ok(str_is(tenant(t, "Bearer tok-a1"), "team-a") && str_is(tenant(t, "Bearer tok-a2"), "team-a"),
       "two tokens of one tenant (blank or tab after the name)");
    ok(str_is(tenant(t, "Bearer tok b with blanks"), "team_B.2"),
       "the token is the rest of the line: blanks inside are kept");
    ok(str_is(tenant(t, "Bearer plain-tok"), TENANT_DEFAULT) &&
           str_is(tenant(t, "Bearer tok-d"), TENANT_DEFAULT),
       "an unnamed token is the default tenant's, as is one named so");
    ok(!m(t, "Bearer team-a tok-a1") && !m(t, "Bearer team-a") && !m(t, "Bearer tok"),
       "the name is not part of the token");
    is_int(tokens_match(t, "Bearer tok-d"), 4, "the index of the token that matched");
    tokens_free(t);

    char name64[80], name65[80];
    memset(name64, 'n', 64);
    strcpy(name64 + 64, " tok\n");
    memset(name65, 'n', 65);
    strcpy(name65 + 65, " tok\n");
    is_int(parse(name64, &t, err), 0, "a name of 64 characters");
    tokens_free(t);
    const char *bad[] = {"ok-tok\nt\xc3\xa9" "am secret-xyz\n", name65, "a/b secret-xyz\n",
                         "a:b secret-xyz\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ok(parse(bad[i], &t, err) == -EINVAL && t == NULL && strstr(err, "tenant name") &&
               !strstr(err, "secret-xyz") && !strstr(err, "ok-tok"),
           "a bad name is refused by line number (%zu: %s)", i, err);
    ok(parse("a secret-xyz\nb other\nc secret-xyz\n", &t, err) == -EINVAL &&
           strstr(err, "line 3") && strstr(err, "already") && !strstr(err, "secret-xyz"),
       "a token listed twice is refused, even for another tenant (%s)", err);
    ok(parse("secret-xyz\nsecret-xyz\n", &t, err) == -EINVAL && strstr(err, "line 2"),
       "... and twice unnamed (%s)", err);

    is_int(tokens_one("env-tok", 7, &t), 0, "tokens_one");
    ok(str_is(tenant(t, "Bearer env-tok"), TENANT_DEFAULT), "the environment's token: default");
    tokens_free(t);
}

int main(void)
{
    struct tokens *t = NULL;
    char err[256];

    is_int(parse("secret\n", &t, err), 0, "one token and a newline (the old format)");
    is_int(tokens_count(t), 1, "one token");
    ok(m(t, "Bearer secret") && m(t, "  Bearer secret\t"),
       "it matches, whitespace around the header stripped");
    ok(!m(t, "Bearer secre") && !m(t, "Bearer secret2") && !m(t, "bearer secret") &&
           !m(t, NULL) && !m(t, "secret"),
       "near misses, another scheme, no header: no match");
    tokens_free(t);

    is_int(parse("# rotation, 2024-05\n\n  old-token  \r\n\t# a comment\nnew-token\r\n \n", &t,
                 err), 0, "comments, blank lines, CRLF, blanks around");
    is_int(tokens_count(t), 2, "two tokens");
    ok(m(t, "Bearer old-token") && m(t, "Bearer new-token"), "either token is accepted");
    ok(!m(t, "Bearer # a comment") && !m(t, "Bearer # rotation, 2024-05") && !m(t, "Bearer ") &&
           !m(t, "Bearer  old-token  x"),
       "comments and blank lines are not tokens");
    tokens_free(t);

    is_int(parse("last-without-newline", &t, err), 0, "no final newline");
    ok(m(t, "Bearer last-without-newline"), "the last line counts");
    tokens_free(t);

    const char *bad[] = {"", "\n\n", "# only a comment\n", "  \t\r\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        t = (struct tokens *)1;
        ok(parse(bad[i], &t, err) == -EINVAL && t == NULL && strstr(err, "no token"),
           "refused without a token: case %zu (%s)", i, err);
    }
    ok(parse("good\nbad\x01token-xyz\n", &t, err) == -EINVAL && strstr(err, "line 2") &&
           !strstr(err, "token-xyz") && !strstr(err, "good"),
       "a control byte is refused by line number, no token quoted (%s)", err);
    ok(tokens_parse("a\0b\n", 4, &t, err, sizeof err) == -EINVAL && strstr(err, "NUL"),
       "a NUL byte is refused (%s)", err);

    char many[TOKENS_MAX * 8 + 16] = "";
    for (int i = 0; i < TOKENS_MAX; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "t%d\n", i);
    is_int(parse(many, &t, err), 0, "TOKENS_MAX tokens");
    ok(tokens_count(t) == TOKENS_MAX && tokens_match(t, "Bearer t0") == 0 &&
           tokens_match(t, "Bearer t63") == TOKENS_MAX - 1, "every one of them matches");
    tokens_free(t);
    strcat(many, "one-more\n");
    ok(parse(many, &t, err) == -EINVAL && strstr(err, "more than"), "one more is refused (%s)",
       err);

    /* the environment's single token, empty included (spec 1.2 quirk) */
    is_int(tokens_one("env-tok", 7, &t), 0, "tokens_one");
    ok(m(t, "Bearer env-tok") && tokens_count(t) == 1, "it matches");
    tokens_free(t);
    is_int(tokens_one("", 0, &t), 0, "tokens_one, empty");
    ok(!m(t, "Bearer ") && !m(t, "Bearer") && !m(t, NULL), "an empty token matches nothing");
    tokens_free(t);

    test_names();

    /* files */
    char dir[] = "/tmp/test_auth.XXXXXX", path[64];
    ok(mkdtemp(dir) != NULL, "temp dir");
    snprintf(path, sizeof path, "%s/tokens", dir);
    FILE *f = fopen(path, "w");
    fputs("# two\nalpha\nbeta\n", f);
    fclose(f);
    is_int(tokens_read_file(path, &t, err, sizeof err), 0, "read a file (%s)", err);
    ok(tokens_count(t) == 2 && m(t, "Bearer beta"), "its tokens");
    tokens_free(t);
    char missing[80];
    snprintf(missing, sizeof missing, "%s/none", dir);
    ok(tokens_read_file(missing, &t, err, sizeof err) == -ENOENT && strstr(err, missing),
       "a missing file: -ENOENT and its path (%s)", err);
    ok(tokens_read_file(dir, &t, err, sizeof err) < 0, "a directory is refused (%s)", err);
    char fifo[80];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    ok(mkfifo(fifo, 0600) == 0 && tokens_read_file(fifo, &t, err, sizeof err) == -EINVAL &&
           strstr(err, "not a regular file"),
       "a FIFO is refused at once, not waited on (%s)", err);
    f = fopen(path, "w");
    for (unsigned long long i = 0; i <= TOKEN_FILE_MAX_BYTES / 8; i++)
        fputs("#comment\n", f);
    fclose(f);
    ok(tokens_read_file(path, &t, err, sizeof err) == -EFBIG, "a file over the limit (%s)", err);
    unlink(path);
    unlink(fifo);
    rmdir(dir);
    return tap_done();
}
