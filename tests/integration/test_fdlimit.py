"""Out of file descriptors stays local (issue 25): with the supervisor's or
the fork server's RLIMIT_NOFILE lowered on the running daemon (prlimit), only
the turn or connection that needed an fd fails, with a reason naming the
limit; the fork server is not restarted, a turn already running goes on, and
turns work again once the limit is back.

Where the fd runs out, and what the new client sees:
* the supervisor, at the spawn reply's fds (room for the connection only):
  close 1011 "cannot start a sandbox: out of file descriptors (RLIMIT_NOFILE)"
  (on d4bf581 the cut reply was taken for a broken fork server: it was
  killed and every running turn ended "sandbox lost: the fork server died");
* the supervisor, at the sandbox's listener (room for the connection and the
  reply's two fds): the same close (it was "sandbox protocol error");
* the supervisor, at accept (no room): HTTP 503 "Out of file descriptors
  (RLIMIT_NOFILE)", the connection taken with the fd reserve (it waited in
  the listen backlog, unanswered, until the limit went up);
* the fork server, at the sandbox's socketpair: the same close 1011 (it said
  "Too many open files");
* the metrics listener: a scrape is served from the reserve (it waited
  unanswered); with no reserve either, the listener rests until the next
  tick (its level-triggered wakeups spun the event loop).

Raw WebSocket clients that only upgrade and wait: a client that pipelines
its first messages can see 1006 instead of a close the server sends before
reading them (the WebSocket closing handshake; not this file's subject).
"""

import asyncio
import os
import re
import resource
import threading
import time

import pytest

import fbtest
from fbtest import RawWS, arun, http_get, http_raw, upgrade_request, wait_until

NO_FDS = "cannot start a sandbox: out of file descriptors (RLIMIT_NOFILE)"
T = 30


def nfds(pid: int) -> int:
    """pid's open fds, once the count has held still for 0.2 s (the closer
    thread and a turn's end may still be closing some)."""
    last = -1
    for _ in range(50):
        n = len(os.listdir(f"/proc/{pid}/fd"))
        if n == last:
            return n
        last = n
        time.sleep(0.2)
    return last


class NofileLowered:
    """pid's soft RLIMIT_NOFILE set to its open fds (held) + room (and the
    hard one too with no_reserve) for the with-block, then put back."""

    def __init__(self, pid: int, room: int, no_reserve: bool = False):
        self.pid, self.room, self.no_reserve = pid, room, no_reserve

    def __enter__(self):
        self.saved = resource.prlimit(self.pid, resource.RLIMIT_NOFILE)
        self.held = nfds(self.pid)
        low = self.held + self.room
        resource.prlimit(self.pid, resource.RLIMIT_NOFILE,
                         (low, low if self.no_reserve else self.saved[1]))
        return self

    def __exit__(self, *exc):
        resource.prlimit(self.pid, resource.RLIMIT_NOFILE, self.saved)


def raw_turn(d) -> str:
    """A client that upgrades and waits without sending: "<code> <reason>" of
    the close it gets, or "open" if the turn is still open after 5 s (it got
    its sandbox)."""
    with RawWS(d.port, token=d.token, timeout=T) as ws:
        try:
            ws.recv_until_close(5)
        except TimeoutError:
            return "open"
        return f"{ws.close_code} {ws.close_reason}"


async def victim_block(turn) -> str:
    r = await turn.run("n = globals().get('n', 0) + 1\nprint(n)")
    return r.stdout.strip()


def beside_a_running_turn(d, pid: int, room: int, probes) -> list:
    """A turn runs a block; pid's fd limit goes to what it holds + room; each
    probe (a function of d, in a thread of its own) runs, once pid is back to
    what it held (the last probe's fds closed), followed by a block of the
    running turn; the limit is put back. What the blocks printed and the
    probes returned, in order."""
    def fds_back(low):
        assert wait_until(lambda: len(os.listdir(f"/proc/{pid}/fd")) <= low.held, 10)

    async def go():
        victim = await fbtest.connect(d)
        try:
            out = [await victim_block(victim)]
            with NofileLowered(pid, room) as low:
                for probe in probes:
                    await asyncio.to_thread(fds_back, low)
                    out.append(await asyncio.to_thread(probe, d))
                    out.append(await victim_block(victim))
            return out
        finally:
            await victim.shutdown()
    return arun(go(), 4 * T)


def serves_again(d) -> None:
    _, res = fbtest.run_blocks(d, "print('again')")
    assert res[0].stdout == "again\n"


def metric(port: int, name: str) -> float:
    status, body = http_get(port, "/metrics", timeout=T)
    assert status == 200, (status, body[:200])
    m = re.search(rf"(?m)^{re.escape(name)} (\S+)$", body.decode())
    assert m, name
    return float(m.group(1))


@pytest.mark.parametrize("room, where", [(1, "the spawn reply"), (3, "the sandbox's listener")])
def test_supervisor_out_of_fds_fails_only_new_turns(make_daemon, room, where):
    """Room for a new connection and `room` - 1 more fds: the new turns fail
    at `where` with the reason, the running turn and the fork server go on,
    and a turn runs again once the limit is back."""
    d = make_daemon(["--pool", "1", "--capacity", "8"])
    fs = d.forkserver_pid()
    out = beside_a_running_turn(d, d.pid, room, [raw_turn, raw_turn])
    assert out == ["1", f"1011 {NO_FDS}", "2", f"1011 {NO_FDS}", "3"], (where, out)
    assert d.forkserver_pid() == fs
    assert "fork server is gone" not in d.stderr()
    serves_again(d)


def test_supervisor_out_of_fds_answers_at_the_door(make_daemon):
    """No fd left for a new connection: it is taken with the fd reserve and
    answered 503 with the reason at once (not left in the backlog); the
    running turn goes on."""
    d = make_daemon(["--pool", "1"])

    def upgrade(d):
        up = http_raw(d.port, upgrade_request(token=d.token), T)
        return up.status, up.headers.get("retry-after"), up.body
    out = beside_a_running_turn(d, d.pid, 0, [upgrade, lambda d: http_get(d.port, "/health", T)])
    why = b"Out of file descriptors (RLIMIT_NOFILE)\n"
    assert out == ["1", (503, "1", why), "2", (503, why), "3"], out
    serves_again(d)


def test_forkserver_out_of_fds_fails_only_new_turns(make_daemon):
    """The fork server's limit at what it holds: a new turn's spawn fails
    there, the fork server answers with the reason instead of a sandbox and
    stays, the running turn goes on, and spawns work again once the limit is
    back."""
    d = make_daemon(["--pool", "0", "--capacity", "8"])
    fs = d.forkserver_pid()
    out = beside_a_running_turn(d, fs, 0, [raw_turn])
    assert out == ["1", f"1011 {NO_FDS}", "2"], out
    assert d.forkserver_pid() == fs
    serves_again(d)


def metrics_port(d) -> int:
    assert wait_until(lambda: "metrics at http://" in d.stderr(), 10)
    return int(re.search(r"metrics at http://127\.0\.0\.1:(\d+)/", d.stderr()).group(1))


def test_metrics_out_of_fds(make_daemon):
    """--metrics-listen with no fd left under the soft limit: a scrape is
    served from the fd reserve (it waited unanswered)."""
    d = make_daemon(["--metrics-listen", "127.0.0.1:0"])
    mport = metrics_port(d)
    with NofileLowered(d.pid, 0):
        status, body = http_get(mport, "/metrics", timeout=5)
    assert status == 200 and b"forkbox_turns_active" in body


def test_metrics_out_of_fds_without_a_reserve(make_daemon):
    """With no reserve either (a hard limit too low to keep one, and no
    CAP_SYS_RESOURCE to raise it), the metrics listener rests until the next
    tick instead of waking the event loop at every round, and the scrape is
    served once the limit is back."""
    d = make_daemon(["--metrics-listen", "127.0.0.1:0"],
                    wrap=["prlimit", "--nofile=1500:1500", "--",
                          "setpriv", "--bounding-set", "-sys_resource", "--"])
    mport = metrics_port(d)
    before = metric(mport, "forkbox_loop_iteration_seconds_count")
    got = {}
    scrape = threading.Thread(target=lambda: got.update(r=http_get(mport, "/metrics", T)))
    with NofileLowered(d.pid, 0):
        scrape.start()
        time.sleep(1.5)
        assert scrape.is_alive(), "served with no fd left"
    scrape.join(T)
    assert got["r"][0] == 200
    after = metric(mport, "forkbox_loop_iteration_seconds_count")
    # ~4 ticks a second and two scrapes; a listener that woke the loop at
    # every round made thousands in the 1.5 s.
    assert after - before < 100, (before, after)
    assert "no fd reserve" in d.stderr()
