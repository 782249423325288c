"""slurm_chaos.nhc run by the real LBNL NHC: a CRITICAL result fails NHC's check with its reason,
OK passes, an unreadable config fails, and the health check never drains by itself there.

Uses ../shared/thirdparty/lbnl-nhc when present (not shipped with slurm-chaos); skipped otherwise.
NHC runs with its node marking switched off (OFFLINE_NODE=:), so nothing here calls Slurm.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import slurm_chaos.observe

REPO = Path(__file__).resolve().parents[2]
NHC = REPO.parent / "shared" / "thirdparty" / "lbnl-nhc"
CHECK = Path(slurm_chaos.observe.__file__).parent / "slurm_chaos.nhc"

pytestmark = pytest.mark.skipif(
    not (NHC / "nhc").is_file() or shutil.which("bash") is None,
    reason=f"LBNL NHC not found at {NHC} (a third-party tool for tests, not shipped)",
)


def nhc(tmp_path: Path, config: str) -> subprocess.CompletedProcess[str]:
    """NHC with its own checks and ours, one nhc.conf line running slurm-chaos's health check."""
    confdir = tmp_path / "nhc"
    scripts = confdir / "scripts"
    scripts.mkdir(parents=True)
    for script in (NHC / "scripts").glob("*.nhc"):
        (scripts / script.name).symlink_to(script)
    (scripts / CHECK.name).symlink_to(CHECK)
    toml = tmp_path / "health.toml"
    toml.write_text(config)
    healthcheck = f"{sys.executable} -m slurm_chaos.observe.healthcheck"
    (confdir / "nhc.conf").write_text(
        f"* || check_slurm_chaos -t 20 {healthcheck} --config {toml} --node node1\n"
    )
    argv = ["bash", str(NHC / "nhc"), "-D", str(confdir), "-t", "25"]
    argv += ["NHC_RM=slurm", "MARK_OFFLINE=0", "ONLINE_NODE=:", "OFFLINE_NODE=:", "LOGFILE=-"]
    argv += [f"RESULTFILE={tmp_path / 'nhc.status'}", "HOSTNAME=node1"]
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "PYTHONPATH": str(REPO)}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)


def checkpoint_config(path: Path, min_free_mb: float) -> str:
    return (
        'signals = ["checkpoint"]\n'
        f'checkpoint_path = "{path}"\n'
        "gpus_per_node = 0\n"
        f"[thresholds]\ncheckpoint_min_free_mb = {min_free_mb}\n"
    )


def test_a_critical_result_fails_nhcs_check_with_its_reason(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    res = nhc(tmp_path, checkpoint_config(ckpt, 1e12))  # no disk has a petabyte free: CRITICAL
    assert res.returncode != 0, res.stdout + res.stderr
    out = res.stdout + res.stderr
    assert "Health check failed:  check_slurm_chaos:  checkpoint: " in out, out
    assert "MiB free" in out, out


def test_an_ok_node_passes(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    res = nhc(tmp_path, checkpoint_config(ckpt, 1))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Health check failed" not in res.stdout + res.stderr


def test_a_broken_config_fails_rather_than_passing_silently(tmp_path: Path) -> None:
    res = nhc(tmp_path, "signals = [\n")  # malformed TOML: the health check cannot run
    assert res.returncode != 0, res.stdout + res.stderr
    assert "check_slurm_chaos" in res.stdout + res.stderr
