"""An in-memory Scheduler for tests: nodes and jobs in dicts, every call recorded, queries counted.

Each submitted job walks through a list of states, one per `poll` (the last one repeats): tests
say what a job does by giving that list (`lifecycle`), so no test waits on a real controller.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from slurm_chaos.errors import SlurmError, SlurmUnreachable
from slurm_chaos.slurm import parse
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

# The states a job passes through by default: queued, running, done.
DEFAULT_STATES = (JobState.PENDING, JobState.RUNNING, JobState.RUNNING, JobState.COMPLETED)
# Queries: the calls that ask the controller something (the rest change state).
QUERIES = frozenset(
    {
        "version",
        "poll",
        "job_record",
        "job_running",
        "time_left",
        "nodes",
        "node",
        "reservation",
        "reservations",
        "partitions",
        "topology",
        "cluster_config",
        "accounting",
    }
)


@dataclass(frozen=True)
class Submission:
    """What was submitted: a script or a --wrap command, with its sbatch options."""

    job_id: str
    script: Path | None
    command: str | None
    args: tuple[str, ...]
    env: Mapping[str, str]


def idle_nodes(count: int, prefix: str = "node") -> dict[str, NodeInfo]:
    return {f"{prefix}{i}": NodeInfo(f"{prefix}{i}", frozenset({"IDLE"}), weight=1) for i in range(count)}


@dataclass
class FakeScheduler:
    """Implements Scheduler in memory. `lifecycle(submission)` gives the JobInfo sequence of a job."""

    node_table: dict[str, NodeInfo] = field(default_factory=lambda: idle_nodes(4))
    lifecycle: Callable[[Submission], Sequence[JobInfo]] | None = None
    switches: list[SwitchInfo] = field(default_factory=list)
    reservation_table: dict[str, ReservationInfo] = field(default_factory=dict)
    slurm_version: str = "24.11.1"
    fail_submit: str | None = None
    #: What the node-side questions answer for a job, ahead of its lifecycle (None: cannot tell).
    running: dict[str, bool | None] = field(default_factory=dict)
    #: Seconds left by each job's time limit (None: no limit); a job not here is not known.
    time_limits: dict[str, float | None] = field(default_factory=dict)
    #: Set, the controller does not answer: job_running says None, time_left and node raise this.
    unreachable: str | None = None
    #: Set, every node update (drain, resume, down, weight, features) fails with this message.
    fail_update: str | None = None
    calls: list[tuple[str, tuple[object, ...]]] = field(default_factory=list)
    submissions: list[Submission] = field(default_factory=list)
    _frames: dict[str, list[JobInfo]] = field(default_factory=dict)
    _next_id: int = 100

    # ------------------------------------------------------------ bookkeeping

    def _call(self, name: str, *args: object) -> None:
        self.calls.append((name, args))

    @property
    def queries(self) -> Counter[str]:
        """How many times each query ran."""
        return Counter(name for name, _ in self.calls if name in QUERIES)

    def called(self, name: str) -> list[tuple[object, ...]]:
        return [args for n, args in self.calls if n == name]

    def default_lifecycle(self, sub: Submission) -> list[JobInfo]:
        nodes = tuple(sorted(self.node_table))[:2]
        return [
            JobInfo(sub.job_id, "job", s, nodes=() if s == JobState.PENDING else nodes)
            for s in DEFAULT_STATES
        ]

    def _submit(
        self, script: Path | None, command: str | None, args: Sequence[str], env: Mapping[str, str]
    ) -> str:
        if self.fail_submit is not None:
            raise SlurmError(self.fail_submit)
        job_id = str(self._next_id)
        self._next_id += 1
        sub = Submission(job_id, script, command, tuple(args), dict(env))
        self.submissions.append(sub)
        frames = list((self.lifecycle or self.default_lifecycle)(sub))
        self._frames[job_id] = [replace(f, job_id=job_id) for f in frames]
        return job_id

    def state_of(self, job_id: str) -> JobInfo:
        """The job's current state without counting a query (for assertions)."""
        return self._frames[job_id][0]

    # ------------------------------------------------------------ Scheduler

    def version(self) -> str:
        self._call("version")
        return self.slurm_version

    def submit(self, script: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str:
        self._call("submit", script, tuple(args))
        return self._submit(script, None, args, env or {})

    def submit_wrap(
        self, command: str, args: Sequence[str] = (), env: Mapping[str, str] | None = None
    ) -> str:
        self._call("submit_wrap", command, tuple(args))
        return self._submit(None, command, args, env or {})

    def poll(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        ids = list(dict.fromkeys(job_ids))
        self._call("poll", tuple(ids))
        out = {}
        for j in ids:
            frames = self._frames.get(j)
            if frames:
                out[j] = frames[0]
                if len(frames) > 1:
                    frames.pop(0)
        return out

    def job_record(self, job_id: str) -> JobRecord:
        self._call("job_record", job_id)
        raise SlurmError(f"job {job_id}: not known to the controller")

    def job_running(self, job_id: str) -> bool | None:
        self._call("job_running", job_id)
        if self.unreachable is not None:
            return None
        if job_id in self.running:
            return self.running[job_id]
        frames = self._frames.get(job_id)
        if not frames:
            return False  # the controller does not know it: it ended long ago
        return frames[0].state not in parse.ENDED_STATES

    def time_left(self, job_id: str) -> float | None:
        self._call("time_left", job_id)
        if self.unreachable is not None:
            raise SlurmUnreachable(self.unreachable)
        if job_id not in self.time_limits:
            raise SlurmError("slurm_load_jobs error: Invalid job id specified")
        return self.time_limits[job_id]

    def cancel(self, job_ids: Iterable[str]) -> None:
        ids = tuple(job_ids)
        self._call("cancel", ids)
        for j in ids:
            frames = self._frames.get(j)
            if frames and not frames[0].state.is_terminal:
                self._frames[j] = [replace(frames[0], state=JobState.CANCELLED)]

    def requeue(self, job_ids: Iterable[str]) -> None:
        self._call("requeue", tuple(job_ids))

    def nodes(self, names: Iterable[str] | None = None) -> dict[str, NodeInfo]:
        wanted = None if names is None else [n for name in names for n in parse.expand_hostlist(name)]
        self._call("nodes", tuple(wanted or ()))
        if wanted is None:
            return dict(self.node_table)
        missing = [n for n in wanted if n not in self.node_table]
        if missing:
            raise SlurmError(f"unknown node(s): {parse.compress_hostlist(missing)}")
        return {n: self.node_table[n] for n in wanted}

    def node(self, name: str) -> NodeInfo:
        self._call("node", name)
        if self.unreachable is not None:
            raise SlurmUnreachable(self.unreachable)
        if name not in self.node_table:
            raise SlurmError(f"node {name}: not found")
        return self.node_table[name]

    def _set(self, node: str, **changes: object) -> None:
        if self.fail_update is not None:
            raise SlurmError(self.fail_update)
        if node not in self.node_table:
            raise SlurmError(f"unknown node {node}")
        self.node_table[node] = replace(self.node_table[node], **changes)  # type: ignore[arg-type]

    def drain(self, node: str, reason: str) -> None:
        self._call("drain", node, reason)
        self._set(node, state=self.node_table[node].state | {"DRAIN"}, reason=reason)

    def mark_down(self, node: str, reason: str) -> None:
        self._call("mark_down", node, reason)
        self._set(node, state=frozenset({"DOWN"}), reason=reason)

    def resume(self, node: str) -> None:
        self._call("resume", node)
        self._set(node, state=frozenset({"IDLE"}), reason="")

    def update_node(
        self, node: str, *, weight: int | None = None, features: Sequence[str] | None = None
    ) -> None:
        self._call("update_node", node, weight, None if features is None else tuple(features))
        if weight is not None:
            self._set(node, weight=weight)
        if features is not None:
            self._set(node, features=tuple(features))

    def reservation(self, name: str) -> ReservationInfo:
        self._call("reservation", name)
        if name not in self.reservation_table:
            raise SlurmError(f"Reservation {name} not found")
        return self.reservation_table[name]

    def reservations(self) -> dict[str, ReservationInfo]:
        self._call("reservations")
        return dict(self.reservation_table)

    def partitions(self) -> dict[str, PartitionInfo]:
        self._call("partitions")
        return {}

    def topology(self) -> list[SwitchInfo]:
        self._call("topology")
        return list(self.switches)

    def cluster_config(self) -> ClusterConfig:
        self._call("cluster_config")
        raise SlurmError("the fake scheduler has no cluster configuration")

    def accounting(self, job_ids: Iterable[str]) -> list[AcctRecord]:
        self._call("accounting", tuple(job_ids))
        return []

    def hostnames(self, nodelist: str) -> list[str]:
        return parse.expand_hostlist(nodelist)
