"""Progress for long waits: a live line on a terminal, one log line per change elsewhere."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO


@dataclass
class Progress:
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    quiet: bool = False
    _last: str = ""
    _prefix: str = ""

    @property
    def live(self) -> bool:
        return not self.quiet and self.stream.isatty()

    def experiment(self, index: int, total: int, name: str) -> None:
        bar_width = 20
        filled = int(bar_width * (index - 1) / max(total, 1))
        self._prefix = f"[{'#' * filled}{'.' * (bar_width - filled)}] {index}/{total}"
        self._say(f"{self._prefix} {name}", final=True)

    def job(self, title: str, job_id: str, state: str, started: float | None) -> None:
        elapsed = f" {time.time() - started:5.0f} s" if started else ""
        line = f"{self._prefix} {title}: job {job_id} {state}{elapsed}"
        if self.live:
            self._say(line)
        elif state != self._last:
            self._last = state
            self._say(line, final=True)

    def done(self, title: str, job_id: str, state: str) -> None:
        if self.live:
            self._say(f"{self._prefix} {title}: job {job_id} {state}", final=True)
        self._last = ""

    def _say(self, line: str, final: bool = False) -> None:
        if self.quiet:
            return
        if self.live:
            self.stream.write("\r\033[K" + line + ("\n" if final else ""))
        elif final:
            self.stream.write(line + "\n")
        self.stream.flush()
