"""--metrics-listen and the per-turn end line (issue 15, item 5 and part of 6).

* /metrics on its own listener is the Prometheus text format (parsed here by
  Debian's python3-prometheus-client), and its counters move by what turns did:
  one ok turn with a tool call and a counted seccomp refusal, one killed at its
  memory limit, one at its block timeout, one upgrade refused 401.
* /metrics is never served on the public port; other paths get 404; a start
  with the metrics address equal to the public one is refused.
* Silent scrapers cannot hold anything up: connections beyond the cap close the
  oldest, each ends at its deadline, turns go on meanwhile.
* Each turn's end writes one info line: turn id, peer, duration, blocks, tool
  calls, how it ended (the label's value), peak memory, refusals; never the token.
"""

import re
import socket
import time

from prometheus_client.parser import text_string_to_metric_families

import fbtest
from fbtest import arun, connect, expect_closed, http_get, http_raw, upgrade_request, wait_until

T = 90
TOKEN = "metrics-test-token-7f3a"
MEMORY_MB = 128
METRICS_RE = re.compile(r"metrics at http://127\.0\.0\.1:(\d+)/metrics")
END_RE = re.compile(r"turn (\d+): end=(\w+) tenant=default peer=(\S+) duration=([\d.]+)s "
                    r"blocks=(\d+) "
                    r"tool_calls=(\d+) peak_memory=(\d+|unknown) refused_syscalls=(\d+) "
                    r"bytes_in=(\d+) bytes_out=(\d+)")


def metrics_port(d) -> int:
    assert wait_until(lambda: METRICS_RE.search(d.stderr()), 10), d.stderr(3000)
    return int(METRICS_RE.search(d.stderr()).group(1))


def scrape(port: int) -> dict:
    """{(sample name, frozenset(labels)): value}, through the real parser."""
    status, body = http_get(port, "/metrics")
    assert status == 200, (status, body[:300])
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def val(m: dict, name: str, **labels) -> float:
    return m.get((name, frozenset(labels.items())), 0.0)


def delta(a: dict, b: dict, name: str, **labels) -> float:
    return val(b, name, **labels) - val(a, name, **labels)


def end_lines(d) -> dict:
    """{turn id: the end line's fields}."""
    return {int(m.group(1)): m for m in END_RE.finditer(d.stderr())}


def test_counters_move_as_turns_run(make_daemon):
    d = make_daemon(["--metrics-listen", "127.0.0.1:0", "--memory", f"{MEMORY_MB}M",
                     "--pids", "32", "--tmpfs-size", "32M", "--block-timeout", "2",
                     "--log-level", "info"], token=TOKEN)
    port = metrics_port(d)
    before = scrape(port)
    assert val(before, "forkbox_turns_active", tenant="default") == 0
    assert val(before, "forkbox_pool_size") == 4

    async def ok_turn():
        turn = await connect(d, token=TOKEN)
        a = await turn.run("x = 1")
        b = await turn.run("import os\nfrom tools import echo\necho(message='hi')\n"
                           "for _ in range(2):\n"
                           "    try:\n        os.setuid(0)\n"
                           "    except PermissionError:\n        pass\n")
        await turn.shutdown()
        return a, b

    async def dies(code):
        turn = await connect(d, token=TOKEN)
        try:
            r = await turn.run(code)
        except fbtest.fc.TurnClosed as e:
            return e.code, e.reason, None
        code_, reason, _ = await expect_closed(turn.ws, 20)
        return code_, reason, r.exit_code

    a, b = arun(ok_turn(), T)
    assert a.exit_code == 0 and b.exit_code == 0, (a, b)
    assert len(b.tool_calls) == 1, b
    oom = arun(dies("l = []\nwhile True:\n    l.append(b'\\x01' * (8 << 20))"), T)
    assert oom[0] == 1011 and oom[1].startswith("out of memory"), oom
    timeout = arun(dies("import time\ntime.sleep(30)"), T)
    assert timeout[:2] == (1000, "block timeout: the block ran longer than 2 s (--block-timeout)")
    resp = http_raw(d.port, upgrade_request("/", token="wrong"))
    assert resp.status == 401

    # Every end line is written once its death report (peak memory) is in.
    assert wait_until(lambda: len(end_lines(d)) >= 3, 15), d.stderr(4000)
    after = scrape(port)

    assert val(after, "forkbox_turns_active", tenant="default") == 0
    assert delta(before, after, "forkbox_turns_total", tenant="default", end="ok") == 1
    assert delta(before, after, "forkbox_turns_total", tenant="default", end="memory") == 1
    assert delta(before, after, "forkbox_turns_total", tenant="default", end="timeout") == 1
    total = sum(v for (n, _), v in after.items() if n == "forkbox_turns_total")
    assert total - sum(v for (n, _), v in before.items() if n == "forkbox_turns_total") == 3
    assert delta(before, after, "forkbox_http_refusals_total", status="401") == 1
    assert delta(before, after, "forkbox_tool_calls_total") == 1
    assert delta(before, after, "forkbox_sandboxes_spawned_total") == 3
    assert delta(before, after, "forkbox_sandboxes_killed_total", cause="memory") == 1
    assert delta(before, after, "forkbox_sandboxes_killed_total", cause="timeout") == 1
    assert delta(before, after, "forkbox_sandboxes_killed_total", cause="pids") == 0
    assert delta(before, after, "forkbox_turn_ready_seconds_count") == 3
    assert delta(before, after, "forkbox_turn_ready_seconds_bucket", le="+Inf") == 3
    # ok: two blocks; oom: one (ended with the turn); timeout: one.
    assert delta(before, after, "forkbox_block_duration_seconds_count") == 4
    assert delta(before, after, "forkbox_block_duration_seconds_sum") >= 2.0
    assert delta(before, after, "forkbox_block_duration_seconds_bucket", le="1") >= 2
    assert delta(before, after, "forkbox_turn_peak_memory_bytes_count") == 3
    # The OOM turn reached its limit: at least ~its 128 MiB, less a little.
    assert delta(before, after, "forkbox_turn_peak_memory_bytes_sum") >= 100 << 20
    assert delta(before, after, "forkbox_client_received_bytes_total") > 0
    assert delta(before, after, "forkbox_client_sent_bytes_total") > 0
    # Every iteration of the event loop is timed (issue 25, item 5); those
    # turns took many, and none of them anywhere near a second.
    iterations = delta(before, after, "forkbox_loop_iteration_seconds_count")
    assert iterations > 20, iterations
    assert delta(before, after, "forkbox_loop_iteration_seconds_bucket", le="1") == iterations
    assert delta(before, after, "forkbox_loop_iteration_seconds_sum") > 0
    # The helper threads: nothing left to close, nothing lost (stderr is read).
    assert wait_until(lambda: val(scrape(port), "forkbox_closer_pending") == 0, 3)
    assert val(after, "forkbox_closer_leaked_total") == 0
    assert val(after, "forkbox_log_lines_dropped_total") == 0

    lines = end_lines(d)
    ends = sorted(m.group(2) for m in lines.values())
    assert ends == ["memory", "ok", "timeout"], ends
    ok = next(m for m in lines.values() if m.group(2) == "ok")
    assert re.fullmatch(r"127\.0\.0\.1:\d+", ok.group(3)), ok.group(0)
    assert (ok.group(5), ok.group(6)) == ("2", "1"), ok.group(0)
    # glibc's setuid() runs on every thread of the process (the runtime has
    # its channel reader too): at least the 2 calls made, as the turn counted.
    refused = int(ok.group(8))
    assert refused >= 2, ok.group(0)
    assert delta(before, after, "forkbox_seccomp_refusals_total", syscall="setuid") == refused
    assert ok.group(7) != "unknown" and int(ok.group(7)) > 1 << 20, ok.group(0)
    mem = next(m for m in lines.values() if m.group(2) == "memory")
    assert int(mem.group(7)) >= 100 << 20, mem.group(0)
    to = next(m for m in lines.values() if m.group(2) == "timeout")
    assert float(to.group(4)) >= 2.0, to.group(0)
    assert TOKEN not in d.stderr()


def test_metrics_only_on_their_own_port(make_daemon):
    d = make_daemon(["--metrics-listen", "127.0.0.1:0"])
    port = metrics_port(d)
    status, body = http_get(d.port, "/metrics")
    assert status != 200 and b"forkbox_" not in body, (status, body[:200])
    assert http_get(port, "/")[0] == 404
    assert http_get(port, "/health")[0] == 404
    status, body = http_get(port, "/metrics?x=1")
    assert status == 200 and b"# TYPE forkbox_turns_total counter" in body
    resp = http_raw(port, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert resp.status == 405


def test_metrics_address_equal_to_public_refused():
    with socket.socket() as s:  # a port nobody else is given while we hold it
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
    for metrics in (f"127.0.0.1:{p}", f"0.0.0.0:{p}"):
        d = fbtest.Daemon(["--listen", f"127.0.0.1:{p}", "--metrics-listen", metrics],
                          listen=False).start()
        try:
            assert d.wait_exit(20) == 2, d.stderr()
            # stderr is read by a thread: it may still be on its way.
            assert wait_until(lambda: "port of their own" in d.stderr(), 5), d.stderr()
            assert "--metrics-listen" in d.stderr()
        finally:
            d.stop()


def test_silent_scrapers_hold_nothing_up(make_daemon):
    """Silent connections beyond the cap close the oldest; a turn and a real
    scrape go on meanwhile; a silent one is closed at its deadline (5 s)."""
    d = make_daemon(["--metrics-listen", "127.0.0.1:0"])
    port = metrics_port(d)
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(20)]
    try:
        _, res = fbtest.run_blocks(d, "print('still here')", timeout=T)
        assert res[0].stdout == "still here\n"
        assert http_get(port, "/metrics")[0] == 200
        # The oldest ones were closed for the newer ones (EOF, not a hang).
        silent[0].settimeout(10)
        assert silent[0].recv(1) == b""
        # The newest is closed by its deadline.
        t0 = time.monotonic()
        silent[-1].settimeout(15)
        assert silent[-1].recv(1) == b""
        assert time.monotonic() - t0 < 10
    finally:
        for s in silent:
            s.close()
