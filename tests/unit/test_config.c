/* config: defaults, flags, environment, bounds, and the fork server argv
 * round trip (which must never carry the token). */
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "tap.h"

static int parse(struct config *c, char *err, int argc, const char **argv)
{
    return config_parse(argc, (char **)argv, c, err, 256);
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
    ok(c.isolate, "isolated by default");
    is_int(c.pool_size, 4, "four pre-forked sandboxes by default");
    is_int(c.preauth_max, 1024, "default pre-auth pool 1024");
    is_int(c.preauth_per_peer, 128, "default per-peer share 128");

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

    const char *bad[][2] = {{"forkboxd", "--capacity=0"}, {"forkboxd", "--listen=nope"},
                            {"forkboxd", "--tools-dir=/x/tool"}, {"forkboxd", "--bogus"},
                            {"forkboxd", "--output-cap=1"}, {"forkboxd", "--log-level=loud"},
                            {"forkboxd", "--preauth-max=0"}, {"forkboxd", "--preauth-per-peer=x"}};
    for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ok(parse(&c, err, 2, bad[i]) < 0 && err[0], "refused: %s (%s)", bad[i][1], err);

    /* The fork server's argv reproduces the config exactly. */
    const char *a3[] = {"forkboxd", "--listen=[::1]:7", "--preload=json,re", "--no-isolation",
                        "--site-packages=/opt/x", "--token-file=/secret/t", "--pool=3",
                        "--preauth-max=77", "--preauth-per-peer=0"};
    is_int(parse(&c, err, 9, a3), 0, "config for the round trip");
    ok(c.preauth_max == 77 && c.preauth_per_peer == 0, "--preauth-max, --preauth-per-peer");
    char **v = config_to_argv(&c, "forkboxd", NULL);
    int n = 0;
    int has_secret = 0;
    while (v[n]) {
        if (strstr(v[n], "secret"))
            has_secret = 1;
        n++;
    }
    ok(!has_secret, "the fork server argv carries no token file");
    is_int(config_parse(n, v, &d, err, sizeof err), 0, "the argv parses back");
    memset(d.token_file, 0, sizeof d.token_file);
    memset(c.token_file, 0, sizeof c.token_file);
    ok(memcmp(&c, &d, sizeof c) == 0, "same config after the round trip");
    config_argv_free(v);
    return tap_done();
}
