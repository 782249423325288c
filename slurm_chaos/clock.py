"""Time as the campaign sees it: injected, so that tests run a long campaign in no time."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol


class Clock(Protocol):
    """Wall-clock time (for records), monotonic time (for deadlines) and sleeping."""

    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(seconds, 0.0))


@dataclass
class FakeClock:
    """A clock that moves only when slept on; records every sleep."""

    now: float = 1_700_000_000.0
    sleeps: list[float] = field(default_factory=list)

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(seconds, 0.0)

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Backoff:
    """Poll intervals that grow while nothing changes and start again from `initial` when it does."""

    initial: float = 0.5
    factor: float = 1.5
    maximum: float = 2.0
    _next: float = 0.0

    def __post_init__(self) -> None:
        self._next = self.initial

    def reset(self) -> None:
        self._next = self.initial

    def interval(self) -> float:
        """The wait before the next poll (then the one after grows)."""
        current = self._next
        self._next = min(self._next * self.factor, self.maximum)
        return current
