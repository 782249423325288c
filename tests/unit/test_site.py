"""Site configs: the shipped ones load; every kind of bad input names the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slurm_chaos.errors import ConfigError
from slurm_chaos.sandbox.layout import Layout, site_placeholders
from slurm_chaos.site import load_site, resolve_placeholders

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "sites" / "golden.yaml"
SANDBOX_SITE = REPO / "site_configs" / "sandbox.yaml"


def _write(tmp_path: Path, data: dict[str, object]) -> Path:
    p = tmp_path / "site.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _golden() -> dict[str, object]:
    data = yaml.safe_load(GOLDEN.read_text())
    assert isinstance(data, dict)
    return data


def test_h100_example_describes_two_numa_nodes_of_four_gpus() -> None:
    site = load_site(REPO / "site_configs" / "h100-ib-example.yaml")
    assert site.nodes.gpus_per_node == 8
    assert [g.numa_node for g in site.nodes.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(site.partition_nodes) == 64
    assert site.switch_of("gpu017") == "leaf02"
    assert site.nccl_env["NCCL_SOCKET_IFNAME"] == "ib0"


def test_golden_site_expands_node_lists() -> None:
    site = load_site(GOLDEN)
    assert site.partitions["batch"] == tuple(f"n0{i}" for i in range(1, 9))
    assert site.racks[1].nodes == ("n05", "n06", "n07", "n08")


def test_sandbox_site_needs_its_sandbox_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX_ROOT", str(tmp_path))
    monkeypatch.delenv("SLURM_CHAOS_SANDBOX", raising=False)
    with pytest.raises(ConfigError) as exc:
        load_site(SANDBOX_SITE, site_placeholders)
    assert exc.value.key == "sandbox"
    assert "sandbox 'chaos' is not up" in str(exc.value)
    with pytest.raises(ConfigError, match="sandbox: loaded without the values of sandbox 'chaos'"):
        load_site(SANDBOX_SITE)  # a caller that does not say where the values come from


def _bad_sandbox_site(tmp_path: Path) -> Path:
    """The shipped sandbox site, placeholders and all, with one misspelt key."""
    text = SANDBOX_SITE.read_text().replace("  partition: debug\n", "  partition: debug\n  partiton: debug\n")
    path = tmp_path / "bad-sandbox.yaml"
    path.write_text(text)
    return path


def test_unknown_key_is_named_while_no_sandbox_is_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's own error first: a misspelt key is not hidden behind 'sandbox not up'."""
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX", "nosuch")
    path = _bad_sandbox_site(tmp_path)
    with pytest.raises(ConfigError) as exc:
        load_site(path, site_placeholders)
    assert (exc.value.key, exc.value.exit_code) == ("slurm.partiton", 2)
    assert "unknown key" in exc.value.problem


def test_a_bad_file_is_reported_before_the_placeholders_are_asked_for(tmp_path: Path) -> None:
    asked: list[str] = []

    def values(name: str) -> dict[str, str]:
        asked.append(name)
        return {}

    with pytest.raises(ConfigError, match=r"slurm\.partiton: unknown key"):
        load_site(_bad_sandbox_site(tmp_path), values)
    assert asked == []


VALUES = {
    "sandbox_root": "/sb",
    "sandbox_shared": "/sb/shared",
    "sandbox_slurm_conf": "/sb/etc/slurm.conf",
    "sandbox_etc": "/sb/etc",
    "prometheus_port": "17003",
    "alertmanager_port": "17004",
    "reservation": "chaos_maint",
}


def test_placeholders_are_filled_in_from_the_values_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX", "other")
    asked: list[str] = []

    def values(name: str) -> dict[str, str]:
        asked.append(name)
        return VALUES

    site = load_site(SANDBOX_SITE, values)
    assert asked == ["other"] and site.sandbox == "other"  # $SLURM_CHAOS_SANDBOX names the sandbox
    assert (site.slurm.conf, site.slurm.plugstack_conf, site.slurm.hooks_dir) == (
        "/sb/etc/slurm.conf",
        "/sb/etc/plugstack.conf",
        "/sb/etc",
    )
    assert site.checkpoint.path == "/sb/shared/checkpoints"
    assert site.safety.allowed_checkpoint_roots == ("/sb/shared/checkpoints",)
    assert site.monitoring.prometheus == "http://127.0.0.1:17003"
    assert site.monitoring.heartbeat_dir == "/sb/heartbeat"


def test_checkpoint_roots_may_be_placeholders(tmp_path: Path) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(SANDBOX_SITE.read_text() + "  allowed_checkpoint_roots:\n    - ${sandbox_shared}/ckpt\n")
    assert load_site(path, lambda name: VALUES).safety.allowed_checkpoint_roots == ("/sb/shared/ckpt",)


def test_resolve_placeholders_is_pure_and_leaves_other_dollars_alone(tmp_path: Path) -> None:
    data = {"a": "${sandbox_root}/x", "b": ["$HOME", "${reservation}"], "c": 3, "d": {"e": "${sandbox_etc}"}}
    assert resolve_placeholders(tmp_path, data, VALUES) == {
        "a": "/sb/x",
        "b": ["$HOME", "chaos_maint"],
        "c": 3,
        "d": {"e": "/sb/etc"},
    }
    assert data["a"] == "${sandbox_root}/x"  # not changed in place


def test_an_unresolved_placeholder_names_its_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        resolve_placeholders(tmp_path / "s.yaml", {"slurm": {"conf": "${sandbox_slurmconf}"}}, VALUES)
    assert exc.value.key == "slurm.conf"
    assert "unknown placeholder ${sandbox_slurmconf} (known: alertmanager_port," in exc.value.problem


def test_placeholders_in_a_site_without_a_sandbox_are_unknown(tmp_path: Path) -> None:
    data = _golden()
    data["checkpoint"]["path"] = "${sandbox_shared}/ckpt"
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as exc:
        load_site(path, lambda name: VALUES)
    assert exc.value.key == "checkpoint.path" and "unknown placeholder ${sandbox_shared}" in exc.value.problem


def test_a_sandbox_that_is_up_gives_the_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX_ROOT", str(tmp_path))
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX", "sbx")
    layout = Layout(name="sbx", index=3, nodes=4, controller_host="localhost")
    layout.save()
    site = load_site(SANDBOX_SITE, site_placeholders)
    assert site.slurm.conf == str(tmp_path / "sbx" / "etc" / "slurm.conf")
    assert site.monitoring.alertmanager == f"http://127.0.0.1:{layout.alertmanager_port}"
    assert site_placeholders("other") is None


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("cluster: x\nslurm: [unclosed\n")
    with pytest.raises(ConfigError) as exc:
        load_site(p)
    assert str(p) in str(exc.value)
    assert "malformed YAML" in str(exc.value)
    assert "line" in str(exc.value)
    assert exc.value.exit_code == 2


@pytest.mark.parametrize(
    ("mutate", "key", "words"),
    [
        (lambda d: d["slurm"].update(partiton="x"), "slurm.partiton", "unknown key"),
        (lambda d: d.update(colour="blue"), "colour", "unknown key"),
        (lambda d: d["nodes"].update(cpus="sixteen"), "nodes.cpus", "expected integer"),
        (lambda d: d["safety"].update(max_nodes=0), "safety.max_nodes", "minimum"),
        (lambda d: d["slurm"].update(partition="gpu"), "slurm.partition", "unknown partition 'gpu'"),
        (
            lambda d: d["safety"].update(allowed_partitions=["nope"]),
            "safety.allowed_partitions.0",
            "unknown partition",
        ),
        (lambda d: d.pop("checkpoint"), "checkpoint", "required key is missing"),
        (
            lambda d: d["probe"].update(model_size="huge"),
            "probe.model_size",
            "expected one of tiny, mini, small, medium, large, got 'huge'",
        ),
        (lambda d: d["nodes"]["gpus"][1].update(numa_node=5), "nodes.gpus.1.numa_node", "numa_nodes is 2"),
        (lambda d: d["racks"]["r1"].update(nodes="x[1-"), "racks.r1.nodes", "bad node list"),
        (lambda d: d["slurm"].update(reservation="other"), "slurm.reservation", "allowed_reservations"),
        (
            lambda d: d["safety"].update(allowed_checkpoint_roots=["/scratch/ckpt", "/home/../etc"]),
            "safety.allowed_checkpoint_roots.1",
            "'..' component",
        ),
        (
            lambda d: d["safety"].update(allowed_checkpoint_roots=["scratch"]),
            "safety.allowed_checkpoint_roots.0",
            "does not match",
        ),
        (
            lambda d: d["safety"].update(allowed_checkpoint_roots=[]),
            "safety.allowed_checkpoint_roots",
            "non-empty",
        ),
        (lambda d: d["checkpoint"].update(path="/scratch//ckpt/"), "checkpoint.path", "empty component"),
        (lambda d: d["slurm"].update(time_limit="1-2-3"), "slurm.time_limit", "does not match"),
        (lambda d: d["slurm"].update(time_limit="30m"), "slurm.time_limit", "does not match"),
        (lambda d: d.update(features={"fast": "n[07-09]"}), "features.fast", "['n09'] are in no partition"),
    ],
)
def test_bad_site_names_file_and_key(tmp_path: Path, mutate, key: str, words: str) -> None:  # type: ignore[no-untyped-def]
    data = _golden()
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as exc:
        load_site(path)
    assert exc.value.key == key
    assert words in exc.value.problem
    assert str(exc.value).startswith(f"{path}: {key}: ")


def test_allowed_checkpoint_roots_default_to_the_checkpoint_path(tmp_path: Path) -> None:
    data = _golden()
    site = load_site(_write(tmp_path, data))
    assert site.safety.allowed_checkpoint_roots == (site.checkpoint.path,)
    data["safety"]["allowed_checkpoint_roots"] = ["/scratch/a", "/scratch/b"]  # type: ignore[index]
    assert load_site(_write(tmp_path, data)).safety.allowed_checkpoint_roots == ("/scratch/a", "/scratch/b")


def test_features_list_their_nodes(tmp_path: Path) -> None:
    data = _golden()
    data["features"] = {"a100": "n[01-04]", "fast": "n[01-08]"}
    site = load_site(_write(tmp_path, data))
    assert site.features["a100"] == ("n01", "n02", "n03", "n04") and len(site.features["fast"]) == 8
    assert load_site(GOLDEN).features == {}


def test_every_todo_left_is_named_with_its_key(tmp_path: Path) -> None:
    """`site init` writes what Slurm cannot tell as "TODO: ..."; loading names each one, exit 2."""
    data = _golden()
    data["checkpoint"]["path"] = "TODO: a directory on the shared filesystem"
    data["safety"]["allowed_users"] = "TODO: who may run experiments"
    data["nodes"]["gpus"][1] = "TODO: GPU 1 and its NUMA node"
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as exc:
        load_site(path)
    assert exc.value.exit_code == 2
    assert exc.value.key == "checkpoint.path"  # the first in the file
    assert str(exc.value).splitlines() == [
        f"{path}: checkpoint.path: still TODO: a directory on the shared filesystem; 2 more TODO entries:",
        f"  {path}: nodes.gpus.1: TODO: GPU 1 and its NUMA node",
        f"  {path}: safety.allowed_users: TODO: who may run experiments",
    ]


def test_todo_inside_a_value_is_not_a_todo(tmp_path: Path) -> None:
    data = _golden()
    data["description"] = "Nothing left TODO: done"
    assert load_site(_write(tmp_path, data)).description == "Nothing left TODO: done"
