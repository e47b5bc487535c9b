"""The spawn path of a fresh sandbox, through the real daemon: --step-times'
record of what each step took (forkbox-bench --rows steps reads it).

Outcomes only, never timings: which lines appear, with which steps, in which
order, and that the default leaves them out."""

import json
import re

from fbtest import run_blocks, wait_until

# The fork server's marks (src/core/steptime.c), in order, then the exit.
STEPS = ["request", "prepare", "clone", "maps", "handoff", "start", "ids", "root",
         "scratch", "tools", "proc", "covers", "go", "namespaces", "fds", "privs",
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


# A block run in each turn: what a sandbox can tell of its network namespace,
# and what it leaves there for the next turn to find.
NETNS_PROBE = r'''
import errno, fcntl, json, os, socket
fd = os.open("/proc/self/ns/net", os.O_RDONLY)
try:  # NS_GET_USERNS: EPERM when the owner is outside our user namespace
    os.close(fcntl.ioctl(fd, 0xb701))
    owned = True
except OSError as e:
    owned = e.errno != errno.EPERM and e.errno
stats = {l.split(":")[0].strip(): l.split(":")[1].split()
         for l in open("/proc/net/dev").read().splitlines()[2:]}
taken = []
for port in (47011, 47012):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        taken.append(port)
    s.close()
try:
    socket.socket(socket.AF_UNIX).bind("\0forkbox-test-abstract")
    abstract_free = True
except OSError:
    abstract_free = False
# Leave things behind: a listener and an abstract socket that outlive the block
# (kept in a global of the turn), and traffic on lo.
import builtins
keep = [socket.socket(), socket.socket(socket.AF_UNIX)]
keep[0].bind(("127.0.0.1", 47011)); keep[0].listen()
keep[1].bind("\0forkbox-test-left-behind")
c = socket.create_connection(("127.0.0.1", 47011)); a, _ = keep[0].accept()
c.sendall(b"x" * 100000); a.recv(1 << 20)
builtins._keep = (keep, c, a)
try:
    socket.socket(socket.AF_UNIX).bind("\0forkbox-test-left-behind")
    left_free = True
except OSError:
    left_free = False
print(json.dumps({"ino": os.fstat(fd).st_ino, "owned": owned, "lo_rx": int(stats["lo"][0]),
                  "ifaces": sorted(stats), "taken": taken, "abstract_free": abstract_free,
                  "left_free_here": left_free}))
'''


def test_network_namespace_made_ahead_fresh_per_turn(make_daemon):
    """Each sandbox gets a network namespace of its own, made ahead by the
    fork server (netns.c): only lo, up, owned by the host's user namespace
    (so not by the sandbox's: it holds no capability over it), and nothing
    one turn leaves there (a listener, an abstract socket, traffic counted
    on lo) is in the next one's. Fresh and pooled sandboxes alike."""
    for args in (["--pool", "0"], ["--pool", "2"]):
        d = make_daemon(args)
        seen = []
        for _ in range(3):
            _, res = run_blocks(d, NETNS_PROBE)
            assert res[0].exit_code == 0, res[0].stderr
            seen.append(json.loads(res[0].stdout))
        for s in seen:
            assert s["owned"] is False, (args, s)
            assert s["ifaces"] == ["lo"], (args, s)
            assert s["lo_rx"] == 0, (args, s)  # nothing counted before this block
            assert s["taken"] == [] and s["abstract_free"], (args, s)
            assert s["left_free_here"] is False, (args, s)  # the socket did bind
        assert len({s["ino"] for s in seen}) == len(seen), (args, seen)
