"""The experiment library: every file loads, every fault SPEC parses, suites name real experiments."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_chaos.campaign.commands import describe_plan, load_suite
from slurm_chaos.errors import ConfigError, UsageError
from slurm_chaos.experiment import available, load_experiment, load_experiment_file
from slurm_chaos.faults.spec import parse_spec
from slurm_chaos.render import fault_spec
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
    assert "control-aa" in shared and "rack-loss" in shared and "checkpoint-hang" not in shared


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
    import json

    from slurm_chaos.experiment import SCHEMA_PATH, Mode, Remediation, Strategy

    props = json.loads(SCHEMA_PATH.read_text())["properties"]
    assert [s.value for s in Strategy] == props["strategy"]["enum"]
    assert [m.value for m in Mode] == props["mode"]["enum"]
    assert [r.value for r in Remediation] == props["expect"]["properties"]["remediation"]["items"]["enum"]


def test_an_experiment_mode_is_a_mode_the_probe_runs() -> None:
    from slurm_chaos.experiment import Mode
    from slurm_chaos.probe.schema import ProbeMode

    assert [m.value for m in Mode] == [m.value for m in ProbeMode]
