"""The command line: bad input exits 2 with a message naming the file and key, and changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

DATA = Path(__file__).resolve().parents[1] / "data"


def _cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurm_chaos", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=env,
    )


def _site(tmp_path: Path, mutate) -> Path:  # type: ignore[no-untyped-def]
    data = yaml.safe_load((DATA / "sites" / "golden.yaml").read_text())
    mutate(data)
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["slurm"].update(partition="gpu"), "slurm.partition: unknown partition 'gpu'"),
        (lambda d: d["nodes"].update(cpus="many"), "nodes.cpus: expected integer"),
        (lambda d: d["safety"].update(maxnodes=3), "safety.maxnodes: unknown key"),
    ],
)
def test_bad_site_exits_2_naming_the_key_and_writes_nothing(tmp_path: Path, mutate, expected: str) -> None:  # type: ignore[no-untyped-def]
    site = _site(tmp_path, mutate)
    out = tmp_path / "out"
    res = _cli("render", "--site", str(site), "--experiment", "numa-mismatch", "--out", str(out))
    assert res.returncode == 2
    assert f"{site}: {expected}" in res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists()


def test_malformed_yaml_exits_2(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("cluster: [x\n")
    res = _cli("campaign", "--site", str(site), "--dry-run")
    assert res.returncode == 2
    assert "malformed YAML" in res.stderr and str(site) in res.stderr


def test_unknown_experiment_exits_2(tmp_path: Path) -> None:
    res = _cli(
        "render",
        "--site",
        str(DATA / "sites" / "golden.yaml"),
        "--experiment",
        "nope",
        "--out",
        str(tmp_path),
    )
    assert res.returncode == 2
    assert "unknown experiment 'nope'" in res.stderr


def test_bad_option_exits_2() -> None:
    res = _cli("campaign", "--site")
    assert res.returncode == 2
    assert "--site" in res.stderr


def test_slurm_failure_exits_3_not_as_a_finding(tmp_path: Path) -> None:
    # No Slurm client tools on PATH: the tool cannot do its work, which is neither a finding nor bad input.
    env = {**os.environ, "PATH": str(tmp_path)}
    res = _cli("site", "init", env=env)
    assert res.returncode == 3, res.stderr
    assert "sinfo: command not found" in res.stderr and "Traceback" not in res.stderr


def test_dry_run_prints_the_plan_and_submits_nothing(tmp_path: Path) -> None:
    res = _cli("campaign", "--site", str(DATA / "sites" / "golden.yaml"), "--dry-run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "control-aa" in res.stdout and "rack-loss" in res.stdout
    assert not (tmp_path / "runs").exists()


def test_report_of_a_missing_run_is_a_clear_error(tmp_path: Path) -> None:
    res = _cli("report", str(tmp_path / "nothing"))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr


def test_help_lists_every_command() -> None:
    res = _cli("--help")
    for cmd in (
        "sandbox",
        "site",
        "render",
        "run",
        "campaign",
        "status",
        "compare",
        "report",
        "faults",
        "rank-nodes",
        "plugin",
        "experiments",
    ):
        assert cmd in res.stdout
