"""Host files from model code: secrets, the host's /, writes outside /workspace and
/tmp, device nodes, setuid bits, /proc and /sys knobs.

The sandbox root is a read-only tmpfs of read-only binds, with tmpfs /workspace
and /tmp, read-only /tools, a fresh /proc and a minimal /dev. Opens of
dangerous /proc files are O_WRONLY opens that never write, so the probes are
harmless even on an unisolated host.
"""

import os

import pytest

import sbx

RO = {"EROFS", "EACCES"}          # read-only mount, or no permission on the ro image
RO_OR_PERM = RO | {"EPERM"}
# Directories every Debian host has at / and the sandbox must not show.
HOST_ONLY_ROOT = {"root", "home", "var", "boot", "srv", "opt", "mnt", "media", "run", "lost+found",
                  "work", "snap", "farm", "old_root", "container_info.json"}

BLOCK = r'''
import os, stat, shutil, subprocess, sys
R = {}
def _create(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.close(fd)
    os.unlink(path)                   # never leave anything behind, wherever it landed
    return "created"
def _open_wronly(path):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)   # never written to
    os.close(fd)
    return "opened"
def _mkdir(path):
    os.mkdir(path)
    os.rmdir(path)
    return "created"
def _symlink(path):
    os.symlink("/tmp", path)
    os.unlink(path)
    return "created"
def _chmod_same(path):
    os.chmod(path, os.stat(path).st_mode & 0o7777)   # same mode: harmless if it worked
    return "chmod ok"
R["read_etc_shadow"] = try_(lambda: open("/etc/shadow", "rb").read()[:20].decode("latin-1"))
R["read_etc_gshadow"] = try_(lambda: open("/etc/gshadow", "rb").read()[:20].decode("latin-1"))
R["read_root_home"] = try_(lambda: os.listdir("/root"))
R["read_home"] = try_(lambda: os.listdir("/home"))
R["root_listing"] = try_(lambda: sorted(os.listdir("/")))
R["host_srcdir_visible"] = os.path.exists(SRCDIR)
R["write_usr"] = try_(lambda: _create("/usr/forkbox-x"))
R["write_usr_bin"] = try_(lambda: _create("/usr/bin/forkbox-x"))
R["write_stdlib_file"] = try_(lambda: _open_wronly(_json.__file__))
R["write_etc"] = try_(lambda: _create("/etc/forkbox-x"))
R["write_etc_passwd"] = try_(lambda: _open_wronly("/etc/passwd"))
R["write_root"] = try_(lambda: _create("/forkbox-x"))
R["mkdir_root"] = try_(lambda: _mkdir("/forkbox-d"))
R["write_tools_new"] = try_(lambda: _create("/tools/forkbox_x.py"))
R["write_tools_existing"] = try_(lambda: _open_wronly("/tools/__init__.py"))
R["rename_tools"] = try_(lambda: os.rename("/tools/echo.py", "/tools/echo2.py"))
R["symlink_in_usr"] = try_(lambda: _symlink("/usr/forkbox-l"))
R["unlink_in_usr_bin"] = try_(lambda: os.unlink("/usr/bin/forkbox-nonexistent"))
R["chmod_usr_bin"] = try_(lambda: _chmod_same(os.path.realpath("/bin/sh")))
R["proc_sys_hostname_write"] = try_(lambda: _open_wronly("/proc/sys/kernel/hostname"))
R["proc_core_pattern_write"] = try_(lambda: _open_wronly("/proc/sys/kernel/core_pattern"))
R["proc_sysrq_trigger_write"] = try_(lambda: _open_wronly("/proc/sysrq-trigger"))
R["proc_kcore_read"] = try_(lambda: open("/proc/kcore", "rb").read(16) and "read")
def _mknod(path, kind, dev):
    os.mknod(path, kind | 0o600, dev)
    os.unlink(path)                   # a node must never be left behind
    return "created"
R["mknod_chr_tmp"] = try_(lambda: _mknod("/tmp/fbx-null", stat.S_IFCHR, os.makedev(1, 3)))
R["mknod_chr_workspace"] = try_(lambda: _mknod("/workspace/fbx-mem", stat.S_IFCHR, os.makedev(1, 1)))
R["mknod_blk_tmp"] = try_(lambda: _mknod("/tmp/fbx-sda", stat.S_IFBLK, os.makedev(8, 0)))
R["dev_listing"] = try_(lambda: sorted(os.listdir("/dev")))
R["dev_null_works"] = try_(lambda: (open("/dev/null", "w").write("x"), open("/dev/zero", "rb").read(4) == b"\0" * 4, len(open("/dev/urandom", "rb").read(8)))[1:])
# setuid: no_new_privs is set, the writable mounts are nosuid, no capabilities anywhere
R["no_new_privs"] = sc(157, 39, 0, 0, 0, 0)["ret"]
def _mount_opts(mp):
    for line in open("/proc/self/mountinfo"):
        f = line.split()
        if f[4] == mp:
            return f[5].split(",")
    return None
R["workspace_mount_opts"] = try_(lambda: _mount_opts("/workspace"))
R["tmp_mount_opts"] = try_(lambda: _mount_opts("/tmp"))
def _caps(text):
    return {l.split(":")[0]: l.split(":")[1].strip() for l in text.splitlines() if l.startswith("Cap") or l.startswith("NoNewPrivs") or l.startswith("Seccomp")}
R["caps_self"] = try_(lambda: _caps(open("/proc/self/status").read()))
R["caps_exec_child"] = try_(lambda: _caps(subprocess.run(["/bin/cat", "/proc/self/status"], capture_output=True, timeout=20).stdout.decode()))
def _setuid_copy():
    src = shutil.which("id") or "/usr/bin/id"
    dst = "/workspace/fbx-suid-id"
    shutil.copy(src, dst)
    os.chmod(dst, 0o4755)
    mode = os.stat(dst).st_mode
    try:
        p = subprocess.run([dst], capture_output=True, timeout=20)
        res = {"rc": p.returncode, "out": p.stdout.decode(), "err": p.stderr.decode()[-200:], "suid_bit": bool(mode & stat.S_ISUID)}
    except OSError as e:
        res = exc(e)
    os.unlink(dst)
    return res
R["setuid_copy_exec"] = try_(_setuid_copy)
R["uid_map"] = try_(lambda: open("/proc/self/uid_map").read().split())
R["gid_map"] = try_(lambda: open("/proc/self/gid_map").read().split())
def _oom_adj(v):
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    try:
        os.write(fd, str(v).encode())
    finally:
        os.close(fd)
    return int(open("/proc/self/oom_score_adj").read())
R["oom_score_adj_lower"] = isolated(lambda: _oom_adj(-1000))
R["oom_score_adj_raise"] = isolated(lambda: _oom_adj(500))
R["sys_visible"] = os.path.exists("/sys/kernel") or os.path.exists("/sys/fs/cgroup")
def _proc_mounts():
    # Every proc mount of our namespace: its mount point -> those of the mounts on it.
    mi = [l.split() for l in open("/proc/self/mountinfo")]
    return {f[4]: [g[4] for g in mi if g[1] == f[0]] for f in mi if f[f.index("-") + 1] == "proc"}
R["proc_mounts"] = _proc_mounts()
R["dev_shm_shows_proc"] = any(os.path.exists("/dev/shm/" + n) for n in ("self", "meminfo", "sys"))
report(R)
'''


@pytest.fixture(scope="module")
def fsprobe(daemon):
    code = sbx.prelude(f"SRCDIR = {sbx.SRCDIR!r}\n" + BLOCK)
    r = daemon.run(code, timeout=90)
    assert r.blocks and r.last.completed and r.last.exit_code == 0, f"block failed: {r!r}"
    return r.last.report()


def _err(res):
    assert isinstance(res, dict) and "exc" in res, f"the operation succeeded: {res!r}"
    return res["errno"]


@pytest.mark.parametrize("case", ["read_etc_shadow", "read_etc_gshadow"])
def test_shadow_unreadable(fsprobe, case):
    assert _err(fsprobe[case]) in {"ENOENT", "EACCES"}, fsprobe[case]


@pytest.mark.parametrize("case", ["read_root_home", "read_home"])
def test_host_home_dirs_invisible(fsprobe, case):
    assert _err(fsprobe[case]) == "ENOENT", fsprobe[case]


def test_root_listing_is_the_sandbox(fsprobe):
    ls = fsprobe["root_listing"]
    assert isinstance(ls, list), ls
    assert {"workspace", "tools", "tmp", "proc", "dev"} <= set(ls), ls
    assert not (set(ls) & HOST_ONLY_ROOT), f"host directories visible at /: {sorted(set(ls) & HOST_ONLY_ROOT)}"


def test_host_checkout_invisible(fsprobe):
    assert fsprobe["host_srcdir_visible"] is False


@pytest.mark.parametrize("case", ["write_usr", "write_usr_bin", "write_stdlib_file", "write_etc",
                                  "write_etc_passwd", "write_root", "mkdir_root", "write_tools_new",
                                  "write_tools_existing", "rename_tools", "symlink_in_usr",
                                  "unlink_in_usr_bin"])
def test_write_outside_workspace_and_tmp(fsprobe, case):
    assert _err(fsprobe[case]) in RO, fsprobe[case]


def test_chmod_image_file(fsprobe):
    assert _err(fsprobe["chmod_usr_bin"]) in RO_OR_PERM, fsprobe["chmod_usr_bin"]


@pytest.mark.parametrize("case", ["proc_sys_hostname_write", "proc_core_pattern_write",
                                  "proc_sysrq_trigger_write", "proc_kcore_read"])
def test_proc_knobs(fsprobe, case):
    assert _err(fsprobe[case]) in RO_OR_PERM | {"ENOENT"}, fsprobe[case]


@pytest.mark.parametrize("case", ["mknod_chr_tmp", "mknod_chr_workspace", "mknod_blk_tmp"])
def test_mknod_device(fsprobe, case):
    assert _err(fsprobe[case]) == "EPERM", fsprobe[case]


def test_dev_is_minimal(fsprobe):
    ls = fsprobe["dev_listing"]
    assert isinstance(ls, list), ls
    bad = set(ls) & {"sda", "vda", "xvda", "nvme0", "nvme0n1", "mem", "kmem", "port", "kmsg",
                     "userfaultfd", "loop0", "loop-control", "fuse", "kvm", "mapper", "net",
                     "console", "tty0", "cpu", "hpet", "vsock", "vhost-net"}
    assert not bad, f"host devices in the sandbox's /dev: {sorted(bad)} (all: {ls})"
    assert fsprobe["dev_null_works"] == [True, 8], fsprobe["dev_null_works"]


def test_no_new_privs(fsprobe):
    assert fsprobe["no_new_privs"] == 1


@pytest.mark.parametrize("mp", ["workspace_mount_opts", "tmp_mount_opts"])
def test_writable_mounts_nosuid_nodev(fsprobe, mp):
    opts = fsprobe[mp]
    assert isinstance(opts, list), f"{mp}: {opts!r}"
    assert "nosuid" in opts and "nodev" in opts, f"{mp}: {opts}"


@pytest.mark.parametrize("who", ["caps_self", "caps_exec_child"])
def test_no_capabilities(fsprobe, who):
    c = fsprobe[who]
    assert isinstance(c, dict) and c, f"{who}: {c!r}"
    zero = "0000000000000000"
    for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert c.get(k) == zero, f"{who}: {k}={c.get(k)} ({c})"
    assert c.get("NoNewPrivs") == "1", c
    assert c.get("Seccomp") == "2", c


def test_setuid_bit_has_no_effect(fsprobe):
    r = fsprobe["setuid_copy_exec"]
    assert isinstance(r, dict), r
    if "exc" in r:  # noexec /workspace refuses the exec: also no effect
        assert r["errno"] in {"EACCES", "EPERM"}, r
    else:
        assert r["rc"] == 0 and "euid=" not in r["out"], r


@pytest.mark.parametrize("which", ["uid_map", "gid_map"])
def test_host_root_not_mapped(fsprobe, which):
    """One id is mapped, and it is not host root (so setuid-root files of the image
    can never give back host root, and files owned by host root are not ours)."""
    m = fsprobe[which]
    assert isinstance(m, list) and len(m) == 3, f"{which}: {m!r}"
    inside, outside, count = (int(x) for x in m)
    assert count == 1 and outside != 0, f"{which}: {m}"


def test_sys_not_mounted(fsprobe):
    assert fsprobe["sys_visible"] is False


def test_no_proc_reachable_but_our_own(fsprobe):
    """Two proc mounts are in a sandbox's mount namespace: its own, at /proc, and
    the template's (src/sandbox/mounts_template.c), without which the kernel lets
    no user namespace mount a proc; that one lies under the scratch at /dev/shm,
    the only mount on it, so no path reaches it."""
    procs = fsprobe["proc_mounts"]
    assert sorted(procs) == ["/dev/shm", "/proc"], procs
    assert procs["/dev/shm"] == ["/dev/shm"], procs
    assert fsprobe["dev_shm_shows_proc"] is False


def test_oom_score_adj_cannot_be_lowered(fsprobe):
    """Code may make itself a likelier OOM victim, never a less likely one."""
    got = fsprobe["oom_score_adj_lower"]
    assert isinstance(got, dict) and got.get("errno") in {"EACCES", "EPERM"}, got


def test_oom_score_adj_can_be_raised(fsprobe):
    assert fsprobe["oom_score_adj_raise"] == 500


SNAPSHOT_TRICKS = r"""
import os, stat
os.symlink("/etc/passwd", "/workspace/link-to-passwd")
os.symlink("/proc/self/environ", "/workspace/link-to-environ")
os.symlink("/", "/workspace/link-to-root")
os.mkfifo("/workspace/fifo")
with open("/workspace/secret-unreadable", "w") as f:
    f.write("x")
os.chmod("/workspace/secret-unreadable", 0)
R = {}
R["hardlink_to_tools"] = try_(lambda: os.link("/tools/echo.py", "/workspace/hard-echo"))
R["hardlink_to_usr"] = try_(lambda: os.link(os.path.realpath("/bin/sh"), "/workspace/hard-sh"))
with open("/workspace/plain.txt", "w") as f:
    f.write("plain")
report(R)
"""


def test_snapshot_ignores_links_fifos_and_unreadable_files(daemon):
    r = daemon.run(sbx.prelude(SNAPSHOT_TRICKS), timeout=60)
    b = r.last
    assert b.completed and b.exit_code == 0, repr(r)
    rep = b.report()
    assert rep["hardlink_to_tools"].get("errno") in {"EXDEV", "EPERM", "EROFS"}, rep
    assert rep["hardlink_to_usr"].get("errno") in {"EXDEV", "EPERM", "EROFS"}, rep
    files = sbx.read_targz(b.archive)
    assert "plain.txt" in files, sorted(files)
    for bad in ("link-to-passwd", "link-to-environ", "fifo", "hard-echo", "hard-sh"):
        assert not any(n == bad or n.startswith(bad + "/") for n in files), f"{bad} in snapshot: {sorted(files)}"
    assert not any(n.startswith("link-to-root") for n in files), sorted(files)
    assert b"root:" not in b"".join(files.values()), "host passwd content leaked into the snapshot"


OVER_CAP = r"""
import os
with open("/workspace/small.txt", "w") as f:
    f.write("small")
with open("/workspace/sparse.bin", "wb") as f:
    f.truncate(150 * 1024 * 1024)     # sparse: costs no memory, but 150 MiB of file data
print(os.path.getsize("/workspace/sparse.bin"))
"""


def test_snapshot_over_cap_file_left_out(daemon):
    """A file that would push the snapshot past --snapshot-max (100M) is left out,
    with a note in stderr; the rest of the workspace still comes back."""
    r = daemon.run(OVER_CAP, timeout=60)
    b = r.last
    assert b.completed and b.exit_code == 0, repr(r)
    files = sbx.read_targz(b.archive)
    assert files.get("small.txt") == b"small" and "sparse.bin" not in files, sorted(files)
    assert "1 file(s) left out of the workspace snapshot" in b.stderr, b.stderr
    assert len(b.archive) < 1 << 20


def _tgz_with_modes(members):
    import tarfile
    infos = []
    for name, mode, data in members:
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        ti.mode = mode
        infos.append((ti, data))
    return sbx.make_targz(infos)


def test_workspace_archive_setuid_bits_masked(daemon):
    """Modes from an incoming workspace archive are masked (spec 9.2 fix:
    0777 & ~022): no setuid/setgid/sticky file appears in the sandbox."""
    ws = _tgz_with_modes([("suid.sh", 0o6777, b"#!/bin/sh\nid\n"), ("plain.txt", 0o644, b"x")])
    code = ("import os, stat\n"
            "for n in ('suid.sh', 'plain.txt'):\n"
            "    print(n, oct(stat.S_IMODE(os.stat(n).st_mode)))\n")

    async def go():
        t = await sbx.Turn.open(daemon)
        b = await t.run(code, workspace=ws)
        await t.close()
        return b
    b = sbx.arun(go(), 60)
    assert b.completed and b.exit_code == 0, repr(b)
    modes = dict(line.split() for line in b.stdout.splitlines())
    assert int(modes["suid.sh"], 8) & 0o7000 == 0, modes
    assert int(modes["suid.sh"], 8) & 0o022 == 0, modes
