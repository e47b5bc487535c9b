"""The daemon short of a resource: memory (its own memory cgroup's limit, below
a turn's), file descriptors (its RLIMIT_NOFILE lowered while it runs), and
its log (a reader that stops reading its stderr). Every turn in flight
completes or ends with a close frame and its reason, nothing is left behind,
and the daemon recovers once the resource is back.

The OOM case: a turn killed for the daemon-wide memory cgroup's limit was
reported as "killed at its memory limit (1024 MiB)", the turn's, not the one
that was hit. A stalled log reader froze the daemon (a blocking write(2) on
its stderr), and a lowered fd limit cost the fork server and every running
turn (a spawn reply cut by MSG_CTRUNC read as a dead fork server): issue 25.
"""

import asyncio
import fcntl
import os
import resource
import socket
import subprocess
import threading
import time

import pytest

import fbtest
from faults import (T, UNDER_ASAN, Holdings, MemoryCgroup, host_mounts, host_turn, ok_outcome,
                    record, recover)
from fbtest import FORKBOXD, POLICY, arun, http_get, wait_until
from id_block import IdBlock


@pytest.mark.skipif(UNDER_ASAN, reason="ASan's shadow memory counts against the daemon's limit")
def test_memory_limited_daemon(make_daemon):
    """forkboxd in a memory cgroup of 300 MiB, a turn's limit 1 GiB: a block
    that allocates 600 MiB is OOM-killed for the daemon's limit and its turn
    says so; a turn beside it completes; the daemon lives on."""
    mem = MemoryCgroup(300 << 20)
    if not mem.dir:
        pytest.skip("needs the v1 memory hierarchy (a cgroup of the test's own with a limit)")
    mounts = host_mounts()
    try:
        d = make_daemon(["--memory", "1G", "--capacity", "4", "--pool", "0"], wrap=mem.wrap())
        held = Holdings(d, mounts)

        async def go():
            small = asyncio.create_task(host_turn(d, "import time\nx = bytearray(8 << 20)\n"
                                                     "time.sleep(2)\nprint('small')"))
            await asyncio.sleep(0.5)
            big = await host_turn(d, "x = [bytearray(1 << 20) for _ in range(600)]")
            held.take()
            return [await small, big], time.monotonic()
        outcomes, t0 = arun(go(), T)
        alive = d.alive()
        rec = recover(d, t0)
        left = held.left_after_stop()
        record("daemon in a 300 MiB memory cgroup, a block allocating 600 MiB", outcomes, left,
               rec, daemon_alive=alive)
        assert alive, d.stderr(3000)
        assert outcomes == ["ran: small", "1011 out of memory: the sandbox was killed at the "
                            "daemon's memory limit (300 MiB), not its own (1024 MiB)"], outcomes
        assert rec is not None, d.stderr(3000)
        assert not left, left
    finally:
        mem.remove()


def test_fd_limit(make_daemon):
    """The supervisor's RLIMIT_NOFILE lowered to what it holds plus 4 while two
    blocks run and six clients connect: the blocks complete, every client
    gets a close with its reason, a 503 at the door (out of file descriptors)
    or its turn once the limit is back, and the daemon serves again."""
    mounts = host_mounts()
    d = make_daemon(["--capacity", "8", "--pool", "2"])
    held = Holdings(d, mounts)
    soft, hard = resource.prlimit(d.pid, resource.RLIMIT_NOFILE)

    async def go():
        running = [asyncio.create_task(host_turn(d, "import time\ntime.sleep(2)\nprint('ran')"))
                   for _ in range(2)]
        await asyncio.sleep(0.8)
        held.take()
        nfds = len(os.listdir(f"/proc/{d.pid}/fd"))
        resource.prlimit(d.pid, resource.RLIMIT_NOFILE, (nfds + 4, hard))
        try:
            new = [asyncio.create_task(host_turn(d, "print('new')", open_timeout=20))
                   for _ in range(6)]
            await asyncio.sleep(2)
        finally:
            resource.prlimit(d.pid, resource.RLIMIT_NOFILE, (soft, hard))
        t0 = time.monotonic()
        return await asyncio.gather(*running, *new), t0
    outcomes, t0 = arun(go(), T)
    rec = recover(d, t0)
    fds = held.fds_settled()
    left = held.left_after_stop()
    record("supervisor's fd limit at what it holds + 4 (2 blocks running, 6 new clients)",
           outcomes, left, rec, fds=[held.fds_idle, fds])
    assert all(ok_outcome(o) for o in outcomes), outcomes
    assert outcomes[:2] == ["ran: ran"] * 2, outcomes
    assert rec is not None, d.stderr(3000)
    assert not left, left
    assert fds <= held.fds_idle, (held.fds_idle, fds)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_stalled_log_reader(tmp_path):
    """forkboxd's stderr a pipe (4 KiB) that its reader stops reading, with
    debug logging: turns keep running (the daemon must not block on its
    log), and once the reader reads again nothing was lost but log lines."""
    ids = IdBlock()
    port = free_port()
    r, w = os.pipe()
    fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ: one page
    argv = [FORKBOXD, "--listen", f"127.0.0.1:{port}", "--policy", POLICY, "--log-level", "debug",
            "--id-range", ids.arg(), "--capacity", "4", "--pool", "1"]
    mounts = host_mounts()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=w,
                         start_new_session=True)
    os.close(w)
    d = None
    try:
        assert wait_until(lambda: _health(port), 20)
        d = _Attached(p, port)
        held = Holdings(d, mounts)

        async def stalled():  # nobody reads r meanwhile
            out = []
            for i in range(4):
                t = asyncio.create_task(host_turn(d, f"print({i})", open_timeout=8))
                done, _ = await asyncio.wait({t}, timeout=10)
                out.append(t.result() if done else "no answer in 10 s")
                if not done:
                    t.cancel()
                    break
            return out
        outcomes = arun(stalled(), 60)
        fcntl.fcntl(r, fcntl.F_SETFL, os.O_NONBLOCK)
        t0 = time.monotonic()
        reading = True

        def reader():  # the reader reads again, until the daemon is gone
            while reading:
                try:
                    if not os.read(r, 65536):
                        return
                except BlockingIOError:
                    time.sleep(0.02)
        th = threading.Thread(target=reader, daemon=True)
        th.start()
        rec = recover(d, t0)
        left = held.left_after_stop()
        reading = False
        th.join(5)
        record("stderr a 4 KiB pipe nobody reads, debug logging (4 turns)", outcomes, left, rec)
        assert outcomes == [f"ran: {i}" for i in range(4)], outcomes
        assert rec is not None
        assert not left, left
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait(10)
        os.close(r)
        ids.release()


def _health(port: int) -> bool:
    try:
        return http_get(port, "/health", 2)[0] == 200
    except OSError:
        return False


class _Attached(fbtest.Daemon):
    """A Daemon for a forkboxd started here (its stderr is the test's pipe)."""

    def __init__(self, proc, port):
        super().__init__()
        self.proc, self.port = proc, port
