"""What the scheduler backend hands to later stages: small frozen records, no Slurm text."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class JobState(StrEnum):
    """A job's effective state as Slurm names it (squeue %T, sacct State)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    CONFIGURING = "CONFIGURING"
    RESIZING = "RESIZING"
    REVOKED = "REVOKED"
    SIGNALING = "SIGNALING"
    STAGE_OUT = "STAGE_OUT"
    STOPPED = "STOPPED"
    UNKNOWN = "UNKNOWN"

    @property
    def is_terminal(self) -> bool:
        """True once this run of the job is over (a requeued job starts a new run)."""
        return self in _TERMINAL

    @classmethod
    def parse(cls, text: str) -> JobState:
        """Read one Slurm state word; sacct writes e.g. `CANCELLED by 0`, sinfo-style text may carry `+`."""
        word = text.strip().split(" ", 1)[0].rstrip("+").upper()
        try:
            return cls(word)
        except ValueError:
            return cls.UNKNOWN

    @classmethod
    def from_flags(cls, names: Iterable[str]) -> JobState:
        """Effective state from a base state plus flags (24.11 `--json` lists both).

        Same precedence as Slurm's own job_state_string(): a flag such as COMPLETING
        or REQUEUED names the state before the base state does.
        """
        states = [cls.parse(n) for n in names]
        for flag in _FLAG_PRECEDENCE:
            if flag in states:
                return flag
        known = [s for s in states if s is not cls.UNKNOWN]
        return known[0] if known else cls.UNKNOWN


_TERMINAL = frozenset(
    {
        JobState.COMPLETED,
        JobState.CANCELLED,
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.PREEMPTED,
        JobState.BOOT_FAIL,
        JobState.DEADLINE,
        JobState.OUT_OF_MEMORY,
        JobState.REVOKED,
    }
)

_FLAG_PRECEDENCE = (
    JobState.COMPLETING,
    JobState.STAGE_OUT,
    JobState.CONFIGURING,
    JobState.RESIZING,
    JobState.REQUEUED,
    JobState.REQUEUE_FED,
    JobState.REQUEUE_HOLD,
    JobState.SPECIAL_EXIT,
    JobState.STOPPED,
    JobState.REVOKED,
    JobState.RESV_DEL_HOLD,
    JobState.SIGNALING,
)


@dataclass(frozen=True)
class JobInfo:
    """One job as the controller (or accounting, once it is gone) reports it."""

    job_id: str
    name: str
    state: JobState
    reason: str = ""
    nodes: tuple[str, ...] = ()
    exit_code: int | None = None
    signal: int | None = None
    restarts: int = 0
    submit_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    partition: str = ""
    reservation: str = ""
    state_flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobRecord:
    """What the controller holds about a job that its user cannot change: the facts to authorise it.

    `admin_comment` only an administrator (or slurmctld's job_submit plugin) can set. The
    oversubscription words are Slurm's: the job's ``NO`` (submitted with --exclusive), ``OK``,
    ``YES``, ``USER``, ``MCS``; the partition's ``NO``, ``EXCLUSIVE``, ``YES[:n]``, ``FORCE[:n]``.
    """

    job_id: str
    user_id: int | None
    user: str
    account: str
    partition: str
    reservation: str
    job_oversubscribe: str
    partition_oversubscribe: str
    array: bool
    het: bool
    num_nodes: int | None
    nodes: tuple[str, ...]
    admin_comment: str
    submit_time: datetime | None = None
    #: When the job's time limit ends it (None: no limit, or not known).
    end_time: datetime | None = None
    #: The other jobs that hold any of the job's nodes now (None: not asked).
    other_jobs: tuple[str, ...] | None = None

    @property
    def exclusive(self) -> bool:
        """The job's nodes are its alone, as slurmctld says: no other job holds any of them now, and
        none may join (the job was submitted with --exclusive, or its partition is
        OverSubscribe=EXCLUSIVE). Never on a FORCE partition, which oversubscribes whatever the job
        asked; never from the CPUs it holds (a job may hold every CPU Slurm counts on a node and
        still share it: OverSubscribe=YES, or an SMT node declared with CPUs= only)."""
        if self.other_jobs is None or self.other_jobs:
            return False
        if self.partition_oversubscribe.upper().startswith("FORCE"):
            return False
        return self.job_oversubscribe.upper() == "NO" or self.partition_oversubscribe.upper() == "EXCLUSIVE"


@dataclass(frozen=True)
class Gres:
    """One generic resource of a node, as Slurm writes it: `gpu:h100:4(S:0)` -> gpu, h100, 4, (0,).

    `sockets` are the sockets whose cores the GRES is bound to (gres.conf `Cores=`, or AutoDetect);
    empty when Slurm was not told. Slurm adds up entries of one type, so `gpu:h100:8(S:0-1)` says
    that the eight GPUs are spread over sockets 0 and 1, not which GPU sits where.
    """

    name: str
    type: str = ""
    count: int = 0
    sockets: tuple[int, ...] = ()


@dataclass(frozen=True)
class NodeInfo:
    """One node: its state words (e.g. {"IDLE", "DRAIN"}), why it is not usable, where it is.

    The hardware fields (cpus .. gres) are Slurm's configured values; 0 or () where not reported.
    """

    name: str
    state: frozenset[str]
    reason: str = ""
    reason_user: str = ""
    reason_time: datetime | None = None
    features: tuple[str, ...] = ()
    address: str = ""
    hostname: str = ""
    cpus: int = 0
    sockets: int = 0
    cores_per_socket: int = 0
    threads_per_core: int = 0
    gres: tuple[Gres, ...] = ()
    # Scheduling weight (lowest first); None where the query does not report it (sinfo groups).
    weight: int | None = None

    @property
    def drain(self) -> bool:
        """Drain was requested (drained or still draining)."""
        return "DRAIN" in self.state

    @property
    def drained(self) -> bool:
        """Drain requested and no job left on the node (sinfo says `drained`)."""
        return self.drain and not self.state & {"ALLOCATED", "MIXED", "COMPLETING"}


@dataclass(frozen=True)
class ReservationInfo:
    """An advanced reservation, e.g. the maintenance window campaigns run in."""

    name: str
    nodes: tuple[str, ...]
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    flags: frozenset[str] = frozenset()
    start: datetime | None = None
    end: datetime | None = None
    state: str = ""


@dataclass(frozen=True)
class PartitionInfo:
    """A partition: its nodes, whether jobs without --partition land in it, its state (UP, DOWN...),
    and whether it shares nodes (OverSubscribe)."""

    name: str
    nodes: tuple[str, ...]
    default: bool = False
    state: str = ""
    oversubscribe: str = ""  # NO, EXCLUSIVE, YES[:n], FORCE[:n]
    preempt_mode: str = ""  # OFF, CANCEL, REQUEUE, SUSPEND[,GANG], ...; '' where not reported


@dataclass(frozen=True)
class SwitchInfo:
    """One switch of topology.conf (topology/tree): level 0 is a leaf, whose nodes share a rack."""

    name: str
    level: int
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()

    @property
    def leaf(self) -> bool:
        return self.level == 0


@dataclass(frozen=True)
class ClusterConfig:
    """What `scontrol show config` says about the cluster as a whole; '' where not set."""

    name: str
    plugstack_conf: str = ""
    topology_plugin: str = ""
    slurm_conf: str = ""
    prolog: str = ""
    epilog: str = ""
    prolog_flags: tuple[str, ...] = ()
    proctrack_type: str = ""
    task_plugin: tuple[str, ...] = ()
    job_submit_plugins: tuple[str, ...] = ()
    health_check_program: str = ""
    preempt_mode: str = ""
    preempt_type: str = ""


@dataclass(frozen=True)
class AcctRecord:
    """One accounting record: a job run (step is None) or one of its steps.

    A requeued job has one job record per run; `requeues` counts the runs before this one.
    """

    job_id: str
    step: str | None
    name: str
    state: JobState
    exit_code: int | None = None
    signal: int | None = None
    nodes: tuple[str, ...] = ()
    elapsed_s: int = 0
    requeues: int = 0
    submit_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    partition: str = ""
    reservation: str = ""
