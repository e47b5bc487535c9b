"""Self-contained helpers for the forkbox security suite.

* Daemon: the real forkboxd (env FORKBOXD, policy from FORKBOX_SRCDIR) on an
  ephemeral loopback port; stderr is drained and kept for failure messages; the
  whole process group is killed at teardown.
* A minimal host-like client (websockets 10.x asyncio API): tools archive, per
  block an empty gzip tar then ``run``, tool calls answered, ``done``/``output``/
  archive collected; a turn that the server ends mid-block is reported, not
  raised (exhaustion cases expect exactly that).
* PRELUDE: Python prepended to attack blocks. ``sc()`` issues a raw syscall via
  ctypes and returns {"ret", "errno"}; ``isolated(fn)`` runs fn in a forked
  child (the seccomp filter is inherited across fork and exec) so that a
  probe which kills its process, hangs, or succeeds where it must not, cannot
  take the block down with it; ``report(d)`` prints one result line that
  ``BlockResult.report()`` parses back.

Nothing here sends a packet anywhere but 127.0.0.1, and every syscall argument
is chosen to be harmless even if the sandbox were not isolated at all (invalid
magic numbers, nonexistent paths, bad file descriptors, signal 0).
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import os
import re
import signal
import socket
import subprocess
import tarfile
import threading
import time
import uuid

import websockets
import websockets.exceptions

SRCDIR = os.environ.get("FORKBOX_SRCDIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
FORKBOXD = os.environ.get("FORKBOXD") or os.path.join(SRCDIR, "build", "src", "forkboxd")
POLICY = os.path.join(SRCDIR, "policy", "default.policy")
MAX_MESSAGE = 256 * 1024 * 1024


def _under_asan(path: str) -> bool:
    """Whether forkboxd is an AddressSanitizer build (gcc links libasan)."""
    try:
        out = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "libasan" in out


# Checks of memory size and whole-address-space scans mean little under ASan:
# its quarantine keeps freed memory resident and its shadow maps terabytes.
UNDER_ASAN = _under_asan(FORKBOXD)
LISTEN_RE = re.compile(r"listening on 127\.0\.0\.1:(\d+)")
REPORT_MARK = "@@FORKBOX-SEC@@"

ConnectionClosed = websockets.exceptions.ConnectionClosed


# --------------------------------------------------------------------------
# the daemon
# --------------------------------------------------------------------------

class Daemon:
    def __init__(self, args=(), token: str | None = None):
        self.args = list(args)
        self.token = token
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._lines: list[str] = []
        self._n_lines = 0  # every line ever read (_lines keeps only the last ones)
        self._lock = threading.Lock()
        self._listening = threading.Event()

    def start(self, timeout: float = 20.0) -> "Daemon":
        if not os.access(FORKBOXD, os.X_OK):
            raise RuntimeError(f"forkboxd not found or not executable: {FORKBOXD}")
        argv = [FORKBOXD, "--listen", "127.0.0.1:0", "--policy", POLICY] + self.args
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("ADK_CODE_MODE_") and k not in ("PORT", "PYTHONHOME", "PYTHONPATH")}
        if self.token is not None:
            env["ADK_CODE_MODE_AUTH_TOKEN"] = self.token
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env, start_new_session=True)
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._listening.wait(timeout):
            err = self.stderr()
            self.stop()
            raise RuntimeError(f"forkboxd did not report listening within {timeout}s; argv={argv}\n"
                               f"stderr:\n{err[-4000:]}")
        return self

    def _drain(self) -> None:
        assert self.proc and self.proc.stderr
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace")
            with self._lock:
                self._lines.append(line)
                self._n_lines += 1
                if len(self._lines) > 20000:
                    del self._lines[:10000]
            m = LISTEN_RE.search(line)
            if m and self.port is None:
                self.port = int(m.group(1))
                self._listening.set()

    def stderr(self, tail: int = 3000) -> str:
        with self._lock:
            return "".join(self._lines)[-tail:]

    def lines(self) -> int:
        """How many stderr lines the daemon has written so far."""
        with self._lock:
            return self._n_lines

    @property
    def pid(self) -> int:
        assert self.proc
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def descendants(self) -> set[int]:
        return descendants(self.pid)

    def stop(self) -> None:
        if self.proc is None:
            return
        pgid = self.proc.pid
        if self.proc.poll() is None:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass

    # -- convenience
    def health(self, timeout: float = 5.0) -> tuple[int, bytes]:
        return http_get(self.port, "/health", timeout)

    def run(self, *codes, tools=None, handler=None, timeout: float = 60.0, **kw) -> "TurnResult":
        """One turn running the given blocks; see run_turn."""
        return arun(run_turn(self, list(codes), tools=tools, handler=handler, **kw), timeout)

    def fresh_turn_ok(self) -> tuple[bool, str]:
        """After an attack: /health answers 200 and a new turn runs print(1)."""
        try:
            st, body = self.health()
        except OSError as e:
            return False, f"/health failed: {e!r}; daemon alive={self.alive()}\n{self.stderr()}"
        if st != 200 or body != b"OK\n":
            return False, f"/health gave {st} {body!r}"
        try:
            r = self.run("print(1)", timeout=30)
        except Exception as e:  # noqa: BLE001
            return False, f"new turn failed: {e!r}\n{self.stderr()}"
        b = r.blocks[0] if r.blocks else None
        if not b or b.exit_code != 0 or b.stdout != "1\n":
            return False, f"new turn did not print 1: {r!r}"
        return True, ""


def descendants(pid: int) -> set[int]:
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as fh:
                    kids = [int(x) for x in fh.read().split()]
            except OSError:
                continue
            for k in kids:
                if k not in out:
                    out.add(k)
                    todo.append(k)
    return out


def wait_until(pred, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())


def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else -1
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    if m:
        body = body[:int(m.group(1))]
    return status, body


# --------------------------------------------------------------------------
# archives
# --------------------------------------------------------------------------

def make_targz(files: dict[str, bytes | str]) -> bytes:
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w:gz", format=tarfile.PAX_FORMAT) as tf:
        for name, data in files.items():
            if isinstance(data, str):
                data = data.encode()
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mode = 0o644
            tf.addfile(ti, io.BytesIO(data))
    return bio.getvalue()


EMPTY_TGZ = make_targz({})

STUB = '''# Generated by adk-code-mode. Do not edit.
from __future__ import annotations
from typing import Any
from adk_code_mode_sandbox._rpc_client import call as _call


def {fn}(**kwargs: Any) -> Any:
    """{fn} (test tool)"""
    return _call({name!r}, dict(kwargs))
'''


def tools_archive(names=("echo",)) -> bytes:
    files = {"__init__.py": "# Generated by adk-code-mode. Do not edit.\n"}
    init = []
    for n in names:
        files[f"{n}.py"] = STUB.format(fn=n, name=n)
        init.append(f"from .{n} import {n}\n")
    files["__init__.py"] += "".join(init) + f"__all__ = {list(names)!r}\n"
    return make_targz(files)


def read_targz(data: bytes) -> dict[str, bytes]:
    out = {}
    if not data:
        return out
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
        for m in tf.getmembers():
            if m.isfile():
                f = tf.extractfile(m)
                out[m.name] = f.read() if f else b""
    return out


# --------------------------------------------------------------------------
# the client
# --------------------------------------------------------------------------

class BlockResult:
    def __init__(self):
        self.done_exit: int | None = None
        self.exit_code: int | None = None      # output.exit_code
        self.stdout = ""
        self.stderr = ""
        self.archive: bytes | None = None
        self.tool_calls: list[dict] = []
        self.logs: list[dict] = []
        self.completed = False                  # done + output + archive all arrived
        self.elapsed = 0.0

    def report(self) -> dict:
        """The JSON dict the block printed with report()."""
        for line in self.stdout.splitlines():
            if line.startswith(REPORT_MARK):
                return json.loads(line[len(REPORT_MARK):])
        raise AssertionError(f"block printed no report; {self!r}")

    def __repr__(self):
        return (f"<block done={self.done_exit} exit={self.exit_code} completed={self.completed} "
                f"logs={self.logs!r} stdout={self.stdout[-1500:]!r} stderr={self.stderr[-2500:]!r}>")


class TurnResult:
    def __init__(self):
        self.ready: dict | None = None
        self.blocks: list[BlockResult] = []
        self.closed_by_server = False
        self.close_code: int | None = None
        self.close_reason = ""
        self.logs: list[dict] = []

    @property
    def last(self) -> BlockResult:
        return self.blocks[-1]

    def __repr__(self):
        return (f"<turn ready={self.ready is not None} closed_by_server={self.closed_by_server} "
                f"close={self.close_code} {self.close_reason!r} logs={self.logs!r} blocks={self.blocks!r}>")


def default_handler(name: str, args: dict):
    if name == "echo":
        return True, {"echoed": args.get("message")}
    return False, {"type": "ToolNotFound", "message": f"no tool registered for {name!r}", "trace": None}


class Turn:
    """One WebSocket turn."""

    def __init__(self, ws, handler=None):
        self.ws = ws
        self.handler = handler or default_handler
        self.result = TurnResult()

    @classmethod
    async def open(cls, daemon: Daemon, tools: bytes | None = None, handler=None, token=None):
        token = daemon.token if token is None else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        ws = await websockets.connect(f"ws://127.0.0.1:{daemon.port}/", max_size=MAX_MESSAGE,
                                      extra_headers=headers, open_timeout=10, close_timeout=5,
                                      compression=None, ping_interval=None)
        t = cls(ws, handler)
        await ws.send(tools_archive() if tools is None else tools)
        return t

    async def _recv(self):
        try:
            return await self.ws.recv()
        except ConnectionClosed:
            self.result.closed_by_server = True
            self.result.close_code = self.ws.close_code
            self.result.close_reason = self.ws.close_reason or ""
            return None

    async def run(self, code: str, workspace: bytes = EMPTY_TGZ) -> BlockResult:
        b = BlockResult()
        self.result.blocks.append(b)
        t0 = time.monotonic()
        try:
            await self.ws.send(workspace)
            await self.ws.send(json.dumps({"code": code, "kind": "run"}) + "\n")
        except ConnectionClosed:
            await self._recv()
            return b
        stage = "running"
        while True:
            msg = await self._recv()
            if msg is None:
                break
            if isinstance(msg, bytes):
                if stage == "archive":
                    b.archive = msg
                    b.completed = True
                    break
                continue
            f = json.loads(msg)
            kind = f.get("kind")
            if stage == "archive":
                raise AssertionError(f"expected the workspace archive after output, got {f!r}")
            if kind == "ready":
                self.result.ready = f
            elif kind == "log":
                b.logs.append(f)
                self.result.logs.append(f)
            elif kind == "tool_call":
                b.tool_calls.append(f)
                ok, val = self.handler(f.get("name"), f.get("args") or {})
                res = {"id": f["id"], "ok": ok, "value": val if ok else None,
                       "error": None if ok else val, "kind": "tool_result"}
                try:
                    await self.ws.send(json.dumps(res) + "\n")
                except ConnectionClosed:
                    pass
            elif kind == "done":
                b.done_exit = f.get("exit_code")
                stage = "output"
            elif kind == "output" and stage == "output":
                b.stdout, b.stderr, b.exit_code = f.get("stdout", ""), f.get("stderr", ""), f.get("exit_code")
                stage = "archive"
        b.elapsed = time.monotonic() - t0
        return b

    async def close(self):
        try:
            await self.ws.send('{"kind":"shutdown"}\n')
        except ConnectionClosed:
            pass
        try:
            await asyncio.wait_for(self.ws.close(1000), 5)
        except Exception:  # noqa: BLE001
            pass

    async def wait_closed(self, timeout: float) -> bool:
        """Drain until the server closes; True if it did within timeout."""
        try:
            await asyncio.wait_for(self._drain(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def _drain(self):
        while (m := await self._recv()) is not None:
            if isinstance(m, str):
                f = json.loads(m)
                if f.get("kind") == "log":
                    self.result.logs.append(f)


async def run_turn(daemon: Daemon, codes: list[str], tools=None, handler=None,
                   stop_on_close: bool = True, after_close_wait: float = 5.0) -> TurnResult:
    t = await Turn.open(daemon, tools, handler)
    try:
        for c in codes:
            b = await t.run(c)
            if t.result.closed_by_server:
                break
            if not b.completed and stop_on_close:
                break
        if not t.result.closed_by_server:
            # A block that ended the turn (timeout, kill) is followed by a close; give it a moment.
            if t.result.blocks and (t.result.blocks[-1].done_exit == 124 or not t.result.blocks[-1].completed):
                await t.wait_closed(after_close_wait)
    finally:
        if not t.result.closed_by_server:
            await t.close()
    return t.result


def arun(coro, timeout: float = 60.0):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


# --------------------------------------------------------------------------
# code run inside the sandbox
# --------------------------------------------------------------------------

PRELUDE = r'''
import ctypes as _ct, os as _os, json as _json, errno as _errno, select as _select, time as _time
_libc = _ct.CDLL(None, use_errno=True)
_libc.syscall.restype = _ct.c_long
_REPORT_MARK = "@@FORKBOX-SEC@@"

def _en(e):
    return _errno.errorcode.get(e, e) if e else None

def _arg(a):
    if isinstance(a, int):
        return _ct.c_ulong(a) if a >= 2**63 else _ct.c_long(a)
    return a

def sc(nr, *args):
    """Raw syscall: {"ret": return value, "errno": name or None}."""
    _ct.set_errno(0)
    r = _libc.syscall(_ct.c_long(nr), *[_arg(a) for a in args])
    e = _ct.get_errno()
    return {"ret": r, "errno": _en(e) if r == -1 else None}

def exc(e):
    return {"exc": type(e).__name__, "errno": _en(getattr(e, "errno", None)), "msg": str(e)[:300]}

def isolated(fn, timeout=8.0):
    """Run fn() in a forked child; its JSON-able result, or {"signal": n} if the
    child was killed, or {"timeout": True}."""
    r, w = _os.pipe()
    pid = _os.fork()
    if pid == 0:
        try:
            _os.close(r)
            try:
                res = fn()
            except BaseException as e:
                res = exc(e)
            _os.write(w, _json.dumps(res, default=repr).encode())
        finally:
            _os._exit(0)
    _os.close(w)
    buf = b""
    deadline = _time.monotonic() + timeout
    timed_out = False
    while True:
        left = deadline - _time.monotonic()
        if left <= 0:
            timed_out = True
            break
        rr, _, _ = _select.select([r], [], [], left)
        if not rr:
            continue
        chunk = _os.read(r, 65536)
        if not chunk:
            break
        buf += chunk
    _os.close(r)
    if timed_out:
        try:
            _os.kill(pid, 9)
        except OSError:
            pass
    _, st = _os.waitpid(pid, 0)
    if timed_out:
        return {"timeout": True}
    if _os.WIFSIGNALED(st):
        return {"signal": _os.WTERMSIG(st)}
    try:
        return _json.loads(buf)
    except ValueError:
        return {"bad": buf[:300].decode("latin-1"), "status": st}

def try_(fn):
    """fn() in this process: its result, or the exception as a dict."""
    try:
        return fn()
    except BaseException as e:
        return exc(e)

def report(d):
    print(_REPORT_MARK + _json.dumps(d, default=repr), flush=True)
'''


def prelude(code: str) -> str:
    return PRELUDE + "\n" + code


def new_token() -> str:
    return "sec-" + uuid.uuid4().hex + uuid.uuid4().hex
