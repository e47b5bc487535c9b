"""Turn cgroups under faults: a hierarchy made read-only while the daemon runs
(in its own mount namespace), a sandbox frozen when the daemon stops, and the
ids such sandboxes hold. No turn cgroup is forgotten: one that cannot be
removed now is retried until it goes (and counted in /metrics meanwhile); one
still there when the daemon exits is removed by the next daemon on the same
id range when it starts. d4bf581 dropped them from its lists (9 were left
after a clean exit in the operator's run), or gave up after a second.
"""

import asyncio
import re
import time

import pytest

from faults import (T, Freezer, Holdings, host_mounts, host_turn, metric, ok_outcome,
                    pids_hierarchy, private_mounts, read_only, record, recover, writable)
from fbtest import arun, http_get, wait_until
from id_block import IdBlock


def metrics_port(d) -> int:
    assert wait_until(lambda: "metrics at http" in d.stderr(), 10), d.stderr(2000)
    return int(re.search(r"metrics at http://127\.0\.0\.1:(\d+)/", d.stderr()).group(1))


def test_read_only_hierarchy(make_daemon):
    """The pids hierarchy goes read-only in the daemon's mount namespace with a
    block running and two spare turn cgroups: the block completes; a new
    turn cannot be placed and ends (1011) with the reason; the spares it
    tried cannot be removed and are counted as waiting; once the hierarchy is
    writable again they go, the gauge is 0 and turns run. Stopped while it is
    read-only, the daemon leaves turn cgroups behind: the next one on its id
    range removes them at its start."""
    mounts = host_mounts()
    ids = IdBlock()
    try:
        args = ["--id-range", ids.arg(), "--capacity", "4", "--pool", "0",
                "--metrics-listen", "127.0.0.1:0"]
        d = make_daemon(args, wrap=private_mounts())
        mport = metrics_port(d)
        held = Holdings(d, mounts)
        mnt = pids_hierarchy()

        async def spares():  # two turn cgroups, spare once their turns end
            return await asyncio.gather(host_turn(d, "print(1)"), host_turn(d, "print(2)"))
        assert arun(spares(), T) == ["ran: 1", "ran: 2"]

        async def go():
            running = asyncio.create_task(host_turn(d, "import time\ntime.sleep(2)\nprint('ran')"))
            await asyncio.sleep(0.8)
            held.take()
            read_only(d, mnt)
            new = await host_turn(d, "print('placed')")
            waiting = await asyncio.to_thread(
                wait_until, lambda: (metric(mport, "forkbox_turn_cgroups_waiting") or 0) > 0, 5)
            during = metric(mport, "forkbox_turn_cgroups_waiting")
            return [await running, new], waiting, during
        outcomes, waiting, during = arun(go(), T)
        writable(d, mnt)
        t0 = time.monotonic()
        gone = wait_until(lambda: metric(mport, "forkbox_turn_cgroups_waiting") == 0, 10)
        rec = recover(d, t0)

        # Stopped while read-only: what it leaves, the next daemon removes.
        assert arun(spares(), T) == ["ran: 1", "ran: 2"]
        held.take()
        read_only(d, mnt)
        left_at_exit = held.left_after_stop()
        d2 = make_daemon(args[:-2])
        removed = wait_until(lambda: not held.turn_cgroups(), 5)
        left = [c for c in held.turn_cgroups()]
        record("read-only pids hierarchy (a block running, a new turn, 2 spares)", outcomes,
               left, rec, waiting_during=during, left_by_stop_while_read_only=len(left_at_exit))
        assert outcomes[0] == "ran: ran", outcomes
        assert outcomes[1] == "1011 sandbox setup failed", outcomes
        assert waiting and during and during >= 2, during
        assert gone, metric(mport, "forkbox_turn_cgroups_waiting")
        assert rec is not None, d.stderr(3000)
        assert left_at_exit and all(x.startswith("cgroup ") for x in left_at_exit), left_at_exit
        assert removed, left
        assert "removed, 0 not yet" in d2.stderr(), d2.stderr(3000)
    finally:
        ids.release()


def test_frozen_sandbox_when_the_daemon_stops(make_daemon):
    """A sandbox frozen (cgroup freezer) with its block running when the daemon
    is told to stop: the turn ends with 1001 and its reason; its frozen tasks
    keep their turn cgroups past the daemon's exit; once thawed they die, and
    the next daemon on the same id range removes those cgroups at its start."""
    mounts = host_mounts()
    ids = IdBlock()
    frz = Freezer()
    try:
        args = ["--id-range", ids.arg(), "--capacity", "2", "--pool", "0"]
        d = make_daemon(args + ["--drain-timeout", "1"])
        held = Holdings(d, mounts)

        async def go():
            turn = asyncio.create_task(host_turn(d, "import time\ntime.sleep(30)"))
            assert await asyncio.to_thread(wait_until, lambda: held.sandboxes(), 10)
            await asyncio.sleep(0.5)
            held.take()
            frz.freeze(held.sandbox_procs())
            stop = asyncio.create_task(asyncio.to_thread(held.left_after_stop))
            return await turn, await stop
        (outcome, left_at_exit) = arun(go(), T)
        frz.thaw()
        t0 = time.monotonic()
        d2 = make_daemon(args)
        removed = wait_until(lambda: not held.turn_cgroups(), 5)
        left = held.turn_cgroups()  # before d2 makes turn cgroups of its own
        rec = recover(d2, t0)
        record("sandbox frozen when the daemon stops (then thawed, daemon restarted)",
               [outcome], left, rec, left_at_exit=len(left_at_exit))
        assert outcome == "1001 server shutting down", outcome
        if frz.kill_survives():
            assert any(x.startswith("cgroup ") for x in left_at_exit), left_at_exit
        assert removed, left
        assert rec is not None, d2.stderr(3000)
    finally:
        frz.remove()
        ids.release()


def test_every_id_held_by_sandboxes_not_yet_reaped(make_daemon):
    """--id-range of 2 ids, capacity 1: two turns end while their sandboxes are
    frozen (killed, not reaped: they keep their ids). The next turn cannot get
    a sandbox and says why; once they are thawed and reaped, turns run."""
    frz = Freezer()
    if not frz.kill_survives():
        frz.remove()
        pytest.skip("frozen tasks die at SIGKILL on cgroup v2: nothing holds an id")
    mounts = host_mounts()
    ids = IdBlock()
    try:
        d = make_daemon(["--id-range", ids.arg(2), "--capacity", "1", "--pool", "0"])
        held = Holdings(d, mounts)
        outcomes = []
        for i in range(2):
            async def one():
                turn = asyncio.create_task(host_turn(d, "import time\ntime.sleep(30)"))
                assert await asyncio.to_thread(wait_until, lambda: held.sandboxes(), 10)
                await asyncio.sleep(0.3)
                held.take()
                frz.freeze(held.sandbox_procs())
                turn.cancel()  # the client goes: the turn ends, its sandbox is killed
                try:
                    await turn
                except asyncio.CancelledError:
                    pass
            arun(one(), T)
            assert wait_until(lambda: http_get(d.port, "/ready")[0] == 200, 10), d.stderr(2000)
        outcomes.append(arun(host_turn(d, "print('no id')"), T))
        frz.thaw()
        t0 = time.monotonic()
        rec = recover(d, t0)
        left = held.left_after_stop()
        record("every id held by frozen sandboxes (--id-range of 2)", outcomes, left, rec)
        assert outcomes == ["1011 no free sandbox id (--id-range): each is held by a sandbox not "
                            "yet reaped"], outcomes
        assert all(ok_outcome(o) for o in outcomes)
        assert rec is not None, d.stderr(3000)
        assert not left, left
    finally:
        frz.remove()
        ids.release()
