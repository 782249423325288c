"""The synthetic job's run drift, static rank offsets, slow wander and fault schedule."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from slurm_chaos.analysis.synthetic import JobModel, SyntheticExperiment, simulate, write_experiment
from slurm_chaos.rundir import read_schedule
from slurm_chaos.schedule import placebo_of, schedule_from_json, switchback_schedule

QUIET = JobModel(ranks=4, steps=400, noise=0.0, rank_jitter=0.0)


def job(m: JobModel) -> np.ndarray:
    return simulate(m).fields["step_time"].max(axis=0)


def test_run_drift_moves_whole_runs_not_steps() -> None:
    levels = [np.log(np.median(job(replace(QUIET, run_drift=0.08, seed=s)))) for s in range(200)]
    assert np.std(levels) == pytest.approx(0.08, rel=0.2)
    x = job(replace(QUIET, run_drift=0.08, seed=3))
    assert np.ptp(x) / np.median(x) < 0.05  # inside one run the drift is a constant factor


def test_rank_offsets_are_static() -> None:
    run = simulate(replace(QUIET, ranks=64, rank_offset=0.02, seed=5))
    compute = run.fields["compute_time"]
    per_rank = np.log(np.median(compute, axis=1))
    assert np.std(per_rank) == pytest.approx(0.02, rel=0.3)
    first, second = np.median(compute[:, :200], axis=1), np.median(compute[:, 200:], axis=1)
    assert np.allclose(first, second, rtol=0.01)


def test_sinusoid_and_slow_wander_move_the_level_within_the_run() -> None:
    x = job(replace(QUIET, sine=0.05, sine_period=200.0, seed=1))
    assert np.allclose(x[:200], x[200:400], rtol=0.02)  # one period later, the same level
    assert np.ptp(x) / np.median(x) > 0.08
    w = job(replace(QUIET, wander=0.03, wander_phi=0.99, walk=0.001, seed=2))
    r = np.log(w) - np.log(w).mean()
    assert np.corrcoef(r[:-20], r[20:])[0, 1] > 0.5  # slow: still correlated 20 steps later


def test_a_schedule_decides_the_faulted_steps_exactly() -> None:
    schedule = switchback_schedule(400, seed=4)
    model = replace(QUIET, noise=0.03, rank_jitter=0.005, wander=0.02, seed=8)
    plain = job(model)
    faulted = job(replace(model, schedule=schedule, step_slowdown=0.05))
    on = schedule.fault_active(400)
    assert on.any() and (~on).any()
    assert np.allclose(faulted[on] / plain[on], 1.05) and np.allclose(faulted[~on], plain[~on])
    placebo = job(replace(model, schedule=placebo_of(schedule), step_slowdown=0.05))
    assert np.array_equal(placebo, plain)


def test_a_slow_rank_on_a_schedule_computes_slower_only_in_on_blocks() -> None:
    schedule = switchback_schedule(400, seed=6)
    run = simulate(replace(QUIET, schedule=schedule, slow_rank=2, slow_rank_factor=0.1))
    on = schedule.fault_active(400)
    compute = run.fields["compute_time"]
    assert np.allclose(compute[2, on] / compute[0, on], 1.1)
    assert np.allclose(compute[2, ~on], compute[0, ~on])


def test_an_experiment_without_a_baseline_is_written_as_a_switchback(tmp_path: Path) -> None:
    schedule = switchback_schedule(300, seed=5)
    fault = JobModel(ranks=2, steps=300, ranks_per_host=1, schedule=schedule)
    write_experiment(tmp_path / "x", SyntheticExperiment("x", None, fault))
    assert not (tmp_path / "x" / "baseline").exists()
    raw = read_schedule(tmp_path / "x" / "fault")
    assert raw is not None and schedule_from_json(raw) == schedule
    assert sorted(p.name for p in (tmp_path / "x" / "fault").glob("rank-*.h5")) == ["rank-0.h5", "rank-1.h5"]
