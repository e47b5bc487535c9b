"""Network egress from model code.

The test opens TCP and UDP listeners on the host's 127.0.0.1 (plus an abstract
and a path AF_UNIX listener) and the block tries to reach them; packet, raw,
netlink and other families, protocols other than TCP and UDP, and a route
lookup toward 169.254.169.254 (UDP connect(), which sends nothing) are tried
too. Policy: `socket` for AF_UNIX and for TCP and UDP over IPv4 and IPv6
(protocol 0, TCP or UDP); other families EAFNOSUPPORT, other types and
protocols of AF_INET/AF_INET6 EPERM; `socketpair` AF_UNIX only. The TCP and
UDP sockets live in the sandbox's own network namespace, which has only `lo`
and no route: 127.0.0.1 and ::1 there are the sandbox itself (nothing
listens, so the host's listeners are never reached), and anything else is
ENETUNREACH without a packet sent. Nothing is ever sent to an address other
than 127.0.0.1, and every connect is bounded by a short timeout.
"""

import os
import select
import socket
import textwrap
import uuid

import pytest

import sbx

EAF = {"exc": "OSError", "errno": "EAFNOSUPPORT"}
EPERM = {"exc": "PermissionError", "errno": "EPERM"}
CREATED = "created"
UNREACH = {"errno": "ENETUNREACH"}
REFUSED = {"exc": "ConnectionRefusedError", "errno": "ECONNREFUSED"}


def _sock_case(expr: str) -> str:
    return f"try_(lambda: ({expr}, 'created')[1])"


# (case id, expression in the block, expected: a subset of the result dict, or the result)
def cases(tcp_port: int, udp_port: int, abstract: str, path: str):
    C = [
        # TCP and UDP: created, but they only reach the sandbox's own loopback.
        ("tcp_socket", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_STREAM)"), CREATED),
        ("tcp_socket_proto_tcp", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)"), CREATED),
        ("tcp_socket_flags", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)"), CREATED),
        ("tcp_connect_host_loopback",
         f"try_(lambda: socket.create_connection(('127.0.0.1', {tcp_port}), timeout=3) and 'connected')", REFUSED),
        ("tcp6_connect_host_loopback",
         f"try_(lambda: socket.create_connection(('::1', {tcp_port}), timeout=3) and 'connected')", REFUSED),
        ("udp_socket", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"), CREATED),
        ("udp_sendto_host_loopback", f"try_(lambda: udp_send('127.0.0.1', {udp_port}))", "sent"),
        ("udp6_socket", _sock_case("socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)"), CREATED),
        ("tcp6_socket", _sock_case("socket.socket(socket.AF_INET6, socket.SOCK_STREAM)"), CREATED),
        ("metadata_route_lookup_udp_connect", "try_(lambda: udp_connect_only('169.254.169.254', 80))", UNREACH),
        ("tcp_connect_10_255_255_1", "try_(lambda: socket.create_connection(('10.255.255.1', 80), timeout=3) and 'connected')", UNREACH),
        ("udp_sendto_10_255_255_1", "try_(lambda: udp_send('10.255.255.1', 53))", UNREACH),
        ("tcp6_connect_global", "try_(lambda: socket.create_connection(('2001:db8::1', 80), timeout=3) and 'connected')", UNREACH),
        # Raw and ping sockets, other protocols: EPERM from the policy (the
        # kernel would also want CAP_NET_RAW for raw, which is dropped).
        ("raw_icmp", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)"), EPERM),
        ("raw_ip_tcp", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)"), EPERM),
        ("ping_dgram", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)"), EPERM),
        ("raw_icmpv6", _sock_case("socket.socket(socket.AF_INET6, socket.SOCK_RAW, 58)"), EPERM),
        ("ping6_dgram", _sock_case("socket.socket(socket.AF_INET6, socket.SOCK_DGRAM, 58)"), EPERM),
        ("sctp_stream", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_STREAM, 132)"), EPERM),
        ("sctp_seqpacket", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_SEQPACKET, 132)"), EPERM),
        ("mptcp", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)"), EPERM),
        ("udplite", _sock_case("socket.socket(socket.AF_INET6, socket.SOCK_DGRAM, 136)"), EPERM),
        ("udp_proto_tcp", _sock_case("socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_TCP)"), EPERM),
        ("tcp_ulp_tls", "try_(lambda: socket.socket().setsockopt(socket.IPPROTO_TCP, 31, b'tls') or 'set')",
         {"errno": "ENOENT"}),
        # Every other family looks absent.
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
        ("af_unspec", "sc(41, 0, 1, 0)", {"ret": -1, "errno": "EAFNOSUPPORT"}),
        ("af_ax25", "sc(41, 3, 2, 0)", {"ret": -1, "errno": "EAFNOSUPPORT"}),
        ("af_ipx", "sc(41, 4, 2, 0)", {"ret": -1, "errno": "EAFNOSUPPORT"}),
        ("af_bridge", "sc(41, 7, 2, 0)", {"ret": -1, "errno": "EAFNOSUPPORT"}),
        ("af_atmpvc", "sc(41, 8, 2, 0)", {"ret": -1, "errno": "EAFNOSUPPORT"}),
        ("af_x25", "sc(41, 9, 5, 0)", {"ret": -1, "errno": "EAFNOSUPPORT"}),
        ("socketpair_inet", "sc(53, 2, 1, 0, BUF)", {"ret": -1, "errno": "EAFNOSUPPORT"}),
        ("socket_inet_high_bits", "sc(41, 0x100000002, 1, 0)", {"ret": -1, "errno": "EAFNOSUPPORT"}),
        ("socket_inet_proto_high_bits", "sc(41, 2, 1, 0x100000000)", {"ret": -1, "errno": "EPERM"}),
        ("socket_inet_raw_syscall", "(lambda r: 'created' if r['ret'] >= 0 else r)(sc(41, 2, 1, 0))", CREATED),
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
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
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
def test_egress(egress, cid):
    rep, _, _ = egress
    got = rep.get(cid)
    want = _EXPECTED[cid]
    if not isinstance(want, dict):
        assert got == want, f"{cid}: got {got!r}, expected {want!r}"
        return
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


NOROUTE_BLOCK = r'''
import socket
def counters():
    dev = {l.split(":")[0].strip(): l.split(":")[1].split() for l in open("/proc/net/dev").read().splitlines()[2:]}
    snmp = open("/proc/net/snmp").read().splitlines()
    ip = dict(zip(snmp[0].split()[1:], map(int, snmp[1].split()[1:])))
    ip6 = dict(l.split() for l in open("/proc/net/snmp6").read().splitlines() if l.strip())
    return {"ifaces": sorted(dev), "lo_tx_packets": int(dev["lo"][9]), "lo_tx_bytes": int(dev["lo"][8]),
            "ip_out_requests": ip["OutRequests"], "ip_out_no_routes": ip["OutNoRoutes"],
            "ip6_out_requests": int(ip6["Ip6OutRequests"]), "ip6_out_no_routes": int(ip6["Ip6OutNoRoutes"])}
def tcp(host):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(3)
    s.connect((host, 80))
    return "connected"
def udp(host):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"forkbox-egress", (host, 53))
    return "sent"
R = {"before": counters()}
R["tcp4"] = try_(lambda: tcp("10.255.255.1"))
R["udp4"] = try_(lambda: udp("10.255.255.1"))
R["tcp6"] = try_(lambda: tcp("2001:db8::1"))
R["udp6"] = try_(lambda: udp("2001:db8::1"))
R["after"] = counters()
report(R)
'''


def test_no_route_out_and_nothing_sent(daemon):
    """A connect or sendto to an address outside the sandbox fails at the route
    lookup: ENETUNREACH, counted as "no route" by the sandbox's own IP stack,
    and no packet leaves through its only interface (lo)."""
    r = daemon.run(sbx.prelude(NOROUTE_BLOCK), timeout=60)
    assert r.blocks and r.last.completed and r.last.exit_code == 0, f"block failed: {r!r}"
    rep = r.last.report()
    for k in ("tcp4", "udp4", "tcp6", "udp6"):
        assert isinstance(rep[k], dict) and rep[k].get("errno") == "ENETUNREACH", f"{k}: {rep[k]!r}"
    b, a = rep["before"], rep["after"]
    assert a["ifaces"] == ["lo"], a
    assert (a["lo_tx_packets"], a["lo_tx_bytes"]) == (b["lo_tx_packets"], b["lo_tx_bytes"]), (b, a)
    assert a["ip_out_requests"] == b["ip_out_requests"], (b, a)
    assert a["ip6_out_requests"] == b["ip6_out_requests"], (b, a)
    assert a["ip_out_no_routes"] - b["ip_out_no_routes"] >= 2, (b, a)
    assert a["ip6_out_no_routes"] - b["ip6_out_no_routes"] >= 2, (b, a)
