/* config: defaults, flags, the --config file, environment, bounds, and the fork server argv
 * round trip (which must never carry the token). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.h"
#include "tap.h"

static int parse(struct config *c, char *err, int argc, const char **argv)
{
    return config_parse(argc, (char **)argv, c, err, 256);
}

/* Write text to a fresh temporary file; its path in path (PATH_MAX). */
static void write_tmp(char *path, const char *text)
{
    strcpy(path, "/tmp/fbconfig-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        abort();
    close(fd);
}

/* --config FILE: the same rows as the flags; file < environment < flags. */
static void test_config_file(void)
{
    struct config c;
    char err[256], path[64];
    write_tmp(path, "# forkboxd.conf\n"
                    "\n"
                    "listen = 127.0.0.3:8081   # trailing comment\n"
                    "capacity 7\n"
                    "  pool=2\n"
                    "memory = 512M\n"
                    "single-use = false\n"
                    "token-file /etc/forkbox/to#ken\n"
                    "site-packages /opt/a\n"
                    "max-upload-tools 2000\n");
    const char *a[] = {"forkboxd", "--config", path};
    is_int(parse(&c, err, 3, a), 0, "--config parses (%s)", err);
    ok(!strcmp(c.listen_host, "127.0.0.3") && c.listen_port == 8081, "listen = from the file");
    ok(c.capacity == 7 && c.pool_size == 2 && c.memory_max == 512ULL << 20,
       "name value, name=value, sizes");
    ok(!c.single_use, "a flag set to false stays off");
    is_str(c.token_file, "/etc/forkbox/to#ken", "'#' inside a value is not a comment");
    ok(c.n_site_dirs == 1 && !strcmp(c.site_dirs[0], "/opt/a"), "repeatable setting");
    is_str(c.config_file, path, "the file read is recorded");
    char eq[80];
    snprintf(eq, sizeof eq, "--config=%s", path);
    const char *b[] = {"forkboxd", "--capacity", "9", eq, "--pool", "1"};
    is_int(parse(&c, err, 6, b), 0, "flags before and after --config");
    ok(c.capacity == 9 && c.pool_size == 1 && c.memory_max == 512ULL << 20,
       "flags override the file wherever they stand");
    setenv("ADK_CODE_MODE_MAX_UPLOAD_TOOLS", "3000", 1);
    is_int(parse(&c, err, 3, a), 0, "file and environment");
    is_int(c.max_upload_tools, 3000, "the environment overrides the file");
    unsetenv("ADK_CODE_MODE_MAX_UPLOAD_TOOLS");
    const char *p2[] = {"forkboxd", "--preload", "--config"};
    ok(parse(&c, err, 3, p2) == 0 && !strcmp(c.preload, "--config") && !c.config_file[0],
       "an argument that reads --config is not the flag");
    unlink(path);

    static const struct { const char *text, *why; } bad[] = {
        {"capacity 7\nfrobnicate 3\n", ":2: frobnicate: not a setting"},
        {"capacity\n", ":1: capacity: no value"},
        {"capacity = 0\n", ":1: --capacity: expected 1..1000000"},
        {"single-use yes\n", ":1: single-use: a flag takes no value"},
        {"config /etc/x\n", ":1: config: not a setting"},
        {"help\n", ":1: help: not a setting"},
        {"uid 5\n", ":1: --uid and --gid are gone"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_tmp(path, bad[i].text);
        ok(parse(&c, err, 3, a) < 0 && strstr(err, path) && strstr(err, bad[i].why),
           "refused with file:line: %s", err);
        unlink(path);
    }
    const char *missing[] = {"forkboxd", "--config", "/nonexistent/forkboxd.conf"};
    ok(parse(&c, err, 3, missing) < 0 && strstr(err, "--config /nonexistent/forkboxd.conf: No such"),
       "a missing file is an error (%s)", err);
}

int main(void)
{
    struct config c, d;
    char err[256];
    unsetenv("PORT");
    unsetenv("ADK_CODE_MODE_MAX_UPLOAD_TOOLS");
    unsetenv("ADK_CODE_MODE_TOOLS_DIR");

    const char *a0[] = {"forkboxd"};
    is_int(parse(&c, err, 1, a0), 0, "no flags parse");
    is_str(c.listen_host, "127.0.0.1", "default host is loopback");
    is_int(c.listen_port, 8080, "default port 8080");
    is_int(c.capacity, 64, "default capacity 64");
    is_int(c.max_upload_tools, 104857600, "default tools upload limit");
    is_int(c.output_cap, 16 << 20, "default output cap 16 MiB");
    is_str(c.tools_dir, "/tools", "default tools dir");
    is_int(c.idle_timeout_ms, 600000, "default idle 600 s");
    is_int(c.block_timeout_ms, 900000, "default block timeout 900 s");
    is_int(c.turn_timeout_ms, 7200000, "default turn timeout 7200 s");
    ok(c.isolate, "isolated by default");
    is_int(c.pool_size, 4, "four pre-forked sandboxes by default");
    is_int(c.preauth_max, 1024, "default pre-auth pool 1024");
    is_int(c.preauth_per_peer, 128, "default per-peer share 128");
    is_int(c.turn_buffer, 32 << 20, "default turn buffer: a few windows (32 MiB)");

    setenv("PORT", "9999", 1);
    is_int(parse(&c, err, 1, a0), 0, "PORT alone");
    is_str(c.listen_host, "0.0.0.0", "PORT alone binds 0.0.0.0 like the reference");
    is_int(c.listen_port, 9999, "PORT value used");
    const char *a1[] = {"forkboxd", "--listen", "127.0.0.2:0"};
    is_int(parse(&c, err, 3, a1), 0, "--listen wins over PORT");
    is_str(c.listen_host, "127.0.0.2", "--listen host");
    is_int(c.listen_port, 0, "--listen port 0");
    unsetenv("PORT");

    setenv("ADK_CODE_MODE_MAX_UPLOAD_TOOLS", "1234", 1);
    is_int(parse(&c, err, 1, a0), 0, "upload env");
    is_int(c.max_upload_tools, 1234, "ADK_CODE_MODE_MAX_UPLOAD_TOOLS read");
    setenv("ADK_CODE_MODE_MAX_UPLOAD_TOOLS", "12x", 1);
    ok(parse(&c, err, 1, a0) < 0 && strstr(err, "ADK_CODE_MODE_MAX_UPLOAD_TOOLS"),
       "bad upload env refused with its name (%s)", err);
    unsetenv("ADK_CODE_MODE_MAX_UPLOAD_TOOLS");

    const char *a2[] = {"forkboxd", "--output-cap=64K", "--memory", "2G", "--site-packages",
                        "/opt/a", "--site-packages=/opt/b", "--single-use", "--block-timeout=7"};
    is_int(parse(&c, err, 9, a2), 0, "sizes and repeats");
    is_int(c.output_cap, 65536, "K suffix");
    is_int(c.memory_max, 2ULL << 30, "G suffix");
    is_int(c.n_site_dirs, 2, "two site dirs");
    is_str(c.site_dirs[1], "/opt/b", "second site dir");
    ok(c.single_use && c.capacity == 1, "single-use means capacity 1");
    is_int(c.block_timeout_ms, 7000, "seconds to ms");
    const char *a_none[] = {"forkboxd", "--block-timeout=0", "--turn-timeout", "0"};
    is_int(parse(&c, err, 4, a_none), 0, "0 timeouts parse");
    ok(c.block_timeout_ms == 0 && c.turn_timeout_ms == 0, "0 is an explicit none");
    is_int(c.cpu_weight, 0, "CPU weight per running turn by default");
    const char *a_w[] = {"forkboxd", "--cpu-weight=250"};
    is_int(parse(&c, err, 2, a_w), 0, "--cpu-weight parses");
    is_int(c.cpu_weight, 250, "--cpu-weight value");

    const char *bad[][2] = {{"forkboxd", "--capacity=0"}, {"forkboxd", "--listen=nope"},
                            {"forkboxd", "--tools-dir=/x/tool"}, {"forkboxd", "--bogus"},
                            {"forkboxd", "--output-cap=1"}, {"forkboxd", "--log-level=loud"},
                            {"forkboxd", "--preauth-max=0"}, {"forkboxd", "--preauth-per-peer=x"},
                            {"forkboxd", "--cpu-weight=10001"}};
    for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ok(parse(&c, err, 2, bad[i]) < 0 && err[0], "refused: %s (%s)", bad[i][1], err);

    /* --log-format, and the journal verdict the fork server shares. */
    unsetenv("JOURNAL_STREAM");
    is_int(parse(&c, err, 1, a0), 0, "defaults");
    ok(c.log_format == LOG_FORMAT_TEXT && !c.log_journal, "text, not the journal, by default");
    const char *lf[] = {"forkboxd", "--log-format=json", "--log-level=warn"};
    is_int(parse(&c, err, 3, lf), 0, "--log-format json");
    ok(c.log_format == LOG_FORMAT_JSON && c.log_level == LOG_LEVEL_WARN, "json and warn");
    const char *lfbad[] = {"forkboxd", "--log-format=xml"};
    ok(parse(&c, err, 2, lfbad) < 0 && strstr(err, "one of text, json, got xml"),
       "a bad format is refused with the choices (%s)", err);
    const char *llbad[] = {"forkboxd", "--log-level=loud"};
    ok(parse(&c, err, 2, llbad) < 0 && strstr(err, "one of debug, info, warn, error"),
       "a bad level is refused with the choices (%s)", err);
    struct stat st;
    char js[64];
    fstat(STDERR_FILENO, &st);
    snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    setenv("JOURNAL_STREAM", js, 1);
    is_int(parse(&c, err, 3, lf), 0, "with $JOURNAL_STREAM naming stderr");
    config_for_forkserver(&c, &d);
    ok(c.log_journal && d.log_journal && d.log_format == LOG_FORMAT_JSON &&
           d.log_level == LOG_LEVEL_WARN,
       "stderr is the journal; the fork server is told so, and gets the format and level");
    snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino + 1);
    setenv("JOURNAL_STREAM", js, 1);
    is_int(parse(&c, err, 1, a0), 0, "with $JOURNAL_STREAM naming another file");
    ok(!c.log_journal, "another inode: not the journal");
    unsetenv("JOURNAL_STREAM");

    /* Host ids: a range of their own, big enough, with no special id. */
    is_int(parse(&c, err, 1, a0), 0, "defaults again");
    ok(c.id_first == 2013265920u && c.id_count == 65536, "default --id-range 2013265920:65536");
    const char *ir[] = {"forkboxd", "--id-range=3000000:1000", "--capacity=10", "--pool=2"};
    is_int(parse(&c, err, 4, ir), 0, "--id-range FIRST:COUNT");
    ok(c.id_first == 3000000 && c.id_count == 1000, "--id-range parsed");
    const char *small[] = {"forkboxd", "--id-range=3000000:23", "--capacity=10", "--pool=2"};
    ok(parse(&c, err, 4, small) < 0 && strstr(err, "needs at least 24"),
       "a range under twice capacity + pool is refused (%s)", err);
    const char *just[] = {"forkboxd", "--id-range=3000000:24", "--capacity=10", "--pool=2"};
    is_int(parse(&c, err, 4, just), 0, "exactly twice capacity + pool is enough");
    const char *badids[][2] = {{"forkboxd", "--id-range=0:1000"},
                               {"forkboxd", "--id-range=65000:1000"},
                               {"forkboxd", "--id-range=4294967000:1000"},
                               {"forkboxd", "--id-range=100000"},
                               {"forkboxd", "--id-range=100000:0"},
                               {"forkboxd", "--uid=1234"},
                               {"forkboxd", "--gid=1234"},
                               {"forkboxd", "--sandbox-exe=forkbox-sandbox"}};
    for (unsigned i = 0; i < sizeof badids / sizeof badids[0]; i++)
        ok(parse(&c, err, 2, badids[i]) < 0 && err[0], "refused: %s (%s)", badids[i][1], err);

    /* The fork server's share: the supervisor's own settings are not in it. */
    const char *a3[] = {"forkboxd", "--listen=[::1]:7", "--preload=json,re", "--no-isolation",
                        "--site-packages=/opt/x", "--token-file=/secret/t", "--pool=3",
                        "--block-timeout=9", "--max-upload-tools=5", "--id-range=3000000:1000",
                        "--preauth-max=77", "--preauth-per-peer=0",
                        "--sandbox-module=/opt/fb/forkbox-sandbox.so"};
    is_int(parse(&c, err, 13, a3), 0, "config for the fork server");
    ok(!strcmp(c.sandbox_module, "/opt/fb/forkbox-sandbox.so"), "--sandbox-module");
    ok(c.preauth_max == 77 && c.preauth_per_peer == 0, "--preauth-max, --preauth-per-peer");
    config_for_forkserver(&c, &d);
    ok(!d.listen_host[0] && d.listen_port == 0 && !d.token_file[0] &&
           d.block_timeout_ms == 0 && d.idle_timeout_ms == 0 && d.max_upload_tools == 0,
       "no listen address, token file, timeouts or upload limits");
    ok(!memmem(&d, sizeof d, "secret", 6) && !memmem(&d, sizeof d, "::1", 3) &&
           !memmem(&d, sizeof d, "/opt/fb", 7),
       "no byte of them either (nor of its own executable's path)");
    ok(d.pool_size == 3 && !d.isolate && d.n_site_dirs == 1 && !strcmp(d.preload, "json,re") &&
           d.id_first == 3000000 && d.id_count == 1000 && d.capacity == c.capacity &&
           d.output_cap == c.output_cap && d.max_unpacked == c.max_unpacked &&
           !strcmp(d.policy_file, c.policy_file),
       "what the fork server uses is kept");
    /* The fork server's share is an allow-list: every supervisor-only
     * setting is zero, whatever it was set to. */
    const char *a4[] = {"forkboxd", "--single-use", "--turn-buffer=2M", "--total-buffer=3G",
                        "--preauth-max=5", "--turn-timeout=5", "--idle-timeout=5",
                        "--max-upload-workspace=7"};
    is_int(parse(&c, err, 8, a4), 0, "supervisor-only settings");
    config_for_forkserver(&c, &d);
    ok(!d.single_use && d.turn_buffer == 0 && d.total_buffer == 0 && d.preauth_max == 0 &&
           d.turn_timeout_ms == 0 && d.max_upload_workspace == 0 && d.capacity == 1,
       "none of them reaches the fork server (capacity 1 does)");

    /* One table drives parsing, defaults and --help: it agrees with itself,
     * and a refusal names the bounds. */
    err[0] = '\0';
    is_int(config_table_check(err, sizeof err), 0, "option table consistent (%s)", err);
    const char *b1[] = {"forkboxd", "--output-cap=12x"};
    ok(parse(&c, err, 2, b1) < 0 && strstr(err, "1K..100M"), "size bounds in the message (%s)", err);
    const char *b2[] = {"forkboxd", "--pool=100001"};
    ok(parse(&c, err, 2, b2) < 0 && strstr(err, "0..100000,"), "number bounds in the message (%s)",
       err);
    const char *b3[] = {"forkboxd", "--turn-buffer=2G", "--total-buffer=1G"};
    ok(parse(&c, err, 3, b3) < 0 && strstr(err, "--total-buffer (1G)"), "buffers related (%s)", err);

    char help[8192] = "";
    FILE *tmp = tmpfile();
    fflush(stdout);
    int saved = dup(1);
    dup2(fileno(tmp), 1);
    const char *h[] = {"forkboxd", "--help"};
    int hr = parse(&c, err, 2, h);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    rewind(tmp);
    size_t hn = fread(help, 1, sizeof help - 1, tmp);
    help[hn] = '\0';
    fclose(tmp);
    is_int(hr, 1, "--help returns 1");
    ok(!strncmp(help, "usage: forkboxd [options]\n  --listen ADDR:PORT         address to serve "
                      "(default 127.0.0.1:8080; with only\n                             $PORT set",
                21 + 91) &&
           strstr(help, "\n  --max-upload-workspace SIZE  workspace archive limit ($..._WORKSPACE, "
                        "100M)\n") &&
           strstr(help, "\n  --single-use               one turn, then exit 0") &&
           strstr(help, "\n  --log-level LEVEL          debug, info, warn, error (info)\n") &&
           strstr(help, "\n  --log-format FORMAT        text, or json: one JSON object per line "
                        "(text)\nSIZE accepts K, M and G suffixes (powers of 1024).\n") &&
           !strstr(help, "--uid") && !strstr(help, "--help"),
       "--help laid out as before, removed flags not listed");
    test_config_file();
    return tap_done();
}
