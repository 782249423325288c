"""The sandbox's monitoring: real Prometheus and Alertmanager (Debian packages), the exporter, and
Debian's node_exporter on every node, as a site runs it.

Each runs with its state under the sandbox's root and is started with a PID file under the sandbox's
run directory and stopped by that PID once it is shown to be ours (its program and an argument naming
this sandbox's paths), like the Slurm daemons. Prometheus, Alertmanager and the exporter listen on
127.0.0.1 only.

A node's node_exporter runs in the node's network, mount and UTS namespaces (entered through its
slurmd, as every node-side command from this host is) and listens on the node's own address, so
Prometheus' ``instance`` names the node's address, which Slurm knows as its NodeAddr. Its textfile
collector reads a directory of the node's own (``<root>/node-exporter/<node>/textfile``). Sandbox
nodes share one kernel, /proc and /sys; what each exporter reads for itself is:

- its mounts: node_exporter reads the mount table of PID 1, the host's on the sandbox, so it is
  given a procfs view without PID directories (``<root>/node-exporter/proc``: every other entry of
  /proc linked); it then falls back, as under ``hidepid``, to its own mount table, the node's mount
  namespace, where ``ckpt-full`` mounts a job's full volume. That volume is an overlay, which
  node_exporter leaves out by default (container layers): here only the pseudo filesystems are;
- its network devices (``eth0``) and their counters, which are per network namespace (the netdev
  collector; not netclass, which reads /sys/class/net: the host's sysfs, the host's devices);
- its hostname (``node_uname_info``'s ``nodename``).

The load average, CPU times and memory are the machine's, the same on every node. Only the collectors
the site's rules use run (``NODE_COLLECTORS``): a site trims node_exporter on compute nodes too, to
keep its jitter off the jobs; on this machine it keeps the scrapes cheap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults import node_proc
from slurm_chaos.resources import shipped
from slurm_chaos.sandbox import daemons
from slurm_chaos.sandbox.layout import Layout

log = logging.getLogger(__name__)

PROMETHEUS = Path("/usr/bin/prometheus")
ALERTMANAGER = Path("/usr/bin/prometheus-alertmanager")
NODE_EXPORTER = Path("/usr/bin/prometheus-node-exporter")
RULES_NAME = "slurm-chaos.rules.yml"
#: The site's host alerts on node_exporter (not ours), loaded beside our rules.
SITE_NODE_RULES_NAME = "site-node.rules.yml"
INTERVAL_S = 2
#: node_exporter's scrape interval: a site's is 15-30 s; short enough here for a fault's minute.
NODE_INTERVAL_S = 4
#: Every node has an address of its own, so every node_exporter listens on its usual port.
NODE_EXPORTER_PORT = 9100
#: Prometheus' job of the node_exporters: the node-exporter mixin's rules select job="node".
NODE_JOB = "node"
#: The collectors the site's rules (site-node.rules.yml) read, and the node's name.
NODE_COLLECTORS = ("cpu", "filesystem", "loadavg", "meminfo", "netdev", "textfile", "uname")
#: Debian's default but for overlay: the sandbox's checkpoint volume (ckpt-full) is an overlay.
NODE_FS_TYPES_EXCLUDE = (
    "^(autofs|binfmt_misc|bpf|cgroup2?|configfs|debugfs|devpts|devtmpfs|fusectl|hugetlbfs|iso9660|mqueue|"
    "nsfs|proc|procfs|pstore|rpc_pipefs|securityfs|selinuxfs|squashfs|sysfs|tracefs)$"
)
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
    #: A node's daemon: the PID of the node's slurmd, whose network, mount and UTS namespaces it
    #: runs in. None: this host's.
    node_pid: int | None = None

    @property
    def program(self) -> str:
        """The executable's own name, links resolved: a sandbox brought up by `slurm-chaos`
        (python3.11) is taken down by a process started as `python` just the same."""
        return Path(os.path.realpath(self.argv[0])).name

    @property
    def command(self) -> list[str]:
        """What is started: `argv`, in the node's namespaces for a node's daemon (nsenter execs it:
        the PID started is the daemon's own)."""
        if self.node_pid is None:
            return list(self.argv)
        return node_proc.nsenter_argv(self.node_pid, self.argv, uts=True)

    def pid(self) -> int | None:
        pid = daemons.read_pid(self.pidfile)
        return pid if daemons.is_ours(pid, self.program, arg=self.marker) else None

    def in_place(self, pid: int) -> bool:
        """A node's daemon runs in its node's slurmd's namespaces: a slurmd started again since has
        new ones, and a mount made on the node now would be out of the daemon's sight."""
        if self.node_pid is None:
            return True
        return all(node_proc.ns_inode(pid, k) == node_proc.ns_inode(self.node_pid, k) for k in ("net", "mnt"))


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


def node_exporter_dir(layout: Layout) -> Path:
    return layout.root / "node-exporter"


def textfile_dir(layout: Layout, node: str) -> Path:
    """The node's textfile collector directory (root's; what a site's cron jobs write on a node)."""
    return node_exporter_dir(layout) / node / "textfile"


def procfs_view(layout: Layout) -> Path:
    """node_exporter's --path.procfs: /proc without its PID directories (see the module's docstring)."""
    return node_exporter_dir(layout) / "proc"


def node_target(layout: Layout, i: int) -> str:
    return f"{layout.node_addr(i)}:{NODE_EXPORTER_PORT}"


def prometheus_config(layout: Layout, rules: list[Path], node_targets: list[str] | None = None) -> str:
    """Prometheus' config: our exporter, and the nodes' node_exporters where they run."""
    files = "".join(f"\n  - {r}" for r in rules)
    text = f"""# Prometheus of the slurm-chaos sandbox "{layout.name}" (written by slurm-chaos).
global:
  scrape_interval: {INTERVAL_S}s
  scrape_timeout: {INTERVAL_S}s
  evaluation_interval: {INTERVAL_S}s
rule_files:{files}
alerting:
  alertmanagers:
    - static_configs:
        - targets: ["127.0.0.1:{layout.alertmanager_port}"]
scrape_configs:
  - job_name: slurm-chaos
    static_configs:
      - targets: ["127.0.0.1:{layout.exporter_port}"]
"""
    if node_targets:
        targets = ", ".join(f'"{t}"' for t in node_targets)
        text += f"""  # Each node's node_exporter on the node's own address: `instance` names its NodeAddr.
  - job_name: {NODE_JOB}
    scrape_interval: {NODE_INTERVAL_S}s
    scrape_timeout: {INTERVAL_S}s
    static_configs:
      - targets: [{targets}]
"""
    return text


def node_exporter(layout: Layout, i: int, slurmd: int | None = None) -> Service:
    """Node `i`'s node_exporter, started in the namespaces of its slurmd `slurmd` (None: not started)."""
    node = layout.node_name(i)
    textfiles = textfile_dir(layout, node)
    return Service(
        f"node_exporter {node}",
        (
            str(NODE_EXPORTER),
            f"--web.listen-address={node_target(layout, i)}",
            f"--collector.textfile.directory={textfiles}",
            f"--path.procfs={procfs_view(layout)}",
            "--collector.disable-defaults",
            *(f"--collector.{c}" for c in NODE_COLLECTORS),
            f"--collector.filesystem.fs-types-exclude={NODE_FS_TYPES_EXCLUDE}",
            "--web.disable-exporter-metrics",
            "--log.level=warn",
        ),
        layout.run_dir / f"node_exporter.{node}.pid",
        layout.log_dir / f"node_exporter.{node}.log",
        f"http://{node_target(layout, i)}/metrics",
        f"--collector.textfile.directory={textfiles}",
        node_pid=slurmd,
    )


def node_exporters(layout: Layout, slurmds: Mapping[str, int] | None = None) -> list[Service]:
    """Every node's node_exporter; `slurmds`: the PIDs of the nodes' running slurmds, to start them."""
    pids = slurmds or {}
    return [node_exporter(layout, i, pids.get(n)) for i, n in enumerate(layout.node_names(), start=1)]


def services(layout: Layout, slurmds: Mapping[str, int] | None = None) -> list[Service]:
    """Alertmanager first: Prometheus sends alerts to it from its first evaluation; the nodes'
    node_exporters before Prometheus, which scrapes them (`slurmds`: see `node_exporters`)."""
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
        *node_exporters(layout, slurmds),
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


def _write(path: Path, text: str) -> bool:
    """Write `text` to `path` unless it holds it already; True if it changed."""
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            return False
    path.write_text(text)
    return True


def write_procfs_view(view: Path, proc: Path = Path("/proc")) -> None:
    """A link to every entry of `proc` but the PID directories (``/proc/1`` above all): ``self``,
    ``mounts`` and ``net`` then resolve in the reading process, in its own namespaces."""
    view.mkdir(parents=True, exist_ok=True)
    for entry in proc.iterdir():
        link = view / entry.name
        if entry.name.isdigit() or link.is_symlink():
            continue
        link.symlink_to(entry)


def write_configs(layout: Layout) -> bool:
    """Write the daemons' configs; True if one Prometheus reads changed (a running one reloads)."""
    mon = monitoring_dir(layout)
    mon.mkdir(parents=True, exist_ok=True)
    alerts = shipped("site_configs") / "alerts"
    rules = [mon / RULES_NAME, mon / SITE_NODE_RULES_NAME]
    changed = [_write(r, (alerts / r.name).read_text()) for r in rules]
    shutil.copyfile(alerts / "alertmanager.yml", mon / "alertmanager.yml")
    targets: list[str] = []
    if NODE_EXPORTER.exists():
        targets = [node_target(layout, i) for i in range(1, layout.nodes + 1)]
        write_procfs_view(procfs_view(layout))
        for node in layout.node_names():
            textfile_dir(layout, node).mkdir(parents=True, exist_ok=True)
    changed.append(_write(mon / "prometheus.yml", prometheus_config(layout, rules, targets)))
    for d in (sandbox_heartbeat_dir(layout), layout.root / "health"):
        # Root's alone: the prolog gives each job a directory of its own in the heartbeat directory.
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
    return any(changed)


#: Our daemons' own addresses (loopback, the nodes' namespaces) are never reached through a proxy.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _ready(url: str) -> bool:
    try:
        with _DIRECT.open(url, timeout=2) as resp:
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
            svc.command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True
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


def _to_start(layout: Layout, slurmds: Mapping[str, int] | None) -> list[Service]:
    """The daemons to start: the nodes' node_exporters only where `slurmds` names the node's slurmd
    (none at all if it is None) and node_exporter is installed."""
    nodes = {svc.label for svc in node_exporters(layout)}
    out = []
    for svc in services(layout, slurmds):
        if svc.label not in nodes:
            out.append(svc)
        elif slurmds is not None and NODE_EXPORTER.exists():
            if svc.node_pid is None:
                log.warning("%s not started: the node's slurmd is not running", svc.label)
            else:
                out.append(svc)
    return out


def _reload(pid: int) -> None:
    """A running Prometheus reads its config and rules again (a sandbox up before they changed)."""
    os.kill(pid, signal.SIGHUP)
    log.info("prometheus (pid %d) reloads its config", pid)


def start_monitoring(layout: Layout, slurmds: Mapping[str, int] | None = None) -> None:
    """Start whichever of Alertmanager, the exporter, the nodes' node_exporters and Prometheus is not
    running; wait until ready. `slurmds`: the PID of each node's running slurmd, in whose namespaces
    its node_exporter runs (one running in another slurmd's is started again); None leaves the
    node_exporters as they are. Without node_exporter installed the sandbox runs without them."""
    for binary in (PROMETHEUS, ALERTMANAGER):
        if not binary.exists():
            raise ChaosError(
                f"{binary} is missing: install the Debian packages prometheus and prometheus-alertmanager"
            )
    if slurmds is not None and not NODE_EXPORTER.exists():
        log.warning(
            "%s is missing: the sandbox runs without a node_exporter per node, and the site's node "
            "alerts (%s) stay silent; install the Debian package prometheus-node-exporter",
            NODE_EXPORTER,
            SITE_NODE_RULES_NAME,
        )
    reload = write_configs(layout)
    started: list[Service] = []
    try:
        for svc in _to_start(layout, slurmds):
            pid = svc.pid()
            if pid is not None and svc.in_place(pid):
                if svc.label == "prometheus" and reload:
                    _reload(pid)
                continue
            if pid is not None:
                log.info("%s (pid %d) runs in namespaces its node left: started again", svc.label, pid)
                _stop(svc)
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


def monitoring_status(layout: Layout) -> dict[str, int | str | None]:
    """Each monitoring daemon's PID, None when it is not running, "not installed" for node_exporter
    where the package is missing."""
    absent = set() if NODE_EXPORTER.exists() else {svc.label for svc in node_exporters(layout)}
    out: dict[str, int | str | None] = {}
    for svc in services(layout):
        pid = svc.pid()
        out[svc.label] = "not installed" if pid is None and svc.label in absent else pid
    return out
