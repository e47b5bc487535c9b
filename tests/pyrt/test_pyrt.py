"""pyrt over the channel: ready, tools, tool calls, outcomes, capture,
snapshots, stray threads, environment (spec 3-6, 9)."""
import json
import os
import re
import subprocess
import time

import fbtest
import pytest
from conftest import UNDER_ASAN, echo_handler, result
from fbtest import make_targz as targz


def _frame_fields():
    """Each kind's fields in order, from the table's one copy,
    src/proto/frame_fields.h (its FRAME_FIELDS_<KIND>(X) lists)."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "src", "proto", "frame_fields.h")
    with open(path) as f:
        text = f.read()
    lists = re.findall(r"#define FRAME_FIELDS_(\w+)\(X\)((?:.*\\\n)*.*)", text)
    table = {k.lower(): re.findall(r"X\(\w+, (\w+)\)", body) for k, body in lists}
    assert len(table) == 8 and table["run"] == ["code"], table
    return table


FRAME_FIELDS = _frame_fields()


def compact_ok(raw):
    """A frame as frame_encode() writes it, so the supervisor relays it as it
    is: compact JSON, the kind's fields in the table's order, "kind" last, one
    trailing newline."""
    assert raw.endswith(b"\n") and not raw.endswith(b"\n\n")
    obj = json.loads(raw)
    assert raw == (json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
    assert list(obj) == FRAME_FIELDS[obj["kind"]] + ["kind"], raw[:200]
    return obj




# ---- ready ------------------------------------------------------------------

def test_ready_frame(sb):
    r = compact_ok(sb.ready_raw)
    assert r["kind"] == "ready"
    assert r["protocol_version"] == 2 and type(r["protocol_version"]) is int
    assert set(r) == {"kind", "protocol_version", "python_version", "packages"}
    assert re.fullmatch(r"3\.\d+\.\d+\S*", r["python_version"])
    assert isinstance(r["packages"], dict)
    for imp, provs in r["packages"].items():
        assert provs and all(isinstance(v, (str, type(None))) for v in provs.values())
    # Same interpreter, same dist-packages: the spec 3.4 algorithm, computed
    # independently, must give the same object, in the same order.
    exp = json.loads(subprocess.check_output(["/usr/bin/python3", "-I", "-c", fbtest.EXPECTED_PACKAGES]))
    assert r["python_version"] == exp["python_version"]
    assert list(r["packages"].items()) == list(exp["packages"].items())
    for name in ("pip", "setuptools", "wheel", "websockets"):
        assert all(name not in p for p in r["packages"].values())


def test_ready_comes_before_first_block_even_back_to_back(make_sandbox):
    sb = make_sandbox(tools=False)
    from conftest import TOOLS as T  # noqa: F811
    sb.send(b"T", targz(T))
    sb.send(b"W", b"")
    sb.send_frame({"code": "print('hi')", "kind": "run"})
    t, first = sb.recv()
    assert json.loads(first)["kind"] == "ready"
    blk = sb.collect()
    assert blk.stdout == "hi\n"


def test_tools_archive_error_logs_and_exits_3(make_sandbox):
    sb = make_sandbox(tools=False)
    sb.send(b"T", b"this is not gzip")
    t, payload = sb.recv()
    f = compact_ok(payload)
    assert f["kind"] == "log" and f["level"] == "error"
    assert f["msg"].startswith("tools archive: ")
    assert sb.recv() is None
    assert sb.proc.wait(10) == 3


def test_channel_must_start_with_the_tools_archive(make_sandbox):
    """The runtime reads the turn's first message itself, in C, before its
    reader thread and its Python loop exist (pyrt_tools_and_ready): it must be
    the tools archive, as the supervisor always sends it. Anything else is
    the stream out of step: an error log and exit 3, no ready."""
    sb = make_sandbox(tools=False)
    sb.send(b"W", b"")
    t, payload = sb.recv()
    f = compact_ok(payload)
    assert f["kind"] == "log" and f["level"] == "error"
    assert f["msg"] == ("forkbox runtime: internal error: the channel did not start with "
                        "the tools archive")
    assert sb.recv() is None
    assert sb.proc.wait(10) == 3


def test_zero_length_tools_archive(make_sandbox):
    sb = make_sandbox(tools={})
    assert sb.ready["kind"] == "ready"
    blk = sb.run("import importlib.util\nprint(importlib.util.find_spec('usr'))")
    assert blk.stdout == "None\n"


def test_eof_exits_0(sb):
    sb.sock.close()
    assert sb.proc.wait(10) == 0


# ---- tools and tool calls ---------------------------------------------------

def test_tools_imports_all_forms(sb):
    code = (
        "import tools\n"
        "from tools import echo\n"
        "from tools.helpdesk import open_ticket\n"
        "import tools.helpdesk.open_ticket\n"
        "import sys, os\n"
        "print(tools.echo is echo, sys.modules['tools.helpdesk.open_ticket'].open_ticket is open_ticket)\n"
        "print(echo(message='x'))\n"
        "print(open_ticket(subject='s', from_='me'))\n"
        "print(sorted(os.listdir(%r)))\n"
        "print('/' in sys.path, '' in sys.path, os.path.dirname(%r) in sys.path)\n"
        "import importlib.util\n"
        "print(importlib.util.find_spec('tmp'), importlib.util.find_spec('etc'))\n"
    ) % (sb.tools_dir, sb.tools_dir)
    blk = sb.run(code, on_call=echo_handler)
    assert blk.stderr == "" and blk.exit_code == 0
    lines = blk.stdout.splitlines()
    assert lines[0] == "True True"
    assert lines[1] == "{'echoed': 'x', 'name': 'echo'}"
    assert lines[2] == "{'echoed': None, 'name': 'helpdesk.open_ticket'}"
    assert "__init__.py" in lines[3] and "helpdesk" in lines[3]
    assert lines[4] == "False False False"
    assert lines[5] == "None None"
    assert [c["name"] for c in blk.calls] == ["echo", "helpdesk.open_ticket"]
    assert blk.calls[1]["args"] == {"subject": "s", "from": "me"}


def test_tool_call_frame_exact(sb):
    blk = sb.run("from tools import echo\nprint('ECHO:', echo(message='x'))", on_call=echo_handler)
    assert blk.stdout == "ECHO: {'echoed': 'x', 'name': 'echo'}\n"
    raw = blk.raw_calls[0]
    f = compact_ok(raw)
    assert re.fullmatch(r"[0-9a-f]{32}", f["id"])
    assert raw == ('{"id":"%s","name":"echo","args":{"message":"x"},"timeout":null,'
                   '"kind":"tool_call"}\n' % f["id"]).encode()


def test_call_serialisation(sb):
    code = r'''
from adk_code_mode_sandbox._rpc_client import call
import dataclasses
@dataclasses.dataclass
class P:
    x: int
    y: tuple
print(call("t.a", {"tup": (1, 2), 1: "int key", None: "none", "dc": P(1, (2, 3)), "u": "é\u2028", "nan": float("nan")}, timeout=1.5))
class O: pass
for bad in ({"o": O()}, {"s": "a\ud800"}):
    try:
        call("t.bad", bad)
    except Exception as e:
        print(type(e).__name__)
d = {}
d["self"] = d
try:
    call("t.rec", d)
except RecursionError:
    print("RecursionError")
'''
    blk = sb.run(code, on_call=lambda f: result(f, "ok"))
    assert blk.stderr == "", blk.stderr
    assert blk.stdout == "ok\nTypeError\nUnicodeEncodeError\nRecursionError\n"
    assert len(blk.calls) == 1  # nothing sent for the three failures
    raw = blk.raw_calls[0].decode()
    assert '"args":{"tup":[1,2],"1":"int key","null":"none","dc":{"x":1,"y":[2,3]},"u":"é\u2028","nan":NaN}' in raw
    assert '"timeout":1.5,"kind":"tool_call"}\n' in raw


def test_concurrent_calls_answered_in_reverse(sb):
    code = r'''
import threading
from tools import echo
res = {}
def worker(i):
    res[i] = echo(message=f"m{i}")
ts = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
for t in ts: t.start()
for t in ts: t.join()
print(all(res[i] == {"echoed": f"m{i}", "name": "echo"} for i in range(8)), len(res))
'''
    sb.send(b"W", b"")
    sb.send_frame({"code": code, "kind": "run"})
    calls = []
    while len(calls) < 8:
        t, p = sb.recv()
        f = json.loads(p)
        assert f["kind"] == "tool_call"
        calls.append(f)
    assert len({c["id"] for c in calls}) == 8
    for f in reversed(calls):
        sb.send_frame(echo_handler(f))
    blk = sb.collect()
    assert blk.stdout == "True 8\n" and blk.exit_code == 0


def test_values_nan_bigint_and_odd_results(sb):
    code = r'''
from adk_code_mode_sandbox._rpc_client import call
v = call("a", {})
print(repr(v))
print(call("b", {}))
print(call("c", {}))
'''
    answers = {
        "a": lambda f: '{"id":"%s","ok":true,"value":[NaN,1180591620717411303424,-Infinity,'
                       '"\\u0000é"],"error":null,"kind":"tool_result"}' % f["id"],
        # ok true wins over an error; missing fields take their defaults
        "b": lambda f: '{"id":"%s","ok":true,"value":5,"error":{"type":"X"},"kind":"tool_result"}\r\n' % f["id"],
        "c": lambda f: '{"kind":"tool_result","id":"%s"}' % f["id"],
    }
    blk = sb.run(code, on_call=lambda f: answers[f["name"]](f))
    assert blk.stderr == ""
    assert blk.stdout == "[nan, 1180591620717411303424, -inf, '\\x00é']\n5\nNone\n"


def test_tool_error_uncaught_and_caught(sb):
    code = r'''
from adk_code_mode_sandbox._rpc_client import call, ToolError
import adk_code_mode_sandbox, adk_code_mode_sandbox.protocol as p
print(adk_code_mode_sandbox.__version__, p.PROTOCOL_VERSION, issubclass(p.ProtocolError, Exception))
try:
    call("nopayload", {})
except ToolError as e:
    print(str(e), "|", e.args[0], "|", e.error_type, e.trace, hasattr(e, "message"), isinstance(e, RuntimeError))
try:
    call("odd", {})
except ToolError as e:
    print(str(e), "|", e.error_type, e.trace)
call("nope", {})
print("not reached")
'''
    errors = {
        "nopayload": None,
        "odd": {"type": 7, "trace": "tb"},
        "nope": {"type": "ToolNotFound", "message": "\"no tool registered for 'nope'\"", "trace": None},
    }
    blk = sb.run(code, on_call=lambda f: result(f, ok=False, error=errors[f["name"]]))
    assert blk.exit_code == 1
    assert blk.stdout == (
        "1.3.0 2 True\n"
        "Error: tool call failed without error payload | Error: tool call failed without error payload"
        " | Error None False True\n"
        "7:  | 7 tb\n")
    assert blk.stderr.startswith('Traceback (most recent call last):\n  File "<code-mode>", line 13, in <module>\n')
    assert blk.stderr.endswith(
        "adk_code_mode_sandbox._rpc_client.ToolError: ToolNotFound: \"no tool registered for 'nope'\"\n")
    assert "forkbox_runtime" not in blk.stderr


def test_rpc_client_api(sb):
    code = r'''
from adk_code_mode_sandbox import _rpc_client as rc
print(isinstance(rc.get(), rc.RpcClient), callable(rc.install))
old = rc.get()
rc.install(None)
try:
    rc.get()
except RuntimeError as e:
    print(e)
rc.install(old)
print(rc.ToolError.__module__, rc.ToolError.__qualname__)
import adk_code_mode_sandbox
print(adk_code_mode_sandbox.__spec__.submodule_search_locations is not None, getattr(adk_code_mode_sandbox, "__file__", None))
'''
    blk = sb.run(code)
    assert blk.stderr == ""
    assert blk.stdout == ("True True\nRPC client not installed; sandbox is not in a valid state\n"
                          "adk_code_mode_sandbox._rpc_client ToolError\nTrue None\n")


def test_garbage_frame_does_not_poison_pending_call(sb):
    sb.send(b"W", b"")
    sb.send_frame({"code": "from tools import echo\nprint(echo(message='z'))", "kind": "run"})
    t, p = sb.recv()
    f = json.loads(p)
    sb.send(b"F", b"{not json\n")
    sb.send(b"F", b'{"kind":"bogus"}\n')
    sb.send_frame(result({"id": "unknown-id"}, "ignored"))
    sb.send_frame({"kind": "run", "code": "print('must not run')"})
    sb.send_frame(echo_handler(f))
    blk = sb.collect()
    assert blk.stdout == "{'echoed': 'z', 'name': 'echo'}\n" and blk.exit_code == 0


# ---- outcomes (spec 6.2) ------------------------------------------------------

@pytest.mark.parametrize("code,exit_code,stderr", [
    ("x = 1", 0, ""),
    ("import sys\nsys.exit()", 0, ""),
    ("exit()", 0, ""),
    ("import sys\nsys.exit(2)", 2, ""),
    ("import sys\nsys.exit(-5)", -5, ""),
    ("import sys\nsys.exit(300)", 300, ""),
    ("import sys\nsys.exit(2**70)", 2**63 - 1, ""),
    ("import sys\nsys.exit(-2**70)", -2**63, ""),
    ("import sys\nsys.exit('msg')", 1, "msg\n"),
    ("raise SystemExit(1, 2)", 1, "(1, 2)\n"),
    ("import sys\nsys.exit(True)", 1, ""),
    ("import sys\nsys.exit(False)", 0, ""),
])
def test_exit_outcomes(sb, code, exit_code, stderr):
    blk = sb.run(code)
    assert blk.exit_code == exit_code
    assert type(blk.done["exit_code"]) is int
    assert blk.done_raw == ('{"exit_code":%d,"kind":"done"}\n' % exit_code).encode()
    compact_ok(blk.done_raw)
    assert blk.stderr == stderr
    assert blk.stdout == ""
    compact_ok(blk.output_raw)


def test_raise_traceback_is_stripped(sb):
    blk = sb.run("def f():\n    raise ValueError('bad')\nf()")
    assert blk.exit_code == 1
    assert blk.stderr == (
        "Traceback (most recent call last):\n"
        '  File "<code-mode>", line 3, in <module>\n'
        '  File "<code-mode>", line 2, in f\n'
        "ValueError: bad\n")


def test_keyboard_interrupt(sb):
    blk = sb.run("raise KeyboardInterrupt")
    assert blk.exit_code == 1 and blk.stderr.endswith("KeyboardInterrupt\n")
    blk = sb.run("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nimport time\ntime.sleep(5)")
    assert blk.exit_code == 1 and "KeyboardInterrupt" in blk.stderr


def test_syntax_error_nothing_runs(sb):
    blk = sb.run("print('ran')\nif True print('bad')")
    assert blk.exit_code == 1 and blk.stdout == ""
    assert blk.stderr.startswith("Traceback (most recent call last):\n")
    assert '  File "<code-mode>", line 2\n' in blk.stderr
    assert "SyntaxError" in blk.stderr.splitlines()[-1]
    blk = sb.run("x = 1\0")
    assert blk.exit_code == 1 and blk.stdout == "" and "null bytes" in blk.stderr


def test_annotations_future_and_main(sb):
    blk = sb.run(
        "print(list(globals()))\n"
        "def f(x: int) -> str: pass\nprint(f.__annotations__)\nprint(__name__)\nimport sys\nprint(sys.modules['__main__'].__dict__ is globals())\n"
        "class A: pass\nimport pickle\nprint(type(pickle.loads(pickle.dumps(A()))).__name__)\n"
        "import threading\nprint(threading.current_thread() is threading.main_thread())")
    assert blk.stderr == ""
    assert blk.stdout.splitlines() == [
        "['__name__', '__doc__', '__package__', '__loader__', '__spec__', '__builtins__']",
        "{'x': 'int', 'return': 'str'}", "__main__", "True", "A", "True"]


def test_globals_cwd_files_persist(sb):
    ws = sb.ws_dir
    b1 = sb.run("import os\nx = 10\nprint(os.getcwd())\nos.mkdir('sub')\nos.chdir('sub')\n"
                "open('f.txt', 'w').write('hello')")
    assert b1.stdout == ws + "\n" and b1.exit_code == 0
    assert b1.files() == {"sub/f.txt": b"hello"}
    b2 = sb.run("print(x * 4)\nimport os\nprint(os.getcwd())\nprint(open('f.txt').read())\n"
                "raise RuntimeError('partial')")
    assert b2.stdout == "40\n%s/sub\nhello\n" % ws and b2.exit_code == 1
    # the snapshot root is the workspace, not the cwd
    assert b2.files() == {"sub/f.txt": b"hello"}
    b3 = sb.run("print(x)")
    assert b3.stdout == "10\n"


# ---- output capture ---------------------------------------------------------

def test_clean_block_and_ordering(sb):
    code = (
        "import os, sys, subprocess\n"
        "print('a')\n"
        "os.write(1, b'b\\n')\n"
        "subprocess.run(['echo', 'c'])\n"
        "sys.stdout.write('d\\n')\n"
        "sys.stdout.buffer.write(b'e\\n')\n"
        "print('E1', file=sys.stderr)\n"
        "os.write(2, b'E2\\n')\n"
        "subprocess.run(['sh', '-c', 'echo E3 >&2'])\n"
        "print('f', end='')\n")
    blk = sb.run(code)
    assert blk.stdout == "a\nb\nc\nd\ne\nf"
    assert blk.stderr == "E1\nE2\nE3\n"
    blk = sb.run("print('hello world')")
    assert blk.stdout == "hello world\n" and blk.stderr == ""


def test_stdio_reset_each_block(sb):
    b1 = sb.run("import sys, io\nsys.stdout = io.StringIO()\nsys.stderr = None\nprint('lost')")
    assert b1.stdout == "" and b1.exit_code == 0
    b2 = sb.run("print('back')\nimport sys\nprint(sys.stdout.encoding, sys.stdout.errors)")
    assert b2.stdout == "back\nutf-8 backslashreplace\n"
    b3 = sb.run("import os\nos.close(1)\nos.close(0)")
    assert b3.exit_code == 0
    b4 = sb.run("print('still')\nimport sys\nprint(repr(sys.stdin.read()))")
    assert b4.stdout == "still\n''\n"


def test_lone_surrogate_and_invalid_utf8(sb):
    blk = sb.run("print('a\\ud800b')\nimport os\nos.write(1, b'x\\xffy\\n')\n"
                 "import sys\nprint('\\udcff', file=sys.stderr)")
    assert blk.stdout == "a\\ud800b\nx\ufffdy\n"
    assert blk.stderr == "\\udcff\n"
    compact_ok(blk.output_raw)


def test_background_output_after_block_is_not_captured(sb):
    b1 = sb.run("import threading, time\n"
                "def later():\n    time.sleep(0.3)\n    print('late')\n"
                "threading.Thread(target=later).start()\nprint('now')")
    assert b1.stdout == "now\n"
    time.sleep(0.6)
    b2 = sb.run("print('next')")
    assert b2.stdout == "next\n"


def test_background_subprocess_does_not_block_block_end(sb):
    t0 = time.monotonic()
    blk = sb.run("import subprocess\nsubprocess.Popen(['sh', '-c', 'echo early; sleep 3; echo late'])\n"
                 "import time\ntime.sleep(0.3)\nprint('main')")
    assert time.monotonic() - t0 < 2.5
    assert "main\n" in blk.stdout and "late" not in blk.stdout


def test_output_cap_keeps_head_and_tail(make_sandbox):
    sb = make_sandbox(args=["--output-cap", "1000"])
    blk = sb.run("import sys\nfor i in range(1000):\n    print('%05d' % i + 'x' * 94)\n"
                 "sys.stderr.write('E' * 100)")
    out = blk.stdout
    total = 1000 * 100
    head, note, tail = out.partition("\n[forkbox: %d bytes of stdout dropped]\n" % (total - 1000))
    assert note, out[:700]
    assert len(head) == 500 and len(tail) == 500
    assert head.startswith("00000xxx") and tail.endswith("00999" + "x" * 94 + "\n")
    assert blk.stderr == "E" * 100


def _reference_stream(data, cap, name):
    """What a stream of these bytes reads as in `output` (the Python code
    pyrt/output.c replaced): head and tail decoded with "replace", each cut
    back to its half of the cap if the U+FFFDs made it longer, the note
    between them."""
    head_cap = cap // 2
    tail_cap = cap - head_cap
    head, rest = data[:head_cap], data[head_cap:]
    tail = rest[-tail_cap:] if rest else b""
    dropped = len(rest) - len(tail)

    def dec(b, limit, keep_end):
        e = b.decode("utf-8", "replace").encode()
        if len(e) > limit:
            e = e[-limit:] if keep_end else e[:limit]
        return e.decode("utf-8", "ignore")
    note = f"\n[forkbox: {dropped} bytes of {name} dropped]\n" if dropped else ""
    return dec(head, head_cap, False) + note + dec(tail, tail_cap, True)


def test_output_frame_matches_the_python_reference(make_sandbox):
    """Random bytes (valid and ill-formed UTF-8, controls, quotes) through the
    C output writer, with a small cap: the text the host reads is exactly
    the reference's, and the frame is exactly json.dumps's."""
    import random
    cap = 1000
    sb = make_sandbox(args=["--output-cap", str(cap)])
    alphabet = [b"a", b"\"", b"\\", b"\n", b"\x00", b"\x1f", b"\x7f", b"\xc3\xa9", b"\xe2\x82\xac",
                b"\xf0\x9f\x98\x80", b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90",
                b"\x80", b"\xc0\xaf"]
    rng = random.Random(1234)
    for size in (0, 7, 499, 500, 501, 999, 1000, 1001, 3000):
        out = b"".join(rng.choice(alphabet) for _ in range(size))[:size]
        err = b"".join(rng.choice(alphabet) for _ in range(size // 3 + 1))
        blk = sb.run(f"import os\nos.write(1, {out!r})\nos.write(2, {err!r})")
        assert blk.stdout == _reference_stream(out, cap, "stdout"), (size, out)
        assert blk.stderr == _reference_stream(err, cap, "stderr"), (size, err)
        compact_ok(blk.output_raw)


def test_flood_memory_bounded(make_sandbox):
    sb = make_sandbox(args=["--output-cap", "4096"])
    b1 = sb.run("def hwm():\n    for l in open('/proc/self/status'):\n"
                "        if l.startswith('VmHWM'):\n            return int(l.split()[1])\n"
                "base = hwm()")
    assert b1.exit_code == 0
    b2 = sb.run("import sys\nline = 'x' * 10000\nfor i in range(10000):\n    print(line)\n"
                "print(hwm() - base, file=sys.stderr)")
    assert b2.exit_code == 0
    grown_kib = int(b2.stderr.split("\n")[-2]) if b2.stderr.endswith("\n") else int(b2.stderr)
    if not UNDER_ASAN:  # ASan's quarantine holds on to freed blocks
        assert grown_kib < 20 * 1024, grown_kib  # 100 MB written, a few KiB kept
    m = re.search(r"\[forkbox: (\d+) bytes of stdout dropped\]", b2.stdout)
    assert m and int(m.group(1)) == 10000 * 10001 - 4096
    assert len(b2.output_raw) < 16 * 1024


# ---- snapshots ----------------------------------------------------------------

def test_snapshot_contents(sb):
    code = (
        "import os\n"
        "open('a.txt', 'w').write('A')\n"
        "os.makedirs('d/e')\n"
        "open('d/e/b.bin', 'wb').write(bytes(range(256)))\n"
        "open('.hidden', 'w').write('h')\n"
        "os.symlink('a.txt', 'link')\n"
        "os.symlink('/etc', 'dirlink')\n"
        "os.mkfifo('fifo')\n"
        "os.mkdir('empty')\n"
        "os.link('a.txt', 'hard.txt')\n")
    blk = sb.run(code)
    assert blk.exit_code == 0, blk.stderr
    assert blk.files() == {"a.txt": b"A", "d/e/b.bin": bytes(range(256)), ".hidden": b"h",
                           "hard.txt": b"A"}
    blk = sb.run("import os\nos.remove('a.txt')")
    assert "a.txt" not in blk.files()
    blk = sb.run("open('a.txt', 'w').write('A')")
    assert blk.files()["a.txt"] == b"A"


def test_workspace_archive_extracted(sb):
    blk = sb.run("print(open('in/data.txt').read())", workspace=targz({"in/data.txt": "payload"}))
    assert blk.stdout == "payload\n"
    assert blk.files() == {"in/data.txt": b"payload"}


def test_snapshot_cap_note(make_sandbox):
    sb = make_sandbox(args=["--snapshot-max", "1000"])
    blk = sb.run("open('small', 'w').write('s' * 10)\nopen('big', 'w').write('b' * 5000)\nprint('ok')")
    assert blk.stdout == "ok\n"
    files = blk.files()
    assert "big" not in files and files["small"] == b"s" * 10
    assert re.fullmatch(r"\[forkbox: 1 file\(s\) left out of the workspace snapshot: "
                        r"over the 1000-byte limit\]\n", blk.stderr), blk.stderr


# ---- stray threads (spec 9.2) -------------------------------------------------

def test_call_after_block_fails_locally_and_sends_nothing(sb):
    b1 = sb.run(
        "import threading, time\n"
        "from tools import echo\n"
        "stray = []\n"
        "def later():\n"
        "    time.sleep(0.3)\n"
        "    try:\n"
        "        echo(message='late')\n"
        "    except Exception as e:\n"
        "        stray.append(f'{type(e).__module__}.{type(e).__name__}: {e}')\n"
        "threading.Thread(target=later).start()\n")
    assert b1.exit_code == 0 and b1.calls == []
    assert sb.quiet(1.0), "the stray call reached the channel"
    b2 = sb.run("print(stray)")
    assert b2.stdout == ("['adk_code_mode_sandbox.protocol.ProtocolError: "
                         "tool call made outside a running code block']\n")
    assert b2.calls == []


def test_pending_call_at_block_end_gets_protocol_error(sb):
    sb.send(b"W", b"")
    sb.send_frame({"code": (
        "import threading, time\n"
        "from tools import echo\n"
        "seen = []\n"
        "def waiter():\n"
        "    try:\n"
        "        echo(message='never answered')\n"
        "    except Exception as e:\n"
        "        seen.append(type(e).__name__)\n"
        "t = threading.Thread(target=waiter)\nt.start()\n"
        "time.sleep(0.5)\n"), "kind": "run"})
    t, p = sb.recv()
    assert json.loads(p)["kind"] == "tool_call"
    blk = sb.collect()  # not answered: done/output/S follow
    assert blk.exit_code == 0
    b2 = sb.run("t.join(5)\nprint(seen)")
    assert b2.stdout == "['ProtocolError']\n"


# ---- environment (spec 6.4) ---------------------------------------------------

def test_environment_allowlist(make_sandbox):
    env = {"PATH": "/usr/bin:/bin", "HOME": "/home/x", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8",
           "ADK_CODE_MODE_AUTH_TOKEN": "s3cr3t-token", "PORT": "9999",
           "ADK_CODE_MODE_TOOLS_DIR": "/tools", "FORKBOX_SECRET": "hunter2"}
    sb = make_sandbox(env=env)
    code = (
        "import os, ctypes\n"
        "print(sorted(os.environ))\n"
        "libc = ctypes.CDLL(None)\nlibc.getenv.restype = ctypes.c_char_p\n"
        "print([libc.getenv(k.encode()) for k in ('ADK_CODE_MODE_AUTH_TOKEN', 'PORT', 'FORKBOX_SECRET', 'LC_ALL')])\n"
        "env = open('/proc/self/environ', 'rb').read()\n"
        "print(b's3cr3t' in env, b'hunter2' in env)\n"
        "import subprocess\nprint(subprocess.run(['env'], capture_output=True, text=True).stdout.count('='))\n")
    blk = sb.run(code)
    assert blk.stderr == ""
    lines = blk.stdout.splitlines()
    assert lines[0] == "['HOME', 'LANG', 'LC_ALL', 'PATH']"
    assert lines[1] == "[None, None, None, b'C.UTF-8']"
    assert lines[2] == "False False"  # wiped from the initial environment block too
    assert lines[3] == "4"


def _env_keep():
    """The allowlist's one copy, src/pyrt/env_keep.h: (names, prefix)."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "src", "pyrt", "env_keep.h")
    with open(path) as f:
        text = f.read()
    names = re.search(r"#define PYRT_ENV_KEEP_NAMES((?:.*\\\n)*.*)", text).group(1)
    return set(re.findall(r'"(\w+)"', names)), re.search(r'_PREFIX "(\w+)"', text).group(1)


def test_environment_is_the_allowlist(make_sandbox):
    """Every name of the C header kept, nothing else, in os.environ and in the
    C environ alike; a name that is not UTF-8 is dropped, not an error."""
    keep, prefix = _env_keep()
    env = {k: "v" for k in keep}
    env.update(PATH=os.environ["PATH"], HOME="/nonexistent", LANG="C.UTF-8", LANGUAGE="C",
               PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1", TMPDIR="/tmp")
    env.update({prefix + "X": "v", "FORKBOX_SECRET": "hunter2", "PATHX": "v", "LC": "v",
                os.fsdecode(b"BAD\xff"): "v"})
    sb = make_sandbox(env=env)
    blk = sb.run("import os, subprocess\nprint(sorted(os.environ))\n"
                 "print(sorted(l.split('=')[0] for l in subprocess.run(['env'], "
                 "capture_output=True, text=True).stdout.splitlines()))\n")
    assert blk.stderr == ""
    want = repr(sorted(keep | {prefix + "X"}))
    assert blk.stdout.splitlines() == [want, want]


# ---- after a raw clone, as in the sandbox --------------------------------------

def test_after_raw_clone(make_sandbox):
    sb = make_sandbox(args=["--clone"])
    code = (
        "import os, threading, subprocess\n"
        "from tools import echo\n"
        "res = []\n"
        "ts = [threading.Thread(target=lambda i=i: res.append(echo(message=str(i)))) for i in range(4)]\n"
        "for t in ts: t.start()\n"
        "for t in ts: t.join()\n"
        "print(len(res), len(os.listdir('/proc/self/task')) >= 2, os.getpid() != os.getppid())\n"
        "print(subprocess.run(['echo', 'sub'], capture_output=True, text=True).stdout, end='')\n")
    b1 = sb.run(code, on_call=echo_handler)
    assert b1.stderr == "" and b1.exit_code == 0
    assert b1.stdout.splitlines() == ["4 True True", "sub"]
    sb.sock.close()
    assert sb.proc.wait(10) == 0


def test_user_signal_handlers_do_not_break_block_end(sb):
    # An alarm handler that raises, firing right after the block: the runtime
    # must still send done/output/snapshot; the handler works in later blocks.
    b1 = sb.run("import signal, time\n"
                "hits = []\n"
                "def h(*a):\n    hits.append(1)\n    raise RuntimeError('alarm')\n"
                "signal.signal(signal.SIGALRM, h)\n"
                "signal.setitimer(signal.ITIMER_REAL, 0.05)\n")
    assert b1.exit_code == 0 and b1.stderr == ""
    time.sleep(0.2)
    b2 = sb.run("print(len(hits))\nimport signal, time\nsignal.setitimer(signal.ITIMER_REAL, 0.05)\ntime.sleep(1)")
    assert b2.stdout == "0\n"
    assert b2.exit_code == 1 and b2.stderr.endswith("RuntimeError: alarm\n")


def test_sys_executable_runs(sb):
    blk = sb.run("import sys, subprocess\n"
                 "print(subprocess.run([sys.executable, '-c', 'print(6*7)'], capture_output=True, text=True).stdout)")
    assert blk.stdout == "42\n\n"


# ---- pyrt_init: site dirs, preloads, the single-thread rule ---------------------

def make_site(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "fbtest_pre.py").write_text("import sys\nLOADED_IN = 'init'\n")
    (site / "fbtest_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    info = site / "fbtest_dist-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fbtest-dist\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("fbtest_pre\n")
    return str(site)


def test_site_dirs_and_preload(make_sandbox, tmp_path):
    site = make_site(tmp_path)
    sb = make_sandbox(args=["--site", site, "--preload", "fbtest_pre, no_such_mod_xyz,"])
    assert sb.ready["packages"]["fbtest_pre"] == {"fbtest-dist": "1.0"}
    blk = sb.run("import sys\nprint('fbtest_pre' in sys.modules, sys.path[-1] == %r)\n"
                 "import fbtest_pre\nprint(fbtest_pre.LOADED_IN)" % site)
    assert blk.stdout == "True True\ninit\n"
    sb.sock.close()
    assert sb.proc.wait(10) == 0
    err = sb.proc.stderr.read().decode()
    assert "preload 'no_such_mod_xyz' failed, skipped: ModuleNotFoundError" in err


def test_preload_starting_a_thread_fails_init(make_sandbox, tmp_path):
    site = make_site(tmp_path)
    sb = make_sandbox(args=["--site", site, "--preload", "fbtest_thread"], tools=False)
    assert sb.proc.wait(20) == 2
    assert "must stay single-threaded" in sb.proc.stderr.read().decode()


# ---- the warm-up of a pooled sandbox ------------------------------------------

PROBE = r'''
import os, sys, signal, threading, json
def _fd_kinds():
    kinds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            kinds.append(os.readlink("/proc/self/fd/" + fd).split(":")[0].split("/")[-1])
        except OSError:
            pass  # the listing's own fd
    return sorted(kinds)
print(json.dumps({
    "globals": sorted(k for k in globals() if k not in ("__builtins__", "_fd_kinds")),
    "modules": sorted(sys.modules),
    "fds": _fd_kinds(),  # numbers differ with the harness's inherited fds
    "cwd_files": sorted(os.listdir(".")),
    "threads": threading.active_count(),
    "sigint": repr(signal.getsignal(signal.SIGINT)),
    "stdio": [type(s).__name__ for s in (sys.stdin, sys.stdout, sys.stderr)],
    "same_main": sys.modules["__main__"].__dict__ is globals(),
}, sort_keys=True))
print("to stderr", file=sys.stderr)
'''


@pytest.mark.parametrize("clone", [False, True])
def test_warm_up_reports_and_leaves_no_trace(make_sandbox, clone):
    """A pooled sandbox warms up before its tools arrive, says so once on the
    warm socket, sends nothing on the channel, and then serves a turn that is
    indistinguishable from a cold sandbox's (namespace, modules, fds,
    workspace, threads, handlers, stdio, output)."""
    extra = ["--clone"] if clone else []
    warm = make_sandbox(args=extra, warm=True)
    assert warm.warm_byte == b"W"
    cold = make_sandbox(args=extra)
    bw, bc = warm.run(PROBE), cold.run(PROBE)
    assert bw.exit_code == 0 and bc.exit_code == 0, (bw.stderr, bc.stderr)
    assert json.loads(bw.stdout) == json.loads(bc.stdout)
    assert bw.stderr == bc.stderr == "to stderr\n"
    assert bw.files() == bc.files() == {}
    # the warm socket is closed by the child once it has reported
    assert warm.warm_sock.recv(16) == b""
    # later blocks behave the same, errors included
    for code in ("x = 1\nprint(x)", "1/0", "import tools\nprint(sorted(dir(tools))[:1])"):
        w, c = warm.run(code), cold.run(code)
        assert (w.stdout, w.stderr, w.exit_code) == (c.stdout, c.stderr, c.exit_code)


def test_run_frame_decoded_in_c_or_python_alike(sb):
    """A run frame in the supervisor's form is decoded in C (module.c,
    run_code); any other form, and a NUL or lone surrogate in the code, by
    Python's protocol.decode. Both give the block the same code."""
    codes = [
        "print('tab\\there', \"quote\\\"\", 'back\\\\slash', '\\u00e9\\U0001F600')",
        "print(repr('\u00e9\U0001F600\t\x01'))",
        "x = 1\0",                      # NUL: refused by compile either way
        "print(len('a\ud800b'))",        # lone surrogate in the source
        "",
    ]
    for code in codes:
        frames = [json.dumps({"code": code, "kind": "run"}, separators=(",", ":"),
                             ensure_ascii=ascii) + "\n" for ascii in (False, True)]
        frames.append(json.dumps({"kind": "run", "code": code}) + "\r\n")
        results = []
        for frame in frames:
            try:
                frame = frame.encode()
            except UnicodeEncodeError:
                continue  # a lone surrogate has no UTF-8 form: only the escaped ones
            sb.send(b"W", b"")
            sb.send_frame(frame)
            blk = sb.collect()
            results.append((blk.exit_code, blk.stdout, blk.stderr))
        assert len(results) >= 2 and all(r == results[0] for r in results), (code, results)


def test_output_larger_than_a_pipe_in_one_write(sb):
    """A block's pipes are drained by the main thread at the block's end
    unless the channel reader takes them over first (a few ms after the run
    frame). One write several pipe buffers long blocks until the reader has
    taken over, and then all of it arrives, on both streams."""
    blk = sb.run("import os\nos.write(1, b'o' * 300000)\nos.write(2, b'e' * 200000)\n"
                 "print('end')")
    assert blk.exit_code == 0, blk.stderr[-300:]
    assert blk.stdout == "o" * 300000 + "end\n"
    assert blk.stderr == "e" * 200000
    blk = sb.run("print('small')")  # and the next block is drained as usual
    assert blk.stdout == "small\n"
