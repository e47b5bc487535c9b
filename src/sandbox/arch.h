/* Runs in the fork server (arch_clone, spawn.c) and the sandbox child (the
 * rest, steps.c's init): the architecture-specific code of a spawn, behind
 * one guard. Each supported architecture has one header,
 * arch_<arch>.h, with the same static inline functions:
 *
 *   long arch_syscall3(long n, long a, long b, long c);
 *   long arch_syscall4(long n, long a, long b, long c, long d);
 *       a system call without glibc: returns the result or -errno and never
 *       touches errno or any other memory of the thread (init runs on a
 *       borrowed thread pointer, see steps.c);
 *   char *arch_thread_pointer(void);
 *       the calling thread's thread pointer (glibc's TCB: __rseq_offset
 *       is relative to it);
 *   long arch_clone_init(unsigned long flags, pid_t *tid_addr, void *stack_top,
 *                        void (*fn)(long));
 *       raw clone(flags, no new stack, child tid tid_addr) on the current
 *       stack: the child returns 0; the parent moves to stack_top before it
 *       touches memory and calls fn(child pid), which must not return;
 *       -errno if there is no child;
 *   long arch_clone(unsigned long flags, int *pidfd, pid_t *child_tid);
 *       the raw clone(2) with no new stack (it behaves as fork), in this
 *       architecture's argument order; as syscall(2): -1 with errno.
 *
 * aarch64 is cross-built and its pure code tested under qemu (tools/cross-arm64),
 * never run as a sandbox (docs/compatibility.md "aarch64"). Another architecture adds its
 * header here; until then the build stops. */
#pragma once

#if defined(__x86_64__)
#include "sandbox/arch_x86_64.h"
#elif defined(__aarch64__)
#include "sandbox/arch_aarch64.h"
#else
#error "forkbox: no spawn code for this architecture: add src/sandbox/arch_<arch>.h (see arch.h)"
#endif
