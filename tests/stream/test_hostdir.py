"""The host's directory as a workspace (issue 27): what a block leaves in it,
as the host sees it afterwards. `forkbox sandbox` serves the directory
through FUSE (src/sandbox/hostfs.c): a block writes as the directory's
owner, whoever that is; no set-uid or set-gid bit, FIFO, socket, device
node, ACL or non-user xattr reaches a host inode; the directory keeps its
own mode; the block may add --workspace-max and then gets ENOSPC; flock and
fcntl locks work; symlinks stay, and the host's reader (forkbox_embed's
Workspace) never follows one out.

Driven through the embedding API (tools/forkbox_embed.py), as a host would,
as root (isolation needs it), against the build tree's forkbox."""

import errno
import os
import shutil
import stat
import struct
import subprocess
import tempfile

import pytest

import forkbox_embed  # tools/, on pythonpath by tests/pytest.ini

SRCDIR = os.environ.get("FORKBOX_SRCDIR", os.path.join(os.path.dirname(__file__), "..", ".."))
FORKBOX = os.environ.get("FORKBOX", os.path.join(SRCDIR, "build", "src", "forkbox"))
TIMEOUT = 60

# A block's probe of a list of calls: each name and the errno it got ("ok").
PROBE = '''
import errno, os
def probe(calls):
    for name, call in calls:
        try:
            call()
            print(name, "ok")
        except OSError as e:
            print(name, errno.errorcode[e.errno])
'''


def sandbox(ws, *args):
    return forkbox_embed.Sandbox({}, workspace=str(ws), forkbox=FORKBOX, args=list(args))


def run(ws, code, *args):
    """One block in a fresh sandbox on ws: its stdout lines (it must exit 0)."""
    with sandbox(ws, *args) as sb:
        r = sb.run(PROBE + code, timeout=TIMEOUT)
    assert r.exit_code == 0, r.stderr
    return r.stdout.splitlines()


def mkdtemp(owner=None, group=None, mode=0o700):
    d = tempfile.mkdtemp(prefix="forkbox-hostdir-")
    if owner is not None:
        os.chown(d, owner, group)
    os.chmod(d, mode)
    return d


@pytest.fixture
def ws():
    d = mkdtemp()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def modes(root):
    """Every entry below root: relative path -> st_mode (not following links)."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = os.lstat(p).st_mode
    return out


# ------------------------------------------------------------------ owners

# Everyday calls a block makes in its workspace, and what they give.
EVERYDAY = """
open('a', 'w').write('12345')
open('a', 'a').write('678')
os.truncate('a', 4)
os.link('a', 'b')
os.rename('b', 'c')
os.replace('new', 'c2')
os.chmod('a', 0o640)
os.symlink('a', 'l')
with open('a', 'r+') as f:
    f.seek(2)
    f.write('xy')
os.utime('a', (1000000000, 1000000000))
st = os.stat('a')
print(open('l').read(), st.st_nlink, oct(st.st_mode & 0o777), int(os.stat('c').st_mtime),
      sorted(os.listdir()))
probe([('chmod-root-as-is', lambda: os.chmod('.', os.stat('.').st_mode & 0o777))])
"""
EVERYDAY_OUT = ("12xy 2 0o640 1000000000 ['a', 'c', 'c2', 'dir', 'l', 'mine', 'theirs']\n"
                "chmod-root-as-is ok\n")


def test_any_owner_any_mode():
    """A mkdtemp directory (0700) of root, of a user, of nobody: the block
    writes as its owner (uid 0 inside), reads the owner's private files and
    not another user's, and the host sees the owner's files at once; what
    the host writes meanwhile, the block sees."""
    for owner in ((0, 0), (1234, 2345), (65534, 65534)):
        one_owner(owner)


def one_owner(owner):
    uid, gid = owner
    ws = mkdtemp(uid, gid)
    try:
        for name, o, mode in (("mine", owner, 0o600), ("theirs", (4321, 4321), 0o600)):
            with open(os.path.join(ws, name), "w") as f:
                f.write(name)
            os.chown(os.path.join(ws, name), *o)
            os.chmod(os.path.join(ws, name), mode)
        with sandbox(ws) as sb:
            r = sb.run(PROBE + "open('new', 'w').write('x'); os.mkdir('dir')\n"
                       "print(os.stat('.').st_uid, os.stat('new').st_uid, open('mine').read())\n"
                       "probe([('theirs', lambda: open('theirs').read())])\n" + EVERYDAY,
                       timeout=TIMEOUT)
            assert r.stdout == "0 0 mine\ntheirs EACCES\n" + EVERYDAY_OUT, r.stdout + r.stderr
            for name in ("a", "c2", "dir"):
                st = os.stat(os.path.join(ws, name))
                assert (st.st_uid, st.st_gid) == owner, (name, st)
            with open(os.path.join(ws, "from-host"), "w") as f:
                f.write("host")
            r = sb.run("print(open('from-host').read(), sorted(os.listdir()))", timeout=TIMEOUT)
            assert r.stdout == ("host ['a', 'c', 'c2', 'dir', 'from-host', 'l', 'mine', "
                                "'theirs']\n"), r.stderr
    finally:
        shutil.rmtree(ws, ignore_errors=True)


# -------------------------------------------------- nothing dangerous stays

def test_no_set_uid_or_set_gid_bit(ws):
    """chmod in every form, open and mknod with a mode: a set-uid or set-gid
    bit is refused (a root-owned workspace would otherwise hold a set-uid
    root program); a host's set-uid file loses the bit once written; a new
    directory in a set-gid one keeps the group but not the bit."""
    os.chown(ws, 0, 4242)
    os.chmod(ws, 0o2775)
    host_suid = os.path.join(ws, "host-suid")
    with open(host_suid, "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(host_suid, 0o4755)
    out = run(ws, """
import stat
open('f', 'w').write('#!/bin/sh\\n')
fd = os.open('f', os.O_RDONLY)
probe([('chmod-suid', lambda: os.chmod('f', 0o4755)),
       ('chmod-sgid', lambda: os.chmod('f', 0o2755)),
       ('fchmod-6777', lambda: os.fchmod(fd, 0o6777)),
       ('chmod-plain', lambda: os.chmod('f', 0o755)),
       ('open-suid', lambda: os.close(os.open('g', os.O_CREAT | os.O_WRONLY, 0o4755))),
       ('mknod-suid', lambda: os.mknod('h', stat.S_IFREG | 0o6755)),
       ('mkdir', lambda: os.mkdir('sub')),
       ('chmod-dir-sgid', lambda: os.chmod('sub', 0o2755)),
       ('write-host-suid', lambda: open('host-suid', 'a').write('exit 0\\n'))])
""")
    assert out == ["chmod-suid EPERM", "chmod-sgid EPERM", "fchmod-6777 EPERM", "chmod-plain ok",
                   "open-suid EPERM", "mknod-suid EPERM", "mkdir ok", "chmod-dir-sgid EPERM",
                   "write-host-suid ok"], out
    found = modes(ws)
    assert not [p for p, m in found.items() if m & (stat.S_ISUID | stat.S_ISGID)], found
    assert os.stat(os.path.join(ws, "sub")).st_gid == 4242  # inherited: the host's choice
    assert stat.S_IMODE(os.stat(ws).st_mode) == 0o2775


def test_no_fifo_socket_or_device_node(ws):
    """A FIFO (a host reader hangs on it), a socket (bind() of a Unix socket
    path), a device node (a whiteout 0:0 too): refused in the workspace, as
    a filesystem without them refuses them; /tmp is the sandbox's own and
    keeps them."""
    out = run(ws, """
import socket, stat
def bind(path):
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
probe([('fifo', lambda: os.mkfifo('fifo')),
       ('socket', lambda: bind('sock')),
       ('chr', lambda: os.mknod('null', stat.S_IFCHR | 0o666, os.makedev(1, 3))),
       ('whiteout', lambda: os.mknod('wh', stat.S_IFCHR | 0o600, 0)),
       ('tmp-fifo', lambda: os.mkfifo('/tmp/fifo')),
       ('tmp-socket', lambda: bind('/tmp/sock'))])
""")
    assert out == ["fifo EPERM", "socket EPERM", "chr EPERM", "whiteout EPERM", "tmp-fifo ok",
                   "tmp-socket ok"], out
    assert os.listdir(ws) == []


# A default ACL giving everyone rwx: files the host later makes in the
# directory would be 0666 whatever its umask.
ACL_RWX_ALL = struct.pack("<I", 2) + b"".join(
    struct.pack("<HHI", tag, 7, 0xFFFFFFFF) for tag in (0x01, 0x04, 0x20))


def test_only_user_xattrs(ws):
    """user.* xattrs work both ways; an ACL (default or access), a file
    capability, trusted.*: refused; the host's own non-user xattrs are not
    the block's to see."""
    host_file = os.path.join(ws, "host")
    open(host_file, "w").close()
    os.setxattr(host_file, "trusted.host", b"secret")
    os.setxattr(host_file, "user.host", b"shared")
    out = run(ws, f"""
open('f', 'w').close()
acl = {ACL_RWX_ALL!r}
probe([('user', lambda: os.setxattr('f', 'user.k', b'v')),
       ('acl-default', lambda: os.setxattr('.', 'system.posix_acl_default', acl)),
       ('acl-access', lambda: os.setxattr('f', 'system.posix_acl_access', acl)),
       ('capability', lambda: os.setxattr('f', 'security.capability', b'\\x01\\x00\\x00\\x02' + b'\\xff' * 16)),
       ('trusted', lambda: os.setxattr('f', 'trusted.k', b'v'))])
print(os.listxattr('host'), os.getxattr('host', 'user.host'))
probe([('read-trusted', lambda: os.getxattr('host', 'trusted.host'))])
""")
    assert out == ["user ok", "acl-default ENOTSUP", "acl-access ENOTSUP",
                   "capability EPERM", "trusted EPERM", "['user.host'] b'shared'",
                   "read-trusted ENODATA"], out
    assert os.listxattr(os.path.join(ws, "f")) == ["user.k"]
    assert os.listxattr(ws) == []
    assert os.getxattr(os.path.join(ws, "f"), "user.k") == b"v"


def test_workspace_root_keeps_its_mode(ws):
    """The directory's own mode is the host's: a block cannot make it 0777
    (every local user could then write there); what is inside is the
    block's."""
    out = run(ws, "os.mkdir('d')\nprobe([('root', lambda: os.chmod('.', 0o777)), "
                  "('sub', lambda: os.chmod('d', 0o777))])")
    assert out == ["root EPERM", "sub ok"], out
    assert stat.S_IMODE(os.stat(ws).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(ws, "d")).st_mode) == 0o777


def test_symlinks_stay_and_the_hosts_reader_stays_inside(ws):
    """Symlinks are kept (a venv is made of them) and, in the sandbox, lead
    where they point there. The host reads what a block left through
    forkbox_embed.Workspace, which resolves every name beneath the
    directory: a link out of it, a .. out of it are refused, not followed;
    a host tool gets the same reader (current_workspace)."""
    secret = tempfile.NamedTemporaryFile(prefix="forkbox-secret-", delete=False)
    secret.write(b"host secret")
    secret.close()
    tools = {"read": lambda name: forkbox_embed.current_workspace().read_text(name)}
    try:
        with forkbox_embed.Sandbox(tools, workspace=ws, forkbox=FORKBOX) as sb:
            r = sb.run(f"""
import os, sys, tools
os.makedirs('venv/bin')
os.symlink(sys.executable, 'venv/bin/python')
os.symlink({secret.name!r}, 'out')
os.symlink('../../' + {secret.name!r}, 'up')
open('data', 'w').write('mine')
os.symlink('data', 'in')
print(os.readlink('venv/bin/python') == sys.executable, os.path.exists('out'))
for name in ('in', 'out', 'up', 'venv/../data'):
    try:
        print(name, tools.read(name=name))
    except Exception as e:
        print(name, type(e).__name__, str(e).split(']')[0])
""", timeout=TIMEOUT)
            assert r.stdout.splitlines() == [
                "True False", "in mine", "out ToolError OSError: [Errno 18",
                "up ToolError OSError: [Errno 18", "venv/../data mine"], r.stdout + r.stderr
        assert os.readlink(os.path.join(ws, "out")) == secret.name
        with forkbox_embed.Workspace(ws) as files:
            assert files.read_text("in") == "mine"
            assert sorted(files.listdir()) == ["data", "in", "out", "up", "venv"]
            for name in ("out", "up", "../" + os.path.basename(ws) + "/data",
                         "venv/bin/python"):
                with pytest.raises(OSError) as e:
                    files.read_bytes(name)
                assert e.value.errno == errno.EXDEV, (name, e.value)
            with pytest.raises(OSError):
                files.open("/proc/self/fd/0")
    finally:
        os.unlink(secret.name)


def test_a_host_mount_inside_the_workspace_stays_the_hosts(ws):
    """A filesystem the host mounted on a directory inside the workspace is
    not reachable from the block (the workspace's server never crosses a
    mount)."""
    inner, loop = os.path.join(ws, "mnt"), os.path.join(ws, "loop")
    os.mkdir(inner)
    os.mkdir(loop)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "forkbox-test", inner], check=True)
    try:
        # and a bind of the workspace onto a name in it (a loop)
        subprocess.run(["mount", "--bind", ws, loop], check=True)
        with open(os.path.join(inner, "host-only"), "w") as f:
            f.write("x")
        out = run(ws, "probe([('list', lambda: os.listdir('mnt')), "
                      "('write', lambda: open('mnt/new', 'w').close()), "
                      "('loop', lambda: os.listdir('loop'))])")
        assert out == ["list EACCES", "write EACCES", "loop EACCES"], out
        assert os.listdir(inner) == ["host-only"]
    finally:
        subprocess.run(["umount", "-l", inner], check=True)
        subprocess.run(["umount", "-l", loop])


# --------------------------------------------------------------- the cap

def test_workspace_max_is_enospc(ws):
    """--workspace-max: what a block may add, charged as tmpfs charges it (a
    file's size in 4 KiB blocks, at least one; a block per directory or
    symlink); statvfs shows it as the filesystem's size; a write gets what
    fits, then ENOSPC, as do a truncate, a fallocate and a new file;
    removing files gives the room back. The host's files already there do
    not count."""
    with open(os.path.join(ws, "host-big"), "wb") as f:
        f.write(b"h" * (3 << 20))
    out = run(ws, """
st = os.statvfs('.')
print(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)
f = open('big', 'wb', buffering=0)
n = 0
try:
    while True:
        n += f.write(b'x' * 300000)
except OSError as e:
    print('wrote', n, errno.errorcode[e.errno])
f.close()
probe([('create', lambda: open('small', 'w').close()),
       ('truncate', lambda: os.truncate('big', 2 << 20)),
       ('fallocate', lambda: os.posix_fallocate(os.open('big', os.O_WRONLY), 0, 2 << 20)),
       ('mkdir', lambda: os.mkdir('d'))])
os.remove('big')
os.remove('host-big')
st = os.statvfs('.')
print(st.f_bavail * st.f_frsize)
open('after', 'wb').write(b'y' * (1 << 20))
print(os.path.getsize('after'))
""", "--workspace-max", "1M")
    assert out == ["1048576 1048576", "wrote 1048576 ENOSPC", "create ENOSPC", "truncate ENOSPC",
                   "fallocate ENOSPC", "mkdir ENOSPC", "1048576", "1048576"], out
    assert sorted(os.listdir(ws)) == ["after"]


def test_workspace_max_defaults_to_tmpfs_size(ws):
    out = run(ws, "st = os.statvfs('.')\nprint(st.f_blocks * st.f_frsize)", "--tmpfs-size", "64M")
    assert out == [str(64 << 20)], out
    r = subprocess.run([FORKBOX, "run", "--workspace", ws, "--workspace-max", "2M", "-"],
                       input="import os\nst = os.statvfs('.')\nprint(st.f_blocks * st.f_frsize)\n",
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert (r.returncode, r.stdout) == (0, f"{2 << 20}\n"), r.stderr


# ----------------------------------------------------------------- locks

def test_flock_and_fcntl_locks(ws):
    """flock (which the supervisor carries out, and refused with ENOLCK on the
    host's directory) and fcntl locks, record and OFD, conflict as they
    should between the block's open files; sqlite in the workspace works."""
    out = run(ws, """
import fcntl, sqlite3
a, b = open('lock', 'w'), open('lock', 'w')
probe([('flock-ex', lambda: fcntl.flock(a, fcntl.LOCK_EX)),
       ('flock-other', lambda: fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)),
       ('flock-un', lambda: fcntl.flock(a, fcntl.LOCK_UN)),
       ('flock-other-again', lambda: fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)),
       ('lockf', lambda: fcntl.lockf(a, fcntl.LOCK_EX | fcntl.LOCK_NB))])
import struct
def ofd(f, kind):
    fcntl.fcntl(f, 37, struct.pack('hhqqi4x', kind, 0, 0, 0, 0))  # F_OFD_SETLK
c, d = open('lock2', 'w'), open('lock2', 'w')
probe([('ofd', lambda: ofd(c, fcntl.F_WRLCK)), ('ofd-other', lambda: ofd(d, fcntl.F_WRLCK))])
db = sqlite3.connect('db.sqlite')
db.execute('create table t (x)')
db.execute('insert into t values (42)')
db.commit()
print(db.execute('select x from t').fetchall())
""")
    assert out == ["flock-ex ok", "flock-other EAGAIN", "flock-un ok", "flock-other-again ok",
                   "lockf ok", "ofd ok", "ofd-other EAGAIN", "[(42,)]"], out


def test_without_fuse_a_clear_refusal(ws, tmp_path):
    """No FUSE device (here a plain file over /dev/fuse, in a mount namespace
    of the test's own): forkbox sandbox refuses to start and says what is
    missing; forkbox run exits 125 with that reason."""
    not_fuse = tmp_path / "not-fuse"
    not_fuse.write_text("")
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        f"mount --bind {not_fuse} /dev/fuse && "
                        f"exec {FORKBOX} run --workspace {ws} -"],
                       input="print('ran')\n", capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 125 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.rstrip().endswith(
        f"workspace {ws} is served through FUSE, which needs /dev/fuse (the fuse module): "
        "not the FUSE device"), r.stderr
