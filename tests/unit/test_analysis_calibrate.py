"""A/A calibration on probe run directories (synthetic runs written as real probe files)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_chaos.analysis.calibrate import calibrate_dirs
from slurm_chaos.analysis.model import Verdict
from slurm_chaos.analysis.switchback import PlaceboCalibration
from slurm_chaos.analysis.synthetic import JobModel, simulate, write_run
from slurm_chaos.campaign.calibrate import write_calibration
from slurm_chaos.cli import main
from slurm_chaos.errors import DataError
from slurm_chaos.rundir import load_recommended_min_effect
from slurm_chaos.schedule import switchback_schedule

MODEL = JobModel(ranks=2, steps=300, warmup_steps=10, noise=0.05, ar_phi=0.3)


def runs(tmp_path: Path, n: int, scale: float = 0.0) -> list[Path]:
    """n unfaulted runs; with ``scale``, run i is slowed by i * scale (a drifting cluster)."""
    return [
        write_run(tmp_path / f"run-{i}", simulate(replace(MODEL, seed=40 + i, slowdown=i * scale)))
        for i in range(n)
    ]


def test_quiet_runs_calibrate_ok(tmp_path: Path) -> None:
    result = calibrate_dirs(runs(tmp_path, 6), min_effect=0.05)
    assert result.calibration.n_pairs == 15
    assert result.calibration.false_positives == 0 and result.ok
    assert result.verdicts == {Verdict.PASSED: 15}
    assert 0 < result.largest_change < 0.05
    record = json.loads(json.dumps(result.to_json()))
    assert record["false_positive_rate"] == 0.0 and record["ok"] is True
    assert record["verdicts"] == {"PASSED": 15} and all(type(k) is str for k in result.to_json()["verdicts"])


def test_drifting_runs_are_flagged_as_too_noisy(tmp_path: Path) -> None:
    # Every run 10% slower than the one before: nothing was injected, yet pairs differ a lot.
    result = calibrate_dirs(runs(tmp_path, 4, scale=0.10), min_effect=0.05)
    assert result.calibration.false_positives == 6 and not result.ok
    # The later run of each pair is the slower one: an A/A control that slows down is too noisy to
    # judge, never a blind spot.
    assert result.verdicts == {Verdict.INCONCLUSIVE: 6} and result.false_alarms == 6
    assert result.calibration.min_effect_for_1pct > 0.09
    assert "TOO NOISY" in result.summary()


def test_mismatched_shapes_and_too_few_runs(tmp_path: Path) -> None:
    one = runs(tmp_path, 1)
    with pytest.raises(DataError, match="at least two runs"):
        calibrate_dirs(one)
    other = write_run(tmp_path / "wide", simulate(replace(MODEL, ranks=3)))
    with pytest.raises(DataError, match="same number of ranks"):
        calibrate_dirs([*one, other])


def test_cli_calibrates_directories_and_writes_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dirs = runs(tmp_path, 3)
    code = main(["calibrate", "--dirs", *map(str, dirs), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "3 runs, 3 pairs" in out and "OK:" in out
    assert json.loads((tmp_path / "calibration.json").read_text())["pairs"] == 3
    write_calibration(tmp_path, calibrate_dirs(dirs))  # rewritten, not appended
    assert json.loads((tmp_path / "calibration.json").read_text())["pairs"] == 3


def test_cli_without_site_or_dirs_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate"]) == 2
    assert "--site" in capsys.readouterr().err


def test_recommended_min_effect_covers_the_spread_of_run_medians(tmp_path: Path) -> None:
    # Runs 0..5 slowed by 0, 2, ..., 10%: the pairs differ by up to 10%, the spread is about 3.6%.
    result = calibrate_dirs(runs(tmp_path, 6, scale=0.02), min_effect=0.05)
    assert 0.025 < result.run_spread < 0.05
    t = 4.0321  # Student's t, 99.5% quantile, 5 degrees of freedom
    expected = math.exp(t * math.sqrt(2) * result.run_spread) - 1
    assert result.recommended_min_effect == pytest.approx(expected, abs=1e-3)
    assert result.recommended_min_effect > result.largest_change
    again = calibrate_dirs(runs(tmp_path / "again", 6, scale=0.02), min_effect=result.recommended_min_effect)
    assert again.calibration.false_positives == 0 and again.ok


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "no such calibration file"),
        ("{", "not a calibration file"),
        ('{"recommended_min_effect": "high"}', "recommended_min_effect: expected a fraction"),
    ],
)
def test_bad_calibration_file_is_named(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "calibration.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(DataError, match=message):
        load_recommended_min_effect(path)


def test_campaign_dry_run_checks_the_calibration_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = Path(__file__).resolve().parents[2] / "site_configs" / "h100-ib-example.yaml"
    code = main(["campaign", "--site", str(site), "--dry-run", "--calibration", str(tmp_path / "none.json")])
    assert code == 2
    assert "none.json: no such calibration file" in capsys.readouterr().err


# ------------------------------------------------------------------ placebo schedules


def placebo_runs(tmp_path: Path, n: int, **model: object) -> list[Path]:
    """n unfaulted runs of 500 steps, each on a placebo schedule of its own, recorded as the probe does."""
    base = replace(MODEL, steps=500, **model)  # type: ignore[arg-type]
    return [
        write_run(
            tmp_path / f"placebo-{i}",
            simulate(replace(base, seed=70 + i, schedule=switchback_schedule(500, seed=i, placebo=True))),
        )
        for i in range(n)
    ]


def test_runs_on_placebo_schedules_calibrate_the_in_job_test_too(tmp_path: Path) -> None:
    result = calibrate_dirs(placebo_runs(tmp_path, 8), min_effect=0.05)
    p = result.placebo
    assert p is not None and p.runs == 8 and p.alpha == 0.01
    assert p.false_positives <= 1 and p.ok and result.ok
    # 5% noise (AR 0.3) over 500 steps: the in-job test sees a few percent, not tens
    assert 0 < p.mde_median < 0.05
    record = json.loads(json.dumps(result.to_json()))["placebo"]
    assert record["design"] == "switchback" and record["runs"] == 8 and record["ok"] is True
    assert "in-job test on placebo schedules: 8 runs" in result.summary()


def test_runs_without_a_schedule_have_no_placebo_calibration(tmp_path: Path) -> None:
    result = calibrate_dirs(runs(tmp_path, 3))
    assert result.placebo is None and result.to_json()["placebo"] is None
    assert "placebo" not in result.summary()


def test_a_run_whose_schedule_toggled_a_fault_or_a_mix_is_refused(tmp_path: Path) -> None:
    toggled = write_run(
        tmp_path / "toggled",
        simulate(replace(MODEL, steps=500, schedule=switchback_schedule(500, seed=3))),
    )
    with pytest.raises(DataError, match="toggled a fault: not an A/A run"):
        calibrate_dirs([*placebo_runs(tmp_path, 2), toggled])
    with pytest.raises(DataError, match="1 of 3 followed a placebo schedule"):
        calibrate_dirs([*runs(tmp_path / "plain", 2), *placebo_runs(tmp_path / "p", 1)])


@pytest.mark.parametrize(("hits", "ok"), [(0, True), (1, True), (2, False), (10, False)])
def test_more_significant_placebos_than_the_level_explains_is_too_many(hits: int, ok: bool) -> None:
    cal = PlaceboCalibration(runs=10, false_positives=hits, rate=hits / 10, upper_95=1.0, mde_median=0.02)
    # P(X >= 1 | 10, 1%) = 9.6%, P(X >= 2) = 0.4%
    assert cal.ok is ok and (cal.p_excess >= 0.05) is ok
    assert ("TOO MANY" in cal.summary()) is not ok
