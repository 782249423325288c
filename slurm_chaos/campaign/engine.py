"""Run experiments and campaigns as a fixed list of stages, each handing a frozen record to the next.

    plan -> submit -> inject -> watch -> collect -> (judge) -> roll back

- plan: the experiment checked and resolved: its directory, job shape, controller faults and when.
- submit: a rendered job script handed to the scheduler; a `SubmittedJob` in the manifest.
- inject: one controller fault applied (journalled first) to the job's nodes: an `Injection`.
- watch: the job polled to its end with backoff, one query of each kind per tick; faults are
  injected when due. Returns `Watched`: the final state, the injections and what was observed.
- collect: the remediation checks the experiment asks for, then ``observations.json``.
- judge: the analysis (`slurm_chaos.analysis`) reads the run directory and gives each verdict.
- roll back: `rolled_back` undoes every journalled controller action however the block ends.

The baseline is the same stages without a fault, run once per job shape. A switchback experiment
has none: its fault job toggles the fault in the on/off blocks of a schedule drawn from a seed of
the run id and the experiment's name, written to ``fault/schedule.json`` before the job is
submitted, and the job is judged on its own on and off steps. Time comes from an
injected `Clock` and Slurm only through the injected `Scheduler`, so the whole engine runs against
fakes in unit tests. The time spent in each stage goes to the manifest's `timings`.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType

from slurm_chaos import rundir
from slurm_chaos.campaign import controller
from slurm_chaos.campaign import hold as held
from slurm_chaos.campaign.decide import JobView, decide
from slurm_chaos.campaign.observe import Watcher
from slurm_chaos.campaign.progress import Progress
from slurm_chaos.campaign.remediation import CHECKS, CheckInput, expected_signal
from slurm_chaos.clock import Backoff, Clock, SystemClock
from slurm_chaos.errors import ChaosError, SlurmError, UsageError
from slurm_chaos.experiment import Experiment, Mode, with_site_deadlines
from slurm_chaos.faults.spec import FaultRequest, parse_spec
from slurm_chaos.observe.healthcheck import REASON_PREFIX as HEALTHCHECK_PREFIX
from slurm_chaos.probe.reader import last_step
from slurm_chaos.render import (
    check_limits,
    fault_schedule,
    fault_spec,
    probe_steps,
    recorded_faults,
    render_job,
)
from slurm_chaos.rundir import (
    Expectation,
    FaultWindow,
    Manifest,
    Observation,
    ObservationLog,
    Role,
    RunKind,
    SubmittedJob,
    write_observations,
)
from slurm_chaos.site import Site
from slurm_chaos.slurm.backend import Scheduler
from slurm_chaos.slurm.model import JobInfo, JobState
from slurm_chaos.slurm.parse import parse_time_limit

log = logging.getLogger(__name__)

# A job gets its time limit plus this long to end before it is cancelled as stuck.
JOB_GRACE_S = 120.0
# How long the health check gets to resume the nodes it drained, and cancelled jobs to end.
SETTLE_TIMEOUT_S = 45.0
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Shape:
    """Jobs of the same shape share one baseline."""

    nodes: int
    tasks_per_node: int
    steps: int
    mode: Mode

    @property
    def label(self) -> str:
        return f"n{self.nodes}-t{self.tasks_per_node}-s{self.steps}-{self.mode}"


def shape_of(site: Site, exp: Experiment) -> Shape:
    return Shape(exp.nodes, exp.tasks_per_node or site.probe.tasks_per_node, probe_steps(site, exp), exp.mode)


@dataclass
class Campaign:
    """Everything one campaign run needs; built by `open_campaign`."""

    site: Site
    experiments: list[Experiment]
    run_dir: Path
    scheduler: Scheduler
    control: controller.NodeControl
    manifest: Manifest
    progress: Progress
    clock: Clock = field(default_factory=SystemClock)
    time_budget_s: float | None = None
    active: set[str] = field(default_factory=set)
    # The last step a running job's probe has flushed (rank 0), for faults due at a step.
    probe_step: Callable[[Path], int | None] = last_step

    @property
    def journal(self) -> controller.ControllerJournal:
        return controller.ControllerJournal(self.run_dir / rundir.CONTROLLER_JOURNAL)

    def save(self) -> None:
        rundir.write_manifest(self.run_dir, self.manifest)


def open_campaign(
    site: Site,
    experiments: list[Experiment],
    run_dir: Path | None,
    resume: bool,
    scheduler: Scheduler,
    control: controller.NodeControl,
    kind: RunKind | str,
    progress: Progress,
    clock: Clock | None = None,
    time_budget_s: float | None = None,
    min_effect_floor: float = 0.0,
) -> Campaign:
    """A new run directory (or the one to resume), with every experiment checked before anything runs.

    ``min_effect_floor`` (from an A/A calibration of the cluster) raises the practical threshold of
    every comparison to what run-to-run noise alone does not reach.
    """
    clock = clock or SystemClock()
    # From here on (hold, observations.json, verdict) an experiment's deadlines are the site's
    # where it overrides them.
    experiments = [with_site_deadlines(e, site.monitoring.deadlines) for e in experiments]
    for exp in experiments:
        check_limits(site, exp)
        controller_faults(site, exp, "check")
    if resume:
        if run_dir is None:
            raise ChaosError("--resume needs the run directory")
        manifest = rundir.read_manifest(run_dir)
        manifest.interrupted = False
        manifest.finished = None
    else:
        label = experiments[0].name if len(experiments) == 1 else kind
        run_id = rundir.new_run_id(label, clock.time())
        run_dir = run_dir or Path("runs") / run_id
        if (run_dir / rundir.MANIFEST).exists():
            raise ChaosError(f"{run_dir} already holds a run; use --resume {run_dir} or another --out")
        manifest = Manifest(
            run_id=run_id,
            site=str(site.path),
            cluster=site.cluster,
            started=clock.time(),
            experiments=[],
            kind=RunKind(kind),
            slurm_version=scheduler.version(),
        )
    # Kept from the start (a resumed run's too): the report's heat map needs no site file then.
    manifest.switches = manifest.switches or {n: rack.switch for rack in site.racks for n in rack.nodes}
    manifest.planned = [e.name for e in experiments]
    manifest.min_effect = max(min(e.hypothesis.max_regression for e in experiments), min_effect_floor)
    camp = Campaign(
        site, experiments, run_dir.resolve(), scheduler, control, manifest, progress, clock, time_budget_s
    )
    camp.save()
    return camp


# ------------------------------------------------------------------ plan
@dataclass(frozen=True)
class TimedFault:
    """A controller fault and when it is injected: once the job's probe reached ``at_step``, or
    ``after_s`` after the job started (a timer, which a fast job can outrun)."""

    after_s: float
    request: FaultRequest
    at_step: int | None = None


def controller_faults(site: Site, exp: Experiment, run_id: str) -> tuple[TimedFault, ...]:
    """The experiment's controller faults in the order they fall due (its SPEC checked whole)."""
    spec = fault_spec(site, exp, Role.FAULT, run_id)
    timed = []
    for r in parse_spec(spec) if spec else ():
        if not controller.is_controller_fault(r):
            continue
        given = dict(r.params)
        if "at_step" in given and "after" in given:
            raise UsageError(f"{exp.path}: fault.spec: {r.format()}: give after or at_step, not both")
        if "at_step" in given:
            timed.append(TimedFault(0.0, r, int(given["at_step"])))
        else:
            timed.append(TimedFault(float(r.resolved().get("after", 0.0)), r))
    # Step-triggered faults come after the timed ones with no delay, in the order of their steps.
    return tuple(sorted(timed, key=lambda t: (t.at_step is not None, t.at_step or 0, t.after_s)))


@dataclass(frozen=True)
class Plan:
    experiment: Experiment
    exp_dir: Path
    shape: Shape
    faults: tuple[TimedFault, ...]


def plan(camp: Campaign, exp: Experiment) -> Plan:
    """Where the experiment's files go, its job shape, and its controller faults in the order due."""
    return Plan(
        exp,
        rundir.experiment_dir(camp.run_dir, exp.name),
        shape_of(camp.site, exp),
        controller_faults(camp.site, exp, camp.manifest.run_id),
    )


# ------------------------------------------------------------------ submit
def submit(
    camp: Campaign, exp: Experiment, role: Role, label: str, job_dir: Path, replicate: int | None = None
) -> SubmittedJob:
    """Render the job script next to its output directory and submit it (``replicate``: one of the
    repeated jobs of a calibration, its schedule seeded apart)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    script = job_dir.parent / f"{job_dir.name}.sbatch"
    t0 = camp.clock.monotonic()
    script.write_text(render_job(camp.site, exp, role, job_dir, camp.manifest.run_id, replicate))
    camp.manifest.timings[f"{label}.{role}.render"] = camp.clock.monotonic() - t0
    script.chmod(0o755)
    try:
        job_id = camp.scheduler.submit(script, env=camp.site.slurm_env())
    except SlurmError as exc:
        if "--chaos" in str(exc) or "unrecognized option" in str(exc):
            raise ChaosError(
                f"{exc}\n  the slurm-chaos SPANK plugin is not loaded: "
                f"run 'slurm-chaos plugin install --site {camp.site.path}'"
            ) from exc
        raise
    job = SubmittedJob(
        experiment=label, role=role, job_id=job_id, script=str(script), submitted=camp.clock.time()
    )
    camp.manifest.forget_job(label, role)
    camp.manifest.put_job(job)
    camp.active.add(job_id)
    camp.save()
    return job


# ------------------------------------------------------------------ inject
@dataclass(frozen=True)
class Injection:
    """A controller fault as applied: to which nodes, when, and whether the job was requeued for it."""

    fault: str
    nodes: tuple[str, ...]
    at: float
    requeued: bool = False


def inject(camp: Campaign, exp: Experiment, fault: TimedFault, job: SubmittedJob) -> Injection:
    """Apply one controller fault to the job's nodes (journalled before it acts)."""
    nodes = controller.target_nodes(fault.request, job.nodes, camp.site)
    controller.apply(fault.request, nodes, exp.name, camp.scheduler, camp.control, camp.journal, camp.clock)
    at = camp.clock.time()
    # Maintenance moves a job off a drained node by requeueing it (the job asked for --requeue).
    requeued = fault.request.name == "node-drain" and exp.requeue
    if requeued:
        camp.scheduler.requeue([job.job_id])
    return Injection(fault.request.name, tuple(nodes), at, requeued)


# ------------------------------------------------------------------ watch
@dataclass(frozen=True)
class Watched:
    """A job watched to its end."""

    job: SubmittedJob
    final: JobInfo
    injections: tuple[Injection, ...] = ()
    observations: tuple[Observation, ...] = ()
    nodes_seen: tuple[str, ...] = ()

    @property
    def crashed(self) -> bool:
        return self.final.state != JobState.COMPLETED


def _updated(job: SubmittedJob, info: JobInfo, now: float) -> SubmittedJob:
    started = job.started
    if info.state == JobState.RUNNING and started is None:
        started = now
    ended = now if info.state.is_terminal and job.ended is None else job.ended
    return replace(
        job,
        state=info.state,
        nodes=info.nodes or job.nodes,
        restarts=info.restarts,
        started=started,
        ended=ended,
    )


def watch(
    camp: Campaign,
    job: SubmittedJob,
    title: str,
    watcher: Watcher | None = None,
    exp: Experiment | None = None,
    faults: tuple[TimedFault, ...] = (),
    job_dir: Path | None = None,
    hold: held.Hold | None = None,
) -> Watched:
    """Poll until the job's run ends (a requeue starts another); inject each fault when it is due,
    and release a held job (``hold``: what it waits for) once that was seen or is overdue, or its
    fault took on none of its nodes. What to do at each tick is `campaign.decide`'s; this loop
    gathers the facts and carries the decision out.

    Each tick asks Slurm once about the job (and the watcher once about its nodes); the wait between
    ticks grows while nothing changes, and stays short while a fault waits for the job to start
    or for a step, and when one falls due.
    """
    pending = list(faults)
    injections: list[Injection] = []
    holding = hold if job_dir is not None else None
    # Slurm's own limit plus grace: the campaign never cancels a job Slurm would still run.
    job_limit = parse_time_limit(camp.site.slurm.time_limit)
    limit = math.inf if job_limit is None else job_limit + JOB_GRACE_S
    limit_reason = f" (the site's slurm.time_limit {camp.site.slurm.time_limit!r} plus {JOB_GRACE_S:.0f} s)"
    t0 = camp.clock.monotonic()  # the current run's start (before the first: when watching began)
    backoff = Backoff()
    last: tuple[object, ...] = ()
    while True:
        info = watcher.tick() if watcher else camp.scheduler.poll([job.job_id]).get(job.job_id)
        if info is not None:
            started_again = job.state != JobState.RUNNING or info.restarts != job.restarts
            if info.state == JobState.RUNNING and started_again:
                t0 = camp.clock.monotonic()
            job = _updated(job, info, camp.clock.time())
            camp.manifest.put_job(job)
            camp.progress.job(title, job.job_id, info.state, job.started)
        observed = tuple(watcher.observations) if watcher else ()
        view = _view(camp, job, info, pending, injections, holding, job_dir, observed, t0, limit)
        decision = decide(view, limit_reason)
        if exp is not None:
            injections.extend(inject(camp, exp, fault, job) for fault in pending[: decision.inject])
            del pending[: decision.inject]
        if decision.release is not None and job_dir is not None:
            why = f": {decision.release}" if decision.release else ""
            log.info("%s: released job %s (%s)%s", title, job.job_id, held.release(job_dir), why)
            holding = None
        if decision.done and info is not None:
            camp.active.discard(job.job_id)
            camp.save()
            camp.progress.done(title, job.job_id, info.state)
            seen = watcher.nodes_seen if watcher else set()
            return Watched(job, info, tuple(injections), observed, tuple(sorted(seen | set(job.nodes))))
        if info is not None:
            now = (info.state, info.restarts, info.nodes, len(observed))
            if now != last:
                backoff.reset()
                last = now
        if decision.cancel is not None:
            camp.scheduler.cancel([job.job_id])
            raise ChaosError(f"job {job.job_id} ({title}) {decision.cancel}")
        if decision.hurry:
            backoff.reset()
        wait = backoff.interval()
        if decision.wake_at is not None:
            wait = min(wait, max(0.0, decision.wake_at - camp.clock.time()))
        camp.clock.sleep(wait)


def _view(
    camp: Campaign,
    job: SubmittedJob,
    info: JobInfo | None,
    pending: list[TimedFault],
    injections: list[Injection],
    hold: held.Hold | None,
    job_dir: Path | None,
    observed: tuple[Observation, ...],
    t0: float,
    limit: float,
) -> JobView:
    """The tick's facts: files are read only where a rule may need them (a step, a held job's records)."""
    step = None
    if job.started is not None and job_dir is not None and any(f.at_step is not None for f in pending):
        step = camp.probe_step(job_dir)
    nowhere = ""
    if hold is not None and job_dir is not None and job.started is not None and not pending:
        nowhere = held.injected_nowhere(hold, job_dir, job.nodes)
    return JobView(
        state=info.state if info is not None else None,
        started=job.started,
        now=camp.clock.time(),
        run_s=camp.clock.monotonic() - t0,
        limit_s=limit,
        pending=tuple(pending),
        probe_step=step,
        hold=hold,
        fault_start=injections[0].at if injections else job.started,
        observed=observed,
        nowhere=nowhere,
    )


# ------------------------------------------------------------------ roll back
@contextmanager
def rolled_back(camp: Campaign, label: str) -> Iterator[None]:
    """Undo every journalled controller action when the block ends, however it ends.

    On Ctrl-C (or SIGTERM) the jobs in flight are cancelled first, and what is undone is said on
    stderr: the user is waiting to know the cluster is back as it was.
    """
    interrupted = False
    try:
        yield
    except KeyboardInterrupt:
        interrupted = True
        if camp.active:
            camp.scheduler.cancel(sorted(camp.active))
        raise
    finally:
        for item in controller.rollback(camp.journal, camp.scheduler, camp.control, camp.clock):
            if interrupted:
                print(f"slurm-chaos: rolled back {item}", file=sys.stderr)
            log.info("%s: rolled back %s", label, item)


# ------------------------------------------------------------------ collect
def _expectation(exp: Experiment) -> Expectation:
    e = exp.expect
    return Expectation(
        expect_regression=e.regression,
        detect_signals=e.detect,
        detect_within_s=e.detect_within_s,
        remediation=tuple(expected_signal(r) for r in e.remediation),
        remediate_within_s=e.remediate_within_s,
        max_lost_steps=e.max_lost_steps,
        min_busbw_gbps=exp.hypothesis.min_busbw_gbps,
    )


def collect(camp: Campaign, p: Plan, watched: Watched) -> ObservationLog:
    """Run the experiment's remediation checks, then write what was observed to observations.json."""
    exp = p.experiment
    extra: list[Observation] = []
    for step in exp.expect.remediation:
        check = CHECKS.get(step)
        if check is None or (check.needs_completed_job and watched.crashed):
            continue
        inp = CheckInput(
            exp,
            camp.site,
            camp.scheduler,
            camp.clock,
            camp.journal,
            p.exp_dir / "fault",
            watched.observations,
        )
        if check.changes_nodes:
            with rolled_back(camp, exp.name):
                extra += check.run(inp)
        else:
            extra += check.run(inp)
    # The fault is on from its first injection (a controller fault), else from the job's start.
    start = watched.injections[0].at if watched.injections else (watched.job.started or camp.clock.time())
    observations = ObservationLog(
        fault_window=FaultWindow(start=start, end=None),
        observations=tuple(sorted(watched.observations + tuple(extra), key=lambda o: o.time)),
        expectation=_expectation(exp),
        crashed=watched.crashed,
        # The SPEC as the job got it (placeholders such as ${checkpoint_dir} filled in).
        fault=fault_spec(camp.site, exp, Role.FAULT, camp.manifest.run_id) or "",
    )
    write_observations(p.exp_dir / rundir.OBSERVATIONS, observations)
    return observations


# ------------------------------------------------------------------ experiment
def run_unfaulted(
    camp: Campaign, exp: Experiment, label: str, job_dir: Path, title: str, replicate: int | None = None
) -> Path:
    """Run the experiment's job without its fault (a baseline or an A/A run) to completion, once:
    a run directory that already holds it completed (a resumed run) submits nothing.

    With ``replicate``, a placebo experiment (switchback, no fault) runs as its fault job does in a
    campaign: on a placebo schedule of its own, seeded by the replicate, written beside its output
    and followed by the probe, with nothing toggled."""
    schedule = None if replicate is None else fault_schedule(camp.site, exp, camp.manifest.run_id, replicate)
    if schedule is not None and not schedule.placebo:
        raise UsageError(
            f"{exp.path}: {exp.name} has a fault: only an unfaulted experiment runs as a placebo"
        )
    role = Role.BASELINE if schedule is None else Role.FAULT
    done = camp.manifest.job(label, role)
    if done is not None and done.state == JobState.COMPLETED:
        return job_dir
    t0 = camp.clock.monotonic()
    if schedule is not None:
        rundir.write_schedule(job_dir, schedule.to_json())
    job = submit(camp, exp, role, label, job_dir, replicate)
    watched = watch(camp, job, title)
    if watched.crashed:
        raise ChaosError(
            f"{title}: job {job.job_id} ended {watched.final.state}; see {job_dir}/slurm-{job.job_id}.out"
        )
    camp.manifest.timings[f"{label}.run"] = camp.clock.monotonic() - t0
    return job_dir


def _baseline(camp: Campaign, p: Plan) -> Path:
    label = p.shape.label
    base_dir = run_unfaulted(
        camp, p.experiment, f"baseline:{label}", rundir.baseline_dir(camp.run_dir, label), f"baseline {label}"
    )
    link = p.exp_dir / "baseline"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(base_dir, p.exp_dir))
    return base_dir


def run_experiment(camp: Campaign, exp: Experiment) -> ObservationLog:
    """Baseline (shared; none for a switchback experiment), fault job watched to its end,
    rollback, observations.json."""
    p = plan(camp, exp)
    p.exp_dir.mkdir(parents=True, exist_ok=True)
    clock = camp.clock
    t_start = clock.monotonic()
    schedule = fault_schedule(camp.site, exp, camp.manifest.run_id)
    if schedule is None:
        _baseline(camp, p)
    t_base = clock.monotonic()
    with rolled_back(camp, exp.name):
        fault_dir = p.exp_dir / Role.FAULT
        if schedule is not None:
            rundir.write_schedule(fault_dir, schedule.to_json())
            log.info(
                "%s: switchback schedule, seed %d, %d on/off pairs%s",
                exp.name,
                schedule.seed,
                schedule.pairs,
                " (placebo)" if schedule.placebo else "",
            )
        job = submit(camp, exp, Role.FAULT, exp.name, fault_dir)
        t_submitted = clock.monotonic()
        mon = camp.site.monitoring
        watcher = Watcher(
            camp.scheduler,
            job.job_id,
            mon.alertmanager,
            clock,
            detectors=mon.detectors,
            node_labels=mon.node_labels,
            reference_heartbeats=Path(mon.heartbeat_dir) if mon.heartbeat_dir else None,
        )
        spec = fault_spec(camp.site, exp, Role.FAULT, camp.manifest.run_id)
        hold = held.Hold(_expectation(exp), recorded_faults(spec)) if exp.hold_limit_s is not None else None
        watched = watch(camp, job, exp.name, watcher, exp, p.faults, fault_dir, hold)
    settle(camp, list(watched.nodes_seen))
    t_ran = clock.monotonic()
    observations = collect(camp, p, watched)
    camp.manifest.timings.update(
        {
            f"{exp.name}.baseline": t_base - t_start,
            f"{exp.name}.submit": t_submitted - t_base,
            f"{exp.name}.fault_job": t_ran - t_submitted,
            f"{exp.name}.collect": clock.monotonic() - t_ran,
        }
    )
    camp.manifest.complete(exp.name)
    camp.save()
    return observations


def settle(camp: Campaign, nodes: list[str], timeout: float = SETTLE_TIMEOUT_S) -> list[str]:
    """Wait for the health check to resume the nodes it drained during the fault; resume stragglers ourselves.

    NHC-style checks resume only nodes they drained, once the check passes again (next interval);
    the next experiment must not start with fewer nodes, and every node must end as it began.
    Returns the nodes resumed here.
    """
    if not nodes:
        return []
    deadline = camp.clock.monotonic() + timeout
    backoff = Backoff()
    while True:
        held = [
            n.name
            for n in camp.scheduler.nodes(nodes).values()
            if n.drain and n.reason.startswith(HEALTHCHECK_PREFIX)
        ]
        if not held:
            return []
        if camp.clock.monotonic() > deadline:
            for node in held:
                log.warning("%s: the health check did not resume it within %.0f s; resuming", node, timeout)
                camp.scheduler.resume(node)
            return held
        camp.clock.sleep(backoff.interval())


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
        deadline = camp.clock.monotonic() + STOP_TIMEOUT_S
        backoff = Backoff()
        while camp.clock.monotonic() < deadline:
            states = camp.scheduler.poll(sorted(camp.active))
            if all(i.state.is_terminal for i in states.values()):
                break
            camp.clock.sleep(backoff.interval())
        camp.active.clear()
    undone = controller.rollback(camp.journal, camp.scheduler, camp.control, camp.clock)
    settle(camp, list(camp.site.partition_nodes))
    return undone


def run_campaign(camp: Campaign) -> bool:
    """Run every experiment not yet completed; returns False when interrupted or out of time."""
    t0 = camp.clock.monotonic()
    todo = [e for e in camp.experiments if e.name not in camp.manifest.completed]
    with _interruptible():
        try:
            for i, exp in enumerate(todo, start=1):
                if camp.time_budget_s is not None and camp.clock.monotonic() - t0 > camp.time_budget_s:
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
            camp.manifest.finished = camp.clock.time()
            camp.save()
    return not camp.manifest.interrupted
