/* Small helpers shared by every process: fds (and passing them), clocks, array growth,
 * parsing, and the reason buffer of the error convention (docs/internals.md,
 * "Errors and ownership"). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>

/* Any socket address (accept, getsockname, getpeername), read as the
 * family it turns out to be. */
union sockaddr_any {
    struct sockaddr sa;
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
    struct sockaddr_storage ss;
};

int fd_set_nonblock(int fd, bool on);   /* 0 or -errno */
int fd_set_cloexec(int fd, bool on);    /* 0 or -errno */
/* Blocking full write/read, retrying EINTR. 0 or -errno; read returns -EPIPE on EOF. */
int write_all(int fd, const void *p, size_t n);
int read_all(int fd, void *p, size_t n);
uint64_t now_ms(void);                  /* CLOCK_MONOTONIC */
uint64_t now_ns(void);

/* The reason buffer: write the reason into err (NULL or errlen 0: none
 * wanted; cut to fit) and return code, a -errno, so a failure is one line:
 *     return err_fmt(err, errlen, -EINVAL, "--%s: expected ...", name);
 * Allocation-free (vsnprintf into the caller's buffer): usable in a
 * sandbox child between clone and exec. */
int err_fmt(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The same for a failed system call: returns -errno as it was on entry
 * (-EIO if errno was 0), whatever formatting the reason does to errno. */
int err_errno(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* fd passing over a unix socket (SCM_RIGHTS), the one copy for every
 * process. Both retry EINTR; neither allocates.
 *
 * fd_send: sendmsg of the n bytes at p with fds[0..nfds) attached to them
 * (nfds 0: plain bytes), MSG_NOSIGNAL | flags. The fds are borrowed: the
 * caller still owns (and closes) its copies. Returns the bytes sent (a
 * stream socket may take fewer: fds ride with the first byte) or -errno;
 * -EINVAL for nfds > FDPASS_MAX_FDS. */
ssize_t fd_send(int sock, const void *p, size_t n, const int *fds, size_t nfds, int flags);
/* fd_recv: recvmsg into p[0..n), MSG_CMSG_CLOEXEC | flags. The fds that
 * came with the bytes are taken by the caller: fds[0..*nfds), each
 * close-on-exec; fds beyond maxfds are closed here (the kernel itself drops
 * any beyond FDPASS_MAX_FDS and sets MSG_CTRUNC). *msg_flags (may be NULL)
 * gets MSG_TRUNC and MSG_CTRUNC of the message, for callers that must
 * refuse a cut message. Returns the bytes received, 0 at EOF, or -errno
 * (-EAGAIN with MSG_DONTWAIT and nothing there). */
ssize_t fd_recv(int sock, void *p, size_t n, int *fds, size_t maxfds, size_t *nfds, int flags,
                int *msg_flags);
/* Constant-time comparison of two byte strings; leaks only the lengths. */
bool ct_equal(const void *a, size_t alen, const void *b, size_t blen);
/* Parse a decimal unsigned integer with an upper bound; 0 or -EINVAL/-ERANGE. */
int parse_u64(const char *s, uint64_t max, uint64_t *out);
/* Room for `need` elements in a growable array: the one copy of "double
 * the capacity, realloc, keep the old array on failure".
 *   pp    the address of the array's pointer (a T **; NULL array = empty)
 *   cap   its capacity in elements, updated on success
 *   need  how many elements must fit (the count after the addition)
 *   elem  sizeof(T)
 *   first the capacity of the first allocation (>= 1)
 *   max   the most elements the array may ever hold (SIZE_MAX: no bound of
 *         its own; the byte size is checked for overflow in any case)
 * The new capacity is twice the old one (first if there was none), at
 * least need, at most max. 0 with *pp and *cap updated (or already enough
 * room: nothing done), -E2BIG if need > max, -ENOMEM if the bytes would
 * overflow a size_t or realloc fails (then *pp and *cap are unchanged: the
 * array is still the caller's, as it was). GROW_ARRAY takes elem from the
 * array's type. */
int grow_array(void *pp, size_t *cap, size_t need, size_t elem, size_t first, size_t max);
#define GROW_ARRAY(arr, cap, need, first, max) \
    grow_array(&(arr), (cap), (need), sizeof *(arr), (first), (max))
/* Raise RLIMIT_NOFILE as far as allowed (util.c says how far and why). */
void raise_nofile(void);
/* An fd reserve: keep the soft RLIMIT_NOFILE n below the hard one (0, or
 * -ERANGE when the limit is too low for that, or -errno); then
 * fd_reserve_lend(true) raises it to the hard one for one call that must not
 * run out of fds and fd_reserve_lend(false) puts back what it was (an
 * operator's prlimit meanwhile included). Nothing happens without a reserve.
 * For one thread: the supervisor's loop. */
int fd_reserve_keep(unsigned n);
void fd_reserve_lend(bool on);
/* accept4(lfd, sa, len, SOCK_NONBLOCK | SOCK_CLOEXEC); when the fd table is
 * full (EMFILE), once more with the reserve lent, and *reserved says the fd
 * is one of the reserve's: the caller answers that connection and closes it
 * (or holds it only within a bound of its own), so the reserve is whole
 * again. The fd, or -errno (-EMFILE: not even the reserve had one). */
int accept_reserved(int lfd, struct sockaddr *sa, socklen_t *len, bool *reserved);
/* What an errno means, as a reason given to a turn, a connection or a call:
 * the two that mean "out of file descriptors" name the limit that was hit
 * (EMFILE: RLIMIT_NOFILE of the process that tried; ENFILE: the system's,
 * fs.file-max), strerror's text for the rest. */
const char *errno_reason(int e);
/* Set our oom_score_adj (proc(5)): the OOM killer's order, sandboxes first
 * (core/limits.h, OOM_ADJ_*). With keep_lower, a value already below adj
 * is left (the operator's: systemd's OOMScoreAdjust=). Lowering it needs
 * CAP_SYS_RESOURCE: 0, or -errno (-EACCES without it). */
int oom_score_adj_set(int adj, bool keep_lower);
/* A detached thread running fn(arg), named name (15 characters at most),
 * with a stack of stack bytes and every signal blocked (so none is ever
 * delivered there instead of to the loop's signalfd). For the supervisor's
 * helpers (loop/closer.h, loop/logq.h, loop/watchdog.h); never in the fork
 * server, which clone(CLONE_NEWUSER) needs single-threaded. 0, or -errno
 * with a reason. */
int thread_start(const char *name, size_t stack, void *(*fn)(void *), void *arg, char *err,
                 size_t errlen);
/* A helper process joined to us by a SEQPACKET socketpair. In the child
 * (returns 0) its end is fd 3 with close-on-exec off, and it dies with us;
 * only async-signal-safe calls are made, so the child may exec. The parent
 * gets the child's pid and its own end in *fd; -errno with a reason in err.
 * The supervisor starts the fork server with it, and the fork server its
 * cgroup placer. */
pid_t fork_helper(const char *what, int *fd, char *err, size_t errlen);
/* A non-blocking, close-on-exec TCP listener on numeric address host
 * (IPv4 or IPv6) and port (0: a free one), SO_REUSEADDR, backlog
 * LISTEN_BACKLOG. The fd (the caller owns it), with the port bound in
 * *bound_port, or -EINVAL (not a numeric address) or -errno. */
int tcp_listen(const char *host, uint16_t port, uint16_t *bound_port);
