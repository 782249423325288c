"""The HTML report in a real headless Chromium: it renders, shows its overview grid and plots, and
logs no errors."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from slurm_chaos.analysis.commands import report_dir
from slurm_chaos.analysis.synthetic import JobModel, SyntheticExperiment, write_run_dir
from slurm_chaos.rundir import Expectation, Observation

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)"
)

# Without the background-networking flags Chromium keeps trying to reach Google's hosts, which this
# machine's closed network refuses; those refusals would drown the console check.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--hide-scrollbars",
]
# Lines Chromium prints about its own environment (no D-Bus, no GPU process in a container), not the page.
ENVIRONMENT_NOISE = re.compile(r"dbus|bus\.cc|gpu|gl_|viz|sandbox|fontconfig|crashpad|ozone|vaapi|udev", re.I)


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = JobModel(ranks=8, steps=600, warmup_steps=15, ranks_per_host=2, gpus=True, seed=1)
    experiments = [
        SyntheticExperiment(
            "slow-gpu",
            base,
            replace(base, seed=2, slow_rank=5, slow_rank_factor=0.3, fault_start_step=250),
            Expectation(detect_signals=("alert_firing",), detect_within_s=60.0),
            observations=[
                ("alert_firing:GpuSlow", 15.0, "rank 5"),
                Observation("detector:dcgm", 15.0, "node3 GPU 1", detector="dcgm", covers=("gpu",)),
                Observation(
                    "detector:straggler", 9.0, "rank 5", detector="straggler", covers=("gpu",), silenced=True
                ),
                ("node_drained", 25.0, "node3: NHC: slow GPU"),
                ("job_requeued", 27.0, "off node3"),
            ],
            fault_name="gpu-throttle",
        ),
        SyntheticExperiment(
            "cpu-hog",
            base,
            replace(base, seed=3, slowdown=0.2, fault_start_step=100),
            Expectation(detect_signals=("alert_firing",)),
            fault_name="cpu-hog",
        ),
    ]
    run = write_run_dir(tmp_path_factory.mktemp("browser") / "run", experiments)
    report_dir(run, "html", None)
    return run / "report.html"


def overview_rows(dom: str) -> dict[str, list[tuple[str, str]]]:
    """Each overview row's (detector, state) cells, from the DOM as the browser built it."""
    table = re.search(r'<table id="overview">.*?</table>', dom, re.S)
    assert table is not None, "no overview grid in the DOM"
    rows = re.findall(r'<tr data-experiment="([^"]+)">(.*?)</tr>', table.group(0), re.S)
    cell = r'<td class="cell \w+" data-detector="([^"]+)" data-state="(\w+)"'
    return {name: re.findall(cell, body) for name, body in rows}


def test_screenshot_shows_the_report(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    done = chromium(tmp_path, "--window-size=1200,1800", f"--screenshot={shot}", page.as_uri())
    assert shot.is_file(), done.stderr[-2000:]
    assert shot.stat().st_size > 50_000  # a blank 1200x1800 page compresses to a few kB
    import matplotlib.image

    pixels = np.asarray(matplotlib.image.imread(str(shot)))[..., :3]
    assert pixels.shape[:2] == (1800, 1200)
    # Not blank: many distinct colours (badges, plot lines, heat map), and plenty of non-white area.
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 200
    assert (pixels.mean(axis=2) < 0.9).mean() > 0.05
    # The PASSED badge's green is on screen.
    green = (pixels[..., 1] > 0.4) & (pixels[..., 0] < 0.3) & (pixels[..., 2] < 0.3)
    assert green.sum() > 100
    # So are the overview's cells near the top: fired (light green) and silenced (light orange).
    top = pixels[:500]
    fired = (np.abs(top - np.array([0xC8, 0xE6, 0xC9]) / 255).max(axis=2) < 0.02).sum()
    silenced = (np.abs(top - np.array([0xFF, 0xE0, 0xB2]) / 255).max(axis=2) < 0.02).sum()
    assert fired > 200 and silenced > 200, (fired, silenced)


def test_dom_has_the_plots_and_console_is_clean(page: Path, tmp_path: Path) -> None:
    done = chromium(tmp_path, "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert dom.count("<svg") == 6
    assert "BLIND SPOT" in dom and "PASSED" in dom
    assert "Ranks x time" in dom and "fault window" in dom
    assert overview_rows(dom) == {
        "slow-gpu": [("dcgm", "fired"), ("straggler", "silenced")],
        "cpu-hog": [("dcgm", "missed"), ("straggler", "missed")],
    }
    assert dom.index('id="overview"') < dom.index('<section id="slow-gpu"')
    for marker in ("alert-0", "alert-1", "alert-2", "drain-3", "requeue-4"):
        assert f'id="slow-gpu-marker-{marker}"' in dom
    assert re.search(r'<time id="started">2026-01-01 \d\d:\d\d:\d\d [+-]\d{4}</time>', dom)
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console
    page_errors = [
        line for line in done.stderr.splitlines() if ":ERROR:" in line and not ENVIRONMENT_NOISE.search(line)
    ]
    assert page_errors == [], page_errors


def test_the_sites_history_shows_in_the_report(tmp_path: Path) -> None:
    """A campaign recorded after an earlier window: the report's history section, as Chromium builds
    it, has a line each of time to detect and effect per experiment with this window marked, and
    names the regression (detected after 80 s instead of 12 s, past its deadline)."""
    from slurm_chaos.history.commands import record_campaign
    from slurm_chaos.site import load_site

    golden = load_site(Path(__file__).resolve().parents[1] / "data" / "sites" / "golden.yaml")
    base = JobModel(ranks=4, steps=300, warmup_steps=15, ranks_per_host=2, seed=1)

    def window(name: str, detect_after_s: float) -> Path:
        exp = SyntheticExperiment(
            "slow-gpu",
            base,
            replace(base, seed=2, slow_rank=1, slow_rank_factor=0.3, fault_start_step=100),
            Expectation(detect_signals=("alert_firing",), detect_within_s=60.0),
            observations=[("alert_firing:GpuSlow", detect_after_s, "rank 1")],
            fault_name="gpu-throttle",
        )
        return write_run_dir(tmp_path / "runs" / name, [exp], run_id=name)

    assert record_campaign(golden, window("w1", 12.0))[1] == ""
    w2 = window("w2", 80.0)
    _, trend = record_campaign(golden, w2)
    report_dir(w2, "html", None, appendix=trend)
    done = chromium(tmp_path, "--dump-dom", (w2 / "report.html").as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    section = re.search(r'<section id="history">.*?</section>', done.stdout, re.S)
    assert section is not None, "no history section in the DOM"
    html_ = section.group(0)
    assert re.findall(r'<tr data-experiment="([^"]+)">', html_) == ["slow-gpu"]
    assert html_.count("<svg") == 2 and html_.count('class="now"') == 2
    assert "time to detect: past its deadline of 60 s (w1: 12 s; now: 80 s)" in html_
    assert '<span class="trend-ends">12 s -&gt; 80 s</span>' in html_
    shot = tmp_path / "history.png"
    chromium(tmp_path, "--window-size=1200,3000", f"--screenshot={shot}", (w2 / "report.html").as_uri())
    assert shot.is_file() and shot.stat().st_size > 20_000
