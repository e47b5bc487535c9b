"""Host processes, other turns and secrets, from model code.

* The sandbox is pid 1 of its own pid namespace; the supervisor, the fork
  server, the test runner and other sandboxes are invisible (ESRCH, no /proc
  entry), and ptrace/process_vm_readv toward them are refused (EPERM) before
  the kernel even looks the pid up. Only signal 0 is ever sent.
* Two concurrent turns cannot see each other's /workspace, /tmp or /dev/shm,
  by path, by walking the tree, or through /proc/<pid>/root; a later turn
  starts empty.
* The bearer token never reaches a sandbox: not in the environment, not in
  /proc/*/environ, not anywhere in its memory.
* Processes a block leaves behind die with the turn.
"""

import asyncio
import json
import os
import time
import uuid

import pytest

import fbtest
import sbx

PROBE_PIDS = r'''
import os, signal
class _iovec(_ct.Structure):
    _fields_ = [("base", _ct.c_void_p), ("len", _ct.c_size_t)]
def process_vm_readv(pid):
    buf = _ct.create_string_buffer(8)
    l = _iovec(_ct.addressof(buf), 8)
    r = _iovec(0x400000, 8)
    return sc(310, pid, _ct.byref(l), 1, _ct.byref(r), 1, 0)
R = {}
R["getpid"] = os.getpid()
R["getppid"] = os.getppid()
R["init_cmdline"] = try_(lambda: open("/proc/1/cmdline", "rb").read().decode("latin-1")[:200])
R["kill_init"] = try_(lambda: os.kill(1, signal.SIGKILL) or "sent")   # pid-ns init ignores it
import time
time.sleep(0.2)
R["init_alive_after_kill"] = os.path.exists("/proc/1/status") and os.getppid() == 1
R["proc_pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
R["init_fds"] = try_(lambda: sorted(os.listdir("/proc/1/fd")))
R["init_sigblk"] = try_(lambda: [l.split()[1] for l in open("/proc/1/status")
                                 if l.startswith("SigBlk:")][0])
for name, pid in TARGETS.items():
    R[f"kill0:{name}"] = try_(lambda: os.kill(pid, 0) or "delivered")
    R[f"proc_entry:{name}"] = os.path.exists(f"/proc/{pid}")
    R[f"proc_root:{name}"] = try_(lambda: os.listdir(f"/proc/{pid}/root"))
    R[f"pidfd_open:{name}"] = isolated(lambda: sc(434, pid, 0))
    R[f"getpriority:{name}"] = isolated(lambda: sc(140, 0, pid))
    R[f"sched_getaffinity:{name}"] = isolated(lambda: sc(204, pid, 128, _ct.create_string_buffer(128)))
    R[f"ptrace_attach:{name}"] = isolated(lambda: sc(101, 0x4206, pid, 0, 0))   # PTRACE_SEIZE: no stop
    R[f"process_vm_readv:{name}"] = isolated(lambda: process_vm_readv(pid))
report(R)
'''


def _targets_code(targets: dict[str, int]) -> str:
    return sbx.prelude(f"TARGETS = {json.dumps(targets)}\n" + PROBE_PIDS)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.fixture(scope="module")
def host_pids(daemon):
    """Supervisor, fork server(s), this test process, and another live sandbox."""
    async def go():
        before = daemon.descendants()
        other = await sbx.Turn.open(daemon)
        # The other turn names its runtime (PR_SET_NAME) and is found by that
        # name: with --pool its sandbox was among `before` already, and on a
        # loaded machine the pool may not have been refilled yet.
        b = await other.run("import ctypes\n"
                            "ctypes.CDLL(None).prctl(15, b'fbtest-other', 0, 0, 0)\n"
                            "print('other up')")
        assert b.completed and b.stdout == "other up\n", repr(b)
        runtime = [p for p in daemon.descendants() if _comm(p) == "fbtest-other"]
        new = sorted(set(runtime) | {_ppid(p) for p in runtime})  # and its init
        before -= set(new)
        targets = {"supervisor": daemon.pid, "test_runner": os.getpid(), "init": 1}
        for i, p in enumerate(sorted(before)):
            targets[f"daemon_child_{i}"] = p
        for i, p in enumerate(new):
            targets[f"other_sandbox_{i}"] = p
        t = await sbx.Turn.open(daemon)
        res = await t.run(_targets_code({k: v for k, v in targets.items() if k != "init"}))
        await t.close()
        await other.close()
        return targets, new, res
    targets, others, res = sbx.arun(go(), 90)
    assert res.completed and res.exit_code == 0, repr(res)
    assert others, "could not find the other turn's sandbox among the daemon's descendants"
    assert all(p > 64 for k, p in targets.items() if k != "init"), \
        f"host pids too small to be told apart from sandbox pids: {targets}"
    return targets, res.report()


def test_sandbox_runs_under_its_own_init(host_pids):
    """The runtime is pid 2 of its own pid namespace, under the sandbox's init (pid 1)."""
    _, rep = host_pids
    assert (rep["getpid"], rep["getppid"]) == (2, 1), rep


def test_sandbox_init_cannot_be_killed_from_inside(host_pids):
    _, rep = host_pids
    assert rep["kill_init"] == "sent", rep["kill_init"]
    assert rep["init_alive_after_kill"] is True


def test_sandbox_init_holds_no_fd_and_runs_no_handler(host_pids):
    """Init shares the runtime's address space but nothing else it could be
    used for: no fd (the channel closes with the runtime's copy) and every
    signal blocked, so no handler ever runs on its small stack."""
    _, rep = host_pids
    assert rep["init_fds"] == [], rep["init_fds"]
    blocked = int(rep["init_sigblk"], 16)
    catchable = [s for s in range(1, 32) if s not in (9, 19)]  # SIGKILL, SIGSTOP cannot be
    assert all(blocked >> (s - 1) & 1 for s in catchable), rep["init_sigblk"]


def test_proc_shows_only_the_sandbox(host_pids):
    targets, rep = host_pids
    pids = rep["proc_pids"]
    assert 1 in pids and len(pids) <= 8, f"/proc lists {pids}"
    leaked = {k: v for k, v in targets.items() if k != "init" and v in pids}
    assert not leaked, f"host processes visible in /proc: {leaked}"


def _names(host_pids):
    targets, _ = host_pids
    return [k for k in targets if k != "init"]


PROBES = [("kill0", lambda r: isinstance(r, dict) and r.get("errno") == "ESRCH"),
          ("proc_entry", lambda r: r is False),
          ("proc_root", lambda r: isinstance(r, dict) and r.get("errno") == "ENOENT"),
          ("pidfd_open", lambda r: r == {"ret": -1, "errno": "ESRCH"}),
          ("getpriority", lambda r: r == {"ret": -1, "errno": "ESRCH"}),
          ("sched_getaffinity", lambda r: r == {"ret": -1, "errno": "ESRCH"}),
          ("ptrace_attach", lambda r: r == {"ret": -1, "errno": "EPERM"}),
          ("process_vm_readv", lambda r: r == {"ret": -1, "errno": "EPERM"})]


@pytest.mark.parametrize("probe,check", PROBES, ids=[p for p, _ in PROBES])
@pytest.mark.parametrize("who", ["supervisor", "test_runner", "daemon_child_0", "other_sandbox_0"])
def test_host_process_unreachable(host_pids, probe, check, who):
    targets, rep = host_pids
    assert who in targets, f"no {who} among {targets}"
    got = rep.get(f"{probe}:{who}")
    assert check(got), f"{probe} on {who} (host pid {targets[who]}): {got!r}"


# ---------------------------------------------------------------------------
# another turn's files
# ---------------------------------------------------------------------------

WRITE_MARKERS = r'''
import os
for d in ("/workspace", "/tmp", "/dev/shm"):
    try:
        with open(os.path.join(d, MARK), "w") as f:
            f.write(MARK)
    except OSError as e:
        print("cannot write", d, e)
print(sorted(p for p in ("/workspace", "/tmp", "/dev/shm") if os.path.exists(os.path.join(p, MARK))))
'''

LOOK_FOR_MARKERS = r'''
import os
R = {}
R["by_path"] = [d for d in ("/workspace", "/tmp", "/dev/shm") if os.path.exists(os.path.join(d, MARK))]
found = []
for top in ("/workspace", "/tmp", "/dev", "/tools", "/"):
    for root, dirs, files in os.walk(top):
        if root == "/":
            dirs[:] = [d for d in dirs if d not in ("proc", "sys")]
        if MARK in files:
            found.append(os.path.join(root, MARK))
        if len(found) > 10:
            break
R["by_walk"] = sorted(set(found))
via_proc = []
for p in os.listdir("/proc"):
    if p.isdigit():
        for d in ("workspace", "tmp", "dev/shm"):
            if os.path.exists(f"/proc/{p}/root/{d}/{MARK}"):
                via_proc.append(f"/proc/{p}/root/{d}")
R["via_proc_root"] = via_proc
R["workspace_listing"] = sorted(os.listdir("/workspace"))
R["tmp_listing"] = sorted(os.listdir("/tmp"))
report(R)
'''


@pytest.fixture(scope="module")
def cross_turn(daemon):
    mark = "fbx-marker-" + uuid.uuid4().hex

    async def go():
        a = await sbx.Turn.open(daemon)
        wa = await a.run(f"MARK = {mark!r}\n" + WRITE_MARKERS)
        b = await sbx.Turn.open(daemon)
        rb = await b.run(sbx.prelude(f"MARK = {mark!r}\n" + LOOK_FOR_MARKERS))
        # A still sees its own files (so the negative result in B means something)
        wa2 = await a.run(f"import os\nprint(os.path.exists('/workspace/{mark}'), os.path.exists('/tmp/{mark}'))")
        await b.close()
        await a.close()
        c = await sbx.Turn.open(daemon)
        rc = await c.run(sbx.prelude(f"MARK = {mark!r}\n" + LOOK_FOR_MARKERS))
        await c.close()
        return wa, rb, wa2, rc
    wa, rb, wa2, rc = sbx.arun(go(), 120)
    return mark, wa, rb, wa2, rc


def test_turn_a_wrote_its_markers(cross_turn):
    mark, wa, _, wa2, _ = cross_turn
    assert wa.completed and "['/dev/shm', '/tmp', '/workspace']" in wa.stdout, repr(wa)
    assert wa2.stdout == "True True\n", repr(wa2)


@pytest.mark.parametrize("how", ["by_path", "by_walk", "via_proc_root"])
def test_concurrent_turn_cannot_see_files(cross_turn, how):
    mark, _, rb, _, _ = cross_turn
    assert rb.completed and rb.exit_code == 0, repr(rb)
    assert rb.report()[how] == [], f"turn B found turn A's files {how}: {rb.report()[how]}"


def test_concurrent_turn_starts_with_empty_workspace(cross_turn):
    _, _, rb, _, _ = cross_turn
    assert rb.report()["workspace_listing"] == []


@pytest.mark.parametrize("how", ["by_path", "by_walk", "via_proc_root"])
def test_later_turn_cannot_see_files(cross_turn, how):
    mark, _, _, _, rc = cross_turn
    assert rc.completed and rc.exit_code == 0, repr(rc)
    assert rc.report()[how] == [], f"a later turn found turn A's files {how}: {rc.report()[how]}"


ABSTRACT_LISTEN = r'''
import socket
S = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
S.bind("\0" + MARK)
S.listen(4)
print("listening")
'''

ABSTRACT_CONNECT = r'''
import socket
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
c.settimeout(3)
report({"connect": try_(lambda: c.connect("\0" + MARK) or "connected")})
'''


def test_concurrent_turn_cannot_reach_abstract_socket(daemon):
    """Abstract AF_UNIX names are per network namespace: turn B cannot connect to a
    listener turn A holds open (while A itself can)."""
    mark = "fbx-abstract-" + uuid.uuid4().hex

    async def go():
        a = await sbx.Turn.open(daemon)
        ra = await a.run(f"MARK = {mark!r}\n" + ABSTRACT_LISTEN)
        self_check = await a.run(sbx.prelude(f"MARK = {mark!r}\n" + ABSTRACT_CONNECT))
        b = await sbx.Turn.open(daemon)
        rb = await b.run(sbx.prelude(f"MARK = {mark!r}\n" + ABSTRACT_CONNECT))
        await b.close()
        await a.close()
        return ra, self_check, rb
    ra, self_check, rb = sbx.arun(go(), 60)
    assert ra.stdout == "listening\n", repr(ra)
    assert self_check.report()["connect"] == "connected", repr(self_check)
    got = rb.report()["connect"]
    assert isinstance(got, dict) and got["errno"] == "ECONNREFUSED", got


def test_sandbox_hostname_is_not_the_hosts(daemon):
    import socket as _s
    r = daemon.run("import os\nprint(os.uname().nodename)", timeout=30)
    assert r.last.completed, repr(r)
    assert r.last.stdout.strip() not in ("", _s.gethostname()), r.last.stdout


def test_sandbox_tmp_is_not_the_hosts(cross_turn):
    mark = cross_turn[0]
    assert not os.path.exists(f"/tmp/{mark}")


# ---------------------------------------------------------------------------
# secrets
# ---------------------------------------------------------------------------

SECRET_SCAN = r'''
import os, re
R = {}
key = bytes(x ^ 0x5A for x in KEY_A)       # first half of the token, decoded here
tail = bytes(x ^ 0x5A for x in KEY_B)      # second half; never joined to the first in this process
R["environ_keys"] = sorted(os.environ)
R["nodename"] = os.uname().nodename
R["adk_in_proc_environ"] = []
for p in [d for d in os.listdir("/proc") if d.isdigit()] + ["self"]:
    try:
        env = open(f"/proc/{p}/environ", "rb").read()
    except OSError:
        continue
    if b"ADK_CODE_MODE" in env or (key in env and tail in env):
        R["adk_in_proc_environ"].append(p)
def scan_memory():
    hits = 0
    scanned = 0
    chunk = 8 << 20
    over = len(key) + len(tail)
    with open("/proc/self/maps") as maps:
        regions = [l.split() for l in maps]
    with open("/proc/self/mem", "rb", buffering=0) as mem:
        for f in regions:
            if "r" not in f[1] or (len(f) > 5 and f[5] in ("[vvar]", "[vsyscall]")):
                continue
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            pos = lo
            while pos < hi:
                n = min(chunk + over, hi - pos)
                try:
                    mem.seek(pos)
                    data = mem.read(n)
                except (OSError, OverflowError, ValueError):
                    break
                scanned += len(data)
                i = data.find(key)
                while i != -1:
                    if data[i + len(key):i + len(key) + len(tail)] == tail:
                        hits += 1
                    i = data.find(key, i + 1)
                del data
                pos += chunk
    return {"hits": hits, "scanned": scanned}
R["memory"] = try_(scan_memory)
report(R)
'''


@pytest.mark.skipif(sbx.UNDER_ASAN, reason="the scan would read ASan's terabytes of shadow "
                    "mappings; it runs in the plain build")
def test_token_never_reaches_the_sandbox(daemon):
    tok = daemon.token.encode()
    assert tok
    half = len(tok) // 2
    enc_a = bytes(x ^ 0x5A for x in tok[:half])
    enc_b = bytes(x ^ 0x5A for x in tok[half:])
    code = sbx.prelude(f"KEY_A = {enc_a!r}\nKEY_B = {enc_b!r}\n" + SECRET_SCAN)
    r = daemon.run(code, timeout=90)
    assert r.last.completed and r.last.exit_code == 0, repr(r)
    rep = r.last.report()
    assert not [k for k in rep["environ_keys"] if k.startswith("ADK_CODE_MODE")], rep["environ_keys"]
    extra = [k for k in rep["environ_keys"]
             if k not in fbtest.ALLOWED_ENV and not k.startswith(fbtest.ALLOWED_ENV_PREFIX)]
    assert not extra, f"environment beyond the allowlist (spec 6.4): {extra}"
    assert rep["adk_in_proc_environ"] == [], rep["adk_in_proc_environ"]
    mem = rep["memory"]
    assert isinstance(mem, dict) and "hits" in mem, mem
    assert mem["scanned"] > 1 << 20, f"memory scan read too little: {mem}"
    assert mem["hits"] == 0, f"the bearer token is in the sandbox's memory ({mem['hits']} copies)"


# ---------------------------------------------------------------------------
# processes left behind die with the turn
# ---------------------------------------------------------------------------

ORPHAN = r'''
import os, subprocess
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sh", ["/bin/sh", "-c", "while :; do sleep 1; done # " + MARK])
    os._exit(0)
os.waitpid(pid, 0)
print("left behind")
'''


def _host_procs_with(marker: str) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    out.append(int(p))
        except OSError:
            pass
    return out


def test_orphans_killed_at_turn_end(daemon):
    mark = "fbx-orphan-" + uuid.uuid4().hex

    async def go():
        t = await sbx.Turn.open(daemon)
        b = await t.run(f"MARK = {mark!r}\n" + ORPHAN)
        alive_during = sbx.wait_until(lambda: _host_procs_with(mark), 5)
        await t.close()
        return b, alive_during
    b, alive_during = sbx.arun(go(), 60)
    assert b.completed and b.stdout == "left behind\n", repr(b)
    assert alive_during, "the orphan was never seen on the host (harness problem)"
    assert sbx.wait_until(lambda: not _host_procs_with(mark), 10), \
        f"processes of a finished turn still running on the host: {_host_procs_with(mark)}"
