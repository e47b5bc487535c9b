/* Runs in the fork server and the sandbox child (see arch.h): aarch64 code of
 * a spawn: the raw system calls of the sandbox's init and its clone onto its
 * own stack (child), and clone(2)'s argument order (fork server). Include
 * arch.h, not this.
 *
 * Built by tools/cross-arm64 (gcc-aarch64-linux-gnu) and compiled in every
 * arm64 build, but never run: qemu-user cannot run the sandbox (no seccomp,
 * see docs/compatibility.md "aarch64"), and no real arm64 machine has run it yet. What it
 * relies on is the arm64 kernel ABI (arch/arm64/kernel/entry-common.S,
 * include/uapi/asm-generic/unistd.h): the number in x8, arguments in x0-x5,
 * `svc #0`, the result in x0, every other register preserved. */
#pragma once
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

static inline long arch_syscall3(long n, long a, long b, long c)
{
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    __asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory", "cc");
    return x0;
}

static inline long arch_syscall4(long n, long a, long b, long c, long d)
{
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    __asm__ volatile("svc #0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3)
                     : "memory", "cc");
    return x0;
}

/* tpidr_el0 is the thread pointer: glibc's TCB starts there (TLS variant I,
 * TLS_DTV_AT_TP), and __rseq_offset is relative to it as on x86-64. */
static inline char *arch_thread_pointer(void)
{
    char *tp;
    __asm__("mrs %0, tpidr_el0" : "=r"(tp));
    return tp;
}

/* clone(flags, newsp 0, parent_tid 0, tls 0, child_tid tid_addr): arm64 has
 * CLONE_BACKWARDS' order, tls before child_tid. The kernel preserves every
 * register but x0 across svc, so stack_top and fn are still in theirs in the
 * parent; sp must stay 16-byte aligned (init_stack is 64-aligned, its size a
 * multiple of 16). brk traps if fn ever returns. */
static inline long arch_clone_init(unsigned long flags, pid_t *tid_addr, void *stack_top,
                                   void (*fn)(long))
{
    register long x8 __asm__("x8") = SYS_clone;
    register long x0 __asm__("x0") = (long)flags;
    register long x1 __asm__("x1") = 0;
    register long x2 __asm__("x2") = 0;
    register long x3 __asm__("x3") = 0;
    register long x4 __asm__("x4") = (long)tid_addr;
    __asm__ volatile("svc #0\n\t"
                     "cmp x0, #0\n\t"
                     "b.le 1f\n\t"
                     "mov sp, %[stack]\n\t"
                     "blr %[fn]\n\t"
                     "brk #0x1\n"
                     "1:"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), [stack] "r"(stack_top),
                       [fn] "r"(fn)
                     : "memory", "cc");
    return x0;
}

/* arm64 order (CLONE_BACKWARDS): flags, newsp, parent_tid, tls, child_tid.
 * CLONE_PIDFD stores the pidfd at parent_tid, as on x86-64. */
static inline long arch_clone(unsigned long flags, int *pidfd, pid_t *child_tid)
{
    return syscall(SYS_clone, flags, NULL, pidfd, 0, child_tid);
}
