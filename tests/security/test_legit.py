"""Legitimate work that must keep working under the isolation and the policy:
stdlib imports, threads, subprocesses of /bin/sh and of the interpreter,
tempfiles, sqlite3 in /tmp, AF_UNIX sockets, fork, a 50 MB file in /workspace
returned in the snapshot, and a tool call round trip.
"""

import hashlib

import pytest

import sbx

MODULES = ["json", "re", "sqlite3", "decimal", "asyncio", "ssl", "ctypes", "hashlib", "zlib", "bz2",
           "lzma", "tempfile", "subprocess", "threading", "multiprocessing", "concurrent.futures",
           "socket", "select", "selectors", "unicodedata", "datetime", "zoneinfo", "csv", "email",
           "xml.etree.ElementTree", "urllib.request", "http.client", "uuid", "random", "secrets",
           "statistics", "fractions", "pickle", "shutil", "pathlib", "typing", "dataclasses",
           "logging", "argparse", "base64", "struct", "array", "mmap", "signal", "resource",
           "platform", "locale", "gzip", "tarfile", "zipfile"]

BLOCK = r'''
import importlib, json, os, sys, threading, subprocess, tempfile, sqlite3, socket, asyncio
R = {"imports": {}}
for m in MODULES:
    try:
        importlib.import_module(m)
        R["imports"][m] = "ok"
    except BaseException as e:
        R["imports"][m] = f"{type(e).__name__}: {e}"

def _threads():
    out = [0] * 8
    def work(i):
        out[i] = sum(range(i * 1000))
    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts: t.start()
    for t in ts: t.join()
    return out == [sum(range(i * 1000)) for i in range(8)]
R["threads"] = try_(_threads)

def _pool():
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        return list(ex.map(lambda x: x * x, range(10))) == [x * x for x in range(10)]
R["thread_pool"] = try_(_pool)

def _run(argv):
    p = subprocess.run(argv, capture_output=True, timeout=30)
    return {"rc": p.returncode, "out": p.stdout.decode(), "err": p.stderr.decode()[-300:]}
R["subprocess_sh"] = try_(lambda: _run(["/bin/sh", "-c", "echo hi"]))
R["subprocess_interpreter"] = try_(lambda: _run([sys.executable, "-c", "print(1)"]))
R["subprocess_pipeline"] = try_(lambda: _run(["/bin/sh", "-c", "printf 'b\\na\\n' | sort | tr a-z A-Z"]))
R["subprocess_shell_true"] = try_(lambda: subprocess.check_output("echo $((6*7))", shell=True, timeout=30).decode())
R["os_system"] = try_(lambda: os.system("true"))

def _tempfiles():
    with tempfile.NamedTemporaryFile("w+", delete=True) as f:
        f.write("hello")
        f.flush()
        f.seek(0)
        ok1 = f.read() == "hello" and f.name.startswith("/tmp/")
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x")
        open(p, "w").write("y")
        ok2 = open(p).read() == "y"
    return [tempfile.gettempdir(), ok1, ok2]
R["tempfiles"] = try_(_tempfiles)

def _sqlite():
    db = sqlite3.connect("/tmp/fbx.db")
    db.execute("create table t(x integer)")
    db.executemany("insert into t values (?)", [(i,) for i in range(1000)])
    db.commit()
    s = db.execute("select sum(x) from t").fetchone()[0]
    db.close()
    db = sqlite3.connect("/tmp/fbx.db")
    s2 = db.execute("select count(*) from t").fetchone()[0]
    db.close()
    os.unlink("/tmp/fbx.db")
    return [s, s2]
R["sqlite3_tmp"] = try_(_sqlite)

def _unix():
    a, b = socket.socketpair()
    a.sendall(b"ping")
    r1 = b.recv(4)
    path = "/tmp/fbx.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(path)
    s, _ = srv.accept()
    c.sendall(b"pong")
    r2 = s.recv(4)
    for x in (a, b, srv, c, s):
        x.close()
    os.unlink(path)
    return (r1 + r2).decode()
R["unix_sockets"] = try_(_unix)

def _fork():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    _, st = os.waitpid(pid, 0)
    return os.WEXITSTATUS(st)
R["fork"] = try_(_fork)

async def _amain():
    async def sq(x):
        await asyncio.sleep(0.01)
        return x * x
    return sum(await asyncio.gather(*(sq(i) for i in range(5))))
R["asyncio"] = try_(lambda: asyncio.run(_amain()))

def _mp():
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=q.put, args=(42,))
    p.start()
    v = q.get(timeout=20)
    p.join(20)
    return [v, p.exitcode]
R["multiprocessing_fork"] = try_(_mp)

R["workspace_cwd"] = os.getcwd()
R["write_workspace_relative"] = try_(lambda: (open("note.txt", "w").write("kept"), os.path.exists("/workspace/note.txt"))[1])
R["mkfifo_tmp"] = try_(lambda: (os.mkfifo("/tmp/fbx.fifo"), os.unlink("/tmp/fbx.fifo"), "ok")[2])
R["decimal_ssl"] = try_(lambda: [str(__import__("decimal").Decimal("1.1") + __import__("decimal").Decimal("2.2")), __import__("ssl").OPENSSL_VERSION.split()[0]])
R["hashlib"] = try_(lambda: __import__("hashlib").sha256(b"abc").hexdigest()[:8])
R["urandom"] = try_(lambda: len(os.urandom(32)))
report(R)
'''


@pytest.fixture(scope="module")
def legit(daemon):
    r = daemon.run(sbx.prelude(f"MODULES = {MODULES!r}\n" + BLOCK), timeout=120)
    assert r.blocks and r.last.completed and r.last.exit_code == 0, f"legit block failed: {r!r}"
    return r.last


@pytest.mark.parametrize("mod", MODULES)
def test_stdlib_import(legit, mod):
    assert legit.report()["imports"][mod] == "ok"


EXPECT = {
    "threads": True,
    "thread_pool": True,
    "subprocess_sh": {"rc": 0, "out": "hi\n", "err": ""},
    "subprocess_interpreter": {"rc": 0, "out": "1\n", "err": ""},
    "subprocess_pipeline": {"rc": 0, "out": "A\nB\n", "err": ""},
    "subprocess_shell_true": "42\n",
    "os_system": 0,
    "tempfiles": ["/tmp", True, True],
    "sqlite3_tmp": [499500, 1000],
    "unix_sockets": "pingpong",
    "fork": 7,
    "asyncio": 30,
    "multiprocessing_fork": [42, 0],
    "workspace_cwd": "/workspace",
    "write_workspace_relative": True,
    "mkfifo_tmp": "ok",
    "hashlib": "ba7816bf",
    "urandom": 32,
}


@pytest.mark.parametrize("case", list(EXPECT))
def test_works(legit, case):
    got = legit.report()[case]
    assert got == EXPECT[case], f"{case}: {got!r}"


def test_decimal_and_ssl(legit):
    got = legit.report()["decimal_ssl"]
    assert got == ["3.3", "OpenSSL"], got


def test_clean_stderr(legit):
    assert legit.stderr == "", legit.stderr[-2000:]


def test_snapshot_returns_relative_file(legit):
    files = sbx.read_targz(legit.archive)
    assert files.get("note.txt") == b"kept", sorted(files)


BIG = r'''
import hashlib, os
data = os.urandom(50 * 1000 * 1000)
with open("/workspace/big.bin", "wb") as f:
    f.write(data)
print(hashlib.sha256(data).hexdigest())
'''


def test_large_file_in_workspace_returned(daemon):
    r = daemon.run(BIG, timeout=180)
    b = r.last
    assert b.completed and b.exit_code == 0, repr(r)
    files = sbx.read_targz(b.archive)
    assert "big.bin" in files, sorted(files)
    assert len(files["big.bin"]) == 50 * 1000 * 1000
    assert hashlib.sha256(files["big.bin"]).hexdigest() == b.stdout.strip()


def test_tool_call_round_trip(daemon):
    code = ("from tools import echo\n"
            "print('ECHO:', echo(message='hi'))\n"
            "import adk_code_mode_sandbox._rpc_client as rc\n"
            "print(rc.call('echo', {'message': 'direct'}))\n")
    r = daemon.run(code, timeout=60)
    b = r.last
    assert b.completed and b.exit_code == 0, repr(r)
    assert b.stdout == "ECHO: {'echoed': 'hi'}\n{'echoed': 'direct'}\n", repr(b)
    assert [c["name"] for c in b.tool_calls] == ["echo", "echo"]
    assert [c["args"] for c in b.tool_calls] == [{"message": "hi"}, {"message": "direct"}]
    assert r.ready and r.ready.get("protocol_version") == 2, r.ready


def test_unknown_tool_error_is_an_exception(daemon):
    code = ("import adk_code_mode_sandbox._rpc_client as rc\n"
            "try:\n    rc.call('nope', {})\nexcept rc.ToolError as e:\n    print('ToolError', e)\n")
    r = daemon.run(code, timeout=60)
    assert r.last.completed and r.last.stdout.startswith("ToolError ToolNotFound:"), repr(r)


LOOPBACK = r'''
import http.server, socket, threading, urllib.request
R = {}
def _http():
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"hello from " + self.path.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.server_address[1]}/x", timeout=10) as r:
            return [r.status, r.read().decode()]
    finally:
        srv.shutdown()
        srv.server_close()
R["http_server"] = try_(_http)
def _udp_echo(family, host):
    a = socket.socket(family, socket.SOCK_DGRAM)
    b = socket.socket(family, socket.SOCK_DGRAM)
    a.settimeout(5)
    b.settimeout(5)
    a.bind((host, 0))
    b.sendto(b"ping", a.getsockname()[:2])
    data, peer = a.recvfrom(16)
    a.sendto(data.upper(), peer)
    got = b.recvfrom(16)[0].decode()
    a.close()
    b.close()
    return got
R["udp_echo_v4"] = try_(lambda: _udp_echo(socket.AF_INET, "127.0.0.1"))
R["udp_echo_v6"] = try_(lambda: _udp_echo(socket.AF_INET6, "::1"))
def _tcp_v6_localhost():
    srv = socket.create_server(("::1", 0), family=socket.AF_INET6)
    c = socket.create_connection(("::1", srv.getsockname()[1]), timeout=5)
    s, _ = srv.accept()
    c.sendall(b"v6")
    got = s.recv(2).decode()
    for x in (c, s, srv):
        x.close()
    return got
R["tcp_v6"] = try_(_tcp_v6_localhost)
R["localhost_resolves"] = try_(lambda: sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)}))
report(R)
'''


def test_servers_on_own_loopback(daemon):
    """A local HTTP server, UDP echo on 127.0.0.1 and ::1, TCP on ::1: code that
    talks to itself works (the sandbox's own loopback, private to the turn)."""
    r = daemon.run(sbx.prelude(LOOPBACK), timeout=90)
    assert r.last.completed and r.last.exit_code == 0, repr(r)
    rep = r.last.report()
    assert rep["http_server"] == [200, "hello from /x"], rep
    assert rep["udp_echo_v4"] == "PING", rep
    assert rep["udp_echo_v6"] == "PING", rep
    assert rep["tcp_v6"] == "v6", rep
    assert "127.0.0.1" in rep["localhost_resolves"], rep


ETC_FILES = r'''
import mimetypes, socket
R = {}
R["getservbyname"] = try_(lambda: [socket.getservbyname("http", "tcp"), socket.getservbyname("domain", "udp")])
R["getprotobyname"] = try_(lambda: [socket.getprotobyname("tcp"), socket.getprotobyname("udp")])
R["getaddrinfo_service"] = try_(lambda: socket.getaddrinfo("127.0.0.1", "https", type=socket.SOCK_STREAM)[0][4][1])
R["mimetypes"] = try_(lambda: [mimetypes.guess_type("a.csv")[0], mimetypes.guess_type("a.parquet")[0] or "", mimetypes.guess_extension("image/svg+xml")])
report(R)
'''


def test_public_etc_files(daemon):
    """Service and protocol names (/etc/services, /etc/protocols) and MIME types
    (/etc/mime.types) resolve as on a normal Debian host."""
    r = daemon.run(sbx.prelude(ETC_FILES), timeout=60)
    assert r.last.completed and r.last.exit_code == 0, repr(r)
    rep = r.last.report()
    assert rep["getservbyname"] == [80, 53], rep
    assert rep["getprotobyname"] == [6, 17], rep
    assert rep["getaddrinfo_service"] == 443, rep
    assert rep["mimetypes"][0] == "text/csv" and rep["mimetypes"][2] == ".svg", rep


MATPLOTLIB = r'''
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(3, 2), dpi=50)
ax.plot([0, 1, 2], [2, 0, 1], label="line")
ax.set_title("forkbox")
ax.legend()
fig.savefig("/workspace/plot.png")
print(matplotlib.matplotlib_fname(), matplotlib.rcParams["backend"])
'''


def test_matplotlib_renders_png(daemon):
    """Debian keeps matplotlib's defaults in /etc/matplotlibrc (mpl-data's copy is
    a symlink to it): with it in the sandbox's /etc, a figure renders to a PNG in
    /workspace, with nothing on stderr (fontconfig finds /etc/fonts too)."""
    r = daemon.run(MATPLOTLIB, timeout=120)
    b = r.last
    assert b.completed and b.exit_code == 0, repr(r)
    assert b.stderr == "", b.stderr[-2000:]
    assert b.stdout.split() == ["/etc/matplotlibrc", "agg"], b.stdout
    png = sbx.read_targz(b.archive).get("plot.png")
    assert png and png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 500, (png or b"")[:16]
