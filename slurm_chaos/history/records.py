"""What the history keeps of one window: typed records built from the report's own results.

A window is one campaign (or `run`) on one site. Its records are taken from the
:class:`~slurm_chaos.analysis.report.RunReport` the report renders, never from report.json or the
probe files read a second way: the history says what the report said.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_chaos.analysis.experiment import ExperimentAnalysis
from slurm_chaos.analysis.model import Detection, Verdict
from slurm_chaos.analysis.report import RunReport


@dataclass(frozen=True)
class Firing:
    """One site detector's firing in one experiment (a :class:`Detection` as stored)."""

    detector: str
    signal: str
    time_to_detect_s: float
    silenced: bool = False


@dataclass(frozen=True)
class ExperimentRecord:
    """One experiment in one window: its verdict and the numbers the monitoring loop is judged by.

    ``effect`` is the regression of the median step (fault / baseline - 1) with its CI; ``mde``
    the smallest effect the window could detect (switchback designs; None otherwise).
    ``detect_within_s`` and ``remediate_within_s`` are the deadlines it was judged against;
    ``expect_regression`` False: an A/A control, whose detectors must stay quiet."""

    name: str
    verdict: Verdict
    reason: str = ""
    fault: str = ""
    design: str = ""
    effect: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    mde: float | None = None
    detected_by: str | None = None
    time_to_detect_s: float | None = None
    time_to_remediate_s: float | None = None
    lost_steps: int = 0
    crashed: bool = False
    straggler: str | None = None
    expect_regression: bool = True
    detect_within_s: float | None = None
    remediate_within_s: float | None = None
    firings: tuple[Firing, ...] = ()

    def first_firing(self, detector: str) -> Firing | None:
        """The detector's earliest firing that reached people, else its earliest silenced one."""
        mine = [f for f in self.firings if f.detector == detector]
        told = [f for f in mine if not f.silenced]
        pool = told or mine
        return min(pool, key=lambda f: f.time_to_detect_s) if pool else None

    @property
    def detectors(self) -> tuple[str, ...]:
        return tuple(sorted({f.detector for f in self.firings}))


@dataclass(frozen=True)
class Window:
    """One campaign on one site: when, on what, and each experiment's record."""

    site: str
    run_id: str
    run_dir: str
    started: float | None
    slurm_version: str = ""
    tool_version: str = ""
    kind: str = ""
    nodes: tuple[str, ...] = ()
    experiments: tuple[ExperimentRecord, ...] = ()

    def experiment(self, name: str) -> ExperimentRecord | None:
        return next((e for e in self.experiments if e.name == name), None)


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _firing(d: Detection) -> Firing:
    return Firing(d.detector, d.signal, float(d.time_to_detect_s), d.silenced)


def experiment_record(a: ExperimentAnalysis) -> ExperimentRecord:
    r, c = a.result, a.result.comparison
    slow = r.stragglers[0] if r.stragglers else None
    return ExperimentRecord(
        name=r.name,
        verdict=r.verdict,
        reason=r.reason,
        fault=r.fault,
        design=r.design,
        effect=None if c is None else _finite(c.regression),
        ci_low=None if c is None else _finite(c.ci_low),
        ci_high=None if c is None else _finite(c.ci_high),
        p_value=None if c is None else _finite(c.p_value),
        mde=_finite(r.mde),
        detected_by=r.detected_by,
        time_to_detect_s=_finite(r.time_to_detect_s),
        time_to_remediate_s=_finite(r.time_to_remediate_s),
        lost_steps=r.lost_steps,
        crashed=r.crashed,
        straggler=None if slow is None else f"rank {slow.rank}@{slow.host}",
        expect_regression=a.expectation.expect_regression,
        detect_within_s=a.expectation.detect_within_s,
        remediate_within_s=a.expectation.remediate_within_s,
        firings=tuple(_firing(d) for d in r.detections),
    )


def window_nodes(report: RunReport) -> tuple[str, ...]:
    """The nodes the window's jobs ran on, as the manifest recorded them; a manifest without jobs
    (an older release's) gives the hosts of the ranks the probe recorded."""
    nodes = {n for j in report.manifest.jobs for n in j.nodes}
    if not nodes:
        runs = [run for a in report.analyses for run in (a.baseline, a.fault) if run is not None]
        nodes = {host for run in runs for host in run.hosts}
    return tuple(sorted(nodes))


def window_of(report: RunReport, run_dir: Path, site: str) -> Window:
    """The window a report describes, filed under ``site`` (the cluster's name)."""
    m = report.manifest
    return Window(
        site=site,
        run_id=m.run_id,
        run_dir=str(run_dir.resolve()),
        started=m.started,
        slurm_version=m.slurm_version,
        tool_version=m.tool_version,
        kind=m.kind.value,
        nodes=window_nodes(report),
        experiments=tuple(experiment_record(a) for a in report.analyses),
    )


def ordered(windows: Sequence[Window]) -> list[Window]:
    """Oldest first; a window of unknown start before every dated one, then by run id."""
    return sorted(windows, key=lambda w: (w.started is not None, w.started or 0.0, w.run_id))
