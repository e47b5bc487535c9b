"""pytest settings for the fault suite (issue 26): a hard limit per test, a
make_daemon factory, and the daemons' stderr attached to a failing test (see
fbtest.py)."""

import fbtest  # tests/lib, on pythonpath by tests/pytest.ini
from fbtest_pytest import make_daemon, pytest_runtest_makereport  # noqa: F401

_hard_time_limit = fbtest.hard_time_limit(120)
