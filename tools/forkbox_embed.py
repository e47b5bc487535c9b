"""forkbox_embed: run forkbox sandboxes from a Python program, with no server.

A Python host starts ``forkbox sandbox`` on a socketpair (the stream transport
of §8.2: ``ADK_CODE_MODE_CONTROL_FD``), with its workspace and a generated
``tools`` package bind-mounted, and speaks the ordinary frames over it: ``run``,
then ``tool_call``s answered by calling host functions, then ``done`` and
``output``. There is no second protocol: this is the host half of §8.2.

    with Sandbox(tools={"add": add}, workspace="/srv/job") as sb:
        r = sb.run("from tools import add\\nprint(add(a=2, b=3))")
        print(r.stdout, r.exit_code)

The tool functions run here, in the host process, never in the sandbox. This
module is also ``forkbox run`` (``main``): the ``forkbox`` binary execs
``python3 forkbox_embed.py run ...`` (src/run_cmd.c says how it finds it).

Standard library only. Spec: shared/spec/wire-protocol.md (sections as §N).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextvars
import ctypes
import dataclasses
import importlib.util
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from typing import Any, Callable, Mapping, Sequence

from forkbox_host import (
    MAX_MESSAGE, PROTOCOL_VERSION, FrameError, ProtocolFault, ToolRegistry, decode_frame,
    encode_frame, tools_from_module, write_tools_package)

# The variables that choose the sandbox's transport and mounts (§8.1, §8.3).
# None is inherited from the host's environment: a stray CONTROL_TCP or
# CONTROL_HTTP would win over the fd (§8.1) and send the sandbox elsewhere.
TRANSPORT_VARS = ("ADK_CODE_MODE_CONTROL_HTTP", "ADK_CODE_MODE_CONTROL_TCP",
                  "ADK_CODE_MODE_CONTROL_TOKEN", "ADK_CODE_MODE_CONTROL_SOCKET",
                  "ADK_CODE_MODE_CONTROL_FD", "ADK_CODE_MODE_WORKDIR", "ADK_CODE_MODE_TOOLS_DIR")

# `forkbox run`'s own failures (no sandbox, a broken sandbox), as docker run's
# 125: not a status a block's sys.exit() is likely to choose.
RUN_FAILED = 125
LOGS_KEPT = 20


class SandboxError(RuntimeError):
    """The sandbox could not start, exited before answering, or broke the frame
    order. ``status`` is its exit status when it is known (else None)."""

    def __init__(self, message: str, status: int | None = None, logs: Sequence[dict] = ()):
        lines = [message] + [f"  sandbox {f['level']}: {f['msg']}" for f in logs]
        super().__init__("\n".join(lines))
        self.status = status
        self.logs = list(logs)


@dataclasses.dataclass
class Result:
    """One block's outcome (§6.2, §6.3)."""
    stdout: str
    stderr: str
    exit_code: int          # done.exit_code (§2.4)
    tool_calls: list[dict]  # the tool_call frames, in arrival order
    logs: list[dict]        # the sandbox's log frames during the block


# openat2(2): the same number on every Linux architecture (new system calls
# got one table); struct open_how and the RESOLVE_ flags of <linux/openat2.h>.
_SYS_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_MODE_FLAGS = {"r": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
               "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND, "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL}


class Workspace:
    """A workspace directory as a host should read what a block left in it.

    A block may leave symlinks (a venv is made of them) that point anywhere,
    and the host, unlike the sandbox, sees its own files at those names. So
    every name given here is resolved beneath the directory only, by the
    kernel (openat2 with RESOLVE_BENEATH and RESOLVE_NO_MAGICLINKS): a symlink
    that leads out of it (an absolute one, or up through ``..``), a ``..`` of
    the name's own or a /proc magic link is an ``OSError`` (EXDEV or ELOOP),
    never the file it points at; symlinks that stay inside are followed.
    Names are relative to the directory. ``close()`` (or ``with``) drops the
    directory fd this holds."""

    def __init__(self, path: str):
        self.path = os.path.realpath(path)
        self._dir = os.open(self.path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self._dir >= 0:
            os.close(self._dir)
            self._dir = -1

    def __enter__(self) -> "Workspace":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self, name: str, flags: int, mode: int = 0o666) -> int:
        if self._dir < 0:
            raise ValueError("workspace closed")
        how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0,
                       _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
        fd = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(self._dir),
                           ctypes.c_char_p(os.fsencode(name)), ctypes.byref(how),
                           ctypes.c_size_t(ctypes.sizeof(how)))
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), os.path.join(self.path, name))
        return fd

    def open(self, name: str, mode: str = "r", encoding: str | None = None, **kwargs) -> io.IOBase:
        """Like ``open()`` (modes r, w, a, x, with + and b), for a name beneath
        the workspace."""
        flags = _MODE_FLAGS.get(mode.replace("b", "").replace("+", "")[:1])
        if flags is None:
            raise ValueError(f"mode {mode!r}")
        if "+" in mode:
            flags = (flags & ~(os.O_WRONLY | os.O_RDONLY)) | os.O_RDWR
        fd = self._open(name, flags)
        try:
            return os.fdopen(fd, mode, encoding=None if "b" in mode else encoding or "utf-8",
                             **kwargs)
        except BaseException:
            os.close(fd)
            raise

    def read_bytes(self, name: str) -> bytes:
        with self.open(name, "rb") as f:
            return f.read()

    def read_text(self, name: str, encoding: str = "utf-8") -> str:
        with self.open(name, "r", encoding=encoding) as f:
            return f.read()

    def listdir(self, name: str = ".") -> list[str]:
        fd = self._open(name, os.O_RDONLY | os.O_DIRECTORY)
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def stat(self, name: str) -> os.stat_result:
        """The file the name leads to (beneath the workspace); a symlink that
        stays inside is followed, as by ``os.stat``."""
        fd = self._open(name, os.O_PATH)
        try:
            return os.stat(fd)
        finally:
            os.close(fd)


_CURRENT: contextvars.ContextVar[Workspace] = contextvars.ContextVar("forkbox_workspace")


def current_workspace() -> Workspace:
    """In a host tool while it answers a block's call (a ``Sandbox``'s tools,
    ``forkbox run --tools``): the calling sandbox's workspace, to read what
    the block wrote there. ``LookupError`` outside a tool call."""
    return _CURRENT.get()


def find_forkbox(explicit: str | None = None) -> str:
    """The ``forkbox`` binary: ``explicit``, else ``$FORKBOX`` (what the C
    ``forkbox run`` sets to itself), else ``forkbox`` on ``$PATH``."""
    path = explicit or os.environ.get("FORKBOX") or shutil.which("forkbox")
    if not path:
        raise SandboxError("no forkbox binary: pass forkbox=, set $FORKBOX or put it on $PATH")
    return path


class Sandbox:
    """One forkbox sandbox (one turn) driven over a socketpair.

    ``tools`` maps tool names (``"fn"`` or ``"ns.fn"``) to host callables; their
    stubs are generated into a private directory named ``tools``, mounted
    read-only. ``workspace`` (default: the current directory) is mounted
    read-write and is the block's cwd: what a block writes is there at once.
    ``args`` are extra ``forkbox sandbox`` flags (e.g. ``["--memory", "256M"]``).
    """

    def __init__(self, tools: Mapping[str, Callable[..., Any]] | None = None, *,
                 workspace: str | None = None, forkbox: str | None = None,
                 args: Sequence[str] = (), start_timeout: float = 60.0):
        self.registry = ToolRegistry(tools or {})
        self.workspace = os.path.realpath(workspace or os.getcwd())
        self.forkbox = forkbox
        self.args = list(args)
        self.start_timeout = start_timeout
        self.ready: dict | None = None
        self.proc: subprocess.Popen | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._write_lock: asyncio.Lock | None = None
        self._tmp: str | None = None
        # The sandbox's last log frames, for the message of a SandboxError.
        self._logs: collections.deque[dict] = collections.deque(maxlen=LOGS_KEPT)
        # forkbox sandbox's last stderr lines: its last one says why it ended.
        self._stderr_lines: collections.deque[str] = collections.deque(maxlen=LOGS_KEPT)
        self._stderr_copier: threading.Thread | None = None
        self.files: Workspace | None = None  # the workspace, to read (from start() on)

    # -- life cycle ---------------------------------------------------------

    def start(self) -> dict:
        """Start the sandbox and wait for its ``ready``; returns that frame."""
        if self.proc is not None:
            raise SandboxError("already started")
        if not os.path.isdir(self.workspace):
            raise SandboxError(f"workspace {self.workspace}: not a directory")
        forkbox = find_forkbox(self.forkbox)
        self.files = Workspace(self.workspace)
        self._tmp = tempfile.mkdtemp(prefix="forkbox-tools-")
        tools_dir = write_tools_package(self.registry.tools.values(), self._tmp)
        # SOCK_STREAM: frames are lines in a byte stream (§8.2). The parent's
        # end is close-on-exec, so the sandbox holds only its own.
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            env = {k: v for k, v in os.environ.items()
                   if k not in TRANSPORT_VARS and k != "FORKBOX"}
            env.update(ADK_CODE_MODE_CONTROL_FD=str(child.fileno()),
                       ADK_CODE_MODE_WORKDIR=self.workspace,
                       ADK_CODE_MODE_TOOLS_DIR=tools_dir)
            # stdin is not the sandbox's (a block reads no terminal); its own
            # diagnostics go to our stderr, never into our stdout, through a
            # pipe we read (_copy_stderr), so that an error can say why.
            self.proc = subprocess.Popen([forkbox, "sandbox", *self.args], env=env,
                                         pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=2, stderr=subprocess.PIPE)
        except OSError as exc:
            parent.close()
            self.files.close()
            self._cleanup_tmp()
            raise SandboxError(f"cannot start {forkbox} sandbox: {exc}") from exc
        finally:
            child.close()
        self._stderr_copier = threading.Thread(target=self._copy_stderr, args=(self.proc.stderr,),
                                               name="forkbox-sandbox-stderr", daemon=True)
        self._stderr_copier.start()
        self._loop = asyncio.new_event_loop()
        try:
            self.ready = self._loop.run_until_complete(
                asyncio.wait_for(self._connect(parent), self.start_timeout))
        except asyncio.TimeoutError:
            self._abort()
            raise SandboxError(f"no ready within {self.start_timeout:g}s") from None
        except BaseException:
            self._abort()
            raise
        return self.ready

    async def _connect(self, sock: socket.socket) -> dict:
        self._reader, self._writer = await asyncio.open_unix_connection(
            sock=sock, limit=MAX_MESSAGE + 1)
        self._write_lock = asyncio.Lock()
        while True:  # log frames may come before ready (a failed step says why)
            frame = await self._recv("ready")
            if frame["kind"] == "log":
                continue
            if frame["kind"] != "ready":
                raise ProtocolFault(f"expected ready, got {frame['kind']}")
            if frame["protocol_version"] != PROTOCOL_VERSION:
                raise ProtocolFault(f"sandbox speaks protocol {frame['protocol_version']!r}")
            return frame

    def close(self, timeout: float = 10.0) -> int | None:
        """Send ``shutdown``, wait for the exit (SIGKILL after ``timeout`` s),
        remove the generated tools. Returns the sandbox's exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None and self._writer is not None:
            try:
                self._loop.run_until_complete(
                    asyncio.wait_for(self._send({"kind": "shutdown"}), timeout))
            except (OSError, asyncio.TimeoutError):
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._teardown()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the sandbox at once (Popen knows when it is reaped: no
        signal can reach a recycled pid)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)

    def _abort(self) -> None:
        self.kill()
        if self.proc is not None:
            self.proc.wait()
        self._teardown()

    def _teardown(self) -> None:
        if self.files is not None:
            self.files.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        self._stderr_done()
        self._cleanup_tmp()

    def _copy_stderr(self, pipe) -> None:
        """In a thread of its own, for the sandbox's lifetime: forkbox sandbox's
        lines go on to our fd 2 as they come (as when it wrote there itself;
        a thread, so that its writes never wait for us to be in a call), and
        the last ones are kept for a SandboxError."""
        with pipe:
            for raw in iter(pipe.readline, b""):
                self._stderr_lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                view = memoryview(raw)
                try:
                    while view:
                        view = view[os.write(2, view):]
                except OSError:
                    pass

    def _stderr_done(self, wait: float = 2.0) -> None:
        """Once the sandbox has exited: its last stderr lines read."""
        if self._stderr_copier is not None:
            self._stderr_copier.join(wait)

    def _why_it_ended(self) -> str:
        """forkbox sandbox's reason for ending (its last line names it), or ""."""
        self._stderr_done()
        for line in reversed(self._stderr_lines):
            if line.startswith("forkbox sandbox: "):
                return ": " + line[len("forkbox sandbox: "):]
        return ""

    def _cleanup_tmp(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> "Sandbox":
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._abort()

    # -- blocks -------------------------------------------------------------

    def run(self, code: str, tools: Mapping[str, Callable[..., Any]] | None = None,
            timeout: float | None = None) -> Result:
        """Run one block; its globals carry over to the next (§6.1). ``tools``
        overrides the callables for this block (the stubs stay those of the
        start). After ``timeout`` s the sandbox is killed and TimeoutError raised."""
        if self._loop is None:
            raise SandboxError("not started (or closed)")
        registry = self.registry if tools is None else ToolRegistry(tools)
        try:
            return self._loop.run_until_complete(asyncio.wait_for(self._run(code, registry), timeout))
        except asyncio.TimeoutError:
            self._abort()
            raise TimeoutError(f"block still running after {timeout:g}s: sandbox killed") from None

    async def _run(self, code: str, registry: ToolRegistry) -> Result:
        await self._send({"kind": "run", "code": code})
        calls: list[dict] = []
        logs: list[dict] = []
        tasks: set[asyncio.Task] = set()
        try:
            while True:
                frame = await self._recv("done")
                kind = frame["kind"]
                if kind == "tool_call":
                    calls.append(frame)
                    t = asyncio.create_task(self._answer(registry, frame))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                elif kind == "log":
                    logs.append(frame)
                elif kind == "done":
                    break
        finally:
            for t in tasks:  # a call still running after done gets no answer (§7.2)
                t.cancel()
        output = await self._recv("output")
        if output["kind"] != "output":
            raise ProtocolFault(f"expected output after done, got {output['kind']}")
        return Result(stdout=output["stdout"], stderr=output["stderr"],
                      exit_code=frame["exit_code"], tool_calls=calls, logs=logs)

    async def _answer(self, registry: ToolRegistry, call: dict) -> None:
        _CURRENT.set(self.files)  # this task's own context (and its tool's thread's)
        result = await registry(call)
        try:
            await self._send(result)
        except OSError:
            pass  # the sandbox is gone; the reader reports it

    # -- frames -------------------------------------------------------------

    async def _send(self, frame: dict) -> None:
        async with self._write_lock:
            self._writer.write(encode_frame(frame).encode("utf-8"))
            await self._writer.drain()

    async def _recv(self, waiting_for: str) -> dict:
        try:
            line = await self._reader.readline()
        except (ValueError, asyncio.LimitOverrunError):
            raise ProtocolFault(f"a frame longer than {MAX_MESSAGE} bytes") from None
        except OSError as exc:
            line, err = b"", exc
        else:
            err = None
        if not line.endswith(b"\n"):  # EOF (a partial line is a sandbox that died mid-write)
            status = await asyncio.to_thread(self._exit_status)
            reason = await asyncio.to_thread(self._why_it_ended)
            why = f" ({err})" if err else ""
            raise SandboxError(f"sandbox closed the channel while waiting for {waiting_for}"
                               f"{why}, exit status {status}{reason}", status, self._logs)
        try:
            frame = decode_frame(line)
        except FrameError as exc:
            raise ProtocolFault(f"undecodable frame from the sandbox: {exc}") from None
        if frame["kind"] == "log":
            self._logs.append(frame)
        return frame

    def _exit_status(self, wait: float = 5.0) -> int | None:
        try:
            return self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            return None


__all__ = ["Result", "Sandbox", "SandboxError", "Workspace", "current_workspace", "find_forkbox",
           "load_tools_module", "main"]


# --------------------------------------------------------------------------
# forkbox run
# --------------------------------------------------------------------------

def load_tools_module(path: str) -> dict[str, Callable[..., Any]]:
    """Import a host-side Python file (on the host: it is the host's code) and
    return its public functions. Its directory goes first on sys.path, as for
    ``python3 FILE``."""
    path = os.path.realpath(path)
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SandboxError(f"--tools {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(path))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        # The host's own code failed: its frames (not the importer's) are
        # what its author needs, then the reason and RUN_FAILED as for any
        # turn that could not start.
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if f.filename != __file__ and not f.filename.startswith("<frozen")]
        print("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames)),
              end="", file=sys.stderr)
        raise SandboxError(f"--tools {path}: {type(e).__name__}: {e}") from None
    try:
        return tools_from_module(module)
    except TypeError as e:
        raise SandboxError(f"--tools {path}: {e}") from None


def _read_block(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _write(stream, text: str) -> None:
    stream.write(text)
    stream.flush()


# forkbox sandbox's settings that forkbox run passes on (the rest keep their
# defaults: forkboxd --help lists them).
SANDBOX_FLAGS = {
    "workspace-max": "how much the blocks may add to the workspace (default: --tmpfs-size, 512M)",
    "memory": "memory of the sandbox (default 1G)",
    "output-cap": "bytes of stdout and of stderr kept per block (default 16M)",
}


def main(argv: Sequence[str] | None = None) -> int:
    """``forkbox run [--workspace DIR] [--tools FILE] [--timeout SEC] [--workspace-max SIZE]
    [--memory SIZE] [--output-cap SIZE] FILE.py...``"""
    p = argparse.ArgumentParser(
        prog="forkbox run",
        description="Run Python files as the blocks of one turn in a local forkbox sandbox "
                    "(no server). Globals carry over from block to block; the exit status is "
                    f"the last block's exit code ({RUN_FAILED} if the sandbox failed).")
    p.add_argument("--workspace", metavar="DIR",
                   help="the blocks' cwd, read-write (default: the current directory)")
    p.add_argument("--tools", metavar="FILE.py",
                   help="host-side module: its public functions become the tools package, "
                        "called here, outside the sandbox")
    p.add_argument("--timeout", type=float, metavar="SEC",
                   help="kill the sandbox if one block runs longer (default: the sandbox's own "
                        "block timeout)")
    for flag, what in SANDBOX_FLAGS.items():
        p.add_argument(f"--{flag}", metavar="SIZE", help=f"{what} (forkbox sandbox --{flag})")
    p.add_argument("files", nargs="+", metavar="FILE.py", help="a block each; - reads stdin")
    args = p.parse_args(list(argv) if argv is not None else sys.argv[1:])
    if args.files.count("-") > 1:
        p.error("stdin (-) can be read only once")
    try:
        blocks = [(f, _read_block(f)) for f in args.files]
        tools = load_tools_module(args.tools) if args.tools else {}
    except (OSError, UnicodeDecodeError, SandboxError) as exc:
        print(f"forkbox run: {exc}", file=sys.stderr)
        return RUN_FAILED
    # The sandbox's own start-up notes (info) are not the program's output:
    # only its warnings and errors reach the terminal.
    flags = ["--log-level", "warn"]
    for flag in SANDBOX_FLAGS:
        value = getattr(args, flag.replace("-", "_"))
        if value is not None:
            flags += [f"--{flag}", value]
    sb = Sandbox(tools, workspace=args.workspace, args=flags)
    status = 0
    try:
        sb.start()
        for _path, code in blocks:
            r = sb.run(code, timeout=args.timeout)
            # The frames carry a block's output after it ends (§8.2: done, then
            # output), so it is written block by block, each stream to its own.
            _write(sys.stdout, r.stdout)
            _write(sys.stderr, r.stderr)
            for log in r.logs:
                if log["level"] in ("warn", "warning", "error"):
                    _write(sys.stderr, f"forkbox: {log['level']}: {log['msg']}\n")
            status = r.exit_code
        sb.close()
    except KeyboardInterrupt:
        sb._abort()
        return 130
    except (SandboxError, ProtocolFault, TimeoutError, OSError) as exc:
        sb._abort()
        print(f"forkbox run: {exc}", file=sys.stderr)
        return RUN_FAILED
    # A shell sees a status modulo 256, as for python3 FILE.py with sys.exit(N).
    return status & 0xFF if isinstance(status, int) else 1


if __name__ == "__main__":
    # A --tools module that imports forkbox_embed (current_workspace) gets
    # this module, not a second copy with a context of its own.
    sys.modules.setdefault("forkbox_embed", sys.modules[__name__])
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        sys.exit(main(sys.argv[2:]))
    print("usage: forkbox_embed.py run [--workspace DIR] [--tools FILE.py] FILE.py...",
          file=sys.stderr)
    sys.exit(2)
