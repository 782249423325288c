"""Typed hand-offs of the analysis stage: comparisons, stragglers, verdicts and results.

What the campaign observed (``observations.json``) is read through :mod:`slurm_chaos.rundir`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from slurm_chaos.rundir.observations import Observation

#: The design of a result judged against a baseline job (switchback's is schedule.DESIGN).
BETWEEN_RUNS = "between-runs"


class Verdict(StrEnum):
    """Outcome of one experiment; the values are what reports print."""

    PASSED = "PASSED"
    BLIND_SPOT = "BLIND SPOT"
    NOT_RECOVERED = "NOT RECOVERED"
    NO_EFFECT = "NO EFFECT"
    INCONCLUSIVE = "INCONCLUSIVE"
    FALSE_ALARM = "FALSE ALARM"


@dataclass(frozen=True)
class Stats:
    """Robust summary of per-step step times (seconds)."""

    n: int
    median: float
    p95: float
    p99: float


@dataclass(frozen=True)
class Comparison:
    """Fault run against its baseline, on the job's per-step time (max over ranks).

    ``regression`` is fault median / baseline median - 1; the CI comes from a block bootstrap,
    ``p_value`` from a Mann-Whitney test on batch medians. ``significant`` needs p < alpha, a CI
    that excludes zero and an effect of at least ``min_effect`` (see :mod:`.regression`).
    """

    baseline: Stats
    fault: Stats
    regression: float
    ci_low: float
    ci_high: float
    p_value: float
    significant: bool
    baseline_warmup_steps: int
    fault_warmup_steps: int
    block_steps: int
    inconclusive_reason: str = ""
    onset_step: int | None = None
    onset_time: float | None = None
    #: True for a switchback run judged on its own on/off blocks (the "baseline" is its off blocks).
    within_job: bool = False

    @property
    def between(self) -> str:
        """What the change was measured between, for verdict reasons."""
        return "between the job's on and off blocks" if self.within_job else "between runs"


class StragglerKind(StrEnum):
    """Why a rank is as fast as it is; the value is the word the report's JSON writes."""

    SLOW_COMPUTE = "slow_compute"  # this rank computes slowly
    WAITS = "waits_in_allreduce"  # it is fast but spends the difference waiting for a slow peer
    NORMAL = "normal"
    # A switchback run: it computes slower, relative to the other ranks, while the fault is on;
    # its score is that slowdown as a fraction (0.2 = 20% slower), not a speed relative to the fastest.
    SLOWER_WHEN_ON = "slower_when_fault_on"


@dataclass(frozen=True)
class StragglerScore:
    """One rank's speed relative to the fastest rank: 1.0 is the fastest, lower is slower."""

    rank: int
    host: str
    gpu: int | None
    score: float
    compute_median: float
    comm_median: float
    kind: StragglerKind


@dataclass(frozen=True)
class Detection:
    """A site detector's first firing after the fault began, for one signal kind it covers."""

    detector: str
    signal: str
    time_to_detect_s: float
    silenced: bool = False


@dataclass(frozen=True)
class BusBandwidth:
    """An allreduce-mode run's bus bandwidth (nccl-tests' busbw, GB/s) over its timed steps."""

    steps: int
    mean_gbps: float
    median_gbps: float


@dataclass(frozen=True)
class BusbwResult:
    """Both runs' bus bandwidth and the hypothesis' floor (``min_busbw_gbps``; None: not judged)."""

    baseline: BusBandwidth | None
    fault: BusBandwidth | None
    min_gbps: float | None = None


@dataclass(frozen=True)
class ExperimentResult:
    """Everything the report says about one experiment."""

    name: str
    fault: str
    verdict: Verdict
    reason: str
    comparison: Comparison | None
    stragglers: tuple[StragglerScore, ...] = ()
    detected_by: str | None = None
    time_to_detect_s: float | None = None
    time_to_remediate_s: float | None = None
    lost_steps: int = 0
    crashed: bool = False
    world_size: int = 0
    observations: tuple[Observation, ...] = field(default_factory=tuple)
    detections: tuple[Detection, ...] = ()
    # How the step-time effect was measured: "between-runs" (a baseline job) or "switchback" (the
    # fault job's own on against off blocks), and the smallest effect it could detect (switchback).
    design: str = BETWEEN_RUNS
    mde: float | None = None
    # Holm-adjusted across the campaign's in-job tests (switchback); None: judged alone.
    p_adjusted: float | None = None
    # An allreduce-mode experiment's bus bandwidth; None: a training run (nothing measured).
    busbw: BusbwResult | None = None

    def to_json(self) -> dict[str, Any]:
        """Flat JSON record, rounded so that re-running gives byte-identical output.

        Every entry has ``design``, ``p_value``, ``significant``, ``mde`` and ``stragglers``
        (slowest first); what a design cannot say is null."""
        c = self.comparison
        record: dict[str, Any] = {
            "name": self.name,
            "design": self.design,
            "p_value": None,
            "significant": False,
            "mde": _round(self.mde),
            "p_adjusted": _round(self.p_adjusted, 12),
            "fault": self.fault,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "world_size": self.world_size,
            "detected_by": self.detected_by,
            "time_to_detect_s": _round(self.time_to_detect_s),
            "time_to_remediate_s": _round(self.time_to_remediate_s),
            "lost_steps": self.lost_steps,
            "crashed": self.crashed,
            "stragglers": [straggler_json(s) for s in self.stragglers],
            "detections": [detection_json(d) for d in self.detections],
            "busbw": None if self.busbw is None else busbw_json(self.busbw),
        }
        record.update(comparison_json(c) if c is not None else {})
        return record


def _round(value: float | None, digits: int = 6) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(float(value), digits)


def detection_json(d: Detection) -> dict[str, Any]:
    return {
        "detector": d.detector,
        "signal": d.signal,
        "time_to_detect_s": _round(d.time_to_detect_s),
        "silenced": d.silenced,
    }


def straggler_json(s: StragglerScore) -> dict[str, Any]:
    return {
        "rank": s.rank,
        "host": s.host,
        "gpu": s.gpu,
        "score": _round(s.score, 4),
        "kind": s.kind.value,
        "compute_median_s": _round(s.compute_median),
        "comm_median_s": _round(s.comm_median),
    }


def busbw_json(b: BusbwResult) -> dict[str, Any]:
    def run(x: BusBandwidth | None) -> dict[str, Any] | None:
        if x is None:
            return None
        return {
            "steps": x.steps,
            "mean_gbps": _round(x.mean_gbps, 4),
            "median_gbps": _round(x.median_gbps, 4),
        }

    return {"baseline": run(b.baseline), "fault_run": run(b.fault), "min_gbps": _round(b.min_gbps, 4)}


def comparison_json(c: Comparison) -> dict[str, Any]:
    return {
        "regression": _round(c.regression),
        "ci_low": _round(c.ci_low),
        "ci_high": _round(c.ci_high),
        "p_value": _round(c.p_value, 12),
        "significant": c.significant,
        "inconclusive_reason": c.inconclusive_reason,
        "baseline": {k: _round(v) if isinstance(v, float) else v for k, v in asdict(c.baseline).items()},
        "fault_run": {k: _round(v) if isinstance(v, float) else v for k, v in asdict(c.fault).items()},
        "baseline_warmup_steps": c.baseline_warmup_steps,
        "fault_warmup_steps": c.fault_warmup_steps,
        "block_steps": c.block_steps,
        "onset_step": c.onset_step,
        "onset_time": _round(c.onset_time),
    }
