"""The in-job statistic: two block statistics (lower decile, clipped mean) judged together, one
exact test and one CI; the reported MDE from the randomisation distribution."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from slurm_chaos.analysis.switchback import (
    ALPHA,
    BRANCHES,
    QUIET_SHARE,
    Effect,
    _block_quantile,
    alpha_shares,
    judge_switchback,
    randomisation_test,
    reassignments,
)
from slurm_chaos.schedule import SwitchbackSchedule, all_pair_assignments, placebo_of, switchback_schedule

FloatArray = npt.NDArray[np.float64]


def ar_noise(steps: int, rng: np.random.Generator, sd: float, phi: float) -> FloatArray:
    """Log step-time noise: AR(1) with lag-1 autocorrelation ``phi`` and marginal sd ``sd``."""
    z = rng.standard_normal(steps)
    e = np.empty(steps)
    e[0] = z[0]
    for i in range(1, steps):
        e[i] = phi * e[i - 1] + math.sqrt(1 - phi * phi) * z[i]
    return np.asarray(sd * e, dtype=np.float64)


def run(
    schedule: SwitchbackSchedule, steps: int, rng: np.random.Generator, sd: float, phi: float
) -> FloatArray:
    """Sandbox-like step times: 15 ms, AR(1) log noise, a heavy tail of occasional long steps."""
    tail = np.where(rng.random(steps) < 0.05, rng.exponential(1.0, steps), 0.0)
    return np.asarray(0.015 * np.exp(ar_noise(steps, rng, sd, phi) + tail), dtype=np.float64)


def stalls(schedule: SwitchbackSchedule, steps: int, rng: np.random.Generator, factor: float) -> FloatArray:
    """A random quarter of the on steps ``factor`` times slower, the rest untouched."""
    on = schedule.fault_active(steps)
    return np.where(on & (rng.random(steps) < 0.25), factor, 1.0)


def test_the_block_quantile_is_numpys() -> None:
    rng = np.random.default_rng(1)
    values = rng.standard_normal((3, 60))
    block = np.repeat(np.arange(6), 10)
    block[[0, 11, 59]] = -1  # not measured
    got = _block_quantile(values, block, 7)
    for b in range(6):
        cols = block == b
        assert got[:, b] == pytest.approx(np.percentile(values[:, cols], 10, axis=1), abs=1e-12)
    assert np.isnan(got[:, 6]).all()


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([300, 700]),
    st.floats(0.01, 0.4),
    st.floats(-0.3, 0.3),
    st.floats(0.0, 1.5),
)
def test_the_combined_test_is_coherent(seed: int, steps: int, sd: float, effect: float, stall: float) -> None:
    """p < alpha exactly when 0 lies outside the CI, for every mix of a uniform slowdown and stalls
    (where the two statistics disagree and their CIs may not meet); the p-value is the weighted
    Bonferroni one over the statistics, each tested at its share of alpha (QUIET_SHARE for one)."""
    rng = np.random.default_rng(seed)
    schedule = switchback_schedule(steps, seed)
    on = schedule.fault_active(steps)
    x = (
        run(schedule, steps, rng, sd, 0.6)
        * np.where(on, 1.0 + effect, 1.0)
        * stalls(schedule, steps, rng, 1 + stall)
    )
    r = judge_switchback(x, schedule)
    assert (r.p_value < ALPHA) == (not r.ci_low <= 0.0 <= r.ci_high) == r.significant
    assert r.ci_low <= r.regression <= r.ci_high
    assert [b.name for b in r.branches] == list(BRANCHES)
    assert sorted(b.share for b in r.branches) == pytest.approx([1 - QUIET_SHARE, QUIET_SHARE])
    assert r.p_value == min(1.0, min(b.p_value / b.share for b in r.branches))
    if r.consistent:
        assert r.ci_low == max(b.ci_low for b in r.branches)
        assert r.ci_high == min(b.ci_high for b in r.branches)
    else:
        assert r.significant and max(b.ci_low for b in r.branches) > min(b.ci_high for b in r.branches)


def test_placebo_false_positives_on_autocorrelated_heavy_tailed_noise() -> None:
    """Sandbox-like noise (lag-1 autocorrelation 0.65, 5% of steps long): at most what alpha explains."""
    rng = np.random.default_rng(20261205)
    runs = 300
    hits = 0
    for i in range(runs):
        schedule = placebo_of(switchback_schedule(500, seed=1000 + i))
        hits += judge_switchback(run(schedule, 500, rng, 0.3, 0.65), schedule).significant
    assert hits <= sps.binom.ppf(0.995, runs, ALPHA)


def test_the_spread_is_the_randomisation_standard_deviation() -> None:
    """With all re-assignments enumerated, ``spread`` is the standard deviation of the contrast over
    them once the estimate's effect is taken out, and ``critical`` the alpha-quantile of its size."""
    rng = np.random.default_rng(3)
    pairs = 10
    blocks = rng.standard_normal((2, 2 * pairs))
    assignment = all_pair_assignments(pairs)[417]
    draws = reassignments(pairs, assignment, 0)
    t = randomisation_test(blocks, assignment, draws, ALPHA)
    for row, test in zip(blocks, t, strict=True):
        null = row - test.estimate * assignment  # the blocks if the effect were none
        w = draws.astype(bool)
        contrasts = np.array([null[m].mean() - null[~m].mean() for m in w])
        assert test.spread == pytest.approx(contrasts.std(), rel=1e-9)
        share = np.mean(np.abs(contrasts) >= test.critical * test.spread - 1e-12)
        assert share >= ALPHA and np.mean(np.abs(contrasts) > test.critical * test.spread + 1e-12) < ALPHA


def test_the_reported_mde_is_detected_with_about_80_percent_power() -> None:
    """The mde a run reports is what the test detects: an effect of the placebo runs' median mde is
    significant in about 80% of runs with the same noise."""
    rng = np.random.default_rng(11)
    runs = 120
    noise = [(switchback_schedule(500, seed=2000 + i), None) for i in range(runs)]
    xs = [run(s, 500, rng, 0.3, 0.65) for s, _ in noise]
    mde = float(
        np.median([judge_switchback(x, placebo_of(s)).mde for (s, _), x in zip(noise, xs, strict=True)])
    )
    assert 0.05 < mde < 0.5
    hits = 0
    for (s, _), x in zip(noise, xs, strict=True):
        r = judge_switchback(x * np.where(s.fault_active(500), 1.0 + mde, 1.0), s)
        hits += r.significant and r.regression > 0
    assert 0.65 <= hits / runs <= 0.95


def test_sparse_stalls_are_still_detected_by_the_mean() -> None:
    """A quarter of the on steps 2.5x slower leaves the blocks' lower decile alone; the clipped mean
    sees them, and the job is called slower."""
    rng = np.random.default_rng(8)
    detected = 0
    for i in range(10):
        schedule = switchback_schedule(500, seed=300 + i)
        x = 0.015 * np.exp(ar_noise(500, rng, 0.05, 0.3)) * stalls(schedule, 500, rng, 2.5)
        r = judge_switchback(x, schedule)
        decile, mean = r.branches
        assert abs(decile.estimate) < 0.05
        detected += mean.p_value < ALPHA * mean.share and r.significant and r.effect is Effect.SLOWDOWN
    assert detected >= 9


def test_render_counts_the_level_the_analysis_tests_at() -> None:
    """render refuses a switchback job too short for the test at the quieter statistic's level."""
    from slurm_chaos.render import SWITCHBACK_ALPHA, SWITCHBACK_MIN_STEPS, SWITCHBACK_QUIET_SHARE
    from slurm_chaos.schedule import MAX_BLOCK, WARMUP_STEPS, min_pairs

    assert SWITCHBACK_QUIET_SHARE == QUIET_SHARE and SWITCHBACK_ALPHA == ALPHA
    assert SWITCHBACK_MIN_STEPS == WARMUP_STEPS + 2 * MAX_BLOCK * min_pairs(ALPHA * QUIET_SHARE)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(3, 20), st.floats(-0.5, 0.5))
def test_the_shares_of_alpha_are_the_same_under_every_assignment_and_effect(
    seed: int, pairs: int, theta: float
) -> None:
    """The shares are read off the pairs' levels, which no re-assignment (a swap within a pair)
    and no hypothesised effect (added to the on blocks) changes: the weighted test stays exact."""
    rng = np.random.default_rng(seed)
    blocks = rng.standard_normal((2, 2 * pairs)) * np.array([[0.5], [1.5]])[rng.permutation(2)]
    assignment = rng.integers(0, 2, pairs)
    on = np.empty(2 * pairs)
    on[0::2], on[1::2] = assignment, 1 - assignment
    shares = alpha_shares(blocks)
    assert sorted(shares) == pytest.approx([1 - QUIET_SHARE, QUIET_SHARE])
    swapped = blocks.copy()
    flip = rng.integers(0, 2, pairs).astype(bool)
    swapped[:, 0::2][:, flip], swapped[:, 1::2][:, flip] = blocks[:, 1::2][:, flip], blocks[:, 0::2][:, flip]
    assert alpha_shares(swapped) == shares
    assert alpha_shares(blocks - theta * on) == shares


@pytest.mark.parametrize("seed", range(4))
def test_the_weighted_test_rejects_at_most_alpha_of_the_assignments(seed: int) -> None:
    """Exactness, counted: for fixed data, of all 2^pairs assignments the schedule could have drawn,
    the weighted Bonferroni test over both statistics rejects at most alpha of them (each statistic
    at most its share, and the shares are the same for every assignment)."""
    rng = np.random.default_rng(seed)
    pairs, alpha = 10, 0.05
    noise = rng.standard_t(3, (1, 2 * pairs))
    blocks = np.vstack([noise[0] + 0.3 * rng.standard_normal(2 * pairs), noise[0]])  # correlated
    draws = reassignments(pairs, all_pair_assignments(pairs)[0], 0)
    shares = alpha_shares(blocks)
    rejected = 0
    for assignment in all_pair_assignments(pairs):
        tests = [
            randomisation_test(blocks[k : k + 1], assignment, draws, alpha * share)[0]
            for k, share in enumerate(shares)
        ]
        rejected += any(t.p_value < alpha * share for t, share in zip(tests, shares, strict=True))
    assert 0 < rejected <= alpha * 2**pairs
