"""The sandbox's monitoring: real Prometheus and Alertmanager (Debian packages) and the exporter.

Each runs with its state under the sandbox's root, listens on 127.0.0.1 only, and is started with
a PID file under the sandbox's run directory and stopped by that PID once it is shown to be ours
(its program and an argument naming this sandbox's paths), like the Slurm daemons.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from slurm_chaos.errors import ChaosError
from slurm_chaos.resources import shipped
from slurm_chaos.sandbox import daemons
from slurm_chaos.sandbox.layout import Layout

log = logging.getLogger(__name__)

PROMETHEUS = Path("/usr/bin/prometheus")
ALERTMANAGER = Path("/usr/bin/prometheus-alertmanager")
RULES_NAME = "slurm-chaos.rules.yml"
INTERVAL_S = 2
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Service:
    """One monitoring daemon: how to start it, how to tell it is up, how to recognise it as ours."""

    label: str
    argv: tuple[str, ...]
    pidfile: Path
    log_file: Path
    ready_url: str
    # An argument only our instance has (it names this sandbox's paths).
    marker: str

    @property
    def program(self) -> str:
        """The executable's own name, links resolved: a sandbox brought up by `slurm-chaos`
        (python3.11) is taken down by a process started as `python` just the same."""
        return Path(os.path.realpath(self.argv[0])).name

    def pid(self) -> int | None:
        pid = daemons.read_pid(self.pidfile)
        return pid if daemons.is_ours(pid, self.program, arg=self.marker) else None


def monitoring_dir(layout: Layout) -> Path:
    return layout.root / "monitoring"


def sandbox_heartbeat_dir(sandbox: Layout | str) -> Path:
    """Where the sandbox's probes write heartbeats (set SLURM_CHAOS_HEARTBEAT_DIR to it for jobs)."""
    if isinstance(sandbox, str):
        layout = Layout.load(sandbox)
        if layout is None:
            raise ChaosError(f"sandbox {sandbox!r} is not up (run 'slurm-chaos sandbox up --name {sandbox}')")
        sandbox = layout
    return sandbox.root / "heartbeat"


def health_config(layout: Layout) -> Path:
    """The health-check config `install_healthcheck` writes into the sandbox's hooks dir (etc/)."""
    from slurm_chaos.observe.healthcheck import CONFIG_NAME

    return layout.etc / CONFIG_NAME


def prometheus_config(layout: Layout, rules: Path) -> str:
    return f"""# Prometheus of the slurm-chaos sandbox "{layout.name}" (written by slurm-chaos).
global:
  scrape_interval: {INTERVAL_S}s
  scrape_timeout: {INTERVAL_S}s
  evaluation_interval: {INTERVAL_S}s
rule_files:
  - {rules}
alerting:
  alertmanagers:
    - static_configs:
        - targets: ["127.0.0.1:{layout.alertmanager_port}"]
scrape_configs:
  - job_name: slurm-chaos
    static_configs:
      - targets: ["127.0.0.1:{layout.exporter_port}"]
"""


def services(layout: Layout) -> list[Service]:
    """Alertmanager first: Prometheus sends alerts to it from its first evaluation."""
    mon, run, logs = monitoring_dir(layout), layout.run_dir, layout.log_dir
    heartbeats = sandbox_heartbeat_dir(layout)
    alertmanager_data = mon / "alertmanager"
    prometheus_data = mon / "prometheus"
    return [
        Service(
            "alertmanager",
            (
                str(ALERTMANAGER),
                f"--config.file={mon / 'alertmanager.yml'}",
                f"--storage.path={alertmanager_data}",
                f"--web.listen-address=127.0.0.1:{layout.alertmanager_port}",
                "--cluster.listen-address=",
                "--data.retention=2h",
                "--log.level=warn",
            ),
            run / "alertmanager.pid",
            logs / "alertmanager.log",
            f"http://127.0.0.1:{layout.alertmanager_port}/-/ready",
            f"--storage.path={alertmanager_data}",
        ),
        Service(
            "exporter",
            (
                sys.executable,
                "-m",
                "slurm_chaos.observe.exporter",
                f"--port={layout.exporter_port}",
                f"--heartbeat-dir={heartbeats}",
                f"--state-dir={layout.root / 'health'}",
                f"--config={health_config(layout)}",
            ),
            run / "exporter.pid",
            logs / "exporter.log",
            f"http://127.0.0.1:{layout.exporter_port}/metrics",
            f"--heartbeat-dir={heartbeats}",
        ),
        Service(
            "prometheus",
            (
                str(PROMETHEUS),
                f"--config.file={mon / 'prometheus.yml'}",
                f"--storage.tsdb.path={prometheus_data}",
                "--storage.tsdb.retention.time=6h",
                f"--web.listen-address=127.0.0.1:{layout.prometheus_port}",
                "--query.max-concurrency=2",
                "--log.level=warn",
            ),
            run / "prometheus.pid",
            logs / "prometheus.log",
            f"http://127.0.0.1:{layout.prometheus_port}/-/ready",
            f"--storage.tsdb.path={prometheus_data}",
        ),
    ]


def write_configs(layout: Layout) -> None:
    mon = monitoring_dir(layout)
    mon.mkdir(parents=True, exist_ok=True)
    rules = mon / RULES_NAME
    alerts = shipped("site_configs") / "alerts"
    shutil.copyfile(alerts / RULES_NAME, rules)
    shutil.copyfile(alerts / "alertmanager.yml", mon / "alertmanager.yml")
    (mon / "prometheus.yml").write_text(prometheus_config(layout, rules))
    for d in (sandbox_heartbeat_dir(layout), layout.root / "health"):
        # Root's alone: the prolog gives each job a directory of its own in the heartbeat directory.
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - our own loopback URL
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _tail(log_file: Path, lines: int = 8) -> str:
    with contextlib.suppress(OSError):
        text = log_file.read_text(errors="replace").strip().splitlines()[-lines:]
        if text:
            return f"\n  {log_file}:\n  " + "\n  ".join(text)
    return f" (nothing in {log_file})"


def _start(svc: Service) -> int:
    if _ready(svc.ready_url):
        # Our instance is not running (its PID file says so), yet the port answers: another process
        # holds it, e.g. an orphan of an earlier sandbox. Starting ours would fail to bind while the
        # readiness check passed on the stranger's answers.
        raise ChaosError(
            f"{svc.label}: {svc.ready_url} already answers but not from this sandbox's {svc.label}; "
            "stop the process that listens there (ss -ltnp) and retry"
        )
    svc.log_file.parent.mkdir(parents=True, exist_ok=True)
    # Go daemons otherwise size their thread pools and heaps for the whole machine.
    env = {**os.environ, "GOMAXPROCS": "1", "GOGC": "50"}
    with open(svc.log_file, "ab") as out:
        proc = subprocess.Popen(
            list(svc.argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True
        )
    svc.pidfile.parent.mkdir(parents=True, exist_ok=True)
    svc.pidfile.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ChaosError(f"{svc.label} exited with {proc.returncode} at start{_tail(svc.log_file)}")
        if _ready(svc.ready_url):
            return proc.pid
        time.sleep(0.1)
    daemons.terminate(proc.pid)
    raise ChaosError(
        f"{svc.label} not ready at {svc.ready_url} after {START_TIMEOUT_S:g} s{_tail(svc.log_file)}"
    )


def start_monitoring(layout: Layout) -> None:
    """Start whichever of Alertmanager, the exporter and Prometheus is not running; wait until ready."""
    for binary in (PROMETHEUS, ALERTMANAGER):
        if not binary.exists():
            raise ChaosError(
                f"{binary} is missing: install the Debian packages prometheus and prometheus-alertmanager"
            )
    write_configs(layout)
    started: list[Service] = []
    try:
        for svc in services(layout):
            if svc.pid() is not None:
                continue
            pid = _start(svc)
            started.append(svc)
            log.info("%s up (pid %d)", svc.label, pid)
    except ChaosError:
        for svc in started:
            _stop(svc)
        raise


def _stop(svc: Service) -> str | None:
    pid = svc.pid()
    if pid is not None:
        daemons.terminate(pid)
    svc.pidfile.unlink(missing_ok=True)
    return f"{svc.label} (pid {pid})" if pid is not None else None


def stop_monitoring(layout: Layout) -> list[str]:
    """Stop our monitoring daemons (by PID, once shown to be ours); returns what was stopped."""
    stopped = [_stop(svc) for svc in reversed(services(layout))]
    return [s for s in stopped if s]
