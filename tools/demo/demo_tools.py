"""Demo host tools for tools/forkbox-run and the integration tests.

Top-level: echo, add, save_file, load_file, list_files (an in-memory,
artifact-like store). Namespaced: weather.get_forecast.
"""

from __future__ import annotations

import hashlib
import time

_FILES: dict[str, str] = {}


def echo(message):
    """Return the message unchanged, wrapped in a dict."""
    return {"echoed": message}


def add(a, b):
    """Add two numbers."""
    return a + b


def get_forecast(city, days=1):
    """A deterministic fake forecast for a city."""
    time.sleep(0.05)  # a little latency so parallel calls overlap
    h = int(hashlib.sha256(city.encode()).hexdigest(), 16)
    summaries = ["sunny", "cloudy", "rain", "snow", "windy"]
    return {"city": city, "days": days, "summary": summaries[h % len(summaries)],
            "high_c": 5 + h % 25}


def save_file(filename, content):
    """Save text content under a name (like save_artifact); returns the version."""
    _FILES[filename] = content
    return len(_FILES)


def load_file(filename):
    """Load saved text content, or None."""
    return _FILES.get(filename)


def list_files():
    """Names of the saved files."""
    return sorted(_FILES)


# Dotted tool name -> callable: what `forkbox run --tools demo_tools.py` offers.
TOOLS = {
    "echo": echo,
    "add": add,
    "save_file": save_file,
    "load_file": load_file,
    "list_files": list_files,
    "weather.get_forecast": get_forecast,
}


def demo_tools() -> dict:
    """Dotted tool name -> callable, ready for forkbox_client.ToolRegistry."""
    return dict(TOOLS)
