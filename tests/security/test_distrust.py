"""The supervisor distrusts its sandboxes (issue 11, items 1 and 2): model code
that finds its channel socket and writes its own envelopes gains nothing.

* A forged workspace archive (setuid or world-writable members owned by root,
  links, devices, `..` paths, a gzip bomb, trailing bytes) never reaches the
  host: the host gets a zero-length archive in its place (its files stay as
  they were) and the turn ends with 1011.
* A forged output frame is held to --output-cap (head and tail kept, with a
  note), whatever the sandbox claims.
* Close reasons come from the supervisor's own vocabulary: text a sandbox
  writes (in a log frame before it exits, say) never becomes a close reason.
* A message is refused at its envelope header when its type or length is not
  legal in the turn's state (a 256 MiB frame announced between blocks ends
  the turn at once, nothing is buffered).
* Memory: each turn's buffers are charged to --turn-buffer and all turns' to
  --total-buffer: a large message is relayed a window at a time; what cannot
  be held (a message held whole over the turn's budget, a window over what
  is left of the daemon's) ends that turn with a clear close (1011 / 1013),
  the daemon does not grow, and other turns go on.
* The sandbox's log lines between blocks reach the operator log rate-limited.
"""

import asyncio
import gzip
import io
import json
import os
import struct
import tarfile
import time

import pytest

import sbx
from test_channel import FIND_CHAN, _rss_mb

CAP = 64 * 1024
ARGS = ["--capacity", "8", "--pool", "0", "--block-timeout", "60", "--output-cap", "64K"]


@pytest.fixture(scope="module")
def daemon():
    with sbx.Daemon(ARGS) as d:
        yield d


def _run_to_close(d, code, timeout=90):
    """One block, then wait for the server to close the turn (up to 10 s)."""
    async def go():
        t = await sbx.Turn.open(d)
        await t.run(code)
        if not t.result.closed_by_server:
            await t.wait_closed(10)
        if not t.result.closed_by_server:
            await t.close()
        return t.result
    return sbx.arun(go(), timeout)


def _archive_code(build: str) -> str:
    """Block code that forges done, output and a snapshot built by `build`
    (Python that sets `data` to the archive bytes), then waits."""
    return sbx.prelude(FIND_CHAN + r'''
import gzip, io, tarfile
''' + build + r'''
send("F", b'{"exit_code":0,"kind":"done"}\n')
send("F", b'{"stdout":"forged\\n","stderr":"","exit_code":0,"kind":"output"}\n')
send("S", data)
time.sleep(20)
''')


def _tar(members) -> str:
    """Python source building a gzip tar from (TarInfo kwargs, payload) pairs.
    ustar, as the sandbox writes it: a GNU header would be refused for its magic
    before the check an attack is aimed at."""
    return f'''
bio = io.BytesIO()
with tarfile.open(fileobj=bio, mode="w:gz", format=tarfile.USTAR_FORMAT) as tf:
    for kw, payload in {members!r}:
        ti = tarfile.TarInfo(kw.pop("name"))
        for k, v in kw.items():
            setattr(ti, k, v)
        ti.size = len(payload) if ti.type in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
        tf.addfile(ti, io.BytesIO(payload) if ti.size else None)
data = bio.getvalue()
'''


FORGED_ARCHIVES = {
    "setuid_root": _tar([({"name": "evil", "mode": 0o4755, "uid": 0, "gid": 0},
                         b"#!/bin/sh\nid\n")]),
    "owner_names": _tar([({"name": "f", "mode": 0o644, "uname": "root", "gname": "root"}, b"x")]),
    "setgid": _tar([({"name": "evil", "mode": 0o2755}, b"x")]),
    "world_writable": _tar([({"name": "w", "mode": 0o666}, b"x")]),
    "owned_by_someone": _tar([({"name": "f", "mode": 0o644, "uid": 1000, "gid": 1000}, b"x")]),
    "symlink": _tar([({"name": "link", "type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}, b"")]),
    "hardlink": _tar([({"name": "a", "mode": 0o644}, b"x"),
                      ({"name": "b", "type": tarfile.LNKTYPE, "linkname": "a"}, b"")]),
    "device": _tar([({"name": "dev", "type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3}, b"")]),
    "dotdot": _tar([({"name": "../escape", "mode": 0o644}, b"x")]),
    "absolute": _tar([({"name": "/etc/cron.d/x", "mode": 0o644}, b"x")]),
    # 300 MiB of zeros in ~300 KiB: past --snapshot-max (100M)
    "gzip_bomb": r'''
z = b"\0" * (1 << 20)
raw = io.BytesIO()
with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9) as g:
    hdr = tarfile.TarInfo("bomb")
    hdr.size = 300 << 20
    hdr.mode = 0o644
    g.write(hdr.tobuf(format=tarfile.USTAR_FORMAT))
    for _ in range(300):
        g.write(z)
    g.write(b"\0" * 1024)
data = raw.getvalue()
''',
    "trailing_garbage": _tar([({"name": "f", "mode": 0o644}, b"x")]) + "data += b'junk'\n",
    "not_gzip": "data = b'plain bytes, not an archive'\n",
}


# Why the supervisor refuses each (after "sandbox workspace archive refused: ").
FORGED_ARCHIVE_REASONS = {
    "setuid_root": "tar: mode has bits outside 0755",
    "owner_names": "tar: owner names not empty",
    "setgid": "tar: mode has bits outside 0755",
    "world_writable": "tar: mode has bits outside 0755",
    "owned_by_someone": "tar: owner not uid/gid 0",
    "symlink": "tar: link name not empty",
    "hardlink": "tar: link name not empty",
    "device": "tar: device numbers not 0",
    "dotdot": "tar: path not relative, clean, UTF-8 text",
    "absolute": "tar: path not relative, clean, UTF-8 text",
    "gzip_bomb": "tar: more file data than the limit",
    "trailing_garbage": "gzip: bytes after the last member",
    "not_gzip": "gzip: not gzip",
}


@pytest.mark.parametrize("attack", list(FORGED_ARCHIVES))
def test_forged_snapshot_never_reaches_the_host(daemon, attack):
    r = _run_to_close(daemon, _archive_code(FORGED_ARCHIVES[attack]))
    b = r.last
    assert b.done_exit == 0 and b.stdout == "forged\n", f"{attack}: {r!r}"
    # the slot after output: a zero-length archive, never the forged bytes
    assert b.archive == b"", f"{attack}: host received {len(b.archive or b'')} archive bytes: {r!r}"
    assert r.closed_by_server, f"{attack}: {r!r}"
    assert (r.close_code, r.close_reason) == (
        1011, "sandbox workspace archive refused: " + FORGED_ARCHIVE_REASONS[attack])
    ok, why = daemon.fresh_turn_ok()
    assert ok, why


def test_honest_snapshot_with_odd_modes_is_relayed_masked(daemon):
    """Files with modes the check refuses in an archive (0666, 0777, setuid) are
    written by the honest snapshot with the bits masked, and relayed."""
    code = r'''
import os
for name, mode in (("rw", 0o666), ("rwx", 0o777), ("suid", 0o4755), ("ro", 0o400)):
    with open(name, "w") as f:
        f.write(name)
    os.chmod(name, mode)
print("ok")
'''
    r = daemon.run(code, timeout=60)
    b = r.last
    assert b.completed and b.stdout == "ok\n", repr(r)
    with tarfile.open(fileobj=io.BytesIO(b.archive), mode="r:gz") as tf:
        modes = {m.name: m.mode for m in tf.getmembers()}
    assert set(modes) == {"rw", "rwx", "suid", "ro"}, modes
    assert all(m & ~0o755 == 0 for m in modes.values()), {k: oct(v) for k, v in modes.items()}


def _forged_output(stdout_expr: str) -> str:
    return sbx.prelude(FIND_CHAN + r'''
big = ''' + stdout_expr + r'''
frame = json.dumps({"stdout": big, "stderr": "", "exit_code": 0, "kind": "output"},
                   separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
send("F", b'{"exit_code":0,"kind":"done"}\n')
send("F", frame)
send("S", b"")
time.sleep(20)
''')


@pytest.mark.parametrize("name,expr", [
    ("ascii", '"A" * (4 * 64 * 1024) + "END"'),
    ("multibyte", '"\\u00e9" * (2 * 64 * 1024) + "END"'),
    ("escapes", '"\\u0001" * (96 * 1024) + "END"'),
])
def test_forged_output_is_held_to_output_cap(daemon, name, expr):
    """Over the cap but within what an output frame may take on the channel:
    cut to head and tail with a note."""
    r = _run_to_close(daemon, _forged_output(expr))
    b = r.last
    assert b.done_exit == 0 and b.exit_code == 0, repr(r)
    out = b.stdout.encode()
    assert len(out) <= CAP + 200, f"{name}: stdout of {len(out)} bytes relayed past a {CAP} cap"
    assert "bytes of stdout dropped" in b.stdout, b.stdout[:200]
    assert b.stdout.endswith("END"), b.stdout[-50:]  # the tail is kept
    assert len(out) >= CAP // 2, len(out)


def test_forged_output_larger_than_any_capped_frame_ends_the_turn(daemon):
    """An output frame longer than two capped streams could ever encode to is
    refused at its envelope header."""
    r = _run_to_close(daemon, _forged_output('"A" * (4 << 20)'))
    assert r.last.done_exit == 0 and r.last.exit_code is None, repr(r)
    assert r.closed_by_server, repr(r)
    assert (r.close_code, r.close_reason) == (
        1011, "sandbox protocol error: 'F' message of 4194360 bytes over the limit of 835840 "
        "in state X (awaiting output)")


VOCAB_CODE = sbx.prelude(FIND_CHAN + r'''
import threading
evil = "tools archive: SECRET-FROM-THE-SANDBOX \u202e<script>" + "x" * 300
def later():
    time.sleep(1.0)  # between blocks: the supervisor logs it and keeps what it means
    send("F", json.dumps({"level": "error", "msg": evil, "kind": "log"}).encode() + b"\n")
    time.sleep(0.5)
    os._exit(3)
threading.Thread(target=later, daemon=True).start()
print("ok")
''')


def test_close_reason_never_carries_sandbox_text(daemon):
    """A sandbox's error report before it exits picks one of the supervisor's
    own close reasons; its text goes to the operator log only."""
    async def go():
        t = await sbx.Turn.open(daemon)
        b = await t.run(VOCAB_CODE)
        await t.wait_closed(10)
        return b, t.result
    b, r = sbx.arun(go(), 60)
    assert b.completed and b.stdout == "ok\n", repr(b)
    assert r.closed_by_server and r.close_code == 1011, repr(r)
    assert r.close_reason == "the tools archive could not be extracted", r.close_reason
    assert "SECRET-FROM-THE-SANDBOX" in daemon.stderr(10 ** 6)  # the operator sees it, escaped


def test_frame_announced_over_the_state_limit_ends_the_turn_at_once(daemon):
    """Between blocks only small frames are legal: a 256 MiB announcement is
    refused at the header (nothing is read or buffered)."""
    code = sbx.prelude(FIND_CHAN + r'''
import threading
def later():
    time.sleep(1.0)  # after done/output/archive: the turn is between blocks
    os.write(CHAN, b"F\0\0\0" + struct.pack("<I", (256 << 20)) + b"{")
    time.sleep(30)
threading.Thread(target=later, daemon=True).start()
print("ok")
''')

    async def go():
        t = await sbx.Turn.open(daemon)
        b = await t.run(code)
        t0 = time.monotonic()
        await t.wait_closed(10)
        return b, t.result.close_code, t.result.close_reason, time.monotonic() - t0
    base = _rss_mb(daemon.pid)
    b, code_, reason, took = sbx.arun(go(), 60)
    assert b.completed and b.stdout == "ok\n", repr(b)
    assert (code_, reason) == (1011, f"sandbox protocol error: 'F' message of {256 << 20} bytes "
                                     f"over the limit of {4 << 20} in state B (between blocks)")
    assert took < 5, took
    assert _rss_mb(daemon.pid) - base < 32


def test_turn_buffer_bounds_a_window_not_a_message():
    """--turn-buffer 24M: a 40 MiB tool_call (it was refused at its header)
    is relayed as it arrives, a window of it held at a time, and arrives
    whole; the supervisor never holds it."""
    d = sbx.Daemon(ARGS + ["--turn-buffer", "24M"]).start()
    try:
        code = sbx.prelude(FIND_CHAN + r'''
body = b'{"id":"big","name":"echo","args":{"m":"' + b"A" * (40 << 20) + b'"},"timeout":null,"kind":"tool_call"}\n'
send("F", body)
print("sent")
''')
        base = _rss_mb(d.pid)
        r = d.run(code, timeout=60)
        assert r.last.completed and r.last.stdout == "sent\n", repr(r)
        assert [len(c["args"]["m"]) for c in r.last.tool_calls] == [40 << 20]
        if not sbx.UNDER_ASAN:
            assert _rss_mb(d.pid) - base < 32
        ok, why = d.fresh_turn_ok()
        assert ok, why
    finally:
        d.stop()


def test_turn_buffer_refuses_a_message_held_whole():
    """--turn-buffer 2M: a 3 MiB log between blocks (held whole: it goes to
    the operator log, never to the client) does not fit: refused at its
    header with a clear reason, nothing held."""
    d = sbx.Daemon(ARGS + ["--turn-buffer", "2M"]).start()
    try:
        code = sbx.prelude(FIND_CHAN + r'''
import threading
def later():
    time.sleep(0.5)  # between blocks
    send("F", b'{"level":"info","msg":"' + b"A" * (3 << 20) + b'","kind":"log"}\n')
threading.Thread(target=later, daemon=True).start()
print("ok")
''')
        base = _rss_mb(d.pid)

        async def go():
            t = await sbx.Turn.open(d)
            b = await t.run(code)
            await t.wait_closed(10)
            return b, t.result
        b, r = sbx.arun(go(), 60)
        assert b.completed and b.stdout == "ok\n", repr(b)
        assert (r.close_code, r.close_reason) == (1011, "sandbox message over the turn's memory budget")
        if not sbx.UNDER_ASAN:
            assert _rss_mb(d.pid) - base < 32
        ok, why = d.fresh_turn_ok()
        assert ok, why
    finally:
        d.stop()


def test_total_buffer_is_shared_and_exhaustion_ends_only_the_asking_turn():
    """--total-buffer 16M, --turn-buffer 16M (a window of 4 MiB each way).
    Turns A1-A3 relay a 30 MiB tool_call each to a client that does not read
    it: a window of each stays charged, most of the 16 MiB. Turn B does the
    same: its window does not fit in what is left, and B is closed with 1013
    (try again later) as it is relayed; the A turns are untouched and
    complete once their clients read, and a fresh turn runs."""
    d = sbx.Daemon(ARGS + ["--turn-buffer", "16M", "--total-buffer", "16M"]).start()
    big = sbx.prelude(FIND_CHAN + r'''
body = b'{"id":"big","name":"echo","args":{"m":"' + b"A" * (30 << 20) + b'"},"timeout":null,"kind":"tool_call"}\n'
send("F", body)
print("sent")
''')
    try:
        async def stalled_turn(stall: asyncio.Event, go_on: asyncio.Event):
            t = await sbx.Turn.open(d)
            await t.ws.send(sbx.EMPTY_TGZ)
            await t.ws.send(json.dumps({"code": big, "kind": "run"}) + "\n")
            t.ws.transport.pause_reading()  # read nothing until told
            stall.set()
            await go_on.wait()
            t.ws.transport.resume_reading()
            b = sbx.BlockResult()
            while (m := await t._recv()) is not None:
                if isinstance(m, bytes):
                    if b.exit_code is not None:
                        b.archive, b.completed = m, True
                        break
                    continue
                f = json.loads(m)
                if f["kind"] == "tool_call":
                    b.tool_calls.append(f)
                elif f["kind"] == "done":
                    b.done_exit = f["exit_code"]
                elif f["kind"] == "output":
                    b.stdout, b.exit_code = f["stdout"], f["exit_code"]
            await t.close()
            return b, t.result

        async def both():
            go_a, go_b = asyncio.Event(), asyncio.Event()
            stalls = [asyncio.Event() for _ in range(4)]
            tasks = []
            for k in range(3):
                tasks.append(asyncio.create_task(stalled_turn(stalls[k], go_a)))
                await stalls[k].wait()
            await asyncio.sleep(3)  # their windows are in the supervisor's queues
            tb = asyncio.create_task(stalled_turn(stalls[3], go_b))
            await stalls[3].wait()
            await asyncio.sleep(3)
            go_b.set()
            b_block, b_turn = await tb
            go_a.set()
            return b_turn, [await t for t in tasks]
        b_turn, a = sbx.arun(both(), 120)
        assert (b_turn.close_code, b_turn.close_reason) == (
            1013, "server memory budget exhausted, try again later"), repr(b_turn)
        for ba, _ in a:
            assert ba.completed and ba.stdout == "sent\n", repr(ba)
            assert [c["id"] for c in ba.tool_calls] == ["big"]
        ok, why = d.fresh_turn_ok()
        assert ok, why
    finally:
        d.stop()


def test_log_flood_between_blocks_is_rate_limited_in_the_operator_log(daemon):
    code = sbx.prelude(FIND_CHAN + r'''
import threading
line = b'{"level":"info","msg":"FLOOD-LINE","kind":"log"}\n'
env = b"F\0\0\0" + struct.pack("<I", len(line)) + line
def flood():
    time.sleep(0.5)
    t0 = time.time()
    while time.time() - t0 < 3:
        os.write(CHAN, env * 64)
threading.Thread(target=flood, daemon=True).start()
print("ok")
''')
    before = daemon.stderr(10 ** 7).count("FLOOD-LINE")

    async def go():
        t = await sbx.Turn.open(daemon)
        b = await t.run(code)
        await asyncio.sleep(4.5)
        b2 = await t.run("print(2)")
        await t.close()
        return b, b2
    b, b2 = sbx.arun(go(), 60)
    assert b.completed and b2.completed and b2.stdout == "2\n", (b, b2)
    lines = daemon.stderr(10 ** 7).count("FLOOD-LINE") - before
    assert 1 <= lines <= 40, f"{lines} sandbox log lines in the operator log"
