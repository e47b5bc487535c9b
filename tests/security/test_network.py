"""Network egress from model code.

The test opens TCP and UDP listeners on the host's 127.0.0.1 (plus an abstract
and a path AF_UNIX listener) and the block tries to reach them; packet, raw and
netlink sockets and a route lookup toward 169.254.169.254 (UDP connect(), which
sends nothing) are tried too. Policy: `socket`/`socketpair` only for AF_UNIX,
everything else EAFNOSUPPORT; and the sandbox's own network namespace has no
route to the host even if a socket existed. Nothing is ever sent to an address
other than 127.0.0.1, and every connect is bounded by a short timeout.
"""

import os
import select
import socket
import textwrap
import uuid

import pytest

import sbx

EAF = {"exc": "OSError", "errno": "EAFNOSUPPORT"}


def _sock_case(expr: str) -> str:
    return f"try_(lambda: ({expr}, 'created')[1])"


# (case id, expression in the block, expected subset of the result)
def cases(tcp_port: int, udp_port: int, abstract: str, path: str):
    C = [
        ("tcp_socket", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_STREAM)"), EAF),
        ("tcp_connect_host_loopback",
         f"try_(lambda: socket.create_connection(('127.0.0.1', {tcp_port}), timeout=3) and 'connected')", EAF),
        ("tcp6_connect_host_loopback",
         f"try_(lambda: socket.create_connection(('::1', {tcp_port}), timeout=3) and 'connected')", EAF),
        ("udp_socket", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"), EAF),
        ("udp_sendto_host_loopback", f"try_(lambda: udp_send('127.0.0.1', {udp_port}))", EAF),
        ("udp6_socket", _sock_case("socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)"), EAF),
        ("tcp6_socket", _sock_case("socket.socket(socket.AF_INET6, socket.SOCK_STREAM)"), EAF),
        ("metadata_route_lookup_udp_connect", "try_(lambda: udp_connect_only('169.254.169.254', 80))", EAF),
        ("raw_icmp", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)"), EAF),
        ("raw_ip_tcp", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)"), EAF),
        ("ping_dgram", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)"), EAF),
        ("raw_icmpv6", _sock_case("socket.socket(socket.AF_INET6, socket.SOCK_RAW, 58)"), EAF),
        ("packet_raw", _sock_case("socket.socket(17, socket.SOCK_RAW, socket.htons(3))"), EAF),
        ("packet_dgram", _sock_case("socket.socket(17, socket.SOCK_DGRAM, socket.htons(3))"), EAF),
        ("netlink_route", _sock_case("socket.socket(16, socket.SOCK_RAW, 0)"), EAF),
        ("netlink_audit", _sock_case("socket.socket(16, socket.SOCK_RAW, 9)"), EAF),
        ("netlink_uevent", _sock_case("socket.socket(16, socket.SOCK_DGRAM, 15)"), EAF),
        ("netlink_sock_diag", _sock_case("socket.socket(16, socket.SOCK_RAW, 4)"), EAF),
        ("af_vsock", _sock_case("socket.socket(40, socket.SOCK_STREAM, 0)"), EAF),
        ("af_alg", _sock_case("socket.socket(38, socket.SOCK_SEQPACKET, 0)"), EAF),
        ("af_key", _sock_case("socket.socket(15, socket.SOCK_RAW, 2)"), EAF),
        ("af_xdp", _sock_case("socket.socket(44, socket.SOCK_RAW, 0)"), EAF),
        ("af_can", _sock_case("socket.socket(29, socket.SOCK_RAW, 1)"), EAF),
        ("af_bluetooth", _sock_case("socket.socket(31, socket.SOCK_RAW, 0)"), EAF),
        ("af_tipc", _sock_case("socket.socket(30, socket.SOCK_RDM, 0)"), EAF),
        ("socketpair_inet", "sc(53, 2, 1, 0, BUF)", {"ret": -1, "errno": "EAFNOSUPPORT"}),
        ("socket_inet_high_bits", "sc(41, 0x100000002, 1, 0)", {"ret": -1, "errno": "EAFNOSUPPORT"}),
        ("socket_inet_raw_syscall", "sc(41, 2, 1, 0)", {"ret": -1, "errno": "EAFNOSUPPORT"}),
        # AF_UNIX is allowed, but abstract names live in the network namespace and paths in
        # the mount namespace: the host's listeners are out of reach.
        ("unix_abstract_host_listener", f"try_(lambda: unix_connect({abstract!r}))",
         {"exc": "ConnectionRefusedError", "errno": "ECONNREFUSED"}),
        ("unix_path_host_listener", f"try_(lambda: unix_connect({path!r}))",
         {"exc": "FileNotFoundError", "errno": "ENOENT"}),
    ]
    return C


SETUP = r'''
import socket
BUF = _ct.create_string_buffer(64)
def udp_send(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    s.sendto(b"forkbox-egress", (host, port))
    return "sent"
def udp_connect_only(host, port):
    # a route lookup: connect() on UDP sends nothing
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((host, port))
    return "routed"
def unix_connect(addr):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(addr)
    return "connected"
'''

NETNS_BLOCK = r'''
R["net_dev"] = try_(lambda: sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]))
R["tcp_table"] = try_(lambda: open("/proc/net/tcp").read() + open("/proc/net/tcp6").read())
R["unix_socketpair"] = try_(lambda: (lambda a: (a[0].send(b"x"), a[1].recv(1).decode())[1])(socket.socketpair()))
'''


class Listeners:
    def __init__(self):
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(8)
        self.tcp.setblocking(False)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.udp.setblocking(False)
        self.abstract = "\0forkbox-sec-" + uuid.uuid4().hex
        self.ua = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ua.bind(self.abstract)
        self.ua.listen(8)
        self.ua.setblocking(False)
        self.path = f"/tmp/forkbox-sec-{uuid.uuid4().hex[:12]}.sock"
        self.up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.up.bind(self.path)
        self.up.listen(8)
        self.up.setblocking(False)

    def anything_arrived(self) -> list[str]:
        got = []
        r, _, _ = select.select([self.tcp, self.udp, self.ua, self.up], [], [], 0.5)
        names = {self.tcp: "tcp", self.udp: "udp", self.ua: "unix-abstract", self.up: "unix-path"}
        for s in r:
            got.append(names[s])
        return got

    def close(self):
        for s in (self.tcp, self.udp, self.ua, self.up):
            s.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


@pytest.fixture(scope="module")
def egress(daemon):
    L = Listeners()
    try:
        C = cases(L.tcp.getsockname()[1], L.udp.getsockname()[1], L.abstract, L.path)
        lines = [SETUP, "R = {}"]
        for cid, expr, _ in C:
            lines.append(f"R[{cid!r}] = isolated(lambda: {expr}, timeout=6)")
        lines.append(NETNS_BLOCK)
        lines.append("report(R)")
        r = daemon.run(sbx.prelude("\n".join(lines)), timeout=120)
        arrived = L.anything_arrived()
    finally:
        L.close()
    assert r.blocks and r.last.completed and r.last.exit_code == 0, f"egress block failed: {r!r}"
    return r.last.report(), arrived, None


_CASE_IDS = [c for c, _, _ in cases(1, 2, "a", "b")]
_EXPECTED = {c: e for c, _, e in cases(1, 2, "a", "b")}


@pytest.mark.parametrize("cid", _CASE_IDS)
def test_egress_refused(egress, cid):
    rep, _, _ = egress
    got = rep.get(cid)
    want = _EXPECTED[cid]
    assert isinstance(got, dict), f"{cid}: {got!r}"
    sub = {k: got.get(k) for k in want}
    assert sub == want, f"{cid}: got {got!r}, expected {want!r}"


def test_nothing_reached_host_listeners(egress):
    _, arrived, _ = egress
    assert arrived == [], f"host listeners received traffic from the sandbox: {arrived}"


def test_netns_has_only_loopback(egress):
    rep, _, _ = egress
    assert rep["net_dev"] == ["lo"], f"interfaces visible in the sandbox: {rep['net_dev']!r}"


def test_netns_hides_host_sockets(egress):
    """/proc/net/tcp in the sandbox lists the sandbox's namespace: no host listener
    (the host always has at least the daemon's own listening socket)."""
    rep, _, _ = egress
    table = rep["tcp_table"]
    assert isinstance(table, str), table
    rows = [l for l in table.splitlines() if ":" in l and not l.strip().startswith("sl")]
    assert rows == [], f"host sockets visible in the sandbox:\n{table[:2000]}"


def test_unix_socketpair_still_works(egress):
    rep, _, _ = egress
    assert rep["unix_socketpair"] == "x", rep["unix_socketpair"]
