"""The sandbox itself: nodes in their own namespaces, topology, and a clean `down`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from waiting import wait_until

from slurm_chaos.faults import node_proc
from slurm_chaos.sandbox import daemons
from slurm_chaos.sandbox.cluster import Sandbox
from slurm_chaos.sandbox.layout import Layout
from slurm_chaos.slurm.parse import parse_scontrol_config

pytestmark = pytest.mark.sandbox


def _slurm(env: dict[str, str], *argv: str) -> str:
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, check=True, timeout=30).stdout


def test_nodes_have_their_own_hostname_and_address(sandbox) -> None:  # type: ignore[no-untyped-def]
    out = _slurm(
        sandbox.env, "srun", "-N4", "--ntasks-per-node=1", "sh", "-c", 'echo "$(hostname) $(hostname -I)"'
    )
    seen = dict(line.split() for line in out.strip().splitlines())
    assert sorted(seen) == ["node1", "node2", "node3", "node4"]
    assert len(set(seen.values())) == 4
    assert all(addr.startswith("10.251.") for addr in seen.values())


def test_topology_has_two_leaf_switches(sandbox) -> None:  # type: ignore[no-untyped-def]
    out = _slurm(sandbox.env, "scontrol", "show", "topology")
    assert "SwitchName=sw1" in out and "Nodes=node1,node2" in out
    assert "SwitchName=sw2" in out and "Nodes=node3,node4" in out
    assert sandbox.switches == {"sw1": ["node1", "node2"], "sw2": ["node3", "node4"]}


def test_slots_for_hooks_and_plugins_are_configured(sandbox) -> None:  # type: ignore[no-untyped-def]
    # Read by the backend's own parser: 24.11 prints the scripts as Prolog[0], 22.05 as Prolog.
    cfg = parse_scontrol_config(_slurm(sandbox.env, "scontrol", "show", "config"))
    slots = {
        "HealthCheckProgram": cfg.health_check_program,
        "Prolog": cfg.prolog,
        "Epilog": cfg.epilog,
        "PlugStackConfig": cfg.plugstack_conf,
        "TopologyPlugin": cfg.topology_plugin,
    }
    assert all(slots.values()), slots
    res = _slurm(sandbox.env, "scontrol", "show", "reservation", sandbox.reservation)
    assert "Nodes=node[1-4]" in res


def test_sacct_sees_jobs_through_slurmdbd(sandbox) -> None:  # type: ignore[no-untyped-def]
    jid = _slurm(
        sandbox.env, "sbatch", "--parsable", "-N1", "-o", "/dev/null", "--wait", "--wrap", "true"
    ).strip()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        out = _slurm(sandbox.env, "sacct", "-n", "-X", "-P", "-j", jid, "-o", "JobID,State")
        if "COMPLETED" in out:
            break
        time.sleep(0.5)
    assert f"{jid}|COMPLETED" in out


def _job_tasks(job: str) -> dict[str, int]:
    """{node: pid} of the running tasks of step 0 of `job` (all sandbox nodes share one PID space)."""
    found = {}
    for pid in node_proc.pids():
        env = node_proc.environ(pid)
        if env.get("SLURM_JOB_ID") == job and env.get("SLURM_STEP_ID") == "0":
            if Path(node_proc.cmdline(pid)[0] if node_proc.cmdline(pid) else "").name == "sleep":
                found[env["SLURMD_NODENAME"]] = pid
    return found


def test_each_node_keeps_its_jobs_in_its_own_cgroup_subtree(sandbox) -> None:  # type: ignore[no-untyped-def]
    """Slurm's cgroup plugins: a multi-node job's /slurm/uid_0/job_J is each node's own, in every
    hierarchy Slurm manages, bound to the task's core; it is gone from every node after the job."""
    layout = Layout.load(sandbox.name)
    assert layout is not None
    if not layout.cgroups:
        pytest.skip("sandbox brought up without cgroups (SLURM_CHAOS_SANDBOX_CGROUPS=0)")
    job = _slurm(
        sandbox.env,
        "sbatch",
        "--parsable",
        "-N4",
        "--ntasks-per-node=1",
        "-o",
        "/dev/null",
        "--wrap",
        "srun sleep 60",
    ).strip()
    try:
        wait_until(lambda: len(_job_tasks(job)) == 4, timeout=30, interval=0.2)
        for node, pid in _job_tasks(job).items():
            # Seen from the host: below the node's subtree; from inside the node it is /slurm/...
            cg = dict(line.split(":", 2)[1:] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines())
            # Slurm's root is /slurm, or /slurm_<node> where it is built for several slurmds a host.
            pattern = (
                rf"/slurm-chaos-sandbox-{sandbox.name}/{node}/slurm(_{node})?/uid_0/job_{job}/step_0(/.*)?"
            )
            for hier in ("freezer", "cpuset", "memory"):
                assert re.fullmatch(pattern, cg[hier]), (node, hier, cg)
            allowed = Path(f"/proc/{pid}/status").read_text().split("Cpus_allowed_list:")[1].split()[0]
            assert allowed in ("0", "1"), (node, allowed)  # one core of the node's two
    finally:
        _slurm(sandbox.env, "scancel", job)
    tops = [
        Path("/sys/fs/cgroup", h, f"slurm-chaos-sandbox-{sandbox.name}")
        for h in ("freezer", "cpuset", "memory")
    ]
    wait_until(
        lambda: not any(list(t.glob(f"node*/slurm*/uid_0/job_{job}")) for t in tops), timeout=60, interval=0.2
    )


def test_second_sandbox_up_down_is_isolated_and_leaves_nothing(sandbox, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A second, differently named sandbox comes up beside the first, under 60 s, and goes without trace."""
    name = "iso" + str(os.getpid() % 1000)
    sb = Sandbox(name)
    t0 = time.monotonic()
    layout = sb.up(nodes=2, install=False)
    elapsed = time.monotonic() - t0
    print(f"sandbox {name} up in {elapsed:.1f} s")
    try:
        assert elapsed < 60
        first = Layout.load(sandbox.name)
        assert first is not None
        assert layout.bridge != first.bridge and layout.subnet != first.subnet
        assert layout.ctld_port != first.ctld_port
        out = _slurm({**os.environ, **layout.env()}, "srun", "-N2", "hostname")
        assert sorted(out.split()) == ["node1", "node2"]
        if layout.cgroups:  # Slurm's job cgroups of the second sandbox's nodes are theirs
            assert list(Path("/sys/fs/cgroup/freezer").glob(f"slurm-chaos-sandbox-{name}/node*/slurm*"))
        pids = [daemons.read_pid(d.pidfile) for d in sb.daemons(layout)]
    finally:
        sb.down()
    assert all(not daemons.alive(p) for p in pids)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert f"slurm-chaos-{name}-" not in netns
    links = subprocess.run(["ip", "link"], capture_output=True, text=True, check=True).stdout
    assert layout.bridge not in links
    assert not list(Path("/sys/fs/cgroup").glob(f"*/slurm-chaos-sandbox-{name}"))
    # The first sandbox is untouched.
    assert Sandbox(sandbox.name).is_up()


def test_unreachable_slurm_is_a_clear_error_within_10_s(sandbox, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    conf = tmp_path / "slurm.conf"
    text = sandbox.slurm_conf.read_text()
    port = next(ln for ln in text.splitlines() if ln.startswith("SlurmctldPort="))
    conf.write_text(text.replace(port, "SlurmctldPort=1"))
    for name in ("topology.conf", "cgroup.conf"):
        src = sandbox.slurm_conf.parent / name
        if src.exists():
            (tmp_path / name).write_text(src.read_text())
    site = tmp_path / "site.yaml"
    site.write_text(
        (Path(__file__).resolve().parents[1] / "data" / "sites" / "golden.yaml")
        .read_text()
        .replace("conf: /etc/slurm/slurm.conf", f"conf: {conf}")
    )
    t0 = time.monotonic()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_chaos",
            "run",
            "--site",
            str(site),
            "control-aa",
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.monotonic() - t0
    assert res.returncode == 3  # the tool failed: not a finding (1), not bad input (2)
    assert "Traceback" not in res.stderr
    assert str(conf) in res.stderr or "controller" in res.stderr.lower(), res.stderr
    assert elapsed < 10 + 3  # the interpreter's own start-up on a loaded 2-core machine
