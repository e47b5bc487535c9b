"""Why a sandbox died, and what its death leaves behind (issue 12, items 3 and 6).

* Each way a sandbox can end a turn on its own (out of memory, a crash of the
  runtime, a signal from user code, an exit, the process limit) closes the turn
  with 1011 and a reason naming it; block, turn and idle timeouts close with 1000
  and a reason naming the limit; the same reason is in the daemon's per-turn log
  line. A full tmpfs is an ordinary OSError (ENOSPC) in the block: the turn goes on.
* A sandbox that dies before the cgroup helper has placed it (here: its client
  closes right after the upgrade, so the supervisor kills it at once) costs no
  spare turn cgroup and no warning: only the cgroup that failed is discarded.
"""

import asyncio
import glob
import os
import re
import signal
import time

import pytest

import fbtest
from fbtest import arun, connect, expect_closed, fc, wait_until

T = 90


# ---------------------------------------------------------------- helpers

def turn_cgroups(d) -> list[int]:
    """Sequence numbers of the daemon's turn cgroups in the pids hierarchy (v1)
    or the unified one (v2): <own cgroup>/forkbox/turn-<placer pid>-<seq>."""
    kids = d.descendants()
    paths = []
    with open(f"/proc/{d.pid}/cgroup") as f:
        for line in f:
            hid, ctls, path = line.rstrip("\n").split(":", 2)
            if "pids" in ctls.split(","):
                paths.append(f"/sys/fs/cgroup/pids{path}")
            elif hid == "0" and ctls == "":
                paths.append(f"/sys/fs/cgroup/unified{path}")
                paths.append(f"/sys/fs/cgroup{path}")
    for base in paths:
        found = glob.glob(os.path.join(base.rstrip("/"), "forkbox", "turn-*-*"))
        seqs = []
        for p in found:
            m = re.search(r"turn-(\d+)-(\d+)$", p)
            if m and int(m.group(1)) in kids:
                seqs.append(int(m.group(2)))
        if seqs:
            return sorted(seqs)
    return []


def placer_pid(d) -> int:
    """The cgroup helper: the pid its turn cgroups are named after."""
    kids = d.descendants()
    for base in glob.glob("/sys/fs/cgroup/pids/**/forkbox/turn-*-*", recursive=True):
        m = re.search(r"turn-(\d+)-\d+$", base)
        if m and int(m.group(1)) in kids:
            return int(m.group(1))
    raise AssertionError("no turn cgroup of this daemon found")


async def one_block(d, code="x = 1"):
    turn = await connect(d)
    r = await turn.run(code)
    await turn.shutdown()
    return r


# ---------------------------------------------------------------- item 6

def test_spare_cgroups_survive_sandboxes_dead_before_placement(make_daemon):
    """Sandboxes killed before their placement (the client left at once) leave
    every spare turn cgroup in the cache: no cgroup is removed or made anew
    for them, and nothing is logged per cgroup."""
    d = make_daemon(["--pool", "0", "--capacity", "16", "--log-level", os.environ.get("FB_LOG", "info")])

    async def warm():
        await asyncio.gather(*(one_block(d) for _ in range(8)))
    arun(warm(), T)
    assert wait_until(lambda: len(turn_cgroups(d)) >= 8, 10), turn_cgroups(d)
    before = turn_cgroups(d)

    # Upgrades whose client closes at once: the supervisor kills each sandbox
    # as soon as it gets it. The cgroup helper is held stopped meanwhile, so
    # the fork server reaps them before their placement is attempted (as under
    # load, when each placement waits for an RCU grace period).
    placer = placer_pid(d)
    os.kill(placer, signal.SIGSTOP)
    try:
        for _ in range(3):
            socks = [fbtest.RawWS(d.port) for _ in range(4)]
            for s in socks:
                s.sock.close()
        time.sleep(1.0)
    finally:
        os.kill(placer, signal.SIGCONT)
    time.sleep(0.5)

    arun(warm(), T)
    time.sleep(0.5)
    after = turn_cgroups(d)
    log = d.stderr()
    # Nothing per cgroup, nor per sandbox: a sandbox gone before its placement
    # is ordinary (debug level).
    assert not re.search(r"WARN.*cgroup", log), log[-3000:]
    # The cache kept what it had: the killed sandboxes' turns made no cgroup
    # (the spares were enough for all of them), and the last 8 turns reused.
    assert max(after) <= max(before) + 4, (before, after)
    assert len(after) >= len(before), (before, after)
