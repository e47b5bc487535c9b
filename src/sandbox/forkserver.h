/* Used in the supervisor (fs_client_*, fsclient.c) and the fork server
 * (forkserver_main, forkserver.c): starting the fork server and talking to
 * it (the records: fsproto.h, which says what the fork server is). */
#pragma once
#include <stdint.h>
#include <sys/types.h>

#include "config/config.h"
#include "sandbox/fsproto.h"

/* --- supervisor side --- */

struct fs_client {
    int ctl_fd;  /* owned; non-blocking SEQPACKET to the fork server; -1 while none runs */
    pid_t pid;   /* the fork server; 0 while none runs */
    int exe_fd;  /* owned: python3.11, opened and checked once (fs_client_open);
                    every start, restarts too, execs this very file */
    int mod_fd;  /* owned: forkbox-sandbox.so, likewise: every start loads this very file */
    int log_fd;  /* borrowed: every start's stderr (forkboxd's log pipe, loop/logq.h),
                    or -1 to share ours */
};

/* The fork server is Debian's python3.11 running forkbox-sandbox.so
 * (sandbox_module.c says why). Its whole command line, and so every
 * sandbox's /proc/self/cmdline: the interpreter's flags (isolated: no
 * environment variables, no user site, no script directory on sys.path;
 * no bytecode written; UTF-8 mode), "-" (the program is read from fd 0),
 * and a marker; no path, nothing configured. argv[0] stays "forkboxd":
 * what sandboxes see did not change when the fork server became a process
 * of its own.
 *
 * The program, FS_BOOT, comes on a pipe as fd 0: it puts back what
 * python3's start-up changed and an embedded interpreter did not (the
 * dispositions of SIGINT, SIGPIPE and SIGXFSZ; sys.argv, which user code
 * sees), then loads the module from its fd (FS_MODULE_FD: the file
 * forkboxd opened and checked, not a path looked up again) through _imp,
 * which adds no module to sys.modules but this one, and calls its main(). */
#define FS_CTL_FD 3
#define FS_MODULE_FD 4
#define FS_STR_(x) #x
#define FS_STR(x) FS_STR_(x) /* a number's digits, for FS_BOOT */
#define FS_ARGV_FLAG "--internal-forkserver"
#define FS_ARGV {"forkboxd", "-I", "-B", "-X", "utf8", "-", FS_ARGV_FLAG, NULL}
#define FS_BOOT                                                              \
    "import _imp, signal, sys\n"                                             \
    "for s in (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):\n"            \
    "    signal.signal(s, signal.SIG_DFL)\n"                                 \
    "sys.argv[:] = ['']\n"                                                   \
    "from importlib.machinery import ModuleSpec\n"                           \
    "_imp.create_dynamic(ModuleSpec('_forkbox_sandbox', None,\n"             \
    "                               origin='/proc/self/fd/" FS_STR(FS_MODULE_FD) "')).main()\n"

/* Open and check the fork server's files: python3.11 into fs->exe_fd and
 * forkbox-sandbox.so (--sandbox-module, else the build tree's when this is
 * the build tree's forkboxd, else the installed one) into fs->mod_fd; no
 * fork server runs yet. Also makes sure fds 0-2 are open, so
 * that nothing the supervisor opens later lands there (a fork server keeps
 * 0-3). Call it before anything else is opened. 0, or -errno with a reason. */
int fs_client_open(const struct config *cfg, struct fs_client *fs, char *err, size_t errlen);
/* Start a fork server from fs->exe_fd and fs->mod_fd: fork, execveat with
 * FS_ARGV and a fixed minimal environment (no fd but the program on a pipe
 * as 0, 1-2 (2: fs->log_fd if set), the control socket as 3 and the module
 * as 4, no ignored
 * signal, no blocked one cross), then send it
 * config_for_forkserver(cfg). Does not wait: fs->ctl_fd (non-blocking) is
 * readable once the ready record is there (fs_client_ready). 0, or -errno
 * with a reason (nothing left running). */
int fs_client_launch(const struct config *cfg, struct fs_client *fs, char *err, size_t errlen);
/* Take the ready record a launched fork server sends once its interpreter
 * is initialised and its policy compiled: 1 ready, 0 not yet, or -errno
 * with a reason (the fork server's own when it sent one); it has then been
 * stopped and reaped. */
int fs_client_ready(struct fs_client *fs, char *err, size_t errlen);
/* fs_client_open + fs_client_launch + wait (at most 30 s) for
 * fs_client_ready: the supervisor's first start, before it reads the
 * token. log_fd is fs->log_fd (-1: our stderr). 0, or -errno with a reason
 * (fs then holds nothing). */
int fs_client_start(const struct config *cfg, int log_fd, struct fs_client *fs, char *err,
                    size_t errlen);
/* Queue one spawn request for turn_id of tenant number tenant (0: none;
 * --cpu-share tenant); 0, -EAGAIN if the socket is full, or -errno. */
int fs_client_request(struct fs_client *fs, uint64_t turn_id, uint32_t tenant);
/* Read one reply. 1 with *rep filled (and, when rep->status == 0, the
 * caller owns *chan_fd and *pidfd), 0 if none is ready, or -errno if the fork
 * server is gone or broke the protocol (the supervisor then restarts it).
 * A spawn reply whose fds did not fit in our fd table is that spawn's
 * failure, not the fork server's: status -EMFILE (the sandbox, its channel
 * closed, ends by itself). */
int fs_client_reply(struct fs_client *fs, struct fs_reply *rep, int *chan_fd, int *pidfd);
/* What a failed spawn reply's status means, as a close reason: "no free
 * sandbox id (--id-range) ..." for FS_NO_FREE_ID, else "cannot start a
 * sandbox: <strerror>". */
void fs_spawn_failure(int status, char *out, size_t len);
/* Why a sandbox that ended on its own ended, as one close reason (at most
 * 123 bytes; docs/operating.md "Why a turn ended"), from its death report d (NULL: none
 * came in waited_ms) and cfg's limits: facts the fork server and its cgroup
 * helper own, never what the sandbox sent. */
enum fs_death {
    FS_DEATH_MEMORY,  /* the OOM killer (for its limit, one above it, or the host's) */
    FS_DEATH_PIDS,    /* it died after a fork was refused at --pids */
    FS_DEATH_CRASH,   /* SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTRAP */
    FS_DEATH_KILLED,  /* any other signal */
    FS_DEATH_EXITED,  /* an exit status */
    FS_DEATH_UNKNOWN, /* no death report */
};
enum fs_death fs_death_reason(const struct fs_reply *d, const struct config *cfg, uint64_t waited_ms,
                              char *out, size_t len);
/* A fork server that is gone or broken: SIGKILL it (if it still runs) and
 * reap it, close the control socket; exe_fd and mod_fd stay for the next launch. */
void fs_client_kill(struct fs_client *fs);
/* The end: close the control socket (the fork server then kills its
 * sandboxes and exits), wait up to 2 s for it, SIGKILL if need be; close
 * exe_fd and mod_fd. */
void fs_client_stop(struct fs_client *fs);


/* --- fork server side (forkbox-sandbox.so only) --- */

/* forkbox-sandbox.so's entry point (sandbox_module.c): ctl_fd is the control socket, on which the
 * configuration arrives first. Never returns. */
_Noreturn void forkserver_main(int ctl_fd);
