"""The sandbox's LBNL NHC set-up (`sandbox up --health nhc`), run by the real NHC.

Uses ../shared/thirdparty/lbnl-nhc when present (not shipped with slurm-chaos); skipped otherwise.
NHC runs with its node marking switched off (OFFLINE_NODE=:), so nothing here calls Slurm. The
full checkpoint volume is a real tiny tmpfs, mounted in a mount namespace of the test's own
(root only).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from slurm_chaos.sandbox import nhc
from slurm_chaos.sandbox.layout import Layout

needs_nhc = pytest.mark.skipif(
    nhc.nhc_source() is None or shutil.which("bash") is None,
    reason="LBNL NHC not found at ../shared/thirdparty/lbnl-nhc (a third-party tool for tests, not shipped)",
)


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Layout:
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    lay = Layout("nhct", 7, 2, "host")
    for node in lay.node_names():
        (lay.root / "tmp" / node).mkdir(parents=True)
    (lay.shared_dir / "checkpoints").mkdir(parents=True)
    lay.etc.mkdir(parents=True)
    lay.log_dir.mkdir(parents=True)
    return lay


def run_nhc(lay: Layout, node: str, *, mount_full: Path | None = None) -> subprocess.CompletedProcess[str]:
    """NHC as the wrapper runs it, its marking off; `mount_full`: a full 64 KiB tmpfs mounted there first."""
    d = nhc.nhc_dir(lay)
    argv = [str(d / "sbin" / "nhc"), "-D", str(d / "etc"), "NHC_RM=slurm", "MARK_OFFLINE=0"]
    argv += ["ONLINE_NODE=:", "OFFLINE_NODE=:", "LOGFILE=-", f"RESULTFILE={d / 'run' / node}.status"]
    argv += [f"HOSTNAME={node}"]
    script = 'exec "$@"'
    if mount_full is not None:
        mount_full.mkdir(parents=True, exist_ok=True)
        script = (
            'mount --make-rprivate / && mount -t tmpfs -o size=64k full "$MNT" && '
            'head -c 1M /dev/zero > "$MNT/ballast" 2>/dev/null; exec "$@"'
        )
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "MNT": str(mount_full or "")}
    full = ["unshare", "-m", "bash", "-c", script, "nhc", *argv] if mount_full else argv
    return subprocess.run(full, capture_output=True, text=True, timeout=60, env=env)


@needs_nhc
def test_a_healthy_node_passes_every_check(layout: Layout) -> None:
    nhc.install_nhc(layout)
    conf = nhc.nhc_dir(layout) / "etc" / "nhc.conf"
    conf.write_text(nhc.nhc_conf(layout, layout.shared_dir / "checkpoints", services=()))
    res = run_nhc(layout, "node1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Health check failed" not in res.stdout + res.stderr


@needs_nhc
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="mounts need root")
def test_a_full_checkpoint_volume_fails_nhcs_own_check_fs_free(layout: Layout) -> None:
    nhc.install_nhc(layout)
    conf = nhc.nhc_dir(layout) / "etc" / "nhc.conf"
    conf.write_text(nhc.nhc_conf(layout, layout.shared_dir / "checkpoints", services=()))
    volume = layout.shared_dir / "checkpoints" / "run1" / "checkpoint-full" / "fault"
    res = run_nhc(layout, "node2", mount_full=volume)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    # NHC's own message, which its helper puts after "NHC: " as the node's drain reason.
    assert f"Health check failed:  check_fs_free:  {volume} has only 0% free" in out, out
    assert "minimum is 10%" in out


@needs_nhc
def test_a_node_without_its_own_tmp_directory_fails_its_own_line_only(layout: Layout) -> None:
    nhc.install_nhc(layout)
    conf = nhc.nhc_dir(layout) / "etc" / "nhc.conf"
    conf.write_text(nhc.nhc_conf(layout, layout.shared_dir / "checkpoints", services=()))
    (layout.root / "tmp" / "node2").rmdir()
    assert run_nhc(layout, "node1").returncode == 0
    res = run_nhc(layout, "node2")
    assert res.returncode != 0
    assert "check_file_test" in res.stdout + res.stderr


@needs_nhc
def test_a_missing_service_fails(layout: Layout) -> None:
    nhc.install_nhc(layout)
    conf = nhc.nhc_dir(layout) / "etc" / "nhc.conf"
    conf.write_text(nhc.nhc_conf(layout, layout.shared_dir / "checkpoints", services=("no-such-daemond",)))
    res = run_nhc(layout, "node1")
    assert res.returncode != 0
    assert "check_ps_service:  Service no-such-daemond (process no-such-daemond) not running" in (
        res.stdout + res.stderr
    )


@needs_nhc
def test_the_wrapper_execs_the_installed_nhc_and_the_mode_switches(layout: Layout) -> None:
    (layout.etc / "healthcheck").write_text("#!/bin/bash\n# dispatcher\n")
    assert nhc.health_mode(layout) == "slurm-chaos"
    hook = nhc.write_nhc_wrapper(layout)
    text = hook.read_text()
    assert nhc.health_mode(layout) == "nhc"
    assert os.access(hook, os.X_OK)
    d = nhc.nhc_dir(layout)
    assert f"exec {d / 'sbin' / 'nhc'} -D {d / 'etc'} NHC_RM=slurm HELPERDIR={d / 'helpers'}" in text
    assert f"SLURM_CONF={layout.slurm_conf}" in text
    assert f'RESULTFILE={d / "run"}/"$node".status' in text  # one result file per node
    # Installed into the sandbox's own directory, with NHC's licence, never system-wide.
    assert (d / "LICENSE").is_file() and (d / "helpers" / "node-mark-offline").is_file()
    assert (d / "etc" / "scripts" / "lbnl_fs.nhc").is_file()
    conf = (d / "etc" / "nhc.conf").read_text()
    assert f"check_fs_free_below {layout.shared_dir / 'checkpoints'} 10%" in conf
    assert "* || check_ps_service munged" in conf
    assert f"node2 || check_file_test -d -w {layout.root / 'tmp' / 'node2'}" in conf


@needs_nhc
def test_a_sandbox_switches_between_nhc_and_its_own_health_check(layout: Layout) -> None:
    from slurm_chaos.sandbox.cluster import Sandbox

    sb = Sandbox(layout.name)
    sb.set_health(layout, "nhc")
    assert nhc.health_mode(layout) == "nhc"
    sb.set_health(layout, "slurm-chaos")
    assert nhc.health_mode(layout) == "slurm-chaos"
    text = (layout.etc / "healthcheck").read_text()
    assert f"for hook in {layout.etc / 'healthcheck.d'}/*; do" in text
    assert os.access(layout.etc / "healthcheck", os.X_OK)
    assert not list(layout.etc.glob(".healthcheck*"))  # written whole, then renamed


def test_up_refuses_an_unknown_health_mode(layout: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_chaos.errors import UsageError
    from slurm_chaos.sandbox.cluster import Sandbox

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(UsageError, match="--health nagios: expected one of slurm-chaos, nhc"):
        Sandbox(layout.name).up(install=False, health="nagios")


@needs_nhc
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="a UTS namespace needs root")
def test_the_wrapper_runs_nhc_as_slurmd_would_on_a_node(layout: Layout) -> None:
    """etc/healthcheck run in a UTS namespace named node2 (as a sandbox node's slurmd runs it): NHC
    takes the node's name from it (node2's own config line applies) and logs to the sandbox's log.
    Marking is off (no Slurm)."""
    hook = nhc.write_nhc_wrapper(layout)
    conf = nhc.nhc_dir(layout) / "etc" / "nhc.conf"
    conf.write_text(nhc.nhc_conf(layout, layout.shared_dir / "checkpoints", services=()))
    script = 'hostname "$0" && exec "$@"'
    marks = ["MARK_OFFLINE=0", "ONLINE_NODE=:", "OFFLINE_NODE=:"]

    def on(node: str) -> subprocess.CompletedProcess[str]:
        argv = ["unshare", "-u", "sh", "-c", script, node, str(hook), *marks]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env={})

    (layout.root / "tmp" / "node2").rmdir()  # node2's own line fails; node1's passes
    assert on("node1").returncode == 0
    log = layout.log_dir / "nhc.log"
    assert "Health check failed" not in (log.read_text() if log.exists() else "")
    res = on("node2")
    assert res.returncode != 0, res.stdout + res.stderr
    text = log.read_text()
    assert "ERROR:  nhc:  Health check failed:  check_file_test:  " in text, text
    assert str(layout.root / "tmp" / "node2") in text


def test_the_nhc_site_config_declares_nhc_and_switches_its_own_health_check_off() -> None:
    from slurm_chaos.site import load_site

    values = {k: f"/sb/{k}" for k in ("sandbox_root", "sandbox_shared", "sandbox_slurm_conf", "sandbox_etc")}
    values |= {"prometheus_port": "1", "alertmanager_port": "2", "reservation": "chaos_maint"}
    repo = Path(__file__).resolve().parents[2]
    site = load_site(repo / "site_configs" / "sandbox-nhc.yaml", lambda name: values)
    (det,) = site.monitoring.detectors
    assert (det.name, det.drain_reason) == ("nhc", "^NHC:") and "checkpoint" in det.signals
    assert det.matches_reason("NHC: check_fs_free:  /ckpt has only 0% free (0kB), minimum is 10%")
    assert site.monitoring.healthcheck_signals == ()
    assert (
        site.monitoring.alertmanager is None and site.monitoring.heartbeat_dir == "/sb/sandbox_root/heartbeat"
    )


def test_without_nhc_the_nhc_mode_says_where_it_looks(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_chaos.errors import UsageError

    monkeypatch.setattr(nhc, "nhc_source", lambda: None)
    with pytest.raises(UsageError, match=r"LBNL NHC not found \(put it at ../shared/thirdparty/lbnl-nhc"):
        nhc.write_nhc_wrapper(layout)
    assert not (layout.etc / "healthcheck").exists()  # nothing half-switched
