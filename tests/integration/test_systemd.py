"""systemd's readiness protocol (sd_notify(3)) as the real forkboxd speaks it:
a datagram socket stands in for the service manager, $NOTIFY_SOCKET points at
it, and the messages are checked in order through start, a turn and SIGTERM;
$WATCHDOG_USEC makes WATCHDOG=1 pings (issue 15, item 4)."""

import asyncio
import os
import signal
import socket
import struct
import time
import uuid

import pytest

from fbtest import arun, connect, run_blocks, wait_until

T = 30


class Manager:
    """The service manager's end: a bound AF_UNIX datagram socket that records
    every datagram with the sender's pid (SCM_CREDENTIALS, which is how
    systemd tells the main process's messages from others')."""

    def __init__(self, tmp_path, abstract: bool):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        if abstract:
            name = f"forkbox-test-{uuid.uuid4().hex}"
            self.sock.bind("\0" + name)
            self.env = "@" + name
        else:
            path = str(tmp_path / "notify")
            self.sock.bind(path)
            self.env = path
        self.msgs: list[tuple[int, list[str]]] = []  # (sender pid, lines)

    def poll(self, timeout: float) -> None:
        """Read what arrives within timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.sock.settimeout(left)
            try:
                data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
            except socket.timeout:
                return
            pid = -1
            for level, kind, body in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("iII", body[:12])[0]
            self.msgs.append((pid, data.decode().split("\n")))

    def wait_for(self, pred, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(pred(line) for _, lines in self.msgs for line in lines):
                return True
            self.poll(0.1)
        return False

    def lines(self) -> list[str]:
        return [line for _, lines in self.msgs for line in lines]

    def close(self):
        self.sock.close()


@pytest.fixture
def manager(tmp_path, request):
    m = Manager(tmp_path, abstract=getattr(request, "param", True))
    yield m
    m.close()


@pytest.mark.parametrize("manager", [True, False], indirect=True, ids=["abstract", "path"])
def test_ready_status_stopping_in_order(make_daemon, manager):
    """READY=1 (with a first STATUS=) once listening; STATUS= follows the
    turns; SIGTERM sends STOPPING=1 before the daemon exits 0. Every message
    comes from forkboxd itself (NotifyAccess=main), none from the fork
    server, which never sees $NOTIFY_SOCKET."""
    d = make_daemon(["--capacity", "8", "--pool", "2"], env={"NOTIFY_SOCKET": manager.env})
    assert manager.wait_for(lambda l: l == "READY=1", T), manager.msgs
    first = manager.msgs[0][1]
    assert first == ["READY=1", "STATUS=turns 0/8, pool 2"], first

    fs = d.forkserver_pid()
    with open(f"/proc/{fs}/environ", "rb") as fh:
        assert b"NOTIFY_SOCKET" not in fh.read()

    # A turn that holds its slot for a while: STATUS= must show it.
    async def go():
        turn = await connect(d)
        try:
            task = asyncio.ensure_future(turn.run("import time; time.sleep(3); print('ok')"))
            seen = await asyncio.get_running_loop().run_in_executor(
                None, manager.wait_for, lambda l: l == "STATUS=turns 1/8, pool 2", 5)
            r = await task
            return seen, r
        finally:
            await turn.shutdown()
    seen, r = arun(go(), T)
    assert seen, manager.lines()
    assert r.exit_code == 0 and r.stdout == "ok\n"
    # ... and the slot given back.
    busy = manager.lines().index("STATUS=turns 1/8, pool 2")
    assert wait_until(lambda: (manager.poll(0.1), "STATUS=turns 0/8, pool 2" in
                               manager.lines()[busy:])[1], 5), manager.lines()

    os.kill(d.pid, signal.SIGTERM)
    assert d.wait_exit(T) == 0, d.stderr(3000)
    manager.poll(0.2)
    lines = manager.lines()
    assert "STOPPING=1" in lines, lines
    assert lines.index("READY=1") < lines.index("STATUS=turns 1/8, pool 2") < \
        lines.index("STOPPING=1"), lines
    assert lines.count("READY=1") == 1 and lines.count("STOPPING=1") == 1, lines
    assert {pid for pid, _ in manager.msgs} == {d.pid}, manager.msgs


def test_watchdog_pings(make_daemon, manager):
    """WATCHDOG_USEC=400000: WATCHDOG=1 at least every 200 ms-ish (the tick is
    250 ms), so several within two seconds; none before READY=1."""
    make_daemon(env={"NOTIFY_SOCKET": manager.env, "WATCHDOG_USEC": "400000"})
    manager.poll(2.0)
    lines = manager.lines()
    assert lines[0] == "READY=1", lines
    assert lines.count("WATCHDOG=1") >= 4, lines


def test_watchdog_for_another_pid_is_ignored(make_daemon, manager):
    """WATCHDOG_PID names another process: the watchdog is not forkboxd's."""
    make_daemon(env={"NOTIFY_SOCKET": manager.env, "WATCHDOG_USEC": "400000",
                     "WATCHDOG_PID": "1"})
    manager.poll(1.5)
    lines = manager.lines()
    assert "READY=1" in lines and "WATCHDOG=1" not in lines, lines


def test_no_notify_socket_no_messages(make_daemon, manager):
    """Without $NOTIFY_SOCKET nothing is sent, and a turn still runs."""
    d = make_daemon()
    _, res = run_blocks(d, "print(2)")
    assert res[0].stdout == "2\n"
    manager.poll(0.5)
    assert manager.msgs == []
