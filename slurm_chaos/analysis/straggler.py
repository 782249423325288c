"""Straggler localisation: which rank (host, GPU) is slow, and which ranks only wait for it.

In a synchronous step every rank's ``step_time`` is the same (the allreduce ends when the slowest
rank arrives), so step time cannot say who is slow. ``compute_time`` can: the slow rank computes
longer and then waits little, while its peers compute at normal speed and spend the difference
waiting in the allreduce (their ``comm_time`` grows). The score follows nvidia-resiliency-ext:
fastest rank's median compute time / this rank's, so 1.0 is the fastest rank and lower is slower.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from slurm_chaos.analysis.model import StragglerKind, StragglerScore
from slurm_chaos.probe.reader import RunData, Selection

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# What the comparison (step_time) and the straggler scores read of a rank file: at 2,048 files
# the probe's other step fields, events and telemetry would double the time it takes.
STEPS_READ = Selection(
    fields=("step_time", "compute_time", "comm_time"), events=False, telemetry=False, allreduce=False
)

# A rank must compute at least this much slower than the typical rank to be called a straggler,
# more if the ranks' medians are spread wider than that anyway.
MIN_SLOWDOWN = 0.05
# ...and be slower than the other ranks' median in at least this share of the steps.
MOST_STEPS = 0.75


def compute_matrix(run: RunData) -> FloatArray:
    """ranks x steps compute time of every rank (step time minus communication in older files)."""
    return _compute_matrix(run, run.matrix("step_time").shape[1])


def _compute_matrix(run: RunData, n: int) -> FloatArray:
    fields = run.ranks[0].fields
    if "compute_time" in fields and all(np.any(r.fields["compute_time"][:n] > 0) for r in run.ranks):
        return run.matrix("compute_time")[:, :n]
    # Older or partial probe output: what is not communication is the rank's own work.
    return run.matrix("step_time")[:, :n] - _comm_matrix(run, n)


def _comm_matrix(run: RunData, n: int) -> FloatArray:
    if "comm_time" in run.ranks[0].fields:
        return run.matrix("comm_time")[:, :n]
    return np.zeros((run.world_size, n))


def _gpu(attrs: dict[str, object]) -> int | None:
    value = attrs.get("gpu_index", -1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def straggler_scores(run: RunData, steps: BoolArray | slice | None = None) -> tuple[StragglerScore, ...]:
    """Score every rank over the selected steps; slowest first, ties broken by rank."""
    n = run.matrix("step_time").shape[1]
    select: BoolArray | slice = slice(None) if steps is None else steps
    per_step = _compute_matrix(run, n)[:, select]
    compute = np.median(per_step, axis=1)
    comm = np.median(_comm_matrix(run, n)[:, select], axis=1)
    fastest = float(compute.min())
    slow = _slow_ranks(compute, per_step)
    kinds = _kinds(compute, comm, slow)
    scores = [
        StragglerScore(
            rank=r.rank,
            host=r.host,
            gpu=_gpu(r.attrs),
            score=1.0 if compute[i] <= 0 else float(min(1.0, max(0.0, fastest / compute[i]))),
            compute_median=float(compute[i]),
            comm_median=float(comm[i]),
            kind=kinds[i],
        )
        for i, r in enumerate(run.ranks)
    ]
    return tuple(sorted(scores, key=lambda s: (s.score, s.rank)))


def _slow_ranks(compute: FloatArray, per_step: FloatArray) -> BoolArray:
    """Each rank against the others (leave one out, so two ranks suffice): far above their median
    by more than their spread, and slower than them in most steps, not only in a few long ones."""
    slow = np.zeros(len(compute), dtype=bool)
    if len(compute) < 2:
        return slow
    candidates = []
    for i in range(len(compute)):
        others = np.delete(compute, i)
        typical = float(np.median(others))
        mad = float(np.median(np.abs(others - typical)))
        # 1.4826 * MAD estimates the spread of healthy ranks; 5 of those is far outside it.
        if compute[i] > typical * (1.0 + MIN_SLOWDOWN) + 5.0 * 1.4826 * mad:
            candidates.append(i)
    if not candidates or per_step.shape[1] == 0:
        return slow
    others_steps = _leave_one_out_medians(per_step, candidates)
    for row, i in enumerate(candidates):
        slow[i] = float(np.mean(per_step[i] > others_steps[row])) >= MOST_STEPS
    return slow


def _leave_one_out_medians(per_step: FloatArray, ranks: list[int]) -> FloatArray:
    """Per step, the median over all ranks but one, for each of ``ranks``: one partition of the
    matrix (the middle order statistics), not one median of the whole matrix per rank."""
    n = per_step.shape[0]
    if n < 4:
        return np.stack([np.median(np.delete(per_step, i, axis=0), axis=0) for i in ranks])
    k = n // 2
    mid = np.partition(per_step, [k - 1, k, k + 1], axis=0)[k - 1 : k + 2]
    below, at, above = mid[0], mid[1], mid[2]  # sorted positions k-1, k, k+1
    x = per_step[ranks]
    if n % 2 == 0:
        # n - 1 left, odd: the median is the remaining value at position k - 1.
        return np.asarray(np.where(x <= below, at, below), dtype=np.float64)
    # n - 1 left, even: the mean of the remaining values at positions k - 1 and k.
    low = np.where(x <= below, at, below)
    high = np.where(x <= at, above, at)
    return np.asarray(0.5 * (low + high), dtype=np.float64)


def _kinds(compute: FloatArray, comm: FloatArray, slow: BoolArray) -> list[StragglerKind]:
    if not slow.any():
        return [StragglerKind.NORMAL] * len(compute)
    slow_compute = float(compute[slow].min())
    slow_comm = float(np.median(comm[slow]))
    kinds: list[StragglerKind] = []
    for c, w, is_slow in zip(compute, comm, slow, strict=False):
        if is_slow:
            kinds.append(StragglerKind.SLOW_COMPUTE)
        # A waiter's extra communication time covers at least half of the compute gap to the straggler.
        elif w - slow_comm >= 0.5 * (slow_compute - c):
            kinds.append(StragglerKind.WAITS)
        else:
            kinds.append(StragglerKind.NORMAL)
    return kinds


def stragglers(scores: tuple[StragglerScore, ...]) -> tuple[StragglerScore, ...]:
    """Only the ranks that compute slowly, slowest first."""
    return tuple(s for s in scores if s.kind is StragglerKind.SLOW_COMPUTE)
