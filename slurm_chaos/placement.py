"""Variability-aware placement: rank nodes by the probe's measured speed, propose Slurm weights and features.

Slurm allocates the lowest-weight nodes first, and a job with `--constraint=fast` only gets nodes
with that feature. A node whose ranks compute markedly slower than the fastest node's gets a higher
weight and loses the `fast` feature.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

from slurm_chaos.analysis.model import StragglerKind
from slurm_chaos.analysis.straggler import STEPS_READ, compute_matrix, straggler_scores
from slurm_chaos.errors import SlurmError
from slurm_chaos.probe.reader import RunData, read_run
from slurm_chaos.slurm.model import NodeInfo
from slurm_chaos.slurm.protocol import Scheduler

FAST_FEATURE = "fast"
SLOW_THRESHOLD = 0.90  # a node below 90% of the fastest node's speed is "slow"
# ...or one that delivers under 75% of the fastest node's work. Coarser, as a mean moves with every
# descheduled step of a busy machine; it sees a node stopped part of the time (clocks throttled in
# bursts, a duty cycle), whose median step is as fast as anyone's while it does a fraction of the work.
WORK_THRESHOLD = 0.75
# The share of each rank's steps left out at either end before the mean of its compute times.
WORK_TRIM = 0.05
BASE_WEIGHT = 1


@dataclass(frozen=True)
class NodeRank:
    """One node's measured speed relative to the fastest node (1.0), over every run it appeared in:
    ``score`` from its median step (the straggler test's), ``work`` from the mean (what it delivers)."""

    node: str
    score: float
    ranks: int
    slow: bool
    weight: int
    work: float = 1.0


def delivered_work(run: RunData) -> dict[int, float]:
    """Each rank's work per second relative to the fastest rank's (1.0): the trimmed mean of its
    compute times against the fastest rank's."""
    compute = compute_matrix(run)
    means = [float(sps.trim_mean(row[np.isfinite(row)], WORK_TRIM)) if len(row) else 0.0 for row in compute]
    fastest = min(means, default=0.0)
    return {
        r.rank: 1.0 if m <= 0 else min(1.0, max(0.0, fastest / m))
        for r, m in zip(run.ranks, means, strict=True)
    }


def probe_dirs(paths: Iterable[Path]) -> list[Path]:
    """Probe output directories: each path itself if it holds rank-0.h5, else every such one below it."""
    found: list[Path] = []
    for p in paths:
        if (p / "rank-0.h5").is_file():
            found.append(p)
        else:
            found += sorted(d.parent for d in p.rglob("rank-0.h5") if not d.parent.is_symlink())
    return found


def rank_nodes(run_dirs: Iterable[Path], threshold: float = SLOW_THRESHOLD) -> list[NodeRank]:
    """Slowest first: each node's score is its worst rank's score per run, then the median over runs."""
    per_node: dict[str, list[float]] = {}
    work_of: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    flagged: dict[str, int] = {}
    for d in run_dirs:
        run = read_run(d, STEPS_READ)
        worst: dict[str, float] = {}
        least: dict[str, float] = {}
        work = delivered_work(run)
        for s in straggler_scores(run):
            worst[s.host] = min(worst.get(s.host, 1.0), s.score)
            least[s.host] = min(least.get(s.host, 1.0), work[s.rank])
            counts[s.host] = counts.get(s.host, 0) + 1
            if s.kind is StragglerKind.SLOW_COMPUTE:
                flagged[s.host] = flagged.get(s.host, 0) + 1
        for host, score in worst.items():
            per_node.setdefault(host, []).append(score)
            work_of.setdefault(host, []).append(least[host])
    ranking = []
    for node, scores in per_node.items():
        median = sorted(scores)[len(scores) // 2]
        delivered = sorted(work_of[node])[len(scores) // 2]
        # Slow: far below the fastest node, delivering far less work, or its ranks were found computing
        # slowly (the straggler test, which weighs the spread between ranks) in at least half of the runs.
        slow = median < threshold or delivered < WORK_THRESHOLD or 2 * flagged.get(node, 0) >= len(scores)
        # Weight grows with slowness: 1 for full speed, up to 100 for a node at a tenth of it.
        speed = min(median, delivered)
        weight = BASE_WEIGHT if not slow else max(2, min(100, round(BASE_WEIGHT / max(speed, 0.01))))
        ranking.append(NodeRank(node, median, counts[node], slow, weight, delivered))
    return sorted(ranking, key=lambda r: (min(r.score, r.work), r.node))


def format_ranking(ranking: list[NodeRank]) -> str:
    lines = [f"{'NODE':<16} {'SPEED':>6} {'WORK':>6} {'RANKS':>5}  {'PROPOSAL'}"]
    for r in ranking:
        proposal = (
            f"Weight={r.weight}, remove feature '{FAST_FEATURE}'" if r.slow else f"feature '{FAST_FEATURE}'"
        )
        lines.append(f"{r.node:<16} {r.score:>6.2f} {r.work:>6.2f} {r.ranks:>5}  {proposal}")
    return "\n".join(lines)


def ranking_json(ranking: list[NodeRank], applied: list[NodeSetting] | None = None) -> dict[str, Any]:
    """What `format_ranking` shows (and, after --apply, the settings applied), as JSON data."""
    nodes = [
        {
            "node": r.node,
            "speed": r.score,
            "work": r.work,
            "ranks": r.ranks,
            "slow": r.slow,
            "proposal": {
                "weight": r.weight,
                "add_features": [] if r.slow else [FAST_FEATURE],
                "remove_features": [FAST_FEATURE] if r.slow else [],
            },
        }
        for r in ranking
    ]
    doc: dict[str, Any] = {"fast_feature": FAST_FEATURE, "nodes": nodes}
    if applied is not None:
        doc["applied"] = [{"node": s.node, "weight": s.weight, "features": list(s.features)} for s in applied]
    return doc


@dataclass(frozen=True)
class NodeSetting:
    """A node's scheduling weight and features: what placement sets (and what restores it)."""

    node: str
    weight: int
    features: tuple[str, ...]

    def describe(self) -> str:
        return f"NodeName={self.node} Weight={self.weight} Features={','.join(self.features) or '(null)'}"


def proposals(ranking: list[NodeRank], current: dict[str, NodeInfo]) -> list[NodeSetting]:
    """New settings for every ranked node Slurm knows: slow ones lose `fast`, fast ones gain it."""
    out = []
    for r in ranking:
        info = current.get(r.node)
        if info is None:
            raise SlurmError(f"rank-nodes: Slurm has no node {r.node!r}")
        feats = [f for f in info.features if f != FAST_FEATURE]
        if not r.slow:
            feats.append(FAST_FEATURE)
        out.append(NodeSetting(r.node, r.weight, tuple(feats)))
    return out


def current_setting(info: NodeInfo) -> NodeSetting:
    """A node's setting now (a weight Slurm did not report is the default one)."""
    return NodeSetting(info.name, BASE_WEIGHT if info.weight is None else info.weight, info.features)


def apply_settings(scheduler: Scheduler, settings: Iterable[NodeSetting]) -> None:
    for s in settings:
        scheduler.update_node(s.node, weight=s.weight, features=s.features)
