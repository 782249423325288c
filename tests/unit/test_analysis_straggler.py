"""Straggler localisation on synthetic probe files."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from slurm_chaos.analysis.model import StragglerKind, straggler_json
from slurm_chaos.analysis.straggler import (
    _leave_one_out_medians,
    straggler_scores,
    stragglers,
)
from slurm_chaos.analysis.synthetic import JobModel, simulate, write_run
from slurm_chaos.probe.reader import read_run

MODEL = JobModel(ranks=8, steps=300, ranks_per_host=2, gpus=True, seed=3)


def test_slow_rank_is_named_with_host_and_gpu(tmp_path: Path) -> None:
    run = read_run(write_run(tmp_path / "fault", simulate(replace(MODEL, slow_rank=5, slow_rank_factor=0.4))))
    scores = straggler_scores(run)
    slow = stragglers(scores)
    assert [s.rank for s in slow] == [5]
    assert (slow[0].host, slow[0].gpu) == ("node3", 1)
    assert slow[0].score == pytest.approx(1 / 1.4, abs=0.02)
    assert scores[0] == slow[0]  # slowest first
    assert all(0.0 <= s.score <= 1.0 for s in scores)
    assert max(s.score for s in scores) == 1.0


def test_waiters_are_told_apart_from_the_slow_rank(tmp_path: Path) -> None:
    run = read_run(write_run(tmp_path / "fault", simulate(replace(MODEL, slow_rank=2, slow_rank_factor=0.3))))
    by_rank = {s.rank: s for s in straggler_scores(run)}
    assert by_rank[2].kind is StragglerKind.SLOW_COMPUTE
    assert all(by_rank[r].kind is StragglerKind.WAITS for r in by_rank if r != 2)
    # The slow rank computes long and waits little; the others the other way round.
    assert by_rank[2].comm_median < min(by_rank[r].comm_median for r in by_rank if r != 2)
    assert by_rank[2].compute_median > 1.25 * max(by_rank[r].compute_median for r in by_rank if r != 2)
    # Step time cannot tell them apart: every rank leaves the allreduce at the same time.
    assert run.matrix("step_time").std(axis=0).max() < 1e-9


def test_the_report_writes_each_kind_as_the_word_it_always_wrote(tmp_path: Path) -> None:
    run = read_run(write_run(tmp_path / "fault", simulate(replace(MODEL, slow_rank=2, slow_rank_factor=0.3))))
    words = {json.loads(json.dumps(straggler_json(s)))["kind"] for s in straggler_scores(run)}
    assert words == {"slow_compute", "waits_in_allreduce"}
    assert all(type(straggler_json(s)["kind"]) is str for s in straggler_scores(run))


def test_uniform_slowdown_has_no_straggler(tmp_path: Path) -> None:
    run = read_run(write_run(tmp_path / "fault", simulate(replace(MODEL, slowdown=0.5))))
    scores = straggler_scores(run)
    assert stragglers(scores) == ()
    assert {s.kind for s in scores} == {StragglerKind.NORMAL}
    assert min(s.score for s in scores) > 0.95


def test_scores_over_selected_steps_only(tmp_path: Path) -> None:
    model = replace(MODEL, slow_rank=1, slow_rank_factor=0.5, fault_start_step=200)
    run = read_run(write_run(tmp_path / "fault", simulate(model)))
    assert stragglers(straggler_scores(run, slice(0, 200))) == ()
    assert [s.rank for s in stragglers(straggler_scores(run, slice(200, None)))] == [1]


def test_no_gpu_means_gpu_none(tmp_path: Path) -> None:
    run = read_run(
        write_run(tmp_path / "r", simulate(replace(MODEL, gpus=False, slow_rank=0, slow_rank_factor=0.3)))
    )
    assert stragglers(straggler_scores(run))[0].gpu is None


@pytest.mark.parametrize("ranks", [2, 3, 4, 5, 8, 9])
def test_leave_one_out_medians_match_the_direct_computation(ranks: int) -> None:
    rng = np.random.default_rng(ranks)
    for matrix in (rng.normal(size=(ranks, 50)), rng.integers(0, 3, size=(ranks, 50)).astype(float)):
        direct = np.stack([np.median(np.delete(matrix, i, axis=0), axis=0) for i in range(ranks)])
        np.testing.assert_allclose(_leave_one_out_medians(matrix, list(range(ranks))), direct)
