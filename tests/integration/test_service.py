"""Issue 15 end to end, on one daemon: tools/bench/service --quick runs steady
load, scrapes /metrics, kills the fork server with SIGKILL, then SIGTERMs
forkboxd with turns in flight (a drain after a restart, which test_drain and
test_restart do not combine). It exits 1 on a failed turn outside the kill, no
recovery within 10 s, an exit status other than 0, or a process left behind."""

import os
import subprocess

from fbtest import FORKBOXD, SRCDIR


def test_service_quick():
    tool = os.path.join(SRCDIR, "tools", "bench", "service")
    p = subprocess.run([tool, "--quick", "--forkboxd", FORKBOXD], capture_output=True,
                       text=True, timeout=80)
    assert p.returncode == 0 and "RESULT: ok" in p.stdout, p.stdout + p.stderr
    assert "forkbox_forkserver_restarts_total 1" in p.stdout, p.stdout
