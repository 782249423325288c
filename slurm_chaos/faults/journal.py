"""The rollback journal: every change a fault makes on a node, written down before it is made.

One append-only JSON-lines file per job and node, ``<root>/<node>/<job>.jsonl``. Records:

- ``header``: who wrote the journal and in which namespaces (so that ``cleanup`` can enter them
  from outside the node, as on the sandbox host);
- ``change``: one change about to be made, with how to undo it (an argv list run in the node's
  namespaces, or a named undo action with its data), the writer's PID and the deadline by which
  it must be undone;
- ``done``: a change was undone (or found already gone);
- ``closed``: an undo has started; no change may be recorded after it, so an agent that wakes
  up late cannot re-apply a fault behind the epilog's back.

Reverting replays the pending changes newest first (``early`` ones, which stop the controller
that could redo a change, before all others) and marks each done, so running it twice is
harmless. Writers and reverters serialise on an flock of the journal file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

from slurm_chaos.errors import ChaosError
from slurm_chaos.runner import Runner

DEFAULT_ROOT = Path("/var/lib/slurm-chaos/journal")

#: JSON data of a named undo action.
Json: TypeAlias = str | int | float | bool | list["Json"] | dict[str, "Json"] | None


class JournalClosed(ChaosError):
    """The job's journal was closed by an undo: no further change may be made."""


class UndoFailed(ChaosError):
    """An undo step failed; the change stays pending so that a later undo or cleanup retries it."""


@dataclass(frozen=True)
class Undo:
    """How to revert one change: an argv list, or a named action with its data."""

    argv: tuple[str, ...] = ()
    action: str = ""
    data: Mapping[str, Json] = field(default_factory=dict)

    def to_json(self) -> dict[str, Json]:
        if self.argv:
            return {"argv": list(self.argv)}
        return {"action": self.action, "data": dict(self.data)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Json]) -> Undo:
        argv = raw.get("argv")
        if isinstance(argv, list):
            return cls(argv=tuple(str(a) for a in argv))
        data = raw.get("data")
        return cls(action=str(raw.get("action", "")), data=data if isinstance(data, dict) else {})

    def describe(self) -> str:
        return " ".join(self.argv) if self.argv else f"{self.action} {json.dumps(dict(self.data))}"


@dataclass(frozen=True)
class Entry:
    """One journalled change."""

    seq: int
    time: float
    job_id: str
    node: str
    fault: str
    action: str
    undo: Undo
    pid: int
    deadline: float
    early: bool = False


@dataclass(frozen=True)
class Header:
    """Where the journal's changes live: the writer's namespaces, and a PID that was in them."""

    job_id: str
    node: str
    time: float
    deadline: float
    ns_pid: int
    netns: int | None
    mntns: int | None


@dataclass(frozen=True)
class State:
    """Everything read back from one journal file."""

    header: Header | None
    entries: tuple[Entry, ...]
    done: frozenset[int]
    closed: bool

    def pending(self) -> list[Entry]:
        """Changes not yet undone, in undo order: early ones first, then newest first."""
        left = [e for e in self.entries if e.seq not in self.done]
        return sorted(left, key=lambda e: (not e.early, -e.seq))

    @property
    def deadline(self) -> float | None:
        times = [e.deadline for e in self.entries] + ([self.header.deadline] if self.header else [])
        return min(times) if times else None


class Journal:
    """The journal of one job on one node."""

    def __init__(self, root: Path, node: str, job_id: str) -> None:
        if not node or "/" in node or not job_id or "/" in job_id:
            raise ValueError(f"bad node {node!r} or job id {job_id!r} for a journal file name")
        self.root = root
        self.node = node
        self.job_id = job_id
        self.path = root / node / f"{job_id}.jsonl"

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive lock over the journal (held while recording or reverting)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the flock

    def _append(self, record: Mapping[str, Json]) -> None:
        # One write per line with O_APPEND, fsynced: the record is on disk before the change is made.
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> State:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            lines = []
        return parse_records(lines)

    def write_header(self, deadline: float, ns_pid: int) -> None:
        """Record where this journal's changes live (once; a second call is ignored)."""
        with self.lock():
            if self.read().header is not None:
                return
            self._append(
                {
                    "kind": "header",
                    "job_id": self.job_id,
                    "node": self.node,
                    "time": time.time(),
                    "deadline": deadline,
                    "ns_pid": ns_pid,
                    "netns": _ns("net"),
                    "mntns": _ns("mnt"),
                }
            )

    def record(self, fault: str, action: str, undo: Undo, deadline: float, early: bool = False) -> Entry:
        """Write one change down before it is made; raises JournalClosed after an undo started."""
        with self.lock():
            state = self.read()
            if state.closed:
                raise JournalClosed(f"journal {self.path} is closed: job {self.job_id} is being undone")
            seq = max((e.seq for e in state.entries), default=0) + 1
            entry = Entry(
                seq, time.time(), self.job_id, self.node, fault, action, undo, os.getpid(), deadline, early
            )
            self._append(entry_to_json(entry))
            return entry

    def mark_done(self, seq: int, outcome: str) -> None:
        self._append({"kind": "done", "seq": seq, "time": time.time(), "outcome": outcome})

    def close(self, by: str) -> None:
        self._append({"kind": "closed", "time": time.time(), "by": by})


def _ns(kind: str) -> int | None:
    try:
        return os.stat(f"/proc/self/ns/{kind}").st_ino
    except OSError:
        return None


def entry_to_json(e: Entry) -> dict[str, Json]:
    return {
        "kind": "change",
        "seq": e.seq,
        "time": e.time,
        "job_id": e.job_id,
        "node": e.node,
        "fault": e.fault,
        "action": e.action,
        "undo": e.undo.to_json(),
        "pid": e.pid,
        "deadline": e.deadline,
        "early": e.early,
    }


def _entry_from_json(r: Mapping[str, Json]) -> Entry:
    undo = r.get("undo")
    return Entry(
        seq=int(_num(r["seq"])),
        time=_num(r["time"]),
        job_id=str(r["job_id"]),
        node=str(r["node"]),
        fault=str(r["fault"]),
        action=str(r["action"]),
        undo=Undo.from_json(undo if isinstance(undo, dict) else {}),
        pid=int(_num(r["pid"])),
        deadline=_num(r["deadline"]),
        early=bool(r.get("early", False)),
    )


def _header_from_json(r: Mapping[str, Json]) -> Header:
    def opt(key: str) -> int | None:
        v = r.get(key)
        return int(v) if isinstance(v, int) else None

    return Header(
        job_id=str(r["job_id"]),
        node=str(r["node"]),
        time=_num(r["time"]),
        deadline=_num(r["deadline"]),
        ns_pid=int(_num(r["ns_pid"])),
        netns=opt("netns"),
        mntns=opt("mntns"),
    )


def _num(v: Json) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"expected a number, got {v!r}")
    return float(v)


def parse_records(lines: list[str]) -> State:
    """Fold journal lines into a State; a torn last line (a crash mid-write) is skipped."""
    header: Header | None = None
    entries: list[Entry] = []
    done: set[int] = set()
    closed = False
    for line in lines:
        try:
            r = json.loads(line)
            kind = r.get("kind")
            if kind == "header" and header is None:
                header = _header_from_json(r)
            elif kind == "change":
                entries.append(_entry_from_json(r))
            elif kind == "done":
                done.add(int(r["seq"]))
            elif kind == "closed":
                closed = True
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return State(header, tuple(entries), frozenset(done), closed)


# ---------------------------------------------------------------------------------------- undo


@dataclass(frozen=True)
class UndoContext:
    """What an undo action may use: a runner that acts inside the node's namespaces, and where the
    node's filesystem is seen from here (``/proc/PID/root`` when undoing from outside its mount
    namespace, as on the sandbox host, whose nodes mount their own cgroup trees)."""

    runner: Runner
    timeout: float = 30.0
    root: Path = Path("/")

    def path(self, recorded: str) -> Path:
        """A path the journal recorded in the node's mount namespace, as reachable from here."""
        return self.root / recorded.lstrip("/")


#: A named undo action: reverts one change, returns what it did (one line); raises UndoFailed.
UndoFn = Callable[[Mapping[str, Json], UndoContext], str]

UNDO_ACTIONS: dict[str, UndoFn] = {}


def undo_action(name: str) -> Callable[[UndoFn], UndoFn]:
    """Register a named undo action (the fault modules register theirs at import)."""

    def register(fn: UndoFn) -> UndoFn:
        UNDO_ACTIONS[name] = fn
        return fn

    return register


@undo_action("none")
def _nothing(data: Mapping[str, Json], ctx: UndoContext) -> str:
    """A change that cannot be taken back (a kernel log line): recorded so the report shows it."""
    return str(data.get("note", "nothing to undo"))


def run_undo(undo: Undo, ctx: UndoContext) -> str:
    """Carry out one undo step."""
    if undo.argv:
        res = ctx.runner(list(undo.argv), timeout=ctx.timeout)
        if not res.ok:
            raise UndoFailed(f"{undo.describe()}: exit {res.returncode}: {res.stderr.strip()[:300]}")
        return undo.describe()
    fn = UNDO_ACTIONS.get(undo.action)
    if fn is None:
        raise UndoFailed(f"unknown undo action {undo.action!r}")
    return fn(undo.data, ctx)


@dataclass(frozen=True)
class Outcome:
    """One thing an undo or a cleanup did, or failed to do (a failed change stays pending)."""

    what: str
    failed: bool = False

    def __str__(self) -> str:
        # The hooks' log and `cleanup` print a failure so, as they did before outcomes had a type.
        return f"FAILED: {self.what}" if self.failed else self.what


def any_failed(outcomes: Iterable[Outcome]) -> bool:
    return any(o.failed for o in outcomes)


@dataclass(frozen=True)
class Reverted:
    """Outcome of reverting one journal: what was undone, and what failed (still pending)."""

    journal: Path
    undone: tuple[str, ...]
    failed: tuple[str, ...]

    def outcomes(self, note: str = "") -> list[Outcome]:
        """What was undone (each with `note` after it), then what failed."""
        return [Outcome(f"{line}{note}") for line in self.undone] + [
            Outcome(line, failed=True) for line in self.failed
        ]


def revert(journal: Journal, ctx: UndoContext, by: str, skip_pid: int | None = None) -> Reverted:
    """Close the journal and undo every pending change, newest first; idempotent.

    `skip_pid`: an early entry recorded by this very process (the agent undoing itself at its
    deadline) is marked done without running its undo, which would stop the caller.
    """
    undone: list[str] = []
    failed: list[str] = []
    with journal.lock():
        state = journal.read()
        if not state.closed:
            journal.close(by)
        for entry in state.pending():
            label = f"{journal.node} job {journal.job_id} {entry.fault}: {entry.action}"
            if skip_pid is not None and entry.early and entry.pid == skip_pid:
                journal.mark_done(entry.seq, "self")
                continue
            try:
                outcome = run_undo(entry.undo, ctx)
            except UndoFailed as exc:
                failed.append(f"{label}: {exc}")
                continue
            journal.mark_done(entry.seq, outcome)
            undone.append(f"{label} -> {outcome}")
    return Reverted(journal.path, tuple(undone), tuple(failed))


def journals(root: Path, nodes: list[str] | None = None) -> list[Journal]:
    """Every journal under `root` (of `nodes` only, if given)."""
    out: list[Journal] = []
    if not root.is_dir():
        return out
    for node_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        if nodes is not None and node_dir.name not in nodes:
            continue
        for f in sorted(node_dir.glob("*.jsonl")):
            out.append(Journal(root, node_dir.name, f.stem))
    return out
