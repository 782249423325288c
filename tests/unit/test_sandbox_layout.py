"""The sandbox's shape: leaf switches and racks for any node count, and layouts saved before them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_chaos.sandbox.layout import MAX_NODES, Layout


def test_default_is_two_nodes_per_leaf() -> None:
    layout = Layout("t", 1, 4, "host")
    assert layout.switches() == {"sw1": ["node1", "node2"], "sw2": ["node3", "node4"]}
    assert layout.rack_of("node3") == "rack2"


def test_leaf_switches_split_the_nodes_evenly_in_order() -> None:
    layout = Layout("t", 1, MAX_NODES, "host", leaf_switches=4)
    leaves = layout.switches()
    assert list(leaves) == ["sw1", "sw2", "sw3", "sw4"]
    assert [len(m) for m in leaves.values()] == [16, 16, 16, 16]
    assert leaves["sw2"][0] == "node17" and leaves["sw4"][-1] == "node64"
    assert layout.rack_of("node33") == "rack3"
    # Every node on exactly one leaf, uneven counts included.
    uneven = Layout("t", 1, 10, "host", leaf_switches=4).switches()
    assert [len(m) for m in uneven.values()] == [3, 3, 2, 2]
    assert sorted(n for m in uneven.values() for n in m) == sorted(f"node{i}" for i in range(1, 11))


@pytest.mark.parametrize("i", [1, MAX_NODES])
def test_names_stay_within_linux_limits_at_the_largest_size(i: int) -> None:
    layout = Layout("abcdefgh", 249, MAX_NODES, "host")
    assert len(layout.veth(i)) <= 15 and len(layout.bridge) <= 15
    assert int(layout.node_addr(i).rsplit(".", 1)[1]) < 255


def test_a_layout_saved_before_leaf_switches_loads_as_two_per_leaf(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX_ROOT", str(tmp_path))
    (tmp_path / "old").mkdir()
    saved = {"name": "old", "index": 3, "nodes": 4, "controller_host": "h", "cgroups": True}
    (tmp_path / "old" / "sandbox.json").write_text(json.dumps(saved))
    layout = Layout.load("old")
    assert layout is not None and layout.leaf_switches == 0 and len(layout.switches()) == 2
    layout.save()
    assert json.loads((tmp_path / "old" / "sandbox.json").read_text())["leaf_switches"] == 0
