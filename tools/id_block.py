"""A block of host ids of its own for each forkboxd that a test or a tool starts.

forkboxd locks its --id-range (src/sandbox/idlock.h): a second daemon whose
range overlaps it refuses to start. Test suites run in parallel (meson, CI,
several engineers on one machine), so no test daemon may take the default
range or one another run could pick: each gets an aligned block of BLOCK ids
out of [FIRST, FIRST + BLOCKS * BLOCK), clear of forkboxd's and forkbox
sandbox's default ranges (which daemons outside the tests may hold) and of any
host user here. A block is ours while we hold flock() on DIR/<first> (the lock
goes with the process, kill -9 included; the files stay, so no holder can lose
its lock to an unlink); a daemon that needs more ids takes n blocks in a row,
aligned to n, locking each. The daemon's own lock is the backstop: this only keeps
test runs from colliding with each other. Old builds, which lock nothing, get
a block of their own all the same (A/B benchmarks).

    block = IdBlock()             # raises RuntimeError if every block is held
    argv += ["--id-range", block.arg()]
    ...
    block.release()               # once the daemon has exited

Used by tests/lib/fbtest.py, tools/soak, tools/bench/attack (and the
benchmarks built on it); tools/bench/server.c and tools/deb-test take a block
the same way (flock on the same files). Standard library only.
"""

from __future__ import annotations

import fcntl
import os
import random

FIRST = 0x7A000000  # 2046820352: above forkbox sandbox's default range, below 2^31
BLOCK = 4096        # ids per block: 2 x (capacity + pool) for any test daemon
BLOCKS = 1024
DIR = "/run/forkbox/test-ids"


class IdBlock:
    """n aligned blocks of BLOCK ids in a row (each block's file locked), ours
    until release() (or our exit)."""

    def __init__(self, n: int = 1) -> None:
        os.makedirs(DIR, mode=0o700, exist_ok=True)
        groups = BLOCKS // n
        start = random.randrange(groups)
        for i in range(groups):
            first = FIRST + (start + i) % groups * n * BLOCK
            self.fds: list[int] = []
            for k in range(n):
                fd = os.open(os.path.join(DIR, str(first + k * BLOCK)),
                             os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    break
                self.fds.append(fd)
            if len(self.fds) == n:
                self.first, self.count = first, n * BLOCK
                return
            self.release()
        raise RuntimeError(f"no {n} blocks of test ids in a row free in {DIR}")

    def arg(self, count: int | None = None) -> str:
        """FIRST:COUNT for --id-range: the block, or its first count ids."""
        return f"{self.first}:{count or self.count}"

    def __contains__(self, uid: int) -> bool:
        return self.first <= uid < self.first + self.count

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
