"""Turn lifecycle: keepalive, idle, client close / vanish mid-block, kill and
release, single-use mode, block and idle timeouts, parallel isolation, and the
forkbox-run demo (§9.1 items 4, 20, 21; §9.2 "no kill")."""

import asyncio
import os
import subprocess
import time

import pytest

from fbtest import (SRCDIR, arun, connect, expect_closed, fc, get_health, http_raw, pid_alive,
                    text_frames, upgrade_request, wait_until, websockets)

T = 30
SPIN = "open('started.txt', 'w').write('x')\nwhile True:\n    pass"


async def start_spinning(d, **kw):
    """Open a turn and start an endless CPU-bound block; returns once the block
    is surely running (its sandbox exists and is past the run frame)."""
    turn = await connect(d, ping_interval=None, **kw)
    await turn.run("pass")
    await turn.ws.send(fc.empty_tar())
    await turn.ws.send(fc.encode_frame({"kind": "run", "code": SPIN}))
    await asyncio.sleep(0.5)
    return turn


def sandbox_pids(d, baseline):
    return d.descendants() - baseline


# ---- item 20: keepalive ----------------------------------------------------

def test_pings_answered_during_cpu_bound_block(make_daemon):
    """§9.1.20: pings get a pong (well within 20 s) while user code spins."""
    d = make_daemon(["--capacity", "4"])

    async def go():
        turn = await start_spinning(d)
        rtts = []
        for _ in range(4):
            t0 = time.monotonic()
            waiter = await turn.ws.ping()
            await asyncio.wait_for(waiter, 5)
            rtts.append(time.monotonic() - t0)
            await asyncio.sleep(0.5)
        await turn.ws.close()
        return rtts
    rtts = arun(go(), T)
    assert max(rtts) < 2.0, rtts


def test_idle_between_blocks_keeps_turn(make_daemon):
    """§9.1.20 / §7.5: silence between blocks (no client pings) does not end the
    turn; pings are answered; state persists. (6 s here, stands in for 600 s.)"""
    d = make_daemon()

    async def go():
        turn = await connect(d, ping_interval=None)
        await turn.run("kept = 'yes'")
        await asyncio.sleep(3)
        waiter = await turn.ws.ping()
        await asyncio.wait_for(waiter, 5)
        await asyncio.sleep(3)
        r = await turn.run("print(kept)")
        await turn.shutdown()
        return r
    r = arun(go(), T)
    assert r.stdout == "yes\n"


# ---- item 21: client goes away mid-block ------------------------------------

def _client_leaves_mid_block(make_daemon, how):
    d = make_daemon(["--capacity", "1", "--pool", "0"])
    baseline = d.descendants()

    async def go():
        turn = await start_spinning(d)
        during = sandbox_pids(d, baseline)
        if how == "close":
            await turn.ws.close()
        elif how == "shutdown-close":           # the host on a block timeout
            await turn.ws.send(fc.encode_frame({"kind": "shutdown"}))
            await turn.ws.close()
        else:                                   # vanish: TCP drop, no close frame
            turn.ws.transport.abort()
        t0 = time.monotonic()
        # the slot comes back: a new turn on a capacity-1 daemon
        while True:
            try:
                t2 = await connect(d)
                break
            except websockets.exceptions.InvalidStatusCode as e:
                assert e.status_code == 503
                if time.monotonic() - t0 > 3:
                    raise
                await asyncio.sleep(0.05)
        took = time.monotonic() - t0
        r = await t2.run("import os\nprint(os.listdir('.'))")
        await t2.shutdown()
        return during, took, r
    during, took, r = arun(go(), T)
    assert during, "no sandbox process seen under forkboxd while the block ran"
    assert took < 1.5, f"slot released only after {took:.2f}s"
    assert r.stdout == "[]\n"       # fresh turn
    gone = wait_until(lambda: not any(pid_alive(p) for p in during), 2.0)
    assert gone, [p for p in during if pid_alive(p)]


def test_client_close_mid_block_releases_turn_and_kills_sandbox(make_daemon):
    """§9.1.21: close 1000 on `while True: pass` -> slot free within ~1 s,
    sandbox process gone."""
    _client_leaves_mid_block(make_daemon, "close")


def test_host_timeout_shutdown_then_close_mid_block(make_daemon):
    """§7.4: what the host does on a block timeout: shutdown, then close."""
    _client_leaves_mid_block(make_daemon, "shutdown-close")


def test_client_vanishes_mid_block(make_daemon):
    """§1.4: a TCP drop without a close frame mid-block releases the turn."""
    _client_leaves_mid_block(make_daemon, "vanish")


def test_client_close_during_pending_tool_call(make_daemon):
    """§9.1.21: close while a (slow) tool call is pending releases the turn."""
    d = make_daemon(["--capacity", "1"])

    async def go():
        started = asyncio.Event()

        async def never(frame):
            started.set()
            await asyncio.sleep(60)

        turn = await connect(d)
        task = asyncio.create_task(turn.run("from tools import echo\necho(message='slow')",
                                            on_tool_call=never))
        await asyncio.wait_for(started.wait(), 10)
        await turn.ws.close()
        try:
            await task
        except fc.TurnClosed:
            pass
        t0 = time.monotonic()
        while True:
            try:
                t2 = await connect(d)
                break
            except websockets.exceptions.InvalidStatusCode:
                if time.monotonic() - t0 > 3:
                    raise
                await asyncio.sleep(0.05)
        r = await t2.run("print('fresh')")
        await t2.shutdown()
        return time.monotonic() - t0, r
    took, r = arun(go(), T)
    assert took < 1.5 and r.stdout == "fresh\n"


# ---- item 4: single-use mode ------------------------------------------------

def test_single_use_busy_then_exit_0(make_daemon):
    """§9.1.4 / §1.3: --single-use admits one turn (others get 503 Busy\\n,
    /health still 200) and exits 0 within ~2 s of shutdown."""
    d = make_daemon(["--single-use"])

    async def go():
        turn = await connect(d)
        r = await turn.run("print('single')")
        busy = await asyncio.to_thread(http_raw, d.port, upgrade_request("/"))
        health = await asyncio.to_thread(get_health, d.port)
        await turn.ws.send(fc.encode_frame({"kind": "shutdown"}))
        t0 = time.monotonic()
        await turn.ws.close()
        return r, busy, health, t0
    r, busy, health, t0 = arun(go(), T)
    assert r.stdout == "single\n"
    assert busy.status == 503 and busy.body == b"Busy\n"
    assert health.status == 200 and health.body == b"OK\n"
    rc = d.wait_exit(5)
    took = time.monotonic() - t0
    assert rc == 0, (rc, d.stderr()[-2000:])
    assert took < 2.5, f"exited {took:.2f}s after shutdown"


def test_single_use_exits_0_after_client_vanishes(make_daemon):
    """§1.3: any end of the admitted turn (here a TCP drop mid-block) exits 0."""
    d = make_daemon(["--single-use"])

    async def go():
        turn = await start_spinning(d)
        turn.ws.transport.abort()
    arun(go(), T)
    assert d.wait_exit(5) == 0


def test_single_use_probe_and_401_do_not_consume(make_daemon):
    """§1.3: a port probe and a failed auth do not use up the single turn."""
    import socket
    d = make_daemon(["--single-use"], env={"ADK_CODE_MODE_AUTH_TOKEN": "tk"})
    socket.create_connection(("127.0.0.1", d.port), timeout=2).close()
    assert http_raw(d.port, upgrade_request("/", token="bad")).status == 401
    assert get_health(d.port).status == 200

    async def go():
        turn = await connect(d, token="tk")
        r = await turn.run("print('ok')")
        await turn.shutdown()
        return r
    assert arun(go(), T).stdout == "ok\n"
    assert d.wait_exit(5) == 0


# ---- timeouts ---------------------------------------------------------------

def test_block_timeout(make_daemon):
    """--block-timeout: the block ends with done (non-zero) + output (stderr
    says why) + archive (files written so far), then the turn ends."""
    d = make_daemon(["--block-timeout", "2"])

    async def go():
        turn = await connect(d)
        t0 = time.monotonic()
        try:
            r = await turn.run(SPIN)
        except fc.TurnClosed as e:
            return e, time.monotonic() - t0, e.code, e.messages
        took = time.monotonic() - t0
        code, reason, msgs = await expect_closed(turn.ws, 10)
        return r, took, (code, reason), msgs
    r, took, code, msgs = arun(go(), T)
    if isinstance(r, fc.TurnClosed):
        pytest.fail(f"turn closed after {took:.1f}s (code {r.code}, reason {r.reason!r}) "
                    f"without done/output/archive; got {[f['kind'] for f in text_frames(r.messages)]}")
    assert 1.5 < took < 8, took
    assert r.exit_code != 0 and r.output_exit_code == r.exit_code
    assert "time" in r.stderr.lower(), r.stderr
    # the archive slot holds a binary: a snapshot with the files written so far,
    # or a zero-length message (host keeps its copy, §4.4) if none can be taken
    assert r.archive is not None
    if r.archive:
        assert r.files.get("started.txt") == b"x"
    assert code == (1000, "block timeout: the block ran longer than 2 s (--block-timeout)")
    assert not any(isinstance(m, str) and '"done"' in m for m in msgs)


def test_idle_timeout_ends_turn(make_daemon):
    """--idle-timeout: a turn idle between blocks longer than that is ended."""
    d = make_daemon(["--idle-timeout", "2"])

    async def go():
        turn = await connect(d)
        await turn.run("pass")
        t0 = time.monotonic()
        code, reason, msgs = await expect_closed(turn.ws, 10)
        return time.monotonic() - t0, (code, reason)
    took, code = arun(go(), T)
    assert 1.5 < took < 6, took
    assert code == (1000, "idle timeout: no block for 2 s (--idle-timeout)")


def test_no_sandbox_left_behind_after_many_turns(make_daemon):
    """Every ended turn's sandbox is reaped: after 25 turns (normal shutdown,
    plain close, abort, error exit) no extra processes remain under forkboxd."""
    d = make_daemon(["--pool", "0"])
    baseline = d.descendants()

    async def go():
        for i in range(25):
            turn = await connect(d)
            await turn.run(f"x = {i}\nopen('f','w').write('x')")
            if i % 4 == 0:
                await turn.shutdown()
            elif i % 4 == 1:
                await turn.ws.close()
            elif i % 4 == 2:
                turn.ws.transport.abort()
            else:
                await turn.ws.send(fc.empty_tar())
                await turn.ws.send(fc.encode_frame({"kind": "run", "code": "import os\nos._exit(1)"}))
                await expect_closed(turn.ws, 10)
    arun(go(), 60)
    assert wait_until(lambda: d.descendants() <= baseline, 5), (baseline, d.descendants())
    assert d.alive()


# ---- parallel turns ----------------------------------------------------------

def test_parallel_turns_are_isolated(make_daemon):
    """forkbox serves many turns at once, each with its own globals, /workspace,
    /tmp and /tools."""
    d = make_daemon(["--capacity", "8"])
    n = 6

    async def one(i):
        tools = fc.ToolRegistry({f"only{i}": (lambda i=i: i)})
        turn = await connect(d, tools)
        r1 = await turn.run(f"me = {i}\nopen('mine.txt','w').write('{i}')\nopen('/tmp/t.txt','w').write('{i}')")
        await asyncio.sleep(0.2)
        r2 = await turn.run(f"import os\nfrom tools import only{i}\n"
                            "print(me, open('mine.txt').read(), open('/tmp/t.txt').read(), "
                            f"only{i}(), sorted(f for f in os.listdir('/tools') if f.startswith('only')))")
        await turn.shutdown()
        return r1, r2
    async def go():
        return await asyncio.gather(*(one(i) for i in range(n)))
    results = arun(go(), 60)
    for i, (r1, r2) in enumerate(results):
        assert r2.stdout == f"{i} {i} {i} {i} ['only{i}.py']\n", (r2.stdout, r2.stderr)
        assert r2.files == {"mine.txt": str(i).encode()}


# ---- the README's main job ---------------------------------------------------

def test_forkbox_run_demo(daemon):
    """tools/forkbox-run tools/demo/hello.py against the daemon."""
    proc = subprocess.run(["/usr/bin/python3", os.path.join(SRCDIR, "tools", "forkbox-run"),
                           "--url", daemon.url, os.path.join(SRCDIR, "tools", "demo", "hello.py")],
                          capture_output=True, text=True, timeout=60)
    out = proc.stdout
    assert proc.returncode == 0, (out, proc.stderr)
    assert "# ready: protocol 2, python 3." in out
    assert "{'echoed': 'hello from the sandbox'}" in out
    assert "2 + 40 = 42" in out
    for city in ("Paris", "Tokyo", "Lima", "Oslo"):
        assert f"{city}: " in out
    assert "saved: ['forecast.txt']" in out
    assert "exit code: 0" in out
    assert "files: forecast.txt (" in out
    assert "tool calls: 8:" in out
    assert "--- stderr ---\nexit code: 0" in out     # clean stderr


# ---- configuration ------------------------------------------------------------

def test_bad_configuration_refuses_to_start(tmp_path):
    """Operator typos: forkboxd exits non-zero at once and says what is wrong."""
    from fbtest import Daemon
    bad_policy = tmp_path / "bad.policy"
    bad_policy.write_text("this is not a policy line\n")
    cases = [(["--capacity", "lots"], "capacity"), (["--no-such-flag"], "no-such-flag"),
             (["--output-cap", "12Q"], "output-cap"), (["--policy", str(bad_policy)], "bad.policy"),
             (["--policy", str(tmp_path / "missing.policy")], "missing.policy")]
    for args, needle in cases:
        d = Daemon(args, policy=False)
        try:
            d.start(timeout=5)
            ok = False
        except RuntimeError:
            ok = True
        rc = d.wait_exit(5) if ok else None
        err = d.stderr()
        d.stop()
        assert ok, f"{args}: daemon started"
        assert rc not in (0, None), (args, rc)
        assert needle in err, (args, err[-500:])


def test_tools_dir_option(make_daemon, tmp_path):
    """--tools-dir: the stubs live at that path (basename 'tools') and import."""
    d = make_daemon(["--tools-dir", "/opt/forkbox-test/tools"])

    async def go():
        turn = await connect(d)
        r = await turn.run("import os, tools\nfrom tools import echo\n"
                           "print(tools.__file__, echo(message=1), os.path.exists('/opt/forkbox-test/tools/echo.py'))")
        await turn.shutdown()
        return r
    r = arun(go(), T)
    assert r.stdout == "/opt/forkbox-test/tools/__init__.py {'echoed': 1} True\n", r.stderr
