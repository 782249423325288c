"""Analyse one experiment directory of a campaign run: baseline/, fault/ and observations.json.

A switchback experiment has no baseline/: its fault job followed a schedule of on/off blocks
(``fault/schedule.json``, or the probe's own record of it) and is judged on its own on against
its off steps (:mod:`.switchback`); the verdict takes that result as its comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from slurm_chaos.analysis.busbw import run_busbw
from slurm_chaos.analysis.model import (
    BETWEEN_RUNS,
    BusbwResult,
    Comparison,
    ExperimentResult,
    StragglerKind,
    StragglerScore,
    Verdict,
)
from slurm_chaos.analysis.regression import MIN_EFFECT, JobSeries, compare_series, job_series
from slurm_chaos.analysis.straggler import STEPS_READ, straggler_scores, stragglers
from slurm_chaos.analysis.switchback import RankContrast, SwitchbackResult, judge_switchback_run
from slurm_chaos.analysis.verdict import Judgement, detections, judge
from slurm_chaos.errors import DataError
from slurm_chaos.probe.reader import MissingProbeFiles, RunData, read_run
from slurm_chaos.rundir import (
    OBSERVATIONS,
    Expectation,
    FaultWindow,
    Observation,
    ObservationLog,
    Role,
    Signal,
    load_injections,
    load_observations,
    read_schedule,
    schedule_path,
)
from slurm_chaos.schedule import DESIGN as SWITCHBACK
from slurm_chaos.schedule import OFF, ON, SwitchbackSchedule, schedule_from_json

FloatArray = npt.NDArray[np.float64]
# The comparison's and the plots' step fields, the events the observations take, and an allreduce
# run's per-size rows (its bus bandwidth).
EXPERIMENT_READ = replace(STEPS_READ, events=True, allreduce=True)

# The probe's own event kinds, as observation signals (schema v1 EVENT_KINDS).
PROBE_EVENT_SIGNALS = {
    "checkpoint_failed": "checkpoint_failed",
    "checkpoint_hang": "checkpoint_hang",
    "resumed": Signal.RESUMED_FROM_CHECKPOINT,
    "gpu_xid": "gpu_xid",
    "gpu_ecc": "gpu_ecc",
    "gpu_throttle": "gpu_throttle",
    "numa_mismatch": "numa_mismatch",
}


@dataclass(frozen=True)
class ExperimentAnalysis:
    """An experiment's result plus what the plots need.

    For a switchback experiment ``baseline`` is None and ``baseline_series`` holds the fault job's
    own measured off steps; ``fault_steps`` its measured on steps."""

    result: ExperimentResult
    baseline: RunData | None  # None: a switchback experiment (no baseline job)
    fault: RunData | None  # None: the fault job left no probe files
    baseline_series: JobSeries
    fault_series: JobSeries | None
    window: FaultWindow
    fault_steps: npt.NDArray[np.bool_]  # the fault run's steps that count as under fault
    # What the experiment expected detected (the report's overview names each expected signal).
    expectation: Expectation = field(default_factory=Expectation)
    # The switchback result (None for a between-runs experiment).
    switchback: SwitchbackResult | None = None


# The line of the rendered fault script (sbatch_templates/fault.sbatch.j2) that gives Slurm the SPEC.
_CHAOS_OPTION = "#SBATCH --chaos="


def rendered_spec(exp_dir: Path) -> str | None:
    """The SPEC the fault job was given, from its rendered script (``${checkpoint_dir}`` and the
    like filled in), or None when the script is missing or carries no --chaos line.

    observations.json names the fault as the experiment file wrote it, placeholders and all;
    an admin reading the report wants the values the job got.
    """
    try:
        text = (exp_dir / f"{Role.FAULT}.sbatch").read_text()
    except (OSError, UnicodeDecodeError):
        return None
    specs = [
        line[len(_CHAOS_OPTION) :].strip() for line in text.splitlines() if line.startswith(_CHAOS_OPTION)
    ]
    return specs[0] if specs and specs[0] else None


def _missing(exp_dir: Path, side: str) -> MissingProbeFiles:
    return MissingProbeFiles(f"{exp_dir.name}: missing {side} run ({exp_dir / side} does not exist)")


def _read_side(exp_dir: Path, side: str) -> RunData:
    directory = exp_dir / side
    if not directory.is_dir():
        raise _missing(exp_dir, side)
    return read_run(directory, EXPERIMENT_READ)


def _without_fault_run(
    name: str, log: ObservationLog, baseline: RunData | None, missing: MissingProbeFiles, design: str
) -> ExperimentAnalysis:
    """A fault job that left no probe files (it never ran, or died before its first flush) did
    not finish its training: NOT RECOVERED, with what was observed, not a failed report."""
    result = ExperimentResult(
        design=design,
        name=name,
        fault=log.fault,
        verdict=Verdict.NOT_RECOVERED,
        reason=f"the fault run left no probe data ({missing}): training never ran or died early",
        comparison=None,
        crashed=True,
        world_size=0 if baseline is None else baseline.world_size,
        observations=log.observations,
        detections=detections(log),
    )
    b = _empty_series() if baseline is None else job_series(baseline)
    return ExperimentAnalysis(
        result, baseline, None, b, None, log.fault_window, np.zeros(0, dtype=np.bool_), log.expectation
    )


def probe_observations(run: RunData) -> tuple[Observation, ...]:
    """The probe's own events and NUMA check, as observations (one per signal and host)."""
    seen: dict[tuple[str, str], Observation] = {}
    for r in run.ranks:
        found = [
            Observation(
                PROBE_EVENT_SIGNALS[e.kind], e.time, f"{r.host} rank {r.rank}: {e.detail}".strip(": ")
            )
            for e in r.events
            if e.kind in PROBE_EVENT_SIGNALS
        ]
        if r.attrs.get("numa_mismatch") is True:
            start = r.attrs.get("start_time")
            t = float(start) if isinstance(start, (int, float)) else float(np.nan_to_num(r.t_start[:1]).sum())
            found.append(
                Observation(
                    "numa_mismatch",
                    t,
                    f"{r.host} rank {r.rank}: cpus {r.attrs.get('cpu_affinity')} "
                    f"on NUMA {r.attrs.get('cpu_numa_nodes')}",
                )
            )
        for o in found:
            key = (o.signal, r.host)
            if key not in seen or o.time < seen[key].time:
                seen[key] = o
    return tuple(seen.values())


def lost_steps(run: RunData) -> int:
    """Steps run more than once: the work redone after resuming from an older checkpoint."""
    counts = [len(r.step) - len(np.unique(r.step)) for r in run.ranks]
    return max(counts) if counts else 0


def _fault_steps(series: JobSeries, window: FaultWindow, warmup: int) -> npt.NDArray[np.bool_]:
    """Steps inside the fault window after the warm-up; every post-warm-up step if times are unknown."""
    t = series.t_start
    mask = np.ones(len(t), dtype=np.bool_)
    if len(t) and np.isfinite(t).all():
        inside = (t >= window.start) & (t <= (np.inf if window.end is None else window.end))
        mask = inside if inside[warmup:].sum() >= 5 else mask
    mask[:warmup] = False
    return mask if mask.any() else np.ones(len(t), dtype=np.bool_)


def analyse_experiment(
    exp_dir: Path, name: str, min_effect: float = MIN_EFFECT, family: tuple[float, int] | None = None
) -> ExperimentAnalysis:
    """Compare, localise stragglers and judge one experiment.

    ``family``: for a switchback experiment judged as one of a campaign's in-job tests, its
    Holm-adjusted p-value and the number of tests (:func:`.report.analyse_run`)."""
    if not exp_dir.is_dir():
        raise DataError(f"{name}: experiment directory {exp_dir} does not exist")
    log = load_observations(exp_dir / OBSERVATIONS)
    log = replace(log, fault=rendered_spec(exp_dir) or log.fault)
    # Switchback: the campaign recorded a schedule, or there is no baseline and the probe did.
    switchback = read_schedule(exp_dir / Role.FAULT) is not None
    has_baseline = (exp_dir / Role.BASELINE).exists()
    baseline = None if switchback or not has_baseline else _read_side(exp_dir, "baseline")
    try:
        fault = _read_side(exp_dir, "fault")
    except MissingProbeFiles as missing:
        if baseline is None and not switchback:
            raise _missing(exp_dir, "baseline") from missing
        return _without_fault_run(name, log, baseline, missing, SWITCHBACK if switchback else BETWEEN_RUNS)
    if baseline is None:
        schedule = run_schedule(fault, exp_dir / Role.FAULT)
        if schedule is None:  # neither a baseline nor a schedule
            raise _missing(exp_dir, "baseline")
        return _switchback_analysis(exp_dir, name, log, fault, schedule, family)
    if baseline.world_size != fault.world_size:
        raise DataError(
            f"{name}: baseline has {baseline.world_size} ranks, fault run has {fault.world_size}; "
            "they must run the same job shape"
        )
    b, f = job_series(baseline), job_series(fault)
    comparison = compare_series(b, f, log.fault_window, min_effect=min_effect)
    steps = _fault_steps(f, log.fault_window, comparison.fault_warmup_steps)
    scores = straggler_scores(fault, steps)
    log = replace(log, observations=_merged(log, probe_observations(fault)))
    lost = lost_steps(fault)
    bandwidth = busbw_result(baseline, fault, log.expectation)
    j = judge(comparison, log, lost, load_injections(exp_dir / "fault"), bandwidth)
    result = _judged(name, log, fault, j, comparison, stragglers(scores), lost, busbw=bandwidth)
    return ExperimentAnalysis(result, baseline, fault, b, f, log.fault_window, steps, log.expectation)


def _judged(
    name: str,
    log: ObservationLog,
    fault: RunData,
    j: Judgement,
    comparison: Comparison | None,
    ranked: tuple[StragglerScore, ...],
    lost: int,
    *,
    design: str = BETWEEN_RUNS,
    mde: float | None = None,
    p_adjusted: float | None = None,
    busbw: BusbwResult | None = None,
) -> ExperimentResult:
    """The result of an experiment whose fault job ran: its judgement, the step-time comparison,
    the stragglers and what the observations say."""
    return ExperimentResult(
        name=name,
        fault=log.fault,
        verdict=j.verdict,
        reason=j.reason,
        comparison=comparison,
        stragglers=ranked,
        detected_by=j.detected_by,
        time_to_detect_s=j.time_to_detect_s,
        time_to_remediate_s=j.time_to_remediate_s,
        lost_steps=lost,
        crashed=log.crashed,
        world_size=fault.world_size,
        observations=log.observations,
        detections=j.detections,
        design=design,
        mde=mde,
        p_adjusted=p_adjusted,
        busbw=busbw,
    )


def busbw_result(baseline: RunData | None, fault: RunData, e: Expectation) -> BusbwResult | None:
    """Both runs' bus bandwidth and the hypothesis' floor; None where neither is an allreduce sweep."""
    b = None if baseline is None else run_busbw(baseline)
    f = run_busbw(fault)
    if b is None and f is None:
        return None
    return BusbwResult(b, f, e.min_busbw_gbps)


def run_schedule(run: RunData, job_dir: Path) -> SwitchbackSchedule | None:
    """The schedule a switchback job followed: the probe's record of it (``fault_schedule`` in its
    files), else the one the campaign wrote (``schedule.json``); None: neither."""
    recorded = run.fault_schedule()
    if recorded is not None:
        return recorded
    raw = read_schedule(job_dir)
    return None if raw is None else schedule_from_json(raw, source=str(schedule_path(job_dir)))


def judge_run_schedule(run: RunData, schedule: SwitchbackSchedule) -> SwitchbackResult:
    """:func:`.switchback.judge_switchback_run` with the states the probe observed, if it did."""
    return judge_switchback_run(run, schedule, observed_state=run.observed_state())


def switchback_stragglers(result: SwitchbackResult) -> tuple[StragglerScore, ...]:
    """The ranks that compute significantly slower while the fault is on, slowest first, as
    straggler entries (kind SLOWER_WHEN_ON: the score is that slowdown, a fraction)."""
    return tuple(_straggler(r) for r in result.stragglers)


def _straggler(r: RankContrast) -> StragglerScore:
    return StragglerScore(r.rank, r.host, None, r.score, np.nan, np.nan, StragglerKind.SLOWER_WHEN_ON)


def _empty_series() -> JobSeries:
    return JobSeries(np.zeros(0), np.zeros(0))


def _switchback_analysis(
    exp_dir: Path,
    name: str,
    log: ObservationLog,
    fault: RunData,
    schedule: SwitchbackSchedule,
    family: tuple[float, int] | None = None,
) -> ExperimentAnalysis:
    """Judge a switchback experiment on its fault job alone."""
    sb = judge_run_schedule(fault, schedule)
    if family is not None:
        sb = sb.adjusted(*family)
    comparison = sb.comparison()
    f = job_series(fault)
    states = schedule.step_states(np.asarray(fault.ranks[0].step[: len(f.step_time)], dtype=np.int64))
    off = states == OFF
    log = replace(log, observations=_merged(log, probe_observations(fault)))
    lost = lost_steps(fault)
    j = judge(comparison, log, lost, load_injections(exp_dir / Role.FAULT))
    result = _judged(
        name, log, fault, j, comparison, switchback_stragglers(sb), lost,
        design=SWITCHBACK, mde=sb.mde, p_adjusted=sb.p_adjusted,
    )  # fmt: skip
    own_off = JobSeries(f.step_time[off], f.t_start[off])
    return ExperimentAnalysis(
        result, None, fault, own_off, f, log.fault_window, states == ON, log.expectation, sb
    )


def _merged(log: ObservationLog, extra: tuple[Observation, ...]) -> tuple[Observation, ...]:
    everything = set(log.observations) | set(extra)
    return tuple(sorted(everything, key=lambda o: (o.time, o.signal, o.detail)))
