"""Revert what faults left behind: journals whose job ended (or whose deadline passed) without undo.

Node-level state lives in the node's namespaces. Each journal's header records the network and
mount namespaces its changes were made in; an undo run from elsewhere (the sandbox host, where
every node is a pair of namespaces) enters them with ``nsenter`` through a process that still
lives in them, while an undo run on the node itself (epilog, watchdog, ``srun -w node``) runs its
commands directly. That process is root's slurmd or slurmstepd, never a user's: a user's process
in those namespaces may have chrooted into a tree of its own (in a user namespace of its own),
and root's writes and rmdirs through its ``/proc/PID/root`` would land there. If no process is
left in a namespace, the namespace and its state are gone and only host-wide changes (processes,
cgroups) remain to undo; if only processes that are not Slurm's are left, the undo is refused
and stays pending.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults import jobfs, node_cpu, node_gpu, node_net, node_proc, node_storage  # noqa: F401 - undo actions
from slurm_chaos.faults.authz import GRANT_SUFFIX, expired_grants
from slurm_chaos.faults.journal import (
    Header,
    Journal,
    Outcome,
    Reverted,
    State,
    UndoContext,
    journals,
    revert,
)
from slurm_chaos.runner import Completed, Runner
from slurm_chaos.slurm.cli_backend import SlurmCLI
from slurm_chaos.slurm.protocol import Scheduler

#: (job id) -> True running, False ended, None unknown (controller unreachable).
JobProbe = Callable[[str], "bool | None"]


@dataclass
class NsRunner:
    """A Runner that runs every command inside another process's network and mount namespaces."""

    inner: Runner
    pid: int
    mount: bool = True

    def __call__(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> Completed:
        return self.inner(
            node_proc.nsenter_argv(self.pid, argv, mount=self.mount), timeout=timeout, env=env, input=input
        )


class Untrusted(ChaosError):
    """The journal's namespaces still live, but only through processes that are not Slurm's."""


def _pid_in(header: Header, proc: Path = node_proc.PROC) -> tuple[int | None, bool]:
    """Root's slurmd or slurmstepd in the header's namespaces: (pid, also in its mount namespace);
    (None, False) when no process is left in them; Untrusted when only others' are."""

    def matches(pid: int, mount: bool) -> bool:
        if node_proc.ns_inode(pid, "net", proc) != header.netns:
            return False
        return not mount or node_proc.ns_inode(pid, "mnt", proc) == header.mntns

    def slurms(pid: int) -> bool:
        return node_proc.root_daemon(pid, node_proc.SLURM_DAEMONS, proc)

    if matches(header.ns_pid, True) and slurms(header.ns_pid):
        return header.ns_pid, True
    net_only: int | None = None
    others = 0
    for pid in node_proc.pids(proc):
        if not matches(pid, False):
            continue
        if not slurms(pid):
            others += 1
        elif matches(pid, True):
            return pid, True
        elif net_only is None:
            net_only = pid
    if net_only is None and others:
        raise Untrusted(
            f"network namespace {header.netns} holds {others} processes but no slurmd or slurmstepd of "
            "root's: entering it through a user's process could act in a root directory of the user's"
        )
    return net_only, False


def node_runner(header: Header | None, runner: Runner, proc: Path = node_proc.PROC) -> Runner:
    """A runner that acts in the namespaces the journal's changes were made in."""
    if header is None or header.netns is None:
        return runner
    here_net = node_proc.ns_inode("self", "net", proc)
    here_mnt = node_proc.ns_inode("self", "mnt", proc)
    if here_net == header.netns and here_mnt == header.mntns:
        return runner
    pid, mount = _pid_in(header, proc)
    if pid is None:
        return runner  # the namespaces are gone, and with them their qdiscs and mounts
    return NsRunner(runner, pid, mount)


#: How long one node-side question to the controller may take (the watchdog's loop waits on it).
NODE_QUERY_TIMEOUT_S = 15.0


def node_scheduler(runner: Runner) -> Scheduler:
    """The Scheduler node-side code asks (the agent's watchdog, cleanup): the Slurm CLI through
    `runner`, in the environment it was started with (slurmd's, for the agent), bounded per question."""
    return SlurmCLI({}, runner, timeout=NODE_QUERY_TIMEOUT_S)


def stale_reason(state: State, job_running: bool | None, now: float) -> str | None:
    """Why a journal must be reverted now, or None to leave it to its epilog and agent."""
    if not state.pending():
        return None
    deadline = state.deadline
    if deadline is not None and now >= deadline:
        return "deadline passed"
    if state.closed:
        return "an earlier undo left changes pending"
    if job_running is False:
        return "job no longer running"
    return None


#: Written by the epilog when a node holds nothing pending: its hook script runs Python for a job
#: without faults only when a journal or grant is newer than this file.
TIDY_NAME = ".tidy"
#: Seconds a cleanup spends at most emptying one node's trash of per-job storage.
STORAGE_BUDGET_S = 10.0
#: How long a grant without an ``until`` (written before grants had one) may stay.
GRANT_DEFAULT_S = 4 * 3600.0


def cleanup(
    journal_root: Path,
    nodes: list[str] | None,
    runner: Runner,
    job_running: JobProbe | None = None,
    now: float | None = None,
    grant_default_s: float = GRANT_DEFAULT_S,
    storage_roots: Sequence[Path] = (),
) -> list[Outcome]:
    """Revert stale journals under `journal_root` (of `nodes` only, if given) and remove expired
    grants; returns what was done.

    A journal is stale when its deadline passed, its job ended (asked of the controller unless
    `job_running` says otherwise) or an earlier undo failed part-way. Failures are returned too
    (``Outcome.failed``), and stay pending for the next run. A grant expires at its ``until``.
    Per-job storage under `storage_roots` (heartbeat directories, :mod:`~slurm_chaos.faults.jobfs`)
    of jobs that ended is unmounted and removed; one whose job may still run is kept.
    """
    probe = job_running or node_scheduler(runner).job_running
    t = time.time() if now is None else now
    out: list[Outcome] = []
    for journal in journals(journal_root, nodes):
        state = journal.read()
        if not state.pending():
            continue
        reason = stale_reason(state, probe(journal.job_id), t)
        if reason is None:
            continue
        result = revert_journal(journal, runner, by=f"cleanup ({reason})")
        out += result.outcomes(note=f" [{reason}]")
    expired = expired_grants(journal_root, nodes, t, grant_default_s)
    for path in grant_files(journal_root, nodes):
        job_id = path.name[: -len(GRANT_SUFFIX)]
        reason = "expired" if path in expired else "job no longer running" if probe(job_id) is False else None
        if reason:
            path.unlink(missing_ok=True)
            out.append(Outcome(f"grant {path} removed [{reason}]"))
    for root in storage_roots:
        for line in jobfs.sweep(jobfs.JobStorage(root, runner), nodes, probe, STORAGE_BUDGET_S):
            failed = line.startswith("FAILED: ")
            out.append(Outcome(line.removeprefix("FAILED: "), failed=failed))
    return out


def grant_files(journal_root: Path, nodes: list[str] | None) -> list[Path]:
    """Every grant file under `journal_root` (of `nodes` only, if given)."""
    return [
        p for node_dir in _node_dirs(journal_root, nodes) for p in sorted(node_dir.glob(f"*{GRANT_SUFFIX}"))
    ]


def _node_dirs(journal_root: Path, nodes: list[str] | None) -> list[Path]:
    if not journal_root.is_dir():
        return []
    dirs = sorted(p for p in journal_root.iterdir() if p.is_dir() and not p.is_symlink())
    return [d for d in dirs if nodes is None or d.name in nodes]


def mark_tidy(journal_root: Path, node: str) -> bool:
    """Stamp the node's directory as holding nothing pending and no grant (the epilog's shortcut
    for later jobs); returns whether it was stamped."""
    node_dir = journal_root / node
    if "/" in node or not node_dir.is_dir() or node_dir.is_symlink():
        return False
    # The stamp's time is a second before the scan began: a journal or grant written during the
    # scan stays newer than it (file times come from a coarser clock than time.time()), so the
    # next epilog's `find -newer` still sees it. Too early only costs one more look.
    began = time.time() - 1.0
    if any(node_dir.glob(f"*{GRANT_SUFFIX}")) or any(
        j.read().pending() for j in journals(journal_root, [node])
    ):
        return False
    fd = os.open(node_dir / TIDY_NAME, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.close(fd)
    os.utime(node_dir / TIDY_NAME, times=(began, began), follow_symlinks=False)
    return True


def revert_journal(
    journal: Journal, runner: Runner, by: str, skip_pid: int | None = None, proc: Path = node_proc.PROC
) -> Reverted:
    """Revert one journal in its own namespaces (refused, and left pending, where only processes
    that are not Slurm's hold them)."""
    header = journal.read().header
    try:
        inner = node_runner(header, runner, proc)
    except Untrusted as exc:
        return Reverted(journal.path, (), (f"{journal.node} job {journal.job_id}: not reverted: {exc}",))
    root = proc / str(inner.pid) / "root" if isinstance(inner, NsRunner) and inner.mount else Path("/")
    return revert(journal, UndoContext(inner, root=root), by=by, skip_pid=skip_pid)
