"""The process, cross-turn and secret cases of test_processes.py again, against a
daemon with pre-forked sandboxes (--pool 2): a pooled sandbox is created before
its turn exists, so it must still never hold the token, see another turn's
files, or outlive its turn."""

import pytest

import sbx
from conftest import DEFAULT_ARGS
from test_processes import *  # noqa: F401,F403  (the same tests, collected here too)
from test_processes import cross_turn, host_pids  # noqa: F401  (their fixtures)


@pytest.fixture(scope="module")
def daemon():
    with sbx.Daemon(DEFAULT_ARGS + ["--pool", "2"]) as d:
        yield d


def test_this_module_runs_against_the_pooled_daemon(daemon):
    assert "--pool" in daemon.argv
    st, body = daemon.health()
    assert (st, body) == (200, b"OK\n")
