"""Each of forkboxd's processes stopped (SIGSTOP) for a while, as a debugger,
a frozen container or an overloaded host does it: the supervisor, the fork
server, its cgroup helper. Every turn in flight completes or ends with a close
frame and its reason, nothing is left behind once the daemon stops, and the
daemon serves again by itself once the process runs on (SIGCONT).

A sandbox that ends while its fork server is stopped cannot be reaped, so no
death report comes: its turn used to end "sandbox stopped: cause unknown (no
death report)"; it now says the fork server did not answer for 5 s.
"""

import asyncio
import time

from faults import T, Holdings, Stopped, host_mounts, host_turn, ok_outcome, record, recover
from fbtest import arun

SLEEPER = "import time\ntime.sleep({s})\nprint('slept')"


def test_supervisor_stopped(make_daemon):
    """Three turns with blocks running while the supervisor is stopped for
    3 s: each completes once it runs on."""
    mounts = host_mounts()
    d = make_daemon(["--capacity", "4", "--pool", "2"])
    held = Holdings(d, mounts)

    async def go():
        turns = [asyncio.create_task(host_turn(d, SLEEPER.format(s=1.5))) for _ in range(3)]
        await asyncio.sleep(0.8)
        held.take()
        with Stopped(d.pid):
            await asyncio.sleep(3)
        return await asyncio.gather(*turns), time.monotonic()
    outcomes, t0 = arun(go(), T)
    rec = recover(d, t0)
    fds = held.fds_settled()
    left = held.left_after_stop()
    record("supervisor stopped 3 s (3 blocks running)", outcomes, left, rec,
           fds=[held.fds_idle, fds])
    assert outcomes == ["ran: slept"] * 3, outcomes
    assert rec is not None, d.stderr(3000)
    assert fds <= held.fds_idle, (held.fds_idle, fds)
    assert not left, left


def test_fork_server_stopped(make_daemon):
    """The fork server stopped for 7 s: blocks already running complete; a turn
    asking for a sandbox meanwhile gets one once it runs on; a sandbox that
    exits meanwhile cannot be reaped, and its turn ends (1011) saying that the
    fork server did not answer for 5 s (no death report)."""
    mounts = host_mounts()
    d = make_daemon(["--capacity", "4", "--pool", "0"])
    held = Holdings(d, mounts)
    fs = d.forkserver_pid()

    async def go():
        running = asyncio.create_task(host_turn(d, SLEEPER.format(s=2)))
        exiting = asyncio.create_task(host_turn(d, "import os, time\ntime.sleep(1.5)\nos._exit(3)"))
        await asyncio.sleep(1)
        held.take()
        with Stopped(fs):
            new = asyncio.create_task(host_turn(d, "print('new')", open_timeout=30))
            await asyncio.sleep(7)
        t0 = time.monotonic()
        return await asyncio.gather(running, exiting, new), t0
    outcomes, t0 = arun(go(), T)
    rec = recover(d, t0)
    left = held.left_after_stop()
    record("fork server stopped 7 s (a block running, one exiting, a new turn)", outcomes, left, rec)
    assert outcomes[0] == "ran: slept", outcomes
    assert outcomes[1] == "1011 sandbox stopped: no death report (the fork server did not " \
                          "answer for 5 s)", outcomes
    assert outcomes[2] == "ran: new", outcomes
    assert rec is not None, d.stderr(3000)
    assert not left, left


def test_cgroup_helper_stopped(make_daemon):
    """The fork server's cgroup helper stopped for 3 s: a fresh sandbox is
    placed (and its turn runs) once it runs on; a sandbox that exits
    meanwhile ends its turn with its own reason (the report comes late, within
    the 5 s the close waits for it)."""
    mounts = host_mounts()
    d = make_daemon(["--capacity", "4", "--pool", "0"])
    held = Holdings(d, mounts)

    async def go():
        running = asyncio.create_task(host_turn(d, SLEEPER.format(s=1.5)))
        exiting = asyncio.create_task(host_turn(d, "import os, time\ntime.sleep(1)\nos._exit(3)"))
        await asyncio.sleep(0.7)
        with Stopped(held.placer()):
            new = asyncio.create_task(host_turn(d, "print('new')", open_timeout=30))
            await asyncio.sleep(3)
        t0 = time.monotonic()
        return await asyncio.gather(running, exiting, new), t0
    outcomes, t0 = arun(go(), T)
    rec = recover(d, t0)
    left = held.left_after_stop()
    record("cgroup helper stopped 3 s (a block running, one exiting, a new turn)", outcomes, left,
           rec)
    assert outcomes == ["ran: slept", "1011 sandbox exited: status 3", "ran: new"], outcomes
    assert all(ok_outcome(o) for o in outcomes)
    assert rec is not None, d.stderr(3000)
    assert not left, left
