"""Onboarding: a site config written from what Slurm reports about a live cluster (`site init`).

What Slurm knows is filled in: the cluster name, partitions, the nodes' CPUs, sockets (taken as
NUMA nodes) and GPUs with the socket gres.conf binds them to, one rack per leaf switch of
topology.conf, node features, and the maintenance reservation. Where `site init` runs on a GPU
node (nvidia-smi is there), each GPU's bus id (``--query-gpu=index,pci.bus_id``) and NUMA node
(``topo -m``'s NUMA Affinity) come from nvidia-smi instead, numbered as Slurm numbers them (the
driver's device minors, ``gpu/numbering.py``). What it cannot know (the checkpoint
path, monitoring, detectors, who may run experiments, the probe's Python) is written as a
`TODO: ...` value, which load_site refuses, naming each key, until someone fills it in.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import socket
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from slurm_chaos.errors import SlurmError, UsageError
from slurm_chaos.gpu import numbering, nvsmi
from slurm_chaos.hostlist import compress_hostlist
from slurm_chaos.runner import Runner
from slurm_chaos.site import TODO, Checkpoint, ProbeOptions, SlurmOptions, healthcheck_signals, todo_entries
from slurm_chaos.slurm.backend import Scheduler
from slurm_chaos.slurm.cli_backend import SlurmCLI
from slurm_chaos.slurm.model import (
    ClusterConfig,
    NodeInfo,
    PartitionInfo,
    ReservationInfo,
    SwitchInfo,
)


@dataclass(frozen=True)
class NodeGpu:
    """One GPU of the node `site init` ran on: its number, bus id and NUMA node (None: not said)."""

    index: int
    pci_bus_id: str
    numa_node: int | None


@dataclass(frozen=True)
class LocalGpus:
    """The GPUs nvidia-smi shows on the node `site init` ran on; ``slurm_numbers``: numbered as
    Slurm numbers them (the driver's device minors), else by NVML's index."""

    host: str
    gpus: tuple[NodeGpu, ...]
    slurm_numbers: bool


@dataclass(frozen=True)
class ClusterFacts:
    """Everything `site init` asks Slurm, in one place (so the config is built without Slurm), and
    the GPUs of the node it runs on where nvidia-smi is there."""

    version: str
    config: ClusterConfig
    partitions: dict[str, PartitionInfo]
    nodes: dict[str, NodeInfo]
    switches: list[SwitchInfo]
    reservations: dict[str, ReservationInfo]
    local_gpus: LocalGpus | None = None


@dataclass(frozen=True)
class Draft:
    """A site config as load_site reads it, with comments for the file by dotted key."""

    data: dict[str, Any]
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def todos(self) -> list[tuple[str, str]]:
        return todo_entries(self.data)


def gather(scheduler: Scheduler) -> ClusterFacts:
    """Ask Slurm (six queries) for what a site config describes."""
    return ClusterFacts(
        version=scheduler.version(),
        config=scheduler.cluster_config(),
        partitions=scheduler.partitions(),
        nodes=scheduler.nodes(),
        switches=scheduler.topology(),
        reservations=scheduler.reservations(),
    )


def describe_gpus(
    query: str, topo: str, driver: Sequence[numbering.DriverGpu] | None, host: str
) -> LocalGpus:
    """This node's GPUs from ``nvidia-smi --query-gpu=index,pci.bus_id --format=csv`` and
    ``nvidia-smi topo -m``, renumbered by the driver's device minors where it lists every GPU."""
    numa = {g.index: g.numa_node for g in nvsmi.parse_topo(topo)}
    seen = nvsmi.readings(query)
    minors = {g.bus_id: g.minor for g in driver or ()}
    slurm = bool(seen) and all(r.bus_id in minors for r in seen)
    gpus = [NodeGpu(minors[r.bus_id] if slurm else r.index, r.bus_id, numa.get(r.index)) for r in seen]
    return LocalGpus(host, tuple(sorted(gpus, key=lambda g: g.index)), slurm)


def local_gpus(runner: Runner, driver_root: Path = numbering.PROC_GPUS) -> LocalGpus | None:
    """The GPUs of the node `site init` runs on; None where nvidia-smi is not there or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = runner(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv"], timeout=30)
    topo = runner(["nvidia-smi", "topo", "-m"], timeout=30)
    if not query.ok:
        return None
    host = socket.gethostname().split(".")[0]
    return describe_gpus(
        query.stdout, topo.stdout if topo.ok else "", numbering.read_driver(driver_root), host
    )


def _todo(what: str) -> str:
    return f"{TODO} {what}"


def _hosts(names: Sequence[str]) -> str:
    return compress_hostlist(list(names))


def choose_reservation(facts: ClusterFacts, name: str | None) -> ReservationInfo | None:
    """The reservation asked for, else the only one there is, else none."""
    if name is not None:
        if name not in facts.reservations:
            known = ", ".join(facts.reservations) or "none"
            raise UsageError(f"--reservation {name}: Slurm has no such reservation (reservations: {known})")
        return facts.reservations[name]
    if len(facts.reservations) == 1:
        return next(iter(facts.reservations.values()))
    return None


def choose_partition(facts: ClusterFacts, resv: ReservationInfo | None) -> PartitionInfo:
    """The default partition (or the first) among those that hold all of the reservation's nodes."""
    parts = [p for p in facts.partitions.values() if p.nodes]
    if not parts:
        raise SlurmError("Slurm reports no partition with nodes: nothing to describe")
    holding = [p for p in parts if resv and set(resv.nodes) <= set(p.nodes)]
    candidates = holding or parts
    return next((p for p in candidates if p.default), candidates[0])


Hardware = tuple[int, int, int, tuple[int, ...] | None]


def _gpu_numa(node: NodeInfo) -> tuple[int, ...] | None:
    """Each GPU's NUMA node in Slurm's order, when every GPU entry is bound to a single socket."""
    gpus = [g for g in node.gres if g.name == "gpu"]
    if not gpus or any(len(g.sockets) != 1 for g in gpus):
        return None
    return tuple(g.sockets[0] for g in gpus for _ in range(g.count))


def _hardware(node: NodeInfo) -> Hardware:
    """What the site's `nodes` section says of one node: CPUs, sockets, GPUs, each GPU's socket."""
    gpus = sum(g.count for g in node.gres if g.name == "gpu")
    return node.cpus, max(node.sockets, 1), gpus, _gpu_numa(node)


def _describe(kind: Hardware) -> str:
    return f"{kind[0]} CPUs, {kind[1]} sockets, {kind[2]} GPUs"


def _gres_text(node: NodeInfo) -> str:
    return ",".join(
        f"{g.name}:{g.type + ':' if g.type else ''}{g.count}"
        + (f"(S:{','.join(map(str, g.sockets))})" if g.sockets else "")
        for g in node.gres
    )


def _nodes_section(facts: ClusterFacts, members: Sequence[str], notes: dict[str, str]) -> dict[str, Any]:
    """The most common node hardware among `members`; a note names the nodes that differ."""
    known = [facts.nodes[n] for n in members if n in facts.nodes and facts.nodes[n].cpus]
    if not known:
        raise SlurmError(f"Slurm reports no CPU count for the nodes {_hosts(members)}")
    kinds = Counter(_hardware(n) for n in known)
    common = kinds.most_common(1)[0][0]
    cpus, sockets, gpus, numa = common
    if len(kinds) > 1:
        others = "; ".join(
            f"{_hosts([n.name for n in known if _hardware(n) == kind])}: {_describe(kind)}"
            for kind in kinds
            if kind != common
        )
        same = _hosts([n.name for n in known if _hardware(n) == common])
        notes["nodes"] = f"Describes {same}; Slurm reports other hardware on {others}."
    section: dict[str, Any] = {"cpus": cpus, "numa_nodes": sockets, "gpus_per_node": gpus}
    notes["nodes.numa_nodes"] = (
        "Slurm's Sockets per node; a node with more NUMA domains than sockets (e.g. AMD NPS4) "
        "needs its real count."
    )
    local = _local_gpus(facts.local_gpus, gpus, sockets, members, notes)
    if local:
        section["gpus"] = local
    elif gpus and numa is not None and max(numa) < sockets:
        section["gpus"] = [{"index": i, "numa_node": n} for i, n in enumerate(numa)]
        notes["nodes.gpus"] = " ".join(
            filter(
                None,
                (
                    notes.get("nodes.gpus"),
                    "Indices in Slurm's order, NUMA nodes from the socket gres.conf binds each GPU to; "
                    "check against `nvidia-smi topo -m` and add pci_bus_id if the faults need it.",
                ),
            )
        )
    elif gpus:
        section["gpus"] = _todo(
            "each GPU's NUMA node as [{index: 0, numa_node: 0}, ...] (see `nvidia-smi topo -m`); "
            f"Slurm only says {_gres_text(known[0])}"
        )
    section["interface"] = _todo("network interface of the probe's sockets, e.g. eth0 or ib0")
    notes["nodes.interface"] = "Add `hca: [mlx5_0, ...]` for InfiniBand, and NCCL settings under nccl.env."
    return section


def _local_gpus(
    local: LocalGpus | None, gpus: int, sockets: int, members: Sequence[str], notes: dict[str, str]
) -> list[dict[str, Any]]:
    """``nodes.gpus`` from nvidia-smi on this node, where it shows the nodes' GPU count with a NUMA
    node each; [] otherwise (a note says why where nvidia-smi answered)."""
    if local is None or not gpus:
        return []
    if len(local.gpus) != gpus or any(g.numa_node is None or g.numa_node >= sockets for g in local.gpus):
        notes["nodes.gpus"] = (
            f"nvidia-smi on {local.host} shows {len(local.gpus)} GPUs (NUMA nodes "
            f"{[g.numa_node for g in local.gpus]}), not {gpus} on at most {sockets} NUMA nodes: not used."
        )
        return []
    which = "among the nodes described" if local.host in members else "not one of the nodes described"
    numbers = (
        "numbered as Slurm numbers them (the driver's device minors)"
        if local.slurm_numbers
        else "numbered by NVML's index: no /proc/driver/nvidia/gpus to tell Slurm's numbers (device minors)"
    )
    notes["nodes.gpus"] = (
        f"From nvidia-smi on {local.host} ({which}): bus ids from --query-gpu, NUMA nodes from "
        f"`topo -m`, {numbers}."
    )
    return [{"index": g.index, "numa_node": g.numa_node, "pci_bus_id": g.pci_bus_id} for g in local.gpus]


def _rack_names(leaves: Sequence[SwitchInfo]) -> list[str]:
    """`rack<N>` after the number a leaf switch's name ends in (sw1 -> rack1, leaf01 -> rack01)."""
    numbers = [m.group(1) if (m := re.search(r"(\d+)$", s.name)) else "" for s in leaves]
    if all(numbers) and len(set(numbers)) == len(numbers):
        return [f"rack{n}" for n in numbers]
    return [f"rack{i}" for i in range(1, len(leaves) + 1)]


def _racks(facts: ClusterFacts, in_partitions: set[str], notes: dict[str, str]) -> dict[str, Any]:
    leaves = [s for s in facts.switches if s.leaf and set(s.nodes) & in_partitions]
    if not leaves:
        plugin = facts.config.topology_plugin or "none"
        notes["racks"] = (
            f"Slurm reports no switches (TopologyPlugin={plugin}): list racks and their leaf switches "
            "by hand for the rack experiments."
        )
        return {}
    notes["racks"] = "One rack per leaf switch of topology.conf."
    return {
        name: {"switch": leaf.name, "nodes": _hosts([n for n in leaf.nodes if n in in_partitions])}
        for name, leaf in zip(_rack_names(leaves), leaves, strict=True)
    }


def _features(facts: ClusterFacts, in_partitions: set[str]) -> dict[str, str]:
    holders: dict[str, list[str]] = {}
    for node in facts.nodes.values():
        if node.name in in_partitions:
            for feature in node.features:
                holders.setdefault(feature, []).append(node.name)
    return {feature: _hosts(names) for feature, names in holders.items()}


def _slurm_section(
    facts: ClusterFacts, slurm_conf: str | None, part: PartitionInfo, resv: ReservationInfo | None
) -> dict[str, Any]:
    return {
        "conf": slurm_conf,
        "partition": part.name,
        "reservation": resv.name if resv else None,
        "time_limit": SlurmOptions(partition=part.name).time_limit,
        "plugstack_conf": facts.config.plugstack_conf or None,
        "hooks_dir": _todo("directory holding prolog.d/, epilog.d/, healthcheck.d/ (null: none)"),
    }


def _unknowns(gpus_per_node: int) -> dict[str, Any]:
    """The sections Slurm knows nothing about: the probe, checkpoints, monitoring."""
    return {
        "probe": {
            "python": _todo("Python with PyTorch on every node"),
            "model_size": _todo("tiny, small, medium or large"),
            "steps": ProbeOptions().steps,
            "tasks_per_node": gpus_per_node or 1,
        },
        "checkpoint": {
            "path": _todo("directory on the shared filesystem that every node can write"),
            "every": Checkpoint(path="").every,
            "timeout_s": Checkpoint(path="").timeout_s,
        },
        "monitoring": {
            "prometheus": _todo("Prometheus URL (null: none)"),
            "alertmanager": _todo("Alertmanager URL (null: none)"),
            "heartbeat_dir": _todo("node-local directory for the probe's heartbeats (null: none)"),
            "healthcheck_signals": _todo("list of what the site's health check detects ([] for none)"),
        },
    }


def _safety(part: PartitionInfo, resv: ReservationInfo | None, max_nodes: int) -> dict[str, Any]:
    return {
        "allowed_users": _todo("list of users who may run experiments"),
        **({"allowed_accounts": list(resv.accounts)} if resv and resv.accounts else {}),
        "allowed_partitions": [part.name],
        **({"allowed_reservations": [resv.name]} if resv else {}),
        "max_nodes": max_nodes,
        "require_exclusive": True,
    }


def _notes(facts: ClusterFacts, part: PartitionInfo, resv: ReservationInfo | None) -> dict[str, str]:
    """Comments for the keys whose value needs a word of explanation."""
    notes = {
        "slurm.conf": "SLURM_CONF when `site init` ran; null: Slurm's default.",
        "slurm.time_limit": "Time limit of each baseline and fault job.",
        "slurm.hooks_dir": "Where slurm.conf's Prolog, Epilog and HealthCheckProgram run hooks from; "
        "`plugin install` puts slurm-chaos's hooks there.",
        "features": "Slurm node features (sbatch --constraint) and the nodes that have them.",
        "probe.python": "e.g. /opt/slurm-chaos/venv/bin/python; python3 where PyTorch is installed.",
        "probe.model_size": "The probe's model: large fills an 80 GB GPU, tiny runs on CPUs.",
        "probe.tasks_per_node": "One rank per GPU (1 on CPU nodes).",
        "monitoring.prometheus": "e.g. http://prometheus:9090 and http://alertmanager:9093.",
        "monitoring.healthcheck_signals": "What the node health check (HealthCheckProgram) detects, "
        f"any of {', '.join(healthcheck_signals())}.",
        "safety.max_nodes": f"The nodes of {'reservation ' + resv.name + ' in ' if resv else ''}"
        f"partition {part.name}.",
    }
    if resv:
        users = ", ".join(resv.users) or "no user list"
        notes["slurm.reservation"] = f"The maintenance reservation: {_hosts(resv.nodes)}, {users}."
        if resv.users:
            notes["safety.allowed_users"] = f"Reservation {resv.name} admits {', '.join(resv.users)}."
    else:
        found = ", ".join(facts.reservations) or "none"
        notes["slurm.reservation"] = (
            f"No reservation chosen (reservations: {found}); name the maintenance reservation here and "
            "in safety.allowed_reservations, or run `site init --reservation NAME`."
        )
    return notes


def build_site(facts: ClusterFacts, slurm_conf: str | None, reservation: str | None = None) -> Draft:
    """The site config that describes `facts`; unknowns are `TODO: ...` values."""
    resv = choose_reservation(facts, reservation)
    part = choose_partition(facts, resv)
    notes = _notes(facts, part, resv)
    in_partitions = {n for p in facts.partitions.values() for n in p.nodes}
    # The nodes experiments run on: the reservation's within the partition.
    members = [n for n in part.nodes if not resv or n in resv.nodes] or list(part.nodes)
    nodes = _nodes_section(facts, members, notes)
    features = _features(facts, in_partitions)
    data: dict[str, Any] = {
        "cluster": facts.config.name or _todo("cluster name"),
        "description": f"Written by `slurm-chaos site init` from Slurm {facts.version}.",
        "slurm": _slurm_section(facts, slurm_conf, part, resv),
        "partitions": {
            p.name: {"nodes": _hosts(p.nodes), **({"default": True} if p.default else {})}
            for p in facts.partitions.values()
            if p.nodes
        },
        "racks": _racks(facts, in_partitions, notes),
        **({"features": features} if features else {}),
        "nodes": nodes,
        **_unknowns(nodes["gpus_per_node"]),
        "safety": _safety(part, resv, len(members)),
    }
    return Draft(data, notes)


# ---------------------------------------------------------------- YAML with comments

HEADER = """\
Site config of cluster {cluster}, written by `slurm-chaos site init` from what Slurm reports.
Values "TODO: ..." are what Slurm cannot tell: fill them in. Until then every command that reads
this file stops, names each TODO left and exits 2 (`slurm-chaos site check FILE` lists them).
"""


def _flow(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 30).strip()
    return text.removesuffix("...").strip()


def _comment(note: str, pad: str) -> list[str]:
    return [f"{pad}# {line}" for line in textwrap.wrap(note, width=100 - len(pad) - 2)]


def _emit(data: Mapping[str, Any], key: tuple[str, ...], notes: Mapping[str, str], out: list[str]) -> None:
    pad = "  " * len(key)
    for name, value in data.items():
        dotted = (*key, str(name))
        if not key and isinstance(value, dict):
            out.append("")
        out.extend(_comment(notes.get(".".join(dotted), ""), pad))
        # A section's entries that hold only scalars go on one line: `rack1: {switch: sw1, nodes: ...}`.
        flat = (
            bool(key)
            and isinstance(value, dict)
            and not any(isinstance(v, dict | list) for v in value.values())
        )
        if isinstance(value, dict) and value and not flat:
            out.append(f"{pad}{_flow(name)}:")
            _emit(value, dotted, notes, out)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            out.append(f"{pad}{_flow(name)}:")
            out.extend(f"{pad}  - {_flow(v)}" for v in value)
        else:
            out.append(f"{pad}{_flow(name)}: {_flow(value)}")


def to_yaml(draft: Draft) -> str:
    """The draft as a commented YAML file; yaml.safe_load gives back draft.data."""
    header = HEADER.format(cluster=draft.data.get("cluster", "?"))
    out = [f"# {line}" for line in header.splitlines()] + [""]
    _emit(draft.data, (), draft.notes, out)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the command


def init_from_slurm(env: Mapping[str, str], runner: Runner, reservation: str | None = None) -> Draft:
    """Ask the cluster that `env` points at (SLURM_CONF) and build its site config.

    Always through the CLI backend: pyslurm's node records leave out the sockets GPUs are bound to.
    Where nvidia-smi is on this node, its GPUs' bus ids and NUMA nodes too.
    """
    facts = dataclasses.replace(gather(SlurmCLI(env, runner)), local_gpus=local_gpus(runner))
    return build_site(facts, env.get("SLURM_CONF") or None, reservation)


def refuse_overwrite(path: Path, force: bool) -> None:
    if path.exists() and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it")


def write_site(path: Path, text: str, force: bool) -> None:
    """Write the file; never replaces an existing one without `force`, even one created meanwhile."""
    try:
        with path.open("w" if force else "x") as f:
            f.write(text)
    except FileExistsError as exc:
        raise UsageError(f"{path} exists; pass --force to overwrite it") from exc
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from exc
