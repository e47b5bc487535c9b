"""`forkbox sandbox` over the spec 8.2 stream transports, driven the way the
reference's Docker host drives its container: the test is the host. It
listens (127.0.0.1 for TCP, a Unix socket) or makes a socketpair (an
inherited fd), starts the sandbox with the spec 8.1/8.3 variables, reads and
checks the token line, and then speaks frames one per line: the block,
tool-call and error cases of the WebSocket suite, the shared workspace and
tools dir, isolation, and the stream-only rules (shutdown exits 0, EOF or an
undecodable line exits 1, unknown kinds are noted on stderr).

Run as root (isolation needs it), from meson (`meson test -C build stream`)
or by hand: FORKBOX=build/src/forkbox python3 -m pytest -q tests/stream."""

import json
import os
import re
import secrets
import select
import socket
import subprocess
import time

import pytest

SRCDIR = os.environ.get("FORKBOX_SRCDIR", os.path.join(os.path.dirname(__file__), "..", ".."))
FORKBOX = os.environ.get("FORKBOX", os.path.join(SRCDIR, "build", "src", "forkbox"))
TIMEOUT = 60.0

TOOLS_INIT = '''\
from adk_code_mode_sandbox._rpc_client import call


def echo(**kw):
    return call("echo", kw)


def fail(**kw):
    return call("fail", kw)
'''


def host_tool(name, args):
    """The host's tools: (ok, value, error)."""
    if name == "echo":
        return True, {"echoed": args}, None
    return False, None, {"type": "ValueError", "message": "no such luck", "trace": None}


class Sandbox:
    """One `forkbox sandbox` and the host's end of its stream."""

    def __init__(self, proc, rfile, wfile, stderr_path, closers=()):
        self.proc = proc
        self.rfile = rfile   # raw fd to read frames from
        self.wfile = wfile   # raw fd to write frames to
        self.buf = bytearray()
        self.scanned = 0     # self.buf[:scanned] holds no \n (a long line is scanned once)
        self.stderr_path = stderr_path
        self.closers = list(closers)

    def send_raw(self, data: bytes):
        view = memoryview(data)
        while view:
            n = os.write(self.wfile, view)
            view = view[n:]

    def send(self, obj):
        self.send_raw(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def recv(self, timeout=TIMEOUT):
        """The next frame, or None at EOF."""
        deadline = time.monotonic() + timeout
        while (nl := self.buf.find(b"\n", self.scanned)) < 0:
            self.scanned = len(self.buf)
            left = deadline - time.monotonic()
            assert left > 0, f"no frame within {timeout}s; stderr:\n{self.stderr()}"
            r, _, _ = select.select([self.rfile], [], [], left)
            if not r:
                continue
            chunk = os.read(self.rfile, 1 << 20)
            if not chunk:
                assert self.buf == b"", self.buf[:200]
                return None
            self.buf += chunk
        line = self.buf[:nl]
        del self.buf[:nl + 1]
        self.scanned = 0
        return json.loads(line)

    def run(self, code, timeout=TIMEOUT):
        """One block: (frames before done, done, output). Tool calls answered."""
        self.send({"code": code, "kind": "run"})
        seen = []
        while True:
            f = self.recv(timeout)
            assert f is not None, f"EOF during a block; stderr:\n{self.stderr()}"
            if f["kind"] == "tool_call":
                ok, value, error = host_tool(f["name"], f["args"])
                self.send({"id": f["id"], "ok": ok, "value": value, "error": error,
                           "kind": "tool_result"})
            if f["kind"] == "done":
                out = self.recv(timeout)
                assert out["kind"] == "output", out
                assert out["exit_code"] == f["exit_code"], (f, out)
                return seen, f, out
            seen.append(f)

    def ready(self):
        f = self.recv()
        assert f["kind"] == "ready" and f["protocol_version"] == 2, f
        assert f["python_version"].startswith("3."), f
        return f

    def stderr(self):
        with open(self.stderr_path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")

    def wait(self, timeout=TIMEOUT):
        return self.proc.wait(timeout=timeout)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        for fd in {self.rfile, self.wfile}:
            try:
                os.close(fd)
            except OSError:
                pass
        for c in self.closers:
            c()


def make_dirs(tmp_path):
    work = tmp_path / "ws"
    tools = tmp_path / "pkg" / "tools"
    tools.mkdir(parents=True)
    (tools / "__init__.py").write_text(TOOLS_INIT)
    return work, tools


def base_env(work, tools, extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADK_CODE_MODE_")}
    env["ADK_CODE_MODE_WORKDIR"] = str(work)
    env["ADK_CODE_MODE_TOOLS_DIR"] = str(tools)
    env.update(extra or {})
    return env


def spawn(tmp_path, env, pass_fds=(), fd_map=None, args=()):
    """Start forkbox sandbox; fd_map {child_fd: our_fd} is set up in the child."""
    errf = open(tmp_path / "stderr.txt", "wb")

    def setup():
        for target, fd in (fd_map or {}).items():
            os.dup2(fd, target)
    proc = subprocess.Popen([FORKBOX, "sandbox", *args], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=errf, preexec_fn=setup,
                            pass_fds=tuple(pass_fds))
    errf.close()
    return proc


def start(transport, tmp_path, extra_env=None, args=(), work=None):
    """A sandbox on the given transport: 'fd' (socketpair as fd 3), 'fd-rw'
    (two pipes, ADK_CODE_MODE_CONTROL_FD=R,W), 'unix' or 'tcp'."""
    w, tools = make_dirs(tmp_path)
    env = base_env(work or w, tools, extra_env)
    err = str(tmp_path / "stderr.txt")
    if transport == "fd":
        ours, theirs = socket.socketpair()
        proc = spawn(tmp_path, env, pass_fds=(3,), fd_map={3: theirs.fileno()}, args=args)
        theirs.close()
        fd = ours.detach()
        return Sandbox(proc, fd, fd, err)
    if transport == "fd-rw":
        to_r, to_w = os.pipe()      # host -> sandbox
        from_r, from_w = os.pipe()  # sandbox -> host
        env["ADK_CODE_MODE_CONTROL_FD"] = "7,9"
        proc = spawn(tmp_path, env, pass_fds=(7, 9), fd_map={7: to_r, 9: from_w}, args=args)
        os.close(to_r)
        os.close(from_w)
        return Sandbox(proc, from_r, to_w, err)
    if transport == "unix":
        path = str(tmp_path / "ctl.sock")
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsock.bind(path)
        lsock.listen(4)
        env["ADK_CODE_MODE_CONTROL_SOCKET"] = path
        proc = spawn(tmp_path, env, args=args)
        lsock.settimeout(30)
        conn, _ = lsock.accept()
        lsock.close()
        return Sandbox(proc, conn.detach(), None, err)._same_fd()
    if transport == "tcp":
        token = secrets.token_hex(16)
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(4)
        port = lsock.getsockname()[1]
        env["ADK_CODE_MODE_CONTROL_TCP"] = f"127.0.0.1:{port}"
        env["ADK_CODE_MODE_CONTROL_TOKEN"] = token
        proc = spawn(tmp_path, env, args=args)
        conn = accept_with_token(lsock, token)
        lsock.close()
        return Sandbox(proc, conn.detach(), None, err)._same_fd()
    raise ValueError(transport)


def _same_fd(self):
    self.wfile = self.rfile
    return self


Sandbox._same_fd = _same_fd


def read_token_line(conn, deadline):
    """The first line, at most 512 bytes with its \\n, 5 s per byte (spec 8.2)."""
    line = b""
    while not line.endswith(b"\n"):
        if len(line) >= 512 or time.monotonic() > deadline:
            return None
        conn.settimeout(5)
        try:
            b = conn.recv(1)
        except socket.timeout:
            return None
        if not b:
            return None
        line += b
    return line[:-1]


def accept_with_token(lsock, token, seen=None):
    """As the Docker host: accept until one connection presents the token
    (compared in constant time), for at most 30 s; others are dropped."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lsock.settimeout(max(0.1, deadline - time.monotonic()))
        conn, _ = lsock.accept()
        line = read_token_line(conn, deadline)
        if seen is not None:
            seen.append(line)
        if line is not None and secrets.compare_digest(line, token.encode()):
            conn.settimeout(None)
            return conn
        conn.close()
    raise AssertionError("no connection presented the token")


@pytest.fixture
def sandbox(tmp_path):
    s = start("fd", tmp_path)
    yield s
    s.close()


# --------------------------------------------------------------- transports

@pytest.mark.parametrize("transport", ["fd", "fd-rw", "unix", "tcp"])
def test_block_and_tool_call_on_each_transport(tmp_path, transport):
    s = start(transport, tmp_path)
    try:
        s.ready()
        seen, done, out = s.run("from tools import echo\nprint('ECHO:', echo(message='x'))")
        assert [f["kind"] for f in seen] == ["tool_call"], seen
        call = seen[0]
        assert call["name"] == "echo" and call["args"] == {"message": "x"}, call
        assert call["timeout"] is None and re.fullmatch(r"[0-9a-f]{32}", call["id"]), call
        assert done["exit_code"] == 0, out
        assert out["stdout"] == "ECHO: {'echoed': {'message': 'x'}}\n" and out["stderr"] == "", out
        s.send({"kind": "shutdown"})
        assert s.recv() is None
        assert s.wait() == 0, s.stderr()
    finally:
        s.close()


MiB = 1 << 20


def big_frames_block(s, n, out_n=None, timeout=TIMEOUT):
    """A block that sends n bytes of tool arguments, gets n bytes of result
    from the host and prints out_n (default n) bytes: each frame longer than
    any socket buffer, both ways. Arguments and result arrive whole; stdout
    whole up to --output-cap (default 16 MiB: 8 head, 8 tail), cut with the
    note beyond it. Returns the output frame."""
    out_n = n if out_n is None else out_n
    s.send({"code": f"import sys\nfrom tools import echo\n"
                    f"r = echo(data='a' * {n})\n"
                    f"sys.stderr.write(f'{{len(r)}} {{set(r)}}')\n"
                    f"sys.stdout.write('b' * {out_n})", "kind": "run"})
    call = s.recv(timeout)
    assert call["kind"] == "tool_call", call
    assert call["args"] == {"data": "a" * n}
    s.send({"id": call["id"], "ok": True, "value": "c" * n, "error": None, "kind": "tool_result"})
    done = s.recv(timeout)
    out = s.recv(timeout)
    assert (done["kind"], done["exit_code"], out["kind"]) == ("done", 0, "output"), \
        (done, out["stderr"][-2000:], s.stderr())
    assert out["stderr"] == f"{n} {{'c'}}", out["stderr"][-2000:]
    return out


@pytest.mark.parametrize("transport", ["fd", "unix", "tcp"])
def test_frames_of_1_and_16_mib_both_ways_on_each_transport(tmp_path, transport):
    """Frames far longer than a socket buffer go both ways on every transport
    (they hung forever on a one-socket transport: the relay's write watch
    was never armed)."""
    s = start(transport, tmp_path)
    try:
        s.ready()
        for n in (MiB, 16 * MiB):
            out = big_frames_block(s, n, timeout=15)
            assert out["stdout"] == "b" * n, len(out["stdout"])
        s.send({"kind": "shutdown"})
        assert s.wait() == 0, s.stderr()
    finally:
        s.close()


def test_frames_of_100_mib_both_ways(tmp_path):
    """100 MiB of tool arguments and of result, exact; 100 MiB printed comes
    back as --output-cap's head and tail with the note in between."""
    s = start("fd", tmp_path)
    try:
        s.ready()
        out = big_frames_block(s, 100 * MiB, timeout=60)
        note = f"\n[forkbox: {100 * MiB - 16 * MiB} bytes of stdout dropped]\n"
        assert out["stdout"] == "b" * (8 * MiB) + note + "b" * (8 * MiB), len(out["stdout"])
        s.send({"kind": "shutdown"})
        assert s.wait() == 0, s.stderr()
    finally:
        s.close()


def nested(levels):
    v = []
    for _ in range(levels - 1):
        v = [v]
    return v


def test_nesting_limit_both_ways(tmp_path):
    """One limit (512 levels, the frame's object included) in the relay as in
    forkboxd: a tool_call at it and a tool_result at it pass; one level more
    from the sandbox ends the turn as a protocol error, and from the host as
    an undecodable line, before the other side sees it."""
    code = ("from tools import echo\nv = []\nfor _ in range({} - 1):\n    v = [v]\n"
            "r = echo(message=v)\nn = 0\nwhile r:\n    r, n = r[0], n + 1\nprint(n)")
    s = start("fd", tmp_path)
    try:
        s.ready()
        s.send({"code": code.format(510), "kind": "run"})
        call = s.recv()
        assert call["kind"] == "tool_call" and call["args"] == {"message": nested(510)}
        # {"id":...,"value":V,...}: V may nest 511 deep
        s.send({"id": call["id"], "ok": True, "value": nested(511), "error": None,
                "kind": "tool_result"})
        _, out = s.recv(), s.recv()
        assert out["stdout"] == "510\n", out
        s.send({"code": code.format(511), "kind": "run"})
        assert s.recv() is None
        assert s.wait() == 1
        assert "forkbox sandbox: sandbox protocol error: JSON nested too deeply\n" in s.stderr()
    finally:
        s.close()
    d = tmp_path / "host"
    d.mkdir()
    s = start("fd", d)
    try:
        s.ready()
        s.send({"code": code.format(3), "kind": "run"})
        call = s.recv()
        s.send({"id": call["id"], "ok": True, "value": nested(512), "error": None,
                "kind": "tool_result"})
        assert s.recv() is None
        assert s.wait() == 1
        assert ("forkbox sandbox: undecodable frame from the host (JSON nested too deeply)\n"
                in s.stderr()), s.stderr()
    finally:
        s.close()


def test_tcp_token_line_first_and_wrong_token_ignored(tmp_path):
    """The token line is the first thing on the connection, and a connection
    presenting another token (here, an impostor that connects first) is
    dropped by the host without disturbing the sandbox's own."""
    w, tools = make_dirs(tmp_path)
    token = secrets.token_hex(16)
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    port = lsock.getsockname()[1]
    impostor = socket.create_connection(("127.0.0.1", port))
    impostor.sendall(b"not-the-token\n")
    env = base_env(w, tools, {"ADK_CODE_MODE_CONTROL_TCP": f"localhost:{port}",
                              "ADK_CODE_MODE_CONTROL_TOKEN": token})
    proc = spawn(tmp_path, env)
    seen = []
    conn = accept_with_token(lsock, token, seen)
    lsock.close()
    impostor.close()
    s = Sandbox(proc, conn.detach(), None, str(tmp_path / "stderr.txt"))._same_fd()
    try:
        assert seen == [b"not-the-token", token.encode()], seen
        s.ready()
        # The token never reaches user code, in the environment or anywhere
        # in the sandbox's /proc.
        _, _, out = s.run(
            f"import os, glob\n"
            f"hits = [p for p in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline')\n"
            f"        if {token!r}.encode() in open(p, 'rb').read()]\n"
            f"print(sorted(k for k in os.environ if k.startswith('ADK')), hits)")
        assert out["stdout"] == "[] []\n", out
        s.send({"kind": "shutdown"})
        assert s.wait() == 0
    finally:
        s.close()


def test_control_http_is_refused_pointing_at_forkboxd(tmp_path):
    w, tools = make_dirs(tmp_path)
    env = base_env(w, tools, {"ADK_CODE_MODE_CONTROL_HTTP": "0"})
    proc = spawn(tmp_path, env)
    assert proc.wait(timeout=30) == 2
    err = (tmp_path / "stderr.txt").read_text()
    assert "ADK_CODE_MODE_CONTROL_HTTP" in err and "forkboxd" in err, err


def test_fd_that_is_not_open_is_refused(tmp_path):
    w, tools = make_dirs(tmp_path)
    proc = spawn(tmp_path, base_env(w, tools, {"ADK_CODE_MODE_CONTROL_FD": "5"}))
    assert proc.wait(timeout=30) == 2
    assert "fd 5 is not open" in (tmp_path / "stderr.txt").read_text()


# ------------------------------------------------------ blocks and errors

def test_exit_codes_exceptions_and_syntax_errors(sandbox):
    sandbox.ready()
    _, d, out = sandbox.run("print('hello world')")
    assert (d["exit_code"], out["stdout"], out["stderr"]) == (0, "hello world\n", "")
    _, d, out = sandbox.run("import sys\nsys.stderr.write('e1\\n')\nsys.exit(2)")
    assert (d["exit_code"], out["stderr"]) == (2, "e1\n"), out
    _, d, out = sandbox.run("import sys; sys.exit('msg')")
    assert (d["exit_code"], out["stderr"]) == (1, "msg\n"), out
    _, d, out = sandbox.run("raise ValueError('bad')")
    assert d["exit_code"] == 1 and "ValueError: bad" in out["stderr"], out
    assert 'File "<code-mode>", line 1' in out["stderr"], out
    _, d, out = sandbox.run("print('ran')\nif True print('bad')")
    assert d["exit_code"] == 1 and "SyntaxError" in out["stderr"] and out["stdout"] == "", out
    _, d, out = sandbox.run("import os; os.write(1, b'fd-level\\n')")
    assert out["stdout"] == "fd-level\n", out


def test_tool_error_result_raises_tool_error(sandbox):
    sandbox.ready()
    _, d, out = sandbox.run("from tools import fail\nfail(a=1)")
    assert d["exit_code"] == 1, out
    assert out["stderr"].rstrip().endswith("ToolError: ValueError: no such luck"), out
    _, d, out = sandbox.run(
        "from tools import fail, echo\n"
        "try:\n    fail()\nexcept Exception as e:\n    print(type(e).__name__, str(e))\n"
        "print(echo(n=2))")
    assert out["stdout"] == "ToolError ValueError: no such luck\n{'echoed': {'n': 2}}\n", out


def test_globals_and_cwd_persist_across_blocks(sandbox, tmp_path):
    sandbox.ready()
    sandbox.run("x = 10\nimport os\nos.mkdir('sub'); os.chdir('sub')")
    _, _, out = sandbox.run("import os\nprint(x * 4, __name__, os.getcwd())")
    assert out["stdout"] == f"40 __main__ {tmp_path / 'ws' / 'sub'}\n", out


def test_unknown_and_unexpected_kinds_are_noted_and_ignored(sandbox):
    sandbox.ready()
    sandbox.send({"id": "x", "ok": True, "value": None, "error": None, "kind": "tool_result"})
    sandbox.send({"exit_code": 0, "kind": "done"})
    _, d, out = sandbox.run("print('still here')")
    assert out["stdout"] == "still here\n", out
    err = sandbox.stderr()
    assert "[adk-code-mode-sandbox] unexpected frame kind: ToolResult\n" in err, err
    assert "[adk-code-mode-sandbox] unexpected frame kind: Done\n" in err, err


def test_shutdown_exits_0(sandbox):
    sandbox.ready()
    sandbox.send({"kind": "shutdown"})
    assert sandbox.wait() == 0, sandbox.stderr()


def test_eof_exits_1(sandbox):
    sandbox.ready()
    sandbox.run("print(1)")
    socket.socket(fileno=os.dup(sandbox.wfile)).shutdown(socket.SHUT_WR)
    assert sandbox.recv() is None
    assert sandbox.wait() == 1
    assert "end of file" in sandbox.stderr(), sandbox.stderr()


@pytest.mark.parametrize("line", [b"\n", b"{not json\n", b"[1,2]\n", b'{"kind":"nope"}\n',
                                  b'\xff{"kind":"run"}\n'])
def test_undecodable_line_exits_1(tmp_path, line):
    s = start("fd", tmp_path)
    try:
        s.ready()
        s.send_raw(line)
        assert s.recv() is None
        assert s.wait() == 1
        assert "undecodable frame from the host" in s.stderr(), s.stderr()
    finally:
        s.close()


def test_block_timeout(tmp_path):
    s = start("fd", tmp_path, args=("--block-timeout", "1"))
    try:
        s.ready()
        _, d, out = s.run("while True: pass", timeout=30)
        assert d["exit_code"] == 124 and "block-timeout" in out["stderr"], out
        assert s.wait() == 1
    finally:
        s.close()


# ----------------------------------------------- the workspace and the tools

def test_workspace_is_the_hosts_directory(tmp_path):
    """Files a block writes are on the host at once (before done is read),
    as the workdir's owner (the bind is idmapped); the host's files are
    visible inside; the workdir is the cwd."""
    work = tmp_path / "ws"
    work.mkdir()
    os.chown(work, 4321, 4322)
    (work / "from_host.txt").write_text("host data")
    os.chown(work / "from_host.txt", 4321, 4322)
    s = start("fd", tmp_path, work=work)
    try:
        s.ready()
        s.send({"code": "import os\nprint(os.getcwd(), open('from_host.txt').read())\n"
                        "open('out.txt', 'w').write('sandbox data')\nos.mkdir('d')\n"
                        "from tools import echo\necho(step=1)\nprint(os.stat('out.txt').st_uid)",
                "kind": "run"})
        call = s.recv()
        assert call["kind"] == "tool_call", call
        # While the block waits for its tool call, its file is already there.
        assert (work / "out.txt").read_text() == "sandbox data"
        st = os.stat(work / "out.txt")
        assert (st.st_uid, st.st_gid) == (4321, 4322), st
        assert os.stat(work / "d").st_uid == 4321
        s.send({"id": call["id"], "ok": True, "value": 1, "error": None, "kind": "tool_result"})
        assert s.recv()["kind"] == "done"
        out = s.recv()
        assert out["stdout"] == f"{work} host data\n0\n", out
    finally:
        s.close()


def test_missing_workdir_is_made_and_writable(tmp_path):
    s = start("fd", tmp_path)
    try:
        s.ready()
        _, d, out = s.run("open('made.txt', 'w').write('ok'); print('ok')")
        assert d["exit_code"] == 0, out
        assert (tmp_path / "ws" / "made.txt").read_text() == "ok"
        # Made by forkbox sandbox (root), whose the block's files then are.
        assert os.stat(tmp_path / "ws").st_uid == 0
        assert os.stat(tmp_path / "ws" / "made.txt").st_uid == 0
    finally:
        s.close()


def test_tools_dir_is_read_only_and_importable(sandbox, tmp_path):
    sandbox.ready()
    _, d, out = sandbox.run(
        "import tools, os\nprint(tools.__file__)\n"
        "try:\n    open(os.path.join(os.path.dirname(tools.__file__), 'x.py'), 'w')\n"
        "except OSError as e:\n    print(e.errno == 30)\n")
    tools_dir = tmp_path / "pkg" / "tools"
    assert out["stdout"] == f"{tools_dir}/__init__.py\nTrue\n", out
    assert sorted(os.listdir(tools_dir)) == ["__init__.py"]


def test_no_other_host_path_is_visible(sandbox, tmp_path):
    (tmp_path / "secret.txt").write_text("s")
    sandbox.ready()
    _, d, out = sandbox.run(
        "import os\n"
        f"paths = ['/root', '/home', '/var', '/work', {str(tmp_path / 'secret.txt')!r},\n"
        f"         {SRCDIR!r}, '/etc/shadow', '/sys/fs/cgroup']\n"
        "print([p for p in paths if os.path.exists(p)])\n"
        "print(sorted(os.listdir('/')))\n"
        "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])")
    lines = out["stdout"].splitlines()
    assert lines[0] == "[]", out
    top = set(eval(lines[1]))
    assert top <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp",
                   "usr", "workspace", "tools"}, top
    assert lines[2] == "0000000000000000", out


def test_a_refused_syscall_is_counted(tmp_path):
    s = start("fd", tmp_path)
    try:
        s.ready()
        _, d, out = s.run("import os\ntry:\n    os.setuid(5)\nexcept PermissionError:\n"
                          "    print('EPERM')")
        assert out["stdout"] == "EPERM\n", out
        s.send({"kind": "shutdown"})
        assert s.wait() == 0
        assert re.search(r"\d+ system calls? refused by the policy \(setuid", s.stderr()), \
            s.stderr()
    finally:
        s.close()


def test_back_to_back_blocks(sandbox):
    """The host sends its next run as soon as it has read output, which may be
    before the sandbox's end-of-block message reached forkbox: never dropped
    (it once was, as an 'unexpected frame kind: Run', under load)."""
    sandbox.ready()
    for i in range(40):
        _, d, out = sandbox.run(f"print({i})")
        assert out["stdout"] == f"{i}\n", (i, out, sandbox.stderr())
    assert "unexpected" not in sandbox.stderr()


def test_fails_closed_without_root(tmp_path):
    """As forkboxd: without what isolation needs (here root, to map the
    sandbox's id) it does not run user code unconfined; it exits 2 and says
    why."""
    w, tools = make_dirs(tmp_path)
    os.chmod(tmp_path, 0o755)
    ours, theirs = socket.socketpair()
    env = base_env(w, tools)
    errf = open(tmp_path / "stderr.txt", "wb")
    proc = subprocess.Popen(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                             FORKBOX, "sandbox"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=errf, pass_fds=(3,),
                            preexec_fn=lambda: os.dup2(theirs.fileno(), 3))
    errf.close()
    theirs.close()
    try:
        assert proc.wait(timeout=60) == 2
        assert "isolation needs root" in (tmp_path / "stderr.txt").read_text()
    finally:
        ours.close()


def _sandbox_uids(root_pid):
    """Host uids of the processes below root_pid that are not root's."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(d))
    uids, todo = set(), [root_pid]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/status") as fh:
                uid = next(int(line.split()[1]) for line in fh if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if uid != 0:
            uids.add(uid)
    return uids


def _pairs_held() -> dict[int, int]:
    """The pairs of ids forkbox sandboxes hold (record locks on
    /run/forkbox/id-pairs, src/sandbox/idlock.h): first id -> holder's pid."""
    st = os.stat("/run/forkbox/id-pairs")
    me = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    held = {}
    with open("/proc/locks") as fh:
        for line in fh:
            f = line.split()  # 1: POSIX ADVISORY WRITE <pid> <maj:min:ino> <start> <end>
            if len(f) >= 8 and f[1] == "POSIX" and f[3] == "WRITE" and f[5] == me:
                held[int(f[6])] = int(f[4])
    return held


def test_concurrent_sandboxes_never_share_a_uid(tmp_path):
    """Each forkbox sandbox locks a pair of ids (in /run/forkbox/id-pairs) from
    a default range next to forkboxd's, so sandboxes running at once never
    share kernel accounting by uid, nor with a forkboxd on its default range;
    the lock goes when the sandbox does."""
    boxes = []
    try:
        for i in range(4):
            d = tmp_path / f"s{i}"
            d.mkdir()
            boxes.append(start("fd", d))
        for s in boxes:
            s.ready()
        uids = [_sandbox_uids(s.proc.pid) for s in boxes]
        for i, u in enumerate(uids):
            assert len(u) == 1, uids
            (uid,) = u
            assert 2013331456 <= uid < 2013331456 + 65536, uid  # not forkboxd's default range
            for other in uids[:i]:
                assert u.isdisjoint(other), uids
        held = _pairs_held()
        for s, (uid,) in zip(boxes, uids):
            assert held.get(uid - uid % 2) == s.proc.pid, (uid, s.proc.pid, held)
        for s in boxes:
            s.send({"kind": "shutdown"})
            assert s.wait() == 0
        held = _pairs_held()
        for (uid,) in uids:
            assert uid - uid % 2 not in held, (uid, held)
    finally:
        for s in boxes:
            s.close()


def _fake_dist(site, version):
    """A distribution `fbcacheprobe` of the given version in site (only it)."""
    for old in site.glob("fbcacheprobe-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = site / f"fbcacheprobe-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fbcacheprobe\nVersion: {version}\n")
    (info / "top_level.txt").write_text("fbcacheprobe\n")


def test_ready_packages_cache_follows_the_distributions(tmp_path):
    """ready.packages is cached in /run/forkbox/packages.json (root's) and
    reused while no sys.path entry holding distributions changes; installing
    or upgrading one is seen by the next sandbox."""
    site = tmp_path / "site"
    site.mkdir()
    _fake_dist(site, "1.0")

    def packages(n):
        d = tmp_path / f"run{n}"
        d.mkdir()
        s = start("fd", d, args=("--site-packages", str(site)))
        try:
            return s.ready()["packages"]
        finally:
            s.send({"kind": "shutdown"})
            s.wait()
            s.close()

    assert packages(1)["fbcacheprobe"] == {"fbcacheprobe": "1.0"}
    cache = "/run/forkbox/packages.json"
    st = os.stat(cache)
    assert st.st_uid == 0 and st.st_mode & 0o022 == 0, st
    assert packages(2)["fbcacheprobe"] == {"fbcacheprobe": "1.0"}
    assert os.stat(cache).st_mtime_ns == st.st_mtime_ns  # served from the cache
    _fake_dist(site, "2.0")
    assert packages(3)["fbcacheprobe"] == {"fbcacheprobe": "2.0"}
    assert os.stat(cache).st_mtime_ns != st.st_mtime_ns


def test_memory_limit_ends_the_sandbox(tmp_path):
    """The turn cgroup's limits hold as for a WebSocket turn: a block that
    touches more than --memory ends the sandbox, and forkbox sandbox says
    why and exits 1."""
    s = start("fd", tmp_path, args=("--memory", "128M"))
    try:
        s.ready()
        s.send({"code": "b = bytearray(400 * 1024 * 1024)\nprint('survived')", "kind": "run"})
        assert s.recv() is None  # no done: the sandbox is gone
        assert s.wait() == 1
        assert "out of memory: the sandbox was killed at its memory limit (128 MiB)" in s.stderr(), s.stderr()
    finally:
        s.close()
