"""`site init`: a site config built from recorded Slurm output, TODOs for what Slurm cannot tell."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from gpu_captures import MACHINES, driver_layout, load, multiply, needs_captures, project
from onboarding import fill_todos

from slurm_chaos import onboard
from slurm_chaos.cli import main
from slurm_chaos.errors import ConfigError, SlurmError, UsageError
from slurm_chaos.gpu import numbering
from slurm_chaos.onboard import ClusterFacts, build_site, to_yaml
from slurm_chaos.runner import Completed, FakeRunner
from slurm_chaos.site import load_site
from slurm_chaos.slurm import parse
from slurm_chaos.slurm.model import Gres, NodeInfo, PartitionInfo, SwitchInfo

V22 = Path(__file__).resolve().parents[1] / "data" / "slurm-22.05"
FILLED = {
    "slurm.hooks_dir": None,
    "nodes.interface": "ib0",
    "probe.python": "/opt/venv/bin/python",
    "probe.model_size": "small",
    "checkpoint.path": "/scratch/ckpt",
    "monitoring.prometheus": "http://prometheus:9090",
    "monitoring.alertmanager": None,
    "monitoring.heartbeat_dir": None,
    "monitoring.healthcheck_signals": ["gpu_xid", "straggler"],
    "safety.allowed_users": ["sre-bot"],
    "nodes.gpus": [{"index": 0, "numa_node": 0}, {"index": 1, "numa_node": 1}],
}


def recorded(nodes: str = "sinfo.json") -> ClusterFacts:
    """The reference 22.05 cluster: debug = node[1-4], sw1/sw2 leaves, reservation `maint` on node[3-4]."""
    return ClusterFacts(
        version="22.05.8",
        config=parse.parse_scontrol_config((V22 / "scontrol_show_config.txt").read_text()),
        partitions=parse.parse_scontrol_partitions(
            (V22 / "scontrol_show_partition_oneliner.txt").read_text()
        ),
        nodes=parse.parse_nodes_json((V22 / nodes).read_text()),
        switches=parse.parse_scontrol_topology((V22 / "scontrol_show_topology.txt").read_text()),
        reservations=parse.parse_scontrol_reservations(
            (V22 / "scontrol_show_reservation_oneliner.txt").read_text()
        ),
    )


def with_gres(facts: ClusterFacts, *gres: Gres) -> ClusterFacts:
    nodes = {n: dataclasses.replace(info, gres=gres) for n, info in facts.nodes.items()}
    return dataclasses.replace(facts, nodes=nodes)


def test_what_slurm_knows() -> None:
    data = build_site(recorded(), "/etc/slurm/slurm.conf").data
    assert data["cluster"] == "chaos3"
    assert data["slurm"]["conf"] == "/etc/slurm/slurm.conf"
    assert (data["slurm"]["partition"], data["slurm"]["reservation"]) == ("debug", "maint")
    assert data["slurm"]["plugstack_conf"] == "/var/lib/slurm-chaos/sandboxes/hinit/etc/plugstack.conf"
    assert data["partitions"] == {"debug": {"nodes": "node[1-4]", "default": True}}
    assert data["racks"] == {
        "rack1": {"switch": "sw1", "nodes": "node[1-2]"},
        "rack2": {"switch": "sw2", "nodes": "node[3-4]"},
    }
    assert data["features"] == {"gpu": "node[1-4]", "rack1": "node[1-2]", "rack2": "node[3-4]"}
    assert data["nodes"]["cpus"] == 2 and data["nodes"]["numa_nodes"] == 2
    assert data["nodes"]["gpus_per_node"] == 0 and "gpus" not in data["nodes"]
    safety = data["safety"]
    assert safety["allowed_partitions"] == ["debug"] and safety["allowed_reservations"] == ["maint"]
    assert safety["max_nodes"] == 2  # the reservation's nodes


def test_what_slurm_cannot_tell_is_todo() -> None:
    draft = build_site(recorded(), None)
    assert [key for key, _ in draft.todos] == [
        "slurm.hooks_dir",
        "nodes.interface",
        "probe.python",
        "probe.model_size",
        "checkpoint.path",
        "monitoring.prometheus",
        "monitoring.alertmanager",
        "monitoring.heartbeat_dir",
        "monitoring.healthcheck_signals",
        "safety.allowed_users",
    ]
    assert draft.data["slurm"]["conf"] is None


def test_yaml_has_comments_and_loads_back() -> None:
    draft = build_site(recorded(), None)
    text = to_yaml(draft)
    assert yaml.safe_load(text) == draft.data
    assert text.startswith("# Site config of cluster chaos3, written by `slurm-chaos site init`")
    assert (
        "# One rack per leaf switch of topology.conf.\nracks:\n  rack1: {switch: sw1, nodes: 'node[1-2]'}"
        in text
    )
    assert all(len(line) <= 100 for line in text.splitlines() if line.lstrip().startswith("#"))


def test_unfilled_file_names_its_todos_and_filled_one_loads(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(to_yaml(build_site(recorded(), None)))
    with pytest.raises(ConfigError) as exc:
        load_site(site)
    assert (exc.value.key, exc.value.exit_code) == ("slurm.hooks_dir", 2)
    assert "safety.allowed_users: TODO: list of users who may run experiments" in str(exc.value)
    loaded = load_site(fill_todos(site, FILLED, tmp_path / "filled.yaml"))
    assert loaded.switch_of("node3") == "sw2" and loaded.slurm.reservation == "maint"
    assert loaded.features["gpu"] == ("node1", "node2", "node3", "node4")


def test_gpus_bound_to_one_socket_each_are_listed() -> None:
    """node[1-3] of the GRES recording: two GPUs on socket 0; node4 has no binding (a note says so)."""
    draft = build_site(recorded("sinfo_gres.json"), None)
    nodes = draft.data["nodes"]
    assert nodes["gpus_per_node"] == 2
    assert nodes["gpus"] == [{"index": 0, "numa_node": 0}, {"index": 1, "numa_node": 0}]
    assert draft.data["probe"]["tasks_per_node"] == 2
    assert draft.notes["nodes"] == (
        "Describes node3; Slurm reports other hardware on node4: 2 CPUs, 2 sockets, 2 GPUs."
    )


def test_per_socket_entries_give_each_gpu_its_numa_node() -> None:
    facts = with_gres(recorded(), Gres("gpu", "h100", 4, (0,)), Gres("gpu", "h100", 4, (1,)))
    gpus = build_site(facts, None).data["nodes"]["gpus"]
    assert [g["numa_node"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g["index"] for g in gpus] == list(range(8))


@pytest.mark.parametrize(
    ("gres", "slurm_says"),
    [
        ((Gres("gpu", "h100", 8, (0, 1)),), "gpu:h100:8(S:0,1)"),  # Slurm adds up a type's sockets
        ((Gres("gpu", "", 2, ()),), "gpu:2"),  # no Cores= in gres.conf
    ],
)
def test_gpus_whose_socket_slurm_does_not_tell_are_todo(gres: tuple[Gres, ...], slurm_says: str) -> None:
    draft = build_site(with_gres(recorded(), *gres), None)
    assert draft.data["nodes"]["gpus"].startswith("TODO: each GPU's NUMA node")
    assert draft.data["nodes"]["gpus"].endswith(f"Slurm only says {slurm_says}")


def test_no_topology_means_no_racks_and_a_note() -> None:
    draft = build_site(dataclasses.replace(recorded(), switches=[]), None)
    assert draft.data["racks"] == {}
    assert "TopologyPlugin=topology/tree" in draft.notes["racks"]


def test_rack_names_follow_the_leaf_switches() -> None:
    facts = recorded()
    leaves = [
        SwitchInfo("leaf01", 0, ("node1", "node2")),
        SwitchInfo("leaf02", 0, ("node3", "node4")),
        SwitchInfo("core", 1, (), ("leaf01", "leaf02")),
    ]
    racks = build_site(dataclasses.replace(facts, switches=leaves), None).data["racks"]
    assert racks == {
        "rack01": {"switch": "leaf01", "nodes": "node[1-2]"},
        "rack02": {"switch": "leaf02", "nodes": "node[3-4]"},
    }
    unnumbered = [SwitchInfo("east", 0, ("node1", "node2")), SwitchInfo("west", 0, ("node3", "node4"))]
    racks = build_site(dataclasses.replace(facts, switches=unnumbered), None).data["racks"]
    assert list(racks) == ["rack1", "rack2"] and racks["rack2"]["switch"] == "west"


def test_reservation_choice() -> None:
    facts = recorded()
    maint = facts.reservations["maint"]
    other = dataclasses.replace(maint, name="other")
    two = dataclasses.replace(facts, reservations={"maint": maint, "other": other})
    draft = build_site(two, None)
    assert draft.data["slurm"]["reservation"] is None and "allowed_reservations" not in draft.data["safety"]
    assert "reservations: maint, other" in draft.notes["slurm.reservation"]
    assert draft.data["safety"]["max_nodes"] == 4
    assert build_site(two, None, reservation="other").data["slurm"]["reservation"] == "other"
    with pytest.raises(UsageError, match=r"--reservation nosuch: .*\(reservations: maint, other\)"):
        build_site(two, None, reservation="nosuch")


def test_partition_that_holds_the_reservation() -> None:
    facts = recorded()
    parts = {
        "batch": PartitionInfo("batch", ("node1", "node2"), default=True),
        "maint": PartitionInfo("maint", ("node3", "node4")),
        "empty": PartitionInfo("empty", ()),
    }
    data = build_site(dataclasses.replace(facts, partitions=parts), None).data
    assert data["slurm"]["partition"] == "maint"
    assert data["partitions"] == {
        "batch": {"nodes": "node[1-2]", "default": True},
        "maint": {"nodes": "node[3-4]"},
    }
    no_resv = build_site(dataclasses.replace(facts, partitions=parts, reservations={}), None).data
    assert no_resv["slurm"]["partition"] == "batch"
    with pytest.raises(SlurmError, match="no partition with nodes"):
        build_site(dataclasses.replace(facts, partitions={"empty": parts["empty"]}), None)


def test_nodes_without_a_cpu_count_are_an_error() -> None:
    facts = recorded()
    bare = {n: NodeInfo(n, frozenset({"IDLE"})) for n in facts.nodes}
    with pytest.raises(SlurmError, match=r"no CPU count for the nodes node\[3-4\]"):
        build_site(dataclasses.replace(facts, nodes=bare), None)


def test_cli_refuses_to_overwrite_before_asking_slurm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    out = tmp_path / "site.yaml"
    out.write_text("mine\n")
    assert main(["site", "init", "--out", str(out)]) == 2
    assert out.read_text() == "mine\n"
    assert "exists; pass --force" in capsys.readouterr().err


def test_site_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(to_yaml(build_site(recorded(), None)))
    assert main(["site", "check", str(site)]) == 2
    assert "slurm.hooks_dir: still TODO" in capsys.readouterr().err
    filled = fill_todos(site, FILLED, tmp_path / "filled.yaml")
    assert main(["site", "check", str(filled)]) == 0
    assert "partition debug (4 nodes), reservation maint, 2 racks: complete" in capsys.readouterr().out


# ---------------------------------------------------------------- GPUs from nvidia-smi on this node


def smi_runner(machine: str) -> FakeRunner:
    """nvidia-smi on a captured machine: the query `site init` makes, cut from the capture's own
    query of every field, and its `topo -m` as captured."""
    capture = load(machine)

    def respond(argv: tuple[str, ...]) -> Completed:
        if argv[:2] == ("nvidia-smi", "--query-gpu=index,pci.bus_id"):
            return Completed(
                argv,
                0,
                project(capture.output("load", "nvidia-smi --query-gpu="), argv[1][12:].split(",")),
                "",
            )
        if argv[:3] == ("nvidia-smi", "topo", "-m"):
            return Completed(argv, 0, capture.output("capabilities", "nvidia-smi topo -m"), "")
        return Completed(argv, 1, "", f"unexpected {argv}")

    return FakeRunner(respond)


BUS = {"h100": "0000:00:09.0", "h100-mig": "0000:00:09.0", "h200": "0000:83:00.0", "l40s": "0000:01:00.0"}


@needs_captures
@pytest.mark.parametrize("machine", MACHINES)
def test_site_init_on_a_recorded_gpu_node_gives_numa_nodes_and_bus_ids(
    machine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`site init` run on node3 of the recording, a captured GPU machine: nvidia-smi's --query-gpu
    gives the bus id, `topo -m` the NUMA node, the driver's minor Slurm's number."""
    monkeypatch.setattr(onboard.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(onboard.socket, "gethostname", lambda: "node3.cluster")
    runner = smi_runner(machine)
    driver = driver_layout(tmp_path / "gpus", {BUS[machine]: 0})
    local = onboard.local_gpus(runner, driver)
    assert local == onboard.LocalGpus("node3", (onboard.NodeGpu(0, BUS[machine], 0),), True)
    facts = dataclasses.replace(with_gres(recorded(), Gres("gpu", "", 1, ())), local_gpus=local)
    draft = build_site(facts, None)
    assert draft.data["nodes"]["gpus"] == [{"index": 0, "numa_node": 0, "pci_bus_id": BUS[machine]}]
    assert draft.notes["nodes.gpus"].startswith("From nvidia-smi on node3 (among the nodes described)")
    site = tmp_path / "site.yaml"
    site.write_text(to_yaml(draft))
    filled = {k: v for k, v in FILLED.items() if k != "nodes.gpus"}
    loaded = load_site(fill_todos(site, filled, tmp_path / "filled.yaml"))
    assert [(g.index, g.numa_node, g.pci_bus_id) for g in loaded.nodes.gpus] == [(0, 0, BUS[machine])]


@needs_captures
def test_site_init_numbers_gpus_by_slurms_number_and_keeps_slurm_where_nvidia_smi_disagrees(
    tmp_path: Path,
) -> None:
    capture = load("h100")
    query = multiply(
        capture.output("load", "nvidia-smi --query-gpu="), ["00000000:3B:00.0", "00000000:18:00.0"]
    )
    driver = numbering.read_driver(driver_layout(tmp_path / "gpus", {"0000:3b:00.0": 0, "0000:18:00.0": 1}))
    local = onboard.describe_gpus(query, "", driver, "login1")
    # NVML's index 0 is bus 18 (PCI order), Slurm's 0 is minor 0 at 3b: listed by Slurm's number.
    assert [(g.index, g.pci_bus_id) for g in local.gpus] == [(0, "0000:3b:00.0"), (1, "0000:18:00.0")]
    assert local.slurm_numbers and all(g.numa_node is None for g in local.gpus)  # no topo -m
    without = onboard.describe_gpus(query, "", None, "login1")
    assert not without.slurm_numbers and [g.index for g in without.gpus] == [0, 1]
    # Two GPUs here, but no NUMA node from topo -m: Slurm's gres binding is kept, with a note.
    facts = with_gres(recorded(), Gres("gpu", "h100", 2, (0,)))
    draft = build_site(dataclasses.replace(facts, local_gpus=local), None)
    assert draft.data["nodes"]["gpus"] == [{"index": 0, "numa_node": 0}, {"index": 1, "numa_node": 0}]
    assert draft.notes["nodes.gpus"].startswith("nvidia-smi on login1 shows 2 GPUs (NUMA nodes [None, None])")


def test_site_init_without_nvidia_smi_asks_slurm_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onboard.shutil, "which", lambda name: None)
    runner = FakeRunner(lambda argv: Completed(argv, 1, "", "not expected"))
    assert onboard.local_gpus(runner) is None and runner.calls == []
