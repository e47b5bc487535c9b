/* The embedded CPython runtime (see pyrt.h).
 *
 * pyrt_init() runs once in the fork server and does everything that can be
 * shared with every sandbox: interpreter start, the runtime package served
 * from the binary, ready.packages, preloads, gc.freeze(). pyrt_serve() runs
 * in the sandbox child and hands the turn to forkbox_runtime.serve(), the
 * Python half of the loop; C keeps the channel, output capture, archives
 * and the environment (module.c, capture.c). */
#include "pyrt/pyrt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/limits.h"
#include "core/steptime.h"
#include "core/util.h"
#include "proto/chan.h"
#include "pyrt/pyrt_embedded.h"
#include "pyrt/pyrt_int.h"
#include "stage/archive.h"

#define RUNTIME_SOURCE "forkbox_runtime.py"
#define RUNTIME_FILENAME "/<forkbox>/forkbox_runtime.py"

struct pyrt_state g_pyrt = {
    .chan_fd = -1,
    .tools_fd = -1,
    .warm_fd = -1,
    .ws_fd = -1,
    .devnull_fd = -1,
    .send_lock = PTHREAD_MUTEX_INITIALIZER,
};

/* Describe the pending Python exception in err, print its traceback to
 * stderr (the fork server's log) and clear it. Returns the code for it:
 * -ENOMEM for a MemoryError, else -EIO (the runtime itself failed). */
static int py_err(char *err, size_t errlen, const char *what)
{
    int code = PyErr_ExceptionMatches(PyExc_MemoryError) ? -ENOMEM : -EIO;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    const char *text = "unknown error";
    PyObject *s = value ? PyObject_Str(value) : NULL;
    if (s)
        text = PyUnicode_AsUTF8(s);
    if (!text) {
        PyErr_Clear();
        text = "unprintable error";
    }
    (void)err_fmt(err, errlen, 0, "%s: %s: %s", what,
            type ? ((PyTypeObject *)type)->tp_name : "?", text);
    Py_XDECREF(s);
    PyErr_Restore(type, value, tb);
    PyErr_Print();
    return code;
}

static const struct pyrt_source *find_source(const char *rel)
{
    for (size_t i = 0; i < sizeof(pyrt_sources) / sizeof(pyrt_sources[0]); i++)
        if (strcmp(pyrt_sources[i].path, rel) == 0)
            return &pyrt_sources[i];
    return NULL;
}

/* {relative path: source bytes} of the package served to user code. */
static PyObject *package_sources(void)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    for (size_t i = 0; i < sizeof(pyrt_sources) / sizeof(pyrt_sources[0]); i++) {
        const struct pyrt_source *s = &pyrt_sources[i];
        if (strcmp(s->path, RUNTIME_SOURCE) == 0)
            continue;
        PyObject *b = PyBytes_FromStringAndSize((const char *)s->text, (Py_ssize_t)s->len);
        if (!b || PyDict_SetItemString(d, s->path, b) < 0) {
            Py_XDECREF(b);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(b);
    }
    return d;
}

/* The runtime module, executed from the embedded source. It is deliberately
 * not put in sys.modules: user code has no name to import it by. */
static PyObject *load_runtime(void)
{
    const struct pyrt_source *src = find_source(RUNTIME_SOURCE);
    if (!src) {
        PyErr_SetString(PyExc_ImportError, "runtime source not embedded");
        return NULL;
    }
    PyObject *mod = PyModule_New("_forkbox_runtime");
    if (!mod)
        return NULL;
    PyObject *dict = PyModule_GetDict(mod);
    if (PyDict_SetItemString(dict, "__builtins__", PyEval_GetBuiltins()) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    /* The embedded text is NUL-terminated (embed.py appends a 0). */
    PyObject *code = Py_CompileString((const char *)src->text, RUNTIME_FILENAME, Py_file_input);
    if (!code) {
        Py_DECREF(mod);
        return NULL;
    }
    PyObject *r = PyEval_EvalCode(code, dict, dict);
    Py_DECREF(code);
    if (!r) {
        Py_DECREF(mod);
        return NULL;
    }
    Py_DECREF(r);
    return mod;
}

static int thread_count(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    if (!f)
        return -1;
    char line[256];
    int n = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    fclose(f);
    return n;
}

/* The interpreter with _forkbox importable. In the fork server it is
 * already running: forkbox-sandbox.so is loaded by python3.11, started by
 * FS_ARGV with the settings an embedding gets here (sandbox_module.c says
 * why), and only the module and sys.executable are left to set. An
 * embedding (tests/pyrt's harness, test_sandbox) starts it here. */
static int interp_start(char *err, size_t errlen)
{
    if (Py_IsInitialized()) {
        PyObject *m = pyrt_module_init();
        int r = m ? PyDict_SetItemString(PyImport_GetModuleDict(), "_forkbox", m) : -1;
        Py_XDECREF(m);
        PyObject *exe = r == 0 ? PyUnicode_DecodeFSDefault(PYRT_PYTHON_EXE) : NULL;
        r = exe ? PySys_SetObject("executable", exe) : -1;
        Py_XDECREF(exe);
        if (r < 0)
            return py_err(err, errlen, "pyrt_init: the _forkbox module");
        return 0;
    }
    if (PyImport_AppendInittab("_forkbox", pyrt_module_init) < 0) {
        return err_fmt(err, errlen, -ENOMEM, "pyrt_init: cannot register the _forkbox module");
    }

    /* UTF-8 mode: file names, open() and subprocess text default to UTF-8
     * whatever the (minimal) locale of the fork server is. */
    PyPreConfig pre;
    PyPreConfig_InitIsolatedConfig(&pre);
    pre.utf8_mode = 1;
    PyStatus st = Py_PreInitialize(&pre);
    if (PyStatus_Exception(st)) {
        return err_fmt(err, errlen, -EIO, "pyrt_init: pre-initialisation: %s",
                       st.err_msg ? st.err_msg : "failed");
    }

    /* Isolated: no environment variables read, no user site, no script
     * directory on sys.path (safe_path). The site module still runs, so
     * Debian's dist-packages stay importable. Signal dispositions of the fork
     * server are left alone; pyrt_serve() sets the child's. No bytecode is
     * written: sandboxes are throwaway, and a __pycache__ in the workspace
     * would show up in the snapshot. */
    PyConfig pc;
    PyConfig_InitIsolatedConfig(&pc);
    pc.site_import = 1;
    pc.user_site_directory = 0;
    pc.safe_path = 1;
    pc.write_bytecode = 0;
    pc.install_signal_handlers = 0;
    pc.parse_argv = 0;
    st = PyConfig_SetString(&pc, &pc.program_name, L"python3");
    if (!PyStatus_Exception(st) && access(PYRT_PYTHON_EXE, X_OK) == 0)
        st = PyConfig_SetBytesString(&pc, &pc.executable, PYRT_PYTHON_EXE);
    if (!PyStatus_Exception(st))
        st = Py_InitializeFromConfig(&pc);
    PyConfig_Clear(&pc);
    if (PyStatus_Exception(st)) {
        return err_fmt(err, errlen, -EIO, "pyrt_init: %s%s%s", st.func ? st.func : "",
                       st.func ? ": " : "", st.err_msg ? st.err_msg : "initialisation failed");
    }

    return 0;
}

int pyrt_init(const struct config *cfg, char *err, size_t errlen)
{
    if (g_pyrt.runtime)
        return err_fmt(err, errlen, -EALREADY, "pyrt_init: the runtime is already initialised");
    g_pyrt.output_cap = cfg->output_cap ? cfg->output_cap : OUTPUT_DEFAULT_CAP;
    g_pyrt.snapshot_max = cfg->snapshot_max ? cfg->snapshot_max : SNAPSHOT_DEFAULT_MAX_BYTES;
    g_pyrt.no_snapshot = cfg->workdir[0] != '\0';
    /* The members kept for the next snapshot count against the turn's
     * memory cgroup: at most an eighth of it, and SNAPSHOT_CACHE_MAX. */
    g_pyrt.snapshot_cache_max = SNAPSHOT_CACHE_MAX;
    if (cfg->memory_max && cfg->memory_max / SNAPSHOT_CACHE_MEMORY_SHARE < g_pyrt.snapshot_cache_max)
        g_pyrt.snapshot_cache_max = cfg->memory_max / SNAPSHOT_CACHE_MEMORY_SHARE;
    g_pyrt.max_unpacked = cfg->max_unpacked ? cfg->max_unpacked : ARCHIVE_DEFAULT_MAX_UNPACKED;
    g_pyrt.max_members = cfg->max_members ? cfg->max_members : ARCHIVE_DEFAULT_MAX_MEMBERS;
    /* Output frames must fit in one channel message with room for JSON
     * escaping (up to 6 bytes per byte of output, two streams). */
    if (g_pyrt.output_cap > CHAN_MAX_MESSAGE_BYTES / 16)
        g_pyrt.output_cap = CHAN_MAX_MESSAGE_BYTES / 16;

    int r = interp_start(err, errlen);
    if (r < 0)
        return r;
    PyObject *rt = load_runtime();
    if (!rt)
        return py_err(err, errlen, "pyrt_init: loading the runtime");
    PyObject *sources = package_sources();
    PyObject *sites = PyList_New(0);
    for (unsigned i = 0; sources && sites && i < cfg->n_site_dirs && i < CONFIG_MAX_SITE_DIRS; i++) {
        if (!cfg->site_dirs[i][0])
            continue;
        PyObject *s = PyUnicode_DecodeFSDefault(cfg->site_dirs[i]);
        if (!s || PyList_Append(sites, s) < 0) {
            Py_XDECREF(s);
            Py_CLEAR(sites);
            break;
        }
        Py_DECREF(s);
    }
    PyObject *ready = NULL;
    if (sources && sites)
        ready = PyObject_CallMethod(rt, "init", "OOs", sources, sites, cfg->preload);
    Py_XDECREF(sources);
    Py_XDECREF(sites);
    if (!ready || !PyBytes_Check(ready)) {
        if (ready)
            PyErr_SetString(PyExc_TypeError, "init() did not return bytes");
        Py_XDECREF(ready);
        Py_DECREF(rt);
        return py_err(err, errlen, "pyrt_init");
    }
    g_pyrt.ready = ready; /* sent from C (pyrt_tools_and_ready) */
    g_pyrt.runtime = rt;
    (void)archive_snapshot_prepare(); /* without it, empty snapshots take the long way */

    /* clone(CLONE_NEWUSER) needs a single-threaded caller: a preload that
     * started a thread (a BLAS pool, say) would break every turn. */
    int n = thread_count();
    if (n > 1) {
        /* -EINVAL: the configuration (--preload) is what is wrong. */
        return err_fmt(err, errlen, -EINVAL, "pyrt_init: %d threads running after the "
                       "preloads; the fork server must stay single-threaded", n);
    }
    /* The fork server keeps the GIL for good: it runs no other Python
     * thread, and each child starts out holding it. */
    return 0;
}

void pyrt_after_fork(void)
{
    /* Resets the GIL, the import lock and the thread states, and runs the
     * os.register_at_fork() child hooks (threading, random reseeding).
     * Nothing here relies on a cached pid: glibc no longer caches it. */
    PyOS_AfterFork_Child();
}

/* ---- the child -------------------------------------------------------- */

/* A `log` error frame written straight from C, for failures before the
 * Python loop runs (proto's writer: no allocation, valid UTF-8 whatever msg
 * holds). */
static void send_log_error(const char *msg)
{
    (void)chan_write_log(g_pyrt.chan_fd, "error", msg);
}

static _Noreturn void fail(const char *what, int errnum)
{
    char msg[512];
    snprintf(msg, sizeof(msg), "%s: %s", what, strerror(errnum));
    send_log_error(msg);
    _exit(3);
}

/* Keep fd off 0-2 (which are dup2 targets during a block) and close-on-exec. */
static int settle_fd(int fd)
{
    if (fd >= 0 && fd <= 2) {
        int nfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (nfd < 0)
            return -1;
        return nfd; /* the low fd stays: it is reopened on /dev/null below */
    }
    if (fd >= 0)
        fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
}

/* pthread_atfork child handler: user code forked the runtime (os.fork,
 * multiprocessing's fork start method, a C extension). The copy shares the
 * turn's channel and capture pipes, and a frame it wrote would interleave
 * with the runtime's (two `done`s, a stale `output`): it drops them here,
 * in fork() itself, before any of its code runs, and the _forkbox entry
 * points refuse to run in it (pyrt_forked_copy, module.c). Its fds 1 and 2
 * stay what they were (the block's pipes), so its output is the block's,
 * as a forked child's is in ordinary Python. Only close(): this runs in a
 * child of a multithreaded process. */
static void forked_child(void)
{
    close_and_reset(&g_pyrt.chan_fd);
    close_and_reset(&g_pyrt.warm_fd);
    close_and_reset(&g_pyrt.tools_fd);
    capture_forget_in_child();
}

_Noreturn void pyrt_serve(int chan_fd, int tools_fd, int warm_fd, const char *tools_dir,
                          const char *workspace_dir)
{
    g_pyrt.chan_fd = settle_fd(chan_fd);
    if (g_pyrt.chan_fd < 0 || !g_pyrt.runtime)
        _exit(3);
    g_pyrt.tools_fd = settle_fd(tools_fd);
    if (g_pyrt.tools_fd < 0)
        fail("tools dir", EBADF);
    g_pyrt.warm_fd = warm_fd >= 0 ? settle_fd(warm_fd) : -1;
    g_pyrt.owner_pid = getpid(); /* a syscall: glibc caches no pid */
    g_pyrt.tools_dir = tools_dir;
    if (pthread_atfork(NULL, NULL, forked_child) != 0)
        fail("pthread_atfork", ENOMEM);
    pthread_mutex_init(&g_pyrt.send_lock, NULL);
    g_pyrt.in_block = false;

    g_pyrt.devnull_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (g_pyrt.devnull_fd < 0)
        fail("open /dev/null", errno);
    /* User code must not write to fds this process does not own: 0-2 are
     * /dev/null outside blocks (they are on entry; make sure, also when the
     * channel or tools fd was one of them and has just been moved). */
    for (int fd = 0; fd < 3; fd++)
        dup2(g_pyrt.devnull_fd, fd);

    /* The workspace root is held by fd: it stays the archive root whatever
     * the cwd becomes. */
    g_pyrt.ws_fd = open(workspace_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (g_pyrt.ws_fd < 0)
        fail("workspace dir", errno);
    if (chdir(workspace_dir) < 0)
        fail("chdir to the workspace", errno);

    steptime_mark(ST_R_SERVE);

    /* A pooled sandbox warms up first (the reader drains the warm-up's
     * capture), then waits for its tools; a fresh one reads them itself,
     * and starts the reader once ready is sent (pyrt_tools_and_ready). */
    bool warm = g_pyrt.warm_fd >= 0;
    int e = warm ? reader_start() : 0;
    if (e < 0)
        fail("channel reader thread", -e);
    PyObject *r = warm ? PyObject_CallMethod(g_pyrt.runtime, "warm", NULL) : NULL;
    Py_XDECREF(r); /* warm() never fails: a warm-up is an optimisation */
    PyErr_Clear();
    pyrt_tools_and_ready(warm);
    if (!warm && (e = reader_start()) < 0)
        fail("channel reader thread", -e);
    /* The loop is entered from C, not through a Python serve(): its frame and
     * what it set up were copy-on-write faults of every fresh sandbox. */
    PyObject *turn = PyObject_GetAttrString(g_pyrt.runtime, "_next_turn");
    if (turn)
        pyrt_serve_turn(turn); /* only comes back on an internal error */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value) {
        if (tb)
            PyException_SetTraceback(value, tb);
        r = PyObject_CallMethod(g_pyrt.runtime, "internal_error", "O", value); /* exits */
        Py_XDECREF(r);
    }
    PyErr_Clear();
    send_log_error("forkbox runtime: the turn loop stopped");
    _exit(4);
}
