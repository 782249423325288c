"""The site's host alerts on node_exporter (site-node.rules.yml, the node-exporter mixin's) and the
sandbox site that declares them as its detectors (sandbox-node-exporter.yaml): promtool checks and
unit-tests the rules; the detectors match them, and an alert's `instance` (a node's address) counts
for that node's jobs only."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurm_chaos.analysis.verdict import judge
from slurm_chaos.campaign.observe import Watcher
from slurm_chaos.clock import FakeClock
from slurm_chaos.rundir import Expectation, FaultWindow, ObservationLog
from slurm_chaos.sandbox.layout import Layout
from slurm_chaos.site import Site, load_site
from slurm_chaos.slurm.fake import FakeScheduler, idle_nodes
from slurm_chaos.slurm.model import JobInfo, JobState

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "site_configs" / "alerts" / "site-node.rules.yml"
SITE = REPO / "site_configs" / "sandbox-node-exporter.yaml"
LAYOUT = Layout("t-node", 7, 4, "host")

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian prometheus) missing"
)


def _alerts() -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            out.setdefault(rule["alert"], []).append(rule)
    return out


def _site() -> Site:
    return load_site(SITE, lambda name: LAYOUT.site_placeholders())


@needs_promtool
def test_the_rules_are_valid() -> None:
    done = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_usual_host_alerts_select_the_sandboxs_node_job_and_wait_less_than_a_fault_lasts() -> None:
    alerts = _alerts()
    assert {
        "NodeFilesystemAlmostOutOfSpace",
        "NodeFilesystemAlmostOutOfFiles",
        "NodeNetworkReceiveErrs",
        "NodeNetworkTransmitErrs",
        "NodeSystemSaturation",
        "NodeExporterDown",
    } <= set(alerts)
    assert [r["labels"]["severity"] for r in alerts["NodeFilesystemAlmostOutOfSpace"]] == [
        "warning",
        "critical",
    ]
    for name, rules in alerts.items():
        for rule in rules:
            assert 'job="node"' in rule["expr"], name  # the sandbox's scrape job (monitoring.NODE_JOB)
            assert {"summary", "description"} <= set(rule["annotations"]), name
            # A fault lasts about a minute on the sandbox: the mixin's 30m to 1h would never fire.
            m = re.fullmatch(r"(\d+)([sm])", str(rule.get("for", "0s")))
            assert m is not None and int(m.group(1)) * (60 if m.group(2) == "m" else 1) <= 60, name


def _promtool_test(tmp_path: Path, tests: list[dict[str, object]]) -> subprocess.CompletedProcess[str]:
    spec = {"rule_files": [str(RULES)], "evaluation_interval": "2s", "tests": tests}
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )


NODE1, NODE2, NODE3 = (f"10.251.7.{10 + i}:9100" for i in (1, 2, 3))
CKPT = {
    "device": "slurm-chaos-ckpt-7-overlay-0a1b2c3d",
    "fstype": "overlay",
    "mountpoint": "/shared/checkpoints/7",
}
ROOT = {"device": "/dev/sda1", "fstype": "ext4", "mountpoint": "/"}


def _series(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
    text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{metric}{{{text}}}", "values": values}


def _fs(instance: str, fs: dict[str, str], avail: int, size: int) -> list[dict[str, str]]:
    labels = {"job": "node", "instance": instance, **fs}
    return [
        _series("node_filesystem_avail_bytes", labels, f"{avail}x20"),
        _series("node_filesystem_size_bytes", labels, f"{size}x20"),
        _series("node_filesystem_readonly", labels, "0x20"),
        _series("node_filesystem_files_free", labels, "1000x20"),
        _series("node_filesystem_files", labels, "1000x20"),
    ]


def _fs_alert(severity: str, limit: int) -> dict[str, object]:
    (rule,) = [r for r in _alerts()["NodeFilesystemAlmostOutOfSpace"] if r["labels"]["severity"] == severity]
    return {
        "exp_labels": {"job": "node", "instance": NODE1, "severity": severity, **CKPT},
        "exp_annotations": {
            **rule["annotations"],
            "summary": f"Filesystem has less than {limit}% space left.",
            "description": f"Filesystem on {CKPT['device']}, mounted on {CKPT['mountpoint']}, at {NODE1} "
            "has only 0.00% available space left.",
        },
    }


@needs_promtool
def test_a_full_checkpoint_volume_on_one_node_fires_for_that_node_alone(tmp_path: Path) -> None:
    """ckpt-full's overlay on node1 (64 KiB, all used); / of every node is half full."""
    series = _fs(NODE1, CKPT, 0, 65536) + _fs(NODE1, ROOT, 50, 100) + _fs(NODE2, ROOT, 50, 100)
    tests: list[dict[str, object]] = [
        {
            "interval": "4s",
            "input_series": series,
            "alert_rule_test": [
                # Pending for its `for:` (6 s) first, then firing.
                {"eval_time": "4s", "alertname": "NodeFilesystemAlmostOutOfSpace", "exp_alerts": []},
                {
                    "eval_time": "20s",
                    "alertname": "NodeFilesystemAlmostOutOfSpace",
                    "exp_alerts": [_fs_alert("warning", 5), _fs_alert("critical", 3)],
                },
                {"eval_time": "20s", "alertname": "NodeFilesystemAlmostOutOfFiles", "exp_alerts": []},
            ],
        }
    ]
    done = _promtool_test(tmp_path, tests)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_network_errors_load_and_a_silent_exporter_fire_the_sites_alerts(tmp_path: Path) -> None:
    eth0 = {"job": "node", "instance": NODE2, "device": "eth0"}
    machine = {"job": "node", "instance": NODE1}
    alerts = {name: rules[0] for name, rules in _alerts().items()}

    def fired(name: str, labels: dict[str, str], description: str, **more: str) -> dict[str, object]:
        """The alert with its labels and the rule's annotations, `description` (and `more`) rendered."""
        return {
            "exp_labels": {**labels, "severity": alerts[name]["labels"]["severity"]},
            "exp_annotations": {**alerts[name]["annotations"], "description": description, **more},
        }

    tests: list[dict[str, object]] = [
        {
            "interval": "4s",
            "input_series": [
                # One packet in ten received in error on node2's eth0.
                _series("node_network_receive_errs_total", eth0, "0+10x40"),
                _series("node_network_receive_packets_total", eth0, "0+100x40"),
                _series("node_network_transmit_errs_total", eth0, "0x40"),
                _series("node_network_transmit_packets_total", eth0, "0+100x40"),
                # The machine's load: 5 on its 2 CPUs.
                _series("node_load1", machine, "5x40"),
                _series("node_cpu_seconds_total", {**machine, "cpu": "0", "mode": "idle"}, "0+1x40"),
                _series("node_cpu_seconds_total", {**machine, "cpu": "1", "mode": "idle"}, "0+1x40"),
                _series("up", {"job": "node", "instance": NODE3}, "0x40"),
                _series("up", {"job": "node", "instance": NODE1}, "1x40"),
            ],
            "alert_rule_test": [
                {
                    "eval_time": "40s",
                    "alertname": "NodeNetworkReceiveErrs",
                    "exp_alerts": [
                        fired(
                            "NodeNetworkReceiveErrs",
                            eth0,
                            f"{NODE2} interface eth0 has encountered 0 receive errors in the last two "
                            "minutes.",
                        )
                    ],
                },
                {"eval_time": "40s", "alertname": "NodeNetworkTransmitErrs", "exp_alerts": []},
                {"eval_time": "40s", "alertname": "NodeSystemSaturation", "exp_alerts": []},  # for: 1m
                {
                    "eval_time": "80s",
                    "alertname": "NodeSystemSaturation",
                    "exp_alerts": [
                        fired(
                            "NodeSystemSaturation",
                            machine,
                            f"System load per core at {NODE1} has been above 2 for the last 15 minutes, "
                            "is currently at 2.50. This might indicate this instance resources saturation "
                            "and can cause it becoming unresponsive.",
                        )
                    ],
                },
                {
                    "eval_time": "40s",
                    "alertname": "NodeExporterDown",
                    "exp_alerts": [
                        fired(
                            "NodeExporterDown",
                            {"job": "node", "instance": NODE3},
                            f"Prometheus cannot scrape node_exporter on {NODE3}: the node is down or "
                            "unreachable, or its exporter stopped.",
                            summary=f"node_exporter {NODE3} is down.",
                        )
                    ],
                },
            ],
        }
    ]
    done = _promtool_test(tmp_path, tests)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_sandbox_site_declares_the_host_alerts_as_its_detectors() -> None:
    site = _site()
    assert site.monitoring.healthcheck_signals == ()  # slurm-chaos's own health check off
    assert site.monitoring.alertmanager == f"http://127.0.0.1:{LAYOUT.alertmanager_port}"
    detectors = {d.name: d for d in site.monitoring.detectors}
    assert detectors["node-filesystem"].signals == ("checkpoint",)
    assert detectors["node-exporter-down"].signals == ("node_lost",)
    # Every detector sees an alert the rules file has, and the filesystem one both of its kinds.
    names = set(_alerts())
    for d in detectors.values():
        assert any(d.matches_alert({"alertname": n}) for n in names), d.name
    filesystem = {n for n in names if detectors["node-filesystem"].matches_alert({"alertname": n})}
    assert filesystem == {"NodeFilesystemAlmostOutOfSpace", "NodeFilesystemAlmostOutOfFiles"}


def test_a_host_alert_counts_for_the_node_its_instance_names_and_no_other() -> None:
    """The sandbox's node_exporters are scraped on the nodes' addresses (Slurm's NodeAddr): the
    campaign maps `instance` back to the node. The job holds node1 and node2 of node0..node3."""
    site = _site()
    nodes = {n: replace(info, address=f"10.251.7.{10 + int(n[4:])}") for n, info in idle_nodes(4).items()}
    fake = FakeScheduler(
        node_table=nodes,
        lifecycle=lambda sub: [JobInfo("", "job", JobState.RUNNING, nodes=("node1", "node2"))] * 5,
    )
    job = fake.submit_wrap("true", [])
    clock = FakeClock()
    w = Watcher(fake, job, "http://alertmanager", clock, lambda url: [], site.monitoring.detectors)
    w.tick()

    def full(instance: str) -> dict[str, object]:
        labels = {"alertname": "NodeFilesystemAlmostOutOfSpace", "job": "node", "instance": instance, **CKPT}
        return {"labels": labels | {"severity": "warning"}, "startsAt": "2023-11-14T22:13:50Z"}

    w.alerts = lambda url: [full(NODE3)]  # node3: not the job's
    w.tick()
    assert w.observations == []
    w.alerts = lambda url: [full(NODE3), full(NODE2)]
    w.tick()
    (detected,) = [o for o in w.observations if o.signal == "detector:node-filesystem"]
    assert (detected.detector, detected.covers) == ("node-filesystem", ("checkpoint",))
    assert NODE2 in detected.detail and NODE3 not in detected.detail
    e = Expectation(expect_regression=False, detect_signals=("signal:checkpoint",), detect_within_s=90.0)
    log = ObservationLog(FaultWindow(clock.time() - 60), tuple(w.observations), e)
    j = judge(None, log)
    assert j.detected_by == "node-filesystem", j.reason
