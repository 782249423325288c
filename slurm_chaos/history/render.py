"""The history as people and programs read it: a table, JSON or one self-contained HTML page per
experiment and window, and a comparison's findings and improvements side by side."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from slurm_chaos.history.compare import Change, HistoryComparison, secs
from slurm_chaos.history.records import ExperimentRecord, Firing, Window

HISTORY_FORMATS = ("text", "json", "html")
COMPARE_FORMATS = ("text", "json")


def when(w: Window) -> str:
    """The window's start, UTC ('-' when the run did not record it)."""
    if w.started is None:
        return "-"
    return datetime.fromtimestamp(w.started, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _effect(e: ExperimentRecord) -> str:
    ci = "" if e.ci_low is None or e.ci_high is None else f" [{_pct(e.ci_low)}, {_pct(e.ci_high)}]"
    return f"{_pct(e.effect)}{ci}"


def _firings(e: ExperimentRecord) -> str:
    """Each detector's first firing: ``nhc 5 s, alerts 40 s (silenced)``."""
    firsts = [f for f in (e.first_firing(d) for d in e.detectors) if f is not None]
    return ", ".join(
        f"{f.detector} {secs(f.time_to_detect_s)}{' (silenced)' if f.silenced else ''}" for f in firsts
    )


def _detect(e: ExperimentRecord) -> str:
    own = "-" if e.time_to_detect_s is None else f"{secs(e.time_to_detect_s)} ({e.detected_by or '?'})"
    return own if not e.firings else f"{own}; {_firings(e)}"


def rows_by_experiment(windows: Sequence[Window]) -> dict[str, list[tuple[Window, ExperimentRecord]]]:
    """Experiment -> its (window, record) pairs, oldest first; experiments in the order first run."""
    rows: dict[str, list[tuple[Window, ExperimentRecord]]] = {}
    for w in windows:
        for e in w.experiments:
            rows.setdefault(e.name, []).append((w, e))
    return rows


_HEADER = ("WINDOW", "STARTED", "SLURM", "VERDICT", "DETECT", "REMEDIATE", "LOST", "EFFECT", "MDE")


def _cells(w: Window, e: ExperimentRecord) -> tuple[str, ...]:
    mde = "-" if e.mde is None else f"{100 * e.mde:.1f}%"
    return (
        w.run_id,
        when(w),
        w.slurm_version or "-",
        e.verdict.value,
        _detect(e),
        secs(e.time_to_remediate_s),
        str(e.lost_steps),
        _effect(e),
        mde,
    )


def history_text(site: str, windows: Sequence[Window]) -> str:
    """Per experiment, one aligned row per window, oldest first."""
    lines = [f"history of site {site}: {len(windows)} windows", ""]
    for name, pairs in rows_by_experiment(windows).items():
        rows = [_HEADER] + [_cells(w, e) for w, e in pairs]
        widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADER))]
        lines.append(name)
        lines += ["  " + "  ".join(c.ljust(n) for c, n in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines.append("")
    return "\n".join(lines)


def _firing_json(f: Firing) -> dict[str, Any]:
    return {
        "detector": f.detector,
        "signal": f.signal,
        "time_to_detect_s": f.time_to_detect_s,
        "silenced": f.silenced,
    }


def record_json(e: ExperimentRecord) -> dict[str, Any]:
    return {
        "name": e.name,
        "verdict": e.verdict.value,
        "reason": e.reason,
        "fault": e.fault,
        "design": e.design,
        "effect": e.effect,
        "ci_low": e.ci_low,
        "ci_high": e.ci_high,
        "p_value": e.p_value,
        "mde": e.mde,
        "detected_by": e.detected_by,
        "time_to_detect_s": e.time_to_detect_s,
        "time_to_remediate_s": e.time_to_remediate_s,
        "lost_steps": e.lost_steps,
        "crashed": e.crashed,
        "straggler": e.straggler,
        "expect_regression": e.expect_regression,
        "detect_within_s": e.detect_within_s,
        "remediate_within_s": e.remediate_within_s,
        "detections": [_firing_json(f) for f in e.firings],
    }


def window_json(w: Window) -> dict[str, Any]:
    return {
        "run_id": w.run_id,
        "run_dir": w.run_dir,
        "started": when(w) if w.started is not None else None,
        "slurm_version": w.slurm_version,
        "tool_version": w.tool_version,
        "kind": w.kind,
        "nodes": list(w.nodes),
    }


def history_json(site: str, windows: Sequence[Window]) -> str:
    """``{"site", "windows": [...], "experiments": {name: [{"window": run id, ...record}]}}``."""
    doc = {
        "site": site,
        "windows": [window_json(w) for w in windows],
        "experiments": {
            name: [{"window": w.run_id, **record_json(e)} for w, e in pairs]
            for name, pairs in rows_by_experiment(windows).items()
        },
    }
    return json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n"


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1100px}"
    "table{border-collapse:collapse;margin:.5em 0}"
    "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-size:.9em}th{background:#f3f3f3}"
)


def history_html(site: str, windows: Sequence[Window]) -> str:
    """One self-contained page: a table per experiment, a row per window."""
    e = html.escape
    sections = []
    for name, pairs in rows_by_experiment(windows).items():
        head = "".join(f"<th>{e(h.lower())}</th>" for h in _HEADER)
        body = "".join(
            f'<tr data-window="{e(w.run_id)}">' + "".join(f"<td>{e(c)}</td>" for c in _cells(w, r)) + "</tr>"
            for w, r in pairs
        )
        sections.append(
            f'<section id="{e(name)}"><h2>{e(name)}</h2><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></section>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>slurm-chaos history {e(site)}</title><style>{_CSS}</style></head><body>"
        f"<h1>slurm-chaos history</h1><p>site <b>{e(site)}</b>, {len(windows)} windows</p>"
        + "".join(sections)
        + "</body></html>\n"
    )


def _change_lines(c: Change, window: str) -> list[str]:
    return [
        f"  {c.experiment}: {c.what}: {c.reason}",
        f"      {c.before_window}: {c.before}",
        f"      {window}: {c.now}",
    ]


def comparison_text(cmp: HistoryComparison) -> str:
    w = cmp.window
    earlier = ", ".join(x.run_id for x in cmp.earlier) or "none"
    lines = [f"site {cmp.site}: window {w.run_id} ({when(w)}) against {len(cmp.earlier)} earlier: {earlier}"]
    lines += ["rules:"] + [f"  - {r}" for r in cmp.rules]
    for title, changes in (("findings", cmp.findings), ("improvements", cmp.improvements)):
        lines.append(f"{title}: {len(changes)}")
        for c in changes:
            lines += _change_lines(c, w.run_id)
    if cmp.new:
        lines.append(f"new this window (nothing to compare): {', '.join(cmp.new)}")
    if cmp.not_run:
        lines.append(f"not run this window: {', '.join(cmp.not_run)}")
    if not cmp.earlier:
        lines.append("no earlier window: nothing to compare")
    return "\n".join(lines) + "\n"


def _change_json(c: Change, window: str) -> dict[str, Any]:
    return {
        "experiment": c.experiment,
        "what": c.what,
        "detector": c.detector,
        "reason": c.reason,
        "before": {"window": c.before_window, "value": c.before},
        "now": {"window": window, "value": c.now},
    }


def comparison_json(cmp: HistoryComparison) -> str:
    run_id = cmp.window.run_id
    doc = {
        "site": cmp.site,
        "window": window_json(cmp.window),
        "earlier": [window_json(w) for w in cmp.earlier],
        "rules": list(cmp.rules),
        "findings": [_change_json(c, run_id) for c in cmp.findings],
        "improvements": [_change_json(c, run_id) for c in cmp.improvements],
        "new": list(cmp.new),
        "not_run": list(cmp.not_run),
        "exit_code": cmp.exit_code,
    }
    return json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n"


# ------------------------------------------------------------------ the report's trend section

#: How many windows a report's trend shows at most (this one and the ones before it).
TREND_WINDOWS = 10


def _sparkline(values: Sequence[float | None], fmt: str, label: str) -> str:
    """A small inline SVG line over the windows, oldest first, this window's point marked; a
    window with no value leaves a gap. No scripts, no external resources."""
    width, height, pad = 180, 36, 4
    known = [v for v in values if v is not None]
    if not known:
        return f'<span class="trend-none" aria-label="{html.escape(label)}">-</span>'
    lo, hi = min(known), max(known)
    span = (hi - lo) or 1.0
    step = (width - 2 * pad) / max(len(values) - 1, 1)

    def xy(i: int, v: float) -> tuple[float, float]:
        return pad + i * step, height - pad - (v - lo) / span * (height - 2 * pad)

    runs: list[list[tuple[float, float]]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            runs.append([])
        else:
            runs[-1].append(xy(i, v))
    paths = "".join(
        '<polyline fill="none" stroke="#555" stroke-width="1.5" points="'
        + " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
        + '"/>'
        for run in runs
        if len(run) > 1
    )
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="#555"/>' for run in runs for x, y in run)
    last = values[-1]
    mark = ""
    if last is not None:
        x, y = xy(len(values) - 1, last)
        mark = f'<circle class="now" cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="#c0392b"/>'
    title = html.escape(f"{label}: " + ", ".join("-" if v is None else fmt.format(v) for v in values))
    return (
        f'<svg class="trend" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f"<title>{title}</title>{paths}{dots}{mark}</svg>"
    )


def _ends(values: Sequence[float | None], fmt: str) -> str:
    """The first and this window's value beside a line, in words."""
    first = next((v for v in values if v is not None), None)
    last = values[-1] if values else None
    text = " -> ".join("-" if v is None else fmt.format(v) for v in (first, last))
    return f'<span class="trend-ends">{html.escape(text)}</span>'


def trend_html(cmp: HistoryComparison, history: Sequence[Window]) -> str:
    """The report's section on the site's history: per experiment of this window, its time to
    detect and its effect over ``history`` (the windows up to this one, oldest first: a small line
    each, this window marked), then the regressions and improvements of ``cmp`` (what `history
    --compare` names). Empty with no earlier window."""
    if not cmp.earlier:
        return ""
    e = html.escape
    windows = list(history)[-TREND_WINDOWS:]
    rows = []
    for rec in cmp.window.experiments:
        series = [w.experiment(rec.name) for w in windows]
        detect = [r.time_to_detect_s if r is not None else None for r in series]
        effect = [r.effect * 100 if r is not None and r.effect is not None else None for r in series]
        verdicts = " ".join(r.verdict.value if r is not None else "-" for r in series)
        rows.append(
            f'<tr data-experiment="{e(rec.name)}"><td>{e(rec.name)}</td>'
            f"<td>{_sparkline(detect, '{:.0f} s', 'time to detect')} {_ends(detect, '{:.0f} s')}</td>"
            f"<td>{_sparkline(effect, '{:+.1f}%', 'effect')} {_ends(effect, '{:+.1f}%')}</td>"
            f"<td>{e(verdicts)}</td></tr>"
        )

    def changes(title: str, cls: str, items: Sequence[Change]) -> str:
        if not items:
            return f'<p class="{cls}">{title}: none</p>'
        lis = "".join(
            f"<li><b>{e(c.experiment)}</b>: {e(c.what)}: {e(c.reason)} "
            f"({e(c.before_window)}: {e(c.before)}; now: {e(c.now)})</li>"
            for c in items
        )
        return f'<p class="{cls}">{title}: {len(items)}</p><ul class="{cls}">{lis}</ul>'

    ids = ", ".join(w.run_id for w in cmp.earlier)
    return (
        '<section id="history"><h2>Since the last window</h2>'
        f"<p>site <b>{e(cmp.site)}</b>: this window judged against {e(ids)} (the rules of "
        f"<code>slurm-chaos history --compare</code>); the lines run over the last {len(windows)} "
        "windows, oldest first, this one in red.</p>"
        "<table><thead><tr><th>experiment</th><th>time to detect</th><th>effect</th><th>verdicts</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        + changes("regressions", "regressions", cmp.findings)
        + changes("improvements", "improvements", cmp.improvements)
        + "</section>"
    )
