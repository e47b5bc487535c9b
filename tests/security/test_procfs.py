"""Host-wide /proc files as channels between sandboxes, and what they say.

A fresh proc instance shows the sandbox's own processes, but its system-wide
files are the host's. The sandbox's /proc covers those another turn can move
(meminfo, stat, loadavg, uptime, vmstat, file-nr, locks, pressure/...) or that
show the host's configuration (cmdline): synthetic files consistent with the
turn's limits (memory, CPU quota) or empty ones, read-only. The daemon's own
command line (sandboxes are clones of the fork server) is not readable either.

The channel test runs two turns at once: one takes memory, files, a lock and
CPU while the other reads the covered files before and after; nothing moves.
"""

import asyncio
import math
import os

import pytest

import sbx

MEMORY = 300 * 1024 * 1024
CPU_MILLIS = 1000

# Covered with synthetic contents, and covered empty (files, then directories);
# the same lists as proc_entries in src/sandbox/mounts.c. Entries this host's
# kernel lacks, or that only host root may read, are left as they are.
SYNTHETIC = ["meminfo", "stat", "cpuinfo", "loadavg", "uptime", "cmdline"]
EMPTY = ["vmstat", "zoneinfo", "buddyinfo", "pagetypeinfo", "diskstats", "interrupts",
         "softirqs", "schedstat", "locks", "sys/fs/file-nr", "sys/fs/inode-nr",
         "sys/fs/inode-state", "sys/fs/dentry-state"]
EMPTY_DIRS = ["pressure"]


def _on_host(path: str) -> bool:
    try:
        st = os.stat("/proc/" + path)
    except OSError:
        return False
    return not (os.path.isfile("/proc/" + path) and not st.st_mode & 0o004)


COVERED = [p for p in SYNTHETIC + EMPTY if _on_host(p)]
COVERED_DIRS = [p for p in EMPTY_DIRS if _on_host(p)]


@pytest.fixture(scope="module")
def pdaemon():
    with sbx.Daemon(["--capacity", "8", "--pool", "0", "--block-timeout", "60",
                    "--memory", str(MEMORY), "--cpu", str(CPU_MILLIS)]) as d:
        yield d


SNAPSHOT = r'''
def _snap():
    out = {}
    for p in COVERED:
        try:
            out[p] = open("/proc/" + p, "rb").read().decode("latin-1")
        except OSError as e:
            out[p] = exc(e)
    for p in COVERED_DIRS:
        out[p + "/"] = try_(lambda: sorted(os.listdir("/proc/" + p)))
    return out
'''

VIEW = SNAPSHOT + r'''
import multiprocessing, os, subprocess, sys
R = {"snap": _snap()}
R["cpu_count"] = [os.cpu_count(), multiprocessing.cpu_count(), os.sysconf("SC_NPROCESSORS_ONLN"),
                  os.sysconf("SC_NPROCESSORS_CONF")]
R["cpu_count_subprocess"] = try_(lambda: subprocess.run([sys.executable, "-c", "import os; print(os.cpu_count())"],
                                                        capture_output=True, timeout=30).stdout.decode().strip())
R["self_cmdline"] = open("/proc/self/cmdline", "rb").read().decode("latin-1")
R["init_cmdline"] = open("/proc/1/cmdline", "rb").read().decode("latin-1")
def _write(p):
    fd = os.open(p, os.O_WRONLY)
    os.close(fd)
    return "opened"
R["write_meminfo"] = try_(lambda: _write("/proc/meminfo"))
R["write_file_nr"] = try_(lambda: _write("/proc/sys/fs/file-nr"))
R["mkdir_pressure"] = try_(lambda: os.mkdir("/proc/pressure/x") or "made")
R["umount_meminfo"] = sc(166, b"/proc/meminfo", 2)      # umount2(MNT_DETACH)
R["umount_stat"] = sc(166, b"/proc/stat", 0)
def _covers():
    out = {}
    for line in open("/proc/self/mountinfo"):
        f = line.split()
        if f[4].startswith("/proc/"):
            out[f[4]] = f[5].split(",")
    return out
R["covers"] = _covers()
R["still_readable"] = try_(lambda: [bool(open("/proc/self/status").read()), bool(open("/proc/version").read()),
                                    bool(open("/proc/sys/kernel/osrelease").read()), os.path.isdir("/proc/self/fd")])
report(R)
'''


@pytest.fixture(scope="module")
def view(pdaemon):
    code = sbx.prelude(f"COVERED = {COVERED!r}\nCOVERED_DIRS = {COVERED_DIRS!r}\n" + VIEW)
    r = pdaemon.run(code, timeout=90)
    assert r.blocks and r.last.completed and r.last.exit_code == 0, f"block failed: {r!r}"
    return r.last.report()


def _meminfo(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        k, v = line.split(":", 1)
        out[k] = int(v.split()[0])
    return out


def test_meminfo_is_the_turns_limit(view):
    m = _meminfo(view["snap"]["meminfo"])
    kb = MEMORY // 1024
    assert m["MemTotal"] == kb and m["MemFree"] == kb and m["MemAvailable"] == kb, m
    # The fields free(1) and psutil read are there.
    for k in ("Buffers", "Cached", "SwapTotal", "SwapFree", "Shmem", "SReclaimable", "Active",
              "Inactive", "Slab", "CommitLimit"):
        assert k in m, (k, m)


def test_cpu_count_follows_the_quota(view):
    """glibc counts the cpuN lines of /proc/stat (no /sys in the sandbox): os.cpu_count(),
    multiprocessing and sysconf see the quota's CPUs, here one."""
    want = min(math.ceil(CPU_MILLIS / 1000), len(os.sched_getaffinity(0)))
    stat = view["snap"]["stat"].splitlines()
    cpus = [l.split()[0] for l in stat if l.startswith("cpu")]
    assert cpus == ["cpu"] + [f"cpu{i}" for i in range(want)], stat
    assert any(l.startswith("btime ") for l in stat), stat
    assert view["cpu_count"] == [want] * 4, view["cpu_count"]
    assert view["cpu_count_subprocess"] == str(want)
    assert view["snap"]["cpuinfo"].count("processor\t:") == want, view["snap"]["cpuinfo"][:500]


def test_load_uptime_cmdline_synthetic(view):
    s = view["snap"]
    assert s["loadavg"] == "0.00 0.00 0.00 1/1 1\n", s["loadavg"]
    up, idle = s["uptime"].split()
    assert float(up) > 0 and idle == "0.00", s["uptime"]
    host = open("/proc/cmdline").read()
    assert s["cmdline"] == "\n" and s["cmdline"] != host, s["cmdline"]


@pytest.mark.parametrize("path", [p for p in EMPTY if p in COVERED])
def test_host_counters_empty(view, path):
    assert view["snap"][path] == "", view["snap"][path][:300]


@pytest.mark.parametrize("path", COVERED_DIRS)
def test_host_dirs_empty(view, path):
    assert view["snap"][path + "/"] == [], view["snap"][path + "/"]


def test_covers_read_only_and_stay(view):
    assert view["write_meminfo"].get("errno") in ("EROFS", "EACCES"), view["write_meminfo"]
    assert view["write_file_nr"].get("errno") in ("EROFS", "EACCES"), view["write_file_nr"]
    assert view["mkdir_pressure"].get("errno") in ("EROFS", "EACCES"), view["mkdir_pressure"]
    assert view["umount_meminfo"] == {"ret": -1, "errno": "EPERM"}, view["umount_meminfo"]
    assert view["umount_stat"] == {"ret": -1, "errno": "EPERM"}, view["umount_stat"]
    covers = view["covers"]
    for p in COVERED + COVERED_DIRS:
        assert "ro" in covers.get("/proc/" + p, []), (p, covers)


def test_daemon_command_line_hidden(view):
    """Sandboxes are clones of the fork server: its argv (the daemon's flags, host
    paths) must not be what /proc/self/cmdline shows."""
    for who in ("self_cmdline", "init_cmdline"):
        c = view[who]
        assert "--listen" not in c and "--policy" not in c and sbx.SRCDIR not in c, (who, c)
        assert c == "forkboxd\0-I\0-B\0-X\0utf8\0-\0--internal-forkserver\0", (who, c)


def test_per_process_files_still_work(view):
    assert view["still_readable"] == [True, True, True, True], view["still_readable"]


HOG = r'''
import fcntl, os, time
_held = [open("/tmp/f%d" % i, "w") for i in range(300)]
with open("/tmp/big", "wb") as f:
    for _ in range(64):
        f.write(os.urandom(1 << 20))
_lock = open("/tmp/lock", "w")
fcntl.flock(_lock, fcntl.LOCK_EX)
t = time.monotonic()
while time.monotonic() - t < 0.5:
    pass
print("holding")
'''


def test_other_turns_activity_invisible(pdaemon):
    """Turn B reads every covered file, turn A takes 64 MiB of tmpfs, 300 open
    files, a flock and half a second of CPU and keeps them, B reads again: the
    same bytes."""
    code_snap = sbx.prelude(f"COVERED = {COVERED!r}\nCOVERED_DIRS = {COVERED_DIRS!r}\n" +
                            SNAPSHOT + "\nimport os\nreport(_snap())\n")

    async def go():
        b = await sbx.Turn.open(pdaemon)
        a = await sbx.Turn.open(pdaemon)
        try:
            first = await b.run(code_snap)
            hog = await a.run(HOG)
            second = await b.run(code_snap)
            return first, hog, second
        finally:
            await a.close()
            await b.close()

    first, hog, second = sbx.arun(go(), timeout=120)
    assert hog.completed and hog.exit_code == 0 and hog.stdout == "holding\n", repr(hog)
    assert first.completed and second.completed, (first, second)
    s1, s2 = first.report(), second.report()
    assert set(s1) == set(COVERED) | {p + "/" for p in COVERED_DIRS}, sorted(s1)
    moved = [p for p in s1 if s1[p] != s2[p]]
    assert moved == [], {p: (s1[p][:200], s2[p][:200]) for p in moved}
