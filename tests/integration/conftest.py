"""pytest fixtures for the forkboxd integration suite (see fbtest.py)."""

import pytest

import fbtest  # tests/lib, on pythonpath by tests/pytest.ini
from fbtest_pytest import make_daemon, pytest_runtest_makereport  # noqa: F401

_hard_time_limit = fbtest.hard_time_limit(90)


@pytest.fixture(scope="module")
def daemon():
    """One daemon with default flags for a whole test module."""
    d = fbtest.Daemon(["--log-level", "info"]).start()
    yield d
    d.stop()
