"""`slurm-chaos history` as a user runs it: exit codes 0 (shown, no regression), 1 (a regression
found), 2 (bad input), on three synthetic windows whose monitoring got slower in the third."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from slurm_chaos.analysis.synthetic import JobModel, SyntheticExperiment, write_run_dir
from slurm_chaos.rundir import Expectation, Observation

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "sites" / "golden.yaml"
BASE = JobModel(ranks=4, steps=300, warmup_steps=10, ranks_per_host=2, seed=1)
CONTROL = SyntheticExperiment(
    "control-aa", BASE, replace(BASE, seed=4), Expectation(expect_regression=False), fault_name="none"
)


def slow_rank(detect_after_s: float) -> SyntheticExperiment:
    """A throttled GPU that NHC reports ``detect_after_s`` after the fault began (deadline 60 s)."""
    return SyntheticExperiment(
        "gpu-throttle",
        BASE,
        replace(BASE, seed=2, slow_rank=3, slow_rank_factor=0.3, fault_start_step=100),
        Expectation(detect_signals=("detector:nhc",), detect_within_s=60.0),
        observations=[
            Observation("detector:nhc", detect_after_s, "NHC", detector="nhc", covers=("straggler",))
        ],
        fault_name="gpu-throttle",
    )


def chaos(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurm_chaos", *map(str, argv)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """The golden site with history.path set, and three run directories: NHC saw the throttled GPU
    after 12 s in the first two windows, after 200 s in the third."""
    tmp = tmp_path_factory.mktemp("history")
    data = yaml.safe_load(GOLDEN.read_text())
    data["history"] = {"path": str(tmp / "history.sqlite")}
    site = tmp / "site.yaml"
    site.write_text(yaml.safe_dump(data))
    runs = [
        write_run_dir(tmp / "runs" / run_id, [slow_rank(after), CONTROL], run_id=run_id)
        for run_id, after in (("w1", 12.0), ("w2", 12.0), ("w3", 200.0))
    ]
    return site, runs


def test_history_import_show_and_compare(history: tuple[Path, list[Path]]) -> None:
    site, (w1, w2, w3) = history
    added = chaos("history", "import", w1, w2, "--site", site)
    assert added.returncode == 0, added.stderr
    assert "added w1 (2 experiments, site golden)" in added.stdout

    table = chaos("history", "--site", site)
    assert table.returncode == 0, table.stderr
    assert "history of site golden: 2 windows" in table.stdout
    assert "gpu-throttle" in table.stdout and "nhc 12 s" in table.stdout

    doc = json.loads(chaos("history", "--site", site, "--format", "json").stdout)
    assert [w["run_id"] for w in doc["windows"]] == ["w1", "w2"]
    assert [r["window"] for r in doc["experiments"]["gpu-throttle"]] == ["w1", "w2"]
    page = chaos("history", "--site", site, "--format", "html")
    assert page.returncode == 0 and page.stdout.startswith("<!DOCTYPE html>")
    assert 'data-window="w2"' in page.stdout

    same = chaos("history", "--site", site, "--compare")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "window w2" in same.stdout and "findings: 0" in same.stdout and "rules:" in same.stdout

    # The option before 'import' stands for it too.
    assert chaos("history", "--site", site, "import", w3).returncode == 0
    worse = chaos("history", "--site", site, "--compare")
    assert worse.returncode == 1, worse.stdout + worse.stderr
    assert "gpu-throttle: time to detect by nhc: beyond the earlier windows' spread" in worse.stdout
    assert "      w2: 12 s\n      w3: 200 s" in worse.stdout
    findings = worse.stdout.split("\nfindings: ")[1].split("\nimprovements: ")[0]
    assert findings.startswith("3\n") and "control-aa" not in findings
    assert (
        "gpu-throttle: verdict: worse than in the last window\n      w2: PASSED\n      w3: BLIND SPOT"
        in findings
    )
    assert "gpu-throttle: time to detect: past its deadline of 60 s" in findings

    last_two = json.loads(
        chaos("history", "--site", site, "--compare", "--last", "2", "--format", "json").stdout
    )
    assert [w["run_id"] for w in last_two["earlier"]] == ["w1", "w2"] and last_two["exit_code"] == 1
    assert {f["experiment"] for f in last_two["findings"]} == {"gpu-throttle"}
    nhc = next(f for f in last_two["findings"] if f["detector"] == "nhc")
    assert (nhc["before"], nhc["now"]) == (
        {"window": "w2", "value": "12 s"},
        {"window": "w3", "value": "200 s"},
    )

    first_two = chaos("history", "--site", site, "--compare", "--window", "w2")
    assert first_two.returncode == 0 and "findings: 0" in first_two.stdout


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["history"], "--site is required"),
        (["history", "--site", "{site}", "--compare", "--last", "0"], "--last 0"),
        (["history", "--site", "{site}", "--compare", "--window", "nope"], "no such window"),
        (["history", "--site", "{site}", "--compare", "--format", "html"], "--compare --format 'html'"),
        (["history", "--site", "{site}", "--store", "{tmp}/none.sqlite"], "no history here"),
        (["history", "import", "{tmp}/no-run", "--store", "{tmp}/h.sqlite"], "no such run directory"),
    ],
)
def test_bad_input_exits_2(
    history: tuple[Path, list[Path]], tmp_path: Path, argv: list[str], words: str
) -> None:
    site, _ = history
    done = chaos(*(a.format(site=site, tmp=tmp_path) for a in argv))
    assert done.returncode == 2, done.stdout + done.stderr
    assert words in done.stderr
