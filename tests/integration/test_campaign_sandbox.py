"""Experiments end to end on the sandbox: verdicts backed by numbers, rollback, interruption and resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]


def _cli(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurm_chaos", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def _node_snapshot(env: dict[str, str]) -> str:
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %T %E %f %w"], env=env, capture_output=True, text=True, check=True
    ).stdout
    # "reserved" is "idle" inside the maintenance reservation: a display difference, not a change.
    return "\n".join(sorted(out.replace(" reserved ", " idle ").splitlines()))


def test_numa_mismatch_run_measures_the_regression(sandbox, chaos_site: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    before = _node_snapshot(sandbox.env)
    out = tmp_path / "run"
    res = _cli("run", "--site", str(chaos_site), "numa-mismatch", "--out", str(out), "-q", env=sandbox.env)
    assert res.returncode in (0, 1), res.stderr
    report = json.loads((out / "report.json").read_text())
    (entry,) = report["experiments"]
    assert entry["name"] == "numa-mismatch"
    assert entry["verdict"] in ("PASSED", "BLIND SPOT")
    # Squeezing the ranks onto one CPU slows training measurably, whatever monitoring saw.
    assert entry["regression"] > 0.10
    assert entry["significant"] is True
    assert entry["ci_low"] > 0
    assert _node_snapshot(sandbox.env) == before


def test_interrupted_campaign_rolls_back_and_resumes(sandbox, chaos_site: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    suite = tmp_path / "suite.yaml"
    suite.write_text("name: short\nexperiments: [control-aa, node-drain-requeue]\n")
    out = tmp_path / "camp"
    before = _node_snapshot(sandbox.env)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurm_chaos",
            "campaign",
            "--site",
            str(chaos_site),
            "--suite",
            str(suite),
            "--out",
            str(out),
            "-q",
        ],
        env=sandbox.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Wait until the drain of the second experiment has been injected, then interrupt.
    journal = out / "controller-journal.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (journal.exists() and '"drain"' in journal.read_text()):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    assert journal.exists(), "the drain was never injected"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "rolled back drain" in stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["interrupted"] is True
    assert manifest["completed"] == ["control-aa"]
    # A partial report covers what finished.
    report = json.loads((out / "report.json").read_text())
    assert [e["name"] for e in report["experiments"]] == ["control-aa"]
    time.sleep(2)
    assert _node_snapshot(sandbox.env) == before

    res = _cli(
        "campaign",
        "--site",
        str(chaos_site),
        "--suite",
        str(suite),
        "--resume",
        str(out),
        "-q",
        env=sandbox.env,
    )
    assert res.returncode in (0, 1), res.stderr
    report = json.loads((out / "report.json").read_text())
    assert [e["name"] for e in report["experiments"]] == ["control-aa", "node-drain-requeue"]
    drain = report["experiments"][1]
    assert drain["verdict"] != "NO EFFECT"
    assert _node_snapshot(sandbox.env) == before
