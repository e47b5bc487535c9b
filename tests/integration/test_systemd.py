"""systemd's readiness protocol (sd_notify(3)) as the real forkboxd speaks it:
a datagram socket stands in for the service manager, $NOTIFY_SOCKET points at
it, and the messages are checked in order through start, a turn and SIGTERM;
$WATCHDOG_USEC makes WATCHDOG=1 pings. Then the shipped unit (systemd-analyze
verify, its settings) and its command line with the shipped settings file
(issue 15, item 4)."""

import asyncio
import os
import re
import signal
import socket
import struct
import subprocess
import time
import uuid

import pytest

from fbtest import FORKBOXD, POLICY, Daemon, arun, connect, run_blocks, wait_until

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


# ---- the shipped unit and settings file (dist/) ------------------------------

DISTDIR = os.environ.get("FORKBOX_DISTDIR") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(FORKBOXD))), "dist")


def unit_text() -> str:
    with open(os.path.join(DISTDIR, "forkboxd.service")) as fh:
        return fh.read()


def unit_settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def test_unit_verifies(tmp_path):
    """systemd-analyze verify accepts the unit without a word (an unknown key
    is only a warning: any output fails), once its ExecStart names a
    forkboxd that exists (the build tree's here; tools/deb-test verifies the
    installed one as it is)."""
    text = unit_text()
    exe = unit_settings(text)["ExecStart"][0].split()[0]
    unit = tmp_path / "forkboxd.service"
    unit.write_text(text.replace(exe, FORKBOXD))
    p = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), \
        (p.returncode, p.stdout, p.stderr)


def test_unit_settings():
    """What the service depends on is in the unit: readiness by notify,
    the delegated cgroup subtree, SIGTERM to forkboxd alone, a stop timeout
    above the 30 s drain, a watchdog, the OOM killer's order, the token as a
    credential, no start without a token file, no seccomp-based directive
    (sandboxes would inherit it), nothing that mounts over /proc."""
    s = unit_settings(unit_text())
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    assert s["Delegate"] == ["yes"] and s["KillMode"] == ["mixed"]
    stop = s["TimeoutStopSec"][0]
    assert stop.endswith("s") and int(stop[:-1]) > 30, stop
    assert s["WatchdogSec"] and s["NoNewPrivileges"] == ["yes"]
    # The OOM killer's order (src/core/limits.h): sandboxes, then the fork
    # server, forkboxd last; lowering it needs CAP_SYS_RESOURCE.
    assert s["OOMScoreAdjust"] == ["-900"] and "CAP_SYS_RESOURCE" in s["CapabilityBoundingSet"][0]
    token = s["ConditionPathExists"][0]
    assert token.endswith("/forkbox/token") and f"--token-file {token}" in s["ExecStart"][0]
    assert s["ExecReload"] == ["/bin/kill -HUP $MAINPID"]  # re-reads the token file
    for k in ("SystemCallFilter", "RestrictAddressFamilies", "RestrictNamespaces",
              "ProtectKernelTunables", "ProtectKernelLogs", "ProtectProc", "ProcSubset",
              "ProtectControlGroups", "PrivateUsers", "MemoryDenyWriteExecute"):
        assert k not in s, k


def shipped_conf(tmp_path) -> str:
    """The shipped forkboxd.conf with every '# name = value' default line
    uncommented."""
    lines = []
    with open(os.path.join(DISTDIR, "forkboxd.conf")) as fh:
        for line in fh:
            m = re.match(r"# ([a-z-]+ = .*)$", line)
            lines.append(m.group(1) + "\n" if m else line)
    conf = tmp_path / "forkboxd.conf"
    conf.write_text("".join(lines))
    return str(conf)


def test_unit_command_runs_a_turn(tmp_path, manager):
    """The unit's ExecStart as systemd would run it: the shipped settings
    file (every default uncommented: each must parse), the token from
    token file (here a temporary one), $NOTIFY_SOCKET and the unit's watchdog.
    READY=1, a turn with the token, WATCHDOG=1, and STOPPING=1 on SIGTERM."""
    s = unit_settings(unit_text())
    token = tmp_path / "token"
    token.write_text("unit-token\n")
    argv = s["ExecStart"][0].replace(s["ConditionPathExists"][0], str(token)).split()[1:]
    conf_at = argv.index("--config") + 1
    argv[conf_at] = shipped_conf(tmp_path)
    # The file's listen (8080) and policy (the installed path) give way to
    # the test's flags: flags override the file.
    d = Daemon(argv + ["--listen", "127.0.0.1:0", "--policy", POLICY], policy=False,
               env={"NOTIFY_SOCKET": manager.env, "WATCHDOG_USEC": "1000000"})
    try:
        d.start()
        assert manager.wait_for(lambda l: l == "READY=1", T)
        assert "settings from" in d.stderr() and "auth on" in d.stderr()
        _, res = run_blocks(d, "print(6 * 7)", token="unit-token")
        assert res[0].stdout == "42\n" and res[0].exit_code == 0
        assert manager.wait_for(lambda l: l == "WATCHDOG=1", 3), manager.lines()
        os.kill(d.pid, signal.SIGTERM)
        assert d.wait_exit(T) == 0
        manager.poll(0.2)
        assert "STOPPING=1" in manager.lines()
    finally:
        d.stop()
