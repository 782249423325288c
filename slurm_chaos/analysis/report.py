"""Reports of a campaign run directory: terminal table, self-contained HTML, JSON and JUnit XML.

Layout read::

    RUN_DIR/manifest.json                       run id, site, start, experiments (slurm_chaos.rundir)
    RUN_DIR/experiments/<name>/baseline/rank-<R>.h5
    RUN_DIR/experiments/<name>/fault/rank-<R>.h5
    RUN_DIR/experiments/<name>/fault.sbatch     the SPEC as the job got it (placeholders filled in)
    RUN_DIR/experiments/<name>/observations.json (slurm_chaos.rundir)

The HTML page groups the heat map's rows by the switch each node hangs off: as the manifest
recorded it when the campaign started, else (an older manifest) from the site config it names,
when that still loads. Every output depends only on these files (seeded bootstrap,
no clock; the HTML shows the start in the machine's time zone), so running the report twice gives
byte-identical files.
"""

from __future__ import annotations

import html
import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slurm_chaos.analysis.experiment import ExperimentAnalysis, analyse_experiment
from slurm_chaos.analysis.model import Detection, ExperimentResult, Verdict
from slurm_chaos.analysis.multiplicity import holm
from slurm_chaos.analysis.regression import ALPHA, MIN_EFFECT
from slurm_chaos.analysis.verdict import DETECTION_SIGNALS, REMEDIATION_SIGNALS, signal_matches
from slurm_chaos.errors import ChaosError
from slurm_chaos.rundir import Expectation, Manifest, Signal, detector_signal, experiment_dir, read_manifest
from slurm_chaos.schedule import DESIGN as SWITCHBACK
from slurm_chaos.site import SIGNAL_KIND

REPORT_FILES = {"html": "report.html", "json": "report.json", "junit": "report.xml"}
#: An overview cell of a detector that stayed quiet where the experiment waits for none of its signals.
NOT_EXPECTED = "not-expected"


@dataclass(frozen=True)
class RunReport:
    manifest: Manifest
    analyses: tuple[ExperimentAnalysis, ...]
    # The practical threshold the comparisons used: the manifest's, else the analysis's default.
    min_effect: float = MIN_EFFECT
    # Which switch each node hangs off (the site's racks); empty when the site config is not at hand.
    switches: Mapping[str, str] = field(default_factory=dict)

    @property
    def started(self) -> str:
        """The run's start as UTC ISO-8601 text ('' when unknown): for machines (JSON, JUnit)."""
        t = self.manifest.started
        return "" if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    @property
    def started_local(self) -> str:
        """The run's start in this machine's time zone with its UTC offset ('' when unknown): for
        people (``2026-12-03 17:05:12 +0000``), who compare it with their logs and dashboards."""
        t = self.manifest.started
        return (
            "" if t is None else datetime.fromtimestamp(t, UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S %z")
        )

    @property
    def results(self) -> tuple[ExperimentResult, ...]:
        return tuple(a.result for a in self.analyses)


def analyse_run(run_dir: Path, switches: Mapping[str, str] | None = None) -> RunReport:
    """Analyse every experiment the manifest lists; bad input raises DataError naming the file.

    ``switches`` (node -> switch) defaults to the manifest's, recorded when the campaign started,
    else the racks of the site config the manifest names.
    """
    manifest = read_manifest(run_dir)
    min_effect = MIN_EFFECT if manifest.min_effect is None else manifest.min_effect
    analyses = [analyse_experiment(experiment_dir(run_dir, n), n, min_effect) for n in manifest.experiments]
    # A campaign's in-job tests are one family: their verdicts rest on Holm-adjusted p-values, so
    # ten experiments at alpha 0.01 do not give a one-in-ten chance of a false call between them.
    tested = [
        i for i, a in enumerate(analyses) if a.switchback is not None and math.isfinite(a.switchback.p_value)
    ]
    if len(tested) > 1:
        adjusted = holm([analyses[i].switchback.p_value for i in tested])  # type: ignore[union-attr]
        for i, p in zip(tested, adjusted, strict=True):
            n = manifest.experiments[i]
            analyses[i] = analyse_experiment(experiment_dir(run_dir, n), n, min_effect, (p, len(tested)))
    if switches is None:
        switches = manifest.switches or site_switches(manifest.site)
    return RunReport(manifest, tuple(analyses), min_effect, switches)


def site_switches(site: str) -> dict[str, str]:
    """Node -> switch from the racks of the site config at ``site``; empty when there is no such file
    or it does not load (moved, since edited, a sandbox site whose sandbox is down): the heat map
    then groups by node only, the rest of the report does not need the site."""
    from slurm_chaos.sandbox.layout import site_placeholders
    from slurm_chaos.site import load_site

    path = Path(site)
    if not site or not path.is_file():
        return {}
    try:
        loaded = load_site(path, site_placeholders)
    except (ChaosError, OSError, ValueError):
        return {}
    return {node: rack.switch for rack in loaded.racks for node in rack.nodes}


def exit_code(results: Sequence[ExperimentResult]) -> int:
    """0 when every verdict is PASSED, 1 otherwise (bad input never gets here: DataError exits 2)."""
    return 0 if all(r.verdict is Verdict.PASSED for r in results) else 1


# --- terminal table ----------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:+.1f}%"


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}s"


def _row(r: ExperimentResult) -> list[str]:
    c = r.comparison
    ci = "-" if c is None or not math.isfinite(c.ci_low) else f"[{_pct(c.ci_low)}, {_pct(c.ci_high)}]"
    p = "-" if c is None else f"{c.p_value:.2g}"
    slow = r.stragglers[0] if r.stragglers else None
    straggler = "-" if slow is None else f"rank {slow.rank}@{slow.host} ({slow.score:.2f})"
    return [
        r.name,
        r.fault or "-",
        r.verdict.value,
        _pct(c.regression if c else None),
        ci,
        p,
        _secs(r.time_to_detect_s),
        _secs(r.time_to_remediate_s),
        str(r.lost_steps),
        straggler,
    ]


def render_table(report: RunReport) -> str:
    """Plain aligned text, one row per experiment, reasons listed below."""
    m = report.manifest
    header = [
        "EXPERIMENT",
        "FAULT",
        "VERDICT",
        "REGRESSION",
        f"{100 * (1 - ALPHA):.0f}% CI",
        "P",
        "DETECT",
        "REMEDIATE",
        "LOST",
        "STRAGGLER",
    ]
    rows = [header] + [_row(r) for r in report.results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        f"run {m.run_id}  site {m.site or '-'}  started {report.started_local or '-'}  "
        f"significant: p < {ALPHA:g} and a change of at least {100 * report.min_effect:.1f}%",
        "",
    ]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() for row in rows]
    lines.append("")
    lines += [f"{r.name}: {r.verdict.value}: {r.reason}" for r in report.results]
    passed = sum(r.verdict is Verdict.PASSED for r in report.results)
    lines.append(f"\n{passed} of {len(report.results)} experiments PASSED")
    return "\n".join(lines) + "\n"


# --- JSON --------------------------------------------------------------------------------------


def report_json(report: RunReport) -> dict[str, Any]:
    m = report.manifest
    return {
        "run_id": m.run_id,
        "site": m.site,
        "started": report.started,
        "exit_code": exit_code(report.results),
        "experiments": [r.to_json() for r in report.results],
    }


def render_json(report: RunReport) -> str:
    return json.dumps(report_json(report), indent=2, sort_keys=True, allow_nan=False) + "\n"


# --- JUnit XML ---------------------------------------------------------------------------------


def _duration(a: ExperimentAnalysis) -> str:
    if a.fault_series is None:
        return "0.000"
    t = a.fault_series.t_start
    seconds = float(t[-1] - t[0] + a.fault_series.step_time[-1]) if len(t) and math.isfinite(t[0]) else 0.0
    return f"{max(0.0, seconds):.3f}"


# How each verdict reads to a CI server: a finding fails the test; NO EFFECT means the injection
# itself is suspect (an error of the test, not a finding); INCONCLUSIVE could not be judged.
_JUNIT_OUTCOME = {
    Verdict.PASSED: None,
    Verdict.BLIND_SPOT: "failure",
    Verdict.NOT_RECOVERED: "failure",
    Verdict.FALSE_ALARM: "failure",
    Verdict.NO_EFFECT: "error",
    Verdict.INCONCLUSIVE: "skipped",
}


def _junit_counts(results: Sequence[ExperimentResult]) -> dict[str, str]:
    outcomes = [_JUNIT_OUTCOME[r.verdict] for r in results]
    return {
        "tests": str(len(outcomes)),
        "failures": str(outcomes.count("failure")),
        "errors": str(outcomes.count("error")),
        "skipped": str(outcomes.count("skipped")),
    }


def _junit_case(suite: ET.Element, a: ExperimentAnalysis, classname: str) -> None:
    r = a.result
    case = ET.SubElement(suite, "testcase", {"name": r.name, "classname": classname, "time": _duration(a)})
    outcome = _JUNIT_OUTCOME[r.verdict]
    if outcome == "skipped":
        ET.SubElement(case, "skipped", {"message": r.reason})
    elif outcome is not None:
        element = ET.SubElement(case, outcome, {"type": r.verdict.value, "message": r.reason})
        element.text = json.dumps(r.to_json(), indent=2, sort_keys=True)
    out = ET.SubElement(case, "system-out")
    out.text = f"{r.verdict.value}: {r.reason}"


def render_junit(report: RunReport) -> str:
    """One testcase per experiment: PASSED passes, BLIND SPOT, NOT RECOVERED and FALSE ALARM are
    failures whose type is the verdict, NO EFFECT an error, INCONCLUSIVE skipped (its reason the
    message)."""
    m = report.manifest
    counts = _junit_counts(report.results)
    root = ET.Element("testsuites", {"name": "slurm-chaos", **counts})
    suite = ET.SubElement(root, "testsuite", {"name": f"slurm-chaos.{m.run_id}", **counts})
    props = ET.SubElement(suite, "properties")
    for key, value in (("run_id", m.run_id), ("site", m.site), ("started", report.started)):
        ET.SubElement(props, "property", {"name": key, "value": value})
    for a in report.analyses:
        _junit_case(suite, a, f"slurm-chaos.{m.site or 'site'}")
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


# --- HTML --------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-size:.9em}th{background:#f3f3f3}
.v{font-weight:bold;padding:.1em .5em;border-radius:.3em;color:#fff;white-space:nowrap}
.PASSED{background:#2e7d32}.BLIND_SPOT{background:#c62828}.NOT_RECOVERED{background:#6a1b9a}
.NO_EFFECT{background:#ef6c00}.INCONCLUSIVE{background:#546e7a}.FALSE_ALARM{background:#ad1457}
section{margin-top:2em;border-top:2px solid #ddd}
.plots svg{max-width:100%;height:auto}.note{color:#555;font-size:.9em}
td.cell{white-space:nowrap;text-align:center}td.num{white-space:nowrap}.cell.fired{background:#c8e6c9}
.cell.silenced{background:#ffe0b2}.cell.missed{background:#f5f5f5;color:#b71c1c}
.cell.not-expected{color:#757575}
.spec{font-family:ui-monospace,monospace;word-break:break-all}.row{display:flex;gap:1em;flex-wrap:wrap;align-items:flex-start}
"""


def _badge(v: Verdict) -> str:
    return f'<span class="v {v.name}">{html.escape(v.value)}</span>'


_SILENCED = " (silenced)"


def _detection_text(d: Detection) -> str:
    return f"{d.detector} ({d.signal}) after {d.time_to_detect_s:.0f} s{_SILENCED if d.silenced else ''}"


def _kv_table(rows: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _experiment_html(a: ExperimentAnalysis, switches: Mapping[str, str]) -> str:
    r, c = a.result, a.result.comparison
    e = html.escape
    numbers: list[tuple[str, str]] = [
        ("verdict", r.verdict.value),
        ("reason", r.reason),
        ("fault SPEC (as the job got it)", r.fault or "-"),
        ("ranks", str(r.world_size)),
    ]
    switchback = r.design == SWITCHBACK
    numbers.append(("design", "switchback (the job's own on vs off blocks)" if switchback else r.design))
    if c is not None:
        test = "randomisation test, on/off pairs" if switchback else "Mann-Whitney, block medians"
        numbers += [
            ("regression (median step)", f"{_pct(c.regression)}  CI [{_pct(c.ci_low)}, {_pct(c.ci_high)}]"),
            (f"p-value ({test})", f"{c.p_value:.3g}  significant: {c.significant}"),
            ("minimum detectable effect", _pct(r.mde)),
            (
                "off blocks median / p95 / p99" if switchback else "baseline median / p95 / p99",
                f"{1e3 * c.baseline.median:.2f} / {1e3 * c.baseline.p95:.2f} / "
                f"{1e3 * c.baseline.p99:.2f} ms  ({c.baseline.n} steps, warm-up {c.baseline_warmup_steps})",
            ),
            (
                "on blocks median / p95 / p99" if switchback else "fault median / p95 / p99",
                f"{1e3 * c.fault.median:.2f} / {1e3 * c.fault.p95:.2f} / "
                f"{1e3 * c.fault.p99:.2f} ms  ({c.fault.n} steps, warm-up {c.fault_warmup_steps})",
            ),
            ("onset (change point)", "-" if c.onset_step is None else f"step {c.onset_step}"),
        ]
    numbers += [
        ("detected by", r.detected_by or "-"),
        ("time to detect", _secs(r.time_to_detect_s)),
        ("site detectors fired", "; ".join(_detection_text(d) for d in r.detections) or "-"),
        ("time to remediate", _secs(r.time_to_remediate_s)),
        ("lost steps", str(r.lost_steps)),
    ]
    strag = (
        "".join(
            f"<tr><td>{s.rank}</td><td>{e(s.host)}</td><td>{'-' if s.gpu is None else s.gpu}</td>"
            f"<td>{s.score:.3f}</td><td>{e(s.kind)}</td></tr>"
            for s in r.stragglers[:20]
        )
        or '<tr><td colspan="5">no rank computes slower than its peers</td></tr>'
    )
    obs = (
        "".join(
            f"<tr><td>{o.time - a.window.start:+.1f}s</td><td>{e(o.signal)}{_SILENCED if o.silenced else ''}"
            f"</td><td>{e(o.detail)}</td></tr>"
            for o in r.observations
        )
        or '<tr><td colspan="3">nothing observed</td></tr>'
    )
    return (
        f'<section id="{e(r.name)}"><h2>{e(r.name)} {_badge(r.verdict)}</h2>'
        f'<div class="row">{_kv_table(numbers)}<div><h3>Stragglers</h3><table><tr><th>rank</th><th>host</th>'
        f"<th>GPU</th><th>score</th><th>kind</th></tr>{strag}</table>"
        "<h3>Observations (from fault start)</h3>"
        f"<table><tr><th>t</th><th>signal</th><th>detail</th></tr>{obs}"
        f"</table></div></div>{_plots_html(a, switches)}</section>"
    )


def _plots_html(a: ExperimentAnalysis, switches: Mapping[str, str]) -> str:
    from slurm_chaos.analysis import plots

    if a.fault is None:
        return '<p class="missing">The fault run left no probe files: nothing to plot.</p>'
    if a.fault_series is None or len(a.fault_series.t_start) == 0:
        return (
            '<p class="missing">The fault run recorded no step (its ranks stopped before the first '
            "one ended): nothing to plot.</p>"
        )
    return (
        f'<div class="plots"><figure>{plots.timeline_svg(a)}</figure>'
        f'<div class="row"><figure>{plots.distribution_svg(a)}</figure></div>'
        f"<figure>{plots.heatmap_svg(a, switches)}</figure></div>"
    )


# --- campaign overview -------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One detector in one experiment: ``fired``, ``silenced`` (fired, but Alertmanager silenced or
    inhibited it: nobody on call was told), ``missed`` (it did not fire after the fault began) or
    ``not-expected`` (it did not fire, and the experiment waits for none of its signals: an A/A
    control waits for none at all, so its quiet detectors missed nothing)."""

    state: str
    time_to_detect_s: float | None = None
    detail: str = ""

    @property
    def text(self) -> str:
        after = "" if self.time_to_detect_s is None else f" {self.time_to_detect_s:.0f} s"
        texts = {
            "fired": f"fired{after}",
            "silenced": f"fired (silenced){after}",
            NOT_EXPECTED: "not expected",
        }
        return texts.get(self.state, "missed")


@dataclass(frozen=True)
class Overview:
    """The campaign at a glance: a row per experiment, a column per detector.

    The columns are the site detectors that fired anywhere in the run; a run without site detectors
    gets our own detection signals instead: those the experiments expected and those monitoring
    raised (alerts, drains).
    """

    site_detectors: bool
    columns: tuple[str, ...]
    rows: tuple[tuple[ExperimentAnalysis, tuple[Cell, ...]], ...]


def _first(cells: Sequence[Cell], expected: bool = True) -> Cell:
    """The earliest firing that reached people, else the earliest silenced one, else missed (or
    not expected)."""
    for state in ("fired", "silenced"):
        times = [c for c in cells if c.state == state]
        if times:
            return min(times, key=lambda c: c.time_to_detect_s or 0.0)
    return Cell("missed" if expected else NOT_EXPECTED)


def _waits_for(e: Expectation, might_be: Callable[[str], bool]) -> bool:
    """Whether the experiment waits for a column: one of its detection signals ``might_be`` it;
    naming none, it waits for any monitoring signal where it expects a slowdown (verdict rule 4),
    for none where it does not (an A/A control)."""
    if not e.detect_signals:
        return e.expect_regression
    return any(might_be(w) for w in e.detect_signals)


def _detector_cell(a: ExperimentAnalysis, detector: str, covers: frozenset[str]) -> Cell:
    def might_be(wanted: str) -> bool:
        """A wanted signal the detector's firing may be: a kind it covers, its own name; a generic
        signal (an alert, a drain) may be its alert or its drain reason too."""
        if wanted.startswith(SIGNAL_KIND):
            return wanted[len(SIGNAL_KIND) :] in covers
        if signal_matches(detector_signal(detector), wanted):
            return True
        return not wanted.startswith((f"{Signal.DETECTOR}:", f"{Signal.REFERENCE}:"))

    return _first(
        [
            Cell("silenced" if d.silenced else "fired", d.time_to_detect_s, d.signal)
            for d in a.result.detections
            if d.detector == detector
        ],
        _waits_for(a.expectation, might_be),
    )


def _signal_cell(a: ExperimentAnalysis, column: str) -> Cell:
    e = a.expectation
    # A column of a drain or a requeue is waited for as a remediation step too.
    remedies = [s for step in e.remediation for s in REMEDIATION_SIGNALS.get(step, (step,))]
    return _first(
        [
            Cell("silenced" if o.silenced else "fired", o.after(a.window.start), o.signal)
            for o in a.result.observations
            if o.since(a.window.start) and signal_matches(o.signal, column)
        ],
        any(signal_matches(column, r) for r in remedies)
        or _waits_for(e, lambda w: signal_matches(column, w) or signal_matches(w, column)),
    )


def _covers(analyses: Sequence[ExperimentAnalysis], detector: str) -> frozenset[str]:
    """The signal kinds a detector covers, as its firings in the run say."""
    return frozenset(
        k for a in analyses for o in a.result.observations if o.detector == detector for k in o.covers
    )


def _own_columns(analyses: Sequence[ExperimentAnalysis]) -> tuple[str, ...]:
    """Expected detection signals, then raised ones no expected column already matches."""
    expected = sorted({w for a in analyses for w in a.expectation.detect_signals})
    raised = sorted(
        {
            o.signal
            for a in analyses
            for o in a.result.observations
            if o.since(a.window.start) and any(signal_matches(o.signal, w) for w in DETECTION_SIGNALS)
        }
    )
    return tuple(expected) + tuple(r for r in raised if not any(signal_matches(r, w) for w in expected))


def overview(analyses: Sequence[ExperimentAnalysis]) -> Overview:
    detectors = tuple(sorted({d.detector for a in analyses for d in a.result.detections}))
    if detectors:
        covers = {d: _covers(analyses, d) for d in detectors}
        rows = tuple((a, tuple(_detector_cell(a, d, covers[d]) for d in detectors)) for a in analyses)
        return Overview(True, detectors, rows)
    columns = _own_columns(analyses)
    return Overview(False, columns, tuple((a, tuple(_signal_cell(a, c) for c in columns)) for a in analyses))


def _cell_html(column: str, c: Cell) -> str:
    e = html.escape
    title = f' title="{e(c.detail)}"' if c.detail else ""  # the signal that fired
    attrs = f'class="cell {c.state}" data-detector="{e(column)}" data-state="{c.state}"{title}'
    return f"<td {attrs}>{e(c.text)}</td>"


def _overview_html(report: RunReport) -> str:
    e = html.escape
    grid = overview(report.analyses)
    head = "".join(f'<th class="detector" data-detector="{e(c)}">{e(c)}</th>' for c in grid.columns)
    body = ""
    for a, cells in grid.rows:
        r = a.result
        tds = "".join(_cell_html(col, c) for col, c in zip(grid.columns, cells, strict=True))
        body += (
            f'<tr data-experiment="{e(r.name)}"><td><a href="#{e(r.name)}">{e(r.name)}</a></td>'
            f'<td class="verdict">{_badge(r.verdict)}</td>{tds}'
            + "".join(f'<td class="num">{e(_row(r)[i])}</td>' for i in (3, 4, 7))
            + f"<td>{e(r.reason)}</td></tr>"
        )
    what = (
        "the site detectors that fired in this run"
        if grid.site_detectors
        else "no site detector fired in this run; our own detection signals, those expected and those raised"
    )
    return (
        f'<h2>Campaign overview</h2><p class="note">One row per experiment; detector columns: {e(what)}. '
        "A cell says whether it fired after the fault began and how soon, fired but silenced "
        "(nobody was told), or missed it; not expected: it stayed quiet where the experiment waits "
        "for none of its signals (an A/A control waits for none).</p>"
        f'<table id="overview"><thead><tr><th>experiment</th><th>verdict</th>{head}<th>regression</th>'
        f"<th>CI</th><th>remediate</th><th>reason</th></tr></thead><tbody>{body}</tbody></table>"
    )


def render_html(report: RunReport, appendix: str = "") -> str:
    """A single page with no external resources: CSS inline, plots as inline SVG. ``appendix``:
    a section rendered elsewhere (the site's history), placed after the experiments."""
    m = report.manifest
    e = html.escape
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>slurm-chaos report {e(m.run_id)}</title><style>{_CSS}</style></head><body>"
        f"<h1>slurm-chaos report</h1><p>run <b>{e(m.run_id)}</b>, site <b>{e(m.site or '-')}</b>, "
        f'started <time id="started">{e(report.started_local or "-")}</time></p>'
        + _overview_html(report)
        + "".join(_experiment_html(a, report.switches) for a in report.analyses)
        + appendix
        + "</body></html>\n"
    )


RENDERERS = {"table": render_table, "html": render_html, "json": render_json, "junit": render_junit}
