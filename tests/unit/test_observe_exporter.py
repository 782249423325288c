"""The exporter's metrics from heartbeat and state files: values, staleness, and gating by enabled signals."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from slurm_chaos.observe import healthcheck as hc
from slurm_chaos.observe.checks import SIGNALS
from slurm_chaos.observe.exporter import (
    ChaosCollector,
    JoinLabels,
    Sources,
    main,
    serve_textfile,
    write_textfile,
)
from slurm_chaos.probe.heartbeat import Heartbeat

NOW = 5000.0


def write_beats(
    directory: Path, ranks: list[tuple[str, float]], job: str = "12", at: float = NOW - 1
) -> None:
    for rank, (host, compute) in enumerate(ranks):
        hb = Heartbeat(directory, job, rank, host, world_size=len(ranks), clock=lambda: at)
        for step in range(5):
            hb.update(step, compute + 0.02, compute, 0.02, checkpoint_failures=rank, numa_mismatch=rank == 2)
            hb._last_write = float("-inf")


def registry(
    tmp_path: Path, signals: frozenset[str] | None = None, join: JoinLabels | None = None
) -> CollectorRegistry:
    config = None
    if signals is not None:
        config = tmp_path / "hc.toml"
        config.write_text(hc.render_config(hc.Options(signals=signals)))
    reg = CollectorRegistry()
    sources = Sources(tmp_path / "hb", tmp_path / "health", config)
    reg.register(ChaosCollector(sources, clock=lambda: NOW, join=join or JoinLabels()))
    return reg


Snapshot = dict[tuple[str, frozenset[tuple[str, str]]], float]


def snapshot(reg: CollectorRegistry) -> Snapshot:
    """Every sample of one read (``get_sample_value`` reads afresh each time, and counters count reads)."""
    return {(s.name, frozenset(s.labels.items())): s.value for m in reg.collect() for s in m.samples}


def sample(snap: Snapshot, name: str, labels: dict[str, str]) -> float | None:
    return snap.get((name, frozenset(labels.items())))


def labels(rank: int, host: str, job: str = "12", world: int = 3) -> dict[str, str]:
    return {
        "job_id": job,
        "rank": str(rank),
        "host": host,
        "Hostname": host,
        "world_size": str(world),
        "mode": "train",
    }


def test_rank_metrics_and_straggler_ratio(tmp_path: Path) -> None:
    write_beats(tmp_path / "hb", [("node1", 0.05), ("node2", 0.10), ("node3", 0.05)])
    reg = registry(tmp_path)
    value = reg.get_sample_value
    assert value("slurm_chaos_probe_step_seconds", labels(1, "node2")) == pytest.approx(0.12)
    assert value("slurm_chaos_probe_compute_seconds", labels(1, "node2")) == pytest.approx(0.10)
    assert value("slurm_chaos_probe_comm_seconds", labels(0, "node1")) == pytest.approx(0.02)
    assert value("slurm_chaos_probe_last_step", labels(0, "node1")) == 4
    assert value("slurm_chaos_probe_straggler_ratio", labels(1, "node2")) == pytest.approx(2.0)
    assert value("slurm_chaos_probe_straggler_ratio", labels(0, "node1")) == pytest.approx(0.05 / 0.075)
    assert value("slurm_chaos_probe_checkpoint_failures_total", labels(2, "node3")) == 2
    assert value("slurm_chaos_probe_numa_mismatch", labels(2, "node3")) == 1
    assert value("slurm_chaos_probe_numa_mismatch", labels(0, "node1")) == 0
    assert value("slurm_chaos_probe_heartbeat_age_seconds", labels(0, "node1")) == pytest.approx(1.0)
    assert all(value("slurm_chaos_signal_enabled", {"signal": s}) == 1 for s in SIGNALS)


def test_stale_heartbeats_are_not_exported(tmp_path: Path) -> None:
    write_beats(tmp_path / "hb", [("node1", 0.05), ("node2", 0.10)], job="old", at=NOW - 600)
    reg = registry(tmp_path)
    assert reg.get_sample_value("slurm_chaos_probe_step_seconds", labels(0, "node1", "old", 2)) is None


def test_disabled_signals_export_nothing(tmp_path: Path) -> None:
    write_beats(tmp_path / "hb", [("node1", 0.05), ("node2", 0.10), ("node3", 0.05)])
    reg = registry(tmp_path, frozenset({"numa"}))
    assert reg.get_sample_value("slurm_chaos_probe_straggler_ratio", labels(1, "node2")) is None
    assert reg.get_sample_value("slurm_chaos_probe_step_seconds", labels(1, "node2")) is None
    assert reg.get_sample_value("slurm_chaos_probe_checkpoint_failures_total", labels(2, "node3")) is None
    assert reg.get_sample_value("slurm_chaos_probe_numa_mismatch", labels(2, "node3")) == 1
    assert reg.get_sample_value("slurm_chaos_signal_enabled", {"signal": "straggler"}) == 0


def test_health_check_results_per_node_and_check(tmp_path: Path) -> None:
    states = tmp_path / "health"
    states.mkdir()
    results = [
        {"check": "numa", "status": 2, "message": "squeezed"},
        {"check": "checkpoint", "status": 1, "message": "missing"},
        {"check": "straggler", "status": 0, "message": "ok"},
    ]
    (states / "node2.json").write_text(json.dumps({"node": "node2", "time": NOW - 3, "results": results}))
    (states / "node4.json").write_text(json.dumps({"node": "node4", "time": NOW - 3600, "results": results}))
    reg = registry(tmp_path, frozenset({"numa", "checkpoint"}))
    value = reg.get_sample_value
    node2 = {"node": "node2", "Hostname": "node2"}
    assert value("slurm_chaos_health_check_ok", node2 | {"check": "numa"}) == 0
    assert value("slurm_chaos_health_check_status", node2 | {"check": "numa"}) == 2
    assert value("slurm_chaos_health_check_ok", node2 | {"check": "checkpoint"}) == 1
    assert value("slurm_chaos_health_check_ok", node2 | {"check": "straggler"}) is None  # not enabled
    assert value("slurm_chaos_health_check_age_seconds", node2) == pytest.approx(3)
    node4 = {"node": "node4", "Hostname": "node4"}
    assert value("slurm_chaos_health_check_ok", node4 | {"check": "numa"}) is None  # stale


def test_one_bad_file_never_fails_the_scrape(tmp_path: Path) -> None:
    write_beats(tmp_path / "hb", [("node1", 0.05), ("node2", 0.10)])
    bad = {"job_id": "12", "rank": 7, "host": "node2", "time": NOW, "step": 1e999, "window": 5}
    (tmp_path / "hb" / "node2" / "12" / "12.7.json").write_text(json.dumps(bad))
    states = tmp_path / "health"
    states.mkdir()
    (states / "node1.json").write_text(json.dumps({"node": "node1", "time": "soon", "results": []}))
    (states / "node2.json").write_text(
        json.dumps({"node": "node3", "time": NOW, "results": []})
    )  # not its own
    (states / "node3.json").write_text(json.dumps({"node": "node3", "time": NOW, "results": [{"check": 1}]}))
    reg = registry(tmp_path)
    first = snapshot(reg)
    assert sample(first, "slurm_chaos_probe_step_seconds", labels(1, "node2", world=2)) == pytest.approx(0.12)
    assert sample(first, "slurm_chaos_exporter_rejected_files_total", {"kind": "heartbeat"}) == 1
    assert sample(first, "slurm_chaos_exporter_rejected_files_total", {"kind": "health"}) == 2
    assert sample(first, "slurm_chaos_health_check_age_seconds", {"node": "node3", "Hostname": "node3"}) == 0
    # A counter: every read that skips a file adds to it, so a file still there keeps it rising.
    second = snapshot(reg)
    assert sample(second, "slurm_chaos_exporter_rejected_files_total", {"kind": "heartbeat"}) == 2
    assert sample(second, "slurm_chaos_exporter_rejected_files_total", {"kind": "health"}) == 4


def test_counters_are_exposed_as_total_and_gauges_are_not(tmp_path: Path) -> None:
    write_beats(tmp_path / "hb", [("node1", 0.05), ("node2", 0.10)])
    types = {m.name: m.type for m in registry(tmp_path).collect()}
    assert types["slurm_chaos_probe_checkpoint_failures"] == "counter"
    assert types["slurm_chaos_exporter_rejected_files"] == "counter"
    gauges = {name for name, kind in types.items() if kind == "gauge"}
    assert "slurm_chaos_probe_step_seconds" in gauges and "slurm_chaos_probe_last_step" in gauges
    assert not any(name.endswith("_total") for name in gauges)


def test_a_ranks_gpu_is_a_label_only_where_its_heartbeat_names_one(tmp_path: Path) -> None:
    for rank, gpu in ((0, 3), (1, None)):
        hb = Heartbeat(tmp_path / "hb", "12", rank, "node1", world_size=2, gpu=gpu, clock=lambda: NOW - 1)
        hb.update(0, 0.1, 0.08, 0.02)
    snap = snapshot(registry(tmp_path))
    series = sorted(
        (dict(have) for name, have in snap if name == "slurm_chaos_probe_step_seconds"),
        key=lambda d: d["rank"],
    )
    assert series == [
        labels(0, "node1", world=2) | {"gpu": "3"},
        labels(1, "node1", world=2),  # no gpu label at all, not an empty one
    ]


def test_join_label_names_are_configurable(tmp_path: Path) -> None:
    hb = Heartbeat(tmp_path / "hb", "12", 0, "node1", world_size=1, gpu=0, clock=lambda: NOW - 1)
    hb.update(0, 0.1, 0.08, 0.02)
    reg = registry(tmp_path, join=JoinLabels(node="gpu_host", gpu="gpu_index"))
    want = {"job_id": "12", "rank": "0", "host": "node1", "world_size": "1", "mode": "train"}
    want |= {"gpu_host": "node1", "gpu_index": "0"}
    assert reg.get_sample_value("slurm_chaos_probe_step_seconds", want) == pytest.approx(0.1)


@pytest.mark.parametrize(
    "node, gpu", [("host", "gpu"), ("Hostname", "Hostname"), ("9x", "gpu"), ("__n", "gpu")]
)
def test_a_join_label_must_be_a_label_name_of_its_own(
    node: str, gpu: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError):
        JoinLabels(node, gpu)
    with pytest.raises(SystemExit) as exit_:
        main(["--port", "1", "--heartbeat-dir", "/nonexistent", "--node-label", node, "--gpu-label", gpu])
    assert exit_.value.code == 2 and "label" in capsys.readouterr().err


def test_health_state_others_may_write_is_not_trusted(tmp_path: Path) -> None:
    states = tmp_path / "health"
    states.mkdir()
    result = [{"check": "numa", "status": 2, "message": "forged"}]
    (states / "node2.json").write_text(json.dumps({"node": "node2", "time": NOW, "results": result}))
    os.chown(states / "node2.json", 4242, 4242)  # not the health check's own file
    reg = registry(tmp_path)
    forged = {"node": "node2", "Hostname": "node2", "check": "numa"}
    assert reg.get_sample_value("slurm_chaos_health_check_ok", forged) is None
    os.chown(states / "node2.json", 0, 0)
    states.chmod(0o1777)  # a directory anyone may write in
    assert reg.get_sample_value("slurm_chaos_health_check_ok", forged) is None
    # One rejection per read: the file, then the whole directory, and now (the third read) again.
    assert reg.get_sample_value("slurm_chaos_exporter_rejected_files_total", {"kind": "health"}) == 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_exporter_process_serves_metrics_over_http(tmp_path: Path) -> None:
    hb = tmp_path / "hb"
    write_beats(hb, [("node1", 0.05), ("node2", 0.10)], at=time.time())
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurm_chaos.observe.exporter", f"--port={port}", f"--heartbeat-dir={hb}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    text = resp.read().decode()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        assert (
            'slurm_chaos_probe_straggler_ratio{Hostname="node2",host="node2",job_id="12",mode="train",rank="1",'
            'world_size="2"} 2.0' in text
        )
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def _families(path: Path) -> dict[str, Metric]:
    return {m.name: m for m in text_string_to_metric_families(path.read_text())}


def test_textfile_once_writes_the_registry_for_node_exporter(tmp_path: Path) -> None:
    write_beats(tmp_path / "hb", [("node1", 0.05), ("node2", 0.10)], at=time.time())
    out = tmp_path / "textfile" / "slurm_chaos.prom"
    out.parent.mkdir()
    assert main(["--textfile", str(out), "--once", "--heartbeat-dir", str(tmp_path / "hb")]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert [p.name for p in out.parent.iterdir()] == ["slurm_chaos.prom"]  # no temporary file left
    families = _families(out)
    ratio = {s.labels["rank"]: s.value for s in families["slurm_chaos_probe_straggler_ratio"].samples}
    assert ratio == {"0": pytest.approx(0.5), "1": pytest.approx(2.0)}
    (node2,) = [s for s in families["slurm_chaos_probe_step_seconds"].samples if s.labels["host"] == "node2"]
    assert node2.labels["Hostname"] == "node2" and node2.value == pytest.approx(0.12)
    counter = families["slurm_chaos_exporter_rejected_files"]
    assert counter.type == "counter"
    assert {s.name for s in counter.samples} == {"slurm_chaos_exporter_rejected_files_total"}


def test_textfile_is_what_a_scrape_of_the_same_registry_shows(tmp_path: Path) -> None:
    write_beats(tmp_path / "hb", [("node1", 0.05), ("node2", 0.10), ("node3", 0.05)])
    reg = registry(tmp_path)
    out = tmp_path / "m.prom"
    write_textfile(reg, out)
    assert out.read_bytes() == generate_latest(reg)  # the clock is fixed, and no file is rejected


def test_textfile_is_rewritten_every_interval_until_told_to_stop(tmp_path: Path) -> None:
    (tmp_path / "hb").mkdir(mode=0o755)
    (tmp_path / "hb" / "node1").mkdir(mode=0o777)  # not trusted: rejected on every read
    (tmp_path / "hb" / "node1").chmod(0o777)
    out = tmp_path / "m.prom"
    waits: list[float] = []
    seen: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        (sample,) = _families(out)["slurm_chaos_exporter_rejected_files"].samples[:1]
        seen.append(sample.value)
        return len(waits) == 3

    serve_textfile(registry(tmp_path), out, 2.5, wait)
    assert waits == [2.5, 2.5, 2.5]
    assert seen == [1, 2, 3]  # each write read the files afresh


def test_textfile_needs_a_prom_name_and_a_directory_it_can_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["--textfile", str(tmp_path / "m.txt"), "--heartbeat-dir", str(tmp_path)])
    assert "only *.prom files" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--port", "1", "--once", "--heartbeat-dir", str(tmp_path)])
    assert "--once: only with --textfile" in capsys.readouterr().err
    missing = tmp_path / "nowhere" / "m.prom"
    assert main(["--textfile", str(missing), "--once", "--heartbeat-dir", str(tmp_path)]) == 1
    assert f"cannot write {missing}" in capsys.readouterr().err
