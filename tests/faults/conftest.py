"""pytest settings for the fault suite (issue 26): a hard limit per test, a
make_daemon factory, and the daemons' stderr attached to a failing test (see
fbtest.py)."""

import pytest

import fbtest  # tests/lib, on pythonpath by tests/pytest.ini

_hard_time_limit = fbtest.hard_time_limit(120)


@pytest.fixture
def make_daemon():
    """Factory: make_daemon(args=[...], **kw) starts a daemon, stopped (its
    whole process group killed) at teardown."""
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
