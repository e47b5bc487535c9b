"""Fixtures for the security suite: one forkboxd per test module.

Missing or broken daemons make tests fail (error), never skip: a protection that
cannot be shown to work is reported as not working.
"""

import sys

import pytest

import sbx

# Limits for the modules that only probe (they must not trip resource limits).
# --pool 0: process-accounting tests compare descendants before and after a turn,
# and a pool refill would add one; test_pool.py covers pooled sandboxes.
DEFAULT_ARGS = ["--capacity", "16", "--block-timeout", "60", "--turn-timeout", "180", "--pool", "0"]


@pytest.fixture(scope="module")
def daemon():
    with sbx.Daemon(DEFAULT_ARGS) as d:
        yield d


@pytest.fixture(autouse=True)
def _daemon_log_on_failure(request):
    """Attach the daemon's stderr tail to a failing test's report."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for name in ("daemon", "small_daemon"):
            if name in request.fixturenames:
                d = request.getfixturevalue(name)
                sys.stderr.write(f"\n--- forkboxd stderr ({name}) ---\n{d.stderr(2500)}\n")


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
