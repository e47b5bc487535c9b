"""TLS and a rolling upgrade behind HAProxy (issue 16 items 1-3).

Runs the recipe deploy/haproxy/forkbox.cfg as shipped, but for its
certificate, listen port, backend ports and socket paths (render_config()),
in front of three forkboxd on 127.0.0.1. HAProxy is this test's own child
(`haproxy -db`, in the foreground, config in a temporary directory), never a
system service; the CA and the proxy's certificate are made here with the
openssl CLI. Clients are the host-like tools/forkbox_client.py over wss://,
verifying the proxy's certificate against that CA.

test_tls_and_token: the certificate is verified (a client without the CA is
refused), the Authorization header reaches forkboxd (a wrong token gets its 401).
test_rolling_upgrade: turn latency direct (one daemon, ws://) and through the
proxy (wss://), then steady concurrent load (more clients than the slots left
while one daemon is out) while every backend in turn is rolled as docs/operating.md
says: `set server ... state drain` on the proxy's admin socket, SIGTERM (it
drains, exits 0), a new daemon on the same port, `state ready`, and the next
one only once the new one answers /ready 200 and HAProxy's check has seen it
up. Every turn must complete, none may fail. Prints its figures (and writes
them to <builddir>/test-rolling-{admin,plain}.txt)."""

import asyncio
import csv
import io
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time

import pytest
import websockets.exceptions

from fbtest import SRCDIR, Daemon, fc, http_get, wait_until
from id_block import IdBlock

CFG = os.path.join(SRCDIR, "deploy", "haproxy", "forkbox.cfg")
TOKEN = "rolling-test-token"
CAPACITY = 2          # per daemon: the proxy's maxconn for it
# forkboxd frees a turn's slot once its sandbox is reaped, a moment after the
# proxy has seen the connection close and counted the slot free: one spare
# slot per daemon (deploy/haproxy/forkbox.cfg) covers that moment, which
# under a loaded CI run was long enough for a refused upgrade to use up all
# the proxy's retries.
SLOT_MARGIN = 1
N_DAEMONS = 3
N_SEQ = 30            # sequential turns measured direct, then through the proxy
WORKERS = 5           # concurrent clients during the roll (> the 4 slots left while one rolls)
THINK = 0.1           # host time between a turn's two blocks (not counted in its latency)
LOAD_TIME_LIMIT = 60  # the load stops by then whatever happens
# --drain-admit 2: after SIGTERM a daemon still admits what the proxy routes
# to it until the proxy's health check (every second, fall 1) has seen /ready
# say 503: the roll by SIGTERM alone ("plain") loses no turn either.
BASE_ARGS = ["--capacity", str(CAPACITY + SLOT_MARGIN), "--preauth-per-peer", "0", "--pool", "2",
             "--drain-timeout", "20", "--drain-admit", "2", "--log-level", "info"]


def haproxy_path() -> str:
    path = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK)
                                       else None)
    if not path:
        pytest.fail("haproxy is not installed: this test runs Debian's HAProxy "
                    "(tools/install-deps installs it: apt-get install haproxy)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_certs(d: str) -> tuple[str, str]:
    """A CA and a certificate for 127.0.0.1 it signs: (CA file, HAProxy's crt
    file: certificate then key). docs/operating.md's commands."""
    def run(*argv):
        subprocess.run(argv, cwd=d, check=True, capture_output=True, timeout=30)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("openssl", "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=forkbox test CA", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("openssl", "req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    run("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "ext.cnf", "-out", "server.crt")
    pem = os.path.join(d, "forkbox.pem")
    with open(pem, "wb") as out:
        for name in ("server.crt", "server.key"):
            with open(os.path.join(d, name), "rb") as f:
                out.write(f.read())
    os.chmod(pem, 0o600)
    return os.path.join(d, "ca.pem"), pem


def render_config(pem: str, sock: str, port: int, backends: list[int]) -> str:
    """deploy/haproxy/forkbox.cfg with this test's paths and ports; every other
    line as shipped. Each substitution must match exactly once, so the test
    fails rather than run something else if the recipe changes shape."""
    with open(CFG) as f:
        text = f.read()
    servers = "".join(f"    server fb{i + 1} 127.0.0.1:{p} maxconn {CAPACITY}\n"
                      for i, p in enumerate(backends))
    subs = [(r"(?m)^    log /dev/log local0$", "    log stdout format raw local0"),
            (r"/run/haproxy/admin\.sock", sock),
            (r"(?m)^    bind :443 ", f"    bind 127.0.0.1:{port} "),
            (r"crt /etc/haproxy/certs/forkbox\.pem ", f"crt {pem} "),
            (r"(?m)(?:^    server fb\d+ 127\.0\.0\.1:\d+ maxconn \d+\n)+", servers)]
    for pattern, repl in subs:
        text, n = re.subn(pattern, lambda _m, r=repl: r, text)
        assert n == 1, f"{CFG}: {pattern!r} matched {n} times"
    return text


class Proxy:
    """HAProxy in the foreground (-db) as this test's child; its log to a file."""

    def __init__(self, d: str, ca: str, pem: str, backends: list[int]):
        self.port = free_port()
        self.sock = os.path.join(d, "admin.sock")
        self.cfg = os.path.join(d, "haproxy.cfg")
        self.log = os.path.join(d, "haproxy.log")
        with open(self.cfg, "w") as f:
            f.write(render_config(pem, self.sock, self.port, backends))
        self.ssl = ssl.create_default_context(cafile=ca)
        self.url = f"wss://127.0.0.1:{self.port}/"
        exe = haproxy_path()
        check = subprocess.run([exe, "-c", "-f", self.cfg], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, f"haproxy -c: {check.stdout}{check.stderr}"
        with open(self.log, "wb") as logf:
            self.proc = subprocess.Popen([exe, "-db", "-f", self.cfg], stdin=subprocess.DEVNULL,
                                         stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def command(self, cmd: str) -> str:
        """One command on the admin socket (HAProxy's runtime API): its answer."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(self.sock)
            s.sendall(cmd.encode() + b"\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        return data.decode()

    def stats(self) -> dict[str, dict]:
        """`show stat`: {server name: its row} for the backend."""
        text = self.command("show stat").lstrip("# ")
        return {r["svname"]: r for r in csv.DictReader(io.StringIO(text))
                if r["pxname"] == "forkboxd"}

    def server_up(self, name: str) -> bool:
        try:
            return self.stats()[name]["status"] == "UP"
        except OSError:
            return False

    def log_text(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


SLOT_IDS: dict[int, IdBlock] = {}


def start_backend(port: int, slot: int) -> Daemon:
    """forkboxd number slot on port, ready (/ready 200). Daemons on one host
    need disjoint --id-ranges (a second one on a range refuses to start): each
    slot has a block of its own (tools/id_block.py), which its successor
    reuses (the old daemon has exited and reaped its sandboxes by then)."""
    ids = SLOT_IDS.setdefault(slot, IdBlock())
    d = Daemon(BASE_ARGS + ["--listen", f"127.0.0.1:{port}", "--id-range", ids.arg()],
               listen=False, token=TOKEN).start()
    ok = wait_until(lambda: _ready(port), 30, 0.02)
    if not ok:
        d.stop()
        raise AssertionError(f"forkboxd on port {port} not ready in 30 s:\n{d.stderr(3000)}")
    return d


def _ready(port: int) -> bool:
    try:
        return http_get(port, "/ready", 2)[0] == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    haproxy_path()  # fails (not skips) without it
    d = str(tmp_path_factory.mktemp("rolling"))
    ca, pem = make_certs(d)
    ports = [free_port() for _ in range(N_DAEMONS)]
    daemons: list[Daemon] = []
    proxy = None
    try:
        for i, p in enumerate(ports):
            daemons.append(start_backend(p, i))
        proxy = Proxy(d, ca, pem, ports)
        names = [f"fb{i + 1}" for i in range(N_DAEMONS)]
        if not wait_until(lambda: all(proxy.server_up(n) for n in names), 30, 0.05):
            raise AssertionError(f"haproxy did not see every backend up:\n{proxy.log_text()[-3000:]}")
        yield {"ports": ports, "daemons": daemons, "proxy": proxy, "ca": ca}
    finally:
        if proxy:
            proxy.stop()
        for dm in daemons:
            dm.stop()


# ---- turns -------------------------------------------------------------------

async def one_turn(url: str, ctx: ssl.SSLContext | None, i: int) -> float:
    """A host-like turn of two blocks (state kept between them, THINK apart);
    returns its latency: connect (TLS, proxy, 101) to the second block's output,
    minus THINK. Raises on any error."""
    kw = {"ssl": ctx} if ctx else {}
    t0 = time.monotonic()
    turn = await fc.Turn.connect(url, {}, token=TOKEN, open_timeout=30, **kw)
    try:
        r1 = await turn.run(f"x = {i}")
        await asyncio.sleep(THINK)
        r2 = await turn.run("print(x * 2)")
    finally:
        await turn.shutdown()
    took = time.monotonic() - t0 - THINK
    assert (r1.exit_code, r2.exit_code, r2.stdout) == (0, 0, f"{2 * i}\n"), (r1, r2)
    return took


def sequential(url: str, ctx, n: int) -> list[float]:
    async def go():
        return [await asyncio.wait_for(one_turn(url, ctx, i), 30) for i in range(n)]
    return asyncio.run(go())


class Load:
    """WORKERS clients running turns back to back through the proxy on a
    thread of their own until stop(): (start time, latency) of each turn that
    completed, (start time, error) of each that did not."""

    def __init__(self, url: str, ctx):
        self.url, self.ctx = url, ctx
        self.done: list[tuple[float, float]] = []
        self.failed: list[tuple[float, str]] = []
        self.started = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _worker(self, w: int) -> None:
        deadline = time.monotonic() + LOAD_TIME_LIMIT
        i = w * 100000
        while not self._stop.is_set() and time.monotonic() < deadline:
            i += 1
            self.started += 1
            t0 = time.monotonic()
            try:
                took = await asyncio.wait_for(one_turn(self.url, self.ctx, i), 40)
                self.done.append((t0, took))
            except Exception as e:  # noqa: BLE001  (every kind of failure counts)
                self.failed.append((t0, f"{type(e).__name__}: {e}"))

    async def _main(self) -> None:
        await asyncio.gather(*(self._worker(w) for w in range(WORKERS)))

    def start(self) -> "Load":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(LOAD_TIME_LIMIT + 45)
        assert not self._thread.is_alive(), "load did not stop"


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] * 1000 if s else float("nan")


def figures(xs: list[float]) -> str:
    return f"p50 {pct(xs, 50):.0f} ms, p99 {pct(xs, 99):.0f} ms, max {pct(xs, 100):.0f} ms (n={len(xs)})"


# ---- tests -------------------------------------------------------------------

def test_tls_and_token(cluster):
    proxy = cluster["proxy"]

    async def go():
        # The proxy's certificate is checked: a client that does not trust the CA is refused.
        with pytest.raises(ssl.SSLCertVerificationError):
            await fc.Turn.connect(proxy.url, {}, token=TOKEN, ssl=ssl.create_default_context())
        # The Authorization header goes through to forkboxd, which refuses a wrong token.
        with pytest.raises(websockets.exceptions.InvalidStatusCode) as exc:
            await fc.Turn.connect(proxy.url, {}, token="not-the-token", ssl=proxy.ssl)
        assert exc.value.status_code == 401
        return await one_turn(proxy.url, proxy.ssl, 21)
    asyncio.run(asyncio.wait_for(go(), 30))


@pytest.mark.parametrize("mode", ["admin", "plain"])
def test_rolling_upgrade(cluster, capsys, mode):
    """admin: docs/operating.md's roll (the proxy's admin socket drains the server
    first, then SIGTERM). plain: SIGTERM alone, as `systemctl restart` on the
    backend's host does; --drain-admit covers the proxy's health-check delay."""
    proxy: Proxy = cluster["proxy"]
    ports, daemons = cluster["ports"], cluster["daemons"]

    direct = sequential(f"ws://127.0.0.1:{ports[0]}/", None, N_SEQ)
    proxied = sequential(proxy.url, proxy.ssl, N_SEQ)

    load = Load(proxy.url, proxy.ssl).start()
    roll_log = []
    try:
        time.sleep(1.5)  # steady load before the roll
        roll_t0 = time.monotonic()
        logs = []  # the stderr of every daemon rolled
        for i, port in enumerate(ports):
            old = daemons[i]
            name = f"fb{i + 1}"
            t0 = time.monotonic()
            # docs/operating.md's roll: the proxy sends this daemon no new turn, then
            # SIGTERM (to forkboxd alone, as systemd's KillMode=mixed does)
            # lets its running turns finish.
            if mode == "admin":
                assert proxy.command(f"set server forkboxd/{name} state drain") == "\n"
            os.kill(old.pid, signal.SIGTERM)
            rc = old.wait_exit(40)
            assert rc == 0, f"old daemon on {port} exited {rc}:\n{old.stderr(3000)}"
            logs.append(old.stderr())
            old.stop()
            t_exit = time.monotonic()
            daemons[i] = start_backend(port, i)  # /ready 200
            if mode == "admin":
                assert proxy.command(f"set server forkboxd/{name} state ready") == "\n"
            assert wait_until(lambda: proxy.server_up(name), 30, 0.02), \
                f"haproxy did not see {name} up again:\n{proxy.log_text()[-3000:]}"
            roll_log.append(f"{name}: drained and exited in {t_exit - t0:.2f} s, "
                            f"successor ready and up in haproxy {time.monotonic() - t_exit:.2f} s")
        roll_t1 = time.monotonic()
        time.sleep(1.5)  # steady load after the roll
    finally:
        load.stop()

    stats = proxy.stats()["BACKEND"]
    logs += [d.stderr() for d in daemons]
    refused = {why: sum(log.count(why) for log in logs)  # forkboxd's refusal log lines
               for why in ("draining: the daemon is stopping", "busy: no turn slot free")}
    during = [took for t0, took in load.done if roll_t0 <= t0 < roll_t1]
    report = "\n".join([
        "",
        f"rolling upgrade through HAProxy (tests/integration/test_rolling.py, {mode}: "
        + ("admin socket drain, then SIGTERM)" if mode == "admin" else "SIGTERM alone)"),
        f"  turns (2 blocks each, {THINK * 1000:.0f} ms host think time excluded):",
        f"  direct, one daemon, ws://, sequential:  {figures(direct)}",
        f"  through the proxy, wss://, sequential: {figures(proxied)}",
        f"  under load ({WORKERS} clients, {N_DAEMONS} daemons x capacity {CAPACITY}):",
        f"    all: {figures([t for _, t in load.done])}",
        f"    during the roll ({roll_t1 - roll_t0:.1f} s): {figures(during)}",
        f"  turns run {load.started}, completed {len(load.done)}, failed {len(load.failed)}",
        f"  upgrades forkboxd refused with 503 (the proxy retries them): "
        f"{refused['draining: the daemon is stopping']} draining, "
        f"{refused['busy: no turn slot free']} busy; haproxy retries {stats['wretr']}, "
        f"redispatches {stats['wredis']}, most turns queued at once {stats['qmax']}",
        *("  " + line for line in roll_log),
    ])
    with capsys.disabled():
        print(report)
    builddir = os.path.dirname(os.environ.get("FORKBOX_DISTDIR", ""))
    if builddir and os.path.isdir(builddir):
        with open(os.path.join(builddir, f"test-rolling-{mode}.txt"), "w") as f:
            f.write(report.lstrip("\n") + "\n")

    assert not load.failed, f"{len(load.failed)} turns failed: {load.failed[:5]}\n" \
                            f"{proxy.log_text()[-4000:]}"
    assert len(load.done) == load.started
    assert len(during) >= 10, f"too few turns ran during the roll: {len(during)}"
