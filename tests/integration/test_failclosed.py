"""Fail closed: forkboxd refuses to start, exit status non-zero and one line on
stderr naming what is missing and how to fix it, when a limit or an isolation
feature its configuration asks for cannot be enforced (docs/operating.md,
"What the operator provides"; cgroups_probe.c and probe.c).

Each feature is taken away from the real daemon only, never from the host:
* cgroups: forkboxd runs in a private mount namespace (unshare -m, propagation
  private) where a tmpfs covers /sys/fs/cgroup, or a read-only bind covers one
  controller's hierarchy;
* user namespaces: forkboxd runs as root of a user namespace of its own (its
  root and the --id-range mapped to the same host ids) whose
  user.max_user_namespaces is 0, a limit that holds for that namespace only;
* seccomp: forkboxd is exec'd under a seccomp filter that makes seccomp(2) and
  prctl(PR_SET_SECCOMP) fail with EINVAL, what a kernel without
  CONFIG_SECCOMP_FILTER answers; the filter binds only that process tree.
"""

import os
import subprocess
import sys

import pytest

from fbtest import FORKBOXD, POLICY, ConnectionClosed, Daemon, arun, connect, wait_until
from id_block import IdBlock

T = 60
BASE = [FORKBOXD, "--listen", "127.0.0.1:0", "--policy", POLICY]

# forkboxd inside a private mount namespace, after a shell command that hides
# or freezes cgroups there ("$@" is forkboxd and its arguments).
def in_mount_ns(setup):
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            f'{setup} && exec "$@"', "sh"]


HIDE_CGROUPS = in_mount_ns("mount -t tmpfs none /sys/fs/cgroup")
RO_PIDS = in_mount_ns("mount --bind -o ro /sys/fs/cgroup/pids /sys/fs/cgroup/pids")
PRIVATE = in_mount_ns("true")

# Root of a new user namespace with user.max_user_namespaces = 0 in it.
NO_USERNS = r'''
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
first, count = int(sys.argv[1]), int(sys.argv[2])
r, w = os.pipe(); r2, w2 = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r); os.close(w2)
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
        os._exit(99)
    os.write(w, b"u"); os.close(w)
    os.read(r2, 1)  # maps written
    if sys.argv[3] == "off":
        with open("/proc/sys/user/max_user_namespaces", "w") as f:
            f.write("0")
    os.execv(sys.argv[4], sys.argv[4:])
os.close(w); os.close(r2)
os.read(r, 1)
for name in ("uid_map", "gid_map"):
    with open(f"/proc/{pid}/{name}", "w") as f:
        f.write(f"0 0 1\n{first} {first} {count}\n")
os.write(w2, b"g")
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
'''

# exec argv[2:] under a filter that fails seccomp(2) (all of it, or argv[1] ==
# "load": only SECCOMP_SET_MODE_FILTER) and prctl(PR_SET_SECCOMP) with EINVAL.
NO_SECCOMP = r'''
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
def ins(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)
LD, JEQ, RET = 0x20, 0x15, 0x06
ALLOW, EINVAL = 0x7FFF0000, 0x00050000 | 22
if sys.argv[1] == "all":
    prog = [ins(LD, 0, 0, 4), ins(JEQ, 0, 5, 0xC000003E),       # x86_64, else allow
            ins(LD, 0, 0, 0), ins(JEQ, 4, 0, 317),               # seccomp: EINVAL
            ins(JEQ, 0, 2, 157),                                 # prctl:
            ins(LD, 0, 0, 16), ins(JEQ, 1, 0, 22),               #   PR_SET_SECCOMP: EINVAL
            ins(RET, 0, 0, ALLOW), ins(RET, 0, 0, EINVAL)]
else:
    prog = [ins(LD, 0, 0, 4), ins(JEQ, 0, 4, 0xC000003E),
            ins(LD, 0, 0, 0), ins(JEQ, 0, 2, 317),
            ins(LD, 0, 0, 16), ins(JEQ, 1, 0, 1),                # SECCOMP_SET_MODE_FILTER
            ins(RET, 0, 0, ALLOW), ins(RET, 0, 0, EINVAL)]
code = ctypes.create_string_buffer(b"".join(prog))
fprog = ctypes.create_string_buffer(struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(code)))
if libc.prctl(22, 2, fprog, 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
    sys.exit("prctl: " + os.strerror(ctypes.get_errno()))
os.execv(sys.argv[2], sys.argv[2:])
'''


def refused(argv):
    """Run forkboxd (argv) until it exits: (exit status, stderr lines)."""
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=T, start_new_session=True)
    return p.returncode, p.stderr.decode("utf-8", "replace").splitlines()


def assert_one_line(status, lines, *words):
    """Refused: non-zero status, and stderr is one line that says it all."""
    assert status != 0 and status > 0, (status, lines)
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("forkboxd: "), line
    for w in words:
        assert w in line, (w, line)
    return line


def test_no_cgroups_refuses_to_start():
    status, lines = refused(HIDE_CGROUPS + BASE)
    line = assert_one_line(status, lines, "cgroup controller 'memory'", "cannot be enforced",
                           "Delegate=yes", "--allow-no-cgroups", "--memory 0")
    assert "not mounted?" in line


def test_read_only_controller_refuses_to_start_and_names_it():
    status, lines = refused(RO_PIDS + BASE)
    assert_one_line(status, lines, "cgroup controller 'pids'", "Read-only file system",
                    "--pids 0", "--allow-no-cgroups")


def test_limit_not_asked_for_need_not_be_enforceable():
    """--pids 0 asks for no process limit: a read-only pids hierarchy is then
    no reason to refuse, and turns run (with the memory and cpu limits)."""
    d = Daemon(["--pids", "0", "--pool", "0"], wrap=RO_PIDS).start()
    try:
        _, (r,) = run_one(d, "print(6 * 7)")
        assert r.stdout == "42\n", r.stderr
        assert "cgroups: v1 memory+cpu" in d.stderr() or "cgroups: v2" in d.stderr()
        assert "NOT enforced" not in d.stderr()
    finally:
        d.stop()


def test_allow_no_cgroups_warns_and_runs_turns():
    d = Daemon(["--allow-no-cgroups", "--pool", "1"], wrap=HIDE_CGROUPS).start()
    try:
        err = d.stderr()
        for ctl in ("memory", "pids", "cpu"):
            assert f"the per-turn {ctl} limit is NOT enforced (--allow-no-cgroups)" in err, err
        _, (r,) = run_one(d, "print('ran')")
        assert r.stdout == "ran\n", r.stderr
        assert "cgroup placement" not in d.stderr()
    finally:
        d.stop()


def test_user_namespaces_off_refuses_to_start():
    ids = IdBlock()  # host ids of this test's own: the namespace maps its range onto them
    first, count = ids.first, 16
    argv = [sys.executable, "-c", NO_USERNS, str(first), str(count), "off"] + BASE + [
        "--id-range", f"{first}:{count}", "--capacity", "2", "--pool", "0"]
    try:
        status, lines = refused(argv)
    finally:
        ids.release()
    assert_one_line(status, lines, "user namespaces are not available",
                    "No space left on device", "user.max_user_namespaces")


def test_user_namespace_probe_control():
    """The same user namespace with the limit left as it was: the probe passes
    (so the refusal above is the limit's doing). The daemon may stop later, at
    a step that needs host root, but not at the user namespace probe."""
    ids = IdBlock()
    first, count = ids.first, 16
    argv = [sys.executable, "-c", NO_USERNS, str(first), str(count), "on"] + BASE + [
        "--id-range", f"{first}:{count}", "--capacity", "2", "--pool", "0", "--single-use"]
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = p.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        _, err = p.communicate(timeout=10)
    finally:
        ids.release()
    assert b"user namespaces are not available" not in err, err


def test_seccomp_unavailable_refuses_to_start():
    status, lines = refused([sys.executable, "-c", NO_SECCOMP, "all"] + BASE)
    assert_one_line(status, lines, "seccomp is not available", "Invalid argument",
                    "CONFIG_SECCOMP_FILTER")


def test_seccomp_filter_that_cannot_load_refuses_to_start():
    """The kernel answers the feature query but refuses the filter itself: the
    probe child that loads the compiled policy finds out."""
    status, lines = refused([sys.executable, "-c", NO_SECCOMP, "load"] + BASE)
    assert_one_line(status, lines, "seccomp is not available",
                    "the policy's filter cannot be loaded", "Invalid argument")


def test_no_isolation_still_starts_without_cgroups():
    """--no-isolation (benchmarks only) stays as it was: no refusal."""
    d = Daemon(["--no-isolation", "--pool", "0"], wrap=HIDE_CGROUPS).start()
    d.stop()


def test_placement_failing_later_fails_the_turn_closed():
    """A cgroup hierarchy that becomes unusable after the start (here: made
    read-only in the daemon's mount namespace; likewise a parent removed and
    not recreatable) ends the turn before any of its code runs; the sandbox
    never runs without its limits."""
    d = Daemon(["--pool", "0"], wrap=PRIVATE).start()
    try:
        _, (r,) = run_one(d, "print(1)")
        assert r.stdout == "1\n", r.stderr
        subprocess.run(["nsenter", "-t", str(d.pid), "-m", "mount", "--bind", "-o", "ro",
                        "/sys/fs/cgroup/pids", "/sys/fs/cgroup/pids"], check=True, timeout=10)

        async def turn():
            t = await connect(d)
            try:
                return await t.run("print('ran without limits')")
            finally:
                await t.shutdown()
        with pytest.raises((ConnectionClosed, ConnectionError, OSError, RuntimeError)):
            r = arun(turn(), T)
            pytest.fail(f"the block ran: {r.stdout!r}")
        assert wait_until(lambda: "cgroup placement of" in d.stderr(), 10), d.stderr(3000)
        assert "ran without limits" not in d.stderr()
        # Writable again before the stop, so that its turn cgroups go with it.
        subprocess.run(["nsenter", "-t", str(d.pid), "-m", "umount", "/sys/fs/cgroup/pids"],
                       check=True, timeout=10)
    finally:
        d.stop()


def run_one(d, *codes):
    async def go():
        t = await connect(d)
        try:
            return t, [await t.run(c) for c in codes]
        finally:
            await t.shutdown()
    return arun(go(), T)
