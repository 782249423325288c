"""Plots of one experiment as inline SVG (matplotlib's SVG backend, deterministic output).

Large runs are reduced before plotting (time bins, rank groups) so the page stays small: a
1,024-rank x 10,000-step run gives a few hundred kB of HTML, not hundreds of MB.
"""

from __future__ import annotations

import io
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from slurm_chaos.analysis.experiment import ExperimentAnalysis
from slurm_chaos.analysis.regression import JobSeries
from slurm_chaos.analysis.verdict import REMEDIATION_SIGNALS, signal_matches
from slurm_chaos.probe.reader import RunData
from slurm_chaos.rundir import Signal

FloatArray = npt.NDArray[np.float64]

MAX_POINTS = 600
MAX_HEAT_COLUMNS = 300
MAX_HEAT_ROWS = 128
MAX_TIMELINE_RANKS = 6
# Timeline and heat map share these margins so their time axes line up on the page.
_WIDE = {"left": 0.08, "right": 0.9, "bottom": 0.16, "top": 0.9}
# What the timeline marks, by the signals that show each: the remediation steps the verdict knows,
# and any alert or site detector firing.
MARKER_SIGNALS: dict[str, tuple[str, ...]] = {
    "drain": REMEDIATION_SIGNALS["drain"],
    "requeue": REMEDIATION_SIGNALS["requeue"],
    "alert": (Signal.ALERT_FIRING, Signal.DETECTOR),
    "resume": REMEDIATION_SIGNALS["resume"],
}
MARKER_COLOURS = {"drain": "tab:purple", "requeue": "tab:orange", "alert": "tab:red", "resume": "tab:cyan"}
_SVG_START = re.compile(r"^.*?(?=<svg)", re.S)
_SVG_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Fixed ids and no timestamps: the same data gives byte-identical SVG.
    matplotlib.rcParams.update({"svg.hashsalt": "slurm-chaos", "svg.fonttype": "none", "font.size": 9})
    return plt


def _svg(fig: object) -> str:
    plt = _pyplot()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})  # type: ignore[attr-defined]
    plt.close(fig)
    text = _SVG_START.sub("", buf.getvalue(), count=1)
    return _SVG_METADATA.sub("", text)


def _bins(n: int, max_bins: int) -> npt.NDArray[np.int64]:
    """Edges splitting n items into at most max_bins contiguous groups."""
    return np.unique(np.linspace(0, n, min(n, max_bins) + 1).astype(np.int64))


def _reduce(x: FloatArray, edges: npt.NDArray[np.int64], how: str = "median") -> FloatArray:
    f = np.median if how == "median" else np.max
    return np.asarray([f(x[..., lo:hi], axis=-1) for lo, hi in itertools.pairwise(edges)]).T


def _fault_run(a: ExperimentAnalysis) -> tuple[RunData, JobSeries]:
    if a.fault is None or a.fault_series is None:
        raise ValueError(f"{a.result.name}: no fault-run data to plot")
    return a.fault, a.fault_series


def _time_axis(a: ExperimentAnalysis) -> tuple[FloatArray, str, float]:
    t = _fault_run(a)[1].t_start
    if len(t) and np.isfinite(t).all():
        return t - t[0], "seconds since the fault run started", float(t[0])
    return np.arange(len(t), dtype=np.float64), "step", 0.0


@dataclass(frozen=True)
class Marker:
    """An observation the timeline marks: its kind (a key of MARKER_SIGNALS) and when, in seconds
    since the fault run started."""

    kind: str
    at_s: float
    signal: str


def marker_kind(signal: str) -> str | None:
    return next(
        (k for k, wanted in MARKER_SIGNALS.items() if any(signal_matches(signal, w) for w in wanted)), None
    )


def markers(a: ExperimentAnalysis) -> tuple[Marker, ...]:
    """Drains, requeues, alerts and resumes inside the fault run's steps (the observations table
    lists every one, those outside too); none when the steps carry no times."""
    x, _, t0 = _time_axis(a)
    if not t0 or not len(x):
        return ()
    found = []
    for o in a.result.observations:
        kind = marker_kind(o.signal)
        if kind is not None and float(x[0]) <= o.time - t0 <= float(x[-1]):
            found.append(Marker(kind, o.time - t0, o.signal))
    return tuple(found)


def _draw_markers(ax: Any, found: Sequence[Marker], prefix: str, span: float) -> None:
    """A labelled vertical line per marker; one legend entry per kind (ids begin with ``prefix``:
    one page holds every experiment's plots). Labels of lines close together are staggered."""
    labelled: set[str] = set()
    top = ax.get_xaxis_transform()  # x in data, y in axes fractions
    level, previous = 0, -math.inf
    for i, m in enumerate(found):
        level = (level + 1) % 3 if m.at_s - previous < 0.025 * span else 0
        previous = m.at_s
        colour = MARKER_COLOURS[m.kind]
        ax.axvline(
            m.at_s,
            color=colour,
            ls=(0, (4, 2)),
            lw=1.1,
            label=m.kind if m.kind not in labelled else "_nolegend_",
            gid=f"{prefix}-marker-{m.kind}-{i}",
        )
        labelled.add(m.kind)
        ax.text(
            m.at_s,
            0.98 - 0.22 * level,
            f" {m.kind}",
            transform=top,
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
            color=colour,
            gid=f"{prefix}-marker-label-{m.kind}-{i}",
        )


@dataclass(frozen=True)
class SwitchbackLayout:
    """What the timeline of a switchback run shows: where the fault was on, which steps were not
    measured, and how fast the nodes' agents acknowledged each change (x in the timeline's units)."""

    on_spans: tuple[tuple[float, float], ...]  # blocks with the fault on (placebo: would have been)
    held_from: float | None  # after the last block the fault stays on (detection phase)
    dropped: FloatArray  # steps not measured: transitions, late or failed acknowledgements
    placebo: bool
    pairs: int
    ack_ms: tuple[float, ...]

    @property
    def ack_text(self) -> str:
        if not self.ack_ms:
            return "no acknowledgement recorded" if not self.placebo else "placebo: nothing toggled"
        ms = sorted(self.ack_ms)
        return f"ack median {ms[len(ms) // 2]:.1f} ms, max {ms[-1]:.1f} ms ({len(ms)} changes)"


_ACK_MS = re.compile(r"\back_ms=([0-9.]+)")


def switchback_layout(run: RunData, x: FloatArray) -> SwitchbackLayout | None:
    """The layout of a run that followed a fault schedule; None for a run without one."""
    schedule = run.fault_schedule()
    if schedule is None:
        return None
    n = len(x)
    steps = np.asarray(run.ranks[0].step[:n], dtype=np.int64)
    block = schedule.block_of(steps)
    on = np.zeros(n, dtype=np.bool_)
    inside = block >= 0
    on[inside] = np.asarray(schedule.assignment, dtype=np.int64)[block[inside]] == 1
    spans = []
    for value, group in itertools.groupby(range(n), key=lambda i: bool(on[i])):
        idx = list(group)
        if value:
            spans.append((float(x[idx[0]]), float(x[min(idx[-1] + 1, n - 1)])))
    after = np.flatnonzero(steps >= schedule.end_step)
    observed = run.observed_state()
    states = schedule.step_states(steps) if observed is None else np.maximum(schedule.step_states(steps), 0)
    if observed is not None:
        states = np.where(observed[:n] == 2, 2, states)
    dropped = x[(states == 2) & inside]
    acks = tuple(
        float(m.group(1))
        for r in run.ranks
        for e in r.events
        if e.kind in ("fault_on", "fault_off") and (m := _ACK_MS.search(e.detail))
    )
    held = float(x[after[0]]) if len(after) and not schedule.placebo else None
    return SwitchbackLayout(tuple(spans), held, dropped, schedule.placebo, schedule.pairs, acks)


def _draw_switchback(ax: Any, layout: SwitchbackLayout, prefix: str) -> None:
    label = "fault on" if not layout.placebo else "placebo block (nothing toggled)"
    for i, (start, end) in enumerate(layout.on_spans):
        ax.axvspan(
            start,
            end,
            color="tab:red",
            alpha=0.12 if not layout.placebo else 0.05,
            label=label if i == 0 else "_nolegend_",
            gid=f"{prefix}-on-block-{i}",
        )
    if layout.held_from is not None:
        ax.axvspan(
            layout.held_from, ax.get_xlim()[1], color="tab:red", alpha=0.06, label="held on (detection)"
        )
    if len(layout.dropped):
        bottom = ax.get_ylim()[0]
        ax.plot(
            layout.dropped,
            np.full(len(layout.dropped), bottom),
            "|",
            color="grey",
            ms=6,
            label="step not measured",
            gid=f"{prefix}-dropped",
        )


def timeline_svg(a: ExperimentAnalysis) -> str:
    """Per-rank step time of the fault run over time, fault window shaded, baseline median dashed."""
    plt = _pyplot()
    x, label, t0 = _time_axis(a)
    fault = _fault_run(a)[0]
    step = fault.matrix("step_time")
    compute = fault.matrix("compute_time") if "compute_time" in fault.ranks[0].fields else step
    edges = _bins(len(x), MAX_POINTS)
    xs = _reduce(x, edges)
    fig, ax = plt.subplots(figsize=(9, 4.0))
    shown = [s.rank for s in a.result.stragglers[:MAX_TIMELINE_RANKS]]
    shown += [r for r in range(min(fault.world_size, MAX_TIMELINE_RANKS)) if r not in shown]
    ax.plot(xs, 1e3 * _reduce(step.max(axis=0), edges), color="black", lw=1.2, label="step (max over ranks)")
    for r in shown[:MAX_TIMELINE_RANKS]:
        ax.plot(
            xs, 1e3 * _reduce(compute[r], edges), lw=0.8, label=f"rank {r} compute ({fault.ranks[r].host})"
        )
    c = a.result.comparison
    if c is not None and c.baseline.median == c.baseline.median:
        ax.axhline(1e3 * c.baseline.median, color="grey", ls="--", lw=0.8, label="baseline median step")
    layout = switchback_layout(fault, x)
    if layout is not None:
        ax.set_xlim(float(x[0]), float(x[-1]) if len(x) > 1 else 1.0)
        _draw_switchback(ax, layout, a.result.name)
    elif t0:
        end = a.window.end if a.window.end is not None else t0 + float(x[-1])
        ax.axvspan(a.window.start - t0, end - t0, color="tab:red", alpha=0.12, label="fault window")
        if a.result.time_to_detect_s is not None:
            ax.axvline(
                a.window.start - t0 + a.result.time_to_detect_s, color="tab:green", lw=1, label="detected"
            )
    _draw_markers(ax, markers(a), a.result.name, float(x[-1] - x[0]) if len(x) > 1 else 1.0)
    ax.set_xlabel(label)
    ax.set_ylabel("ms")
    if layout is None:
        ax.set_title("Step time per rank (fault run)")
    else:
        ax.set_title(
            f"Step time per rank (switchback: {layout.pairs} on/off pairs; {layout.ack_text})", fontsize=9
        )
    # Below the axes, so it hides neither the steps nor the markers' labels.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncols=5, frameon=False)
    ax.set_xlim(float(x[0]), float(x[-1]) if len(x) > 1 else 1.0)
    # The heat map's left and right margins, so the two time axes line up on the page.
    fig.subplots_adjust(**{**_WIDE, "bottom": 0.3, "top": 0.92})
    return _svg(fig)


def distribution_svg(a: ExperimentAnalysis) -> str:
    """Histograms of the job step time: baseline after warm-up vs the fault run's steps under fault."""
    plt = _pyplot()
    c = a.result.comparison
    bw = c.baseline_warmup_steps if c else 0
    base = 1e3 * a.baseline_series.step_time[bw:]
    fault = 1e3 * _fault_run(a)[1].step_time[a.fault_steps]
    both = np.concatenate([base, fault])
    lo, hi = np.percentile(both, [0.5, 99.5]) if len(both) else (0.0, 1.0)
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, 60)
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.hist(base, bins=edges, alpha=0.55, color="tab:blue", label="baseline", density=True)
    ax.hist(fault, bins=edges, alpha=0.55, color="tab:red", label="fault run", density=True)
    if c is not None:
        ax.axvline(1e3 * c.baseline.median, color="tab:blue", lw=1)
        ax.axvline(1e3 * c.fault.median, color="tab:red", lw=1)
    ax.set_xlabel("job step time (ms)")
    ax.set_ylabel("density")
    ax.set_title("Baseline vs fault")
    ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.16, right=0.97, bottom=0.16, top=0.9)
    return _svg(fig)


def _time_columns(m: FloatArray, x: FloatArray, columns: int) -> FloatArray:
    """Median of each rank over equal-width time bins (NaN where a bin holds no step start)."""
    edges_t = np.linspace(float(x[0]), float(x[-1]), columns + 1)
    edges = np.searchsorted(x, edges_t, side="left")
    edges[-1] = len(x)
    out = np.full((m.shape[0], columns), np.nan)
    for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
        if hi > lo:
            out[:, i] = np.median(m[:, lo:hi], axis=1)
    return out


def _natural(name: str) -> tuple[object, ...]:
    """node2 before node10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


@dataclass(frozen=True)
class HeatRows:
    """The heat map's rows, grouped by switch then node: which ranks each row takes the max of,
    and the spans of rows each node and each switch covers (first row, end row, name)."""

    ranks: tuple[tuple[int, ...], ...]
    nodes: tuple[tuple[int, int, str], ...]
    switches: tuple[tuple[int, int, str], ...]
    per_node: bool  # each row is a whole node (too many ranks for a row each)


def _spans(keys: Sequence[str]) -> tuple[tuple[int, int, str], ...]:
    out: list[tuple[int, int, str]] = []
    for i, k in enumerate(keys):
        if out and out[-1][2] == k:
            out[-1] = (out[-1][0], i + 1, k)
        else:
            out.append((i, i + 1, k))
    return tuple(out)


def heat_rows(hosts: Sequence[str], switch_of: Mapping[str, str], max_rows: int = MAX_HEAT_ROWS) -> HeatRows:
    """Rows by switch, then node, then rank: a rank each, a node each when there are more ranks
    than rows, else contiguous groups of nodes. A node the site puts under no switch goes last."""
    order = sorted(
        range(len(hosts)),
        key=lambda r: (
            hosts[r] not in switch_of,
            _natural(switch_of.get(hosts[r], "")),
            _natural(hosts[r]),
            r,
        ),
    )
    groups: list[tuple[int, ...]] = [(r,) for r in order]
    per_node = len(order) > max_rows
    if per_node:
        groups = [tuple(r for r in order if hosts[r] == h) for _, _, h in _spans([hosts[r] for r in order])]
    if len(groups) > max_rows:
        edges = _bins(len(groups), max_rows)
        groups = [tuple(itertools.chain(*groups[lo:hi])) for lo, hi in itertools.pairwise(edges)]
    first = [g[0] for g in groups]
    return HeatRows(
        tuple(groups),
        _spans([hosts[r] for r in first]),
        _spans([switch_of.get(hosts[r], "") for r in first]) if switch_of else (),
        per_node,
    )


def _label_rows(ax: Any, rows: HeatRows, prefix: str) -> None:
    """Node names on the axis, lines between nodes (thicker between switches), switch names beside."""
    nodes = rows.nodes if len(rows.nodes) <= 48 else ()  # too many to read: the switches say enough
    ax.set_yticks([(lo + hi) / 2 for lo, hi, _ in nodes], [n for _, _, n in nodes], fontsize=7)
    for label, (_, _, n) in zip(ax.get_yticklabels(), nodes, strict=True):
        label.set_gid(f"{prefix}-heat-node-{n}")
    for lo, _, _ in rows.nodes[1:]:
        ax.axhline(lo, color="white", lw=0.4)
    left = ax.get_yaxis_transform()  # x in axes fractions, y in data
    for lo, hi, sw in rows.switches:
        if lo:
            ax.axhline(lo, color="white", lw=1.6)
        ax.text(
            -0.075,
            (lo + hi) / 2,
            sw or "(no switch)",
            transform=left,
            rotation=90,
            ha="center",
            va="center",
            fontsize=7,
            gid=f"{prefix}-heat-switch-{sw}",
        )
        ax.plot([-0.06, -0.06], [lo + 0.1, hi - 0.1], transform=left, color="grey", lw=1, clip_on=False)


def heatmap_svg(a: ExperimentAnalysis, switch_of: Mapping[str, str] | None = None) -> str:
    """Ranks x time heat map of compute time relative to the run's median (who was slow, when),
    rows grouped by node and, where the site says which switch each node hangs off, by switch."""
    plt = _pyplot()
    fault = _fault_run(a)[0]
    name = "compute_time" if "compute_time" in fault.ranks[0].fields else "step_time"
    m = fault.matrix(name)
    x, label, _ = _time_axis(a)
    # Equal time bins, so the fault window lines up with the timeline above even when steps vary in length.
    reduced = _time_columns(m, x, min(MAX_HEAT_COLUMNS, m.shape[1])) if len(x) > 1 else m
    rows = heat_rows([r.host for r in fault.ranks], switch_of or {})
    grid = np.stack([np.max(reduced[list(g)], axis=0) for g in rows.ranks])
    ref = float(np.nanmedian(grid)) or 1.0
    cmap = plt.get_cmap("magma").with_extremes(bad="#dddddd")
    fig, ax = plt.subplots(figsize=(9, 3.2))
    fig.subplots_adjust(**_WIDE)
    image = ax.imshow(
        grid / ref,
        aspect="auto",
        interpolation="nearest",
        cmap=cmap,
        origin="lower",
        extent=(float(x[0]), float(x[-1]) if len(x) > 1 else 1.0, 0, len(rows.ranks)),
        vmin=0.8,
        vmax=max(1.2, float(np.nanpercentile(grid / ref, 99.5))),
    )
    # The colour bar gets its own axes so the heat map lines up with the timeline above it.
    fig.colorbar(
        image,
        cax=fig.add_axes((0.915, _WIDE["bottom"], 0.012, _WIDE["top"] - _WIDE["bottom"])),
        label="x median",
    )
    _label_rows(ax, rows, a.result.name)
    if not rows.switches:
        ax.set_ylabel("node")
    ax.set_xlabel(label)
    grouped = "max over each node's ranks" if rows.per_node else "max over rank groups"
    ax.set_title(
        f"Ranks x time by {'switch and ' if rows.switches else ''}node: {name} relative to the median"
        + (f" ({grouped})" if len(rows.ranks) < m.shape[0] else "")
    )
    return _svg(fig)
