"""The experiment library: every file loads, every fault SPEC parses, suites name real experiments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_chaos.campaign.commands import describe_plan, load_suite
from slurm_chaos.errors import ConfigError, UsageError
from slurm_chaos.experiment import (
    NOT_YET_AVAILABLE,
    SCHEMA_PATH,
    Design,
    available,
    experiment_json,
    load_experiment,
    load_experiment_file,
    reversible_faults,
    spec_fault_names,
)
from slurm_chaos.faults.spec import parse_spec
from slurm_chaos.render import fault_schedule, fault_spec
from slurm_chaos.site import load_site

DATA = Path(__file__).resolve().parents[1] / "data"
STRATEGIES = {"gpu", "resource", "network", "storage", "numa", "topology", "variability", "node"}


@pytest.mark.parametrize("name", sorted(available()))
def test_library_experiment_loads_and_its_spec_parses(name: str) -> None:
    exp = load_experiment(name)
    site = load_site(DATA / "sites" / "golden.yaml")
    spec = fault_spec(site, exp, "fault", "r1")
    if exp.is_control:
        assert spec is None
    else:
        assert spec is not None and "${" not in spec
        assert parse_spec(spec)


def test_library_covers_every_strategy() -> None:
    strategies = {load_experiment_file(p).strategy for p in available().values()}
    assert STRATEGIES <= strategies


def test_maintenance_suite_covers_the_acceptance_list() -> None:
    names = {e.name for e in load_suite("maintenance")}
    assert {
        "numa-mismatch",
        "network-degradation",
        "checkpoint-enospc",
        "checkpoint-hang",
        "node-drain-requeue",
        "slow-rank",
        "noisy-neighbour",
        "rack-loss",
        "known-slow-node",
        "control-aa",
    } <= names


def test_dry_run_plan_shares_one_baseline_per_job_shape() -> None:
    site = load_site(DATA / "sites" / "golden.yaml")
    plan = describe_plan(site, load_suite("maintenance"))
    baselines = [line for line in plan.splitlines() if line.startswith("baseline ")]
    # checkpoint-hang trains longer (its hang shows only after the checkpoint timeout): its own shape.
    assert len(baselines) == 2, plan
    assert "baseline n2-t2-s600-train: shared by checkpoint-hang" in baselines
    (shared,) = (b for b in baselines if "s300" in b)
    assert "rack-loss" in shared and "checkpoint-hang" not in shared
    # Judged inside their own job, the switchback experiments share no baseline: they have none.
    for name in ("control-aa", "slow-rank", "noisy-neighbour", "network-degradation", "known-slow-node"):
        assert name not in shared, plan


def test_unknown_experiment_and_suite_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="unknown experiment 'nope'"):
        load_experiment("nope")
    with pytest.raises(UsageError, match="unknown suite"):
        load_suite("nope")


def test_bad_experiment_names_the_key(tmp_path: Path) -> None:
    p = tmp_path / "x.yaml"
    p.write_text(
        "name: x\nstrategy: numa\ndescription: d\nfault: {spec: numa-mismatch, when: 3}\nexpect: {}\n"
    )
    with pytest.raises(ConfigError) as exc:
        load_experiment_file(p)
    assert exc.value.key == "fault.when"


def test_the_experiment_enums_are_the_schemas() -> None:
    from slurm_chaos.experiment import SCHEMA_PATH, Mode, Remediation, Strategy

    props = json.loads(SCHEMA_PATH.read_text())["properties"]
    assert [s.value for s in Strategy] == props["strategy"]["enum"]
    assert [m.value for m in Mode] == props["mode"]["enum"]
    assert [r.value for r in Remediation] == props["expect"]["properties"]["remediation"]["items"]["enum"]


def test_an_experiment_mode_is_a_mode_the_probe_runs() -> None:
    from slurm_chaos.experiment import Mode
    from slurm_chaos.probe.schema import ProbeMode

    assert [m.value for m in Mode] == [m.value for m in ProbeMode]


# --- design: switchback (one job, its own control) or between-runs --------------------------

REVERSIBLE = {"slow-rank", "slow-node", "noisy-neighbour", "netem"}


def _experiment(tmp_path: Path, spec: str | None, design: str | None = None, extra: str = "") -> Path:
    p = tmp_path / "x.yaml"
    p.write_text(
        "name: x\nstrategy: resource\ndescription: d\n"
        + (f"design: {design}\n" if design else "")
        + f"fault: {{spec: {json.dumps(spec)}{extra}}}\nexpect: {{}}\n"
    )
    return p


def test_the_reversible_faults_are_the_catalogues_with_a_control_key() -> None:
    assert set(reversible_faults()) == REVERSIBLE


@pytest.mark.parametrize(
    ("spec", "design"),
    [
        ("slow-rank:rank=1,percent=60", Design.SWITCHBACK),
        ("netem:delay=4ms+noisy-neighbour:cpus=1", Design.SWITCHBACK),
        ("netem:delay=4ms+numa-mismatch", Design.BETWEEN_RUNS),  # one irreversible fault
        ("node-drain:at_step=60,node=1", Design.BETWEEN_RUNS),  # a controller fault
        ("gpu-ecc", Design.BETWEEN_RUNS),
        (None, Design.BETWEEN_RUNS),  # an A/A control compares two runs unless it asks otherwise
    ],
)
def test_the_default_design(tmp_path: Path, spec: str | None, design: Design) -> None:
    assert load_experiment_file(_experiment(tmp_path, spec)).design is design


def test_shipped_reversible_experiments_are_judged_inside_their_job() -> None:
    for name, path in available().items():
        exp = load_experiment_file(path)
        reversible = bool(exp.fault.spec) and set(spec_fault_names(exp.fault.spec or "")) <= REVERSIBLE
        if reversible or name == "control-aa":  # the A/A control is a placebo switchback
            assert exp.design is Design.SWITCHBACK, name
        else:
            assert exp.design is Design.BETWEEN_RUNS, name


def test_design_window_is_refused_as_not_available_yet(tmp_path: Path) -> None:
    p = _experiment(tmp_path, "slow-rank:rank=1", "window")
    with pytest.raises(ConfigError) as exc:
        load_experiment_file(p)
    assert (exc.value.path, exc.value.key) == (str(p), "design")
    assert "'window' is not available yet" in str(exc.value) and str(p) in str(exc.value)


def test_switchback_on_an_irreversible_fault_names_the_fault(tmp_path: Path) -> None:
    p = _experiment(tmp_path, "slow-rank:rank=1+numa-mismatch", "switchback")
    with pytest.raises(ConfigError) as exc:
        load_experiment_file(p)
    assert exc.value.key == "design"
    assert "'numa-mismatch' cannot be turned on and off" in exc.value.problem


def test_switchback_without_a_fault_is_a_placebo(tmp_path: Path) -> None:
    exp = load_experiment_file(_experiment(tmp_path, None, "switchback"))
    assert exp.design is Design.SWITCHBACK and exp.is_control
    site = load_site(DATA / "sites" / "golden.yaml")
    schedule = fault_schedule(site, exp, "r1")
    assert schedule is not None and schedule.placebo and schedule.pairs >= 8
    assert experiment_json(exp)["design"] == "switchback"


def test_a_switchback_schedule_decides_when_the_fault_is_on(tmp_path: Path) -> None:
    p = _experiment(tmp_path, "slow-rank:rank=1", "switchback", ", duration_s: 30")
    with pytest.raises(ConfigError) as exc:
        load_experiment_file(p)
    assert exc.value.key == "fault.duration_s"
    # between runs the same keys mean what they meant
    assert load_experiment_file(_experiment(tmp_path, "slow-rank:rank=1", "between-runs", ", duration_s: 30"))


def test_an_unknown_design_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_experiment_file(_experiment(tmp_path, "slow-rank:rank=1", "alternating"))
    assert exc.value.key == "design" and "switchback" in exc.value.problem


def test_the_design_enum_is_the_schemas() -> None:
    props = json.loads(SCHEMA_PATH.read_text())["properties"]
    assert props["design"]["enum"] == [d.value for d in Design] + list(NOT_YET_AVAILABLE)
