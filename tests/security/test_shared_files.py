"""Channels through the files sandboxes share with the host and with each other
(issue 11, item 5).

/usr, a few /etc files, --site-packages dirs, the device nodes and the read-only
root are the same inodes and the same page cache in every sandbox and on the
host. Each class of channel is tried from model code, and where the other end is
the host, observed from this (host) process:

* inotify read events (IN_OPEN, IN_ACCESS, IN_CLOSE_NOWRITE) on a shared file
  show nothing of the host's or another turn's opens: such watches are refused;
  watches for changes in /workspace still report changes;
* page cache: preadv2(RWF_NOWAIT / RWF_DONTCACHE) is refused with EOPNOTSUPP,
  cachestat with ENOSYS; fadvise DONTNEED, readahead and madvise hints return 0
  and do nothing: the file's residency, measured here with mincore, does not
  change; mincore in the sandbox reports every page of a shared file resident;
* flock: refused with ENOLCK on shared files (a lock held by the host or by
  another turn is neither felt nor seen); on /workspace, /tmp and /dev/shm it has
  the usual semantics, carried out by the supervisor (blocking waits, LOCK_NB,
  shared vs exclusive, across processes of one sandbox, the filelock pattern),
  with a bound on waiting calls, and waiting calls that are interrupted or killed
  are dropped.

The site dir is made by the test under /var/tmp (a disk filesystem: tmpfs pages
cannot be evicted, which would make the page-cache checks vacuous; the first
check proves eviction works there from the host).
"""

import asyncio
import ctypes
import fcntl
import mmap
import os
import re
import shutil
import tempfile
import time

import pytest

import sbx
from conftest import DEFAULT_ARGS

USR_FILE = "/usr/lib/os-release"
USR_BIG = "/usr/share/common-licenses/GPL-3"   # ~35 KB, harmless to evict if a check fails
SITE_NAME = "fbx_shared.bin"
# EOPNOTSUPP; Python's errno.errorcode names 95 by its alias
NOTSUP = {"ret": -1, "errno": "ENOTSUP"}
SITE_SIZE = 1 << 20

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def cached(path: str) -> tuple[int, int]:
    """(pages in the page cache, pages) as the host sees it: this process owns or
    may write the file, so mincore reports the cache, not a neutral answer."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        p = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert p not in (None, ctypes.c_void_p(-1).value), "mmap failed"
        n = (size + 4095) // 4096
        vec = (ctypes.c_ubyte * n)()
        try:
            assert _libc.mincore(p, size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            _libc.munmap(p, size)
        return sum(v & 1 for v in vec), n
    finally:
        os.close(fd)


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 16):
            pass


@pytest.fixture(scope="module")
def site():
    d = tempfile.mkdtemp(prefix="fbx-site-", dir="/var/tmp")
    os.chmod(d, 0o755)
    path = os.path.join(d, SITE_NAME)
    with open(path, "wb") as f:
        f.write(os.urandom(SITE_SIZE))
        f.flush()
        os.fsync(f.fileno())
    os.chmod(path, 0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon(site):
    with sbx.Daemon(DEFAULT_ARGS + ["--site-packages", site]) as d:
        yield d


def site_file(site):
    return os.path.join(site, SITE_NAME)


def run_blocks(daemon, *steps, timeout=90.0):
    """Turns opened at once; steps are (turn index, code) blocks run in order, or
    callables run on the host between blocks. Returns the reports of the blocks."""
    async def go():
        turns = {}
        reports = []
        try:
            for step in steps:
                if callable(step):
                    step()
                    continue
                i, code = step
                if i not in turns:
                    turns[i] = await sbx.Turn.open(daemon)
                    code = sbx.PRELUDE + "\nimport os\n" + code
                b = await turns[i].run(code)
                assert b.completed and b.exit_code == 0, b
                reports.append(b.report())
        finally:
            for t in turns.values():
                await t.close()
        return reports
    return sbx.arun(go(), timeout)


def one_block(daemon, code, timeout=90.0):
    return run_blocks(daemon, (0, code), timeout=timeout)[0]


# --------------------------------------------------------------------------
# futex keys (issue 25, item 6: documented, not closed)
# --------------------------------------------------------------------------

# A shared (not FUTEX_PRIVATE_FLAG) futex on a file mapping is keyed by the
# inode and offset, not by the address space: two turns that map the same
# root file can wake each other. seccomp sees futex's op, not what backs the
# address, and refusing shared futexes would break multiprocessing's
# semaphores (sem_open: shared futexes on a /dev/shm mapping), so docs/security.md
# ("What a sandbox can see") lists it beside the timing channels. This
# test documents the behaviour: if it starts failing, the channel closed and
# docs/security.md must say so.
FUTEX = r'''
import ctypes, mmap, os, time
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
fd = os.open(%r, os.O_RDONLY)
ADDR = _libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
WORD = ctypes.c_uint32.from_address(ADDR).value
class timespec(ctypes.Structure):
    _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]
'''
FUTEX_WAITER = FUTEX + r'''
t0 = time.monotonic()
r = sc(202, ADDR, 0, WORD, ctypes.addressof(timespec(8, 0)), 0, 0)   # FUTEX_WAIT, shared
report({"wait": r, "after": round(time.monotonic() - t0, 2)})
'''
FUTEX_WAKER = FUTEX + r'''
woken, end = 0, time.monotonic() + 6
while not woken and time.monotonic() < end:
    woken = sc(202, ADDR, 1, 1, 0, 0, 0)["ret"]     # FUTEX_WAKE, shared
    time.sleep(0.01)
report({"woken": woken})
'''


def test_futex_on_a_shared_file_wakes_another_turn(daemon):
    """Turn A waits on a shared futex in its read-only mapping of a root file;
    turn B, in its own mapping of the same file, wakes it (1 bit per wake)."""
    async def go():
        a, b = await sbx.Turn.open(daemon), await sbx.Turn.open(daemon)
        try:
            ra = asyncio.ensure_future(a.run(sbx.PRELUDE + FUTEX_WAITER % USR_FILE))
            await asyncio.sleep(1.0)   # A is waiting
            rb = await b.run(sbx.PRELUDE + FUTEX_WAKER % USR_FILE)
            return (await ra).report(), rb.report()
        finally:
            await a.close()
            await b.close()
    wait, wake = sbx.arun(go(), 60)
    assert wake["woken"] == 1, (wait, wake)
    assert wait["wait"] == {"ret": 0, "errno": None} and wait["after"] < 7, (wait, wake)


# --------------------------------------------------------------------------
# inotify
# --------------------------------------------------------------------------

WATCH = r'''
import struct
IN_ACCESS, IN_MODIFY, IN_CLOSE_WRITE, IN_CLOSE_NOWRITE, IN_OPEN = 1, 2, 8, 0x10, 0x20
IN_CREATE, IN_DELETE, IN_MOVED_FROM, IN_MOVED_TO = 0x100, 0x200, 0x40, 0x80
READS = IN_ACCESS | IN_OPEN | IN_CLOSE_NOWRITE
IFD = _libc.inotify_init1(os.O_NONBLOCK)
def add_watch(path, mask):
    r = sc(254, IFD, path.encode(), mask)
    return r["errno"] or "ok"
def events():
    out = []
    while True:
        try:
            buf = os.read(IFD, 65536)
        except BlockingIOError:
            return out
        i = 0
        while i + 16 <= len(buf):
            wd, mask, cookie, ln = struct.unpack_from("iIII", buf, i)
            name = buf[i + 16:i + 16 + ln].rstrip(b"\0").decode()
            out.append([mask, name])
            i += 16 + ln
'''


def test_inotify_read_events_of_host_and_other_turns_are_not_seen(daemon, site):
    """A watches a /usr file, its directory and a site file for reads, and for
    everything (IN_ALL_EVENTS); the host and turn B open and read them; A sees
    no read event (its watches were refused)."""
    targets = [USR_FILE, os.path.dirname(USR_FILE), site_file(site)]
    setup = WATCH + f'''
TARGETS = {targets!r}
report({{"reads": [add_watch(p, READS) for p in TARGETS],
         "open": [add_watch(p, IN_OPEN) for p in TARGETS],
         "access": add_watch(TARGETS[0], IN_ACCESS),
         "close_nowrite": add_watch(TARGETS[0], IN_CLOSE_NOWRITE),
         "all": add_watch(TARGETS[0], 0xfff),
         "high_bits": add_watch(TARGETS[0], (1 << 32) | IN_OPEN)}})
'''
    reader = f'''
for p in {targets!r}:
    if os.path.isdir(p):
        os.listdir(p)
    else:
        open(p, "rb").read()
report({{"read": True}})
'''

    def host_reads():
        for p in targets:
            if os.path.isdir(p):
                os.listdir(p)
            else:
                with open(p, "rb") as f:
                    f.read()

    collect = r'''
_time.sleep(0.2)
ev = events()
report({"events": ev, "reads_seen": [e for e in ev if e[0] & READS]})
'''
    rep = run_blocks(daemon, (0, setup), (1, reader), host_reads, (0, collect))
    w, seen = rep[0], rep[2]
    assert w["reads"] == ["EPERM"] * 3, w
    assert w["open"] == ["EPERM"] * 3, w
    assert w["access"] == w["close_nowrite"] == w["all"] == w["high_bits"] == "EPERM", w
    assert seen["reads_seen"] == [], seen


def test_dnotify_access_refused_modify_allowed(daemon):
    rep = one_block(daemon, r'''
import fcntl, signal
signal.signal(signal.SIGIO, signal.SIG_IGN)
d = os.open("/usr/lib", os.O_RDONLY | os.O_DIRECTORY)
w = os.open("/workspace", os.O_RDONLY | os.O_DIRECTORY)
report({"usr_access": try_(lambda: fcntl.fcntl(d, fcntl.F_NOTIFY, fcntl.DN_ACCESS | fcntl.DN_MULTISHOT)),
        "ws_modify": try_(lambda: fcntl.fcntl(w, fcntl.F_NOTIFY, fcntl.DN_MODIFY | fcntl.DN_CREATE))})
''')
    assert isinstance(rep["usr_access"], dict) and rep["usr_access"]["errno"] == "EPERM", rep
    assert rep["ws_modify"] == 0, rep


def test_inotify_change_watchers_in_workspace_work(daemon):
    """What watchers of the sandbox's own files use keeps working."""
    rep = one_block(daemon, WATCH + r'''
os.makedirs("/workspace/w", exist_ok=True)
mask = IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
r = add_watch("/workspace/w", mask)
with open("/workspace/w/a.txt", "w") as f:
    f.write("x")
os.rename("/workspace/w/a.txt", "/workspace/w/b.txt")
os.unlink("/workspace/w/b.txt")
_time.sleep(0.05)
names = {}
for m, n in events():
    for bit, label in ((IN_CREATE, "create"), (IN_MODIFY, "modify"), (IN_CLOSE_WRITE, "close_write"),
                       (IN_MOVED_FROM, "moved_from"), (IN_MOVED_TO, "moved_to"), (IN_DELETE, "delete")):
        if m & bit:
            names.setdefault(label, []).append(n)
report({"add": r, "events": names})
''')
    assert rep["add"] == "ok", rep
    assert rep["events"] == {"create": ["a.txt"], "modify": ["a.txt"], "close_write": ["a.txt"],
                             "moved_from": ["a.txt"], "moved_to": ["b.txt"],
                             "delete": ["b.txt"]}, rep


# --------------------------------------------------------------------------
# page cache
# --------------------------------------------------------------------------

PAGECACHE = r'''
import mmap as _mmap
class _iov(_ct.Structure):
    _fields_ = [("base", _ct.c_void_p), ("len", _ct.c_size_t)]
_BUF = _ct.create_string_buffer(1 << 16)
_IOV = _iov(_ct.addressof(_BUF), 1 << 16)
def preadv2(path, flags, off=0):
    fd = os.open(path, os.O_RDONLY)
    try:
        return sc(327, fd, _ct.byref(_IOV), 1, off, 0, flags)
    finally:
        os.close(fd)
def fadvise(path, advice):
    fd = os.open(path, os.O_RDONLY)
    try:
        return sc(221, fd, 0, 0, advice)
    finally:
        os.close(fd)
_libc.mmap.restype = _ct.c_void_p
_libc.mmap.argtypes = [_ct.c_void_p, _ct.c_size_t, _ct.c_int, _ct.c_int, _ct.c_int, _ct.c_long]
def mapped(path):
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    p = _libc.mmap(None, size, _mmap.PROT_READ, _mmap.MAP_SHARED, fd, 0)
    os.close(fd)
    return p, size
def mincore(path):
    p, size = mapped(path)
    n = (size + 4095) // 4096
    vec = (_ct.c_ubyte * n)()
    r = sc(27, _ct.c_void_p(p), size, vec)
    return {"ret": r["ret"], "errno": r["errno"], "resident": sum(v & 1 for v in vec), "pages": n}
def madvise(path, advice):
    p, size = mapped(path)
    return sc(28, _ct.c_void_p(p), size, advice)
'''


def test_eviction_works_on_the_site_dir_from_the_host(site):
    """Control: without a filter, fadvise DONTNEED evicts the site file, so the
    checks below could fail."""
    path = site_file(site)
    warm(path)
    assert cached(path)[0] == cached(path)[1]
    evict(path)
    assert cached(path)[0] == 0


@pytest.mark.parametrize("which", ["site", "usr"])
def test_sandbox_cannot_evict_a_shared_file(daemon, site, which):
    """fadvise DONTNEED (also with high bits), preadv2 RWF_DONTCACHE, madvise
    PAGEOUT/COLD on a shared file: the host still finds every page cached."""
    path = site_file(site) if which == "site" else USR_BIG
    warm(path)
    before = cached(path)
    assert before[0] == before[1], before
    rep = one_block(daemon, PAGECACHE + f'''
P = {path!r}
report({{"dontneed": fadvise(P, 4), "dontneed_high": fadvise(P, (1 << 32) | 4),
         "noreuse": fadvise(P, 5),
         "dontcache": [preadv2(P, 0x80, off) for off in range(0, os.path.getsize(P), 1 << 16)][-1],
         "pageout": madvise(P, 21), "cold": madvise(P, 20)}})
''')
    ok = {"ret": 0, "errno": None}
    assert rep["dontneed"] == rep["dontneed_high"] == rep["noreuse"] == ok, rep
    assert rep["pageout"] == rep["cold"] == ok, rep
    assert rep["dontcache"] == NOTSUP, rep
    assert cached(path) == before, (rep, cached(path))


def test_sandbox_cannot_load_a_shared_file_with_hints(daemon, site):
    """readahead, fadvise WILLNEED and madvise WILLNEED return 0 and bring
    nothing into the cache (reading it would: that is the timing residue)."""
    path = site_file(site)
    evict(path)
    assert cached(path)[0] == 0
    rep = one_block(daemon, PAGECACHE + f'''
P = {path!r}
fd = os.open(P, os.O_RDONLY)
report({{"readahead": sc(187, fd, 0, 1 << 20), "willneed": fadvise(P, 3),
         "madv_willneed": madvise(P, 3)}})
''')
    ok = {"ret": 0, "errno": None}
    assert rep == {"readahead": ok, "willneed": ok, "madv_willneed": ok}, rep
    time.sleep(0.2)   # readahead is asynchronous: give it a chance to show
    assert cached(path)[0] == 0, cached(path)


def test_cache_state_probes_are_refused_or_neutral(daemon, site):
    """After the host evicted a shared file: RWF_NOWAIT is refused (EOPNOTSUPP,
    not EAGAIN), cachestat gets ENOSYS, mincore says every page is resident."""
    path = site_file(site)
    evict(path)
    assert cached(path)[0] == 0
    rep = one_block(daemon, PAGECACHE + f'''
P = {path!r}
rng = (_ct.c_uint64 * 2)(0, 0)
cs = (_ct.c_uint64 * 5)()
fd = os.open(P, os.O_RDONLY)
report({{"nowait": preadv2(P, 8), "nowait_high": preadv2(P, (1 << 32) | 8),
         "nowait_usr": preadv2({USR_FILE!r}, 8),
         "plain": preadv2(P, 0, 1 << 16)["ret"],
         "cachestat": sc(451, fd, _ct.byref(rng), _ct.byref(cs), 0),
         "mincore": mincore(P)}})
''')
    assert rep["nowait"] == rep["nowait_high"] == rep["nowait_usr"] == NOTSUP, rep
    assert rep["plain"] == 1 << 16, rep
    assert rep["cachestat"] == {"ret": -1, "errno": "ENOSYS"}, rep
    m = rep["mincore"]
    assert m["ret"] == 0 and m["resident"] == m["pages"] == SITE_SIZE // 4096, rep
    # the plain read above brought in its own 64 KiB (and readahead), nothing says more
    assert cached(path)[0] < SITE_SIZE // 4096


# --------------------------------------------------------------------------
# flock on shared files
# --------------------------------------------------------------------------

LOCKS = r'''
import fcntl, signal
def lk(fd, op):
    try:
        fcntl.flock(fd, op)
        return "ok"
    except OSError as e:
        return _errno.errorcode[e.errno]
'''


def _host_flock(path, op):
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, op)
        return fd, "ok"
    except OSError as e:
        os.close(fd)
        return -1, os.strerror(e.errno)


def test_flock_on_shared_files_refused_and_blocks_nobody(daemon, site):
    """Turn A tries to lock shared files (exclusive, shared, and the anonymous
    inode behind eventfd/epoll) and keeps the fds open; the host and turn B can
    still take those locks; B's own attempts are refused the same way (ENOLCK,
    never EWOULDBLOCK: a lock elsewhere is not seen)."""
    targets = [USR_FILE, site_file(site), "/etc/passwd", "/dev/null"]
    take = LOCKS + f'''
import select
KEEP = [os.open(p, os.O_RDONLY) for p in {targets!r}]
EFD = _libc.eventfd(0, 0)
EP = select.epoll()
res = {{p: lk(fd, fcntl.LOCK_EX | fcntl.LOCK_NB) for p, fd in zip({targets!r}, KEEP)}}
res["blocking_sh"] = lk(KEEP[0], fcntl.LOCK_SH)
res["eventfd"] = lk(EFD, fcntl.LOCK_EX | fcntl.LOCK_NB)
res["epoll"] = lk(EP.fileno(), fcntl.LOCK_EX)
res["unlock"] = lk(KEEP[0], fcntl.LOCK_UN)
report(res)
'''
    host = {}

    def host_locks():
        for p in (USR_FILE, site_file(site)):
            fd, r = _host_flock(p, fcntl.LOCK_EX | fcntl.LOCK_NB)
            host[p] = r
            if fd >= 0:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    other = LOCKS + f'''
import select
fds = [os.open(p, os.O_RDONLY) for p in {targets!r}]
res = {{p: lk(fd, fcntl.LOCK_EX | fcntl.LOCK_NB) for p, fd in zip({targets!r}, fds)}}
res["eventfd"] = lk(_libc.eventfd(0, 0), fcntl.LOCK_EX | fcntl.LOCK_NB)
EP = select.epoll()
res["epoll"] = lk(EP.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
report(res)
'''
    a, b = run_blocks(daemon, (0, take), host_locks, (1, other))
    assert a == dict({p: "ENOLCK" for p in targets}, blocking_sh="ENOLCK", eventfd="ENOLCK",
                     epoll="ENOLCK", unlock="ok"), a
    assert host == {USR_FILE: "ok", site_file(site): "ok"}, host
    assert b == dict({p: "ENOLCK" for p in targets}, eventfd="ENOLCK", epoll="ENOLCK"), b
    # the turn summary is logged once the turn has ended, which may be after we return
    summary = re.compile(r"system calls refused by the policy \(.*flock \u00d7")
    assert sbx.wait_until(lambda: summary.search(daemon.stderr(20000)), 10), \
        "refused flocks are counted in the turn summary"


def test_host_lock_on_shared_file_neither_blocks_nor_shows(daemon, site):
    """The host holds an exclusive lock on a /usr file and a site file; a sandbox's
    blocking flock returns at once with ENOLCK, as it does when nobody holds one."""
    held = []
    try:
        for p in (USR_FILE, site_file(site)):
            fd, r = _host_flock(p, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert r == "ok", (p, r)
            held.append(fd)
        rep = one_block(daemon, LOCKS + f'''
t0 = _time.monotonic()
res = {{p: [lk(os.open(p, os.O_RDONLY), fcntl.LOCK_SH), lk(os.open(p, os.O_RDONLY), fcntl.LOCK_EX | fcntl.LOCK_NB)]
        for p in {[USR_FILE, site_file(site)]!r}}}
res["elapsed"] = _time.monotonic() - t0
report(res)
''')
    finally:
        for fd in held:
            os.close(fd)
    assert rep[USR_FILE] == rep[site_file(site)] == ["ENOLCK", "ENOLCK"], rep
    assert rep["elapsed"] < 5, rep


# --------------------------------------------------------------------------
# flock on the sandbox's own files
# --------------------------------------------------------------------------

def test_flock_private_files_usual_semantics(daemon):
    rep = one_block(daemon, LOCKS + r'''
R = {}
for d in ("/workspace", "/tmp", "/dev/shm"):
    p = d + "/lockme"
    a = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    b = os.open(p, os.O_RDWR)
    r = [lk(a, fcntl.LOCK_SH), lk(b, fcntl.LOCK_SH | fcntl.LOCK_NB),      # shared + shared
         lk(b, fcntl.LOCK_EX | fcntl.LOCK_NB),                             # shared blocks exclusive
         lk(a, fcntl.LOCK_UN), lk(b, fcntl.LOCK_EX | fcntl.LOCK_NB),       # converted once a is gone
         lk(a, fcntl.LOCK_SH | fcntl.LOCK_NB), lk(a, fcntl.LOCK_EX | fcntl.LOCK_NB),
         lk(b, fcntl.LOCK_UN), lk(a, fcntl.LOCK_EX | fcntl.LOCK_NB)]
    dup = os.dup(a)                     # same open file: shares the lock
    r.append(lk(dup, fcntl.LOCK_EX | fcntl.LOCK_NB))
    os.close(a); os.close(dup); os.close(b)
    R[d] = r
rfd, wfd = os.pipe()
R["pipe"] = lk(rfd, fcntl.LOCK_EX)
import socket
S = socket.socketpair()
R["socket"] = lk(S[0].fileno(), fcntl.LOCK_EX)
M = os.memfd_create("m")
R["memfd"] = [lk(M, fcntl.LOCK_EX), lk(os.open("/proc/self/fd/%d" % M, os.O_RDWR), fcntl.LOCK_EX | fcntl.LOCK_NB)]
R["tools"] = lk(os.open("/tools/__init__.py", os.O_RDONLY), fcntl.LOCK_SH)
R["badfd"] = lk(9999, fcntl.LOCK_EX)
R["badop"] = try_(lambda: fcntl.flock(rfd, 77))
report(R)
''')
    want = ["ok", "ok", "EAGAIN", "ok", "ok", "EAGAIN", "EAGAIN", "ok", "ok", "ok"]
    for d in ("/workspace", "/tmp", "/dev/shm"):
        assert rep[d] == want, (d, rep)
    assert rep["pipe"] == rep["socket"] == "ok" and rep["badfd"] == "EBADF", rep
    assert rep["memfd"] == ["ok", "EAGAIN"], rep     # a second open of it sees the lock
    assert rep["tools"] == "ENOLCK", rep             # read-only, nothing needs to lock it
    assert rep["badop"]["errno"] == "EINVAL", rep


def test_flock_blocking_waits_across_processes(daemon):
    """A blocking exclusive lock in a child waits while the parent holds the lock
    and is granted soon after it is released; a shared lock waits for an
    exclusive one the same way; so does a lock asked for on another thread."""
    rep = one_block(daemon, LOCKS + r'''
def waiter(op, hold):
    a = os.open("/workspace/lk", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(a, fcntl.LOCK_EX)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        b = os.open("/workspace/lk", os.O_RDWR)
        os.write(w, b"s")
        t0 = _time.monotonic()
        res = lk(b, op)
        os.write(w, ("%s %.3f" % (res, _time.monotonic() - t0)).encode())
        os._exit(0)
    os.read(r, 1)
    _time.sleep(hold)
    t_rel = _time.monotonic()
    fcntl.flock(a, fcntl.LOCK_UN)
    out = os.read(r, 100).decode().split()
    after = _time.monotonic() - t_rel
    os.waitpid(pid, 0)
    os.close(a)
    return {"result": out[0], "waited": float(out[1]), "granted_after_release": after}
def thread_waiter(hold):
    import threading
    a = os.open("/workspace/lk", os.O_RDWR | os.O_CREAT, 0o644)
    b = os.open("/workspace/lk", os.O_RDWR)
    fcntl.flock(a, fcntl.LOCK_EX)
    out = {}
    def run():
        t0 = _time.monotonic()
        out["result"] = lk(b, fcntl.LOCK_EX)
        out["waited"] = _time.monotonic() - t0
    t = threading.Thread(target=run)
    t.start()
    _time.sleep(hold)
    t_rel = _time.monotonic()
    fcntl.flock(a, fcntl.LOCK_UN)
    t.join(30)
    out["granted_after_release"] = _time.monotonic() - t_rel
    os.close(a); os.close(b)
    return out
report({"ex": waiter(fcntl.LOCK_EX, 0.5), "sh": waiter(fcntl.LOCK_SH, 0.3),
        "thread": thread_waiter(0.4)})
''')
    for k, hold in (("ex", 0.5), ("sh", 0.3), ("thread", 0.4)):
        r = rep[k]
        assert r["result"] == "ok", rep
        assert r["waited"] >= hold - 0.05, rep          # it did wait for the holder
        assert r["granted_after_release"] < 2.0, rep    # and got it soon after (generous)


def test_flock_filelock_pattern(daemon):
    """py-filelock's UnixFileLock (O_CREAT|O_TRUNC, flock LOCK_EX|LOCK_NB, poll):
    two processes of one sandbox take turns, never both inside."""
    rep = one_block(daemon, LOCKS + r'''
class FileLock:
    def __init__(self, path):
        self.path, self.fd = path, None
    def __enter__(self):
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno == _errno.ENOSYS:
                    raise NotImplementedError("no flock") from e
                _time.sleep(0.005)
                continue
            self.fd = fd
            return self
    def __exit__(self, *a):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)

def worker(tag, n):
    for i in range(n):
        with FileLock("/workspace/app.lock"):
            with open("/workspace/log", "a") as f:
                f.write(tag + "<\n"); f.flush()
                _time.sleep(0.002)
                f.write(tag + ">\n")
pid = os.fork()
if pid == 0:
    worker("c", 30); os._exit(0)
worker("p", 30)
os.waitpid(pid, 0)
lines = open("/workspace/log").read().split()
pairs = all(lines[i][0] == lines[i + 1][0] and lines[i][1] == "<" and lines[i + 1][1] == ">"
            for i in range(0, len(lines), 2))
report({"lines": len(lines), "nested_never": pairs})
''')
    assert rep == {"lines": 120, "nested_never": True}, rep


def test_flock_waiting_calls_are_bounded(daemon):
    """20 children block on a lock the parent holds: 16 wait (FLOCK_MAX_PARKED)
    and are granted in turn once it is released, 4 get ENOLCK at once."""
    rep = one_block(daemon, LOCKS + r'''
a = os.open("/workspace/many", os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(a, fcntl.LOCK_EX)
r, w = os.pipe()
sr, sw = os.pipe()
kids = []
for i in range(20):
    pid = os.fork()
    if pid == 0:
        b = os.open("/workspace/many", os.O_RDWR)
        os.write(sw, b"s")
        res = lk(b, fcntl.LOCK_EX)
        if res == "ok":
            fcntl.flock(b, fcntl.LOCK_UN)
        os.write(w, (res + "\n").encode())
        os._exit(0)
    kids.append(pid)
started = 0
while started < 20:
    started += len(os.read(sr, 20))
_time.sleep(1.0)          # each child is in its flock by now: waiting, or refused
early = []
while True:
    rr, _, _ = _select.select([r], [], [], 0)
    if not rr:
        break
    early += os.read(r, 4096).decode().split()
fcntl.flock(a, fcntl.LOCK_UN)
got = list(early)
deadline = _time.monotonic() + 30
while len(got) < 20 and _time.monotonic() < deadline:
    rr, _, _ = _select.select([r], [], [], 1)
    if rr:
        got += os.read(r, 4096).decode().split()
for pid in kids:
    os.waitpid(pid, 0)
report({"early": sorted(early), "all": sorted(got)})
''', timeout=120)
    assert rep["early"] == ["ENOLCK"] * 4, rep
    assert rep["all"] == ["ENOLCK"] * 4 + ["ok"] * 16, rep


def test_flock_waiting_call_interrupted_or_killed_takes_no_lock(daemon):
    """A blocking flock interrupted by a signal whose handler raises, and one
    whose process is killed: after the holder releases, the lock is free (the
    supervisor dropped both calls instead of granting them later)."""
    rep = one_block(daemon, LOCKS + r'''
a = os.open("/workspace/intr", os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(a, fcntl.LOCK_EX)
r, w = os.pipe()
pid_i = os.fork()
if pid_i == 0:
    class Alarm(Exception):
        pass
    def on_alarm(sig, frame):
        raise Alarm()
    signal.signal(signal.SIGALRM, on_alarm)
    b = os.open("/workspace/intr", os.O_RDWR)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        res = lk(b, fcntl.LOCK_EX)
    except Alarm:
        res = "interrupted"
    os.write(w, (res + "\n").encode())
    _time.sleep(3)            # keeps b open: a late grant would show
    os._exit(0)
pid_k = os.fork()
if pid_k == 0:
    b = os.open("/workspace/intr", os.O_RDWR)
    lk(b, fcntl.LOCK_EX)
    os._exit(0)
_time.sleep(0.8)
os.kill(pid_k, signal.SIGKILL)
os.waitpid(pid_k, 0)
first = os.read(r, 100).decode().strip()
fcntl.flock(a, fcntl.LOCK_UN)
_time.sleep(0.5)              # past the supervisor's longest retry delay
c = os.open("/workspace/intr", os.O_RDWR)
free = lk(c, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.waitpid(pid_i, 0)
report({"interrupted": first, "free_after": free})
''')
    assert rep == {"interrupted": "interrupted", "free_after": "ok"}, rep


def test_flock_cost(daemon):
    """One supervised flock round trip, against a counted refusal and an
    allowed call in the same sandbox (printed; bounded generously)."""
    rep = one_block(daemon, r'''
fd = os.open("/workspace/cost", os.O_RDWR | os.O_CREAT, 0o644)
def best(f, n=2000):
    b = 1e9
    for _ in range(3):
        t0 = _time.perf_counter()
        for _ in range(n):
            f()
        b = min(b, (_time.perf_counter() - t0) / n * 1e6)
    return b
report({"flock_us": best(lambda: _libc.flock(fd, 1)), "counted_refusal_us": best(lambda: sc(312, 0, 0, 0, 0, 0)),
        "getppid_us": best(lambda: _libc.getppid())})
''')
    print(f"\nflock round trip {rep['flock_us']:.1f} us; counted refusal "
          f"{rep['counted_refusal_us']:.1f} us; getppid {rep['getppid_us']:.2f} us")
    assert rep["flock_us"] < 2000, rep


# --------------------------------------------------------------------------
# syscalls newer than libseccomp's table
# --------------------------------------------------------------------------

def test_syscalls_unknown_to_libseccomp_get_the_default(daemon):
    """The policy can only name what libseccomp 2.5.4 knows (Debian's table ends
    at futex_requeue, 456); newer calls, and numbers no kernel has yet, get the
    default: refused with EPERM. Arguments are harmless if a call ran."""
    rep = one_block(daemon, r'''
report({"statmount": sc(457, 0, 0, 0, 0), "listmount": sc(458, 0, 0, 0, 0),
        "mseal": sc(462, 0, 0, 0), "getxattrat": sc(464, -1, 0, 0, 0, 0, 0),
        "file_getattr": sc(468, -1, 0, 0, 0, 0), "n600": sc(600), "n1023": sc(1023)})
''')
    assert all(v == {"ret": -1, "errno": "EPERM"} for v in rep.values()), rep


# --------------------------------------------------------------------------
# ordinary code
# --------------------------------------------------------------------------

def test_ordinary_code_still_works(daemon):
    rep = one_block(daemon, r'''
import sqlite3, subprocess, sys
R = {}
R["numpy"] = try_(lambda: __import__("numpy").arange(10).sum().item())
db = sqlite3.connect("/workspace/x.db")
db.execute("create table t(x)")
db.executemany("insert into t values (?)", [(i,) for i in range(100)])
db.commit()
db2 = sqlite3.connect("/workspace/x.db")
R["sqlite"] = db2.execute("select sum(x) from t").fetchone()[0]
R["subprocess"] = subprocess.run([sys.executable, "-c", "import fcntl, os; fd = os.open('/tmp/s', os.O_CREAT | os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); print('locked')"],
                                 capture_output=True, text=True).stdout
R["sh"] = subprocess.run(["/bin/sh", "-c", "echo hi"], capture_output=True, text=True).stdout
report(R)
''')
    assert rep == {"numpy": 45, "sqlite": 4950, "subprocess": "locked\n", "sh": "hi\n"}, rep
