"""Tool calls from sandboxed code to the host (spec 5.4).

Generated stubs do ``from adk_code_mode_sandbox._rpc_client import call``.
``call`` sends one ``tool_call`` frame and blocks the calling thread until the
``tool_result`` with the same id arrives. It is thread-safe; results may come
back in any order. Outside a running code block it raises ProtocolError and
sends nothing.
"""
from __future__ import annotations

import os
import threading

from .protocol import ProtocolError, ToolCall, encode

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


class _Waiter:
    __slots__ = ("lock", "result", "error")

    def __init__(self):
        self.lock = threading.Lock()
        self.lock.acquire()
        self.result = None
        self.error = None


class RpcClient:
    """Matches tool_result frames to waiting calls by id.

    send(data: bytes) -> bool writes one encoded tool_call frame and returns
    False, sending nothing, when no code block is running.
    """

    def __init__(self, send):
        self._send = send
        self._lock = threading.Lock()
        self._pending = {}

    def call(self, name, args, timeout=None):
        frame = ToolCall(id=_new_id(), name=name, args=args, timeout=timeout)
        # Raises TypeError / RecursionError / UnicodeEncodeError here, in the
        # caller, before anything is sent.
        data = encode(frame).encode("utf-8")
        waiter = _Waiter()
        with self._lock:
            self._pending[frame.id] = waiter
        try:
            if not self._send(data):
                raise ProtocolError("tool call made outside a running code block")
            waiter.lock.acquire()
        finally:
            with self._lock:
                self._pending.pop(frame.id, None)
        if waiter.error is not None:
            raise waiter.error
        res = waiter.result
        if res.ok:
            return res.value
        if res.error is None:
            raise ToolError("Error", "tool call failed without error payload")
        raise ToolError(res.error.type, res.error.message, res.error.trace)

    def deliver(self, result):
        """Wake the call waiting on result.id; results for unknown ids are dropped."""
        with self._lock:
            waiter = self._pending.pop(result.id, None)
        if waiter is not None:
            waiter.result = result
            waiter.lock.release()

    def fail_id(self, call_id, message):
        with self._lock:
            waiter = self._pending.pop(call_id, None)
        if waiter is not None:
            waiter.error = ProtocolError(message)
            waiter.lock.release()

    def fail_all(self, message):
        """Fail every pending call with ProtocolError(message)."""
        with self._lock:
            waiters = list(self._pending.values())
            self._pending.clear()
        for waiter in waiters:
            waiter.error = ProtocolError(message)
            waiter.lock.release()


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
