"""The supervisor's snapshot check (src/proto/tarcheck.h) against CPython's
tarfile, which is what the host extracts the snapshot with.

Archives come from four places: tarfile itself (every format and member
kind), libarchive's form written out by hand, the sandbox's own writer
(archive_snapshot, through `tarcheck_tool -S`), and random and targeted byte
edits of all of those. Every one goes through the check (tarcheck_tool, in
two chunkings that must agree). Whenever the check accepts:

  * tarfile (mode "r:gz", as the host opens it) reads exactly the members
    the check reported, in order: name, type, size and mode; no link name,
    uid/gid 0, no owner names, no device numbers, no pax keys but path and
    mtime; every file's data reads in full;
  * extracting it as the reference host does (extractall, fully trusted,
    applying modes and, as root, ownership) makes only regular files and
    directories inside the destination, none setuid, setgid, sticky or
    writable by group or others, all owned by root; the "data" filter of
    newer Pythons raises nothing either.

And the attacks of issue 11 (a setuid-root member, world-writable modes,
links, devices, "..", absolute names, pax and GNU tricks, trailing data,
bombs) are each refused outright.

Runs as root (ownership is only applied by tarfile as root). Needs
TARCHECK_TOOL (meson sets it) or a build in ../../build.
"""
import gzip
import io
import os
import random
import stat
import struct
import subprocess
import tarfile
import tempfile
import zlib

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.environ.get("TARCHECK_TOOL") or os.path.join(HERE, "..", "..", "build", "tests",
                                                      "unit", "tarcheck_tool")


# ----------------------------------------------------------------- building
def lax_num(v, width):
    """libarchive's octal fields: 6 digits, ' ', NUL (11 digits, ' ' for 12)."""
    digits = 11 if width == 12 else 6
    s = b"%0*o " % (digits, v)
    return s + b"\0" * (width - len(s))


def set_checksum(h):
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)


def ustar(name, typ=b"0", mode=0o644, size=0, prefix=b"", mtime=1700000000, link=b""):
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = lax_num(mode, 8)
    h[108:116] = lax_num(0, 8)
    h[116:124] = lax_num(0, 8)
    h[124:136] = lax_num(size, 12)
    h[136:148] = lax_num(mtime, 12)
    h[156:157] = typ
    h[157:157 + len(link)] = link
    h[257:265] = b"ustar\x0000"
    h[329:337] = lax_num(0, 8)
    h[337:345] = lax_num(0, 8)
    h[345:345 + len(prefix)] = prefix
    set_checksum(h)
    return bytes(h)


def pad(data):
    return data + b"\0" * (-len(data) % 512)


def pax_rec(key, val):
    body = b" " + key + b"=" + val + b"\n"
    n = len(body) + 1
    while len(b"%d" % n) + len(body) != n:
        n += 1
    return b"%d" % n + body


def member(name, data=b"", mode=0o644, pax=None, typ=b"0", **kw):
    out = b""
    if pax is not None:
        out += ustar(b"PaxHeader/x", b"x", 0o644, len(pax)) + pad(pax)
    return out + ustar(name, typ, mode, len(data), **kw) + pad(data)


END = b"\0" * 1024


def gz(tar, level=6):
    return gzip.compress(tar, compresslevel=level, mtime=0)


def gz_zeros(head, n):
    """gzip of head + n zero bytes, without holding them."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [z.compress(head)]
    chunk = b"\0" * (1 << 20)
    while n:
        k = min(n, len(chunk))
        out.append(z.compress(chunk[:k]))
        n -= k
    out.append(z.flush())
    return b"".join(out)


def with_tarfile(members, fmt=tarfile.PAX_FORMAT):
    """members: (name, kind, mode, data, extra attrs) -> gzip tar by tarfile."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=fmt) as tf:
        for name, kind, mode, data, extra in members:
            ti = tarfile.TarInfo(name)
            ti.type = kind
            ti.mode = mode
            ti.mtime = extra.get("mtime", 1700000000)
            for k, v in extra.items():
                setattr(ti, k, v)
            if kind == tarfile.REGTYPE:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
            else:
                tf.addfile(ti)
    return buf.getvalue()


def reg(name, data=b"x", mode=0o644, **extra):
    return (name, tarfile.REGTYPE, mode, data, extra)


def dirm(name, mode=0o755, **extra):
    return (name, tarfile.DIRTYPE, mode, b"", extra)


def other(name, kind, **extra):
    return (name, kind, 0o644, b"", extra)


# ----------------------------------------------------------------- checking
def run_tool(archives, chunk=0, extra=()):
    """Check every archive; returns [(rc, reason, [members])]."""
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i, a in enumerate(archives):
            p = os.path.join(d, "%05d.tgz" % i)
            with open(p, "wb") as f:
                f.write(a)
            paths.append(p)
        out = []
        # A few thousand paths per run keep argv small.
        for k in range(0, len(paths), 2000):
            r = subprocess.run([TOOL, "-c", str(chunk), *extra, *paths[k:k + 2000]],
                               capture_output=True, check=True, timeout=600)
            members = []
            for line in r.stdout.split(b"\n"):
                if line.startswith(b"M "):
                    _, typ, mode, size, path = line.split(b" ", 4)
                    members.append((typ.decode(), int(mode, 8), int(size), bytes.fromhex(path.decode())))
                elif line.startswith(b"R "):
                    _, rc, why = line.split(b" ", 2)
                    out.append((int(rc), why.decode(), members))
                    members = []
    assert len(out) == len(archives)
    return out


def check_all(archives):
    """Verdicts in two chunkings (must agree); differential check of every
    accepted archive. Returns the verdicts."""
    one = run_tool(archives, 0)
    chunked = run_tool(archives, 5)
    for i, (a, b) in enumerate(zip(one, chunked)):
        assert a == b, "archive %d: chunking changed the verdict: %r vs %r" % (i, a[:2], b[:2])
    for a, (rc, why, members) in zip(archives, one):
        if rc == 0 and a:
            compare_with_tarfile(a, members)
    return one


# Extraction filters came with 3.11.4 (Debian's 3.11.2 has none: its
# extractall is the fully trusted one).
FILTERS = hasattr(tarfile, "data_filter")


def extractall(tf, dest, flt):
    if FILTERS:
        tf.extractall(dest, filter=flt)
    elif flt == "fully_trusted":
        tf.extractall(dest)


def compare_with_tarfile(data, members):
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
        got = tf.getmembers()
        assert len(got) == len(members), (len(got), len(members))
        for ti, (typ, mode, size, path) in zip(got, members):
            assert ti.name.encode("utf-8", "surrogateescape") == path, (ti.name, path)
            assert ti.type == (tarfile.REGTYPE if typ == "0" else tarfile.DIRTYPE), ti.type
            assert ti.mode == mode, (ti.name, oct(ti.mode), oct(mode))
            assert ti.size == size, (ti.name, ti.size, size)
            assert ti.linkname == "" and ti.uid == 0 and ti.gid == 0
            assert ti.uname == "" and ti.gname == "" and ti.devmajor == 0 and ti.devminor == 0
            assert set(ti.pax_headers) <= {"path", "mtime"}, ti.pax_headers
            assert ti.sparse is None
            if ti.isreg():
                assert len(tf.extractfile(ti).read()) == size
    with tempfile.TemporaryDirectory() as d:
        dest = os.path.join(d, "dest")
        os.mkdir(dest)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
            extractall(tf, dest, "fully_trusted")
        assert os.listdir(d) == ["dest"], "something was written beside dest"
        seen = set()
        for root, dirs, files in os.walk(dest):
            for n in dirs + files:
                p = os.path.join(root, n)
                st = os.lstat(p)
                assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode), (p, oct(st.st_mode))
                assert st.st_mode & 0o7022 == 0, (p, oct(st.st_mode))
                assert st.st_uid == 0 and st.st_gid == 0, (p, st.st_uid)
                seen.add(os.path.relpath(p, dest).encode("utf-8", "surrogateescape"))
        for typ, mode, size, path in members:
            assert path in seen, path
        dest2 = os.path.join(d, "data")
        os.mkdir(dest2)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
            extractall(tf, dest2, "data")


# ------------------------------------------------------------------ sources
def writer_archives(tmp):
    """Archives the sandbox's writer makes of odd trees."""
    out = []
    trees = {
        "plain": {"a.txt": (b"hello", 0o644), "b/c.txt": (b"", 0o600), "exec": (b"#!", 0o4755)},
        "odd": {"h\u00e9llo \u20ac.txt": (b"u", 0o666), "nl\nname": (b"n", 0o777),
                "x" * 150: (b"long", 0o644), ("d" * 100 + "/") * 3 + "f": (b"deep", 0o2755),
                "sp ace/tab\there": (b"t", 0o1777), "..dots/...": (b".", 0o644),
                "\U0001f600/\u00e9" * 20: (b"emoji", 0o700)},
        "empty": {},
        "big": {"big.bin": (os.urandom(300000), 0o644), "zeros": (b"\0" * 200000, 0o644)},
    }
    for name, files in trees.items():
        root = os.path.join(tmp, name)
        os.mkdir(root)
        for rel, (data, mode) in files.items():
            p = os.path.join(root, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(data)
            os.chmod(p, mode)
        outp = os.path.join(tmp, name + ".tgz")
        subprocess.run([TOOL, "-S", root, outp], check=True, capture_output=True)
        with open(outp, "rb") as f:
            out.append(f.read())
    return out


def libarchive_form():
    """Hand-built archives in the writer's form (all accepted)."""
    longp = b"d" * 120 + b"/" + b"f" * 110
    return [
        END,
        member(b"a.txt", b"hello\n") + member(b"b/c", b"") + member(b"exec.sh", b"#!\n", 0o755) + END,
        member(b"f" * 99, b"long", pax=pax_rec(b"path", longp) + pax_rec(b"mtime", b"1700000000.123456789")) + END,
        member(b"x", b"utf8", pax=pax_rec(b"path", "h\u00e9llo/\u20ac".encode())) + END,
        ustar(b"d/", b"5", 0o755) + ustar(b"d/e/", b"5", 0o755) + member(b"d/x", b"in a dir") + END,
        member(b"n" * 80, b"p", prefix=b"p" * 100) + END,
        member(b"future", b"f", pax=pax_rec(b"mtime", b"8589934591")) + END,
        member(b"a", b"a") + END + b"\0" * 9216,
    ]


def tarfile_sources():
    """Archives tarfile writes, in every format, of every member kind."""
    out = []
    sets = [
        [reg("a"), reg("b/c", b"data" * 100, 0o755)],
        [dirm("d"), reg("d/f"), dirm("d/g"), reg("e", b"", 0o644)],
        [reg("l" * 150), reg("m" * 90 + "/" + "n" * 90)],
        [reg("h\u00e9llo"), reg("\u20ac/\U0001f600")],
        [reg("f", mtime=1700000000.5)],
        [reg("f", mtime=2 ** 40)],
        [reg("f", mode=0o4755)],
        [reg("f", mode=0o666)],
        [reg("f", mode=0o600)],
        [reg("f", uid=1000)],
        [reg("f", uname="root")],
        [other("l", tarfile.SYMTYPE, linkname="/etc/passwd")],
        [reg("a"), other("h", tarfile.LNKTYPE, linkname="a")],
        [other("c", tarfile.CHRTYPE, devmajor=1, devminor=3)],
        [other("p", tarfile.FIFOTYPE)],
        [reg("../evil")],
        [reg("/abs")],
        [reg("b"), reg("a")],
        [reg("a"), reg("a")],
        [dirm("d", 0o777)],
        [reg("x" * 300)],
        [reg("a\nb")],
        [reg("sp ace", b"", 0o755)],
    ]
    for members in sets:
        for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
            try:
                out.append(with_tarfile(members, fmt))
            except ValueError:
                pass  # the format cannot hold it
    return out


# ----------------------------------------------------------------- mutation
INTERESTING = [0, 0x20, 0x2f, 0x2e, 0x30, 0x31, 0x35, 0x37, 0x78, 0x67, 0x4c, 0x4b, 0x80, 0xff,
               0x0a, 0x3d, 0x53, 0x7f, 0x32]


def fix_checksums(tar):
    """Recompute the checksum of every block that looks like a header."""
    b = bytearray(tar)
    for off in range(0, len(b) - 511, 512):
        if b[off + 257:off + 262] == b"ustar" or b[off + 148:off + 156].strip(b"\0 ").isdigit():
            set_checksum(memoryview(b)[off:off + 512])
    return bytes(b)


def mutate(tar, rnd):
    b = bytearray(tar)
    for _ in range(rnd.randint(1, 3)):
        if not b:
            break
        r = rnd.random()
        if r < 0.6:
            # A byte in some block's header area or pax records.
            blk = rnd.randrange(0, max(1, len(b) // 512)) * 512
            off = blk + rnd.choice([rnd.randrange(512), rnd.randrange(100), 156, 157,
                                    rnd.randrange(100, 160), rnd.randrange(257, 265),
                                    rnd.randrange(345, 512)])
            if off < len(b):
                b[off] = rnd.choice(INTERESTING) if rnd.random() < 0.7 else rnd.randrange(256)
        elif r < 0.75:
            # A numeric field rewritten in another spelling.
            blk = rnd.randrange(0, max(1, len(b) // 512)) * 512
            field = rnd.choice([(100, 8), (108, 8), (124, 12), (136, 12), (329, 8)])
            val = rnd.choice([b"0000644\0", b" 644\0\0\0\0", b"+644\0\0\0\0", b"0o644\0\0\0",
                              b"0_644\0\0\0", b"644 1\0\0\0", b"\x80\0\0\0\0\0\0\x01",
                              b"\xff" * 8, b"\0" * 8, b"4755 \0\0\0", b"0000000001 ",
                              b"00000001000 "])
            val = (val + b"\0" * 12)[:field[1]]
            b[blk + field[0]:blk + field[0] + field[1]] = val
        elif r < 0.85:
            # Splice a pax record into the first pax block, or a new one.
            rec = rnd.choice([pax_rec(b"size", b"5"), pax_rec(b"path", b"../x"),
                              pax_rec(b"linkpath", b"/etc"), pax_rec(b"hdrcharset", b"BINARY"),
                              pax_rec(b"uid", b"1"), pax_rec(b"mtime", b"1.5"),
                              pax_rec(b"path", b"a/b"), pax_rec(b"GNU.sparse.size", b"9"),
                              pax_rec(b"path", "\u00e9".encode())])
            blk = rnd.randrange(0, max(1, len(b) // 512)) * 512
            b[blk:blk] = ustar(b"PaxHeader/y", b"x", 0o644, len(rec)) + pad(rec)
        elif r < 0.95:
            # Truncate or extend.
            if rnd.random() < 0.5:
                del b[rnd.randrange(len(b)):]
            else:
                b += bytes(rnd.choice([b"\0", b"x"]) * rnd.randrange(1, 2000))
        else:
            # Duplicate a block range.
            s = rnd.randrange(0, max(1, len(b) // 512)) * 512
            b[s:s] = b[s:s + 512 * rnd.randint(1, 3)]
    out = bytes(b)
    return fix_checksums(out) if rnd.random() < 0.9 else out


def gz_variants(tar, rnd):
    """The tar in gzip shapes: one member, split members, and near misses."""
    yield gz(tar)
    if len(tar) > 2:
        cut = rnd.randrange(1, len(tar))
        yield gz(tar[:cut], 1) + gz(tar[cut:], 9)
    kind = rnd.randrange(6)
    g = bytearray(gz(tar))
    if kind == 0:
        yield bytes(g[:3]) + b"\x08" + bytes(g[4:10]) + b"name\0" + bytes(g[10:])  # FNAME
    elif kind == 1:
        yield bytes(g) + b"\0\0"
    elif kind == 2:
        yield bytes(g) + gz(b"")
    elif kind == 3:
        g[-5] ^= 0x40
        yield bytes(g)
    elif kind == 4:
        yield bytes(g[:rnd.randrange(len(g))])
    else:
        z = zlib.compressobj(6, zlib.DEFLATED, -15)
        raw = z.compress(tar) + z.flush()
        yield (b"\x1f\x8b\x08\x00\0\0\0\0\0\xff" + raw +
               struct.pack("<II", zlib.crc32(tar), len(tar) & 0xffffffff))


# -------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def tmp():
    with tempfile.TemporaryDirectory() as d:
        yield d


def test_tool_present():
    assert os.access(TOOL, os.X_OK), "build tarcheck_tool first (meson sets TARCHECK_TOOL)"


def test_writer_output_accepted_and_read_alike(tmp):
    archives = writer_archives(tmp)
    verdicts = check_all(archives)
    for i, (rc, why, members) in enumerate(verdicts):
        assert rc == 0, "writer archive %d refused: %s" % (i, why)
    names = {m[3] for m in verdicts[1][2]}
    assert "h\u00e9llo \u20ac.txt".encode() in names and b"nl\nname" in names
    modes = {m[3]: m[1] for v in verdicts for m in v[2]}
    assert modes[b"exec"] == 0o755 and modes["h\u00e9llo \u20ac.txt".encode()] == 0o644


def test_libarchive_form_accepted():
    archives = [gz(t) for t in libarchive_form()]
    for rc, why, _ in check_all(archives):
        assert rc == 0, why


def test_tarfile_archives():
    """tarfile's own archives: the plain ones pass (and read alike), the
    dangerous ones do not."""
    archives = tarfile_sources()
    verdicts = check_all(archives)
    accepted = sum(1 for rc, _, _ in verdicts if rc == 0)
    assert accepted >= 10, "only %d of tarfile's archives accepted" % accepted
    assert accepted < len(archives)


ATTACKS = {
    "setuid root": with_tarfile([reg("suid", b"\x7fELF", 0o4755, uid=0, uname="root")]),
    "setgid": with_tarfile([reg("sgid", b"x", 0o2755)]),
    "world-writable": with_tarfile([reg("ww", b"x", 0o666)]),
    "world-writable dir": with_tarfile([dirm("d", 0o777)]),
    "symlink": with_tarfile([other("l", tarfile.SYMTYPE, linkname="/etc/passwd")]),
    "hardlink": with_tarfile([reg("a"), other("h", tarfile.LNKTYPE, linkname="/etc/shadow")]),
    "char device": with_tarfile([other("mem", tarfile.CHRTYPE, devmajor=1, devminor=1)]),
    "fifo": with_tarfile([other("p", tarfile.FIFOTYPE)]),
    "dotdot": with_tarfile([reg("../../etc/cron.d/x")]),
    "absolute": with_tarfile([reg("/etc/cron.d/x")]),
    "owner 1000": with_tarfile([reg("f", uid=1000, gid=1000)]),
    "gnu longname": with_tarfile([reg("g" * 200)], tarfile.GNU_FORMAT),
    "pax size record": gz(member(b"a", b"x", pax=pax_rec(b"size", b"0")) + member(b"b") + END),
    "pax path dotdot": gz(member(b"a", b"x", pax=pax_rec(b"path", b"../x")) + END),
    "pax hdrcharset": gz(member(b"a", b"x", pax=pax_rec(b"hdrcharset", b"BINARY")) + END),
    "global header": gz(ustar(b"g", b"g", size=len(pax_rec(b"path", b"x"))) +
                        pad(pax_rec(b"path", b"x")) + member(b"a") + END),
    "base-256 size": gz(bytes(bytearray(member(b"a", b"x")[:124]) + b"\x80" + b"\0" * 10 + b"\x01" +
                              member(b"a", b"x")[136:]) + END),
    "trailing garbage": gz(member(b"a") + END) + b"\x1f\x8b garbage",
    "second member after the end": gz(member(b"a") + END) + gz(member(b"b", b"x", 0o4755) + END),
    "bad crc": gz(member(b"a") + END)[:-8] + b"\0" * 8,
    "bomb after the end": gz_zeros(member(b"a") + END, 256 << 20),
    "bomb in a member": gz_zeros(ustar(b"a", b"0", 0o644, 200 << 20), 200 << 20),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_refused(name):
    (rc, why, _), = run_tool([ATTACKS[name]])
    assert rc < 0, "%s accepted" % name


def test_setuid_attack_is_real(tmp):
    """Without the check, the host's extraction (as root) makes the setuid
    root file of issue 11."""
    dest = os.path.join(tmp, "reference")
    os.mkdir(dest)
    with tarfile.open(fileobj=io.BytesIO(ATTACKS["setuid root"]), mode="r:gz") as tf:
        extractall(tf, dest, "fully_trusted")
    st = os.lstat(os.path.join(dest, "suid"))
    assert st.st_mode & stat.S_ISUID and st.st_uid == 0


def test_random_mutations(tmp):
    """Random edits of valid archives of every source: whatever the check
    accepts, tarfile reads alike and extracts harmlessly."""
    rnd = random.Random(11)
    bases = list(libarchive_form())
    os.makedirs(os.path.join(tmp, "m"))
    for a in writer_archives(os.path.join(tmp, "m")):
        bases.append(gzip.decompress(a))
    for a in tarfile_sources():
        bases.append(gzip.decompress(a))
    archives, mutated = [], []
    for _ in range(1500):
        t = rnd.choice(bases)
        edited = rnd.random() < 0.75
        if edited:
            t = mutate(t, rnd)
        for a in gz_variants(t, rnd):
            archives.append(a)
            mutated.append(edited)
    verdicts = check_all(archives)
    accepted = sum(1 for rc, _, _ in verdicts if rc == 0)
    accepted_edited = sum(1 for (rc, _, _), e in zip(verdicts, mutated) if rc == 0 and e)
    print("%d archives: %d accepted (%d of them edited), %d refused"
          % (len(verdicts), accepted, accepted_edited, len(verdicts) - accepted))
    # Not vacuous: many accepted, edited ones among them, and many refused.
    assert accepted >= 200 and accepted_edited >= 40 and len(verdicts) - accepted >= 1000
