"""The run directory: one per `slurm-chaos run`, `campaign` or `calibrate`, and the one owner of its files.

Layout (file -> the module here that reads and writes it)::

    RUN_DIR/manifest.json                       manifest.py      what ran: plan, jobs, timings
    RUN_DIR/controller-journal.jsonl            campaign/controller.py (write-ahead journal)
    RUN_DIR/calibration.json                    calibration.py   an A/A calibration's result
    RUN_DIR/baselines/<shape>/                  Slurm output and the probe's rank-<R>.h5
    RUN_DIR/experiments/<name>/{baseline,fault}.sbatch
    RUN_DIR/experiments/<name>/{baseline -> ../../baselines/<shape>, fault}/  (switchback: fault/ only)
    RUN_DIR/experiments/<name>/observations.json  observations.py  what monitoring and Slurm did
    RUN_DIR/experiments/<name>/fault/release    layout.RELEASE   the campaign ends a held fault job
    RUN_DIR/experiments/<name>/fault/injections/<node>.json  injections.py  whether each node fault took
    RUN_DIR/experiments/<name>/fault/schedule.json  schedule.py  a switchback job's on/off blocks
    RUN_DIR/aa/run-<i>/                         the A/A runs of a calibration

The campaign writes these files and the analysis reads them, both through this package only.
"""

from __future__ import annotations

from slurm_chaos.rundir.calibration import CALIBRATION_FILE, load_recommended_min_effect, write_calibration
from slurm_chaos.rundir.injections import InjectionRecord, load_injections
from slurm_chaos.rundir.layout import (
    CONTROLLER_JOURNAL,
    INJECTIONS,
    MANIFEST,
    OBSERVATIONS,
    RELEASE,
    SCHEDULE,
    Role,
    aa_dir,
    baseline_dir,
    experiment_dir,
    new_run_id,
)
from slurm_chaos.rundir.manifest import Manifest, RunKind, SubmittedJob, read_manifest, write_manifest
from slurm_chaos.rundir.observations import (
    Expectation,
    FaultWindow,
    Observation,
    ObservationLog,
    Signal,
    alert_signal,
    detector_signal,
    load_observations,
    observations_from_json,
    observations_to_json,
    reference_signal,
    write_observations,
)
from slurm_chaos.rundir.schedule import read_schedule, schedule_path, write_schedule

__all__ = [
    "CALIBRATION_FILE",
    "CONTROLLER_JOURNAL",
    "INJECTIONS",
    "MANIFEST",
    "OBSERVATIONS",
    "RELEASE",
    "SCHEDULE",
    "Expectation",
    "FaultWindow",
    "InjectionRecord",
    "Manifest",
    "Observation",
    "ObservationLog",
    "Role",
    "RunKind",
    "Signal",
    "SubmittedJob",
    "aa_dir",
    "alert_signal",
    "baseline_dir",
    "detector_signal",
    "experiment_dir",
    "load_injections",
    "load_observations",
    "load_recommended_min_effect",
    "new_run_id",
    "observations_from_json",
    "observations_to_json",
    "read_manifest",
    "read_schedule",
    "reference_signal",
    "schedule_path",
    "write_calibration",
    "write_manifest",
    "write_observations",
    "write_schedule",
]
