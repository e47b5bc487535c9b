"""The Python test helpers of every suite (integration, security, pyrt).

On sys.path by tests/pytest.ini, together with tools/ (forkbox_client.py, the
host-like client this builds on) and tools/demo/.

* Daemon: starts the real forkboxd (env FORKBOXD; it finds forkbox-sandbox in
  the build tree itself) on an ephemeral port and a block of host ids of its
  own (tools/id_block.py: forkboxd locks its --id-range, and suites run in
  parallel), parses the "listening on 127.0.0.1:PORT" line, drains its
  stderr, kills its whole process group at teardown. descendants(),
  pid_alive(), wait_until() to watch its processes.
* Archives: make_targz(), EMPTY_TGZ, read_targz() (gzip pax tars as the host
  makes them, from tools/forkbox_client.py).
* arun(): runs a coroutine with a hard timeout (no test may hang).
* Raw HTTP and a raw WebSocket client on plain sockets, for byte-exact and
  malformed-input cases the websockets library will not produce.
* Turn helpers built on tools/forkbox_client.py.
* ALLOWED_ENV: the sandbox's environment allowlist, as the tests expect it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import re
import select
import signal
import socket
import struct
import subprocess
import threading
import time

SRCDIR = os.environ.get("FORKBOX_SRCDIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
FORKBOXD = os.environ.get("FORKBOXD") or os.path.join(SRCDIR, "build", "src", "forkboxd")
POLICY = os.path.join(SRCDIR, "policy", "default.policy")
# The fork server's module, which the build tree's forkboxd finds beside itself,
# and the interpreter that runs it (src/sandbox/forkserver.h).
SANDBOX_MODULE = os.path.join(os.path.dirname(FORKBOXD), "forkbox-sandbox.so")
SANDBOX_PYTHON = "/usr/bin/python3.11"


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
FORKSERVER_CMDLINE = b"forkboxd\0-I\0-B\0-X\0utf8\0-\0--internal-forkserver\0"  # its fixed argv

import forkbox_client as fc  # noqa: E402  (tools/, on pythonpath by tests/pytest.ini)
from id_block import IdBlock  # noqa: E402  (tools/)
import websockets  # noqa: E402
import websockets.exceptions  # noqa: E402
from demo_tools import demo_tools  # noqa: E402,F401  (tools/demo/)

ConnectionClosed = websockets.exceptions.ConnectionClosed
LISTEN_RE = re.compile(r"listening on 127\.0\.0\.1:(\d+)")
MAX_MESSAGE = fc.MAX_MESSAGE


# --------------------------------------------------------------------------
# the sandbox's environment allowlist (what a sandbox's os.environ may hold)
# --------------------------------------------------------------------------

def _env_keep():
    """The spec 6.4 allowlist from its one copy, the C header the sandbox is
    built with: (names, prefix)."""
    with open(os.path.join(SRCDIR, "src", "pyrt", "env_keep.h")) as f:
        text = f.read()
    names = re.search(r"#define PYRT_ENV_KEEP_NAMES((?:.*\\\n)*.*)", text)
    prefix = re.search(r'#define PYRT_ENV_KEEP_PREFIX "(\w+)"', text)
    found = set(re.findall(r'"(\w+)"', names.group(1)))
    assert "PATH" in found and prefix, "src/pyrt/env_keep.h: allowlist not found"
    return found, prefix.group(1)


ALLOWED_ENV, ALLOWED_ENV_PREFIX = _env_keep()



# The spec 3.4 ready.packages algorithm, written independently of the
# runtime's, with the python version: a script that prints
# {"python_version": ..., "packages": {...}} as JSON (run inside a turn, or
# under /usr/bin/python3 -I, which must agree).
EXPECTED_PACKAGES = r'''
import importlib.metadata as md, json, platform
EX = {"adk-code-mode-sandbox", "websockets", "pip", "setuptools", "wheel"}
idx = {}
for d in md.distributions():
    n = d.metadata["Name"]
    if n is None or n.casefold() in EX:
        continue
    k = (n.casefold(), n, d.version)
    if n.casefold() not in idx or k > idx[n.casefold()]:
        idx[n.casefold()] = k
out = {}
pd = md.packages_distributions()
key = lambda s: (s.casefold(), s)
for imp in sorted(pd, key=key):
    prov = {}
    for dn in sorted(pd[imp], key=key):
        e = idx.get(dn.casefold())
        if e:
            prov[e[1]] = e[2]
    if prov:
        out[imp] = prov
print(json.dumps({"python_version": platform.python_version(), "packages": out}))
'''

# --------------------------------------------------------------------------
# the daemon
# --------------------------------------------------------------------------

class Daemon:
    """One forkboxd process (it finds forkbox-sandbox in the build tree itself).

    ``args`` are extra flags; ``env`` extra variables; ``token`` sets
    ADK_CODE_MODE_AUTH_TOKEN (and is kept as ``self.token`` for clients);
    ``listen=False`` starts it without --listen (start() then does not wait);
    ``policy=False`` leaves out --policy policy/default.policy; ``wrap`` is a
    command that runs forkboxd (it must exec it, e.g. ``unshare -m ...``);
    ``stderr_path`` gives it that file as stderr instead of a pipe (as systemd
    gives it the journal's stream), read back as it grows. Unless ``args``
    give an --id-range (or --no-isolation), it gets ``self.ids``, an IdBlock
    held until stop()."""

    KEEP_LINES = 20000  # stderr lines kept (a flood test writes far more)

    def __init__(self, args=(), env=None, listen=True, policy=True, token: str | None = None,
                 wrap=(), stderr_path: str | None = None):
        self.args = list(args)
        self.wrap = list(wrap)
        self.extra_env = dict(env or {})
        self.listen = listen
        self.policy = policy
        self.token = token
        self.stderr_path = stderr_path
        self.proc: subprocess.Popen | None = None
        self.ids: IdBlock | None = None
        self.port: int | None = None
        self._lines: list[str] = []
        self._n_lines = 0  # every line ever read (_lines keeps only the last ones)
        self._lock = threading.Lock()
        self._listening = threading.Event()
        self._reader: threading.Thread | None = None

    # -- lifecycle
    def start(self, timeout: float = 20.0) -> "Daemon":
        if not os.access(FORKBOXD, os.X_OK):
            raise RuntimeError(f"forkboxd not found or not executable: {FORKBOXD}")
        argv = self.wrap + [FORKBOXD]
        if self.listen:
            argv += ["--listen", "127.0.0.1:0"]
        if self.policy and os.path.exists(POLICY):
            argv += ["--policy", POLICY]
        argv += self.args
        if not self.ids and not {"--id-range", "--no-isolation"} & {a.split("=")[0] for a in self.args}:
            self.ids = IdBlock()
        if self.ids:
            argv += ["--id-range", self.ids.arg()]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("ADK_CODE_MODE_") and k not in ("PORT", "PYTHONHOME", "PYTHONPATH")}
        if self.token is not None:
            env["ADK_CODE_MODE_AUTH_TOKEN"] = self.token
        env.update(self.extra_env)
        self.argv = argv
        if self.stderr_path:
            with open(self.stderr_path, "wb") as fh:  # truncated, same inode
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=fh, env=env,
                                             start_new_session=True)
        else:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         env=env, start_new_session=True)
        self._reader = threading.Thread(target=self._tail if self.stderr_path else self._drain,
                                        daemon=True)
        self._reader.start()
        if not self.listen:
            return self
        deadline = time.monotonic() + timeout
        while not self._listening.wait(0.05):
            if self.proc.poll() is not None:
                if self._reader:
                    self._reader.join(2)
                if self._listening.is_set():
                    break
                self.stop()  # gives its ids back
                raise RuntimeError(f"forkboxd exited with status {self.proc.returncode}; "
                                   f"argv={argv}\nstderr:\n{self.stderr(4000)}")
            if time.monotonic() > deadline:
                break
        if not self._listening.is_set():
            err = self.stderr(4000)
            self.stop()
            raise RuntimeError(f"forkboxd did not report listening within {timeout}s; "
                               f"argv={argv}\nstderr:\n{err}")
        return self

    def _drain(self) -> None:
        assert self.proc and self.proc.stderr
        for raw in self.proc.stderr:
            self._take_line(raw)

    def _tail(self) -> None:
        """_drain for a stderr file: read what it grows by until the daemon exits."""
        assert self.proc and self.stderr_path
        rest = b""
        with open(self.stderr_path, "rb") as fh:
            while True:
                exited = self.proc.poll() is not None
                chunk = fh.read(65536)
                rest += chunk
                *whole, rest = rest.split(b"\n")
                for raw in whole:
                    self._take_line(raw + b"\n")
                if not chunk:
                    if exited:
                        break
                    time.sleep(0.02)
        if rest:
            self._take_line(rest)

    def _take_line(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace")
        with self._lock:
            self._lines.append(line)
            self._n_lines += 1
            if len(self._lines) > self.KEEP_LINES:
                del self._lines[:self.KEEP_LINES // 2]
        m = LISTEN_RE.search(line)
        if m and self.port is None:
            self.port = int(m.group(1))
            self._listening.set()

    def stderr(self, tail: int | None = None) -> str:
        """What the daemon wrote to stderr (its last KEEP_LINES lines); with
        ``tail``, only the last ``tail`` characters."""
        with self._lock:
            text = "".join(self._lines)
        return text if tail is None else text[-tail:]

    def lines(self) -> int:
        """How many stderr lines the daemon has written so far."""
        with self._lock:
            return self._n_lines

    @property
    def pid(self) -> int:
        assert self.proc
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float) -> int | None:
        assert self.proc
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to the daemon's own process group (it was started
        in a new session, so the group holds only forkboxd and its children)."""
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
        if self._reader:
            self._reader.join(2)
        if self.ids and self.proc.poll() is not None:
            self.ids.release()
            self.ids = None

    def descendants(self) -> set[int]:
        return descendants(self.pid)

    def forkserver_pid(self) -> int:
        """The fork server: the daemon's child with the fork server's fixed argv
        (its sandboxes and cgroup helper are clones of it, one level further down)."""
        for pid in children(self.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if fh.read() == FORKSERVER_CMDLINE:
                        return pid
            except OSError:
                pass
        raise AssertionError("no fork server under the daemon")

    def health(self, timeout: float = 5.0) -> tuple[int, bytes]:
        """GET /health: (status, body)."""
        return http_get(self.port, "/health", timeout)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class DaemonFactory:
    """A suite's make_daemon fixture: make_daemon(args=[...], env={...}, **kw)
    starts a dedicated daemon; stop_all() at teardown."""

    def __init__(self):
        self.started: list[Daemon] = []

    def __call__(self, args=(), env=None, **kw) -> Daemon:
        d = Daemon(list(args), env=env, **kw)
        self.started.append(d)
        return d.start()

    def stop_all(self) -> None:
        for d in self.started:
            d.stop()


def stderr_sections(funcargs: dict) -> list[tuple[str, str]]:
    """The stderr of a failed test's daemons (its `daemon` and `make_daemon`
    fixtures), as report sections: it usually names the cause."""
    daemons = []
    if isinstance(funcargs.get("daemon"), Daemon):
        daemons.append(funcargs["daemon"])
    if isinstance(funcargs.get("make_daemon"), DaemonFactory):
        daemons += funcargs["make_daemon"].started
    return [(f"forkboxd stderr #{i} {d.args}", d.stderr()[-6000:]) for i, d in enumerate(daemons)]


def children(pid: int) -> list[int]:
    """The live children of pid (those of all its threads), via /proc/<pid>/task/*/children."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as fh:
                out += [int(x) for x in fh.read().split()]
        except OSError:
            continue
    return out


def descendants(pid: int) -> set[int]:
    """All live descendants of pid."""
    out: set[int] = set()
    todo = [pid]
    while todo:
        for k in children(todo.pop()):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out


def nspid_depth(pid: int) -> int:
    """How many pid namespaces pid is in (1: ours; a sandbox's are deeper)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return len(line.split()) - 1
    except OSError:
        pass
    return 0


def host_mounts() -> set[str]:
    """Our mount namespace's mounts (root and mount point of each)."""
    with open("/proc/self/mountinfo") as f:
        return {" ".join(line.split()[3:5]) for line in f}


def cgroup_mounts() -> list[tuple[str, str, set[str]]]:
    """(fstype, mount point, options) of every cgroup hierarchy here."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fstype, _, opts = (post.split() + ["", "", ""])[:3]
            if fstype in ("cgroup", "cgroup2"):
                out.append((fstype, pre.split()[4], set(opts.split(","))))
    return out


def cgroup_forkbox_dirs(pid: int) -> list[str]:
    """<mount>/<pid's cgroup>/forkbox in every hierarchy pid is in: where a
    daemon's turn cgroups are (tools/soak)."""
    mounts = cgroup_mounts()
    out = []
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for fstype, mnt, opts in mounts:
                if (not ctrls and fstype == "cgroup2") or (ctrls and set(ctrls.split(",")) <= opts):
                    d = os.path.join(mnt, path.lstrip("/"), "forkbox")
                    if d not in out:
                        out.append(d)
                    break
    return out


def pid_alive(pid: int) -> bool:
    """True if pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(pred, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())


# --------------------------------------------------------------------------
# archives: gzip pax tars as the host makes them (tools/forkbox_client.py)
# --------------------------------------------------------------------------

make_targz = fc.make_tar  # {name: str | bytes} -> gzip tar bytes; members 0644, mtime 0
EMPTY_TGZ = fc.empty_tar()  # the empty archive the host sends before every block


def read_targz(data: bytes, only_regular: bool = False) -> dict[str, bytes]:
    """gzip tar bytes -> {member name: content} of its regular files ({} for b"").
    only_regular: assert that there is no other kind of member."""
    out = {}
    if not data:
        return out
    for m, content in fc.read_tar(data):
        assert m.isreg() or not only_regular, f"non-regular member {m.name} ({m.type!r})"
        if m.isreg():
            out[m.name] = content
    return out


# --------------------------------------------------------------------------
# asyncio glue
# --------------------------------------------------------------------------

def arun(coro, timeout: float = 30.0):
    """Run a coroutine to completion with a hard wall-clock limit."""
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


async def connect(daemon: Daemon, tools=None, *, token=None, path="/", **kw) -> fc.Turn:
    url = f"ws://127.0.0.1:{daemon.port}{path}"
    return await fc.Turn.connect(url, demo_tools() if tools is None else tools, token=token, **kw)


def run_blocks(daemon: Daemon, *codes: str, timeout: float = 60.0, tools=None, handler=None,
               **kw) -> tuple[fc.Turn, list[fc.BlockResult]]:
    """One turn that runs codes in order, then shutdown: (the turn, the results).
    tools: as for connect() (default: the demo tools); handler(turn), if given,
    makes each block's on_tool_call; kw go to connect()."""
    async def go():
        turn = await connect(daemon, tools, **kw)
        try:
            out = []
            for c in codes:
                out.append(await turn.run(c, on_tool_call=handler(turn) if handler else None))
            return turn, out
        finally:
            await turn.shutdown()
    return arun(go(), timeout)


async def expect_closed(ws, timeout: float = 10.0) -> tuple[int | None, str, list]:
    """Read until the server ends the connection. Returns (close code, reason,
    messages received meanwhile). Raises asyncio.TimeoutError if it stays open."""
    msgs = []

    async def drain():
        try:
            while True:
                msgs.append(await ws.recv())
        except ConnectionClosed:
            pass
    await asyncio.wait_for(drain(), timeout)
    return ws.close_code, ws.close_reason or "", msgs


def text_frames(msgs) -> list[dict]:
    out = []
    for m in msgs:
        if isinstance(m, tuple):
            m = m[1]
        if isinstance(m, str):
            try:
                out.append(fc.decode_frame(m))
            except fc.FrameError:
                pass
    return out


# --------------------------------------------------------------------------
# raw HTTP
# --------------------------------------------------------------------------

class Response:
    def __init__(self, raw: bytes):
        self.raw = raw
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        self.version = parts[0]
        self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        self.reason = parts[2] if len(parts) > 2 else ""
        self.header_list = []
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                self.header_list.append((k.strip(), v.strip()))
        self.headers = {k.lower(): v for k, v in self.header_list}

    def __repr__(self):
        return f"<Response {self.status} {self.headers} body={self.body!r}>"


def http_raw(port: int, request: bytes, timeout: float = 5.0) -> Response:
    """Send raw bytes, read until the server closes (non-101 answers close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            data += chunk
            if data.startswith(b"HTTP/1.1 101") and b"\r\n\r\n" in data:
                break
    return Response(data)


def ws_key() -> str:
    return base64.b64encode(os.urandom(16)).decode()


def upgrade_request(path: str = "/", token: str | None = None, headers=(), auth: str | None = None,
                    key: str | None = None) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", "Upgrade: websocket",
             "Connection: Upgrade", f"Sec-WebSocket-Key: {key or ws_key()}",
             "Sec-WebSocket-Version: 13"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    if auth is not None:
        lines.append(f"Authorization: {auth}")
    lines += list(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def get_health(port: int, path: str = "/health") -> Response:
    return http_raw(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET path: (status, body cut to Content-Length). Unlike http_raw, a server
    that does not answer within timeout raises (socket.timeout, an OSError)."""
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
# raw WebSocket client (plain socket; full control over framing)
# --------------------------------------------------------------------------

class RawWS:
    OP_CONT, OP_TEXT, OP_BIN, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10

    def __init__(self, port: int, path: str = "/", token: str | None = None, timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.timeout = timeout
        key = ws_key()
        self.sock.sendall(upgrade_request(path, token=token, key=key))
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError(f"closed during handshake: {buf!r}")
            buf += chunk
        head, _, self.rest = buf.partition(b"\r\n\r\n")
        self.response = Response(head + b"\r\n\r\n")
        if self.response.status != 101:
            raise ConnectionError(f"handshake failed: {self.response!r}")
        accept = base64.b64encode(hashlib.sha1(
            (key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        assert self.response.headers.get("sec-websocket-accept") == accept
        self.close_code: int | None = None
        self.close_reason = ""

    def send_frame(self, opcode: int, payload: bytes, fin: bool = True, mask: bytes | None = None,
                   rsv: int = 0) -> None:
        b0 = (0x80 if fin else 0) | (rsv << 4) | opcode
        n = len(payload)
        if n < 126:
            hdr = struct.pack("!BB", b0, 0x80 | n)
        elif n < 65536:
            hdr = struct.pack("!BBH", b0, 0x80 | 126, n)
        else:
            hdr = struct.pack("!BBQ", b0, 0x80 | 127, n)
        if mask is None:
            mask = b"\0\0\0\0"  # a zero mask key is legal and leaves the payload as is
        if mask != b"\0\0\0\0":
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(hdr + mask + payload)

    def send_text(self, text: str | bytes) -> None:
        self.send_frame(self.OP_TEXT, text.encode("utf-8") if isinstance(text, str) else text)

    def send_binary(self, data: bytes) -> None:
        self.send_frame(self.OP_BIN, data)

    def _read_exact(self, n: int, deadline: float) -> bytes:
        out = self.rest[:n]
        self.rest = self.rest[n:]
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("raw ws read timed out")
            self.sock.settimeout(left)
            chunk = self.sock.recv(max(65536, n - len(out)))
            if not chunk:
                raise EOFError("connection closed")
            out += chunk
        if len(out) > n:
            self.rest = out[n:] + self.rest
            out = out[:n]
        return out

    def recv_frame(self, timeout: float | None = None) -> tuple[int, bool, bytes]:
        deadline = time.monotonic() + (timeout or self.timeout)
        b0, b1 = self._read_exact(2, deadline)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._read_exact(2, deadline))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._read_exact(8, deadline))[0]
        if b1 & 0x80:
            mk = self._read_exact(4, deadline)
            data = bytes(b ^ mk[i % 4] for i, b in enumerate(self._read_exact(n, deadline)))
        else:
            data = self._read_exact(n, deadline)
        return b0 & 0x0F, bool(b0 & 0x80), data

    def recv(self, timeout: float | None = None):
        """Next data message as str/bytes; answers pings; returns None on close
        (close_code/close_reason set). EOF without a close frame -> close_code 1006."""
        deadline = time.monotonic() + (timeout or self.timeout)
        parts, first_op = [], None
        while True:
            try:
                op, fin, data = self.recv_frame(max(0.01, deadline - time.monotonic()))
            except (EOFError, ConnectionResetError):
                self.close_code = self.close_code or 1006
                return None
            if op == self.OP_PING:
                self.send_frame(self.OP_PONG, data)
                continue
            if op == self.OP_PONG:
                continue
            if op == self.OP_CLOSE:
                self.close_code = struct.unpack("!H", data[:2])[0] if len(data) >= 2 else 1005
                self.close_reason = data[2:].decode("utf-8", "replace")
                return None
            if op != self.OP_CONT:
                first_op = op
            parts.append(data)
            if fin:
                payload = b"".join(parts)
                return payload.decode("utf-8") if first_op == self.OP_TEXT else payload

    def recv_until_close(self, timeout: float = 10.0) -> list:
        deadline = time.monotonic() + timeout
        msgs = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"connection still open; got {msgs!r}")
            m = self.recv(left)
            if m is None:
                return msgs
            msgs.append(m)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def socket_closed(sock: socket.socket, timeout: float) -> bool:
    """True if the peer closes (EOF or reset) within timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
        if r:
            try:
                if sock.recv(65536) == b"":
                    return True
            except (ConnectionResetError, OSError):
                return True
    return False


# --------------------------------------------------------------------------
# frame envelope of the sandbox channel (docs/internals.md), for forging
# --------------------------------------------------------------------------

def chan_envelope(kind: bytes, payload: bytes) -> bytes:
    return kind + b"\0\0\0" + struct.pack("<I", len(payload)) + payload


FORGE_PRELUDE = r'''
import os, stat as _st
def _chan_fds():
    fds = []
    for fd in range(3, 256):
        try:
            m = os.fstat(fd).st_mode
        except OSError:
            continue
        if _st.S_ISSOCK(m):
            fds.append(fd)
    return fds
'''


# ---- a hard per-test wall-clock limit ---------------------------------------

class TestHang(Exception):
    pass


def hard_time_limit(default_seconds: int):
    """An autouse fixture for a suite's conftest.py: no test may hang, on top
    of the per-call timeouts inside the tests. $FORKBOX_TEST_TIME_LIMIT
    overrides the suite's default."""
    import pytest

    limit = int(os.environ.get("FORKBOX_TEST_TIME_LIMIT", str(default_seconds)))

    @pytest.fixture(autouse=True)
    def _hard_time_limit():
        def on_alarm(signum, frame):
            raise TestHang(f"test exceeded {limit}s")
        old = signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(limit)
        yield
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return _hard_time_limit
