"""Each sandbox node's own cgroup subtree, so that Slurm's cgroup plugins run as on a real node.

All slurmds of a sandbox share this host's cgroup hierarchies, and Slurm's v1 plugin names a
job's cgroup ``/slurm/uid_U/job_J`` from the hierarchy's mount point: two nodes of one job would
share (and clean up) one cgroup. So every node gets ``<hierarchy>/slurm-chaos-sandbox-<name>/<node>``
in each hierarchy; its slurmd is started inside it, in a cgroup namespace of its own (that
subtree becomes its ``/``), with the hierarchies mounted afresh in its private mount namespace
(a cgroup mount made in a cgroup namespace is rooted at the namespace's root). Slurm's
``/slurm/...`` then lands in the node's subtree, and ``/proc/PID/cgroup`` read on the node names
paths of that node's mounts, as on a real node.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults import cgroupfs

CGROUP_ROOT = Path("/sys/fs/cgroup")
MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class Hierarchy:
    """One cgroup mount under /sys/fs/cgroup: its directory name there and how to mount it again."""

    name: str  # "cpu", "cpu,cpuacct", "systemd", "unified"
    fstype: str  # "cgroup" (v1) or "cgroup2"
    options: str  # the v1 controllers (or "none,name=systemd"); "" for cgroup2

    def mount_arg(self) -> str:
        """One word for the node launcher: NAME:FSTYPE:OPTIONS."""
        return f"{self.name}:{self.fstype}:{self.options}"


_V1_OPTIONS_KEPT = {
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "blkio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
}


def hierarchies(mountinfo: str | None = None, root: Path = CGROUP_ROOT) -> list[Hierarchy]:
    """The cgroup hierarchies mounted directly under `root` in this mount namespace."""
    text = MOUNTINFO.read_text() if mountinfo is None else mountinfo
    out: list[Hierarchy] = []
    seen: set[str] = set()
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 10:
            continue
        point = Path(fields[4])
        if point.parent != root or point.name in seen:
            continue
        post = line.split(" - ", 1)[1].split()
        fstype, superopts = post[0], post[2] if len(post) > 2 else ""
        if fstype == "cgroup2":
            out.append(Hierarchy(point.name, "cgroup2", ""))
        elif fstype == "cgroup":
            opts = superopts.split(",")
            kept = [o for o in opts if o in _V1_OPTIONS_KEPT]
            named = [o for o in opts if o.startswith("name=")]
            if not kept and not named:
                continue
            options = ",".join(kept) if kept else ",".join(["none", *named])
            out.append(Hierarchy(point.name, "cgroup", options))
        else:
            continue
        seen.add(point.name)
    return out


def symlinks(root: Path = CGROUP_ROOT) -> list[tuple[str, str]]:
    """Links beside the mounts (``cpu -> cpu,cpuacct`` where controllers are co-mounted)."""
    out = []
    with contextlib.suppress(OSError):
        for entry in sorted(root.iterdir()):
            if entry.is_symlink():
                out.append((entry.name, os.readlink(entry)))
    return out


@dataclass(frozen=True)
class SandboxCgroups:
    """The cgroup subtrees of one sandbox: ``<root>/<hierarchy>/slurm-chaos-sandbox-<name>/<node>``."""

    sandbox: str
    root: Path = CGROUP_ROOT

    @property
    def top(self) -> str:
        return f"slurm-chaos-sandbox-{self.sandbox}"

    def node_dirs(self, node: str, hs: list[Hierarchy]) -> list[Path]:
        return [self.root / h.name / self.top / node for h in hs]

    def create_node(self, node: str, hs: list[Hierarchy]) -> list[Path]:
        """Make the node's cgroup in every hierarchy (a cpuset one gets its parent's CPUs and memory
        nodes, without which no process may join it); returns the cgroup.procs files to join."""
        procs = []
        for h in hs:
            top = self.root / h.name / self.top
            for d in (top, top / node):
                d.mkdir(exist_ok=True)
                if "cpuset" in h.options.split(","):
                    cgroupfs.copy_cpuset(d)
            procs.append(top / node / "cgroup.procs")
        return procs

    def subtrees(self) -> list[Path]:
        """This sandbox's top directory in each hierarchy where one exists."""
        out = []
        with contextlib.suppress(OSError):
            for h in sorted(self.root.iterdir()):
                top = h / self.top
                if not h.is_symlink() and top.is_dir():
                    out.append(top)
        return out

    def remove(self, grace: float = 5.0) -> list[str]:
        """Kill whatever still runs in the sandbox's cgroups and remove them, deepest first."""
        tops = self.subtrees()
        pids = sorted({pid for top in tops for pid in _pids_under(top)})
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + grace
        while pids and time.monotonic() < end and any(_pids_under(top) for top in tops):
            time.sleep(0.05)
        removed: list[str] = []
        failed: list[str] = []
        for top in tops:
            below = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for d in [*below, top]:
                try:
                    cgroupfs.rmdir(d)
                    removed.append(str(d))
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    failed.append(f"{d}: {exc.strerror}")
        if failed:
            raise ChaosError("cgroups of sandbox " + self.sandbox + " not removed: " + "; ".join(failed))
        return [f"process {p} in the sandbox's cgroups" for p in pids]


def _pids_under(top: Path) -> set[int]:
    out: set[int] = set()
    for procs in top.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            out.update(int(p) for p in procs.read_text().split())
    return out


#: Runs as the node's launcher, after it joined its cgroups: `unshare --cgroup` makes them the
#: namespace's root; the hierarchies are then mounted afresh in the node's private mount namespace.
NODE_LAUNCHER = r"""
set -e
node=$1 hosts=$2 conf=$3
shift 3
if [ -n "${SLURM_CHAOS_SHARED_MOUNT:-}" ]; then
    # Every mount is the node's own but the shared one: what the node mounts under it (a job's
    # heartbeat tmpfs) the host sees too, and nothing else it mounts leaves the node.
    awk '{print $5}' /proc/self/mountinfo | while read -r mp; do
        mp=$(printf '%b' "$mp")
        case "$mp" in
        "$SLURM_CHAOS_SHARED_MOUNT" | "$SLURM_CHAOS_SHARED_MOUNT"/*) ;;
        *) mount --make-private "$mp" ;;
        esac
    done
    unset SLURM_CHAOS_SHARED_MOUNT
fi
hostname "$node"
mount --bind "$hosts" /etc/hosts
if [ "$#" -gt 0 ]; then
    mount -t tmpfs -o mode=755 slurm-chaos-cgroup /sys/fs/cgroup
    for spec in "$@"; do
        kind=${spec%%:*}
        rest=${spec#*:}
        if [ "$kind" = link ]; then
            ln -s "${rest#*:}" "/sys/fs/cgroup/${rest%%:*}"
            continue
        fi
        fstype=${rest%%:*}
        opts=${rest#*:}
        mkdir "/sys/fs/cgroup/$kind"
        if [ "$fstype" = cgroup2 ]; then
            mount -t cgroup2 cgroup2 "/sys/fs/cgroup/$kind"
        else
            mount -t cgroup -o "$opts" cgroup "/sys/fs/cgroup/$kind"
        fi
    done
fi
exec slurmd -f "$conf" -N "$node"
"""

#: Joins the cgroup.procs files given after "--" and execs the rest (the node's unshare).
JOIN_AND_EXEC = r"""
while [ "$1" != -- ]; do
    echo $$ > "$1"
    shift
done
shift
exec "$@"
"""


def node_argv(
    netns: str,
    node: str,
    hosts: Path,
    slurm_conf: Path,
    procs: list[Path],
    hs: list[Hierarchy],
    links: list[tuple[str, str]],
    shared: Path | None = None,
) -> list[str]:
    """The command that starts one node's slurmd in its own namespaces (and cgroups, if `procs`);
    `shared`: a shared mount of the host's that stays the node's peer (mounts under it propagate
    both ways), every other mount of the node being private."""
    unshare = ["unshare", "--uts", "--mount", "--propagation", "private" if shared is None else "unchanged"]
    specs: list[str] = []
    if procs:
        unshare.insert(1, "--cgroup")
        specs = [h.mount_arg() for h in hs] + [f"link:{name}:{target}" for name, target in links]
    env = [] if shared is None else ["env", f"SLURM_CHAOS_SHARED_MOUNT={shared}"]
    inner = [*unshare, *env, "sh", "-c", NODE_LAUNCHER, "sh", node, str(hosts), str(slurm_conf), *specs]
    argv = ["nsenter", f"--net=/run/netns/{netns}"]
    if procs:
        return [*argv, "sh", "-c", JOIN_AND_EXEC, "sh", *(str(p) for p in procs), "--", *inner]
    return [*argv, *inner]
