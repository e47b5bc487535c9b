"""Who a sandbox is on the host, and what it shares (issue 11, items 4 and 5).

Each sandbox runs as a host uid and gid of its own, taken from --id-range when
it is cloned (pooled ones too) and given back only once it has been reaped, in
a user namespace owned by that id, not by host root. The kernel counts many
resources per user and charges a user namespace's use up to the namespace's
owner: with every sandbox as one uid in namespaces owned by root, one turn
could exhaust host root's inotify instances and watches or queued signals,
and every other turn's pipe buffers and fds in flight.

The exhaustion cases let one turn (A) use a resource up in its first block and
keep it so (its turn stays open, idle), then check that host root (this test
process, or a child of it) and another turn running meanwhile (B) are not
affected. Each fails on a build where sandboxes share uid 65534 in
namespaces owned by root.

Seen from the host, a sandbox's processes are the daemon's descendants in a
user namespace other than ours; NS_GET_OWNER_UID names that namespace's owner.
"""

import array
import asyncio
import fcntl
import os
import pwd
import re
import subprocess
import sys
import textwrap

import pytest

import sbx
from id_block import IdBlock

NS_GET_OWNER_UID = 0xB704  # _IO(0xb7, 0x4), linux/nsfs.h

# A block of ids of this module's own while it runs (tools/id_block.py), so
# that daemons of other suites running meanwhile never hand out the same ids
# (they would share quotas, which some cases here exhaust).
IDS = IdBlock()
ID_FIRST, ID_COUNT = IDS.first, IDS.count
POOL = 2
ARGS = ["--capacity", "8", "--pool", str(POOL), "--block-timeout", "60", "--turn-timeout", "180",
        "--id-range", f"{ID_FIRST}:{ID_COUNT}"]


@pytest.fixture(scope="module")
def daemon():
    with sbx.Daemon(ARGS) as d:
        yield d


# --------------------------------------------------------------------------- host view

def ns_owner(pid: int) -> int:
    fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    try:
        buf = array.array("I", [0xFFFFFFFF])
        fcntl.ioctl(fd, NS_GET_OWNER_UID, buf, True)
        return buf[0]
    finally:
        os.close(fd)


def sandbox_procs(d: sbx.Daemon) -> dict[int, dict]:
    """Host pid -> {ns, uids, gids, owner} for the daemon's descendants in another
    user namespace (sandboxes, pooled ones included)."""
    own = os.stat("/proc/self/ns/user").st_ino
    out = {}
    for pid in d.descendants():
        try:
            ns = os.stat(f"/proc/{pid}/ns/user").st_ino
            if ns == own:
                continue
            with open(f"/proc/{pid}/status") as fh:
                status = fh.read()
            uids = [int(x) for x in re.search(r"^Uid:\s+(.*)$", status, re.M).group(1).split()]
            gids = [int(x) for x in re.search(r"^Gid:\s+(.*)$", status, re.M).group(1).split()]
            out[pid] = {"ns": ns, "uids": uids, "gids": gids, "owner": ns_owner(pid)}
        except (OSError, AttributeError):
            continue  # exited meanwhile
    return out


def settled(procs: dict[int, dict]) -> bool:
    """Every process past setup step 2: a sandbox cloned a moment ago (a pool
    refill) still has host root as its saved ids until then."""
    return all(len(set(p["uids"])) == 1 and len(set(p["gids"])) == 1 for p in procs.values())


def settled_view(d: sbx.Daemon, min_namespaces: int) -> dict[int, dict]:
    """sandbox_procs() once every sandbox is past step 2 and at least
    min_namespaces exist (bounded wait; the last sample otherwise)."""
    view = {}

    def ok():
        nonlocal view
        view = sandbox_procs(d)
        return settled(view) and len({p["ns"] for p in view.values()}) >= min_namespaces
    sbx.wait_until(ok, 20, 0.1)
    return view


def ids_by_namespace(procs: dict[int, dict]) -> dict[int, int]:
    """user namespace -> the one host id all its processes run as (asserted)."""
    by_ns: dict[int, set] = {}
    for pid, p in procs.items():
        assert len(set(p["uids"])) == 1 and p["uids"] == p["gids"], \
            f"pid {pid}: real/effective/saved/fs ids differ, or uid != gid: {p}"
        by_ns.setdefault(p["ns"], set()).add(p["uids"][0])
        assert p["owner"] == p["uids"][0], \
            f"pid {pid}: its user namespace is owned by {p['owner']}, not by its own id: {p}"
    for ns, ids in by_ns.items():
        assert len(ids) == 1, f"user namespace {ns} holds several host ids: {ids}"
    return {ns: ids.pop() for ns, ids in by_ns.items()}


def in_range(i: int) -> bool:
    return ID_FIRST <= i < ID_FIRST + ID_COUNT


UID_MAP = sbx.prelude(
    'report({"uid": open("/proc/self/uid_map").read().split(), '
    '"gid": open("/proc/self/gid_map").read().split()})')


def mapped_id(block: sbx.BlockResult) -> int:
    assert block.completed and block.exit_code == 0, repr(block)
    rep = block.report()
    assert rep["uid"][0] == "0" and rep["uid"][2] == "1" and rep["gid"] == rep["uid"], rep
    return int(rep["uid"][1])


# --------------------------------------------------------------------------- ids

def test_concurrent_sandboxes_have_distinct_host_ids(daemon):
    """Four turns at once plus the pool: every sandbox (each user namespace) runs
    as one host id of the range, in every id slot (real, effective, saved, fs),
    its namespace is owned by that id, and no two share one."""
    async def go():
        turns = [await sbx.Turn.open(daemon) for _ in range(4)]
        try:
            blocks = await asyncio.gather(*(t.run(UID_MAP) for t in turns))
            host = settled_view(daemon, 4)  # while all four turns are open
        finally:
            for t in turns:
                await t.close()
        return blocks, host
    blocks, host = sbx.arun(go(), 120)
    mapped = [mapped_id(b) for b in blocks]
    assert len(set(mapped)) == 4, f"turns share host ids: {mapped}"
    assert all(in_range(i) for i in mapped), (mapped, ID_FIRST, ID_COUNT)
    per_ns = ids_by_namespace(host)
    assert len(per_ns) >= 4, f"expected at least the four turns' sandboxes: {host}"
    ids = list(per_ns.values())
    assert len(set(ids)) == len(ids), f"sandboxes share host ids: {per_ns}"
    assert all(in_range(i) for i in ids), per_ns
    assert set(mapped) <= set(ids), (mapped, per_ns)


def test_pooled_sandboxes_are_not_owned_by_root(daemon):
    """With no turn running, the pooled sandboxes: user namespaces owned by their
    own ids (never 0), each a different one."""
    per_ns = ids_by_namespace(settled_view(daemon, POOL))
    owners = list(per_ns.values())
    assert 0 not in owners and len(set(owners)) == len(owners), per_ns


def test_ids_are_not_reused_at_once(daemon):
    """Turns one after another get fresh ids: a freed id goes to the back of the
    line (round robin over the range), it is not the next one handed out."""
    seen = []
    for _ in range(6):
        seen.append(mapped_id(daemon.run(UID_MAP, timeout=60).last))
    assert len(set(seen)) == len(seen), f"an id came back at once: {seen}"


def _start_fails(args, timeout=30):
    p = subprocess.run([sbx.FORKBOXD, "--listen", "127.0.0.1:0", "--policy", sbx.POLICY] + args,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stderr


def test_too_small_id_range_is_refused_at_start():
    """capacity 8 + pool 2 can hold 20 ids at once (each slot a live sandbox and
    one not yet reaped): 19 are refused, with the reason."""
    rc, err = _start_fails(["--capacity", "8", "--pool", "2", "--id-range", f"{ID_FIRST}:19"])
    assert rc == 2 and "needs at least 20" in err, (rc, err)


def test_id_range_used_by_the_host_is_refused_at_start():
    """A range that holds an id of /etc/passwd (here the lowest non-root user's)
    is the host's, not forkboxd's: the daemon does not start."""
    uid = min(p.pw_uid for p in pwd.getpwall() if 0 < p.pw_uid < 65534)
    rc, err = _start_fails(["--capacity", "8", "--pool", "2", "--id-range", f"{uid}:64"])
    assert rc != 0 and f"already uses id {uid}" in err, (rc, err)


def test_uid_and_gid_flags_are_gone():
    for flag in ("--uid", "--gid"):
        rc, err = _start_fails([flag, "1234"])
        assert rc == 2 and "--id-range" in err, (flag, rc, err)


# --------------------------------------------------------------------------- exhaustion

def while_exhausted(d: sbx.Daemon, exhaust: str, host_check, probe: str):
    """Turn A runs `exhaust` (one block that uses a resource up, keeps it in module
    globals and reports); while A's turn stays open, host_check() runs here and
    turn B runs `probe`. Returns (A's report, host_check's result, B's report)."""
    async def go():
        a = await sbx.Turn.open(d)
        try:
            ba = await a.run(sbx.prelude(exhaust))
            assert ba.completed and ba.exit_code == 0, repr(ba)
            host = host_check()
            rb = await sbx.run_turn(d, [sbx.prelude(probe)])
        finally:
            await a.close()
        return ba.report(), host, rb
    rep_a, host, rb = sbx.arun(go(), 240)
    assert rb.blocks and rb.last.completed and rb.last.exit_code == 0, repr(rb)
    return rep_a, host, rb.last.report()


EXHAUST_INOTIFY = r'''
_os.makedirs("/tmp/w", exist_ok=True)
NAMES = []
for i in range(2000):
    open(f"/tmp/w/{i}", "w").close()
    NAMES.append(f"/tmp/w/{i}".encode())
FDS, ierr = [], None
while len(FDS) < 300:
    fd = _libc.inotify_init1(0o2000000)  # IN_CLOEXEC
    if fd < 0:
        ierr = _en(_ct.get_errno())
        break
    FDS.append(fd)
watches, werr = 0, None
for fd in FDS:
    for p in NAMES:
        if _libc.inotify_add_watch(fd, p, 4) < 0:  # IN_ATTRIB
            werr = _en(_ct.get_errno())
            break
        watches += 1
    if werr:
        break
report({"instances": len(FDS), "ierr": ierr, "watches": watches, "werr": werr})
'''

PROBE_INOTIFY = r'''
open("/tmp/x", "w").close()
fd = _libc.inotify_init1(0o2000000)
e1 = _en(_ct.get_errno()) if fd < 0 else None
wd = _libc.inotify_add_watch(fd, b"/tmp/x", 4) if fd >= 0 else -1
e2 = _en(_ct.get_errno()) if wd < 0 else None
report({"init": e1 or "ok", "watch": e2 or "ok"})
'''


def test_inotify_exhaustion_reaches_neither_root_nor_another_turn(daemon, tmp_path):
    """A sandbox gets 32 inotify instances and 8192 watches (caps in its own user
    namespace); what it takes is charged to its own host id, so host root can
    still create an instance and add a watch, and so can another turn."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    target = tmp_path / "watched"
    target.write_text("x")
    pre = libc.inotify_init1(os.O_CLOEXEC)  # root's instance, for the watch check
    assert pre >= 0, os.strerror(ctypes.get_errno())
    opened = []

    def root_check():
        fd = libc.inotify_init1(os.O_CLOEXEC)
        e1 = ctypes.get_errno() if fd < 0 else 0
        if fd >= 0:
            opened.append(fd)
        wd = libc.inotify_add_watch(pre, str(target).encode(), 4)
        e2 = ctypes.get_errno() if wd < 0 else 0
        return {"init": os.strerror(e1) if e1 else "ok", "watch": os.strerror(e2) if e2 else "ok"}
    try:
        a, root, b = while_exhausted(daemon, EXHAUST_INOTIFY, root_check, PROBE_INOTIFY)
    finally:
        for fd in opened + [pre]:
            os.close(fd)
    assert root == {"init": "ok", "watch": "ok"}, f"host root lost inotify to a sandbox: {root}, A: {a}"
    assert b == {"init": "ok", "watch": "ok"}, f"another turn lost inotify: {b}, A: {a}"
    assert a == {"instances": 32, "ierr": "EMFILE", "watches": 8192, "werr": "ENOSPC"}, a


EXHAUST_SIGQUEUE = r'''
import signal
_libc.pthread_self.restype = _ct.c_ulong
_libc.pthread_sigqueue.argtypes = [_ct.c_ulong, _ct.c_int, _ct.c_void_p]
SIG = signal.SIGRTMIN
signal.pthread_sigmask(signal.SIG_BLOCK, {SIG})  # they stay queued on this thread
me = _libc.pthread_self()
queued, err = 0, None
while queued < 200000:
    r = _libc.pthread_sigqueue(me, SIG, None)
    if r:
        err = _en(r)
        break
    queued += 1
report({"queued": queued, "err": err})
'''

PROBE_SIGQUEUE = r'''
import signal
_libc.pthread_self.restype = _ct.c_ulong
_libc.pthread_sigqueue.argtypes = [_ct.c_ulong, _ct.c_int, _ct.c_void_p]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
r = _libc.pthread_sigqueue(_libc.pthread_self(), signal.SIGRTMIN, None)
report({"sigqueue": _en(r) if r else "ok"})
'''

# Host root queues one real-time signal to itself (in a child: pytest's signal
# state stays as it is).
ROOT_SIGQUEUE = textwrap.dedent(r'''
    import ctypes, errno, signal
    libc = ctypes.CDLL(None)
    libc.pthread_self.restype = ctypes.c_ulong
    libc.pthread_sigqueue.argtypes = [ctypes.c_ulong, ctypes.c_int, ctypes.c_void_p]
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGRTMIN})
    r = libc.pthread_sigqueue(libc.pthread_self(), signal.SIGRTMIN, None)
    print(errno.errorcode.get(r, r) if r else "ok")
''')


def test_queued_signals_reach_neither_root_nor_another_turn(daemon):
    """A sandbox may queue 1024 signals (RLIMIT_SIGPENDING), charged to its own
    host id: host root and another turn can still sigqueue."""
    def root_check():
        p = subprocess.run([sys.executable, "-c", ROOT_SIGQUEUE], capture_output=True, text=True,
                           timeout=30)
        return p.stdout.strip() or p.stderr[-300:]
    a, root, b = while_exhausted(daemon, EXHAUST_SIGQUEUE, root_check, PROBE_SIGQUEUE)
    assert root == "ok", f"host root cannot queue a signal while a sandbox holds {a}: {root}"
    assert b == {"sigqueue": "ok"}, f"another turn cannot queue a signal: {b}, A: {a}"
    assert a["err"] == "EAGAIN" and 1000 <= a["queued"] <= 1024, a


EXHAUST_PIPES = r'''
import fcntl
PIPES, err = [], None
while len(PIPES) < 300:
    r, w = _os.pipe()
    PIPES.append((r, w))
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
    except OSError as e:
        err = _en(e.errno)
        break
report({"big": len(PIPES) - (1 if err else 0), "err": err})
'''

PROBE_PIPES = r'''
import fcntl
r, w = _os.pipe()
default = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)
try:
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
    big = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)
except OSError as e:
    big = _en(e.errno)
report({"default": default, "big": big})
'''


def test_pipe_buffers_of_one_turn_do_not_shrink_another(daemon):
    """Pipe buffers are counted per host user (fs.pipe-user-pages-soft: 64 MiB):
    a turn that grows its pipes up to that limit only shrinks its own. Another
    turn still gets 64 KiB pipes and may grow one to 1 MiB."""
    a, _, b = while_exhausted(daemon, EXHAUST_PIPES, lambda: None, PROBE_PIPES)
    assert a["err"] == "EPERM" and a["big"] >= 16, a  # A did reach the per-user limit
    assert b == {"default": 65536, "big": 1 << 20}, f"another turn's pipes were shrunk: {b}, A: {a}"


EXHAUST_INFLIGHT = r'''
import array, socket
A_, B_ = socket.socketpair()
FD = _os.open("/dev/null", _os.O_RDONLY)
parked, err = 0, None
for _ in range(40):
    try:
        A_.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [FD] * 250))])
        parked += 250
    except OSError as e:
        err = _en(e.errno)
        break
report({"parked": parked, "err": err})
'''

PROBE_INFLIGHT = r'''
import array, socket
a, b = socket.socketpair()
try:
    a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0]))])
    res = "ok"
except OSError as e:
    res = _en(e.errno)
report({"send_fd": res})
'''


def test_fds_in_flight_of_one_turn_do_not_stop_another(daemon):
    """The kernel refuses an SCM_RIGHTS message while the sender's host user has
    more fds in flight than the sender's RLIMIT_NOFILE (1024). A turn that parks
    1250 in its own socket stops only itself: another turn can still pass an fd."""
    a, _, b = while_exhausted(daemon, EXHAUST_INFLIGHT, lambda: None, PROBE_INFLIGHT)
    assert a == {"parked": 1250, "err": "ETOOMANYREFS"}, a
    assert b == {"send_fd": "ok"}, f"another turn cannot pass an fd: {b}, A: {a}"


# --------------------------------------------------------------------------- item 5

CMDLINES = sbx.prelude(
    'report({p: try_(lambda: open(p, "rb").read().decode("latin-1")) '
    'for p in ("/proc/self/cmdline", "/proc/1/cmdline", "/proc/2/cmdline")})')


def test_cmdline_shows_no_configuration(daemon):
    """Sandboxes are clones of the fork server and read its argv as their own
    command line: it must hold no host path, no port, no flag of the daemon's."""
    r = daemon.run(CMDLINES, timeout=60)
    assert r.last.completed, repr(r)
    rep = r.last.report()
    leaks = [str(daemon.port), "--listen", "--policy", "--id-range", "--pool", sbx.POLICY,
             sbx.SRCDIR, sbx.FORKBOXD]
    for path, text in rep.items():
        assert isinstance(text, str) and text, (path, text)
        assert "/" not in text, f"{path} names a host path: {text!r}"
        assert not [s for s in leaks if s in text], f"{path} shows the daemon's settings: {text!r}"
    # From the host: the fork server's own command line is the same marker.
    with open(f"/proc/{daemon.pid}/task/{daemon.pid}/children") as fh:
        fs = fh.read().split()
    assert fs, "no fork server found"
    with open(f"/proc/{fs[0]}/cmdline", "rb") as fh:
        assert fh.read() == b"forkboxd\0-I\0-B\0-X\0utf8\0-\0--internal-forkserver\0"
