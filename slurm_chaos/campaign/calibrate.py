"""`slurm-chaos calibrate`: run the A/A control job several times on the cluster, then calibrate.

Each run is the control experiment's baseline job (no fault), submitted one after another so that
they share the cluster's conditions no more than a baseline and its fault run would. The runs land
in RUN_DIR/aa/run-<i>/; the calibration is written to RUN_DIR/calibration.json.
"""

from __future__ import annotations

from pathlib import Path

from slurm_chaos import rundir
from slurm_chaos.analysis.calibrate import AACalibration, calibrate_dirs
from slurm_chaos.analysis.regression import MIN_EFFECT
from slurm_chaos.campaign.engine import Campaign, run_unfaulted
from slurm_chaos.errors import UsageError

MIN_RUNS = 3


def run_calibration(camp: Campaign, runs: int) -> AACalibration:
    """Submit ``runs`` unfaulted jobs of the campaign's one experiment and calibrate on them."""
    if runs < MIN_RUNS:
        raise UsageError(f"--runs {runs}: at least {MIN_RUNS} runs are needed for pairs to compare")
    if len(camp.experiments) != 1:
        raise UsageError("A/A calibration runs one experiment's job")
    (exp,) = camp.experiments
    dirs = []
    for i in range(runs):
        camp.progress.experiment(i + 1, runs, f"A/A run {i}")
        dirs.append(run_unfaulted(camp, exp, f"aa:{i}", rundir.aa_dir(camp.run_dir, i), f"A/A run {i}"))
    camp.manifest.finished = camp.clock.time()
    camp.save()
    min_effect = MIN_EFFECT if camp.manifest.min_effect is None else camp.manifest.min_effect
    result = calibrate_dirs(dirs, min_effect)
    write_calibration(camp.run_dir, result)
    return result


def write_calibration(run_dir: Path, result: AACalibration) -> Path:
    return rundir.write_calibration(run_dir, result.to_json())
