"""What to do about a watched job at one tick, decided from what that tick saw: no I/O here.

`engine.watch` polls Slurm once, reads the facts the rules may need (the probe's last step, the
injection records of a held job), hands them to `decide` as a `JobView`, and carries out the
`Decision`: inject, release, cancel, or return. The rules, in the order they apply:

1. Faults fall due in their order: one waiting for a step once the probe has flushed it, one
   waiting for a delay once that long has passed since the job started; none before it starts.
2. A held fault job is released once nothing is left to inject and either its injection took on
   none of its nodes, or every signal it waits for was seen since the fault began (or is overdue);
   never in the tick that injects, whose fault has only just begun.
3. A run that ended (not a requeue, which starts another) is done.
4. A run older than the site's time limit plus grace is cancelled (before its first start, the
   time since watching began counts: a job that never starts holds no node).
5. While a fault waits for the start or for a step, the next tick comes soon; a fault due after a
   delay wakes the loop when it falls due.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from slurm_chaos.campaign import hold as held
from slurm_chaos.rundir import Observation
from slurm_chaos.slurm.model import JobState


class Timed(Protocol):
    """When a controller fault falls due: at a probe step, or a delay after the job started."""

    @property
    def after_s(self) -> float: ...

    @property
    def at_step(self) -> int | None: ...


@dataclass(frozen=True)
class JobView:
    """One tick's facts about a watched job."""

    state: JobState | None  # as Slurm reported it this tick (None: it said nothing)
    started: float | None  # wall-clock time of the job's first start
    now: float  # wall-clock time
    run_s: float  # how long the current run has lasted (before a start: how long it was watched)
    limit_s: float  # the site's time limit plus grace (inf: none)
    pending: Sequence[Timed] = ()  # faults still to inject, in the order they fall due
    probe_step: int | None = None  # the last step the probe flushed
    hold: held.Hold | None = None  # what a held job waits for; None once released or never held
    fault_start: float | None = None  # when its fault began (the first injection, else the start)
    observed: Sequence[Observation] = ()
    nowhere: str = ""  # why its injection took on none of its nodes ("" where it took, or not yet known)


@dataclass(frozen=True)
class Decision:
    """What the loop does at this tick."""

    inject: int = 0  # how many of the pending faults, from the first, to inject now
    release: str | None = None  # release the held job; the text says why ("" for its signals)
    done: bool = False  # the run ended: return what was watched
    cancel: str | None = None  # cancel the job and fail with this reason
    hurry: bool = False  # poll again soon (reset the backoff)
    wake_at: float | None = None  # wall-clock time a delayed fault falls due


def _due(fault: Timed, view: JobView) -> bool:
    if view.started is None:
        return False
    if fault.at_step is not None:
        return view.probe_step is not None and view.probe_step >= fault.at_step
    return view.now - view.started >= fault.after_s


def due_count(view: JobView) -> int:
    """How many of the pending faults, from the first, are due (rule 1)."""
    n = 0
    while n < len(view.pending) and _due(view.pending[n], view):
        n += 1
    return n


def release_reason(view: JobView, injecting: int) -> str | None:
    """Rule 2: why the held job may end now, or None while it holds on."""
    if view.hold is None or view.started is None or injecting or view.pending:
        return None
    if view.nowhere:
        return view.nowhere
    if held.release_due(view.hold.expectation, view.fault_start, view.observed, view.now):
        return ""
    return None


def decide(view: JobView, limit_reason: str = "") -> Decision:
    """The tick's decision, by the rules of the module docstring."""
    inject = due_count(view)
    release = release_reason(view, inject)
    if view.state is not None and view.state.is_terminal and view.state != JobState.REQUEUED:
        return Decision(inject=inject, release=release, done=True)
    cancel = None
    if view.run_s > view.limit_s:
        cancel = f"did not finish within {view.limit_s:.0f} s{limit_reason}; cancelled"
    rest = view.pending[inject:]
    hurry = bool(inject) or (bool(rest) and (view.started is None or rest[0].at_step is not None))
    wake_at = None
    if rest and view.started is not None and rest[0].at_step is None:
        wake_at = view.started + rest[0].after_s
    return Decision(inject=inject, release=release, cancel=cancel, hurry=hurry, wake_at=wake_at)
