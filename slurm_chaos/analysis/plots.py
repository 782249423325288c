"""Plots of one experiment as inline SVG (matplotlib's SVG backend, deterministic output).

Large runs are reduced before plotting (time bins, rank groups) so the page stays small: a
1,024-rank x 10,000-step run gives a few hundred kB of HTML, not hundreds of MB.
"""

from __future__ import annotations

import io
import itertools
import re
from typing import Any

import numpy as np
import numpy.typing as npt

from slurm_chaos.analysis.experiment import ExperimentAnalysis
from slurm_chaos.analysis.regression import JobSeries
from slurm_chaos.probe.reader import RunData

FloatArray = npt.NDArray[np.float64]

MAX_POINTS = 600
MAX_HEAT_COLUMNS = 300
MAX_HEAT_ROWS = 128
MAX_TIMELINE_RANKS = 6
# Timeline and heat map share these margins so their time axes line up on the page.
_WIDE = {"left": 0.08, "right": 0.9, "bottom": 0.16, "top": 0.9}
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


def timeline_svg(a: ExperimentAnalysis) -> str:
    """Per-rank step time of the fault run over time, fault window shaded, baseline median dashed."""
    plt = _pyplot()
    x, label, t0 = _time_axis(a)
    fault = _fault_run(a)[0]
    step = fault.matrix("step_time")
    compute = fault.matrix("compute_time") if "compute_time" in fault.ranks[0].fields else step
    edges = _bins(len(x), MAX_POINTS)
    xs = _reduce(x, edges)
    fig, ax = plt.subplots(figsize=(9, 3.2))
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
    if t0:
        end = a.window.end if a.window.end is not None else t0 + float(x[-1])
        ax.axvspan(a.window.start - t0, end - t0, color="tab:red", alpha=0.12, label="fault window")
        if a.result.time_to_detect_s is not None:
            ax.axvline(
                a.window.start - t0 + a.result.time_to_detect_s, color="tab:green", lw=1, label="detected"
            )
    ax.set_xlabel(label)
    ax.set_ylabel("ms")
    ax.set_title("Step time per rank (fault run)")
    ax.legend(fontsize=7, loc="upper left", ncols=2)
    ax.set_xlim(float(x[0]), float(x[-1]) if len(x) > 1 else 1.0)
    fig.subplots_adjust(**_WIDE)
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


def heatmap_svg(a: ExperimentAnalysis) -> str:
    """Ranks x time heat map of compute time relative to the run's median (who was slow, when)."""
    plt = _pyplot()
    fault = _fault_run(a)[0]
    name = "compute_time" if "compute_time" in fault.ranks[0].fields else "step_time"
    m = fault.matrix(name)
    x, label, _ = _time_axis(a)
    # Equal time bins, so the fault window lines up with the timeline above even when steps vary in length.
    reduced = _time_columns(m, x, min(MAX_HEAT_COLUMNS, m.shape[1])) if len(x) > 1 else m
    row_edges = _bins(reduced.shape[0], MAX_HEAT_ROWS)
    grid = np.stack([np.max(reduced[lo:hi], axis=0) for lo, hi in itertools.pairwise(row_edges)])
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
        extent=(float(x[0]), float(x[-1]) if len(x) > 1 else 1.0, 0, m.shape[0]),
        vmin=0.8,
        vmax=max(1.2, float(np.nanpercentile(grid / ref, 99.5))),
    )
    # The colour bar gets its own axes so the heat map lines up with the timeline above it.
    fig.colorbar(
        image,
        cax=fig.add_axes((0.915, _WIDE["bottom"], 0.012, _WIDE["top"] - _WIDE["bottom"])),
        label="x median",
    )
    ax.set_xlabel(label)
    ax.set_ylabel("rank")
    ax.set_title(
        f"Ranks x time: {name} relative to the median"
        + (" (max over rank groups)" if len(row_edges) - 1 < m.shape[0] else "")
    )
    return _svg(fig)
