"""Remediation checks the engine makes itself, in a registry keyed by the experiment schema's enum.

Slurm and monitoring show most remediation steps on their own (a drain, a requeue, a resume from
checkpoint: the watcher and the probe record them). Two need the engine to look: where a requeued
job went, and whether placement now avoids a slow node. Each check returns the observations that
show the step happened; the verdict then finds them like any other signal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slurm_chaos.campaign.controller import Action, ActionKind, ControllerJournal
from slurm_chaos.clock import Backoff, Clock
from slurm_chaos.errors import ChaosError, SlurmError
from slurm_chaos.experiment import Experiment, Remediation
from slurm_chaos.placement import apply_settings, current_setting, proposals, rank_nodes
from slurm_chaos.rundir import Observation, Signal
from slurm_chaos.site import Site
from slurm_chaos.slurm.backend import Scheduler
from slurm_chaos.slurm.model import JobState

log = logging.getLogger(__name__)

PLACEMENT_CHECK_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class CheckInput:
    """What a check may use: the experiment, its fault job's results, and the door to Slurm."""

    experiment: Experiment
    site: Site
    scheduler: Scheduler
    clock: Clock
    journal: ControllerJournal
    fault_dir: Path
    observations: tuple[Observation, ...]


@dataclass(frozen=True)
class RemediationCheck:
    """One check: the signal it records, and whether it needs a fault job that completed (it reads
    its probe files) or changes node settings (then the engine rolls back after it)."""

    signal: str
    run: Callable[[CheckInput], list[Observation]]
    needs_completed_job: bool = False
    changes_nodes: bool = False


def rescheduled_same_switch(inp: CheckInput) -> list[Observation]:
    """The job's new allocation after a requeue lies under one switch and avoids every lost node."""
    lost = {a.node for a in inp.journal.actions(inp.experiment.name, ActionKind.LOSE)}
    for o in inp.observations:
        if o.signal != Signal.JOB_RESCHEDULED:
            continue
        nodes = [n for n in o.detail.split(",") if n]
        switches = {inp.site.switch_of(n) for n in nodes}
        if nodes and len(switches) == 1 and not set(nodes) & lost:
            detail = f"{','.join(nodes)} under {switches.pop()}"
            return [Observation(CHECKS[Remediation.RESCHEDULE_SAME_SWITCH].signal, o.time, detail)]
    return []


def avoid_slow_node(inp: CheckInput) -> list[Observation]:
    """Rank the fault job's nodes, mark the slow one, and check that a job asking for fast nodes avoids it.

    Settings are journalled before they change and restored by the engine's rollback.
    """
    ranking = rank_nodes([inp.fault_dir])
    slow = {r.node for r in ranking if r.slow}
    if not slow:
        return []
    found = [Observation("slow_node_identified", inp.clock.time(), ", ".join(sorted(slow)))]
    current = inp.scheduler.nodes(list(inp.site.partition_nodes))
    for r in ranking:
        old = current_setting(current[r.node])
        data = {"weight": old.weight, "features": list(old.features)}
        inp.journal.record(
            Action(inp.clock.time(), inp.experiment.name, ActionKind.SETTING, r.node, data=data)
        )
    apply_settings(inp.scheduler, proposals(ranking, current))
    job_id = _submit_placement_job(inp)
    try:
        nodes = _allocation(inp, job_id)
    finally:
        inp.scheduler.cancel([job_id])
    if nodes and not set(nodes) & slow:
        signal = CHECKS[Remediation.AVOID_SLOW_NODE].signal
        found.append(Observation(signal, inp.clock.time(), f"job {job_id} got {','.join(nodes)}"))
    elif nodes:
        log.warning("job %s asked for fast nodes and got %s", job_id, ",".join(nodes))
    return found


def _submit_placement_job(inp: CheckInput) -> str:
    slurm = inp.site.slurm
    args = [
        f"--nodes={inp.experiment.nodes}",
        "--constraint=fast",
        "--exclusive",
        f"--partition={slurm.partition}",
        "--output=/dev/null",
        "--time=00:02:00",
    ]
    if slurm.reservation:
        args.append(f"--reservation={slurm.reservation}")
    if slurm.account:
        args.append(f"--account={slurm.account}")
    try:
        return inp.scheduler.submit_wrap("srun hostname", args, env=inp.site.slurm_env())
    except SlurmError as exc:
        raise ChaosError(f"placement check job was refused: {exc}") from exc


def _allocation(inp: CheckInput, job_id: str) -> tuple[str, ...]:
    """The nodes the job got once it runs (or ended); () if it got none in time."""
    backoff = Backoff()
    deadline = inp.clock.monotonic() + PLACEMENT_CHECK_TIMEOUT_S
    while inp.clock.monotonic() < deadline:
        info = inp.scheduler.poll([job_id]).get(job_id)
        if info is not None and info.nodes and (info.state.is_terminal or info.state == JobState.RUNNING):
            return info.nodes
        inp.clock.sleep(backoff.interval())
    return ()


CHECKS: dict[Remediation, RemediationCheck] = {
    Remediation.RESCHEDULE_SAME_SWITCH: RemediationCheck("rescheduled_same_switch", rescheduled_same_switch),
    Remediation.AVOID_SLOW_NODE: RemediationCheck(
        "avoided_slow_node", avoid_slow_node, needs_completed_job=True, changes_nodes=True
    ),
}


def expected_signal(step: Remediation) -> str:
    """The name the expectation records for a step: its check's signal, else the step's own name
    (the verdict maps drain, requeue and resume to the signals Slurm and the probe give)."""
    check = CHECKS.get(step)
    return check.signal if check else step.value
