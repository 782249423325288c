"""Site detectors: silenced alerts, NHC drains, node labels, `signal:<kind>` expectations, report entries."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurm_chaos.analysis.model import ExperimentResult, Verdict
from slurm_chaos.analysis.verdict import detections, judge
from slurm_chaos.campaign.hold import release_due
from slurm_chaos.campaign.observe import Watcher, host_of
from slurm_chaos.clock import FakeClock
from slurm_chaos.errors import ConfigError
from slurm_chaos.experiment import load_experiment_file
from slurm_chaos.rundir import (
    Expectation,
    FaultWindow,
    Observation,
    ObservationLog,
    observations_from_json,
    observations_to_json,
)
from slurm_chaos.site import Detector, load_site
from slurm_chaos.slurm.fake import FakeScheduler, idle_nodes
from slurm_chaos.slurm.model import JobInfo, JobState

GOLDEN = Path(__file__).resolve().parents[2] / "tests" / "data" / "sites" / "golden.yaml"
T0 = 1_700_000_000.0  # the fake clock's start, and the fault's
AT_30S = "2023-11-14T22:13:50Z"  # T0 + 30 s

NHC = Detector("nhc", ("checkpoint", "node_health"), drain_reason="^NHC:")
DCGM = Detector("dcgm-xid", ("gpu_xid",), alert=(("alertname", "GpuXidErrors"),))
STRAGGLER = Detector(
    "chaos-straggler", ("straggler",), alert=(("alertname", "=~Chaos(Straggler|StepTime.+)"),)
)
MUTE = {"state": "suppressed", "silencedBy": ["maintenance-window"], "inhibitedBy": []}


def alert(name: str, status: dict[str, object] | None = None, **labels: str) -> dict[str, object]:
    a: dict[str, object] = {"labels": {"alertname": name, **labels}, "startsAt": AT_30S}
    if status is not None:
        a["status"] = status
    return a


def watcher(*detectors: Detector) -> tuple[Watcher, FakeScheduler]:
    """A watcher of a job on node1 and node2 (of node0..node3), no alerts yet."""
    fake = FakeScheduler(
        node_table=idle_nodes(4),
        lifecycle=lambda sub: [JobInfo("", "job", JobState.RUNNING, nodes=("node1", "node2"))] * 5,
    )
    job = fake.submit_wrap("true", [])
    w = Watcher(fake, job, "http://alertmanager", FakeClock(), alerts=lambda url: [], detectors=detectors)
    return w, fake


def advance(w: Watcher, seconds: float) -> None:
    assert isinstance(w.clock, FakeClock)
    w.clock.advance(seconds)


def drain(fake: FakeScheduler, node: str, reason: str) -> None:
    """Slurm's view of a drain some other tool requested (NHC, a site script)."""
    fake.node_table[node] = replace(fake.node_table[node], state=frozenset({"MIXED", "DRAIN"}), reason=reason)


def judged(w: Watcher, e: Expectation) -> ObservationLog:
    return ObservationLog(FaultWindow(T0), tuple(sorted(w.observations, key=lambda o: o.time)), e)


def test_a_silenced_alert_counts_and_is_marked_silenced() -> None:
    w, _ = watcher(STRAGGLER)
    w.alerts = lambda url: [alert("ChaosStraggler", MUTE, job_id=w.job_id)]
    w.tick()
    assert {o.signal for o in w.observations} == {"alert_firing:ChaosStraggler", "detector:chaos-straggler"}
    assert all(o.silenced and o.time == T0 + 30 for o in w.observations)
    for wanted in ("alert_firing:ChaosStraggler", "signal:straggler"):
        j = judge(None, judged(w, Expectation(expect_regression=False, detect_signals=(wanted,))))
        assert j.verdict is Verdict.PASSED, j.reason
        assert "(silenced)" in j.reason
    (d,) = detections(judged(w, Expectation()))
    assert (d.detector, d.signal, d.time_to_detect_s) == ("chaos-straggler", "straggler", 30.0)
    assert d.silenced


def test_inhibited_alerts_count_too_and_plain_ones_are_not_silenced() -> None:
    w, _ = watcher()
    w.alerts = lambda url: [
        alert("A", {"state": "active", "silencedBy": [], "inhibitedBy": ["other"]}, job_id=w.job_id),
        alert("B", {"state": "active", "silencedBy": [], "inhibitedBy": []}, job_id=w.job_id),
    ]
    w.tick()
    assert {o.signal: o.silenced for o in w.observations} == {"alert_firing:A": True, "alert_firing:B": False}


def test_an_alert_about_an_unrelated_node_does_not_count() -> None:
    w, _ = watcher(DCGM)
    w.alerts = lambda url: [
        alert("GpuXidErrors", Hostname="node3"),
        alert("GpuXidErrors", instance="node0:9400"),
    ]
    w.tick()
    assert w.observations == []
    j = judge(None, judged(w, Expectation(expect_regression=False, detect_signals=("signal:gpu_xid",))))
    assert j.verdict is Verdict.BLIND_SPOT


def test_an_instance_names_its_node() -> None:
    assert host_of("node2:9100") == "node2"
    assert host_of("node2.cluster.example:9100") == "node2"
    assert host_of("node2") == "node2"
    assert host_of("10.0.0.5:9100") == "10.0.0.5"
    assert host_of("[fe80::1]:9100") == "fe80::1"
    w, _ = watcher(DCGM)
    w.alerts = lambda url: [alert("GpuXidErrors", instance="node2:9100")]
    w.tick()
    (o, d) = sorted(w.observations, key=lambda o: o.signal)
    assert o.signal == "alert_firing:GpuXidErrors"
    assert (d.signal, d.detector, d.covers) == ("detector:dcgm-xid", "dcgm-xid", ("gpu_xid",))


def test_a_node_named_by_its_address_is_the_jobs() -> None:
    w, fake = watcher(DCGM)
    fake.node_table["node2"] = replace(fake.node_table["node2"], address="10.0.0.12")
    w.tick()
    w.alerts = lambda url: [alert("GpuXidErrors", instance="10.0.0.12:9400")]
    w.tick()
    assert "detector:dcgm-xid" in {o.signal for o in w.observations}


def test_node_labels_are_the_sites() -> None:
    w, _ = watcher(DCGM)
    w.node_labels = ("gpu_host",)
    w.alerts = lambda url: [alert("GpuXidErrors", gpu_host="node3", node="node1")]
    w.tick()
    assert w.observations == []  # node3 is not the job's; `node` is not a node label here


def test_an_nhc_drain_on_the_jobs_node_satisfies_signal_checkpoint() -> None:
    w, fake = watcher(NHC)
    w.tick()
    advance(w, 40)
    drain(fake, "node2", "NHC: check_fs_free: /ckpt full")
    w.tick()
    assert {o.signal for o in w.observations} == {"node_drained", "detector:nhc"}
    e = Expectation(expect_regression=False, detect_signals=("signal:checkpoint",), detect_within_s=600.0)
    log = judged(w, e)
    j = judge(None, log)
    assert j.verdict is Verdict.PASSED, j.reason
    assert (j.detected_by, j.time_to_detect_s) == ("nhc", 40.0)
    assert {(d.detector, d.signal) for d in j.detections} == {("nhc", "checkpoint"), ("nhc", "node_health")}
    # Today's healthcheck_drain is slurm-chaos's own health check, not NHC.
    ours_only = replace(log, expectation=replace(e, detect_signals=("healthcheck_drain",)))
    assert judge(None, ours_only).verdict is Verdict.BLIND_SPOT
    assert release_due(e, T0, w.observations, T0 + 41)


def test_our_own_injected_drain_is_no_detection() -> None:
    w, fake = watcher(Detector("any", ("node_health",), drain_reason="."))
    drain(fake, "node1", "slurm-chaos: node-drain")
    w.tick()
    assert w.observations == []


def test_a_detector_of_another_signal_does_not_satisfy_the_expectation() -> None:
    w, _ = watcher(DCGM)
    w.alerts = lambda url: [alert("GpuXidErrors", node="node1")]
    w.tick()
    j = judge(None, judged(w, Expectation(expect_regression=False, detect_signals=("signal:checkpoint",))))
    assert j.verdict is Verdict.BLIND_SPOT


def test_old_alert_firing_expectations_still_work() -> None:
    w, _ = watcher()  # no detectors declared: as before them
    w.alerts = lambda url: [alert("ChaosCheckpointFailing", host="node1")]
    w.tick()
    e = Expectation(expect_regression=False, detect_signals=("alert_firing:ChaosCheckpointFailing",))
    j = judge(None, judged(w, e))
    assert j.verdict is Verdict.PASSED
    assert (j.detected_by, j.time_to_detect_s) == ("alert_firing:ChaosCheckpointFailing", 30.0)
    assert j.detections == ()


def test_alert_matchers_equality_and_anchored_regex() -> None:
    d = Detector("x", ("straggler",), alert=(("alertname", "=~Chaos.*"), ("severity", "critical")))
    assert d.matches_alert({"alertname": "ChaosStraggler", "severity": "critical"})
    assert not d.matches_alert({"alertname": "ChaosStraggler", "severity": "warning"})
    assert not d.matches_alert({"alertname": "NotChaos", "severity": "critical"})
    assert not d.matches_alert({"alertname": "ChaosStraggler"})
    assert not NHC.matches_alert({"alertname": "ChaosStraggler"})


def test_observations_keep_detector_fields_and_old_files_load() -> None:
    new = Observation("detector:nhc", T0 + 5, "node1: NHC: x", "nhc", ("checkpoint",), True)
    old = Observation("alert_firing:X", T0 + 6, "{}")
    log = ObservationLog(FaultWindow(T0), (new, old), Expectation(detect_signals=("signal:checkpoint",)))
    raw = observations_to_json(log)
    assert raw["observations"][1] == {"signal": "alert_firing:X", "time": T0 + 6, "detail": "{}"}
    assert observations_from_json(raw) == log


def test_report_entries_carry_detections_beside_detected_by() -> None:
    w, fake = watcher(NHC)
    advance(w, 12)
    drain(fake, "node1", "NHC: check_ps_service")
    w.tick()
    j = judge(None, judged(w, Expectation(expect_regression=False, detect_signals=("signal:node_health",))))
    r = ExperimentResult(
        "x",
        "",
        j.verdict,
        j.reason,
        None,
        detected_by=j.detected_by,
        time_to_detect_s=j.time_to_detect_s,
        detections=j.detections,
    )
    doc = r.to_json()
    assert (doc["verdict"], doc["detected_by"], doc["time_to_detect_s"]) == ("PASSED", "nhc", 12.0)
    assert doc["detections"] == [
        {"detector": "nhc", "signal": "checkpoint", "time_to_detect_s": 12.0, "silenced": False},
        {"detector": "nhc", "signal": "node_health", "time_to_detect_s": 12.0, "silenced": False},
    ]


# ------------------------------------------------------------------ site config
def _site(tmp_path: Path, monitoring: dict[str, Any]) -> Path:
    data = yaml.safe_load(GOLDEN.read_text())
    data["monitoring"] = monitoring
    p = tmp_path / "site.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_site_declares_its_detectors(tmp_path: Path) -> None:
    site = load_site(
        _site(
            tmp_path,
            {
                "detectors": [
                    {"name": "nhc", "signals": ["checkpoint", "node_health"], "drain_reason": "^NHC:"},
                    {"name": "dcgm-xid", "signals": ["gpu_xid"], "alert": {"alertname": "GpuXidErrors"}},
                ],
                "node_labels": ["Hostname"],
            },
        )
    )
    assert site.monitoring.detectors == (NHC, DCGM)
    assert site.monitoring.node_labels == ("Hostname",)
    default = load_site(GOLDEN).monitoring
    assert default.detectors == () and "instance" in default.node_labels


@pytest.mark.parametrize(
    ("detector", "key", "words"),
    [
        (
            {"name": "n", "signals": ["checkpoint"], "drain": "^NHC:"},
            "monitoring.detectors.0.drain",
            "unknown key",
        ),
        (
            {"name": "n", "signals": ["checkpoint"], "drain_reason": "^NHC:("},
            "monitoring.detectors.0.drain_reason",
            "bad regex",
        ),
        (
            {"name": "n", "signals": ["gpu_xid"], "alert": {"alertname": "=~Gpu[Xid"}},
            "monitoring.detectors.0.alert.alertname",
            "bad regex",
        ),
        ({"name": "n", "signals": ["checkpoint"]}, "monitoring.detectors.0", "drain_reason or alert"),
        (
            {"name": "n", "signals": ["disk"], "drain_reason": "x"},
            "monitoring.detectors.0.signals.0",
            "expected one of",
        ),
    ],
)
def test_a_bad_detector_names_its_key(tmp_path: Path, detector: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_site(_site(tmp_path, {"detectors": [detector]}))
    assert exc.value.key == key
    assert words in exc.value.problem


def test_two_detectors_of_one_name_are_an_error(tmp_path: Path) -> None:
    d = {"name": "nhc", "signals": ["checkpoint"], "drain_reason": "^NHC:"}
    with pytest.raises(ConfigError) as exc:
        load_site(_site(tmp_path, {"detectors": [d, d]}))
    assert exc.value.key == "monitoring.detectors.1.name"


def test_an_experiment_names_signal_kinds_the_site_can_declare(tmp_path: Path) -> None:
    p = tmp_path / "x.yaml"
    body = "name: x\nstrategy: storage\ndescription: d\nfault: {spec: null}\nexpect: {detect: [%s]}\n"
    p.write_text(body % "'signal:checkpoint', 'alert_firing:ChaosCheckpointFailing'")
    detect = load_experiment_file(p).expect.detect
    assert detect == ("signal:checkpoint", "alert_firing:ChaosCheckpointFailing")
    p.write_text(body % "'signal:disk'")
    with pytest.raises(ConfigError) as exc:
        load_experiment_file(p)
    assert exc.value.key == "expect.detect.0"
    assert "unknown signal kind 'disk'" in exc.value.problem
