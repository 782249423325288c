"""Regression statistics against synthetic runs whose true step-time change is known."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from slurm_chaos.analysis.regression import (
    JobSeries,
    aa_false_positive_rate,
    aa_pairs,
    block_length,
    bootstrap_ratio_ci,
    compare_series,
    detect_fault_segment,
    detect_warmup,
    lag1_autocorrelation,
    robust_stats,
)
from slurm_chaos.analysis.synthetic import (
    JobModel,
    SyntheticRun,
    simulate,
    simulate_job_time,
    true_regression,
)
from slurm_chaos.rundir import FaultWindow

BASE = JobModel(ranks=8, steps=1000, warmup_steps=25, noise=0.02, seed=11)


def series(run: SyntheticRun) -> JobSeries:
    return JobSeries(run.fields["step_time"].max(axis=0), run.t_start[0])


@pytest.mark.parametrize("slowdown", [0.02, 0.10, 0.30])
def test_global_slowdown_is_measured_within_one_point(slowdown: float) -> None:
    fault = replace(BASE, seed=12, slowdown=slowdown)
    c = compare_series(series(simulate(BASE)), series(simulate(fault)))
    truth = true_regression(BASE, fault, samples=100_000)
    assert abs(c.regression - truth) < 0.01
    assert c.significant
    assert c.ci_low < c.regression < c.ci_high
    assert c.ci_low > 0


def test_slow_rank_regression_within_one_point() -> None:
    fault = replace(BASE, seed=13, slow_rank=3, slow_rank_factor=0.25)
    c = compare_series(series(simulate(BASE)), series(simulate(fault)))
    assert abs(c.regression - true_regression(BASE, fault, samples=100_000)) < 0.01
    assert c.significant


def test_mid_run_fault_onset_and_window() -> None:
    fault = replace(BASE, seed=14, slowdown=0.15, fault_start_step=550, fault_end_step=800)
    run = simulate(fault)
    truth = true_regression(BASE, fault, samples=100_000)
    blind = compare_series(series(simulate(BASE)), series(run))
    assert blind.onset_step is not None and abs(blind.onset_step - 550) <= 3
    assert blind.onset_time == pytest.approx(run.t_start[0, blind.onset_step])
    # Without a window the detected segment is what counts; with it, the window's steps.
    assert abs(blind.regression - truth) < 0.01
    windowed = compare_series(series(simulate(BASE)), series(run), run.fault_window())
    assert abs(windowed.regression - truth) < 0.01
    assert windowed.fault.n == pytest.approx(250, abs=1)


def test_onset_keeps_its_own_threshold_under_a_calibrated_min_effect() -> None:
    # A noisy cluster's calibration raised min_effect to 179%; a 15% fault still has an onset.
    fault = replace(BASE, seed=14, slowdown=0.15, fault_start_step=550, fault_end_step=800)
    run = simulate(fault)
    calibrated = compare_series(series(simulate(BASE)), series(run), min_effect=1.79)
    assert calibrated.onset_step is not None and abs(calibrated.onset_step - 550) <= 3
    assert not calibrated.significant  # the practical threshold still decides significance
    strict = compare_series(series(simulate(BASE)), series(run), min_effect=1.79, onset_min_effect=0.5)
    assert strict.onset_step is None


def test_fault_segment_ends_where_the_job_recovers() -> None:
    x = simulate_job_time(replace(BASE, seed=15, slowdown=0.2, fault_start_step=300, fault_end_step=600))
    segment = detect_fault_segment(x)
    assert segment is not None
    assert abs(segment[0] - 300) <= 3 and abs(segment[1] - 600) <= 3


def test_no_onset_in_a_steady_run() -> None:
    assert detect_fault_segment(simulate_job_time(replace(BASE, warmup_steps=0, seed=16))) is None


def test_warmup_is_detected_not_fixed() -> None:
    long = detect_warmup(simulate_job_time(replace(BASE, warmup_steps=60, seed=17)))
    short = detect_warmup(simulate_job_time(replace(BASE, warmup_steps=10, seed=17)))
    none = detect_warmup(simulate_job_time(replace(BASE, warmup_steps=0, seed=17)))
    # exp(-t/tau) falls under the 2% noise after about 4 tau.
    assert 150 <= long <= 400
    assert 20 <= short <= 80
    assert none <= 50
    assert short < long


def test_warmup_before_a_windowed_fault_is_searched_before_it() -> None:
    fault = replace(BASE, seed=18, slowdown=0.3, fault_start_step=200)
    run = simulate(fault)
    c = compare_series(series(simulate(BASE)), series(run), run.fault_window())
    assert c.fault_warmup_steps < 200
    assert c.fault.n == 800


def test_autocorrelation_estimate_ignores_level_shifts() -> None:
    steady = simulate_job_time(replace(BASE, ar_phi=0.5, noise=0.05, warmup_steps=0, steps=4000, seed=19))
    shifted = steady.copy()
    shifted[2000:] *= 1.3
    assert 0.35 < lag1_autocorrelation(steady) < 0.6
    assert abs(lag1_autocorrelation(shifted) - lag1_autocorrelation(steady)) < 0.05
    assert block_length(steady) == block_length(shifted)


def test_bootstrap_is_seeded_and_covers_the_truth() -> None:
    rng = np.random.default_rng(0)
    a = 1.0 + 0.05 * rng.standard_normal(500)
    b = 1.1 * (1.0 + 0.05 * rng.standard_normal(500))
    first = bootstrap_ratio_ci(a, b, 4, 0.99)
    assert first == bootstrap_ratio_ci(a, b, 4, 0.99)
    assert first[0] < 0.10 < first[1]


def test_robust_stats() -> None:
    s = robust_stats(np.arange(1, 101, dtype=np.float64))
    assert (s.n, s.median) == (100, 50.5)
    assert s.p95 == pytest.approx(95.05) and s.p99 == pytest.approx(99.01)


def test_too_few_steps_is_inconclusive() -> None:
    short = replace(BASE, steps=15, warmup_steps=0)
    c = compare_series(series(simulate(short)), series(simulate(replace(short, seed=2, slowdown=0.5))))
    assert not c.significant
    assert "only" in c.inconclusive_reason


def test_noisy_short_runs_are_inconclusive_not_significant() -> None:
    noisy = replace(BASE, steps=60, warmup_steps=0, noise=0.3, ar_phi=0.6)
    c = compare_series(series(simulate(noisy)), series(simulate(replace(noisy, seed=3, slowdown=0.04))))
    assert not c.significant
    assert c.inconclusive_reason.startswith("too noisy")


def test_fault_window_outside_the_run_gives_no_fault_steps() -> None:
    run = simulate(BASE)
    c = compare_series(series(run), series(run), FaultWindow(start=run.t_start[0, -1] + 1e6))
    assert c.fault.n == 0 and not c.significant and c.inconclusive_reason


def test_aa_false_positive_rate_at_most_one_percent() -> None:
    model = JobModel(ranks=4, steps=400, warmup_steps=15, noise=0.05, ar_phi=0.4)
    runs = [simulate_job_time(replace(model, seed=100 + i)) for i in range(24)]
    calibration = aa_false_positive_rate(aa_pairs(runs), n_boot=200)
    assert calibration.n_pairs == 24 * 23 // 2
    assert calibration.rate <= 0.01
    assert calibration.upper_95 < 0.02


def test_aa_calibration_flags_a_broken_method() -> None:
    # A "method" that sees a 3% shift in every pair must come out with a 100% false-positive rate.
    model = JobModel(ranks=4, steps=300, noise=0.01)
    pairs = [
        (simulate_job_time(replace(model, seed=i)), 1.03 * simulate_job_time(replace(model, seed=50 + i)))
        for i in range(5)
    ]
    calibration = aa_false_positive_rate(pairs, n_boot=100)
    assert calibration.rate == 1.0 and calibration.upper_95 == 1.0
    # The threshold that would have silenced them sits just above the largest shift seen.
    assert 0.025 < calibration.min_effect_for_1pct < 0.04
    quiet = aa_false_positive_rate(pairs, n_boot=100, min_effect=calibration.min_effect_for_1pct)
    assert quiet.false_positives == 0


def test_aa_calibration_keeps_min_effect_when_already_quiet() -> None:
    model = JobModel(ranks=4, steps=300, noise=0.02)
    runs = [simulate_job_time(replace(model, seed=300 + i)) for i in range(5)]
    assert aa_false_positive_rate(aa_pairs(runs), n_boot=100, min_effect=0.02).min_effect_for_1pct == 0.02
