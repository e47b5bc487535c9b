"""The OOM killer takes sandboxes first (issue 25): oom_score_adj is 1000 for
every sandbox (written by the fork server before the child's step 2, so
before any code of the turn and before a pooled sandbox warms up), -900 for
the supervisor and -800 for the fork server and its cgroup helper (lowering
needs CAP_SYS_RESOURCE: without it, as in a container, they stay where they
started, and sandboxes are still above them).

The OOM case: forkboxd in a v1 memory cgroup of its own, 512 MiB, smaller
than what its turns may take (--memory 256M each): three clients stall in
the middle of 90 MiB uploads and four turns allocate 150 MiB each. The kernel
kills sandboxes; the supervisor, the fork server and its helper live on; the
killed turns end with a reason and the daemon serves the next turn. On
d4bf581 (oom_score_adj 0 everywhere) the supervisor held the uploads (270
MiB), the OOM killer took it as the biggest process: exit 137, every turn
gone, nothing to restart it. Since the relay holds a window, not a message
(issue 25), the uploads' bytes are in their sandboxes instead, which the
kernel kills first whatever their size.
"""

import asyncio
import os
import re
import struct
import time

import pytest

import fbtest
from fbtest import RawWS, arun, wait_until

MiB = 1 << 20
CGROUP_LIMIT = 512 * MiB
UPLOAD, STALLED_AT = 95 * MiB, 90 * MiB
ALLOC = 150 * MiB
T = 60


def sys_resource() -> bool:
    """Whether we (and so the daemon we start) hold CAP_SYS_RESOURCE."""
    with open("/proc/self/status") as f:
        eff = int(re.search(r"(?m)^CapEff:\s*([0-9a-f]+)", f.read()).group(1), 16)
    return bool(eff >> 24 & 1)


def oom_adj(pid: int) -> int | None:
    """pid's oom_score_adj, None if it is gone."""
    try:
        with open(f"/proc/{pid}/oom_score_adj") as f:
            return int(f.read())
    except FileNotFoundError:
        return None


def helper_pid(fs: int) -> int:
    """The fork server's cgroup helper: its child that is no sandbox (every
    sandbox is pid 1 of a pid namespace of its own)."""
    for pid in fbtest.children(fs):
        try:
            with open(f"/proc/{pid}/status") as f:
                if re.search(r"(?m)^NSpid:\s*\d+$", f.read()):
                    return pid
        except FileNotFoundError:
            pass  # a sandbox reaped meanwhile
    raise AssertionError("no cgroup helper under the fork server")


class MemoryCgroup:
    """A v1 memory cgroup of ours, under the test's own, limited to limit
    bytes (swap included): wrap() starts a command in it, remove() takes it
    away with what the daemon left in it (its forkbox/ directory)."""

    def __init__(self, limit: int):
        self.dir = None
        with open("/proc/self/cgroup") as f:
            own = next((l.rstrip("\n").split(":", 2)[2] for l in f
                        if "memory" in l.split(":", 2)[1].split(",")), None)
        base = f"/sys/fs/cgroup/memory{own}" if own is not None else None
        if not base or not os.path.isdir(base):
            return
        self.dir = os.path.join(base, f"forkbox-oomtest-{os.getpid()}")
        os.mkdir(self.dir)
        with open(os.path.join(self.dir, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        try:
            with open(os.path.join(self.dir, "memory.memsw.limit_in_bytes"), "w") as f:
                f.write(str(limit))
        except OSError:
            pass  # no swap accounting: then no swap to fall back on either

    def wrap(self) -> list[str]:
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', self.dir]

    def remove(self) -> None:
        if not self.dir:
            return
        deadline = time.monotonic() + 10
        while os.path.isdir(self.dir) and time.monotonic() < deadline:
            for root, dirs, _ in os.walk(self.dir, topdown=False):
                for d in dirs:
                    try:
                        os.rmdir(os.path.join(root, d))
                    except OSError:
                        pass
            try:
                os.rmdir(self.dir)
            except OSError:
                time.sleep(0.1)


def stall_upload(d) -> RawWS:
    """A client whose tools archive stops 90 MiB into a 95 MiB frame (held by
    the supervisor on d4bf581, passed on to the sandbox now)."""
    ws = RawWS(d.port, token=d.token, timeout=T)
    ws.sock.sendall(struct.pack("!BBQ", 0x82, 0x80 | 127, UPLOAD) + b"\0\0\0\0")
    chunk = os.urandom(MiB)
    for _ in range(STALLED_AT // MiB):
        ws.sock.sendall(chunk)
    return ws


def vm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"(?m)^VmRSS:\s*(\d+) kB", f.read()).group(1)) << 10


async def allocating_turn(d) -> str:
    """A turn that allocates ALLOC (every page written) and waits: "ran" or
    "<code> <reason>" of its close."""
    turn = await fbtest.connect(d)
    try:
        r = await turn.run(f"import time\nx = b'x' * {ALLOC}\ntime.sleep(3)\nprint('ran')")
        return r.stdout.strip()
    except fbtest.fc.TurnClosed as e:
        return f"{e.code} {e.reason}"
    finally:
        await turn.shutdown()


def test_oom_score_adj_order(make_daemon):
    """Each process's oom_score_adj: sandboxes 1000, pooled ones before
    their turn and their own children too; the supervisor, the fork server
    and its helper below, -900 and -800 where we may lower them."""
    d = make_daemon(["--pool", "2"])
    fs = d.forkserver_pid()
    code = ("import subprocess\n"
            "print(open('/proc/self/oom_score_adj').read().strip(), "
            "subprocess.run(['cat', '/proc/self/oom_score_adj'], capture_output=True, "
            "text=True).stdout.strip())")
    _, res = fbtest.run_blocks(d, code)
    assert res[0].stdout == "1000 1000\n", res[0]
    assert wait_until(lambda: len(fbtest.children(fs)) >= 3, 10)  # helper + the pool
    helper = helper_pid(fs)
    pooled = {oom_adj(p) for p in fbtest.children(fs) if p != helper} - {None}
    assert pooled == {1000}, pooled
    procs = {"supervisor": oom_adj(d.pid), "fork server": oom_adj(fs), "helper": oom_adj(helper)}
    if sys_resource():
        assert procs == {"supervisor": -900, "fork server": -800, "helper": -800}
    else:  # as they started: we cannot lower them
        assert procs == {k: oom_adj(os.getpid()) for k in procs}, procs


@pytest.mark.skipif(not sys_resource(), reason="needs CAP_SYS_RESOURCE: the fork server then "
                    "makes 1000 the sandbox's floor")
def test_sandbox_cannot_lower_its_oom_score_adj(make_daemon):
    d = make_daemon(["--pool", "0"])
    code = ("try:\n"
            "    open('/proc/self/oom_score_adj', 'w').write('0')\n"
            "except OSError as e:\n"
            "    print(e.errno)\n"
            "print(open('/proc/self/oom_score_adj').read().strip())")
    _, res = fbtest.run_blocks(d, code)
    assert res[0].stdout == "13\n1000\n", res[0]


@pytest.mark.skipif("ASAN_OPTIONS" in os.environ,
                    reason="ASan's shadow memory counts against the daemon's limit")
def test_oom_kills_sandboxes_not_the_daemon(make_daemon):
    mem = MemoryCgroup(CGROUP_LIMIT)
    if not mem.dir:
        pytest.skip("needs the v1 memory hierarchy")
    uploads = []
    try:
        d = make_daemon(["--memory", "256M", "--capacity", "8", "--pool", "0"],
                        wrap=mem.wrap())
        fs = d.forkserver_pid()
        helper = helper_pid(fs)
        for _ in range(3):
            uploads.append(stall_upload(d))
        # What came of them moved on to their sandboxes, a window at a time:
        # the supervisor holds a few windows, not the uploads.
        assert vm_rss(d.pid) < 64 * MiB, vm_rss(d.pid)

        async def go():
            return await asyncio.gather(*[allocating_turn(d) for _ in range(4)])
        outcomes = arun(go(), T)
        assert d.alive(), (outcomes, d.stderr(3000))
        assert fbtest.pid_alive(fs) and fbtest.pid_alive(helper)
        assert d.forkserver_pid() == fs
        killed = [o for o in outcomes if o != "ran"]
        assert killed, outcomes  # 270 MiB held + 4 x 150 MiB do not fit in 512 MiB
        assert all(re.match(r"1011 out of memory", o) for o in killed), outcomes
        for ws in uploads:
            ws.close()
        uploads.clear()
        _, res = fbtest.run_blocks(d, "print('after')")
        assert res[0].stdout == "after\n"
    finally:
        for ws in uploads:
            ws.close()
        for dm in getattr(make_daemon, "started", []):
            dm.stop()
        mem.remove()
