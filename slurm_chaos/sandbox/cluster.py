"""Bring a named sandbox cluster up, report on it, and take it down again."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import jinja2

from slurm_chaos.errors import ChaosError, UsageError
from slurm_chaos.faults import jobfs
from slurm_chaos.runner import Runner, SubprocessRunner
from slurm_chaos.sandbox import daemons
from slurm_chaos.sandbox.cgroups import SandboxCgroups, hierarchies, node_argv, symlinks
from slurm_chaos.sandbox.layout import MAX_NODES, Layout, check_name, sandboxes_root, used_indices
from slurm_chaos.sandbox.packages import ensure_packages

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).parent / "templates"
# Only reachable on 127.0.0.1 inside the sandbox; not a secret.
DB_PASSWORD = "slurm-chaos-sandbox"  # noqa: S105
HOOK_TIMEOUT_S = 60
# sinfo shows nodes of an active reservation as "reserved" (or "maint"); they are up all the same.
UP_STATES = ("idle", "reserved", "maint", "mixed", "allocated", "completing")


@dataclass(frozen=True)
class Daemon:
    """One daemon of the sandbox and how to recognise it as ours."""

    label: str
    program: str
    pidfile: Path
    arg: str | None = None
    conf_marker: bool = False


def _render(name: str, **ctx: object) -> str:
    env = jinja2.Environment(  # noqa: S701 - renders config files, not HTML
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    return env.get_template(name).render(**ctx)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


HOOK_NOTES = {
    "prolog": "A failing hook is reported but never drains the node by itself.",
    "epilog": "A failing hook is reported but never drains the node by itself.",
    "healthcheck": "Health checks drain nodes themselves (scontrol), so the exit code is not used.",
}


def _write_dispatcher(etc: Path, kind: str) -> None:
    """etc/<kind>: runs every executable in etc/<kind>.d in name order, each bounded in time."""
    (etc / f"{kind}.d").mkdir(exist_ok=True)
    text = _render(
        "dispatcher.sh.j2",
        kind=kind,
        dir=etc / f"{kind}.d",
        timeout=HOOK_TIMEOUT_S,
        failure_note=HOOK_NOTES[kind],
        propagate=False,
    )
    tmp = etc / f".{kind}.tmp"
    _write(tmp, text, 0o755)
    tmp.replace(etc / kind)  # slurmd may run it at any moment: never a half-written file


def slurm_version(runner: Runner) -> tuple[int, int]:
    res = runner(["slurmctld", "-V"], timeout=10)
    try:
        major, minor = res.stdout.split()[1].split(".")[:2]
        return int(major), int(minor)
    except (IndexError, ValueError) as exc:
        raise ChaosError(
            f"cannot tell the Slurm version from 'slurmctld -V': {res.stdout or res.stderr}"
        ) from exc


class Sandbox:
    """Operations on one named sandbox; every command goes through `runner`."""

    def __init__(self, name: str, runner: Runner | None = None) -> None:
        self.name = check_name(name)
        self.runner: Runner = runner or SubprocessRunner()

    # ---------------------------------------------------------------- layout
    @contextlib.contextmanager
    def _registry_lock(self) -> Iterator[None]:
        root = sandboxes_root()
        root.mkdir(parents=True, exist_ok=True)
        with open(root / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _allocate(self, nodes: int, cgroups: bool, switches: int = 0) -> Layout:
        host = socket.gethostname().split(".")[0]
        with self._registry_lock():
            existing = Layout.load(self.name)
            if existing is not None:
                shape = (existing.nodes, existing.cgroups, existing.leaf_switches)
                if shape != (nodes, cgroups, switches) and self._ctld_alive(existing):
                    raise UsageError(
                        f"sandbox {self.name!r} is up with {existing.nodes} nodes, "
                        f"{len(existing.switches())} leaf switches, cgroups "
                        f"{'on' if existing.cgroups else 'off'}; "
                        f"'sandbox down --name {self.name}' first to change them"
                    )
                layout = Layout(self.name, existing.index, nodes, host, cgroups, switches)
            else:
                taken = used_indices() | self._subnets_in_use()
                index = next((i for i in range(1, 250) if i not in taken), None)
                if index is None:
                    raise ChaosError("no free sandbox index (subnets 10.251.1-249 all in use)")
                layout = Layout(self.name, index, nodes, host, cgroups, switches)
            layout.save()
            return layout

    def _subnets_in_use(self) -> set[int]:
        res = self.runner(["ip", "-o", "-4", "addr", "show"], timeout=10)
        used = set()
        for line in res.stdout.splitlines():
            for word in line.split():
                if word.startswith("10.251."):
                    with contextlib.suppress(ValueError, IndexError):
                        used.add(int(word.split(".")[2]))
        return used

    def layout(self) -> Layout:
        layout = Layout.load(self.name)
        if layout is None:
            raise UsageError(
                f"no sandbox named {self.name!r} (run 'slurm-chaos sandbox up --name {self.name}')"
            )
        return layout

    # ---------------------------------------------------------------- daemons
    def daemons(self, layout: Layout) -> list[Daemon]:
        run = layout.run_dir
        out = [
            Daemon("mariadbd", "mariadbd", run / "mariadbd.pid", arg=f"--datadir={layout.root}/db/data"),
            Daemon("slurmdbd", "slurmdbd", run / "slurmdbd.pid", conf_marker=True),
            Daemon("slurmctld", "slurmctld", run / "slurmctld.pid", conf_marker=True),
        ]
        out += [
            Daemon(f"slurmd {n}", "slurmd", layout.slurmd_pidfile(n), arg=n, conf_marker=True)
            for n in layout.node_names()
        ]
        return out

    def _is_ours(self, layout: Layout, d: Daemon) -> bool:
        marker = ("SLURM_CONF", str(layout.slurm_conf)) if d.conf_marker else None
        return daemons.is_ours(daemons.read_pid(d.pidfile), d.program, marker=marker, arg=d.arg)

    def slurmd_pids(self, layout: Layout) -> dict[str, int]:
        """The PID of each node's slurmd that runs and is ours: the process in the node's namespaces."""
        out = {}
        for node, d in zip(layout.node_names(), self.daemons(layout)[3:], strict=True):
            pid = daemons.read_pid(d.pidfile)
            if pid is not None and self._is_ours(layout, d):
                out[node] = pid
        return out

    def _ctld_alive(self, layout: Layout) -> bool:
        return self._is_ours(layout, self.daemons(layout)[2])

    def _slurm_env(self, layout: Layout) -> dict[str, str]:
        return {"SLURM_CONF": str(layout.slurm_conf)}

    # ---------------------------------------------------------------- up
    def up(
        self,
        nodes: int = 4,
        install: bool = True,
        health_interval: int | None = None,
        monitoring: bool = True,
        cgroups: bool | None = None,
        switches: int = 0,
        health: str | None = None,
    ) -> Layout:
        """Start whatever of the sandbox is not running yet and wait until every node is idle.

        `switches`: leaf switches under the spine (nodes split evenly between them in order);
        0, two nodes per leaf.

        `cgroups` (default: on unless $SLURM_CHAOS_SANDBOX_CGROUPS is 0): Slurm's cgroup plugins,
        each node in a cgroup subtree of its own; off: proctrack/linuxproc and no task plugin.

        `health`: what the nodes' HealthCheckProgram runs, "slurm-chaos" (the hook dispatcher:
        slurm-chaos's health check) or "nhc" (LBNL NHC, see sandbox/nhc.py); None: as the sandbox
        has it (slurm-chaos for a new one). A running sandbox switches at once, without a restart.
        """
        if os.geteuid() != 0:
            raise UsageError(
                "'sandbox up' must run as root (it creates network namespaces and starts daemons)"
            )
        if not 1 <= nodes <= MAX_NODES:
            raise UsageError(f"--nodes {nodes}: expected 1..{MAX_NODES}")
        if not 0 <= switches <= nodes:
            raise UsageError(f"--switches {switches}: expected 1..{nodes} (the number of nodes)")
        from slurm_chaos.sandbox.nhc import HEALTH_MODES

        if health is not None and health not in HEALTH_MODES:
            raise UsageError(f"--health {health}: expected one of {', '.join(HEALTH_MODES)}")
        t0 = time.monotonic()
        if install:
            ensure_packages(self.runner)
        if cgroups is None:
            cgroups = os.environ.get("SLURM_CHAOS_SANDBOX_CGROUPS", "1") != "0"
        layout = self._allocate(nodes, cgroups, switches)
        fresh = not self._ctld_alive(layout)
        if fresh:
            self._rotate_logs(layout)
            # Every node runs the health check each interval; a site with many nodes lengthens it
            # too (at 64 nodes, one check a second on this machine's 2 cores, not 13).
            self._write_configs(layout, health_interval or max(5, nodes))
        if health is not None:
            self.set_health(layout, health)
        self._ensure_munge(layout)
        self._ensure_network(layout)
        self._ensure_mariadb(layout)
        self._ensure_slurmdbd(layout)
        self._ensure_slurmctld(layout)
        self._ensure_slurmds(layout)
        # slurmd registrations queue at the controller: about 0.5 s a node under load here.
        self._wait_idle(layout, timeout=max(60, nodes))
        self._ensure_reservation(layout)
        if monitoring:
            from slurm_chaos.sandbox.monitoring import start_monitoring

            start_monitoring(layout, self.slurmd_pids(layout))
        log.info("sandbox %s up: %d nodes idle in %.1f s", self.name, nodes, time.monotonic() - t0)
        return layout

    @staticmethod
    def _rotate_logs(layout: Layout) -> None:
        """A new controller's logs start empty; the last ones are kept in log.previous.

        A purged sandbox's new slurmctld starts job ids at 1 again: without this, a line about an
        earlier job N would read as one about the new job N.
        """
        logs = layout.log_dir
        if not logs.is_dir() or not any(logs.iterdir()):
            return
        previous = logs.with_name("log.previous")
        try:
            jobfs.remove_tree(previous)
        except (OSError, jobfs.JobFsError) as exc:
            log.warning("sandbox %s: %s not removed: %s", layout.name, previous, exc)
            return
        logs.rename(previous)

    def _write_configs(self, layout: Layout, health_interval: int) -> None:
        for sub in ("state", "spool", "log", "run", "tmp", "db", "shared", "etc"):
            (layout.root / sub).mkdir(parents=True, exist_ok=True)
        for n in layout.node_names():
            (layout.root / "spool" / n).mkdir(parents=True, exist_ok=True)
            (layout.root / "tmp" / n).mkdir(parents=True, exist_ok=True)
        features = [f"{layout.rack_of(n)},sw{layout.rack_of(n)[4:]},cpu,fast" for n in layout.node_names()]
        etc = layout.etc
        version = slurm_version(self.runner)
        _write(
            layout.slurm_conf,
            _render(
                "slurm.conf.j2", L=layout, features=features, health_interval=health_interval, version=version
            ),
        )
        _write(etc / "topology.conf", _render("topology.conf.j2", L=layout))
        # slurmdbd refuses a world-readable config holding the database password.
        _write(etc / "slurmdbd.conf", _render("slurmdbd.conf.j2", L=layout, db_password=DB_PASSWORD), 0o600)
        if layout.cgroups or version >= (23, 2):
            _write(etc / "cgroup.conf", _render("cgroup.conf.j2", cgroups=layout.cgroups, version=version))
        else:
            (etc / "cgroup.conf").unlink(missing_ok=True)
        _write(etc / "hosts", _render("hosts.j2", L=layout))
        for kind in HOOK_NOTES:
            _write_dispatcher(etc, kind)
        plugstack = etc / "plugstack.conf"
        if not plugstack.exists():
            _write(plugstack, "# SPANK plugins: see 'slurm-chaos plugin install'\n")
        # slurmctld does not start without the script JobSubmitPlugins=lua names. Until
        # `plugin install` writes the policy beside it, it refuses every --chaos.
        from slurm_chaos.faults.plugin_install import JOB_SUBMIT_LUA, render_job_submit
        from slurm_chaos.faults.policy import POLICY_NAME

        _write(etc / JOB_SUBMIT_LUA, render_job_submit(etc / POLICY_NAME))

    def set_health(self, layout: Layout, mode: str) -> None:
        """Make the nodes' HealthCheckProgram run `mode`'s health check ("slurm-chaos" or "nhc").

        slurmd runs etc/healthcheck afresh every interval, so the switch takes effect at the next
        check without a restart. Nodes NHC drained stay drained until NHC (or someone) resumes them.
        """
        from slurm_chaos.sandbox.nhc import write_nhc_wrapper

        if mode == "nhc":
            write_nhc_wrapper(layout)
        else:
            _write_dispatcher(layout.etc, "healthcheck")
        log.info("sandbox %s: HealthCheckProgram runs %s", self.name, mode)

    def _ensure_munge(self, layout: Layout) -> None:
        cred = self.runner(["munge", "-n"], timeout=10)
        if cred.ok and self.runner(["unmunge"], timeout=10, input=cred.stdout).ok:
            return
        key = Path("/etc/munge/munge.key")
        if not key.exists() or key.stat().st_size == 0:
            res = self.runner(["mungekey", "--create", f"--keyfile={key}"], timeout=30)
            if not res.ok:
                raise ChaosError(f"mungekey failed: {res.stderr.strip()}")
            shutil.chown(key, "munge", "munge")
            key.chmod(0o600)
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        res = self.runner(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], timeout=30)
        if not res.ok:
            raise ChaosError(f"munged did not start: {res.stderr.strip()}")
        pid = daemons.wait_for_pidfile(Path("/run/munge/munged.pid"), 5)
        if pid is None:
            raise ChaosError("munged did not write /run/munge/munged.pid")
        (layout.run_dir / "munged.pid").write_text(f"{pid}\n")

    def _ip(self, *args: str) -> None:
        res = self.runner(["ip", *args], timeout=20)
        if not res.ok:
            raise ChaosError(f"ip {' '.join(args)}: {res.stderr.strip()}")

    def _ensure_network(self, layout: Layout) -> None:
        if not self.runner(["ip", "link", "show", layout.bridge], timeout=10).ok:
            self._ip("link", "add", layout.bridge, "type", "bridge")
            self._ip("addr", "add", f"{layout.controller_addr}/24", "dev", layout.bridge)
            self._ip("link", "set", layout.bridge, "up")
        existing = set(self.runner(["ip", "netns", "list"], timeout=10).stdout.split())
        for i in range(1, layout.nodes + 1):
            ns = layout.netns(i)
            if ns in existing:
                continue
            self._ip("netns", "add", ns)
            # A veth of this name left by a `down` just before: the kernel removes it only once it
            # has destroyed the old namespace, which can take seconds after `ip netns del`.
            if self.runner(["ip", "link", "show", layout.veth(i)], timeout=10).ok:
                self.runner(["ip", "link", "del", layout.veth(i)], timeout=20)
            self._ip("link", "add", layout.veth(i), "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._ip("link", "set", layout.veth(i), "master", layout.bridge, "up")
            self._ip("-n", ns, "addr", "add", f"{layout.node_addr(i)}/24", "dev", "eth0")
            self._ip("-n", ns, "link", "set", "eth0", "up")
            self._ip("-n", ns, "link", "set", "lo", "up")

    def _mariadb(self, layout: Layout, sql: str) -> bool:
        sock = layout.root / "db" / "mysqld.sock"
        res = self.runner(["mariadb", "--no-defaults", f"--socket={sock}", "-uroot", "-e", sql], timeout=10)
        return res.ok

    def _ensure_mariadb(self, layout: Layout) -> None:
        d = self.daemons(layout)[0]
        if self._is_ours(layout, d):
            return
        data = layout.root / "db" / "data"
        if not (data / "mysql").is_dir():
            res = self.runner(
                [
                    "mariadb-install-db",
                    "--no-defaults",
                    "--user=root",
                    f"--datadir={data}",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ],
                timeout=120,
            )
            if not res.ok:
                raise ChaosError(f"mariadb-install-db failed: {res.stderr.strip()[-500:]}")
        argv = [
            "mariadbd",
            "--no-defaults",
            "--user=root",
            f"--datadir={data}",
            f"--socket={layout.root}/db/mysqld.sock",
            f"--port={layout.mariadb_port}",
            "--bind-address=127.0.0.1",
            f"--pid-file={d.pidfile}",
            f"--log-error={layout.log_dir}/mariadbd.err",
            "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=16M",
            "--performance-schema=OFF",
        ]
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while not self._mariadb(layout, "select 1"):
            if time.monotonic() > deadline:
                raise ChaosError(self._failure("mariadbd", layout.log_dir / "mariadbd.err"))
            time.sleep(0.2)
        # The database exists before slurmdbd first connects: slurmdbd 24.11 creating it itself with
        # MariaDB 11.8's client library (Debian 13) fails its next query ("5027 Number of columns in
        # result (=1) set execeeds maxmimum allowed number of columns (=0)") and exits.
        ok = self._mariadb(
            layout,
            f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}'; "
            f"CREATE DATABASE IF NOT EXISTS slurm_acct_db_{layout.index}; "
            f"GRANT ALL ON slurm_acct_db_{layout.index}.* TO 'slurm'@'127.0.0.1';",
        )
        if not ok:
            raise ChaosError("could not create the slurm database user in the sandbox's MariaDB")

    def _start_slurm_daemon(self, layout: Layout, d: Daemon, argv: list[str], log_file: Path) -> None:
        res = self.runner(argv, timeout=60, env=self._slurm_env(layout))
        pid = daemons.wait_for_pidfile(d.pidfile, 15) if res.ok else None
        if pid is None or not self._is_ours(layout, d):
            detail = res.stderr.strip()
            raise ChaosError(self._failure(d.label, log_file, detail))

    def _ensure_slurmdbd(self, layout: Layout) -> None:
        d = self.daemons(layout)[1]
        if not self._is_ours(layout, d):
            self._start_slurm_daemon(layout, d, ["slurmdbd"], layout.log_dir / "slurmdbd.log")
        env = self._slurm_env(layout)
        deadline = time.monotonic() + 30
        while True:
            res = self.runner(
                ["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"], timeout=10, env=env
            )
            if res.ok:
                break
            if time.monotonic() > deadline:
                raise ChaosError(
                    self._failure("slurmdbd", layout.log_dir / "slurmdbd.log", res.stderr.strip())
                )
            time.sleep(0.2)
        if layout.cluster_name not in res.stdout.split():
            add = self.runner(["sacctmgr", "-i", "add", "cluster", layout.cluster_name], timeout=30, env=env)
            if not add.ok:
                raise ChaosError(f"sacctmgr add cluster failed: {add.stderr.strip()}")

    def _ensure_slurmctld(self, layout: Layout) -> None:
        d = self.daemons(layout)[2]
        if self._is_ours(layout, d):
            return
        self._start_slurm_daemon(
            layout, d, ["slurmctld", "-f", str(layout.slurm_conf)], layout.log_dir / "slurmctld.log"
        )
        env = self._slurm_env(layout)
        deadline = time.monotonic() + 20
        while not self.runner(["scontrol", "ping"], timeout=10, env=env).stdout.count("UP"):
            if time.monotonic() > deadline:
                raise ChaosError(self._failure("slurmctld", layout.log_dir / "slurmctld.log"))
            time.sleep(0.2)

    def _ensure_slurmds(self, layout: Layout) -> None:
        hosts = layout.etc / "hosts"
        hs = hierarchies() if layout.cgroups else []
        links = symlinks() if layout.cgroups else []
        if layout.cgroups and not any(h.fstype == "cgroup" for h in hs):
            raise ChaosError(
                "the sandbox's cgroup mode needs cgroup v1 hierarchies under /sys/fs/cgroup (none here); "
                "bring it up with SLURM_CHAOS_SANDBOX_CGROUPS=0"
            )
        for i, (node, d) in enumerate(
            zip(layout.node_names(), self.daemons(layout)[3:], strict=True), start=1
        ):
            if self._is_ours(layout, d):
                continue
            # A node is a slurmd in our network namespace with its own hostname (UTS), its own
            # /etc/hosts (private mount namespace) and, in cgroup mode, its own cgroup subtree and
            # namespace; `ip netns exec` would remount /sys and break cgroups.
            procs = SandboxCgroups(layout.name).create_node(node, hs) if layout.cgroups else []
            shared = self._share_heartbeats(layout, node)
            argv = node_argv(layout.netns(i), node, hosts, layout.slurm_conf, procs, hs, links, shared)
            self._start_slurm_daemon(layout, d, argv, layout.log_dir / f"slurmd.{node}.log")

    def _share_heartbeats(self, layout: Layout, node: str) -> Path:
        """The node's heartbeat directory as a shared mount (bound on itself): the job's heartbeat
        tmpfs the node's prolog mounts in it is seen on the host too, where the exporter reads it
        (and not by the other nodes: each keeps only its own directory shared)."""
        from slurm_chaos.sandbox.monitoring import sandbox_heartbeat_dir

        path = sandbox_heartbeat_dir(layout) / node
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
        for d in (path.parent, path):
            d.chmod(0o755)
        if str(path) not in jobfs.mount_points():
            self._mount("--bind", str(path), str(path))
        self._mount("--make-shared", str(path))
        return path

    def _mount(self, *args: str) -> None:
        res = self.runner(["mount", *args], timeout=20)
        if not res.ok:
            raise ChaosError(f"mount {' '.join(args)}: {res.stderr.strip()}")

    def node_states(self, layout: Layout) -> dict[str, str]:
        res = self.runner(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10, env=self._slurm_env(layout))
        states = {}
        for line in res.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def _wait_idle(self, layout: Layout, timeout: float) -> None:
        env = self._slurm_env(layout)
        deadline = time.monotonic() + timeout
        resumed: set[str] = set()
        tty = sys.stderr.isatty()
        while True:
            states = self.node_states(layout)
            idle = [n for n, s in states.items() if s.rstrip("*~#$@+%!^-") in UP_STATES]
            if tty:
                print(
                    f"\rwaiting for nodes: {len(idle)}/{layout.nodes} up", end="", file=sys.stderr, flush=True
                )
            if len(idle) == layout.nodes:
                if tty:
                    print(file=sys.stderr)
                return
            for node, state in states.items():
                # A node left drained or down by an earlier session of this sandbox is ours to resume.
                if node not in resumed and state.rstrip("*") in ("drained", "down", "drain", "draining"):
                    self.runner(
                        ["scontrol", "update", f"nodename={node}", "state=resume"], timeout=10, env=env
                    )
                    resumed.add(node)
            if time.monotonic() > deadline:
                bad = sorted(set(layout.node_names()) - set(idle))
                first = bad[0] if bad else layout.node_names()[0]
                raise ChaosError(
                    self._failure(
                        f"nodes {', '.join(bad)} (states: {states})", layout.log_dir / f"slurmd.{first}.log"
                    )
                )
            time.sleep(0.2)

    def _ensure_reservation(self, layout: Layout) -> None:
        env = self._slurm_env(layout)
        show = self.runner(["scontrol", "-o", "show", "reservation", layout.reservation], timeout=10, env=env)
        if show.ok and f"ReservationName={layout.reservation}" in show.stdout:
            return
        res = self.runner(
            [
                "scontrol",
                "create",
                "reservation",
                f"ReservationName={layout.reservation}",
                "StartTime=now",
                "Duration=infinite",
                "Nodes=ALL",
                "Users=root",
                "Flags=IGNORE_JOBS",
            ],
            timeout=10,
            env=env,
        )
        if not res.ok:
            raise ChaosError(f"could not create reservation {layout.reservation}: {res.stderr.strip()}")

    def _failure(self, what: str, log_file: Path, detail: str = "") -> str:
        """A message naming the daemon that failed with the last error lines of its log."""
        lines: list[str] = []
        with contextlib.suppress(OSError):
            lines = log_file.read_text(errors="replace").splitlines()
        errors = [ln for ln in lines if "error" in ln.lower() or "fatal" in ln.lower()] or lines
        tail = "\n  ".join(errors[-5:])
        msg = f"{what} did not come up"
        if detail:
            msg += f": {detail}"
        return msg + (f"\n  {log_file}:\n  {tail}" if tail else f" (no log at {log_file})")

    # ---------------------------------------------------------------- down
    def down(self, purge: bool = True) -> list[str]:
        """Stop what this sandbox started (by PID), delete its namespaces and bridge; return what stopped."""
        layout = Layout.load(self.name)
        if layout is None:
            return []
        from slurm_chaos.sandbox.monitoring import stop_monitoring

        stopped: list[str] = stop_monitoring(layout)
        for d in reversed(self.daemons(layout)):
            pid = daemons.read_pid(d.pidfile)
            if pid is not None and self._is_ours(layout, d):
                daemons.terminate(pid)
                stopped.append(f"{d.label} (pid {pid})")
            d.pidfile.unlink(missing_ok=True)
        existing = set(self.runner(["ip", "netns", "list"], timeout=10).stdout.split())
        for i in range(1, layout.nodes + 1):
            ns = layout.netns(i)
            if ns not in existing:
                continue
            # Whatever still runs in our namespace (a stuck slurmstepd, job processes) is ours.
            pids = self.runner(["ip", "netns", "pids", ns], timeout=10).stdout.split()
            for p in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(p), 9)
                    stopped.append(f"process {p} in {ns}")
            self.runner(["ip", "netns", "del", ns], timeout=10)
        # Job processes that left the network namespace are still in the nodes' cgroups.
        stopped += SandboxCgroups(layout.name).remove()
        if self.runner(["ip", "link", "show", layout.bridge], timeout=10).ok:
            self.runner(["ip", "link", "del", layout.bridge], timeout=10)
        self._stop_munge_if_last(layout, stopped)
        from slurm_chaos.sandbox.monitoring import sandbox_heartbeat_dir

        # The jobs' heartbeat mounts the nodes made (seen here through the shared mount), then it.
        try:
            stopped += [f"mount {line}" for line in jobfs.detach(sandbox_heartbeat_dir(layout), self.runner)]
        except jobfs.JobFsError as exc:
            log.warning("sandbox %s: %s", self.name, exc)
        if purge:
            # Keep the logs for a post-mortem; everything else of the sandbox goes, the fault journals
            # too: a new slurmctld starts job ids at 1 again, and an old closed journal of job N would
            # refuse the new job N. Users' trees (a job's heartbeat directory, a home) may be
            # arbitrarily deep: removed without recursion.
            for sub in (
                "journal",
                "prefix",
                "state",
                "spool",
                "tmp",
                "db",
                "run",
                "etc",
                "shared",
                "monitoring",
                "heartbeat",
                "health",
                "nhc",
                "node-exporter",
            ):
                try:
                    jobfs.remove_tree(layout.root / sub)
                except (OSError, jobfs.JobFsError) as exc:
                    log.warning("sandbox %s: %s not removed: %s", self.name, layout.root / sub, exc)
            (layout.root / "sandbox.json").unlink(missing_ok=True)
        return stopped

    def _stop_munge_if_last(self, layout: Layout, stopped: list[str]) -> None:
        pidfile = layout.run_dir / "munged.pid"
        pid = daemons.read_pid(pidfile)
        if pid is None:
            return
        others = [
            other
            for other in (Layout.load(p.parent.name) for p in sandboxes_root().glob("*/sandbox.json"))
            if other is not None and other.name != layout.name and self._ctld_alive(other)
        ]
        if others:
            # Another sandbox still uses it; hand over responsibility for stopping it.
            shutil.copy(pidfile, others[0].run_dir / "munged.pid")
        elif daemons.is_ours(pid, "munged"):
            daemons.terminate(pid)
            stopped.append(f"munged (pid {pid})")
        pidfile.unlink(missing_ok=True)

    # ---------------------------------------------------------------- status
    def status(self) -> dict[str, object]:
        from slurm_chaos.sandbox.monitoring import monitoring_status
        from slurm_chaos.sandbox.nhc import health_mode

        layout = self.layout()
        procs = {}
        for d in self.daemons(layout):
            pid = daemons.read_pid(d.pidfile)
            procs[d.label] = pid if self._is_ours(layout, d) else None
        states = self.node_states(layout) if procs["slurmctld"] else {}
        return {
            "name": layout.name,
            "root": str(layout.root),
            "slurm_conf": str(layout.slurm_conf),
            "bridge": layout.bridge,
            "subnet": f"{layout.subnet}.0/24",
            "daemons": procs,
            # Not counted in `status`'s exit code: a sandbox may run without its monitoring.
            "monitoring": monitoring_status(layout),
            "nodes": {n: states.get(n, "unknown") for n in layout.node_names()},
            "switches": layout.switches(),
            "reservation": layout.reservation,
            "health": health_mode(layout),
        }

    def is_up(self) -> bool:
        layout = Layout.load(self.name)
        if layout is None:
            return False
        return all(self._is_ours(layout, d) for d in self.daemons(layout))

    # ---------------------------------------------------------------- node control
    def stop_node(self, node: str) -> int:
        """Stop one node's slurmd (node loss); returns the PID stopped."""
        layout = self.layout()
        d = next((x for x in self.daemons(layout) if x.label == f"slurmd {node}"), None)
        if d is None:
            raise UsageError(f"sandbox {self.name} has no node {node!r}")
        pid = daemons.read_pid(d.pidfile)
        if pid is None or not self._is_ours(layout, d):
            raise ChaosError(f"slurmd of {node} is not running")
        daemons.terminate(pid)
        return pid

    def start_nodes(self) -> None:
        """Start the slurmd of every node that is not running (after a node loss)."""
        self._ensure_slurmds(self.layout())
