"""Every turn the server ends reaches the client as a close frame with its
reason (issue 26): the closing handshake of RFC 6455 7.1.1, and the 101 before
anything that follows it.

* A host pipelines: the reference host sends the workspace archive and `run`
  back to back, without reading. When forkboxd closed the TCP connection as
  soon as its close frame was written, those late bytes drew a reset, the
  client's write failed before it read the close, and websockets reported 1006
  "no close frame received or sent" instead of the code and reason forkboxd
  logged (about half the turns here). The server now reads and discards until
  the client's own close frame, then closes.
* A raw client that keeps writing after the server decided to close reads the
  close frame once it reads, and the connection ends with a FIN, not a reset.
* An upgrade followed in the same write by bytes that are not a frame gets its
  101 first, then close 1002 (it used to get a close frame where the HTTP
  status line should be).
"""

import asyncio
import random
import socket
import struct
import time

import forkbox_client as fc
from faults import Holdings, host_mounts, record
from fbtest import RawWS, arun, upgrade_request, ws_key

TURNS, AT_ONCE = 16, 8


async def pipelined_turns(url: str, tools: bytes | None, workspace: bytes) -> list:
    """TURNS host-like turns, AT_ONCE at a time: tools archive, then the
    workspace archive and run back to back (tools/forkbox_client.py, as the
    reference host); what each one's close said."""
    sem = asyncio.Semaphore(AT_ONCE)

    async def one():
        async with sem:
            turn = await fc.Turn.connect(url, {}, tools_bytes=tools)
            try:
                await turn.run("print(1)", workspace=workspace)
                return ("ran", None, "")
            except fc.TurnClosed as e:
                return (e.stage, e.code, e.reason)
            finally:
                await turn.ws.close()
    return await asyncio.gather(*(one() for _ in range(TURNS)))


def test_pipelined_archive_over_its_limit_gets_1009_and_its_reason(make_daemon):
    """The workspace archive is refused at its header (1009) while its 2 MB
    and the run frame are still being sent."""
    mounts = host_mounts()
    d = make_daemon(["--capacity", str(AT_ONCE), "--max-upload-workspace", "64K"])
    held = Holdings(d, mounts)
    big = bytes(range(256)) * (2_000_000 // 256)
    ends = arun(pipelined_turns(d.url, None, big), 90)
    record(f"host pipelines a 2 MB workspace archive (over its 64K limit) and run ({TURNS} turns)",
           [f"{e[1]} {e[2][:40]}" for e in ends], held.left_after_stop(), "n/a")
    bad = [e for e in ends if e[1] != 1009]
    assert not bad, f"{len(bad)} of {TURNS} turns did not see close 1009: {bad}"
    assert all("message too large" in e[2] for e in ends), ends


def test_pipelined_bad_tools_archive_gets_1011_and_its_reason(make_daemon):
    """The tools archive is not gzip: the sandbox says so and the turn ends
    (1011) while the client sends its workspace archive and run."""
    mounts = host_mounts()
    d = make_daemon(["--capacity", str(AT_ONCE)])
    held = Holdings(d, mounts)
    ws = fc.make_tar({"data.bin": random.Random(26).randbytes(300_000)})  # as it compresses
    ends = arun(pipelined_turns(d.url, b"not a gzip archive" * 8, ws), 90)
    record(f"host pipelines a 300 KB workspace archive and run after a bad tools archive "
           f"({TURNS} turns)", [f"{e[1]} {e[2][:40]}" for e in ends], held.left_after_stop(), "n/a")
    bad = [e for e in ends if e[1] != 1011]
    assert not bad, f"{len(bad)} of {TURNS} turns did not see close 1011: {bad}"
    assert all("tools archive" in e[2] for e in ends), ends


def _frame(opcode: int, payload: bytes, announce: int | None = None) -> bytes:
    """A masked client frame (zero key: the payload as is); announce: the
    length its header gives, if not the payload's."""
    n = len(payload) if announce is None else announce
    if n < 126:
        hdr = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 65536:
        hdr = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        hdr = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    return hdr + b"\0\0\0\0" + payload


def test_raw_client_that_keeps_writing_reads_the_close(make_daemon):
    """A client announces a 1 MiB tools archive (over --max-upload-tools 64K)
    and goes on writing it, and then more, for half a second before it reads:
    every write succeeds (the server reads and discards), it then finds close
    1009 with the reason, sends its own close, and gets a FIN."""
    d = make_daemon(["--max-upload-tools", "64K"])
    ws = RawWS(d.port)
    seen = []
    try:
        sock = ws.sock
        body = 1 << 20
        try:
            sock.sendall(_frame(2, b"", announce=body))
            chunk = b"\0" * 65536
            for _ in range(body // len(chunk)):
                sock.sendall(chunk)  # raises on a reset
                time.sleep(0.02)
            for _ in range(8):  # frames after the refused message, as a pipelining host's
                sock.sendall(_frame(2, b"x" * 16384))
            seen.append("every write taken")
        except OSError as e:
            seen.append(f"write failed: {e!r}")
        try:
            got = ws.recv(10)
            seen.append(f"{ws.close_code} {ws.close_reason}" if got is None else "a message")
            sock.sendall(_frame(8, struct.pack("!H", 1000)))
            sock.settimeout(10)
            seen.append("FIN" if sock.recv(65536) == b"" else "more bytes")
        except OSError as e:
            seen.append(f"read failed: {e!r}")
        record("raw client writes 1.1 MiB after its upload is refused (1009), then reads", seen,
               [], "n/a")
        assert seen == ["every write taken", "1009 message too large: 1048576 bytes announced, "
                        "the limit here is 65536", "FIN"], seen
    finally:
        ws.close()


def test_upgrade_then_garbage_gets_101_then_1002(make_daemon):
    """The upgrade request and bytes that are not a WebSocket frame in one
    write: the 101 comes first, then close 1002 with its reason."""
    d = make_daemon()
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        s.sendall(upgrade_request(key=ws_key()) + b"GARBAGE\r\n\r\n")
        data = b""
        deadline = time.monotonic() + 10
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < 4:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        record("upgrade request and GARBAGE in one write", [repr(data[:24])], [], "n/a")
        assert data.startswith(b"HTTP/1.1 101 "), data[:80]
        frame = data.partition(b"\r\n\r\n")[2]
        assert frame[0] == 0x88, frame
        n = frame[1] & 0x7F
        while len(frame) < 2 + n:
            chunk = s.recv(65536)
            if not chunk:
                break
            frame += chunk
        assert struct.unpack("!H", frame[2:4])[0] == 1002, frame
        assert frame[4:2 + n] == b"reserved bits set", frame
