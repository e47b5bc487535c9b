"""One turn of the baseline: the reference's per-turn process model, minus its container.

Started by tools/bench/baseline-server as a FRESH /usr/bin/python3 process for every accepted
TCP connection (argv[1] is the inherited socket fd). It serves that one connection with
python3-websockets 10.4 (asyncio) and then exits, doing per turn what the reference server does
(shared/spec/wire-protocol.md): extract the tools archive into a temporary tools dir, compute
ready.packages with importlib.metadata (section 3.4), send ready; per block extract the workspace
archive, run the code with exec() in a worker thread with sys.stdout/sys.stderr redirected to
buffers, proxy tool calls over the socket (matched by id), then send done, output and a gzip tar
snapshot of the workspace. A benchmark stand-in written for forkbox-bench, not the reference's code.
"""

import asyncio
import builtins
import concurrent.futures
import contextlib
import importlib.metadata
import io
import json
import os
import platform
import shutil
import socket
import sys
import tarfile
import tempfile
import threading
import traceback
import types
import uuid

from websockets.exceptions import ConnectionClosed
from websockets.legacy.server import WebSocketServer, WebSocketServerProtocol

MAX_MESSAGE = 256 * 1024 * 1024
SKIP_DISTS = {"adk-code-mode-sandbox", "websockets", "pip", "setuptools", "wheel"}
KINDS = {"ready", "run", "tool_call", "tool_result", "log", "done", "output", "shutdown"}


def encode(frame):
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":")) + "\n"


def decode(text):
    """A frame dict, or None when the text does not decode as a frame (section 3.2)."""
    text = text.rstrip("\r\n")
    if not text:
        return None
    try:
        f = json.loads(text)
    except ValueError:
        return None
    if not isinstance(f, dict) or f.get("kind") not in KINDS:
        return None
    return f


def packages():
    """ready.packages, computed per turn like the reference (section 3.4)."""
    index = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if not name or name.casefold() in SKIP_DISTS:
            continue
        cand = (name.casefold(), name, dist.version or "")
        if cand[0] not in index or cand > index[cand[0]]:
            index[cand[0]] = cand
    out = {}
    pd = importlib.metadata.packages_distributions()
    for imp in sorted(pd, key=lambda s: (s.casefold(), s)):
        prov = {}
        for dn in sorted(pd[imp], key=lambda s: (s.casefold(), s)):
            hit = index.get(dn.casefold())
            if hit:
                prov[hit[1]] = hit[2]
        if prov:
            out[imp] = prov
    return out


def extract(data, dest):
    """Section 4.2 filter: regular files and directories only, no links, nothing outside dest."""
    if not data:
        return
    real_dest = os.path.realpath(dest)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for m in tar:
            if not (m.isreg() or m.isdir()) or m.linkname:
                continue
            if m.name.startswith("/"):
                continue
            name = os.path.normpath(m.name)  # leaves ".." only at the start
            if name == "." or name.startswith(".."):
                continue
            target = os.path.realpath(os.path.join(real_dest, name))
            if target != real_dest and not target.startswith(real_dest + os.sep):
                continue
            if m.isdir():
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            src = tar.extractfile(m)
            with open(target, "wb") as f:
                shutil.copyfileobj(src, f)
            os.chmod(target, m.mode & 0o755)


def snapshot(root):
    """gzip tar of every regular file under root (no symlinks, no directory entries)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            for fn in sorted(filenames):
                path = os.path.join(dirpath, fn)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                try:
                    tar.add(path, arcname=os.path.relpath(path, root), recursive=False)
                except OSError:
                    pass
    return buf.getvalue()


class ToolError(RuntimeError):
    def __init__(self, error_type, message, trace=None):
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.trace = trace


class ProtocolError(Exception):
    pass


class Rpc:
    """call() for user threads: send tool_call through the event loop, wait for the result."""

    def __init__(self, ws, loop):
        self.ws, self.loop = ws, loop
        self.lock = threading.Lock()
        self.waiting = {}
        self.broken = None

    def call(self, name, args, timeout=None):
        cid = uuid.uuid4().hex
        fut = concurrent.futures.Future()
        with self.lock:
            if self.broken:
                raise ProtocolError(self.broken)
            self.waiting[cid] = fut
        frame = {"id": cid, "name": name, "args": args, "timeout": timeout, "kind": "tool_call"}
        try:
            text = encode(frame)
        except Exception:
            with self.lock:
                self.waiting.pop(cid, None)
            raise
        asyncio.run_coroutine_threadsafe(self.ws.send(text), self.loop).result()
        res = fut.result()
        if res.get("ok", True):
            return res.get("value")
        err = res.get("error")
        if not isinstance(err, dict):
            raise ToolError("Error", "tool call failed without error payload")
        raise ToolError(str(err.get("type", "Error")), str(err.get("message", "")), err.get("trace"))

    def resolve(self, frame):
        with self.lock:
            fut = self.waiting.pop(frame.get("id", ""), None)
        if fut:
            fut.set_result(frame)

    def fail_all(self, why):
        with self.lock:
            self.broken = why
            pending, self.waiting = self.waiting, {}
        for fut in pending.values():
            fut.set_exception(ProtocolError(why))


def install_runtime(rpc):
    pkg = types.ModuleType("adk_code_mode_sandbox")
    pkg.__path__ = []
    rpc_mod = types.ModuleType("adk_code_mode_sandbox._rpc_client")
    rpc_mod.call, rpc_mod.ToolError = rpc.call, ToolError
    proto = types.ModuleType("adk_code_mode_sandbox.protocol")
    proto.ProtocolError = ProtocolError
    pkg._rpc_client, pkg.protocol = rpc_mod, proto
    sys.modules.update({"adk_code_mode_sandbox": pkg, "adk_code_mode_sandbox._rpc_client": rpc_mod,
                        "adk_code_mode_sandbox.protocol": proto})


def run_block(code, env):
    out, err = io.StringIO(), io.StringIO()
    exit_code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            exec(compile(code, "<code-mode>", "exec"), env)
        except SystemExit as e:
            if e.code is None:
                exit_code = 0
            elif isinstance(e.code, int):
                exit_code = e.code
            else:
                print(e.code, file=sys.stderr)
                exit_code = 1
        except BaseException:
            traceback.print_exc()
            exit_code = 1
    return exit_code, out.getvalue(), err.getvalue()


async def read_results(ws, rpc):
    while True:
        msg = await ws.recv()
        if isinstance(msg, str):
            f = decode(msg)
            if f and f["kind"] == "tool_result":
                rpc.resolve(f)


async def turn(ws):
    loop = asyncio.get_running_loop()
    tools_parent = tempfile.mkdtemp(prefix="fbb-tools-")
    work = tempfile.mkdtemp(prefix="fbb-ws-")
    try:
        msg = await ws.recv()
        if isinstance(msg, str):
            return
        os.mkdir(os.path.join(tools_parent, "tools"))
        extract(msg, os.path.join(tools_parent, "tools"))
        if tools_parent not in sys.path:
            sys.path.insert(0, tools_parent)
        os.chdir(work)
        for k in [k for k in os.environ if k.startswith("ADK_CODE_MODE_")]:
            del os.environ[k]
        await ws.send(encode({"kind": "ready", "protocol_version": 2,
                              "python_version": platform.python_version(), "packages": packages()}))
        rpc = Rpc(ws, loop)
        install_runtime(rpc)
        env = {"__name__": "__main__", "__builtins__": builtins}
        while True:
            msg = await ws.recv()
            if isinstance(msg, str):
                f = decode(msg)
                if f and f["kind"] == "shutdown":
                    return
                continue
            extract(msg, work)
            msg = await ws.recv()
            f = decode(msg) if isinstance(msg, str) else None
            if not f or f["kind"] != "run":
                return
            rpc.broken = None
            reader = asyncio.ensure_future(read_results(ws, rpc))
            block = loop.run_in_executor(None, run_block, f.get("code", ""), env)
            done, _ = await asyncio.wait({reader, block}, return_when=asyncio.FIRST_COMPLETED)
            if block not in done:  # the connection closed mid-block
                rpc.fail_all("control pipe closed by host")
                await block
                return
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await reader
            exit_code, out, err = block.result()
            await ws.send(encode({"exit_code": exit_code, "kind": "done"}))
            await ws.send(encode({"stdout": out, "stderr": err, "exit_code": exit_code,
                                  "kind": "output"}))
            await ws.send(snapshot(work))
    except ConnectionClosed:
        pass
    finally:
        os.chdir("/")
        shutil.rmtree(tools_parent, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


class OneConnection(WebSocketServer):
    def is_serving(self):
        return True


async def serve(fd):
    loop = asyncio.get_running_loop()
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    finished = loop.create_future()

    async def handler(ws):
        try:
            await turn(ws)
        finally:
            if not finished.done():
                finished.set_result(None)

    proto = WebSocketServerProtocol(handler, OneConnection(), max_size=MAX_MESSAGE,
                                    ping_interval=20, ping_timeout=20)
    await loop.connect_accepted_socket(lambda: proto, sock)
    # The turn ends when the handler returns or the connection is gone (also before a handshake).
    lost = asyncio.ensure_future(proto.wait_closed())
    await asyncio.wait({finished, lost}, return_when=asyncio.FIRST_COMPLETED)
    await proto.close()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
