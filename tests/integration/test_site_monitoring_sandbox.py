"""The site's monitoring judged on the sandbox (#12): real LBNL NHC as the nodes' HealthCheckProgram,
a maintenance-window silence on every alert, and an alert about a node the job does not hold.

Each test runs one experiment through the CLI, as an administrator would (about 1-2 minutes each
here). NHC comes from ../shared/thirdparty/lbnl-nhc (not shipped): without it the NHC test skips.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sandbox_cli import cli, reinstall_plugin

from slurm_chaos.experiment import load_experiment
from slurm_chaos.sandbox import nhc
from slurm_chaos.sandbox.cluster import Sandbox
from slurm_chaos.sandbox.layout import Layout

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _nodes(env: dict[str, str]) -> dict[str, tuple[str, str]]:
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N|%T|%E"], env=env, capture_output=True, text=True, timeout=30
    ).stdout
    return {n: (s, r) for n, s, r in (line.split("|", 2) for line in out.splitlines())}


def _wait_nhc_resumed(env: dict[str, str], timeout: float = 90) -> dict[str, tuple[str, str]]:
    """Until no node is drained by NHC (it resumes what it drained once its checks pass)."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = _nodes(env)
        if not any(r.startswith("NHC:") for _, r in nodes.values()) or time.monotonic() > deadline:
            return nodes
        time.sleep(1)


def _observations(out: Path, name: str) -> list[dict[str, Any]]:
    data = json.loads((out / "experiments" / name / "observations.json").read_text())
    obs = data["observations"] if isinstance(data, dict) else data
    assert isinstance(obs, list)
    return obs


# ---------------------------------------------------------------- NHC as the HealthCheckProgram


@pytest.mark.skipif(nhc.nhc_source() is None, reason="LBNL NHC not found at ../shared/thirdparty/lbnl-nhc")
def test_nhc_as_the_health_check_program_detects_a_full_checkpoint_volume(
    sandbox: Any, chaos_site: Path, tmp_path: Path
) -> None:
    layout = Layout.load(sandbox.name)
    assert layout is not None
    sb = Sandbox(sandbox.name)
    site = REPO / "site_configs" / "sandbox-nhc.yaml"
    out = tmp_path / "nhc"
    states = layout.root / "health"
    sb.set_health(layout, "nhc")
    try:
        assert nhc.health_mode(layout) == "nhc"
        # NHC's checks pass on healthy nodes: nobody is drained by it before the fault.
        time.sleep(12)  # two HealthCheckIntervals
        before = _nodes(sandbox.env)
        assert not any(r.startswith("NHC:") for _, r in before.values()), before
        ours_before = {p.name: p.stat().st_mtime for p in states.glob("*.json")}
        t0 = time.monotonic()
        res = cli("run", "--site", str(site), "checkpoint-full", "--out", str(out), "-q", env=sandbox.env)
        took = time.monotonic() - t0
        # NHC resumes the node it drained once the volume is gone (the job's epilog unmounts it).
        after = _wait_nhc_resumed(sandbox.env)
    finally:
        sb.set_health(layout, "slurm-chaos")
        for node, (_, reason) in _nodes(sandbox.env).items():
            if reason.startswith("NHC:"):  # spoil no later test: nothing resumes it from now on
                subprocess.run(
                    ["scontrol", "update", f"nodename={node}", "state=resume"], env=sandbox.env, timeout=30
                )
        reinstall_plugin(sandbox, chaos_site)
    print(f"\ncheckpoint-full on NHC: {took:.0f} s")
    assert res.returncode == 0, res.stdout + res.stderr
    (entry,) = json.loads((out / "report.json").read_text())["experiments"]
    assert entry["verdict"] == "PASSED", entry["reason"]
    assert entry["detected_by"] == "nhc", entry
    assert entry["reason"].startswith("detected by nhc after "), entry["reason"]
    found = {(d["detector"], d["signal"]) for d in entry["detections"]}
    assert ("nhc", "checkpoint") in found, entry["detections"]
    by_nhc = [o for o in _observations(out, "checkpoint-full") if o["signal"] == "detector:nhc"]
    assert by_nhc, _observations(out, "checkpoint-full")
    # NHC's own check, on the job's checkpoint volume, in the reason NHC's helper gave Slurm.
    assert any(": NHC: check_fs_free: " in o["detail"] and "/checkpoints/" in o["detail"] for o in by_nhc)
    # slurm-chaos's own health check did not run (switched off: it neither drained nor checked).
    assert not any(o["signal"] == "healthcheck_drain" for o in _observations(out, "checkpoint-full"))
    assert {p.name: p.stat().st_mtime for p in states.glob("*.json")} == ours_before
    assert not any(r.startswith("NHC:") for _, r in after.values()), after


# ---------------------------------------------------------------- silences and unrelated alerts


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _am(layout: Layout, path: str, body: object | None = None, method: str = "GET") -> Any:
    url = f"http://127.0.0.1:{layout.alertmanager_port}{path}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method=method)
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read()
    return json.loads(text) if text else None


def _fault_job_nodes(
    env: dict[str, str], name: str, proc: subprocess.Popen[str], timeout: float
) -> list[str]:
    """The nodes of the experiment's fault job once it runs (expanded by scontrol)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        out = subprocess.run(
            ["squeue", "-h", "-t", "R", "-n", f"chaos-{name}-fault", "-o", "%N"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split()
        if out:
            hosts = subprocess.run(
                ["scontrol", "show", "hostnames", out[0]], env=env, capture_output=True, text=True, timeout=30
            )
            return hosts.stdout.split()
        time.sleep(0.5)
    raise AssertionError(f"the fault job of {name} did not start within {timeout:g} s")


def test_a_silenced_alert_detects_and_an_alert_about_another_node_does_not(
    sandbox: Any, chaos_site: Path, tmp_path: Path
) -> None:
    """slow-rank detected only by the site's alert rules (ChaosStraggler, the sandbox's), all of them
    silenced for a maintenance window; a site alert about a node the job does not hold, posted to
    the same Alertmanager while the fault job runs, is not counted."""
    layout = Layout.load(sandbox.name)
    assert layout is not None
    site = yaml.safe_load(chaos_site.read_text())
    site["monitoring"]["detectors"] = [
        {"name": "chaos-rules", "signals": ["straggler"], "alert": {"alertname": "ChaosStraggler"}},
        {
            "name": "site-node-alerts",
            "signals": ["straggler", "node_health"],
            "alert": {"alertname": "=~Site.+"},
        },
    ]
    site_file = tmp_path / "sandbox-alerts.yaml"
    site_file.write_text(yaml.safe_dump(site))
    exp = yaml.safe_load(load_experiment("slow-rank").path.read_text())
    exp["expect"]["detect"] = ["signal:straggler"]  # no drain, no alert by name: the site's detectors
    exp_file = tmp_path / "slow-rank.yaml"
    exp_file.write_text(yaml.safe_dump(exp))
    now = datetime.now(UTC)
    silence = _am(
        layout,
        "/api/v2/silences",
        {
            "matchers": [{"name": "alertname", "value": ".+", "isRegex": True, "isEqual": True}],
            "startsAt": _iso(now),
            "endsAt": _iso(now + timedelta(hours=1)),
            "createdBy": "slurm-chaos tests",
            "comment": "maintenance window",
        },
        "POST",
    )["silenceID"]
    out = tmp_path / "silenced"
    posted: list[dict[str, object]] = []
    t0 = time.monotonic()
    argv = ["run", "--site", str(site_file), str(exp_file), "--out", str(out), "-q"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurm_chaos", *argv],
        env=sandbox.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        held = _fault_job_nodes(sandbox.env, "slow-rank", proc, 300)
        others = [n for n in sandbox.nodes if n not in held]
        assert others, held
        begins = datetime.now(UTC)
        posted = [
            {
                "labels": {"alertname": "SiteNodeUnhealthy", "instance": f"{n}:9100", "severity": "critical"},
                "startsAt": _iso(begins),
                "endsAt": _iso(begins + timedelta(minutes=5)),
            }
            for n in others
        ]
        _am(layout, "/api/v2/alerts", posted, "POST")
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        _am(layout, f"/api/v2/silence/{silence}", method="DELETE")
        if posted:  # resolved now: nothing of this test stays firing
            end = _iso(datetime.now(UTC))
            _am(layout, "/api/v2/alerts", [{**a, "endsAt": end} for a in posted], "POST")
        reinstall_plugin(sandbox, chaos_site)
    print(f"\nslow-rank, silenced: {time.monotonic() - t0:.0f} s")
    assert proc.returncode == 0, stdout + stderr
    (entry,) = json.loads((out / "report.json").read_text())["experiments"]
    assert entry["verdict"] == "PASSED", entry["reason"]
    assert entry["detected_by"] == "chaos-rules", entry
    assert "(silenced)" in entry["reason"], entry["reason"]
    by_rules = [d for d in entry["detections"] if d["detector"] == "chaos-rules"]
    assert by_rules and all(d["silenced"] for d in by_rules), entry["detections"]
    # The alert about the other nodes fired (Alertmanager has it) but is no detection of this job.
    assert not [d for d in entry["detections"] if d["detector"] == "site-node-alerts"], entry["detections"]
    assert not any("SiteNodeUnhealthy" in o["signal"] for o in _observations(out, "slow-rank"))
