"""A job judged on its own switchback schedule: two statistics, one exact test, one coherent CI.

The run's fault schedule (:mod:`slurm_chaos.schedule`) toggled the fault in on/off blocks that come in pairs,
the order within each pair decided by a coin. Everything here follows from that design:

- statistics: the job's step time per step is the *fastest* rank's (every rank waits for the
  slowest at the all-reduce, so a fault on any rank shows in all, and the minimum carries less of
  the ranks' own noise than the maximum). Per block, two statistics on a log scale: the lower
  decile of the measured steps' log times (the typical step, blind to the long steps that make
  most of the noise) and the log of their mean after clipping outliers to the block's median +- 3
  scaled MADs (the cost, which also sees a slowdown of only some steps: stalls). The effect
  ``theta`` of each is the mean of the on blocks' values minus the off blocks'; ``regression =
  exp(theta) - 1`` is the on-off difference as a fraction of the off level (0.05 = on blocks 5%
  slower). Before the test, each pair's two blocks are corrected for the drift across the pair
  that the slope between the neighbouring pairs' levels predicts (a pair's level holds one on and
  one off block under any assignment, so the correction does not depend on the assignment and the
  test stays exact). Both statistics are computed the same way under every assignment, and both
  shift by exactly ``theta0`` when every on step is scaled by exp(theta0) (a fixed quantile of log
  times and a clipped mean are scale-equivariant), which is what the test and its inversion need.
  Why: on the sandbox's real noise (lag-1 autocorrelation ~0.65, 12-step block means CV ~33%,
  bench/bench_noise_sandbox.py on 11 A/A runs, 330 placebo cuts) the clipped mean of the slowest
  rank detected 36% with 80% power at 500 steps; the lower decile of the fastest, 12.6%, and both
  together 13.2% (power at 5/10%: 5/14% before, 29/72% now), with false positives within alpha;
- test: a randomisation test over the recorded assignment, for each statistic at its share of
  alpha: :data:`QUIET_SHARE` (0.8) for the quieter of the two, the rest for the other (weighted
  Bonferroni). Under "the fault changes every step time by the factor exp(theta0)", the blocks'
  values minus ``theta0`` for the on blocks would have come out the same under any assignment
  the schedule could have drawn; a statistic's p-value is the share of those assignments (all
  2^pairs of them up to 16 pairs, else 10,000 drawn by the schedule's own coin plus the recorded
  one) whose contrast is at least as far from zero as the recorded one. Both statistics use the
  same re-assignments. Which statistic is quieter is read off the pairs' levels (the mean of a
  pair's two blocks; :func:`alpha_shares`), which no re-assignment and no hypothesised effect
  changes, so the shares are fixed under the test's own randomisation: each test is exact at its
  share, and the job's p-value, the smallest p / share, is below alpha exactly when one statistic
  rejects at its share. Against alpha / 2 each, the quieter statistic's MDE is ~4% smaller
  (2.75% -> 2.63% on iid 5% noise at 400 steps, the same false positives), and the other
  still catches what only it sees (stalls, at 0.2 alpha). (A single max-|t| over both would
  spend less of alpha on their correlation, but its rejection set in theta0 is not an interval,
  so its CI could not be read off as one);
- CI: the set of ``theta0`` that this same test does not reject at ``alpha``: for each statistic
  the set its test keeps at its share (for each re-assignment the set where it counts against
  ``theta0`` is an interval around the estimate, two linear roots, so its CI is an order statistic
  of their end points, and p < share x alpha exactly when 0 lies outside it), and the job's CI is
  the intersection of the two, so ``p < alpha`` exactly when 0 lies outside the CI, by
  construction. The estimate is the statistics' estimates weighted by 1 / spread^2, held inside
  the CI. Where the two CIs do not meet, no single factor explains both (the fault changed the
  shape of the step times: stalls); then one statistic rejects at its share and its estimate and
  CI are reported (``consistent`` False), still with 0 outside;
- ``mde``: the smallest effect this run would detect with 80% power at its own noise, read off
  the randomisation distribution: for each statistic, its standard error under the null (the
  spread of the contrast over the re-assignments once the estimate's effect is taken out, exact
  for sign flips) and its critical value at its share of alpha in those units (the re-assignments'
  quantile), widened for the effect itself (under theta the re-assignments' contrasts spread as
  sqrt(se^2 + theta^2 / pairs)); the smaller of the two statistics' MDEs. On a long job of
  sandbox noise it matches the simulated power (3.8% reported, 3.6% measured at 5,170 steps);
  across short runs of uneven noise the median reported MDE sits below the effect detected in 80%
  of all of them, the noisier runs' MDEs being larger (bench/bench_noise_sandbox.py);
- effect call: significant -> SLOWDOWN or SPEEDUP; otherwise NO EFFECT only if the whole CI lies
  inside +-``margin`` (equivalence), else INCONCLUSIVE, with the MDE in the reason;
- stragglers: per rank and step, log(compute time) minus log(mean compute time of the other
  ranks), so job-wide noise and drift cancel; the same block statistic, test and re-assignments,
  and Holm across ranks. A rank is named when its adjusted p-value is below alpha and it computes
  slower in the on blocks; ``score`` is that slowdown relative to the other ranks (fraction). A
  rank that is slower all the time (a slower node) is not named: only the change counts.

The drift between runs never enters: every comparison is inside one run, block against
neighbouring block.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from slurm_chaos.analysis.model import Comparison, Stats
from slurm_chaos.analysis.multiplicity import holm
from slurm_chaos.analysis.regression import robust_stats
from slurm_chaos.analysis.straggler import compute_matrix
from slurm_chaos.probe.reader import RunData
from slurm_chaos.schedule import (
    DESIGN,
    DROPPED,
    OFF,
    ON,
    SwitchbackSchedule,
    all_pair_assignments,
    min_pairs,
    placebo_of,
    random_pair_assignments,
    switchback_schedule,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

ALPHA = 0.01
POWER = 0.80
CLIP = 3.0
#: The job statistic's quantile of each block's log step times (the lower decile).
QUANTILE = 0.10
#: The job's two statistics, judged on the same re-assignments; weighted Bonferroni over both.
BRANCHES = ("lower decile", "clipped mean")
#: The share of alpha the quieter statistic is tested at; the other is tested at the rest. Which
#: one is quieter is read off data that no re-assignment and no hypothesised effect changes (the
#: pairs' levels), so the weighted Bonferroni test stays exact.
QUIET_SHARE = 0.8
EQUIVALENCE_MARGIN = 0.05
EXACT_PAIRS = 16
N_RANDOM = 10_000


class Effect(StrEnum):
    SLOWDOWN = "slowdown"
    SPEEDUP = "speedup"
    NO_EFFECT = "no effect"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Randomisation:
    """The test of one series of block statistics (log scale), and its inversion."""

    estimate: float
    ci_low: float
    ci_high: float
    p_value: float
    pair_se: float  # standard error of the estimate from the spread of the pair differences
    #: the estimate's standard error under the null, from the re-assignments: the root mean square
    #: of the contrasts of the blocks less the estimate's effect (the sign-flip variance, exact)
    spread: float = math.inf
    #: the test's critical value at its level in units of ``spread``: the share ``alpha`` of the
    #: re-assignments' contrasts (at the estimate) that lie furthest from zero start beyond it
    critical: float = math.inf


@dataclass(frozen=True)
class Branch:
    """One of the job's statistics, tested at ``share`` x alpha: its estimate (fraction), CI and
    p-value, and the MDE its own randomisation distribution gives."""

    name: str
    estimate: float
    ci_low: float
    ci_high: float
    p_value: float
    mde: float
    share: float


@dataclass(frozen=True)
class RankContrast:
    """One rank's change in compute time, relative to the other ranks, between on and off blocks."""

    rank: int
    host: str
    score: float  # fraction: 0.10 = 10% slower than the others in on blocks than in off blocks
    ci_low: float
    ci_high: float
    p_value: float
    p_adjusted: float  # Holm across the job's ranks
    significant: bool

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "score": _round(self.score, 6)}


@dataclass(frozen=True)
class SwitchbackResult:
    """The fields of the report's experiment entry, and what they rest on."""

    regression: float
    ci_low: float
    ci_high: float
    p_value: float
    significant: bool
    mde: float
    effect: Effect
    reason: str
    alpha: float
    margin: float
    pairs: int
    on: Stats
    off: Stats
    dropped_steps: int
    placebo: bool
    ranks: tuple[RankContrast, ...] = ()
    design: str = DESIGN
    #: Holm-adjusted across a campaign's in-job tests (``family`` of them); None: judged alone.
    p_adjusted: float | None = None
    family: int = 1
    #: the job's statistics one by one (lower decile, clipped mean); the fields above combine them
    branches: tuple[Branch, ...] = ()
    #: False when no common effect fits both statistics at alpha (their CIs do not meet: the fault
    #: changed the shape of the step times, not their scale); the CI is then the significant one's
    consistent: bool = True

    def adjusted(self, p_adjusted: float, family: int) -> SwitchbackResult:
        """This result as one of ``family`` tests of a campaign (Holm): significant only where the
        adjusted p-value is below alpha too, INCONCLUSIVE with the reason where it no longer is."""
        if not self.significant or p_adjusted < self.alpha:
            return replace(self, p_adjusted=p_adjusted, family=family)
        reason = (
            f"p = {self.p_value:.2g} alone, but {p_adjusted:.2g} after Holm's adjustment across the "
            f"campaign's {family} in-job tests: not significant at {self.alpha:g}"
        )
        return replace(
            self,
            significant=False,
            effect=Effect.INCONCLUSIVE,
            reason=reason,
            p_adjusted=p_adjusted,
            family=family,
        )

    @property
    def stragglers(self) -> tuple[RankContrast, ...]:
        """Ranks that compute significantly slower when the fault is on, slowest first."""
        named = [r for r in self.ranks if r.significant and r.score > 0]
        return tuple(sorted(named, key=lambda r: (-r.score, r.rank)))

    def to_json(self) -> dict[str, Any]:
        return {
            "design": self.design,
            "regression": _round(self.regression),
            "ci_low": _round(self.ci_low),
            "ci_high": _round(self.ci_high),
            "p_value": _round(self.p_value, 12),
            "p_adjusted": None if self.p_adjusted is None else _round(self.p_adjusted, 12),
            "significant": self.significant,
            "mde": _round(self.mde),
            "effect": self.effect.value,
            "reason": self.reason,
            "pairs": self.pairs,
            "placebo": self.placebo,
            "stragglers": [r.to_json() for r in self.stragglers],
        }

    def comparison(self) -> Comparison:
        """As a :class:`Comparison` for :func:`.verdict.judge`: off blocks as the baseline, and
        ``inconclusive_reason`` set unless the call is significant or NO EFFECT by equivalence."""
        return Comparison(
            baseline=self.off,
            fault=self.on,
            regression=self.regression,
            ci_low=self.ci_low,
            ci_high=self.ci_high,
            p_value=self.p_value,
            significant=self.significant,
            baseline_warmup_steps=0,
            fault_warmup_steps=0,
            block_steps=0,
            inconclusive_reason=self.reason if self.effect is Effect.INCONCLUSIVE else "",
            within_job=True,
        )


def _round(value: float, digits: int = 6) -> float | None:
    return round(float(value), digits) if math.isfinite(value) else None


# --- the test ----------------------------------------------------------------------------------


def reassignments(pairs: int, assignment: IntArray, seed: int) -> FloatArray:
    """The assignments the test compares the recorded one with (rows, 1.0 on): all of them for a
    few pairs, else the recorded one plus :data:`N_RANDOM` drawn by the schedule's coin (seeded,
    so reproducible). Read-only: the last few are cached, as one run is judged several times
    (job, ranks, and in calibration and benchmarks on the same schedule)."""
    return _reassignments(pairs, tuple(int(a) for a in assignment), seed)


@functools.lru_cache(maxsize=8)
def _reassignments(pairs: int, assignment: tuple[int, ...], seed: int) -> FloatArray:
    if pairs <= EXACT_PAIRS:
        rows = all_pair_assignments(pairs)
    else:
        drawn = random_pair_assignments(pairs, N_RANDOM, np.random.default_rng([seed, pairs]))
        rows = np.vstack([np.asarray(assignment, dtype=np.int64)[None, :], drawn])
    out = rows.astype(np.float64)
    out.flags.writeable = False
    return out


def _contrasts(values: FloatArray, z: FloatArray, on: FloatArray) -> FloatArray:
    """Mean of ``values`` over each assignment's on blocks minus the mean over its off blocks.

    ``values`` is series x blocks, ``z`` draws x blocks (1.0 on, 0.0 off) with ``on`` blocks on
    in each row; the result is series x draws.
    """
    on_sum = (z @ values.T).T
    off_sum = values.sum(axis=1, keepdims=True) - on_sum
    return np.asarray(on_sum / on - off_sum / (z.shape[1] - on), dtype=np.float64)


def randomisation_test(
    blocks: FloatArray, assignment: IntArray, draws: FloatArray, alpha: float = ALPHA
) -> tuple[Randomisation, ...]:
    """Test each row of ``blocks`` (series x blocks, log scale) against the re-assignments ``draws``.

    For re-assignment w and hypothesised effect t, the statistic is a - t b (a = w @ x,
    b = w @ assignment) against the recorded c - t; |a - t b| >= |c - t| holds between the roots
    (c - a) / (1 - b) and (c + a) / (1 + b), an interval that contains c. p(t) is the share of
    intervals that contain t.
    """
    z = np.asarray(draws, dtype=np.float64)
    on = z.sum(axis=1)
    recorded = assignment.astype(np.float64)[None, :]
    c = _contrasts(blocks, recorded, recorded.sum(axis=1))[:, 0]  # (series,)
    a = _contrasts(blocks, z, on)  # (series, draws)
    b = _contrasts(recorded, z, on)[0]  # (draws,)
    whole = np.abs(np.abs(b) - 1.0) < 1e-9  # the recorded assignment or its mirror: always as extreme
    with np.errstate(divide="ignore", invalid="ignore"):
        r1 = (c[:, None] - a) / (1.0 - b)
        r2 = (c[:, None] + a) / (1.0 + b)
    low = np.where(whole, -np.inf, np.minimum(np.minimum(r1, r2), c[:, None]))
    high = np.where(whole, np.inf, np.maximum(np.maximum(r1, r2), c[:, None]))
    n = draws.shape[0]
    k = _needed(alpha, n)
    low_sorted, high_sorted = np.sort(low, axis=1), np.sort(high, axis=1)
    covering = np.sum((low <= 0.0) & (high >= 0.0), axis=1)
    se = _pair_se(blocks, assignment)
    spread = _null_spread(blocks, assignment, c)
    # The re-assignments' contrasts of the blocks less the estimate's effect: the test's null
    # distribution where the effect is the estimate; its share alpha furthest from zero starts at
    # the critical value.
    null = np.sort(np.abs(a - c[:, None] * b[None, :]), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        critical = null[:, n - k] / spread
    return tuple(
        Randomisation(
            estimate=float(c[i]),
            ci_low=float(low_sorted[i, k - 1]),
            ci_high=float(high_sorted[i, n - k]),
            p_value=float(covering[i] / n),
            pair_se=float(se[i]),
            spread=float(spread[i]),
            critical=float(critical[i]) if spread[i] > 0 else math.inf,
        )
        for i in range(blocks.shape[0])
    )


def _needed(alpha: float, n: int) -> int:
    """Fewest covering intervals with count / n >= alpha (the same comparison p < alpha makes)."""
    k = max(1, math.ceil(alpha * n))
    while k > 1 and (k - 1) / n >= alpha:
        k -= 1
    while k < n and k / n < alpha:
        k += 1
    return k


def _pair_se(blocks: FloatArray, assignment: IntArray) -> FloatArray:
    sign = np.where(assignment[0::2] == ON, 1.0, -1.0)
    d = (blocks[:, 0::2] - blocks[:, 1::2]) * sign  # on minus off, per pair
    pairs = d.shape[1]
    if pairs < 2:
        return np.full(blocks.shape[0], np.inf)
    return np.asarray(d.std(axis=1, ddof=1) / math.sqrt(pairs), dtype=np.float64)


def _null_spread(blocks: FloatArray, assignment: IntArray, estimate: FloatArray) -> FloatArray:
    """Standard deviation of the contrast over all re-assignments of the blocks less the estimate's
    effect (sign flips of the pairs' on-minus-off differences): sqrt(sum (d - estimate)^2) / pairs."""
    sign = np.where(assignment[0::2] == ON, 1.0, -1.0)
    d = (blocks[:, 0::2] - blocks[:, 1::2]) * sign - estimate[:, None]
    return np.asarray(np.sqrt((d * d).sum(axis=1)) / d.shape[1], dtype=np.float64)


def randomisation_mde(spread: float, critical: float, pairs: int, power: float = POWER) -> float:
    """Smallest slowdown (fraction) the randomisation test detects with ``power``, from its own
    null distribution: ``spread`` (the estimate's standard error under the null) and ``critical``
    (the test's critical value in units of it).

    Under an effect theta the recorded pair differences carry theta, so the re-assignments'
    contrasts spread wider, sqrt(spread^2 + theta^2 / pairs): the smallest theta with
    theta - critical * sqrt(spread^2 + theta^2 / pairs) = z(power) * spread. With few pairs the
    root may not exist: no effect is detected with that power.
    """
    if pairs < 2 or not (math.isfinite(spread) and math.isfinite(critical)) or spread <= 0:
        return math.inf
    zb = float(sps.norm.ppf(power))
    a = 1.0 - critical**2 / pairs
    if a <= 0:
        return math.inf
    # u = theta / spread: a u^2 - 2 zb u + zb^2 - critical^2 = 0, the root above zb
    disc = zb * zb - a * (zb * zb - critical**2)
    u = (zb + math.sqrt(max(disc, 0.0))) / a
    return math.expm1(u * spread)


def minimum_detectable(pair_se: float, pairs: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest slowdown (fraction) detected with ``power`` at this standard error (normal theory,
    t with pairs - 1 degrees of freedom: the MDE reported before the lower decile joined the clipped
    mean, kept for the benchmarks; see :func:`randomisation_mde`)."""
    if pairs < max(2, min_pairs(alpha)) or not math.isfinite(pair_se):
        return math.inf
    df = pairs - 1
    return math.expm1((float(sps.t.ppf(1.0 - alpha / 2.0, df)) + float(sps.t.ppf(power, df))) * pair_se)


# --- block statistics --------------------------------------------------------------------------


def _block_stats(values: FloatArray, block: IntArray, blocks: int) -> FloatArray:
    """Robust mean of each block's values (series x steps -> series x blocks); NaN when empty.

    Values further than ``CLIP`` scaled MADs from the block's median are clipped to that bound
    first: a lone long step weighs like a moderately long one, and with normal noise almost
    nothing is clipped, so short blocks keep the mean's efficiency (a trimmed mean of ten steps
    would throw away a fifth of them).
    """
    grid, counts = _padded(values, block, blocks)
    if grid is None:
        return np.full((values.shape[0], blocks), np.nan)
    inside = np.arange(grid.shape[2]) < counts[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):  # empty blocks: inf - inf, 0 / 0
        median = _padded_median(grid, counts)
        spread = CLIP * 1.4826 * _padded_median(np.abs(grid - median[..., None]), counts)
        clipped = np.clip(grid, (median - spread)[..., None], (median + spread)[..., None])
        out = np.where(inside, clipped, 0.0).sum(axis=2) / counts
    return np.where(counts > 0, out, np.nan)


def _block_quantile(values: FloatArray, block: IntArray, blocks: int, q: float = QUANTILE) -> FloatArray:
    """The ``q`` quantile of each block's values (linear between order statistics, as numpy's
    default), series x steps -> series x blocks; NaN when empty."""
    grid, counts = _padded(values, block, blocks)
    if grid is None:
        return np.full((values.shape[0], blocks), np.nan)
    ordered = np.sort(grid, axis=2)
    h = q * np.maximum(counts - 1, 0)
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(counts - 1, 0))
    index = np.arange(grid.shape[1])
    below, above = ordered[:, index, lo], ordered[:, index, hi]
    with np.errstate(invalid="ignore"):
        out = below + (h - lo) * np.where(hi > lo, above - below, 0.0)
    return np.where(counts > 0, out, np.nan)


def _padded(values: FloatArray, block: IntArray, blocks: int) -> tuple[FloatArray | None, IntArray]:
    """The measured values as one grid, series x blocks x longest block (+inf beyond a block's own
    steps), so every block is done at once; and each block's count. None when nothing is measured."""
    series = values.shape[0]
    steps = np.flatnonzero(block >= 0)
    owner = block[steps]
    counts = np.bincount(owner, minlength=blocks)
    if len(steps) == 0:
        return None, counts
    order = np.argsort(owner, kind="stable")
    steps, owner = steps[order], owner[order]
    position = np.arange(len(steps)) - np.repeat(np.cumsum(counts) - counts, counts)
    grid = np.full((series, blocks, int(counts.max())), np.inf)
    grid[:, owner, position] = values[:, steps]
    return grid, counts


def _padded_median(grid: FloatArray, counts: IntArray) -> FloatArray:
    """Median over the last axis of the first ``counts[block]`` entries (the rest is +inf)."""
    ordered = np.sort(grid, axis=2)
    low = np.maximum(counts - 1, 0) // 2
    high = np.maximum(counts - 1, 0) - low
    blocks = np.arange(grid.shape[1])
    return np.asarray(0.5 * (ordered[:, blocks, low] + ordered[:, blocks, high]), dtype=np.float64)


def _measured_blocks(
    schedule: SwitchbackSchedule, steps: IntArray, finite: npt.NDArray[np.bool_], observed: IntArray | None
) -> IntArray:
    """Block index of each measured step, -1 for steps that do not count."""
    states = schedule.step_states(steps)
    block = schedule.block_of(steps)
    keep = (states != DROPPED) & finite
    if observed is not None:
        # The probe's record of what the agent acknowledged: a step it saw in another state (a late
        # toggle) or in transition does not count.
        keep &= observed == states
    return np.where(keep, block, -1)


def _remove_local_trend(
    stats: FloatArray, schedule: SwitchbackSchedule, pairs: npt.NDArray[np.bool_]
) -> FloatArray:
    """Block statistics (series x kept blocks) less the drift within each pair that the
    neighbouring pairs' levels predict.

    A pair's level (the mean of its two blocks) holds one on and one off block whatever the
    assignment, so under every hypothesised effect it moves by the same amount for all pairs and
    the slope between pairs does not depend on the assignment: subtracting it keeps the
    randomisation test exact, and a steady drift no longer adds to the pair differences.
    """
    level = 0.5 * (stats[:, 0::2] + stats[:, 1::2])
    if level.shape[1] < 2:
        return stats
    starts = np.asarray(schedule.block_starts, dtype=np.float64)[0::2][pairs]
    length = np.asarray(schedule.block_steps, dtype=np.float64)[0::2][pairs]
    slope = np.gradient(level, starts + length, axis=1)
    drift = slope * length  # from the centre of the first block to the centre of the second
    out = stats.copy()
    out[:, 0::2] += 0.5 * drift
    out[:, 1::2] -= 0.5 * drift
    return out


def _complete_pairs(stats: FloatArray) -> npt.NDArray[np.bool_]:
    ok = np.asarray(np.isfinite(stats).all(axis=0), dtype=np.bool_)
    return np.asarray(ok[0::2] & ok[1::2], dtype=np.bool_)


def _rank_contrast(compute: FloatArray) -> FloatArray:
    """log(rank's compute time) - log(mean of the other ranks'), per rank and step."""
    n = compute.shape[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        others = (compute.sum(axis=0, keepdims=True) - compute) / (n - 1)
        return np.asarray(np.log(compute) - np.log(others), dtype=np.float64)


# --- judging a run -----------------------------------------------------------------------------


def judge_switchback(
    step_time: FloatArray,
    schedule: SwitchbackSchedule,
    *,
    compute: FloatArray | None = None,
    hosts: Sequence[str] = (),
    steps: IntArray | None = None,
    observed_state: IntArray | None = None,
    alpha: float = ALPHA,
    margin: float = EQUIVALENCE_MARGIN,
) -> SwitchbackResult:
    """Judge a run on its own schedule.

    ``step_time`` is the job's per-step time; ``compute`` (ranks x steps) the ranks' compute times
    for the straggler contrast, ``hosts`` their hosts; ``steps`` the step numbers of the columns
    (default 0, 1, ...); ``observed_state`` the probe's per-step fault state, if recorded.
    """
    x = np.asarray(step_time, dtype=np.float64)
    index = np.arange(len(x), dtype=np.int64) if steps is None else np.asarray(steps, dtype=np.int64)
    if index.shape != x.shape:
        raise ValueError(f"steps: {index.shape[0]} step numbers for {x.shape[0]} step times")
    if observed_state is not None and np.shape(observed_state) != x.shape:
        raise ValueError(f"observed_state: {np.shape(observed_state)} states for {x.shape[0]} step times")
    finite = np.isfinite(x) & (x > 0)
    block = _measured_blocks(schedule, index, finite, observed_state)
    n_blocks = len(schedule.block_steps)
    job = job_blocks(np.where(finite, x, np.nan), block, n_blocks)
    pairs_ok = _complete_pairs(job)
    keep_blocks = np.repeat(pairs_ok, 2)
    assignment = np.asarray(schedule.assignment, dtype=np.int64)[keep_blocks]
    pairs = int(pairs_ok.sum())
    states = schedule.step_states(index)
    measured = block >= 0
    on = robust_stats(x[measured & (states == ON)])
    off = robust_stats(x[measured & (states == OFF)])
    dropped = int(len(x) - measured.sum())
    if pairs < 2:
        return _untestable(schedule, pairs, on, off, dropped, alpha, margin)
    draws = reassignments(pairs, assignment, schedule.seed)
    job = _remove_local_trend(job[:, keep_blocks], schedule, pairs_ok)
    shares = alpha_shares(job)
    tests = tuple(
        randomisation_test(job[k : k + 1], assignment, draws, alpha * share)[0]
        for k, share in enumerate(shares)
    )
    branches = tuple(
        Branch(
            name,
            math.expm1(t.estimate),
            math.expm1(t.ci_low),
            math.expm1(t.ci_high),
            t.p_value,
            randomisation_mde(t.spread, t.critical, pairs) if pairs >= min_pairs(alpha * share) else math.inf,
            share,
        )
        for name, t, share in zip(BRANCHES, tests, shares, strict=True)
    )
    estimate, ci_low, ci_high, p_value, consistent = combine(tests, shares)
    mde = min(b.mde for b in branches)
    ranks = _ranks(compute, hosts, index, block, schedule, pairs_ok, assignment, draws, alpha)
    regression, low, high = math.expm1(estimate), math.expm1(ci_low), math.expm1(ci_high)
    significant = any(t.p_value < alpha * share for t, share in zip(tests, shares, strict=True))
    effect, reason = _call(regression, low, high, significant, mde, pairs, alpha, margin)
    return SwitchbackResult(
        regression=regression,
        ci_low=low,
        ci_high=high,
        p_value=p_value,
        significant=significant,
        mde=mde,
        effect=effect,
        reason=reason,
        alpha=alpha,
        margin=margin,
        pairs=pairs,
        on=on,
        off=off,
        dropped_steps=dropped,
        placebo=schedule.placebo,
        ranks=ranks,
        branches=branches,
        consistent=consistent,
    )


def job_blocks(x: FloatArray, block: IntArray, blocks: int) -> FloatArray:
    """The job's block statistics, one row per :data:`BRANCHES` entry (log scale): the lower decile
    of each block's log step times and the log of its clipped mean."""
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(x)[None, :]
        return np.vstack(
            [_block_quantile(logs, block, blocks), np.log(_block_stats(x[None, :], block, blocks))]
        )


def alpha_shares(blocks: FloatArray) -> tuple[float, ...]:
    """The share of alpha each statistic (row of ``blocks``, series x kept blocks, log scale) is
    tested at: :data:`QUIET_SHARE` for the quieter one, the rest split among the others.

    Quieter: the smaller mean square second difference of its pairs' levels (the mean of a pair's
    two blocks), which measures the block statistic's own noise with the slow drift taken out. A
    pair's level holds one on and one off block under every assignment, and a hypothesised effect
    moves every level by the same half of it, so the shares are the same under every
    re-assignment and every effect the CI tries: each test stays exact at its share, and the
    weighted Bonferroni test over them at alpha. The mean carries Gaussian noise best, the lower
    decile the sandbox's long steps; the other statistic still sees what only it can (stalls).
    """
    n = int(blocks.shape[0])
    if n < 2:
        return (1.0,) * n
    level = 0.5 * (blocks[:, 0::2] + blocks[:, 1::2])
    if level.shape[1] < 3:
        return (1.0 / n,) * n
    second = level[:, 2:] - 2.0 * level[:, 1:-1] + level[:, :-2]
    quiet = int(np.argmin((second * second).mean(axis=1)))
    return tuple(QUIET_SHARE if k == quiet else (1.0 - QUIET_SHARE) / (n - 1) for k in range(n))


def combine(
    tests: Sequence[Randomisation], shares: Sequence[float]
) -> tuple[float, float, float, float, bool]:
    """One estimate, CI and p-value from the statistics' tests, each at its ``share`` of alpha:
    (estimate, ci_low, ci_high, p_value, consistent), log scale.

    The p-value is the weighted Bonferroni one, the smallest p / share, so p < alpha exactly when
    some statistic's p < share x alpha, i.e. when 0 lies outside its CI; the CI is the effects no
    statistic rejects, the intersection of theirs, which therefore excludes 0 exactly then too.
    The estimate is the statistics' estimates weighted by their precision (1 / spread^2) and held
    inside the CI. Where the CIs do not meet, no common effect fits the job (the fault changed the
    shape of its step times, a stall of some steps), and the CI and estimate are those of the
    statistic with the smallest p / share, which is below alpha there: the call stays significant
    and 0 outside the CI.
    """
    scaled = [t.p_value / share for t, share in zip(tests, shares, strict=True)]
    p_value = min(1.0, min(scaled))
    low, high = max(t.ci_low for t in tests), min(t.ci_high for t in tests)
    if low > high:
        first = tests[int(np.argmin(scaled))]
        return first.estimate, first.ci_low, first.ci_high, p_value, False
    weights = [1.0 / t.spread**2 if 0 < t.spread < math.inf else 0.0 for t in tests]
    if sum(weights) > 0:
        estimate = sum(w * t.estimate for w, t in zip(weights, tests, strict=True)) / sum(weights)
    else:
        estimate = tests[0].estimate
    return min(max(estimate, low), high), low, high, p_value, True


def _ranks(
    compute: FloatArray | None,
    hosts: Sequence[str],
    index: IntArray,
    block: IntArray,
    schedule: SwitchbackSchedule,
    pairs_ok: npt.NDArray[np.bool_],
    assignment: IntArray,
    draws: FloatArray,
    alpha: float,
) -> tuple[RankContrast, ...]:
    if compute is None or compute.shape[0] < 2:
        return ()
    if compute.shape[1] != len(index):
        raise ValueError(f"compute: {compute.shape[1]} steps, but the job series has {len(index)}")
    contrast = _rank_contrast(np.asarray(compute, dtype=np.float64))
    usable = np.isfinite(contrast).all(axis=0)
    stats = _block_stats(contrast, np.where(usable, block, -1), len(schedule.block_steps))
    stats = stats[:, np.repeat(pairs_ok, 2)]
    if not np.isfinite(stats).all():
        return ()
    tests = randomisation_test(_remove_local_trend(stats, schedule, pairs_ok), assignment, draws, alpha)
    adjusted = holm([t.p_value for t in tests])
    return tuple(
        RankContrast(
            rank=r,
            host=hosts[r] if r < len(hosts) else "",
            score=math.expm1(t.estimate),
            ci_low=math.expm1(t.ci_low),
            ci_high=math.expm1(t.ci_high),
            p_value=t.p_value,
            p_adjusted=adjusted[r],
            significant=adjusted[r] < alpha,
        )
        for r, t in enumerate(tests)
    )


def _call(
    regression: float,
    low: float,
    high: float,
    significant: bool,
    mde: float,
    pairs: int,
    alpha: float,
    margin: float,
) -> tuple[Effect, str]:
    level = f"{100 * (1 - alpha):.0f}%"
    ci = f"{level} CI [{100 * low:+.1f}%, {100 * high:+.1f}%]"
    if significant:
        return (Effect.SLOWDOWN if regression > 0 else Effect.SPEEDUP), ""
    if -margin < low and high < margin:
        return Effect.NO_EFFECT, f"{ci} lies inside +-{100 * margin:.1f}%"
    need = min_pairs(alpha * QUIET_SHARE)
    if pairs < need:
        return Effect.INCONCLUSIVE, (
            f"only {pairs} on/off pairs: the randomisation test needs {need} to reach p < {alpha}"
        )
    return Effect.INCONCLUSIVE, (
        f"not significant, and the {ci} admits changes beyond +-{100 * margin:.1f}%; "
        f"this run detects {100 * mde:.1f}% or more (80% power)"
    )


def _untestable(
    schedule: SwitchbackSchedule, pairs: int, on: Stats, off: Stats, dropped: int, alpha: float, margin: float
) -> SwitchbackResult:
    return SwitchbackResult(
        regression=math.nan,
        ci_low=-math.inf,
        ci_high=math.inf,
        p_value=1.0,
        significant=False,
        mde=math.inf,
        effect=Effect.INCONCLUSIVE,
        reason=f"only {pairs} complete on/off pairs measured (need {min_pairs(alpha * QUIET_SHARE)})",
        alpha=alpha,
        margin=margin,
        pairs=pairs,
        on=on,
        off=off,
        dropped_steps=dropped,
        placebo=schedule.placebo,
    )


def judge_switchback_run(
    run: RunData,
    schedule: SwitchbackSchedule,
    *,
    observed_state: IntArray | None = None,
    alpha: float = ALPHA,
    margin: float = EQUIVALENCE_MARGIN,
) -> SwitchbackResult:
    """:func:`judge_switchback` on a probe run: the job's step time is the fastest rank's (the
    slowest rank's adds its own noise: every rank waits for the slowest at the all-reduce, so a
    fault that slows any one shows in all)."""
    step_time = run.matrix("step_time")
    n = step_time.shape[1]
    return judge_switchback(
        step_time.min(axis=0),
        schedule,
        compute=compute_matrix(run)[:, :n],
        hosts=run.hosts,
        steps=np.asarray(run.ranks[0].step[:n], dtype=np.int64),
        observed_state=None if observed_state is None else observed_state[:n],
        alpha=alpha,
        margin=margin,
    )


# --- placebo calibration -----------------------------------------------------------------------


@dataclass(frozen=True)
class PlaceboCalibration:
    """Unfaulted runs judged on placebo schedules: every significant call is a false positive."""

    runs: int
    false_positives: int
    rate: float
    upper_95: float  # one-sided Clopper-Pearson bound on the true rate
    mde_median: float
    alpha: float = ALPHA

    @property
    def p_excess(self) -> float:
        """The chance of at least this many false positives in this many runs if the test held
        its level alpha (binomial tail): small when the runs show more than alpha explains."""
        return float(sps.binom.sf(self.false_positives - 1, self.runs, self.alpha))

    @property
    def ok(self) -> bool:
        """No more false positives than the test's level explains (the binomial tail >= 5%)."""
        return self.p_excess >= 0.05

    def to_json(self) -> dict[str, Any]:
        return {
            "design": DESIGN,
            "runs": self.runs,
            "alpha": self.alpha,
            "false_positives": self.false_positives,
            "false_positive_rate": round(self.rate, 6),
            "false_positive_rate_upper_95": round(self.upper_95, 6),
            "p_excess": round(self.p_excess, 6),
            "mde_median": _round(self.mde_median),
            "ok": self.ok,
        }

    def summary(self) -> str:
        return (
            f"in-job test on placebo schedules: {self.runs} runs, {self.false_positives} significant "
            f"at alpha {100 * self.alpha:g}% (rate {100 * self.rate:.1f}%, 95% upper bound "
            f"{100 * self.upper_95:.1f}%); median MDE {100 * self.mde_median:.1f}%: "
            + ("OK" if self.ok else "TOO MANY false positives for the test's level")
        )


def placebo_calibration(results: Sequence[SwitchbackResult]) -> PlaceboCalibration:
    """False-positive rate and median MDE of unfaulted runs' judgements on placebo schedules."""
    if not results:
        raise ValueError("placebo calibration needs at least one run")
    hits = sum(r.significant for r in results)
    total = len(results)
    upper = 1.0 if hits == total else float(sps.beta.ppf(0.95, hits + 1, total - hits))
    alphas = {r.alpha for r in results}
    if len(alphas) != 1:
        raise ValueError(f"placebo calibration of tests at different levels: {sorted(alphas)}")
    mde = float(np.median([r.mde for r in results]))
    return PlaceboCalibration(total, hits, hits / total, upper, mde, alphas.pop())


def calibrate_placebo(
    step_times: Sequence[FloatArray],
    schedules: Sequence[SwitchbackSchedule] | None = None,
    *,
    seed: int = 0,
    alpha: float = ALPHA,
) -> PlaceboCalibration:
    """Judge unfaulted runs on placebo schedules: their recorded ones, or, for runs recorded
    without one, a placebo drawn per run (seed + run index) to fit its length."""
    if schedules is not None and len(schedules) != len(step_times):
        raise ValueError(f"schedules: {len(schedules)} for {len(step_times)} runs")
    results = []
    for i, x in enumerate(step_times):
        schedule = (
            schedules[i] if schedules is not None else switchback_schedule(len(x), seed + i, placebo=True)
        )
        results.append(judge_switchback(x, placebo_of(schedule), alpha=alpha))
    return placebo_calibration(results)
