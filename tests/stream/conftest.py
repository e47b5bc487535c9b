"""pytest settings for the stream suite (test_stream.py, test_hostdir.py)."""

import fbtest  # tests/lib, on pythonpath by tests/pytest.ini

_hard_time_limit = fbtest.hard_time_limit(120)
