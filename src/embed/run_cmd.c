/* `forkbox run [--workspace DIR] [--tools FILE.py] FILE.py...`: runs in the
 * forkbox process a user starts, only to exec the Python host that does the
 * work (forkbox_embed.py's main: one Sandbox, a block per file).
 *
 * Why a Python host: --tools names a Python module whose functions must run
 * on the host, outside the sandbox; only a Python process can call them, and
 * forkbox_embed.py is that host already (the embedding API). This command
 * adds nothing but finding it: the source tree's copy for the build tree's
 * forkbox (what is being tested, as config.c does for the policy), the
 * installed one otherwise. The host starts `forkbox sandbox` from this same
 * binary ($FORKBOX), so a build tree's run never mixes with an install. */
#include "embed/run_cmd.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef FORKBOX_PYTHON3          /* the host's interpreter (any python3 >= 3.9) */
#define FORKBOX_PYTHON3 "/usr/bin/python3"
#endif
#ifndef FORKBOX_RUN_HOST         /* the installed forkbox_embed.py */
#define FORKBOX_RUN_HOST "/usr/share/forkbox/client/forkbox_embed.py"
#endif
#ifndef FORKBOX_SOURCE_RUN_HOST  /* the source tree's, for the build tree's forkbox */
#define FORKBOX_SOURCE_RUN_HOST ""
#endif
#ifndef FORKBOX_BUILD_FORKBOX    /* the build tree's forkbox */
#define FORKBOX_BUILD_FORKBOX ""
#endif

static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return a[0] && b[0] && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

int run_cmd_main(int argc, char **argv)
{
    char self[PATH_MAX];
    if (!realpath("/proc/self/exe", self)) {
        fprintf(stderr, "forkbox run: /proc/self/exe: %s\n", strerror(errno));
        return 125;
    }
    const char *host = same_file("/proc/self/exe", FORKBOX_BUILD_FORKBOX)
                           ? FORKBOX_SOURCE_RUN_HOST : FORKBOX_RUN_HOST;
    /* python3 HOST run ARGS...: argv[0] is "run", so it passes as is. */
    char **pargv = calloc((size_t)argc + 3, sizeof *pargv);
    if (!pargv || setenv("FORKBOX", self, 1) < 0) {
        fprintf(stderr, "forkbox run: out of memory\n");
        return 125;
    }
    pargv[0] = (char *)FORKBOX_PYTHON3;
    pargv[1] = (char *)host;
    for (int i = 0; i < argc; i++)
        pargv[2 + i] = argv[i];
    execv(FORKBOX_PYTHON3, pargv);
    fprintf(stderr, "forkbox run: cannot run %s %s: %s\n", FORKBOX_PYTHON3, host, strerror(errno));
    free(pargv);
    return 125;
}
