"""Run experiments and campaigns: baseline once per job shape, then each fault job, watched and rolled back.

Stages, in order: render -> submit/queue -> (inject controller faults, watch) -> collect -> analyse.
The time spent in each stage is recorded per experiment in the manifest (`timings`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from slurm_chaos.analysis.model import (
    Expectation,
    FaultWindow,
    Observation,
    ObservationLog,
    write_observations,
)
from slurm_chaos.campaign import controller, remediation
from slurm_chaos.campaign.observe import HEALTHCHECK_PREFIX, Watcher
from slurm_chaos.campaign.progress import Progress
from slurm_chaos.errors import ChaosError, SlurmError
from slurm_chaos.experiment import Experiment
from slurm_chaos.faults.spec import FaultRequest, parse_spec
from slurm_chaos.render import check_limits, fault_spec, render_job
from slurm_chaos.rundir import JobRecord, Manifest, experiment_dir, new_run_id, read_manifest, write_manifest
from slurm_chaos.runner import Runner
from slurm_chaos.site import Site
from slurm_chaos.slurm.backend import Scheduler
from slurm_chaos.slurm.model import JobInfo, JobState

log = logging.getLogger(__name__)

POLL_S = 0.5
# Remediation steps the engine itself observes, by the signal it records for each.
REMEDIATION_SIGNALS = {
    "reschedule_same_switch": "rescheduled_same_switch",
    "avoid_slow_node": "avoided_slow_node",
}
OBSERVATIONS = "observations.json"


@dataclass(frozen=True)
class Shape:
    """Jobs of the same shape share one baseline."""

    nodes: int
    tasks_per_node: int
    steps: int
    mode: str

    @property
    def label(self) -> str:
        return f"n{self.nodes}-t{self.tasks_per_node}-s{self.steps}-{self.mode}"


def shape_of(site: Site, exp: Experiment) -> Shape:
    return Shape(
        exp.nodes, exp.tasks_per_node or site.probe.tasks_per_node, exp.steps or site.probe.steps, exp.mode
    )


@dataclass
class Campaign:
    """Everything one campaign run needs; built by `open_campaign`."""

    site: Site
    experiments: list[Experiment]
    run_dir: Path
    scheduler: Scheduler
    runner: Runner
    control: controller.NodeControl
    manifest: Manifest
    progress: Progress
    time_budget_s: float | None = None
    active: set[str] = field(default_factory=set)

    @property
    def journal(self) -> controller.ControllerJournal:
        return controller.ControllerJournal(self.run_dir / "controller-journal.jsonl")

    def save(self) -> None:
        write_manifest(self.run_dir, self.manifest)


def open_campaign(
    site: Site,
    experiments: list[Experiment],
    run_dir: Path | None,
    resume: bool,
    scheduler: Scheduler,
    runner: Runner,
    control: controller.NodeControl,
    kind: str,
    progress: Progress,
    time_budget_s: float | None = None,
    min_effect_floor: float = 0.0,
) -> Campaign:
    """A new run directory (or the one to resume), with every experiment checked before anything runs.

    ``min_effect_floor`` (from an A/A calibration of the cluster) raises the practical threshold of
    every comparison to what run-to-run noise alone does not reach.
    """
    for exp in experiments:
        check_limits(site, exp)
        spec = fault_spec(site, exp, "fault", "check")
        if spec:
            parse_spec(spec)
    if resume:
        if run_dir is None:
            raise ChaosError("--resume needs the run directory")
        manifest = read_manifest(run_dir)
        manifest.interrupted = False
        manifest.finished = None
    else:
        label = experiments[0].name if len(experiments) == 1 else kind
        run_id = new_run_id(label)
        run_dir = run_dir or Path("runs") / run_id
        if (run_dir / "manifest.json").exists():
            raise ChaosError(f"{run_dir} already holds a run; use --resume {run_dir} or another --out")
        manifest = Manifest(
            run_id=run_id,
            site=str(site.path),
            cluster=site.cluster,
            started=time.time(),
            experiments=[],
            kind=kind,
            slurm_version=scheduler.version(),
        )
    manifest.planned = [e.name for e in experiments]
    manifest.min_effect = max(min(e.hypothesis.max_regression for e in experiments), min_effect_floor)
    camp = Campaign(
        site, experiments, run_dir.resolve(), scheduler, runner, control, manifest, progress, time_budget_s
    )
    camp.save()
    return camp


# ------------------------------------------------------------------ jobs
def _submit(camp: Campaign, exp: Experiment, role: str, label: str, job_dir: Path) -> JobRecord:
    job_dir.mkdir(parents=True, exist_ok=True)
    script = job_dir.parent / f"{job_dir.name}.sbatch"
    t0 = time.monotonic()
    script.write_text(render_job(camp.site, exp, role, job_dir, camp.manifest.run_id))
    camp.manifest.timings[f"{label}.{role}.render"] = time.monotonic() - t0
    script.chmod(0o755)
    try:
        job_id = camp.scheduler.submit(script, env=camp.site.slurm_env())
    except SlurmError as exc:
        if "--chaos" in str(exc) or "unrecognized option" in str(exc):
            raise ChaosError(
                f"{exc}\n  the slurm-chaos SPANK plugin is not loaded: "
                f"run 'slurm-chaos plugin install --site "
                f"{camp.site.path}'"
            ) from exc
        raise
    record = JobRecord(experiment=label, role=role, job_id=job_id, script=str(script), submitted=time.time())
    camp.manifest.jobs.append(record)
    camp.active.add(job_id)
    camp.save()
    return record


def _update(record: JobRecord, info: JobInfo) -> None:
    record.state = info.state.value
    record.nodes = list(info.nodes) or record.nodes
    record.restarts = info.restarts
    if info.state == JobState.RUNNING and record.started is None:
        record.started = time.time()
    if info.state.is_terminal and record.ended is None:
        record.ended = time.time()


def _wait(
    camp: Campaign,
    record: JobRecord,
    title: str,
    watcher: Watcher | None = None,
    on_running: list[tuple[float, FaultRequest]] | None = None,
    exp: Experiment | None = None,
) -> JobInfo:
    """Poll until the job ends; fire controller faults `after` seconds into the run."""
    pending = sorted(on_running or [], key=lambda x: x[0])
    limit = _limit_s(camp.site.slurm.time_limit) + 120
    t0 = time.monotonic()
    while True:
        info = watcher.tick() if watcher else camp.scheduler.poll([record.job_id]).get(record.job_id)
        if info is not None:
            _update(record, info)
            camp.progress.job(title, record.job_id, info.state.value, record.started)
            if record.started is not None and pending and exp is not None:
                while pending and time.time() - record.started >= pending[0][0]:
                    _, request = pending.pop(0)
                    nodes = controller.target_nodes(request, tuple(record.nodes), camp.site)
                    controller.apply(request, nodes, exp.name, camp.scheduler, camp.control, camp.journal)
                    if request.name == "node-drain" and exp.requeue:
                        # Maintenance moves the job off the drained node: requeue it (it needs --requeue).
                        camp.scheduler.requeue([record.job_id])
                    camp.manifest.timings[f"{exp.name}.fault_injected_at"] = time.time()
            if info.state.is_terminal and info.state != JobState.REQUEUED:
                camp.active.discard(record.job_id)
                camp.save()
                camp.progress.done(title, record.job_id, info.state.value)
                return info
        if time.monotonic() - t0 > limit:
            camp.scheduler.cancel([record.job_id])
            raise ChaosError(f"job {record.job_id} ({title}) did not finish within {limit:.0f} s; cancelled")
        time.sleep(POLL_S)


def _limit_s(text: str) -> float:
    days, _, hms = text.rpartition("-")
    parts = [int(p) for p in hms.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return (int(days) if days else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


# ------------------------------------------------------------------ experiment
def run_unfaulted(camp: Campaign, exp: Experiment, label: str, job_dir: Path, title: str) -> Path:
    """Run the experiment's job without its fault (a baseline or an A/A run) to completion, once:
    a run directory that already holds it completed (a resumed run) submits nothing."""
    done = camp.manifest.job(label, "baseline")
    if done is not None and done.state == JobState.COMPLETED.value:
        return job_dir
    t0 = time.monotonic()
    record = _submit(camp, exp, "baseline", label, job_dir)
    info = _wait(camp, record, title)
    if info.state != JobState.COMPLETED:
        raise ChaosError(
            f"{title}: job {record.job_id} ended {info.state.value}; see {job_dir}/slurm-{record.job_id}.out"
        )
    camp.manifest.timings[f"{label}.run"] = time.monotonic() - t0
    return job_dir


def _baseline(camp: Campaign, exp: Experiment) -> Path:
    shape = shape_of(camp.site, exp)
    label = f"baseline:{shape.label}"
    return run_unfaulted(
        camp, exp, label, camp.run_dir / "baselines" / shape.label, f"baseline {shape.label}"
    )


def _expectation(exp: Experiment) -> Expectation:
    e = exp.expect
    return Expectation(
        expect_regression=e.regression,
        detect_signals=e.detect,
        detect_within_s=e.detect_within_s,
        remediation=tuple(REMEDIATION_SIGNALS.get(r, r) for r in e.remediation),
        remediate_within_s=e.remediate_within_s,
        max_lost_steps=e.max_lost_steps,
    )


def run_experiment(camp: Campaign, exp: Experiment) -> None:
    """Baseline (shared), fault job watched to its end, rollback, observations.json."""
    exp_dir = experiment_dir(camp.run_dir, exp.name)
    exp_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    base_dir = _baseline(camp, exp)
    link = exp_dir / "baseline"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(base_dir, exp_dir))
    t_base = time.monotonic()

    spec = fault_spec(camp.site, exp, "fault", camp.manifest.run_id)
    requests = parse_spec(spec) if spec else ()
    timed = [
        (float(r.resolved().get("after", exp.fault.start_after_s)), r)
        for r in requests
        if r.name in controller.CONTROLLER_FAULTS
    ]
    old = camp.manifest.job(exp.name, "fault")
    if old is not None:
        camp.manifest.jobs.remove(old)
    record = _submit(camp, exp, "fault", exp.name, exp_dir / "fault")
    t_submitted = time.monotonic()
    watcher = Watcher(camp.scheduler, record.job_id, camp.site.monitoring.alertmanager)
    crashed = False
    interrupted = False
    try:
        info = _wait(camp, record, f"{exp.name}", watcher, timed, exp)
        crashed = info.state != JobState.COMPLETED
    except KeyboardInterrupt:
        interrupted = True
        camp.scheduler.cancel([record.job_id])
        raise
    finally:
        undone = controller.rollback(
            camp.journal, camp.scheduler, camp.control, camp.runner, camp.site.slurm_env()
        )
        for item in undone:
            if interrupted:
                print(f"slurm-chaos: rolled back {item}", file=sys.stderr)
            log.info("%s: rolled back %s", exp.name, item)
    _settle(camp, sorted(watcher.nodes_seen | set(record.nodes)))
    extra: list[Observation] = []
    if "reschedule_same_switch" in exp.expect.remediation:
        lost = {a.node for a in camp.journal.actions(exp.name, "lose")}
        moved = remediation.rescheduled_same_switch(watcher.observations, lost, camp.site)
        extra += [moved] if moved else []
    if "avoid_slow_node" in exp.expect.remediation and not crashed:
        try:
            extra += remediation.avoid_slow_node(camp, exp, exp_dir / "fault")
        finally:
            controller.rollback(
                camp.journal, camp.scheduler, camp.control, camp.runner, camp.site.slurm_env()
            )
    t_ran = time.monotonic()
    injected = camp.manifest.timings.get(f"{exp.name}.fault_injected_at")
    start = injected if (timed and injected) else (record.started or time.time())
    write_observations(
        exp_dir / OBSERVATIONS,
        ObservationLog(
            fault_window=FaultWindow(start=start, end=None),
            observations=tuple(sorted(watcher.observations + extra, key=lambda o: o.time)),
            expectation=_expectation(exp),
            crashed=crashed,
            fault=exp.fault.spec or "",
        ),
    )
    camp.manifest.timings.update(
        {
            f"{exp.name}.baseline": t_base - t_start,
            f"{exp.name}.submit": t_submitted - t_base,
            f"{exp.name}.fault_job": t_ran - t_submitted,
            f"{exp.name}.collect": time.monotonic() - t_ran,
        }
    )
    if exp.name not in camp.manifest.completed:
        camp.manifest.completed.append(exp.name)
    camp.manifest.experiments = [e for e in camp.manifest.planned if e in camp.manifest.completed]
    camp.save()


def _settle(camp: Campaign, nodes: list[str], timeout: float = 45.0) -> None:
    """Wait for the health check to resume the nodes it drained during the fault; resume stragglers ourselves.

    NHC-style checks resume only nodes they drained, once the check passes again (next interval);
    the next experiment must not start with fewer nodes, and every node must end as it began.
    """
    if not nodes:
        return
    deadline = time.monotonic() + timeout
    while True:
        held = [
            n.name
            for n in camp.scheduler.nodes(nodes).values()
            if n.drain and n.reason.startswith(HEALTHCHECK_PREFIX)
        ]
        if not held:
            return
        if time.monotonic() > deadline:
            for node in held:
                log.warning("%s: the health check did not resume it within %.0f s; resuming", node, timeout)
                camp.scheduler.resume(node)
            return
        time.sleep(POLL_S)


@contextmanager
def _interruptible() -> Iterator[None]:
    """SIGTERM behaves as Ctrl-C, so a cancelled campaign rolls back the same way."""

    def raise_interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop(camp: Campaign) -> list[str]:
    """Cancel our jobs, wait for their epilogs, undo controller faults; returns what was undone."""
    if camp.active:
        camp.scheduler.cancel(sorted(camp.active))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = camp.scheduler.poll(sorted(camp.active))
            if all(i.state.is_terminal for i in states.values()):
                break
            time.sleep(POLL_S)
        camp.active.clear()
    undone = controller.rollback(
        camp.journal, camp.scheduler, camp.control, camp.runner, camp.site.slurm_env()
    )
    _settle(camp, list(camp.site.partition_nodes))
    return undone


def run_campaign(camp: Campaign) -> bool:
    """Run every experiment not yet completed; returns False when interrupted or out of time."""
    t0 = time.monotonic()
    todo = [e for e in camp.experiments if e.name not in camp.manifest.completed]
    with _interruptible():
        try:
            for i, exp in enumerate(todo, start=1):
                if camp.time_budget_s is not None and time.monotonic() - t0 > camp.time_budget_s:
                    log.warning("time budget spent: %d experiments left for --resume", len(todo) - i + 1)
                    camp.manifest.interrupted = True
                    break
                camp.progress.experiment(i, len(todo), exp.name)
                run_experiment(camp, exp)
        except KeyboardInterrupt:
            print("\nslurm-chaos: interrupted: cancelling jobs and rolling back", file=sys.stderr)
            undone = stop(camp)
            for item in undone:
                print(f"slurm-chaos: rolled back {item}", file=sys.stderr)
            camp.manifest.interrupted = True
        finally:
            camp.manifest.finished = time.time()
            camp.save()
    return not camp.manifest.interrupted
