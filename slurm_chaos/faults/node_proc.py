"""Processes on a node: identity that survives PID reuse, and the tasks of one job found through /proc.

A PID alone is not an identity: by the time an undo runs, the process may be gone and its PID
reused. Every process slurm-chaos records is recorded as (pid, start time in clock ticks since
boot), field 22 of ``/proc/PID/stat``, and is only signalled while both still match.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcId:
    """One process: its PID and its start time (clock ticks after boot)."""

    pid: int
    start: int


def start_time(pid: int, proc: Path = PROC) -> int | None:
    """Start time of `pid` in clock ticks, or None when it is gone (zombies count as gone)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def proc_id(pid: int, proc: Path = PROC) -> ProcId | None:
    start = start_time(pid, proc)
    return None if start is None else ProcId(pid, start)


def is_alive(p: ProcId, proc: Path = PROC) -> bool:
    """True while the very process `p` (not a later one with its PID) still runs."""
    return start_time(p.pid, proc) == p.start


def send(p: ProcId, sig: int, group: bool = False, proc: Path = PROC) -> bool:
    """Signal `p` (its process group when `group`) if it is still the same process; True if sent."""
    if not is_alive(p, proc):
        return False
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(p.pid, sig)
        else:
            os.kill(p.pid, sig)
        return True
    return False


def pids(proc: Path = PROC) -> Iterator[int]:
    for entry in proc.iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def environ(pid: int, proc: Path = PROC) -> dict[str, str]:
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            out[key] = value
    return out


def cmdline(pid: int, proc: Path = PROC) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [p.decode(errors="replace") for p in raw.split(b"\0") if p]


def ns_inode(pid: int | str, kind: str, proc: Path = PROC) -> int | None:
    """Inode of namespace `kind` (net, mnt) of `pid` ('self' allowed); None if unreadable."""
    try:
        return os.stat(proc / str(pid) / "ns" / kind).st_ino
    except OSError:
        return None


def nsenter_argv(pid: int, argv: Sequence[str], mount: bool = True, uts: bool = False) -> list[str]:
    """`argv` run in the network namespace of `pid` (and its mount and UTS namespaces if asked):
    how code on the sandbox host acts on a node, through a process that lives in it (its slurmd).
    nsenter execs `argv` in place (no fork: no PID namespace is entered), so its PID is argv's."""
    flags = ["-n", *(["-m"] if mount else []), *(["-u"] if uts else [])]
    return ["nsenter", "-t", str(pid), *flags, "--", *argv]


def parent(pid: int, proc: Path = PROC) -> int | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def comm(pid: int, proc: Path = PROC) -> str:
    try:
        return (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def find_ancestor(pid: int, name: str, proc: Path = PROC) -> int | None:
    """Nearest ancestor of `pid` whose comm is `name` (slurmd, for the prolog and the agent)."""
    seen = 0
    current: int | None = parent(pid, proc)
    while current and current > 1 and seen < 64:
        if comm(current, proc) == name:
            return current
        current = parent(current, proc)
        seen += 1
    return None


def job_tasks(job_id: str, rank: int | None = None, proc: Path = PROC) -> list[ProcId]:
    """Task processes of job steps of `job_id` in this network namespace (of global `rank` if given).

    A task carries SLURM_JOB_ID, SLURM_PROCID and a numeric SLURM_STEP_ID in its environment;
    the batch script (step 'batch'), srun itself and slurmstepd are not tasks and are left alone:
    stopping srun would stall every rank's I/O, not just this one's. Processes in another network
    namespace are another node's (in the sandbox all nodes share one PID namespace).
    """
    here = ns_inode("self", "net", proc)
    found: list[ProcId] = []
    for pid in pids(proc):
        env = environ(pid, proc)
        if env.get("SLURM_JOB_ID") != job_id or not env.get("SLURM_STEP_ID", "").isdigit():
            continue
        if rank is not None and env.get("SLURM_PROCID") != str(rank):
            continue
        argv = cmdline(pid, proc)
        if not argv or Path(argv[0]).name in ("srun", "slurmstepd") or argv[0].startswith("slurmstepd:"):
            continue
        if ns_inode(pid, "net", proc) != here:
            continue
        p = proc_id(pid, proc)
        if p is not None:
            found.append(p)
    return found


def job_steps_here(job_id: str, proc: Path = PROC) -> list[int]:
    """PIDs of this job's slurmstepd processes in this network namespace (the job still runs here)."""
    here = ns_inode("self", "net", proc)
    prefix = f"slurmstepd: [{job_id}."
    out = []
    for pid in pids(proc):
        argv = cmdline(pid, proc)
        if argv and argv[0].startswith(prefix) and ns_inode(pid, "net", proc) == here:
            out.append(pid)
    return out


def signal_name(sig: int) -> str:
    return signal.Signals(sig).name
