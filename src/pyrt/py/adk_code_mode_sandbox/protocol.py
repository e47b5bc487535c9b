"""Frames of the Code Mode wire protocol, version 2 (spec section 3).

Encoding: compact UTF-8 JSON, raw non-ASCII, every field present, one
trailing newline. Decoding follows spec 3.2: trailing CR/LF stripped, NaN and
big integers accepted, the last duplicate key wins, unknown keys dropped,
missing keys defaulted.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Optional

PROTOCOL_VERSION = 2


class ProtocolError(Exception):
    """The control channel broke, or a frame could not be decoded."""


@dataclass
class Ready:
    protocol_version: int = PROTOCOL_VERSION
    python_version: str = ""
    packages: dict = field(default_factory=dict)
    kind: str = "ready"


@dataclass
class Run:
    code: str = ""
    kind: str = "run"


@dataclass
class ToolCall:
    id: str = ""
    name: str = ""
    args: Any = field(default_factory=dict)
    timeout: Optional[float] = None
    kind: str = "tool_call"


@dataclass
class ErrorInfo:
    type: str = "Error"
    message: str = ""
    trace: Optional[str] = None


@dataclass
class ToolResult:
    id: str = ""
    ok: bool = True
    value: Any = None
    error: Optional[ErrorInfo] = None
    kind: str = "tool_result"


@dataclass
class Log:
    level: str = "info"
    msg: str = ""
    kind: str = "log"


@dataclass
class Done:
    exit_code: int = 0
    kind: str = "done"


@dataclass
class Output:
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    kind: str = "output"


@dataclass
class Shutdown:
    kind: str = "shutdown"


_KINDS = {
    "ready": Ready,
    "run": Run,
    "tool_call": ToolCall,
    "tool_result": ToolResult,
    "log": Log,
    "done": Done,
    "output": Output,
    "shutdown": Shutdown,
}
_FIELDS = {k: tuple(f.name for f in dataclasses.fields(c) if f.name != "kind")
           for k, c in _KINDS.items()}

_FIELD_NAMES = {}  # dataclass -> its field names, in order


def _as_object(o):
    """json's hook for what it cannot encode itself. A dataclass (the frame,
    its ErrorInfo, one passed in tool args) becomes an object of its fields
    in order, as dataclasses.asdict() would make it, without asdict's deep
    copy of every value (most of a tool call's encoding time)."""
    cls = type(o)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"Object of type {cls.__name__} is not JSON serializable")
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return {n: getattr(o, n) for n in names}


# check_circular=False: a self-referencing container raises RecursionError
# (as through asdict), not json's ValueError.
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=True,
                          check_circular=False, default=_as_object).encode


def encode(frame) -> str:
    """Frame -> JSON text with the trailing newline. Raises TypeError (not
    serialisable) or RecursionError (self-referencing container)."""
    return _dumps(frame) + "\n"


def decode(data):
    """bytes or str -> frame object; ProtocolError when undecodable."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProtocolError(f"frame is not valid UTF-8: {e}") from None
    text = data.rstrip("\r\n")
    if not text:
        raise ProtocolError("empty frame")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"invalid JSON frame: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("frame is not a JSON object")
    kind = obj.get("kind")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown frame kind: {kind!r}")
    kw = {name: obj[name] for name in _FIELDS[kind] if name in obj}
    if cls is ToolResult:
        err = kw.get("error")
        if err is not None:
            if not isinstance(err, dict):
                raise ProtocolError("tool_result error must be an object or null")
            kw["error"] = ErrorInfo(type=str(err.get("type", "Error")),
                                    message=str(err.get("message", "")),
                                    trace=err.get("trace"))
    return cls(**kw)
