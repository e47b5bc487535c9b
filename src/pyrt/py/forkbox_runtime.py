"""forkbox's private runtime: the turn loop that pyrt_serve() hands over to.

Loaded by pyrt.c from the binary into a module that is not in sys.modules, so
user code cannot import it by name. Channel I/O, output capture, archives and
the environment are done in C by the builtin _forkbox module; this file holds
the parts that are easier to get right in Python (JSON, tracebacks, imports).
"""
# Not `threading` (nor `queue`, which imports it): threading's at-fork hook
# (os.register_at_fork) runs in every sandbox as it starts and un-shared ~140
# pages of the fork server's heap per turn (measured). User code that imports
# threading gets a fresh copy; a --preload that imports it brings the hook back.
import __future__
import builtins
import gc
import importlib
import importlib.machinery
import importlib.util
import io
import json
import os
import platform
import signal
import _signal  # the C functions: no enum conversions, and whatever user code does to `signal`
import sys
import _thread
import traceback
import types

import _forkbox as _fb

_CHAN_FRAME = ord("F")
_CHAN_SNAPSHOT = ord("S")

_EXCLUDED_DISTS = {"adk-code-mode-sandbox", "websockets", "pip", "setuptools", "wheel"}
_FILENAME = "<code-mode>"
_COMPILE_FLAGS = __future__.annotations.compiler_flag
_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1
_SRC_PREFIX = "/<forkbox>/"

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=True).encode

# The warm-up of a pooled sandbox (see _Turn.warm_up): blocks like the ones
# agents write, one that succeeds and prints to both streams, one that fails
# with a traceback. They use only modules the runtime has already imported.
_WARM_BLOCKS = (
    """\
import json, sys
rows = [{"id": i, "name": f"item {i}", "ok": i % 2 == 0} for i in range(20)]
total = sum(r["id"] for r in rows if r["ok"])
text = json.dumps({"rows": rows, "total": total}, indent=2)
data = json.loads(text)
print(len(text), data["total"], sorted(data)[:3], f"{total / 3:.2f}")
try:
    {}["missing"]
except KeyError as e:
    print("error:", repr(e), file=sys.stderr)
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def __repr__(self):
        return f"Point({self.x}, {self.y})"
print(Point(1, 2), " ".join(str(x) for x in range(5)))
""",
    "def f(x):\n    return 1 / x\nf(0)\n",
)
# An empty gzip tar, as a host sends for an empty workspace.
_EMPTY_TGZ = (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03\xed\xc1\x01\r\x00\x00\x00\xc2\xa0"
              b"\xf7Om\x0e7\xa0\x00\x00\x00\x00\x00\x00\x00\x00\x00\x807\x03\x9a\xde\x1d'\x00"
              b"(\x00\x00")


def _frame(obj):
    return (_dumps(obj) + "\n").encode("utf-8")


# An error `log` frame, fields in the table's order (src/proto/frame_fields.h)
# so that the supervisor relays it as it is. Written with json, the same
# escaping as the supervisor's encoder, not with C's frame_log_write: msg may
# be a long traceback in any language, which that writer (made for short
# ASCII messages where nothing may allocate) would cut and turn into '?'.
def _log_error_frame(msg):
    return _frame({"level": "error", "msg": msg, "kind": "log"})


# `done`, built as _frame() would build it without making a json encoder
# object per block. (`output` is built in C: _fb.output, pyrt/output.c.)
def _done_frame(exit_code):
    return b'{"exit_code":%d,"kind":"done"}\n' % exit_code


# --------------------------------------------------------------------------
# Modules served from the binary


class EmbeddedFinder:
    """Meta-path finder + loader for the runtime package embedded in the binary.

    Only the names it was given are served; it reads no file, so nothing of the
    fork server's or supervisor's filesystem is reachable through it."""

    def __init__(self, sources):
        # sources: {"adk_code_mode_sandbox/_rpc_client.py": b"..."}
        self._mods = {}
        for rel, text in sources.items():
            if not rel.endswith(".py"):
                continue
            parts = rel[:-3].split("/")
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts.pop()
            self._mods[".".join(parts)] = (rel, text, is_pkg)

    def find_spec(self, fullname, path=None, target=None):
        entry = self._mods.get(fullname)
        if entry is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=_SRC_PREFIX + entry[0],
                                              is_package=entry[2])

    def invalidate_caches(self):
        pass

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        rel, text, _ = self._mods[module.__spec__.name]
        code = compile(text, _SRC_PREFIX + rel, "exec", dont_inherit=True)
        exec(code, module.__dict__)

    def get_source(self, fullname):
        entry = self._mods.get(fullname)
        if entry is None:
            raise ImportError(fullname, name=fullname)
        return entry[1].decode("utf-8")

    def is_package(self, fullname):
        entry = self._mods.get(fullname)
        if entry is None:
            raise ImportError(fullname, name=fullname)
        return entry[2]


class ToolsFinder:
    """Exposes exactly one top-level name, `tools`, as the package in tools_dir.

    Submodules (tools.ns, tools.ns.fn) are then found by the normal path
    finder through tools.__path__; the parent directory of tools_dir is never
    put on sys.path (spec 9.2, "/ on sys.path")."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "tools":
            return None
        tools_dir = _fb.tools_dir()  # the sandbox's (pyrt_serve); set nothing per turn here
        init = os.path.join(tools_dir, "__init__.py")
        if os.path.isfile(init):
            return importlib.util.spec_from_file_location(
                "tools", init, submodule_search_locations=[tools_dir])
        spec = importlib.machinery.ModuleSpec("tools", None, is_package=True)
        spec.submodule_search_locations = [tools_dir]
        return spec

    def invalidate_caches(self):
        pass


# --------------------------------------------------------------------------
# Fork server side: runs once in pyrt_init()


def compute_packages():
    """ready.packages, spec 3.4."""
    import importlib.metadata
    index = {}
    for dist in importlib.metadata.distributions():
        try:
            name = dist.metadata["Name"]
        except Exception:
            continue
        if not isinstance(name, str):
            continue
        folded = name.casefold()
        if folded in _EXCLUDED_DISTS:
            continue
        version = dist.version
        # keep the one that sorts last by (casefold, name, version string)
        key = (folded, name, version if isinstance(version, str) else "")
        old = index.get(folded)
        if old is None or key > old[0]:
            index[folded] = (key, name, version)
    packages = {}
    mapping = importlib.metadata.packages_distributions()
    order = lambda s: (s.casefold(), s)  # noqa: E731
    for import_name in sorted(mapping, key=order):
        providers = {}
        for dist_name in sorted(mapping[import_name], key=order):
            entry = index.get(dist_name.casefold())
            if entry is not None:
                providers[entry[1]] = entry[2]
        if providers:
            packages[import_name] = providers
    return packages


# ready.packages of the last fork server with the same distributions, so a
# fork server (one per `forkbox sandbox`) need not walk every distribution's
# metadata again: 150-400 ms on a Debian host with a few hundred packages.
# Root's and in /run (tmpfs): only a root fork server reads or writes it.
_PACKAGES_CACHE = "/run/forkbox/packages.json"
_DIST_SUFFIXES = (".dist-info", ".egg-info")


def _packages_key():
    """What ready.packages depends on: the interpreter and, for every sys.path
    entry that holds distributions (a *.dist-info or *.egg-info entry) or is a
    file (a zip), its identity and mtime. Installing, removing or upgrading a
    distribution adds or renames such an entry, which changes its directory's
    mtime. Entries without distributions (a turn's tools dir's parent, say)
    are left out, so they don't spoil the key. Editing a METADATA file in
    place is not seen (docs/internals.md)."""
    key = [sys.version, platform.python_version()]
    for entry in sys.path:
        try:
            st = os.stat(entry or ".")
            if os.path.isdir(entry or "."):
                names = os.listdir(entry or ".")
                if not any(n.endswith(_DIST_SUFFIXES) for n in names):
                    continue
        except OSError:
            continue
        key.append([entry, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size])
    return key


def _cache_usable():
    """The cache's directory is root's and writable by root only, and we are
    root (the fork server runs as root until it clones a sandbox)."""
    if os.geteuid() != 0:
        return False
    try:
        os.mkdir(os.path.dirname(_PACKAGES_CACHE), 0o755)
    except OSError:
        pass
    try:
        st = os.lstat(os.path.dirname(_PACKAGES_CACHE))
    except OSError:
        return False
    import stat as _stat
    return _stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


def _packages_cached():
    """ready.packages from the cache when its key matches, else computed (in
    a child) and the cache replaced atomically."""
    if not _cache_usable():
        return _packages_in_a_child()
    key = _packages_key()
    try:
        with open(_PACKAGES_CACHE, "rb") as f:
            cached = json.loads(f.read())
        if cached.get("key") == key and isinstance(cached.get("packages"), dict):
            return cached["packages"]
    except (OSError, ValueError, AttributeError):
        pass
    packages = _packages_in_a_child()
    tmp = f"{_PACKAGES_CACHE}.{os.getpid()}"
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644),
                  "w") as f:
            f.write(json.dumps({"key": key, "packages": packages}))
        os.rename(tmp, _PACKAGES_CACHE)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return packages


def _packages_in_a_child():
    """compute_packages() in a forked child: importlib.metadata and what it
    pulls in (email, zipfile, csv, pathlib, ...: ~3 MB of heap) then never
    enter the fork server, every page of which each sandbox's clone copies
    into its page tables."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            with open(w, "wb") as out:
                out.write(json.dumps(compute_packages()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with open(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise RuntimeError("computing ready.packages failed (see the error above)")
    return json.loads(data)


def _thread_count():
    """Threads of this process, native ones included (threading only knows
    its own)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return _thread._count() + 1


def init(sources, site_dirs, preload):
    """Called once by pyrt_init(); returns the ready frame (bytes)."""
    sys.meta_path.insert(0, EmbeddedFinder(sources))
    if site_dirs:
        import site
        for d in site_dirs:
            site.addsitedir(d)
    import adk_code_mode_sandbox  # noqa: F401
    import adk_code_mode_sandbox._rpc_client  # noqa: F401
    import adk_code_mode_sandbox.protocol  # noqa: F401
    # In the table's order (src/proto/frame_fields.h): relayed as it is.
    ready = _frame({"protocol_version": 2, "python_version": platform.python_version(),
                    "packages": _packages_cached(), "kind": "ready"})
    for name in (preload or "").split(","):
        name = name.strip()
        if not name:
            continue
        try:
            importlib.import_module(name)
        except BaseException as e:  # a broken preload must not stop the daemon
            sys.stderr.write(f"forkbox: preload {name!r} failed, skipped: "
                             f"{type(e).__name__}: {e}\n")
            sys.stderr.flush()
        # clone(CLONE_NEWUSER) needs a single-threaded caller, and a thread
        # would not survive the fork anyway: name the module that started one.
        threads = _thread_count()
        if threads > 1:
            raise RuntimeError(
                f"preload {name!r} left {threads - 1} thread(s) running in the fork server, "
                f"which must stay single-threaded (OpenBLAS, OpenMP, MKL, BLIS and numexpr "
                f"are already pinned to one thread); drop it from --preload")
    # Warm up what every turn uses, so children share it copy-on-write.
    compile("pass", _FILENAME, "exec", _COMPILE_FLAGS, True)
    traceback.format_exception_only(ValueError, ValueError("x"))
    global _next_turn
    _next_turn = _prepare_turn()
    # Everything allocated so far is shared with every sandbox: keep the
    # children's collector from touching (and un-sharing) it.
    gc.collect()
    gc.freeze()
    return ready


# --------------------------------------------------------------------------
# Sandbox child side: pyrt_serve()

def _sanitize_environ():
    """Spec 6.4: the C environ first (in _forkbox), then os.environ, by the
    one allowlist (src/pyrt/env_keep.h)."""
    _fb.sanitize_env()
    for key in list(os.environ):
        if not _fb.env_allowed(key):
            try:
                del os.environ[key]
            except KeyError:
                pass


def _prepare_turn():
    """What every turn starts from, built once in the fork server: the
    environment reduced to the allowlist, the runtime's signal dispositions,
    the `tools` finder and a _Turn (RPC client, __main__, stdio). None of it
    depends on the sandbox, and each sandbox, a copy-on-write copy of the fork
    server, gets it untouched. Built in every sandbox instead, it cost ~100
    copied pages and ~0.5 ms a turn (measured). The fork server runs no code
    of a turn, so the finder and the RPC client stay idle in it."""
    _sanitize_environ()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # default_int_handler in blocks
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    sys.meta_path.insert(0, ToolsFinder())
    turn = _Turn()
    turn.stdio = _stdio_as_in_a_block()
    # The runtime's stdio for the whole life of every sandbox (see
    # _Turn.reset_stdio), and the fork server's own too (it prints nothing
    # after init; they write to the same fds): the interpreter's start-up
    # ones are dropped here, once, not in every sandbox.
    (sys.stdin, sys.stdout, sys.stderr) = (sys.__stdin__, sys.__stdout__,
                                           sys.__stderr__) = turn.stdio
    return turn


def _new_stdio():
    """(stdin, stdout, stderr) on fds 0, 1, 2. Unbuffered like `python -u`:
    a raw FileIO under a write-through text layer, so print(), os.write(1,
    ...) and subprocess output keep their order."""
    out = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                           errors="backslashreplace", write_through=True)
    err = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                           errors="backslashreplace", write_through=True)
    inp = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                           encoding="utf-8", errors="surrogateescape")
    return inp, out, err


def _stdio_as_in_a_block():
    """_new_stdio() made in the fork server for every sandbox's blocks, with
    fds 0-2 on what they are when a block makes them (0 on /dev/null, 1 and 2
    on the capture pipes): the objects note whether their fd can seek. One
    print goes through them here, so that what a first write sets up is
    shared too; the pipe is emptied after."""
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    r, w = os.pipe()
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, 0)
        os.dup2(w, 1)
        os.dup2(w, 2)
        stdio = _new_stdio()
        saved_std = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = stdio[1], stdio[2]
        try:
            _execute("print(1)\n", {"__builtins__": builtins}, stdio[2], lambda: None)
        finally:
            sys.stdout, sys.stderr = saved_std
        os.read(r, 4096)
        return stdio
    finally:
        for fd, old in zip((0, 1, 2), saved):
            os.dup2(old, fd)
            os.close(old)
        for fd in (r, w, null):
            os.close(fd)


class _Turn:
    def __init__(self):
        from adk_code_mode_sandbox import _rpc_client, protocol
        self.protocol = protocol
        self.rpc = _rpc_client.RpcClient(_fb.call)
        _rpc_client.install(self.rpc)
        self.main = types.ModuleType("__main__")  # __name__, __doc__, __package__, __loader__, __spec__
        self.main.__dict__["__builtins__"] = builtins
        self.stdio = None  # (stdin, stdout, stderr): the runtime's, see reset_stdio
        # Every stdio object the runtime took out of sys, by id: never freed
        # (see reset_stdio), so an id is never reused while it is here.
        self.retired = {}
        # Python-level signal handlers, suspended while the runtime's own code
        # runs (see suspend_handlers); SIGINT raises KeyboardInterrupt in blocks.
        self.handlers = {signal.SIGINT: signal.default_int_handler}
        self.blocks = 0  # blocks of the turn begun (the warm-up's are not the turn's)

    # -- the turn's messages: _fb.serve_loop (module.c) calls these -------
    def on_frame(self, payload):
        """A frame serve_loop did not decode itself. Only a run frame
        matters here: a tool result reaches the loop only if no call was
        waiting when it came (reader.c), so it is dropped like any other
        late or unknown result."""
        try:
            frame = self.protocol.decode(payload)
        except Exception:
            return  # drop just that message (spec 9.2, channel poisoning)
        if type(frame) is self.protocol.Run:
            self.run_block(frame.code)

    # -- the warm-up of a pooled sandbox ------------------------------------
    def warm_up(self):
        """Go through a block's path once before the turn exists: the first
        block of a forked interpreter otherwise pays for copy-on-write faults
        and first-use set-up (0.45-1.9 ms for a print(1), ARCHITECTURE.md).
        Sends nothing on the channel (block_begin is never called, so even a
        tool call could not be sent) and leaves nothing user code can see:
        the namespace is thrown away, stdio objects and signal handlers are
        put back, the workspace stays empty, no module is imported."""
        saved = (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__,
                 sys.__stderr__)
        globs = {"__name__": "__main__", "__builtins__": builtins}
        try:
            self.protocol.decode(_frame({"code": "pass", "kind": "run"}))
            _fb.extract_workspace(_EMPTY_TGZ)
            _fb.capture_begin()
            try:
                self.reset_stdio()
                for code in _WARM_BLOCKS:
                    _execute(code, globs, self.stdio[2], self.restore_handlers)
                    self.suspend_handlers()
                # A call and its result, without the channel: the transport
                # answers with a result for whatever id it is given.
                def transport(call_id, data):
                    return _frame({"id": call_id, "ok": True, "value": {"a": [1]},
                                   "error": None, "kind": "tool_result"})
                type(self.rpc)(transport).call(
                    "warm_up", {"n": 1, "s": "x", "l": [None, True, 1.5]})
                self.flush_stdio()
            finally:
                _fb.capture_end()
            _done_frame(1)
            _fb.output(1, "", False)
            _fb.snapshot()
            _fb.snapshot_discard()
        except BaseException:
            pass  # a warm-up is an optimisation: never a reason to fail the turn
        finally:
            (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__,
             sys.__stderr__) = saved
            globs.clear()

    # -- one block ---------------------------------------------------------
    def reset_stdio(self):
        """Put the runtime's stdio objects back in sys for a block.

        They are made once (in the fork server) and stay for the whole turn:
        replacing them per block freed an object that a thread still inside
        print() held a borrowed reference to (CPython 3.11's print() does not
        own its file), and the interpreter crashed. So nothing is done when
        a block left them alone, which is every block but a rare one; fds 1
        and 2 beneath them are what changes per block (capture.c). An object
        that a block put in their place, or one of ours that it closed, is
        taken out of sys but kept in self.retired for the rest of the turn,
        for the same reason: the runtime never drops the last reference to
        an object a thread may be writing to."""
        _fb.ensure_stdio_fds()
        current = (sys.stdin, sys.stdout, sys.stderr)
        dunder = (sys.__stdin__, sys.__stdout__, sys.__stderr__)
        stdio = list(self.stdio)
        changed = False
        for i, ours in enumerate(stdio):
            if current[i] is ours and dunder[i] is ours and not _closed(ours):
                continue
            changed = True
            if _closed(ours):
                stdio[i] = _new_stdio()[i]
            for obj in (current[i], dunder[i], ours):
                if obj is not stdio[i]:
                    self.retired[id(obj)] = obj
        if changed:
            self.stdio = tuple(stdio)
            (sys.stdin, sys.stdout, sys.stderr) = (sys.__stdin__, sys.__stdout__,
                                                   sys.__stderr__) = self.stdio

    def flush_stdio(self):
        for s in (sys.stdout, sys.stderr, self.stdio[1], self.stdio[2]):
            try:
                s.flush()
            except BaseException:
                pass

    def suspend_handlers(self):
        """Replace every Python-level signal handler with SIG_IGN until the
        next block, so that a handler user code installed (signal.alarm,
        SIGINT from a leftover thread...) cannot raise inside the runtime
        between done, output and the snapshot."""
        saved = {}
        for sig in _fb.caught_signals():  # only these can have a Python handler
            try:
                handler = _signal.getsignal(sig)
                if callable(handler):
                    _signal.signal(sig, _signal.SIG_IGN)
                    saved[sig] = handler
            except (OSError, ValueError, TypeError):
                pass
        self.handlers = saved

    def restore_handlers(self):
        for sig, handler in self.handlers.items():
            try:
                _signal.signal(sig, handler)
            except (OSError, ValueError, TypeError):
                pass
        self.handlers = {}

    def run_block(self, code):
        _fb.capture_begin()
        # Before the turn's first block no code of the turn has run: stdio is as the fork
        # server made it (a pooled sandbox's warm-up puts it back). Checking it anyway
        # touched the three stdio objects and their buffers: 14 of a fresh turn's ~330
        # copy-on-write faults (forkbox-bench --rows steps, the block row).
        if self.blocks:
            self.reset_stdio()
        self.blocks += 1
        sys.modules["__main__"] = self.main
        _fb.block_begin()
        exit_code = _execute(code, self.main.__dict__, self.stdio[2], self.restore_handlers)
        if _fb.forked_copy():
            _exit_forked_copy(exit_code)
        while True:
            try:
                self.suspend_handlers()
                break
            except BaseException:  # a handler that was already due: just retry
                continue
        # Mark the block over and send `done` under the channel's send lock,
        # so a stray thread's call() can no longer interleave (spec 9.2).
        _fb.block_end(_done_frame(exit_code))
        _fb.fail_calls("code block ended before the tool result arrived")
        self.flush_stdio()
        _fb.capture_end()
        notes = ""
        over_cap, bad_names, snap_err = _fb.snapshot()
        if over_cap:
            notes += (f"[forkbox: {over_cap} file(s) left out of the workspace "
                      f"snapshot: over the {_fb.snapshot_max()}-byte limit]\n")
        if bad_names:
            notes += (f"[forkbox: {bad_names} file(s) or directories left out of "
                      "the workspace snapshot: names that are not UTF-8, longer "
                      "than 4095 bytes, or contain 'hdrcharset=']\n")
        if snap_err:
            notes += f"[forkbox: workspace snapshot failed: {snap_err}]\n"
        # stdout and stderr go from the capture's buffers into the frame in
        # C (pyrt/output.c), decoded, cut and escaped there.
        _fb.output(exit_code, notes, True)
        _fb.send_snapshot()


def _exit_forked_copy(exit_code):
    """A child that user code forked (os.fork) ran to the end of the block,
    as a script's child runs to the end of the script: it exits the way that
    child would (atexit functions, stdio flushed, the block's exit code as its
    status), and never reaches the runtime's end of a block, which is the
    parent's (the channel is closed in it anyway, see forked_child in
    pyrt.c)."""
    try:
        import atexit
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except BaseException:
            pass
    os._exit(exit_code & 0xFF)


def _closed(stream):
    try:
        return bool(stream.closed)
    except BaseException:  # a broken object: treat it as closed
        return True


def _execute(code, globs, err, restore_handlers):
    """Compile and run one block; returns the exit code (spec 6.2).
    restore_handlers() re-arms the user's signal handlers: inside the try, so
    a signal that was already pending counts as the block's own."""
    try:
        co = compile(code, _FILENAME, "exec", _COMPILE_FLAGS, True)
    except BaseException as e:  # SyntaxError, ValueError (NUL bytes), MemoryError, ...
        _write(err, "Traceback (most recent call last):\n"
               + "".join(traceback.format_exception_only(type(e), e)))
        return 1
    try:
        restore_handlers()
        exec(co, globs)
    except SystemExit as e:
        return _exit_code(e, err)
    except BaseException as e:
        tb = e.__traceback__
        # Strip the runtime's own frame(s) so the first one is <code-mode>.
        while tb is not None and tb.tb_frame.f_code is _execute.__code__:
            tb = tb.tb_next
        try:
            _write(err, "".join(traceback.format_exception(type(e), e, tb)))
        except BaseException:
            _write(err, f"{type(e).__name__}: <traceback could not be formatted>\n")
        finally:
            e = tb = None
        return 1
    return 0


def _exit_code(e, err):
    code = e.code
    if code is None:
        return 0
    try:
        if isinstance(code, int):  # bool included: True -> 1, False -> 0
            return max(_INT64_MIN, min(_INT64_MAX, int(code)))
        text = str(code)
    except BaseException:
        text = "<SystemExit code could not be converted>"
    _write(err, text + "\n")
    return 1


def _write(stream, text):
    try:
        stream.write(text)
    except BaseException:
        pass


_next_turn = None  # built by init() (see _prepare_turn)


def _reader_offer(payload):
    """Called by the channel reader (reader.c), on its own thread, for a frame
    not in the supervisor's form while calls wait: True if it was a tool
    result (now delivered, or dropped if none waits for it) or undecodable
    (dropped, spec 9.2 channel poisoning); False: it is for the main loop."""
    protocol = _next_turn.protocol
    try:
        frame = protocol.decode(payload)
    except Exception:
        return True
    if type(frame) is not protocol.ToolResult:
        return False
    if isinstance(frame.id, str):
        _fb.deliver(frame.id, payload)
    return True


def warm():
    """Called by pyrt_serve() in a pooled sandbox, before it waits for its
    tools: warm up, and say so."""
    sys.modules["__main__"] = _next_turn.main
    _next_turn.warm_up()
    _fb.warm_done()


def internal_error(e):
    """Called by pyrt_serve() when the turn's loop (module.c, serve_loop) ended
    with exception e: the runtime failed. Never returns."""
    try:
        msg = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        _fb.send(_CHAN_FRAME, _log_error_frame("forkbox runtime: internal error: " + msg))
    finally:
        os._exit(4)
