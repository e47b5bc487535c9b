"""The fork server is restarted, not mourned (issue 15 item 2): after a
`kill -9` of the fork server, only the turns whose sandboxes died with it end
(1011 and a reason), a new fork server is started the way the first was (no
fd of the supervisor's but its control socket, no token in its environment),
new turns succeed again within seconds, no sandbox of the old one survives,
its turn cgroups are gone, and /ready says 503 meanwhile. A fork server that
cannot be started again makes forkboxd exit non-zero."""

import asyncio
import os
import shutil
import signal
import threading
import time

from fbtest import (POLICY, Daemon, arun, connect, descendants, host_mounts, http_get, nspid_depth,
                    pid_alive, wait_until)
from test_drain import Leftovers

T = 60
LOST = "sandbox lost: the fork server died"


def _fd_inodes(pid: int) -> set[str]:
    """The sockets and pipes pid holds above stdio (their inodes: shared only
    if inherited; fds 0-2 are the daemon's stdio, which the fork server keeps)."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        if int(fd) <= 2:
            continue
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if t.startswith(("socket:", "pipe:")):
            out.add(t)
    return out


class ReadyPoller(threading.Thread):
    """GET /ready every 20 ms: [(monotonic time, status)]."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port, self.seen, self.stop = port, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                st = http_get(self.port, "/ready", timeout=2)[0]
            except OSError:
                st = -1
            self.seen.append((time.monotonic(), st))
            time.sleep(0.02)


def test_kill_9_of_the_fork_server_under_load(make_daemon):
    mounts = host_mounts()
    d = make_daemon(["--capacity", "8", "--pool", "2"], token="tk-restart-secret")
    old_fs = d.forkserver_pid()
    poller = ReadyPoller(d.port)
    poller.start()

    async def go():
        turns = [await connect(d, token=d.token, ping_interval=None) for _ in range(3)]
        blocks = [asyncio.create_task(t.run("import time\ntime.sleep(60)")) for t in turns]
        await asyncio.sleep(1.0)
        left = Leftovers(d, mounts)  # the old fork server, its placer, its sandboxes
        old_tree = descendants(old_fs) | {old_fs}
        assert sum(1 for p in old_tree if nspid_depth(p) > 1) >= 3
        t_kill = time.monotonic()
        os.kill(old_fs, signal.SIGKILL)
        ends = []
        for b in blocks:
            try:
                await asyncio.wait_for(b, 15)
                ends.append(None)
            except Exception as e:  # fc.TurnClosed
                ends.append((getattr(e, "code", None), getattr(e, "reason", repr(e))))
        # New turns: the first attempt right away (admitted, its sandbox asked
        # for again from the new fork server if the old one took the request).
        t_ok = None
        for _ in range(40):
            try:
                t = await connect(d, token=d.token)
                r = await asyncio.wait_for(t.run("print('back')"), 15)
                await t.shutdown()
                if r.stdout == "back\n":
                    t_ok = time.monotonic()
                    break
            except Exception:
                await asyncio.sleep(0.25)
        return left, old_tree, t_kill, ends, t_ok
    left, old_tree, t_kill, ends, t_ok = arun(go(), T)
    assert wait_until(lambda: any(st == 200 and t > t_ok for t, st in poller.seen), 5)
    poller.stop.set()
    poller.join(5)

    assert ends == [(1011, LOST)] * 3, ends
    assert t_ok is not None, d.stderr()[-3000:]
    took = t_ok - t_kill
    print(f"\nkill -9 of the fork server -> first new turn done: {took * 1000:.0f} ms")
    assert took < 10, took
    # no process of the old fork server's tree survives; its cgroups are gone
    left.procs = old_tree
    left.check()
    # /ready: 200 before, 503 while it restarted, 200 after
    before = [st for t, st in poller.seen if t < t_kill]
    after = [st for t, st in poller.seen if t >= t_kill]
    assert before and set(before) == {200}, before
    assert 503 in after and after[-1] == 200, after
    first503 = after.index(503)
    assert 200 in after[first503:], after
    # the new fork server: started the same way
    assert d.alive()
    new_fs = d.forkserver_pid()
    assert new_fs != old_fs
    with open(f"/proc/{new_fs}/environ", "rb") as f:
        env = f.read()
    assert b"tk-restart-secret" not in env and b"ADK_CODE_MODE" not in env, env
    leaked = _fd_inodes(new_fs) & _fd_inodes(d.pid)
    assert not leaked, leaked
    assert "a new one (pid" in d.stderr()


def test_fork_server_that_cannot_restart_makes_forkboxd_exit_non_zero(tmp_path):
    """The policy the fork server compiles at start is gone (the executable
    itself is held open by forkboxd, so removing it would not do): every new
    start fails, and after a bounded number of tries forkboxd exits 1."""
    policy = tmp_path / "copy.policy"
    shutil.copy(POLICY, policy)
    d = Daemon(["--policy", str(policy)], policy=False).start()
    try:
        fs = d.forkserver_pid()
        os.remove(policy)
        t0 = time.monotonic()
        os.kill(fs, signal.SIGKILL)
        rc = d.wait_exit(30)
        took = time.monotonic() - t0
        err = d.stderr()
    finally:
        d.stop()
    assert rc == 1, (rc, err[-3000:])
    assert "giving up" in err, err[-3000:]
    assert took < 20, took
    assert wait_until(lambda: not pid_alive(fs), 5)
