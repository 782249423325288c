"""A run judged on its own switchback schedule: test, CI, MDE, equivalence, stragglers, Holm."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from slurm_chaos.analysis.model import Verdict
from slurm_chaos.analysis.multiplicity import holm
from slurm_chaos.analysis.switchback import (
    ALPHA,
    Effect,
    SwitchbackResult,
    calibrate_placebo,
    judge_switchback,
    judge_switchback_run,
    placebo_calibration,
)
from slurm_chaos.analysis.synthetic import JobModel, simulate, write_run
from slurm_chaos.analysis.verdict import judge
from slurm_chaos.probe.reader import read_run
from slurm_chaos.rundir import Expectation, FaultWindow, ObservationLog
from slurm_chaos.schedule import DROPPED, SwitchbackSchedule, placebo_of, switchback_schedule

FloatArray = npt.NDArray[np.float64]


def noisy_run(
    schedule: SwitchbackSchedule, steps: int, rng: np.random.Generator, noise: float, effect: float = 0.0
) -> FloatArray:
    """Step times: AR(1) noise (0.3) around 0.1 s, a slow drift, ``effect`` while the fault is on."""
    z = sps.norm.rvs(size=steps, random_state=rng)
    e = np.empty(steps)
    e[0] = z[0]
    for i in range(1, steps):
        e[i] = 0.3 * e[i - 1] + math.sqrt(1 - 0.09) * z[i]
    drift = 0.03 * np.sin(np.arange(steps) / steps * 2 * math.pi + rng.uniform(0, 6.3))
    on = schedule.fault_active(steps)
    return 0.1 * np.exp(noise * e + drift) * np.where(on, 1.0 + effect, 1.0)


def _shifted(x: FloatArray, schedule: SwitchbackSchedule, theta: float) -> FloatArray:
    """The run as it would be if the fault's effect were smaller by the factor exp(theta)."""
    on = schedule.step_states(len(x)) == 1
    return np.asarray(x * np.where(on, math.exp(-theta), 1.0), dtype=np.float64)


@settings(max_examples=20, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([300, 600]),  # exact enumeration (<= 16 pairs) and drawn re-assignments
    st.floats(0.005, 0.3),
    st.floats(-0.2, 0.2),
)
def test_p_value_and_ci_agree(seed: int, steps: int, noise: float, effect: float) -> None:
    rng = np.random.default_rng(seed)
    schedule = switchback_schedule(steps, seed)
    x = noisy_run(schedule, steps, rng, noise, effect)
    r = judge_switchback(x, schedule)
    assert (r.p_value < ALPHA) == (not r.ci_low <= 0.0 <= r.ci_high)
    assert r.significant == (r.p_value < ALPHA)
    assert r.ci_low <= r.regression <= r.ci_high
    # The CI is the set the same test does not reject: inside it (halfway from the estimate to a
    # bound) the test on the shifted run keeps 0; just beyond a bound it rejects.
    theta, low, high = (math.log1p(v) for v in (r.regression, r.ci_low, r.ci_high))
    for bound in (low, high):
        inside = judge_switchback(_shifted(x, schedule, (theta + bound) / 2), schedule)
        assert inside.p_value >= ALPHA
        beyond = judge_switchback(_shifted(x, schedule, bound + 0.05 * (bound - theta) - 1e-9), schedule)
        assert beyond.p_value < ALPHA


def test_false_positives_on_placebo_runs_stay_within_the_binomial_bound() -> None:
    rng = np.random.default_rng(20261130)
    runs = 300
    results = []
    for i in range(runs):
        schedule = placebo_of(switchback_schedule(300, seed=i))
        results.append(judge_switchback(noisy_run(schedule, 300, rng, 0.05, effect=0.2), schedule))
    calibration = placebo_calibration(results)
    # An exact test rejects a true null at most alpha of the time: 3 expected, 9 is the 99.5% quantile.
    assert calibration.false_positives <= sps.binom.ppf(0.995, runs, ALPHA)
    assert calibration.runs == runs
    assert 0.0 < calibration.mde_median < 0.1


def test_calibration_on_unfaulted_runs_without_a_recorded_schedule() -> None:
    rng = np.random.default_rng(5)
    runs = [0.1 * np.exp(0.05 * rng.standard_normal(400)) for _ in range(50)]
    calibration = calibrate_placebo(runs, seed=1000)
    placebos = [placebo_of(switchback_schedule(400, 1000 + i, placebo=True)) for i in range(50)]
    calls = [judge_switchback(x, s) for x, s in zip(runs, placebos, strict=True)]
    assert calibration.runs == 50 and calibration.false_positives == sum(r.significant for r in calls)
    assert calibration.to_json()["design"] == "switchback"
    # Their recorded schedules, if any, are used as placebos even when they were not marked so.
    recorded = [switchback_schedule(400, seed=i) for i in range(50)]
    assert calibrate_placebo(runs, recorded).runs == 50
    with pytest.raises(ValueError, match="schedules"):
        calibrate_placebo(runs, recorded[:3])


def test_a_large_effect_is_found_every_time() -> None:
    rng = np.random.default_rng(7)
    for i in range(30):
        schedule = switchback_schedule(500, seed=100 + i)
        r = judge_switchback(noisy_run(schedule, 500, rng, 0.05, effect=0.10), schedule)
        assert r.significant and r.effect is Effect.SLOWDOWN
        assert r.ci_low < 0.10 < r.ci_high or abs(r.regression - 0.10) < 0.03
        assert r.mde < 0.05


def test_a_speedup_is_not_a_slowdown() -> None:
    schedule = switchback_schedule(500, seed=3)
    r = judge_switchback(noisy_run(schedule, 500, np.random.default_rng(3), 0.02, effect=-0.1), schedule)
    assert r.significant and r.effect is Effect.SPEEDUP and r.regression < 0


def _verdict(r: SwitchbackResult) -> Verdict:
    log = ObservationLog(FaultWindow(0.0), (), Expectation(expect_regression=True))
    return judge(r.comparison(), log).verdict


def test_no_effect_only_by_equivalence() -> None:
    rng = np.random.default_rng(11)
    schedule = placebo_of(switchback_schedule(500, seed=11))
    quiet = judge_switchback(noisy_run(schedule, 500, rng, 0.01), schedule)
    assert not quiet.significant
    assert quiet.effect is Effect.NO_EFFECT
    assert -quiet.margin < quiet.ci_low and quiet.ci_high < quiet.margin
    assert _verdict(quiet) is Verdict.NO_EFFECT
    noisy = judge_switchback(noisy_run(schedule, 500, rng, 0.30), schedule)
    assert not noisy.significant
    assert noisy.effect is Effect.INCONCLUSIVE
    assert noisy.ci_high >= noisy.margin or noisy.ci_low <= -noisy.margin
    assert f"{100 * noisy.mde:.1f}%" in noisy.reason
    assert _verdict(noisy) is Verdict.INCONCLUSIVE
    # A real 10% fault is never called NO EFFECT when the run is too noisy to see it.
    hidden = judge_switchback(noisy_run(switchback_schedule(500, 11), 500, rng, 0.4, 0.10), schedule)
    assert hidden.effect is not Effect.NO_EFFECT


def test_mde_grows_with_noise_and_is_infinite_without_enough_pairs() -> None:
    schedule = switchback_schedule(500, seed=5)
    mdes = [
        judge_switchback(noisy_run(schedule, 500, np.random.default_rng(5), n), schedule).mde
        for n in (0.01, 0.05, 0.2)
    ]
    assert mdes == sorted(mdes) and mdes[0] < 0.01 < mdes[2]
    short = switchback_schedule(120, seed=5)  # 3-4 pairs: an exact test cannot reach p < 0.01
    r = judge_switchback(noisy_run(short, 120, np.random.default_rng(5), 0.001, 0.5), short)
    assert not r.significant and r.mde == math.inf and r.effect is Effect.INCONCLUSIVE
    assert "pairs" in r.reason


def test_a_run_too_short_for_two_pairs_is_inconclusive() -> None:
    schedule = switchback_schedule(500, seed=1)
    r = judge_switchback(np.full(40, 0.1), schedule)
    assert r.pairs == 0 and r.effect is Effect.INCONCLUSIVE and not r.significant


def test_steps_the_probe_saw_in_another_state_are_dropped() -> None:
    schedule = switchback_schedule(500, seed=9)
    x = noisy_run(schedule, 500, np.random.default_rng(9), 0.05)
    states = schedule.step_states(500)
    late = states.copy()
    # The agent acknowledged every change three steps late: those steps ran in the old state.
    for start in schedule.block_starts[1:]:
        late[start : start + 3] = DROPPED
    plain = judge_switchback(x, schedule)
    seen = judge_switchback(x, schedule, observed_state=late)
    assert seen.dropped_steps - plain.dropped_steps == int(np.sum((late == DROPPED) & (states != DROPPED)))


def test_mismatched_inputs_name_the_argument() -> None:
    schedule = switchback_schedule(500, seed=9)
    with pytest.raises(ValueError, match="observed_state"):
        judge_switchback(np.full(500, 0.1), schedule, observed_state=schedule.step_states(400))
    with pytest.raises(ValueError, match="steps"):
        judge_switchback(np.full(500, 0.1), schedule, steps=np.arange(10))
    with pytest.raises(ValueError, match="compute"):
        judge_switchback(np.full(500, 0.1), schedule, compute=np.full((4, 400), 0.1))


def test_report_fields() -> None:
    schedule = switchback_schedule(500, seed=2)
    r = judge_switchback(noisy_run(schedule, 500, np.random.default_rng(2), 0.05, 0.1), schedule)
    record = r.to_json()
    for key in ("design", "regression", "ci_low", "ci_high", "p_value", "significant", "mde", "stragglers"):
        assert key in record
    assert record["design"] == "switchback"


# --- stragglers --------------------------------------------------------------------------------

FOUR_RANKS = JobModel(ranks=4, steps=500, ranks_per_host=1, noise=0.05, rank_offset=0.02)


def test_a_ten_percent_slow_rank_is_named_among_nodes_two_percent_apart() -> None:
    named = []
    for i in range(20):
        schedule = switchback_schedule(500, seed=200 + i)
        slow = i % 4
        run = simulate(replace(FOUR_RANKS, slow_rank=slow, slow_rank_factor=0.10, schedule=schedule, seed=i))
        r = judge_switchback(
            run.fields["step_time"].max(axis=0),
            schedule,
            compute=run.fields["compute_time"],
            hosts=[f"node{k + 1}" for k in range(4)],
        )
        named.append([(s.rank, s.host) for s in r.stragglers] == [(slow, f"node{slow + 1}")])
        assert r.significant and r.regression > 0
    assert sum(named) >= 19


def test_a_statically_slower_node_is_not_a_straggler_of_the_fault() -> None:
    wrongly_named = 0
    for i in range(20):
        schedule = placebo_of(switchback_schedule(500, seed=300 + i))
        model = replace(FOUR_RANKS, rank_offset=0.05, slow_rank=1, slow_rank_factor=0.10, seed=i)
        run = simulate(replace(model, fault_start_step=0))  # rank 1 is 10% slower throughout
        r = judge_switchback(
            run.fields["step_time"].max(axis=0), schedule, compute=run.fields["compute_time"]
        )
        wrongly_named += bool(r.stragglers)
    assert wrongly_named <= 1


def test_stragglers_of_a_probe_run_carry_rank_and_host(tmp_path: Path) -> None:
    schedule = switchback_schedule(400, seed=17)
    model = replace(
        FOUR_RANKS, steps=400, ranks_per_host=2, slow_rank=3, slow_rank_factor=0.2, schedule=schedule
    )
    run = read_run(write_run(tmp_path / "fault", simulate(model)))
    r = judge_switchback_run(run, schedule)
    assert [s.to_json() for s in r.stragglers] == [
        {"rank": 3, "host": "node2", "score": pytest.approx(0.2, abs=0.02)}
    ]
    assert r.to_json()["stragglers"][0]["rank"] == 3


# --- Holm --------------------------------------------------------------------------------------


def test_holm_known_values() -> None:
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx((0.03, 0.06, 0.06, 0.02))
    assert holm([0.2]) == (0.2,)
    assert holm([]) == ()
    assert holm([math.nan, 0.001]) == (1.0, 0.002)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), max_size=30))
def test_holm_is_monotone_bounded_and_never_smaller(p: list[float]) -> None:
    adjusted = holm(p)
    assert all(raw <= adj <= 1.0 for raw, adj in zip(p, adjusted, strict=True))
    order = sorted(range(len(p)), key=lambda i: p[i])
    assert [adjusted[i] for i in order] == sorted(adjusted)
    # Rejecting below alpha: the smallest p-value must beat alpha / m on its own.
    if p and min(adjusted) < ALPHA:
        assert min(p) < ALPHA / len(p) * (1 + 1e-12)
