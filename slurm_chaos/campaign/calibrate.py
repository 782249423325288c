"""`slurm-chaos calibrate`: run the A/A control job several times on the cluster, then calibrate.

Each run is the control experiment's job with no fault, submitted one after another so that they
share the cluster's conditions no more than a baseline and its fault run would. A placebo experiment
(``design: switchback`` with no fault, as the shipped control-aa) runs on a placebo schedule of its
own each time, so that every run is also judged on its own on/off blocks: the false-positive rate
and the MDE of the in-job test. The runs land in RUN_DIR/aa/run-<i>/; the calibration is written
to RUN_DIR/calibration.json.
"""

from __future__ import annotations

from pathlib import Path

from slurm_chaos import rundir
from slurm_chaos.analysis.calibrate import AACalibration, calibrate_dirs
from slurm_chaos.analysis.regression import MIN_EFFECT
from slurm_chaos.campaign.engine import Campaign, run_unfaulted
from slurm_chaos.errors import UsageError
from slurm_chaos.experiment import Experiment

MIN_RUNS = 3


def on_placebo_schedules(exp: Experiment) -> bool:
    """Whether the experiment's A/A runs follow placebo schedules of their own, as its job does in
    a campaign (a switchback experiment without a fault), so that they calibrate the in-job test
    too; any other experiment's runs are its unfaulted baseline job."""
    return exp.is_control and exp.is_switchback


def calibration_plan(exp: Experiment, runs: int) -> str:
    """What a calibration of ``runs`` runs of ``exp`` will do, for a dry run."""
    own = ", each on a placebo schedule of its own" if on_placebo_schedules(exp) else ""
    return f"then {runs} A/A runs of {exp.name}{own}, every pair compared"


def run_calibration(camp: Campaign, runs: int) -> AACalibration:
    """Submit ``runs`` unfaulted jobs of the campaign's one experiment and calibrate on them."""
    if runs < MIN_RUNS:
        raise UsageError(f"--runs {runs}: at least {MIN_RUNS} runs are needed for pairs to compare")
    if len(camp.experiments) != 1:
        raise UsageError("A/A calibration runs one experiment's job")
    (exp,) = camp.experiments
    placebo = on_placebo_schedules(exp)
    dirs = []
    for i in range(runs):
        camp.progress.experiment(i + 1, runs, f"A/A run {i}")
        job_dir = rundir.aa_dir(camp.run_dir, i)
        dirs.append(run_unfaulted(camp, exp, f"aa:{i}", job_dir, f"A/A run {i}", i if placebo else None))
    camp.manifest.finished = camp.clock.time()
    camp.save()
    min_effect = MIN_EFFECT if camp.manifest.min_effect is None else camp.manifest.min_effect
    result = calibrate_dirs(dirs, min_effect)
    write_calibration(camp.run_dir, result)
    return result


def write_calibration(run_dir: Path, result: AACalibration) -> Path:
    return rundir.write_calibration(run_dir, result.to_json())
