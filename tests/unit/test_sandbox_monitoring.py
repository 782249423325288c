"""Monitoring daemons of a sandbox: their configs, their PID checks, and a start that fails loudly."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults import node_proc
from slurm_chaos.resources import shipped
from slurm_chaos.sandbox import monitoring
from slurm_chaos.sandbox.layout import Layout


@pytest.fixture()
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Layout:
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX_ROOT", str(tmp_path))
    lay = Layout("t-obs", 7, 4, "host")
    lay.save()
    return lay


@pytest.fixture()
def no_node_exporter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """node_exporter not installed (whatever this machine has)."""
    absent = tmp_path / "no-such-node-exporter"
    monkeypatch.setattr(monitoring, "NODE_EXPORTER", absent)
    return absent


@pytest.fixture()
def node_exporter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """node_exporter installed (a stand-in file: nothing here runs it)."""
    binary = tmp_path / "bin" / "prometheus-node-exporter"
    binary.parent.mkdir()
    binary.write_text("")
    monkeypatch.setattr(monitoring, "NODE_EXPORTER", binary)
    return binary


def test_prometheus_config_points_at_this_sandboxs_ports(layout: Layout, no_node_exporter: Path) -> None:
    monitoring.write_configs(layout)
    mon = monitoring.monitoring_dir(layout)
    conf = yaml.safe_load((mon / "prometheus.yml").read_text())
    assert conf["global"]["scrape_interval"] == "2s" and conf["global"]["evaluation_interval"] == "2s"
    # Ours and the site's host alerts, side by side.
    assert conf["rule_files"] == [str(mon / "slurm-chaos.rules.yml"), str(mon / "site-node.rules.yml")]
    am = conf["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert am == [f"127.0.0.1:{layout.alertmanager_port}"]
    assert conf["scrape_configs"][0]["static_configs"][0]["targets"] == [f"127.0.0.1:{layout.exporter_port}"]
    # Without node_exporter there is nothing to scrape on the nodes (and no target down to alert on).
    assert [c["job_name"] for c in conf["scrape_configs"]] == ["slurm-chaos"]
    for name in ("slurm-chaos.rules.yml", "site-node.rules.yml"):
        assert (mon / name).read_text() == (shipped("site_configs") / "alerts" / name).read_text()
    assert monitoring.sandbox_heartbeat_dir("t-obs") == layout.root / "heartbeat"
    # Root's alone: each job gets a directory of its own in it from the prolog.
    assert (layout.root / "heartbeat").stat().st_mode & 0o7777 == 0o755


def test_services_listen_on_loopback_with_state_under_the_sandbox(layout: Layout) -> None:
    svcs = {s.label: s for s in monitoring.services(layout)}
    nodes = [f"node_exporter node{i}" for i in range(1, 5)]
    # Prometheus last: what it scrapes and sends alerts to is up before it.
    assert list(svcs) == ["alertmanager", "exporter", *nodes, "prometheus"]
    svcs = {label: svc for label, svc in svcs.items() if label not in nodes}
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


# ---------------------------------------------------------------- node_exporter on every node


def test_a_nodes_node_exporter_runs_in_the_nodes_namespaces_on_its_address(layout: Layout) -> None:
    svc = monitoring.node_exporter(layout, 2, slurmd=4242)
    assert svc.label == "node_exporter node2"
    # Entered through the node's slurmd, as every node-side command from the host: its network (its
    # address, its eth0), mount (its mounts) and UTS (its hostname) namespaces; nsenter execs it.
    assert svc.command[:7] == ["nsenter", "-t", "4242", "-n", "-m", "-u", "--"]
    assert svc.command[7:] == list(svc.argv)
    assert svc.argv[0] == str(monitoring.NODE_EXPORTER) and svc.program == "prometheus-node-exporter"
    address = f"{layout.node_addr(2)}:9100"
    assert f"--web.listen-address={address}" in svc.argv
    assert svc.ready_url == f"http://{address}/metrics"
    textfiles = layout.root / "node-exporter" / "node2" / "textfile"
    assert f"--collector.textfile.directory={textfiles}" in svc.argv
    assert svc.marker == f"--collector.textfile.directory={textfiles}"  # this sandbox's, this node's
    assert f"--path.procfs={layout.root / 'node-exporter' / 'proc'}" in svc.argv
    # Only the collectors the site's rules read.
    assert "--collector.disable-defaults" in svc.argv
    enabled = {a.removeprefix("--collector.") for a in svc.argv if re.fullmatch(r"--collector\.[a-z_]+", a)}
    assert enabled == {"cpu", "filesystem", "loadavg", "meminfo", "netdev", "textfile", "uname"}
    assert (svc.pidfile, svc.log_file) == (
        layout.run_dir / "node_exporter.node2.pid",
        layout.log_dir / "node_exporter.node2.log",
    )
    # Not started (no slurmd known): argv alone, and never run on this host by `start_monitoring`.
    assert monitoring.node_exporter(layout, 2).node_pid is None


def test_the_checkpoint_volume_is_seen_and_pseudo_filesystems_are_not(layout: Layout) -> None:
    (svc,) = [s for s in monitoring.node_exporters(layout, {"node1": 1}) if s.node_pid == 1]
    (flag,) = [a for a in svc.argv if a.startswith("--collector.filesystem.fs-types-exclude=")]
    exclude = re.compile(flag.split("=", 1)[1])
    # ckpt-full's full volume is an overlay (node_exporter's own default leaves overlays out).
    for seen in ("overlay", "tmpfs", "ext4", "xfs", "nfs4", "lustre"):
        assert not exclude.match(seen), seen
    for hidden in ("proc", "sysfs", "cgroup", "cgroup2", "devpts", "nsfs", "tracefs"):
        assert exclude.match(hidden), hidden


def test_prometheus_scrapes_every_nodes_node_exporter_as_job_node(
    layout: Layout, node_exporter: Path
) -> None:
    monitoring.write_configs(layout)
    mon = monitoring.monitoring_dir(layout)
    conf = yaml.safe_load((mon / "prometheus.yml").read_text())
    (node,) = [c for c in conf["scrape_configs"] if c["job_name"] == "node"]
    # `instance` is then the node's address (its NodeAddr): how the campaign tells an alert's node.
    assert node["static_configs"] == [{"targets": [f"10.251.7.{10 + i}:9100" for i in range(1, 5)]}]
    assert node["scrape_interval"] == "4s"
    for n in layout.node_names():
        assert monitoring.textfile_dir(layout, n).is_dir()
    view = monitoring.procfs_view(layout)
    names = {p.name for p in view.iterdir()}
    assert not any(n.isdigit() for n in names)  # no /proc/1: node_exporter reads its own mounts
    assert {"self", "mounts", "stat", "loadavg", "meminfo", "net"} <= names
    assert os.readlink(view / "mounts") == "/proc/mounts"


def test_a_procfs_view_links_all_but_the_pid_directories(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for d in ("1", "4242", "self", "net", "sys"):
        (proc / d).mkdir(parents=True)
    (proc / "loadavg").write_text("0.1 0.2 0.3 1/2 3\n")
    view = tmp_path / "view"
    monitoring.write_procfs_view(view, proc)
    monitoring.write_procfs_view(view, proc)  # again: nothing to do
    assert sorted(p.name for p in view.iterdir()) == ["loadavg", "net", "self", "sys"]
    assert (view / "loadavg").read_text().startswith("0.1 ")


def _fake_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """Prometheus and Alertmanager "installed", and `_start` recording what it would start."""
    for name in ("PROMETHEUS", "ALERTMANAGER"):
        binary = tmp_path / "bin" / name.lower()
        binary.parent.mkdir(exist_ok=True)
        binary.write_text("")
        monkeypatch.setattr(monitoring, name, binary)
    started: list[str] = []

    def start(svc: monitoring.Service) -> int:
        started.append(svc.label if svc.node_pid is None else f"{svc.label} in {svc.node_pid}")
        return 4000 + len(started)

    monkeypatch.setattr(monitoring, "_start", start)
    return started


def test_without_node_exporter_the_sandbox_comes_up_without_it_and_says_so(
    layout: Layout,
    no_node_exporter: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = _fake_starts(monkeypatch, tmp_path)
    with caplog.at_level(logging.WARNING, logger="slurm_chaos.sandbox.monitoring"):
        monitoring.start_monitoring(layout, {n: 100 + i for i, n in enumerate(layout.node_names())})
    assert started == ["alertmanager", "exporter", "prometheus"]
    (line,) = [r.getMessage() for r in caplog.records]
    assert "runs without a node_exporter per node" in line and "prometheus-node-exporter" in line
    status = monitoring.monitoring_status(layout)
    assert status["node_exporter node1"] == "not installed" and status["prometheus"] is None


def test_node_exporters_start_where_their_nodes_slurmd_runs(
    layout: Layout,
    node_exporter: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = _fake_starts(monkeypatch, tmp_path)
    with caplog.at_level(logging.WARNING, logger="slurm_chaos.sandbox.monitoring"):
        monitoring.start_monitoring(layout, {"node1": 101, "node2": 102, "node4": 104})
    assert started == [
        "alertmanager",
        "exporter",
        "node_exporter node1 in 101",
        "node_exporter node2 in 102",
        "node_exporter node4 in 104",
        "prometheus",
    ]
    assert [r.getMessage() for r in caplog.records] == [
        "node_exporter node3 not started: the node's slurmd is not running"
    ]
    # A caller that does not know the nodes' slurmds (a test restarting the exporter) leaves them be.
    started.clear()
    monitoring.start_monitoring(layout)
    assert started == ["alertmanager", "exporter", "prometheus"]
    assert monitoring.monitoring_status(layout)["node_exporter node1"] is None


def test_a_running_prometheus_reloads_a_changed_config(
    layout: Layout, no_node_exporter: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_starts(monkeypatch, tmp_path)
    monitoring.start_monitoring(layout)
    monkeypatch.setattr(monitoring.Service, "pid", lambda svc: 4242)
    reloaded: list[int] = []
    monkeypatch.setattr(monitoring, "_reload", reloaded.append)
    monitoring.start_monitoring(layout)
    assert reloaded == []  # the same config: nothing to reload
    # A sandbox brought up before node_exporter was installed (or before the site's rules).
    (monitoring.monitoring_dir(layout) / "site-node.rules.yml").write_text("groups: []\n")
    monitoring.start_monitoring(layout)
    assert reloaded == [4242]


def test_a_node_exporter_left_in_an_old_slurmds_namespaces_is_started_again(
    layout: Layout, node_exporter: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = _fake_starts(monkeypatch, tmp_path)
    monkeypatch.setattr(monitoring.Service, "pid", lambda svc: 7000 if svc.node_pid else 4242)
    # node1's slurmd (101) shares the exporter's namespaces; node2's (102) was started again since.
    inodes = {(7000, "net"): 1, (7000, "mnt"): 2, (101, "net"): 1, (101, "mnt"): 2, (102, "net"): 1}
    monkeypatch.setattr(node_proc, "ns_inode", lambda pid, kind: inodes.get((pid, kind), 9))
    stopped: list[str] = []
    monkeypatch.setattr(monitoring, "_stop", lambda svc: stopped.append(svc.label))
    monkeypatch.setattr(monitoring, "_reload", lambda pid: None)
    monitoring.start_monitoring(layout, {"node1": 101, "node2": 102})
    assert stopped == ["node_exporter node2"]
    assert started == ["node_exporter node2 in 102"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(not monitoring.NODE_EXPORTER.exists(), reason="Debian's prometheus-node-exporter missing")
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="a mount namespace of its own needs root"
)
def test_node_exporter_reads_the_mounts_of_its_own_mount_namespace(layout: Layout, tmp_path: Path) -> None:
    """The real node_exporter with the sandbox's flags (on 127.0.0.1 here), in a mount namespace with
    a full volume no other namespace has: it reports that volume (its own mounts, not PID 1's)."""
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if subprocess.run([*unshare, "true"], capture_output=True, timeout=30).returncode != 0:
        pytest.skip("no mount namespace of its own here (a container without CAP_SYS_ADMIN)")
    monitoring.write_configs(layout)
    svc = monitoring.node_exporter(layout, 1)
    port = _free_port()
    argv = [
        f"--web.listen-address=127.0.0.1:{port}" if a.startswith("--web.listen-address=") else a
        for a in svc.argv
    ]
    (monitoring.textfile_dir(layout, "node1") / "site.prom").write_text("site_cron_ok 1\n")
    volume = tmp_path / "checkpoints" / "job7"
    volume.mkdir(parents=True)
    fill_and_exec = (
        'mount -t tmpfs -o size=64k slurm-chaos-test-ckpt "$1" && cat /dev/zero > "$1/ballast"; '
        'shift; exec "$@"'
    )
    proc = subprocess.Popen(
        [*unshare, "sh", "-c", fill_and_exec, "sh", str(volume), *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "GOMAXPROCS": "1"},
    )
    try:
        text = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "node_filesystem_avail_bytes" not in text:
            assert proc.poll() is None, proc.communicate()[1]
            with contextlib.suppress(OSError):
                with monitoring._DIRECT.open(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    text = resp.read().decode()
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(10)
    assert not os.path.ismount(volume)  # the volume was the exporter's namespace's alone
    labels = f'device="slurm-chaos-test-ckpt",fstype="tmpfs",mountpoint="{volume}"'
    avail = re.search(rf"^node_filesystem_avail_bytes\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    size = re.search(rf"^node_filesystem_size_bytes\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    assert avail and size, text
    assert float(avail.group(1)) / float(size.group(1)) < 0.05  # NodeFilesystemAlmostOutOfSpace's 5 %
    assert re.search(r"^site_cron_ok 1$", text, re.M)  # the node's textfile collector directory
    assert re.search(r"^node_uname_info\{.*nodename=", text, re.M) and "node_load1 " in text
    assert "go_goroutines" not in text  # no exporter metrics: the site's rules do not read them
