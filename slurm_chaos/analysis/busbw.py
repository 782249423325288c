"""Bus bandwidth of an allreduce-mode probe run, by nccl-tests' definition, over its timed steps.

Each step of the sweep is one all_reduce of a known size (:meth:`RankData.allreduce_bytes`); its
time is the slowest rank's (the collective ends when the last rank's does, as for step time), its
algbw bytes / time and its busbw algbw x 2(n-1)/n (:mod:`slurm_chaos.probe.bandwidth`). The
hypothesis' ``min_busbw_gbps`` is judged on the median over steps (:mod:`.verdict`).
"""

from __future__ import annotations

import numpy as np

from slurm_chaos.analysis.model import BusBandwidth
from slurm_chaos.probe.bandwidth import busbw_factor
from slurm_chaos.probe.reader import RunData


def run_busbw(run: RunData) -> BusBandwidth | None:
    """Mean and median busbw over the run's timed steps; None for a run that is not an allreduce
    sweep, or that timed none."""
    sizes = [r.allreduce_bytes() for r in run.ranks]
    if not sizes or any(s is None for s in sizes):
        return None
    nbytes = sizes[0]
    assert nbytes is not None
    times = run.matrix("step_time")
    n = min(len(nbytes), times.shape[1])
    seconds = times[:, :n].max(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        busbw = nbytes[:n] / seconds / 1e9 * busbw_factor(run.world_size)
    busbw = busbw[np.isfinite(busbw) & (seconds > 0)]
    if len(busbw) == 0:
        return None
    return BusBandwidth(len(busbw), float(np.mean(busbw)), float(np.median(busbw)))
