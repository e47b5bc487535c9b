/* sandbox/arch.h: the architecture's raw system calls, thread pointer and
 * clone argument orders, checked against the kernel (no namespace, no
 * privilege). It runs natively in the suite and under qemu-aarch64-static in
 * tools/cross-arm64, where it is the only check that arch_aarch64.h's
 * assembly and clone order reach the kernel as meant. qemu-user refuses
 * CLONE_VM without CLONE_THREAD, so there arch_clone_init is skipped (TAP
 * SKIP): that part of the aarch64 file has not run anywhere (docs/compatibility.md,
 * "aarch64"). */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/rseq.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sandbox/arch.h"
#include "tap.h"

static void test_syscalls(void)
{
    errno = 1234;
    is_int(arch_syscall3(SYS_getpid, 0, 0, 0), getpid(), "arch_syscall3(getpid) is getpid()");
    is_int(arch_syscall3(SYS_close, -1, 0, 0), -EBADF, "arch_syscall3 returns -errno (close(-1))");
    is_int(errno, 1234, "and leaves errno alone");

    /* The 4th argument reaches the kernel: openat's mode. */
    char dir[] = "/tmp/fbx-arch-XXXXXX", path[64];
    if (!mkdtemp(dir)) {
        ok(0, "mkdtemp: %s", strerror(errno));
        return;
    }
    snprintf(path, sizeof path, "%s/f", dir);
    mode_t old = umask(0);
    long fd = arch_syscall4(SYS_openat, AT_FDCWD, (long)path, O_CREAT | O_EXCL | O_WRONLY, 0604);
    umask(old);
    struct stat st = {0};
    ok(fd >= 0 && fstat((int)fd, &st) == 0 && (st.st_mode & 07777) == 0604,
       "arch_syscall4(openat, ..., 0604) creates mode 0604 (got %lo)",
       (unsigned long)(st.st_mode & 07777));
    if (fd >= 0)
        close((int)fd);
    unlink(path);
    rmdir(dir);
}

static void test_thread_pointer(void)
{
    char *tp = arch_thread_pointer();
    ok(tp == (char *)__builtin_thread_pointer(), "arch_thread_pointer() is the compiler's");
    if (__rseq_size == 0) {
        printf("ok %d - rseq area at tp + __rseq_offset # SKIP glibc registered no rseq area "
               "(qemu-user or an old kernel)\n", ++tap_n);
        return;
    }
    /* glibc 2.36's sched_getcpu() reads this field; it is 32-bit cpu_id. */
    const struct rseq *rs = (const struct rseq *)(tp + __rseq_offset);
    int cpu = sched_getcpu();
    ok(cpu >= 0 && (int)rs->cpu_id == cpu, "the rseq area at tp + __rseq_offset holds our cpu");
}

/* clone(2) in this architecture's argument order, as spawn.c calls it: the
 * pidfd comes back and the child's tid is written where asked. With the
 * x86-64 order on arm64 the tid pointer would land in the tls slot and
 * nothing would be written. */
static void test_clone(void)
{
    static pid_t child_tid;
    int pidfd = -1;
    long pid = arch_clone(CLONE_PIDFD | CLONE_CHILD_SETTID | SIGCHLD, &pidfd, &child_tid);
    bool no_pidfd = pid < 0 && errno == EINVAL;
    if (no_pidfd) /* qemu-user 7.2 refuses CLONE_PIDFD; every kernel since 5.2 has it */
        pid = arch_clone(CLONE_CHILD_SETTID | SIGCHLD, &pidfd, &child_tid);
    if (pid == 0)
        _exit(child_tid == (pid_t)syscall(SYS_gettid) ? 0 : 1);
    ok(pid > 0, "arch_clone forks (%s)", pid < 0 ? strerror(errno) : "ok");
    if (pid < 0)
        return;
    if (no_pidfd)
        printf("ok %d - CLONE_PIDFD's fd comes back through the parent_tid slot # SKIP "
               "CLONE_PIDFD refused (qemu-user)\n", ++tap_n);
    else
        ok(pidfd >= 0, "CLONE_PIDFD's fd comes back through the parent_tid slot");
    int status = 0;
    waitpid((pid_t)pid, &status, 0);
    ok(WIFEXITED(status) && WEXITSTATUS(status) == 0,
       "the child finds its tid at child_tid (status %#x)", status);
    if (pidfd >= 0)
        close(pidfd);
}

/* arch_clone_init as steps.c's init uses it: the caller moves to a new
 * stack and runs fn(child); the child carries on. fn exits with the
 * child's code, +100 if it did not run on init_stack. */
static char init_stack[16384] __attribute__((aligned(64)));
static pid_t init_tid;

__attribute__((noreturn, used, no_sanitize_address, no_sanitize("undefined")))
static void init_fn(long child)
{
    char here;
    int off = &here >= init_stack && &here < init_stack + sizeof init_stack ? 0 : 100;
    int status = 0;
    long pid = arch_syscall4(SYS_wait4, child, (long)&status, __WALL, 0);
    int code = pid == child && WIFEXITED(status) ? WEXITSTATUS(status) : 50;
    for (;;)
        arch_syscall3(SYS_exit_group, code + off, 0, 0);
}

static void test_clone_init(void)
{
    pid_t helper = fork();
    if (helper == 0) {
        long r = arch_clone_init(CLONE_VM | CLONE_CHILD_SETTID | SIGCHLD, &init_tid,
                                 init_stack + sizeof init_stack, init_fn);
        if (r == -EINVAL)
            _exit(77); /* qemu-user: CLONE_VM needs CLONE_THREAD there */
        if (r < 0)
            _exit(60);
        /* The child, on the original stack. */
        arch_syscall3(SYS_exit_group, init_tid == (pid_t)syscall(SYS_gettid) ? 5 : 6, 0, 0);
        _exit(70);
    }
    int status = 0;
    waitpid(helper, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
        printf("ok %d - arch_clone_init # SKIP CLONE_VM without CLONE_THREAD refused "
               "(qemu-user)\n", ++tap_n);
        return;
    }
    ok(WIFEXITED(status) && WEXITSTATUS(status) == 5,
       "arch_clone_init: the child finds its tid, the parent reaps it from init_stack "
       "(status %#x; 6: no tid, 1xx: not on init_stack)", status);
}

int main(void)
{
    test_syscalls();
    test_thread_pointer();
    test_clone();
    test_clone_init();
    return tap_done();
}
