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
    or the unified one (v2): <own cgroup>/forkbox/turn-<first id>-<placer pid>-<seq>."""
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
        found = glob.glob(os.path.join(base.rstrip("/"), "forkbox", "turn-*-*-*"))
        seqs = []
        for p in found:
            m = re.search(r"turn-\d+-(\d+)-(\d+)$", p)
            if m and int(m.group(1)) in kids:
                seqs.append(int(m.group(2)))
        if seqs:
            return sorted(seqs)
    return []


def placer_pid(d) -> int:
    """The cgroup helper: the pid its turn cgroups are named after."""
    kids = d.descendants()
    for base in glob.glob("/sys/fs/cgroup/pids/**/forkbox/turn-*-*-*", recursive=True):
        m = re.search(r"turn-\d+-(\d+)-\d+$", base)
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


# ---------------------------------------------------------------- item 3

MEMORY_MB, PIDS = 128, 32
LIMIT_ARGS = ["--memory", f"{MEMORY_MB}M", "--pids", str(PIDS), "--tmpfs-size", "32M",
              "--pool", "2", "--capacity", "8"]


@pytest.fixture(scope="module")
def limited():
    d = fbtest.Daemon(LIMIT_ARGS + ["--log-level", "info"]).start()
    yield d
    d.stop()


async def closed_by(d, code: str) -> tuple[int | None, str]:
    """Run one block that ends the sandbox; the close code and reason."""
    turn = await connect(d)
    try:
        r = await turn.run(code)
    except fc.TurnClosed as e:
        return e.code, e.reason
    return None, f"block completed: exit {r.exit_code}, stderr {r.stderr[-300:]!r}"


FORK_THEN_ABORT = r'''
import os, time
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
except OSError:
    pass
os.abort()
'''

DEATHS = {
    "oom": ("l = []\nwhile True:\n    l.append(b'\\x01' * (8 << 20))",
            f"out of memory: the sandbox was killed at its memory limit ({MEMORY_MB} MiB)"),
    "segv": ("import ctypes\nctypes.string_at(0)",
             "sandbox crashed: SIGSEGV in the runtime or native code"),
    "abort": ("import os\nos.abort()", "sandbox crashed: SIGABRT in the runtime or native code"),
    "sigterm": ("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", "sandbox killed: SIGTERM"),
    "sigkill": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "sandbox killed: SIGKILL"),
    "exit7": ("import os\nos._exit(7)", "sandbox exited: status 7"),
    "exit200": ("import os\nos._exit(200)", "sandbox exited: status 128 or more"),
    "pids": (FORK_THEN_ABORT,
             f"process limit: the sandbox died (SIGABRT) after reaching its limit of {PIDS} processes"),
}


@pytest.mark.parametrize("what", sorted(DEATHS))
def test_close_reason_says_why_the_sandbox_died(limited, what):
    """Each way a sandbox dies on its own gets its own 1011 reason, from the
    wait status and the turn cgroup's counters; the daemon's per-turn log line
    says the same."""
    code, want = DEATHS[what]
    got_code, reason = arun(closed_by(limited, code), T)
    assert (got_code, reason) == (1011, want), (got_code, reason)
    assert len(reason.encode()) <= 123
    assert wait_until(lambda: f": ended: {want}\n" in limited.stderr(), 5), \
        limited.stderr()[-2000:]
    # The daemon goes on: the next turn is served.
    r = arun(one_block(limited, "print(6 * 7)"), T)
    assert r.exit_code == 0 and r.stdout == "42\n", r


def test_full_tmpfs_is_an_error_in_the_block_not_a_death(limited):
    """A full /workspace is ENOSPC in the block (exit code 1, the traceback
    says so); the turn goes on, and the next block runs."""
    async def go():
        turn = await connect(limited)
        r1 = await turn.run("i = 0\nwhile True:\n"
                            "    with open(f'/workspace/f{i}', 'wb') as f:\n"
                            "        f.write(b'x' * (4 << 20))\n"
                            "    i += 1")
        r2 = await turn.run("import glob, os\nfor p in glob.glob('/workspace/f*'):\n"
                            "    os.remove(p)\nprint('still here')")
        await turn.shutdown()
        return r1, r2
    r1, r2 = arun(go(), T)
    assert r1.exit_code == 1 and "No space left on device" in r1.stderr, r1
    assert r2.exit_code == 0 and r2.stdout == "still here\n", r2


def test_timeouts_say_which_limit(make_daemon):
    """Block, turn and idle timeouts close with 1000 and a reason naming the
    limit; the per-turn log line says the same."""
    d = make_daemon(["--block-timeout", "2", "--idle-timeout", "2", "--turn-timeout", "4",
                     "--log-level", "info"])

    async def block():
        turn = await connect(d)
        r = await turn.run("import time\ntime.sleep(30)")
        code, reason, _ = await expect_closed(turn.ws, 10)
        return r.exit_code, code, reason

    async def idle():
        turn = await connect(d)
        await turn.run("pass")
        code, reason, _ = await expect_closed(turn.ws, 10)
        return code, reason

    async def whole_turn():
        turn = await connect(d)
        for _ in range(10):
            try:
                await turn.run("import time\ntime.sleep(1)")
            except fc.TurnClosed as e:
                return e.code, e.reason
            await asyncio.sleep(0.5)
        code, reason, _ = await expect_closed(turn.ws, 10)
        return code, reason

    exit_code, code, reason = arun(block(), T)
    assert exit_code == 124 and (code, reason) == (
        1000, "block timeout: the block ran longer than 2 s (--block-timeout)"), (code, reason)
    assert (arun(idle(), T)) == (1000, "idle timeout: no block for 2 s (--idle-timeout)")
    code, reason = arun(whole_turn(), T)
    assert (code, reason) == (1000, "turn timeout: the turn lasted longer than 4 s (--turn-timeout)")
    log = d.stderr()
    for want in ("block timeout: the block", "idle timeout: no block", "turn timeout: the turn"):
        assert f": ended: {want}" in log, log[-2000:]
