/* net/auth.c: the token file's syntax (one token a line, blanks and '#'
 * lines skipped), its refusals (which never quote a token), reading a file,
 * and matching against every token. */
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

int main(void)
{
    struct tokens *t = NULL;
    char err[256];

    is_int(parse("secret\n", &t, err), 0, "one token and a newline (the old format)");
    is_int(tokens_count(t), 1, "one token");
    ok(tokens_match(t, "Bearer secret") && tokens_match(t, "  Bearer secret\t"),
       "it matches, whitespace around the header stripped");
    ok(!tokens_match(t, "Bearer secre") && !tokens_match(t, "Bearer secret2") &&
           !tokens_match(t, "bearer secret") && !tokens_match(t, NULL) &&
           !tokens_match(t, "secret"),
       "near misses, another scheme, no header: no match");
    tokens_free(t);

    is_int(parse("# rotation, 2024-05\n\n  old-token  \r\n\t# a comment\nnew token\r\n \n", &t,
                 err), 0, "comments, blank lines, CRLF, blanks around");
    is_int(tokens_count(t), 2, "two tokens");
    ok(tokens_match(t, "Bearer old-token") && tokens_match(t, "Bearer new token"),
       "either token is accepted (a blank inside a token is kept)");
    ok(!tokens_match(t, "Bearer # a comment") && !tokens_match(t, "Bearer # rotation, 2024-05") &&
           !tokens_match(t, "Bearer ") && !tokens_match(t, "Bearer  old-token  x"),
       "comments and blank lines are not tokens");
    tokens_free(t);

    is_int(parse("last-without-newline", &t, err), 0, "no final newline");
    ok(tokens_match(t, "Bearer last-without-newline"), "the last line counts");
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
    ok(tokens_count(t) == TOKENS_MAX && tokens_match(t, "Bearer t0") &&
           tokens_match(t, "Bearer t63"), "every one of them matches");
    tokens_free(t);
    strcat(many, "one-more\n");
    ok(parse(many, &t, err) == -EINVAL && strstr(err, "more than"), "one more is refused (%s)",
       err);

    /* the environment's single token, empty included (spec 1.2 quirk) */
    is_int(tokens_one("env-tok", 7, &t), 0, "tokens_one");
    ok(tokens_match(t, "Bearer env-tok") && tokens_count(t) == 1, "it matches");
    tokens_free(t);
    is_int(tokens_one("", 0, &t), 0, "tokens_one, empty");
    ok(!tokens_match(t, "Bearer ") && !tokens_match(t, "Bearer") && !tokens_match(t, NULL),
       "an empty token matches nothing");
    tokens_free(t);

    /* files */
    char dir[] = "/tmp/test_auth.XXXXXX", path[64];
    ok(mkdtemp(dir) != NULL, "temp dir");
    snprintf(path, sizeof path, "%s/tokens", dir);
    FILE *f = fopen(path, "w");
    fputs("# two\nalpha\nbeta\n", f);
    fclose(f);
    is_int(tokens_read_file(path, &t, err, sizeof err), 0, "read a file (%s)", err);
    ok(tokens_count(t) == 2 && tokens_match(t, "Bearer beta"), "its tokens");
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
