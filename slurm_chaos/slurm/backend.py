"""The door to Slurm: the `Scheduler` interface and the function that picks its implementation."""

from __future__ import annotations

from collections.abc import Mapping

from slurm_chaos.runner import Runner
from slurm_chaos.slurm.protocol import Scheduler
from slurm_chaos.slurm.select import select_scheduler

__all__ = ["Scheduler", "make_scheduler"]


def make_scheduler(env: Mapping[str, str], runner: Runner, timeout: float = 8.0) -> Scheduler:
    """pyslurm when it imports and matches the installed Slurm (major.minor), else the CLI."""
    return select_scheduler(env, runner, timeout)
