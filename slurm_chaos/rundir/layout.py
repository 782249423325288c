"""File and directory names inside a run directory (the layout is drawn in the package docstring)."""

from __future__ import annotations

import time
from enum import StrEnum
from pathlib import Path

MANIFEST = "manifest.json"
OBSERVATIONS = "observations.json"
CONTROLLER_JOURNAL = "controller-journal.jsonl"
#: In a held fault job's directory: the campaign creates it to let the probe end (its hold).
RELEASE = "release"
#: In a fault job's directory: one ``<node>.json`` per node, whether each node fault took there.
INJECTIONS = "injections"
#: In a switchback fault job's directory: the schedule of on/off blocks it was given (schedule.py).
SCHEDULE = "schedule.json"


class Role(StrEnum):
    """Which of an experiment's two jobs: the unfaulted baseline or the fault run (also the names of
    their script and output directory)."""

    BASELINE = "baseline"
    FAULT = "fault"


def new_run_id(label: str, now: float | None = None) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f"-{label}"


def experiment_dir(run_dir: Path, name: str) -> Path:
    return run_dir / "experiments" / name


def baseline_dir(run_dir: Path, shape_label: str) -> Path:
    """Jobs of one shape share a baseline run."""
    return run_dir / "baselines" / shape_label


def aa_dir(run_dir: Path, index: int) -> Path:
    return run_dir / "aa" / f"run-{index}"
