"""The runtime's stdio and forks against ordinary code (issue 12, items 1-2).

* Threads that print, log or write to fds 1/2 at every moment, across 500
  blocks, never crash the runtime, never lose the turn, and their output lands
  in the block during which it was written (never in a later one).
* Children made by os.fork() (directly, through multiprocessing, with or
  without exec, outliving the block or not) never write to the turn's channel:
  their output goes to the block's captured streams, like a forked child's
  output in ordinary Python, and the parent's blocks go on unaffected.
"""

import re

import pytest

from fbtest import arun, connect, demo_tools, run_blocks

T = 80

TAG = re.compile(r"<(\w+):(\d+):(\d+)>")


def blocks(daemon, codes, timeout=T):
    """The results of one turn running codes (fbtest.run_blocks)."""
    return run_blocks(daemon, *codes, timeout=timeout)[1]


# ---- item 1: stdio that threads cannot break ------------------------------

# Daemon threads that write as fast as the GIL lets them (a short sleep every
# 50 writes keeps the main thread's blocks going), each tagging its writes with
# the block number it saw last: <kind:block:seq>.
PRINTERS = r'''
import ctypes, logging, os, sys, threading, time
BLOCK = 0
libc = ctypes.CDLL(None)
log = logging.getLogger("printer")
log.addHandler(logging.StreamHandler())  # holds the sys.stderr of this block
log.setLevel(logging.INFO)
log.propagate = False

def printer(kind):
    i = 0
    while True:
        i += 1
        t = f"<{kind}:{BLOCK}:{i}>"
        if kind == "print":
            print(t)
        elif kind == "flush":
            print(t, flush=True)
        elif kind == "write":
            sys.stdout.write(t + "\n")
        elif kind == "err":
            print(t, file=sys.stderr, flush=True)
        elif kind == "log":
            log.info(t)
        elif kind == "oswrite":
            os.write(1, (t + "\n").encode())
        elif kind == "cwrite":
            b = (t + "\n").encode()
            libc.write(2 if i % 2 else 1, b, len(b))
        elif kind == "printf":
            libc.printf(b"%s\n", t.encode())
            libc.fflush(None)
        if i % 50 == 0:
            time.sleep(0.001)

KINDS = ("print", "flush", "write", "err", "log", "oswrite", "cwrite", "printf")
for k in KINDS:
    threading.Thread(target=printer, args=(k,), daemon=True).start()
'''

BLOCK = "BLOCK = {n}\ntime.sleep(0.002)\nos.write(1, b'<block:{n}>\\n')\n"

KINDS = ("print", "flush", "write", "err", "log", "oswrite", "cwrite", "printf")


def test_printing_threads_across_500_blocks(daemon):
    n_blocks = 500
    results = blocks(daemon, [PRINTERS] + [BLOCK.format(n=n) for n in range(1, n_blocks + 1)])
    assert results[0].exit_code == 0, results[0].stderr
    last_seen = {}
    max_seq = {}  # per writer: the highest sequence number seen in earlier blocks
    for n, r in enumerate(results[1:], 1):
        assert r.exit_code == 0, (n, r.stderr[-2000:])
        assert f"<block:{n}>" in r.stdout, n
        assert "Traceback" not in r.stderr, (n, r.stderr[-2000:])
        block_seq = {}
        for kind, b, seq in TAG.findall(r.stdout + r.stderr):
            # A writer's writes are in time order: one that lands in this
            # block was written after everything of it an earlier block
            # showed, so never output left over from an earlier block. (The
            # block number in a tag is when it was formatted, which may be a
            # few blocks before the write: a thread can wait for the GIL.)
            assert int(b) <= n and int(seq) > max_seq.get(kind, 0), (n, kind, b, seq, max_seq)
            block_seq[kind] = max(block_seq.get(kind, 0), int(seq))
            last_seen[kind] = n
        max_seq.update(block_seq)
    # Every kind of writer is still alive and captured at the end.
    assert all(last_seen.get(k, 0) > n_blocks - 10 for k in KINDS), last_seen


FLOOD = r'''
import os, sys, threading
ERRORS = []
STOP = False
def flood(n):
    while not STOP:
        try:
            if n % 2:
                print("z" * 300_000)  # larger than a pipe: often waits for room at a block's end
            else:
                os.write(2, b"q" * 300_000)
        except OSError as e:
            ERRORS.append(repr(e))
for n in range(4):
    threading.Thread(target=flood, args=(n,), daemon=True).start()
'''


def test_flooding_threads_never_see_a_broken_pipe(make_daemon):
    """Writes still waiting for room in a block's pipe when the block ends
    complete (their bytes past the end are dropped); they never fail."""
    d = make_daemon(["--output-cap", "256K"])
    results = blocks(d, [FLOOD] + ["import time; time.sleep(0.003)"] * 200
                         + ["import time\nSTOP = True\ntime.sleep(1)\nprint('<errors:', len(ERRORS), ERRORS[:3])"])
    assert all(r.exit_code == 0 for r in results), [r.stderr[-500:] for r in results if r.exit_code]
    assert results[-1].stdout.endswith("<errors: 0 []\n"), results[-1].stdout[-500:]


REPLACE = r'''
import io, sys, threading
def spin():
    while True:
        print("x" * 10, end="")
        sys.stderr.write("y")
threading.Thread(target=spin, daemon=True).start()
'''


def test_blocks_replacing_or_closing_stdio_under_printing_threads(daemon):
    """A block that replaces or closes sys.stdout/stderr while threads print:
    the next block gets working stdio back, and nothing crashes."""
    codes = [REPLACE]
    for n in range(60):
        if n % 3 == 0:
            codes.append("sys.stdout = io.StringIO(); sys.stderr = io.StringIO()")
        elif n % 3 == 1:
            codes.append("sys.stdout.close(); sys.__stderr__.close()")
        else:
            codes.append(f"import os; os.write(1, b'<ok:{n}>')")
    results = blocks(daemon, codes)
    for n, r in enumerate(results[1:]):
        assert r.exit_code == 0, (n, r.stderr[-2000:])
        if n % 3 == 2:
            assert f"<ok:{n}>" in r.stdout
    (r,) = blocks(daemon, ["print('fresh turn')"])
    assert r.stdout == "fresh turn\n"


# ---- item 2: forked copies of the runtime stay silent ---------------------

FORK_FALLS_THROUGH = r'''
import os, sys
pid = os.fork()
sys.stdout.write(("child" if pid == 0 else "parent") + " {n}\n")  # one write: no interleaving
if pid:
    _, st = os.waitpid(pid, 0)
    print("status", os.waitstatus_to_exitcode(st))
'''

FORK_EXITS = r'''
import os, sys
pid = os.fork()
if pid == 0:
    print("child", {n}, flush=True)
    os._exit(7)
_, st = os.waitpid(pid, 0)
print("parent", {n}, os.waitstatus_to_exitcode(st))
'''

FORK_RAISES = r'''
import os
pid = os.fork()
if pid == 0:
    raise ValueError("in the child {n}")
_, st = os.waitpid(pid, 0)
print("parent", {n}, os.waitstatus_to_exitcode(st))
'''

FORK_EXEC = r'''
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, "-c", "print('exec child {n}')"])
_, st = os.waitpid(pid, 0)
print("parent", {n}, os.waitstatus_to_exitcode(st))
'''


def test_fork_child_falls_through_the_block(daemon):
    """The child runs the rest of the block and exits, as a script's child
    would: its output is in the block's stdout, its done never reaches the
    host."""
    results = blocks(daemon, [FORK_FALLS_THROUGH.format(n=n) for n in range(20)]
                         + ["print('after')"])
    for n, r in enumerate(results[:20]):
        assert r.exit_code == 0, (n, r.stdout, r.stderr)
        assert sorted(r.stdout.splitlines()) == sorted([f"child {n}", f"parent {n}", "status 0"]), \
            (n, r.stdout, r.stderr)
        assert not r.logs
    assert results[20].stdout == "after\n"


def test_fork_child_exits_or_raises(daemon):
    codes = []
    for n in range(10):
        codes += [FORK_EXITS.format(n=n), FORK_RAISES.format(n=n)]
    results = blocks(daemon, codes + ["print('after')"])
    for i in range(10):
        ex, ra = results[2 * i], results[2 * i + 1]
        assert ex.exit_code == 0 and sorted(ex.stdout.splitlines()) == [f"child {i}", f"parent {i} 7"], \
            (ex.stdout, ex.stderr)
        # The child's uncaught exception: its traceback in the block's stderr, exit status 1.
        assert ra.exit_code == 0 and ra.stdout == f"parent {i} 1\n", (ra.stdout, ra.stderr)
        assert f"ValueError: in the child {i}" in ra.stderr
    assert results[-1].stdout == "after\n"


def test_fork_then_exec(daemon):
    results = blocks(daemon, [FORK_EXEC.format(n=n) for n in range(5)] + ["print('after')"])
    for n, r in enumerate(results[:5]):
        assert r.exit_code == 0, (r.stdout, r.stderr)
        assert r.stdout == f"exec child {n}\nparent {n} 0\n", (r.stdout, r.stderr)
    assert results[-1].stdout == "after\n"


MP_FORK = r'''
import multiprocessing as mp, os
def work(x):
    print("worker", x, flush=True)
    return x * x
ctx = mp.get_context("fork")
p = ctx.Process(target=work, args=({n},))
p.start(); p.join()
print("exitcode", p.exitcode)
with ctx.Pool(2) as pool:
    print("squares", sum(pool.map(work, range(10))))
'''


def test_multiprocessing_fork(daemon):
    results = blocks(daemon, [MP_FORK.format(n=n) for n in range(5)] + ["print('after')"])
    for n, r in enumerate(results[:5]):
        assert r.exit_code == 0, (r.stdout, r.stderr)
        lines = r.stdout.splitlines()
        assert f"worker {n}" in lines and "exitcode 0" in lines and "squares 285" in lines, \
            (r.stdout, r.stderr)
        assert not r.logs
    assert results[-1].stdout == "after\n"


MP_START = r'''
import multiprocessing as mp
ctx = mp.get_context("{method}")
p = ctx.Process(target=print, args=("hello from {method}",))
p.start(); p.join(30)
print("exitcode", p.exitcode)
with ctx.Pool(1) as pool:
    print("abs", pool.map(abs, [-1, -2]))
'''


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_multiprocessing_spawn_and_forkserver(daemon, method):
    """A fresh interpreter (sys.executable) started from the sandbox: works,
    and its output is the block's, like any subprocess's."""
    r1, r2 = blocks(daemon, [MP_START.format(method=method), "print('after')"])
    assert r1.exit_code == 0, (r1.stdout, r1.stderr)
    assert f"hello from {method}\n" in r1.stdout and "exitcode 0\n" in r1.stdout, (r1.stdout, r1.stderr)
    assert "abs [1, 2]\n" in r1.stdout
    assert r2.stdout == "after\n"


OUTLIVES = r'''
import os, time
pid = os.fork()
if pid == 0:
    # Outlives this block: keeps writing through the next ones.
    for i in range(300):
        try:
            os.write(1, b"<late>\n")
            print("<late-print>", flush=True)
        except OSError:
            pass
        time.sleep(0.005)
    os._exit(0)
os.write(1, b"parent\n")  # one write: the child's may come between print's two
'''


def test_child_outliving_its_block(daemon):
    """A child still running after its block ended neither holds the block
    open nor lands in a later block's output."""
    codes = [OUTLIVES] + ["import time; time.sleep(0.05); print('next')"] * 30
    results = blocks(daemon, codes)
    assert results[0].exit_code == 0 and "parent\n" in results[0].stdout
    for r in results[1:]:
        assert r.exit_code == 0 and r.stdout == "next\n" and r.stderr == "", (r.stdout, r.stderr)
        assert not r.logs


FORK_IN_THREAD = r'''
import os, threading
def t():
    pid = os.fork()
    if pid == 0:
        print("thread child", flush=True)
        return  # the child's only thread ends: the child exits
    os.waitpid(pid, 0)
th = threading.Thread(target=t); th.start(); th.join()
print("joined")
'''


def test_fork_from_a_thread(daemon):
    results = blocks(daemon, [FORK_IN_THREAD] * 5 + ["print('after')"])
    for r in results[:5]:
        assert r.exit_code == 0 and sorted(r.stdout.splitlines()) == ["joined", "thread child"], \
            (r.stdout, r.stderr)
    assert results[-1].stdout == "after\n"


TOOL_IN_CHILD = r'''
import os, sys
from tools import echo
pid = os.fork()
if pid == 0:
    try:
        echo(message="from the child")
        sys.stdout.write("child: call returned\n")
    except Exception as e:
        sys.stdout.write(f"child: {type(e).__name__}: {e}\n")
    os._exit(0)
os.waitpid(pid, 0)
print("parent:", echo(message="from the parent"))
'''


def test_tool_call_from_a_forked_child_fails_cleanly(daemon):
    """The channel is the runtime's: a forked child's tool call raises at
    once (no hang, nothing sent), and the parent's calls go on."""
    async def go():
        turn = await connect(daemon, demo_tools())
        try:
            return [await turn.run(TOOL_IN_CHILD), await turn.run("print(echo(message='again'))")]
        finally:
            await turn.shutdown()
    r1, r2 = arun(go(), T)
    assert r1.exit_code == 0, (r1.stdout, r1.stderr)
    lines = r1.stdout.splitlines()
    assert lines[0].startswith("child: RuntimeError: forkbox: only the sandbox's main process"), lines
    assert lines[1].startswith("parent: ") and "from the parent" in lines[1], lines
    assert [c["args"] for c in r1.tool_calls] == [{"message": "from the parent"}], r1.tool_calls
    assert r2.exit_code == 0 and "again" in r2.stdout
