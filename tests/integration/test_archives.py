"""Archives in both directions (§4, §9.1 item 19, §9.2 archive hardening):
hostile members are skipped, limits end the turn, bombs are stopped."""

import asyncio
import hashlib
import io
import os
import tarfile
import uuid

import pytest

from fbtest import arun, connect, expect_closed, fc

T = 30

LIST_WS = r'''
import os, json
out = []
for root, dirs, files in os.walk('.'):
    for n in dirs + files:
        p = os.path.join(root, n)[2:]
        st = os.lstat(p)
        kind = 'l' if os.path.islink(p) else 'd' if os.path.isdir(p) else 'f' if os.path.isfile(p) else 'o'
        out.append([p, kind, st.st_mode & 0o7777])
print(json.dumps(sorted(out)))
'''


def member(name, type_=tarfile.REGTYPE, data=b"", mode=0o644, linkname=""):
    ti = tarfile.TarInfo(name)
    ti.type = type_
    ti.mode = mode
    ti.linkname = linkname
    if type_ in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        ti.devmajor, ti.devminor = 1, 3
    if type_ in (tarfile.REGTYPE, tarfile.AREGTYPE):
        ti.size = len(data)
        return (ti, data)
    return (ti, None)


def tar_of(members, fmt=tarfile.PAX_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=fmt) as tf:
        for ti, data in members:
            tf.addfile(ti, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


async def block(daemon, code, workspace=None, tools_bytes=None, **kw):
    turn = await connect(daemon, tools_bytes=tools_bytes, **kw)
    try:
        return await turn.run(code, workspace=workspace)
    finally:
        await turn.shutdown()


def test_hostile_workspace_members_are_skipped(daemon):
    """§9.1.19 / §4.2: links, devices, fifos, absolute and .. paths are skipped
    without error; good members (normalised) are extracted; setuid is masked."""
    tag = uuid.uuid4().hex[:8]
    evil = [f"/tmp/fb_abs_{tag}.txt", f"../fb_up_{tag}.txt", f"a/../../fb_up2_{tag}.txt",
            f"sub/../../../fb_up3_{tag}.txt"]
    members = [member(n, data=b"evil") for n in evil] + [
        member("sl", tarfile.SYMTYPE, linkname="/etc"),
        member(f"sl/fb_through_{tag}", data=b"evil"),
        member("hl", tarfile.LNKTYPE, linkname="/etc/passwd"),
        member("ok.txt", data=b"ok", mode=0o6755),
        member("hl2", tarfile.LNKTYPE, linkname="ok.txt"),
        member("chr", tarfile.CHRTYPE),
        member("blk", tarfile.BLKTYPE),
        member("fifo", tarfile.FIFOTYPE),
        member("dir", tarfile.DIRTYPE, mode=0o755),
        member("dir/sub.txt", data=b"sub"),
        member("x/./y//z.txt", data=b"z"),
        member("p/../q.txt", data=b"q"),
        member("./dot.txt", data=b"dot"),
    ]
    check = LIST_WS + "\n" + f"print([os.path.exists(p) for p in {['/' + e.split('/')[-1] for e in evil[1:]] + [evil[0], f'/etc/fb_through_{tag}']!r}])"
    r = arun(block(daemon, check, workspace=tar_of(members)), T)
    assert r.exit_code == 0, r.stderr
    listing_line, exists_line = r.stdout.splitlines()
    import json
    listing = {p: (k, m) for p, k, m in json.loads(listing_line)}
    files = {p for p, (k, _) in listing.items() if k == "f"}
    # the symlink "sl" is dropped, so "sl/fb_through_*" lands in a real directory inside
    assert files == {"ok.txt", "dir/sub.txt", "x/y/z.txt", "q.txt", "dot.txt",
                     f"sl/fb_through_{tag}"}, listing
    assert not any(k in ("l", "o") for k, _ in listing.values()), listing
    assert listing["ok.txt"][1] & 0o6000 == 0, oct(listing["ok.txt"][1])
    assert exists_line == str([False] * 5)
    assert set(r.files) == files
    assert not os.path.exists(f"/tmp/fb_abs_{tag}.txt")
    for e in evil[1:]:
        assert not os.path.exists("/" + e.split("/")[-1])


def test_file_through_symlink_on_disk_is_skipped(daemon):
    """§4.2 step 5: a member whose path resolves outside through a symlink the
    user created in an earlier block is skipped."""
    tag = uuid.uuid4().hex[:8]

    async def go():
        turn = await connect(daemon)
        r1 = await turn.run("import os\nos.symlink('/tmp', 'lnk')\nos.makedirs('/tmp/d', exist_ok=True)\n"
                            "os.symlink('/tmp/d', 'dl')")
        ws = fc.make_tar({f"lnk/fb_thru_{tag}.txt": "evil", f"dl/fb_thru2_{tag}.txt": "evil",
                          "fine.txt": "fine"})
        r2 = await turn.run(f"import os\nprint(os.path.exists('/tmp/fb_thru_{tag}.txt'), "
                            f"os.path.exists('/tmp/d/fb_thru2_{tag}.txt'), os.path.islink('lnk'), "
                            "open('fine.txt').read())", workspace=ws)
        await turn.shutdown()
        return r1, r2
    r1, r2 = arun(go(), T)
    assert r1.exit_code == 0, r1.stderr
    assert r2.stdout == "False False True fine\n", r2.stderr
    assert set(r2.files) == {"fine.txt"}
    assert not os.path.exists(f"/tmp/fb_thru_{tag}.txt")


def test_tar_dialects_and_old_style_dirs(daemon):
    """§4.1: pax (with x headers), GNU long names and ustar are all read."""
    long = "long/" + "n" * 150 + ".txt"
    gnu = tar_of([member(long, data=b"gnu")], fmt=tarfile.GNU_FORMAT)
    pax = tar_of([member("p/" + "q" * 120 + ".txt", data=b"pax"), member("ü.txt", data=b"u")])
    ustar = tar_of([member("u.txt", data=b"ustar")], fmt=tarfile.USTAR_FORMAT)

    async def go():
        turn = await connect(daemon)
        out = []
        for ws in (gnu, pax, ustar):
            out.append(await turn.run("pass", workspace=ws))
        await turn.shutdown()
        return out
    r1, r2, r3 = arun(go(), T)
    assert r1.files == {long: b"gnu"}
    assert r2.files == {long: b"gnu", "p/" + "q" * 120 + ".txt": b"pax", "ü.txt": b"u"}
    assert r3.files.get("u.txt") == b"ustar"


def test_hostile_tools_members_are_skipped(daemon):
    """The tools archive goes through the same filter; the package still imports."""
    tag = uuid.uuid4().hex[:8]
    files = fc.render_tools_files(fc.ToolRegistry({"echo": lambda message: message}).tools.values())
    members = [member(n, data=s.encode()) for n, s in files.items()] + [
        member(f"../fb_tools_up_{tag}.py", data=b"x = 1"),
        member(f"/tmp/fb_tools_abs_{tag}.py", data=b"x = 1"),
        member("lnk.py", tarfile.SYMTYPE, linkname="/etc/passwd"),
    ]
    code = (f"import os\nfrom tools import echo\nprint(echo(message='hi'), "
            f"os.path.exists('/fb_tools_up_{tag}.py'), os.path.exists('/tmp/fb_tools_abs_{tag}.py'), "
            "os.path.lexists('/tools/lnk.py'))")
    r = arun(block(daemon, code, tools_bytes=tar_of(members),
                   tools=fc.ToolRegistry({"echo": lambda message: message})), T)
    assert r.stdout == "hi False False False\n", r.stderr


def sized_archive(target: int, seed: bytes) -> bytes:
    """A valid gzip tar of exactly `target` bytes: incompressible content gets
    close below the target, the gzip header's file-name field makes up the rest."""
    import gzip
    n = target - 700
    while n > 0:
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
            ti = tarfile.TarInfo("r.bin")
            ti.size = n
            tf.addfile(ti, io.BytesIO(seed[:n]))

        def gz(fname):
            buf = io.BytesIO()
            with gzip.GzipFile(filename=fname, mode="wb", fileobj=buf, mtime=0) as g:
                g.write(raw.getvalue())
            return buf.getvalue()
        pad = target - len(gz(""))
        if pad >= 2:
            data = gz("a" * (pad - 1))      # the name plus its NUL
            assert len(data) == target, (len(data), target)
            return data
        n -= 500
    raise AssertionError(f"could not build an archive of {target} bytes")


def test_workspace_limit_is_exact(make_daemon):
    """§4.5: a workspace archive exactly at the limit is accepted; one byte
    over ends the turn (no done)."""
    seed = os.urandom(64 * 1024)
    limit = 40_000
    at = sized_archive(limit, seed)
    over = sized_archive(limit + 1, seed)
    d = make_daemon(["--max-upload-workspace", str(limit)])
    r = arun(block(d, "import os\nprint(os.path.getsize('r.bin'))", workspace=at), T)
    assert r.exit_code == 0, r.stderr
    assert int(r.stdout) > 30_000

    async def go():
        turn = await connect(d)
        await turn.ws.send(over)
        await turn.ws.send(fc.encode_frame({"kind": "run", "code": "print('ran')"}))
        return await expect_closed(turn.ws, 10)
    code, reason, msgs = arun(go(), T)
    # refused at the frame header (net/ws_in.c), before its bytes arrive
    assert (code, reason) == (
        1009, f"message too large: {len(over)} bytes announced, the limit here is {limit}")
    assert not any('"done"' in m for m in msgs if isinstance(m, str))


def test_tools_limit_from_env(make_daemon):
    """ADK_CODE_MODE_MAX_UPLOAD_TOOLS: a tools archive over it ends the turn."""
    d = make_daemon(env={"ADK_CODE_MODE_MAX_UPLOAD_TOOLS": "2000"})
    big = fc.make_tar({"__init__.py": "# x\n", "blob.py": "x = %r\n" % os.urandom(6000).hex()})
    assert len(big) > 2000

    async def go():
        turn = await connect(d, tools_bytes=big)
        return await expect_closed(turn.ws, 10)
    code, reason, msgs = arun(go(), T)
    assert (code, reason) == (
        1009, f"message too large: {len(big)} bytes announced, the limit here is 2000")
    assert not any('"ready"' in m for m in msgs if isinstance(m, str))
    # and a small one still works on the same daemon
    r = arun(block(d, "from tools import echo\nprint(echo(message=1))"), T)
    assert r.stdout == "{'echoed': 1}\n"


@pytest.mark.parametrize("which", ["workspace", "tools"])
def test_gzip_bomb_ends_turn(make_daemon, which):
    """§9.2: decompressed bytes are capped (--max-unpacked): a small archive that
    inflates to 64 MiB ends the turn; the daemon keeps serving."""
    d = make_daemon(["--max-unpacked", "1M"])
    bomb = fc.make_tar({"__init__.py": "", "zeros.bin": b"\0" * (64 << 20)})
    assert len(bomb) < 200_000

    async def go():
        if which == "tools":
            turn = await connect(d, tools_bytes=bomb)
        else:
            turn = await connect(d)
            await turn.ws.send(bomb)
            await turn.ws.send(fc.encode_frame({"kind": "run", "code": "print('ran')"}))
        return await expect_closed(turn.ws, 15)
    code, reason, msgs = arun(go(), 30)
    # the archive and `run` arrive back to back, as the host sends them: the
    # runtime's report comes while the block counts as running, and is kept
    assert (code, reason) == (1011, f"the {which} archive could not be extracted")
    assert not any('"done"' in m for m in msgs if isinstance(m, str))
    r = arun(block(d, "print('still serving')"), T)
    assert r.stdout == "still serving\n"


def test_member_count_cap_ends_turn(make_daemon):
    """§9.2: --max-members caps members per archive."""
    d = make_daemon(["--max-members", "50"])
    many = fc.make_tar({f"f{i}.txt": "x" for i in range(500)})

    async def go():
        turn = await connect(d)
        await turn.ws.send(many)
        await turn.ws.send(fc.encode_frame({"kind": "run", "code": "print('ran')"}))
        return await expect_closed(turn.ws, 15)
    code, reason, msgs = arun(go(), 30)
    assert (code, reason) == (1011, "the workspace archive could not be extracted")
    assert not any('"done"' in m for m in msgs if isinstance(m, str))
    r = arun(block(d, "print('still serving')", workspace=fc.make_tar({"a": "1", "b": "2"})), T)
    assert r.stdout == "still serving\n"


@pytest.mark.parametrize("payload", [b"not a gzip stream at all",
                                     b"\x1f\x8b\x08\x00" + b"\xff" * 64,
                                     "plain-tar"], ids=["garbage", "corrupt-gzip", "plain-tar"])
@pytest.mark.parametrize("which", ["tools", "workspace"])
def test_unreadable_archive_ends_turn(daemon, payload, which):
    """§2.3: an unreadable tools or workspace archive ends the turn (gzip only, §4.1)."""
    if payload == "plain-tar":
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            ti = tarfile.TarInfo("a.txt")
            ti.size = 1
            tf.addfile(ti, io.BytesIO(b"a"))
        payload = buf.getvalue()

    async def go():
        if which == "tools":
            turn = await connect(daemon, tools_bytes=payload)
        else:
            turn = await connect(daemon)
            await turn.ws.send(payload)
            await turn.ws.send(fc.encode_frame({"kind": "run", "code": "print('ran')"}))
        return await expect_closed(turn.ws, 10)
    code, reason, msgs = arun(go(), T)
    assert (code, reason) == (1011, f"the {which} archive could not be extracted")
    assert not any('"done"' in m for m in msgs if isinstance(m, str))
    for m in msgs:
        if isinstance(m, str) and '"log"' in m:
            assert fc.decode_frame(m)["level"] == "error"


def test_large_workspace_round_trip(daemon):
    """A 12 MiB (incompressible) upload is extracted and comes back in the snapshot."""
    data = os.urandom(12 << 20)
    r = arun(block(daemon, "import hashlib\nprint(hashlib.sha256(open('big.bin','rb').read()).hexdigest())",
                   workspace=fc.make_tar({"big.bin": data})), 60)
    import hashlib
    assert r.stdout.strip() == hashlib.sha256(data).hexdigest(), r.stderr
    assert r.files["big.bin"] == data


def test_returned_archive_is_host_readable(daemon):
    """§4.3/§4.4: the snapshot extracts with the host's filter into an
    authoritative local copy (member names relative, no directories needed)."""
    import tempfile
    r = arun(block(daemon, "import os\nos.makedirs('a/b', exist_ok=True)\nopen('a/b/c.txt','w').write('c')\n"
                           "open('top.txt','w').write('t')"), T)
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "stale.txt"), "w").write("old")
        fc.replace_dir_from_tar(r.archive, tmp)
        got = sorted(os.path.relpath(os.path.join(root, f), tmp)
                     for root, _, fs in os.walk(tmp) for f in fs)
    assert got == ["a/b/c.txt", "top.txt"]
    for m, _ in fc.read_tar(r.archive):
        assert m.isreg() and not m.name.startswith(("/", "./"))


ODD_WORKSPACE = r'''
import locale, os
locale.setlocale(locale.LC_ALL, 'C')  # user code may change the process locale
def w(p, mode=0o644, data=b'x'):
    d = os.path.dirname(p)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(p, 'wb') as f:
        f.write(data)
    os.chmod(p, mode)
w('world-writable', 0o666); w('all-bits', 0o777); w('setuid', 0o4755); w('private', 0o600)
w('h\u00e9llo \u20ac.txt'); w('l' * 200); w('/'.join(['d' * 100] * 5) + '/f')
w('nl\nname'); w(b'bad\xff'.decode('utf-8', 'surrogateescape'))
w('neg'); os.utime('neg', (0, -100))
w('far'); os.utime('far', (0, 2 ** 34))
'''


def test_snapshot_passes_the_supervisor_check(daemon):
    """The real sandbox's snapshot of odd files (modes 0666/0777/04755/0600,
    non-ASCII, long and deep names, a newline, a name that is not UTF-8,
    times before 1970 and past 2242, user code in the C locale) is in the
    subset the supervisor accepts (src/proto/tarcheck.h): checked with
    tarcheck_tool from the same build, and read by tarfile as expected."""
    import subprocess
    import tempfile
    from fbtest import FORKBOXD
    # <build>/src/forkboxd -> <build>/tests/unit/tarcheck_tool
    tool = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(FORKBOXD))),
                        "tests", "unit", "tarcheck_tool")
    r = arun(block(daemon, ODD_WORKSPACE), T)
    assert r.exit_code == 0, r.stderr
    with tempfile.NamedTemporaryFile(suffix=".tgz") as f:
        f.write(r.archive)
        f.flush()
        out = subprocess.run([tool, "-c", "3", f.name], capture_output=True, text=True,
                             check=True).stdout
    assert "R 0 ok" in out, out
    members = {m.name: m for m, _ in fc.read_tar(r.archive)}
    assert "bad\udcff" not in members  # not UTF-8: skipped, and said so
    assert "[forkbox: 1 file(s) or directories left out of the workspace snapshot: names" in r.stderr
    assert {"h\u00e9llo \u20ac.txt", "l" * 200, "/".join(["d" * 100] * 5) + "/f",
            "nl\nname"} <= set(members)
    assert members["world-writable"].mode == 0o644
    assert members["all-bits"].mode == 0o755 and members["setuid"].mode == 0o755
    assert members["private"].mode == 0o644
    assert members["neg"].mtime == 0 and members["far"].mtime == 8 ** 11 - 1
    for m in members.values():
        assert m.uid == 0 and m.gid == 0 and not m.uname and set(m.pax_headers) <= {"path", "mtime"}


# --------------------------------------------------------------------------
# incremental snapshots (issue 13): one gzip member per file, reused while
# the file is unchanged, in the sandbox and in the supervisor's check

INCR_SETUP = r'''
import os, random, time
r = random.Random(1)
os.makedirs("sub", exist_ok=True)
open("a.txt", "w").write("alpha\n" * 1000)
open("b.txt", "w").write("bravo")
open("c.sh", "w").write("#!/bin/sh\necho hi\n")
os.chmod("c.sh", 0o755)
open("rnd.bin", "wb").write(bytes(r.getrandbits(8) for _ in range(200000)))
open("sub/d.txt", "w").write("delta")
open("gone.txt", "w").write("to be deleted")
time.sleep(0.05)  # past the clock tick of the writes: the members may be kept
'''

INCR_CHANGE = r'''
import os, time
open("a.txt", "r+").write("ALPHA\n")        # same size, in place
os.rename("b.txt", "b2.txt")                # renamed
open("sub/new.tmp", "w").write("DELTA!")
os.replace("sub/new.tmp", "sub/d.txt")      # replaced
os.chmod("c.sh", 0o644)                     # chmod'ed
os.remove("gone.txt")                       # deleted
time.sleep(0.05)
'''


def fb_members(data):
    """The gzip members of a snapshot, by the FB length in each header
    (src/proto/tarcheck.h: XLEN 40, the length, then the SHA-256 of the
    member's bytes after its 52-byte header, zeros for a stored one); fails
    on anything else."""
    out, off = [], 0
    while off < len(data):
        h = data[off:off + 52]
        assert h[:4] == b"\x1f\x8b\x08\x04" and h[10:16] == b"\x28\x00FB\x24\x00", h
        n = int.from_bytes(h[16:20], "little")
        assert 52 < n <= len(data) - off
        body = data[off + 52:off + n]
        assert h[20:52] in (hashlib.sha256(body).digest(), bytes(32)), "FB digest"
        out.append(data[off:off + n])
        off += n
    return out


def libarchive_files(data):
    """Members and data as libarchive (the C library the reference's other
    readers use) reads the archive, through ctypes."""
    import ctypes
    import ctypes.util
    la = ctypes.CDLL(ctypes.util.find_library("archive") or "libarchive.so.13")
    la.archive_read_new.restype = ctypes.c_void_p
    la.archive_entry_pathname.restype = ctypes.c_char_p
    la.archive_entry_pathname.argtypes = [ctypes.c_void_p]
    la.archive_entry_perm.argtypes = [ctypes.c_void_p]
    la.archive_read_data.restype = ctypes.c_ssize_t
    la.archive_read_data.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    for f in ("archive_read_support_filter_gzip", "archive_read_support_format_tar",
              "archive_read_free"):
        getattr(la, f).argtypes = [ctypes.c_void_p]
    la.archive_read_open_memory.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    la.archive_read_next_header.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    a = la.archive_read_new()
    la.archive_read_support_filter_gzip(a)
    la.archive_read_support_format_tar(a)
    assert la.archive_read_open_memory(a, data, len(data)) == 0
    files, e, buf = {}, ctypes.c_void_p(), ctypes.create_string_buffer(65536)
    while (r := la.archive_read_next_header(a, ctypes.byref(e))) == 0:
        name = la.archive_entry_pathname(e).decode()
        mode = la.archive_entry_perm(e)
        body = b""
        while (n := la.archive_read_data(a, buf, len(buf))) > 0:
            body += buf.raw[:n]
        assert n == 0
        files[name] = (mode, body)
    la.archive_read_free(a)
    assert r == 1  # ARCHIVE_EOF
    return files


def tar_modes(data):
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
        return {m.name: (m.mode, tf.extractfile(m).read()) for m in tf.getmembers()}


async def check_hits(d, n):
    """The supervisor's debug line for the n-th snapshot it checked (its
    stderr is read by a thread: wait for it, at most 10 s)."""
    for _ in range(200):
        lines = [ln for ln in d.stderr().splitlines() if "verified earlier in the turn" in ln]
        if len(lines) >= n:
            return lines[n - 1]
        await asyncio.sleep(0.05)
    raise AssertionError(d.stderr()[-2000:])


def test_snapshot_members_reused_and_changes_seen(make_daemon):
    """An unchanged workspace's next snapshot is the same bytes, one FB gzip
    member per file, each reused (the supervisor inflates none of the
    compressed ones again); random data is stored; a file modified in place, renamed,
    replaced, chmod'ed or deleted is right in the next snapshot, as Python's
    tarfile and libarchive read it."""
    d = make_daemon(["--log-level", "debug"])

    async def go():
        turn = await connect(d)
        try:
            r1 = await turn.run(INCR_SETUP)
            r2 = await turn.run("pass")
            line2 = await check_hits(d, 2)
            r3 = await turn.run(INCR_CHANGE)
            r4 = await turn.run("pass")
            line4 = await check_hits(d, 4)
            return r1, r2, line2, r3, r4, line4
        finally:
            await turn.shutdown()

    r1, r2, line2, r3, r4, line4 = arun(go(), T)
    for r in (r1, r2, r3, r4):
        assert r.exit_code == 0, r.stderr
    m1 = fb_members(r1.archive)
    assert len(m1) == 7  # six files, then the end blocks
    assert r2.archive == r1.archive
    # all but rnd.bin, whose stored blocks are cheaper to inflate than to hash
    assert "snapshot of 6 members, 5 of them verified earlier" in line2, line2
    big = max(m1, key=len)
    assert len(big) > 200000  # rnd.bin: stored blocks, not level 1 on random bytes
    want = {"a.txt": (0o644, b"alpha\n" * 1000), "b.txt": (0o644, b"bravo"),
            "c.sh": (0o755, b"#!/bin/sh\necho hi\n"), "sub/d.txt": (0o644, b"delta"),
            "gone.txt": (0o644, b"to be deleted")}
    for reader in (tar_modes, libarchive_files):
        got = reader(r1.archive)
        assert len(got["rnd.bin"][1]) == 200000
        del got["rnd.bin"]
        assert got == want, reader

    want3 = {"a.txt": (0o644, b"ALPHA\n" + b"alpha\n" * 999), "b2.txt": (0o644, b"bravo"),
             "c.sh": (0o644, b"#!/bin/sh\necho hi\n"), "sub/d.txt": (0o644, b"DELTA!")}
    for reader in (tar_modes, libarchive_files):
        got = reader(r3.archive)
        rnd = got.pop("rnd.bin")
        assert rnd == reader(r1.archive)["rnd.bin"]
        assert got == want3, reader
    assert r3.files["a.txt"].startswith(b"ALPHA\n") and "gone.txt" not in r3.files
    assert r4.archive == r3.archive
    assert "snapshot of 5 members, 4 of them verified earlier" in line4, line4


MMAP_1 = r'''
import mmap, time
f = open("m.dat", "w+b")
f.write(b"0123456789abcdef" * 256)
f.flush()
m = mmap.mmap(f.fileno(), 4096)
m[0:1] = b"X"   # the first write through the map moves mtime
time.sleep(0.05)
'''
MMAP_2 = r'''
m[1:2] = b"Y"   # the page is mapped writable already: no new mtime or ctime
'''


def test_snapshot_sees_writes_through_a_map(daemon):
    """A file mapped shared and writable can change without its times: its
    member is never reused while it is mapped."""
    async def go():
        turn = await connect(daemon)
        try:
            a = await turn.run(MMAP_1)
            b = await turn.run(MMAP_2)
            c = await turn.run("m.close(); f.close()")
            return a, b, c
        finally:
            await turn.shutdown()

    a, b, c = arun(go(), T)
    assert a.exit_code == 0 and b.exit_code == 0 and c.exit_code == 0, (a.stderr, b.stderr)
    assert a.files["m.dat"][:4] == b"X123"
    assert b.files["m.dat"][:4] == b"XY23"
    assert c.files["m.dat"][:4] == b"XY23"
