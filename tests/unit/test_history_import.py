"""Run directories into the history: recorded ones of earlier releases, and a campaign's at its end.

The history keeps what the report says: every stored value is checked against report.json.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurm_chaos.analysis.commands import report_dir
from slurm_chaos.analysis.synthetic import JobModel, SyntheticExperiment, write_experiment, write_run_dir
from slurm_chaos.errors import DataError, UsageError
from slurm_chaos.history.commands import import_runs, record_campaign
from slurm_chaos.history.store import open_store
from slurm_chaos.rundir import Expectation, Observation, read_manifest
from slurm_chaos.site import load_site

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "data" / "rundir"
GOLDEN = REPO / "tests" / "data" / "sites" / "golden.yaml"
BASE = JobModel(ranks=4, steps=300, warmup_steps=10, ranks_per_host=2, seed=1)
DETECT = Expectation(
    detect_signals=("detector:nhc",), detect_within_s=60.0, remediation=("drain",), remediate_within_s=120.0
)


def nhc(after_s: float, silenced: bool = False) -> Observation:
    return Observation(
        "detector:nhc", after_s, "NHC: slow GPU", detector="nhc", covers=("straggler",), silenced=silenced
    )


def slow_rank(detect_after_s: float) -> SyntheticExperiment:
    return SyntheticExperiment(
        "gpu-throttle",
        BASE,
        replace(BASE, seed=2, slow_rank=3, slow_rank_factor=0.3, fault_start_step=100),
        DETECT,
        observations=[nhc(detect_after_s), ("node_drained", detect_after_s + 20.0, "node2: NHC: slow GPU")],
        fault_name="gpu-throttle",
    )


CONTROL = SyntheticExperiment(
    "control-aa", BASE, replace(BASE, seed=4), Expectation(expect_regression=False), fault_name="none"
)


def recorded(name: str, tmp_path: Path) -> Path:
    """A run directory of an earlier release: its recorded manifest, synthetic experiments beside it."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    shutil.copy(RECORDED / name / "manifest.json", run_dir / "manifest.json")
    experiments = {"gpu-throttle": slow_rank(12.0), "control-aa": CONTROL}
    for exp in read_manifest(run_dir).experiments:
        write_experiment(run_dir / "experiments" / exp, experiments[exp])
    return run_dir


def test_run_directories_of_earlier_releases_import(tmp_path: Path) -> None:
    runs = [recorded("campaign-0.x", tmp_path), recorded("analysis-0.x", tmp_path)]
    store = tmp_path / "h.sqlite"
    text = import_runs(runs, None, store)
    assert f"added 20261130-120000-campaign (1 experiments, site sandbox) to {store}" in text
    with open_store(store, create=False) as history:
        assert history.sites() == ["sandbox", "synthetic"]  # the manifest's cluster, else its site
        (campaign,) = history.windows("sandbox")
        (analysis,) = history.windows("synthetic")
    assert (campaign.run_id, campaign.slurm_version, campaign.kind) == (
        "20261130-120000-campaign",
        "22.05.8",
        "campaign",
    )
    assert campaign.started == 1764504000.25 and campaign.run_dir == str(runs[0].resolve())
    assert campaign.nodes == ("node1", "node2", "node3", "node4")  # every job's nodes
    assert analysis.started == datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    assert analysis.nodes == ("node1", "node2")  # no jobs recorded: the hosts of the probe's ranks
    assert [e.name for e in analysis.experiments] == ["gpu-throttle", "control-aa"]


def test_the_history_stores_what_the_report_says(tmp_path: Path) -> None:
    run_dir = recorded("analysis-0.x", tmp_path)
    import_runs([run_dir], None, tmp_path / "h.sqlite")
    report_dir(run_dir, "json", None)
    reported = {e["name"]: e for e in json.loads((run_dir / "report.json").read_text())["experiments"]}
    with open_store(tmp_path / "h.sqlite") as history:
        (window,) = history.windows("synthetic")
    for stored in window.experiments:
        r = reported[stored.name]
        assert stored.verdict.value == r["verdict"] and stored.reason == r["reason"]
        assert (stored.detected_by, stored.lost_steps, stored.crashed) == (
            r["detected_by"],
            r["lost_steps"],
            r["crashed"],
        )
        for ours, theirs in (
            (stored.time_to_detect_s, r["time_to_detect_s"]),
            (stored.time_to_remediate_s, r["time_to_remediate_s"]),
            (stored.mde, r["mde"]),
            (stored.effect, r.get("regression")),
            (stored.ci_low, r.get("ci_low")),
            (stored.p_value, r.get("p_value")),
        ):
            assert (ours is None and theirs is None) or ours == pytest.approx(theirs, abs=1e-6)
        assert len(stored.firings) == len(r["detections"])
        for f, d in zip(stored.firings, r["detections"], strict=True):
            assert (f.detector, f.signal, f.silenced) == (d["detector"], d["signal"], d["silenced"])
            assert f.time_to_detect_s == pytest.approx(d["time_to_detect_s"])
    throttle = window.experiment("gpu-throttle")
    assert throttle is not None and throttle.firings and throttle.time_to_detect_s == pytest.approx(12.0)
    assert throttle.detect_within_s == 60.0 and throttle.straggler is not None
    control = window.experiment("control-aa")
    assert control is not None and control.expect_regression is False


def test_a_run_directory_that_does_not_analyse_adds_nothing(tmp_path: Path) -> None:
    good = recorded("campaign-0.x", tmp_path)
    with pytest.raises(DataError, match="experiment directory"):
        import_runs([good, RECORDED / "analysis-0.x"], None, tmp_path / "h.sqlite")  # manifest only
    assert not (tmp_path / "h.sqlite").exists()


def test_a_run_of_another_cluster_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"ran on cluster 'sandbox', not .*'golden'"):
        import_runs([recorded("campaign-0.x", tmp_path)], load_site(GOLDEN), tmp_path / "h.sqlite")


def test_the_history_lies_beside_the_run_directories_unless_the_site_names_it(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run_dir = write_run_dir(runs / "w1", [slow_rank(12.0)], run_id="w1")
    site = load_site(GOLDEN)
    assert record_campaign(site, run_dir) == (f"history: w1 added to {runs / 'history.sqlite'}\n", "")
    elsewhere = tmp_path / "var" / "history.sqlite"
    line, _ = record_campaign(replace(site, history_path=elsewhere), run_dir)
    assert line.endswith(f"added to {elsewhere}\n")
    with open_store(elsewhere, create=False) as history:
        (window,) = history.windows("golden")  # a manifest without a cluster: the site's
    assert window.run_id == "w1"


def test_a_history_that_cannot_be_written_costs_the_campaign_a_warning(tmp_path: Path) -> None:
    run_dir = write_run_dir(tmp_path / "runs" / "w1", [slow_rank(12.0)], run_id="w1")
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    site = replace(load_site(GOLDEN), history_path=blocked / "history.sqlite")
    line, trend = record_campaign(site, run_dir)
    assert line.startswith("history: not recorded (") and trend == ""
    assert f"slurm-chaos history import {run_dir} --store {blocked / 'history.sqlite'}" in line


def test_a_recorded_window_gets_the_reports_trend_against_the_last(tmp_path: Path) -> None:
    """The first window has nothing to compare with; the second's report section shows each
    experiment's time to detect and effect over both windows and names the regressions
    `history --compare` names: detected after 80 s instead of 12 s, past its 60 s deadline."""
    runs = tmp_path / "runs"
    site = load_site(GOLDEN)
    w1 = write_run_dir(runs / "w1", [slow_rank(12.0)], run_id="w1")
    assert record_campaign(site, w1)[1] == ""
    w2 = write_run_dir(runs / "w2", [slow_rank(80.0)], run_id="w2")
    line, trend = record_campaign(site, w2)
    assert line == f"history: w2 added to {runs / 'history.sqlite'}\n"
    assert trend.startswith('<section id="history">') and "judged against w1" in trend
    assert trend.count("<svg") == 2 and 'class="now"' in trend  # time to detect, effect; this window marked
    assert '<p class="regressions">regressions: 4</p>' in trend
    assert "verdict: worse than in the last window (w1: PASSED; now: BLIND SPOT)" in trend
    assert "time to detect: past its deadline of 60 s (w1: 12 s; now: 80 s)" in trend
    assert '<p class="improvements">improvements: none</p>' in trend
    report_dir(w2, "html", None, appendix=trend)
    assert trend in (w2 / "report.html").read_text()
