"""Tenants (issue 28): one forkboxd shared by several agents, each with its share.

* Named tokens ("NAME TOKEN" lines): --tenant-capacity caps the turns one
  tenant holds; its next upgrade gets 429 with Retry-After and a body naming
  the limit, while other tenants are admitted up to --capacity (503 Busy).
* /metrics counts turns by tenant, and each turn's end line says tenant=NAME;
  no token appears in either.
* SIGHUP: a tenant removed from the file gets 401 for new turns while its
  running turn goes on; a name that comes back meanwhile is the same tenant
  (its running turn still counts against its share).
* --tenant-buffer: a tenant's turns together hold at most that much of the
  supervisor's buffers; a turn over it is closed with 1013, another tenant's
  is not.
* --cpu-share tenant: a turn's sandbox runs under its tenant's cgroup.
"""

import asyncio
import os
import re
import signal
import socket

from prometheus_client.parser import text_string_to_metric_families

import fbtest
from fbtest import RawWS, arun, connect, http_get, http_raw, upgrade_request, wait_until

T = 90
TOK = {"team-a": "tok-a-" + "1f" * 8, "team-b": "tok-b-" + "2e" * 8, "default": "tok-d-" + "3d" * 8}
METRICS_RE = re.compile(r"metrics at http://127\.0\.0\.1:(\d+)/metrics")


def token_file(tmp_path, text: str):
    f = tmp_path / "tokens"
    f.write_text(text)
    return f


def replace(path, text):
    """Write text to path atomically (as a deploy would)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def sighup(d, log_text: str):
    n = d.stderr().count(log_text)
    os.kill(d.pid, signal.SIGHUP)
    assert wait_until(lambda: d.stderr().count(log_text) > n, 5), d.stderr(2000)


def scrape(d) -> dict:
    """{(sample name, frozenset(labels)): value}, through Prometheus's parser."""
    assert wait_until(lambda: METRICS_RE.search(d.stderr()), 10), d.stderr(3000)
    status, body = http_get(int(METRICS_RE.search(d.stderr()).group(1)), "/metrics")
    assert status == 200, (status, body[:300])
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out, body.decode()


def val(m: dict, name: str, **labels):
    return m.get((name, frozenset(labels.items())))


class Held:
    """An admitted turn that sends nothing: its socket holds the slot."""

    def __init__(self, sock):
        self.sock, self.status = sock, 101


def ask(d, token: str):
    """One upgrade for token: Held (101), or the Response."""
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    s.sendall(upgrade_request("/", token=token))
    data = b""
    while b"\r\n\r\n" not in data or not data.startswith(b"HTTP/1.1 101"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    if data.startswith(b"HTTP/1.1 101"):
        return Held(s)
    s.close()
    return fbtest.Response(data)


def statuses(answers) -> list:
    return [a.status for a in answers]


def release(answers):
    for a in answers:
        if isinstance(a, Held):
            a.sock.close()


def test_tenant_capacity_429_while_others_are_admitted(make_daemon, tmp_path):
    """--capacity 8 --tenant-capacity 3: tenant A asking for 5 turns gets 3 and two
    429s while B gets its 3; unnamed tokens are the default tenant's; the ninth
    turn meets the daemon's capacity (503 Busy) first; a slot A gives back is
    A's again."""
    f = token_file(tmp_path, f"# a comment\nteam-a {TOK['team-a']}\nteam-b\t{TOK['team-b']}\n"
                             f"{TOK['default']}\n")
    d = make_daemon(["--token-file", str(f), "--capacity", "8", "--tenant-capacity", "3",
                     "--metrics-listen", "127.0.0.1:0"])
    held = []
    try:
        a = [ask(d, TOK["team-a"]) for _ in range(5)]
        held += a
        b = [ask(d, TOK["team-b"]) for _ in range(3)]
        held += b
        assert statuses(a) == [101, 101, 101, 429, 429], statuses(a)
        assert statuses(b) == [101, 101, 101], statuses(b)
        r = a[3]
        assert r.reason == "Too Many Requests" and r.headers.get("retry-after") == "1", r
        assert r.body == b"Tenant busy: at most 3 turns at once (tenant-capacity)\n", r
        assert r.headers.get("connection") == "close", r
        assert wait_until(lambda: "tenant team-a holds 3 turns (--tenant-capacity)" in d.stderr(), 5), \
            d.stderr(2000)

        dflt = [ask(d, TOK["default"]) for _ in range(3)]
        held += dflt
        assert statuses(dflt) == [101, 101, 503], statuses(dflt)
        assert dflt[2].body == b"Busy\n", dflt[2]
        # a bad token at capacity: 503 first, as spec 1.1 orders it
        assert http_raw(d.port, upgrade_request("/", token="nope")).status == 503

        m, text = scrape(d)
        assert val(m, "forkbox_turns_active", tenant="team-a") == 3
        assert val(m, "forkbox_turns_active", tenant="team-b") == 3
        assert val(m, "forkbox_turns_active", tenant="default") == 2
        assert val(m, "forkbox_tenant_refusals_total", tenant="team-a") == 2
        assert val(m, "forkbox_tenant_refusals_total", tenant="team-b") == 0
        assert val(m, "forkbox_http_refusals_total", status="429") == 2
        assert val(m, "forkbox_http_refusals_total", status="503") == 2  # Busy, and "nope"
        assert all(t not in text for t in TOK.values())

        a[0].sock.close()  # A gives one back: A's next upgrade is admitted
        assert wait_until(lambda: val(scrape(d)[0], "forkbox_turns_active", tenant="team-a") == 2,
                          10)
        again = ask(d, TOK["team-a"])
        held.append(again)
        assert statuses([again]) == [101]
    finally:
        release(held)
    assert all(t not in d.stderr() for t in TOK.values())


def test_turns_are_counted_and_logged_by_tenant(make_daemon, tmp_path):
    f = token_file(tmp_path, f"team-a {TOK['team-a']}\nteam-b {TOK['team-b']}\n")
    d = make_daemon(["--token-file", str(f), "--metrics-listen", "127.0.0.1:0",
                     "--log-level", "info"])

    async def one(token, code):
        turn = await connect(d, token=token)
        try:
            return await turn.run(code)
        finally:
            await turn.shutdown()
    for code in ("print(1)", "print(2)"):
        assert arun(one(TOK["team-a"], code), T).exit_code == 0
    assert arun(one(TOK["team-b"], "raise SystemExit(3)"), T).exit_code == 3

    end = re.compile(r"turn (\d+): end=(\w+) tenant=(\S+) peer=")
    assert wait_until(lambda: len(end.findall(d.stderr())) == 3, 15), d.stderr(3000)
    assert sorted(m[2] for m in end.findall(d.stderr())) == ["team-a", "team-a", "team-b"]
    m, text = scrape(d)
    assert val(m, "forkbox_turns_total", tenant="team-a", end="ok") == 2
    assert val(m, "forkbox_turns_total", tenant="team-b", end="ok") == 1
    assert val(m, "forkbox_turns_total", tenant="team-b", end="memory") == 0
    assert val(m, "forkbox_turns_active", tenant="team-a") == 0
    assert "tenants: team-a (1), team-b (2)" in d.stderr()
    for t in TOK.values():
        assert t not in text and t not in d.stderr()


def test_sighup_removes_a_tenant_but_not_its_running_turn(make_daemon, tmp_path):
    """team-a leaves the file: its new upgrades get 401, its running turn goes
    on (and stays in /metrics until it ends). It comes back with a new token
    while that turn runs: the same tenant, so --tenant-capacity 1 still counts
    the running turn (429) until it ends."""
    f = token_file(tmp_path, f"team-a {TOK['team-a']}\nteam-b {TOK['team-b']}\n")
    d = make_daemon(["--token-file", str(f), "--tenant-capacity", "1",
                     "--metrics-listen", "127.0.0.1:0"])
    new_a = "tok-a-new-" + "4c" * 8

    async def across():
        turn = await connect(d, token=TOK["team-a"])
        try:
            block = asyncio.create_task(turn.run("import time; time.sleep(3); print('slept')"))
            await asyncio.sleep(0.5)
            replace(f, f"team-b {TOK['team-b']}\n")
            await asyncio.to_thread(sighup, d, "SIGHUP: 1 tokens from")
            gone = await asyncio.to_thread(http_raw, d.port, upgrade_request("/", token=TOK["team-a"]))
            m, _ = await asyncio.to_thread(scrape, d)
            still = val(m, "forkbox_turns_active", tenant="team-a")
            replace(f, f"team-b {TOK['team-b']}\nteam-a {new_a}\n")
            await asyncio.to_thread(sighup, d, "SIGHUP: 2 tokens from")
            full = await asyncio.to_thread(http_raw, d.port, upgrade_request("/", token=new_a))
            r1 = await block
            r2 = await turn.run("print('after')")
            return gone.status, still, full.status, r1, r2
        finally:
            await turn.shutdown()
    gone, still, full, r1, r2 = arun(across(), T)
    assert gone == 401 and still == 1 and full == 429, (gone, still, full)
    assert (r1.stdout, r2.stdout) == ("slept\n", "after\n"), (r1, r2)
    # its slot is back once it ended: the new token admits team-a
    assert wait_until(lambda: val(scrape(d)[0], "forkbox_turns_active", tenant="team-a") == 0, 10)
    ws = RawWS(d.port, token=new_a)
    ws.sock.close()
    # removed for good: once its last turn is freed, its rows go too
    replace(f, f"team-b {TOK['team-b']}\n")
    sighup(d, "SIGHUP: 1 tokens from")
    assert wait_until(lambda: "team-a" not in scrape(d)[1], 10), scrape(d)[1]
    assert d.alive()


BIG_CALL = ("from tools import echo\n"
            "echo(message='A' * (30 << 20))\n"
            "print('sent')\n")


def test_tenant_buffer_ends_only_that_tenants_turn(make_daemon, tmp_path):
    """--turn-buffer 16M --tenant-buffer 16M --total-buffer 200M. A turn
    relays a 30 MiB tool_call to a client that does not read it through a
    window (4 MiB), so each stalled turn of team-a holds about a window of
    team-a's 16M. team-a's turns are stalled one after another until one no
    longer fits: it is closed with 1013. A stalled team-b turn, charged to
    team-b's own 16M, is not; every other turn completes once its client
    reads."""
    f = token_file(tmp_path, f"team-a {TOK['team-a']}\nteam-b {TOK['team-b']}\n")
    d = make_daemon(["--token-file", str(f), "--turn-buffer", "16M", "--tenant-buffer", "16M",
                     "--total-buffer", "200M", "--capacity", "10"])

    async def small_result(call):
        return {"id": call["id"], "ok": True, "value": "ok", "error": None, "kind": "tool_result"}

    async def stalled(token, stall: asyncio.Event, go_on: asyncio.Event):
        t = await connect(d, token=token)
        try:
            t.ws.transport.pause_reading()  # read nothing until told
            task = asyncio.create_task(t.run(BIG_CALL, on_tool_call=small_result))
            stall.set()
            await go_on.wait()
            t.ws.transport.resume_reading()
            return await task
        except fbtest.fc.TurnClosed as e:
            return e.code, e.reason
        finally:
            await t.shutdown()

    async def stall_one(token, go_on):
        stall = asyncio.Event()
        task = asyncio.create_task(stalled(token, stall, go_on))
        await stall.wait()
        await asyncio.sleep(2)  # its window fills and stays in the supervisor
        return task

    async def scenario():
        go_on = asyncio.Event()
        a = []
        while len(a) < 8 and "end=overload tenant=team-a" not in d.stderr():
            a.append(await stall_one(TOK["team-a"], go_on))
        b = await stall_one(TOK["team-b"], go_on)
        go_on.set()
        return await asyncio.gather(*a), await b
    a, b = arun(scenario(), 150)
    refused = [r for r in a if r == (1013, "server memory budget exhausted, try again later")]
    assert len(refused) == 1 and len(a) >= 3, a  # a window each, 16M: the 4th or so
    assert all(r.exit_code == 0 and r.stdout == "sent\n" for r in a if r not in refused), a
    assert b.exit_code == 0 and b.stdout == "sent\n", b
    assert "end=overload tenant=team-b" not in d.stderr()


TENANT_CG = re.compile(r"^(?:\d+:(?:[^:]*,)?cpu(?:,[^:]*)?|0:):"
                       r".*/tenant-\d+-\d+-(\d+)/turn-\d+-\d+-\d+$", re.M)


def tenants_running(d) -> list:
    """The tenant numbers of the cgroups the daemon's processes' CPU is in."""
    found = []
    for pid in d.descendants():
        try:
            with open(f"/proc/{pid}/cgroup") as fh:
                found += TENANT_CG.findall(fh.read())
        except OSError:
            pass
    return sorted(found)


def test_cpu_share_tenant_puts_turns_under_their_tenant(make_daemon, tmp_path):
    """--cpu-share tenant: each turn's sandbox (pooled or fresh) runs in a cgroup
    under its tenant's, named by the tenant's number, never its name; a turn
    that ended leaves none behind."""
    f = token_file(tmp_path, f"team-a {TOK['team-a']}\nteam-b {TOK['team-b']}\n")
    d = make_daemon(["--token-file", str(f), "--cpu-share", "tenant", "--pool", "1"])

    async def during(tokens) -> list:
        """The tenants seen while turns of tokens run a block."""
        turns = [await connect(d, token=t) for t in tokens]
        try:
            blocks = [asyncio.create_task(t.run("import time; time.sleep(4)")) for t in turns]
            # the sandbox's init and runtime, for each turn
            want = len(tokens) * 2
            await asyncio.to_thread(wait_until, lambda: len(tenants_running(d)) >= want, 10)
            seen = tenants_running(d)
            for b in blocks:
                await b
            return seen
        finally:
            for t in turns:
                await t.shutdown()
    assert arun(during([TOK["team-a"]]), T) == ["1", "1"]
    assert arun(during([TOK["team-b"], TOK["team-a"], TOK["team-a"]]), T) == ["1"] * 4 + ["2"] * 2
    assert wait_until(lambda: tenants_running(d) == [], 10), tenants_running(d)
    assert "team-" not in "".join(open(f"/proc/{p}/cgroup").read() for p in d.descendants())
