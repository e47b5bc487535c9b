"""Resource exhaustion, each bounded by small limits, and after each one the daemon
still answers /health and runs a fresh turn.

Daemon limits here: --memory 256M --pids 64 --tmpfs-size 64M --block-timeout 5
--output-cap 64K. Outcomes asserted:

* fork loop -> BlockingIOError (EAGAIN) before 64 processes;
* classic fork bomb -> block timeout (done 124, close 1000 naming it); under
  ASan its quarantine may reach memory.max first (OOM kill, log error + close
  1011); no process of the turn survives on the host;
* thread loop -> RuntimeError("can't start new thread") before 64 threads;
* memory bomb -> the sandbox OOM-killed at the cgroup's memory.max (log error
  + close 1011 naming it; no RLIMIT_AS, so Python never sees MemoryError);
* filling /workspace, /tmp, /dev/shm -> OSError ENOSPC within ~64M;
* fd loop -> OSError EMFILE;
* CPU spin and sleep -> done exit 124 with a time-limit stderr, then close;
* output flood (print, fd 1, stderr) -> the stream kept under the cap with a
  "[forkbox: N bytes of ... dropped]" note.
"""

import asyncio as asio
import hashlib
import re

import pytest

import sbx

MEM = 256 << 20
PIDS = 64
TMPFS = 64 << 20
BLOCK_TIMEOUT = 5
OUTPUT_CAP = 64 << 10
ARGS = ["--capacity", "8", "--memory", "256M", "--pids", str(PIDS), "--tmpfs-size", "64M",
        "--block-timeout", str(BLOCK_TIMEOUT), "--turn-timeout", "60", "--output-cap", "64K", "--pool", "0"]
TIME_LIMIT_RE = re.compile(r"time limit", re.I)
# How the supervisor ends a turn whose block ran into --block-timeout.
BLOCK_TIMEOUT_CLOSE = (1000, f"block timeout: the block ran longer than {BLOCK_TIMEOUT} s (--block-timeout)")
# ... and one whose sandbox the kernel OOM-killed at memory.max (close 1011).
OOM_CLOSE_REASON = f"out of memory: the sandbox was killed at its memory limit ({MEM >> 20} MiB)"
DROPPED_RE = re.compile(r"\[forkbox: (\d+) bytes of (stdout|stderr) dropped\]")


@pytest.fixture(scope="module")
def small_daemon():
    with sbx.Daemon(ARGS) as d:
        yield d


def _after(d: sbx.Daemon):
    ok, why = d.fresh_turn_ok()
    assert ok, why


def _killed(r: sbx.TurnResult, reason: str) -> bool:
    """The sandbox was killed by a limit: a log error frame and close 1011."""
    return (r.closed_by_server and (r.close_code, r.close_reason) == (1011, reason)
            and any(f.get("level") == "error" for f in r.logs))


def _timed_out(b: sbx.BlockResult) -> bool:
    return b.done_exit == 124 and b.exit_code == 124 and bool(TIME_LIMIT_RE.search(b.stderr))


# --------------------------------------------------------------------------- processes

FORK_LOOP = r'''
import os, time
pids, err = [], None
try:
    while len(pids) < 10000:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        pids.append(pid)
except OSError as e:
    err = e
for p in pids:
    os.kill(p, 9)
for p in pids:
    os.waitpid(p, 0)
report({"n": len(pids), "exc": type(err).__name__ if err else None, "errno": _en(getattr(err, "errno", 0))})
'''


def test_fork_loop_hits_pids_limit(small_daemon):
    r = small_daemon.run(sbx.prelude(FORK_LOOP), timeout=60)
    b = r.last
    assert b.completed and b.exit_code == 0, repr(r)
    rep = b.report()
    assert rep["exc"] == "BlockingIOError" and rep["errno"] == "EAGAIN", rep
    assert rep["n"] < PIDS, rep
    _after(small_daemon)


FORK_BOMB = r'''
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
'''


def test_fork_bomb_contained(small_daemon):
    before = small_daemon.descendants()
    r = small_daemon.run(FORK_BOMB, timeout=BLOCK_TIMEOUT + 40)
    b = r.last
    # 64 pids hold little memory: the bomb spins until the block timeout.
    timed_out = _timed_out(b) and (r.close_code, r.close_reason) == BLOCK_TIMEOUT_CLOSE
    if sbx.UNDER_ASAN:
        # Under ASan each process's quarantine keeps what it frees (every
        # failed fork's OSError) resident, and the 64 of them race the 5 s
        # timer to memory.max: either end, each exact, and nothing else.
        assert timed_out or _killed(r, OOM_CLOSE_REASON), repr(r)
    else:
        assert timed_out, repr(r)
    assert r.closed_by_server, repr(r)
    assert b.elapsed < BLOCK_TIMEOUT + 15, f"took {b.elapsed:.1f}s"
    # Every process of the bomb is gone from the host.
    assert sbx.wait_until(lambda: len(small_daemon.descendants() - before) == 0, 15), \
        f"left behind: {sorted(small_daemon.descendants() - before)}"
    _after(small_daemon)


THREAD_LOOP = r'''
import threading
ev = threading.Event()
threads, err = [], None
try:
    while len(threads) < 10000:
        t = threading.Thread(target=ev.wait, daemon=True)
        t.start()
        threads.append(t)
except BaseException as e:
    err = e
ev.set()
for t in threads:
    t.join()
report({"n": len(threads), "exc": type(err).__name__ if err else None, "msg": str(err)})
'''


def test_thread_bomb_hits_pids_limit(small_daemon):
    r = small_daemon.run(sbx.prelude(THREAD_LOOP), timeout=60)
    b = r.last
    assert b.completed and b.exit_code == 0, repr(r)
    rep = b.report()
    assert rep["exc"] == "RuntimeError" and "can't start new thread" in rep["msg"], rep
    assert rep["n"] < PIDS, rep
    _after(small_daemon)


# --------------------------------------------------------------------------- memory

MEMORY_BOMB = r'''
chunks = []
total = 0
try:
    while True:
        c = bytearray(16 << 20)
        for i in range(0, len(c), 4096):
            c[i] = 1
        chunks.append(c)
        total += len(c)
except MemoryError:
    chunks.clear()
    print("MemoryError after", total)
    raise
'''


def test_memory_bomb(small_daemon):
    r = small_daemon.run(MEMORY_BOMB, timeout=60)
    assert not r.last.completed, repr(r)
    assert _killed(r, OOM_CLOSE_REASON), repr(r)
    _after(small_daemon)


# --------------------------------------------------------------------------- disk

DISK_FILL = r'''
import os
written, err, paths = 0, None, []
chunk = b"\xa5" * (1 << 20)
try:
    while written < (1 << 30):
        path = os.path.join(DIR, f"fbx-fill-{len(paths)}")
        paths.append(path)
        with open(path, "wb") as f:
            for _ in range(PER_FILE_MB):
                f.write(chunk)
                f.flush()
                written += len(chunk)
except OSError as e:
    err = e
finally:
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass
report({"written": written, "files": len(paths), "exc": type(err).__name__ if err else None,
        "errno": _en(getattr(err, "errno", 0))})
'''


@pytest.mark.parametrize("where", ["/workspace", "/tmp", "/dev/shm"])
def test_disk_fill(small_daemon, where):
    # Many 8 MiB files: the filesystem fills up (ENOSPC) before any one file
    # reaches the per-file size limit.
    r = small_daemon.run(sbx.prelude(f"DIR = {where!r}\nPER_FILE_MB = 8\n" + DISK_FILL), timeout=60)
    b = r.last
    assert b.completed and b.exit_code == 0, repr(r)
    rep = b.report()
    assert rep["errno"] == "ENOSPC", rep
    assert rep["written"] <= TMPFS, rep
    _after(small_daemon)


def test_single_file_size_limit(small_daemon):
    # One growing file stops at RLIMIT_FSIZE (EFBIG: CPython ignores SIGXFSZ) or at ENOSPC.
    r = small_daemon.run(sbx.prelude("DIR = '/workspace'\nPER_FILE_MB = 1 << 20\n" + DISK_FILL), timeout=60)
    b = r.last
    assert b.completed and b.exit_code == 0, repr(r)
    rep = b.report()
    assert rep["errno"] in {"EFBIG", "ENOSPC"} and rep["files"] == 1, rep
    assert rep["written"] <= TMPFS, rep
    _after(small_daemon)


FD_LOOP = r'''
import os, resource
fds, err = [], None
try:
    while len(fds) < 10_000_000:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    err = e
for fd in fds:
    os.close(fd)
report({"n": len(fds), "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "exc": type(err).__name__ if err else None, "errno": _en(getattr(err, "errno", 0))})
'''


def test_fd_exhaustion(small_daemon):
    r = small_daemon.run(sbx.prelude(FD_LOOP), timeout=60)
    b = r.last
    assert b.completed and b.exit_code == 0, repr(r)
    rep = b.report()
    assert rep["errno"] == "EMFILE", rep
    assert rep["n"] <= rep["soft"] <= 1 << 20, rep
    _after(small_daemon)


def test_fd_limit_cannot_be_raised(small_daemon):
    code = sbx.prelude(r'''
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
res = try_(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (hard + 1, hard + 1)) or "raised")
raw = sc(302, 0, 7, _ct.byref((_ct.c_uint64 * 2)(hard + 1, hard + 1)), None)
report({"hard": hard, "res": res, "raw": raw})
''')
    r = small_daemon.run(code, timeout=30)
    rep = r.last.report()
    # CPython turns the kernel's EPERM into ValueError; the raw prlimit64 shows the errno.
    assert rep["res"].get("exc") == "ValueError" and "not allowed to raise" in rep["res"]["msg"], rep
    assert rep["raw"] == {"ret": -1, "errno": "EPERM"}, rep


# --------------------------------------------------------------------------- time

@pytest.mark.parametrize("code", ["while True: pass", "import time\ntime.sleep(1000)",
                                  "import threading\nthreading.Event().wait()"],
                         ids=["cpu_spin", "sleep", "wait_forever"])
def test_block_timeout(small_daemon, code):
    r = small_daemon.run(code, timeout=BLOCK_TIMEOUT + 30)
    b = r.last
    assert _timed_out(b), repr(r)
    assert BLOCK_TIMEOUT - 0.5 <= b.elapsed < BLOCK_TIMEOUT + 5, f"timed out after {b.elapsed:.1f}s"
    assert r.closed_by_server, f"connection not closed after the timeout: {r!r}"
    assert (r.close_code, r.close_reason) == BLOCK_TIMEOUT_CLOSE, repr(r)
    _after(small_daemon)


def test_background_spinner_does_not_outlive_turn(small_daemon):
    before = small_daemon.descendants()
    code = r'''
import os
if os.fork() == 0:
    while True:
        pass
print("spinning")
'''
    r = small_daemon.run(code, "print(2)", timeout=30)
    assert [b.stdout for b in r.blocks] == ["spinning\n", "2\n"], repr(r)
    assert sbx.wait_until(lambda: len(small_daemon.descendants() - before) == 0, 10), \
        f"left behind: {sorted(small_daemon.descendants() - before)}"
    _after(small_daemon)


# --------------------------------------------------------------------------- output

@pytest.mark.parametrize("stream,code", [
    ("stdout", "import sys\nfor _ in range(512):\n    sys.stdout.write('x' * 65536)\n"),
    ("stdout", "import os\nfor _ in range(512):\n    os.write(1, b'y' * 65536)\n"),
    ("stderr", "import sys\nfor _ in range(512):\n    sys.stderr.write('z' * 65536)\n"),
    ("stdout", "import subprocess\nsubprocess.run(['/bin/sh', '-c', 'head -c 33554432 /dev/zero | tr \"\\\\0\" w'])\n"),
], ids=["print", "fd1", "stderr", "subprocess"])
def test_output_flood_capped(small_daemon, stream, code):
    r = small_daemon.run(code, timeout=60)
    b = r.last
    assert b.completed and b.exit_code == 0, repr(r)
    text = getattr(b, stream)
    m = DROPPED_RE.search(text)
    assert m and m.group(2) == stream, f"no dropped note in {stream}: head {text[:100]!r} tail {text[-200:]!r}"
    assert int(m.group(1)) > 0
    assert len(text.encode()) <= OUTPUT_CAP + 256, f"{stream} is {len(text.encode())} bytes, cap {OUTPUT_CAP}"
    _after(small_daemon)


# --------------------------------------------------------------------------- neighbours

@pytest.mark.parametrize("attack", ["fork_bomb", "memory_bomb", "cpu_spin"])
def test_noisy_neighbour_does_not_break_another_turn(small_daemon, attack):
    """While one turn exhausts its limits, a concurrent turn still runs its blocks."""
    code = {"fork_bomb": FORK_BOMB, "memory_bomb": MEMORY_BOMB, "cpu_spin": "while True: pass"}[attack]

    async def go():
        victim = await sbx.Turn.open(small_daemon)
        first = await victim.run("x = 20\nprint('ready')")
        bad = await sbx.Turn.open(small_daemon)
        bad_task = asio.ensure_future(bad.run(code))
        await asio.sleep(1.0)
        during = await victim.run("import hashlib\nprint(x * 2, hashlib.sha256(b'a' * 1000000).hexdigest()[:8])")
        await asio.wait_for(bad_task, BLOCK_TIMEOUT + 20)
        after = await victim.run("print(x + 1)")
        await victim.close()
        await bad.close()
        return first, during, after
    first, during, after = sbx.arun(go(), BLOCK_TIMEOUT + 60)
    assert first.stdout == "ready\n", repr(first)
    want = hashlib.sha256(b"a" * 1000000).hexdigest()[:8]
    assert during.completed and during.stdout == f"40 {want}\n", repr(during)
    assert after.completed and after.stdout == "21\n", repr(after)
    _after(small_daemon)
