"""Run directories: one per `slurm-chaos run` or `campaign`, with a manifest.json that says what ran.

Layout::

    RUN_DIR/manifest.json
    RUN_DIR/experiments/<name>/{baseline,fault}.sbatch     rendered scripts
    RUN_DIR/experiments/<name>/{baseline,fault}/           Slurm output and the probe's rank-<R>.h5
    RUN_DIR/experiments/<name>/observations.json           what monitoring and Slurm did
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slurm_chaos import __version__
from slurm_chaos.errors import DataError

MANIFEST = "manifest.json"


@dataclass
class JobRecord:
    """One submitted job as the run directory remembers it."""

    experiment: str
    role: str
    job_id: str
    script: str
    submitted: float
    nodes: list[str] = field(default_factory=list)
    state: str = "PENDING"
    started: float | None = None
    ended: float | None = None
    restarts: int = 0


@dataclass
class Manifest:
    run_id: str
    site: str
    cluster: str
    started: float
    # Experiments with results, in plan order: what the report covers (a partial run covers fewer).
    experiments: list[str]
    kind: str = "run"
    tool_version: str = __version__
    python: str = field(default_factory=lambda: platform.python_version())
    slurm_version: str = ""
    host: str = field(default_factory=platform.node)
    finished: float | None = None
    interrupted: bool = False
    jobs: list[JobRecord] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    completed: list[str] = field(default_factory=list)
    planned: list[str] = field(default_factory=list)
    # Smallest change in step time that counts as a regression: the steady-state tolerance.
    min_effect: float = 0.05
    argv: list[str] = field(default_factory=lambda: list(sys.argv))

    def job(self, experiment: str, role: str) -> JobRecord | None:
        return next((j for j in self.jobs if j.experiment == experiment and j.role == role), None)


def new_run_id(label: str) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{label}"


def experiment_dir(run_dir: Path, name: str) -> Path:
    return run_dir / "experiments" / name


def write_manifest(run_dir: Path, manifest: Manifest) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(asdict(manifest), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, run_dir / MANIFEST)


def read_manifest(run_dir: Path) -> Manifest:
    path = run_dir / MANIFEST
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise DataError(f"{run_dir}: not a slurm-chaos run directory (no {MANIFEST})") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: unreadable manifest ({exc})") from exc
    jobs = [JobRecord(**j) for j in data.pop("jobs", [])]
    try:
        return Manifest(**data, jobs=jobs)
    except TypeError as exc:
        raise DataError(f"{path}: unexpected manifest layout ({exc})") from exc
