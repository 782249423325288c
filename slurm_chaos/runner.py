"""The one way this package runs external commands: argv lists through an injected runner."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completed:
    """Outcome of one command."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class Runner(Protocol):
    """Runs argv (never a shell string) and returns its outcome; never raises on non-zero exit."""

    def __call__(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> Completed: ...


@dataclass
class SubprocessRunner:
    """Runs commands for real; `env` entries are added to the inherited environment."""

    base_env: Mapping[str, str] = field(default_factory=dict)

    def __call__(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> Completed:
        full_env = {**os.environ, **self.base_env, **(env or {})}
        log.debug("run %s", " ".join(argv))
        try:
            proc = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=timeout,
                env=full_env,
                input=input,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return Completed(tuple(argv), 124, out, f"timed out after {timeout} s")
        except FileNotFoundError:
            return Completed(tuple(argv), 127, "", f"{argv[0]}: command not found")
        return Completed(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


class Invocation(NamedTuple):
    """One command a FakeRunner was asked to run, with the bounds and environment it was given."""

    argv: tuple[str, ...]
    timeout: float | None
    env: Mapping[str, str] | None


@dataclass
class FakeRunner:
    """Replays canned outputs for unit tests; records every argv it was asked to run (``calls``)
    and, for tests of what a command is run with, its timeout and environment (``invocations``)."""

    responses: Callable[[tuple[str, ...]], Completed]
    calls: list[tuple[str, ...]] = field(default_factory=list)
    invocations: list[Invocation] = field(default_factory=list)

    def __call__(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> Completed:
        key = tuple(argv)
        self.calls.append(key)
        self.invocations.append(Invocation(key, timeout, env))
        return self.responses(key)
