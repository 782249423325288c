"""Hardening of what root writes and runs (#27 finding 11).

- ``plugin install`` writes plugstack.conf root's with mode 0644, never the old file's mode;
- ``cleanup --run`` refuses a run directory (or its manifest, or its controller journal) that
  neither the invoking user nor root owns, or that others may write: it would cancel the jobs and
  undo the node actions read there;
- the NHC check runs a Python console script, or a python named on its line, isolated (-I).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import slurm_chaos.observe
from slurm_chaos.campaign.commands import refuse_untrusted_run_dir
from slurm_chaos.cli import main
from slurm_chaos.errors import UsageError
from slurm_chaos.faults.install_root import InstallRoot
from slurm_chaos.faults.plugin_install import update_plugstack
from slurm_chaos.rundir import CONTROLLER_JOURNAL, MANIFEST

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "site_configs" / "h100-ib-example.yaml"
NHC_CHECK = Path(slurm_chaos.observe.__file__).parent / "slurm_chaos.nhc"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="ownership: only root can give a file to a user")
USER = 4242


@root_only
def test_plugstack_conf_is_written_0644_and_roots_whatever_its_old_mode(tmp_path: Path) -> None:
    plugstack = tmp_path / "plugstack.conf"
    plugstack.write_text("required /usr/lib/other.so\n")
    plugstack.chmod(0o666)  # world-writable: anyone could add a plugin slurmstepd loads as root
    os.chown(plugstack, USER, USER)
    assert not update_plugstack(plugstack, "required /usr/local/lib/slurm-chaos/slurm_chaos.so policy=/p")
    st = plugstack.stat()
    assert stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == 0
    assert plugstack.read_text().splitlines() == [
        "required /usr/lib/other.so",
        "required /usr/local/lib/slurm-chaos/slurm_chaos.so policy=/p",
    ]
    # Into an image, the same.
    image = tmp_path / "image"
    (image / "etc/slurm").mkdir(parents=True)
    image.chmod(0o755)
    (image / "etc/slurm/plugstack.conf").write_text("")
    (image / "etc/slurm/plugstack.conf").chmod(0o777)
    update_plugstack(Path("/etc/slurm/plugstack.conf"), "required /x/slurm_chaos.so", InstallRoot.at(image))
    assert stat.S_IMODE((image / "etc/slurm/plugstack.conf").stat().st_mode) == 0o644


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    run.chmod(0o755)
    (run / MANIFEST).write_text("{}")
    (run / CONTROLLER_JOURNAL).write_text("")
    return run


@root_only
@pytest.mark.parametrize(
    ("what", "change", "why"),
    [
        ("", lambda p: os.chown(p, USER, USER), f"is owned by uid {USER}, neither yours (0) nor root's"),
        ("", lambda p: p.chmod(0o777), "is writable by group or others (mode 777)"),
        (MANIFEST, lambda p: os.chown(p, USER, USER), f"is owned by uid {USER}"),
        (CONTROLLER_JOURNAL, lambda p: p.chmod(0o666), "is writable by group or others (mode 666)"),
    ],
)
def test_cleanup_run_refuses_a_run_directory_others_control(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str, change: object, why: str
) -> None:
    run = _run_dir(tmp_path)
    refuse_untrusted_run_dir(run)  # the invoking user's own: read as before
    target = run / what if what else run
    change(target)  # type: ignore[operator]
    with pytest.raises(UsageError, match=re.escape(f"--run: {target} {why}")):
        refuse_untrusted_run_dir(run)
    # The command exits 2 before it reads the run directory or asks Slurm anything.
    assert main(["cleanup", "--site", str(SITE), "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"--run: {target} {why}" in err and "refused" in err


def test_cleanup_run_refuses_a_link_for_the_run_directory_or_its_files(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    elsewhere = tmp_path / "journal"
    elsewhere.write_text("")
    (run / CONTROLLER_JOURNAL).unlink()
    (run / CONTROLLER_JOURNAL).symlink_to(elsewhere)
    with pytest.raises(UsageError, match="is a symlink"):
        refuse_untrusted_run_dir(run)
    (tmp_path / "link").symlink_to(run)
    with pytest.raises(UsageError, match=rf"{tmp_path / 'link'} is a symlink"):
        refuse_untrusted_run_dir(tmp_path / "link")


def _nhc(tmp_path: Path, *command: str) -> str:
    """check_slurm_chaos run by bash with NHC's die and log stubbed: what it reported."""
    script = (
        f'die() {{ echo "DIE $*"; }}; log() {{ echo "LOG $*"; }}; source {NHC_CHECK}; check_slurm_chaos "$@"'
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "planted"), "HOME": str(tmp_path)}
    done = subprocess.run(
        ["bash", "-c", script, "nhc", "-t", "20", *command],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    return done.stdout


def test_nhc_runs_the_console_script_isolated(tmp_path: Path) -> None:
    """A console script's '#!/usr/bin/python3' has no -I: root would honour PYTHONPATH and import a
    planted module from NHC's working directory."""
    (tmp_path / "planted").mkdir()
    for where in (tmp_path / "planted", tmp_path):
        (where / "json.py").write_text("raise SystemExit('planted json imported')\n")
    console = tmp_path / "slurm-chaos-healthcheck"
    console.write_text(
        f"#!{sys.executable}\n"
        "import sys, json\n"
        "print(f'slurm-chaos-health CRITICAL on n1 - probe: isolated={sys.flags.isolated}')\n"
        "sys.exit(2)\n"
    )
    console.chmod(0o755)
    assert "DIE 1 check_slurm_chaos:  probe: isolated=1" in _nhc(tmp_path, str(console), "--config", "x")
    # A python named on the line runs isolated too.
    report = "print(f'slurm-chaos-health CRITICAL on n1 - py: isolated={sys.flags.isolated}')"
    code = f"import sys, json; {report}; sys.exit(2)"
    assert "DIE 1 check_slurm_chaos:  py: isolated=1" in _nhc(tmp_path, sys.executable, "-c", code)
