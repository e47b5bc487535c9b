"""A connection flooder for the pre-auth tests (run as its own process).

    python3 flood.py [--partial] PORT SECONDS STATS_FILE ADDR:N [ADDR:N ...]

Keeps N idle TCP connections from each loopback source address ADDR open to
127.0.0.1:PORT, never sending a byte (with --partial: each sends the first
line of a request and nothing more, a slowloris); whenever the server closes or resets one,
it opens a new one at once, for SECONDS or until SIGTERM. Then it closes
everything and writes
{"connects": c, "closed_by_server": k, "errors": e} as JSON to STATS_FILE.

Loopback only: ADDR must be in 127.0.0.0/8, and the destination is always
127.0.0.1. Bounded in time (SECONDS, at most 60) and in count (N per address,
at most 4096 in all).
"""

import errno
import json
import resource
import select
import signal
import socket
import sys
import time

IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)


def main() -> int:
    args = sys.argv[1:]
    partial = args[0] == "--partial"
    if partial:
        args = args[1:]
    port, seconds, stats_file = int(args[0]), float(args[1]), args[2]
    slots = []
    for spec in args[3:]:
        addr, n = spec.rsplit(":", 1)
        if not addr.startswith("127."):
            raise SystemExit(f"flood.py: not a loopback address: {addr}")
        slots += [addr] * int(n)
    if seconds > 60 or len(slots) > 4096:
        raise SystemExit("flood.py: at most 60 s and 4096 connections")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    ep = select.epoll()
    socks: dict[int, tuple[socket.socket, str]] = {}
    want = {a: slots.count(a) for a in set(slots)}
    have = dict.fromkeys(want, 0)
    stats = {"connects": 0, "closed_by_server": 0, "errors": 0}

    def open_one(addr: str) -> bool:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        # The port is chosen at connect() from the whole 4-tuple, so one source
        # address is not limited by ports that bound sockets hold.
        s.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        try:
            s.bind((addr, 0))
            rc = s.connect_ex(("127.0.0.1", port))
        except OSError:
            rc = -1
        if rc not in (0, errno.EINPROGRESS):
            stats["errors"] += 1
            s.close()
            return False
        stats["connects"] += 1
        socks[s.fileno()] = (s, addr)
        have[addr] += 1
        ep.register(s.fileno(), select.EPOLLIN | select.EPOLLRDHUP |
                    (select.EPOLLOUT if partial else 0))
        return True

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stop:
        # (Re)open what is missing; a failed connect is retried next round.
        for addr, n in want.items():
            while have[addr] < n and open_one(addr):
                pass
        for fd, ev in ep.poll(0.05):
            if ev == select.EPOLLOUT:  # connected: send the partial request once
                try:
                    socks[fd][0].send(b"GET / HTTP/1.1\r\n")
                except OSError:
                    pass
                ep.modify(fd, select.EPOLLIN | select.EPOLLRDHUP)
                continue
            s, addr = socks.pop(fd)
            ep.unregister(fd)
            s.close()
            have[addr] -= 1
            stats["closed_by_server"] += 1
            open_one(addr)
    for s, _ in socks.values():
        s.close()
    with open(stats_file, "w") as f:
        json.dump(stats, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
