"""What every node-level fault family shares: the job it acts for, its controllers, its registry.

A fault family (``node_net``, ``node_cpu``, ``node_gpu``, ``node_storage``) registers one apply
function per fault name. Applying journals each change before making it and returns the
controllers (if any) that the detached agent must keep running: a duty cycle that stops and
continues a rank, a delayed fault waiting for its time.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from slurm_chaos.enums import parse_enum
from slurm_chaos.errors import ChaosError
from slurm_chaos.faults.choices import Control
from slurm_chaos.faults.journal import Journal
from slurm_chaos.faults.spec import FaultRequest
from slurm_chaos.runner import Runner

log = logging.getLogger("slurm_chaos.faults")

#: Environment entry that marks every process slurm-chaos starts, so an undo finds them all
#: (workers forked by stress-ng included) without trusting a PID.
MARKER_ENV = "SLURM_CHAOS_MARKER"

E = TypeVar("E", bound=StrEnum)


class Spawner(Protocol):
    """Starts a long-running helper (stress-ng) detached in its own session; returns its PID."""

    def __call__(self, argv: Sequence[str], env: Mapping[str, str], log_file: Path | None) -> int: ...


def _without_job_env(environ: Mapping[str, str]) -> dict[str, str]:
    # The helper is not one of the job's tasks: nothing may mistake it for one by its environment.
    return {k: v for k, v in environ.items() if not k.startswith(("SLURM_", "SPANK_"))}


def popen_spawner(argv: Sequence[str], env: Mapping[str, str], log_file: Path | None) -> int:
    """The real Spawner: a new session (off the prolog's process group), output to the log file."""
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env={**_without_job_env(os.environ), **env},
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise ChaosError(f"{argv[0]}: command not found") from exc
    finally:
        if log_file:
            out.close()  # type: ignore[union-attr]
    return proc.pid


@dataclass(frozen=True)
class JobContext:
    """The job a fault acts for on this node, and the tools it acts with."""

    job_id: str
    node: str
    nodes: tuple[str, ...]
    uid: int | None
    gid: int | None
    deadline: float
    journal: Journal
    runner: Runner
    spawner: Spawner = popen_spawner
    log_file: Path | None = None
    #: The site's allowed checkpoint roots: the only places a fault acts on a path the job names.
    ckpt_roots: tuple[str, ...] = ()
    #: The one interface netem may shape (the policy's job_interface); None: netem is refused.
    job_interface: str | None = None
    #: The GPUs slurmd gave the job on this node (SLURM_JOB_GPUS); () when it has none.
    gpus: tuple[int, ...] = ()
    #: slurmctld's word that the job holds this node alone (the prolog's JobFacts.exclusive): node-wide
    #: faults (netem) act only then, whatever the policy's require_exclusive says.
    exclusive: bool = False

    def marker(self, fault: str) -> str:
        return f"{self.node}:{self.job_id}:{fault}"


class Controller(Protocol):
    """Work the detached agent keeps doing for a fault until the job ends."""

    name: str

    def tick(self, now: float) -> float:
        """Do whatever is due at `now`; return when this controller next needs to run."""
        ...

    def stop(self) -> None:
        """Leave the job's processes as they were (continue stopped tasks); called once at the end."""
        ...


@runtime_checkable
class Switchable(Controller, Protocol):
    """A controller of a reversible fault that the job turns on and off (``control=switchback``).

    An applier asked for ``control=switchback`` returns only switchable controllers, each starting
    off; the agent's switch (``agent.Switched``) calls :meth:`switch` when the job's control channel
    asks for a change. A ChaosError or OSError leaves the fault as it was and is acknowledged as
    an error.
    """

    def switch(self, on: bool, now: float) -> None:
        """Make the fault act (on) or not (off) from now on."""
        ...


def switchback(req: FaultRequest) -> bool:
    """Whether the job turns this fault on and off itself (the catalogue's ``control`` key)."""
    return req.fault.key("control") is not None and choice(req, "control", Control) is Control.SWITCHBACK


ApplyFn = Callable[[FaultRequest, JobContext], list[Controller]]

APPLIERS: dict[str, ApplyFn] = {}


def applies(name: str) -> Callable[[ApplyFn], ApplyFn]:
    """Register the apply function of the node-level fault `name`."""

    def register(fn: ApplyFn) -> ApplyFn:
        APPLIERS[name] = fn
        return fn

    return register


def num(req: FaultRequest, key: str) -> float:
    """A numeric key of the request (given or default); 0 when unset."""
    value = req.get(key)
    if value is None:
        return 0.0
    if isinstance(value, str):
        raise ChaosError(f"{req.name}: key {key} is not numeric")
    return float(value)


def text(req: FaultRequest, key: str) -> str:
    value = req.get(key)
    return "" if value is None else str(value)


def choice(req: FaultRequest, key: str, kind: type[E]) -> E:
    """An enum key of the request (given or default) as its member of `kind` (``faults/choices.py``);
    a word `kind` lacks is refused naming the fault, the key and the words it takes."""
    try:
        return parse_enum(kind, req.get(key))
    except ValueError as exc:
        raise ChaosError(f"{req.name}: key {key}: {exc}") from exc


def check(res_ok: bool, what: str, detail: str) -> None:
    if not res_ok:
        raise ChaosError(f"{what} failed: {detail.strip()[:300]}")
