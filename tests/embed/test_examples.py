"""The embedding API's examples (issue 17 item 3), run as a host would run
them: examples/embed.c built by meson against libforkbox-embed, and
examples/embed.py with forkbox_embed on its path. Each starts the build
tree's `forkbox sandbox` on a socketpair, answers tool calls on the host and
reads back the workspace file a block wrote."""
import os
import subprocess
import sys

SRC = os.environ.get("FORKBOX_SRCDIR") or os.path.join(os.path.dirname(__file__), "..", "..")
FORKBOX = os.environ.get("FORKBOX") or os.path.join(SRC, "build", "src", "forkbox")
EXAMPLE = os.environ.get("FORKBOX_EMBED_EXAMPLE") or os.path.join(SRC, "build", "examples", "embed")
TIMEOUT = 120


def test_c_example():
    r = subprocess.run([EXAMPLE, FORKBOX], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "ready: protocol 2",
        'tool_call add {"a":2,"b":40}',
        "done: exit_code 0",
        "stdout: the host says 42",
        "workspace: answer.txt: 42",
        "sandbox exited 0",
    ]


def test_python_example():
    env = dict(os.environ, PYTHONPATH=os.path.join(SRC, "tools"))
    r = subprocess.run(["/usr/bin/python3", os.path.join(SRC, "examples", "embed.py"), FORKBOX],
                       capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "ready: protocol 2",
        "block 1: 0 the host says 42 ['add']",
        "block 2: 1 21 42 adk_code_mode_sandbox._rpc_client.ToolError: "
        "KeyError: 'no data for Atlantis'",
        "workspace: answer.txt: 42",
    ]
