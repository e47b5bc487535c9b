/* Private to src/pyrt: the state shared by pyrt.c, module.c and capture.c.
 *
 * There is exactly one interpreter per process, so its companion state is one
 * static struct (g_pyrt, defined in pyrt.c). The fork server fills the
 * configuration part in pyrt_init(); the turn part is only used in the
 * sandbox child, inside pyrt_serve(). */
#pragma once
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <unistd.h>

#include "core/buf.h"
#include "core/limits.h"
#include "proto/chan.h"
#include "stage/archive.h"

/* Output capture of fds 1 and 2 for one block (capture.c). */
struct capture_stream {
    int rfd;          /* pipe read end (owned, O_NONBLOCK); -1 once at EOF */
    size_t head_cap;  /* bytes kept from the start of the stream */
    size_t tail_cap;  /* bytes kept from the end (ring) */
    uint8_t *head;    /* owned, grows up to head_cap */
    size_t head_len, head_alloc;
    uint8_t *tail;    /* owned ring of tail_cap bytes, allocated on first use */
    size_t tail_len;  /* bytes held in the ring */
    size_t tail_pos;  /* next write position in the ring */
    uint64_t dropped; /* bytes neither in head nor tail */
};

struct capture {
    struct capture_stream s[2]; /* [0] stdout, [1] stderr */
};

/* Once per sandbox, before the reader starts: the eventfd that wakes it for
 * a capture's start and end. The fd (close-on-exec), or -errno. */
int capture_init(void);
/* Start capturing: fresh pipes dup2'ed onto fds 1 and 2, drained by the
 * channel reader from now on. cap = bytes kept per stream. 0 or -errno. */
int capture_begin(struct capture *c, uint64_t cap);
/* Point fds 1 and 2 at devnull_fd, have the reader take what is left in the
 * pipes without waiting for writers that are still alive, and wait until it
 * has. The buffers stay in c until capture_free(). threads: another thread
 * may be writing (the pipes are then retired, not closed: capture.c). */
void capture_end(struct capture *c, int devnull_fd, bool threads);
/* For the reader: a run frame went by, a capture is about to begin. */
void capture_prime(void);
/* In a child forked from the runtime (pthread_atfork): close the capture's
 * read ends and the reader's eventfd, which only the runtime may hold. */
void capture_forget_in_child(void);
/* Poll entries capture_poll_fds() fills: the adopted capture's two pipes,
 * then the retired pipes of ended blocks. */
#define CAPTURE_POLL_FDS (2 + CAPTURE_RETIRED_MAX)
/* For the reader's poll: fill p[0..CAPTURE_POLL_FDS-1] (fd -1 if unused);
 * returns the poll timeout (ms, -1 for none). */
int capture_poll_fds(struct pollfd *p);
/* For the reader, after every poll: adopt a capture that waits for it, drain
 * what p (from capture_poll_fds) says is ready, finish the capture if
 * capture_end() asked, and close retired pipes that are done. */
void capture_service(const struct pollfd *p);
/* Copy stream i's kept bytes out: head, then the tail in order. */
void capture_tail_copy(const struct capture_stream *s, uint8_t *out);
void capture_free(struct capture *c);

/* Append the block's `output` frame built from c's buffers (output.c):
 * stdout and stderr as the Python runtime decodes, cuts and escapes them,
 * stderr_notes (plain lines, each ending in '\n'; NULL for none) after
 * stderr. 0 or -ENOMEM. */
int output_frame(struct buf *out, const struct capture *c, const char *stderr_notes,
                 int64_t exit_code);

/* Tool calls waiting for their results (calls.c). A caller registers before
 * it sends, so a result can never arrive unclaimed; delivery sets done and
 * posts sem. */
struct call_wait {
    struct call_wait *next;
    char id[64];           /* the call's id (not NUL-terminated) */
    size_t id_len;
    uint8_t *result;       /* owned once done: the tool_result frame */
    size_t result_len;
    char *error;           /* owned once done, if the call failed (may be NULL then) */
    bool done;
    sem_t sem;
};

int calls_register(struct call_wait *w, const char *id, size_t id_len);
void calls_unregister(struct call_wait *w);
/* Free what a finished call holds. */
void calls_release(struct call_wait *w);
/* The channel reader's offer of a frame (malloc'd, len bytes): the result
 * of a waiting call, which now owns it (TAKEN); a result no call waits for,
 * late or unknown (UNCLAIMED: the caller drops it); or not in the
 * supervisor's tool_result form (NOT_A_RESULT: for the main loop). */
enum calls_offer { CALLS_NOT_A_RESULT, CALLS_TAKEN, CALLS_UNCLAIMED };
enum calls_offer calls_deliver_frame(uint8_t *frame, size_t len);
/* A tool_result Python decoded: hand a copy of the frame to the call with
 * that id; false if none waits for it. */
bool calls_deliver_id(const char *id, size_t id_len, const uint8_t *frame, size_t len);
/* True if a call is registered (a result may be due). */
bool calls_waiting(void);
/* Fail every waiting call with message (block end). */
void calls_fail_all(const char *message);

/* The channel reader thread (reader.c): started once per sandbox; 0 or
 * -errno. reader_next() waits for the next message that is not a tool result
 * and hands it over (type, malloc'd data). */
int reader_start(void);
void reader_next(enum chan_type *type, uint8_t **data, size_t *len);
/* Before reader_start(): the channel's next message, read by the caller
 * (pyrt_serve, for the turn's first). EOF ends the process, as in the
 * reader. */
void reader_read_first(enum chan_type *type, uint8_t **data, size_t *len);

/* The turn's first message, its tools archive, extracted and answered with
 * ready (module.c); read by the caller, or from the reader once it runs.
 * Never returns on an error: the error frame goes, and the process exits 3. */
void pyrt_tools_and_ready(bool reader_running);
/* Serve the turn's messages with turn.run_block and turn.on_frame (module.c);
 * returns only with an exception set. */
void pyrt_serve_turn(PyObject *turn);

struct pyrt_state {
    /* from struct config, copied by pyrt_init() */
    uint64_t output_cap;   /* bytes kept per stream per block */
    uint64_t snapshot_max; /* data bytes in a snapshot */
    bool no_snapshot;      /* stream mode (cfg->workdir): the host shares the workspace;
                              every snapshot is empty (a zero-length 'S') */
    uint64_t snapshot_cache_max; /* member bytes kept for the next snapshot */
    uint64_t max_unpacked; /* per incoming archive */
    uint64_t max_members;

    PyObject *runtime; /* the private forkbox_runtime module (owned) */
    PyObject *ready;   /* the ready frame (bytes, owned), sent from C (pyrt_tools_and_ready) */

    /* the turn, in the sandbox child */
    int chan_fd;         /* borrowed from the caller of pyrt_serve; -1 in a forked copy */
    pid_t owner_pid;     /* the runtime's pid: a forked copy of it has another */
    int tools_fd;        /* owned until the tools archive is extracted */
    const char *tools_dir; /* the tools' path in the sandbox (pyrt_serve's, borrowed) */
    int warm_fd;         /* owned (pooled children): "warmed up" goes here, once */
    int ws_fd;           /* workspace root, O_DIRECTORY (owned) */
    struct snapshot_cache *snap_cache; /* owned, made at the first snapshot;
                                          NULL without memory (then none) */
    int devnull_fd;      /* /dev/null, O_RDWR (owned) */
    pthread_mutex_t send_lock; /* one message at a time; guards in_block */
    bool in_block;       /* a block runs: tool calls may be sent */
    struct capture cap;
    bool capturing;
    struct snapshot_iov snap; /* the last snapshot, until send_snapshot(); its
                                 pieces may point into snap_cache */
};

extern struct pyrt_state g_pyrt;

/* True in a child that user code forked from the runtime (os.fork,
 * multiprocessing): it must never touch the channel, the capture or the
 * locks the runtime's other threads may have held at the fork. */
static inline bool pyrt_forked_copy(void)
{
    return getpid() != g_pyrt.owner_pid;
}

PyMODINIT_FUNC pyrt_module_init(void);
