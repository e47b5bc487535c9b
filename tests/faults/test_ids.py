"""An id range has one owner (issue 26). A second forkboxd given the same
--id-range used to start without a word, and under load a host uid was held by
sandboxes of both at once (per-user kernel quotas shared: 52 times in a run).
Now forkboxd locks its range, `forkbox sandbox` its pair of its range
(src/sandbox/idlock.h), and whichever comes second on ids that another holds
refuses to start, naming the holder's pid and range; the range is free again
once its holder has exited.
"""

import os
import socket
import subprocess

import fbtest
from faults import record
from fbtest import FORKBOXD, POLICY, SRCDIR, run_blocks
from id_block import IdBlock

FORKBOX = os.environ.get("FORKBOX") or os.path.join(SRCDIR, "build", "src", "forkbox")
SMALL = ["--capacity", "4", "--pool", "0"]
STREAM = ["--capacity", "1", "--pool", "0"]  # what forkbox sandbox runs with: its range is checked so


def start_result(argv, env=None, timeout=15.0):
    """Run argv: (exit status, stderr), or (None, stderr) if it is still
    running after timeout (then it is killed)."""
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=env, start_new_session=True, pass_fds=())
    try:
        _, err = p.communicate(timeout=timeout)
        return p.returncode, err.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        _, err = p.communicate(timeout=10)
        return None, err.decode("utf-8", "replace")


def forkboxd(*args):
    return [FORKBOXD, "--listen", "127.0.0.1:0", "--policy", POLICY, *args]


def stream_env(tmp_path):
    tools = tmp_path / "pkg" / "tools"
    tools.mkdir(parents=True)
    (tools / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADK_CODE_MODE_")}
    env.update(ADK_CODE_MODE_WORKDIR=str(tmp_path / "ws"), ADK_CODE_MODE_TOOLS_DIR=str(tools),
               ADK_CODE_MODE_CONTROL_FD="3")
    return env


def test_a_second_daemon_on_an_overlapping_range_refuses_and_names_the_holder(make_daemon):
    ids = IdBlock()
    try:
        a = make_daemon(["--id-range", ids.arg()] + SMALL)
        rc, err = start_result(forkboxd("--id-range", f"{ids.first + 1000}:1000", *SMALL))
        line = next((x[x.index("--id-range"):] for x in err.splitlines() if "--id-range" in x),
                    "no word of it")
        record("a second forkboxd on an overlapping --id-range",
               ["still running after 15 s" if rc is None else f"exit {rc}: {line}"], [], "n/a")
        assert rc == 1, (rc, err)
        assert f"--id-range {ids.first + 1000}:1000 is not free: pid {a.pid} (forkboxd) holds " \
               f"ids {ids.arg()}" in err, err
        _, (r,) = run_blocks(a, "print('first')")  # the holder serves on
        assert r.stdout == "first\n", r
        a.stop()
        b = make_daemon(["--id-range", ids.arg()] + SMALL)  # free once its holder is gone
        _, (r,) = run_blocks(b, "print('second')")
        assert r.stdout == "second\n", r
    finally:
        ids.release()


def test_forkbox_sandbox_refuses_a_range_a_daemon_holds(make_daemon, tmp_path):
    ids = IdBlock()
    try:
        a = make_daemon(["--id-range", ids.arg()] + SMALL)
        ours, theirs = socket.socketpair()
        with ours:
            p = subprocess.Popen([FORKBOX, "sandbox", "--id-range", f"{ids.first - 64}:128", *STREAM],
                                 env=stream_env(tmp_path), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 pass_fds=(3,), preexec_fn=lambda: os.dup2(theirs.fileno(), 3))
            theirs.close()
            try:
                _, err = p.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate(timeout=10)
        err = err.decode("utf-8", "replace")
        assert p.returncode == 2, (p.returncode, err)
        assert f"pid {a.pid} (forkboxd) holds ids {ids.arg()}" in err, err
    finally:
        ids.release()


def test_a_daemon_refuses_a_range_where_forkbox_sandboxes_run(tmp_path):
    ids = IdBlock()
    ours, theirs = socket.socketpair()
    p = subprocess.Popen([FORKBOX, "sandbox", "--id-range", f"{ids.first}:64", *STREAM],
                         env=stream_env(tmp_path), stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(3,),
                         preexec_fn=lambda: os.dup2(theirs.fileno(), 3))
    theirs.close()
    try:
        ours.settimeout(30)
        assert b'"kind":"ready"' in ours.recv(65536)  # its sandbox runs, on its pair
        rc, err = start_result(forkboxd("--id-range", ids.arg(), *SMALL))
        assert rc == 1 and f"pid {p.pid} (forkbox) holds ids {ids.first}" in err, (rc, err)
        ours.sendall(b'{"kind":"shutdown"}\n')
        assert p.wait(30) == 0
        with fbtest.Daemon(["--id-range", ids.arg()] + SMALL) as d:  # free again
            _, (r,) = run_blocks(d, "print(3)")
            assert r.stdout == "3\n", r
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        ours.close()
        ids.release()
