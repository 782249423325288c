"""Benchmark: smallest step-time regression detected at 99% confidence, by steps per rank and noise.

Usage: python bench/bench_sensitivity.py [--trials N] [--aa-pairs N] [--goal-trials N]

"Detected" means the comparison calls it significant (p < 0.01, the 99% CI excludes zero, effect
at least 1%) in at least 95% of independent baseline/fault pairs. Noise is the coefficient of
variation of the job's per-step time (robust: IQR / 1.349 / median), with lag-1 autocorrelation
0.3 as on a real node. Goal: 2% within 500 steps at 5% noise. The same script measures the A/A
false-positive rate at 500 steps and 5% noise.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from slurm_chaos.analysis.regression import JobSeries, aa_false_positive_rate, compare_series
from slurm_chaos.analysis.synthetic import JobModel, simulate_job_time

STEPS = (100, 250, 500, 1000, 2000)
NOISE = (0.02, 0.05, 0.10)
REGRESSIONS = (0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.10, 0.15, 0.20, 0.30)
POWER = 0.95


def model_for(noise: float, steps: int) -> JobModel:
    """A model whose job step time has coefficient of variation ``noise`` (the shared factor scaled up)."""
    probe = JobModel(ranks=8, steps=4000, noise=noise, ar_phi=0.3, seed=999)
    x = simulate_job_time(probe)
    q75, q25 = np.percentile(x, [75, 25])
    measured = (q75 - q25) / 1.349 / np.median(x)
    return replace(probe, steps=steps, noise=noise * noise / measured, warmup_steps=10, seed=0)


def cv(x: np.ndarray) -> float:
    q75, q25 = np.percentile(x, [75, 25])
    return float((q75 - q25) / 1.349 / np.median(x))


def detected(model: JobModel, regression: float, trials: int) -> bool:
    """Significant in at least POWER of the trials; stops as soon as too many have failed."""
    allowed = int((1.0 - POWER) * trials + 1e-9)
    misses = 0
    for i in range(trials):
        base = simulate_job_time(replace(model, seed=10_000 + 2 * i))
        # Scaling the job series gives an exactly known regression with the same noise structure.
        fault = (1.0 + regression) * simulate_job_time(replace(model, seed=10_001 + 2 * i))
        nan = np.full(model.steps, np.nan)
        misses += not compare_series(
            JobSeries(base, nan), JobSeries(fault, nan), n_boot=400, seed=i
        ).significant
        if misses > allowed:
            return False
    return True


def detection_rate(model: JobModel, regression: float, trials: int) -> float:
    hits = 0
    for i in range(trials):
        base = simulate_job_time(replace(model, seed=20_000 + 2 * i))
        fault = (1.0 + regression) * simulate_job_time(replace(model, seed=20_001 + 2 * i))
        nan = np.full(model.steps, np.nan)
        hits += compare_series(JobSeries(base, nan), JobSeries(fault, nan), n_boot=400, seed=i).significant
    return hits / trials


def smallest_detected(model: JobModel, trials: int) -> float | None:
    return next((r for r in REGRESSIONS if detected(model, r, trials)), None)


def table(models: dict[float, JobModel], trials: int) -> None:
    print("steps/rank " + "".join(f"  noise {n:>4.0%}" for n in NOISE))
    for steps in STEPS:
        cells = []
        for n in NOISE:
            found = smallest_detected(replace(models[n], steps=steps), trials)
            cells.append(f"{'>30%' if found is None else f'{found:.1%}':>11}")
        print(f"{steps:>10} " + "".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--aa-pairs", type=int, default=1000)
    parser.add_argument("--goal-trials", type=int, default=100)
    args = parser.parse_args()
    t0 = time.perf_counter()
    for phi in (0.3, 0.0):
        print(
            f"\nsmallest regression detected (significant at alpha 0.01 in >= {POWER:.0%} of {args.trials} "
            f"trials), lag-1 autocorrelation {phi}"
        )
        models = {n: replace(model_for(n, 4000), ar_phi=phi) for n in NOISE}
        table(models, args.trials)
    m = replace(model_for(0.05, 4000), steps=500)
    for phi in (0.3, 0.0):
        rate = detection_rate(replace(m, ar_phi=phi), 0.02, args.goal_trials)
        power = ", ".join(f"{'meets' if rate >= p else 'misses'} {p:.0%} power" for p in (0.80, POWER))
        print(
            f"goal point (2% at 500 steps, 5% noise, autocorrelation {phi}): detected in {rate:.0%} "
            f"of {args.goal_trials} pairs ({power}; 80% is the usual power of a minimum detectable effect)"
        )
    print(f"measured job step-time CV at the 5% setting: {cv(simulate_job_time(replace(m, seed=4242))):.3f}")
    pairs = [
        (
            simulate_job_time(replace(m, seed=50_000 + 2 * i)),
            simulate_job_time(replace(m, seed=50_001 + 2 * i)),
        )
        for i in range(args.aa_pairs)
    ]
    aa = aa_false_positive_rate(pairs)
    print(
        f"A/A at 500 steps, 5% noise: {aa.false_positives}/{aa.n_pairs} significant = {aa.rate:.2%} "
        f"(95% upper bound {aa.upper_95:.2%})"
    )
    print(f"took {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
