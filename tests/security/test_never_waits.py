"""The supervisor's event loop never waits on an object a sandbox controls
(issue 25, item 1).

close(2) of the last reference to an open file runs the object's release on
the closing thread, and a loopback TCP socket with unsent data, a peer that
does not read and SO_LINGER {1, N} makes that release wait N seconds. A
sandbox that hands the supervisor such a socket and drops its own copy first
makes the supervisor's close the last one: on d4bf581 every turn, /health and
accept stalled for N s, by three routes:

* linger: the socket sent over the channel with SCM_RIGHTS (the sandbox keeps
  the supervisor busy with 128 KiB of log frames first, so that its own close
  comes before the supervisor's recvmsg);
* many: 253 fds in one message (SCM_MAX_FD), more than the supervisor had
  room for: the kernel dropped the rest, doing their last close in recvmsg,
  on the loop; among them a unix socket with such a TCP socket queued in it
  (its release closes that one);
* flockrace: flock(2) on the socket, which the supervisor carries out on a
  pidfd_getfd copy, while another thread closes the sandbox's fds (won 2 of
  3-100 tries here).

Now the kernel refuses a sandbox's fds where it can (SO_PASSRIGHTS, Linux
6.16: sendmsg fails with EPERM in the sandbox); where it cannot (the
`fallback` daemon runs under tests/lib/no_passrights.c, as on Debian 12's 6.1)
the turn ends as a protocol error, and every fd the supervisor did not make
is closed on its closer thread. Either way /health keeps answering (p99 under
50 ms, probed every 10 ms whether or not the previous probe has returned),
the supervisor's fd table comes back to its size, and a fresh turn runs.
"""

import json
import os
import subprocess
import sys
import time

import pytest

import sbx

NO_PASSRIGHTS = os.environ.get("FORKBOX_NO_PASSRIGHTS") or os.path.join(
    os.path.dirname(sbx.FORKBOXD), "..", "tests", "security", "no-passrights")
ARGS = ["--capacity", "8", "--pool", "0", "--block-timeout", "60"]
LINGER_S = 2
PROBE_EVERY = 0.010
PROBE_TIMEOUT = 5.0
P99_LIMIT = 0.050


# Model code: a loopback TCP socket whose close lingers (unsent data, a peer
# that does not read), the channel, and a report of what the kernel said.
SETUP = r'''
import fcntl, json, os, random, socket, struct, threading, time
def _chan():
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                return int(fd)
        except OSError:
            pass
CHAN = _chan()
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(64)
peers = []
def linger_sock(secs):
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    c.connect(srv.getsockname())
    p, _ = srv.accept()
    p.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    peers.append(p)           # kept open and unread: the close must wait
    c.setblocking(False)
    try:
        while True:
            c.send(b"x" * 65536)
    except BlockingIOError:
        pass
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, secs))
    return c
def frame(body):
    return b"F\0\0\0" + struct.pack("<I", len(body)) + body
LOG = frame(b'{"level":"info","msg":"x","kind":"log"}\n')
BUSY = frame(b'{"level":"info","msg":"' + b"a" * 16000 + b'","kind":"log"}\n') * 8
def send_and_drop(fds):
    """Keep the supervisor busy, send fds with a log frame, close our copies
    before it reads them. What the kernel said."""
    ch = socket.socket(fileno=os.dup(CHAN))
    try:
        os.write(CHAN, BUSY)
        socket.send_fds(ch, [LOG], fds)
        return "sent"
    except OSError as e:
        return f"{type(e).__name__}: {e.errno}"
    finally:
        for fd in set(fds):
            os.close(fd)
'''

ATTACKS = {
    "linger": SETUP + r'''
print(json.dumps({"send": send_and_drop([linger_sock(%d).detach()])}), flush=True)
time.sleep(%d + 0.5)
''' % (LINGER_S, LINGER_S),
    "many": SETUP + r'''
a, b = socket.socketpair()
q = linger_sock(%d)
socket.send_fds(a, [b"x"], [q.fileno()])   # queued in b: b's release would close it
a.close()
q.close()
fds = [linger_sock(%d).detach() for _ in range(3)] + [b.detach()]
print(json.dumps({"send": send_and_drop((fds * 64)[:253])}), flush=True)
time.sleep(%d + 0.5)
''' % (LINGER_S, LINGER_S, LINGER_S),
    # Threads flock dups of the socket in a loop (each a pidfd_getfd copy in
    # the supervisor, closed after its answer) while a closer thread drops
    # every fd of ours at a random moment. When those closes return at once,
    # ours was not the last reference: a copy of the supervisor's was, and
    # its close lingers (the peer is kept open that long); when ours lingers,
    # the peer is reset to end it.
    "flockrace": SETUP + r'''
def attempt(delay):
    c = linger_sock(%d)
    fds = [os.dup(c.fileno()) for _ in range(4)]
    stop, done = threading.Event(), threading.Event()
    def locker(fd):
        while not stop.is_set():
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                pass
    def closer():
        for fd in fds:
            os.close(fd)
        c.close()
        done.set()
    ts = [threading.Thread(target=locker, args=(fd,)) for fd in fds]
    for t in ts:
        t.start()
    time.sleep(delay)
    threading.Thread(target=closer, daemon=True).start()
    won = done.wait(0.02)
    stop.set()
    if won:
        time.sleep(%d + 0.2)
    for p in peers:
        p.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        p.close()
    peers.clear()
    for t in ts:
        t.join()
    done.wait(3)
    return won
won = tries = 0
end = time.monotonic() + 6
while time.monotonic() < end and won < 2:
    won += attempt(random.random() * 0.005)
    tries += 1
print(json.dumps({"tries": tries, "won": won}), flush=True)
''' % (LINGER_S, LINGER_S),
}


# The prober runs in a process of its own: in this one, the turn's client
# (decoding the frames the attack relays) would hold the GIL and its delays
# would be taken for the daemon's.
PROBER = r"""
import asyncio, json, sys, time
port, every, timeout = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
samples = []
async def one():
    t0 = time.monotonic()
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
        w.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data = await asyncio.wait_for(r.read(), timeout)
        w.close()
        ok = data.startswith(b"HTTP/1.1 200")
    except (OSError, asyncio.TimeoutError):
        ok = False
    samples.append(time.monotonic() - t0 if ok else timeout)
async def main():
    loop = asyncio.get_running_loop()
    stop = loop.run_in_executor(None, sys.stdin.read)   # EOF: stop
    tasks, nxt = [], time.monotonic()
    while not stop.done():
        tasks.append(asyncio.ensure_future(one()))
        nxt += every
        await asyncio.sleep(max(0.0, nxt - time.monotonic()))
    await asyncio.gather(*tasks)
asyncio.run(main())
print(json.dumps(samples))
"""


class HealthProbe:
    """GET /health every PROBE_EVERY s from a process of its own, each probe
    on a fresh connection and timed from its own start, without waiting for
    the previous one: a stall of the supervisor shows in every probe it
    holds up."""

    def __init__(self, port: int):
        self.port = port
        self.samples: list[float] = []

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", PROBER, str(self.port),
                                      str(PROBE_EVERY), str(PROBE_TIMEOUT)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return self

    def __exit__(self, *exc):
        out, _ = self.proc.communicate(b"", timeout=PROBE_TIMEOUT + 10)
        self.samples = json.loads(out)

    def p99(self) -> float:
        xs = sorted(self.samples)
        return xs[min(len(xs) - 1, int(len(xs) * 0.99))]


@pytest.fixture(scope="module", params=["kernel", "fallback"])
def daemon(request):
    """The daemon as this kernel runs it, and as one without SO_PASSRIGHTS."""
    if request.param == "fallback" and not os.access(NO_PASSRIGHTS, os.X_OK):
        pytest.fail(f"{NO_PASSRIGHTS} not built")
    wrap = [NO_PASSRIGHTS] if request.param == "fallback" else []
    d = sbx.Daemon(ARGS)
    d.wrap = wrap
    with d:
        d.passrights = sbx.KERNEL_PASSRIGHTS and request.param == "kernel"
        yield d


def _fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_health_does_not_wait_for_a_sandbox_object(daemon, attack):
    if attack == "flockrace" and not daemon.passrights and sbx.KERNEL_PASSRIGHTS:
        pytest.skip("flock does not depend on SO_PASSRIGHTS: the kernel case covers it")
    fds = _fd_count(daemon.pid)
    with HealthProbe(daemon.port) as probe:
        t0 = time.monotonic()
        r = daemon.run(ATTACKS[attack], timeout=60)
        # A turn ended at once still leaves a close behind that would linger.
        time.sleep(max(0.0, t0 + LINGER_S + 1 - time.monotonic()))
    b = r.last
    what = (f"close {r.close_code} {r.close_reason!r}; block done={b.done_exit} "
            f"stdout={b.stdout[-300:]!r} stderr={b.stderr[-500:]!r}")
    assert len(probe.samples) > 100, probe.samples
    assert probe.p99() < P99_LIMIT, (
        f"/health p99 {probe.p99() * 1e3:.0f} ms, worst {max(probe.samples) * 1e3:.0f} ms "
        f"over {len(probe.samples)} probes; {what}")
    if attack == "flockrace":
        assert b.completed and '"tries"' in b.stdout, what
    elif daemon.passrights:
        # The kernel refused the fds: nothing reached the supervisor.
        assert b.completed and '"send": "PermissionError: 1"' in b.stdout, what
    else:
        assert (r.close_code, r.close_reason) == (
            1011, "sandbox protocol error: sandbox sent a file descriptor"), what
    # Every fd that came from the sandbox was closed (by the closer thread).
    assert sbx.wait_until(lambda: _fd_count(daemon.pid) <= fds, 10), (fds, _fd_count(daemon.pid))
    ok, why = daemon.fresh_turn_ok()
    assert ok, why
