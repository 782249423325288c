"""Debian's node_exporter on every sandbox node, judged with a site's stock host alerts (#12).

Each node's node_exporter is scraped by the sandbox's Prometheus (job "node") with an `instance`
naming the node's address and a hostname of the node's own; checkpoint-full, run as an administrator
would on site_configs/sandbox-node-exporter.yaml (the mixin's host alerts as the site's only
detectors), fills the fault job's checkpoint volume in its nodes' mount namespaces, and the site's
NodeFilesystemAlmostOutOfSpace fires for those nodes alone and is counted as the detection of
detector node-filesystem (about 1-2 minutes here). Without node_exporter installed it skips.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sandbox_cli import cli, reinstall_plugin

from slurm_chaos.rundir.layout import Role
from slurm_chaos.rundir.manifest import read_manifest
from slurm_chaos.sandbox import monitoring
from slurm_chaos.sandbox.cluster import Sandbox
from slurm_chaos.sandbox.layout import Layout

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.slow,
    pytest.mark.skipif(
        not monitoring.NODE_EXPORTER.exists(),
        reason=f"{monitoring.NODE_EXPORTER} missing (apt-get install prometheus-node-exporter)",
    ),
]

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "site_configs" / "sandbox-node-exporter.yaml"
ALERT = "NodeFilesystemAlmostOutOfSpace"
#: The sandbox's own addresses are never reached through a proxy.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))

T = TypeVar("T")


def _query(layout: Layout, promql: str) -> list[dict[str, Any]]:
    """An instant query of the sandbox's Prometheus: its result vector."""
    url = f"http://127.0.0.1:{layout.prometheus_port}/api/v1/query?" + urllib.parse.urlencode(
        {"query": promql}
    )
    with DIRECT.open(url, timeout=10) as resp:
        data = json.loads(resp.read())
    assert data["status"] == "success", data
    result = data["data"]["result"]
    assert isinstance(result, list)
    return result


def _wait(what: str, probe: Callable[[], T | None], timeout: float) -> T:
    """Poll `probe` once a second until it returns something; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(1)


def _checkpoint_alerts(layout: Layout, checkpoints: Path, window_s: float | None = None) -> set[str]:
    """The instances with NodeFilesystemAlmostOutOfSpace (pending or firing) on a filesystem mounted
    under the checkpoint root: now, or at any time in the last `window_s` seconds."""
    series = f'ALERTS{{alertname="{ALERT}",job="node"}}'
    promql = series if window_s is None else f"max_over_time({series}[{int(window_s) + 5}s])"
    return {
        r["metric"]["instance"]
        for r in _query(layout, promql)
        if r["metric"].get("mountpoint", "").startswith(f"{checkpoints}/")
    }


def test_every_nodes_node_exporter_is_scraped_and_a_full_checkpoint_volume_alerts_for_its_nodes_only(
    sandbox: Any, chaos_site: Path, tmp_path: Path
) -> None:
    layout = Layout.load(sandbox.name)
    assert layout is not None
    address = {layout.node_name(i): f"{layout.node_addr(i)}:9100" for i in range(1, layout.nodes + 1)}
    node_of = {a: n for n, a in address.items()}

    # Every node's node_exporter runs (sandbox status shows it) and is scraped on the node's address.
    shown = Sandbox(sandbox.name).status()["monitoring"]
    assert isinstance(shown, dict)
    assert all(isinstance(shown[f"node_exporter {n}"], int) for n in address), shown

    def all_up() -> dict[str, str] | None:
        up = {r["metric"]["instance"]: r["value"][1] for r in _query(layout, 'up{job="node"}')}
        return up if up == dict.fromkeys(address.values(), "1") else None

    _wait("every node's node_exporter scraped (up == 1 on each node's address)", all_up, 60)
    # In the node's UTS namespace: its own hostname, under the instance of its own address.
    uname = {
        r["metric"]["instance"]: r["metric"]["nodename"]
        for r in _query(layout, 'node_uname_info{job="node"}')
    }
    assert uname == {a: n for n, a in address.items()}, uname
    # In the node's network namespace: its eth0 (the host's bridge and veths are not the node's).
    netdev = _query(layout, 'node_network_receive_packets_total{job="node"}')
    devices = {(r["metric"]["instance"], r["metric"]["device"]) for r in netdev}
    assert {(a, "eth0") for a in address.values()} <= devices, devices
    assert not any(d.startswith(("scb-", "scv-")) for _, d in devices), devices

    # No full checkpoint volume left by an earlier test.
    checkpoints = sandbox.shared_dir / "checkpoints"
    _wait(
        "no earlier checkpoint volume alert",
        lambda: True if not _checkpoint_alerts(layout, checkpoints) else None,
        90,
    )

    out = tmp_path / "node-exporter"
    t0 = time.monotonic()
    try:
        res = cli("run", "--site", str(SITE), "checkpoint-full", "--out", str(out), "-q", env=sandbox.env)
    finally:
        reinstall_plugin(sandbox, chaos_site)
    took = time.monotonic() - t0
    print(f"\ncheckpoint-full on node_exporter's host alerts: {took:.0f} s")
    assert res.returncode == 0, res.stdout + res.stderr

    (fault,) = [j for j in read_manifest(out).jobs if j.role == Role.FAULT]
    assert fault.nodes, fault
    held = {address[n] for n in fault.nodes}

    # Prometheus: the alert was raised on the fault job's nodes (each mounts its own full volume)
    # and on no other node: the others' exporters do not see those mounts.
    alerted = _checkpoint_alerts(layout, checkpoints, took)
    assert alerted == held, {node_of[a] for a in alerted}

    # The campaign: the site's detector node-filesystem detected it, for the job's nodes only.
    (entry,) = json.loads((out / "report.json").read_text())["experiments"]
    assert entry["verdict"] == "PASSED", entry["reason"]
    assert entry["detected_by"] == "node-filesystem", entry
    found = {(d["detector"], d["signal"]) for d in entry["detections"]}
    assert ("node-filesystem", "checkpoint") in found, entry["detections"]
    data = json.loads((out / "experiments" / "checkpoint-full" / "observations.json").read_text())
    observations = data["observations"] if isinstance(data, dict) else data
    by_site = [json.loads(o["detail"]) for o in observations if o["signal"] == "detector:node-filesystem"]
    assert by_site, observations
    assert {labels["instance"] for labels in by_site} <= held, by_site
    assert all(labels["alertname"] == ALERT for labels in by_site), by_site
    assert all(labels["mountpoint"].startswith(f"{checkpoints}/") for labels in by_site), by_site
    # slurm-chaos's own health check is off on this site: it neither drained nor alerted.
    assert not any(o["signal"] == "healthcheck_drain" for o in observations), observations
