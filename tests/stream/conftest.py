"""pytest settings for the stream transport suite (test_stream.py)."""

import fbtest  # tests/lib, on pythonpath by tests/pytest.ini

_hard_time_limit = fbtest.hard_time_limit(120)
