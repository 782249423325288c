"""A/A calibration on real runs: the same job, unfaulted, run several times on the cluster.

Every pair of runs is compared as if one were the baseline and the other a fault run. Nothing
changed between them, so each "significant" call is a false positive, and each pair is also judged
as the A/A control experiment would be (no fault, no regression expected): any verdict but PASSED
there (INCONCLUSIVE for a significant change) means the method or the cluster is too noisy for the
campaign's verdicts to be trusted.

The comparison's own statistics model the noise within a run. What differs from one run to the next
(another moment's load on shared nodes, a CPU's clock, a neighbour on the network) they do not, and
on a shared machine it dominates. The calibration measures it: the spread of the runs' median step
times, from which follows the practical threshold (``min_effect``) that at most 1% of A/A pairs
exceed: the 99% prediction bound of two new runs' difference of log medians (Student's t, n - 1
degrees of freedom, times sqrt(2) standard deviations).
The recommendation is the larger of that and the threshold that silenced all but 1% of the pairs
seen; ``slurm-chaos campaign --calibration calibration.json`` uses it.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scipy import stats as sps

from slurm_chaos.analysis.model import Verdict
from slurm_chaos.analysis.regression import (
    MIN_EFFECT,
    SEED,
    Calibration,
    JobSeries,
    aa_pairs,
    calibration_of,
    compare_series,
    detect_warmup,
    job_series,
)
from slurm_chaos.analysis.straggler import STEPS_READ
from slurm_chaos.analysis.switchback import PlaceboCalibration, judge_switchback_run, placebo_calibration
from slurm_chaos.analysis.verdict import judge
from slurm_chaos.errors import DataError
from slurm_chaos.probe.reader import RunData, read_run
from slurm_chaos.rundir import Expectation, FaultWindow, ObservationLog

MAX_FALSE_POSITIVE_RATE = 0.01


@dataclass(frozen=True)
class AACalibration:
    runs: tuple[str, ...]
    min_effect: float
    calibration: Calibration
    verdicts: dict[Verdict, int]
    largest_change: float  # the largest |regression| between two runs, significant or not
    run_spread: float  # standard deviation of the runs' log median step time
    recommended_min_effect: float
    #: The runs judged each on its own placebo schedule (runs that followed one), else None.
    placebo: PlaceboCalibration | None = None

    @property
    def ok(self) -> bool:
        """At most 1% false positives and every pair judged PASSED as the A/A control; and for
        runs on placebo schedules, no more significant ones than the in-job test's level explains."""
        between = self.calibration.rate <= MAX_FALSE_POSITIVE_RATE and self.false_alarms == 0
        return between and (self.placebo is None or self.placebo.ok)

    @property
    def false_alarms(self) -> int:
        """Pairs the A/A control would not have passed."""
        return sum(n for v, n in self.verdicts.items() if v is not Verdict.PASSED)

    def to_json(self) -> dict[str, Any]:
        c = self.calibration
        return {
            "runs": list(self.runs),
            "pairs": c.n_pairs,
            "min_effect": self.min_effect,
            "false_positives": c.false_positives,
            "false_positive_rate": round(c.rate, 6),
            "false_positive_rate_upper_95": round(c.upper_95, 6),
            "min_effect_for_1pct": round(c.min_effect_for_1pct, 6),
            "largest_change": round(self.largest_change, 6),
            "run_spread": round(self.run_spread, 6),
            "recommended_min_effect": round(self.recommended_min_effect, 6),
            "verdicts": {v.value: n for v, n in sorted(self.verdicts.items())},
            "placebo": None if self.placebo is None else self.placebo.to_json(),
            "ok": self.ok,
        }

    def summary(self) -> str:
        c = self.calibration
        verdicts = ", ".join(f"{n} {v}" for v, n in sorted(self.verdicts.items()))
        return "\n".join(
            [
                f"A/A calibration: {len(self.runs)} runs, {c.n_pairs} pairs, "
                f"min_effect {100 * self.min_effect:.1f}%",
                f"  false positives {c.false_positives} of {c.n_pairs}: rate {100 * c.rate:.2f}% "
                f"(95% upper bound {100 * c.upper_95:.2f}%)",
                f"  largest run-to-run change {100 * self.largest_change:.2f}% "
                f"(run medians spread {100 * self.run_spread:.1f}%); "
                f"min_effect for <= 1% false positives: {100 * c.min_effect_for_1pct:.2f}% in these pairs, "
                f"recommended {100 * self.recommended_min_effect:.1f}%",
                f"  control verdicts: {verdicts}",
                f"  {'OK' if self.ok else 'TOO NOISY'}: false-positive rate "
                f"{'<=' if c.rate <= MAX_FALSE_POSITIVE_RATE else '>'} "
                f"{100 * MAX_FALSE_POSITIVE_RATE:.0f}%, "
                f"{self.false_alarms} control verdicts not PASSED",
                *([] if self.placebo is None else [f"  {self.placebo.summary()}"]),
            ]
        )


# The share of A/A pairs the recommended threshold lets through (two-sided).
FALSE_POSITIVES = 0.01


def run_median(series: JobSeries) -> float:
    """The run's median step time after its warm-up."""
    x = series.step_time[detect_warmup(series.step_time) :]
    return float(statistics.median(x.tolist())) if len(x) else math.nan


def between_run_threshold(medians: Sequence[float]) -> tuple[float, float]:
    """(spread, threshold): the standard deviation of the log medians, and the relative change
    between two new runs that 1% of A/A pairs exceed if the log medians are normal.

    The threshold is the 99% prediction bound of the difference of two new runs' log medians:
    Student's t with n - 1 degrees of freedom times sqrt(2) spreads, so that the uncertainty of a
    spread estimated from a handful of runs is paid for (the normal quantile would let several
    percent of new pairs through whenever the estimate came out low).
    """
    logs = [math.log(m) for m in medians if m > 0 and math.isfinite(m)]
    if len(logs) < 2:
        return math.nan, math.nan
    spread = statistics.stdev(logs)
    t = float(sps.t.ppf(1.0 - FALSE_POSITIVES / 2.0, len(logs) - 1))
    return spread, math.exp(t * math.sqrt(2.0) * spread) - 1.0


def _window(series: JobSeries) -> FaultWindow | None:
    t = series.t_start
    return FaultWindow(start=float(t[0])) if len(t) and math.isfinite(t[0]) else None


def calibrate_series(
    names: Sequence[str],
    series: Sequence[JobSeries],
    min_effect: float = MIN_EFFECT,
    placebo: PlaceboCalibration | None = None,
) -> AACalibration:
    """Compare every pair of runs and judge each as the A/A control experiment."""
    if len(series) < 2:
        raise DataError(f"A/A calibration needs at least two runs, got {len(series)}")
    control = Expectation(expect_regression=False)
    comparisons = []
    verdicts: Counter[Verdict] = Counter()
    for i, (a, b) in enumerate(aa_pairs(list(series))):
        window = _window(b)
        c = compare_series(a, b, window, min_effect=min_effect, seed=SEED + i)
        comparisons.append(c)
        log = ObservationLog(window or FaultWindow(start=0.0), (), control)
        verdicts[judge(c, log).verdict] += 1
    changes = [abs(c.regression) for c in comparisons if math.isfinite(c.regression)]
    calibration = calibration_of(comparisons, min_effect)
    spread, threshold = between_run_threshold([run_median(x) for x in series])
    recommended = max(calibration.min_effect_for_1pct, threshold if math.isfinite(threshold) else 0.0)
    return AACalibration(
        runs=tuple(names),
        min_effect=min_effect,
        calibration=calibration,
        verdicts=dict(verdicts),
        largest_change=max(changes, default=math.nan),
        run_spread=spread,
        recommended_min_effect=round(recommended, 4),
        placebo=placebo,
    )


def calibrate_dirs(dirs: Sequence[Path], min_effect: float = MIN_EFFECT) -> AACalibration:
    """A/A calibration of probe run directories (``rank-<R>.h5`` each) of one job shape."""
    runs = [read_run(d, STEPS_READ) for d in dirs]
    sizes = {r.world_size for r in runs}
    if len(sizes) > 1:
        shapes = ", ".join(f"{r.directory}: {r.world_size}" for r in runs)
        raise DataError(f"A/A runs must have the same number of ranks ({shapes})")
    return calibrate_series([str(d) for d in dirs], [job_series(r) for r in runs], min_effect, _placebo(runs))


def _placebo(runs: Sequence[RunData]) -> PlaceboCalibration | None:
    """Each run that followed a placebo schedule judged on it (the in-job test's false positives);
    None when no run did. A schedule that toggled a fault is refused: that run was not unfaulted."""
    judged = []
    for r in runs:
        schedule = r.fault_schedule()
        if schedule is None:
            continue
        if not schedule.placebo:
            raise DataError(f"{r.directory}: its fault schedule toggled a fault: not an A/A run")
        judged.append(judge_switchback_run(r, schedule, observed_state=r.observed_state()))
    if judged and len(judged) != len(runs):
        raise DataError(
            f"A/A runs: {len(judged)} of {len(runs)} followed a placebo schedule, the others none"
        )
    return placebo_calibration(judged) if judged else None
