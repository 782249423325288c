"""A switchback experiment judged on its fault job alone: analysis, verdict, report.json, compare."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_chaos.analysis.commands import compare, compare_dirs, compare_switchback, report_dir
from slurm_chaos.analysis.experiment import analyse_experiment
from slurm_chaos.analysis.model import StragglerKind, Verdict
from slurm_chaos.analysis.synthetic import JobModel, SyntheticExperiment, simulate, write_run, write_run_dir
from slurm_chaos.errors import UsageError
from slurm_chaos.probe.reader import MissingProbeFiles
from slurm_chaos.rundir import SCHEDULE, Expectation
from slurm_chaos.schedule import switchback_schedule

STEPS = 500
SCHEDULE_A = switchback_schedule(STEPS, seed=11, affected_ranks=(3,))
BASE = JobModel(ranks=4, steps=STEPS, ranks_per_host=2, seed=1)
DETECT = Expectation(detect_signals=("alert_firing:Straggler",), detect_within_s=60.0)

EXPERIMENTS = [
    # rank 3 computes 20% slower in the on blocks; the alert fires
    SyntheticExperiment(
        "slow-rank-sb",
        None,
        replace(BASE, seed=2, slow_rank=3, slow_rank_factor=0.2, schedule=SCHEDULE_A),
        DETECT,
        observations=[("alert_firing:Straggler", 12.0, "rank 3")],
        fault_name="slow-rank:rank=3,percent=60,control=switchback",
    ),
    # the same schedule as a placebo on an unfaulted job: nothing to find
    SyntheticExperiment(
        "placebo-sb",
        None,
        replace(BASE, seed=3, schedule=switchback_schedule(STEPS, seed=12, placebo=True)),
        Expectation(expect_regression=False),
        fault_name="",
    ),
    # between runs, as before
    SyntheticExperiment(
        "cpu-hog",
        BASE,
        replace(BASE, seed=4, slowdown=0.15),
        Expectation(detect_signals=("alert_firing",), detect_within_s=60.0),
        fault_name="cpu-hog",
    ),
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run_dir(tmp_path_factory.mktemp("run") / "run-1", EXPERIMENTS)


def test_a_switchback_experiment_is_judged_on_its_fault_job_alone(run_dir: Path) -> None:
    exp = run_dir / "experiments" / "slow-rank-sb"
    assert not (exp / "baseline").exists() and (exp / "fault" / SCHEDULE).is_file()
    a = analyse_experiment(exp, "slow-rank-sb")
    r = a.result
    assert a.baseline is None and a.switchback is not None
    assert r.design == "switchback" and r.verdict is Verdict.PASSED, r.reason
    c = r.comparison
    assert c is not None and c.significant and c.p_value < 0.01
    assert c == a.switchback.comparison()  # the verdict's comparison is the switchback result's
    # rank 3 slows every step by 20% of its compute; the job's step time follows it
    assert 0.1 < c.regression < 0.3 and c.ci_low > 0
    assert r.mde is not None and 0 < r.mde < 0.1
    (straggler,) = r.stragglers
    assert (straggler.rank, straggler.host, straggler.kind) == (3, "node2", StragglerKind.SLOWER_WHEN_ON)
    assert straggler.score == pytest.approx(0.2, abs=0.03)
    # the plots' "baseline" is the job's own off steps, its fault steps the on steps
    states = SCHEDULE_A.step_states(STEPS)
    assert len(a.baseline_series.step_time) == (states == 0).sum() >= c.baseline.n > 0
    assert a.fault_steps.sum() == (states == 1).sum() >= c.fault.n > 0


def test_a_placebo_finds_nothing(run_dir: Path) -> None:
    r = analyse_experiment(run_dir / "experiments" / "placebo-sb", "placebo-sb").result
    assert r.design == "switchback" and r.comparison is not None
    assert not r.comparison.significant and r.stragglers == ()
    assert r.verdict is Verdict.PASSED, r.reason


def test_report_json_entries_carry_design_p_value_significant_mde_and_stragglers(run_dir: Path) -> None:
    report_dir(run_dir, "json", None)
    doc = json.loads((run_dir / "report.json").read_text())
    entries = {e["name"]: e for e in doc["experiments"]}
    for e in entries.values():
        assert {"design", "p_value", "significant", "mde", "stragglers"} <= set(e)
        scores = [s["score"] for s in e["stragglers"]]
        assert all({"rank", "host", "score"} <= set(s) for s in e["stragglers"])
        assert scores == sorted(scores, reverse=e["design"] == "switchback")  # slowest first
    sb = entries["slow-rank-sb"]
    assert sb["design"] == "switchback" and sb["significant"] is True and sb["p_value"] < 0.01
    assert 0 < sb["mde"] < 0.1
    assert [(s["rank"], s["host"], s["kind"]) for s in sb["stragglers"]] == [
        (3, "node2", "slower_when_fault_on")
    ]
    hog = entries["cpu-hog"]
    assert hog["design"] == "between-runs" and hog["mde"] is None and hog["significant"] is True
    assert entries["placebo-sb"]["significant"] is False
    html = (run_dir / "report.html").read_text()
    assert "randomisation test, on/off pairs" in html and "off blocks median" in html


def test_a_fault_run_without_probe_files_is_not_recovered(tmp_path: Path, run_dir: Path) -> None:
    exp = tmp_path / "slow-rank-sb"
    shutil.copytree(run_dir / "experiments" / "slow-rank-sb", exp)
    for f in (exp / "fault").glob("rank-*.h5"):
        f.unlink()
    r = analyse_experiment(exp, "slow-rank-sb").result
    assert (r.verdict, r.design, r.comparison) == (Verdict.NOT_RECOVERED, "switchback", None)


def test_without_a_baseline_or_a_schedule_the_baseline_is_missing(tmp_path: Path, run_dir: Path) -> None:
    exp = tmp_path / "slow-rank-sb"
    shutil.copytree(run_dir / "experiments" / "slow-rank-sb", exp)
    (exp / "fault" / SCHEDULE).unlink()
    # probe files of schema 2, which record no schedule
    write_run(exp / "fault", simulate(EXPERIMENTS[0].fault), schema_version=2)
    with pytest.raises(MissingProbeFiles, match="missing baseline run"):
        analyse_experiment(exp, "slow-rank-sb")


def test_without_schedule_json_the_probes_schedule_is_judged(tmp_path: Path, run_dir: Path) -> None:
    exp = tmp_path / "slow-rank-sb"
    shutil.copytree(run_dir / "experiments" / "slow-rank-sb", exp)
    (exp / "fault" / SCHEDULE).unlink()
    r = analyse_experiment(exp, "slow-rank-sb").result
    assert r.design == "switchback" and r.verdict is Verdict.PASSED, r.reason
    assert r.comparison is not None and r.comparison.significant
    assert [s.rank for s in r.stragglers] == [3]


def test_compare_one_directory_judges_the_run_on_its_own_blocks(run_dir: Path) -> None:
    fault = run_dir / "experiments" / "slow-rank-sb" / "fault"
    doc = json.loads(compare([fault], "json"))
    assert doc == json.loads(compare_switchback(fault, "json"))
    assert {
        "design",
        "regression",
        "ci_low",
        "ci_high",
        "p_value",
        "significant",
        "mde",
        "stragglers",
    } <= set(doc)
    assert doc["design"] == "switchback" and doc["significant"] is True
    assert doc["ci_low"] < doc["regression"] < doc["ci_high"] and doc["ci_low"] > 0
    assert [s["rank"] for s in doc["stragglers"]] == [3] and doc["stragglers"][0]["host"] == "node2"
    text = compare([fault], "text")
    assert "design" in text and "switchback" in text and "rank 3 on node2" in text and "mde" in text


def test_compare_one_directory_needs_a_schedule(run_dir: Path) -> None:
    with pytest.raises(UsageError, match="no fault schedule"):
        compare([run_dir / "experiments" / "cpu-hog" / "fault"], "json")
    with pytest.raises(UsageError, match="--format"):
        compare_switchback(run_dir / "experiments" / "slow-rank-sb" / "fault", "xml")


def test_compare_two_directories_keeps_working(run_dir: Path) -> None:
    exp = run_dir / "experiments" / "cpu-hog"
    both = compare([exp / "baseline", exp / "fault"], "json")
    assert both == compare_dirs(exp / "baseline", exp / "fault", "json")
    assert json.loads(both)["significant"] is True


def test_the_cli_compares_one_directory(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from slurm_chaos.cli import main

    fault = run_dir / "experiments" / "slow-rank-sb" / "fault"
    assert main(["compare", str(fault), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["design"] == "switchback"


def test_a_campaigns_in_job_tests_are_judged_as_one_family(run_dir: Path) -> None:
    """Holm across the run's switchback experiments: each p-value adjusted, its verdict resting on it."""
    from slurm_chaos.analysis.report import analyse_run

    report = analyse_run(run_dir, switches={})
    by_name = {a.result.name: a for a in report.analyses}
    slow, placebo, between = by_name["slow-rank-sb"], by_name["placebo-sb"], by_name["cpu-hog"]
    assert slow.switchback is not None and placebo.switchback is not None
    for a in (slow, placebo):
        assert a.switchback is not None and a.switchback.family == 2
        assert a.result.p_adjusted == a.switchback.p_adjusted
        assert a.result.p_adjusted is not None and a.result.p_adjusted >= a.switchback.p_value
    assert between.result.p_adjusted is None  # between runs: not an in-job test
    assert slow.result.verdict is Verdict.PASSED and slow.switchback.significant
    assert slow.result.to_json()["p_adjusted"] == pytest.approx(slow.result.p_adjusted)


def test_a_call_that_holds_alone_but_not_in_the_family_is_inconclusive(run_dir: Path) -> None:
    a = analyse_experiment(run_dir / "experiments" / "slow-rank-sb", "slow-rank-sb")
    sb = a.switchback
    assert sb is not None and sb.significant
    kept = sb.adjusted(sb.p_value * 3, 3)
    assert kept.significant and kept.p_adjusted == sb.p_value * 3 and kept.family == 3
    lost = sb.adjusted(0.02, 3)
    assert not lost.significant and lost.effect.value == "inconclusive"
    assert "after Holm's adjustment across the campaign's 3 in-job tests" in lost.reason
    assert lost.comparison().inconclusive_reason == lost.reason
    assert lost.to_json()["p_adjusted"] == 0.02
