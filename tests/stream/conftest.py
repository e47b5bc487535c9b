"""pytest settings for the stream transport suite (test_stream.py)."""

import os
import signal

import pytest

# No test may hang: a hard per-test wall-clock limit on top of the per-call
# timeouts inside the tests.
TEST_TIME_LIMIT = int(os.environ.get("FORKBOX_TEST_TIME_LIMIT", "120"))


class TestHang(Exception):
    pass


@pytest.fixture(autouse=True)
def _hard_time_limit():
    def on_alarm(signum, frame):
        raise TestHang(f"test exceeded {TEST_TIME_LIMIT}s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TEST_TIME_LIMIT)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)
