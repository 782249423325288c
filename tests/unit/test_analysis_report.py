"""Reports of a synthetic campaign run directory: formats, determinism, exit codes, bad input."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest

from slurm_chaos.analysis.commands import compare_dirs, report_dir
from slurm_chaos.analysis.model import Verdict
from slurm_chaos.analysis.report import analyse_run, render_junit
from slurm_chaos.analysis.synthetic import JobModel, SyntheticExperiment, simulate, write_run, write_run_dir
from slurm_chaos.errors import ChaosError, DataError, UsageError
from slurm_chaos.rundir import Expectation

XSD = Path(__file__).resolve().parents[1] / "data" / "junit" / "junit.xsd"
BASE = JobModel(ranks=4, steps=400, warmup_steps=10, ranks_per_host=2, seed=1)
DETECT = Expectation(
    detect_signals=("alert_firing:Straggler",),
    detect_within_s=60.0,
    remediation=("drain",),
    remediate_within_s=120.0,
)

EXPERIMENTS = [
    SyntheticExperiment(
        "slow-rank",
        BASE,
        replace(BASE, seed=2, slow_rank=3, slow_rank_factor=0.3, fault_start_step=150),
        DETECT,
        observations=[
            ("alert_firing:Straggler", 12.0, "rank 3"),
            ("node_drained", 40.0, "node2: NHC: slow GPU"),
        ],
        fault_name="gpu-throttle",
    ),
    SyntheticExperiment(
        "cpu-hog",
        BASE,
        replace(BASE, seed=3, slowdown=0.15),
        Expectation(detect_signals=("alert_firing",), detect_within_s=60.0),
        fault_name="cpu-hog",
    ),
    SyntheticExperiment(
        "a-a", BASE, replace(BASE, seed=4), Expectation(expect_regression=False), fault_name="none"
    ),
]
EXPECTED = {"slow-rank": "PASSED", "cpu-hog": "BLIND SPOT", "a-a": "PASSED"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run_dir(tmp_path_factory.mktemp("run") / "run-1", EXPERIMENTS)


@pytest.fixture(scope="module")
def outputs(run_dir: Path) -> dict[str, tuple[str, int]]:
    return {fmt: report_dir(run_dir, fmt, None) for fmt in ("table", "json", "junit", "html")}


def test_table_is_aligned_and_has_every_verdict(outputs: dict[str, tuple[str, int]]) -> None:
    text, code = outputs["table"]
    assert code == 1  # one BLIND SPOT
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("EXPERIMENT"))
    rows = lines[header + 1 : header + 4]
    for name, verdict in EXPECTED.items():
        row = next(r for r in rows if r.startswith(name))
        assert verdict in row
    # Columns line up: each verdict starts where the header's VERDICT does.
    col = lines[header].index("VERDICT")
    assert all(r[col:].startswith(tuple(EXPECTED.values())) for r in rows)
    assert "rank 3@node2" in text


def test_json_report(run_dir: Path, outputs: dict[str, tuple[str, int]]) -> None:
    text, _ = outputs["json"]
    doc = json.loads(text)
    assert doc == json.loads((run_dir / "report.json").read_text())
    records = {e["name"]: e for e in doc["experiments"]}
    assert {n: r["verdict"] for n, r in records.items()} == EXPECTED
    slow = records["slow-rank"]
    assert [s["rank"] for s in slow["stragglers"]] == [3]
    assert slow["stragglers"][0]["host"] == "node2"
    assert slow["time_to_detect_s"] == pytest.approx(12.0)
    assert slow["time_to_remediate_s"] == pytest.approx(40.0)
    assert slow["regression"] > 0.2 and slow["ci_low"] < slow["regression"] < slow["ci_high"]
    assert doc["exit_code"] == 1
    # Every entry says how it was measured; between runs there is no minimum detectable effect.
    for r in records.values():
        assert (r["design"], r["mde"]) == ("between-runs", None)
        assert isinstance(r["significant"], bool) and 0 <= r["p_value"] <= 1
    assert slow["significant"] is True


def test_junit_validates_against_the_schema(run_dir: Path, outputs: dict[str, tuple[str, int]]) -> None:
    xmlschema = pytest.importorskip("xmlschema")
    schema = xmlschema.XMLSchema(str(XSD))
    text, _ = outputs["junit"]
    schema.validate(str(run_dir / "report.xml"))
    assert text == (run_dir / "report.xml").read_text()
    doc = schema.to_dict(str(run_dir / "report.xml"))
    suite = doc["testsuite"][0]
    assert (suite["@tests"], suite["@failures"], suite["@errors"], suite["@skipped"]) == ("3", "1", "0", "0")
    assert (doc["@tests"], doc["@failures"], doc["@errors"], doc["@skipped"]) == ("3", "1", "0", "0")
    cases = {c["@name"]: c for c in suite["testcase"]}
    assert "failure" not in cases["slow-rank"] and "failure" not in cases["a-a"]
    assert cases["cpu-hog"]["failure"][0]["@type"] == "BLIND SPOT"


def test_junit_maps_every_verdict_to_its_outcome(run_dir: Path) -> None:
    """PASSED passes; BLIND SPOT, NOT RECOVERED and FALSE ALARM fail; NO EFFECT is an error of the test (the
    injection is suspect); INCONCLUSIVE is skipped with its reason; every count matches."""
    xmlschema = pytest.importorskip("xmlschema")
    schema = xmlschema.XMLSchema(str(XSD))
    report = analyse_run(run_dir)
    template = report.analyses[0]
    results = [
        replace(template.result, name=v.name.lower(), verdict=v, reason=f"why {v.name}") for v in Verdict
    ]
    analyses = tuple(replace(template, result=r) for r in results)
    text = render_junit(replace(report, analyses=analyses))
    schema.validate(text)
    doc = schema.to_dict(text)
    suite = doc["testsuite"][0]
    counts = {"@tests": "6", "@failures": "3", "@errors": "1", "@skipped": "1"}
    assert {k: suite[k] for k in counts} == counts and {k: doc[k] for k in counts} == counts
    cases = {c["@name"]: c for c in suite["testcase"]}
    outcomes = {name: sorted(set(c) & {"failure", "error", "skipped"}) for name, c in cases.items()}
    assert outcomes == {
        "passed": [],
        "blind_spot": ["failure"],
        "not_recovered": ["failure"],
        "false_alarm": ["failure"],
        "no_effect": ["error"],
        "inconclusive": ["skipped"],
    }
    assert cases["blind_spot"]["failure"][0]["@type"] == "BLIND SPOT"
    assert cases["not_recovered"]["failure"][0]["@type"] == "NOT RECOVERED"
    assert cases["no_effect"]["error"][0]["@type"] == "NO EFFECT"
    assert cases["no_effect"]["error"][0]["@message"] == "why NO_EFFECT"
    assert cases["inconclusive"]["skipped"][0]["@message"] == "why INCONCLUSIVE"


def test_schema_rejects_what_jenkins_would(tmp_path: Path) -> None:
    xmlschema = pytest.importorskip("xmlschema")
    schema = xmlschema.XMLSchema(str(XSD))
    assert not schema.is_valid('<testsuites><testsuite name="x" tests="1" failures="0"/></testsuites>')
    assert not schema.is_valid(
        '<testsuites><testsuite name="x" tests="1" failures="0" errors="0">'
        "<testcase/></testsuite></testsuites>"
    )


def test_html_is_self_contained_with_plots(run_dir: Path, outputs: dict[str, tuple[str, int]]) -> None:
    text, code = outputs["html"]
    assert code == 1 and "report.html" in text
    page = (run_dir / "report.html").read_text()
    assert page.count("<svg") == 3 * len(EXPERIMENTS)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "<script" not in page and "@import" not in page
    assert "fault window" in page and "Ranks x time" in page and "Baseline vs fault" in page


def test_rerun_gives_identical_files(run_dir: Path, outputs: dict[str, tuple[str, int]]) -> None:
    before = {n: (run_dir / n).read_bytes() for n in ("report.html", "report.json", "report.xml")}
    text, _ = report_dir(run_dir, "json", None)
    assert text == outputs["json"][0]
    assert {n: (run_dir / n).read_bytes() for n in before} == before


def test_manifest_min_effect_raises_the_bar(tmp_path: Path) -> None:
    run = write_run_dir(tmp_path / "lenient", [EXPERIMENTS[1]])
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "min_effect": 0.5}))
    doc = json.loads(report_dir(run, "json", None)[0])["experiments"][0]
    # +15% is real but under a 50% practical threshold: not significant, so no blind spot either.
    assert doc["regression"] > 0.1 and doc["significant"] is False
    assert doc["verdict"] != "BLIND SPOT"
    (run / "manifest.json").write_text(json.dumps({**manifest, "min_effect": "big"}))
    with pytest.raises(DataError, match="min_effect"):
        report_dir(run, "json", None)


def test_exit_code_zero_when_everything_passed(tmp_path: Path) -> None:
    run = write_run_dir(tmp_path / "ok", [EXPERIMENTS[0], EXPERIMENTS[2]])
    out = tmp_path / "table.txt"
    text, code = report_dir(run, "table", out)
    assert code == 0 and out.read_text() == text


def test_compare_dirs_json(run_dir: Path) -> None:
    exp = run_dir / "experiments" / "slow-rank"
    doc = json.loads(compare_dirs(exp / "baseline", exp / "fault", "json"))
    for key in ("regression", "ci_low", "ci_high", "p_value", "significant", "stragglers"):
        assert key in doc
    assert doc["significant"] is True
    assert doc["stragglers"][0]["rank"] == 3 and doc["stragglers"][0]["host"] == "node2"
    assert 0 < doc["stragglers"][0]["score"] < 0.85
    assert doc["onset_step"] == pytest.approx(150, abs=3)
    text = compare_dirs(exp / "baseline", exp / "fault", "text")
    assert "rank 3 on node2" in text and re.search(r"significant +yes", text)


def test_unknown_format_is_a_usage_error(run_dir: Path) -> None:
    with pytest.raises(UsageError):
        report_dir(run_dir, "pdf", None)
    with pytest.raises(UsageError):
        compare_dirs(run_dir, run_dir, "xml")


# --- bad input ---------------------------------------------------------------------------------


@pytest.fixture()
def copy(run_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    return target


def test_truncated_hdf5_is_a_data_error(copy: Path) -> None:
    f = copy / "experiments" / "cpu-hog" / "fault" / "rank-1.h5"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
    with pytest.raises(DataError, match=r"rank-1\.h5"):
        report_dir(copy, "table", None)


def test_corrupt_hdf5_is_a_data_error(copy: Path) -> None:
    f = copy / "experiments" / "a-a" / "baseline" / "rank-0.h5"
    f.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 20)
    with pytest.raises(DataError, match=r"rank-0\.h5"):
        report_dir(copy, "json", None)


def test_missing_dataset_is_a_data_error(copy: Path) -> None:
    with h5py.File(copy / "experiments" / "a-a" / "fault" / "rank-2.h5", "a") as f:
        del f["steps"]["step_time"]
    with pytest.raises(DataError, match="step_time"):
        report_dir(copy, "json", None)


def test_missing_baseline_is_a_data_error(copy: Path) -> None:
    shutil.rmtree(copy / "experiments" / "cpu-hog" / "baseline")
    with pytest.raises(DataError, match="cpu-hog: missing baseline run"):
        report_dir(copy, "table", None)


def test_missing_rank_file_is_a_data_error(copy: Path) -> None:
    (copy / "experiments" / "a-a" / "fault" / "rank-2.h5").unlink()
    with pytest.raises(DataError, match=r"rank files \[2\] are missing"):
        report_dir(copy, "table", None)


@pytest.mark.parametrize("left", ["empty directory", "no directory"])
def test_fault_run_without_probe_files_is_not_recovered(copy: Path, left: str) -> None:
    fault = copy / "experiments" / "cpu-hog" / "fault"
    shutil.rmtree(fault)
    if left == "empty directory":
        fault.mkdir()
    table, code = report_dir(copy, "table", None)
    assert code == 1
    row = next(line for line in table.splitlines() if line.startswith("cpu-hog "))
    assert "NOT RECOVERED" in row
    assert "cpu-hog: NOT RECOVERED: the fault run left no probe data" in table
    report_dir(copy, "html", None)
    page = (copy / "report.html").read_text()
    assert "The fault run left no probe files: nothing to plot." in page
    assert page.count("<svg") > 0  # the other experiments keep their plots
    data = json.loads(report_dir(copy, "json", None)[0])
    (hog,) = (e for e in data["experiments"] if e["name"] == "cpu-hog")
    assert (hog["verdict"], hog["crashed"], "regression" in hog) == ("NOT RECOVERED", True, False)
    assert (hog["design"], hog["p_value"], hog["significant"], hog["stragglers"]) == (
        "between-runs",
        None,
        False,
        [],
    )
    report_dir(copy, "junit", None)


def test_mismatched_ranks_is_a_data_error(copy: Path) -> None:
    fault = copy / "experiments" / "a-a" / "fault"
    shutil.rmtree(fault)
    write_run(fault, simulate(replace(BASE, ranks=2)))
    with pytest.raises(DataError, match="baseline has 4 ranks, fault run has 2"):
        report_dir(copy, "table", None)
    with pytest.raises(DataError, match="2 ranks, but baseline"):
        compare_dirs(copy / "experiments" / "a-a" / "baseline", fault, "json")


def test_missing_manifest_and_experiment(copy: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"manifest\.json: no such file"):
        report_dir(tmp_path, "table", None)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["experiments"].append("ghost")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="ghost"):
        report_dir(copy, "table", None)


def test_missing_observations_is_a_data_error(copy: Path) -> None:
    (copy / "experiments" / "a-a" / "observations.json").unlink()
    with pytest.raises(DataError, match=r"observations\.json: no such file"):
        report_dir(copy, "table", None)


def test_probe_events_become_observations(tmp_path: Path) -> None:
    exp = SyntheticExperiment(
        "xid",
        BASE,
        replace(BASE, seed=9),
        Expectation(expect_regression=False, detect_signals=("gpu_xid",), detect_within_s=30.0),
    )
    run = write_run_dir(tmp_path / "xid", [exp])
    fault = run / "experiments" / "xid" / "fault" / "rank-1.h5"
    with h5py.File(fault, "a") as f:
        t0 = float(f["steps"]["t_start"][0])
        ev = f["events"]
        for name, value in (("time", t0 + 5.0), ("kind", "gpu_xid"), ("detail", "Xid 79")):
            ev[name].resize((1,))
            ev[name][0] = value
    doc = json.loads(report_dir(run, "json", None)[0])["experiments"][0]
    assert doc["verdict"] == "PASSED" and doc["detected_by"] == "gpu_xid"
    assert doc["time_to_detect_s"] == pytest.approx(5.0, abs=0.01)


def test_lost_steps_counts_repeated_steps(tmp_path: Path) -> None:
    exp = SyntheticExperiment(
        "requeue", BASE, replace(BASE, seed=9), Expectation(expect_regression=False, max_lost_steps=10)
    )
    run = write_run_dir(tmp_path / "rq", [exp])
    for r in range(BASE.ranks):
        with h5py.File(run / "experiments" / "requeue" / "fault" / f"rank-{r}.h5", "a") as f:
            step = f["steps"]["step"]
            step[...] = np.concatenate([np.arange(200), np.arange(180, 380)])
    doc = json.loads(report_dir(run, "json", None)[0])["experiments"][0]
    assert doc["lost_steps"] == 20
    assert doc["verdict"] == "NOT RECOVERED" and "lost 20 steps" in doc["reason"]


def test_unwritable_output_is_a_clear_error(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ChaosError, match="cannot write the report"):
        report_dir(run_dir, "json", tmp_path / "no-such-dir" / "report.json")


def test_fault_run_whose_ranks_recorded_no_step_is_reported(copy: Path) -> None:
    """Ranks that died before their first step ended (a rack lost before training started) leave
    rank files with no step: the campaign still writes every report, with nothing to plot there."""
    for path in (copy / "experiments" / "cpu-hog" / "fault").glob("rank-*.h5"):
        with h5py.File(path, "a") as f:
            for ds in f["steps"].values():
                ds.resize(0, axis=0)
    table, code = report_dir(copy, "table", None)
    assert code == 1
    assert "cpu-hog " in table
    report_dir(copy, "html", None)
    page = (copy / "report.html").read_text()
    assert "The fault run recorded no step" in page
    assert page.count("<svg") > 0  # the other experiments keep their plots
    data = json.loads(report_dir(copy, "json", None)[0])
    (hog,) = (e for e in data["experiments"] if e["name"] == "cpu-hog")
    assert hog["verdict"] != "PASSED"
    report_dir(copy, "junit", None)
