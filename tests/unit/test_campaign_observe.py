"""The watcher: which alerts concern the job it watches, and when they and a node's reason began."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from slurm_chaos.analysis.model import Verdict
from slurm_chaos.analysis.verdict import judge
from slurm_chaos.campaign.controller import REASON_PREFIX
from slurm_chaos.campaign.observe import Watcher, starts_at
from slurm_chaos.clock import FakeClock
from slurm_chaos.observe.healthcheck import REASON_PREFIX as HEALTHCHECK_PREFIX
from slurm_chaos.rundir import Expectation, FaultWindow, Observation, ObservationLog
from slurm_chaos.site import Detector
from slurm_chaos.slurm.fake import FakeScheduler, idle_nodes
from slurm_chaos.slurm.model import JobInfo, JobState


def alert(name: str, when: str = "2026-12-03T07:09:44.137946123Z", **labels: str) -> dict[str, object]:
    return {"labels": {"alertname": name, **labels}, "startsAt": when}


def watcher(alerts: list[dict[str, object]]) -> Watcher:
    fake = FakeScheduler(
        node_table=idle_nodes(4),
        lifecycle=lambda sub: [JobInfo("", "job", JobState.RUNNING, nodes=("node0", "node1"))] * 5,
    )
    job = fake.submit_wrap("true", [])
    return Watcher(fake, job, "http://alertmanager", FakeClock(), alerts=lambda url: alerts)


def test_only_alerts_about_this_job_or_its_nodes_count() -> None:
    w = watcher([])
    w.alerts = lambda url: [
        alert("ChaosStepTimeRegression", job_id="19"),  # an earlier job's, still firing
        alert("ChaosStepTimeRegression", job_id=w.job_id),
        alert("ChaosNumaMismatch", node="node3"),  # a node the job does not hold
        alert("ChaosCheckpointFailing", host="node1"),
        alert("ClusterWide"),
    ]
    w.tick()
    signals = sorted(o.signal for o in w.observations)
    assert signals == [
        "alert_firing:ChaosCheckpointFailing",
        "alert_firing:ChaosStepTimeRegression",
        "alert_firing:ClusterWide",
    ]
    (mine,) = [o for o in w.observations if "ChaosStepTimeRegression" in o.signal]
    assert f'"job_id": "{w.job_id}"' in mine.detail
    w.tick()
    assert len(w.observations) == 3  # each alert once


def test_an_alert_of_the_same_name_about_another_job_does_not_hide_this_ones() -> None:
    earlier = alert("ChaosStepTimeRegression", job_id="1")
    w = watcher([earlier])
    w.tick()
    assert w.observations == []
    w.alerts = lambda url: [earlier, alert("ChaosStepTimeRegression", job_id=w.job_id)]
    w.tick()
    assert [o.signal for o in w.observations] == ["alert_firing:ChaosStepTimeRegression"]


def test_an_alert_is_timed_when_alertmanager_says_it_began() -> None:
    w = watcher([alert("ClusterWide", "2026-12-03T07:09:44.5Z")])
    w.tick()
    (o,) = w.observations
    assert o.time == datetime(2026, 12, 3, 7, 9, 44, 500000, tzinfo=UTC).timestamp()


def test_starts_at_parses_rfc3339_and_refuses_the_rest() -> None:
    utc = datetime(2026, 12, 3, 7, 9, 44, 137946, tzinfo=UTC).timestamp()
    assert starts_at({"startsAt": "2026-12-03T07:09:44.137946123Z"}) == utc
    assert starts_at({"startsAt": "2026-12-03T08:09:44.137946+01:00"}) == utc
    assert starts_at({"startsAt": "2026-12-03T07:09:44Z"}) == utc - 0.137946
    for bad in ("0001-01-01T00:00:00Z", "yesterday", "", 5):
        assert starts_at({"startsAt": bad}) is None, bad
    assert starts_at({}) is None


# ------------------------------------------------------------ reason times

NHC = Detector("nhc", ("checkpoint", "node_health"), drain_reason="^NHC:")


def node_watcher(clock: FakeClock) -> tuple[Watcher, FakeScheduler]:
    fake = FakeScheduler(
        node_table=idle_nodes(2),
        lifecycle=lambda sub: [JobInfo("", "job", JobState.RUNNING, nodes=("node0", "node1"))] * 50,
    )
    job = fake.submit_wrap("true", [])
    return Watcher(fake, job, clock=clock, detectors=(NHC,)), fake


def set_reason(fake: FakeScheduler, node: str, state: set[str], reason: str, at: float | None) -> None:
    when = None if at is None else datetime.fromtimestamp(at, UTC)
    fake.node_table[node] = replace(
        fake.node_table[node], state=frozenset(state), reason=reason, reason_time=when
    )


def signals(w: Watcher) -> dict[str, Observation]:
    return {o.signal: o for o in w.observations}


def test_a_drain_is_timed_when_slurm_set_its_reason_not_when_we_polled() -> None:
    clock = FakeClock(1_700_000_000.0)
    w, fake = node_watcher(clock)
    w.tick()
    # The fault begins at .5, NHC drains at .8, Slurm's whole seconds say .0; we poll at 2.2.
    start = clock.now + 0.5
    set_reason(fake, "node1", {"MIXED", "DRAIN"}, "NHC: gpu gone", float(int(start + 0.3)))
    clock.advance(2.2)
    w.tick()
    seen = signals(w)
    assert set(seen) == {"node_drained", "detector:nhc"}
    for o in seen.values():
        assert (o.time, o.resolution_s) == (1_700_000_000.0, 1.0), o
        # Half a second "before" the fault by the reason's clock, yet inside the window.
        assert o.since(start) and o.after(start) == 0.0
    log = ObservationLog(
        FaultWindow(start), tuple(w.observations), Expectation(False, ("signal:node_health",), 60)
    )
    j = judge(None, log)
    assert (j.verdict, j.detected_by, j.time_to_detect_s) == (Verdict.PASSED, "nhc", 0.0)
    assert [(d.detector, d.time_to_detect_s) for d in j.detections] == [("nhc", 0.0), ("nhc", 0.0)]


def test_a_node_drained_before_the_job_is_no_detection() -> None:
    clock = FakeClock(1_700_000_000.0)
    w, fake = node_watcher(clock)
    set_reason(fake, "node1", {"MIXED", "DRAIN"}, "NHC: disk", clock.now - 3600)
    w.tick()
    start = clock.now + 1
    clock.advance(2)
    w.tick()
    drained = signals(w)["node_drained"]
    assert drained.time == clock.now - 3602 and not drained.since(start)
    # A reason set a second or more before the fault is older than any rounding of a later one.
    assert not replace(drained, time=start - 1.0).since(start)
    assert replace(drained, time=start - 0.999).since(start)
    log = ObservationLog(
        FaultWindow(start), tuple(w.observations), Expectation(False, ("signal:node_health",), 60)
    )
    j = judge(None, log)
    assert (j.verdict, j.detected_by, j.detections) == (Verdict.BLIND_SPOT, None, ())


def test_the_poll_times_what_has_no_reason_time_and_a_reason_older_than_the_change() -> None:
    clock = FakeClock(1_700_000_000.0)
    w, fake = node_watcher(clock)
    set_reason(fake, "node0", {"MIXED", "DRAIN"}, "NHC: disk", None)  # no reason time: the poll's
    set_reason(fake, "node1", {"MIXED", "DRAIN"}, "NHC: gpu", clock.now - 30)
    w.tick()
    assert [(o.signal, o.time, o.resolution_s) for o in w.observations if "node0" in o.detail] == [
        ("node_drained", clock.now, 0.0),
        ("detector:nhc", clock.now, 0.0),
    ]
    # node1 goes down later; Slurm keeps the drain's reason (and its time) from before the poll
    # that still showed it up: the down is timed by the poll that saw it.
    clock.advance(10)
    set_reason(fake, "node1", {"DOWN", "DRAIN"}, "NHC: gpu", clock.now - 40)
    w.tick()
    (down,) = [o for o in w.observations if o.signal == "node_down"]
    assert (down.time, down.resolution_s) == (clock.now, 0.0)
    # A node that goes down with a reason of its own is timed by it.
    clock.advance(10)
    set_reason(fake, "node0", {"DOWN"}, "Not responding", clock.now - 1.0)
    w.tick()
    (down0,) = [o for o in w.observations if o.signal == "node_down" and "node0" in o.detail]
    assert (down0.time, down0.resolution_s) == (clock.now - 1.0, 1.0)


def test_our_own_drain_and_a_controller_clock_ahead_are_timed_by_the_poll() -> None:
    clock = FakeClock(1_700_000_000.0)
    w, fake = node_watcher(clock)
    set_reason(fake, "node0", {"DOWN", "DRAIN"}, f"{REASON_PREFIX} drain", clock.now - 5)
    set_reason(fake, "node1", {"MIXED", "DRAIN"}, "NHC: gpu", clock.now + 3)
    w.tick()
    times = {(o.signal, o.detail.split(":")[0]): (o.time, o.resolution_s) for o in w.observations}
    assert times == {
        ("node_down", "node0"): (clock.now, 0.0),
        ("node_drained", "node1"): (clock.now, 1.0),
        ("detector:nhc", "node1"): (clock.now, 1.0),
    }


# ------------------------------------------------------------ another job's drain


def test_a_health_check_drain_on_another_jobs_findings_is_no_detection_of_this_one() -> None:
    """A job of another user on a shared node gets it drained: neither a FALSE ALARM of this job's
    control nor an unearned PASSED of its fault."""
    clock = FakeClock(1_700_000_000.0)
    w, fake = node_watcher(clock)
    w.detectors = (Detector("ours", ("straggler",), drain_reason="^slurm-chaos-health:"),)
    other = f"{HEALTHCHECK_PREFIX} straggler: job 9{w.job_id} rank 1 computes 5000.0 ms/step, 100.00x"
    set_reason(fake, "node0", {"MIXED", "DRAIN"}, other, clock.now)
    w.tick()
    assert w.observations == []
    # This job's own findings, and the node's own measurement (no job named), are detections.
    mine = f"{HEALTHCHECK_PREFIX} straggler: job 9{w.job_id} rank 1 ...; job {w.job_id} rank 0 computes"
    set_reason(fake, "node0", {"MIXED", "DRAIN"}, mine, clock.now)
    set_reason(fake, "node1", {"MIXED", "DRAIN"}, f"{HEALTHCHECK_PREFIX} gpu_xid: Xid 79 on GPU 0", clock.now)
    clock.advance(2)
    w.tick()
    assert sorted((o.signal, o.detail.split(":")[0]) for o in w.observations) == [
        ("detector:ours", "node0"),
        ("detector:ours", "node1"),
        ("healthcheck_drain", "node0"),
        ("healthcheck_drain", "node1"),
        ("node_drained", "node0"),
        ("node_drained", "node1"),
    ]
    assert w.anothers_drain(other) and not w.anothers_drain(mine) and not w.anothers_drain("NHC: job 1")
