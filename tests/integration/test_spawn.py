"""The spawn path of a fresh sandbox, through the real daemon: --step-times'
record of what each step took (forkbox-bench --rows steps reads it).

Outcomes only, never timings: which lines appear, with which steps, in which
order, and that the default leaves them out."""

import re

from fbtest import run_blocks, wait_until

# The fork server's marks (src/core/steptime.c), in order, then the exit.
STEPS = ["request", "prepare", "clone", "maps", "handoff", "start", "go", "ids", "root",
         "scratch", "tools", "proc", "covers", "detach", "namespaces", "fds", "privs",
         "seccomp", "rlimits", "init", "afterfork", "serve", "tools_in", "ready", "run_in",
         "block", "snapshot", "exit"]
STEP_LINE = re.compile(r"sandbox (\d+) steps:(.*)")


def step_lines(d):
    return [(int(m.group(1)), m.group(2)) for m in map(STEP_LINE.search, d.stderr().splitlines())
            if m]


def test_step_times_one_line_per_fresh_sandbox(make_daemon):
    """--step-times: each fresh sandbox that ran a block gets one debug line
    when it is reaped, with every step in the order it ran, its wall time and
    CPU time (us) and page faults; the placer logs its placement's CPU.
    Without the flag (the default) there is none of it."""
    d = make_daemon(["--pool", "0", "--log-level", "debug", "--step-times"])
    for _ in range(2):
        _, res = run_blocks(d, "print(1)")
        assert res[0].stdout == "1\n"
    assert wait_until(lambda: len(step_lines(d)) >= 2, 10), d.stderr(3000)
    for pid, rest in step_lines(d):
        items = re.findall(r" (\w+)=(-?[\d.]+|nan)/(-?[\d.]+|nan)/(-?\d+)", rest)
        assert [name for name, *_ in items] == STEPS, rest
        for name, wall, cpu, faults in items:
            assert float(wall) >= 0, (name, rest)
            if name != "exit":  # the runtime's CPU at its exit is nobody's (steptime.h)
                assert float(cpu) >= 0 and int(faults) >= 0, (name, rest)
        assert re.search(rf"sandbox {pid} placed in \d+ us \(cpu \d+ us\)", d.stderr()), pid

    plain = make_daemon(["--pool", "0", "--log-level", "debug"])
    _, res = run_blocks(plain, "print(1)")
    assert res[0].stdout == "1\n"
    assert wait_until(lambda: "placed in" in plain.stderr(), 10)
    assert not step_lines(plain)
    assert "(cpu " not in plain.stderr()
