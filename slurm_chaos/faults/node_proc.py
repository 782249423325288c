"""Processes on a node: identity that survives PID reuse, Slurm's own processes, and a job's tasks.

A PID alone is not an identity: by the time an undo runs, the process may be gone and its PID
reused. Every process slurm-chaos records is recorded as (pid, start time in clock ticks since
boot), field 22 of ``/proc/PID/stat``, and is only signalled while both still match.

Nor is a title or an environment: a job's user sets both (``exec -a "slurmstepd: [J.extern]"``).
Slurm's own processes are root's in every uid and run Slurm's binary (`root_daemon`); a job's
steps are its slurmstepd processes, its cgroups theirs, its tasks the processes in a step's
cgroup (`job_tasks`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults import cgroupfs

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


def uids(pid: int | str, proc: Path = PROC) -> tuple[int, ...]:
    """Real, effective, saved and filesystem uid of `pid` as this reader's user namespace sees them
    (a user's "root" in a user namespace of its own reads as the user); () when it is gone."""
    try:
        text = (proc / str(pid) / "status").read_text()
    except OSError:
        return ()
    for line in text.splitlines():
        if line.startswith("Uid:"):
            return tuple(int(u) for u in line.split()[1:5])
    return ()


def owned_by(pid: int | str, uid: int, proc: Path = PROC) -> bool:
    """True when every uid of `pid` is `uid`: a setuid program a user started keeps the user's real uid."""
    ids = uids(pid, proc)
    return bool(ids) and all(u == uid for u in ids)


def exe_name(pid: int, proc: Path = PROC) -> str:
    """The name of the file `pid` executes (an upgraded daemon's reads "NAME (deleted)": NAME)."""
    try:
        target = os.readlink(proc / str(pid) / "exe")
    except OSError:
        return ""
    return Path(target.removesuffix(" (deleted)")).name


#: The names Slurm's node daemons are installed under: Debian's slurm-wlm installs slurmstepd-wlm
#: (/usr/sbin/slurmstepd is an alternatives link to it; /proc/PID/exe names the file itself).
SLURMSTEPD = ("slurmstepd", "slurmstepd-wlm")
SLURM_DAEMONS = ("slurmd", "slurmd-wlm", *SLURMSTEPD)


def root_daemon(pid: int, names: Sequence[str], proc: Path = PROC) -> bool:
    """True when `pid` is root's in every uid and executes a file named one of `names`.

    Nothing else about a process is its own: any process may call itself "slurmstepd: [J.extern]"
    (``exec -a``), set any environment, chroot into a tree of its own inside a user namespace,
    or run the slurmstepd binary, but not as root."""
    return owned_by(pid, 0, proc) and exe_name(pid, proc) in names


#: The title slurmstepd gives itself: "slurmstepd: [JOB.STEP]", STEP a number, "extern" or "batch".
STEP_TITLE = re.compile(r"slurmstepd: \[(?P<job>[0-9]+)\.(?P<step>[a-z0-9]+)\]")


def step_daemons(job_id: str, proc: Path = PROC) -> dict[int, str]:
    """{pid: step} of job `job_id`'s slurmstepd processes in this network namespace.

    A title is believed only of root's slurmstepd, whose memory (where /proc/PID/cmdline is read
    from) no user can write. Processes in another network namespace are another node's (in the
    sandbox all nodes share one PID namespace)."""
    here = ns_inode("self", "net", proc)
    out: dict[int, str] = {}
    for pid in pids(proc):
        argv = cmdline(pid, proc)
        title = STEP_TITLE.fullmatch(argv[0].strip()) if argv else None
        if title is None or title["job"] != job_id:
            continue
        if root_daemon(pid, SLURMSTEPD, proc) and ns_inode(pid, "net", proc) == here:
            out[pid] = title["step"]
    return out


def job_cgroups(job_id: str, proc: Path = PROC, daemons: Iterable[int] | None = None) -> dict[str, str]:
    """{hierarchy: job `job_id`'s cgroup} as Slurm made it: the cgroups of the job's own slurmstepd
    (of `daemons`, its `step_daemons` found already) up to their ``job_J`` component; {} while
    none runs here or it is in no cgroup of the job.

    Never taken from a task: on cgroup v2 a user's delegated subtree may hold a
    ``.../user@U.service/job_J/step_extern`` of the user's making, and a root slurmstepd is
    where Slurm put it (no user can move a process of root's)."""
    for pid in sorted(step_daemons(job_id, proc) if daemons is None else daemons):
        try:
            paths = cgroupfs.proc_cgroups(pid, proc)
        except ChaosError:
            continue
        jobs = {h: j for h, path in paths.items() if (j := cgroupfs.job_path(path, job_id)) is not None}
        if jobs:
            return jobs
    return {}


def step_cgroups(jobs: Mapping[str, str], step: str) -> dict[str, str]:
    """{hierarchy: the step's cgroup} under the job's cgroups `jobs` (Slurm's ``job_J/step_S``)."""
    return {h: f"{j.rstrip('/')}/step_{step}" for h, j in jobs.items()}


def job_tasks(job_id: str, rank: int | None = None, proc: Path = PROC) -> list[ProcId]:
    """Task processes of job `job_id`'s numbered steps here (of global `rank` if given).

    A task is a process in a step's cgroup (in every hierarchy where Slurm made the job's), the
    step's cgroup taken from its slurmstepd (see `job_cgroups`); where Slurm made the job no
    cgroup, a descendant of that slurmstepd. Neither the environment nor a title says what a task
    is: a user sets both at will. Only then is the rank read, from SLURM_PROCID, among the step's
    own processes: a task that lies about it misleads the fault about the job's own ranks only.
    slurmstepd and srun are not tasks: stopping srun would stall every rank's I/O.
    """
    daemons = step_daemons(job_id, proc)
    steps = {pid: s for pid, s in daemons.items() if s.isdigit()}
    if not steps:
        return []
    jobs = job_cgroups(job_id, proc, daemons)
    members = _in_cgroups(jobs, set(steps.values()), proc) if jobs else _descendants(set(steps), proc)
    found: list[ProcId] = []
    for pid in sorted(members - set(steps)):
        if rank is not None and environ(pid, proc).get("SLURM_PROCID") != str(rank):
            continue
        argv = cmdline(pid, proc)
        if not argv or Path(argv[0]).name == "srun" or root_daemon(pid, SLURMSTEPD, proc):
            continue
        p = proc_id(pid, proc)
        if p is not None:
            found.append(p)
    return found


def _in_cgroups(jobs: Mapping[str, str], steps: set[str], proc: Path) -> set[int]:
    """The processes inside the cgroup of one of `steps` in every hierarchy of `jobs`."""
    groups = [step_cgroups(jobs, s) for s in sorted(steps)]
    out: set[int] = set()
    for pid in pids(proc):
        try:
            paths = cgroupfs.proc_cgroups(pid, proc)
        except ChaosError:
            continue
        if any(cgroupfs.inside(paths, g) for g in groups):
            out.add(pid)
    return out


def _descendants(roots: set[int], proc: Path) -> set[int]:
    """`roots` and every process below them (a parent is the kernel's record, no user's claim)."""
    children: dict[int, list[int]] = {}
    for pid in pids(proc):
        ppid = parent(pid, proc)
        if ppid is not None:
            children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def signal_name(sig: int) -> str:
    return signal.Signals(sig).name
