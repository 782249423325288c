"""The observability loop on the real sandbox: health check drains and resumes, alerts fire and resolve.

A thread plays a running probe job by writing heartbeats (one rank straggling, then healthy again);
Slurm's HealthCheckProgram runs the installed check on each node (or, when the sandbox was brought up
without a HealthCheckInterval, this test runs the node's dispatcher in the node's namespaces as
slurmd would). Times to detect are printed (pytest -s) and bounded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

import slurm_chaos
from slurm_chaos.observe.healthcheck import REASON_PREFIX, install_healthcheck
from slurm_chaos.probe.heartbeat import Heartbeat, remove_job_dir
from slurm_chaos.runner import SubprocessRunner
from slurm_chaos.sandbox import daemons, monitoring
from slurm_chaos.sandbox.layout import Layout, site_placeholders
from slurm_chaos.site import Site, load_site
from slurm_chaos.slurm.parse import parse_scontrol_nodes

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
RUN = SubprocessRunner()


@dataclass
class Loop:
    """The sandbox with its health check installed and its monitoring running."""

    layout: Layout
    site: Site
    interval: int

    def node(self, name: str) -> Any:
        res = RUN(
            ["scontrol", "-o", "show", "node", name],
            timeout=10,
            env={"SLURM_CONF": str(self.layout.slurm_conf)},
        )
        return parse_scontrol_nodes(res.stdout)[name]

    def tick(self) -> None:
        """Without a HealthCheckInterval, run every node's health-check dispatcher as slurmd would."""
        if self.interval > 0:
            return
        for node in self.layout.node_names():
            pid = daemons.read_pid(self.layout.run_dir / f"slurmd.{node}.pid")
            argv = ["nsenter", "-t", str(pid), "-n", "-u", "-m", str(self.layout.etc / "healthcheck")]
            RUN(argv, timeout=60)

    def install(self, signals: tuple[str, ...]) -> None:
        site = replace(self.site, monitoring=replace(self.site.monitoring, healthcheck_signals=signals))
        install_healthcheck(self.layout.etc, site)

    def wait(self, what: str, ok: Callable[[], bool], timeout: float) -> float:
        t0 = time.monotonic()
        while not ok():
            assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout:g} s"
            self.tick()
            time.sleep(0.5)
        return time.monotonic() - t0


def _health_interval(slurm_conf: Path) -> int:
    m = re.search(r"^HealthCheckInterval=(\d+)", slurm_conf.read_text(), re.M)
    return int(m.group(1)) if m else 0


@pytest.fixture(scope="module")
def loop(sandbox: Any) -> Iterator[Loop]:
    layout = Layout.load(sandbox.name)
    assert layout is not None
    os.environ["SLURM_CHAOS_SANDBOX"] = sandbox.name
    site = load_site(REPO / "site_configs/sandbox.yaml", site_placeholders)
    already = any(svc.pid() is not None for svc in monitoring.services(layout))
    monitoring.start_monitoring(layout)
    lp = Loop(layout, site, _health_interval(layout.slurm_conf))
    lp.install(site.monitoring.healthcheck_signals)
    try:
        yield lp
    finally:
        lp.install(site.monitoring.healthcheck_signals)
        if not already:
            monitoring.stop_monitoring(layout)


class Job:
    """A fake probe job: its ranks write heartbeats every 0.2 s until stopped; one rank may straggle."""

    def __init__(self, directory: Path, job_id: str, hosts: list[str], slow_rank: int) -> None:
        self.beats = [Heartbeat(directory, job_id, r, h, world_size=len(hosts)) for r, h in enumerate(hosts)]
        self.slow_rank = slow_rank
        self.slow = True
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        step = 0
        while not self.stop.is_set():
            for hb in self.beats:
                compute = 0.120 if self.slow and hb.rank == self.slow_rank else 0.050
                hb.update(
                    step, 0.140 if self.slow else 0.070, compute, 0.140 - compute if self.slow else 0.020
                )
            step += 1
            time.sleep(0.2)

    def __enter__(self) -> Job:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        for hb in self.beats:
            hb.close()
            remove_job_dir(hb.directory.parent.parent, hb.host, hb.job_id)


def _drained_by_check(loop: Loop, node: str, check: str) -> bool:
    info = loop.node(node)
    return bool(info.drain and info.reason.startswith(f"{REASON_PREFIX} {check}:"))


def test_straggling_rank_drains_its_node_and_resumes_it_once_healthy(loop: Loop) -> None:
    heartbeats = monitoring.sandbox_heartbeat_dir(loop.layout)
    hosts = ["node1", "node2", "node3"]
    with Job(heartbeats, f"obs{os.getpid()}a", hosts, slow_rank=1) as job:
        detect = loop.wait("node2 drained", lambda: _drained_by_check(loop, "node2", "straggler"), 60)
        reason = loop.node("node2").reason
        assert "rank 1 computes 120.0 ms/step" in reason and "2.40x the median of 2 other rank(s)" in reason
        # Only the slow rank's node: its peers merely wait for it.
        assert not loop.node("node1").drain and not loop.node("node3").drain
        job.slow = False
        recover = loop.wait("node2 resumed", lambda: not loop.node("node2").drain, 60)
    print(
        f"\nhealth check (interval {loop.interval} s): straggler drained in {detect:.1f} s, "
        f"resumed {recover:.1f} s after it recovered"
    )
    assert detect < 3 * max(loop.interval, 2) + 10


def test_disabled_signal_does_not_drain(loop: Loop) -> None:
    signals = tuple(s for s in loop.site.monitoring.healthcheck_signals if s != "straggler")
    loop.install(signals)
    state = loop.layout.root / "health" / "node2.json"
    heartbeats = monitoring.sandbox_heartbeat_dir(loop.layout)
    job_id = f"obs{os.getpid()}b"
    with Job(heartbeats, job_id, ["node1", "node2"], slow_rank=1):
        t0 = time.time()

        def checked_twice_since() -> bool:
            data = json.loads(state.read_text())
            return bool(data["time"] > t0 + max(loop.interval, 2))

        loop.wait("two health checks on node2", checked_twice_since, 60)
        assert not loop.node("node2").drain
        checks_run = [r["check"] for r in json.loads(state.read_text())["results"]]
        assert "straggler" not in checks_run and "numa" in checks_run
        # Nor does it alert: the exporter leaves the signal out, as this set-up does not watch it.
        time.sleep(max(0.0, t0 + 15 - time.time()))
        assert not _firing(loop, "ChaosStraggler", job_id)
    loop.install(loop.site.monitoring.healthcheck_signals)


def _alerts(loop: Loop) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{loop.layout.alertmanager_port}/api/v2/alerts?active=true"
    with urllib.request.urlopen(url, timeout=5) as resp:
        data: list[dict[str, Any]] = json.loads(resp.read())
    return data


def _firing(loop: Loop, name: str, job_id: str) -> list[dict[str, Any]]:
    return [
        a
        for a in _alerts(loop)
        if a["labels"].get("alertname") == name and a["labels"].get("job_id") == job_id
    ]


def _prometheus(loop: Loop, path: str) -> Any:
    url = f"http://127.0.0.1:{loop.layout.prometheus_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())["data"]
    except OSError as exc:
        return f"{url}: {exc}"


def _alert_path(loop: Loop, job_id: str) -> str:
    """Where an alert that does not arrive got stuck: the exporter's series, the rule, the notifier."""
    query = urllib.parse.quote(f'slurm_chaos_probe_straggler_ratio{{job_id="{job_id}"}}')
    series = _prometheus(loop, f"/api/v1/query?query={query}")
    targets = _prometheus(loop, "/api/v1/targets")
    if isinstance(targets, dict):
        targets = [
            (t.get("health"), t.get("lastError"), t.get("lastScrapeDuration"))
            for t in targets.get("activeTargets", [])
        ]
    rules = _prometheus(loop, "/api/v1/rules?type=alert")
    if isinstance(rules, dict):
        rules = [
            (r["name"], r.get("state"), r.get("health"), r.get("lastError"), len(r.get("alerts", [])))
            for g in rules.get("groups", [])
            for r in g.get("rules", [])
            if r.get("name") == "ChaosStraggler"
        ]
    managers = _prometheus(loop, "/api/v1/alertmanagers")
    return f"series {series}; targets {targets}; rule {rules}; alertmanagers {managers}"


def test_prometheus_scrapes_the_exporter_and_the_straggler_alert_fires_and_resolves(loop: Loop) -> None:
    url = f"http://127.0.0.1:{loop.layout.prometheus_port}/api/v1/targets"
    with urllib.request.urlopen(url, timeout=5) as resp:
        targets = json.loads(resp.read())["data"]["activeTargets"]
    # Our exporter is the slurm-chaos job's one target (the node_exporters are the site's, job "node").
    ours = [t["scrapeUrl"] for t in targets if t["scrapePool"] == "slurm-chaos"]
    assert ours == [f"http://127.0.0.1:{loop.layout.exporter_port}/metrics"]
    heartbeats = monitoring.sandbox_heartbeat_dir(loop.layout)
    job_id = f"obs{os.getpid()}c"
    with Job(heartbeats, job_id, ["node3", "node4"], slow_rank=1) as job:
        try:
            fire = loop.wait(
                "ChaosStraggler in Alertmanager", lambda: bool(_firing(loop, "ChaosStraggler", job_id)), 60
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {_alert_path(loop, job_id)}") from None
        (alert,) = _firing(loop, "ChaosStraggler", job_id)
        assert alert["labels"]["rank"] == "1" and alert["labels"]["host"] == "node4"
        assert alert["labels"]["signal"] == "straggler"
        job.slow = False
        resolve = loop.wait(
            "ChaosStraggler resolved", lambda: not _firing(loop, "ChaosStraggler", job_id), 60
        )
        loop.wait("node4 resumed", lambda: not loop.node("node4").drain, 60)
    print(
        f"\nalert: ChaosStraggler in Alertmanager {fire:.1f} s after the rank slowed, "
        f"resolved {resolve:.1f} s after it recovered"
    )
    assert fire < 30


def test_rank_squeezed_onto_one_cpu_drains_its_node_until_the_job_ends(loop: Loop) -> None:
    """A real Slurm task bound to 1 of its node's 2 CPUs (as the numa-mismatch fault squeezes it)."""
    env = {"SLURM_CONF": str(loop.layout.slurm_conf)}
    argv = ["sbatch", "--parsable", "--nodes=1", "--nodelist=node3", "--exclusive", "--output=/dev/null"]
    argv += [f"--reservation={loop.layout.reservation}", "--wrap", "srun taskset -c 1 sleep 300"]
    res = RUN(argv, timeout=30, env=env)
    assert res.ok, res.stderr
    job_id = res.stdout.strip().split(";")[0]
    try:
        detect = loop.wait("node3 drained", lambda: _drained_by_check(loop, "node3", "numa"), 90)
        reason = loop.node("node3").reason
        assert f"job {job_id} rank 0 bound to 1 CPU(s) (1) of its share of 2" in reason
    finally:
        RUN(["scancel", job_id], timeout=30, env=env)
    recover = loop.wait("node3 resumed", lambda: not loop.node("node3").drain, 90)
    print(
        f"\nhealth check: squeezed task drained its node {detect:.1f} s after submission, "
        f"resumed {recover:.1f} s after the job was cancelled"
    )


# ---------------------------------------------------------------- forged health input (run as users)

# Run as an unprivileged user (stdlib only): heartbeats that lie, written wherever the user can.
FORGER = r"""
import json, os, sys
base, job, hosts, extra = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4:]
beats = [
    {"job_id": job, "rank": r, "host": h, "time": 1e12, "step": 100, "window": 20, "step_time": 0.6,
     "compute_time": 0.5 if r == 1 else 0.05, "comm_time": 0.01, "world_size": len(hosts)}
    for r, h in enumerate(hosts)
]
wrote = []
for d in [base, *(os.path.join(base, h, job) for h in hosts), *extra]:
    for b in beats:
        path = os.path.join(d, f"{job}.{b['rank']}.json")
        try:
            with open(path, "w") as f:
                json.dump(b, f)
            wrote.append(path)
        except OSError:
            pass
print("WROTE", len(wrote))
"""

USER_PY = "/usr/bin/python3"


def _state_time(loop: Loop, node: str) -> float:
    try:
        return float(json.loads((loop.layout.root / "health" / f"{node}.json").read_text())["time"])
    except (OSError, ValueError, KeyError):
        return 0.0


def _checked_twice(loop: Loop, nodes: list[str]) -> None:
    """Until every node's health check has run twice since now."""
    t0 = time.time() + max(loop.interval, 2)
    loop.wait(f"two health checks on {nodes}", lambda: all(_state_time(loop, n) > t0 for n in nodes), 60)


def _drained(loop: Loop, nodes: list[str]) -> dict[str, str]:
    """The nodes the health check drained, with its reasons."""
    infos = {n: loop.node(n) for n in nodes}
    return {n: i.reason for n, i in infos.items() if i.drain and i.reason.startswith(REASON_PREFIX)}


def _remove_and_resume(loop: Loop, paths: list[Path], nodes: list[str]) -> None:
    """Take the forged files away; wait until no node stays drained by the check (spoil no other test)."""
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    loop.wait("nodes resumed", lambda: not _drained(loop, nodes), 90)


def _forged(heartbeats: Path, job: str) -> list[Path]:
    return [*heartbeats.glob(f"{job}.*.json"), *heartbeats.glob(f"*/{job}")]


def test_forged_heartbeats_of_a_user_without_a_job_drain_nothing(
    loop: Loop, sandbox_users: dict[str, Any]
) -> None:
    user = sandbox_users["chaosno"]
    heartbeats = monitoring.sandbox_heartbeat_dir(loop.layout)
    job = f"9{os.getpid()}"
    nodes = loop.layout.node_names()
    try:
        res = RUN(user.argv(USER_PY, "-c", FORGER, str(heartbeats), job, "node1,node2,node3"), timeout=30)
        assert res.ok, res.stderr
        _checked_twice(loop, nodes)
        assert _drained(loop, nodes) == {}
    finally:
        _remove_and_resume(loop, _forged(heartbeats, job), nodes)


def _user_job(loop: Loop, user: Any, script: str, *sbatch: str) -> str:
    path = user.home / f"job-{uuid.uuid4().hex[:8]}.sh"
    path.write_text("#!/bin/sh\n" + script)
    os.chown(path, user.uid, user.gid)
    env = {"SLURM_CONF": str(loop.layout.slurm_conf), "SBATCH_RESERVATION": loop.layout.reservation}
    argv = ["sbatch", "--parsable", "-D", str(user.home), "-o", f"{path}.out", *sbatch, str(path)]
    res = RUN(user.argv(*argv, env={**env, "PATH": os.environ["PATH"]}), timeout=30)
    assert res.ok, res.stderr
    return res.stdout.strip().split(";")[0]


def _job_state(loop: Loop, job: str) -> str:
    res = RUN(
        ["squeue", "-h", "-j", job, "-o", "%T"], timeout=10, env={"SLURM_CONF": str(loop.layout.slurm_conf)}
    )
    return res.stdout.strip()


def test_a_jobs_heartbeats_lying_about_host_and_time_drain_nothing(
    loop: Loop, sandbox_users: dict[str, Any]
) -> None:
    """A user's own job on node1 claims ranks on node2 and node3 (one slow), timed in the far future."""
    user = sandbox_users["chaosno"]
    heartbeats = monitoring.sandbox_heartbeat_dir(loop.layout)
    forger = user.home / "forger.py"
    forger.write_text(FORGER)
    nodes = loop.layout.node_names()
    own = f'{heartbeats}/node1/"$SLURM_JOB_ID"'
    script = f'{USER_PY} {forger} {heartbeats} "$SLURM_JOB_ID" node1,node2,node3 {own}\n'
    job = _user_job(loop, user, script + "sleep 30\n", "-N1", "-w", "node1")
    try:
        loop.wait("the job runs", lambda: _job_state(loop, job) == "RUNNING", 60)
        _checked_twice(loop, nodes)
        assert _drained(loop, nodes) == {}
    finally:
        RUN(["scancel", job], timeout=30, env={"SLURM_CONF": str(loop.layout.slurm_conf)})
        _remove_and_resume(loop, _forged(heartbeats, job), nodes)


# Run as the victim's rank: real heartbeats through the package's own writer.
VICTIM = """
import os, sys, time
from slurm_chaos.probe.heartbeat import Heartbeat, remove_job_dir
hb = Heartbeat(sys.argv[1], os.environ["SLURM_JOB_ID"], 0, os.environ["SLURMD_NODENAME"], world_size=1)
for step in range(100):
    hb.update(step, 0.05, 0.04, 0.01)
    time.sleep(0.2)
hb.close()
"""


def _metrics(loop: Loop) -> tuple[int, str]:
    url = f"http://127.0.0.1:{loop.layout.exporter_port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _exported(loop: Loop, job: str, host: str) -> bool:
    """Whether the exporter shows rank 0 of `job` on `host`."""
    want = {f'job_id="{job}"', 'rank="0"', f'host="{host}"'}
    series = [line.split("{", 1) for line in _metrics(loop)[1].splitlines() if "{" in line]
    return any(
        name == "slurm_chaos_probe_last_step" and want <= set(rest.split("}")[0].split(","))
        for name, rest in series
    )


def test_another_users_squatting_does_not_silence_a_jobs_heartbeats(
    loop: Loop, sandbox_users: dict[str, Any]
) -> None:
    victim, squatter = sandbox_users["chaosok"], sandbox_users["chaosno"]
    heartbeats = monitoring.sandbox_heartbeat_dir(loop.layout)
    # The victim imports slurm-chaos as itself: from a copy in its home, since the checkout may sit
    # where only root can read (a clone in /root, mode 0700, as on a fresh machine).
    src = victim.home / "lib"
    shutil.copytree(
        Path(slurm_chaos.__file__).resolve().parent,
        src / "slurm_chaos",
        ignore=shutil.ignore_patterns("__pycache__"),
        dirs_exist_ok=True,
    )
    (victim.home / "victim.py").write_text(VICTIM)
    script = f"PYTHONPATH={src} {USER_PY} {victim.home / 'victim.py'} {heartbeats}\n"
    job = _user_job(loop, victim, script, "-N1", "-w", "node3", "--hold")
    env = {"SLURM_CONF": str(loop.layout.slurm_conf)}
    squat = [
        f"{heartbeats}/{job}.0.json",
        f"{heartbeats}/node3/{job}",
        f"{heartbeats}/node3/{job}/{job}.0.json",
    ]
    for path in squat:  # a directory where the rank's file (or the job's directory) goes
        RUN(squatter.argv("mkdir", path), timeout=10)
    try:
        assert RUN(["scontrol", "release", job], timeout=30, env=env).ok
        loop.wait("the victim's heartbeat exported", lambda: _exported(loop, job, "node3"), 60)
    finally:
        RUN(["scancel", job], timeout=30, env=env)
        _remove_and_resume(loop, [Path(p) for p in squat if Path(p).exists()], [])


def test_forged_task_environment_outside_any_job_drains_nothing(
    loop: Loop, sandbox_users: dict[str, Any]
) -> None:
    """A user's process on node2 that calls itself rank 0 of a job, squeezed onto one of two CPUs."""
    user = sandbox_users["chaosno"]
    pid = daemons.read_pid(loop.layout.run_dir / "slurmd.node2.pid")
    fake = {
        "SLURM_JOB_ID": "999999",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURMD_NODENAME": "node2",
        "SLURM_CPUS_PER_TASK": "2",
    }
    argv = [
        "nsenter",
        "-t",
        str(pid),
        "-n",
        "-u",
        "-m",
        "--",
        *user.argv("taskset", "-c", "0", "sleep", "120", env=fake),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    nodes = loop.layout.node_names()
    try:
        _checked_twice(loop, nodes)
        assert _drained(loop, nodes) == {}
    finally:
        for child in _descendants(proc.pid):
            os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait()
        _remove_and_resume(loop, [], nodes)


def _descendants(pid: int) -> list[int]:
    kids = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            kids.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(
                int(stat.parent.name)
            )
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def test_one_malformed_file_never_fails_the_exporters_scrape(loop: Loop) -> None:
    heartbeats = monitoring.sandbox_heartbeat_dir(loop.layout)
    bad = {"job_id": "7", "rank": 1e999, "host": "node4", "time": 0, "step": 0, "window": 1}
    job_dir = heartbeats / "node4" / "7"
    planted = [heartbeats / "7.0.json", job_dir / "7.0.json", loop.layout.root / "health" / "zz-bad.json"]
    job_dir.mkdir(parents=True, exist_ok=True)
    try:
        planted[0].write_text(json.dumps(bad).replace("Infinity", "1e999"))
        planted[1].write_text(planted[0].read_text())
        planted[2].write_text(json.dumps({"node": "zz", "time": "soon", "results": [{"check": "numa"}]}))
        status, text = _metrics(loop)
        assert status == 200, text[-500:]
        assert "slurm_chaos_signal_enabled" in text
    finally:
        for path in planted:
            path.unlink(missing_ok=True)
        shutil.rmtree(job_dir, ignore_errors=True)


def test_symlinks_in_the_checkpoint_directory_change_nothing_outside_it(
    loop: Loop, sandbox_users: dict[str, Any]
) -> None:
    """The health check's probe file: its name once was predictable, and root wrote through a symlink."""
    user = sandbox_users["chaosno"]
    checkpoints = Path(str(loop.site.checkpoint.path))
    victim = loop.layout.shared_dir / f"victim-{uuid.uuid4().hex[:6]}"
    victim.write_text("precious\n")
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    top = int(Path("/proc/sys/kernel/pid_max").read_text())
    pids = sorted({300 + (last + i - 300) % (top - 300) for i in range(1, 6000)})
    plant = (
        "import os, sys\n"
        "d, victim, pids = sys.argv[1], sys.argv[2], sys.argv[3:]\n"
        "for p in pids:\n"
        "    os.symlink(victim, os.path.join(d, f'.slurm-chaos-health.node2.{p}'))\n"
    )
    links = [checkpoints / f".slurm-chaos-health.node2.{p}" for p in pids]
    try:
        res = RUN(user.argv(USER_PY, "-c", plant, str(checkpoints), str(victim), *map(str, pids)), timeout=60)
        assert res.ok, res.stderr
        _checked_twice(loop, ["node2"])
        assert victim.read_text() == "precious\n"
        assert oct(victim.stat().st_mode & 0o7777) == "0o644" and victim.stat().st_uid == 0
    finally:
        for link in links:
            link.unlink(missing_ok=True)
        victim.unlink(missing_ok=True)


def _exporter_down_firing(loop: Loop) -> bool:
    return any(a["labels"].get("alertname") == "ChaosExporterDown" for a in _alerts(loop))


def test_exporter_down_fires_an_alert_and_resolves_once_back(loop: Loop) -> None:
    """Without its exporter every slurm-chaos alert is blind: that itself must alert."""
    (exporter,) = [svc for svc in monitoring.services(loop.layout) if svc.label == "exporter"]
    pid = exporter.pid()
    assert pid is not None
    daemons.terminate(pid)
    try:
        fire = loop.wait("ChaosExporterDown in Alertmanager", lambda: _exporter_down_firing(loop), 90)
    finally:
        monitoring.start_monitoring(loop.layout)
    resolve = loop.wait("ChaosExporterDown resolved", lambda: not _exporter_down_firing(loop), 90)
    print(
        f"\nalert: ChaosExporterDown {fire:.1f} s after the exporter stopped, resolved {resolve:.1f} s after"
    )
