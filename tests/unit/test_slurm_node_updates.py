"""What placement, remediation and the controller faults ask of Slurm: node updates, --wrap jobs, weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_chaos.errors import SlurmError
from slurm_chaos.placement import NodeRank, NodeSetting, apply_settings, current_setting, proposals
from slurm_chaos.runner import Completed, FakeRunner
from slurm_chaos.slurm import parse
from slurm_chaos.slurm.cli_backend import SlurmCLI
from slurm_chaos.slurm.fake import FakeScheduler, idle_nodes

DATA = Path(__file__).resolve().parent.parent / "data"


def cli(stdout: str = "", rc: int = 0, stderr: str = "") -> tuple[SlurmCLI, FakeRunner]:
    runner = FakeRunner(lambda argv: Completed(argv, rc, stdout, stderr))
    return SlurmCLI({"SLURM_CONF": "/x/slurm.conf"}, runner), runner


def test_update_node_sets_weight_and_features_in_one_command() -> None:
    slurm, runner = cli()
    slurm.update_node("node2", weight=5, features=("cpu", "sw1"))
    slurm.update_node("node3", features=())
    slurm.update_node("node4")  # nothing to change: no command
    assert runner.calls == [
        (
            "scontrol",
            "update",
            "NodeName=node2",
            "Weight=5",
            "AvailableFeatures=cpu,sw1",
            "ActiveFeatures=cpu,sw1",
        ),
        ("scontrol", "update", "NodeName=node3", "AvailableFeatures=(null)", "ActiveFeatures=(null)"),
    ]


def test_mark_down_needs_a_reason_and_says_slurms_error() -> None:
    slurm, runner = cli()
    slurm.mark_down("node1", "slurm-chaos: node loss")
    assert runner.calls == [
        ("scontrol", "update", "NodeName=node1", "State=DOWN", "Reason=slurm-chaos: node loss")
    ]
    with pytest.raises(SlurmError, match="requires a reason"):
        slurm.mark_down("node1", " ")
    bad = (DATA / "slurm-22.05" / "scontrol_update_bad_node.stderr").read_text().splitlines()[0]
    failing, _ = cli(rc=1, stderr=bad)
    with pytest.raises(SlurmError, match="Invalid node name"):
        failing.mark_down("nodeX", "why")


def test_submit_wrap_is_sbatch_wrap() -> None:
    slurm, runner = cli(stdout="4242\n")
    assert slurm.submit_wrap("srun hostname", ["--nodes=2", "--constraint=fast"]) == "4242"
    assert runner.calls == [
        ("sbatch", "--parsable", "--nodes=2", "--constraint=fast", "--wrap", "srun hostname")
    ]


def test_node_weight_is_read_from_every_form() -> None:
    text = parse.parse_scontrol_nodes((DATA / "slurm-22.05" / "scontrol_show_node_oneliner.txt").read_text())
    assert {n.weight for n in text.values()} == {1}
    json24 = parse.parse_nodes_json((DATA / "slurm-24.11" / "scontrol_show_nodes.json").read_text())
    assert {n.weight for n in json24.values()} == {1}


def test_placement_goes_through_the_scheduler() -> None:
    fake = FakeScheduler(node_table=idle_nodes(2))
    fake.update_node("node0", features=("cpu", "fast"))
    ranking = [NodeRank("node1", 0.5, 1, True, 2), NodeRank("node0", 1.0, 1, False, 1)]
    current = fake.nodes(["node0", "node1"])
    settings = proposals(ranking, current)
    assert settings == [NodeSetting("node1", 2, ()), NodeSetting("node0", 1, ("cpu", "fast"))]
    apply_settings(fake, settings)
    assert fake.node_table["node1"].weight == 2
    assert current_setting(current["node1"]) == NodeSetting("node1", 1, ())
    with pytest.raises(SlurmError, match="no node 'node9'"):
        proposals([NodeRank("node9", 1.0, 1, False, 1)], current)
