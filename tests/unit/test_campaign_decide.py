"""`campaign.decide`: the watch loop's rules on tables of views, no scheduler, clock or files."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest

from slurm_chaos.campaign import hold as held
from slurm_chaos.campaign.decide import Decision, JobView, decide
from slurm_chaos.rundir import Expectation, Observation
from slurm_chaos.slurm.model import JobState

T = 1_700_000_000.0


@dataclass(frozen=True)
class Fault:
    after_s: float = 0.0
    at_step: int | None = None


RUNNING = JobView(state=JobState.RUNNING, started=T, now=T + 10, run_s=10, limit_s=720)
PENDING = JobView(state=JobState.PENDING, started=None, now=T, run_s=5, limit_s=720)


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        # Rule 1: a fault falls due at its step, or after its delay; never before the start.
        (replace(RUNNING, pending=(Fault(at_step=60),), probe_step=59), Decision(hurry=True)),
        (replace(RUNNING, pending=(Fault(at_step=60),), probe_step=60), Decision(inject=1, hurry=True)),
        (replace(RUNNING, pending=(Fault(at_step=60),), probe_step=None), Decision(hurry=True)),
        (replace(RUNNING, pending=(Fault(after_s=30),)), Decision(wake_at=T + 30)),
        (replace(RUNNING, pending=(Fault(after_s=5),)), Decision(inject=1, hurry=True)),
        (replace(PENDING, pending=(Fault(after_s=0),)), Decision(hurry=True)),
        # Two due at once are injected together; one not yet due stays and sets the wake-up.
        (
            replace(RUNNING, pending=(Fault(after_s=1), Fault(after_s=2), Fault(after_s=40))),
            Decision(inject=2, hurry=True, wake_at=T + 40),
        ),
        # Rule 3: an ended run is done; a requeue is not.
        (replace(RUNNING, state=JobState.COMPLETED), Decision(done=True)),
        (replace(RUNNING, state=JobState.FAILED), Decision(done=True)),
        (replace(RUNNING, state=JobState.REQUEUED), Decision()),
        (replace(RUNNING, state=None), Decision()),
        # Rule 4: past the limit, cancelled; an unlimited job never.
        (replace(RUNNING, run_s=721), Decision(cancel="did not finish within 720 s; cancelled")),
        (replace(PENDING, run_s=721), Decision(cancel="did not finish within 720 s; cancelled")),
        (replace(RUNNING, run_s=10**9, limit_s=math.inf), Decision()),
        # ...but an ended run is done whatever its age.
        (replace(RUNNING, run_s=10**9, state=JobState.COMPLETED), Decision(done=True)),
    ],
)
def test_decide(view: JobView, expected: Decision) -> None:
    assert decide(view) == expected


def test_the_cancel_reason_names_the_limit_it_came_from() -> None:
    why = " (the site's slurm.time_limit '10' plus 120 s)"
    assert decide(replace(RUNNING, run_s=800), why).cancel == f"did not finish within 720 s{why}; cancelled"


DETECT = Expectation(detect_signals=("healthcheck_drain",), detect_within_s=90)
HOLD = held.Hold(DETECT)


def drain(at: float) -> Observation:
    return Observation(signal="healthcheck_drain", time=at, detail="n01: straggler")


@pytest.mark.parametrize(
    ("view", "release"),
    [
        # Rule 2: held until what it waits for was seen since the fault began...
        (replace(RUNNING, hold=HOLD, fault_start=T), None),
        (replace(RUNNING, hold=HOLD, fault_start=T, observed=(drain(T + 4),)), ""),
        # ...a signal from before the fault does not count...
        (replace(RUNNING, hold=HOLD, fault_start=T + 5, observed=(drain(T + 4),)), None),
        # ...or the deadline (plus grace) has passed...
        (replace(RUNNING, hold=HOLD, fault_start=T, now=T + 90 + held.GRACE_S), ""),
        # ...or the injection took nowhere.
        (replace(RUNNING, hold=HOLD, fault_start=T, nowhere="no GPU on n01"), "no GPU on n01"),
        # Never while a fault is still to come, nor in the tick that injects it, nor before the start.
        (replace(RUNNING, hold=HOLD, fault_start=T, nowhere="x", pending=(Fault(after_s=99),)), None),
        (replace(RUNNING, hold=HOLD, fault_start=T, nowhere="x", pending=(Fault(after_s=1),)), None),
        (replace(PENDING, hold=HOLD, nowhere="x"), None),
        # Released already (or never held): nothing to release.
        (replace(RUNNING, hold=None, nowhere="x"), None),
    ],
)
def test_a_held_job_is_released_by_rule_two(view: JobView, release: str | None) -> None:
    assert decide(view).release == release


def test_a_held_job_that_ends_is_released_and_done_in_the_same_tick() -> None:
    view = replace(RUNNING, state=JobState.COMPLETED, hold=HOLD, fault_start=T, observed=(drain(T + 1),))
    assert decide(view) == Decision(release="", done=True)
