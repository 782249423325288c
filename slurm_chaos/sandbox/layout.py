"""Names, addresses, ports and paths of one named sandbox, derived from its name and index."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_chaos.errors import UsageError

NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,7}$")
MAX_NODES = 64
SUBNET_PREFIX = "10.251"
PORT_BASE = 17000


def sandboxes_root() -> Path:
    """Directory that holds one state directory per sandbox."""
    return Path(os.environ.get("SLURM_CHAOS_SANDBOX_ROOT", "/var/lib/slurm-chaos/sandboxes"))


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise UsageError(
            f"sandbox name {name!r}: expected 1-8 characters of a-z, 0-9 and '-', starting with a letter "
            "(it becomes part of interface names, which Linux limits to 15 characters)"
        )
    return name


@dataclass(frozen=True)
class Layout:
    """Everything that identifies one sandbox on this machine."""

    name: str
    index: int
    nodes: int
    controller_host: str
    #: Slurm's cgroup plugins, each node in a cgroup subtree of its own (see sandbox/cgroups.py);
    #: False: proctrack/linuxproc and no task plugin, as before.
    cgroups: bool = True
    #: Leaf switches under the spine, the nodes split evenly between them in order; 0: two nodes
    #: per leaf (one rack each), the 4-node layout the shipped site config describes.
    leaf_switches: int = 0

    @property
    def root(self) -> Path:
        return sandboxes_root() / self.name

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    def slurmd_pidfile(self, node: str) -> Path:
        """Where the slurmd of `node` writes its PID: the process whose namespaces are the node's."""
        return self.run_dir / f"slurmd.{node}.pid"

    @property
    def shared_dir(self) -> Path:
        """Plays the cluster's shared filesystem: job output, checkpoints, probe files."""
        return self.root / "shared"

    @property
    def bridge(self) -> str:
        return f"scb-{self.name}"

    @property
    def subnet(self) -> str:
        return f"{SUBNET_PREFIX}.{self.index}"

    @property
    def controller_addr(self) -> str:
        return f"{self.subnet}.1"

    def node_name(self, i: int) -> str:
        return f"node{i}"

    def node_names(self) -> list[str]:
        return [self.node_name(i) for i in range(1, self.nodes + 1)]

    def node_addr(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"

    def netns(self, i: int) -> str:
        return f"slurm-chaos-{self.name}-node{i}"

    def veth(self, i: int) -> str:
        return f"scv-{self.name}-{i}"

    @property
    def ctld_port(self) -> int:
        return PORT_BASE + 10 * self.index

    @property
    def dbd_port(self) -> int:
        return self.ctld_port + 1

    @property
    def mariadb_port(self) -> int:
        return self.ctld_port + 2

    @property
    def prometheus_port(self) -> int:
        return self.ctld_port + 3

    @property
    def alertmanager_port(self) -> int:
        return self.ctld_port + 4

    @property
    def exporter_port(self) -> int:
        return self.ctld_port + 5

    @property
    def cluster_name(self) -> str:
        return f"chaos{self.index}"

    @property
    def reservation(self) -> str:
        return "chaos_maint"

    def switches(self) -> dict[str, list[str]]:
        """Leaf switches of topology.conf, one rack each: `leaf_switches` of them, or two nodes per leaf."""
        names = self.node_names()
        if self.leaf_switches <= 0:
            return {f"sw{k // 2 + 1}": names[k : k + 2] for k in range(0, len(names), 2)}
        # The first `extra` leaves take one node more: 10 nodes on 4 leaves are 3, 3, 2, 2.
        per, extra = divmod(len(names), self.leaf_switches)
        out: dict[str, list[str]] = {}
        start = 0
        for k in range(self.leaf_switches):
            size = per + (1 if k < extra else 0)
            out[f"sw{k + 1}"] = names[start : start + size]
            start += size
        return out

    def rack_of(self, node: str) -> str:
        for sw, members in self.switches().items():
            if node in members:
                return "rack" + sw[2:]
        raise KeyError(node)

    def env(self) -> dict[str, str]:
        """Environment for Slurm commands aimed at this sandbox (the maintenance reservation included)."""
        return {
            "SLURM_CONF": str(self.slurm_conf),
            "SBATCH_RESERVATION": self.reservation,
            "SALLOC_RESERVATION": self.reservation,
            "SLURM_RESERVATION": self.reservation,
        }

    def site_placeholders(self) -> dict[str, str]:
        """The values of a sandbox site config's `${name}` placeholders (site_configs/sandbox.yaml)."""
        return {
            "sandbox_root": str(self.root),
            "sandbox_shared": str(self.shared_dir),
            "sandbox_slurm_conf": str(self.slurm_conf),
            "sandbox_etc": str(self.etc),
            "prometheus_port": str(self.prometheus_port),
            "alertmanager_port": str(self.alertmanager_port),
            "reservation": self.reservation,
        }

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "sandbox.json").write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, name: str) -> Layout | None:
        path = sandboxes_root() / check_name(name) / "sandbox.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        data.setdefault("cgroups", False)  # written before the sandbox had cgroups: it ran without
        data.setdefault("leaf_switches", 0)
        return cls(**data)


def site_placeholders(name: str) -> dict[str, str] | None:
    """What `load_site(path, site_placeholders)` fills a sandbox site's placeholders in with: the
    values of sandbox `name` as it runs on this machine; None when it is not up."""
    layout = Layout.load(name)
    return layout.site_placeholders() if layout else None


def used_indices() -> set[int]:
    root = sandboxes_root()
    used = set()
    if root.is_dir():
        for p in root.glob("*/sandbox.json"):
            try:
                used.add(int(json.loads(p.read_text())["index"]))
            except (ValueError, KeyError, OSError):
                continue
    return used
