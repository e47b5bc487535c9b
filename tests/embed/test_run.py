"""`forkbox run` (issue 17 item 2): Python files as the blocks of one turn in a
local sandbox, no server, run as a user would from a shell: the build tree's
forkbox binary, its stdout, stderr and exit status.

The workspaces belong to an unprivileged owner (a user's directory): the
sandbox's writes land as that owner (the stream mount's id mapping)."""
import os
import subprocess
import textwrap

import pytest

FORKBOX = os.environ.get("FORKBOX") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "src", "forkbox")
OWNER = 65534  # nobody: any non-root owner will do
TIMEOUT = 120  # seconds for one `forkbox run`; a turn takes well under one on an idle machine


def forkbox_run(*args, cwd=None, stdin=None):
    env = {k: v for k, v in os.environ.items() if k != "FORKBOX"}
    return subprocess.run([FORKBOX, "run", *map(str, args)], cwd=cwd, input=stdin,
                          capture_output=True, text=True, timeout=TIMEOUT, env=env)


@pytest.fixture
def ws(tmp_path):
    d = tmp_path / "ws"
    d.mkdir()
    os.chown(d, OWNER, OWNER)
    return d


def block(tmp_path, name, code):
    p = tmp_path / name
    p.write_text(textwrap.dedent(code))
    return p


def test_one_file_prints_like_python(tmp_path, ws):
    f = block(tmp_path, "hello.py", """
        import sys
        print("hello from", sys.version_info[:2] >= (3, 11))
        print("to stderr", file=sys.stderr)
    """)
    r = forkbox_run("--workspace", ws, f)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hello from True\n"
    assert r.stderr == "to stderr\n"


def test_stdin_is_a_block(ws):
    r = forkbox_run("--workspace", ws, "-", stdin="print(6 * 7)\n")
    assert (r.returncode, r.stdout) == (0, "42\n"), r.stderr


def test_two_files_share_globals_in_order(tmp_path, ws):
    a = block(tmp_path, "a.py", "x = 41\nprint('a')\n")
    b = block(tmp_path, "b.py", "print('b', x + 1)\n")
    r = forkbox_run("--workspace", ws, a, "-", b, stdin="x += 0\nprint('stdin', x)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "a\nstdin 41\nb 42\n"


def test_tools_module_runs_on_the_host(tmp_path, ws):
    marker = tmp_path / "host-side.txt"
    tools = block(tmp_path, "host_tools.py", f"""
        import os

        def add(a, b):
            '''Add two numbers.'''
            with open({str(marker)!r}, "a") as f:   # a host path: the sandbox cannot see it
                f.write(f"pid {{os.getpid()}}\\n")
            return a + b

        def divide(a, b):
            return a / b

        def _private():
            return "not a tool"
    """)
    f = block(tmp_path, "use.py", f"""
        import os
        import tools
        print(tools.add(a=2, b=40))
        print(sorted(tools.__all__))
        try:
            tools.divide(a=1, b=0)
        except Exception as e:
            print(type(e).__name__, e)
        print(os.path.exists({str(marker)!r}))
    """)
    r = forkbox_run("--workspace", ws, "--tools", tools, f)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "42", "['add', 'divide']", "ToolError ZeroDivisionError: division by zero", "False"]
    # Called in a host process (not the sandbox's): the host file has the line.
    assert marker.read_text().startswith("pid ")


def test_tools_dict_names_namespaced_tools(tmp_path, ws):
    """A module's TOOLS dict replaces its public functions: dotted names are
    namespaces (the demo tools of README's quick start)."""
    demo = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "demo", "demo_tools.py")
    f = block(tmp_path, "use.py", """
        import tools
        from tools.weather import get_forecast
        print(sorted(tools.__all__), get_forecast(city="Oslo")["city"])
    """)
    r = forkbox_run("--workspace", ws, "--tools", demo, f)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("['add', 'echo', 'list_files', 'load_file', 'save_file'] "
                        "Oslo\n"), r.stdout
    bad = block(tmp_path, "bad_tools.py", "TOOLS = {'x': 1}\n")
    r = forkbox_run("--workspace", ws, "--tools", bad, f)
    assert r.returncode == 125 and "TOOLS" in r.stderr, (r.returncode, r.stderr)


def test_tools_module_that_fails_to_import_is_named_with_its_own_frames(tmp_path, ws):
    """A --tools file that raises on import: the turn does not start (125),
    the reason names the file and the error, the traceback shows its lines."""
    f = block(tmp_path, "use.py", "print('never')\n")
    bad = block(tmp_path, "bad_import.py", "x = 1\nimport no_such_module_here\n")
    r = forkbox_run("--workspace", ws, "--tools", bad, f)
    assert r.returncode == 125, (r.returncode, r.stderr)
    lines = r.stderr.rstrip().splitlines()
    assert lines[-1] == (f"forkbox run: --tools {os.path.realpath(bad)}: ModuleNotFoundError: "
                         "No module named 'no_such_module_here'"), r.stderr
    assert f'File "{os.path.realpath(bad)}", line 2' in r.stderr, r.stderr
    assert "forkbox_embed.py" not in r.stderr and "never" not in r.stdout, r.stderr


def test_uncaught_tool_error_ends_the_block_with_a_traceback(tmp_path, ws):
    tools = block(tmp_path, "t.py", "def boom():\n    raise ValueError('no luck')\n")
    r = forkbox_run("--workspace", ws, "--tools", tools, "-", stdin="import tools\ntools.boom()\n")
    assert r.returncode == 1
    assert r.stderr.rstrip().splitlines()[-1] == \
        "adk_code_mode_sandbox._rpc_client.ToolError: ValueError: no luck"


@pytest.mark.parametrize("first, last, status", [
    ("pass", "import sys; sys.exit(3)", 3),
    ("raise SystemExit(4)", "print('fine')", 0),
    ("pass", "1 / 0", 1),
    ("pass", "import sys; sys.exit(300)", 300 & 0xFF),
])
def test_exit_status_is_the_last_blocks(tmp_path, ws, first, last, status):
    a = block(tmp_path, "a.py", first + "\n")
    b = block(tmp_path, "b.py", last + "\n")
    r = forkbox_run("--workspace", ws, a, b)
    assert r.returncode == status, r.stderr
    if last == "1 / 0":
        assert r.stderr.rstrip().endswith("ZeroDivisionError: division by zero")


def test_written_file_lands_in_the_workspace(tmp_path, ws):
    (ws / "in.txt").write_text("from the host\n")
    f = block(tmp_path, "w.py", """
        import os
        print(open("in.txt").read().strip(), os.getcwd())
        with open("out.txt", "w") as fh:
            fh.write("from the block\\n")
    """)
    r = forkbox_run("--workspace", ws, f)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"from the host {ws}\n"
    assert (ws / "out.txt").read_text() == "from the block\n"
    assert os.stat(ws / "out.txt").st_uid == OWNER


def test_default_workspace_is_the_current_directory(tmp_path, ws):
    f = block(tmp_path, "cwd.py", """
        import os
        print(os.getcwd())
        open("made-here.txt", "w").write("x")
    """)
    r = forkbox_run(f, cwd=ws)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{ws}\n"
    assert (ws / "made-here.txt").read_text() == "x"


def test_failures_of_forkbox_run_itself_are_125(tmp_path, ws):
    r = forkbox_run("--workspace", ws, tmp_path / "missing.py")
    assert r.returncode == 125
    assert "missing.py" in r.stderr
    r = forkbox_run("--workspace", tmp_path / "no-such-dir", "-", stdin="print(1)\n")
    assert r.returncode == 125
    assert "no-such-dir" in r.stderr


MiB = 1 << 20


@pytest.mark.parametrize("n", [MiB, 16 * MiB, 100 * MiB])
def test_output_and_tool_frames_of_any_size(tmp_path, ws, n):
    """Tool arguments and results of n bytes arrive whole; so does output up
    to --output-cap (16 MiB), and beyond it its head and tail with a note.
    Frames longer than the socket's buffer hung forkbox run for ever."""
    tools = block(tmp_path, "t.py", """
        def echo(data):
            return {"len": len(data), "data": "c" * len(data)}
    """)
    f = block(tmp_path, "big.py", f"""
        import sys, tools
        r = tools.echo(data="a" * {n})
        print(r["len"], len(r["data"]), set(r["data"]), file=sys.stderr)
        sys.stdout.write("b" * {n})
    """)
    r = forkbox_run("--workspace", ws, "--tools", tools, f)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr == f"{n} {n} {{'c'}}\n"
    if n <= 16 * MiB:
        assert r.stdout == "b" * n, len(r.stdout)
    else:
        note = f"\n[forkbox: {n - 16 * MiB} bytes of stdout dropped]\n"
        assert r.stdout == "b" * (8 * MiB) + note + "b" * (8 * MiB), len(r.stdout)


def test_nesting_past_the_limit_is_125_with_the_reason(tmp_path, ws):
    """A tool call nested past the one limit (512 levels) ends the turn in the
    sandbox's relay; forkbox run says why and exits 125, with no traceback
    (900 levels reached the host before, whose json.loads a deeper stack can fail on)."""
    tools = block(tmp_path, "t.py", "def echo(message):\n    return 1\n")
    for levels, ok in ((510, True), (511, False), (900, False)):
        f = block(tmp_path, "nest.py", f"""
            import tools
            v = []
            for _ in range({levels} - 1):
                v = [v]
            print(tools.echo(message=v))
        """)
        r = forkbox_run("--workspace", ws, "--tools", tools, f)
        if ok:
            assert (r.returncode, r.stdout) == (0, "1\n"), r.stderr
            continue
        assert r.returncode == 125, (levels, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr, r.stderr
        assert r.stderr.endswith("forkbox run: sandbox closed the channel while waiting for done, "
                                 "exit status 1: sandbox protocol error: JSON nested too deeply\n"), \
            r.stderr


def test_python_api_raises_sandbox_error_with_the_reason(tmp_path, ws):
    """The embedding API: a protocol fault is a SandboxError naming it."""
    import forkbox_embed  # tools/, on pythonpath by tests/pytest.ini
    with forkbox_embed.Sandbox({"echo": lambda message: 1}, workspace=str(ws),
                               forkbox=FORKBOX) as sb:
        with pytest.raises(forkbox_embed.SandboxError) as e:
            sb.run("import tools\nv = []\nfor _ in range(600):\n    v = [v]\ntools.echo(message=v)",
                   timeout=TIMEOUT)
        assert e.value.status == 1
        assert str(e.value).endswith(": sandbox protocol error: JSON nested too deeply"), str(e.value)
