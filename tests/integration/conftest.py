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


class DaemonFactory:
    def __init__(self):
        self.started = []

    def __call__(self, args=(), env=None, **kw):
        d = fbtest.Daemon(list(args), env=env, **kw)
        self.started.append(d)
        return d.start()


@pytest.fixture
def make_daemon():
    """Factory: make_daemon(args=[...], env={...}) starts a dedicated daemon,
    stopped (whole process group killed) at teardown."""
    f = DaemonFactory()
    yield f
    for d in f.started:
        d.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the daemons' stderr to failing tests: it usually names the cause."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" and rep.failed:
        args = getattr(item, "funcargs", {})
        daemons = []
        if isinstance(args.get("daemon"), fbtest.Daemon):
            daemons.append(args["daemon"])
        if isinstance(args.get("make_daemon"), DaemonFactory):
            daemons += args["make_daemon"].started
        for i, d in enumerate(daemons):
            rep.sections.append((f"forkboxd stderr #{i} {d.args}", d.stderr()[-6000:]))
