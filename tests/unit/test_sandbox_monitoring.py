"""Monitoring daemons of a sandbox: their configs, their PID checks, and a start that fails loudly."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from slurm_chaos.errors import ChaosError
from slurm_chaos.resources import shipped
from slurm_chaos.sandbox import monitoring
from slurm_chaos.sandbox.layout import Layout


@pytest.fixture()
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Layout:
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX_ROOT", str(tmp_path))
    lay = Layout("t-obs", 7, 4, "host")
    lay.save()
    return lay


def test_prometheus_config_points_at_this_sandboxs_ports(layout: Layout) -> None:
    monitoring.write_configs(layout)
    mon = monitoring.monitoring_dir(layout)
    conf = yaml.safe_load((mon / "prometheus.yml").read_text())
    assert conf["global"]["scrape_interval"] == "2s" and conf["global"]["evaluation_interval"] == "2s"
    assert conf["rule_files"] == [str(mon / "slurm-chaos.rules.yml")]
    am = conf["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert am == [f"127.0.0.1:{layout.alertmanager_port}"]
    assert conf["scrape_configs"][0]["static_configs"][0]["targets"] == [f"127.0.0.1:{layout.exporter_port}"]
    assert (mon / "slurm-chaos.rules.yml").read_text() == (
        shipped("site_configs") / "alerts" / "slurm-chaos.rules.yml"
    ).read_text()
    assert monitoring.sandbox_heartbeat_dir("t-obs") == layout.root / "heartbeat"
    # Root's alone: each job gets a directory of its own in it from the prolog.
    assert (layout.root / "heartbeat").stat().st_mode & 0o7777 == 0o755


def test_services_listen_on_loopback_with_state_under_the_sandbox(layout: Layout) -> None:
    svcs = {s.label: s for s in monitoring.services(layout)}
    assert list(svcs) == ["alertmanager", "exporter", "prometheus"]
    prom, am = svcs["prometheus"], svcs["alertmanager"]
    assert f"--web.listen-address=127.0.0.1:{layout.prometheus_port}" in prom.argv
    assert f"--storage.tsdb.path={layout.root}/monitoring/prometheus" in prom.argv
    assert (
        "--cluster.listen-address=" in am.argv
        and f"--web.listen-address=127.0.0.1:{layout.alertmanager_port}" in am.argv
    )
    assert all(s.pidfile.parent == layout.run_dir for s in svcs.values())
    assert f"--port={layout.exporter_port}" in svcs["exporter"].argv


def test_stop_never_kills_a_process_that_is_not_ours(layout: Layout) -> None:
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        for svc in monitoring.services(layout):
            svc.pidfile.parent.mkdir(parents=True, exist_ok=True)
            svc.pidfile.write_text(f"{stranger.pid}\n")
        assert monitoring.stop_monitoring(layout) == []
        assert stranger.poll() is None
        assert not any(s.pidfile.exists() for s in monitoring.services(layout))
    finally:
        stranger.kill()
        stranger.wait()


def test_a_daemon_that_dies_at_start_fails_with_its_log(layout: Layout) -> None:
    svc = monitoring.Service(
        "broken",
        (sys.executable, "-c", "import sys; print('listen tcp: address already in use'); sys.exit(3)"),
        layout.run_dir / "broken.pid",
        layout.log_dir / "broken.log",
        "http://127.0.0.1:1/-/ready",
        "-c",
    )
    t0 = time.monotonic()
    with pytest.raises(ChaosError) as err:
        monitoring._start(svc)
    assert time.monotonic() - t0 < 10
    assert "broken exited with 3 at start" in str(err.value) and "address already in use" in str(err.value)


@pytest.mark.parametrize("started_as", ["the same path", "another name"])
def test_started_service_is_recognised_and_stopped_by_pid(
    layout: Layout, tmp_path: Path, started_as: str
) -> None:
    # "another name": brought up by the console script (python3.x), taken down by `python -m ...`.
    program = sys.executable
    if started_as == "another name":
        program = str(tmp_path / "python-alias")
        Path(program).symlink_to(sys.executable)
    marker = f"--marker={layout.root}"
    svc = monitoring.Service(
        "sleeper",
        (sys.executable, "-c", "import time; time.sleep(60)", marker),
        layout.run_dir / "sleeper.pid",
        layout.log_dir / "sleeper.log",
        "http://127.0.0.1:1/-/ready",
        marker,
    )
    proc = subprocess.Popen([program, *svc.argv[1:]])
    try:
        svc.pidfile.parent.mkdir(parents=True, exist_ok=True)
        svc.pidfile.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/cmdline").read_bytes().count(b"\0") < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # until the child has exec'd
        assert svc.pid() == proc.pid
        assert monitoring._stop(svc) == f"sleeper (pid {proc.pid})"
        assert proc.wait(15) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_port_held_by_another_process_is_refused_before_starting(layout: Layout) -> None:
    import http.server
    import threading

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    svc = monitoring.Service(
        "exporter",
        (sys.executable, "-c", "import time; time.sleep(60)"),
        layout.run_dir / "exporter.pid",
        layout.log_dir / "exporter.log",
        f"http://127.0.0.1:{server.server_address[1]}/",
        "-c",
    )
    try:
        with pytest.raises(ChaosError, match="already answers but not from this sandbox's exporter"):
            monitoring._start(svc)
        assert not svc.pidfile.exists()  # nothing was started
    finally:
        server.shutdown()
        server.server_close()
