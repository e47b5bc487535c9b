/* The private builtin module `_forkbox`: what the Python runtime needs from C.
 *
 * Every call that can block (channel reads and writes, waiting for the
 * reader's last drain of a block's output, archives) releases the GIL, so the channel reader thread,
 * user threads and tool calls keep running while one of them waits. Channel
 * writes are serialised by g_pyrt.send_lock, which also guards in_block: a
 * tool call is only written while a block runs, and block_end() marks the
 * block over and writes `done` in one critical section, so a stray thread's
 * call can never land between done, output and the snapshot (spec 9.2). */
#include "pyrt/pyrt_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/steptime.h"
#include "proto/chan.h"
#include "proto/shape.h"
#include "pyrt/env_keep.h"
#include "stage/archive.h"

extern char **environ;

/* ---- channel ---------------------------------------------------------- */

/* Write v[0..cnt) to the channel, resuming after partial writes, at most
 * 1024 iovecs (IOV_MAX) a call: one message is one system call where the
 * socket takes it (the supervisor then wakes once per message). v is
 * consumed. MSG_NOSIGNAL: a vanished supervisor gives EPIPE, not a signal;
 * writev for a channel that is not a socket (tests). Returns 0 or -errno. */
static int chan_writev(int fd, struct iovec *v, size_t cnt)
{
    bool sock = true;
    while (cnt > 0 && v->iov_len == 0)
        v++, cnt--;
    while (cnt > 0) {
        size_t k = cnt < 1024 ? cnt : 1024;
        struct msghdr msg = {.msg_iov = v, .msg_iovlen = k};
        ssize_t w = sock ? sendmsg(fd, &msg, MSG_NOSIGNAL) : writev(fd, v, (int)k);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == ENOTSOCK && sock) {
                sock = false;
                continue;
            }
            return -errno;
        }
        while (cnt > 0 && (size_t)w >= v->iov_len) {
            w -= (ssize_t)v->iov_len;
            v++;
            cnt--;
        }
        if (cnt > 0) {
            v->iov_base = (uint8_t *)v->iov_base + w;
            v->iov_len -= (size_t)w;
        }
    }
    return 0;
}

/* A header and a payload in one system call. Returns 0 or -errno. */
static int chan_write2(int fd, const void *hdr, size_t hn, const void *p, size_t n)
{
    struct iovec iov[2] = {{(void *)hdr, hn}, {(void *)p, n}};
    return chan_writev(fd, iov, n ? 2 : 1);
}

/* A snapshot's pieces as one 'S' message. Caller holds send_lock. A write
 * error means the supervisor is gone, and with it the turn: exit like on
 * EOF. */
static void chan_send_snapshot_locked(const struct snapshot_iov *o)
{
    uint8_t hdr[CHAN_HDR_LEN];
    if (o->len > CHAN_MAX_MESSAGE_BYTES)
        _exit(3); /* never produced: snapshots are capped below this */
    if (pyrt_forked_copy())
        _exit(1); /* never reached: the callers refuse first */
    chan_hdr_encode(hdr, CHAN_SNAPSHOT, (uint32_t)o->len);
    struct iovec *all = malloc((o->n + 1) * sizeof *all);
    if (!all)
        _exit(3);
    all[0] = (struct iovec){hdr, sizeof hdr};
    if (o->n) /* none in stream mode's empty snapshots, where iov is NULL */
        memcpy(all + 1, o->iov, o->n * sizeof *all);
    if (chan_writev(g_pyrt.chan_fd, all, o->n + 1) < 0)
        _exit(0);
    free(all);
}

/* The _forkbox entry points that touch the channel, the capture or the
 * runtime's locks call this first: in a child user code forked from the
 * runtime they raise instead (the channel fd is closed there, see
 * forked_child in pyrt.c, and a lock another thread held at the fork would
 * never be released). A tool call from such a child thus fails cleanly. */
static bool refused_in_forked_copy(void)
{
    if (!pyrt_forked_copy())
        return false;
    PyErr_SetString(PyExc_RuntimeError,
                    "forkbox: only the sandbox's main process talks to the host; "
                    "a forked child cannot send on the turn's channel or call tools");
    return true;
}

/* One whole message; caller holds send_lock. A write error means the
 * supervisor is gone, and with it the turn: exit like on EOF. */
static void chan_send_locked(enum chan_type type, const void *p, size_t n)
{
    uint8_t hdr[CHAN_HDR_LEN];
    if (n > CHAN_MAX_MESSAGE_BYTES)
        _exit(3); /* never produced: output and snapshots are capped below this */
    if (pyrt_forked_copy())
        _exit(1); /* never reached: the callers refuse first */
    chan_hdr_encode(hdr, type, (uint32_t)n);
    if (chan_write2(g_pyrt.chan_fd, hdr, sizeof(hdr), p, n) < 0)
        _exit(0);
}

/* The code of a run frame in the supervisor's form (shape.h) as a str, or
 * NULL (no exception set) for any other frame, which Python's
 * protocol.decode then reads: decoding the one frame every block starts with
 * here spares each sandbox ~60 copied pages of the json and dataclass
 * machinery (measured). */
static PyObject *run_code(const uint8_t *data, size_t len)
{
    cJSON *root;
    const char *code = shape_run_code(data, len, &root);
    PyObject *r = NULL;
    if (code) {
        r = PyUnicode_DecodeUTF8(code, (Py_ssize_t)strlen(code), "strict");
        if (!r)
            PyErr_Clear(); /* what strict UTF-8 refuses: Python's decoder says why */
    }
    cJSON_Delete(root);
    return r;
}

/* An incoming archive into dest_fd, within the turn's limits; msg says why
 * it failed (always set on failure). 0 or -errno. */
static int extract(const uint8_t *p, size_t n, int dest_fd, char *msg, size_t msglen)
{
    struct archive_limits lim = {.max_unpacked = g_pyrt.max_unpacked,
                                 .max_members = g_pyrt.max_members};
    struct extract_stats st = {0};
    int r = archive_extract(p ? p : (const uint8_t *)"", n, dest_fd, &lim, &st, msg, msglen);
    if (r < 0 && !msg[0])
        snprintf(msg, msglen, "%s", strerror(-r));
    return r;
}

/* The turn's messages in the order the supervisor sent them,
 * waited for without the GIL, for as long as the turn lasts: a workspace
 * archive is extracted (one that fails ends the turn: an error log frame,
 * exit 3), a run frame in the supervisor's form goes to turn.run_block(code),
 * any other frame to turn.on_frame(payload); a tool result reaches this loop
 * only if no call waited for it (reader.c), and on_frame drops it; a later
 * tools archive is dropped. Returns only with an exception: the runtime's
 * own failure, which pyrt_serve reports. In C, not Python, and entered from
 * C: the frames and objects a Python loop and its set-up touched were
 * copy-on-write pages of a fresh sandbox (forkbox-bench --rows steps: run_in
 * and block rows 88-89 + 116-117 faults with both in Python, 82 + 116-117
 * with the loop in C, 47-48 + 141-142 entered from C: the first Python
 * frame's costs now fall in the block). */
void pyrt_serve_turn(PyObject *turn)
{
    PyObject *run_block = PyObject_GetAttrString(turn, "run_block");
    PyObject *on_frame = run_block ? PyObject_GetAttrString(turn, "on_frame") : NULL;
    while (on_frame) {
        enum chan_type type;
        uint8_t *data;
        size_t len;
        Py_BEGIN_ALLOW_THREADS
        reader_next(&type, &data, &len);
        Py_END_ALLOW_THREADS
        /* A handler that raised while we waited: as the Python loop did,
         * KeyboardInterrupt is dropped, anything else is the runtime's
         * failure. */
        if (PyErr_CheckSignals() < 0) {
            if (!PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
                free(data);
                break;
            }
            PyErr_Clear();
        }
        if (type == CHAN_WORKSPACE) {
            char msg[300] = "workspace archive: ";
            int e;
            Py_BEGIN_ALLOW_THREADS
            e = extract(data, len, g_pyrt.ws_fd, msg + strlen(msg), sizeof msg - strlen(msg));
            Py_END_ALLOW_THREADS
            free(data);
            if (e < 0) {
                pthread_mutex_lock(&g_pyrt.send_lock);
                (void)chan_write_log(g_pyrt.chan_fd, "error", msg);
                _exit(3);
            }
        } else if (type == CHAN_FRAME) {
            PyObject *r, *code = run_code(data, len);
            if (code) {
                free(data);
                steptime_mark(ST_R_RUN);
                r = PyObject_CallOneArg(run_block, code);
                Py_DECREF(code);
            } else {
                PyObject *payload = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)len);
                free(data);
                r = payload ? PyObject_CallOneArg(on_frame, payload) : NULL;
                Py_XDECREF(payload);
            }
            if (!r)
                break;
            Py_DECREF(r);
        } else {
            free(data); /* a later tools archive; nothing else comes from the supervisor */
        }
    }
    Py_XDECREF(run_block);
    Py_XDECREF(on_frame);
}

/* tools_dir() -> str: the sandbox's tools directory (the `tools` finder's). */
static PyObject *fb_tools_dir(PyObject *self, PyObject *unused)
{
    if (!g_pyrt.tools_dir)
        Py_RETURN_NONE;
    return PyUnicode_DecodeFSDefault(g_pyrt.tools_dir);
}

/* forked_copy() -> bool: this is a copy user code forked from the runtime. */
static PyObject *fb_forked_copy(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(pyrt_forked_copy());
}

/* send(type, data): one message, whatever the block state (ready, output, log). */
static PyObject *fb_send(PyObject *self, PyObject *args)
{
    if (refused_in_forked_copy())
        return NULL;
    int type;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "iy*:send", &type, &data))
        return NULL;
    if (type != CHAN_FRAME && type != CHAN_SNAPSHOT) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "bad channel message type");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&g_pyrt.send_lock);
    chan_send_locked((enum chan_type)type, data.buf, (size_t)data.len);
    pthread_mutex_unlock(&g_pyrt.send_lock);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    Py_RETURN_NONE;
}

/* call(id, frame) -> bytes | str | None: send a tool_call frame, if a block
 * runs, and wait for its result (calls.c). bytes: the tool_result frame;
 * str: why the call failed (the block ended); None: no block runs, nothing
 * was sent. A signal handler that raises ends the wait with its exception. */
static PyObject *fb_call(PyObject *self, PyObject *args)
{
    if (refused_in_forked_copy())
        return NULL;
    const char *id;
    Py_ssize_t id_len;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "s#y*:call", &id, &id_len, &data))
        return NULL;
    struct call_wait w;
    int r = calls_register(&w, id, (size_t)id_len);
    if (r < 0) {
        PyBuffer_Release(&data);
        errno = -r;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    bool sent;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&g_pyrt.send_lock);
    sent = g_pyrt.in_block;
    if (sent)
        chan_send_locked(CHAN_FRAME, data.buf, (size_t)data.len);
    pthread_mutex_unlock(&g_pyrt.send_lock);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    while (sent) {
        Py_BEGIN_ALLOW_THREADS
        r = sem_wait(&w.sem);
        Py_END_ALLOW_THREADS
        if (r == 0)
            break;
        if (errno == EINTR && PyErr_CheckSignals() == 0)
            continue;
        if (errno != EINTR)
            PyErr_SetFromErrno(PyExc_OSError);
        calls_unregister(&w); /* a result that came meanwhile is dropped */
        calls_release(&w);
        return NULL;
    }
    calls_unregister(&w);
    PyObject *out;
    if (!sent)
        out = Py_NewRef(Py_None);
    else if (w.result)
        out = PyBytes_FromStringAndSize((const char *)w.result, (Py_ssize_t)w.result_len);
    else
        out = PyUnicode_FromString(w.error ? w.error : "tool call failed in the sandbox");
    calls_release(&w);
    return out;
}

/* deliver(id, frame) -> bool: a tool_result not in the supervisor's form,
 * decoded in Python on the reader's thread (_reader_offer): wake its call. */
static PyObject *fb_deliver(PyObject *self, PyObject *args)
{
    if (refused_in_forked_copy())
        return NULL;
    const char *id;
    Py_ssize_t id_len;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "s#y*:deliver", &id, &id_len, &data))
        return NULL;
    bool taken = calls_deliver_id(id, (size_t)id_len, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyBool_FromLong(taken);
}

/* fail_calls(message): every waiting call returns message (block end). */
static PyObject *fb_fail_calls(PyObject *self, PyObject *arg)
{
    if (refused_in_forked_copy())
        return NULL;
    const char *msg = PyUnicode_AsUTF8(arg);
    if (!msg)
        return NULL;
    calls_fail_all(msg);
    Py_RETURN_NONE;
}

static PyObject *fb_block_begin(PyObject *self, PyObject *unused)
{
    if (refused_in_forked_copy())
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&g_pyrt.send_lock);
    g_pyrt.in_block = true;
    pthread_mutex_unlock(&g_pyrt.send_lock);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* block_end(done_frame): mark the block over and send `done`, atomically. */
static PyObject *fb_block_end(PyObject *self, PyObject *arg)
{
    if (refused_in_forked_copy())
        return NULL;
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&g_pyrt.send_lock);
    g_pyrt.in_block = false;
    chan_send_locked(CHAN_FRAME, data.buf, (size_t)data.len);
    pthread_mutex_unlock(&g_pyrt.send_lock);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    steptime_mark(ST_R_DONE);
    Py_RETURN_NONE;
}

/* ---- stdio and capture ------------------------------------------------ */

/* Reopen any of fds 0-2 that user code closed on /dev/null, so new pipes
 * never land on them. */
static void ensure_stdio_fds(void)
{
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF)
            dup2(g_pyrt.devnull_fd, fd);
}

static PyObject *fb_ensure_stdio_fds(PyObject *self, PyObject *unused)
{
    ensure_stdio_fds();
    Py_RETURN_NONE;
}

/* caught_signals() -> [signum]: the signals whose disposition is a handler
 * function, read from the kernel. A handler set by signal.signal() is one
 * (CPython's), so only these can have a Python-level handler: a block's end
 * looks at a few signals instead of calling signal.getsignal() 62 times. */
static PyObject *fb_caught_signals(PyObject *self, PyObject *unused)
{
    PyObject *list = PyList_New(0);
    for (int sig = 1; list && sig < NSIG; sig++) {
        struct sigaction sa;
        if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa) < 0)
            continue; /* glibc's internal signals: EINVAL */
        if (!(sa.sa_flags & SA_SIGINFO) && (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN))
            continue;
        PyObject *n = PyLong_FromLong(sig);
        if (!n || PyList_Append(list, n) < 0)
            Py_CLEAR(list);
        Py_XDECREF(n);
    }
    return list;
}

static PyObject *fb_capture_begin(PyObject *self, PyObject *unused)
{
    if (refused_in_forked_copy())
        return NULL;
    if (g_pyrt.capturing) {
        PyErr_SetString(PyExc_RuntimeError, "capture already running");
        return NULL;
    }
    ensure_stdio_fds();
    capture_free(&g_pyrt.cap); /* a last capture whose output() never came */
    int r = capture_begin(&g_pyrt.cap, g_pyrt.output_cap);
    if (r < 0) {
        capture_free(&g_pyrt.cap);
        errno = -r;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    g_pyrt.capturing = true;
    Py_RETURN_NONE;
}

/* capture_end(): stop capturing; what was captured stays for output(). */
static PyObject *fb_capture_end(PyObject *self, PyObject *unused)
{
    if (refused_in_forked_copy())
        return NULL;
    if (!g_pyrt.capturing) {
        PyErr_SetString(PyExc_RuntimeError, "no capture running");
        return NULL;
    }
    /* Another Python thread alive: one may be inside a write (capture.c). */
    PyThreadState *t = PyInterpreterState_ThreadHead(PyInterpreterState_Get());
    bool threads = t && PyThreadState_Next(t);
    Py_BEGIN_ALLOW_THREADS
    capture_end(&g_pyrt.cap, g_pyrt.devnull_fd, threads);
    Py_END_ALLOW_THREADS
    g_pyrt.capturing = false;
    Py_RETURN_NONE;
}

/* output(exit_code, stderr_notes, send) -> int: build the block's `output`
 * frame from what the last capture kept (output.c), send it if send is
 * true, and free the capture's buffers. Returns the frame's length. */
static PyObject *fb_output(PyObject *self, PyObject *args)
{
    if (refused_in_forked_copy())
        return NULL;
    long long exit_code;
    const char *notes;
    int send;
    if (!PyArg_ParseTuple(args, "Lsp:output", &exit_code, &notes, &send))
        return NULL;
    if (g_pyrt.capturing) {
        PyErr_SetString(PyExc_RuntimeError, "capture still running");
        return NULL;
    }
    struct buf frame;
    buf_init(&frame, CHAN_MAX_MESSAGE_BYTES);
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = output_frame(&frame, &g_pyrt.cap, notes, exit_code);
    capture_free(&g_pyrt.cap);
    if (r == 0 && send) {
        pthread_mutex_lock(&g_pyrt.send_lock);
        chan_send_locked(CHAN_FRAME, frame.data, frame.len);
        pthread_mutex_unlock(&g_pyrt.send_lock);
    }
    Py_END_ALLOW_THREADS
    size_t len = frame.len;
    buf_free(&frame);
    if (r < 0) {
        errno = -r;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSize_t(len);
}

/* ---- archives --------------------------------------------------------- */

/* The turn's first message is its tools archive (the supervisor sends it as
 * soon as it has the channel): extracted and answered with ready here, in C,
 * before the interpreter runs a frame and, in a fresh sandbox, before the
 * reader thread exists. Both are then after ready, not in front of it: the
 * thread's start, and the first frames' copy-on-write faults (~60 pages),
 * put ~0.35 ms between a fresh sandbox's set-up and its ready (measured with
 * --step-times). The tools fd is closed after: no writable path to the
 * tools is left for user code. The supervisor always sends the tools first;
 * anything else first is the stream out of step. */
void pyrt_tools_and_ready(bool reader_running)
{
    enum chan_type type;
    uint8_t *data;
    size_t len;
    if (reader_running)
        reader_next(&type, &data, &len);
    else
        reader_read_first(&type, &data, &len);
    steptime_mark(ST_R_TOOLS);
    char msg[300] = "tools archive: ";
    int r = -EPROTO;
    if (type == CHAN_TOOLS)
        r = extract(data, len, g_pyrt.tools_fd, msg + strlen(msg), sizeof msg - strlen(msg));
    else
        snprintf(msg, sizeof msg, "forkbox runtime: internal error: the channel did not start "
                 "with the tools archive");
    free(data);
    close_and_reset(&g_pyrt.tools_fd);
    steptime_mark(ST_R_READY);
    if (r < 0) {
        (void)chan_write_log(g_pyrt.chan_fd, "error", msg);
        _exit(3);
    }
    pthread_mutex_lock(&g_pyrt.send_lock);
    chan_send_locked(CHAN_FRAME, PyBytes_AS_STRING(g_pyrt.ready),
                     (size_t)PyBytes_GET_SIZE(g_pyrt.ready));
    pthread_mutex_unlock(&g_pyrt.send_lock);
}

/* extract_workspace(data): the archive given (bytes-like) into the workspace
 * (a pooled sandbox's warm-up; the turn's own come through serve_loop). */
static PyObject *fb_extract_workspace(PyObject *self, PyObject *arg)
{
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0)
        return NULL;
    char msg[256] = "";
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = extract(data.buf, (size_t)data.len, g_pyrt.ws_fd, msg, sizeof(msg));
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (r < 0) {
        PyObject *e = Py_BuildValue("(is)", -r, msg);
        if (e) {
            PyErr_SetObject(PyExc_OSError, e);
            Py_DECREF(e);
        }
        return NULL;
    }
    Py_RETURN_NONE;
}

/* snapshot() -> (files left out over the cap, files and directories left
 * out for their names, error text or None). The archive stays in C until
 * send_snapshot(): it can be 100 MiB. */
static PyObject *fb_snapshot(PyObject *self, PyObject *unused)
{
    struct snapshot_stats st = {0};
    int r;
    snapshot_iov_free(&g_pyrt.snap);
    if (g_pyrt.no_snapshot) /* stream mode: the host sees the workspace itself */
        return Py_BuildValue("(KKO)", 0ULL, 0ULL, Py_None);
    if (!g_pyrt.snap_cache && g_pyrt.snapshot_cache_max)
        g_pyrt.snap_cache = snapshot_cache_new(g_pyrt.snapshot_cache_max);
    Py_BEGIN_ALLOW_THREADS
    r = archive_snapshot_iov(g_pyrt.ws_fd, g_pyrt.snapshot_max, g_pyrt.snap_cache,
                             &g_pyrt.snap, &st);
    Py_END_ALLOW_THREADS
    if (r < 0) {
        /* A zero-length archive leaves the host's copy unchanged (spec 4.4). */
        snapshot_iov_free(&g_pyrt.snap);
        return Py_BuildValue("(KKs)", (unsigned long long)st.over_cap,
                             (unsigned long long)st.bad_names, strerror(-r));
    }
    return Py_BuildValue("(KKO)", (unsigned long long)st.over_cap,
                         (unsigned long long)st.bad_names, Py_None);
}

static PyObject *fb_send_snapshot(PyObject *self, PyObject *unused)
{
    if (refused_in_forked_copy())
        return NULL;
    /* The first block's record is complete: it goes before the snapshot,
     * which may end the turn (and kill us) at once. */
    steptime_mark(ST_R_SNAPSHOT);
    steptime_send();
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&g_pyrt.send_lock);
    chan_send_snapshot_locked(&g_pyrt.snap);
    pthread_mutex_unlock(&g_pyrt.send_lock);
    Py_END_ALLOW_THREADS
    snapshot_iov_free(&g_pyrt.snap);
    Py_RETURN_NONE;
}

/* snapshot_discard(): drop the snapshot built last without sending it
 * (the warm-up of a pooled sandbox). */
static PyObject *fb_snapshot_discard(PyObject *self, PyObject *unused)
{
    snapshot_iov_free(&g_pyrt.snap);
    Py_RETURN_NONE;
}

/* warm_done(): a pooled sandbox tells the fork server it is warmed up, once.
 * The fork server may already have closed its end (it handed us out before
 * the warm-up was over): MSG_NOSIGNAL, and any error is fine. */
static PyObject *fb_warm_done(PyObject *self, PyObject *unused)
{
    if (refused_in_forked_copy())
        return NULL;
    if (g_pyrt.warm_fd >= 0) {
        char c = 'W';
        ssize_t w;
        do
            w = send(g_pyrt.warm_fd, &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (w < 0 && errno == EINTR);
        close_and_reset(&g_pyrt.warm_fd);
    }
    Py_RETURN_NONE;
}

static PyObject *fb_snapshot_max(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(g_pyrt.snapshot_max);
}

/* ---- environment (spec 6.4) ------------------------------------------- */

/* Is the variable kv ("NAME=value", or a bare name) on the allowlist
 * (env_keep.h)? */
static bool env_allowed(const char *kv)
{
    static const char *const keep[] = {PYRT_ENV_KEEP_NAMES};
    static const char prefix[] = PYRT_ENV_KEEP_PREFIX;
    const char *eq = strchr(kv, '=');
    size_t n = eq ? (size_t)(eq - kv) : strlen(kv);
    if (n >= sizeof prefix - 1 && memcmp(kv, prefix, sizeof prefix - 1) == 0)
        return true;
    for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++)
        if (strlen(keep[i]) == n && memcmp(kv, keep[i], n) == 0)
            return true;
    return false;
}

/* The initial environment block [env_start, env_end) from /proc/self/stat
 * (fields 50 and 51): what /proc/self/environ shows. */
static bool env_block(uintptr_t *start, uintptr_t *end)
{
    char buf[2048];
    _cleanup_close_ int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n <= 0)
        return false;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p)
        return false;
    /* After ") " comes field 3; env_start is field 50. */
    unsigned long long v[2] = {0, 0};
    int field = 2;
    for (char *tok = strtok(p + 1, " "); tok; tok = strtok(NULL, " ")) {
        field++;
        if (field == 50)
            v[0] = strtoull(tok, NULL, 10);
        else if (field == 51) {
            v[1] = strtoull(tok, NULL, 10);
            *start = (uintptr_t)v[0];
            *end = (uintptr_t)v[1];
            return v[0] < v[1];
        }
    }
    return false;
}

/* env_allowed(name) -> bool: the runtime's test for os.environ's names
 * (str; undecodable bytes arrive as lone surrogates, which no allowed name
 * has: False, as for a NUL or '=' in the name). */
static PyObject *fb_env_allowed(PyObject *self, PyObject *arg)
{
    Py_ssize_t n;
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "env_allowed() takes a str");
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8AndSize(arg, &n);
    if (!name) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    return PyBool_FromLong(strlen(name) == (size_t)n && !strchr(name, '=') && env_allowed(name));
}

/* Remove every variable not on the allowlist from the C environ and wipe its
 * text where it sits in the initial environment block, so that it does not
 * stay readable in /proc/self/environ (spec 9.2, "secrets readable").
 * Strings outside that block (setenv copies) are only unset: libc may reuse
 * them. */
static PyObject *fb_sanitize_env(PyObject *self, PyObject *unused)
{
    uintptr_t bs = 0, be = 0;
    bool have_block = env_block(&bs, &be);
    for (;;) {
        char *victim = NULL;
        for (char **e = environ; e && *e; e++)
            if (!env_allowed(*e)) {
                victim = *e;
                break;
            }
        if (!victim)
            break;
        const char *eq = strchr(victim, '=');
        size_t n = eq ? (size_t)(eq - victim) : strlen(victim);
        char name[512];
        bool inside = have_block && (uintptr_t)victim >= bs && (uintptr_t)victim < be;
        if (eq && n > 0 && n < sizeof(name)) {
            memcpy(name, victim, n);
            name[n] = 0;
            unsetenv(name);
        }
        /* A name unsetenv() cannot handle (no '=', empty, huge) is still
         * there: drop the pointer by hand. */
        char **e = environ;
        while (*e && *e != victim)
            e++;
        for (; *e; e++)
            e[0] = e[1];
        if (inside)
            memset(victim, 0, strnlen(victim, be - (uintptr_t)victim));
    }
    Py_RETURN_NONE;
}

static PyMethodDef fb_methods[] = {
    {"tools_dir", fb_tools_dir, METH_NOARGS, "The sandbox's tools directory."},
    {"forked_copy", fb_forked_copy, METH_NOARGS, "True in a copy user code forked from the runtime."},
    {"send", fb_send, METH_VARARGS, "send(type, data): write one channel message."},
    {"call", fb_call, METH_VARARGS, "call(id, frame): send a tool_call if a block runs and wait: bytes, str (failed) or None (not sent)."},
    {"deliver", fb_deliver, METH_VARARGS, "deliver(id, frame): wake the call waiting for this tool_result."},
    {"fail_calls", fb_fail_calls, METH_O, "Fail every waiting call with this message."},
    {"block_begin", fb_block_begin, METH_NOARGS, "Mark a block as running."},
    {"block_end", fb_block_end, METH_O, "Mark the block over and send the done frame, atomically."},
    {"ensure_stdio_fds", fb_ensure_stdio_fds, METH_NOARGS, "Reopen closed fds 0-2 on /dev/null."},
    {"capture_begin", fb_capture_begin, METH_NOARGS, "Route fds 1 and 2 into capped buffers."},
    {"capture_end", fb_capture_end, METH_NOARGS, "Stop capturing; the output stays for output()."},
    {"output", fb_output, METH_VARARGS, "output(exit_code, stderr_notes, send): the output frame."},
    {"extract_workspace", fb_extract_workspace, METH_O, "Extract a workspace archive (bytes) into the workspace."},
    {"snapshot", fb_snapshot, METH_NOARGS,
     "Build the workspace snapshot: (over_cap, bad_names, error)."},
    {"send_snapshot", fb_send_snapshot, METH_NOARGS, "Send the snapshot built last."},
    {"snapshot_max", fb_snapshot_max, METH_NOARGS, "The snapshot data cap in bytes."},
    {"snapshot_discard", fb_snapshot_discard, METH_NOARGS, "Drop the snapshot built last."},
    {"warm_done", fb_warm_done, METH_NOARGS, "Pooled sandbox: report the warm-up done."},
    {"sanitize_env", fb_sanitize_env, METH_NOARGS, "Reduce the C environ to the allowlist."},
    {"env_allowed", fb_env_allowed, METH_O, "env_allowed(name): is the name on the allowlist?"},
    {"caught_signals", fb_caught_signals, METH_NOARGS, "Signals with a handler function."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fb_module = {
    PyModuleDef_HEAD_INIT, "_forkbox", "forkbox runtime internals (private).", -1, fb_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC pyrt_module_init(void)
{
    return PyModule_Create(&fb_module);
}
