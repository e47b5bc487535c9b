#!/usr/bin/env python3
"""Write the seed corpora under fuzz/corpus/<target>/.

The seeds are committed; this script documents how they were made and
rebuilds them (`fuzz/gen-seeds.py`, idempotent). Each target's input format
is described at the top of fuzz/fuzz-<target>.c. Keep seeds small: libFuzzer
mutates small inputs best, and the replay tests run every one of them.
"""
import gzip
import io
import os
import struct
import sys
import tarfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# --------------------------------------------------------------------- frame
FRAMES = {
    "run": '{"kind":"run","code":"print(1)\\n"}',
    "run-ws": ' { "code" : "x = [1, 2]" , "kind" : "run" } \r\n',
    "tool-result": '{"kind":"tool_result","id":"c1","ok":true,"value":{"a":[1,2.5e3,null]},"error":null}',
    "tool-result-err": '{"kind":"tool_result","id":"c2","ok":false,"value":null,"error":{"type":"E","msg":"no"}}',
    "shutdown": '{"kind":"shutdown"}',
    "ready": '{"kind":"ready","protocol_version":2,"python_version":"3.11.2","packages":{"numpy":"1.26"}}',
    "tool-call": '{"kind":"tool_call","id":"c1","name":"search","args":{"q":"x","n":3},"timeout":2.5}',
    "tool-call-null": '{"kind":"tool_call","id":"c1","name":"t","args":{},"timeout":null}',
    "log": '{"kind":"log","level":"info","msg":"hello \\u00e9 \\ud83d\\ude00"}',
    "log-nul": '{"level":"warn","msg":"a\\u0000b","kind":"log"}',
    "done": '{"kind":"done","exit_code":0}',
    "done-neg": '{"kind":"done","exit_code":-9223372036854775808}',
    "output": '{"kind":"output","stdout":"1\\n","stderr":"","exit_code":1}',
    "nan": '{"kind":"tool_result","id":"x","ok":true,"value":[NaN,Infinity,-Infinity,1e999]}',
    "bigint": '{"kind":"tool_result","id":"x","value":123456789012345678901234567890123456789012345678901234567890123456789}',
    "lone-surrogate": '{"kind":"log","msg":"\\ud800x","level":"info"}',
    "dup-keys": '{"kind":"log","kind":"done","exit_code":3,"exit_code":4}',
    "unknown-keys": '{"kind":"done","extra":[1,{"b":2}],"exit_code":0}',
    "nested": '{"kind":"run","code":"","x":' + "[" * 40 + "]" * 40 + "}",
    "not-object": "[1,2,3]",
    "trailing": '{"kind":"shutdown"} x',
    "bad-kind": '{"kind":5}',
    "missing-kind": '{"code":"x"}',
    "wrong-type": '{"kind":"done","exit_code":"0"}',
    "float-exit": '{"kind":"output","exit_code":1.0}',
    "proto-version": '{"kind":"ready","protocol_version":3}',
    "escapes": '{"kind":"log","msg":"\\"\\\\\\/\\b\\f\\n\\r\\t\\u001f"}',
    "chan-frame": b"F\x00\x00\x00\x10\x00\x00\x00{\"kind\":\"done\"}",
    "chan-tools": b"T\x00\x00\x00\x00\x00\x00\x01\xff",
    # As a log message for frame_log_write (even first byte: the full room):
    # quotes, a backslash, controls, UTF-8 and a stray byte, which become '?'.
    "log-write-bytes": b"path \"/t\xc3\xa9\\ools\"\n\x01\x1f\x7f\xff end",
}

# ---------------------------------------------------------------------- http
KEY = "dGhlIHNhbXBsZSBub25jZQ=="
UPGRADE = (
    "GET /ws HTTP/1.1\r\nHost: localhost:8080\r\nUpgrade: websocket\r\n"
    "Connection: Upgrade\r\nSec-WebSocket-Key: " + KEY + "\r\n"
    "Sec-WebSocket-Version: 13\r\nAuthorization: Bearer s3cret-token\r\n\r\n"
)
HTTP = {
    "upgrade": UPGRADE,
    "upgrade-frames": UPGRADE + "\x81\x85\x01\x02\x03\x04ig\x6fhn",
    "health": "GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "http10": "GET /health HTTP/1.0\r\n\r\n",
    "connection-list": (
        "GET / HTTP/1.1\r\nConnection: keep-alive\r\nConnection:  Upgrade \t\r\n"
        "Upgrade: WebSocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + KEY + "\r\n\r\n"
    ),
    "body": "POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
    "chunked": "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "bad-name": "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
    "empty-value": "GET / HTTP/1.1\r\nX-Empty:\r\nUpgrade:\r\n\r\n",
    "lf-only": "GET / HTTP/1.1\nHost: x\n\n",
    "http2": "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "many-headers": "GET / HTTP/1.1\r\n" + "".join("H%d: v\r\n" % i for i in range(70)) + "\r\n",
    "long-target": "GET /" + "a" * 3000 + " HTTP/1.1\r\n\r\n",
    "bad-key": UPGRADE.replace(KEY, "short"),
}

# ------------------------------------------------------------------------ ws


def raw_frame(b0, payload, mask=b"\x11\x22\x33\x44", masked=True, length_form=None):
    n = len(payload)
    h = bytes([b0])
    mbit = 0x80 if masked else 0
    if length_form == 16 or (length_form is None and 126 <= n < 65536):
        h += bytes([mbit | 126]) + struct.pack(">H", n)
    elif length_form == 64 or (length_form is None and n >= 65536):
        h += bytes([mbit | 127]) + struct.pack(">Q", n)
    else:
        h += bytes([mbit | n])
    if masked:
        h += mask
        payload = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
    return h + payload


def desc(b0, payload, masked=True, length_form=None, key=b"\x01\x02\x03\x04"):
    """A structured-mode frame description (see fuzz-ws.c)."""
    n = len(payload)
    top = 0 if masked else 0x80
    if length_form == 16:
        d = bytes([b0, top | 126]) + struct.pack(">H", n)
    elif length_form == 64:
        d = bytes([b0, top | 127]) + struct.pack(">Q", n)
    else:
        d = bytes([b0, top | n])
    return d + (key if masked else b"") + payload


def ws_inputs():
    F_STRUCT, F_INITIAL, F_SMALL, F_CLOSE, F_REPLY, F_SCLOSE, F_BULK = 1, 2, 4, 8, 16, 32, 0xC0
    close = struct.pack(">H", 1000) + b"bye"
    return {
        "raw-text": bytes([0, 0]) + raw_frame(0x81, b"hello"),
        "raw-chunked": bytes([3, F_INITIAL]) + raw_frame(0x82, b"\x00\x01\x02" * 20) + raw_frame(0x88, close),
        "raw-unmasked": bytes([0, 0]) + raw_frame(0x81, b"hi", masked=False),
        "text": bytes([7, F_STRUCT]) + desc(0x81, b'{"kind":"run","code":"1"}'),
        "binary-reply": bytes([5, F_STRUCT | F_REPLY]) + desc(0x82, b"\x1f\x8b\x08\x00") + desc(0x89, b"p"),
        "fragments": bytes([2, F_STRUCT]) + desc(0x01, b"hel") + desc(0x89, b"ping")
        + desc(0x00, b"lo ") + desc(0x8a, b"") + desc(0x80, "w\u00f6rld".encode()),
        "invalid-utf8": bytes([1, F_STRUCT]) + desc(0x81, b"ok\xc3(") + desc(0x81, b"after"),
        "split-utf8": bytes([1, F_STRUCT]) + desc(0x01, b"\xe2\x82") + desc(0x80, b"\xac"),
        "too-big": bytes([9, F_STRUCT | F_SMALL]) + desc(0x82, b"x" * 101) + desc(0x81, b"y"),
        "too-big-fragments": bytes([9, F_STRUCT | F_SMALL]) + desc(0x02, b"x" * 60) + desc(0x80, b"y" * 60),
        "len16": bytes([200, F_STRUCT]) + desc(0x82, b"z" * 300, length_form=16),
        "len64-huge": bytes([0, F_STRUCT]) + bytes([0x82, 127]) + b"\x7f" + b"\xff" * 7 + b"\x01\x02\x03\x04" + b"abc",
        "close-on-text": bytes([4, F_STRUCT | F_CLOSE]) + desc(0x81, b"a") + desc(0x81, b"b") + desc(0x82, b"c"),
        "server-close": bytes([4, F_STRUCT | F_SCLOSE | F_REPLY]) + desc(0x81, b"a") + desc(0x81, b"b") + desc(0x81, b"c") + desc(0x81, b"d"),
        "close-frame": bytes([0, F_STRUCT]) + desc(0x88, close) + desc(0x81, b"late"),
        "close-bad-code": bytes([0, F_STRUCT]) + desc(0x88, struct.pack(">H", 1005)),
        "rsv-bits": bytes([0, F_STRUCT]) + desc(0xc1, b"compressed?"),
        "control-fragmented": bytes([0, F_STRUCT]) + desc(0x09, b"p"),
        "unmasked": bytes([0, F_STRUCT]) + desc(0x81, b"plain", masked=False),
        "bulk": bytes([0xFF, F_STRUCT | F_BULK]) + desc(0x81, b"t" * 100) + desc(0x82, b"b" * 300, length_form=16)
        + desc(0x89, b""),
        "bulk-reply": bytes([0xFF, F_STRUCT | F_BULK | F_REPLY]) + desc(0x82, b"b" * 1000, length_form=16),
    }


# ------------------------------------------------------------------- archive


def tar(members, fmt=tarfile.USTAR_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for m in members:
            info, data = m
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
        end = tf.offset
    # Drop tarfile's padding to a 10 KiB record: two zero blocks end it.
    return buf.getvalue()[: end + 1024]


def reg(name, data=b"x\n", mode=0o644):
    i = tarfile.TarInfo(name)
    i.size = len(data)
    i.mode = mode
    i.mtime = 1700000000
    return (i, data)


def special(name, kind, link=""):
    i = tarfile.TarInfo(name)
    i.type = kind
    i.linkname = link
    i.mode = 0o755
    return (i, None)


def archive_inputs():
    F_RAW, F_SNAP, F_SMALL_SNAP = 1, 2, 4
    basic = tar([special("dir/", tarfile.DIRTYPE), reg("dir/a.txt", b"hello\n"), reg("top.py", b"print(1)\n", 0o4755)])
    out = {
        "basic": bytes([0]) + basic,
        "basic-snapshot": bytes([F_SNAP]) + basic,
        "basic-gzip": bytes([F_RAW]) + gzip.compress(basic, mtime=0),
        "ustar": bytes([0]) + tar([reg("u/v/w.txt"), special("u/x", tarfile.DIRTYPE)], tarfile.USTAR_FORMAT),
        "gnu-longname": bytes([0]) + tar([reg("l" * 120 + "/f" * 20)], tarfile.GNU_FORMAT),
        "pax-longname": bytes([F_SNAP]) + tar([reg("p" * 200 + ".txt", b"pax\n")], tarfile.PAX_FORMAT),
        "escape-dotdot": bytes([0]) + tar([reg("../../../outside/evil"), reg("a/../../b"), reg("ok/../fine")]),
        "escape-abs": bytes([0]) + tar([reg("/tmp/evil"), reg("//abs")]),
        "escape-links": bytes([0]) + tar([reg("up/evil"), reg("abs/evil"), reg("self/x"), reg("loop/x"),
                                          special("up", tarfile.DIRTYPE), reg("up")]),
        "symlink-then-file": bytes([0]) + tar([special("ln", tarfile.SYMTYPE, "../../../outside"), reg("ln/x"), reg("ln")]),
        "hardlink": bytes([0]) + tar([reg("f"), special("h", tarfile.LNKTYPE, "f"),
                                      special("h2", tarfile.LNKTYPE, "../../../outside/x")]),
        "specials": bytes([0]) + tar([special("fifo", tarfile.FIFOTYPE), special("chr", tarfile.CHRTYPE),
                                      special("blk", tarfile.BLKTYPE), special("cont", tarfile.CONTTYPE)]),
        "snapshot-cap": bytes([F_SNAP | F_SMALL_SNAP]) + tar([reg("s1", b"1" * 3000), reg("s2", b"2" * 3000),
                                                             reg("d/s3", b"3" * 90)]),
        "overwrite": bytes([F_SNAP]) + tar([reg("sub/keep", b"new"), reg("sub", b"file over dir"),
                                            reg("d/f"), special("d/f", tarfile.DIRTYPE), reg("d/f/g")]),
        "dots": bytes([0]) + tar([reg("./a"), reg("b/./c"), reg("x//y"), reg("."), special("./", tarfile.DIRTYPE), reg("..cfg")]),
        # Large tars go in compressed (F_RAW) to keep seeds small.
        "many": bytes([F_RAW]) + gzip.compress(tar([reg("m%03d" % i, b"") for i in range(110)]), mtime=0),
        "big": bytes([F_RAW]) + gzip.compress(tar([reg("big", b"\0" * 300000), reg("big2", b"b" * 700000)]), mtime=0),
        "not-gzip": bytes([F_RAW]) + basic,
        "double-gzip": bytes([F_RAW]) + gzip.compress(gzip.compress(basic, mtime=0), mtime=0),
        "empty": bytes([F_RAW]),
        "empty-tar": bytes([0]) + b"\0" * 1024,
    }
    # A pax header that claims a large size for a small member, and a GNU
    # sparse 1.0 file (holes count against the cap).
    big = tarfile.TarInfo("claims-big")
    big.size = 3
    big.pax_headers = {"size": "1073741824"}
    out["pax-size"] = bytes([0]) + tar([(big, b"abc")], tarfile.PAX_FORMAT)
    sp = tarfile.TarInfo("GNUSparseFile.0/sparse")
    sparse_map = b"1\n1048000\n4\n"
    sparse_map += b"\0" * (512 - len(sparse_map))
    sp.size = len(sparse_map) + 4
    sp.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                      "GNU.sparse.name": "sparse", "GNU.sparse.realsize": "2000000"}
    out["gnu-sparse-over"] = bytes([F_SNAP]) + tar([(sp, sparse_map + b"data")], tarfile.PAX_FORMAT)
    sp.pax_headers = dict(sp.pax_headers, **{"GNU.sparse.realsize": "1048004"})
    out["gnu-sparse"] = bytes([F_SNAP]) + tar([(sp, sparse_map + b"data")], tarfile.PAX_FORMAT)
    return out


# -------------------------------------------------------------------- policy
POLICY = {
    "minimal": "default deny EPERM\nallow read write exit_group\n",
    "groups": (
        "# comment\ndefault errno EPERM\n"
        "group @more { dup dup2 }\n"
        "group @io { read write\n  close @more }\nallow @io\n"
        "group @io2 {\n read pread64\n}\nallow @io2 getpid\n"
    ),
    "when": (
        "default kill\ndefine MYFLAG 0x10|0x20\n"
        "allow socket when arg0 == AF_UNIX\n"
        "errno EAFNOSUPPORT socket when arg0 != AF_UNIX\n"
        "allow ioctl\ndeny EPERM ioctl when arg1 & 0xffffffff == TIOCSTI\n"
        "allow clone when arg0 & CLONE_NEWUSER|CLONE_NEWNS == 0 and arg1 <= MYFLAG\n"
        "allow prctl when arg0 >= 1 and arg1 > 2 and arg2 < 3\n"
    ),
    "conflict": "default deny EPERM\nallow read\ndeny EPERM read\n",
    "duplicate": "default deny EPERM\nallow read\nallow read\n",
    "default-allow": "default allow\n",
    "no-default": "allow read\n",
    "two-defaults": "default kill\ndefault deny EPERM\n",
    "unclosed": "default kill\ngroup @g { read\n",
    "unknown-syscall": "default kill\nallow not_a_syscall\n",
    "foreign": "default kill\nallow socketcall read\n",
    "same-arg": "default kill\nallow kill when arg0 == 1 and arg0 == 2\n",
    "bad-errno": "default deny ENOTANERRNO\n",
    "numeric-errno": "default deny 1\nerrno 38 clone3\n",
    "crlf": "default deny EPERM\r\nallow read\r\n",
    "noop-supervise": (
        "default deny EPERM\nallow madvise fadvise64 preadv2\nsupervise flock\nnoop readahead\n"
        "noop madvise when arg2 & 0xffffffff == MADV_COLD\n"
        "noop fadvise64 when arg3 & 0xffffffff == POSIX_FADV_DONTNEED\n"
        "errno EOPNOTSUPP preadv2 when arg5 & RWF_NOWAIT == RWF_NOWAIT\n"
        "errno EPERM flock when arg1 & 0xffffffff == 99\n"
    ),
    "supervise-unsupported": "default kill\nsupervise read\n",
    "default-noop": "default noop\n",
}


# --------------------------------------------------------------------- inbox
# Client messages the supervisor re-encodes for a sandbox, frames already in
# the supervisor's form, and plain strings (used as a code and as an id).
INBOX = {
    "run": '{"kind":"run","code":"print(1)\\n"}',
    "run-escapes": '{"code":"s = \\"\\u00e9\\ud83d\\ude00\\/\\t\\"","kind":"run"}',
    "run-nul": '{"kind":"run","code":"a\\u0000b"}',
    "run-lone-surrogate": '{"kind":"run","code":"\\udc00"}',
    "result": '{"kind":"tool_result","id":"c1","ok":true,"value":{"a":[1,"x"]},"error":null}',
    "result-escaped-id": '{"kind":"tool_result","id":"c\\"1\\u00e9","ok":false,"value":null,"error":{"type":"E"}}',
    "result-number-id": '{"kind":"tool_result","id":7,"ok":true,"value":"\\u0000"}',
    "result-nul-value": '{"kind":"tool_result","id":"c\\n","value":"\\u0000"}',
    "sup-run": '{"code":"x = 1","kind":"run"}\n',
    "sup-result": '{"id":"c1","ok":true,"value":1,"error":null,"kind":"tool_result"}\n',
    "sup-result-quote": '{"id":"a\\",\\"b","ok":true,"value":1,"error":null,"kind":"tool_result"}\n',
    "sup-trailing": '{"code":"x","kind":"run"} {"code":"x","kind":"run"}\n',
    "string-plain": "c1",
    "string-quote": 'a"b,\\',
    "string-nul": b"a\x00b",
    "string-nul-text": "\\u0000",
}


# ------------------------------------------------------------------ tarcheck
# Tar streams in the form libarchive's restricted pax writer makes them (the
# subset proto/tarcheck.h accepts), and near misses.


def lax_num(v, width):
    """libarchive's octal fields: 6 digits, ' ', NUL (11 digits, ' ' for 12)."""
    digits = 11 if width == 12 else 6
    s = b"%0*o " % (digits, v)
    return s + b"\0" * (width - len(s))


def ustar(name, typ=b"0", mode=0o644, size=0, prefix=b"", mtime=1700000000, link=b"",
          uid=0, magic=b"ustar\x0000", fields=None):
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = lax_num(mode, 8)
    h[108:116] = lax_num(uid, 8)
    h[116:124] = lax_num(0, 8)
    h[124:136] = lax_num(size, 12)
    h[136:148] = lax_num(mtime, 12)
    h[156:157] = typ
    h[157:157 + len(link)] = link
    h[257:265] = magic
    h[329:337] = lax_num(0, 8)
    h[337:345] = lax_num(0, 8)
    h[345:345 + len(prefix)] = prefix
    for off, val in (fields or {}).items():
        h[off:off + len(val)] = val
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def pad(data):
    return data + b"\0" * (-len(data) % 512)


def pax_rec(key, val):
    body = b" " + key + b"=" + val + b"\n"
    n = len(body) + 1
    while len(b"%d" % n) + len(body) != n:
        n += 1
    return b"%d" % n + body


def member(name, data=b"", mode=0o644, pax=None, **kw):
    out = b""
    if pax is not None:
        out += ustar(b"PaxHeader/x", b"x", 0o644, len(pax)) + pad(pax)
    return out + ustar(name, b"0", mode, len(data), **kw) + pad(data)


END = b"\0" * 1024


def tarcheck_inputs():
    RAW, GZ, GZ2, STORED, SMALL, BUDGET, FB = 0, 1, 2, 3, 4, 8, 16
    files = (member(b"a.txt", b"hello\n") + member(b"b/c", b"") +
             member(b"exec.sh", b"#!/bin/sh\n", 0o755) + END)
    longp = b"d" * 120 + b"/" + b"f" * 110
    pax_long = member(b"f" * 99, b"long", pax=pax_rec(b"path", longp) +
                      pax_rec(b"mtime", b"1700000000.123456789")) + END
    pax_utf8 = member(b"h?llo", b"utf8", pax=pax_rec(b"path", "h\u00e9llo/\u20ac".encode())) + END
    dirs = (ustar(b"d/", b"5", 0o755) + ustar(b"d/e/", b"5", 0o755) +
            member(b"d/x", b"in a dir") + END)
    prefixed = member(b"n" * 80, b"p", prefix=b"p" * 100) + END
    out = {
        "files": (0, GZ, files),
        "files-bytewise": (1, GZ | BUDGET, files),
        "files-raw": (7, RAW, gzip.compress(files, mtime=0)),
        "two-members": (64, GZ2, files),
        "stored": (7, STORED, files),
        "pax-long": (0, GZ, pax_long),
        "pax-utf8": (1, GZ, pax_utf8),
        "dirs": (7, GZ, dirs),
        "prefix": (0, GZ, prefixed),
        "empty": (0, GZ, END),
        "empty-message": (0, RAW, b""),
        # FB members of 2 blocks each (byte 0 = 0x55): one per tar entry,
        # as the snapshot writer makes them, for the verified-member cache
        "fb-aligned": (0x55, GZ | FB, member(b"a.txt", b"hello\n") + member(b"b.txt", b"b") +
                       member(b"exec.sh", b"#!/bin/sh\n", 0o755) + END),
        "fb-stored": (0x55, STORED | FB, member(b"a.txt", b"hello\n") + member(b"b.txt", b"b") +
                      END),
        "fb-mixed": (0x1b, GZ | FB, files),
        "small-limits": (3, GZ | SMALL, member(b"a", b"1" * 2000) + member(b"b", b"2" * 2000) + END),
        "over-small-limits": (3, GZ | SMALL, member(b"a", b"1" * 3000) + member(b"b", b"2" * 3000) + END),
        "trailer-10k": (0, GZ, files + b"\0" * (10240 - len(files) % 10240)),
        # near misses
        "setuid": (0, GZ, member(b"a", b"x", 0o4755) + END),
        "world-writable": (0, GZ, member(b"a", b"x", 0o666) + END),
        "symlink": (0, GZ, ustar(b"l", b"2", 0o777, link=b"/etc/passwd") + END),
        "hardlink": (0, GZ, member(b"a") + ustar(b"h", b"1", link=b"a") + END),
        "gnu-longname": (0, GZ, ustar(b"././@LongLink", b"L", size=4) + pad(b"abc\0") +
                         member(b"abc") + END),
        "global-pax": (0, GZ, ustar(b"g", b"g", size=11) + pad(b"11 a=bcde\n\0")[:512] +
                       member(b"a") + END),
        "pax-size": (0, GZ, member(b"a", b"x", pax=pax_rec(b"size", b"1000")) + END),
        "pax-hdrcharset": (0, GZ, member(b"a", b"x", pax=pax_rec(b"hdrcharset", b"BINARY") +
                                         pax_rec(b"path", b"\xff")) + END),
        "base256-size": (0, GZ, member(b"a", b"x", fields={124: b"\x80" + b"\0" * 10 + b"\x01"}) + END),
        "gnu-magic": (0, GZ, member(b"a", b"x", magic=b"ustar  \0") + END),
        "out-of-order": (0, GZ, member(b"b") + member(b"a") + END),
        "beneath-file": (0, GZ, member(b"a") + member(b"a/b") + END),
        "dotdot": (0, GZ, member(b"../x") + END),
        "trailing-garbage": (0, RAW, gzip.compress(files, mtime=0) + b"junk"),
        "bad-crc": (0, RAW, gzip.compress(files, mtime=0)[:-8] + b"\0" * 8),
        "fname-flag": (0, RAW, gzip.compress(files, mtime=0)[:3] + b"\x08" +
                       gzip.compress(files, mtime=0)[4:]),
    }
    return {k: bytes([seed, flags]) + data for k, (seed, flags, data) in out.items()}


# --------------------------------------------------------------------- session
# fuzz-session.c: operations of (opcode, param, u16 length, payload).
def op(code, param=0, payload=b""):
    if isinstance(payload, str):
        payload = payload.encode()
    return bytes([code, param]) + struct.pack("<H", len(payload)) + payload


RUN = op(0, 0, '{"code":"print(1)","kind":"run"}\n')
RESULT = op(0, 0, '{"id":"abc","ok":true,"value":{"x":1},"error":null,"kind":"tool_result"}\n')
ARCHIVES = op(9) + op(9)  # the tools archive, then the first block's workspace archive
READY, TOOL_CALL, LOG, DONE, OUTPUT = (op(5, k, b"\x80abc") for k in range(5))
SNAP_EMPTY, SNAP_ONE, SNAP_EVIL = (op(5, k) for k in (5, 6, 7))  # no payload: unchanged


def session_inputs():
    block = RUN + READY + TOOL_CALL + RESULT + DONE + op(5, 4, b"\x80") + SNAP_EMPTY
    return {
        "turn": ARCHIVES + block + op(0, 0, '{"kind":"shutdown"}\n'),
        "two-blocks": ARCHIVES + block + op(9) + RUN + DONE + op(5, 4, b"\x80") + SNAP_ONE,
        "evil-snapshot": ARCHIVES + RUN + READY + DONE + op(5, 4, b"\x80") + SNAP_EVIL,
        "forged-envelopes": ARCHIVES + RUN + READY + op(3, 0, '{"exit_code":0,"kind":"done"}\n')
        + op(3, 3, b"\x1f\x8b not an archive"),
        "huge-header": ARCHIVES + RUN + op(4, 0, b"F\0\0\0" + struct.pack("<I", 1 << 28) + b"{"),
        "timeout": ARCHIVES + RUN + READY + op(6, 2) + op(6, 200),
        "sandbox-dies": ARCHIVES + RUN + READY + TOOL_CALL + op(7),
        "client-junk": op(2, 0, b"\x81\x7f" + b"\xff" * 8) + op(8),
        "fragmented-run": ARCHIVES + op(0, 5, '{"code":"x=1","kind":"run"}\n') + DONE,
        "log-between": ARCHIVES + READY + LOG + LOG + op(3, 0, '{"level":"info","msg":"m","kind":"log"}\n'),
    }


def main():
    for name, data in FRAMES.items():
        write("frame", name, data)
    # byte 0 seeds the chunking: 0 = one chunk, small = byte-sized feeds.
    for i, (name, data) in enumerate(HTTP.items()):
        write("http", name, bytes([(0, 1, 7, 64)[i % 4]]) + data.encode("latin-1"))
    for name, data in ws_inputs().items():
        write("ws", name, data)
    for name, data in archive_inputs().items():
        write("archive", name, data)
    for name, data in POLICY.items():
        write("policy", name, data)
    for name, data in INBOX.items():
        write("inbox", name, data)
    for name, data in tarcheck_inputs().items():
        write("tarcheck", name, data)
    for name, data in session_inputs().items():
        write("session", name, data)
    with open(os.path.join(ROOT, "..", "..", "policy", "default.policy"), "rb") as f:
        write("policy", "default.policy", f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
