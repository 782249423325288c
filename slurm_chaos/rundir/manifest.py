"""``manifest.json``: what a run planned, which jobs it submitted, what finished, how long each stage took.

Written by the campaign after every change (atomically), read by the report, `status` and
`--resume`. Two older forms still load: the campaign's before the run directory had one owner
(the same keys, ``started`` as Unix seconds) and the analysis's minimal one (``run_id``, ``site``,
``started`` as ISO-8601 text, ``experiments``), which the synthetic run directories still write.
Keys added since (``switches``) are optional.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from slurm_chaos import __version__
from slurm_chaos.enums import parse_enum
from slurm_chaos.errors import DataError
from slurm_chaos.rundir.layout import MANIFEST, Role
from slurm_chaos.slurm.model import JobState

E = TypeVar("E", bound=StrEnum)


class RunKind(StrEnum):
    """Which command made the run directory."""

    RUN = "run"
    CAMPAIGN = "campaign"
    CALIBRATION = "calibration"


@dataclass(frozen=True)
class SubmittedJob:
    """One job the run submitted, as the run directory remembers it (Unix seconds)."""

    experiment: str
    role: Role
    job_id: str
    script: str
    submitted: float
    nodes: tuple[str, ...] = ()
    state: JobState = JobState.PENDING
    started: float | None = None
    ended: float | None = None
    restarts: int = 0


@dataclass
class Manifest:
    """The run's manifest; the campaign updates it as the run goes and saves it after each change."""

    run_id: str
    site: str
    started: float | None
    # Experiments with results, in plan order: what the report covers (a partial run covers fewer).
    experiments: list[str]
    cluster: str = ""
    kind: RunKind = RunKind.RUN
    tool_version: str = __version__
    python: str = field(default_factory=lambda: platform.python_version())
    slurm_version: str = ""
    host: str = field(default_factory=platform.node)
    finished: float | None = None
    interrupted: bool = False
    jobs: list[SubmittedJob] = field(default_factory=list)
    # Seconds spent per stage, by "<experiment>.<stage>" (and "analyse").
    timings: dict[str, float] = field(default_factory=dict)
    completed: list[str] = field(default_factory=list)
    planned: list[str] = field(default_factory=list)
    # Smallest change in step time that counts as a regression; None: the analysis's default.
    min_effect: float | None = None
    argv: list[str] = field(default_factory=lambda: list(sys.argv))
    # Node -> the switch it hangs off, from the site's racks when the campaign started: the report's
    # heat map groups ranks by it when the site config no longer loads (a sandbox site, once down).
    switches: dict[str, str] = field(default_factory=dict)

    def job(self, experiment: str, role: Role) -> SubmittedJob | None:
        return next((j for j in self.jobs if j.experiment == experiment and j.role == role), None)

    def put_job(self, job: SubmittedJob) -> None:
        """Add a job, or replace the record of the same job id."""
        for i, old in enumerate(self.jobs):
            if old.job_id == job.job_id:
                self.jobs[i] = job
                return
        self.jobs.append(job)

    def forget_job(self, experiment: str, role: Role) -> None:
        self.jobs = [j for j in self.jobs if not (j.experiment == experiment and j.role == role)]

    def complete(self, experiment: str) -> None:
        """Mark an experiment done; the report covers the completed ones in plan order."""
        if experiment not in self.completed:
            self.completed.append(experiment)
        self.experiments = [e for e in self.planned if e in self.completed]


def _to_json(manifest: Manifest) -> dict[str, Any]:
    data = asdict(manifest)
    data["kind"] = manifest.kind.value
    data["jobs"] = [
        {**asdict(j), "role": j.role.value, "nodes": list(j.nodes), "state": j.state.value}
        for j in manifest.jobs
    ]
    return data


def write_manifest(run_dir: Path, manifest: Manifest) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(_to_json(manifest), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, run_dir / MANIFEST)


def read_manifest(run_dir: Path) -> Manifest:
    """Read a run directory's manifest; anything malformed raises DataError naming the file and key."""
    path = run_dir / MANIFEST
    if not run_dir.is_dir():
        raise DataError(f"{run_dir}: no such run directory")
    if not path.is_file():
        raise DataError(f"{path}: no such file; is {run_dir} a slurm-chaos run directory?")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise DataError(f"{path}: expected a JSON object")
    return _manifest(raw, path)


_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": (str,),
    "site": (str,),
    "cluster": (str,),
    "tool_version": (str,),
    "python": (str,),
    "slurm_version": (str,),
    "host": (str,),
    "interrupted": (bool,),
}


def _manifest(raw: dict[str, Any], path: Path) -> Manifest:
    known = {f.name for f in fields(Manifest)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise DataError(f"{path}: {unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    for key in ("run_id", "experiments"):
        if key not in raw:
            raise DataError(f"{path}: {key}: missing")
    for key, types in _TYPES.items():
        if key in raw and (
            not isinstance(raw[key], types) or (bool not in types and isinstance(raw[key], bool))
        ):
            raise DataError(f"{path}: {key}: expected {types[0].__name__}, got {raw[key]!r}")
    names = _names(raw["experiments"], path, "experiments")
    if len(set(names)) != len(names):
        raise DataError(f"{path}: experiments: names repeat")
    min_effect = raw.get("min_effect")
    if min_effect is not None and (
        isinstance(min_effect, bool) or not isinstance(min_effect, (int, float)) or not 0 <= min_effect < 10
    ):
        raise DataError(f"{path}: min_effect: expected a fraction such as 0.02, got {min_effect!r}")
    timings = raw.get("timings", {})
    if not isinstance(timings, dict) or not all(_is_number(v) for v in timings.values()):
        raise DataError(f"{path}: timings: expected an object of seconds")
    argv = raw.get("argv", [])
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise DataError(f"{path}: argv: expected a list of strings")
    jobs = raw.get("jobs", [])
    if not isinstance(jobs, list):
        raise DataError(f"{path}: jobs: expected a list")
    switches = raw.get("switches", {})
    if not isinstance(switches, dict) or not all(isinstance(v, str) and v for v in switches.values()):
        raise DataError(f"{path}: switches: expected an object of node -> switch names")
    plain = {k: v for k, v in raw.items() if k in _TYPES}
    return Manifest(
        **plain,
        kind=_enum(RunKind, raw.get("kind", RunKind.RUN.value), path, "kind"),
        started=_when(raw.get("started"), path, "started"),
        experiments=names,
        finished=_when(raw.get("finished"), path, "finished"),
        jobs=[_job(j, path, i) for i, j in enumerate(jobs)],
        timings={str(k): float(v) for k, v in timings.items()},
        completed=_names(raw.get("completed", []), path, "completed"),
        planned=_names(raw.get("planned", []), path, "planned"),
        min_effect=None if min_effect is None else float(min_effect),
        argv=list(argv),
        switches={str(node): sw for node, sw in switches.items()},
    )


def _job(raw: object, path: Path, i: int) -> SubmittedJob:
    where = f"jobs[{i}]"
    if not isinstance(raw, dict):
        raise DataError(f"{path}: {where}: expected an object")
    known = {f.name for f in fields(SubmittedJob)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise DataError(f"{path}: {where}.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    for key in ("experiment", "job_id", "script"):
        if not isinstance(raw.get(key), str):
            raise DataError(f"{path}: {where}.{key}: expected a string, got {raw.get(key)!r}")
    submitted = _when(raw.get("submitted"), path, f"{where}.submitted")
    if submitted is None:
        raise DataError(f"{path}: {where}.submitted: missing")
    restarts = raw.get("restarts", 0)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        raise DataError(f"{path}: {where}.restarts: expected a count, got {restarts!r}")
    state = JobState.parse(str(raw.get("state", "PENDING")))
    return SubmittedJob(
        experiment=raw["experiment"],
        role=_enum(Role, raw.get("role"), path, f"{where}.role"),
        job_id=raw["job_id"],
        script=raw["script"],
        submitted=submitted,
        nodes=tuple(_names(raw.get("nodes", []), path, f"{where}.nodes")),
        state=state,
        started=_when(raw.get("started"), path, f"{where}.started"),
        ended=_when(raw.get("ended"), path, f"{where}.ended"),
        restarts=restarts,
    )


def _enum(kind: type[E], value: object, path: Path, key: str) -> E:
    try:
        return parse_enum(kind, value)
    except ValueError as exc:
        raise DataError(f"{path}: {key}: {exc}") from None


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _when(value: object, path: Path, key: str) -> float | None:
    """Unix seconds; the older analysis form wrote ISO-8601 text (``2026-01-01T00:00:00Z``)."""
    if value is None or value == "":
        return None
    if _is_number(value):
        return float(value)  # type: ignore[arg-type]
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    raise DataError(f"{path}: {key}: expected Unix seconds or an ISO-8601 time, got {value!r}")


def _names(value: object, path: Path, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise DataError(f"{path}: {key}: expected a list of names")
    return list(value)
