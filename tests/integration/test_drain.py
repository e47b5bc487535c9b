"""Graceful drain (issue 15 item 1): on SIGTERM/SIGINT forkboxd stops taking
turns at once (503 with Retry-After, /ready 503; the listener stays open),
lets the admitted ones run until they end or --drain-timeout passes, then
closes the rest with 1001 and exits 0; a second signal ends the drain at once.
Nothing is left behind: no process, no turn cgroup, no host mount."""

import asyncio
import glob
import os
import signal
import socket
import time

from fbtest import (arun, cgroup_forkbox_dirs, connect, expect_closed, fc, host_mounts, http_get,
                    http_raw, nspid_depth, pid_alive, upgrade_request, wait_until)

T = 60
SHUTDOWN = fc.encode_frame({"kind": "shutdown"})
REASON = "server shutting down"


# ---- what a daemon leaves behind ---------------------------------------------

class Leftovers:
    """A snapshot of a running daemon's processes and turn cgroups (and the
    host's mounts before it started): check() after it exited says what of
    it is still there."""

    def __init__(self, d, mounts_before: set[str]):
        self.procs = d.descendants()
        fs = d.forkserver_pid()
        placers = [p for p in self.procs if nspid_depth(p) == 1 and p != fs]
        self.cgroups = set()
        for cg in cgroup_forkbox_dirs(d.pid):
            for placer in placers:
                self.cgroups |= set(glob.glob(os.path.join(cg, f"turn-*-{placer}-*")))
        self.mounts_before = mounts_before
        assert any(nspid_depth(p) > 1 for p in self.procs), "no sandbox seen"

    def check(self, timeout: float = 5.0) -> None:
        assert wait_until(lambda: not any(pid_alive(p) for p in self.procs), timeout), \
            [p for p in self.procs if pid_alive(p)]
        assert wait_until(lambda: not any(os.path.exists(c) for c in self.cgroups), timeout), \
            [c for c in self.cgroups if os.path.exists(c)]
        assert host_mounts() - self.mounts_before == set()


def ready(d) -> int:
    return http_get(d.port, "/ready")[0]


def test_sigterm_lets_running_turn_finish_and_refuses_new_ones(make_daemon):
    """A 3 s block started before SIGTERM completes (done, output, archive, then a
    normal close on shutdown); after SIGTERM an upgrade gets 503 with
    Retry-After (also on a connection accepted before the signal), /ready
    goes 200 -> 503, /health stays 200; the daemon exits 0 and leaves nothing."""
    mounts = host_mounts()
    d = make_daemon(["--drain-timeout", "30", "--capacity", "4"])
    assert ready(d) == 200
    assert http_get(d.port, "/ready")[1] == b"Ready\n"

    async def go():
        turn = await connect(d)
        early = socket.create_connection(("127.0.0.1", d.port), timeout=5)  # accepted, no request yet
        block = asyncio.create_task(turn.run(
            "import time\nt0 = time.monotonic()\ntime.sleep(3)\n"
            "open('out.txt', 'w').write('kept')\nprint('slept', round(time.monotonic() - t0))"))
        await asyncio.sleep(0.8)
        left = Leftovers(d, mounts)
        os.kill(d.pid, signal.SIGTERM)
        await asyncio.sleep(0.3)
        during = {
            "ready": await asyncio.to_thread(http_get, d.port, "/ready"),
            "health": await asyncio.to_thread(http_get, d.port, "/health"),
            "upgrade": await asyncio.to_thread(http_raw, d.port, upgrade_request("/")),
        }
        early.sendall(upgrade_request("/"))
        early_answer = await asyncio.to_thread(early.recv, 4096)
        early.close()
        alive_during = d.alive()
        r = await asyncio.wait_for(block, 20)
        await turn.ws.send(SHUTDOWN)
        code, reason, _ = await expect_closed(turn.ws, 10)
        return left, during, early_answer, alive_during, r, code
    left, during, early_answer, alive_during, r, code = arun(go(), T)

    assert alive_during
    assert during["ready"] == (503, b"Shutting down\n"), during
    assert during["health"] == (200, b"OK\n"), during
    up = during["upgrade"]
    assert up.status == 503 and up.body == b"Shutting down\n", up
    assert up.headers.get("retry-after") == "1", up
    assert early_answer.startswith(b"HTTP/1.1 503 "), early_answer
    assert r.exit_code == 0 and r.stdout == "slept 3\n", (r.stdout, r.stderr)
    assert r.files == {"out.txt": b"kept"}
    assert code == 1000, code
    assert d.wait_exit(10) == 0, d.stderr()[-2000:]
    left.check()
    assert "draining" in d.stderr()


def test_drain_timeout_closes_running_and_idle_turns_with_1001(make_daemon):
    """Turns still admitted when --drain-timeout passes (one spinning in a block,
    one idle between blocks: idle counts as running) are closed with 1001 and
    a reason; until then the daemon waits; it exits 0 and leaves nothing. The
    signal is SIGINT to the whole process group, as a terminal's Ctrl-C sends
    it: the fork server ignores it (a 1011 here would mean it died of it)."""
    mounts = host_mounts()
    d = make_daemon(["--drain-timeout", "2"])

    async def go():
        busy = await connect(d, ping_interval=None)
        idle = await connect(d, ping_interval=None)
        await idle.run("pass")
        await busy.run("pass")
        await busy.ws.send(fc.empty_tar())
        await busy.ws.send(fc.encode_frame({"kind": "run", "code": "while True:\n    pass"}))
        await asyncio.sleep(0.5)
        left = Leftovers(d, mounts)
        t0 = time.monotonic()
        os.killpg(d.pid, signal.SIGINT)
        await asyncio.sleep(1.0)
        waiting = d.alive() and await asyncio.to_thread(ready, d) == 503
        closes = await asyncio.gather(expect_closed(busy.ws, 10), expect_closed(idle.ws, 10))
        return left, waiting, [c[:2] for c in closes], time.monotonic() - t0
    left, waiting, closes, took = arun(go(), T)
    assert waiting, "the daemon did not wait for its turns"
    assert closes == [(1001, REASON), (1001, REASON)], closes
    assert 1.5 < took < 6, took
    assert d.wait_exit(10) == 0, d.stderr()[-2000:]
    left.check()


def test_second_sigterm_ends_the_drain_at_once(make_daemon):
    """With a long --drain-timeout, a second SIGTERM closes the running turn with
    1001 now and the daemon exits 0 right after."""
    mounts = host_mounts()
    d = make_daemon(["--drain-timeout", "120"])

    async def go():
        turn = await connect(d, ping_interval=None)
        block = asyncio.create_task(turn.run("import time\ntime.sleep(100)"))
        await asyncio.sleep(0.8)
        left = Leftovers(d, mounts)
        os.kill(d.pid, signal.SIGTERM)
        await asyncio.sleep(1.0)
        still = d.alive() and not block.done()
        t0 = time.monotonic()
        os.kill(d.pid, signal.SIGINT)
        try:
            await asyncio.wait_for(block, 10)
            closed = None
        except fc.TurnClosed as e:
            closed = (e.code, e.reason)
        return left, still, closed, t0
    left, still, closed, t0 = arun(go(), T)
    assert still, "the first SIGTERM did not leave the turn running"
    assert closed == (1001, REASON), closed
    assert d.wait_exit(10) == 0, d.stderr()[-2000:]
    assert time.monotonic() - t0 < 5
    left.check()


def test_sigterm_without_turns_exits_at_once(make_daemon):
    """No turn running: SIGTERM exits 0 promptly, and connects are refused after."""
    d = make_daemon()
    port = d.port
    t0 = time.monotonic()
    os.kill(d.pid, signal.SIGTERM)
    assert d.wait_exit(10) == 0, d.stderr()[-2000:]
    assert time.monotonic() - t0 < 5
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        refused = False
    except OSError:
        refused = True
    assert refused


def test_drain_admit_keeps_admitting_while_ready_says_503(make_daemon):
    """--drain-admit 2: for 2 s after SIGTERM /ready already answers 503 (a load
    balancer's health check takes the daemon out) while an upgrade the balancer
    still routes here is admitted and runs to its end; after that window
    upgrades get 503, and the daemon exits 0 once its turns are done."""
    d = make_daemon(["--drain-admit", "2", "--drain-timeout", "30"])

    async def go():
        held = await connect(d)  # admitted before: keeps the drain going past the window
        os.kill(d.pid, signal.SIGTERM)
        await asyncio.sleep(0.3)
        ready_during = await asyncio.to_thread(http_get, d.port, "/ready")
        turn = await connect(d)  # inside the window: admitted
        r = await turn.run("print(6 * 7)")
        await turn.ws.send(SHUTDOWN)
        code, _, _ = await expect_closed(turn.ws, 10)
        await asyncio.sleep(2.0)  # the window is over; `held` still runs
        late = await asyncio.to_thread(http_raw, d.port, upgrade_request("/"))
        await held.ws.send(SHUTDOWN)
        held_code, _, _ = await expect_closed(held.ws, 10)
        return ready_during, r, code, late, held_code
    ready_during, r, code, late, held_code = arun(go(), T)

    assert ready_during == (503, b"Shutting down\n"), ready_during
    assert r.exit_code == 0 and r.stdout == "42\n", (r.stdout, r.stderr)
    assert code == 1000 and held_code == 1000
    assert late.status == 503 and late.body == b"Shutting down\n", late
    assert d.wait_exit(10) == 0, d.stderr()[-2000:]


def test_ready_is_503_at_capacity_and_an_upgrade_to_ready_is_a_turn(make_daemon):
    """/ready says 503 Busy while every turn slot is taken, 200 once one is free;
    an upgrade whose path is /ready is still a turn (spec 1.1: any path but
    /health)."""
    d = make_daemon(["--capacity", "1"])

    async def go():
        turn = await connect(d, path="/ready")
        r = await turn.run("print('via /ready')")
        full = await asyncio.to_thread(http_get, d.port, "/ready")
        await turn.shutdown()
        return r, full
    r, full = arun(go(), T)
    assert r.stdout == "via /ready\n"
    assert full == (503, b"Busy\n"), full
    assert wait_until(lambda: ready(d) == 200, 5)
