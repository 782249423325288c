"""slurm-chaos's reference checks beside a site's detectors: a straggler the site's detectors miss
is a BLIND SPOT whose reason names the reference check that saw it, when, and what would have
caught it. The heartbeats are real files (the probe's own writer) in a private directory."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from slurm_chaos.analysis.model import Comparison, Stats, Verdict
from slurm_chaos.analysis.verdict import judge
from slurm_chaos.campaign.observe import Watcher
from slurm_chaos.clock import FakeClock
from slurm_chaos.probe.heartbeat import Heartbeat
from slurm_chaos.rundir import Expectation, FaultWindow, ObservationLog
from slurm_chaos.site import Detector
from slurm_chaos.slurm.fake import FakeScheduler, idle_nodes
from slurm_chaos.slurm.model import JobInfo, JobState

T0 = 1_700_000_000.0
SLOW_RANK = Expectation(
    expect_regression=True,
    detect_signals=("healthcheck_drain", "alert_firing:ChaosStraggler", "signal:straggler"),
    detect_within_s=90,
)
STATS = Stats(500, 0.1, 0.11, 0.12)
SLOWED = Comparison(STATS, STATS, 0.4, 0.3, 0.5, 1e-9, True, 50, 50, 4)  # +40%, significant
NHC = Detector("nhc", ("checkpoint", "node_health"), drain_reason="^NHC:")


def heartbeats(tmp_path: Path) -> Path:
    d = tmp_path / "heartbeat"
    d.mkdir(mode=0o700)
    return d


def beat(directory: Path, job: str, when: float, slow: float = 0.05, failures: int = 0) -> None:
    """Rank 0 on node1 and rank 1 on node2 of `job` at `when`; rank 1 computes `slow` s/step."""
    for rank, host in enumerate(("node1", "node2")):
        hb = Heartbeat(directory, job, rank, host, world_size=2, clock=lambda: when)
        (directory / host / job).mkdir(parents=True, exist_ok=True, mode=0o755)
        for step in range(5):
            compute = slow if rank == 1 else 0.05
            hb.update(step, 0.2, compute, 0.2 - compute, checkpoint_failures=failures if rank == 0 else 0)
            hb._last_write = float("-inf")  # every step written, as a slow probe's would be
        # The scan trusts a heartbeat's time only up to its file's change time: make that `when`.
        os.utime(hb.path, (when, when))


def watched(directory: Path, nodes: tuple[str, ...] = ("node1", "node2")) -> Watcher:
    fake = FakeScheduler(
        node_table=idle_nodes(4),
        lifecycle=lambda sub: [JobInfo("", "job", JobState.RUNNING, nodes=nodes)] * 50,
    )
    job = fake.submit_wrap("true", [])
    return Watcher(fake, job, None, FakeClock(T0), detectors=(NHC,), reference_heartbeats=directory)


def log_of(w: Watcher) -> ObservationLog:
    return ObservationLog(FaultWindow(T0), tuple(sorted(w.observations, key=lambda o: o.time)), SLOW_RANK)


def test_a_straggler_no_site_detector_covers_is_a_blind_spot_naming_the_reference(tmp_path: Path) -> None:
    d = heartbeats(tmp_path)
    w = watched(d)
    beat(d, w.job_id, T0 + 10)  # in step: nothing
    w.clock.advance(10)  # type: ignore[attr-defined]
    w.tick()
    assert w.observations == []
    beat(d, w.job_id, T0 + 24, slow=0.12)
    w.clock.advance(14)  # type: ignore[attr-defined]
    w.tick()
    w.tick()  # once per node and check
    (ref,) = w.observations
    assert ref.signal == "reference:straggler" and ref.detector is None
    assert ref.time == T0 + 24  # the heartbeat's own time, not the poll's
    assert ref.detail.startswith(f"node2: job {w.job_id} rank 1 computes 120.0 ms/step, 2.40x the median")
    assert "metric slurm_chaos_probe_straggler_ratio, alert ChaosStraggler" in ref.detail
    # A reference finding is no detection: the site's detectors (NHC) missed it.
    slowed = judge(SLOWED, log_of(w))
    assert slowed.verdict is Verdict.BLIND_SPOT
    assert slowed.detected_by is None and slowed.detections == ()
    assert "; the reference check straggler saw it after 24 s: node2: job" in slowed.reason


def test_the_reference_is_named_in_a_blind_spot_only(tmp_path: Path) -> None:
    d = heartbeats(tmp_path)
    w = watched(d)
    beat(d, w.job_id, T0 + 5, slow=0.12)
    w.tick()
    c = SLOWED
    blind = judge(c, log_of(w))
    assert blind.verdict is Verdict.BLIND_SPOT
    assert blind.reason.startswith("step time +40.0% [+30.0%, +50.0%] but no healthcheck_drain/")
    assert "; the reference check straggler saw it after 5 s: node2: " in blind.reason
    # The site's own health check drained the node: PASSED, and the reference is not mentioned.
    fake = w.scheduler
    assert isinstance(fake, FakeScheduler)
    fake.node_table["node2"] = replace(
        fake.node_table["node2"],
        state=frozenset({"MIXED", "DRAIN"}),
        reason="slurm-chaos-health: straggler: rank 1",
    )
    w.clock.advance(7)  # type: ignore[attr-defined]
    w.tick()
    passed = judge(c, log_of(w))
    assert passed.verdict is Verdict.PASSED, passed.reason
    assert "reference" not in passed.reason


def test_checkpoint_failures_the_probe_reported_are_a_reference_finding(tmp_path: Path) -> None:
    d = heartbeats(tmp_path)
    w = watched(d)
    beat(d, w.job_id, T0 + 8, failures=3)
    w.tick()
    (ref,) = w.observations
    assert ref.signal == "reference:checkpoint"
    assert ref.detail.startswith(f"node1: job {w.job_id} rank 0: 3 checkpoint write(s) failed")
    assert "alert ChaosCheckpointFailing" in ref.detail


def test_other_jobs_heartbeats_and_stale_ones_are_not_the_reference(tmp_path: Path) -> None:
    d = heartbeats(tmp_path)
    w = watched(d)
    beat(d, "4242", T0 + 5, slow=0.12)  # another job's straggler
    beat(d, w.job_id, T0 - 600, slow=0.12)  # this job's, but stale (20 s at most)
    w.tick()
    assert w.observations == []


def test_without_a_readable_heartbeat_directory_there_is_no_reference(tmp_path: Path) -> None:
    w = watched(tmp_path / "missing")
    w.tick()
    assert w.observations == []
    want = "step time +40.0% [+30.0%, +50.0%] but no healthcheck_drain/alert_firing:ChaosStraggler/"
    assert judge(SLOWED, log_of(w)).reason == want + "signal:straggler in time"
