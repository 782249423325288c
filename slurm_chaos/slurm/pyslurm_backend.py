"""Scheduler over pyslurm (>= 23.2 object API), used only when pyslurm matches the installed Slurm.

pyslurm talks to libslurm directly (no process per query). It has no equivalent of "these sbatch
options on this script" nor of the reservation/accounting views this project reads, so those
calls go through the CLI backend it wraps; job state and node control use pyslurm.
pyslurm is imported lazily: this module imports on machines without it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from slurm_chaos.errors import SlurmError
from slurm_chaos.slurm import parse
from slurm_chaos.slurm.cli_backend import SlurmCLI
from slurm_chaos.slurm.model import (
    AcctRecord,
    ClusterConfig,
    JobInfo,
    JobRecord,
    JobState,
    NodeInfo,
    PartitionInfo,
    ReservationInfo,
    SwitchInfo,
)


def load_pyslurm() -> ModuleType | None:
    """The pyslurm module, or None when it is not installed or its libslurm does not load."""
    try:
        return importlib.import_module("pyslurm")
    except (ImportError, OSError):
        return None


def _when(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    if isinstance(value, (int, float)) and value > 0:
        return datetime.fromtimestamp(value, UTC)
    return None


def _job(job: Any) -> JobInfo:
    """A pyslurm.Job -> JobInfo (attribute names of the pyslurm 23.2+ API)."""
    exit_code = getattr(job, "exit_code", None)
    return JobInfo(
        job_id=str(job.id),
        name=str(getattr(job, "name", "") or ""),
        state=JobState.parse(str(getattr(job, "state", "") or "")),
        reason=str(getattr(job, "state_reason", "") or ""),
        nodes=tuple(parse.expand_hostlist(str(getattr(job, "allocated_nodes", "") or ""))),
        exit_code=exit_code if isinstance(exit_code, int) else None,
        signal=getattr(job, "exit_code_signal", None),
        restarts=int(getattr(job, "requeue_count", 0) or 0),
        submit_time=_when(getattr(job, "submit_time", None)),
        start_time=_when(getattr(job, "start_time", None)),
        end_time=_when(getattr(job, "end_time", None)),
        partition=str(getattr(job, "partition", "") or ""),
        reservation=str(getattr(job, "reservation", "") or ""),
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _weight(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _node(node: Any) -> NodeInfo:
    """A pyslurm.Node -> NodeInfo; pyslurm writes states as `IDLE+DRAIN`.

    No GRES: pyslurm's `configured_gres` is a dict of counts without the socket binding, so the
    records that need GRES (onboarding) come from the CLI backend.
    """
    features = getattr(node, "available_features", None) or ()
    return NodeInfo(
        name=str(node.name),
        state=frozenset(w.upper() for w in str(getattr(node, "state", "")).split("+") if w),
        reason=str(getattr(node, "reason", "") or ""),
        reason_user=str(getattr(node, "reason_user", "") or ""),
        reason_time=_when(getattr(node, "reason_time", None)),
        features=tuple(str(f) for f in features),
        address=str(getattr(node, "address", "") or ""),
        hostname=str(getattr(node, "hostname", "") or ""),
        cpus=_int(getattr(node, "total_cpus", 0)),
        sockets=_int(getattr(node, "sockets", 0)),
        cores_per_socket=_int(getattr(node, "cores_per_socket", 0)),
        threads_per_core=_int(getattr(node, "threads_per_core", 0)),
        weight=_weight(getattr(node, "weight", None)),
    )


class PyslurmScheduler:
    """Implements Scheduler with pyslurm for job state and node control, the CLI for the rest."""

    def __init__(self, pyslurm: ModuleType, cli: SlurmCLI) -> None:
        self.pyslurm = pyslurm
        self.cli = cli

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self.pyslurm.RPCError as exc:
            raise SlurmError(f"{what}: {exc}") from exc

    def version(self) -> str:
        return self.cli.version()

    def submit(self, script: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str:
        return self.cli.submit(script, args, env)

    def poll(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        ids = list(dict.fromkeys(str(j) for j in job_ids))
        live = {str(j.id): _job(j) for j in self._call("load jobs", self.pyslurm.Jobs.load).values()}
        jobs = {j: live[j] for j in ids if j in live}
        gone = [j for j in ids if j not in jobs]  # as in SlurmCLI.poll: accounting only for purged jobs
        if gone:
            runs = parse.latest_runs(self.cli.accounting(gone))
            jobs.update({j: parse.acct_to_job(r) for j, r in runs.items() if j in gone})
        return {j: jobs[j] for j in ids if j in jobs}

    # The node-side questions (agent, cleanup, health check) go through the CLI, as they always did.

    def job_running(self, job_id: str) -> bool | None:
        return self.cli.job_running(job_id)

    def time_left(self, job_id: str) -> float | None:
        return self.cli.time_left(job_id)

    def node(self, name: str) -> NodeInfo:
        return self.cli.node(name)

    def cancel(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            self._call(f"cancel {job_id}", self.pyslurm.Job(int(job_id)).cancel)

    def requeue(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            self._call(f"requeue {job_id}", self.pyslurm.Job(int(job_id)).requeue)

    def nodes(self, names: Iterable[str] | None = None) -> dict[str, NodeInfo]:
        found = {str(n.name): _node(n) for n in self._call("load nodes", self.pyslurm.Nodes.load).values()}
        if names is None:
            return found
        wanted = [n for name in names for n in parse.expand_hostlist(name)]
        missing = [n for n in wanted if n not in found]
        if missing:
            raise SlurmError(f"unknown node(s): {parse.compress_hostlist(missing)}")
        return {n: found[n] for n in wanted}

    def drain(self, node: str, reason: str) -> None:
        change = self.pyslurm.Node(state="DRAIN", reason=reason)
        self._call(f"drain {node}", self.pyslurm.Node(node).modify, change)

    def resume(self, node: str) -> None:
        self._call(f"resume {node}", self.pyslurm.Node(node).modify, self.pyslurm.Node(state="RESUME"))

    def mark_down(self, node: str, reason: str) -> None:
        self.cli.mark_down(node, reason)

    def update_node(
        self, node: str, *, weight: int | None = None, features: Sequence[str] | None = None
    ) -> None:
        self.cli.update_node(node, weight=weight, features=features)

    def submit_wrap(
        self, command: str, args: Sequence[str] = (), env: Mapping[str, str] | None = None
    ) -> str:
        return self.cli.submit_wrap(command, args, env)

    def reservation(self, name: str) -> ReservationInfo:
        return self.cli.reservation(name)

    def reservations(self) -> dict[str, ReservationInfo]:
        return self.cli.reservations()

    def partitions(self) -> dict[str, PartitionInfo]:
        return self.cli.partitions()

    def topology(self) -> list[SwitchInfo]:
        return self.cli.topology()

    def cluster_config(self) -> ClusterConfig:
        return self.cli.cluster_config()

    def job_record(self, job_id: str) -> JobRecord:
        return self.cli.job_record(job_id)

    def accounting(self, job_ids: Iterable[str]) -> list[AcctRecord]:
        return self.cli.accounting(job_ids)

    def hostnames(self, nodelist: str) -> list[str]:
        return parse.expand_hostlist(nodelist)
