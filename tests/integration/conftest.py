"""pytest fixtures for the forkboxd integration suite (see fbtest.py)."""

import pytest

import fbtest  # tests/lib, on pythonpath by tests/pytest.ini

_hard_time_limit = fbtest.hard_time_limit(90)


@pytest.fixture(scope="module")
def daemon():
    """One daemon with default flags for a whole test module."""
    d = fbtest.Daemon(["--log-level", "info"]).start()
    yield d
    d.stop()


@pytest.fixture
def make_daemon():
    """Factory: make_daemon(args=[...], env={...}) starts a dedicated daemon,
    stopped (whole process group killed) at teardown."""
    f = fbtest.DaemonFactory()
    yield f
    f.stop_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the daemons' stderr to failing tests: it usually names the cause."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" and rep.failed:
        rep.sections += fbtest.stderr_sections(getattr(item, "funcargs", {}))
