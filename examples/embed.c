/* examples/embed.c: a C host that runs one block in a forkbox sandbox with the
 * embedding API (forkbox/embed.h), answers its tool call, and reads back the
 * file the block wrote. Runs as the host program; tests/embed runs it.
 *
 *     cc embed.c $(pkg-config --cflags --libs forkbox-embed) -o embed
 *     ./embed [FORKBOX]      (default: $FORKBOX, else the installed forkbox)
 *
 * The tools package is written by hand here: one stub per host function, in
 * the form the spec's section 5 describes (a Python host generates it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <forkbox/embed.h>

static const char TOOLS_INIT[] =
    "from adk_code_mode_sandbox._rpc_client import call as _call\n"
    "\n"
    "def add(*, a, b):\n"
    "    \"\"\"Add two numbers (runs on the host).\"\"\"\n"
    "    return _call('add', {'a': a, 'b': b})\n";

static const char BLOCK[] =
    "import tools\n"
    "total = tools.add(a=2, b=40)\n"
    "print('the host says', total)\n"
    "with open('answer.txt', 'w') as f:\n"
    "    f.write(f'{total}\\n')\n";

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(text, f);
    return fclose(f);
}

/* The host's side of one tool call: add(a, b), or an error result. */
static cJSON *answer(const cJSON *call)
{
    cJSON *res = cJSON_CreateObject();
    cJSON_AddItemToObject(res, "id", cJSON_Duplicate(cJSON_GetObjectItem(call, "id"), 1));
    const cJSON *name = cJSON_GetObjectItem(call, "name");
    const cJSON *args = cJSON_GetObjectItem(call, "args");
    const cJSON *a = cJSON_GetObjectItem(args, "a"), *b = cJSON_GetObjectItem(args, "b");
    if (cJSON_IsString(name) && strcmp(name->valuestring, "add") == 0 && cJSON_IsNumber(a) &&
        cJSON_IsNumber(b)) {
        cJSON_AddTrueToObject(res, "ok");
        cJSON_AddNumberToObject(res, "value", a->valuedouble + b->valuedouble);
        cJSON_AddNullToObject(res, "error");
    } else {
        cJSON_AddFalseToObject(res, "ok");
        cJSON_AddNullToObject(res, "value");
        cJSON *e = cJSON_AddObjectToObject(res, "error");
        cJSON_AddStringToObject(e, "type", "ToolNotFound");
        cJSON_AddStringToObject(e, "message", "no such tool");
        cJSON_AddNullToObject(e, "trace");
    }
    cJSON_AddStringToObject(res, "kind", "tool_result");
    return res;
}

static const char *kind_of(const cJSON *frame)
{
    return cJSON_GetObjectItem(frame, "kind")->valuestring;  /* recv checked it is a string */
}

int main(int argc, char **argv)
{
    char work[] = "/tmp/forkbox-embed-XXXXXX";
    char ws[64], tools[64], init[64], path[64], err[256];
    if (!mkdtemp(work))
        return perror("mkdtemp"), 1;
    snprintf(ws, sizeof ws, "%s/ws", work);
    snprintf(tools, sizeof tools, "%s/tools", work);
    snprintf(init, sizeof init, "%s/tools/__init__.py", work);
    /* The workspace is the block's as its owner's (any owner, any mode:
     * here ours, 0700); the tools dir is read by an unprivileged id through
     * its mode, hence 0755 and 0644. */
    if (mkdir(ws, 0700) < 0 || mkdir(tools, 0755) < 0 || write_file(init, TOOLS_INIT) < 0)
        return perror("setup"), 1;

    struct forkbox_sandbox_opts opts = {
        .forkbox = argc > 1 ? argv[1] : NULL, .workdir = ws, .tools_dir = tools};
    struct forkbox_sandbox *sb;
    int rc = forkbox_sandbox_start(&opts, &sb, err, sizeof err);
    if (rc < 0)
        return fprintf(stderr, "start: %s\n", err), 1;

    int status = 1;
    cJSON *f = NULL;
    if ((rc = forkbox_sandbox_recv(sb, 60000, &f, err, sizeof err)) < 0 ||
        strcmp(kind_of(f), "ready") != 0)
        goto fail;
    printf("ready: protocol %d\n", cJSON_GetObjectItem(f, "protocol_version")->valueint);
    cJSON_Delete(f);

    cJSON *run = cJSON_CreateObject();
    cJSON_AddStringToObject(run, "code", BLOCK);
    cJSON_AddStringToObject(run, "kind", "run");
    rc = forkbox_sandbox_send(sb, run, err, sizeof err);
    cJSON_Delete(run);
    if (rc < 0)
        goto fail;
    /* Frames until done: tool calls are answered as they come. */
    for (;;) {
        if ((rc = forkbox_sandbox_recv(sb, 60000, &f, err, sizeof err)) < 0)
            goto fail;
        if (strcmp(kind_of(f), "tool_call") == 0) {
            char *args = cJSON_PrintUnformatted(cJSON_GetObjectItem(f, "args"));
            printf("tool_call %s %s\n", cJSON_GetObjectItem(f, "name")->valuestring, args);
            free(args);
            cJSON *res = answer(f);
            rc = forkbox_sandbox_send(sb, res, err, sizeof err);
            cJSON_Delete(res);
            if (rc < 0)
                goto fail;
        } else if (strcmp(kind_of(f), "done") == 0) {
            printf("done: exit_code %d\n", cJSON_GetObjectItem(f, "exit_code")->valueint);
            cJSON_Delete(f);
            break;
        }
        cJSON_Delete(f);
    }
    if ((rc = forkbox_sandbox_recv(sb, 60000, &f, err, sizeof err)) < 0 ||
        strcmp(kind_of(f), "output") != 0)
        goto fail;
    printf("stdout: %s", cJSON_GetObjectItem(f, "stdout")->valuestring);
    cJSON_Delete(f);

    /* The workspace is the host's directory: the block's file is here now. */
    snprintf(path, sizeof path, "%s/ws/answer.txt", work);
    FILE *ans = fopen(path, "r");
    char line[64] = "";
    if (ans && fgets(line, sizeof line, ans))
        printf("workspace: answer.txt: %s", line);
    if (ans)
        fclose(ans);

    cJSON *bye = cJSON_CreateObject();
    cJSON_AddStringToObject(bye, "kind", "shutdown");
    forkbox_sandbox_send(sb, bye, err, sizeof err);
    cJSON_Delete(bye);
    int st;
    if (forkbox_sandbox_wait(sb, 10000, &st) == 0 && WIFEXITED(st)) {
        printf("sandbox exited %d\n", WEXITSTATUS(st));
        status = WEXITSTATUS(st) != 0;
    }
    forkbox_sandbox_free(sb);
    unlink(path);
    unlink(init);
    rmdir(tools);
    rmdir(ws);
    rmdir(work);
    return status;

fail:
    fprintf(stderr, "embed: %s\n", rc < 0 ? err : "unexpected frame");
    cJSON_Delete(f);
    forkbox_sandbox_free(sb);
    return 1;
}
