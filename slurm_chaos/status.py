"""`slurm-chaos status RUN_DIR`: what a run holds and where its jobs stand."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from slurm_chaos.errors import ChaosError
from slurm_chaos.rundir import Manifest, read_manifest

log = logging.getLogger(__name__)


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "Z" if t else "-"


def format_status(manifest: Manifest, live: dict[str, str]) -> str:
    lines = [
        f"run {manifest.run_id} ({manifest.kind}) on {manifest.cluster}, site {manifest.site}",
        f"started {_when(manifest.started)}, finished {_when(manifest.finished)}"
        + (" (interrupted)" if manifest.interrupted else ""),
        f"slurm-chaos {manifest.tool_version}, Slurm {manifest.slurm_version or '?'}, "
        f"Python {manifest.python}",
        f"experiments: {len(manifest.completed)}/{len(manifest.experiments)} complete",
        "",
        f"{'EXPERIMENT':<24} {'ROLE':<9} {'JOB':>8} {'STATE':<12} {'RESTARTS':>8}  NODES",
    ]
    for j in manifest.jobs:
        state = live.get(j.job_id, j.state)
        lines.append(
            f"{j.experiment:<24} {j.role:<9} {j.job_id:>8} {state:<12} {j.restarts:>8}  "
            f"{','.join(j.nodes) or '-'}"
        )
    return "\n".join(lines)


def status_json(manifest: Manifest, live: dict[str, str]) -> dict[str, Any]:
    """What `format_status` shows, as JSON data (times as Unix seconds, None when unknown)."""
    return {
        "run_id": manifest.run_id,
        "kind": str(manifest.kind),
        "cluster": manifest.cluster,
        "site": manifest.site,
        "started": manifest.started,
        "finished": manifest.finished,
        "interrupted": manifest.interrupted,
        "tool_version": manifest.tool_version,
        "slurm_version": manifest.slurm_version,
        "python": manifest.python,
        "experiments": list(manifest.experiments),
        "completed": list(manifest.completed),
        "jobs": [
            {
                "experiment": j.experiment,
                "role": str(j.role),
                "job_id": j.job_id,
                "state": live.get(j.job_id, str(j.state)),
                "restarts": j.restarts,
                "nodes": list(j.nodes),
            }
            for j in manifest.jobs
        ],
    }


def live_states(manifest: Manifest) -> dict[str, str]:
    """Current state of the run's unfinished jobs, in one query; empty when Slurm cannot say."""
    from slurm_chaos.runner import SubprocessRunner
    from slurm_chaos.sandbox.layout import site_placeholders
    from slurm_chaos.site import load_site
    from slurm_chaos.slurm.backend import make_scheduler

    open_jobs = [j.job_id for j in manifest.jobs if j.ended is None]
    if not open_jobs:
        return {}
    try:
        site = load_site(manifest.site, site_placeholders)
        scheduler = make_scheduler(site.slurm_env(), SubprocessRunner())
        return {job_id: info.state.value for job_id, info in scheduler.poll(open_jobs).items()}
    except ChaosError as exc:
        log.warning("job states from the manifest only: %s", exc)
        return {}


def run_status(run_dir: Path, live: bool = True, fmt: str = "text") -> tuple[str, int]:
    """Text (or, with fmt "json", one JSON document) for the terminal and an exit code (0 when the
    run finished uninterrupted)."""
    manifest = read_manifest(run_dir)
    done = manifest.finished is not None and not manifest.interrupted
    states = live_states(manifest) if live else {}
    if fmt == "json":
        text = json.dumps({**status_json(manifest, states), "exit_code": 0 if done else 1}, indent=2)
    else:
        text = format_status(manifest, states)
    return text, 0 if done else 1
