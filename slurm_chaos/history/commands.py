"""What `slurm-chaos history` does, and what a campaign calls at its end; the CLI only parses options.

Where the history lies: ``--store`` when given, else the site's ``history.path``, else
``history.sqlite`` beside the run directories (a campaign's: its run directory's parent; the
`history` command's: ``runs/``, where run directories go by default).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from slurm_chaos.analysis.report import RunReport, analyse_run
from slurm_chaos.errors import ChaosError, DataError, UsageError
from slurm_chaos.history.compare import HistoryComparison, compare_windows
from slurm_chaos.history.records import Window, window_of
from slurm_chaos.history.render import (
    COMPARE_FORMATS,
    HISTORY_FORMATS,
    comparison_json,
    comparison_text,
    history_html,
    history_json,
    history_text,
    trend_html,
)
from slurm_chaos.history.store import open_store
from slurm_chaos.rundir import Manifest
from slurm_chaos.site import Site

log = logging.getLogger(__name__)

HISTORY_FILE = "history.sqlite"
#: Where run directories go when --out is not given (campaign.engine's default), and so the history.
DEFAULT_RUNS = Path("runs")


def store_path(site: Site | None, store: Path | None, runs: Path = DEFAULT_RUNS) -> Path:
    """The history file: ``store``, else the site's history.path, else beside ``runs``."""
    if store is not None:
        return store
    if site is not None and site.history_path is not None:
        return site.history_path
    return runs / HISTORY_FILE


def site_name(manifest: Manifest, site: Site | None, run_dir: Path) -> str:
    """The site a run is filed under: the cluster its manifest names (an older release's manifest
    names none: the given site's, else the site config it ran with)."""
    if site is not None and manifest.cluster and manifest.cluster != site.cluster:
        raise UsageError(
            f"{run_dir}: ran on cluster {manifest.cluster!r}, not {site.path}'s {site.cluster!r}: "
            "one history per site"
        )
    return manifest.cluster or (site.cluster if site is not None else manifest.site) or "-"


def read_window(run_dir: Path, site: Site | None) -> Window:
    """The window a run directory holds, from the report's own analysis of it."""
    report = analyse_run(run_dir)
    return window_of(report, run_dir, site_name(report.manifest, site, run_dir))


def import_runs(run_dirs: Sequence[Path], site: Site | None, store: Path | None) -> str:
    """``history import``: every run directory analysed first (a bad one adds nothing), then added."""
    if store is None and (site is None or site.history_path is None):
        parents = {d.resolve().parent for d in run_dirs}
        if len(parents) > 1:
            raise UsageError(
                "the run directories lie in different directories: name the history with --store"
            )
        path = store_path(site, None, parents.pop())
    else:
        path = store_path(site, store)
    windows = [read_window(d, site) for d in run_dirs]
    with open_store(path) as history:
        for w in windows:
            history.add(w)
    lines = [f"added {w.run_id} ({len(w.experiments)} experiments, site {w.site}) to {path}" for w in windows]
    return "\n".join(lines) + "\n"


def _site_windows(site: Site, store: Path | None) -> tuple[Path, list[Window]]:
    path = store_path(site, store)
    with open_store(path, create=False) as history:
        windows = history.windows(site.cluster)
        sites = history.sites()
    if not windows:
        there = ", ".join(sites) or "none"
        raise DataError(f"{path}: no window of site {site.cluster!r} (sites there: {there})")
    return path, windows


def show(site: Site, store: Path | None, fmt: str) -> str:
    """``history --site S``: per experiment, one row per window."""
    if fmt not in HISTORY_FORMATS:
        raise UsageError(f"--format {fmt!r}: expected one of {', '.join(HISTORY_FORMATS)}")
    _, windows = _site_windows(site, store)
    render = {"text": history_text, "json": history_json, "html": history_html}[fmt]
    return render(site.cluster, windows)


def choose(windows: Sequence[Window], window: str | None, last: int) -> tuple[Window, list[Window]]:
    """This window (``window``'s run id, else the latest) and the ``last`` windows before it."""
    if last < 1:
        raise UsageError(f"--last {last}: expected at least 1")
    ids = [w.run_id for w in windows]
    if window is not None and window not in ids:
        raise UsageError(f"--window {window!r}: no such window (known: {', '.join(ids)})")
    i = len(windows) - 1 if window is None else ids.index(window)
    return windows[i], list(windows[max(0, i - last) : i])


def compare(site: Site, store: Path | None, last: int, window: str | None, fmt: str) -> tuple[str, int]:
    """``history --site S --compare``: (text, exit code: 1 when a regression is found)."""
    if fmt not in COMPARE_FORMATS:
        raise UsageError(f"--compare --format {fmt!r}: expected one of {', '.join(COMPARE_FORMATS)}")
    _, windows = _site_windows(site, store)
    now, earlier = choose(windows, window, last)
    result: HistoryComparison = compare_windows(now, earlier)
    text = comparison_json(result) if fmt == "json" else comparison_text(result)
    return text, result.exit_code


def record_campaign(site: Site, run_dir: Path, report: RunReport | None = None) -> tuple[str, str]:
    """Add a finished campaign's window to the site's history: (a line to print, the report's
    section on the site's history: this window against the last, '' where there is none).

    The run directory is the evidence and stays so: a history that cannot be written (a full disk,
    a file of a newer release) costs the campaign nothing but this warning and the command that
    adds it later. ``report``: the run's analysis, where the caller has it already."""
    path = store_path(site, None, run_dir.resolve().parent)
    try:
        report = report if report is not None else analyse_run(run_dir)
        window = window_of(report, run_dir, site_name(report.manifest, site, run_dir))
        with open_store(path) as history:
            history.add(window)
            windows = history.windows(window.site)
    except (ChaosError, OSError, sqlite3.Error) as exc:
        log.warning("history: %s not recorded in %s: %s", run_dir, path, exc)
        line = f"history: not recorded ({exc}); later: slurm-chaos history import {run_dir} --store {path}\n"
        return line, ""
    now, earlier = choose(windows, window.run_id, 1)
    upto = windows[: [w.run_id for w in windows].index(now.run_id) + 1]
    return f"history: {window.run_id} added to {path}\n", trend_html(compare_windows(now, earlier), upto)
