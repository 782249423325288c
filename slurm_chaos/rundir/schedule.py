"""``fault/schedule.json``: the switchback schedule a fault job was given, as JSON data.

The campaign writes it before it submits the job (the probe reads it through ``--fault-schedule``);
the analysis reads it back and parses it (:func:`slurm_chaos.schedule.schedule_from_json`).
This module only owns the file: it does not know the schedule's fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurm_chaos.errors import DataError
from slurm_chaos.rundir.layout import SCHEDULE


def schedule_path(job_dir: Path) -> Path:
    return job_dir / SCHEDULE


def write_schedule(job_dir: Path, data: Mapping[str, Any]) -> Path:
    """Write the schedule's JSON form into the job's directory (created if missing)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    path = schedule_path(job_dir)
    path.write_text(json.dumps(dict(data), indent=2, sort_keys=True) + "\n")
    return path


def read_schedule(job_dir: Path) -> dict[str, Any] | None:
    """The JSON object in the job's ``schedule.json``; None when the job has none (a job of a
    between-runs experiment). A file that is there but unreadable is a DataError naming it."""
    path = schedule_path(job_dir)
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: cannot read the fault schedule ({exc})") from exc
    if not isinstance(raw, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw
