"""A hostile sandbox against the supervisor: model code finds its channel socket
(the supervisor <-> sandbox socketpair, docs/internals.md) and writes forged or
malformed messages on it.

The supervisor accepts from a sandbox only legal messages in legal states
(ready once; tool_call/log during a block; done, output, S in order). Anything
else, a malformed frame, or a message over the limit ends that turn with a
`log` error frame and close 1011, kills the sandbox, and the daemon keeps
serving.
"""

import asyncio
import json
import os
import time
import struct

import pytest

import sbx

FIND_CHAN = r'''
import os, struct, json, time
def chan_fds():
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                out.append(int(fd))
        except OSError:
            pass
    return out
fds = chan_fds()
assert len(fds) == 1, f"expected one channel socket, found {fds}"
CHAN = fds[0]
def send(kind, payload):
    os.write(CHAN, bytes([ord(kind), 0, 0, 0]) + struct.pack("<I", len(payload)) + payload)
'''

ATTACKS = {
    "unknown_type": 'os.write(CHAN, b"Z\\0\\0\\0" + struct.pack("<I", 4) + b"abcd")',
    "nonzero_padding": 'os.write(CHAN, b"F\\1\\2\\3" + struct.pack("<I", 2) + b"{}")',
    "huge_length": 'os.write(CHAN, b"F\\0\\0\\0" + struct.pack("<I", 0xFFFFFFFF) + b"x" * 64)',
    "invalid_utf8": 'send("F", b\'{"level":"info","msg":"\\xff\\xfe","kind":"log"}\\n\')',
    "invalid_json": 'send("F", b"{not json\\n")',
    "unknown_kind": 'send("F", b\'{"kind":"pwn"}\\n\')',
    "second_ready": 'send("F", b\'{"kind":"ready","protocol_version":2,"python_version":"3","packages":{}}\\n\')',
    "host_only_kind_tool_result": 'send("F", b\'{"id":"x","ok":true,"value":1,"error":null,"kind":"tool_result"}\\n\')',
    "host_only_kind_run": 'send("F", b\'{"code":"print(1)","kind":"run"}\\n\')',
    "snapshot_before_done": 'send("S", b"")',
    "tools_archive_from_child": 'send("T", b"")',
    # the listener message is legal only as the first message, from setup
    "late_listener_message": 'send("N", b"")',
    # Where the kernel refuses a sandbox's fds (SO_PASSRIGHTS), the message alone.
    "late_listener_message_with_fd": (
        'import socket\n'
        'try:\n'
        '    socket.send_fds(socket.socket(fileno=os.dup(CHAN)), [b"N\\0\\0\\0" + struct.pack("<I", 0)],'
        ' [os.open("/dev/null", os.O_RDONLY)])\n'
        'except PermissionError:\n'
        '    send("N", b"")'),
}


# The supervisor's close reason for each (after "sandbox protocol error: ").
ATTACK_REASONS = {
    "unknown_type": "bad envelope",
    "nonzero_padding": "bad envelope",
    "huge_length": "message too large",
    "invalid_utf8": "invalid UTF-8",
    "invalid_json": "invalid JSON",
    "unknown_kind": "unknown kind",
    "second_ready": "unexpected ready frame in state X (block running)",
    "host_only_kind_tool_result": "kind not accepted from the sandbox",
    "host_only_kind_run": "kind not accepted from the sandbox",
    "snapshot_before_done": "unexpected 'S' message in state X (block running)",
    "tools_archive_from_child": "unexpected 'T' message in state X (block running)",
    "late_listener_message": "unexpected 'N' message in state X (block running)",
    "late_listener_message_with_fd": ("unexpected 'N' message in state X (block running)"
                                      if sbx.KERNEL_PASSRIGHTS else "sandbox sent a file descriptor"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_forged_channel_message_ends_only_this_turn(daemon, attack):
    code = sbx.prelude(FIND_CHAN + ATTACKS[attack] + "\ntime.sleep(20)\nprint('still running')\n")
    r = daemon.run(code, timeout=60)
    assert r.closed_by_server, f"{attack}: {r!r}"
    assert (r.close_code, r.close_reason) == (1011, "sandbox protocol error: " + ATTACK_REASONS[attack]), r
    assert any(f.get("level") == "error" for f in r.logs), f"{attack}: no log error frame: {r!r}"
    assert not r.last.completed and "still running" not in r.last.stdout, repr(r)
    assert r.last.elapsed < 15, f"{attack}: turn took {r.last.elapsed:.1f}s to end"
    ok, why = daemon.fresh_turn_ok()
    assert ok, why


def test_forged_tool_call_is_relayed_as_a_tool_call_only(daemon):
    """A tool_call frame written directly on the channel during a block is legal;
    the host sees it as an ordinary tool_call (no other kind can be smuggled)."""
    code = sbx.prelude(FIND_CHAN + r'''
send("F", b'{"id":"forged-1","name":"echo","args":{"message":"x"},"timeout":null,"kind":"tool_call"}\n')
time.sleep(1)
print("ok")
''')
    r = daemon.run(code, timeout=60)
    b = r.last
    assert b.completed and b.stdout == "ok\n", repr(r)
    assert [c["id"] for c in b.tool_calls] == ["forged-1"], b.tool_calls
    ok, why = daemon.fresh_turn_ok()
    assert ok, why


def test_closing_the_channel_ends_the_turn(daemon):
    code = sbx.prelude(FIND_CHAN + "import socket\nsocket.socket(fileno=CHAN).shutdown(socket.SHUT_RDWR)\ntime.sleep(20)\n")
    r = daemon.run(code, timeout=60)
    # the runtime's reader sees the channel end and exits 0; its death report names that
    assert r.closed_by_server and (r.close_code, r.close_reason) == (1011, "sandbox exited: status 0"), r
    ok, why = daemon.fresh_turn_ok()
    assert ok, why


FLOOD = r'''
msg = PAYLOAD
frame = b"F\0\0\0" + struct.pack("<I", len(msg)) + msg
t0 = time.time()
n = 0
while time.time() - t0 < 6:
    os.write(CHAN, frame)
    n += 1
print("sent", n)
'''

FLOODS = {
    "tool_call": b'{"id":"x","name":"echo","args":{"m":"' + b"A" * 60000 + b'"},"timeout":null,"kind":"tool_call"}\n',
    "log": b'{"level":"info","msg":"' + b"A" * 60000 + b'","kind":"log"}\n',
}


def _rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return -1


@pytest.mark.parametrize("kind", list(FLOODS))
def test_frame_flood_with_a_stalled_client_is_bounded(daemon, kind):
    """The sandbox floods legal frames while the client reads nothing: the
    supervisor must apply backpressure (not buffer without bound) and keep
    answering /health."""
    code = sbx.prelude(FIND_CHAN + f"PAYLOAD = {FLOODS[kind]!r}\n" + FLOOD)
    base = _rss_mb(daemon.pid)

    async def go():
        t = await sbx.Turn.open(daemon)
        await t.ws.send(sbx.EMPTY_TGZ)
        await t.ws.send(json.dumps({"code": code, "kind": "run"}) + "\n")
        samples = []
        for _ in range(7):
            await asyncio.sleep(1)
            t0 = time.monotonic()
            st = daemon.health()
            samples.append((_rss_mb(daemon.pid), st[0], time.monotonic() - t0))
        b = sbx.BlockResult()
        # now read everything: the block must still finish normally
        while True:
            m = await asyncio.wait_for(t.ws.recv(), 30)
            if isinstance(m, bytes):
                if b.done_exit is not None and b.exit_code is not None:
                    b.completed = True
                    break
                continue
            f = json.loads(m)
            if f["kind"] == "done":
                b.done_exit = f["exit_code"]
            elif f["kind"] == "output":
                b.exit_code, b.stdout, b.stderr = f["exit_code"], f["stdout"], f["stderr"]
        await t.close()
        return samples, b
    samples, b = sbx.arun(go(), 90)
    assert all(st == 200 and dt < 1.0 for _, st, dt in samples), samples
    peak = max(r for r, _, _ in samples)
    if not sbx.UNDER_ASAN:  # ASan's quarantine keeps freed memory resident
        assert peak - base < 64, f"supervisor RSS grew from {base} MB to {peak} MB: {samples}"
    assert b.completed and b.done_exit == 0 and b.stdout.startswith("sent "), repr(b)
    ok, why = daemon.fresh_turn_ok()
    assert ok, why
