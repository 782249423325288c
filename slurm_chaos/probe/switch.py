"""The probe's side of a switchback fault schedule: the fault's state before each step, the one rank
per node that asks the agent for it, and what every rank records of it.

A reversible fault (slow-rank, slow-node, ...) applied with ``control=switchback`` acts only while
the job asks for it, through the node's control channel (:mod:`slurm_chaos.faults.control`). The
schedule (:mod:`slurm_chaos.schedule`) says when; this module turns it into requests.

Physical state, what the agent is asked for before step ``s``:

- warm-up (``s`` before the first block): off;
- inside block ``i``: the block's assignment, from its first step on (its transition steps
  included: the toggle happens at the boundary the block starts at, and the analysis drops them);
- the held-on phase, after the last block: on, through the rest of ``--steps`` and the whole hold
  (``--hold-file``). A held fault job is held so that what it waits for (a health check, an alert
  on the fault) happens, and that needs the fault acting;
- a placebo schedule: never anything. No request is written at all, so the fault stays as the
  agent opened it (off) and every "effect" the analysis finds is noise.

Who toggles: on each node where the agent opened a channel for the job, the rank with local rank 0,
so exactly one per node. When the physical state changes at a step boundary it writes the request
and waits (before the step, outside its timings) for the acknowledgement. The node's other ranks
read the same ``ack`` file and wait for the same acknowledgement without writing, so that every
rank's file says what its own node did. Ranks on nodes without a channel (the fault does not act
there) follow the schedule.

Recorded per step (``steps/fault_state``, ``steps/fault_epoch``): the scheduled state (0 off, 1 on,
2 not measured), except 2 while the rank's node is unsure, that is from a toggle whose ack was late,
carried an error, confirmed another state or could not be asked for (the channel vanished), until
an ack confirms the state asked for (a late ack found at a later step, or the next toggle); and the
epoch of the last acknowledgement the rank took (0 before any, -1 where there is no channel).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from slurm_chaos.errors import DataError, UsageError
from slurm_chaos.faults.control import Ack, ChannelClient, State
from slurm_chaos.schedule import DROPPED, SwitchbackSchedule, schedule_from_json

#: How long a toggle waits for the agent's acknowledgement (the agent polls every 5 ms).
ACK_TIMEOUT_S = 1.0
NO_CHANNEL_EPOCH = -1


def load_schedule(path: Path, steps: int) -> SwitchbackSchedule:
    """The schedule of ``--fault-schedule PATH``; errors (exit 2) name the option and the file.

    A schedule longer than ``--steps`` would leave blocks unrun: the pairs would not balance."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"--fault-schedule {path}: cannot read it ({exc.strerror or exc})") from exc
    try:
        schedule = schedule_from_json(text, source=f"--fault-schedule {path}")
    except DataError as exc:
        raise UsageError(str(exc)) from None
    if schedule.end_step > steps:
        raise UsageError(
            f"--fault-schedule {path}: the schedule runs {schedule.end_step} steps, more than --steps {steps}"
        )
    return schedule


@dataclass(frozen=True)
class Plan:
    """A schedule's per-step states, computed once (a probe step must not redo the block search)."""

    schedule: SwitchbackSchedule
    on: npt.NDArray[np.bool_]
    scheduled: npt.NDArray[np.int64]

    @classmethod
    def of(cls, schedule: SwitchbackSchedule) -> Plan:
        end = schedule.end_step
        return cls(schedule, schedule.fault_active(end), schedule.step_states(end))

    def physical(self, step: int) -> State:
        """What the agent is asked for during `step` (see the module's docstring)."""
        if self.schedule.placebo:
            return State.OFF
        if step >= len(self.on):
            return State.ON  # the held-on phase
        return State.ON if self.on[step] else State.OFF

    def scheduled_state(self, step: int) -> int:
        """The analysis's state of `step`: 0 off, 1 on, 2 not measured (also after the last block)."""
        return int(self.scheduled[step]) if 0 <= step < len(self.scheduled) else DROPPED


def physical_states(schedule: SwitchbackSchedule, steps: int) -> list[State]:
    """The physical state of steps ``0..steps-1``."""
    plan = Plan.of(schedule)
    return [plan.physical(s) for s in range(steps)]


@dataclass(frozen=True)
class StepFault:
    """What one rank records for one step, and the events the step's toggle gave (kind, detail)."""

    state: int
    epoch: int
    events: tuple[tuple[str, str], ...] = ()


@dataclass
class FaultSwitch:
    """One rank's end of the schedule; :meth:`before_step` runs before every step."""

    plan: Plan
    client: ChannelClient | None = None
    toggles: bool = False
    ack_timeout: float = ACK_TIMEOUT_S
    poll_s: float = 0.001
    epoch: int = NO_CHANNEL_EPOCH
    # The state the node is known to be in; None while unsure (a failed or unconfirmed toggle).
    confirmed: State | None = None
    _want: State | None = field(default=None, repr=False)
    _need: int = field(default=0, repr=False)  # the epoch an ack must reach to settle the node

    def __post_init__(self) -> None:
        if self.client is None:
            return
        ack = self.client.ack()
        self.epoch = ack.epoch if ack is not None else 0
        self.confirmed = ack.state if ack is not None and not ack.error else None
        self._need = self.epoch

    @property
    def has_channel(self) -> bool:
        return self.client is not None

    def before_step(self, step: int) -> StepFault:
        """Bring the node to the step's physical state (or wait to see it brought there)."""
        scheduled = self.plan.scheduled_state(step)
        if self.client is None or self.plan.schedule.placebo:
            return StepFault(scheduled, self.epoch)
        want = self.plan.physical(step)
        events: list[tuple[str, str]] = []
        if want != self._want:  # a boundary, or the first step this process runs
            self._want = want
            if want != self.confirmed:
                toggle = self._request if self.toggles else self._observe
                events.append(toggle(self.client, want, step))
        elif self.confirmed != want:
            events.extend(self._late(self.client, want, step))
        state = scheduled if self.confirmed == want else DROPPED
        return StepFault(state, self.epoch, tuple(events))

    # --- the toggling rank ----------------------------------------------------------------------

    def _request(self, client: ChannelClient, want: State, step: int) -> tuple[str, str]:
        self.confirmed = None
        t0 = time.monotonic()
        try:
            epoch = client.request(want)
        except OSError as exc:
            return _error(step, None, want, f"cannot send the request, channel vanished? ({exc})")
        self._need = epoch
        ack = client.wait(epoch, self.ack_timeout, self.poll_s)
        return self._settle(client, ack, epoch, want, step, t0)

    def _settle(
        self, client: ChannelClient, ack: Ack | None, epoch: int, want: State, step: int, t0: float
    ) -> tuple[str, str]:
        if ack is None:
            why = "channel vanished" if not _open(client) else f"no ack within {self.ack_timeout:g} s"
            return _error(step, epoch, want, why)
        self.epoch = ack.epoch
        if ack.error:
            return _error(step, ack.epoch, want, f"agent: {ack.error}")
        if ack.state != want:
            return _error(step, ack.epoch, want, f"ack confirms {ack.state.value}")
        self.confirmed = want
        return _done(step, ack.epoch, want, t0)

    # --- the node's other ranks -----------------------------------------------------------------

    def _observe(self, client: ChannelClient, want: State, step: int) -> tuple[str, str]:
        """Wait for the toggling rank's request to be acknowledged, without writing anything."""
        self.confirmed = None
        seen, t0 = self.epoch, time.monotonic()
        end = t0 + self.ack_timeout
        while True:
            ack = client.ack()
            if ack is not None and ack.state == want and not ack.error:
                self.epoch, self.confirmed, self._need = ack.epoch, want, ack.epoch
                return _done(step, ack.epoch, want, t0, "observed")
            if ack is not None and ack.error and ack.epoch > seen:
                self.epoch, self._need = ack.epoch, ack.epoch + 1
                return _error(step, ack.epoch, want, f"agent: {ack.error}")
            if ack is None and not _open(client):
                return _error(step, None, want, "channel vanished")
            if time.monotonic() >= end:
                self._need = seen + 1
                return _error(step, None, want, f"no ack within {self.ack_timeout:g} s")
            time.sleep(self.poll_s)

    # --- both: an unsure node settled by a late ack ---------------------------------------------

    def _late(self, client: ChannelClient, want: State, step: int) -> list[tuple[str, str]]:
        """A look (no wait) for the ack a failed toggle never got: from it on the node is sure."""
        ack = client.ack()
        if ack is None or ack.error or ack.state != want or ack.epoch < self._need:
            return []
        self.epoch, self.confirmed = ack.epoch, want
        return [(f"fault_{want.value}", f"epoch={ack.epoch} step={step} late ack, found at this step")]


def _open(client: ChannelClient) -> bool:
    return client.is_open()


def _done(step: int, epoch: int, want: State, t0: float, how: str = "requested") -> tuple[str, str]:
    ms = 1e3 * (time.monotonic() - t0)
    return f"fault_{want.value}", f"epoch={epoch} ack_ms={ms:.3f} step={step} {how}"


def _error(step: int, epoch: int | None, want: State, why: str) -> tuple[str, str]:
    where = f"epoch={epoch} " if epoch is not None else ""
    return "fault_error", f"{where}step={step} want={want.value}: {why}"


def open_switch(
    schedule: SwitchbackSchedule,
    control: Path | None,
    node: str,
    job_id: str,
    local_rank: int,
    ack_timeout: float = ACK_TIMEOUT_S,
) -> FaultSwitch:
    """This rank's switch: with the node's channel where the agent opened one under `control`
    (the journal root), toggling if the rank has local rank 0 on its node."""
    plan = Plan.of(schedule)
    if control is None:
        return FaultSwitch(plan, ack_timeout=ack_timeout)
    try:
        client = ChannelClient.find(control, node, job_id)
    except ValueError as exc:  # not in a Slurm job: no job id (or node name) to find the channel by
        raise UsageError(
            f"--fault-control {control}: {exc} (needs SLURM_JOB_ID and SLURMD_NODENAME)"
        ) from exc
    return FaultSwitch(plan, client, toggles=client is not None and local_rank == 0, ack_timeout=ack_timeout)
