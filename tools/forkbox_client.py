"""A small asyncio client for the Code Mode sandbox wire protocol, version 2.

It behaves like adk-code-mode's ``RemoteBackend`` (the host) so that forkboxd can
be exercised exactly the way the host drives it:

* connect with ``max_size`` 256 MiB, ``Authorization: Bearer <token>`` only when a
  token is given, and the default ``permessage-deflate`` offer;
* send the tools archive right after the 101, without waiting for ``ready``;
* per block: send a workspace archive (the empty gzip tar by default), then ``run``;
  dispatch every ``tool_call`` concurrently and answer in completion order; stop at
  ``done`` (cancelling dispatches still running), then read ``output`` and the
  workspace archive by position;
* end the turn with ``shutdown`` and a 1000 close, both best effort.

Only the standard library and python3-websockets (10.x, asyncio API) are used.
Spec: shared/spec/wire-protocol.md (sections cited as §N).
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import os
import posixpath
import shutil
import tarfile
import tempfile
from typing import Any, Iterable, Mapping

import websockets
import websockets.exceptions

# Frames, stubs and tool dispatch are shared with the stream host
# (forkbox_embed.py); re-exported here for the suites that use them as fc.*.
import forkbox_host
from forkbox_host import (  # noqa: F401
    GENERATED_MARKER, MAX_MESSAGE, PROTOCOL_VERSION, FrameError, ProtocolFault,
    ProtocolVersionMismatch, Tool, ToolHandler, ToolParam, decode_frame, encode_frame,
    json_safe, render_stub, render_tools_files, tool_from_callable)

MAX_DOWNLOAD_WORKSPACE = 100 * 1024 * 1024  # §4.5, host side

# --------------------------------------------------------------------------
# Archives (§4)
# --------------------------------------------------------------------------

def make_tar(files: Mapping[str, bytes | str] | Iterable[tarfile.TarInfo | tuple] = (),
             *, mode: int = 0o644, mtime: float = 0) -> bytes:
    """A gzip-compressed pax tar. ``files`` maps member names to contents, or is an
    iterable of ``TarInfo`` / ``(TarInfo, bytes|None)`` for hand-made members."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tf:
        items = files.items() if isinstance(files, Mapping) else files
        for item in items:
            if isinstance(item, tarfile.TarInfo):
                tf.addfile(item)
                continue
            first, data = item
            if isinstance(first, tarfile.TarInfo):
                info = first
                tf.addfile(info, io.BytesIO(data) if data is not None else None)
                continue
            if isinstance(data, str):
                data = data.encode("utf-8")
            info = tarfile.TarInfo(name=first)
            info.size = len(data)
            info.mode = mode
            info.mtime = mtime
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def empty_tar() -> bytes:
    """The zero-member gzip tar the host sends before every block (~45 bytes)."""
    return make_tar({})


def read_tar(data: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """Every member of a gzip tar with its content (None for non-regular members).
    Raises tarfile.TarError / OSError on a corrupt or non-gzip archive."""
    out = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
        for m in tf.getmembers():
            content = None
            if m.isreg():
                f = tf.extractfile(m)
                content = f.read() if f is not None else b""
            out.append((m, content))
    return out


def _keep_member(m: tarfile.TarInfo) -> str | None:
    """§4.2 steps 1-4: the normalised name, or None if the member is dropped."""
    if not (m.isreg() or m.isdir()):
        return None
    if m.linkname:
        return None
    name = posixpath.normpath(m.name)
    name = name.rstrip("/") or name
    if name.startswith("/") or name.startswith(".."):
        return None
    if any(part == ".." for part in name.split("/")):
        return None
    return name


def tar_files(data: bytes) -> dict[str, bytes]:
    """Regular files that survive the §4.2 filter, keyed by normalised name."""
    files: dict[str, bytes] = {}
    for m, content in read_tar(data):
        name = _keep_member(m)
        if name is not None and m.isreg() and name != ".":
            files[name] = content or b""
    return files


def safe_extract(data: bytes, dest: str) -> list[str]:
    """Extract a gzip tar into ``dest`` with the §4.2 filter. Returns the names of
    the files written. Modes are masked to 0644/0755; links are never created."""
    os.makedirs(dest, exist_ok=True)
    dest_real = os.path.realpath(dest)
    written = []
    for m, content in read_tar(data):
        name = _keep_member(m)
        if name is None or name == ".":
            continue
        target = os.path.join(dest_real, name)
        resolved = os.path.realpath(target)
        if resolved != dest_real and not resolved.startswith(dest_real + os.sep):
            continue
        if m.isdir():
            os.makedirs(target, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.lexists(target) and not os.path.isfile(target):
            continue
        with open(target, "wb") as fh:
            fh.write(content or b"")
        os.chmod(target, 0o755 if m.mode & 0o111 else 0o644)
        written.append(name)
    return written


def replace_dir_from_tar(data: bytes, dest: str) -> list[str]:
    """What the host does with a non-empty snapshot (§4.4): authoritative replace."""
    dest_real = os.path.realpath(dest)
    os.makedirs(dest_real, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="forkbox-ws-", dir=os.path.dirname(dest_real)) as tmp:
        names = safe_extract(data, tmp)
        for entry in os.scandir(dest_real):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        for name in os.listdir(tmp):
            shutil.move(os.path.join(tmp, name), os.path.join(dest_real, name))
    return names


def tools_archive(tools: Iterable[Tool]) -> bytes:
    return make_tar(render_tools_files(tools))


class ToolRegistry(forkbox_host.ToolRegistry):
    """The shared registry plus the tools archive the WebSocket host sends (§5.1)."""

    def archive(self) -> bytes:
        return tools_archive(self.tools.values())


# --------------------------------------------------------------------------
# The turn (one WebSocket connection)
# --------------------------------------------------------------------------

@dataclasses.dataclass
class BlockResult:
    stdout: str
    stderr: str
    exit_code: int                 # from done (§2.4)
    output_exit_code: Any
    archive: bytes | None          # the binary after output (None if text came instead)
    files: dict[str, bytes]        # the archive's regular files after the §4.2 filter
    tool_calls: list[dict]
    logs: list[dict]
    messages: list[tuple[str, Any]]  # every message received, in order: ("text"|"binary", data)
    done_raw: str = ""
    output_raw: str = ""


class TurnClosed(ConnectionError):
    """The server closed the connection (or it broke) during a block.

    ``stage`` follows §7.4: "not run", "unknown" (no done) or "ran" (done seen)."""

    def __init__(self, stage: str, code: int | None, reason: str, messages: list):
        super().__init__(f"connection closed ({stage}): code={code} reason={reason!r}")
        self.stage, self.code, self.reason, self.messages = stage, code, reason, messages


class Turn:
    """One turn: ``await Turn.connect(url, tools)``, then ``run()`` blocks."""

    def __init__(self, ws, registry: ToolRegistry | None):
        self.ws = ws
        self.registry = registry or ToolRegistry()
        self.ready: dict | None = None
        self.ready_raw: str | None = None
        self.ready_count = 0

    @classmethod
    async def connect(cls, url: str, tools: ToolRegistry | Mapping | None = None, *,
                      token: str | None = None, open_timeout: float = 10.0,
                      send_tools: bool = True, tools_bytes: bytes | None = None,
                      **ws_kwargs) -> "Turn":
        registry = tools if isinstance(tools, forkbox_host.ToolRegistry) else ToolRegistry(tools or {})
        headers = dict(ws_kwargs.pop("extra_headers", {}) or {})
        if token:
            headers["Authorization"] = f"Bearer {token}"
        ws_kwargs.setdefault("max_size", MAX_MESSAGE)
        ws = await websockets.connect(normalise_url(url), extra_headers=headers,
                                      open_timeout=open_timeout, **ws_kwargs)
        turn = cls(ws, registry)
        if send_tools:
            try:
                await ws.send(tools_bytes if tools_bytes is not None
                              else tools_archive(registry.tools.values()))
            except BaseException:
                await ws.close()
                raise
        return turn

    def _closed(self, stage: str, messages: list) -> TurnClosed:
        return TurnClosed(stage, self.ws.close_code, self.ws.close_reason or "", messages)

    def _note_ready(self, frame: dict, raw: str) -> None:
        self.ready_count += 1
        self.ready, self.ready_raw = frame, raw
        if frame["protocol_version"] != PROTOCOL_VERSION or isinstance(frame["protocol_version"], str):
            raise ProtocolVersionMismatch(f"server speaks {frame['protocol_version']!r}")

    async def run(self, code: str, workspace: bytes | None = None, *,
                  send_archive: bool = True,
                  on_tool_call: ToolHandler | None = None) -> BlockResult:
        """Run one block the way the host does. Raises TurnClosed on a lost
        connection and ProtocolFault on an ordering violation."""
        handler = on_tool_call or self.registry
        messages: list[tuple[str, Any]] = []
        calls: list[dict] = []
        logs: list[dict] = []
        tasks: set[asyncio.Task] = set()
        try:
            if send_archive:
                await self.ws.send(workspace if workspace is not None else empty_tar())
            await self.ws.send(encode_frame({"code": code, "kind": "run"}))
        except websockets.exceptions.ConnectionClosed:
            raise self._closed("not run", messages) from None

        async def dispatch(frame: dict) -> None:
            result = await handler(frame)
            if result is None:  # the handler answered (or chose not to) itself
                return
            try:
                await self.ws.send(result if isinstance(result, (str, bytes)) else encode_frame(result))
            except websockets.exceptions.ConnectionClosed:
                pass

        done_raw = ""
        try:
            while True:
                msg = await self.ws.recv()
                if isinstance(msg, bytes):
                    messages.append(("binary", msg))
                    continue  # ignored before done (§2.4)
                messages.append(("text", msg))
                try:
                    frame = decode_frame(msg)
                except FrameError:
                    continue
                kind = frame["kind"]
                if kind == "ready":
                    self._note_ready(frame, msg)
                elif kind == "tool_call":
                    calls.append(frame)
                    t = asyncio.create_task(dispatch(frame))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                elif kind == "log":
                    logs.append(frame)
                elif kind == "done":
                    done_raw = msg
                    done = frame
                    break
        except websockets.exceptions.ConnectionClosed:
            for t in tasks:
                t.cancel()
            raise self._closed("unknown", messages) from None
        for t in tasks:  # dispatches still running never get a result (§7.2)
            t.cancel()
        try:
            msg = await self.ws.recv()
            messages.append(("binary" if isinstance(msg, bytes) else "text", msg))
            if not isinstance(msg, str):
                raise ProtocolFault("expected the text output frame after done, got binary")
            output = decode_frame(msg)
            if output["kind"] != "output":
                raise ProtocolFault(f"expected output after done, got {output['kind']}")
            output_raw = msg
            archive = await self.ws.recv()
            messages.append(("binary" if isinstance(archive, bytes) else "text", archive))
        except websockets.exceptions.ConnectionClosed:
            raise self._closed("ran", messages) from None
        files: dict[str, bytes] = {}
        if isinstance(archive, bytes):
            if archive:
                files = tar_files(archive)
        else:
            archive = None
        return BlockResult(stdout=output["stdout"], stderr=output["stderr"],
                           exit_code=done["exit_code"], output_exit_code=output["exit_code"],
                           archive=archive, files=files, tool_calls=calls, logs=logs,
                           messages=messages, done_raw=done_raw, output_raw=output_raw)

    async def shutdown(self) -> None:
        """Best-effort ``shutdown`` then close 1000 (§7.5)."""
        try:
            await self.ws.send(encode_frame({"kind": "shutdown"}))
        except Exception:
            pass
        try:
            await self.ws.close()
        except Exception:
            pass

    close = shutdown

    async def __aenter__(self) -> "Turn":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()


def normalise_url(url: str) -> str:
    """The host's URL mapping (§7.1)."""
    if url.startswith("https://"):
        return "wss://" + url[len("https://"):]
    if url.startswith("http://"):
        return "ws://" + url[len("http://"):]
    if not url.startswith(("ws://", "wss://")):
        return "wss://" + url
    return url


async def run_blocks(url: str, blocks: Iterable[str], tools: ToolRegistry | Mapping | None = None,
                     *, token: str | None = None) -> tuple[dict | None, list[BlockResult]]:
    """Convenience: one turn, several blocks. Returns (ready, results)."""
    turn = await Turn.connect(url, tools, token=token)
    results = []
    try:
        for code in blocks:
            results.append(await turn.run(code))
    finally:
        await turn.shutdown()
    return turn.ready, results


__all__ = [
    "BlockResult", "FrameError", "ProtocolFault", "ProtocolVersionMismatch", "Tool",
    "ToolParam", "ToolRegistry", "Turn", "TurnClosed", "decode_frame", "empty_tar",
    "encode_frame", "json_safe", "make_tar", "normalise_url", "read_tar",
    "render_stub", "render_tools_files", "replace_dir_from_tar", "run_blocks",
    "safe_extract", "tar_files", "tool_from_callable", "tools_archive",
]
