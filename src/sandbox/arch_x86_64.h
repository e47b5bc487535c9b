/* Runs in the fork server and the sandbox child (see arch.h): x86-64 code of
 * a spawn: the raw system calls of the sandbox's init and its clone onto its
 * own stack (child), and clone(2)'s argument order (fork server). Include
 * arch.h, not this. */
#pragma once
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

static inline long arch_syscall3(long n, long a, long b, long c)
{
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"(n), "D"(a), "S"(b), "d"(c)
                     : "rcx", "r11", "memory");
    return ret;
}

static inline long arch_syscall4(long n, long a, long b, long c, long d)
{
    register long r10 __asm__("r10") = d;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
                     : "rcx", "r11", "memory");
    return ret;
}

/* %fs:0 holds the TCB's own address (glibc's tcbhead_t.tcb). */
static inline char *arch_thread_pointer(void)
{
    char *tp;
    __asm__("mov %%fs:0, %0" : "=r"(tp));
    return tp;
}

/* clone(flags, newsp 0, parent_tid 0, child_tid tid_addr, tls 0). */
static inline long arch_clone_init(unsigned long flags, pid_t *tid_addr, void *stack_top,
                                   void (*fn)(long))
{
    register long r10 __asm__("r10") = (long)tid_addr;
    register long r8 __asm__("r8") = 0;
    long ret;
    __asm__ volatile("syscall\n\t"
                     "test %%rax, %%rax\n\t"
                     "jle 1f\n\t"
                     "mov %[stack], %%rsp\n\t"
                     "mov %%rax, %%rdi\n\t"
                     "call *%[fn]\n\t"
                     "ud2\n"
                     "1:"
                     : "=a"(ret)
                     : "0"((long)SYS_clone), "D"((long)flags), "S"(0L), "d"(0L), "r"(r10),
                       "r"(r8), [stack] "r"(stack_top), [fn] "r"(fn)
                     : "rcx", "r11", "memory");
    return ret;
}

/* x86-64 order: flags, newsp, parent_tid, child_tid, tls (others, such as
 * aarch64's CLONE_BACKWARDS, swap the last two). */
static inline long arch_clone(unsigned long flags, int *pidfd, pid_t *child_tid)
{
    return syscall(SYS_clone, flags, NULL, pidfd, child_tid, 0);
}
