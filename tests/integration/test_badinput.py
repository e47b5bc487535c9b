"""Bad input both ways: malformed client frames in every state (§2.3, §9.1
item 18), WebSocket-level violations (§1.4), and hostile sandboxes forging
channel messages or crashing (§9.2 "no isolation", "no kill")."""

import os
import struct
import time

import pytest

from fbtest import (FORGE_PRELUDE, RawWS, arun, chan_envelope, connect, expect_closed, fc,
                    text_frames)

T = 30


async def still_serving(daemon):
    turn = await connect(daemon)
    try:
        r = await turn.run("print('still serving')")
    finally:
        await turn.shutdown()
    assert r.stdout == "still serving\n" and r.exit_code == 0
    return True


# ---- state B (item 18) -----------------------------------------------------

BETWEEN_BLOCKS_JUNK = [
    "not json", "", "\n", "\r\n", "[1,2]", "42", "null", '"str"', '{"kind":"nope"}', '{"kind":5}',
    '{"no":"kind"}', '{"kind":"log"} {"kind":"log"}', '{"kind":"shutdown"', "NaN",
    '{"kind":"tool_result","id":"x","ok":true,"value":1}', '{"kind":"ready"}', '{"kind":"done"}',
    '{"kind":"output","stdout":"forged"}', '{"kind":"tool_call","id":"1","name":"echo"}',
    '{"kind":"tool_result","error":"not-an-object"}', '{"kind":"log","level":"error","msg":"x"}',
    '{"kind":"run","code":"open(\'ran_without_archive\',\'w\').write(\'x\')"}',
]


def test_between_blocks_junk_is_ignored(daemon):
    """§9.1.18 / §9.1.10: between blocks undecodable text and every frame
    other than shutdown are ignored; a run without an archive never executes."""
    async def go():
        turn = await connect(daemon)
        r1 = await turn.run("x = 'kept'")
        for junk in BETWEEN_BLOCKS_JUNK:
            await turn.ws.send(junk)
        r2 = await turn.run("import os\nprint(x, os.path.exists('ran_without_archive'))")
        await turn.shutdown()
        return r1, r2
    r1, r2 = arun(go(), T)
    assert r1.exit_code == 0
    assert r2.stdout == "kept False\n", r2.stderr
    # nothing but the block's own frames came back
    kinds = [f["kind"] for f in text_frames(r2.messages)]
    assert kinds == ["done", "output"], kinds


def test_shutdown_ends_turn_with_normal_close(daemon):
    """§2.3: shutdown between blocks ends the turn (close 1000)."""
    async def go():
        turn = await connect(daemon)
        await turn.run("pass")
        await turn.ws.send(fc.encode_frame({"kind": "shutdown"}))
        return await expect_closed(turn.ws, 5)
    code, reason, msgs = arun(go(), T)
    assert code == 1000, (code, reason)
    assert msgs == []


# ---- state T and R ---------------------------------------------------------

@pytest.mark.parametrize("first", ['{"kind":"run","code":"print(1)"}', '{"kind":"shutdown"}',
                                   "garbage"], ids=["run", "shutdown", "garbage"])
def test_text_as_first_message_ends_turn(daemon, first):
    """§2.3 state T: text instead of the tools archive ends the turn (no ready),
    as a normal end: close 1000 without a reason."""
    async def go():
        turn = await connect(daemon, send_tools=False)
        await turn.ws.send(first)
        return await expect_closed(turn.ws, 5)
    code, reason, msgs = arun(go(), T)
    assert (code, reason) == (1000, "")
    assert not any('"ready"' in m for m in msgs if isinstance(m, str))
    assert arun(still_serving(daemon), T)


@pytest.mark.parametrize("second", ["undecodable {", b"\x1f\x8b binary", '{"kind":"shutdown"}',
                                    '{"kind":"tool_result","id":"x"}', '{"kind":"log"}'],
                         ids=["undecodable", "binary", "shutdown", "tool_result", "log"])
def test_state_r_anything_but_run_ends_turn(daemon, second):
    """§2.3 state R (archive received, awaiting run): anything else ends the
    turn (close 1000, no reason)."""
    async def go():
        turn = await connect(daemon)
        await turn.run("pass")
        await turn.ws.send(fc.empty_tar())
        await turn.ws.send(second)
        await turn.ws.send(fc.encode_frame({"kind": "run", "code": "print('ran')"}))
        return await expect_closed(turn.ws, 5)
    code, reason, msgs = arun(go(), T)
    assert (code, reason) == (1000, "")
    assert not any('"done"' in m for m in msgs if isinstance(m, str))
    assert arun(still_serving(daemon), T)


# ---- state X ---------------------------------------------------------------

def test_block_running_ignores_run_shutdown_binary_and_garbage(daemon):
    """§2.3 state X: other valid frames (run, shutdown), binary messages and
    (RECOMMENDED) undecodable text are dropped; the tool call still works and
    the turn continues normally."""
    async def go():
        turn = await connect(daemon)
        await turn.ws.send(fc.empty_tar())
        await turn.ws.send(fc.encode_frame({"kind": "run", "code":
                                            "import time\ntime.sleep(0.5)\nfrom tools import echo\n"
                                            "print(echo(message='after junk'))"}))
        for junk in (fc.encode_frame({"kind": "run", "code": "print('second run')"}),
                     fc.encode_frame({"kind": "shutdown"}), fc.empty_tar(), b"", "garbage{",
                     '{"kind":"ready"}'):
            await turn.ws.send(junk)
        # now read the block like the host (run() without sending anything)
        r = await read_block(turn)
        r2 = await turn.run("print('next block')")
        await turn.shutdown()
        return r, r2
    r, r2 = arun(go(), T)
    assert r.stdout == "{'echoed': 'after junk'}\n", r.stderr
    assert r2.stdout == "next block\n"


async def read_block(turn):
    """Read one block's frames (the run was sent by hand), answering tool calls."""
    msgs, calls = [], []
    while True:
        m = await turn.ws.recv()
        msgs.append(m)
        if isinstance(m, bytes):
            continue
        f = fc.decode_frame(m)
        if f["kind"] == "tool_call":
            calls.append(f)
            await turn.ws.send(fc.encode_frame(await turn.registry(f)))
        elif f["kind"] == "done":
            break
    out = fc.decode_frame(await turn.ws.recv())
    archive = await turn.ws.recv()
    assert out["kind"] == "output" and isinstance(archive, bytes)
    return fc.BlockResult(out["stdout"], out["stderr"], f["exit_code"], out["exit_code"], archive,
                          fc.tar_files(archive) if archive else {}, calls, [], msgs)


def test_undecodable_result_does_not_poison_channel(daemon):
    """§9.2 channel poisoning: an undecodable text during a block is dropped;
    later calls of the same block still work."""
    def handler(turn):
        async def h(frame):
            await turn.ws.send("this is not json")
            await turn.ws.send('{"kind":"tool_result","error":"not-an-object","id":"%s"}' % frame["id"])
            return await turn.registry(frame)
        return h

    async def go():
        turn = await connect(daemon)
        r = await turn.run("from tools import echo\nprint(echo(message=1))\nprint(echo(message=2))",
                           on_tool_call=handler(turn))
        await turn.shutdown()
        return r
    r = arun(go(), T)
    assert r.stdout == "{'echoed': 1}\n{'echoed': 2}\n", r.stderr


# ---- WebSocket level -------------------------------------------------------

def raw_turn_start(port):
    ws = RawWS(port)
    ws.send_binary(fc.tools_archive(fc.ToolRegistry({}).tools.values()))
    return ws


def raw_block(ws, code, timeout=10):
    ws.send_binary(fc.empty_tar())
    ws.send_text(fc.encode_frame({"kind": "run", "code": code}))
    return [fc.decode_frame(x) for x in ws_until_archive(ws, timeout)]


def ws_until_archive(ws, timeout):
    """The text messages of a block, up to its archive after output."""
    msgs = []
    while True:
        m = ws.recv(timeout)
        assert m is not None, f"closed: {ws.close_code} {msgs}"
        msgs.append(m)
        if isinstance(m, bytes) and any(isinstance(x, str) and '"output"' in x for x in msgs):
            return [x for x in msgs if isinstance(x, str)]


def test_invalid_utf8_text_closes_1007(daemon):
    """§1.4: text must be valid UTF-8 (reference: close 1007)."""
    with raw_turn_start(daemon.port) as ws:
        raw_block(ws, "pass")
        ws.send_text(b'{"kind":"log","msg":"\xff\xfe"}\n')
        ws.recv_until_close(5)
        assert (ws.close_code, ws.close_reason) == (1007, "text message not UTF-8")
    assert arun(still_serving(daemon), T)


def test_fragmented_messages_and_interleaved_ping(daemon):
    """§1.4: fragmented messages are reassembled; a ping between fragments is
    answered; a zero-mask client frame is legal."""
    with raw_turn_start(daemon.port) as ws:
        arc = fc.make_tar({"frag.txt": "fragmented"})
        ws.send_frame(ws.OP_BIN, arc[:10], fin=False)
        ws.send_frame(ws.OP_CONT, arc[10:], fin=True, mask=b"\x01\x02\x03\x04")
        run = fc.encode_frame({"kind": "run", "code": "print(open('frag.txt').read())"}).encode()
        ws.send_frame(ws.OP_TEXT, run[:5], fin=False)
        ws.send_frame(ws.OP_PING, b"mid")
        ws.send_frame(ws.OP_CONT, run[5:12], fin=False, mask=b"\xaa\xbb\xcc\xdd")
        ws.send_frame(ws.OP_CONT, run[12:], fin=True)
        got_pong = False
        msgs = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            op, fin, data = ws.recv_frame(10)
            if op == ws.OP_PONG:
                got_pong = got_pong or data == b"mid"
                continue
            if op == ws.OP_CLOSE:
                pytest.fail(f"closed: {data!r}")
            msgs.append((op, data))
            if op == ws.OP_BIN:
                break
        assert got_pong
        frames = [fc.decode_frame(d.decode()) for op, d in msgs if op == ws.OP_TEXT]
        out = [f for f in frames if f["kind"] == "output"][0]
        assert out["stdout"] == "fragmented\n", out


def test_message_of_256_mib_accepted_and_larger_closes_1009(make_daemon):
    """§1.4 / §9.1.19: a 256 MiB message is accepted (a run with a field the
    spec drops: relayed to the sandbox as it arrives and decoded there, in a
    sandbox with room for it); one byte more closes with 1009. (One the
    state ignores would be read at the pace for ignored bytes, 1 MiB/s after
    a burst: it is not one.)"""
    daemon = make_daemon(["--memory", "2G"])
    limit = 256 * 1024 * 1024
    head, tail = b'{"kind":"run","code":"print(\'after big\')","pad":"', b'"}\n'
    big = head + b"a" * (limit - len(head) - len(tail)) + tail
    assert len(big) == limit
    with raw_turn_start(daemon.port) as ws:
        ws.send_binary(fc.empty_tar())
        ws.send_text(big)
        frames = [fc.decode_frame(m) for m in ws_until_archive(ws, 60)]
        assert [f for f in frames if f["kind"] == "output"][0]["stdout"] == "after big\n"
    with raw_turn_start(daemon.port) as ws:
        raw_block(ws, "pass")
        try:
            ws.send_text(big[:-1] + b" \n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        ws.recv_until_close(30)
        assert (ws.close_code, ws.close_reason) == (
            1009, f"message too large: {limit + 1} bytes announced, the limit here is {limit}")
    del big
    assert arun(still_serving(daemon), T)


def test_unmasked_client_frame_closes(daemon):
    """RFC 6455 §5.1: a server must close on an unmasked client frame."""
    with raw_turn_start(daemon.port) as ws:
        raw_block(ws, "pass")
        payload = fc.encode_frame({"kind": "shutdown"}).encode()
        ws.sock.sendall(struct.pack("!BB", 0x81, len(payload)) + payload)
        ws.recv_until_close(5)
        assert (ws.close_code, ws.close_reason) == (1002, "client frame not masked")
    assert arun(still_serving(daemon), T)


# RFC 6455 protocol errors that the WebSocket library would close without a
# status code: the supervisor closes them with 1002 (issue 11, item 7).
PROTOCOL_ERRORS = {
    "control-frame-over-125": struct.pack("!BB", 0x89, 0x80 | 126) + struct.pack("!H", 126)
    + b"\x01\x02\x03\x04" + b"p" * 126,
    "fragmented-ping": struct.pack("!BB", 0x09, 0x80 | 1) + b"\x01\x02\x03\x04" + b"p",
    "one-byte-close-payload": struct.pack("!BB", 0x88, 0x80 | 1) + b"\x00\x00\x00\x00" + b"x",
    "64-bit-length-top-bit": struct.pack("!BB", 0x82, 0x80 | 127) + struct.pack("!Q", 1 << 63)
    + b"\x01\x02\x03\x04",
    # refused by the header check before wslay would (it reports a frame only
    # with its first payload byte): no payload follows these headers
    "continuation-outside-a-message": struct.pack("!BB", 0x80, 0x80 | 100) + b"\x01\x02\x03\x04",
    "new-message-inside-a-fragmented-one": struct.pack("!BB", 0x02, 0x80 | 1) + b"\x01\x02\x03\x04"
    + b"x" + struct.pack("!BB", 0x82, 0x80 | 100) + b"\x01\x02\x03\x04",
    "reserved-bit": struct.pack("!BB", 0xC2, 0x80 | 100) + b"\x01\x02\x03\x04",
    "unknown-opcode": struct.pack("!BB", 0x83, 0x80 | 100) + b"\x01\x02\x03\x04",
}
# The reason net/ws_in.c gives for each.
PROTOCOL_ERROR_REASONS = {
    "control-frame-over-125": "control frame too long or fragmented",
    "fragmented-ping": "control frame too long or fragmented",
    "one-byte-close-payload": "close frame with a 1-byte payload",
    "64-bit-length-top-bit": "frame length over 2^63",
    "continuation-outside-a-message": "continuation frame outside a message",
    "new-message-inside-a-fragmented-one": "new message before the last one ended",
    "reserved-bit": "reserved bits set",
    "unknown-opcode": "unknown opcode",
}


@pytest.mark.parametrize("case", list(PROTOCOL_ERRORS))
def test_protocol_errors_close_1002(daemon, case):
    with raw_turn_start(daemon.port) as ws:
        raw_block(ws, "pass")
        ws.sock.sendall(PROTOCOL_ERRORS[case])
        ws.recv_until_close(5)
        assert (ws.close_code, ws.close_reason) == (1002, PROTOCOL_ERROR_REASONS[case]), case
    assert arun(still_serving(daemon), T)


def test_upload_over_its_limit_refused_at_the_header(daemon):
    """The header of a workspace archive that announces more than the limit
    (100 MiB here) is refused with 1009 as soon as it arrives: the body is
    never sent."""
    with raw_turn_start(daemon.port) as ws:
        raw_block(ws, "pass")
        t0 = time.monotonic()
        ws.sock.sendall(struct.pack("!BB", 0x82, 0x80 | 127) + struct.pack("!Q", 200 << 20)
                        + b"\x01\x02\x03\x04" + b"z")
        ws.recv_until_close(5)
        assert (ws.close_code, ws.close_reason) == (
            1009, f"message too large: {200 << 20} bytes announced, the limit here is {100 << 20}")
        assert time.monotonic() - t0 < 3
    assert arun(still_serving(daemon), T)


def test_tools_upload_over_its_limit_refused_at_the_header(daemon):
    """The same for the first message, the tools archive (limit 100 MiB),
    with not even one byte of its body sent."""
    ws = RawWS(daemon.port)
    t0 = time.monotonic()
    ws.sock.sendall(struct.pack("!BB", 0x82, 0x80 | 127) + struct.pack("!Q", 101 << 20)
                    + b"\x01\x02\x03\x04")
    ws.recv_until_close(5)
    assert (ws.close_code, ws.close_reason) == (
        1009, f"message too large: {101 << 20} bytes announced, the limit here is {100 << 20}")
    assert time.monotonic() - t0 < 3
    assert arun(still_serving(daemon), T)


def test_upload_fragments_over_the_limit_refused_at_the_fragment_header(make_daemon):
    """A fragmented upload is refused at the header of the fragment that takes
    it past the limit (1 MiB here), before any of that fragment's body: the
    first fragment is a real tar.gz prefix, the second is announced only."""
    d = make_daemon(["--max-upload-workspace", "1M"])
    big = fc.make_tar({"blob.bin": os.urandom(2 << 20)})
    first = big[:700 << 10]
    with raw_turn_start(d.port) as ws:
        raw_block(ws, "pass")
        ws.send_frame(RawWS.OP_BIN, first, fin=False)
        t0 = time.monotonic()
        ws.sock.sendall(struct.pack("!BB", 0x80 | RawWS.OP_CONT, 0x80 | 127)
                        + struct.pack("!Q", 700 << 10) + b"\0\0\0\0")
        ws.recv_until_close(5)
        # announced: both fragments together
        assert (ws.close_code, ws.close_reason) == (
            1009, f"message too large: {2 * (700 << 10)} bytes announced, the limit here is {1 << 20}")
        assert time.monotonic() - t0 < 3
    assert arun(still_serving(d), T)


def vm_hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))


def test_an_upload_is_held_once(make_daemon):
    """The supervisor holds one copy of an upload, not the message plus a
    copy for the sandbox: its peak RSS grows by about the upload's size
    (880490b: twice it)."""
    d = make_daemon([])
    size = 48 << 20
    upload = fc.make_tar({"blob.bin": os.urandom(size)})
    code = "import os\nprint(os.path.getsize('/workspace/blob.bin'))\nos.remove('/workspace/blob.bin')"
    before = vm_hwm_kib(d.pid)

    async def go():
        async with await connect(d) as turn:
            r = await turn.run(code, upload)
            assert r.stdout.strip() == str(size), r.stderr
    arun(go(), T)
    grew = (vm_hwm_kib(d.pid) - before) << 10
    assert grew < 1.4 * len(upload), f"peak RSS grew by {grew >> 20} MiB for a {len(upload) >> 20} MiB upload"


# ---- hostile sandbox -------------------------------------------------------

def forge(payload_expr: str, then: str = "import time\ntime.sleep(0.5)\nprint('after forge')") -> str:
    return FORGE_PRELUDE + f"""
_data = {payload_expr}
_fds = _chan_fds()
for _fd in _fds:
    try:
        os.write(_fd, _data)
    except OSError:
        pass
{then}
"""


FORGERIES = {
    "garbage": "b'garbage!' * 8",
    "bad-type": repr(chan_envelope(b"Z", b"{}")),
    "huge-length": repr(b"F\0\0\0" + struct.pack("<I", 0xFFFFFFF0) + b"{"),
    "done": repr(chan_envelope(b"F", b'{"exit_code":0,"kind":"done"}\n')),
    "output": repr(chan_envelope(b"F", b'{"stdout":"forged","stderr":"","exit_code":0,"kind":"output"}\n')),
    "done-output-snapshot": repr(chan_envelope(b"F", b'{"exit_code":0,"kind":"done"}\n')
                                 + chan_envelope(b"F", b'{"stdout":"forged","stderr":"","exit_code":0,"kind":"output"}\n')
                                 + chan_envelope(b"S", fc.empty_tar())),
    "snapshot": repr(chan_envelope(b"S", fc.empty_tar())),
    "ready": repr(chan_envelope(b"F", b'{"kind":"ready","protocol_version":2,"python_version":"3","packages":{}}\n')),
    "bad-json": repr(chan_envelope(b"F", b'{"kind":"done",')),
    "tools-archive": repr(chan_envelope(b"T", b"")),
}
# The supervisor's close reason for each. A forged done (or done, output and
# snapshot) is taken as the block's: the fault is the real done that follows.
FORGED_REASONS = {
    "garbage": "bad envelope",
    "bad-type": "bad envelope",
    "huge-length": "message too large",
    "done": "unexpected done frame in state X (awaiting output)",
    "output": "unexpected output frame in state X (block running)",
    "done-output-snapshot": "unexpected done frame in state B (between blocks)",
    "snapshot": "unexpected 'S' message in state X (block running)",
    "ready": "unexpected ready frame in state X (block running)",
    "bad-json": "invalid JSON",
    "tools-archive": "unexpected 'T' message in state X (block running)",
}


def test_sandbox_sees_a_single_channel_socket(daemon):
    """The channel is the only fd besides 0/1/2 that is a socket (the forging
    tests below rely on finding it)."""
    async def go():
        turn = await connect(daemon)
        r = await turn.run(FORGE_PRELUDE + "print(len(_chan_fds()))")
        await turn.shutdown()
        return r
    r = arun(go(), T)
    assert r.stdout == "1\n", r.stderr


@pytest.mark.parametrize("what", list(FORGERIES))
def test_forged_channel_messages_end_turn(daemon, what):
    """§9.2 no isolation: bytes the user code writes to its channel socket can
    at most end its own turn with an error (1011); the daemon keeps serving."""
    async def go():
        turn = await connect(daemon)
        await turn.run("pass")
        await turn.ws.send(fc.empty_tar())
        await turn.ws.send(fc.encode_frame({"kind": "run", "code": forge(FORGERIES[what])}))
        t0 = time.monotonic()
        code, reason, msgs = await expect_closed(turn.ws, 10)
        return code, reason, msgs, time.monotonic() - t0
    code, reason, msgs, took = arun(go(), T)
    assert (code, reason) == (1011, "sandbox protocol error: " + FORGED_REASONS[what]), msgs
    frames = text_frames(msgs)
    for f in frames:
        assert f["kind"] in ("log", "done", "output", "tool_call"), f
        if f["kind"] == "log":
            assert f["level"] == "error"
    # the forged output never reaches the host as the block's output unless a
    # done preceded it from the same forgery (then the real done is the fault)
    assert arun(still_serving(daemon), T)


@pytest.mark.parametrize("crash,why", [
    ("import os\nos._exit(3)", "sandbox exited: status 3"),
    ("import ctypes\nctypes.string_at(0)", "sandbox crashed: SIGSEGV in the runtime or native code"),
    ("import os, threading, time\n"
     "threading.Thread(target=lambda: os._exit(0)).start()\ntime.sleep(2)", "sandbox exited: status 0"),
    ("import os\nos.abort()", "sandbox crashed: SIGABRT in the runtime or native code")],
    ids=["os._exit", "segfault", "exit-0-from-thread", "abort"])
def test_sandbox_crash_mid_block_ends_turn(daemon, crash, why):
    """A sandbox that dies mid-block ends its turn with an error (log error
    frame optional, then 1011 and the cause); the daemon keeps serving."""
    async def go():
        turn = await connect(daemon)
        r0 = await turn.run("x = 1")
        await turn.ws.send(fc.empty_tar())
        await turn.ws.send(fc.encode_frame({"kind": "run", "code": "print('before')\n" + crash}))
        t0 = time.monotonic()
        code, reason, msgs = await expect_closed(turn.ws, 10)
        return r0, code, reason, msgs, time.monotonic() - t0
    r0, code, reason, msgs, took = arun(go(), T)
    assert r0.exit_code == 0
    assert (code, reason) == (1011, why), msgs
    assert took < 5
    for f in text_frames(msgs):
        assert f["kind"] == "log" and f["level"] == "error", f
    assert arun(still_serving(daemon), T)


def test_sigkill_self_is_harmless(daemon):
    """SIGKILL to itself: the runtime is pid 2 of its pid namespace (under the
    sandbox's init), so the signal kills it and ends only its own turn, with
    1011 and the cause; the daemon keeps serving."""
    async def go():
        turn = await connect(daemon)
        try:
            r = await turn.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\nprint('alive')")
        except fc.TurnClosed as e:
            return e.code, e.reason
        finally:
            await turn.shutdown()
        raise AssertionError(f"the block completed: {r!r}")
    assert arun(go(), T) == (1011, "sandbox killed: SIGKILL")
    assert arun(still_serving(daemon), T)


def test_user_code_cannot_reach_the_network(daemon):
    """§9.2 isolation: user code has no route to the daemon's listening port."""
    code = f"""
import socket
try:
    s = socket.create_connection(("127.0.0.1", {daemon.port}), timeout=2)
    print("connected")
except Exception as e:
    print("blocked", type(e).__name__)
"""
    async def go():
        turn = await connect(daemon)
        r = await turn.run(code)
        await turn.shutdown()
        return r
    r = arun(go(), T)
    assert r.stdout.startswith("blocked"), (r.stdout, r.stderr)


# ---- nesting (one limit for every peer: proto/jscan.h, JSCAN_MAX_DEPTH) ------

NESTED_CALL = ("from tools import echo\nv = []\nfor _ in range({levels} - 1):\n    v = [v]\n"
               "echo(message=v)\nprint('relayed')")


def test_tool_call_nesting_limit(daemon):
    """A tool_call is {..."args":{"message":V}}: V nested 510 deep is 512
    levels, the limit, relayed to a host that decodes it; one more (or 900,
    which reached the host before, as deep as the reference's json decodes
    with ~90 frames of its own stack) ends the turn before the host sees it."""
    async def go(levels):
        turn = await connect(daemon)
        try:
            r = await turn.run(NESTED_CALL.format(levels=levels))
            await turn.shutdown()
            return r, None
        except fc.TurnClosed as e:
            return None, (e.code, e.reason)
    r, closed = arun(go(510), T)
    assert closed is None and r.exit_code == 0 and r.stdout == "relayed\n", (r, closed)
    assert [c["name"] for c in r.tool_calls] == ["echo"]
    for levels in (511, 900):
        r, closed = arun(go(levels), T)
        assert closed == (1011, "sandbox protocol error: JSON nested too deeply"), (levels, r, closed)
    assert arun(still_serving(daemon), T)
