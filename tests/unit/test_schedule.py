"""The switchback fault schedule: generation, per-step states, re-randomisation, JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_chaos.errors import DataError
from slurm_chaos.schedule import (
    DROPPED,
    OFF,
    ON,
    SwitchbackSchedule,
    min_pairs,
    placebo_of,
    schedule_from_json,
    switchback_schedule,
)


@st.composite
def schedules(draw: st.DrawFn) -> SwitchbackSchedule:
    min_block = draw(st.integers(2, 30))
    max_block = draw(st.integers(min_block, 40))
    return switchback_schedule(
        draw(st.integers(0, 1500)),
        draw(st.integers(0, 2**63 - 1)),
        warmup_steps=draw(st.integers(0, 100)),
        min_block=min_block,
        max_block=max_block,
        transition_steps=draw(st.integers(0, min_block - 1)),
        placebo=draw(st.booleans()),
    )


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_generated_schedules_keep_the_design(data: st.DataObject) -> None:
    s = data.draw(schedules())
    steps = s.end_step + data.draw(st.integers(0, 50))
    # Pairs of equal length inside the bounds, one block on and one off, balanced overall.
    assert len(s.block_steps) == 2 * s.pairs
    assert all(s.min_block <= b <= s.max_block for b in s.block_steps)
    assert s.block_steps[0::2] == s.block_steps[1::2]
    assert all({a, b} == {OFF, ON} for a, b in zip(s.assignment[0::2], s.assignment[1::2], strict=True))
    states = s.step_states(steps)
    assert np.sum(states == ON) == np.sum(states == OFF)
    # Warm-up, the first steps of every block and everything after the last block are dropped.
    assert (states[: s.warmup_steps] == DROPPED).all()
    assert (states[s.end_step :] == DROPPED).all()
    for start, length, on in zip(s.block_starts, s.block_steps, s.assignment, strict=True):
        block = states[start : start + length]
        assert (block[: s.transition_steps] == DROPPED).all()
        assert (block[s.transition_steps :] == on).all()
    # The fault is applied exactly in the on blocks, transition steps included; never for a placebo.
    active = s.fault_active(steps)
    expected = np.zeros(steps, dtype=bool)
    for start, length, on in zip(s.block_starts, s.block_steps, s.assignment, strict=True):
        expected[start : start + length] = bool(on) and not s.placebo
    assert (active == expected).all()


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 3000), st.integers(0, 2**63 - 1))
def test_schedule_fills_the_run_and_is_determined_by_its_seed(steps: int, seed: int) -> None:
    s = switchback_schedule(steps, seed)
    assert s == switchback_schedule(steps, seed)
    assert s.end_step <= max(steps, s.warmup_steps)
    # What is left unmeasured after the last pair could not have held another pair.
    assert steps - s.end_step < 2 * s.min_block or steps < s.warmup_steps


@settings(max_examples=100, deadline=None)
@given(schedules())
def test_json_round_trip(s: SwitchbackSchedule) -> None:
    assert schedule_from_json(json.loads(json.dumps(s.to_json()))) == s
    assert schedule_from_json(s.dumps()) == s


def test_seeds_draw_different_assignments() -> None:
    assignments = {switchback_schedule(500, seed).assignment for seed in range(20)}
    assert len(assignments) == 20


def test_placebo_is_the_same_schedule_with_nothing_toggled() -> None:
    s = switchback_schedule(500, 11)
    p = placebo_of(s)
    assert p.placebo and not s.placebo
    assert (p.block_steps, p.assignment, p.seed) == (s.block_steps, s.assignment, s.seed)
    assert (p.step_states(500) == s.step_states(500)).all()
    assert not p.fault_active(500).any() and s.fault_active(500).any()
    assert p.to_json()["placebo"] is True


def test_truncated_keeps_complete_pairs_only() -> None:
    s = switchback_schedule(500, 5)
    cut = s.block_starts[5] + 1  # inside the third pair's second block
    t = s.truncated(cut)
    assert t.pairs == 2
    assert t.block_steps == s.block_steps[:4] and t.assignment == s.assignment[:4]
    assert s.truncated(10_000) == s


def test_all_assignments_are_every_order_of_every_pair() -> None:
    s = switchback_schedule(200, 3, warmup_steps=0, min_block=10, max_block=10)
    rows = s.all_assignments()
    assert rows.shape == (2**s.pairs, 2 * s.pairs)
    assert len({tuple(r) for r in rows}) == len(rows)
    assert (rows[:, 0::2] + rows[:, 1::2] == 1).all()
    assert tuple(s.assignment) in {tuple(r) for r in rows}
    drawn = s.random_assignments(1000, np.random.default_rng(0))
    assert (drawn[:, 0::2] + drawn[:, 1::2] == 1).all()
    assert 0.4 < drawn[:, 0].mean() < 0.6  # a fair coin per pair


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"assignment": [1, 1]}, "assignment"),
        ({"block_steps": [10, 12]}, "block_steps"),
        ({"block_steps": [5, 5]}, "block_steps"),
        ({"seed": "7"}, "seed"),
        ({"seed": True}, "seed"),
        ({"design": "window"}, "design"),
        ({"schema": 2}, "schema"),
        ({"placebo": "no"}, "placebo"),
        ({"affected_hosts": [1]}, "affected_hosts"),
        ({"transition_steps": 10}, "transition_steps"),
    ],
)
def test_malformed_schedules_name_the_key(change: dict[str, object], key: str) -> None:
    good = {**switchback_schedule(20, 1, warmup_steps=0, min_block=10, max_block=10).to_json()}
    with pytest.raises(DataError, match=f"run-7/fault_schedule: {key}"):
        schedule_from_json({**good, **change}, source="run-7/fault_schedule")


def test_not_json_is_a_data_error() -> None:
    with pytest.raises(DataError, match="fault_schedule: not JSON"):
        schedule_from_json("{")


def test_min_pairs_is_where_an_exact_test_can_first_reject() -> None:
    assert min_pairs(0.01) == 8  # 2 / 2**8 < 0.01 <= 2 / 2**7
    assert 2 / 2 ** min_pairs(0.01) < 0.01 <= 2 / 2 ** (min_pairs(0.01) - 1)
    assert min_pairs(0.25) == 4  # 2 / 2**3 = 0.25 is not below 0.25
