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
    Target,
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


def _busbw_experiment(tmp_path: Path, mode: str, floor: str) -> Path:
    p = tmp_path / "x.yaml"
    p.write_text(
        f"name: x\nstrategy: network\ndescription: d\nmode: {mode}\n"
        f"fault: {{spec: 'nccl-degrade:ib=off'}}\nhypothesis: {{min_busbw_gbps: {floor}}}\nexpect: {{}}\n"
    )
    return p


def test_min_busbw_is_kept_for_an_allreduce_experiment_and_reaches_its_expectation(tmp_path: Path) -> None:
    from slurm_chaos.campaign.engine import _expectation

    exp = load_experiment_file(_busbw_experiment(tmp_path, "allreduce", "12.5"))
    assert exp.hypothesis.min_busbw_gbps == 12.5
    assert experiment_json(exp)["hypothesis"]["min_busbw_gbps"] == 12.5
    assert _expectation(exp).min_busbw_gbps == 12.5  # what observations.json hands the verdict


@pytest.mark.parametrize(("mode", "floor"), [("train", "12.5"), ("allreduce", "0"), ("allreduce", "-1")])
def test_min_busbw_needs_an_allreduce_run_and_a_positive_floor(tmp_path: Path, mode: str, floor: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_experiment_file(_busbw_experiment(tmp_path, mode, floor))
    assert exc.value.key == "hypothesis.min_busbw_gbps"
    if mode == "train":
        assert "only an allreduce-mode experiment measures bus bandwidth" in str(exc.value)


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


@pytest.mark.parametrize(("key", "instead"), [("duration_s", "whole fault job"), ("start_after_s", "after=")])
@pytest.mark.parametrize("design", ["switchback", "between-runs"])
def test_the_removed_timing_keys_are_refused_saying_what_to_use(
    tmp_path: Path, key: str, instead: str, design: str
) -> None:
    p = _experiment(tmp_path, "slow-rank:rank=1", design, f", {key}: 30")
    with pytest.raises(ConfigError) as exc:
        load_experiment_file(p)
    assert (exc.value.path, exc.value.key) == (str(p), f"fault.{key}")
    assert instead in exc.value.problem and exc.value.exit_code == 2


def test_an_experiment_json_has_no_removed_timing_keys() -> None:
    data = experiment_json(load_experiment("slow-rank"))
    assert "duration_s" not in data and "start_after_s" not in data
    assert data["target"] == {"rank": 1, "node": None, "switch": None}


def test_the_schema_no_longer_knows_the_removed_keys() -> None:
    from slurm_chaos.experiment import REMOVED_FAULT_KEYS

    fault = json.loads(SCHEMA_PATH.read_text())["properties"]["fault"]["properties"]
    assert not set(REMOVED_FAULT_KEYS) & set(fault)


# --- fault.target: written into the SPEC, never contradicting it -------------------------------


def _targeted(tmp_path: Path, spec: str | None, target: str) -> Path:
    return _experiment(tmp_path, spec, "between-runs", f", target: {{{target}}}")


@pytest.mark.parametrize(
    ("spec", "target", "written"),
    [
        ("slow-rank:percent=60", "rank: 1", "slow-rank:rank=1,percent=60"),
        ("slow-rank:rank=1,percent=60", "rank: 1", "slow-rank:rank=1,percent=60"),  # agrees: as written
        ("slow-node", "node: 1", "slow-node:node=1"),
        ("rack-loss:at_step=60", "switch: sw2", "rack-loss:switch=sw2,at_step=60"),
        # every fault with the key gets it; the others are left as written
        ("netem:delay=4ms+slow-node:percent=30", "node: 1", "netem:delay=4ms+slow-node:node=1,percent=30"),
        ("slow-node+node-drain:at_step=60", "node: 1", "slow-node:node=1+node-drain:at_step=60,node=1"),
        (
            "ckpt-eio:path=${checkpoint_dir}+slow-rank",
            "rank: 3",
            "ckpt-eio:path=${checkpoint_dir}+slow-rank:rank=3",
        ),
    ],
)
def test_the_target_is_written_into_the_spec(tmp_path: Path, spec: str, target: str, written: str) -> None:
    exp = load_experiment_file(_targeted(tmp_path, spec, target))
    assert exp.fault.spec == written
    site = load_site(DATA / "sites" / "golden.yaml")
    rendered = fault_spec(site, exp, "fault", "r1")
    assert rendered is not None and parse_spec(rendered)
    assert experiment_json(exp)["spec"] == written


def test_a_switchback_target_rank_is_the_specs_and_the_schedules(tmp_path: Path) -> None:
    exp = load_experiment_file(
        _experiment(tmp_path, "slow-rank:percent=60", "switchback", ", target: {rank: 1}")
    )
    site = load_site(DATA / "sites" / "golden.yaml")
    assert fault_spec(site, exp, "fault", "r1") == "slow-rank:rank=1,percent=60,control=switchback"
    schedule = fault_schedule(site, exp, "r1")
    assert schedule is not None and schedule.affected_ranks == (1,)


@pytest.mark.parametrize(
    ("spec", "target", "key", "said"),
    [
        ("slow-rank:rank=1", "rank: 2", "rank", "slow-rank:rank=1"),
        ("slow-node:node=0", "node: 1", "node", "slow-node:node=0"),
        ("rack-loss:switch=sw1", "switch: sw2", "switch", "rack-loss:switch=sw1"),
        ("noisy-neighbour:cpus=1+node-drain:after=4s,node=1", "node: 0", "node", "node-drain:node=1"),
    ],
)
def test_a_spec_that_contradicts_the_target_is_refused(
    tmp_path: Path, spec: str, target: str, key: str, said: str
) -> None:
    p = _targeted(tmp_path, spec, target)
    with pytest.raises(ConfigError) as exc:
        load_experiment_file(p)
    assert (exc.value.path, exc.value.key) == (str(p), f"fault.target.{key}")
    assert said in exc.value.problem and str(p) in str(exc.value)


@pytest.mark.parametrize(
    ("spec", "target", "key"),
    [
        ("netem:delay=4ms,rate=4M", "node: 0", "node"),  # netem acts on every node of the job
        ("numa-mismatch", "rank: 1", "rank"),  # and numa-mismatch on every task
        ("noisy-neighbour:cpus=1", "node: 0", "node"),
        ("slow-node", "rank: 1", "rank"),
        ("slow-rank", "switch: sw1", "switch"),
    ],
)
def test_a_target_no_fault_of_the_spec_has_is_refused(
    tmp_path: Path, spec: str, target: str, key: str
) -> None:
    p = _targeted(tmp_path, spec, target)
    with pytest.raises(ConfigError) as exc:
        load_experiment_file(p)
    assert (exc.value.path, exc.value.key) == (str(p), f"fault.target.{key}")
    assert f"no fault of the SPEC {spec!r} has a {key!r} key" in exc.value.problem


def test_a_target_on_a_control_or_out_of_range_is_refused(tmp_path: Path) -> None:
    p = _targeted(tmp_path, None, "node: 0")
    with pytest.raises(ConfigError) as exc:
        load_experiment_file(p)
    assert exc.value.key == "fault.target.node" and "control" in exc.value.problem
    p = _targeted(tmp_path, "slow-node", "node: 70000")  # the catalogue's max is 65535
    with pytest.raises(ConfigError) as exc:
        load_experiment_file(p)
    assert exc.value.key == "fault.target.node"


def test_a_bad_spec_under_a_target_names_fault_spec(tmp_path: Path) -> None:
    p = _targeted(tmp_path, "slow-rank:rank=x", "rank: 1")
    with pytest.raises(ConfigError) as exc:
        load_experiment_file(p)
    assert exc.value.key == "fault.spec"


def test_the_cli_exits_2_naming_file_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from slurm_chaos.cli import main

    p = _targeted(tmp_path, "netem:delay=4ms", "node: 0")
    site = DATA / "sites" / "golden.yaml"
    code = main(["render", "--site", str(site), "--experiment", str(p), "--out", str(tmp_path / "out")])
    assert code == 2
    assert f"{p}: fault.target.node:" in capsys.readouterr().err


def test_shipped_targets_agree_with_their_specs() -> None:
    for name, path in available().items():
        exp = load_experiment_file(path)
        spec = exp.fault.spec or ""
        t = exp.fault.target
        if t.rank is not None:
            assert f"rank={t.rank}" in spec, name
        if t.node is not None:
            assert f"node={t.node}" in spec, name
    for name in ("network-degradation", "numa-mismatch", "noisy-neighbour"):  # every node or task
        assert load_experiment(name).fault.target == Target(), name


def test_an_unknown_design_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_experiment_file(_experiment(tmp_path, "slow-rank:rank=1", "alternating"))
    assert exc.value.key == "design" and "switchback" in exc.value.problem


def test_the_design_enum_is_the_schemas() -> None:
    props = json.loads(SCHEMA_PATH.read_text())["properties"]
    assert props["design"]["enum"] == [d.value for d in Design] + list(NOT_YET_AVAILABLE)
