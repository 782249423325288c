"""Node ranking for placement: the median step and the work a node delivers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from slurm_chaos.analysis.synthetic import JobModel, SyntheticRun, simulate, write_run
from slurm_chaos.placement import WORK_THRESHOLD, rank_nodes

MODEL = JobModel(ranks=4, steps=400, ranks_per_host=2, seed=7)


def _with_bursts(run: SyntheticRun, ranks: list[int], share: float, extra_s: float) -> SyntheticRun:
    """Some ranks stopped part of the time: `share` of their steps take `extra_s` longer to compute
    (a duty cycle, clocks throttled in bursts); their other steps are as fast as anyone's."""
    rng = np.random.default_rng(3)
    fields = {k: v.copy() for k, v in run.fields.items()}
    for r in ranks:
        hit = rng.random(fields["compute_time"].shape[1]) < share
        fields["compute_time"][r, hit] += extra_s
    return replace(run, fields=fields)


def test_a_node_stopped_part_of_the_time_is_slow_although_its_median_step_is_not(tmp_path: Path) -> None:
    run = _with_bursts(simulate(MODEL), [0, 1], share=0.3, extra_s=0.3)  # node1: ranks 0 and 1
    ranking = {r.node: r for r in rank_nodes([write_run(tmp_path / "run", run)])}
    node1, node2 = ranking["node1"], ranking["node2"]
    assert node1.score > 0.9  # the median step hardly moved...
    assert node1.work < 0.6 < WORK_THRESHOLD  # ...but the node does about half the work
    assert node1.slow and node1.weight >= 2
    assert not node2.slow and node2.work > 0.95


def test_a_few_long_steps_do_not_make_a_node_slow(tmp_path: Path) -> None:
    """A busy machine deschedules a rank now and then: 2% of its steps a lot longer is not a slow node."""
    run = _with_bursts(simulate(MODEL), [2], share=0.02, extra_s=1.0)
    ranking = rank_nodes([write_run(tmp_path / "run", run)])
    assert not any(r.slow for r in ranking), ranking
    assert min(r.work for r in ranking) > 0.9
