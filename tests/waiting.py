"""Waiting on a state, not on time: tests poll for what they expect, bounded by a timeout."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.005) -> None:
    """Return once `predicate()` is true; fail the test after `timeout` seconds without it."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not true after {timeout:g} s: {getattr(predicate, '__name__', '')}")
        time.sleep(interval)
