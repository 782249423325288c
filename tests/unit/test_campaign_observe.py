"""The watcher: which alerts concern the job it watches, and when they began."""

from __future__ import annotations

from datetime import UTC, datetime

from slurm_chaos.campaign.observe import Watcher, starts_at
from slurm_chaos.clock import FakeClock
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
