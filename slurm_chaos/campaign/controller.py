"""Faults that act from the controller side: drain a node, lose a node, lose a whole leaf switch.

Each action is journalled in the run directory before it is made, and undone by `rollback`, which
is idempotent and also runs when the campaign is interrupted.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from slurm_chaos.clock import Clock, SystemClock
from slurm_chaos.enums import parse_enum
from slurm_chaos.errors import ChaosError, SlurmError
from slurm_chaos.faults.catalogue import Where
from slurm_chaos.faults.spec import FaultRequest
from slurm_chaos.placement import NodeSetting, apply_settings
from slurm_chaos.runner import Runner
from slurm_chaos.site import Site
from slurm_chaos.slurm.backend import Scheduler

log = logging.getLogger(__name__)

REASON_PREFIX = "slurm-chaos:"


def is_controller_fault(request: FaultRequest) -> bool:
    """Applied by the campaign through Slurm (the catalogue's `where`), not by a node's hooks."""
    return request.fault.where is Where.CONTROLLER


class ActionKind(StrEnum):
    """What a journalled change did to a node."""

    DRAIN = "drain"
    LOSE = "lose"
    SETTING = "setting"  # weight and features changed; the action's data holds the old ones


class NodeControl(Protocol):
    """How a node is made to disappear and come back on this cluster."""

    def lose(self, node: str) -> None: ...

    def restore(self, node: str) -> None: ...


@dataclass
class SlurmNodeControl:
    """A real cluster: mark the node DOWN (Slurm kills and requeues its jobs), RESUME it afterwards."""

    scheduler: Scheduler

    def lose(self, node: str) -> None:
        try:
            self.scheduler.mark_down(node, f"{REASON_PREFIX} node loss")
        except SlurmError as exc:
            raise ChaosError(f"could not mark {node} down: {exc}") from exc

    def restore(self, node: str) -> None:
        self.scheduler.resume(node)


@dataclass
class SandboxNodeControl:
    """The sandbox: cut the node's link on the bridge, as a power or cable loss looks to its peers.

    Nothing on the node is told: its slurmd stops answering, Slurm declares it DOWN after
    SlurmdTimeout and requeues its jobs, and its peers' connections hang rather than reset.
    """

    sandbox: str
    runner: Runner
    scheduler: Scheduler
    clock: Clock = field(default_factory=SystemClock)

    def _veth(self, node: str) -> str:
        from slurm_chaos.sandbox.layout import Layout

        layout = Layout.load(self.sandbox)
        if layout is None:
            raise ChaosError(f"sandbox {self.sandbox} is not up")
        return layout.veth(int(node.removeprefix("node")))

    def lose(self, node: str) -> None:
        res = self.runner(["ip", "link", "set", self._veth(node), "down"], timeout=10)
        if not res.ok:
            raise ChaosError(f"could not cut {node}'s link: {res.stderr.strip()}")

    def restore(self, node: str) -> None:
        self.runner(["ip", "link", "set", self._veth(node), "up"], timeout=10)
        deadline = self.clock.monotonic() + 30
        while self.clock.monotonic() < deadline:
            info = self.scheduler.nodes([node]).get(node)
            if info is not None and "NOT_RESPONDING" not in info.state:
                break
            self.clock.sleep(0.5)
        info = self.scheduler.nodes([node]).get(node)
        # With ReturnToService=2 Slurm returns a node by itself once it answers again; resuming a
        # node that is neither down nor drained is an error, and not needed.
        if info is None or info.state & {"DOWN", "DRAIN"}:
            self.scheduler.resume(node)


@dataclass(frozen=True)
class Action:
    """One journalled change: what was done to which node, for which experiment."""

    time: float
    experiment: str
    kind: ActionKind
    node: str
    undone: bool = False
    data: dict[str, Any] = field(default_factory=dict)


class ControllerJournal:
    """Append-only JSON lines in the run directory; the last line for a node/kind wins."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, action: Action) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as fh:
            fh.write(json.dumps({**asdict(action), "kind": action.kind.value}) + "\n")
            fh.flush()

    def pending(self) -> list[Action]:
        if not self.path.exists():
            return []
        latest: dict[tuple[ActionKind, str], Action] = {}
        for a in self._read():
            latest[(a.kind, a.node)] = a
        return [a for a in latest.values() if not a.undone]

    def actions(self, experiment: str, kind: ActionKind) -> list[Action]:
        """Every change of one kind made for an experiment (done or undone)."""
        if not self.path.exists():
            return []
        return [a for a in self._read() if a.experiment == experiment and a.kind is kind and not a.undone]

    def _read(self) -> list[Action]:
        found = []
        for i, line in enumerate(self.path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                found.append(Action(**{**raw, "kind": parse_enum(ActionKind, raw["kind"])}))
            except (ValueError, TypeError, KeyError) as exc:
                raise ChaosError(f"{self.path}: line {i}: not a journal entry ({exc})") from exc
        return found


def target_nodes(request: FaultRequest, allocated: tuple[str, ...], site: Site) -> list[str]:
    """Which nodes a controller fault acts on: one allocated node by index, or a whole switch."""
    if request.name == "rack-loss":
        switch = str(request.resolved().get("switch", "")) or (site.switch_of(allocated[0]) or "")
        if switch in ("", "first"):
            switch = site.switch_of(allocated[0]) or ""
        members = [n for r in site.racks if r.switch == switch for n in r.nodes]
        if not members:
            raise ChaosError(f"rack-loss: no switch {switch!r} in {site.path}")
        return members
    index = int(request.resolved().get("node", 0))
    if index >= len(allocated):
        raise ChaosError(f"{request.name}: node index {index} but the job has {len(allocated)} nodes")
    return [allocated[index]]


def apply(
    request: FaultRequest,
    nodes: list[str],
    experiment: str,
    scheduler: Scheduler,
    control: NodeControl,
    journal: ControllerJournal,
    clock: Clock,
) -> None:
    for node in nodes:
        if request.name == "node-drain":
            journal.record(Action(clock.time(), experiment, ActionKind.DRAIN, node))
            scheduler.drain(node, f"{REASON_PREFIX} drain injected by experiment {experiment}")
        else:
            journal.record(Action(clock.time(), experiment, ActionKind.LOSE, node))
            control.lose(node)
        log.info("%s: %s %s", experiment, request.name, node)


def rollback(
    journal: ControllerJournal, scheduler: Scheduler, control: NodeControl, clock: Clock
) -> list[str]:
    """Undo every pending action (newest first); returns what was undone.

    An action that cannot be undone now stays pending (a later rollback or `cleanup --run` tries again).
    """
    undone = []
    for a in sorted(journal.pending(), key=lambda x: x.time, reverse=True):
        try:
            if a.kind is ActionKind.DRAIN:
                scheduler.resume(a.node)
            elif a.kind is ActionKind.SETTING:
                setting = NodeSetting(a.node, int(a.data["weight"]), tuple(a.data["features"]))
                apply_settings(scheduler, [setting])
            else:
                control.restore(a.node)
        except (ChaosError, KeyError, ValueError) as exc:
            log.warning("rollback of %s %s failed: %s", a.kind, a.node, exc)
            continue
        journal.record(Action(clock.time(), a.experiment, a.kind, a.node, undone=True))
        undone.append(f"{a.kind} {a.node}")
    return undone
