"""Faults that act from the controller side: drain a node, lose a node, lose a whole leaf switch.

Each action is journalled in the run directory before it is made, and undone by `rollback`, which
is idempotent and also runs when the campaign is interrupted.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults.spec import FaultRequest
from slurm_chaos.placement import NodeSetting, apply_settings
from slurm_chaos.runner import Runner
from slurm_chaos.site import Site
from slurm_chaos.slurm.backend import Scheduler

log = logging.getLogger(__name__)

REASON_PREFIX = "slurm-chaos:"
CONTROLLER_FAULTS = ("node-drain", "node-down", "rack-loss")


class NodeControl(Protocol):
    """How a node is made to disappear and come back on this cluster."""

    def lose(self, node: str) -> None: ...

    def restore(self, node: str) -> None: ...


@dataclass
class SlurmNodeControl:
    """A real cluster: mark the node DOWN (Slurm kills and requeues its jobs), RESUME it afterwards."""

    scheduler: Scheduler
    runner: Runner
    env: dict[str, str]

    def lose(self, node: str) -> None:
        res = self.runner(
            ["scontrol", "update", f"nodename={node}", "state=down", f"reason={REASON_PREFIX} node loss"],
            timeout=15,
            env=self.env,
        )
        if not res.ok:
            raise ChaosError(f"could not mark {node} down: {res.stderr.strip()}")

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
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            info = self.scheduler.nodes([node]).get(node)
            if info is not None and "NOT_RESPONDING" not in info.state:
                break
            time.sleep(0.5)
        info = self.scheduler.nodes([node]).get(node)
        # With ReturnToService=2 Slurm returns a node by itself once it answers again; resuming a
        # node that is neither down nor drained is an error, and not needed.
        if info is None or info.state & {"DOWN", "DRAIN"}:
            self.scheduler.resume(node)


@dataclass(frozen=True)
class Action:
    """One journalled change: what was done to which node, for which experiment.

    kind is "drain", "lose" or "setting" (weight and features changed; `data` holds the old ones).
    """

    time: float
    experiment: str
    kind: str
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
            fh.write(json.dumps(asdict(action)) + "\n")
            fh.flush()

    def pending(self) -> list[Action]:
        if not self.path.exists():
            return []
        latest: dict[tuple[str, str], Action] = {}
        for line in self.path.read_text().splitlines():
            if line.strip():
                a = Action(**json.loads(line))
                latest[(a.kind, a.node)] = a
        return [a for a in latest.values() if not a.undone]

    def actions(self, experiment: str, kind: str) -> list[Action]:
        """Every change of one kind made for an experiment (done or undone)."""
        if not self.path.exists():
            return []
        found = [Action(**json.loads(ln)) for ln in self.path.read_text().splitlines() if ln.strip()]
        return [a for a in found if a.experiment == experiment and a.kind == kind and not a.undone]


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
) -> None:
    for node in nodes:
        if request.name == "node-drain":
            journal.record(Action(time.time(), experiment, "drain", node))
            scheduler.drain(node, f"{REASON_PREFIX} drain injected by experiment {experiment}")
        else:
            journal.record(Action(time.time(), experiment, "lose", node))
            control.lose(node)
        log.info("%s: %s %s", experiment, request.name, node)


def rollback(
    journal: ControllerJournal,
    scheduler: Scheduler,
    control: NodeControl,
    runner: Runner,
    env: dict[str, str],
) -> list[str]:
    """Undo every pending action (newest first); returns what was undone."""
    undone = []
    for a in sorted(journal.pending(), key=lambda x: x.time, reverse=True):
        try:
            if a.kind == "drain":
                scheduler.resume(a.node)
            elif a.kind == "setting":
                setting = NodeSetting(a.node, int(a.data["weight"]), tuple(a.data["features"]))
                apply_settings(runner, env, [setting])
            else:
                control.restore(a.node)
        except (ChaosError, KeyError, ValueError) as exc:
            log.warning("rollback of %s %s failed: %s", a.kind, a.node, exc)
            continue
        journal.record(Action(time.time(), a.experiment, a.kind, a.node, undone=True))
        undone.append(f"{a.kind} {a.node}")
    return undone
