/* Runs as the fork server: forkbox-sandbox's main, and through it every
 * sandbox child.
 *
 * Only forkboxd starts it (fsclient.c): argv is exactly FS_ARGV, fd 3 the
 * control socket, the environment a fixed minimal one; the configuration
 * comes as the first record on fd 3, never in argv (sandboxes read this
 * process's command line as their own).
 *
 * Why an executable of its own: it links the interpreter the way Debian's
 * python3 does, the static libpython in a non-PIE executable that exports
 * the C API (Py*, _Py*) to extension modules, which runs pure-Python code
 * ~1.3x faster than the position-independent libpython3.11.so. Dropping PIE
 * costs this process nothing: every sandbox is a clone of it, shares its
 * layout and may read its own /proc/self/maps, and its only input is the
 * supervisor. forkboxd, which parses the network's and the sandboxes' bytes
 * and holds the token, stays PIE and links no Python at all. */
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>

#include "core/log.h"
#include "core/util.h"
#include "sandbox/forkserver.h"

int main(int argc, char **argv)
{
    if (argc != 2 || strcmp(argv[1], FS_ARGV_FLAG) != 0) {
        fprintf(stderr, "forkbox-sandbox: the fork server of forkboxd, started by it only\n");
        return 2;
    }
    /* Exec'd by fd, the kernel names us after the fd's number: say what we
     * are in ps and in every sandbox's /proc/self/comm. */
    prctl(PR_SET_NAME, "forkbox-sandbox", 0, 0, 0);
    raise_nofile();
    log_init("forkserver", LOG_LEVEL_INFO);
    forkserver_main(3);
}
