"""A job's cgroups on this node, found from its slurmstepd, for faults that must stay inside them.

Slurm makes a job's cgroup in the hierarchies its plugins manage: on cgroup v1 (one hierarchy
per controller) ``/slurm/uid_U/job_J/step_S[/task_T]`` in freezer (proctrack/cgroup), cpuset and
memory (task/cgroup), but nothing in the cpu controller's; on v2 (one unified hierarchy)
``.../job_J/step_S/user/task_T``. A process's cgroup in each hierarchy is read from
``/proc/PID/cgroup``; the job's is the prefix of its slurmstepd's path up to its ``job_J``
component (``node_proc.job_cgroups``), never of a task's: on v2 a user with a delegated subtree
(``user@U.service``) makes ``job_J/step_extern`` there at will. Paths are those of the reader's
cgroup namespace, which is the node's for the prolog and its agent.

A process can exit between the scan that found it and the write that moves it: that is
`ProcessGone`, which callers log and skip.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from slurm_chaos.errors import ChaosError

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC = Path("/proc")
#: The name of the unified (v2) hierarchy in a process's /proc/PID/cgroup ("0::/path").
UNIFIED = ""


class ProcessGone(ChaosError):
    """The process exited (ESRCH/ENOENT) between being found and being acted on."""


def gone(exc: OSError) -> bool:
    return exc.errno in (errno.ESRCH, errno.ENOENT)


def proc_cgroups(pid: int, proc: Path = PROC) -> dict[str, str]:
    """{controllers of a hierarchy ("cpu", "cpu,cpuacct", "name=systemd", "" for v2): path}."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError as exc:
        if gone(exc):
            raise ProcessGone(f"pid {pid} exited") from exc
        raise ChaosError(f"{proc}/{pid}/cgroup: {exc.strerror}") from exc
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out[parts[1]] = parts[2]
    if not out:  # a zombie's cgroup file is empty
        raise ProcessGone(f"pid {pid} exited")
    return out


def job_path(path: str, job_id: str) -> str | None:
    """`path` up to its ``job_<job_id>`` component (None if it has none): the job's own cgroup
    where `path` is a slurmstepd's (a task's may be a tree of the user's making)."""
    parts = [p for p in path.split("/") if p]
    mark = f"job_{job_id}"
    if mark not in parts:
        return None
    return "/" + "/".join(parts[: parts.index(mark) + 1])


def _under(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


@dataclass(frozen=True)
class Cgroupfs:
    """This node's cgroup mounts: v2 when ``<root>/cgroup.controllers`` exists (the unified
    hierarchy is mounted at the root), else v1 with one directory per hierarchy."""

    root: Path = CGROUP_ROOT
    proc: Path = PROC

    @property
    def v2(self) -> bool:
        return (self.root / "cgroup.controllers").exists()

    def mount_of(self, controllers: str) -> Path | None:
        """Where the hierarchy of `controllers` (a /proc/PID/cgroup field) is mounted, if it is."""
        if controllers == UNIFIED:
            return self.root if self.v2 else None
        names = [c.removeprefix("name=") for c in controllers.split(",")]
        for candidate in (",".join(names), *names):
            d = self.root / candidate
            if (d / "cgroup.procs").exists():
                return d
        return None

    def cpu_hierarchy(self) -> str:
        """The /proc/PID/cgroup name of the hierarchy that holds the cpu controller."""
        if self.v2:
            return UNIFIED
        for candidate in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
            if (self.root / candidate / "cpu.cfs_quota_us").exists():
                return candidate
        raise ChaosError(f"no cgroup cpu controller mounted under {self.root}")

    def dir(self, controllers: str, path: str) -> Path:
        mount = self.mount_of(controllers)
        if mount is None:
            raise ChaosError(f"cgroup hierarchy {controllers or 'unified'} is not mounted under {self.root}")
        return mount / path.lstrip("/")

    def of(self, pid: int) -> dict[str, str]:
        """The process's cgroup in each hierarchy mounted here."""
        cg = proc_cgroups(pid, self.proc)
        return {k: v for k, v in cg.items() if self.mount_of(k) is not None}

    def mounted(self, cgroups: Mapping[str, str]) -> dict[str, str]:
        """The entries of `cgroups` ({hierarchy: path}) whose hierarchy is mounted here."""
        return {h: path for h, path in cgroups.items() if self.mount_of(h) is not None}

    def move(self, pid: int, group: Path) -> None:
        """Write `pid` into `group`; ProcessGone if it exited meanwhile."""
        try:
            self.write(group / "cgroup.procs", str(pid))
        except OSError as exc:
            if gone(exc):
                raise ProcessGone(f"pid {pid} exited before it could be moved to {group}") from exc
            raise ChaosError(f"move pid {pid} to {group}: {exc.strerror or exc}") from exc

    def write(self, path: Path, value: str) -> None:
        """One write to a control file (the kernel acts on each write as a whole)."""
        path.write_text(f"{value}\n")

    def procs(self, group: Path) -> list[int]:
        try:
            return [int(p) for p in (group / "cgroup.procs").read_text().split()]
        except OSError:
            return []


def copy_cpuset(group: Path) -> None:
    """A new v1 cpuset cgroup admits no process until it has CPUs and memory nodes: its parent's."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        f = group / name
        if f.exists() and not f.read_text().strip():
            f.write_text((group.parent / name).read_text())


def inside(paths: Mapping[str, str], jobs: Mapping[str, str]) -> bool:
    """True when every hierarchy of `jobs` has its path of `paths` inside that job cgroup."""
    return all(_under(paths.get(h, ""), j) for h, j in jobs.items())


def rmdir(group: Path) -> None:
    """Remove a cgroup (its control files go with it; its processes and child cgroups do not)."""
    os.rmdir(group)
