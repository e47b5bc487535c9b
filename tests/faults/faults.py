"""Helpers of the fault suite (issue 26), on top of tests/lib/fbtest.py.

* Turns as a host runs them, whose outcome is one line: "ran" or the close
  code and reason the client saw ("1006" when there was no close frame).
* What a daemon holds (Holdings): its processes (supervisor, fork server,
  cgroup helper, sandboxes), its turn cgroups, the supervisor's fds, and the
  host's mounts before it started; left_after_stop() lists what is still
  there once it has exited (processes, turn cgroups, mounts, processes
  running as an id of its block).
* Faults, each undone by the test that injects it: stopping a process
  (SIGSTOP/SIGCONT), freezing a sandbox (v1 freezer, or the v2 cgroup.freeze
  of its turn cgroup), a read-only cgroup hierarchy in the daemon's own
  mount namespace, a memory cgroup with a limit for the whole daemon.
  Cgroups the tests make are theirs and removed by them; no other is
  touched.
* record(): with $FORKBOX_FAULT_REPORT set, each test appends one JSON line
  (fault, what the clients saw, what was left behind, time to recover),
  written before the test's assertions, so that a build that fails them
  (d4bf581) is described as well: tests/faults/table.py formats them.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import time

import forkbox_client as fc
import websockets.exceptions
from fbtest import (ConnectionClosed, arun, cgroup_forkbox_dirs, cgroup_mounts, children,
                    descendants, host_mounts, nspid_depth, pid_alive, wait_until)

T = 60

REPORT = os.environ.get("FORKBOX_FAULT_REPORT")
# tools/test-sanitized: ASan's shadow and quarantine change what a memory
# limit means.
UNDER_ASAN = "ASAN_OPTIONS" in os.environ


def record(fault: str, clients: list[str], left: list[str], recover_s: float | str | None,
           **extra) -> None:
    """recover_s: seconds from the fault's end to a turn that runs, None if none
    did, "n/a" for a fault that needs no recovery."""
    if not REPORT:
        return
    row = {"fault": fault, "clients": clients, "left": left,
           "recover_s": round(recover_s, 2) if isinstance(recover_s, float) else recover_s,
           **extra}
    with open(REPORT, "a") as f:
        f.write(json.dumps(row) + "\n")


# ---- turns -------------------------------------------------------------------

async def host_turn(d, code: str, *, open_timeout: float = 30.0, tools=None) -> str:
    """One turn, one block, then shutdown: "ran: <stdout>" or what its close
    said ("<code> <reason>"; "1006" without a close frame), or the error."""
    try:
        turn = await fc.Turn.connect(d.url, tools or {}, token=d.token, open_timeout=open_timeout)
    except ConnectionClosed as e:  # closed while it sent its tools archive
        return f"{e.rcvd.code} {e.rcvd.reason}" if e.rcvd else "1006"
    except websockets.exceptions.InvalidStatusCode as e:  # answered at the door
        return f"http {e.status_code}"
    except Exception as e:  # noqa: BLE001  (refused, timed out: what the client saw)
        return f"connect failed: {e!r}"[:160]
    try:
        r = await turn.run(code)
        return f"ran: {r.stdout.strip()}"[:160]
    except fc.TurnClosed as e:
        return f"{e.code} {e.reason}".strip()
    except Exception as e:  # noqa: BLE001
        return f"error: {e!r}"[:160]
    finally:
        await turn.shutdown()


def ok_outcome(o: str) -> bool:
    """A turn completed, ended with a close frame that says why, or was
    answered 503 at the door (its body says why: out of fds, busy)."""
    m = re.match(r"(\d+) (.+)", o)
    return (o.startswith("ran") or o == "http 503" or
            bool(m and m.group(1) in ("1000", "1001", "1011", "1013")))


def recover(d, since: float, limit: float = 30.0) -> float | None:
    """Seconds from `since` until a new turn runs print(1), or None."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if arun(host_turn(d, "print(1)", open_timeout=10), 20) == "ran: 1":
            return time.monotonic() - since
        time.sleep(0.1)
    return None


# ---- what a daemon holds ------------------------------------------------------

def own_cgroup(pid: int, controller: str | None) -> str | None:
    """pid's cgroup path in the v1 hierarchy of controller, or (None) v2."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            hid, ctls, path = line.rstrip("\n").split(":", 2)
            if (controller and controller in ctls.split(",")) or (not controller and hid == "0"):
                return path
    return None


def controller_mount(controller: str) -> str | None:
    """Where the v1 hierarchy of controller is mounted (None: not a v1 one)."""
    for fstype, mnt, opts in cgroup_mounts():
        if fstype == "cgroup" and controller in opts:
            return mnt
    return None


class Holdings:
    """What daemon d holds, taken while it runs (take() again to add what
    came since: sandboxes, a new cgroup helper)."""

    def __init__(self, d, mounts_before: set[str]):
        self.d = d
        self.mounts_before = mounts_before
        self.ids = d.ids or id_range_of(d.args)
        self.procs: set[int] = set()
        self.placers: set[int] = set()
        self.dirs = cgroup_forkbox_dirs(d.pid)
        self.fds_idle = len(os.listdir(f"/proc/{d.pid}/fd"))
        self.take()

    def take(self) -> None:
        procs = self.d.descendants()
        self.procs |= procs
        try:
            fs = self.d.forkserver_pid()
        except AssertionError:
            return
        self.placers |= {p for p in children(fs) if nspid_depth(p) == 1}

    def sandboxes(self) -> list[int]:
        """The daemon's sandbox inits (pid 1 of their namespaces) now."""
        try:
            fs = self.d.forkserver_pid()
        except AssertionError:
            return []
        return [p for p in children(fs) if nspid_depth(p) > 1]

    def sandbox_procs(self) -> list[int]:
        """Every process of the daemon's sandboxes now."""
        try:
            fs = self.d.forkserver_pid()
        except AssertionError:
            return []
        return [p for p in descendants(fs) if nspid_depth(p) > 1]

    def placer(self) -> int:
        self.take()
        fs = self.d.forkserver_pid()
        kids = [p for p in children(fs) if nspid_depth(p) == 1]
        assert len(kids) == 1, kids
        return kids[0]

    def turn_cgroups(self) -> list[str]:
        """Turn cgroups made by its cgroup helpers (d4bf581 named them
        turn-<helper pid>-<n>, now turn-<first id>-<helper pid>-<n>), and
        any named after its id block."""
        first = self.ids.first if self.ids else None
        found = []
        for base in self.dirs:
            try:
                names = os.listdir(base)
            except OSError:
                continue
            for n in names:
                m = re.fullmatch(r"turn-(?:(\d+)-)?(\d+)-\d+", n)
                if m and (int(m.group(2)) in self.placers or
                          (first is not None and m.group(1) == str(first))):
                    found.append(os.path.join(base, n))
        return found

    def fds_settled(self, timeout: float = 5.0) -> int:
        """The supervisor's fds once they are back to what it held idle (or
        what it holds after timeout)."""
        path = f"/proc/{self.d.pid}/fd"
        wait_until(lambda: len(os.listdir(path)) <= self.fds_idle, timeout, 0.1)
        return len(os.listdir(path))

    def left_after_stop(self, timeout: float = 5.0) -> list[str]:
        """Stop the daemon; what of it is still there."""
        self.take()
        self.d.stop()
        left = []
        wait_until(lambda: not any(pid_alive(p) for p in self.procs), timeout)
        left += [f"process {p}" for p in sorted(self.procs) if pid_alive(p)]
        wait_until(lambda: not self.turn_cgroups(), timeout)
        left += [f"cgroup {c}" for c in self.turn_cgroups()]
        left += [f"mount {m}" for m in sorted(host_mounts() - self.mounts_before)
                 if sandbox_like(m.split()[1])]
        left += [f"uid {u} of its block held by pid {p}" for p, u in uids_in(self.ids)]
        return left


# A sandbox's root is built at /tmp in the fork server's own mount namespace
# (src/sandbox/mounts_int.h, ROOT_AT): a mount of forkbox's that leaked into
# ours would be there. Other tests on this machine mount things of their own
# meanwhile (under /tmp/<their dir>/...): those are not counted.
ROOT_TOPS = {"bin", "dev", "etc", "lib", "lib32", "lib64", "opt", "proc", "run", "sbin", "sys",
             "tmp", "tools", "usr", "var", "workspace"}


def sandbox_like(mountpoint: str) -> bool:
    parts = mountpoint.split("/")
    return mountpoint == "/tmp" or (len(parts) > 2 and parts[1] == "tmp" and parts[2] in ROOT_TOPS)


class IdRange:
    def __init__(self, first: int, count: int):
        self.first, self.count = first, count

    def __contains__(self, uid: int) -> bool:
        return self.first <= uid < self.first + self.count


def id_range_of(args) -> IdRange | None:
    """The --id-range in a daemon's arguments."""
    args = list(args)
    for i, a in enumerate(args):
        v = a.split("=", 1)[1] if a.startswith("--id-range=") else \
            args[i + 1] if a == "--id-range" and i + 1 < len(args) else None
        if v:
            first, count = (int(x) for x in v.split(":"))
            return IdRange(first, count)
    return None


def uids_in(ids) -> list[tuple[int, int]]:
    """(pid, uid) of every process running as an id of block ids."""
    out = []
    if not ids:
        return out
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/status") as f:
                uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration, ValueError):
            continue
        if uid in ids:
            out.append((int(p), uid))
    return out


# ---- faults --------------------------------------------------------------------

class Stopped:
    """SIGSTOP pid for the duration of the with-block (SIGCONT after)."""

    def __init__(self, pid: int):
        self.pid = pid

    def __enter__(self):
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, signal.SIGCONT)


class Freezer:
    """Freezes processes: the v1 freezer (a cgroup of the test's own, made
    and removed here), else cgroup v2's cgroup.freeze of each process's own
    cgroup (a sandbox's turn cgroup)."""

    def __init__(self):
        self.mnt = controller_mount("freezer")
        self.dir = None
        self.frozen_v2: list[str] = []
        if self.mnt:
            self.dir = os.path.join(self.mnt, (own_cgroup(os.getpid(), "freezer") or "/").lstrip("/"),
                                    f"forkbox-faults-{os.getpid()}-{time.monotonic_ns()}")
            os.mkdir(self.dir)

    def freeze(self, pids: list[int]) -> None:
        if self.dir:
            for p in pids:
                try:
                    with open(os.path.join(self.dir, "cgroup.procs"), "w") as f:
                        f.write(str(p))
                except OSError:
                    pass  # gone meanwhile
            with open(os.path.join(self.dir, "freezer.state"), "w") as f:
                f.write("FROZEN")
            assert wait_until(lambda: open(os.path.join(self.dir, "freezer.state")).read().strip()
                              == "FROZEN", 10), "not frozen"
            return
        for p in pids:
            path = own_cgroup(p, None)
            base = next((m for t, m, _ in cgroup_mounts() if t == "cgroup2"), None)
            if path is None or base is None:
                continue
            f = os.path.join(base, path.lstrip("/"), "cgroup.freeze")
            with open(f, "w") as fh:
                fh.write("1")
            self.frozen_v2.append(f)

    def kill_survives(self) -> bool:
        """Whether a frozen task outlives SIGKILL until thawed (v1 yes, v2 no)."""
        return self.dir is not None

    def thaw(self) -> None:
        if self.dir:
            with open(os.path.join(self.dir, "freezer.state"), "w") as f:
                f.write("THAWED")
        for f in self.frozen_v2:
            try:
                with open(f, "w") as fh:
                    fh.write("0")
            except OSError:
                pass
        self.frozen_v2 = []

    def remove(self) -> None:
        """Thaw, and remove the test's freezer cgroup once its tasks are gone."""
        self.thaw()
        if self.dir:
            procs = os.path.join(self.dir, "cgroup.procs")
            wait_until(lambda: not open(procs).read().strip(), 10)
            try:
                os.rmdir(self.dir)
            except OSError:
                pass


def private_mounts() -> list[str]:
    """The wrap that runs forkboxd in a mount namespace of its own."""
    return ["unshare", "-m", "--propagation", "private"]


def pids_hierarchy() -> str:
    """The hierarchy turn cgroups need for --pids: v1 pids, else cgroup2."""
    return controller_mount("pids") or next(m for t, m, _ in cgroup_mounts() if t == "cgroup2")


def read_only(d, mnt: str) -> None:
    """Make mnt read-only in d's mount namespace (a read-only bind over it)."""
    subprocess.run(["nsenter", "-t", str(d.pid), "-m", "mount", "--bind", "-o", "ro", mnt, mnt],
                   check=True, timeout=10)


def writable(d, mnt: str) -> None:
    """Undo read_only: the bind comes off."""
    subprocess.run(["nsenter", "-t", str(d.pid), "-m", "umount", mnt], check=True, timeout=10)


class MemoryCgroup:
    """A v1 memory cgroup of the test's own with a limit, to start a daemon in
    (wrap()); removed with what forkboxd made under it."""

    def __init__(self, limit: int):
        mnt = controller_mount("memory")
        self.dir = None
        if not mnt:
            return
        own = own_cgroup(os.getpid(), "memory") or "/"
        self.dir = os.path.join(mnt, own.lstrip("/"), f"forkbox-faults-{os.getpid()}")
        os.mkdir(self.dir)
        with open(os.path.join(self.dir, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))

    def wrap(self) -> list[str]:
        return ["sh", "-c", f'echo $$ > {self.dir}/cgroup.procs && exec "$@"', "sh"]

    def remove(self) -> None:
        if not self.dir:
            return
        for sub in sorted(glob.glob(os.path.join(self.dir, "forkbox", "*", "")), reverse=True):
            try:
                os.rmdir(sub)
            except OSError:
                pass
        for dr in (os.path.join(self.dir, "forkbox"), self.dir):
            try:
                os.rmdir(dr)
            except OSError:
                pass


def metric(port: int, name: str) -> float | None:
    from fbtest import http_get
    try:
        st, body = http_get(port, "/metrics", 5)
    except OSError:
        return None
    m = re.search(rb"(?m)^" + re.escape(name.encode()) + rb" (\S+)$", body)
    return float(m.group(1)) if m else None
