"""A job's reports about itself never drain a node on their own (issue #27, finding 3), on the sandbox.

A user's job writes heartbeats that lie (a failed checkpoint, one rank a hundred times slower, the
probe's NUMA flag) into its own heartbeat directory and runs two ranks on one CPU (`taskset -c 0`);
then the health check runs on the node as slurmd runs it. For chaosno, on no allowlist, that is an
alert (WARNING, saying why), and the node's state is as before, during the job and after it. For
chaosok, whom the site's policy allows (the maintenance demo's experiments run as such a user),
the same findings still drain, and the check resumes the node once the job is gone.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sandbox_cli import reinstall_plugin

from slurm_chaos.observe.healthcheck import REASON_PREFIX, install_healthcheck
from slurm_chaos.runner import SubprocessRunner
from slurm_chaos.sandbox import daemons, monitoring
from slurm_chaos.sandbox.layout import Layout, site_placeholders
from slurm_chaos.site import load_site
from slurm_chaos.slurm.parse import parse_scontrol_nodes

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
RUN = SubprocessRunner()
NODE = "node2"
STATUS_WORDS = ("OK", "WARNING", "CRITICAL", "UNKNOWN")
USER_PY = "/usr/bin/python3"

# Run as the job's user (stdlib only): every 2 s for `seconds`, two ranks' heartbeats on this node in
# the job's own directory, rank 0 with a failed checkpoint and the NUMA flag, rank 1 100x slower.
FORGER = r"""
import json, os, sys, time
base, seconds = sys.argv[1], float(sys.argv[2])
job, node = os.environ["SLURM_JOB_ID"], os.environ["SLURMD_NODENAME"]
own = os.path.join(base, node, job)
end = time.time() + seconds
while time.time() < end:
    for rank, compute in ((0, 0.05), (1, 5.0)):
        beat = {"job_id": job, "rank": rank, "host": node, "time": time.time(), "step": 100,
                "window": 20, "step_time": compute + 0.01, "compute_time": compute,
                "comm_time": 0.01, "world_size": 2, "checkpoint_failures": 1 - rank,
                "numa_mismatch": rank == 0}
        tmp = os.path.join(own, f".{job}.{rank}.tmp")
        with open(tmp, "w") as f:
            json.dump(beat, f)
        os.replace(tmp, os.path.join(own, f"{job}.{rank}.json"))
    time.sleep(2)
"""


@dataclass
class Cluster:
    layout: Layout

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.layout.slurm_conf)}

    def node(self, name: str) -> Any:
        res = RUN(["scontrol", "-o", "show", "node", name], timeout=10, env=self.env)
        return parse_scontrol_nodes(res.stdout)[name]

    def state(self, name: str) -> tuple[bool, str]:
        info = self.node(name)
        return bool(info.drain), info.reason

    def health_check(self, name: str) -> str:
        """One pass of the node's health-check dispatcher, in the node's namespaces as slurmd runs it."""
        pid = daemons.read_pid(self.layout.run_dir / f"slurmd.{name}.pid")
        argv = ["nsenter", "-t", str(pid), "-n", "-u", "-m", str(self.layout.etc / "healthcheck")]
        res = RUN(argv, timeout=90)
        return res.stdout + res.stderr

    def job_state(self, job: str) -> str:
        res = RUN(["squeue", "-h", "-j", job, "-o", "%T"], timeout=10, env=self.env)
        return res.stdout.strip()

    def wait(self, what: str, ok: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
            time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster(sandbox: Any, chaos_site: Path) -> Iterator[Cluster]:
    layout = Layout.load(sandbox.name)
    assert layout is not None
    site = load_site(chaos_site, site_placeholders)
    # The site's policy decides whose findings drain: installed here, whatever an earlier module's
    # fixture put back or took away on leaving.
    reinstall_plugin(sandbox, chaos_site)
    install_healthcheck(layout.etc, site)
    yield Cluster(layout)


def _submit(cluster: Cluster, user: Any, seconds: int) -> str:
    """The forging job on NODE as `user`: heartbeats for `seconds`, and two ranks bound to CPU 0."""
    heartbeats = monitoring.sandbox_heartbeat_dir(cluster.layout)
    forger = user.home / "forge_heartbeats.py"
    forger.write_text(FORGER)
    script = user.home / f"forge-{uuid.uuid4().hex[:8]}.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"{USER_PY} {forger} {heartbeats} {seconds} &\n"
        f"srun -n2 taskset -c 0 sleep {seconds}\n"
        "wait\n"
    )
    os.chown(script, user.uid, user.gid)
    argv = ["sbatch", "--parsable", "-D", str(user.home), "-o", f"{script}.out"]
    argv += ["-N1", "-n2", f"-w{NODE}", "--exclusive", f"--reservation={cluster.layout.reservation}"]
    res = RUN(user.argv(*argv, str(script), env={**cluster.env, "PATH": os.environ["PATH"]}), timeout=30)
    assert res.ok, res.stderr
    return res.stdout.strip().split(";")[0]


class Findings:
    """Health-check passes on NODE until one shows the job's three findings; the last pass's report
    is kept."""

    def __init__(self, cluster: Cluster, job: str) -> None:
        self.cluster, self.report = cluster, ""
        self.wanted = {
            "straggler": f"job {job} rank 1 computes",
            "checkpoint": f"job {job} rank 0: 1 checkpoint write(s) failed",
            "numa": f"job {job}: 2 ranks squeezed onto CPUs 0",
        }

    def lines(self) -> dict[str, str]:
        """The report's line of each finding's check, where it shows the finding."""
        out = {}
        for line in self.report.splitlines():
            word, _, rest = line.strip().partition(" ")
            for check, text in self.wanted.items():
                if word in STATUS_WORDS and rest.lstrip().startswith(f"{check}: ") and text in rest:
                    out[check] = word
        return out

    def seen(self) -> bool:
        self.report = self.cluster.health_check(NODE)
        return len(self.lines()) == len(self.wanted)

    def wait(self) -> None:
        try:
            self.cluster.wait("the forged findings seen", self.seen, 60)
        finally:
            print(f"\n{self.report}")


def _end(cluster: Cluster, job: str) -> None:
    RUN(["scancel", job], timeout=30, env=cluster.env)
    cluster.wait(f"job {job} gone", lambda: cluster.job_state(job) in ("", "COMPLETED", "CANCELLED"), 90)


def test_a_users_forged_heartbeats_and_binding_alert_but_never_drain(
    cluster: Cluster, sandbox_users: dict[str, Any]
) -> None:
    user = sandbox_users["chaosno"]
    before = {n: cluster.state(n) for n in cluster.layout.node_names()}
    assert not before[NODE][0], f"{NODE} is drained before the test: {before[NODE]}"
    job = _submit(cluster, user, 90)
    try:
        cluster.wait("the job runs", lambda: cluster.job_state(job) == "RUNNING", 60)
        findings = Findings(cluster, job)
        findings.wait()
        assert cluster.state(NODE) == before[NODE], findings.report
        # An alert that says why, not a failure: a WARNING per finding, and no drain.
        assert findings.lines() == dict.fromkeys(findings.wanted, "WARNING"), findings.report
        assert "alert only, no drain" in findings.report, findings.report
        assert "not in allow_users" in findings.report, findings.report
        assert "action: none" in findings.report, findings.report
    finally:
        _end(cluster, job)
    cluster.health_check(NODE)
    assert {n: cluster.state(n) for n in cluster.layout.node_names()} == before


def test_a_policy_allowed_users_findings_still_drain_until_the_job_ends(
    cluster: Cluster, sandbox_users: dict[str, Any]
) -> None:
    """The maintenance demo's way of detecting: an allowed user's job is drained on its findings."""
    user = sandbox_users["chaosok"]
    record = cluster.layout.root / "health" / f"{NODE}.drained"
    record.unlink(missing_ok=True)  # no earlier drain counts against this one
    job = _submit(cluster, user, 90)
    try:
        cluster.wait("the job runs", lambda: cluster.job_state(job) == "RUNNING", 60)
        findings = Findings(cluster, job)
        findings.wait()
        assert findings.lines() == dict.fromkeys(findings.wanted, "CRITICAL"), findings.report
        drained, reason = cluster.state(NODE)
        assert drained and reason.startswith(REASON_PREFIX) and f"job {job}" in reason, reason
        # The rate limit's record of it: root's alone (a user who could write it could lift the limit).
        st = record.stat()
        assert st.st_uid == 0 and not st.st_mode & 0o022, oct(st.st_mode)
    finally:
        _end(cluster, job)

    def resumed() -> bool:
        cluster.health_check(NODE)
        return not cluster.state(NODE)[0]

    cluster.wait(f"{NODE} resumed", resumed, 90)
