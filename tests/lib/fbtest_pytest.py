"""What the suites that start their own daemons share as pytest plumbing: the
make_daemon factory and the daemons' stderr attached to a failing test. A
suite's conftest.py imports both by name (pytest takes a conftest's fixtures
and hooks from its attributes, imported or not). Apart from fbtest.py, which
tools/bench/service uses without pytest."""

import pytest

import fbtest


@pytest.fixture
def make_daemon():
    """Factory: make_daemon(args=[...], env={...}) starts a dedicated daemon,
    stopped (its whole process group killed) at teardown."""
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
