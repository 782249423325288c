"""Benchmark: which in-job statistic sees the smallest slowdown in REAL sandbox noise (offline).

Usage: nice -n 19 python bench/bench_noise_sandbox.py DIR [DIR ...] [--schedules 30] [--draws 2000]
       [--seed 0] [--alpha 0.01]

Every DIR is searched for probe runs (directories holding ``rank-*.h5``). A run whose recorded
schedule is a placebo (an A/A run, ``control-aa``) is *noise*; a run with a real switchback
schedule (slow-rank, known-slow-node, ...) is a *real fault*; runs without a schedule are skipped.
Nothing is run on a cluster: this only re-reads recorded runs.

For every variant of the in-job statistic (the first row is what ``slurm_chaos.analysis.switchback``
ships: per step the minimum over ranks of the step time, per block the lower decile of the log step
times and the clipped mean, the quieter tested at 0.8 alpha and the other at 0.2, p the smaller
p / share; the second row what it
shipped before: the maximum over ranks, the block mean clipped at the median +- 3 scaled MADs;
both log, pairs corrected for the slope between neighbouring pairs, a randomisation test over the
pairs' coins at alpha 0.01) and of the schedule (blocks of 10-15 steps, 1 transition step
dropped), each noise run is cut into ``--schedules`` placebo schedules drawn as
``schedule.switchback_schedule`` draws them (the same seeds for every variant with the same block
lengths), and each is judged:

- ``FP``: significant placebo calls (no effect was applied: all are false positives);
- ``mde nt``: median of the normal-theory mde from the pair differences (as reported before,
  ``switchback.minimum_detectable``); ``mde rep``: median of the mde as reported now, from the
  randomisation distribution (``switchback.randomisation_mde``, each statistic at alpha / their
  number, the smallest);
- ``mde emp``: the effect the test detects (significant, slower) in 80% of the placebo cuts when
  every step of the on blocks is made 1+effect times slower (exact: every statistic here is
  scale-equivariant, so the effect is a shift of the blocks' logs); ``@rep``: the power when each
  cut's effect is its own reported mde (80% where it is honest);
- ``job e%``: that power at 2.5, 5 and 10%;
- ``rank e%``: the power when only the last rank loses ``e`` of its step time in its compute in
  the on blocks, which every rank then waits for (its compute and every rank's step time grow by
  e x its step time, the other ranks' communication by as much);
- ``sparse e%``: the power when a random quarter of the on steps are 1+4e slower (the same mean
  cost: stalls, not a slower device);
- real faults: the estimate on the run's own recorded schedule and whether it is significant
  (``*``), for the variants that keep that schedule's blocks.

Every variant computes its statistic the same way under every assignment (a fixed function of the
steps and the blocks), so each test is an exact randomisation test; the draws are ``--draws``
random coins plus the recorded assignment. ``check_today`` asserts that the first row computes
what ``judge_switchback_run`` computes (each statistic's estimate, the reported mde). After the
table: the best variant whose false positives alpha explains (binomial tail >= 5%), the steps
it and the shipped one need for an MDE of 5% at this noise
(empirical MDE scaled by sqrt(steps), and normal theory from the pair spread), and both measured
on all noise runs' steps concatenated into one long job.

Results on /var/tmp/sbdata/demo1 (a ``make demo`` on a 2-core VM that was running other work too:
11 A/A runs of 500 steps, 2 nodes x 1 rank, ~15 ms a step, per-step log sd ~0.35, lag-1
autocorrelation ~0.7, the two ranks' compute times correlated ~0.8; 30 placebo cuts a run, 2,000
draws), re-measured 2026-12-05 with the shipped statistic (excerpt; the other rows as on 12-04)::

    variant (power: %)          FP    mde nt  rep  emp @rep job 2.5/5/10 rank   sparse  | slow node noisy net
    shipped (min, decile+mean)  6/330  8.2  9.3 13.2  82% 7/29/72  7/31/73  2/ 6/14 | 80%* 71%* -8% 1055%*
    before (max, clipped mean)  6/330 33.3 31.6 36.1  73% 1/ 5/14  1/ 5/13  2/ 5/12 | 39%* 29% -12% 791%*
    min, quartile + mean        4/330 12.1 13.6 16.0  79% 3/16/54  4/18/57  2/ 7/15 | 72%* 46%* -8% 987%*
    min over ranks              4/330 29.5 26.6 31.5  71% 2/ 7/20  2/ 7/22  2/ 7/19 | 59%* 27%  -8% 874%*
    block lower quartile        6/330 16.3 18.0 19.4  85% 3/ 9/38  3/ 8/37  2/ 5/ 8 | 50%* 49%* -2% 894%*
    block lower decile          8/330 12.2 13.3 14.1  83% 4/14/57  4/13/56  2/ 4/ 4 | 50%* 55%*  0% 956%*
    blocks 4-6                  3/330 19.0 18.7 18.8  79% 2/ 6/31  2/ 6/28  2/ 7/22 |
    lower decile, min ranks     6/330  8.2  8.7 12.6   -   9/35/72 10/37/75  3/ 4/ 4 | 80%* 71%*  7% 1055%*

The shipped pair of statistics detects 13.2% with 80% power at 500 steps (before: 36.1%), 0.95x
what the lower decile of the fastest rank alone detects (12.6%): Bonferroni's alpha / 2 is the
price of keeping the clipped mean, which keeps a stall of a quarter of the on steps in view (14%
power at 10%, before 12%; the decile alone 4%). False positives stay within what alpha explains
(3.3 of 330 expected; the cuts of one run share its steps, so the counts are correlated). The
reported mde (from the randomisation) is honest per cut: an effect of each cut's own mde is
detected in 82% of cuts; its median sits below the pooled empirical MDE because the runs' noise
differs (the noisier runs need more). Longer jobs, cut from the 11 runs concatenated (5,170
steps) into half-overlapping windows, 40 placebo cuts each: 1,000 steps: shipped MDE 9.5%
(reported 7.6%, @rep 79%, FP 1/360), before 21.8%; 2,000 steps: shipped 6.3% (reported 6.1%, @rep
82%, FP 0/160), before 13.3%; the whole 5,170: reported 3.8%, empirical 3.6%. An MDE of 5% needs
~3,300 steps with the shipped statistic (~25,000 before).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from slurm_chaos.analysis.straggler import compute_matrix
from slurm_chaos.analysis.switchback import (
    _block_stats,
    _remove_local_trend,
    alpha_shares,
    minimum_detectable,
    randomisation_mde,
    randomisation_test,
    reassignments,
)
from slurm_chaos.probe.reader import Selection, read_run
from slurm_chaos.schedule import DROPPED, ON, SwitchbackSchedule, switchback_schedule

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

EFFECTS = (0.025, 0.05, 0.10)
#: Effects (fractions) on which the empirical MDE is interpolated.
GRID = np.unique(np.concatenate([np.geomspace(0.005, 4.0, 72), EFFECTS]))
POWER = 0.80
FAULTS = ("slow-rank", "known-slow-node", "noisy-neighbour", "network-degradation")


@dataclass(frozen=True)
class Run:
    name: str
    step: FloatArray  # ranks x steps: step time
    compute: FloatArray  # ranks x steps: compute time (step time less communication)
    comm: FloatArray
    steps: IntArray
    schedule: SwitchbackSchedule | None
    observed: IntArray | None


@dataclass(frozen=True)
class Variant:
    name: str
    quantity: str = "step"  # "step": step time; "compute": the ranks' compute time
    reduce: str = "max"  # over ranks, per step: max, median, min
    #: per block: clipped mean, median, qNN (NNth percentile of the logs: q25 lower quartile); several
    #: joined by "+" are judged together, each at its share of alpha (weighted Bonferroni, as shipped)
    block: str = "clipped"
    trend: str = "slope"  # slope (today), none, second (block minus its neighbours' mean)
    min_block: int = 10
    max_block: int = 15
    transition: int = 1

    @property
    def default_blocks(self) -> bool:
        return (self.min_block, self.max_block) == (10, 15)


VARIANTS = (
    Variant("shipped (min, decile + mean)", reduce="min", block="q10+clipped"),
    Variant("before (max, clipped mean)"),
    Variant("min, quartile + mean", reduce="min", block="q25+clipped"),
    Variant("median over ranks", reduce="median"),
    Variant("min over ranks", reduce="min"),
    Variant("block median", block="median"),
    Variant("block lower quartile", block="q25"),
    Variant("block lower decile", block="q10"),
    Variant("no slope correction", trend="none"),
    Variant("2nd difference (neighbours)", trend="second"),
    Variant("compute time (max)", quantity="compute"),
    Variant("compute time (min)", quantity="compute", reduce="min"),
    Variant("transition 0", transition=0),
    Variant("transition 2 (trim)", transition=2),
    Variant("transition 3 (trim)", transition=3),
    Variant("blocks 20-25", min_block=20, max_block=25),
    Variant("blocks 6-8", min_block=6, max_block=8),
    Variant("blocks 4-6", min_block=4, max_block=6),
    Variant("blocks 4-6, no slope", min_block=4, max_block=6, trend="none"),
    Variant("blocks 4-6, min ranks, median", min_block=4, max_block=6, block="median", reduce="min"),
    Variant("lower quartile, min ranks", block="q25", reduce="min"),
    Variant("blocks 6-8, lower quartile", min_block=6, max_block=8, block="q25"),
    Variant("blocks 4-6, lower quartile", min_block=4, max_block=6, block="q25"),
    Variant("blocks 4-6, lower quartile, min", min_block=4, max_block=6, block="q25", reduce="min"),
    Variant("lower decile, min ranks", block="q10", reduce="min"),
    Variant("blocks 20-25, lower quartile, min", min_block=20, max_block=25, block="q25", reduce="min"),
)


# --- reading -----------------------------------------------------------------------------------


def find_runs(roots: Sequence[Path]) -> tuple[list[Run], list[Run], list[str]]:
    """(noise runs, real-fault runs, skipped) under ``roots``."""
    dirs = sorted({p.parent for root in roots for p in root.rglob("rank-*.h5")})
    noise: list[Run] = []
    faults: list[Run] = []
    skipped: list[str] = []
    selection = Selection(
        fields=("step_time", "compute_time", "comm_time"), events=False, telemetry=False, allreduce=False
    )
    for d in dirs:
        data = read_run(d, selection)
        schedule = data.fault_schedule()
        if schedule is None:
            skipped.append(str(d))
            continue
        step = data.matrix("step_time")
        n = step.shape[1]
        observed = data.observed_state()
        run = Run(
            name=_short(d),
            step=step,
            compute=compute_matrix(data)[:, :n],
            comm=data.matrix("comm_time")[:, :n],
            steps=np.asarray(data.ranks[0].step[:n], dtype=np.int64),
            schedule=schedule,
            observed=None if observed is None else np.asarray(observed[:n], dtype=np.int64),
        )
        (noise if schedule.placebo else faults).append(run)
    return noise, faults, skipped


def _short(d: Path) -> str:
    parts = d.parts
    return parts[-2] if parts[-1] == "fault" else parts[-1]


# --- the statistic -----------------------------------------------------------------------------


def job_series(step: FloatArray, compute: FloatArray, v: Variant) -> FloatArray:
    x = step if v.quantity == "step" else compute
    if v.reduce == "max":
        return np.asarray(x.max(axis=0), dtype=np.float64)
    if v.reduce == "min":
        return np.asarray(x.min(axis=0), dtype=np.float64)
    return np.asarray(np.median(x, axis=0), dtype=np.float64)


def block_index(
    schedule: SwitchbackSchedule, steps: IntArray, x: FloatArray, observed: IntArray | None
) -> IntArray:
    """Block of each measured step, -1 for steps that do not count (as the library counts them)."""
    states = schedule.step_states(steps)
    keep = (states != DROPPED) & np.isfinite(x) & (x > 0)
    if observed is not None:
        keep &= observed == states
    return np.where(keep, schedule.block_of(steps), -1)


def block_logs(x: FloatArray, block: IntArray, blocks: int, how: str) -> FloatArray:
    """log of each block's statistic (rows of ``x``: series; columns: steps) -> series x blocks."""
    if "+" in how:  # one row block per statistic
        return np.vstack([block_logs(x, block, blocks, part) for part in how.split("+")])
    if how == "clipped":
        return np.asarray(np.log(_block_stats(x, block, blocks)), dtype=np.float64)
    out = np.full((x.shape[0], blocks), np.nan)
    q = 50.0 if how == "median" else float(how[1:])
    logs = np.log(x)
    for b in range(blocks):
        cols = block == b
        if cols.any():
            out[:, b] = np.percentile(logs[:, cols], q, axis=1)
    return np.asarray(out, dtype=np.float64)


def detrend(stats: FloatArray, schedule: SwitchbackSchedule, how: str) -> FloatArray:
    """The same fixed transformation under every assignment (so the test stays exact)."""
    if how == "slope":
        return _remove_local_trend(stats, schedule, np.ones(schedule.pairs, dtype=np.bool_))
    if how == "second":
        padded = np.concatenate([stats[:, :1], stats, stats[:, -1:]], axis=1)
        return np.asarray(stats - 0.5 * (padded[:, :-2] + padded[:, 2:]), dtype=np.float64)
    return stats


# --- the test ----------------------------------------------------------------------------------

_DRAWS: dict[tuple[int, int, int], FloatArray] = {}


def draws(pairs: int, n: int, seed: int) -> FloatArray:
    """``n`` random coins per pair as assignments (rows, 1.0 on), drawn once per pair count."""
    key = (pairs, n, seed)
    if key not in _DRAWS:
        coins = np.random.default_rng([seed, pairs]).integers(0, 2, size=(n, pairs))
        _DRAWS[key] = np.stack([coins, 1 - coins], axis=2).reshape(n, 2 * pairs).astype(np.float64)
    return _DRAWS[key]


@dataclass(frozen=True)
class Test:
    estimate: FloatArray  # per series: on minus off (log)
    p_value: FloatArray
    mde: float  # reported (normal theory) for series 0


def test(series: FloatArray, z: FloatArray, n_draws: int, seed: int, alpha: float) -> Test:
    """Randomisation test of every row of ``series`` (x blocks) over the pairs' coins."""
    pairs = z.shape[0] // 2
    w = np.vstack([z[None, :], draws(pairs, n_draws, seed)])
    t = series @ ((2.0 * w - 1.0) / pairs).T  # series x (1 + draws)
    p = np.mean(np.abs(t) >= np.abs(t[:, :1]) - 1e-12, axis=1)
    sign = np.where(z[0::2] == ON, 1.0, -1.0)
    d = (series[0, 0::2] - series[0, 1::2]) * sign
    mde = minimum_detectable(float(d.std(ddof=1) / math.sqrt(pairs)), pairs, alpha) if pairs > 1 else math.inf
    return Test(np.asarray(t[:, 0], dtype=np.float64), np.asarray(p, dtype=np.float64), mde)


def on_steps(schedule: SwitchbackSchedule, steps: IntArray) -> BoolArray:
    block = schedule.block_of(steps)
    on = np.zeros(steps.shape, dtype=np.bool_)
    inside = block >= 0
    on[inside] = np.asarray(schedule.assignment)[block[inside]] == ON
    return on


def sparse(run: Run, on: BoolArray, effect: float, seed: int) -> tuple[FloatArray, FloatArray]:
    """Step and compute times when a random quarter of the on steps are 1 + 4 x effect slower
    (the same mean cost as ``effect`` on every on step: a stall, not a slower device)."""
    hit = on & (np.random.default_rng([seed, 7]).random(on.shape) < 0.25)
    factor = np.where(hit, 1.0 + 4.0 * effect, 1.0)[None, :]
    return run.step * factor, run.compute * factor


def slow_rank(run: Run, on: BoolArray, effect: float) -> tuple[FloatArray, FloatArray]:
    """Step and compute times when the last rank loses ``effect`` of its step time in on steps."""
    extra = effect * run.step[-1] * on
    step = run.step + extra[None, :]
    compute = run.compute.copy()
    compute[-1] += extra
    return step, compute


def shares_of(stats: FloatArray, branches: int) -> FloatArray:
    """Each branch's share of alpha per series (branches x series), as the library weighs them
    (:func:`slurm_chaos.analysis.switchback.alpha_shares`: the quieter statistic gets most)."""
    rows = stats.shape[0] // branches
    return np.array([alpha_shares(stats[r::rows][:branches]) for r in range(rows)]).T


def combined(
    stats: FloatArray, branches: int, z: FloatArray, n_draws: int, seed: int, alpha: float
) -> tuple[FloatArray, FloatArray]:
    """(estimate, p-value) per series of ``branches`` statistics stacked in ``stats`` (branch-major
    rows), each tested at its share of alpha: p is the smallest p / share (weighted Bonferroni, as
    the library combines them), the estimate the sign-deciding one of the branch that gives it."""
    rows = stats.shape[0] // branches
    tests = [test(stats[b * rows : (b + 1) * rows], z, n_draws, seed, alpha) for b in range(branches)]
    scaled = np.vstack([t.p_value for t in tests]) / shares_of(stats, branches)
    first = np.argmin(scaled, axis=0)
    estimate = np.vstack([t.estimate for t in tests])[first, np.arange(rows)]
    return estimate, np.minimum(1.0, scaled.min(axis=0))


def reported_mde(stats: FloatArray, branches: int, z: FloatArray, seed: int, alpha: float) -> float:
    """The library's reported mde for the first series of each branch: from the randomisation
    distribution, each branch at its share of alpha, the smallest."""
    rows = stats.shape[0] // branches
    first = stats[0::rows][:branches]
    pairs = len(z) // 2
    assignment = z.astype(np.int64)
    draws = reassignments(pairs, assignment, seed)
    tests = [
        randomisation_test(first[b : b + 1], assignment, draws, alpha * share)[0]
        for b, share in enumerate(alpha_shares(first))
    ]
    return min(randomisation_mde(t.spread, t.critical, pairs) for t in tests)


@dataclass
class Tally:
    tests: int = 0
    false_positives: int = 0
    mde: list[float] = field(default_factory=list)  # reported (from the randomisation), per test
    mde_normal: list[float] = field(default_factory=list)  # normal theory (shipped before), per test
    #: detections when each cut's on blocks are slower by that cut's own reported mde (the nearest
    #: GRID effect): about POWER of the tests where the reported mde is honest
    own: int = 0
    pair_sd: list[float] = field(default_factory=list)  # spread of the pair differences, per test
    #: detections per GRID effect (every on step slower: a shift of the on blocks' logs)
    job: FloatArray = field(default_factory=lambda: np.zeros(len(GRID)))
    #: detections per EFFECTS: one rank's compute slower; a random quarter of the on steps slower
    rank: FloatArray = field(default_factory=lambda: np.zeros(len(EFFECTS)))
    sparse: FloatArray = field(default_factory=lambda: np.zeros(len(EFFECTS)))


def evaluate(runs: Sequence[Run], v: Variant, schedules: int, n_draws: int, seed: int, alpha: float) -> Tally:
    """Every noise run cut into ``schedules`` placebo schedules of ``v``'s blocks, each judged."""
    tally = Tally()
    shifts = np.log1p(GRID)
    for run in runs:
        n = run.step.shape[1]
        for k in range(schedules):
            schedule = switchback_schedule(
                n,
                seed * 1_000_003 + k,
                min_block=v.min_block,
                max_block=v.max_block,
                transition_steps=v.transition,
                placebo=True,
            )
            on = on_steps(schedule, run.steps)
            rows = [job_series(run.step, run.compute, v)]
            for e in EFFECTS:
                rows.append(job_series(*slow_rank(run, on, e), v))
            for e in EFFECTS:
                rows.append(job_series(*sparse(run, on, e, seed * 1_000_003 + k), v))
            x = np.vstack(rows)
            block = block_index(schedule, run.steps, x[0], None)
            stats = detrend(block_logs(x, block, len(schedule.block_steps), v.block), schedule, v.trend)
            z = np.asarray(schedule.assignment, dtype=np.float64)
            dz = detrend(z[None, :], schedule, v.trend)[0]  # the shift's image: linear in the blocks
            branches = v.block.count("+") + 1
            per = len(rows)
            series = np.vstack(
                [
                    np.vstack([s[:1], s[:1] + shifts[:, None] * dz[None, :], s[1:]])
                    for s in (stats[b * per : (b + 1) * per] for b in range(branches))
                ]
            )
            estimate, p_value = combined(series, branches, z, n_draws, seed, alpha)
            hit = (p_value < alpha) & (estimate > 0)
            tally.tests += 1
            tally.false_positives += int(p_value[0] < alpha)
            tally.mde.append(reported_mde(stats, branches, z, seed, alpha))
            if math.isfinite(tally.mde[-1]):
                nearest = int(np.argmin(np.abs(np.log(GRID) - math.log(max(tally.mde[-1], 1e-9)))))
                tally.own += int(hit[1 + nearest])
            tally.mde_normal.append(test(stats[:1], z, 1, seed, alpha).mde)
            tally.pair_sd.append(pair_sd(stats[0], z))
            end = 1 + len(GRID) + len(EFFECTS)
            tally.job += hit[1 : 1 + len(GRID)]
            tally.rank += hit[1 + len(GRID) : end]
            tally.sparse += hit[end:]
    return tally


def pair_sd(series: FloatArray, z: FloatArray) -> float:
    sign = np.where(z[0::2] == ON, 1.0, -1.0)
    return float(((series[0::2] - series[1::2]) * sign).std(ddof=1))


def empirical_mde(power: FloatArray) -> float:
    """The smallest effect of GRID with ``POWER``, interpolated on log effect."""
    above = np.flatnonzero(power >= POWER)
    if len(above) == 0:
        return math.inf
    i = int(above[0])
    if i == 0:
        return float(GRID[0])
    lo, hi = math.log(GRID[i - 1]), math.log(GRID[i])
    f = (POWER - power[i - 1]) / (power[i] - power[i - 1])
    return math.exp(lo + f * (hi - lo))


def judge_fault(run: Run, v: Variant, n_draws: int, seed: int, alpha: float) -> tuple[float, bool] | None:
    """The variant's estimate (fraction) and significance on the run's own schedule."""
    if run.schedule is None or not v.default_blocks or v.transition >= run.schedule.min_block:
        return None
    schedule = replace(run.schedule, transition_steps=v.transition)
    x = job_series(run.step, run.compute, v)[None, :]
    block = block_index(schedule, run.steps, x[0], run.observed)
    stats = block_logs(x, block, len(schedule.block_steps), v.block)
    ok = np.asarray(np.isfinite(stats).all(axis=0), dtype=np.bool_)
    pairs_ok = np.asarray(ok[0::2] & ok[1::2], dtype=np.bool_)
    keep = np.repeat(pairs_ok, 2)
    if pairs_ok.sum() < 2:
        return None
    kept = replace(
        schedule,
        block_steps=tuple(np.asarray(schedule.block_steps)[keep].tolist()),
        assignment=tuple(np.asarray(schedule.assignment)[keep].tolist()),
    )
    z = np.asarray(kept.assignment, dtype=np.float64)
    if v.trend == "slope":
        series = _remove_local_trend(stats[:, keep], schedule, pairs_ok)
    else:
        series = detrend(stats[:, keep], kept, v.trend)
    estimate, p_value = combined(series, v.block.count("+") + 1, z, n_draws, seed, alpha)
    return math.expm1(float(estimate[0])), bool(p_value[0] < alpha)


def check_today(runs: Sequence[Run], alpha: float) -> None:
    """The 'shipped' row computes what ``judge_switchback_run`` computes (each statistic's estimate,
    and the reported mde)."""
    from slurm_chaos.analysis.switchback import judge_switchback

    v = VARIANTS[0]
    for run in runs[:3]:
        assert run.schedule is not None
        lib = judge_switchback(run.step.min(axis=0), run.schedule, steps=run.steps, alpha=alpha)
        x = job_series(run.step, run.compute, v)[None, :]
        block = block_index(run.schedule, run.steps, x[0], None)
        stats = detrend(block_logs(x, block, len(run.schedule.block_steps), v.block), run.schedule, v.trend)
        z = np.asarray(run.schedule.assignment, dtype=np.float64)
        for row, branch in zip(stats, lib.branches, strict=True):
            mine = test(row[None, :], z, 1, 0, alpha)
            assert math.isclose(
                math.expm1(float(mine.estimate[0])), branch.estimate, rel_tol=1e-9, abs_tol=1e-12
            )
        mde = reported_mde(stats, len(lib.branches), z, run.schedule.seed, alpha)
        assert math.isclose(mde, lib.mde, rel_tol=1e-9), (mde, lib.mde)


def steps_for(pair_sd_median: float, v: Variant, target: float, alpha: float) -> int:
    """Steps a job needs (30 warm-up + pairs of mean-length blocks) for a reported MDE of ``target``."""
    for pairs in range(2, 100_000):
        df = pairs - 1
        z = float(sps.t.ppf(1 - alpha / 2, df)) + float(sps.t.ppf(POWER, df))
        if math.expm1(z * pair_sd_median / math.sqrt(pairs)) <= target:
            return 30 + round(pairs * (v.min_block + v.max_block))
    return -1


def concatenated(runs: Sequence[Run]) -> Run:
    """All noise runs (same rank count as the first) after their 30 warm-up steps, as one job."""
    same = [r for r in runs if r.step.shape[0] == runs[0].step.shape[0]]
    step = np.concatenate([r.step[:, 30:] for r in same], axis=1)
    compute = np.concatenate([r.compute[:, 30:] for r in same], axis=1)
    comm = np.concatenate([r.comm[:, 30:] for r in same], axis=1)
    steps = np.arange(step.shape[1], dtype=np.int64)
    return Run(f"{len(same)} runs concatenated", step, compute, comm, steps, None, None)


# --- output ------------------------------------------------------------------------------------


def pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%" if math.isfinite(x) else "inf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--schedules", type=int, default=30, help="placebo cuts per noise run")
    parser.add_argument("--draws", type=int, default=2000, help="random re-assignments per test")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alpha", type=float, default=0.01)
    args = parser.parse_args()
    t0 = time.perf_counter()
    noise, faults, skipped = find_runs(args.dirs)
    if not noise:
        raise SystemExit("no unfaulted runs with a placebo schedule found")
    check_today(noise, args.alpha)
    steps = sorted({r.step.shape[1] for r in noise})
    print(
        f"noise: {len(noise)} A/A runs ({', '.join(map(str, steps))} steps, "
        f"{noise[0].step.shape[0]} ranks); real faults: {', '.join(r.name for r in faults) or 'none'}; "
        f"skipped (no schedule): {len(skipped)}; {args.schedules} placebo cuts a run, {args.draws} draws, "
        f"alpha {args.alpha:g}"
    )
    order = {name: i for i, name in enumerate(FAULTS)}
    shown = sorted(faults, key=lambda f: (order.get(f.name, len(FAULTS)), f.name))
    head = (
        f"{'variant':<33} {'FP':>7} {'mde nt':>7} {'mde rep':>8} {'mde emp':>8} {'@rep':>5}  "
        f"{'job 2.5/5/10%':>17}  "
        f"{'rank 2.5/5/10%':>17}  {'sparse 2.5/5/10%':>17}  " + " ".join(f"{f.name[:14]:>14}" for f in shown)
    )
    print(head)
    print("-" * len(head))
    tallies: dict[str, tuple[Variant, Tally, float]] = {}
    for v in VARIANTS:
        tally = evaluate(noise, v, args.schedules, args.draws, args.seed, args.alpha)
        power_job = tally.job / tally.tests
        power_rank = tally.rank / tally.tests
        emp = empirical_mde(power_job)
        tallies[v.name] = (v, tally, emp)
        job = "/".join(f"{100 * power_job[list(GRID).index(e)]:3.0f}" for e in EFFECTS)
        rank = "/".join(f"{100 * p:3.0f}" for p in power_rank)
        spread = "/".join(f"{100 * p:3.0f}" for p in tally.sparse / tally.tests)
        cells = []
        for f in shown:
            got = judge_fault(f, v, args.draws, args.seed, args.alpha)
            cells.append(f"{'-':>14}" if got is None else f"{pct(got[0], 0) + ('*' if got[1] else ' '):>14}")
        fp = f"{tally.false_positives}/{tally.tests}"
        print(
            f"{v.name:<33} {fp:>7} {pct(float(np.median(tally.mde_normal))):>7} "
            f"{pct(float(np.median(tally.mde))):>8} {pct(emp):>8} {100 * tally.own / tally.tests:>4.0f}%  "
            f"{job:>17}  {rank:>17}  {spread:>17}  " + " ".join(cells)
        )
    honest = [
        (emp, name)
        for name, (v, t, emp) in tallies.items()
        if sps.binom.sf(t.false_positives - 1, t.tests, args.alpha) >= 0.05
    ]
    today = tallies[VARIANTS[0].name]
    best_emp, best_name = min(honest) if honest else (math.inf, "")
    print(
        f"\nFP: significant placebo cuts (no effect applied); mde nt: median mde by normal theory (as "
        f"reported before); mde rep: median reported mde (from the randomisation);\nmde emp: effect detected "
        f"in {100 * POWER:.0f}% of all cuts; @rep: power when each cut's effect is its own reported mde "
        f"({100 * POWER:.0f}% if honest);\njob/rank/sparse: power (%) when every on step "
        "is 1+e slower / only the last rank's compute is (the others wait) / a random quarter of the on "
        "steps\nare 1+4e slower; real faults: estimate on the run's own schedule, * significant."
    )
    if best_name:
        v = tallies[best_name][0]
        print(
            f"best at an honest FP rate: {best_name}: empirical MDE {pct(best_emp)} "
            f"(shipped {pct(today[2])}, {best_emp / today[2]:.2f}x)"
        )
        for name, (vv, tt, emp) in ((today[0].name, today), (best_name, tallies[best_name])):
            theory = steps_for(float(np.median(tt.pair_sd)), vv, 0.05, args.alpha)
            scaled = 30 + round((max(steps) - 30) * (emp / 0.05) ** 2)
            print(
                f"steps for an MDE of 5% with '{name}': {scaled} (empirical MDE x sqrt(steps)), "
                f"{theory} (normal theory at the median pair spread)"
            )
        long = concatenated(noise)
        for vv in (today[0], v):
            tt = evaluate([long], vv, max(4, args.schedules // 2), args.draws, args.seed, args.alpha)
            print(
                f"{long.name} ({long.step.shape[1]} steps), '{vv.name}': FP {tt.false_positives}/{tt.tests}, "
                f"mde rep {pct(float(np.median(tt.mde)))}, "
                f"mde emp {pct(empirical_mde(tt.job / tt.tests))}"
            )
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
