"""What `slurm-chaos compare` and `slurm-chaos report` do; the CLI only parses options and prints."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from slurm_chaos.analysis.experiment import judge_run_schedule, run_schedule
from slurm_chaos.analysis.model import Comparison, StragglerKind, StragglerScore, comparison_json
from slurm_chaos.analysis.regression import ALPHA, MIN_EFFECT, compare_runs
from slurm_chaos.analysis.report import (
    RENDERERS,
    REPORT_FILES,
    RunReport,
    analyse_run,
    exit_code,
    render_html,
    render_json,
    render_junit,
)
from slurm_chaos.analysis.straggler import STEPS_READ, straggler_scores, stragglers
from slurm_chaos.analysis.switchback import SwitchbackResult
from slurm_chaos.errors import ChaosError, UsageError
from slurm_chaos.probe.reader import RunData, read_run

COMPARE_FORMATS = ("text", "table", "json")
REPORT_FORMATS = tuple(RENDERERS)


def _compare_record(c: Comparison, slow: tuple[StragglerScore, ...], waiters: int) -> dict[str, Any]:
    record = comparison_json(c)
    record["stragglers"] = [
        {"rank": s.rank, "host": s.host, "gpu": s.gpu, "score": round(s.score, 4)} for s in slow
    ]
    record["waiting_ranks"] = waiters
    return record


def compare_and_localise(
    baseline: RunData, fault: RunData, min_effect: float = MIN_EFFECT
) -> tuple[Comparison, tuple[StragglerScore, ...]]:
    """The comparison of two runs, and every rank's straggler score where the fault acted: from
    the detected onset, or after the warm-up when no onset was found."""
    c = compare_runs(baseline, fault, min_effect=min_effect)
    start = c.fault_warmup_steps if c.onset_step is None else c.onset_step
    return c, straggler_scores(fault, slice(start, None))


def compare(dirs: list[Path], fmt: str, min_effect: float = MIN_EFFECT) -> str:
    """``slurm-chaos compare``: one directory, a switchback run judged on its own on/off blocks
    (:func:`compare_switchback`); two, a baseline and a fault run (:func:`compare_dirs`)."""
    if len(dirs) == 1:
        return compare_switchback(dirs[0], fmt)
    if len(dirs) == 2:
        return compare_dirs(dirs[0], dirs[1], fmt, min_effect)
    raise UsageError(f"compare: expected FAULT_DIR or BASELINE_DIR FAULT_DIR, got {len(dirs)} directories")


def compare_switchback(fault: Path, fmt: str) -> str:
    """Judge one run on its own fault schedule (its ``schedule.json``, or the schedule its probe
    files record); JSON or an aligned text summary. A run without a schedule is a usage error:
    it needs a baseline to be compared with."""
    if fmt not in COMPARE_FORMATS:
        raise UsageError(f"--format {fmt!r}: expected one of {', '.join(COMPARE_FORMATS)}")
    run = read_run(fault, STEPS_READ)
    schedule = run_schedule(run, fault)
    if schedule is None:
        raise UsageError(
            f"{fault}: no fault schedule (no schedule.json, none in its probe files): "
            "compare it with a baseline: slurm-chaos compare BASELINE_DIR FAULT_DIR"
        )
    result = judge_run_schedule(run, schedule)
    if fmt == "json":
        return json.dumps(result.to_json(), indent=2, sort_keys=True, allow_nan=False) + "\n"
    return _switchback_text(result)


def _switchback_text(r: SwitchbackResult) -> str:
    def pct(x: float) -> str:
        return "-" if not math.isfinite(x) else f"{100 * x:+.2f}%"

    level = f"{100 * (1 - r.alpha):.0f}%"
    rows = [
        ("design", f"{r.design}{' (placebo)' if r.placebo else ''}: {r.pairs} on/off pairs"),
        ("off median", f"{1e3 * r.off.median:.3f} ms  ({r.off.n} steps)"),
        ("on median", f"{1e3 * r.on.median:.3f} ms  ({r.on.n} steps; {r.dropped_steps} steps not measured)"),
        ("regression", f"{pct(r.regression)}  {level} CI [{pct(r.ci_low)}, {pct(r.ci_high)}]"),
        ("p-value", f"{r.p_value:.3g}"),
        ("significant", "yes" if r.significant else "no"),
        ("mde", "-" if not math.isfinite(r.mde) else f"{100 * r.mde:.2f}% (80% power)"),
        ("effect", r.effect.value + (f" ({r.reason})" if r.reason else "")),
        (
            "stragglers",
            ", ".join(f"rank {s.rank} on {s.host} (+{100 * s.score:.1f}% when on)" for s in r.stragglers)
            or "none",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows) + "\n"


def compare_dirs(baseline: Path, fault: Path, fmt: str, min_effect: float = MIN_EFFECT) -> str:
    """Compare two probe run directories; JSON or an aligned text summary.

    ``min_effect`` is the practical threshold below which no change is called significant.
    """
    if fmt not in COMPARE_FORMATS:
        raise UsageError(f"--format {fmt!r}: expected one of {', '.join(COMPARE_FORMATS)}")
    c, scores = compare_and_localise(read_run(baseline, STEPS_READ), read_run(fault, STEPS_READ), min_effect)
    slow = stragglers(scores)
    waiters = sum(s.kind is StragglerKind.WAITS for s in scores)
    record = _compare_record(c, slow, waiters)
    if fmt == "json":
        return json.dumps(record, indent=2, sort_keys=True) + "\n"
    return _compare_text(c, slow, waiters)


def _compare_text(c: Comparison, slow: tuple[StragglerScore, ...], waiters: int) -> str:
    def pct(x: float) -> str:
        return "-" if not math.isfinite(x) else f"{100 * x:+.2f}%"

    rows = [
        (
            "baseline median",
            f"{1e3 * c.baseline.median:.3f} ms  (p95 {1e3 * c.baseline.p95:.3f}, "
            f"p99 {1e3 * c.baseline.p99:.3f}; {c.baseline.n} steps after {c.baseline_warmup_steps} warm-up)",
        ),
        (
            "fault median",
            f"{1e3 * c.fault.median:.3f} ms  (p95 {1e3 * c.fault.p95:.3f}, "
            f"p99 {1e3 * c.fault.p99:.3f}; {c.fault.n} steps after {c.fault_warmup_steps} warm-up)",
        ),
        (
            "regression",
            f"{pct(c.regression)}  {100 * (1 - ALPHA):.0f}% CI [{pct(c.ci_low)}, {pct(c.ci_high)}]",
        ),
        ("p-value", f"{c.p_value:.3g}"),
        (
            "significant",
            "yes"
            if c.significant
            else "no" + (f" ({c.inconclusive_reason})" if c.inconclusive_reason else ""),
        ),
        ("onset", "-" if c.onset_step is None else f"step {c.onset_step}"),
        ("stragglers", ", ".join(f"rank {s.rank} on {s.host} (score {s.score:.2f})" for s in slow) or "none"),
        ("waiting ranks", str(waiters)),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows) + "\n"


def report_dir(
    run_dir: Path, fmt: str, out: Path | None, report: RunReport | None = None, appendix: str = ""
) -> tuple[str, int]:
    """Write report.html, report.json and report.xml into ``run_dir``; return (text to print, exit code).

    ``out``, when given, receives the requested format too (for table: the table). The text printed
    is the table for ``table``, the document itself for ``json`` and ``junit``, and the page's path
    for ``html``. ``report``: the run's analysis where the caller made it already; ``appendix``: a
    section for the page (the site's history, which the campaign renders).
    """
    if fmt not in REPORT_FORMATS:
        raise UsageError(f"--format {fmt!r}: expected one of {', '.join(REPORT_FORMATS)}")
    report = report if report is not None else analyse_run(run_dir)
    documents = {
        "html": render_html(report, appendix),
        "json": render_json(report),
        "junit": render_junit(report),
    }
    rendered = documents.get(fmt) or RENDERERS[fmt](report)
    targets = [(run_dir / REPORT_FILES[kind], text) for kind, text in documents.items()]
    for path, text in targets + ([(out, rendered)] if out is not None else []):
        try:
            path.write_text(text)
        except OSError as exc:
            raise ChaosError(f"{path}: cannot write the report ({exc.strerror or exc})") from exc
    printed = f"wrote {out or run_dir / REPORT_FILES['html']}\n" if fmt == "html" else rendered
    return printed, exit_code(report.results)
