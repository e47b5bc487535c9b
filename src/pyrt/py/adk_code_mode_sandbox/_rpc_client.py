"""Tool calls from sandboxed code to the host (spec 5.4).

Generated stubs do ``from adk_code_mode_sandbox._rpc_client import call``.
``call`` sends one ``tool_call`` frame and blocks the calling thread until the
``tool_result`` with the same id arrives. It is thread-safe; results may come
back in any order. Outside a running code block it raises ProtocolError and
sends nothing.
"""
from __future__ import annotations

import os

from .protocol import ProtocolError, ToolCall, ToolResult, decode, encode

__all__ = ["ToolError", "RpcClient", "call", "get", "install"]


class ToolError(RuntimeError):
    """A tool call failed on the host: str(e) == f"{error_type}: {message}"."""

    def __init__(self, error_type, message, trace=None):
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.trace = trace


def _new_id():
    """uuid.uuid4().hex, without building a UUID object."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40  # version 4
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    return b.hex()


class RpcClient:
    """Sends tool_call frames and returns their results.

    transport(id: str, data: bytes) writes one encoded tool_call frame and
    waits for its result: the tool_result frame (bytes), why the call failed
    (str, e.g. the block ended first), or None, having sent nothing, when no
    code block is running. In the sandbox it is _forkbox.call, which matches
    results to calls by id without the GIL, so calls from several threads
    may be answered in any order.
    """

    def __init__(self, transport):
        self._transport = transport

    def call(self, name, args, timeout=None):
        frame = ToolCall(id=_new_id(), name=name, args=args, timeout=timeout)
        # Raises TypeError / RecursionError / UnicodeEncodeError here, in the
        # caller, before anything is sent.
        data = encode(frame).encode("utf-8")
        reply = self._transport(frame.id, data)
        if reply is None:
            raise ProtocolError("tool call made outside a running code block")
        if isinstance(reply, str):
            raise ProtocolError(reply)
        res = decode(reply)
        if type(res) is not ToolResult or res.id != frame.id:
            raise ProtocolError("the answer to a tool call is not its tool_result")
        if res.ok:
            return res.value
        if res.error is None:
            raise ToolError("Error", "tool call failed without error payload")
        raise ToolError(res.error.type, res.error.message, res.error.trace)


_client = None


def install(client):
    """Make client the one used by call()."""
    global _client
    _client = client


def get():
    client = _client
    if client is None:
        raise RuntimeError("RPC client not installed; sandbox is not in a valid state")
    return client


def call(name, args, timeout=None):
    """Call the host tool `name` with `args`; returns its value or raises ToolError."""
    return get().call(name, args, timeout)
