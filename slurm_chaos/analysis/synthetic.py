"""Synthetic probe output with a known truth, for tests and benchmarks.

A synchronous data-parallel job is modelled step by step: every rank computes (a shared
AR(1) noise factor for the whole job plus per-rank jitter, an exponential warm-up, a fault that
slows every rank or one rank inside a window of steps), then waits in the allreduce until the
slowest rank arrives, so every rank's ``step_time`` is the job's step time and the waiting shows up
in ``comm_time``. Files follow schema v1 (:mod:`slurm_chaos.probe.schema`).

What differs between runs and drifts within one, which the A/A comparisons of two runs cannot
tell from a fault, is modelled too (all off by default):

- ``run_drift``: the whole run is slower or faster by a log-normal factor (a VM's CPU speed, the
  nodes the job landed on, their thermal state);
- ``rank_offset``: each rank computes at its own static speed (nodes differ);
- slow wander within the run, shared by all ranks: an AR(1) with ``wander_phi`` close to 1
  (``wander``: its standard deviation), a random walk (``walk``: per-step standard deviation) and
  a sinusoid (``sine``: amplitude, ``sine_period`` steps, random phase);
- ``schedule``: a switchback schedule (:mod:`slurm_chaos.schedule`) decides the steps under fault instead
  of ``fault_start_step``/``fault_end_step``; ``step_slowdown`` slows every part of the step, so
  the job's step time rises by exactly that fraction (a known truth for the benchmarks).

The extra variation is drawn from a second generator, so runs without it are what they always were.

:func:`true_regression` gives the population value the analysis should recover.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
from scipy import signal as sps

from slurm_chaos.probe.schema import SCHEMA_VERSION, STEP_FIELDS, rank_file_name, schedule_attrs
from slurm_chaos.probe.writer import write_attrs
from slurm_chaos.rundir import (
    Expectation,
    FaultWindow,
    Observation,
    ObservationLog,
    write_observations,
    write_schedule,
)
from slurm_chaos.schedule import SwitchbackSchedule

#: The first probe schema that records a run's fault schedule.
SCHEDULE_SCHEMA = 3

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class JobModel:
    """Parameters of one synthetic run (times in seconds)."""

    ranks: int = 8
    steps: int = 1000
    compute_s: float = 0.100
    allreduce_s: float = 0.020
    optimizer_s: float = 0.004
    data_s: float = 0.002
    noise: float = 0.02  # CV of the job-wide per-step factor (shared by all ranks)
    rank_jitter: float = 0.005  # CV of each rank's own compute time
    ar_phi: float = 0.3  # lag-1 autocorrelation of the shared factor
    warmup_steps: int = 0  # e-folding length of the warm-up transient
    warmup_amplitude: float = 1.0  # step 0 is this much slower than steady state
    slowdown: float = 0.0  # every rank's compute slows by this fraction under fault
    slow_rank: int | None = None
    slow_rank_factor: float = 0.0  # the slow rank's compute slows by this fraction under fault
    fault_start_step: int = 0
    fault_end_step: int | None = None  # exclusive; None: to the end
    ranks_per_host: int = 4
    gpus: bool = False
    start_time: float = 1_700_000_000.0
    seed: int = 0
    step_slowdown: float = 0.0  # the whole step slows by this fraction under fault
    run_drift: float = 0.0  # standard deviation of the run's log speed factor
    rank_offset: float = 0.0  # standard deviation of each rank's static log compute speed
    wander: float = 0.0  # standard deviation of the slow AR(1) factor
    wander_phi: float = 0.98
    walk: float = 0.0  # per-step standard deviation of the random walk
    sine: float = 0.0  # amplitude of the sinusoid
    sine_period: float = 200.0  # steps
    schedule: SwitchbackSchedule | None = None


@dataclass(frozen=True)
class SyntheticRun:
    """Arrays of one synthetic run, ranks x steps."""

    model: JobModel
    fields: dict[str, FloatArray]
    t_start: FloatArray  # ranks x steps

    def fault_window(self) -> FaultWindow:
        m = self.model
        start = float(self.t_start[0, m.fault_start_step])
        end = (
            None
            if m.fault_end_step is None or m.fault_end_step >= m.steps
            else float(self.t_start[0, m.fault_end_step] - 1e-6)
        )
        return FaultWindow(start, end)


def _shared_factor(m: JobModel, rng: np.random.Generator) -> FloatArray:
    z = rng.standard_normal(m.steps)
    e = np.empty(m.steps)
    scale = np.sqrt(1.0 - m.ar_phi**2)
    e[0] = z[0]
    for i in range(1, m.steps):  # stationary AR(1) with unit variance
        e[i] = m.ar_phi * e[i - 1] + scale * z[i]
    return np.maximum(0.05, 1.0 + m.noise * e)


def _fault_mask(m: JobModel) -> npt.NDArray[np.bool_]:
    if m.schedule is not None:
        return m.schedule.fault_active(m.steps)
    steps = np.arange(m.steps)
    end = m.steps if m.fault_end_step is None else m.fault_end_step
    return (steps >= m.fault_start_step) & (steps < end)


def _environment(m: JobModel) -> tuple[FloatArray, FloatArray]:
    """(per-step factor of the whole job, static compute factor per rank)."""
    rng = np.random.default_rng([m.seed, 1])
    run = np.exp(m.run_drift * rng.standard_normal())
    ranks = np.exp(m.rank_offset * rng.standard_normal((m.ranks, 1)))
    t = np.arange(m.steps)
    slow = np.zeros(m.steps)
    if m.wander:
        innovation = m.wander * np.sqrt(1.0 - m.wander_phi**2) * rng.standard_normal(m.steps)
        innovation[0] = m.wander * rng.standard_normal()  # start in the stationary law
        slow += sps.lfilter([1.0], [1.0, -m.wander_phi], innovation)
    if m.walk:
        slow += np.cumsum(m.walk * rng.standard_normal(m.steps))
    if m.sine:
        slow += m.sine * np.sin(2.0 * np.pi * t / m.sine_period + rng.uniform(0.0, 2.0 * np.pi))
    return np.asarray(run * np.maximum(0.05, 1.0 + slow), dtype=np.float64), ranks


def simulate(m: JobModel) -> SyntheticRun:
    """Generate one run's step fields."""
    rng = np.random.default_rng(m.seed)
    shared = _shared_factor(m, rng)
    jitter = np.maximum(0.05, 1.0 + m.rank_jitter * rng.standard_normal((m.ranks, m.steps)))
    warm = 1.0 + (
        m.warmup_amplitude * np.exp(-np.arange(m.steps) / m.warmup_steps) if m.warmup_steps else 0.0
    )
    fault = _fault_mask(m)
    per_rank = np.ones((m.ranks, 1))
    if m.slow_rank is not None:
        per_rank[m.slow_rank] += m.slow_rank_factor
    slow = np.where(fault, 1.0 + m.slowdown, 1.0) * np.where(fault, per_rank, 1.0)
    env, rank_speed = _environment(m)
    env = env * np.where(fault, 1.0 + m.step_slowdown, 1.0)
    compute = m.compute_s * shared * warm * jitter * slow * rank_speed * env
    data = m.data_s * (1.0 + 0.05 * rng.standard_normal((m.ranks, m.steps))).clip(0.1) * env
    arrive = compute + data
    barrier = arrive.max(axis=0)
    allreduce = m.allreduce_s * (1.0 + 0.02 * rng.standard_normal(m.steps)).clip(0.1) * env
    comm = barrier - arrive + allreduce
    optimizer = np.full((m.ranks, m.steps), m.optimizer_s) * env
    step_time = compute + data + comm + optimizer
    starts = m.start_time + np.concatenate([[0.0], np.cumsum(step_time[0])[:-1]])
    fields = {
        "step_time": step_time,
        "compute_time": compute,
        "comm_time": comm,
        "optimizer_time": optimizer,
        "data_time": data,
        "checkpoint_time": np.zeros((m.ranks, m.steps)),
    }
    return SyntheticRun(m, fields, np.broadcast_to(starts, (m.ranks, m.steps)).copy())


def true_regression(base: JobModel, fault: JobModel, samples: int = 200_000) -> float:
    """Population value of median(fault job step) / median(baseline job step) - 1, by simulation.

    Uses independent draws (the AR(1) factor is stationary, so the marginal law is the same) and
    fault-on steps only, with no warm-up: the quantity the analysis estimates.
    """

    def draw(m: JobModel, seed: int) -> float:
        plain = replace(
            m, steps=samples, warmup_steps=0, ar_phi=0.0, seed=seed, fault_start_step=0, fault_end_step=None
        )
        return float(np.median(simulate_job_time(plain)))

    return draw(fault, 987_654) / draw(base, 123_456) - 1.0


def simulate_job_time(m: JobModel) -> FloatArray:
    """The job's step time series only, in chunks so large sample counts stay small in memory."""
    out = []
    chunk = max(1, 2_000_000 // m.ranks)
    for i, lo in enumerate(range(0, m.steps, chunk)):
        part = simulate(replace(m, steps=min(chunk, m.steps - lo), seed=m.seed * 1000 + i))
        out.append(part.fields["step_time"].max(axis=0))
    return np.concatenate(out)


def host_of(m: JobModel, rank: int) -> str:
    return f"node{rank // m.ranks_per_host + 1}"


def write_run(
    directory: Path, run: SyntheticRun, job_id: str = "1000", schema_version: int = SCHEMA_VERSION
) -> Path:
    """Write one ``rank-<R>.h5`` per rank: schema 2 (attributes also as ``meta``) or 1 (without)."""
    import h5py

    m = run.model
    directory.mkdir(parents=True, exist_ok=True)
    for r in range(m.ranks):
        with h5py.File(directory / rank_file_name(r), "w") as f:
            attrs = {
                "schema_version": schema_version,
                "rank": r,
                "world_size": m.ranks,
                "local_rank": r % m.ranks_per_host,
                "host": host_of(m, r),
                "job_id": job_id,
                "start_time": m.start_time,
                "mode": "train",
                "backend": "gloo",
                "restart_step": 0,
                "cpu_affinity": "0-3",
                "cpu_numa_nodes": "0",
                "numa_mismatch": False,
                "gpu_index": r % m.ranks_per_host if m.gpus else -1,
            }
            if schema_version >= SCHEDULE_SCHEMA:  # recorded as the probe records it
                attrs |= schedule_attrs(m.schedule)
            if schema_version == 1:
                f.attrs.update(attrs)
            else:
                write_attrs(f, attrs)
            g = f.create_group("steps")
            g.create_dataset("step", data=np.arange(m.steps, dtype=np.int64), maxshape=(None,))
            g.create_dataset("t_start", data=run.t_start[r], maxshape=(None,))
            for name in STEP_FIELDS:
                g.create_dataset(name, data=run.fields[name][r], maxshape=(None,))
            e = f.create_group("events")
            strings = h5py.string_dtype()
            e.create_dataset("time", data=np.zeros(0), maxshape=(None,))
            e.create_dataset("kind", data=np.zeros(0, dtype=object), dtype=strings, maxshape=(None,))
            e.create_dataset("detail", data=np.zeros(0, dtype=object), dtype=strings, maxshape=(None,))
    return directory


@dataclass(frozen=True)
class SyntheticExperiment:
    """One experiment of a synthetic campaign run directory; without a baseline, a switchback
    experiment: its fault model's schedule is written to ``fault/schedule.json``."""

    name: str
    baseline: JobModel | None
    fault: JobModel
    expectation: Expectation = field(default_factory=Expectation)
    # (signal, seconds after the fault's start, detail), or an Observation (a site detector's
    # firing, a silenced alert) whose time is seconds after the fault's start
    observations: Sequence[tuple[str, float, str] | Observation] = ()
    crashed: bool = False
    fault_name: str = "synthetic"


def write_experiment(exp_dir: Path, exp: SyntheticExperiment) -> ObservationLog:
    """Write baseline/ (or, for a switchback experiment, fault/schedule.json), fault/ and
    observations.json of one experiment."""
    if exp.baseline is not None:
        write_run(exp_dir / "baseline", simulate(exp.baseline), job_id="1000")
    elif exp.fault.schedule is not None:
        write_schedule(exp_dir / "fault", exp.fault.schedule.to_json())
    fault_run = simulate(exp.fault)
    write_run(exp_dir / "fault", fault_run, job_id="1001")
    window = fault_run.fault_window()
    log = ObservationLog(
        fault_window=window,
        observations=tuple(_at(o, window.start) for o in exp.observations),
        expectation=exp.expectation,
        crashed=exp.crashed,
        fault=exp.fault_name,
    )
    write_observations(exp_dir / "observations.json", log)
    return log


def _at(o: tuple[str, float, str] | Observation, start: float) -> Observation:
    if isinstance(o, Observation):
        return replace(o, time=start + o.time)
    signal, dt, detail = o
    return Observation(signal, start + dt, detail)


def write_run_dir(
    run_dir: Path,
    experiments: Sequence[SyntheticExperiment],
    run_id: str = "synthetic-1",
    site: str = "synthetic",
) -> Path:
    """A campaign run directory (manifest.json plus experiments/<name>/...) the report reads."""
    run_dir.mkdir(parents=True, exist_ok=True)
    manifest = {
        "run_id": run_id,
        "site": site,
        "started": "2026-01-01T00:00:00Z",
        "experiments": [e.name for e in experiments],
    }
    (run_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for exp in experiments:
        write_experiment(run_dir / "experiments" / exp.name, exp)
    return run_dir
