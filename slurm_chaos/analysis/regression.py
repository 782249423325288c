"""Step-time regression of a fault run against its baseline.

The unit of analysis is the job's step: a synchronous data-parallel step lasts as long as its
slowest rank, so each run is reduced to one series, the per-step maximum of ``step_time`` over
ranks. Consecutive steps are autocorrelated (thermal state, page cache, background load), so every
statistic that needs independent samples works on blocks of consecutive steps whose length comes
from the series' own lag-1 autocorrelation:

- warm-up: MSER-5 (White 1997), the truncation point that minimises the standard error of the
  remaining mean, searched over the first half of the run, on batch medians so spikes do not move it,
  then extended by as much again (at most a tenth of the run) to drop the transient's tail;
- regression: fault median / baseline median - 1, with a circular block bootstrap CI at 1 - alpha;
- significance: Mann-Whitney U on block medians with an effective-sample-size correction, and only
  if p < alpha, the CI excludes zero and the effect is at least ``min_effect`` (a practical
  threshold: 1% by default). :func:`aa_false_positive_rate` measures how often that call fires when
  nothing changed (0.5% of 1,000 synthetic A/A pairs, see bench/bench_sensitivity.py);
- onset: binary segmentation with Pettitt's rank statistic, its variance inflated by the
  autocorrelation time, keeping change points whose level shift is at least ``onset_min_effect``.
  That threshold is its own: a calibrated ``min_effect`` (raised to absorb run-to-run drift,
  which does not exist inside one run) must not switch off finding where a fault began.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from slurm_chaos.analysis.model import Comparison, Stats
from slurm_chaos.errors import DataError
from slurm_chaos.probe.reader import RunData
from slurm_chaos.rundir import FaultWindow

FloatArray = npt.NDArray[np.float64]

T = TypeVar("T")

ALPHA = 0.01
MIN_EFFECT = 0.01
ONSET_MIN_EFFECT = 0.01
# A CI still admitting a regression this large, while the call is "not significant", is too noisy to tell.
INCONCLUSIVE_EFFECT = 0.05
MIN_STEPS = 20
N_BOOT = 1000
SEED = 20260515
_MSER_BATCH = 5


@dataclass(frozen=True)
class JobSeries:
    """The job's per-step time (max over ranks) and the steps' start times (NaN when unknown)."""

    step_time: FloatArray
    t_start: FloatArray


def job_series(run: RunData) -> JobSeries:
    """Reduce a run to its per-step job time; ranks that stopped early truncate the series."""
    matrix = run.matrix("step_time")
    n = matrix.shape[1]
    starts = np.stack([r.t_start[:n] for r in run.ranks])
    with np.errstate(invalid="ignore"):
        t = np.nanmin(starts, axis=0) if np.isfinite(starts).any() else np.full(n, np.nan)
    return JobSeries(matrix.max(axis=0), np.asarray(t, dtype=np.float64))


def robust_stats(x: FloatArray) -> Stats:
    if len(x) == 0:
        return Stats(0, math.nan, math.nan, math.nan)
    med, p95, p99 = np.percentile(x, [50, 95, 99])
    return Stats(len(x), float(med), float(p95), float(p99))


def detect_warmup(x: FloatArray, max_fraction: float = 0.5) -> int:
    """Number of leading steps to drop (MSER-5 on batch medians, searched over the first part)."""
    m = len(x) // _MSER_BATCH
    if m < 8:
        return 0
    y = np.median(x[: m * _MSER_BATCH].reshape(m, _MSER_BATCH), axis=1)
    # Suffix sums give every candidate truncation's variance in one pass.
    s1 = np.cumsum(y[::-1])[::-1]
    s2 = np.cumsum((y * y)[::-1])[::-1]
    count = np.arange(m, 0, -1, dtype=np.float64)
    var = np.maximum(s2 / count - (s1 / count) ** 2, 0.0)
    mser = var / count
    limit = max(1, int(m * max_fraction))
    d = int(np.argmin(mser[:limit]))
    if limit > 2 and d >= limit - 1:
        # The minimum at the edge of the search means drift or a step change, not a warm-up.
        return 0
    # MSER marks where the transient stops dominating the variance; its tail decays over about as
    # long again and, left in, biases the median (A/A false positives 1.45% instead of 1.25%). The
    # extension is capped at a tenth of the run so a long warm-up does not eat the measurement.
    return min(d + min(d, m // 10), limit) * _MSER_BATCH


def lag1_autocorrelation(x: FloatArray, segment: int = 64) -> float:
    """Lag-1 autocorrelation, the median over short centred segments.

    Centring each segment on its own keeps a level shift (the fault itself, or the warm-up's tail)
    from passing for autocorrelation, which would blow up every block length.
    """
    k = len(x) // segment
    if k < 2:
        if len(x) < 3:
            return 0.0
        segs = (x - np.median(x))[None, :]
    else:
        segs = x[: k * segment].reshape(k, segment)
        segs = segs - segs.mean(axis=1, keepdims=True)
    num = np.einsum("ij,ij->i", segs[:, :-1], segs[:, 1:])
    den = np.einsum("ij,ij->i", segs, segs)
    valid = den > 0
    return float(np.median(num[valid] / den[valid])) if valid.any() else 0.0


def block_length(*series: FloatArray) -> int:
    """Block of consecutive steps long enough that block statistics are roughly independent."""
    rho = max(0.0, min(0.95, max(lag1_autocorrelation(s) for s in series)))
    tau = (1.0 + rho) / (1.0 - rho)  # integrated autocorrelation time of an AR(1) process
    n = min(len(s) for s in series)
    return int(max(1, min(math.ceil(2.0 * tau), n // MIN_STEPS if n >= MIN_STEPS else 1)))


def _block_medians(x: FloatArray, block: int) -> FloatArray:
    k = len(x) // block
    if k == 0:
        return np.asarray([np.median(x)])
    return np.asarray(np.median(x[: k * block].reshape(k, block), axis=1), dtype=np.float64)


def mann_whitney_p(base: FloatArray, fault: FloatArray, block: int) -> float:
    """Two-sided Mann-Whitney p-value on block medians, corrected for what autocorrelation remains.

    Neighbouring block medians still correlate a little; the normal approximation's variance is
    inflated by 1 + 2 r1 (r1: their pooled lag-1 autocorrelation, if positive), the usual
    effective-sample-size correction.
    """
    a, b = _block_medians(base, block), _block_medians(fault, block)
    if len(a) < 2 or len(b) < 2:
        return 1.0
    if np.ptp(np.concatenate([a, b])) == 0.0:
        return 1.0
    n1, n2 = len(a), len(b)
    u = float(
        sps.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic", use_continuity=False).statistic
    )
    sigma = math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12.0)
    r1 = _pooled_lag1(a, b)
    z = (u - n1 * n2 / 2.0) / (sigma * math.sqrt(1.0 + 2.0 * max(0.0, r1)))
    return float(2.0 * sps.norm.sf(abs(z)))


def _pooled_lag1(*samples: FloatArray) -> float:
    num = den = 0.0
    for x in samples:
        d = x - x.mean()
        num += float(np.dot(d[:-1], d[1:]))
        den += float(np.dot(d, d))
    return 0.0 if den == 0.0 else num / den


def _bootstrap_medians(x: FloatArray, block: int, n_boot: int, rng: np.random.Generator) -> FloatArray:
    """Medians of circular block-bootstrap resamples, in chunks so memory stays bounded."""
    n = len(x)
    k = math.ceil(n / block)
    offsets = np.arange(block)
    out = np.empty(n_boot)
    chunk = max(1, 4_000_000 // max(n, 1))
    for lo in range(0, n_boot, chunk):
        hi = min(n_boot, lo + chunk)
        starts = rng.integers(0, n, size=(hi - lo, k))
        idx = ((starts[:, :, None] + offsets) % n).reshape(hi - lo, k * block)[:, :n]
        out[lo:hi] = np.median(x[idx], axis=1)
    return out


def bootstrap_ratio_ci(
    base: FloatArray, fault: FloatArray, block: int, level: float, n_boot: int = N_BOOT, seed: int = SEED
) -> tuple[float, float]:
    """Percentile CI of median(fault) / median(base) - 1 (circular block bootstrap, seeded)."""
    rng = np.random.default_rng(seed)
    mb = _bootstrap_medians(base, block, n_boot, rng)
    mf = _bootstrap_medians(fault, block, n_boot, rng)
    ratios = mf / mb - 1.0
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
    return float(lo), float(hi)


def pettitt(x: FloatArray) -> tuple[int, float]:
    """Most likely change point (index of the first step after it) and Pettitt's statistic K."""
    n = len(x)
    r = sps.rankdata(x)
    u = 2.0 * np.cumsum(r)[:-1] - np.arange(1, n) * (n + 1.0)
    k = int(np.argmax(np.abs(u)))
    return k + 1, float(abs(u[k]))


def change_points(
    x: FloatArray,
    tau: float,
    min_effect: float = MIN_EFFECT,
    p_max: float = 1e-4,
    min_size: int = 10,
    max_points: int = 4,
) -> list[int]:
    """Binary segmentation with Pettitt's test; returns sorted step indices where the level shifts."""
    found: list[int] = []
    segments = [(0, len(x))]
    while segments and len(found) < max_points:
        lo, hi = segments.pop(0)
        n = hi - lo
        if n < 2 * min_size:
            continue
        k, stat = pettitt(x[lo:hi])
        # Autocorrelation inflates Var(U) by about tau; scale the asymptotic p-value accordingly.
        p = 2.0 * math.exp(-6.0 * stat * stat / ((n**3 + n**2) * tau))
        cut = lo + k
        before, after = np.median(x[lo:cut]), np.median(x[cut:hi])
        if p > p_max or cut - lo < min_size or hi - cut < min_size or before <= 0:
            continue
        if abs(after / before - 1.0) < min_effect:
            continue
        found.append(cut)
        segments += [(lo, cut), (cut, hi)]
    return sorted(found)


def detect_fault_segment(x: FloatArray, min_effect: float = MIN_EFFECT) -> tuple[int, int] | None:
    """Steps [onset, end) during which the job ran at least ``min_effect`` slower than before.

    None when no such rise is found; ``end`` is ``len(x)`` when the job never recovered.
    """
    if len(x) < 2 * MIN_STEPS:
        return None
    block = block_length(x)
    points = change_points(x, max(1.0, block / 2.0), min_effect)
    if not points:
        return None
    bounds = [0, *points, len(x)]
    levels = [float(np.median(x[lo:hi])) for lo, hi in itertools.pairwise(bounds)]
    # The first rise is the onset (a warm-up only ever steps down); the fault lasts until the
    # level is back near where it was before the rise.
    for i in range(1, len(levels)):
        reference = levels[i - 1]
        if levels[i] >= reference * (1.0 + min_effect):
            for j in range(i + 1, len(levels)):
                if levels[j] < reference * (1.0 + min_effect / 2.0):
                    return bounds[i], bounds[j]
            return bounds[i], len(x)
    return None


def _fault_selection(
    fault: JobSeries, window: FaultWindow | None, base_warm: int, min_effect: float
) -> tuple[int, FloatArray, tuple[int, int] | None]:
    """Warm-up length of the fault run, its steps that count as 'under fault', and the detected segment.

    With a known fault window, the steps whose start lies inside it; without one, the segment that
    change-point detection finds, or every step after the warm-up if it finds none.
    """
    x, t = fault.step_time, fault.t_start
    if window is not None and len(t) > 0 and bool(np.isfinite(t).all()):
        pre = int(np.searchsorted(t, window.start))
        # Warm-up is searched before the fault so a step change at its start is not mistaken for it.
        warm = detect_warmup(x[:pre], max_fraction=0.9) if pre >= 8 * _MSER_BATCH else detect_warmup(x)
        mask = (t >= window.start) & (t <= (math.inf if window.end is None else window.end))
        mask[:warm] = False
        return warm, x[mask], _segment(x, min(warm, base_warm), min_effect)
    warm = detect_warmup(x)
    # MSER also trims a step up in the first half; start the search where the baseline settled.
    segment = _segment(x, min(warm, base_warm), min_effect)
    if segment is None:
        return warm, x[warm:], None
    lo, hi = max(segment[0], warm), segment[1]
    return warm, x[lo:hi] if hi - lo >= MIN_STEPS else x[warm:], segment


def _segment(x: FloatArray, skip: int, min_effect: float) -> tuple[int, int] | None:
    found = detect_fault_segment(x[skip:], min_effect)
    return None if found is None else (found[0] + skip, found[1] + skip)


def compare_series(
    base: JobSeries,
    fault: JobSeries,
    window: FaultWindow | None = None,
    *,
    alpha: float = ALPHA,
    min_effect: float = MIN_EFFECT,
    n_boot: int = N_BOOT,
    seed: int = SEED,
    onset_min_effect: float = ONSET_MIN_EFFECT,
) -> Comparison:
    """Compare two job series; with a fault window only the fault run's steps inside it count."""
    base_warm = detect_warmup(base.step_time)
    b = base.step_time[base_warm:]
    fault_warm, f, segment = _fault_selection(fault, window, base_warm, onset_min_effect)
    sb, sf = robust_stats(b), robust_stats(f)
    onset_step = None if segment is None else segment[0]
    onset_time = None
    if onset_step is not None and math.isfinite(fault.t_start[onset_step]):
        onset_time = float(fault.t_start[onset_step])
    if min(len(b), len(f)) < MIN_STEPS or not sb.median > 0:
        reason = f"only {len(b)} baseline and {len(f)} fault steps after warm-up (need {MIN_STEPS} each)"
        regression = ci_low = ci_high = math.nan
        p, significant, block = 1.0, False, 1
    else:
        block = block_length(b, f)
        regression = sf.median / sb.median - 1.0
        ci_low, ci_high = bootstrap_ratio_ci(b, f, block, 1.0 - alpha, n_boot, seed)
        p = mann_whitney_p(b, f, block)
        # All three, so that A/A pairs stay under 1% (measured 0.7% over 2,000 pairs at rho = 0.3 and 5%
        # noise, where the rank test alone gave 1.0-1.5%).
        significant = p < alpha and (ci_low > 0.0 or ci_high < 0.0) and abs(regression) >= min_effect
        reason = ""
        if not significant and (ci_high >= INCONCLUSIVE_EFFECT or ci_low <= -INCONCLUSIVE_EFFECT):
            reason = (
                f"too noisy: the {100 * (1 - alpha):.0f}% CI [{100 * ci_low:+.1f}%, {100 * ci_high:+.1f}%] "
                f"still admits a change of {100 * INCONCLUSIVE_EFFECT:.0f}% or more"
            )
    return Comparison(
        baseline=sb,
        fault=sf,
        regression=regression,
        ci_low=ci_low,
        ci_high=ci_high,
        p_value=p,
        significant=significant,
        baseline_warmup_steps=base_warm,
        fault_warmup_steps=fault_warm,
        block_steps=block,
        inconclusive_reason=reason,
        onset_step=onset_step,
        onset_time=onset_time,
    )


def compare_runs(
    base: RunData,
    fault: RunData,
    window: FaultWindow | None = None,
    *,
    alpha: float = ALPHA,
    min_effect: float = MIN_EFFECT,
    onset_min_effect: float = ONSET_MIN_EFFECT,
) -> Comparison:
    """Compare two probe runs of the same job shape; mismatched ranks raise :class:`DataError`."""
    if base.world_size != fault.world_size:
        raise DataError(
            f"{fault.directory}: {fault.world_size} ranks, but baseline {base.directory} has "
            f"{base.world_size}; compare runs of the same job shape"
        )
    return compare_series(
        job_series(base),
        job_series(fault),
        window,
        alpha=alpha,
        min_effect=min_effect,
        onset_min_effect=onset_min_effect,
    )


@dataclass(frozen=True)
class Calibration:
    """A/A calibration: how often the method calls 'significant' when nothing changed.

    ``min_effect_for_1pct`` is the smallest practical threshold that would have kept these pairs'
    rate at or under 1% (the ``min_effect`` used, when the rate already was). The test models
    within-run noise; run-to-run differences (another job's load, another node, a thermal state)
    it does not, and on a shared machine they dominate. Setting ``min_effect`` to this value (the
    report reads it from the manifest) absorbs them.
    """

    n_pairs: int
    false_positives: int
    rate: float
    upper_95: float
    min_effect_for_1pct: float


def aa_false_positive_rate(
    pairs: Iterable[tuple[FloatArray, FloatArray]],
    *,
    alpha: float = ALPHA,
    min_effect: float = MIN_EFFECT,
    n_boot: int = 400,
) -> Calibration:
    """Run the comparison on A/A pairs (two runs of the same, unfaulted job) and count significant calls.

    ``upper_95`` is the one-sided 95% Clopper-Pearson bound on the true rate, so a small number of
    pairs is not mistaken for proof of a low rate.
    """
    comparisons = [
        compare_series(
            JobSeries(a, np.full(len(a), np.nan)),
            JobSeries(b, np.full(len(b), np.nan)),
            alpha=alpha,
            min_effect=min_effect,
            n_boot=n_boot,
            seed=SEED + i,
        )
        for i, (a, b) in enumerate(pairs)
    ]
    return calibration_of(comparisons, min_effect)


def calibration_of(comparisons: Sequence[Comparison], min_effect: float = MIN_EFFECT) -> Calibration:
    """The A/A calibration of comparisons between runs in which nothing changed."""
    total = len(comparisons)
    if total == 0:
        raise ValueError("A/A calibration needs at least one pair")
    flagged = [abs(c.regression) for c in comparisons if c.significant]
    hits = len(flagged)
    upper = 1.0 if hits == total else float(sps.beta.ppf(0.95, hits + 1, total - hits))
    # Raising min_effect above the k-th largest flagged effect leaves k - 1 false positives; allow 1%.
    allowed = int(0.01 * total)
    ranked = sorted(flagged, reverse=True)
    threshold = min_effect if hits <= allowed else max(min_effect, ranked[allowed] * (1.0 + 1e-9))
    return Calibration(total, hits, hits / total, upper, threshold)


def aa_pairs(runs: Sequence[T]) -> list[tuple[T, T]]:
    """Every unordered pair of distinct baseline runs (job series), for :func:`aa_false_positive_rate`."""
    return list(itertools.combinations(runs, 2))
