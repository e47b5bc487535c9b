"""Turn and block semantics (§9.1 items 5, 10-17, 22, 23 outgoing) plus the
§9.2 output improvements (cap, fd-level capture, lone surrogates)."""

import json
import re

import fbtest
from fbtest import ALLOWED_ENV, ALLOWED_ENV_PREFIX, arun, connect, fc, run_blocks, text_frames

T = 30


# ---- item 5: ready ---------------------------------------------------------

def test_ready_once_with_version_python_and_packages(daemon):
    """§9.1.5: one ready per turn, integer protocol_version 2, python 3.x,
    packages computed as in §3.4 (compared with the same algorithm run inside)."""
    turn, (r1, r2, r3, r4) = run_blocks(daemon, "x = 1", "print(x)", fbtest.EXPECTED_PACKAGES,
                                        "import platform; print(platform.python_version())")
    assert turn.ready_count == 1
    raw = turn.ready_raw
    assert raw.endswith("\n")
    assert re.search(r'"protocol_version":2[,}]', raw), raw
    ready = json.loads(raw)
    assert type(ready["protocol_version"]) is int and ready["protocol_version"] == 2
    assert ready["python_version"].startswith("3.")
    assert r4.stdout == ready["python_version"] + "\n"
    assert isinstance(ready["packages"], dict)
    for imp, dists in ready["packages"].items():
        assert isinstance(imp, str) and isinstance(dists, dict) and dists
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in dists.items())
    # ready arrives before the first block's done
    kinds = [f["kind"] for f in text_frames(r1.messages)]
    assert "ready" in kinds and kinds.index("ready") < kinds.index("done")
    assert r3.exit_code == 0, r3.stderr
    inside = json.loads(r3.stdout)
    assert list(ready["packages"].items()) == list(inside["packages"].items())


def test_ready_not_waited_for(daemon):
    """§2.1: tools archive, workspace archive and run back to back work."""
    async def go():
        turn = await connect(daemon)
        # nothing awaited between the tools upload and the first block
        r = await turn.run("print('pipelined')")
        await turn.shutdown()
        return turn, r
    turn, r = arun(go(), T)
    assert r.stdout == "pipelined\n" and turn.ready is not None


# ---- item 10, 11: archives before run; done, output, archive -------------

def test_zero_member_and_zero_length_archives_accepted(daemon):
    """§9.1.10: a zero-member gzip tar and a zero-length binary both precede a run."""
    async def go():
        turn = await connect(daemon)
        a = await turn.run("print('a')", workspace=fc.empty_tar())
        b = await turn.run("print('b')", workspace=b"")
        await turn.shutdown()
        return a, b
    a, b = arun(go(), T)
    assert (a.stdout, a.exit_code) == ("a\n", 0)
    assert (b.stdout, b.exit_code) == ("b\n", 0)


def test_zero_length_tools_archive_accepted(daemon):
    """§2.3 state T: a zero-length tools archive means nothing to extract."""
    async def go():
        turn = await connect(daemon, tools_bytes=b"")
        r = await turn.run("import os\nprint(sorted(os.listdir('/tools')) if os.path.isdir('/tools') else 'none')")
        await turn.shutdown()
        return turn, r
    turn, r = arun(go(), T)
    assert r.exit_code == 0, r.stderr
    assert turn.ready is not None


def test_block_ends_with_done_output_archive(daemon):
    """§9.1.11: done, output, binary gzip tar, nothing in between, equal exit codes."""
    turn, rs = run_blocks(daemon, "print(1)", "import sys; sys.exit(3)", "raise KeyError('k')")
    for r, code in zip(rs, (0, 3, 1)):
        kinds = [("binary" if k == "binary" else fc.decode_frame(m)["kind"]) for k, m in r.messages]
        i = kinds.index("done")
        assert kinds[i:] == ["done", "output", "binary"], kinds
        assert r.exit_code == code and r.output_exit_code == code
        assert type(r.output_exit_code) is int
        assert r.archive is not None and r.archive[:2] == b"\x1f\x8b"
        fc.read_tar(r.archive)  # a valid gzip tar


# ---- item 12-14: output and outcomes --------------------------------------

def test_print_hello_world_clean_stderr(daemon):
    """§9.1.12."""
    _, (r,) = run_blocks(daemon, "print('hello world')")
    assert r.stdout == "hello world\n"
    assert r.stderr == ""
    assert r.exit_code == 0


def test_sys_exit_variants(daemon):
    """§9.1.13 (and §6.2: bool exit codes SHOULD be emitted as integers)."""
    _, rs = run_blocks(daemon, "import sys; sys.exit(2)", "import sys; sys.exit()",
                       "import sys; sys.exit('msg')", "exit()", "import sys; sys.exit(-7)",
                       "import sys; sys.exit(300)", "import sys; sys.exit(True)")
    got = [(r.exit_code, r.stderr) for r in rs]
    assert got[0] == (2, "")
    assert got[1] == (0, "")
    assert got[2] == (1, "msg\n")
    assert got[3] == (0, "")
    assert got[4] == (-7, "")
    assert got[5] == (300, "")
    assert rs[6].exit_code == 1 and type(rs[6].exit_code) is int
    assert '"exit_code":1' in rs[6].done_raw


def test_exception_and_syntax_error(daemon):
    """§9.1.14: tracebacks name <code-mode>; a SyntaxError runs nothing."""
    _, (r1, r2, r3) = run_blocks(daemon, "x = 1\nraise ValueError('bad')",
                                 "print('ran')\nif True print('bad')", "print('turn alive')")
    assert r1.exit_code == 1
    assert "ValueError: bad" in r1.stderr
    assert r1.stderr.startswith("Traceback (most recent call last):")
    assert r1.stderr.rstrip("\n").endswith("ValueError: bad")
    assert 'File "<code-mode>", line 2, in <module>' in r1.stderr
    assert r2.exit_code == 1 and "SyntaxError" in r2.stderr
    assert r2.stdout == ""
    assert r3.stdout == "turn alive\n" and r3.exit_code == 0


def test_keyboard_interrupt_is_exit_1(daemon):
    """§6.2: any other BaseException -> traceback, exit 1."""
    _, (r,) = run_blocks(daemon, "raise KeyboardInterrupt")
    assert r.exit_code == 1 and "KeyboardInterrupt" in r.stderr


# ---- item 15-17: state ----------------------------------------------------

def test_state_persists_within_turn(daemon):
    """§9.1.15: globals, relative files and the cwd persist; __name__ is __main__."""
    _, rs = run_blocks(daemon,
                       "x = 10\nopen('a.txt','w').write('A')\nimport os\nos.makedirs('sub', exist_ok=True)\nos.chdir('sub')",
                       "print(x*4)",
                       "import os\nprint(os.path.basename(os.getcwd()))\nprint(open('../a.txt').read())",
                       "print(__name__)",
                       "def f(x: int): pass\nprint(f.__annotations__)")
    assert [r.exit_code for r in rs] == [0] * 5, [r.stderr for r in rs]
    assert rs[1].stdout == "40\n"
    assert rs[2].stdout == "sub\nA\n"
    assert rs[3].stdout == "__main__\n"
    assert rs[4].stdout == "{'x': 'int'}\n"   # §6.2 CO_FUTURE_ANNOTATIONS
    # the snapshot root stays the workspace root, not the cwd
    assert rs[2].files == {"a.txt": b"A"}


def test_snapshot_is_full_and_authoritative(daemon):
    """§9.1.16: new files appear, deleted are absent, recreated reappear;
    symlinks and special files never appear; hidden and nested files do."""
    _, rs = run_blocks(
        daemon,
        "import os\nopen('a.txt','w').write('A')\nopen('.hidden','w').write('h')\n"
        "os.makedirs('d/e', exist_ok=True)\nopen('d/e/f.bin','wb').write(bytes(range(256)))\n"
        "os.makedirs('empty', exist_ok=True)",
        "import os\nos.remove('a.txt')\nos.symlink('d/e/f.bin', 'link')\nos.symlink('d', 'dlink')\n"
        "os.mkfifo('fifo')\nos.link('.hidden', 'hard')",
        "open('a.txt','w').write('A')",
        "pass")
    assert rs[0].files == {"a.txt": b"A", ".hidden": b"h", "d/e/f.bin": bytes(range(256))}
    names0 = [m.name for m, _ in fc.read_tar(rs[0].archive)]
    assert not any(n.startswith("./") or n.startswith("/") for n in names0)
    assert rs[1].exit_code == 0, rs[1].stderr
    assert "a.txt" not in rs[1].files
    assert "link" not in rs[1].files and "fifo" not in rs[1].files
    assert not any(n.startswith("dlink") for n in rs[1].files)
    members1 = fc.read_tar(rs[1].archive)
    assert all(m.isreg() for m, _ in members1), [(m.name, m.type) for m, _ in members1]
    # §9.2: a second path to an inode is sent as a regular file (not a link member)
    assert rs[1].files.get("hard") == b"h" and rs[1].files.get(".hidden") == b"h"
    assert rs[2].files.get("a.txt") == b"A"
    assert rs[3].files == rs[2].files


def test_new_turn_is_fresh(daemon):
    """§9.1.17: no variables, no files, cwd is the empty workspace root; the
    globals hold exactly the §6.1 keys."""
    run_blocks(daemon, "secret_var = 42\nopen('left.txt','w').write('x')")
    _, (r1, r2) = run_blocks(
        daemon,
        "print(sorted(globals()))",
        "import os\nprint('secret_var' in globals(), os.listdir('.'))")
    assert r1.stdout == str(sorted(["__name__", "__doc__", "__package__", "__loader__",
                                    "__spec__", "__builtins__"])) + "\n"
    assert r2.stdout == "False []\n"
    assert r2.files == {}


def test_workspace_upload_is_extracted(daemon):
    """§2.3 state B: a non-empty workspace archive lands in the workspace root."""
    async def go():
        turn = await connect(daemon)
        r = await turn.run("print(open('in/data.txt').read())",
                           workspace=fc.make_tar({"in/data.txt": "payload"}))
        await turn.shutdown()
        return r
    r = arun(go(), T)
    assert r.stdout == "payload\n", r.stderr
    assert r.files == {"in/data.txt": b"payload"}


# ---- item 22: environment -------------------------------------------------

def test_environment_allowlist_and_token_absent(make_daemon):
    """§9.1.22 / §6.4 / §9.2: the token is in neither os.environ nor
    /proc/self/environ nor /proc/1/environ; only allowlisted names remain."""
    token = "tok-" + "7f3a9c2e" * 4
    d = make_daemon(env={"ADK_CODE_MODE_AUTH_TOKEN": token, "PORT": "1",
                         "FORKBOX_TEST_SECRET": "s3cr3t-value", "LANG": "C.UTF-8",
                         "ADK_CODE_MODE_MAX_UPLOAD_TOOLS": "104857600"})
    code = r'''
import os, json
def rd(p):
    try:
        return open(p, 'rb').read().decode('latin-1')
    except OSError as e:
        return 'ERR ' + type(e).__name__
print(json.dumps({"keys": sorted(os.environ), "self": rd('/proc/self/environ'),
                  "one": rd('/proc/1/environ')}))
'''
    _, (r,) = run_blocks(d, code, token=token)
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    bad = [k for k in info["keys"]
           if k not in ALLOWED_ENV and not k.startswith(ALLOWED_ENV_PREFIX)]
    assert bad == []
    for where in ("self", "one"):
        assert token not in info[where]
        assert "ADK_CODE_MODE" not in info[where]
        assert "s3cr3t-value" not in info[where]
    assert token not in r.stdout and "ADK_CODE_MODE_AUTH_TOKEN" not in r.stdout


# ---- item 23: outgoing encoding -------------------------------------------

def test_outgoing_frames_compact_raw_utf8_all_fields(daemon):
    """§9.1.23 / §3.1: compact separators, raw non-ASCII, lowercase \\u00xx
    escapes, raw U+007F/U+2028, trailing newline, every field present."""
    code = ("import sys\nprint('h\u00e9llo \u2713 \u2028\u007f')\n"
            + r"""sys.stdout.write('\x01\x1f\t\b\f\\"/')""" + "\nsys.stderr.write('e')")
    _, (r,) = run_blocks(daemon, code)
    raw = r.output_raw
    assert raw.endswith("\n") and raw.count("\n") == 1
    assert "h\u00e9llo \u2713 \u2028\u007f" in raw
    assert r'\u0001\u001f\t\b\f\\\"/' in raw
    obj = json.loads(raw)
    assert set(obj) == {"stdout", "stderr", "exit_code", "kind"}
    # byte-identical to Python's compact ensure_ascii=False dump (same key order)
    assert json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n" == raw
    done = json.loads(r.done_raw)
    assert set(done) == {"exit_code", "kind"} and r.done_raw.endswith("\n")
    assert r.done_raw.rstrip("\n") in ('{"exit_code":0,"kind":"done"}', '{"kind":"done","exit_code":0}')


# ---- §9.2 output improvements ---------------------------------------------

def test_fd_level_capture(daemon):
    """§9.2: writes to fd 1/2 are captured; sys.stdout.buffer exists."""
    _, (r,) = run_blocks(daemon, "import os, sys\nos.write(1, b'fd1\\n')\nos.write(2, b'fd2\\n')\n"
                                 "sys.stdout.flush()\nsys.stdout.buffer.write(b'buf\\n')")
    assert r.exit_code == 0, r.stderr
    assert "fd1\n" in r.stdout and "buf\n" in r.stdout
    assert "fd2\n" in r.stderr


def test_output_cap_keeps_head_and_tail_with_note(make_daemon):
    """§9.2: output over --output-cap is cut, keeping head and tail, with a note."""
    d = make_daemon(["--output-cap", "64K"])
    _, (r, r2) = run_blocks(d, "print('HEAD' + 'x' * 2_000_000 + 'TAIL')", "print('small')")
    assert r.exit_code == 0
    assert len(r.stdout.encode()) < 200_000
    assert r.stdout.startswith("HEAD")
    assert "TAIL" in r.stdout[-200:]
    assert "dropped" in r.stdout.lower() or "dropped" in r.stderr.lower()
    assert r2.stdout == "small\n"


def test_lone_surrogate_print(daemon):
    """§9.2: a lone surrogate in output does not break the turn."""
    _, (r, r2) = run_blocks(daemon, "print('a\\ud800b')\nprint('next')", "print('after')")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("a") and lines[0].endswith("b") and len(lines[0]) >= 3
    assert lines[1] == "next"
    assert r2.stdout == "after\n"
