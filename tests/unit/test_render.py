"""Rendering: golden files for every role, and refusals that change nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_chaos.errors import UsageError
from slurm_chaos.experiment import Design, Experiment, Fault, load_experiment
from slurm_chaos.faults.spec import canonical_spec
from slurm_chaos.render import (
    SWITCHBACK_STEPS,
    fault_schedule,
    fault_spec,
    render_experiment,
    render_job,
    switchback_seed,
    unknown_features,
)
from slurm_chaos.schedule import schedule_from_json
from slurm_chaos.site import load_site

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDEN = DATA / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


SWITCHBACK = DATA / "experiments" / "slow-rank-switchback.yaml"
BETWEEN = DATA / "experiments" / "slow-rank-between-runs.yaml"


@pytest.mark.parametrize(
    ("experiment", "role"),
    [
        ("numa-mismatch", "baseline"),
        ("numa-mismatch", "fault"),
        ("control-aa", "baseline"),
        ("control-aa", "fault"),
        (str(SWITCHBACK), "fault"),
    ],
)
def test_render_matches_golden(experiment: str, role: str) -> None:
    site = load_site(DATA / "sites" / "golden.yaml")
    exp = load_experiment(experiment)
    text = render_job(site, exp, role, Path("/runs/r1") / exp.name / role, "r1")
    golden = GOLDEN / f"{exp.name}.{role}.sbatch"
    if UPDATE:
        golden.write_text(text)
    assert text == golden.read_text()


def test_a_switchback_fault_job_follows_its_schedule(tmp_path: Path) -> None:
    """control=switchback on the fault (canonical SPEC), the schedule and the control root for
    the probe, and at least the schedule's steps."""
    site = load_site(DATA / "sites" / "golden.yaml")
    exp = load_experiment(str(SWITCHBACK))
    assert exp.design is Design.SWITCHBACK
    text = render_job(site, exp, "fault", Path("/r/fault"), "r1")
    spec = "slow-rank:rank=1,percent=60,control=switchback"
    assert f"#SBATCH --chaos={spec}\n" in text and spec == canonical_spec(spec)
    assert fault_spec(site, exp, "fault", "r1") == spec  # what observations.json records
    assert (
        "  --fault-schedule /r/fault/schedule.json \\\n  --fault-control /var/lib/slurm-chaos/journal\n"
        in text
    )
    schedule = fault_schedule(site, exp, "r1")
    assert schedule is not None and schedule.seed == switchback_seed("r1", exp.name)
    assert schedule.affected_ranks == (1,) and not schedule.placebo
    steps = int(text.split("--steps ")[1].split()[0])
    assert steps >= schedule.end_step and steps == max(site.probe.steps, SWITCHBACK_STEPS)
    # A between-runs job of the same fault has neither.
    between = render_job(site, load_experiment(str(BETWEEN)), "fault", Path("/r/fault"), "r1")
    assert "--fault-schedule" not in between and "control=" not in between
    script = tmp_path / "fault.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0


def test_the_schedule_is_drawn_from_the_run_and_the_experiment() -> None:
    site = load_site(DATA / "sites" / "golden.yaml")
    exp = load_experiment(str(SWITCHBACK))
    assert fault_schedule(site, exp, "r1") == fault_schedule(site, exp, "r1")
    assert switchback_seed("r1", exp.name) != switchback_seed("r2", exp.name)
    assert switchback_seed("r1", exp.name) != switchback_seed("r1", "other")
    assert fault_schedule(site, load_experiment(str(BETWEEN)), "r1") is None


def test_a_switchback_placebo_has_a_schedule_and_no_fault(tmp_path: Path) -> None:
    site = load_site(DATA / "sites" / "golden.yaml")
    exp = replace(load_experiment("control-aa"), design=Design.SWITCHBACK)
    text = render_job(site, exp, "fault", tmp_path / "fault", "r1")
    assert "--chaos" not in text and "SLURM_CHAOS_FAULT" not in text
    assert f"--fault-schedule {tmp_path}/fault/schedule.json\n" in text and "--fault-control" not in text


def test_a_dry_run_of_a_switchback_experiment_writes_its_schedule_and_no_baseline(tmp_path: Path) -> None:
    site = load_site(DATA / "sites" / "golden.yaml")
    exp = load_experiment(str(SWITCHBACK))
    (job,) = render_experiment(site, exp, tmp_path, "r1")
    assert job.role == "fault" and not (tmp_path / "baseline.sbatch").exists()
    schedule = fault_schedule(site, exp, "r1")
    assert schedule is not None
    assert schedule_from_json(json.loads((tmp_path / "fault" / "schedule.json").read_text())) == schedule


def test_a_switchback_experiment_too_short_for_the_test_is_refused(tmp_path: Path) -> None:
    site = load_site(DATA / "sites" / "golden.yaml")
    short = replace(load_experiment(str(SWITCHBACK)), steps=200)
    with pytest.raises(UsageError, match="design switchback needs at least 270 steps"):
        render_experiment(site, short, tmp_path / "out", "r1")
    assert not (tmp_path / "out").exists()


def test_fault_script_carries_the_chaos_option_and_baseline_does_not() -> None:
    site = load_site(DATA / "sites" / "golden.yaml")
    exp = load_experiment("numa-mismatch")
    fault = render_job(site, exp, "fault", Path("/r"), "r1")
    base = render_job(site, exp, "baseline", Path("/r"), "r1")
    assert "#SBATCH --chaos=numa-mismatch\n" in fault
    assert "--chaos" not in base
    # Apart from the fault's lines and its hold (it trains on until the campaign has seen the
    # expected detection), the two jobs are the same job.
    assert "  --hold-file /r/release \\\n  --hold-max-s 150\n" in fault and "--hold" not in base
    fault = fault.replace(" \\\n  --hold-file /r/release \\\n  --hold-max-s 150", "")
    strip = [ln for ln in fault.splitlines() if "chaos=" not in ln and "SLURM_CHAOS_FAULT" not in ln]
    strip = [ln.replace("fault", "baseline") for ln in strip if "applies the fault" not in ln]
    assert [ln for ln in strip if ln] == [ln for ln in base.splitlines() if ln]


def test_only_a_fault_job_that_waits_for_something_holds() -> None:
    """A control, or an experiment that expects no detection and no remediation, ends after its
    steps; one that waits for a detection holds at most its deadlines plus a margin."""
    site = load_site(DATA / "sites" / "golden.yaml")
    assert "--hold" not in render_job(site, load_experiment("control-aa"), "fault", Path("/r"), "r1")
    drain = load_experiment("node-drain-requeue")
    assert drain.hold_limit_s == 120 + 30  # remediate_within_s + margin
    assert "--hold-max-s 150" in render_job(site, drain, "fault", Path("/r"), "r1")


def test_rendered_scripts_are_valid_bash(tmp_path: Path) -> None:
    site = load_site(DATA / "sites" / "golden.yaml")
    for job in render_experiment(site, load_experiment("numa-mismatch"), tmp_path, "r1"):
        assert subprocess.run(["bash", "-n", str(job.script)], check=False).returncode == 0
        assert job.script.stat().st_mode & 0o111


def test_too_many_nodes_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    site = load_site(DATA / "sites" / "golden.yaml")
    exp = load_experiment("numa-mismatch")
    big = Experiment(**{**exp.__dict__, "nodes": 5, "fault": Fault(spec="numa-mismatch")})
    out = tmp_path / "out"
    with pytest.raises(UsageError, match=r"safety\.max_nodes is 4"):
        render_experiment(site, big, out, "r1")
    assert not out.exists()


def test_constraint_must_name_features_the_site_lists(tmp_path: Path) -> None:
    site = load_site(DATA / "sites" / "golden.yaml")
    exp = load_experiment("numa-mismatch")
    typo = Experiment(**{**exp.__dict__, "constraint": "fsat"})
    features = {"fast": ("n01",), "a100": ("n01",)}
    with_features = type(site)(**{**site.__dict__, "features": features})
    with pytest.raises(UsageError, match="names features no node has: fsat"):
        render_experiment(with_features, typo, tmp_path / "out", "r1")
    assert not (tmp_path / "out").exists()
    render_experiment(site, typo, tmp_path / "unchecked", "r1")  # a site without features: not checked


@pytest.mark.parametrize(
    ("constraint", "unknown"),
    [("fast", []), ("fast&a100", []), ("[fast|a100]*2", []), ("fast&h100", ["h100"]), ("", [])],
)
def test_unknown_features(constraint: str, unknown: list[str]) -> None:
    assert unknown_features(constraint, {"fast": (), "a100": ()}) == unknown


def test_a_gpu_fault_job_copies_each_nodes_injection_record(tmp_path: Path) -> None:
    """Before the probe (what the prolog did, for the hold) and after it (for the verdict), one task
    per node copies whether the GPU fault took there (never failing the job)."""
    site = load_site(DATA / "sites" / "golden.yaml")
    text = render_job(site, load_experiment("gpu-ecc"), "fault", Path("/r/gpu-ecc/fault"), "r1")
    before, probe, after = re.split(r"\n(?=srun --kill-on-bad-exit=1)|(?<=--hold-max-s 90)\n", text)
    for part in (before, after):
        assert "--ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=0" in part
        assert "-m slurm_chaos.faults.injection collect" in part
        assert "--journal-root /var/lib/slurm-chaos/journal --out /r/gpu-ecc/fault || true" in part
    assert "injection" not in probe
    assert "injection" not in render_job(site, load_experiment("gpu-ecc"), "baseline", Path("/r"), "r1")
    assert "injection" not in render_job(site, load_experiment("numa-mismatch"), "fault", Path("/r"), "r1")
    script = tmp_path / "fault.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
