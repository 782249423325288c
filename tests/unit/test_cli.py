"""The command line: bad input exits 2 with a message naming the file and key, and changes nothing."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurm_chaos.analysis.synthetic import JobModel, SyntheticExperiment, write_run_dir
from slurm_chaos.campaign.commands import load_suite
from slurm_chaos.cli import build_parser, main
from slurm_chaos.experiment import available, load_experiment
from slurm_chaos.faults.catalogue import KeyType, load_catalogue
from slurm_chaos.placement import probe_dirs, rank_nodes
from slurm_chaos.rundir import Expectation, read_manifest

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


@pytest.mark.parametrize("up", [False, True])
def test_bad_sandbox_site_names_the_key_whether_or_not_the_sandbox_is_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, up: bool
) -> None:
    """The file's own error, not 'sandbox not up': the schema is checked before the placeholders."""
    from slurm_chaos.sandbox.layout import Layout

    repo = Path(__file__).resolve().parents[2]
    text = (repo / "site_configs" / "sandbox.yaml").read_text()
    site = tmp_path / "bad.yaml"
    site.write_text(text.replace("  partition: debug\n", "  partition: debug\n  partiton: debug\n"))
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX", "chaos" if up else "nosuch")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))
    if up:
        Layout(name="chaos", index=3, nodes=4, controller_host="localhost").save()
    out = tmp_path / "out"
    res = _cli("render", "--site", str(site), "--experiment", "slow-rank", "--out", str(out))
    assert res.returncode == 2, res.stderr
    assert f"{site}: slurm.partiton: unknown key" in res.stderr
    assert "not up" not in res.stderr and "Traceback" not in res.stderr
    assert not out.exists()


def test_render_fills_a_sandbox_sites_placeholders_from_the_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_chaos.sandbox.layout import Layout

    site = Path(__file__).resolve().parents[2] / "site_configs" / "sandbox.yaml"
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX", "sbx")
    out = tmp_path / "out"
    assert main(["render", "--site", str(site), "--experiment", "slow-rank", "--out", str(out)]) == 2
    assert not out.exists()  # sbx is not up
    Layout(name="sbx", index=3, nodes=4, controller_host="localhost").save()
    assert main(["render", "--site", str(site), "--experiment", "slow-rank", "--out", str(out)]) == 0
    assert str(tmp_path / "sandboxes" / "sbx" / "heartbeat") in (out / "fault.sbatch").read_text()


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


# --- --format json: one document, the same data as the text form ------------------------------


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[Any, int]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return json.loads(out), code


def test_experiments_json_is_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    doc, code = _json(capsys, "experiments", "--format", "json")
    assert code == 0
    records = {e["name"]: e for e in doc["experiments"]}
    assert list(records) == sorted(available())
    slow = records["slow-rank"]
    exp = load_experiment("slow-rank")
    assert (slow["strategy"], slow["nodes"], slow["spec"]) == (str(exp.strategy), exp.nodes, exp.fault.spec)
    assert slow["description"] == exp.description and slow["description"]
    assert slow["expect"]["detect"] == list(exp.expect.detect)
    assert slow["expect"]["remediation"] == [str(r) for r in exp.expect.remediation]
    assert records["control-aa"]["spec"] is None and records["control-aa"]["expect"]["regression"] is False
    # The text form lists the same experiments, in the same order.
    main(["experiments"])
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == list(records)


def test_faults_json_is_the_catalogue(capsys: pytest.CaptureFixture[str]) -> None:
    doc, code = _json(capsys, "faults", "--format", "json")
    assert code == 0
    cat = load_catalogue()
    assert doc["version"] == cat.version
    assert [f["name"] for f in doc["faults"]] == list(cat.names())
    for record in doc["faults"]:
        fault = cat.get(record["name"])
        assert fault is not None
        assert record["where"] == fault.where.value and record["description"] == fault.description
        assert [k["name"] for k in record["keys"]] == [k.name for k in fault.keys]
        for k in record["keys"]:
            spec = fault.key(k["name"])
            assert spec is not None
            assert (k["type"], k["default"], k["required"]) == (spec.type.value, spec.default, spec.required)
    netem = next(f for f in doc["faults"] if f["name"] == "netem")
    assert netem["where"] == "node"
    assert all(k["type"] in {t.value for t in KeyType} for f in doc["faults"] for k in f["keys"])


def test_dry_run_json_is_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden = str(DATA / "sites" / "golden.yaml")
    doc, code = _json(capsys, "campaign", "--site", golden, "--dry-run", "--format", "json")
    assert code == 0
    suite = [e.name for e in load_suite("maintenance")]
    assert [e["name"] for e in doc["experiments"]] == suite
    assert doc["site"]["cluster"] == "golden" and doc["site"]["reservation"] == "maint"
    shared = [n for b in doc["baselines"] for n in b["shared_by"]]
    # Every between-runs experiment has a baseline; a switchback one is judged inside its own job.
    between = [e["name"] for e in doc["experiments"] if e["design"] == "between-runs"]
    assert sorted(shared) == sorted(between) and len(between) < len(suite)
    # The text plan names the same baselines.
    main(["campaign", "--site", golden, "--dry-run"])
    text = capsys.readouterr().out
    for b in doc["baselines"]:
        assert f"baseline {b['shape']}: shared by {', '.join(b['shared_by'])}" in text


def test_json_without_dry_run_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["campaign", "--site", str(DATA / "sites" / "golden.yaml"), "--format", "json"]) == 2
    assert "--dry-run" in capsys.readouterr().err


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = JobModel(ranks=4, steps=120, warmup_steps=10, ranks_per_host=2, seed=1)
    exp = SyntheticExperiment(
        "slow-rank",
        base,
        replace(base, seed=2, slow_rank=3, slow_rank_factor=0.3),
        Expectation(expect_regression=True),
        fault_name="slow-rank",
    )
    return write_run_dir(tmp_path_factory.mktemp("run") / "run-1", [exp])


def test_status_json_is_the_manifest(synthetic_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc, code = _json(capsys, "status", str(synthetic_run), "--offline", "--format", "json")
    manifest = read_manifest(synthetic_run)
    assert (doc["run_id"], doc["site"], doc["experiments"]) == ("synthetic-1", "synthetic", ["slow-rank"])
    assert [j["job_id"] for j in doc["jobs"]] == [j.job_id for j in manifest.jobs]
    # The same exit code as the text form, and in the document.
    assert main(["status", str(synthetic_run), "--offline"]) == code == doc["exit_code"]
    assert f"run {manifest.run_id}" in capsys.readouterr().out


def test_rank_nodes_json_is_the_ranking(synthetic_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc, code = _json(capsys, "rank-nodes", str(synthetic_run), "--format", "json")
    assert code == 0
    ranking = rank_nodes(probe_dirs([synthetic_run]))
    assert [(n["node"], n["slow"], n["ranks"]) for n in doc["nodes"]] == [
        (r.node, r.slow, r.ranks) for r in ranking
    ]
    assert [n["speed"] for n in doc["nodes"]] == pytest.approx([r.score for r in ranking])
    slow = [n for n in doc["nodes"] if n["slow"]]
    assert slow and all(n["proposal"]["remove_features"] == [doc["fast_feature"]] for n in slow)
    assert "applied" not in doc


# --- --help: what it does, its exit codes, an example ------------------------------------------


def _subcommands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield " ".join((*path, name)), sub
                yield from _subcommands(sub, (*path, name))


def test_every_subcommand_help_has_description_exit_codes_and_example() -> None:
    commands = dict(_subcommands(build_parser()))
    for nested in ("sandbox up", "sandbox env", "plugin install", "plugin check", "site init", "site check"):
        assert nested in commands
    assert len(commands) >= 20
    for name, parser in commands.items():
        assert parser.description and parser.description.strip(), name
        lines = parser.format_help().splitlines()
        assert any(line.startswith("exit codes: ") for line in lines), name
        example = lines.index("example:") if "example:" in lines else -1
        assert example > 0 and lines[example + 1].strip().startswith(
            ("slurm-chaos", "sudo slurm-chaos", "eval")
        ), name
