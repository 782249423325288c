"""What admins look at in the HTML report (#12 item 5): the campaign overview grid, the timeline's
drain/requeue/alert/resume markers, the heat map grouped by switch and node, the start time in
local time with its offset, and fault SPECs as the job got them."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest

from slurm_chaos.analysis import plots
from slurm_chaos.analysis.report import analyse_run, overview, render_html, render_table, site_switches
from slurm_chaos.analysis.synthetic import JobModel, SyntheticExperiment, write_run_dir
from slurm_chaos.experiment import load_experiment
from slurm_chaos.render import render_job
from slurm_chaos.rundir import Expectation, Observation
from slurm_chaos.site import load_site

DATA = Path(__file__).resolve().parents[1] / "data"
BASE = JobModel(ranks=8, steps=400, warmup_steps=10, ranks_per_host=2, seed=1)
SLOW = replace(BASE, seed=2, slow_rank=5, slow_rank_factor=0.3, fault_start_step=150)
CHECKPOINT = load_experiment("checkpoint-full")
RAW_SPEC = CHECKPOINT.fault.spec or ""
SWITCHES = {"node1": "leaf01", "node2": "leaf01", "node3": "leaf02", "node4": "leaf02"}
STARTED = 1_796_317_512.0  # 2026-12-03 17:05:12 UTC


def detector(name: str, dt: float, *kinds: str, silenced: bool = False) -> Observation:
    return Observation(
        f"detector:{name}", dt, f"{name} saw {kinds[0]}", detector=name, covers=kinds, silenced=silenced
    )


EXPERIMENTS = [
    # nhc fires; the straggler alert fires earlier, but silenced (nobody on call was told).
    SyntheticExperiment(
        "slow-gpu",
        BASE,
        SLOW,
        Expectation(detect_signals=("signal:gpu",), detect_within_s=60.0),
        observations=[
            detector("straggler-alert", 8.0, "gpu", silenced=True),
            detector("nhc", 12.0, "gpu", "cpu"),
            ("node_drained", 14.0, "node3: NHC: slow GPU"),
            ("job_requeued", 16.0, "requeued off node3"),
            ("resumed_from_checkpoint", 20.0, "node1 rank 0: step 300"),
        ],
        fault_name="gpu-throttle",
    ),
    # Only the silenced alert fires: detected, but silenced; nhc covers no checkpoint: not expected.
    SyntheticExperiment(
        CHECKPOINT.name,
        BASE,
        replace(BASE, seed=3),
        Expectation(expect_regression=False, detect_signals=("signal:checkpoint",)),
        observations=[detector("straggler-alert", 5.0, "checkpoint", silenced=True)],
        fault_name=RAW_SPEC,
    ),
    # Nothing fires at all: nhc (it covers cpu) missed it; the straggler alert was not expected to.
    SyntheticExperiment(
        "cpu-hog",
        BASE,
        replace(BASE, seed=4, slowdown=0.2, fault_start_step=100),
        Expectation(detect_signals=("signal:cpu",)),
        fault_name="cpu-hog",
    ),
]


class Grid(HTMLParser):
    """The overview table: its detector columns and, per experiment row, each cell's state and text."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = False
        self.columns: list[str] = []
        self.rows: dict[str, dict[str, tuple[str, str]]] = {}
        self.verdicts: dict[str, str] = {}
        self._row = ""
        self._cell: tuple[str, str] | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table" and a.get("id") == "overview":
            self.inside = True
        if not self.inside:
            return
        if tag == "th" and "data-detector" in a:
            self.columns.append(a["data-detector"] or "")
        if tag == "tr" and "data-experiment" in a:
            self._row = a["data-experiment"] or ""
            self.rows[self._row] = {}
        if tag == "td" and "data-state" in a:
            self._cell = (a["data-detector"] or "", a["data-state"] or "")
            self._text = ""
        if tag == "span" and self._row and "v" in (a.get("class") or "").split():
            self.verdicts[self._row] = (a.get("class") or "").split()[1]

    def handle_data(self, data: str) -> None:
        self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.inside = False
        if tag == "td" and self._cell is not None:
            column, state = self._cell
            self.rows[self._row][column] = (state, self._text.strip())
            self._cell = None


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = write_run_dir(tmp_path_factory.mktemp("overview") / "run", EXPERIMENTS)
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "started": STARTED}))
    # The fault script as the campaign renders it: the SPEC with ${checkpoint_dir} filled in.
    exp_dir = run / "experiments" / CHECKPOINT.name
    site = load_site(DATA / "sites" / "golden.yaml")
    (exp_dir / "fault.sbatch").write_text(render_job(site, CHECKPOINT, "fault", exp_dir / "fault", "run"))
    return run


@pytest.fixture(scope="module")
def page(run_dir: Path) -> str:
    return render_html(analyse_run(run_dir, switches=SWITCHES))


@pytest.fixture
def tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_overview_grid_has_a_row_per_experiment_and_a_column_per_detector(page: str) -> None:
    grid = Grid()
    grid.feed(page)
    assert grid.columns == ["nhc", "straggler-alert"]
    assert list(grid.rows) == ["slow-gpu", "checkpoint-full", "cpu-hog"]
    assert grid.rows["slow-gpu"] == {
        "nhc": ("fired", "fired 12 s"),
        "straggler-alert": ("silenced", "fired (silenced) 8 s"),
    }
    assert grid.rows["checkpoint-full"] == {
        "nhc": ("not-expected", "not expected"),
        "straggler-alert": ("silenced", "fired (silenced) 5 s"),
    }
    assert grid.rows["cpu-hog"] == {
        "nhc": ("missed", "missed"),
        "straggler-alert": ("not-expected", "not expected"),
    }
    # The verdict per row, coloured by its class (the CSS gives each verdict its colour).
    assert grid.verdicts == {"slow-gpu": "PASSED", "checkpoint-full": "PASSED", "cpu-hog": "BLIND_SPOT"}
    assert re.search(r"\.BLIND_SPOT\{background:#[0-9a-f]{6}\}", page)
    # The grid comes before the first experiment's section.
    assert page.index('id="overview"') < page.index('<section id="slow-gpu"')


def test_without_site_detectors_the_columns_are_our_own_detection_signals(tmp_path: Path) -> None:
    experiments = [
        SyntheticExperiment(
            "alerted",
            BASE,
            SLOW,
            Expectation(detect_signals=("alert_firing:Straggler",)),
            observations=[("alert_firing:Straggler", 9.0, "rank 5"), ("node_drained", 30.0, "node3")],
        ),
        SyntheticExperiment("quiet", BASE, replace(BASE, seed=4, slowdown=0.2), Expectation()),
    ]
    report = analyse_run(write_run_dir(tmp_path / "run", experiments), switches={})
    grid = overview(report.analyses)
    assert not grid.site_detectors
    assert grid.columns == ("alert_firing:Straggler", "node_drained")
    states = {a.result.name: [(c.state, c.time_to_detect_s) for c in cells] for a, cells in grid.rows}
    assert states["alerted"] == [("fired", pytest.approx(9.0)), ("fired", pytest.approx(30.0))]
    assert states["quiet"] == [("missed", None), ("missed", None)]


def test_an_aa_controls_quiet_detectors_are_not_expected_not_missed(tmp_path: Path) -> None:
    """A placebo waits for no signal: its quiet cells are neutral, in both kinds of grid; one that
    fires all the same says so."""
    drained = ("node_drained", 12.0, "node3: NHC: slow GPU")
    experiments = [
        SyntheticExperiment(
            "slow-gpu",
            BASE,
            SLOW,
            Expectation(detect_signals=("signal:gpu",), remediation=("drain",)),
            observations=[detector("nhc", 12.0, "gpu"), drained],
        ),
        SyntheticExperiment("control-aa", BASE, replace(BASE, seed=4), Expectation(expect_regression=False)),
        SyntheticExperiment(
            "noisy-aa",
            BASE,
            replace(BASE, seed=5),
            Expectation(expect_regression=False),
            observations=[detector("nhc", 3.0, "gpu")],
        ),
        # Naming no signal but expecting a slowdown, any monitoring signal would do (verdict rule 4).
        SyntheticExperiment("any-signal", BASE, replace(BASE, seed=6), Expectation()),
    ]
    run = write_run_dir(tmp_path / "run", experiments)
    grid = Grid()
    grid.feed(render_html(analyse_run(run, switches={})))
    assert grid.rows["slow-gpu"] == {"nhc": ("fired", "fired 12 s")}
    assert grid.rows["control-aa"] == {"nhc": ("not-expected", "not expected")}
    assert grid.rows["noisy-aa"] == {"nhc": ("fired", "fired 3 s")}
    assert grid.rows["any-signal"] == {"nhc": ("missed", "missed")}
    assert ".cell.not-expected{" in render_html(analyse_run(run, switches={}))
    # Without site detectors: our own signals' columns, the drain a remediation slow-gpu waits for.
    plain = [
        replace(x, observations=[o for o in x.observations if not isinstance(o, Observation)])
        for x in experiments
    ]
    report = analyse_run(write_run_dir(tmp_path / "plain", plain), switches={})
    own = {a.result.name: [c.state for c in cells] for a, cells in overview(report.analyses).rows}
    assert overview(report.analyses).columns == ("signal:gpu", "node_drained")
    assert own == {
        "slow-gpu": ["missed", "fired"],
        "control-aa": ["not-expected", "not-expected"],
        "noisy-aa": ["not-expected", "not-expected"],
        "any-signal": ["missed", "missed"],
    }


def test_timeline_marks_drain_requeue_alert_and_resume(run_dir: Path, page: str) -> None:
    a = analyse_run(run_dir, switches={}).analyses[0]
    found = plots.markers(a)
    assert [m.kind for m in found] == ["alert", "alert", "drain", "requeue", "resume"]
    # Seconds since the fault run started, where the plot's time axis starts.
    assert a.fault_series is not None
    t0 = float(a.fault_series.t_start[0])
    assert [round(m.at_s - (a.window.start - t0), 6) for m in found] == [8.0, 12.0, 14.0, 16.0, 20.0]
    svg = plots.timeline_svg(a)
    for i, kind in enumerate(m.kind for m in found):
        assert f'id="slow-gpu-marker-{kind}-{i}"' in svg
        assert f'id="slow-gpu-marker-label-{kind}-{i}"' in svg
    # A label beside each line (" alert"), one legend entry per kind ("alert").
    for kind in ("drain", "requeue", "alert", "resume"):
        assert svg.count(f"> {kind}<") == sum(m.kind == kind for m in found), kind
        assert svg.count(f">{kind}<") == 1, kind
    assert 'id="slow-gpu-marker-drain-2"' in page


def test_heat_map_rows_are_grouped_by_switch_and_node(run_dir: Path, page: str) -> None:
    for sw in ("leaf01", "leaf02"):
        assert f'id="slow-gpu-heat-switch-{sw}"' in page
    for node in SWITCHES:
        assert f'id="slow-gpu-heat-node-{node}"' in page
    assert "Ranks x time by switch and node" in page
    plain = render_html(analyse_run(run_dir, switches={}))
    assert "heat-switch" not in plain and 'id="slow-gpu-heat-node-node1"' in plain


def test_heat_map_groups_by_the_switches_the_manifest_kept_once_the_site_is_gone(
    run_dir: Path, tmp_path: Path
) -> None:
    """A sandbox site does not load once its sandbox is down: the manifest's switches stand in."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, symlinks=True)
    manifest = json.loads((copy / "manifest.json").read_text())
    gone = {**manifest, "site": str(tmp_path / "sandbox-down.yaml")}
    (copy / "manifest.json").write_text(json.dumps({**gone, "switches": SWITCHES}))
    report = analyse_run(copy)
    assert report.switches == SWITCHES
    assert 'id="slow-gpu-heat-switch-leaf02"' in render_html(report)
    # An older manifest without them: the site config it names, here none that loads.
    (copy / "manifest.json").write_text(json.dumps(gone))
    assert analyse_run(copy).switches == {}
    (copy / "manifest.json").write_text(json.dumps({**gone, "site": str(DATA / "sites" / "golden.yaml")}))
    assert analyse_run(copy).switches["n08"] == "leafB"


def test_heat_rows_order_and_collapse() -> None:
    hosts = ["gpu10", "gpu10", "gpu2", "gpu2", "gpu1", "gpu1"]
    rows = plots.heat_rows(hosts, {"gpu10": "leafA", "gpu1": "leafB"})
    # By switch, then node (gpu2 before gpu10), a node under no switch last.
    assert rows.ranks == ((0,), (1,), (4,), (5,), (2,), (3,))
    assert rows.nodes == ((0, 2, "gpu10"), (2, 4, "gpu1"), (4, 6, "gpu2"))
    assert rows.switches == ((0, 2, "leafA"), (2, 4, "leafB"), (4, 6, ""))
    collapsed = plots.heat_rows(hosts, {}, max_rows=4)
    assert collapsed.per_node and collapsed.ranks == ((4, 5), (2, 3), (0, 1))
    assert [n for _, _, n in collapsed.nodes] == ["gpu1", "gpu2", "gpu10"] and collapsed.switches == ()


def test_site_switches_come_from_the_site_config_the_manifest_names(tmp_path: Path) -> None:
    golden = site_switches(str(DATA / "sites" / "golden.yaml"))
    assert golden["n01"] == "leafA" and golden["n08"] == "leafB" and len(golden) == 8
    assert site_switches(str(tmp_path / "gone.yaml")) == {}
    assert site_switches("synthetic") == {}
    broken = tmp_path / "broken.yaml"
    broken.write_text("cluster: [\n")
    assert site_switches(str(broken)) == {}


def test_start_time_is_local_with_its_utc_offset(run_dir: Path, tz: None) -> None:
    report = analyse_run(run_dir, switches={})
    assert report.started_local == "2026-12-03 22:35:12 +0530"
    assert '<time id="started">2026-12-03 22:35:12 +0530</time>' in render_html(report)
    assert "started 2026-12-03 22:35:12 +0530" in render_table(report)
    assert report.started == "2026-12-03T17:05:12Z"  # JSON and JUnit keep UTC for machines


def test_fault_specs_are_shown_as_the_job_got_them(run_dir: Path, page: str) -> None:
    assert "${" in RAW_SPEC  # the experiment file's SPEC has a placeholder ...
    raw = json.loads((run_dir / "experiments" / CHECKPOINT.name / "observations.json").read_text())
    assert raw["fault"] == RAW_SPEC  # ... and observations.json carries it unfilled
    assert "${" not in page and "$" not in page
    assert "ckpt-full:path=/scratch/ckpt/run/checkpoint-full/fault" in page
    result = analyse_run(run_dir, switches={}).results[1]
    assert result.fault == "ckpt-full:path=/scratch/ckpt/run/checkpoint-full/fault"
    # Without the rendered script the report says what observations.json says.
    assert analyse_run(run_dir, switches={}).results[0].fault == "gpu-throttle"
