"""The pre-forked pool (--pool), preloads (--preload) and extra package dirs
(--site-packages), through the real daemon.

Outcomes only, never timings: every turn gets a sandbox of its own (pooled
or fresh), nothing of one turn is visible in the next, pooled sandboxes that
die unused are replaced, and preloaded / extra packages are importable,
read-only and listed in ready.packages."""

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile

import pytest

from fbtest import arun, children, connect, pid_alive, wait_until

T = 60


def idle_sandboxes(d):
    """Sandboxes under the fork server (each an init with the runtime below
    it; the fork server's cgroup helper has no child), with no turn running."""
    return {p for p in children(d.forkserver_pid()) if pid_alive(p) and children(p)}


def sandbox_pids_in_log(d):
    return [int(p) for p in re.findall(r"turn \d+: sandbox pid (\d+)", d.stderr())]


async def one_turn(d, *codes):
    turn = await connect(d)
    try:
        return turn, [await turn.run(c) for c in codes]
    finally:
        await turn.shutdown()


MARK = r'''
import builtins, os, sys
seen = {"marker": getattr(builtins, "_fb_marker", None),
        "tmp": sorted(os.listdir("/tmp")), "ws": sorted(os.listdir("."))}
builtins._fb_marker = "set by an earlier turn"
open("/tmp/left-behind", "w").write("x")
open("left-behind.txt", "w").write("x")
print(seen)
'''
CLEAN = "{'marker': None, 'tmp': [], 'ws': []}\n"


# ---- the pool -----------------------------------------------------------------

def test_pool_turns_in_a_row_get_fresh_sandboxes(make_daemon):
    """--pool 2: several turns in a row each run in a sandbox of their own
    (different host pids, nothing left from the turn before)."""
    d = make_daemon(["--pool", "2", "--log-level", "debug"])
    assert wait_until(lambda: len(idle_sandboxes(d)) == 2, 20), idle_sandboxes(d)

    async def go():
        return [await one_turn(d, MARK, "print(_fb_marker if '_fb_marker' in dir() else 1)")
                for _ in range(6)]
    results = arun(go(), T)
    for turn, (r1, r2) in results:
        assert r1.exit_code == 0, r1.stderr
        assert r1.stdout == CLEAN
        assert r2.stdout == "1\n"
        assert turn.ready_count == 1
    pids = sandbox_pids_in_log(d)
    assert len(pids) == 6 and len(set(pids)) == 6, pids
    assert "pooled sandbox" in d.stderr()          # the pool served some of them
    assert wait_until(lambda: len(idle_sandboxes(d)) == 2, 20)  # and was refilled
    assert d.alive()


def test_pool_parallel_turns_more_than_the_pool(make_daemon):
    """More turns at once than pooled sandboxes: the rest are spawned fresh;
    every turn is isolated from the others."""
    d = make_daemon(["--pool", "2", "--log-level", "debug"])
    assert wait_until(lambda: len(idle_sandboxes(d)) == 2, 20)
    n = 6

    async def one(i):
        turn = await connect(d)
        try:
            r1 = await turn.run(MARK)
            await asyncio.sleep(0.2)  # all turns alive at once
            r2 = await turn.run(f"import os\nprint(sorted(os.listdir('.')), {i})")
            return r1, r2
        finally:
            await turn.shutdown()

    async def go():
        return await asyncio.gather(*(one(i) for i in range(n)))
    for i, (r1, r2) in enumerate(arun(go(), T)):
        assert r1.stdout == CLEAN, r1.stderr
        assert r2.stdout == f"['left-behind.txt'] {i}\n"
    pids = sandbox_pids_in_log(d)
    assert len(pids) == n and len(set(pids)) == n, pids


def test_pool_replaces_sandboxes_killed_from_outside(make_daemon):
    """A pooled sandbox that dies unused is reaped, logged and replaced; turns
    keep working."""
    d = make_daemon(["--pool", "2", "--log-level", "debug"])
    assert wait_until(lambda: len(idle_sandboxes(d)) == 2, 20)
    first = idle_sandboxes(d)
    for pid in first:
        os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: len(idle_sandboxes(d)) == 2 and not idle_sandboxes(d) & first, 20), \
        (first, idle_sandboxes(d))
    assert all(not pid_alive(p) for p in first)
    assert d.stderr().count("died unused") >= 2, d.stderr()[-2000:]
    _, (r,) = arun(one_turn(d, MARK), T)
    assert r.stdout == CLEAN, r.stderr
    assert d.alive()


def test_pool_zero_spawns_fresh(make_daemon):
    """--pool 0: no sandbox waits while idle; turns are spawned on demand."""
    d = make_daemon(["--pool", "0"])
    _, (r1,) = arun(one_turn(d, MARK), T)
    _, (r2,) = arun(one_turn(d, MARK), T)
    assert r1.stdout == r2.stdout == CLEAN
    assert wait_until(lambda: not idle_sandboxes(d), 5), idle_sandboxes(d)


# ---- preloads -----------------------------------------------------------------

def test_preload_and_a_bad_name(make_daemon):
    """--preload: modules are in sys.modules before the turn's code runs; a
    name that does not import is logged and skipped, the daemon serves."""
    d = make_daemon(["--pool", "1", "--preload", "csv,no_such_module_fbx, decimal"])
    assert re.search(r"preload 'no_such_module_fbx' failed, skipped: ModuleNotFoundError",
                     d.stderr()), d.stderr()[-2000:]
    _, (r,) = arun(one_turn(d, "import sys\nprint('csv' in sys.modules, 'decimal' in sys.modules)"), T)
    assert r.stdout == "True True\n", r.stderr


def test_preload_that_starts_a_thread_stops_the_daemon(make_daemon, site_dir):
    """A preload that leaves a thread in the fork server would break every
    clone: forkboxd refuses to start and names it."""
    with open(os.path.join(site_dir, "fbx_threads.py"), "w") as fh:
        fh.write("import threading, time\n"
                 "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    with pytest.raises(RuntimeError) as e:
        make_daemon(["--site-packages", site_dir, "--preload", "fbx_threads"])
    assert "preload 'fbx_threads' left 1 thread(s)" in str(e.value)


def _have(mod):
    return subprocess.run(["/usr/bin/python3", "-c", f"import {mod}"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not (_have("numpy") and _have("pandas")),
                    reason="python3-numpy / python3-pandas not installed")
def test_preload_numpy_pandas(make_daemon):
    """Debian's numpy and pandas preload (BLAS pinned to one thread in the
    fork server), are already imported in the turn, work, and the pinning
    variables do not leak into the sandbox's environment."""
    d = make_daemon(["--pool", "1", "--preload", "numpy,pandas"])
    code = ("import os, sys, threading\n"
            "print('pandas' in sys.modules, 'numpy' in sys.modules)\n"
            "import numpy as np, pandas as pd\n"
            "print(int(pd.DataFrame({'a': [1, 2, 3]}).a.sum()), float(np.ones((3, 3)).dot(np.ones(3))[0]))\n"
            "print(sorted(k for k in os.environ if 'THREADS' in k))\n")
    ready_turn, (r,) = arun(one_turn(d, code), T)
    assert r.stdout == "True True\n6 3.0\n[]\n", r.stderr
    assert "numpy" in ready_turn.ready["packages"]


@pytest.mark.skipif(not _have("numpy"), reason="python3-numpy not installed")
def test_cold_numpy_import_in_an_isolated_sandbox(make_daemon):
    """Without preloading, Debian's numpy imports inside the sandbox: its BLAS
    is reached through /etc/alternatives, which the sandbox's /etc provides."""
    d = make_daemon(["--pool", "0"])
    code = ("import sys\n"
            "print('numpy' in sys.modules)\n"
            "import numpy as np\n"
            "print(float(np.ones((2, 2)).dot(np.ones(2))[1]))\n")
    _, (r,) = arun(one_turn(d, code), T)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "False\n2.0\n", r.stderr


# ---- --site-packages ----------------------------------------------------------

@pytest.fixture
def site_dir():
    """A package dir the sandbox uid can read (pytest's tmp_path is 0700)."""
    d = tempfile.mkdtemp(prefix="fbx-site-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make_package(site):
    pkg = os.path.join(site, "fbx_extra")
    os.mkdir(pkg)
    with open(os.path.join(pkg, "__init__.py"), "w") as fh:
        fh.write("VALUE = 42\n")
    info = os.path.join(site, "fbx_extra-1.2.3.dist-info")
    os.mkdir(info)
    with open(os.path.join(info, "METADATA"), "w") as fh:
        fh.write("Metadata-Version: 2.1\nName: fbx-extra\nVersion: 1.2.3\n")
    with open(os.path.join(info, "top_level.txt"), "w") as fh:
        fh.write("fbx_extra\n")
    for root, dirs, files in os.walk(site):
        for n in dirs:
            os.chmod(os.path.join(root, n), 0o755)
        for n in files:
            os.chmod(os.path.join(root, n), 0o644)


@pytest.mark.parametrize("pool", ["0", "2"])
def test_site_packages_importable_readonly_listed(make_daemon, site_dir, pool):
    """--site-packages DIR: importable (and preloadable), read-only inside,
    listed in ready.packages."""
    make_package(site_dir)
    d = make_daemon(["--pool", pool, "--site-packages", site_dir, "--preload", "fbx_extra"])
    code = ("import sys, os\n"
            "print('fbx_extra' in sys.modules)\n"
            "import fbx_extra\n"
            "print(fbx_extra.VALUE, fbx_extra.__file__.startswith(%r))\n"
            "try:\n"
            "    open(os.path.join(%r, 'new.py'), 'w')\n"
            "except OSError as e:\n"
            "    print(type(e).__name__, e.errno)\n" % (site_dir, site_dir))
    turn, (r,) = arun(one_turn(d, code), T)
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == ["True", "42 True"], r.stdout
    assert lines[2] in ("OSError 30", "PermissionError 13"), lines[2]  # EROFS (or EACCES)
    assert not os.path.exists(os.path.join(site_dir, "new.py"))
    assert turn.ready["packages"]["fbx_extra"] == {"fbx-extra": "1.2.3"}


# ---- turn cgroups -------------------------------------------------------------

def _forkbox_cgroup_dirs(pid):
    """<hierarchy>/<pid's own cgroup>/forkbox for each v1/v2 hierarchy."""
    dirs = []
    with open(f"/proc/{pid}/cgroup") as fh:
        own = [line.rstrip("\n").split(":", 2) for line in fh]
    for _, ctl, path in own:
        mnt = {"": "/sys/fs/cgroup/unified"}.get(ctl, f"/sys/fs/cgroup/{ctl.replace('name=', '')}")
        if not os.path.isdir(mnt):
            mnt = "/sys/fs/cgroup"  # pure v2 host
        dirs.append(os.path.join(mnt + path, "forkbox"))
    return dirs


def _turn_cgroups(dirs, placer):
    """Every turn cgroup named turn-<first id>-<placer pid>-* in those directories."""
    found = []
    for base in dirs:
        try:
            found += [os.path.join(base, n) for n in os.listdir(base)
                      if re.fullmatch(rf"turn-\d+-{placer}-\d+", n)]
        except OSError:
            pass
    return found


def test_turn_cgroups_recycled_and_removed_at_stop(make_daemon):
    """Turn cgroups are reused (a few turns in a row do not pile up cgroups),
    and stopping the daemon the way systemd does (SIGTERM to its whole process
    group) removes every one of them, the pooled sandboxes' included."""
    d = make_daemon(["--pool", "2", "--log-level", "debug"])
    assert wait_until(lambda: len(idle_sandboxes(d)) == 2, T)
    fs = d.forkserver_pid()
    placer = [p for p in children(fs) if not children(p) and p not in idle_sandboxes(d)]
    assert len(placer) == 1, children(fs)
    placer = placer[0]
    dirs = _forkbox_cgroup_dirs(placer)
    if not _turn_cgroups(dirs, placer):
        pytest.skip("no cgroup controller usable here")
    # Without reuse, 10 turns with a pool of 2 number their cgroups up to 12;
    # with it, a released cgroup serves the next sandbox (a few more when a
    # release is still settling as the next sandbox arrives).
    seqs = set()
    for _ in range(10):
        arun(one_turn(d, "print(1)"), T)
        seqs |= {int(p.rsplit("-", 1)[1]) for p in _turn_cgroups(dirs, placer)}
    assert max(seqs) <= 8, sorted(seqs)
    os.killpg(d.proc.pid, signal.SIGTERM)
    assert d.wait_exit(10) is not None
    assert wait_until(lambda: not pid_alive(placer), 5), "the cgroup helper outlived the daemon"
    assert _turn_cgroups(dirs, placer) == []


def test_another_daemon_stopping_leaves_our_cgroups_alone(make_daemon):
    """Daemons started under the same cgroup share <own>/forkbox. One of them
    stopping must not take that directory away from the others: a daemon that
    has no turn cgroup yet (--pool 0, before its first turn) still gets its
    next sandbox into cgroups. (CI ran test suites in parallel and lost a turn
    this way: the stopping daemon removed the then empty shared parent.)"""
    a = make_daemon(["--pool", "0"])
    dirs = _forkbox_cgroup_dirs(os.getpid())
    b = make_daemon(["--pool", "0"])
    arun(one_turn(b, "print(1)"), T)
    os.killpg(b.proc.pid, signal.SIGTERM)
    assert b.wait_exit(10) is not None
    _, (r,) = arun(one_turn(a, "print(2)"), T)
    assert r.stdout == "2\n", r.stderr
    assert "cgroup placement" not in a.stderr()
    # Removed by hand (or by a forkboxd from before this fix) while a is
    # between turns: a makes it again.
    a.stop()
    a = make_daemon(["--pool", "0"])
    removed = 0
    for p in dirs:
        try:
            os.rmdir(p)
            removed += 1
        except OSError:
            pass  # absent, or in use by a daemon of a test running beside us
    _, (r,) = arun(one_turn(a, "print(3)"), T)
    assert r.stdout == "3\n", r.stderr
    assert "cgroup placement" not in a.stderr()
    if removed:
        assert "was removed under us; recreated it" in a.stderr()
