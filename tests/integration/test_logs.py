"""The operator's log (issue 15, item 6): a line per refused request (status,
peer, reason; never the token), journald priority prefixes when stderr is the
journal, --log-format json, and the token file: several tokens, re-read on
SIGHUP without dropping a turn."""

import asyncio
import json
import os
import re
import signal
import socket
import time

from fbtest import arun, connect, get_health, http_raw, upgrade_request, wait_until

TOKEN = "right-token-" + "cd" * 8
WRONG = "wrong-guess-" + "ef" * 8
BURST = 10  # LOG_RATELIMIT_BURST (src/core/limits.h)


def ask(port: int, request: bytes, timeout: float = 5.0) -> tuple[int, int]:
    """Send a request on a fresh connection: (the status answered, our port)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
        return status, s.getsockname()[1]


def refusal(d, status: str, port: int, timeout: float = 5.0) -> str:
    """The refusal line for status and our port (waits for it)."""
    want = re.compile(rf"request refused: {status} to 127\.0\.0\.1:{port}: (.*)")
    found = []

    def seen():
        found[:] = [m.group(1) for m in map(want.search, d.stderr().splitlines()) if m]
        return bool(found)
    assert wait_until(seen, timeout), f"no '{status}' line for port {port}:\n{d.stderr()[-3000:]}"
    assert len(found) == 1, found
    return found[0]


async def one_block(d, code="print('ok')", **kw):
    turn = await connect(d, **kw)
    try:
        return await turn.run(code)
    finally:
        await turn.shutdown()


def turn_works(d, token):
    r = arun(one_block(d, token=token), 30)
    return (r.stdout, r.exit_code) == ("ok\n", 0)


def unauthorized(d, token) -> bool:
    return http_raw(d.port, upgrade_request("/", token=token)).status == 401


# ---- a line per refused request -------------------------------------------

def test_refused_requests_are_logged_without_the_token(make_daemon):
    d = make_daemon(["--capacity", "1"], env={"ADK_CODE_MODE_AUTH_TOKEN": TOKEN})

    status, port = ask(d.port, upgrade_request("/x", token=WRONG))
    assert status == 401
    why = refusal(d, "401", port)
    assert why.startswith("bad token") and '(GET "/x")' in why, why

    status, port = ask(d.port, upgrade_request("/"))
    assert status == 401
    assert refusal(d, "401", port).startswith("no Authorization header")

    status, port = ask(d.port, b"NOT HTTP AT ALL\r\n\r\n")
    assert status == 400
    assert refusal(d, "400", port) == "malformed HTTP request"

    status, port = ask(d.port, b"GET / HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n")
    assert status == 431
    assert refusal(d, "431", port).startswith("request too large")

    status, port = ask(d.port, f"GET /plain HTTP/1.1\r\nHost: x\r\n"
                                f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
    assert status == 426
    assert refusal(d, "426", port).startswith("not a WebSocket upgrade")

    async def at_capacity():
        turn = await connect(d, token=TOKEN)
        try:
            return await asyncio.to_thread(ask, d.port, upgrade_request("/", token=TOKEN))
        finally:
            await turn.shutdown()
    status, port = arun(at_capacity(), 30)
    assert status == 503
    assert refusal(d, "503", port).startswith("busy")

    assert get_health(d.port).status == 200  # answered, not refused: no line
    text = d.stderr()
    assert text.count("request refused:") == 6, text
    # neither the wrong token nor the right one, nor the header, is ever logged
    assert WRONG not in text and TOKEN not in text and "Bearer" not in text
    assert all(" WARN " in line for line in text.splitlines() if "request refused:" in line)


def test_timeout_before_a_request_is_logged(make_daemon):
    d = make_daemon()
    with socket.create_connection(("127.0.0.1", d.port)) as silent, \
            socket.create_connection(("127.0.0.1", d.port)) as slow:
        slow.sendall(b"GET / HTTP/1.1\r\nHost:")
        # HTTP_REQUEST_TIMEOUT_MS is 10 s; the tick is 250 ms
        assert refusal(d, "timeout", silent.getsockname()[1], 20) == \
            "no request within 10 s, closed unanswered"
        assert refusal(d, "timeout", slow.getsockname()[1], 5) == \
            "request incomplete within 10 s, closed unanswered"


def test_a_flood_of_refusals_is_rate_limited(make_daemon):
    d = make_daemon()
    t0 = time.monotonic()
    for _ in range(300):
        assert ask(d.port, b"BAD\r\n\r\n")[0] == 400
    elapsed = time.monotonic() - t0
    # the suppressed count is reported once the flood stops (the tick's flush)
    assert wait_until(lambda: "similar messages suppressed" in d.stderr(), 5), d.stderr()[-2000:]
    lines = [ln for ln in d.stderr().splitlines() if "request refused:" in ln]
    # a burst, then one line a second (LOG_RATELIMIT_*), and the report
    assert BURST <= len(lines) <= BURST + elapsed + 3, (len(lines), elapsed)
    n = sum(int(m.group(1)) for m in
            re.finditer(r"\((\d+) similar messages? suppressed", d.stderr()))
    n += sum(int(m.group(1)) for m in
             re.finditer(r": (\d+) similar messages? suppressed", d.stderr()))
    assert len(lines) - ("similar messages suppressed" in lines[-1]) + n >= 300, (len(lines), n)


# ---- journald priority prefixes --------------------------------------------

def journal_daemon(make_daemon, tmp_path, match: bool, args=()):
    """A daemon whose stderr is a file, with $JOURNAL_STREAM naming that file
    (match) or another inode: systemd's check is device and inode."""
    path = tmp_path / "stderr"
    path.write_bytes(b"")
    st = os.stat(path)
    ino = st.st_ino if match else st.st_ino + 1
    d = make_daemon(list(args), env={"JOURNAL_STREAM": f"{st.st_dev}:{ino}"},
                    stderr_path=str(path))
    ask(d.port, upgrade_request("/", token=WRONG))  # a line at WARN: no token set, so...
    ask(d.port, b"BAD\r\n\r\n")                      # ...a 400 gives one
    assert wait_until(lambda: "request refused: 400" in d.stderr(), 5)
    os.kill(d.pid, signal.SIGTERM)
    assert d.wait_exit(10) == 0
    d.stop()
    return [ln for ln in path.read_bytes().split(b"\n") if ln]


def test_journal_stream_gives_priority_prefixes(make_daemon, tmp_path):
    lines = journal_daemon(make_daemon, tmp_path, match=True)
    bad = [ln for ln in lines if not re.match(rb"<[3467]>", ln)]
    assert not bad, bad
    assert any(ln.startswith(b"<6>forkboxd: INFO ") for ln in lines), lines
    assert any(ln.startswith(b"<6>forkserver: INFO ") for ln in lines), lines  # the fork server too
    assert any(ln.startswith(b"<4>forkboxd: WARN ") and b"request refused: 400" in ln
               for ln in lines), lines


def test_another_journal_stream_gives_none(make_daemon, tmp_path):
    lines = journal_daemon(make_daemon, tmp_path, match=False)
    assert lines and not [ln for ln in lines if ln.startswith(b"<")], lines
    assert any(ln.startswith(b"forkserver: INFO ") for ln in lines), lines


def test_journal_json_has_priority_and_no_timestamp(make_daemon, tmp_path):
    lines = journal_daemon(make_daemon, tmp_path, match=True, args=["--log-format", "json"])
    procs = set()
    for ln in lines:
        m = re.match(rb"<([3467])>(\{.*\})$", ln)
        assert m, ln
        obj = json.loads(m.group(2))
        assert "ts" not in obj, obj  # journald stamps lines itself
        assert {"error": b"3", "warn": b"4", "info": b"6", "debug": b"7"}[obj["level"]] == m.group(1)
        procs.add(obj["proc"])
    assert {"forkboxd", "forkserver"} <= procs, procs


# ---- --log-format json ------------------------------------------------------

def test_json_lines(make_daemon, tmp_path):
    path = tmp_path / "stderr"
    d = make_daemon(["--log-format", "json", "--log-level", "debug"], stderr_path=str(path),
                    env={"ADK_CODE_MODE_AUTH_TOKEN": TOKEN})
    assert turn_works(d, TOKEN)
    # a target with quotes, a backslash, a tab and bytes that are not UTF-8
    target = b'/q"\\\t\xff\xfe?a=\xc3\xa9'
    status, port = ask(d.port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n"
                       b"Authorization: Bearer " + WRONG.encode() + b"\r\n\r\n")
    assert status == 401
    assert wait_until(lambda: f"127.0.0.1:{port}" in d.stderr(), 5)
    os.kill(d.pid, signal.SIGTERM)
    assert d.wait_exit(10) == 0
    d.stop()

    raw = path.read_bytes()
    text = raw.decode("utf-8")  # strict: every line is valid UTF-8
    assert raw.endswith(b"\n")
    objs = [json.loads(ln) for ln in text.split("\n")[:-1]]  # every line one object
    for o in objs:
        assert set(o) == {"ts", "level", "proc", "pid", "src", "msg"}, o
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", o["ts"]), o
        assert o["level"] in ("debug", "info", "warn", "error") and isinstance(o["pid"], int)
    assert {"forkboxd", "forkserver"} <= {o["proc"] for o in objs}
    refused = [o for o in objs if f"127.0.0.1:{port}" in o["msg"]]
    assert len(refused) == 1 and refused[0]["level"] == "warn", refused
    # the peer's bytes, as printable ASCII inside the JSON string
    assert refused[0]["msg"].endswith(r'(GET "/q\x22\x5c\x09\xff\xfe?a=\xc3\xa9")'), refused
    assert WRONG not in text and TOKEN not in text


# ---- several tokens, SIGHUP ----------------------------------------------------

def test_token_file_with_two_tokens(make_daemon, tmp_path):
    f = tmp_path / "tokens"
    f.write_text("# rotation: the new token, then the old one\n\nnew-token-1\n  old-token-2 \n")
    d = make_daemon(["--token-file", str(f)])
    assert turn_works(d, "new-token-1")
    assert turn_works(d, "old-token-2")
    assert unauthorized(d, "new-token-1 old-token-2") and unauthorized(d, WRONG)
    assert unauthorized(d, "# rotation: the new token, then the old one")


def replace(path, text):
    """Write text to path atomically (as an operator's tool or a deploy would)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def sighup(d, log_text: str, timeout=5.0):
    n = d.stderr().count(log_text)
    os.kill(d.pid, signal.SIGHUP)
    assert wait_until(lambda: d.stderr().count(log_text) > n, timeout), d.stderr()[-2000:]


def test_sighup_rotates_tokens_without_dropping_a_turn(make_daemon, tmp_path):
    f = tmp_path / "tokens"
    f.write_text("old-token\n")
    d = make_daemon(["--token-file", str(f), "--capacity", "4"])

    async def across():
        turn = await connect(d, token="old-token")
        try:
            block = asyncio.create_task(
                turn.run("import time; time.sleep(3); print('slept')"))
            await asyncio.sleep(0.5)
            replace(f, "new-token\n")
            await asyncio.to_thread(sighup, d, "SIGHUP: 1 tokens from")
            assert await asyncio.to_thread(turn_works, d, "new-token")
            assert await asyncio.to_thread(unauthorized, d, "old-token")
            r1 = await block
            r2 = await turn.run("print('after')")  # the admitted turn goes on
            return r1, r2
        finally:
            await turn.shutdown()
    r1, r2 = arun(across(), 60)
    assert (r1.stdout, r1.exit_code) == ("slept\n", 0), r1.stderr
    assert (r2.stdout, r2.exit_code) == ("after\n", 0), r2.stderr
    assert d.alive()


def test_sighup_with_a_bad_file_keeps_the_tokens(make_daemon, tmp_path):
    f = tmp_path / "tokens"
    f.write_text("a-token\nb-token\n")
    d = make_daemon(["--token-file", str(f)])

    f.unlink()  # unreadable: gone
    sighup(d, "keeping the 2 tokens in use")
    assert "No such file or directory" in d.stderr()
    assert turn_works(d, "a-token") and turn_works(d, "b-token")

    f.write_text("# only a comment\n")  # readable, but no token
    sighup(d, "keeping the 2 tokens in use")
    assert "no token" in d.stderr()
    f.unlink()
    f.mkdir()  # not a regular file
    sighup(d, "keeping the 2 tokens in use")
    assert "not a regular file" in d.stderr()
    f.rmdir()
    if os.geteuid() != 0:  # root reads a mode 000 file anyway
        f.write_text("c-token\n")
        f.chmod(0)
        sighup(d, "keeping the 2 tokens in use")
    assert turn_works(d, "a-token") and unauthorized(d, "c-token")
    assert d.alive()
    # and the error lines never carry a token
    assert "a-token" not in d.stderr() and "b-token" not in d.stderr()


def test_sighup_with_the_environment_token(make_daemon):
    d = make_daemon(env={"ADK_CODE_MODE_AUTH_TOKEN": TOKEN})
    sighup(d, "nothing to reload")
    assert d.alive() and turn_works(d, TOKEN) and unauthorized(d, WRONG)


# ---- a log reader that stops (issue 25, item 2) -----------------------------

def test_a_stalled_log_reader_stalls_nothing(tmp_path):
    """stderr is a pipe its reader stops reading (a stuck log shipper): the
    daemon keeps serving /health and turns (on d4bf581 it stopped at its
    first write to the full pipe). Lines that do not fit the supervisor's
    queue are dropped; when the reader comes back, the lines it reads are
    whole (JSON, one a line, the fork server's too) and one says how many
    were dropped."""
    import fcntl
    import subprocess
    from types import SimpleNamespace

    from fbtest import FORKBOXD, POLICY, http_get

    r, w = os.pipe()
    fcntl.fcntl(w, 1031, 4096)   # F_SETPIPE_SZ: one page, full at once
    argv = [FORKBOXD, "--listen", "127.0.0.1:0", "--policy", POLICY, "--pool", "0",
            "--log-level", "debug", "--log-format", "json"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADK_CODE_MODE_")}
    env["ADK_CODE_MODE_AUTH_TOKEN"] = TOKEN
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=w,
                            env=env, start_new_session=True)
    os.close(w)
    try:
        got = b""
        deadline = time.monotonic() + 20
        while (m := re.search(rb"listening on 127\.0\.0\.1:(\d+)", got)) is None:
            assert time.monotonic() < deadline and proc.poll() is None, got[-2000:]
            got += os.read(r, 65536)
        d = SimpleNamespace(port=int(m.group(1)))
        # From here on nobody reads. Each refused call is a debug line: far
        # more than the pipe and the queue (256 KiB) hold.
        flood = ("import os\nn = 0\nfor _ in range(20000):\n    try:\n        os.setuid(0)\n"
                 "    except PermissionError:\n        n += 1\nprint(n)")
        res = arun(one_block(d, flood, token=TOKEN), 30)
        assert (res.stdout, res.exit_code) == ("20000\n", 0), res
        t0 = time.monotonic()
        assert http_get(d.port, "/health", timeout=5)[0] == 200
        assert time.monotonic() - t0 < 1.0
        assert turn_works(d, TOKEN)
        # The reader comes back.
        os.set_blocking(r, False)
        text, dropped = b"", None
        deadline = time.monotonic() + 10
        while dropped is None and time.monotonic() < deadline:
            try:
                text += os.read(r, 1 << 20)
            except BlockingIOError:
                time.sleep(0.05)
            dropped = re.search(rb"(\d+) log lines? dropped", text)
        assert dropped, text[-3000:]
        # Every refused call is a line, read or counted as dropped (the count
        # itself must not be dropped for want of room).
        n_dropped = int(dropped.group(1))
        assert text.count(b"refused setuid") + n_dropped >= 20000, (n_dropped, text[-2000:])
        text = got + text
        objs = [json.loads(ln) for ln in text[:text.rindex(b"\n")].split(b"\n")]  # all whole
        assert any(o["proc"] == "forkserver" for o in objs), text[:2000]
        assert any("log lines dropped" in o["msg"] and o["level"] == "warn" for o in objs)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
        os.close(r)
