"""HTTP front door: /health, routing, auth, capacity, probes and bad requests
(§1.1, §1.2, §9.1 items 1-4, §9.2 "slot taken too early")."""

import asyncio
import email.utils
import socket
import time

import pytest

from fbtest import (RawWS, arun, connect, get_health, http_raw, socket_closed, upgrade_request,
                    wait_until, websockets)

TOKEN = "s3cret-token-" + "ab" * 8


def assert_plain(resp, status, reason, body):
    """Byte-exact body and the full header set of a non-101 answer (§1.1)."""
    assert resp.status == status, resp
    assert resp.version == "HTTP/1.1"
    assert resp.reason == reason
    assert resp.body == body
    h = resp.headers
    assert h.get("content-type") == "text/plain; charset=utf-8", h
    assert h.get("content-length") == str(len(body)), h
    assert h.get("connection", "").lower() == "close", h
    assert "date" in h and email.utils.parsedate_to_datetime(h["date"]) is not None


async def one_block(daemon, code="print('ok')", **kw):
    turn = await connect(daemon, **kw)
    try:
        return await turn.run(code)
    finally:
        await turn.shutdown()


def turn_works(daemon, **kw):
    r = arun(one_block(daemon, **kw), 20)
    assert (r.stdout, r.exit_code) == ("ok\n", 0), r.stderr
    return True


# ---- item 1: /health ------------------------------------------------------

def test_health_before_during_after_turn(make_daemon):
    """§9.1.1: 200 OK\\n with no auth, before, during (block running and between
    blocks, even at capacity) and after a turn."""
    d = make_daemon(["--capacity", "1"], env={"ADK_CODE_MODE_AUTH_TOKEN": TOKEN})
    assert_plain(get_health(d.port), 200, "OK", b"OK\n")

    async def during():
        turn = await connect(d, token=TOKEN)
        task = asyncio.create_task(turn.run("import time; time.sleep(1.5); print('slept')"))
        await asyncio.sleep(0.5)
        running = await asyncio.to_thread(get_health, d.port)
        r = await task
        between = await asyncio.to_thread(get_health, d.port)
        await turn.shutdown()
        return running, r, between
    running, r, between = arun(during(), 20)
    assert r.stdout == "slept\n"
    assert_plain(running, 200, "OK", b"OK\n")
    assert_plain(between, 200, "OK", b"OK\n")
    assert wait_until(lambda: get_health(d.port).status == 200, 3)
    for _ in range(20):
        assert get_health(d.port).body == b"OK\n"
    assert turn_works(d, token=TOKEN)


def test_health_query_is_an_upgrade_path(daemon):
    """§1.1: only the exact target /health is the health check."""
    turn_works(daemon, path="/health?x")
    with RawWS(daemon.port, "/health?x") as ws:
        assert ws.response.status == 101
    resp = http_raw(daemon.port, b"GET /health?x HTTP/1.1\r\nHost: x\r\n\r\n")
    assert resp.body != b"OK\n"


# ---- item 2: routing and auth ---------------------------------------------

@pytest.mark.parametrize("path", ["/", "/x/y/z", "/?a=b", "/healthz", "/HEALTH", "/health/"])
def test_upgrade_on_any_path(daemon, path):
    """§9.1.2: every path but /health upgrades (no token configured)."""
    with RawWS(daemon.port, path) as ws:
        assert ws.response.status == 101
        assert ws.response.headers.get("upgrade", "").lower() == "websocket"


def test_auth_required_and_401_exact(make_daemon):
    """§9.1.2 / §1.2: exact 'Bearer <token>' required (surrounding whitespace
    tolerated, scheme case-sensitive, one space); 401 body byte-exact."""
    d = make_daemon(["--capacity", "1"], env={"ADK_CODE_MODE_AUTH_TOKEN": TOKEN})
    bad = [None, "", "Bearer", "Bearer ", f"bearer {TOKEN}", f"Bearer  {TOKEN}", f"Basic {TOKEN}",
           f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN.upper()}", f"{TOKEN}"]
    for auth in bad:
        t0 = time.monotonic()
        resp = http_raw(d.port, upgrade_request("/", auth=auth))
        assert_plain(resp, 401, "Unauthorized", b"Unauthorized\n")
        assert time.monotonic() - t0 < 4, "401 answer must close the connection"
    # surrounding whitespace is stripped
    for auth in (f"  Bearer {TOKEN}", f"Bearer {TOKEN}\t"):
        resp = http_raw(d.port, upgrade_request("/", auth=auth))
        assert resp.status == 101, (auth, resp)
        assert wait_until(lambda: turn_possible(d), 3)
    # failed checks never took the (single) slot
    assert turn_works(d, token=TOKEN)
    with pytest.raises(websockets.exceptions.InvalidStatusCode) as ei:
        arun(one_block(d, token="wrong"), 10)
    assert ei.value.status_code == 401


def turn_possible(d, token=TOKEN):
    try:
        return turn_works(d, token=token)
    except Exception:
        return False


def test_no_token_accepts_every_upgrade(daemon):
    """§9.1.2: with no token configured, any Authorization header is accepted."""
    turn_works(daemon, token="whatever")
    resp = http_raw(daemon.port, upgrade_request("/", auth="Basic Zm9vOmJhcg=="))
    assert resp.status == 101


def test_token_file(make_daemon, tmp_path):
    """--token-file: the file's token is required."""
    f = tmp_path / "token"
    f.write_text("file-token-123\n")
    d = make_daemon(["--token-file", str(f)])
    assert turn_works(d, token="file-token-123")
    assert_plain(http_raw(d.port, upgrade_request("/", token="nope")), 401, "Unauthorized",
                 b"Unauthorized\n")


# ---- item 3: port probes ---------------------------------------------------

def test_port_probe_does_not_take_slot(make_daemon):
    """§9.1.3: bare TCP connects that close (with or without sending) do not
    take the slot or disturb the server."""
    d = make_daemon(["--capacity", "1"])
    for _ in range(10):
        s = socket.create_connection(("127.0.0.1", d.port), timeout=2)
        s.close()
    s = socket.create_connection(("127.0.0.1", d.port), timeout=2)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")  # RST on close
    s.close()
    assert get_health(d.port).status == 200
    assert turn_works(d)
    assert d.alive()


# ---- item 4: capacity ------------------------------------------------------

def test_capacity_busy_before_auth(make_daemon):
    """§9.1.4: at capacity a further upgrade gets 503 Busy\\n, checked before
    auth; /health still answers; a released slot is reusable."""
    d = make_daemon(["--capacity", "2"], env={"ADK_CODE_MODE_AUTH_TOKEN": TOKEN})

    async def go():
        t1 = await connect(d, token=TOKEN)
        t2 = await connect(d, token=TOKEN)
        r1 = await t1.run("x = 1")
        r2 = await t2.run("x = 2")
        busy_good = await asyncio.to_thread(http_raw, d.port, upgrade_request("/", token=TOKEN))
        busy_bad = await asyncio.to_thread(http_raw, d.port, upgrade_request("/", token="wrong"))
        busy_none = await asyncio.to_thread(http_raw, d.port, upgrade_request("/"))
        health = await asyncio.to_thread(get_health, d.port)
        await t1.shutdown()
        # the slot comes back
        t0 = time.monotonic()
        while True:
            try:
                t3 = await connect(d, token=TOKEN)
                break
            except websockets.exceptions.InvalidStatusCode:
                if time.monotonic() - t0 > 2:
                    raise
                await asyncio.sleep(0.05)
        r3 = await t3.run("print(x if 'x' in globals() else 'fresh')")
        r2b = await t2.run("print(x)")
        await t3.shutdown()
        await t2.shutdown()
        return r1, r2, busy_good, busy_bad, busy_none, health, r3, r2b
    r1, r2, busy_good, busy_bad, busy_none, health, r3, r2b = arun(go(), 30)
    assert r1.exit_code == 0 and r2.exit_code == 0
    for resp in (busy_good, busy_bad, busy_none):
        assert_plain(resp, 503, "Service Unavailable", b"Busy\n")
    assert_plain(health, 200, "OK", b"OK\n")
    assert r3.stdout == "fresh\n"
    assert r2b.stdout == "2\n"        # turns are independent


# ---- issue 11, item 7: front-door edges ----------------------------------------

def assert_426(resp):
    """RFC 6455 4.2.2/4.4 and RFC 7231 6.5.15: a 426 names the upgrade it wants."""
    assert_plain(resp, 426, "Upgrade Required", b"Upgrade Required\n")
    assert resp.headers.get("sec-websocket-version") == "13", resp
    assert resp.headers.get("upgrade", "").lower() == "websocket", resp


@pytest.mark.parametrize("version", ["8", "12", "14", "13, 8", ""])
def test_wrong_version_426_says_13(daemon, version):
    """A wrong Sec-WebSocket-Version gets 426 with Sec-WebSocket-Version: 13."""
    req = upgrade_request("/").replace(b"Sec-WebSocket-Version: 13",
                                       f"Sec-WebSocket-Version: {version}".encode())
    assert_426(http_raw(daemon.port, req))


def test_plain_get_426_says_13(daemon):
    assert_426(http_raw(daemon.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"))


def test_wrong_version_routing_order(make_daemon):
    """Spec 1.1 rows in order for a wrong version: 503 before 401 before 426."""
    d = make_daemon(["--capacity", "1"], env={"ADK_CODE_MODE_AUTH_TOKEN": TOKEN})

    def wrong(token):
        return upgrade_request("/", token=token).replace(b"Sec-WebSocket-Version: 13",
                                                         b"Sec-WebSocket-Version: 8")
    assert_plain(http_raw(d.port, wrong("nope")), 401, "Unauthorized", b"Unauthorized\n")
    assert_plain(http_raw(d.port, wrong(None)), 401, "Unauthorized", b"Unauthorized\n")
    assert_426(http_raw(d.port, wrong(TOKEN)))

    async def at_capacity():
        turn = await connect(d, token=TOKEN)
        await turn.run("x = 1")
        out = [await asyncio.to_thread(http_raw, d.port, wrong(t)) for t in (TOKEN, "nope")]
        await turn.shutdown()
        return out
    for resp in arun(at_capacity(), 30):
        assert_plain(resp, 503, "Service Unavailable", b"Busy\n")
    assert wait_until(lambda: turn_possible(d), 5)


DUPLICATES = {
    "auth-right-right": [f"Authorization: Bearer {TOKEN}"],
    "auth-right-wrong": ["Authorization: Bearer wrong"],
    "auth-right-empty": ["Authorization:"],
    "auth-lowercase": [f"authorization: Bearer {TOKEN}"],
    "key": ["Sec-WebSocket-Key: " + "A" * 22 + "=="],
    "version": ["Sec-WebSocket-Version: 13"],
    "upgrade": ["Upgrade: websocket"],
    "host": ["Host: 127.0.0.1"],
}


@pytest.mark.parametrize("case", list(DUPLICATES))
def test_duplicated_header_refused_never_upgraded(make_daemon, case):
    """Two Authorization headers (or two of another header a request carries
    once) get 400 and are never upgraded, whatever the values; the slot stays
    free."""
    d = make_daemon(["--capacity", "1"], env={"ADK_CODE_MODE_AUTH_TOKEN": TOKEN})
    req = upgrade_request("/", token=TOKEN, headers=DUPLICATES[case])
    assert_plain(http_raw(d.port, req), 400, "Bad Request", b"Bad Request\n")
    # the wrong value first, the right one last (what "last wins" accepted)
    req = upgrade_request("/", auth="Bearer wrong", headers=[f"Authorization: Bearer {TOKEN}"])
    assert_plain(http_raw(d.port, req), 400, "Bad Request", b"Bad Request\n")
    assert turn_works(d, token=TOKEN)


def test_duplicated_authorization_refused_without_token(daemon):
    """With no token configured, any Authorization is accepted, but two are not."""
    req = upgrade_request("/", auth="Bearer a", headers=["Authorization: Bearer a"])
    assert_plain(http_raw(daemon.port, req), 400, "Bad Request", b"Bad Request\n")
    resp = http_raw(daemon.port, b"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: a\r\n"
                                 b"Authorization: a\r\n\r\n")
    assert_plain(resp, 400, "Bad Request", b"Bad Request\n")
    assert_plain(get_health(daemon.port), 200, "OK", b"OK\n")


# ---- §9.2: requests that must not wedge the server -------------------------

@pytest.mark.parametrize("req", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
    b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Version: 13\r\n\r\n",                                       # no key
    b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n",
    b"HELLO\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n",
], ids=["plain-get", "post", "no-key", "version-8", "garbage", "huge-header"])
def test_bad_request_does_not_wedge(make_daemon, req):
    """§9.2: a GET without upgrade (and other bad requests) gets a 4xx with
    Connection: close and leaves the single slot free."""
    d = make_daemon(["--capacity", "1"])
    try:
        resp = http_raw(d.port, req, timeout=5)
        if resp.raw:
            assert 400 <= resp.status < 500, resp
            assert resp.headers.get("connection", "").lower() == "close"
    except (ConnectionResetError, BrokenPipeError):
        pass  # closing on a hostile request is also fine
    assert get_health(d.port).status == 200
    assert turn_works(d)


def test_slow_client_is_closed_and_holds_no_slot(make_daemon):
    """§1.4 handshake timeout: half a request is closed after ~10 s; meanwhile
    it does not hold the only slot."""
    d = make_daemon(["--capacity", "1"])
    s = socket.create_connection(("127.0.0.1", d.port), timeout=2)
    t0 = time.monotonic()
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n")
    assert turn_works(d)
    assert get_health(d.port).status == 200
    closed = socket_closed(s, 14)
    elapsed = time.monotonic() - t0
    s.close()
    assert closed, "half-sent request not closed within 14 s"
    assert elapsed > 2, f"closed too early ({elapsed:.1f}s) for a slow client"
    assert turn_works(d)


def test_compression_optional(daemon):
    """§1.4: a client without permessage-deflate works too."""
    turn_works(daemon, compression=None)


def test_port_env_binds_all_interfaces(make_daemon):
    """§1.1 / §8.3: PORT without --listen binds 0.0.0.0:$PORT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = make_daemon(env={"PORT": str(port)}, listen=False)
    assert wait_until(lambda: _health_ok(port), 10), d.stderr()
    assert "0.0.0.0:%d" % port in d.stderr()
    d.port = port
    assert turn_works(d)


def _health_ok(port):
    try:
        return get_health(port).status == 200
    except OSError:
        return False
