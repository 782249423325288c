"""`slurm-chaos status RUN_DIR`: what a run holds and where its jobs stand."""

from __future__ import annotations

import time
from pathlib import Path

from slurm_chaos.rundir import Manifest, read_manifest


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "Z" if t else "-"


def format_status(manifest: Manifest, live: dict[str, str]) -> str:
    lines = [
        f"run {manifest.run_id} ({manifest.kind}) on {manifest.cluster}, site {manifest.site}",
        f"started {_when(manifest.started)}, finished {_when(manifest.finished)}"
        + (" (interrupted)" if manifest.interrupted else ""),
        f"slurm-chaos {manifest.tool_version}, Slurm {manifest.slurm_version or '?'}, Python {manifest.python}",
        f"experiments: {len(manifest.completed)}/{len(manifest.experiments)} complete",
        "",
        f"{'EXPERIMENT':<24} {'ROLE':<9} {'JOB':>8} {'STATE':<12} {'RESTARTS':>8}  NODES",
    ]
    for j in manifest.jobs:
        state = live.get(j.job_id, j.state)
        lines.append(
            f"{j.experiment:<24} {j.role:<9} {j.job_id:>8} {state:<12} {j.restarts:>8}  {','.join(j.nodes) or '-'}"
        )
    return "\n".join(lines)


def run_status(run_dir: Path, live: dict[str, str] | None = None) -> tuple[str, int]:
    """Text for the terminal and an exit code (0 when the run finished uninterrupted)."""
    manifest = read_manifest(run_dir)
    done = manifest.finished is not None and not manifest.interrupted
    return format_status(manifest, live or {}), 0 if done else 1
