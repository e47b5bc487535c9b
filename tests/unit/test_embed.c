/* Unit tests for libforkbox-embed (src/embed/embed.c) against a stand-in
 * `forkbox` (a python3 script) that reports what it was started with: the
 * channel on fd 3 and nothing else of the host's, the three variables and
 * none of the host's ADK_CODE_MODE_*, default signals, frames one a line,
 * and the error codes of recv and wait. No root needed: no real sandbox. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <forkbox/embed.h>

#include "tap.h"

static const char STANDIN[] =
    "#!/usr/bin/python3\n"
    "import json, os, sys\n"
    "def send(o):\n"
    "    os.write(3, (json.dumps(o) + '\\n').encode())\n"
    "if '--quiet' in sys.argv:\n"
    "    while os.read(3, 4096): pass\n"
    "    sys.exit(0)\n"
    "fds = sorted(int(x) for x in os.listdir('/proc/self/fd'))\n"
    "st = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines()\n"
    "          if ':\\t' in l)\n"
    "env = {k: v for k, v in os.environ.items() if k.startswith('ADK_') or k == 'FORKBOX'}\n"
    "send({'kind': 'ready', 'argv': sys.argv[1:], 'fds': fds, 'env': env,\n"
    "      'sigign': int(st['SigIgn'], 16), 'sigblk': int(st['SigBlk'], 16),\n"
    "      'stdin': os.readlink('/proc/self/fd/0')})\n"
    "line = b''\n"
    "while not line.endswith(b'\\n'):\n"
    "    line += os.read(3, 65536)\n"
    "send({'kind': 'echo', 'got': line.decode()})\n"
    "os.write(3, b'not json\\n{\"kind\":\"partial\"')\n"
    "sys.exit(5)\n";

static char dir[] = "/tmp/test-embed-XXXXXX";
static char standin[64], tools[64];

static const char *str_of(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void test_start_and_frames(void)
{
    char err[256] = "";
    /* What the child must not get: a host fd without close-on-exec, an
     * ignored SIGTERM, a blocked SIGUSR1, a transport variable that would
     * win over the fd, and $FORKBOX. */
    int leak = open("/dev/null", O_RDONLY);
    signal(SIGTERM, SIG_IGN);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    setenv("ADK_CODE_MODE_CONTROL_TCP", "192.0.2.1:9", 1);
    setenv("FORKBOX", "/nonexistent", 1);

    char *args[] = {"--log-level", "warn", NULL};
    struct forkbox_sandbox_opts o = {.forkbox = standin, .workdir = dir, .tools_dir = tools,
                                     .args = args};
    struct forkbox_sandbox *sb = NULL;
    int r = forkbox_sandbox_start(&o, &sb, err, sizeof err);
    is_int(r, 0, "start: %s", err);
    close(leak);
    signal(SIGTERM, SIG_DFL);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    unsetenv("ADK_CODE_MODE_CONTROL_TCP");
    unsetenv("FORKBOX");
    if (r < 0)
        return;

    cJSON *f = NULL;
    r = forkbox_sandbox_recv(sb, 30000, &f, err, sizeof err);
    is_int(r, 0, "recv ready: %s", err);
    is_str(str_of(f, "kind"), "ready", "the first frame is the stand-in's");
    char *argv = cJSON_PrintUnformatted(cJSON_GetObjectItem(f, "argv"));
    is_str(argv, "[\"sandbox\",\"--log-level\",\"warn\"]", "argv: sandbox, then opts.args");
    char *fds = cJSON_PrintUnformatted(cJSON_GetObjectItem(f, "fds"));
    /* 0-2, the channel, and the directory fd listing them: no host fd */
    is_str(fds, "[0,1,2,3,4]", "no fd of the host's but the channel on 3");
    const cJSON *env = cJSON_GetObjectItem(f, "env");
    is_int(cJSON_GetArraySize(env), 3, "three variables, none of the host's ADK_/FORKBOX");
    is_str(str_of(env, "ADK_CODE_MODE_CONTROL_FD"), "3", "CONTROL_FD=3");
    is_str(str_of(env, "ADK_CODE_MODE_WORKDIR"), dir, "WORKDIR");
    is_str(str_of(env, "ADK_CODE_MODE_TOOLS_DIR"), tools, "TOOLS_DIR");
    double ign = cJSON_GetObjectItem(f, "sigign")->valuedouble;
    ok(!((unsigned long long)ign & (1ULL << (SIGTERM - 1))), "SIGTERM not ignored in the child");
    is_int(cJSON_GetObjectItem(f, "sigblk")->valuedouble, 0, "no signal blocked in the child");
    is_str(str_of(f, "stdin"), "/dev/null", "stdin is /dev/null");
    free(argv);
    free(fds);
    cJSON_Delete(f);

    cJSON *bad = cJSON_CreateArray();
    is_int(forkbox_sandbox_send(sb, bad, err, sizeof err), -EINVAL, "send: not an object");
    cJSON_Delete(bad);
    cJSON *run = cJSON_CreateObject();
    cJSON_AddStringToObject(run, "code", "a\nb");
    cJSON_AddStringToObject(run, "kind", "run");
    is_int(forkbox_sandbox_send(sb, run, err, sizeof err), 0, "send run: %s", err);
    cJSON_Delete(run);
    r = forkbox_sandbox_recv(sb, 30000, &f, err, sizeof err);
    is_str(r == 0 ? str_of(f, "got") : NULL, "{\"code\":\"a\\nb\",\"kind\":\"run\"}\n",
           "sent as one compact line, the newline in code escaped");
    cJSON_Delete(f);
    is_int(forkbox_sandbox_recv(sb, 30000, &f, err, sizeof err), -EBADMSG,
           "a line that is not JSON: -EBADMSG (%s)", err);
    ok(f == NULL, "no frame with an error");
    is_int(forkbox_sandbox_recv(sb, 30000, &f, err, sizeof err), -EPIPE,
           "EOF after a partial line: -EPIPE (%s)", err);
    int st = -1;
    is_int(forkbox_sandbox_wait(sb, 30000, &st), 0, "wait");
    ok(WIFEXITED(st) && WEXITSTATUS(st) == 5, "the exit status is the child's (5)");
    is_int(forkbox_sandbox_kill(sb), 0, "kill after the exit: 0");
    forkbox_sandbox_free(sb);
}

static void test_timeout_and_kill(void)
{
    char err[256] = "";
    char *args[] = {"--quiet", NULL};
    struct forkbox_sandbox_opts o = {.forkbox = standin, .workdir = dir, .tools_dir = tools,
                                     .args = args};
    struct forkbox_sandbox *sb = NULL;
    if (forkbox_sandbox_start(&o, &sb, err, sizeof err) < 0) {
        ok(0, "start: %s", err);
        return;
    }
    cJSON *f = NULL;
    is_int(forkbox_sandbox_recv(sb, 100, &f, err, sizeof err), -ETIMEDOUT, "recv: -ETIMEDOUT");
    int st = -1;
    is_int(forkbox_sandbox_wait(sb, 100, &st), -ETIMEDOUT, "wait: -ETIMEDOUT while it runs");
    is_int(forkbox_sandbox_kill(sb), 0, "kill");
    is_int(forkbox_sandbox_wait(sb, 30000, &st), 0, "wait after kill");
    ok(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "killed by SIGKILL");
    forkbox_sandbox_free(sb);
}

static void test_bad_options(void)
{
    char err[256] = "";
    struct forkbox_sandbox *sb = (struct forkbox_sandbox *)1;
    struct forkbox_sandbox_opts o = {.forkbox = standin, .workdir = dir};
    is_int(forkbox_sandbox_start(&o, &sb, err, sizeof err), -EINVAL, "no tools_dir: -EINVAL");
    ok(sb == NULL, "*out is NULL on failure");
    o.tools_dir = tools;
    o.forkbox = "/nonexistent/forkbox";
    is_int(forkbox_sandbox_start(&o, &sb, err, sizeof err), -ENOENT, "no such binary: -ENOENT");
    ok(strstr(err, "/nonexistent/forkbox") != NULL, "the reason names it: %s", err);
    forkbox_sandbox_free(NULL);
}

int main(void)
{
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    snprintf(standin, sizeof standin, "%s/forkbox", dir);
    snprintf(tools, sizeof tools, "%s/tools", dir);
    FILE *fp = fopen(standin, "w");
    if (!fp || fputs(STANDIN, fp) < 0 || fclose(fp) != 0 || chmod(standin, 0755) < 0 ||
        mkdir(tools, 0755) < 0)
        return perror("setup"), 1;
    test_start_and_frames();
    test_timeout_and_kill();
    test_bad_options();
    unlink(standin);
    rmdir(tools);
    rmdir(dir);
    return tap_done();
}
