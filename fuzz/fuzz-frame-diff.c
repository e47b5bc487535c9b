/* Differential target: forkbox's frame decoding against the reference's
 * decision procedure (spec 3.2), written as a small Python oracle from the
 * spec (fuzz/frame_oracle.py) and run in an embedded CPython (libpython3.11,
 * initialised once).
 *
 * Host -> supervisor (what must agree with the reference). forkbox's decode
 * of a client's text message is, end to end: the WebSocket layer's UTF-8
 * check (net/ws_in.c, utf8_valid), frame_decode(FRAME_FROM_CLIENT) in the
 * supervisor, frame_encode() of the result onto the channel, and the sandbox
 * runtime's decoder on those bytes (src/pyrt/py/adk_code_mode_sandbox/
 * protocol.py; for a run frame also the C reader shape_run_code()). For
 * every input:
 *   - forkbox accepts iff the oracle does (the supervisor and the runtime
 *     both: the supervisor never relays what its sandbox cannot decode);
 *   - when both accept, the kind and every field's value are equal, with
 *     exact types (frame_oracle.canon: 1 is not 1.0 nor True, NaN is NaN,
 *     -0.0, big integers, lone surrogates, duplicate keys inside values);
 *   - a run's code read by shape_run_code(), when it reads it, is the
 *     runtime's code.
 * Sandbox -> supervisor -> host. The supervisor is stricter with a sandbox
 * (spec 3.3 types, five kinds): a refusal is not compared; but a frame it
 * accepts must be one the host (the reference's decoder, the oracle)
 * accepts, and what it relays (frame_encode()) must decode there to the same
 * values as the sandbox's bytes.
 *
 * Deliberate differences, each narrow and listed in docs/compatibility.md:
 *   DIFF_TYPES  a client's run.code and tool_result.id must be strings
 *               (forkbox refuses the frame; the reference decodes it, then
 *               compile() fails on a non-string code, and a non-string id
 *               matches no call, so the result is dropped either way);
 *   DIFF_DEPTH  nesting deeper than JSCAN_MAX_DEPTH (512): forkbox stops
 *               there on purpose, the reference's json at its interpreter's
 *               recursion limit, which depends on the Python version and on
 *               the caller's stack (3.11: 993 levels less the stack's depth),
 *               so no fixed depth would match it (proto/jscan.h says why 512);
 *   DIFF_ITEMS  more than FRAME_MAX_ITEMS (4 Mi) JSON items in one message
 *               (the scanner's time bound; the reference has none but the
 *               256 MiB message size). Needs an input of 8 MiB or more, so
 *               libFuzzer's lengths never reach it; kept for a replayed one. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <string.h>

#include "core/buf.h"
#include "core/utf8.h"
#include "fuzz.h"
#include "proto/frame.h"
#include "proto/jscan.h"
#include "proto/shape.h"

#ifndef FUZZ_SRCDIR
#error "FUZZ_SRCDIR (the source tree, for fuzz/frame_oracle.py and src/pyrt/py) is set by fuzz/meson.build"
#endif

#define ENCODE_MAX (64u * 1024 * 1024)
/* Past this nesting depth accept/refuse may differ (DIFF_DEPTH); values of
 * what both accept are still compared. */
#define DEEP JSCAN_MAX_DEPTH

static PyObject *oracle_decode;  /* owned: frame_oracle.decode */
static PyObject *oracle_canon;   /* owned: frame_oracle.canon_values */
static PyObject *runtime_decode; /* owned: adk_code_mode_sandbox.protocol.decode */

static PyObject *import_attr(const char *module, const char *attr)
{
    PyObject *m = PyImport_ImportModule(module);
    PyObject *a = m ? PyObject_GetAttrString(m, attr) : NULL;
    if (!a) {
        PyErr_Print();
        fprintf(stderr, "frame-diff: cannot load %s.%s\n", module, attr);
        abort();
    }
    Py_DECREF(m);
    return a;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    PyConfig config;
    PyStatus st;

    (void)argc;
    (void)argv;
    /* Isolated: no environment, no user site; no signal handlers (libFuzzer
     * owns SIGINT, SIGSEGV...). */
    PyConfig_InitIsolatedConfig(&config);
    config.install_signal_handlers = 0;
    config.site_import = 0;
    config.write_bytecode = 0;
    st = PyConfig_SetBytesString(&config, &config.program_name, "frame-diff");
    if (!PyStatus_Exception(st))
        st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(st)) {
        fprintf(stderr, "frame-diff: Python: %s\n", st.err_msg ? st.err_msg : "?");
        abort();
    }
    if (PyRun_SimpleString("import sys\n"
                           "sys.path[:0] = ['" FUZZ_SRCDIR "/fuzz', '" FUZZ_SRCDIR "/src/pyrt/py']\n") != 0)
        abort();
    oracle_decode = import_attr("frame_oracle", "decode");
    oracle_canon = import_attr("frame_oracle", "canon_values");
    runtime_decode = import_attr("adk_code_mode_sandbox.protocol", "decode");
    return 0;
}

/* LeakSanitizer: the interpreter lives until exit and is never finalised
 * (finalising would not free everything either), and it keeps some of its
 * objects behind pointers LSan does not see, so what libpython allocated is
 * not reported. forkbox's own allocations are still checked. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libpython3\n";
}

/* The deepest nesting of [ and { outside strings (the input need not be
 * JSON: this only decides whether DIFF_DEPTH may apply). */
static unsigned max_depth(const uint8_t *p, size_t n)
{
    unsigned d = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        if (in_str) {
            if (p[i] == '\\')
                i++;
            else if (p[i] == '"')
                in_str = false;
        } else if (p[i] == '"') {
            in_str = true;
        } else if (p[i] == '[' || p[i] == '{') {
            if (++d > max)
                max = d;
        } else if ((p[i] == ']' || p[i] == '}') && d > 0) {
            d--;
        }
    }
    return max;
}

/* The oracle's verdict on bytes: a new reference to its tuple
 * ("ok", canon, kind, values) or ("error", reason). */
static PyObject *oracle(const uint8_t *p, size_t n)
{
    PyObject *r = PyObject_CallFunction(oracle_decode, "y#", (const char *)p, (Py_ssize_t)n);
    FUZZ_ASSERT(r && PyTuple_Check(r), "the oracle raised");
    return r;
}

static bool tuple_ok(PyObject *t)
{
    return PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(t, 0), "ok") == 0;
}

static const char *tuple_str(PyObject *t, Py_ssize_t i)
{
    const char *s = PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, i));
    if (!s) { /* a canon text is ASCII; a reason too */
        PyErr_Clear();
        return "?";
    }
    return s;
}

/* DIFF_TYPES: forkbox refused the type of run.code or tool_result.id, which
 * the reference does not check. */
static bool diff_types(PyObject *o, const char *why)
{
    if (!why || strcmp(why, "field has the wrong type") != 0 || !tuple_ok(o))
        return false;
    const char *kind = tuple_str(o, 2);
    PyObject *values = PyTuple_GET_ITEM(o, 3);
    const char *name = !strcmp(kind, "run") ? "code" : !strcmp(kind, "tool_result") ? "id" : NULL;
    PyObject *v = name ? PyDict_GetItemString(values, name) : NULL;
    return v && !PyUnicode_Check(v);
}

/* forkbox's decode of what the supervisor accepted, as the sandbox reads it:
 * a new reference to its canon text, or NULL with *why set if the runtime
 * refuses it. */
static PyObject *runtime_view(const struct frame *f, const char **why)
{
    struct buf e;
    buf_init(&e, ENCODE_MAX);
    FUZZ_ASSERT(frame_encode(f, &e) == 0, "frame_encode");

    PyObject *obj = PyObject_CallFunction(runtime_decode, "y#", (const char *)e.data,
                                          (Py_ssize_t)e.len);
    PyObject *canon = NULL;
    if (!obj) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        *why = "the sandbox's decoder refused what the supervisor relays";
        if (value) {
            PyObject *s = PyObject_Str(value);
            fprintf(stderr, "runtime: %s\n", s ? PyUnicode_AsUTF8(s) : "?");
            Py_XDECREF(s);
        }
        PyErr_Clear();
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    } else {
        canon = PyObject_CallFunction(oracle_canon, "sO", frame_kind_name(f->kind), obj);
        FUZZ_ASSERT(canon, "canon of the runtime's frame raised");
        /* The sandbox reads a run's code in C when the frame has its shape. */
        if (f->kind == FRAME_RUN) {
            cJSON *root = NULL;
            const char *code = shape_run_code(e.data, e.len, &root);
            if (code) {
                PyObject *c = PyUnicode_FromString(code);
                PyObject *rc = PyObject_GetAttrString(obj, "code");
                FUZZ_ASSERT(c && rc && PyObject_RichCompareBool(c, rc, Py_EQ) == 1,
                            "shape_run_code() reads another code than the runtime's decoder");
                Py_DECREF(c);
                Py_DECREF(rc);
            }
            cJSON_Delete(root);
        }
        Py_DECREF(obj);
    }
    buf_free(&e);
    return canon;
}

static void from_client(const uint8_t *data, size_t size)
{
    struct frame f;
    const char *why = NULL;
    PyObject *o = oracle(data, size), *mine = NULL;
    bool ok = false;

    if (!utf8_valid(data, size)) {
        why = "not UTF-8 (the WebSocket layer closes with 1007)";
    } else {
        int r = frame_decode(data, size, FRAME_FROM_CLIENT, &f, &why);
        if (r == -ENOMEM)
            goto out;
        if (r == 0) {
            mine = runtime_view(&f, &why);
            ok = mine != NULL;
            frame_free(&f);
        }
    }

    bool ook = tuple_ok(o);
    if (ok != ook) {
        if (!ok && diff_types(o, why)) /* DIFF_TYPES */
            goto out;
        if (max_depth(data, size) > DEEP) /* DIFF_DEPTH */
            goto out;
        if (!ok && why && strcmp(why, "too many JSON values") == 0) /* DIFF_ITEMS */
            goto out;
    }
    FUZZ_ASSERT(ok == ook, "host frame: forkbox %s (%s), the reference %s (%s): %.*s",
                ok ? "accepts" : "refuses", why ? why : "", ook ? "accepts" : "refuses",
                tuple_str(o, 1), (int)(size > 300 ? 300 : size), (const char *)data);
    if (ok)
        FUZZ_ASSERT(strcmp(PyUnicode_AsUTF8(mine), tuple_str(o, 1)) == 0,
                    "host frame decoded differently:\n  forkbox   %.600s\n  reference %.600s",
                    PyUnicode_AsUTF8(mine), tuple_str(o, 1));
out:
    Py_XDECREF(mine);
    Py_DECREF(o);
}

static void from_child(const uint8_t *data, size_t size)
{
    struct frame f;
    const char *why = NULL;
    struct buf e;

    if (frame_decode(data, size, FRAME_FROM_CHILD, &f, &why) != 0)
        return; /* stricter than the reference on purpose (spec 3.3, issue 11) */
    PyObject *o = oracle(data, size);
    FUZZ_ASSERT(tuple_ok(o) || max_depth(data, size) > DEEP,
                "the supervisor accepts a sandbox frame the host cannot decode (%s): %.*s",
                tuple_str(o, 1), (int)(size > 300 ? 300 : size), (const char *)data);
    buf_init(&e, ENCODE_MAX);
    FUZZ_ASSERT(frame_encode(&f, &e) == 0, "frame_encode");
    PyObject *relayed = oracle(e.data, e.len);
    FUZZ_ASSERT(tuple_ok(relayed) == tuple_ok(o) &&
                    strcmp(tuple_str(relayed, 1), tuple_str(o, 1)) == 0,
                "the host decodes the relayed frame differently:\n  sent     %.600s\n"
                "  relayed  %.600s",
                tuple_str(o, 1), tuple_str(relayed, 1));
    Py_DECREF(relayed);
    Py_DECREF(o);
    buf_free(&e);
    frame_free(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    from_client(data, size);
    from_child(data, size);
    return 0;
}
