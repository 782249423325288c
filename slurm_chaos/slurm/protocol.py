"""The one interface later stages use to talk to Slurm, whichever implementation is behind it.

Nothing outside ``slurm_chaos/slurm/`` runs a Slurm command: what a stage needs from Slurm is a
method here (tests/unit/test_architecture.py holds that line).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from slurm_chaos.slurm.model import (
    AcctRecord,
    ClusterConfig,
    JobInfo,
    JobRecord,
    NodeInfo,
    PartitionInfo,
    ReservationInfo,
    SwitchInfo,
)


class Scheduler(Protocol):
    """Submit, watch and steer jobs and nodes; every method is one (or at most two) Slurm queries."""

    def version(self) -> str:
        """Installed Slurm version, e.g. `22.05.8`."""
        ...

    def submit(self, script: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str:
        """Submit a batch script with extra sbatch options (and job environment); return the job id."""
        ...

    def poll(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        """State of many jobs at once: live ones from the controller, finished ones from accounting."""
        ...

    def job_record(self, job_id: str) -> JobRecord:
        """What the controller holds about one live job (user, account, partition, reservation,
        oversubscription, array and het membership, admin comment); SlurmError if it has none."""
        ...

    def job_running(self, job_id: str) -> bool | None:
        """Whether anything of the job still runs on its nodes: False once it ended (or is pending,
        requeued, or no longer known to the controller), None when the controller cannot tell.
        Never raises: node-side code (the agent's watchdog, cleanup) keeps faults on None."""
        ...

    def time_left(self, job_id: str) -> float | None:
        """Seconds until the job's time limit ends it; None when it has no limit.
        SlurmError when the controller cannot tell (unreachable, or the job is not known)."""
        ...

    def cancel(self, job_ids: Iterable[str]) -> None:
        """Cancel jobs (already finished ones are ignored)."""
        ...

    def requeue(self, job_ids: Iterable[str]) -> None:
        """Requeue running jobs, as `scontrol requeue` does."""
        ...

    def nodes(self, names: Iterable[str] | None = None) -> dict[str, NodeInfo]:
        """Node state, reason and hardware, for the named nodes or all of them."""
        ...

    def node(self, name: str) -> NodeInfo:
        """One node, asked about alone (its own health check asks on every run, so the controller
        never sends every node's record); SlurmError if it is unknown or the controller cannot tell."""
        ...

    def drain(self, node: str, reason: str) -> None:
        """Drain a node (running jobs finish, no new ones start) with a reason."""
        ...

    def resume(self, node: str) -> None:
        """Return a drained or down node to service."""
        ...

    def mark_down(self, node: str, reason: str) -> None:
        """Set a node DOWN with a reason: Slurm kills (and requeues) its jobs, as on a node loss."""
        ...

    def update_node(
        self, node: str, *, weight: int | None = None, features: Sequence[str] | None = None
    ) -> None:
        """Set a node's scheduling weight and/or its features (available and active alike)."""
        ...

    def submit_wrap(
        self, command: str, args: Sequence[str] = (), env: Mapping[str, str] | None = None
    ) -> str:
        """Submit `sbatch --wrap COMMAND` with extra sbatch options; return the job id."""
        ...

    def reservation(self, name: str) -> ReservationInfo:
        """One advanced reservation; SlurmError if it does not exist."""
        ...

    def reservations(self) -> dict[str, ReservationInfo]:
        """Every advanced reservation, by name (none: an empty dict)."""
        ...

    def partitions(self) -> dict[str, PartitionInfo]:
        """Every partition, by name, in Slurm's order."""
        ...

    def topology(self) -> list[SwitchInfo]:
        """The switches of topology/tree; empty without a topology plugin."""
        ...

    def cluster_config(self) -> ClusterConfig:
        """Cluster name and the configuration paths slurmctld reports."""
        ...

    def accounting(self, job_ids: Iterable[str]) -> list[AcctRecord]:
        """Every accounting record of the jobs: each run (requeues included) and its steps."""
        ...

    def hostnames(self, nodelist: str) -> list[str]:
        """Expand a Slurm hostlist such as `node[1-3,5]`."""
        ...
