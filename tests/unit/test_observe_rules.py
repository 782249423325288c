"""The shipped alert rules and Alertmanager config, checked and unit-tested by promtool/amtool themselves."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ALERTS = Path(__file__).resolve().parents[2] / "site_configs" / "alerts"
RULES = ALERTS / "slurm-chaos.rules.yml"

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian prometheus) missing"
)

RANK = 'job_id="9",rank="1",host="node2",world_size="2",mode="train"'


def promtool_test(tmp_path: Path, tests: list[dict[str, object]]) -> subprocess.CompletedProcess[str]:
    spec = {"rule_files": [str(RULES)], "evaluation_interval": "2s", "tests": tests}
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )


def test_rules_are_valid() -> None:
    done = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    names = {r.get("alert") for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    for name in ("ChaosStepTimeRegression", "ChaosStraggler", "ChaosCheckpointFailing", "ChaosNumaMismatch"):
        assert name in names
    assert {"ChaosGpuXid", "ChaosGpuThrottle"} <= names
    assert {"ChaosExporterDown", "ChaosExporterRejectedInput"} <= names


@pytest.mark.skipif(shutil.which("amtool") is None, reason="amtool missing")
def test_alertmanager_config_is_valid() -> None:
    done = subprocess.run(
        ["amtool", "check-config", str(ALERTS / "alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


README = ALERTS.parents[1] / "README.md"


def _rules() -> dict[str, dict[str, Any]]:
    return {
        r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r
    }


def _alert(name: str, labels: dict[str, str], summary: str) -> dict[str, object]:
    """The alert promtool must see: `labels`, `summary`, and the rule's own description and runbook."""
    return {"exp_labels": labels, "exp_annotations": _rules()[name]["annotations"] | {"summary": summary}}


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^a-z0-9 _-]", "", text).replace(" ", "-")


def test_every_alert_says_what_it_means_and_links_its_runbook() -> None:
    readme = README.read_text()
    runbooks = readme[readme.index("\n## Runbooks\n") :]
    runbooks = runbooks[: runbooks.index("\n## ", 1)]
    anchors = {_anchor(line) for line in runbooks.splitlines() if line.startswith("#### ")}
    rules = _rules()
    assert len(rules) >= 9
    for name, rule in rules.items():
        annotations = rule["annotations"]
        assert len(annotations.get("description", "")) > 40, name
        url = annotations["runbook_url"]
        assert url == f"README.md#{_anchor(name)}" and _anchor(name) in anchors, name
    # No runbook for an alert that is gone.
    assert anchors == {_anchor(name) for name in rules}


def test_exporter_down_or_failing_fires(tmp_path: Path) -> None:
    up = 'up{job="slurm-chaos",instance="127.0.0.1:17015"}'
    labels = {
        "severity": "critical",
        "signal": "exporter",
        "job": "slurm-chaos",
        "instance": "127.0.0.1:17015",
    }
    summary = "the slurm-chaos exporter 127.0.0.1:17015 is down or failing: the slurm-chaos alerts are blind"
    never = {"severity": "critical", "signal": "exporter", "job": "slurm-chaos"}
    never_summary = "the slurm-chaos exporter  is down or failing: the slurm-chaos alerts are blind"
    done = promtool_test(
        tmp_path,
        [
            {
                "interval": "2s",
                # Up, then its scrapes fail from 4 s (a crash, or a scrape that raises: up is 0 either way).
                "input_series": [{"series": up, "values": "1 1 0x10"}],
                "alert_rule_test": [
                    {"eval_time": "2s", "alertname": "ChaosExporterDown", "exp_alerts": []},
                    {
                        "eval_time": "16s",
                        "alertname": "ChaosExporterDown",
                        "exp_alerts": [_alert("ChaosExporterDown", labels, summary)],
                    },
                ],
            },
            {
                "interval": "2s",
                "input_series": [{"series": 'up{job="node"}', "values": "1x10"}],
                "alert_rule_test": [
                    {
                        "eval_time": "12s",
                        "alertname": "ChaosExporterDown",
                        "exp_alerts": [_alert("ChaosExporterDown", never, never_summary)],
                    }
                ],
            },
        ],
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_rejected_input_files_warn(tmp_path: Path) -> None:
    series = 'slurm_chaos_exporter_rejected_files_total{instance="e:1",job="slurm-chaos",kind="heartbeat"}'
    labels = {"severity": "warning", "signal": "exporter", "instance": "e:1", "kind": "heartbeat"}
    summary = "the slurm-chaos exporter e:1 skips heartbeat files: malformed or not trusted"
    done = promtool_test(
        tmp_path,
        [
            {
                "interval": "2s",
                # Nothing rejected for 20 s; then one file on every scrape (the counter counts reads) for
                # 40 s; then none: the counter stays where it is and the alert resolves.
                "input_series": [{"series": series, "values": "0x10 1+1x20 21x40"}],
                "alert_rule_test": [
                    {"eval_time": "20s", "alertname": "ChaosExporterRejectedInput", "exp_alerts": []},
                    {"eval_time": "40s", "alertname": "ChaosExporterRejectedInput", "exp_alerts": []},
                    {
                        "eval_time": "60s",
                        "alertname": "ChaosExporterRejectedInput",
                        "exp_alerts": [_alert("ChaosExporterRejectedInput", labels, summary)],
                    },
                    {"eval_time": "130s", "alertname": "ChaosExporterRejectedInput", "exp_alerts": []},
                ],
            }
        ],
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_straggler_fires_after_its_for_duration_and_resolves(tmp_path: Path) -> None:
    labels = {"severity": "critical", "signal": "straggler", "job_id": "9", "rank": "1", "host": "node2"}
    labels |= {"world_size": "2", "mode": "train"}
    summary = "job 9 rank 1 on node2 is 2.00x slower than its peers"
    done = promtool_test(
        tmp_path,
        [
            {
                "interval": "2s",
                "input_series": [
                    # Slow from 4 s to 14 s, then healthy again.
                    {
                        "series": f"slurm_chaos_probe_straggler_ratio{{{RANK}}}",
                        "values": "1 1 2 2 2 2 2 2 1 1 1 1",
                    },
                    {
                        "series": f"slurm_chaos_probe_compute_seconds{{{RANK}}}",
                        "values": "0.1 0.1 0.2x6 0.1x4",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "6s", "alertname": "ChaosStraggler", "exp_alerts": []},
                    {
                        "eval_time": "8s",
                        "alertname": "ChaosStraggler",
                        "exp_alerts": [_alert("ChaosStraggler", labels, summary)],
                    },
                    {"eval_time": "18s", "alertname": "ChaosStraggler", "exp_alerts": []},
                ],
            }
        ],
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_straggler_needs_a_real_time_difference(tmp_path: Path) -> None:
    done = promtool_test(
        tmp_path,
        [
            {
                "interval": "2s",
                "input_series": [
                    {"series": f"slurm_chaos_probe_straggler_ratio{{{RANK}}}", "values": "2x10"},
                    {"series": f"slurm_chaos_probe_compute_seconds{{{RANK}}}", "values": "0.001x10"},
                ],
                "alert_rule_test": [{"eval_time": "16s", "alertname": "ChaosStraggler", "exp_alerts": []}],
            }
        ],
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_step_time_regression_against_the_best_job_of_the_same_size(tmp_path: Path) -> None:
    base = 'job_id="1",rank="0",host="node1",world_size="2",mode="train"'
    slow = 'job_id="2",rank="0",host="node3",world_size="2",mode="train"'
    bigger = 'job_id="3",rank="0",host="node3",world_size="4",mode="train"'
    allreduce = 'job_id="4",rank="0",host="node4",world_size="2",mode="allreduce"'
    labels = {"severity": "warning", "signal": "straggler", "job_id": "2", "world_size": "2", "mode": "train"}
    done = promtool_test(
        tmp_path,
        [
            {
                "interval": "2s",
                "input_series": [
                    {"series": f"slurm_chaos_probe_step_seconds{{{base}}}", "values": "0.1x5 _x20"},
                    {"series": f"slurm_chaos_probe_step_seconds{{{slow}}}", "values": "_x5 0.2x20"},
                    # Neither a bigger job nor one timing allreduces alone is compared with them.
                    {"series": f"slurm_chaos_probe_step_seconds{{{bigger}}}", "values": "0.5x25"},
                    {"series": f"slurm_chaos_probe_step_seconds{{{allreduce}}}", "values": "0.01x25"},
                ],
                "alert_rule_test": [
                    {"eval_time": "8s", "alertname": "ChaosStepTimeRegression", "exp_alerts": []},
                    {"eval_time": "14s", "alertname": "ChaosStepTimeRegression", "exp_alerts": []},
                    {
                        "eval_time": "20s",
                        "alertname": "ChaosStepTimeRegression",
                        "exp_alerts": [
                            _alert(
                                "ChaosStepTimeRegression",
                                labels,
                                "job 2: step time 200ms, over 1.5x the best of its size",
                            )
                        ],
                    },
                ],
            }
        ],
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_checkpoint_numa_and_gpu_alerts_from_probe_and_health_check(tmp_path: Path) -> None:
    hc = 'node="node3",instance="e",job="slurm-chaos"'
    done = promtool_test(
        tmp_path,
        [
            {
                "interval": "2s",
                "input_series": [
                    {
                        # dcgm-exporter's name for the node stays on the alert, for a site's routing.
                        "series": f'slurm_chaos_probe_checkpoint_failures_total{{{RANK},Hostname="node2"}}',
                        "values": "0 0 1 1 1 1",
                    },
                    {"series": f'slurm_chaos_health_check_ok{{check="numa",{hc}}}', "values": "1 0 0 0 0 0"},
                    {
                        "series": f'slurm_chaos_health_check_ok{{check="gpu_xid",{hc}}}',
                        "values": "1 1 0 0 0 0",
                    },
                    {"series": f'slurm_chaos_health_check_ok{{check="gpu_throttle",{hc}}}', "values": "1x5"},
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "6s",
                        "alertname": "ChaosCheckpointFailing",
                        "exp_alerts": [
                            _alert(
                                "ChaosCheckpointFailing",
                                {
                                    "severity": "critical",
                                    "signal": "checkpoint",
                                    "job_id": "9",
                                    "host": "node2",
                                    "Hostname": "node2",
                                },
                                "checkpoint writes failing (job 9, node node2)",
                            )
                        ],
                    },
                    {
                        "eval_time": "6s",
                        "alertname": "ChaosNumaMismatch",
                        "exp_alerts": [
                            _alert(
                                "ChaosNumaMismatch",
                                {"severity": "warning", "signal": "numa", "check": "numa"} | _hc_labels(),
                                "ranks bound away from their GPU's NUMA node or squeezed (node node3)",
                            )
                        ],
                    },
                    {
                        "eval_time": "6s",
                        "alertname": "ChaosGpuXid",
                        "exp_alerts": [
                            _alert(
                                "ChaosGpuXid",
                                {"severity": "critical", "signal": "gpu_xid", "check": "gpu_xid"}
                                | _hc_labels(),
                                "GPU Xid error or missing GPU on node3",
                            )
                        ],
                    },
                    {"eval_time": "8s", "alertname": "ChaosGpuThrottle", "exp_alerts": []},
                ],
            }
        ],
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _hc_labels() -> dict[str, str]:
    return {"node": "node3", "instance": "e", "job": "slurm-chaos"}
