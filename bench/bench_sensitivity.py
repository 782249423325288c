"""Benchmark: how small a step-time regression each design detects, and how often it cries wolf.

Usage: python bench/bench_sensitivity.py [--runs N] [--placebo-runs N] [--steps N ...]
       [--grid [--trials N] ...]

By default one table puts the designs side by side on the acceptance model of issue #11: 500
steps, 5% noise (the coefficient of variation of the job's per-step time, robust: IQR / 1.349 /
median), lag-1 autocorrelation 0.3, 8% run-to-run drift (standard deviation of the run's log
speed), and slow wander within the run:

- between runs: a baseline job against a fault job (two runs, each with its own drift), as
  ``slurm-chaos compare BASE FAULT`` judges them; once with the default ``min_effect`` of 1% and
  once calibrated, with the ``min_effect`` that an A/A calibration of 10 runs recommends;
- in-job switchback: one run with a seeded switchback schedule, judged on its own on/off blocks
  (:mod:`slurm_chaos.analysis.switchback`); false positives come from placebo schedules.

Columns: the share of unfaulted runs called significant (false positives, at alpha 0.01), the MDE
(smallest regression detected, significant and positive, in at least 80% of runs, interpolated on
the grid of effects), the median of the ``mde`` the in-job test reports itself, and the power at
2.5%, 5% and 10%. A regression is applied by scaling the job's step times (the fault run's, or the
on blocks'), so its size is exactly known.

Measured on 2026-11-30 (2-core machine, --runs 200 --placebo-runs 1000 --between-runs 50):
between runs 41/50 false positives (MDE 11%, meaningless at that rate), calibrated 1/50 and an
MDE of 35%; in-job with slow wander 11/1000 false positives, MDE 2.52% (reported 2.52%), power
80% / 100% / 100% at 2.5 / 5 / 10%; without wander 9/1000 and 2.47%; with rough wander
(--rough) 3/500 and 2.65%.

Re-measured on 2026-12-05 with the shipped statistic (the fastest rank's step time, lower decile
and clipped mean each at alpha/2; --runs 100 --placebo-runs 400 --between-runs 30 --steps 2000,
132 s): in-job with slow wander 2/400 false positives, MDE 2.65% (reported 3.08%), power 76% /
100% / 100% at 2.5 / 5 / 10%; without wander 2/400 and 2.63%; at 2,000 steps (the switchback
jobs' default now) 2/400 and 1.32% (reported 1.26%). On this model's Gaussian noise the mean
carries the test and Bonferroni's alpha/2 costs ~5% of the MDE; the lower decile wins on real
sandbox noise (bench/bench_noise_sandbox.py).

Then with the statistics weighted (the quieter at 0.8 alpha, the other at 0.2: weighted
Bonferroni), side by side with the alpha/2 split on one machine, defaults (--runs 300
--placebo-runs 1000): in-job with slow wander 2.77% -> **2.70%** (false positives 8 -> 13 of 1000,
both within what alpha explains), without wander 2.73% -> 2.64%; reported 3.09% -> 2.93%. The
acceptance's 2.5% is not met on this model: its Gaussian noise is the clipped mean's, and the
dropped transition step of each block and the drift correction cost what the split no longer does.

``--grid`` also prints the older tables: the smallest regression the between-run comparison
detects in 95% of pairs, by steps per rank and noise.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from slurm_chaos.analysis.calibrate import between_run_threshold, run_median
from slurm_chaos.analysis.regression import JobSeries, aa_false_positive_rate, compare_series
from slurm_chaos.analysis.switchback import judge_switchback
from slurm_chaos.analysis.synthetic import JobModel, simulate, simulate_job_time
from slurm_chaos.schedule import placebo_of, switchback_schedule

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


# --- designs side by side ---------------------------------------------------------------------

EFFECTS = (0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.10, 0.15, 0.20, 0.30, 0.50, 0.75, 1.0)
SHOWN = (0.025, 0.05, 0.10)
TARGET_POWER = 0.80
CALIBRATION_RUNS = 10
# Slow wander: a slow AR(1) (time constant 200 steps) and a sinusoid over the whole run.
SLOW_WANDER = {"wander": 0.02, "wander_phi": 0.995, "sine": 0.02, "sine_period": 500.0}
# Rougher than "slow": a faster AR(1), a random walk and a shorter period, to show what wander costs.
ROUGH_WANDER = {"wander": 0.02, "wander_phi": 0.98, "walk": 0.001, "sine": 0.02, "sine_period": 200.0}


@dataclass(frozen=True)
class DesignRow:
    name: str
    false_positives: int
    placebo_runs: int
    power: dict[float, float]
    reported_mde: float | None = None

    def mde(self) -> float | None:
        """Smallest effect with power >= 80%, linear between grid points."""
        points = sorted(self.power.items())
        for (e0, p0), (e1, p1) in zip([(0.0, 0.0), *points], points, strict=False):
            if p1 >= TARGET_POWER:
                return e1 if p1 == p0 else e0 + (TARGET_POWER - p0) * (e1 - e0) / (p1 - p0)
        return None


def acceptance_model(steps: int = 500, **wander: float) -> JobModel:
    base = model_for(0.05, 4000)
    return replace(base, ranks=4, steps=steps, run_drift=0.08, **wander)


def in_job_row(name: str, model: JobModel, runs: int, placebo_runs: int) -> DesignRow:
    """Placebo runs for false positives; power by scaling the on blocks of the same runs."""
    false_positives = 0
    mdes = []
    effects = (0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.10)
    hits = dict.fromkeys(effects, 0)
    for i in range(max(runs, placebo_runs)):
        schedule = switchback_schedule(model.steps, seed=70_000 + i)
        # The job's step time as judge_switchback_run takes it: the fastest rank's.
        x = simulate(replace(model, seed=80_000 + i)).fields["step_time"].min(axis=0)
        if i < placebo_runs:
            placebo = judge_switchback(x, placebo_of(schedule))
            false_positives += placebo.significant
            mdes.append(placebo.mde)
        if i < runs:
            on = schedule.fault_active(model.steps)
            for e in effects:
                r = judge_switchback(x * np.where(on, 1.0 + e, 1.0), schedule)
                hits[e] += r.significant and r.regression > 0
    power = {e: h / runs for e, h in hits.items()}
    return DesignRow(name, false_positives, placebo_runs, power, float(np.median(mdes)))


def between_run_rows(model: JobModel, runs: int) -> list[DesignRow]:
    """Baseline vs fault run, with min_effect 1% and with the one a 10-run A/A calibration recommends."""
    nan = np.full(model.steps, np.nan)
    calibration = [
        JobSeries(simulate_job_time(replace(model, seed=60_000 + i)), nan) for i in range(CALIBRATION_RUNS)
    ]
    _, threshold = between_run_threshold([run_median(x) for x in calibration])
    effects = tuple(e for e in EFFECTS if e >= 0.025)
    fp = {0.01: 0, threshold: 0}
    hits = {m: dict.fromkeys(effects, 0) for m in fp}
    for i in range(runs):
        base = simulate_job_time(replace(model, seed=90_000 + 2 * i))
        fault = simulate_job_time(replace(model, seed=90_001 + 2 * i))

        significant, regression = _between(base, fault, 1.0, i)
        for m in fp:
            fp[m] += significant and abs(regression) >= m
        for e in effects:
            significant, regression = _between(base, fault, 1.0 + e, i)
            for m in fp:
                hits[m][e] += significant and regression >= m
    names = {0.01: "between runs, min_effect 1%", threshold: f"between runs, calibrated ({threshold:.0%})"}
    return [DesignRow(names[m], fp[m], runs, {e: h / runs for e, h in hits[m].items()}) for m in fp]


def _between(base: np.ndarray, fault: np.ndarray, scale: float, seed: int) -> tuple[bool, float]:
    nan = np.full(len(base), np.nan)
    c = compare_series(JobSeries(base, nan), JobSeries(fault * scale, nan), n_boot=400, seed=seed)
    return c.significant, c.regression


def print_rows(rows: Sequence[DesignRow]) -> None:
    shown = "".join(f"  power@{e:.1%}".replace(".0%", "%") for e in SHOWN)
    print(f"{'design':<44} {'false pos.':>12} {'MDE@80%':>8} {'reported':>9}{shown}")
    for r in rows:
        mde = r.mde()
        fp = f"{r.false_positives}/{r.placebo_runs}"
        cells = "".join(f"{r.power.get(e, float('nan')):>12.0%}" for e in SHOWN)
        reported = "" if r.reported_mde is None else f"{r.reported_mde:.2%}"
        print(
            f"{r.name:<44} {fp:>12} {'>' + f'{max(r.power):.0%}' if mde is None else f'{mde:.2%}':>8} "
            f"{reported:>9}{cells}"
        )


def designs(runs: int, placebo_runs: int, between_runs: int, rough: bool, steps: Sequence[int] = ()) -> None:
    slow = acceptance_model(**SLOW_WANDER)
    x = simulate_job_time(replace(slow, run_drift=0.0, wander=0.0, sine=0.0, steps=4000, seed=4242))
    print(
        f"500 steps, job step-time CV {cv(x):.3f} before drift and wander, AR(1) {slow.ar_phi}, "
        f"run drift {slow.run_drift:.0%}, slow wander {SLOW_WANDER}; alpha 0.01"
    )
    rows: list[DesignRow] = []
    rows += between_run_rows(slow, between_runs)
    rows.append(in_job_row("in-job switchback (slow wander)", slow, runs, placebo_runs))
    variants: list[tuple[str, Callable[[], JobModel]]] = [
        ("in-job switchback (no wander)", lambda: acceptance_model()),
    ]
    if rough:
        variants.append(("in-job switchback (rough wander)", lambda: acceptance_model(**ROUGH_WANDER)))
    for name, make in variants:
        rows.append(in_job_row(name, make(), runs, placebo_runs))
    for n in steps:
        model = acceptance_model(n, **SLOW_WANDER)
        rows.append(in_job_row(f"in-job switchback (slow wander), {n} steps", model, runs, placebo_runs))
    print_rows(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="in-job runs per effect")
    parser.add_argument("--placebo-runs", type=int, default=1000, help="in-job placebo runs")
    parser.add_argument("--between-runs", type=int, default=100, help="baseline/fault pairs per effect")
    parser.add_argument("--rough", action="store_true", help="also an in-job row with rough wander")
    parser.add_argument(
        "--steps", type=int, nargs="*", default=(), help="also in-job rows (slow wander) at these job lengths"
    )
    parser.add_argument("--grid", action="store_true", help="also the between-run sensitivity grid")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--aa-pairs", type=int, default=1000)
    parser.add_argument("--goal-trials", type=int, default=100)
    args = parser.parse_args()
    t0 = time.perf_counter()
    designs(args.runs, args.placebo_runs, args.between_runs, args.rough, args.steps)
    if args.grid:
        grid(args)
    print(f"took {time.perf_counter() - t0:.0f} s")


def grid(args: argparse.Namespace) -> None:
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


if __name__ == "__main__":
    main()
