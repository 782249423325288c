"""A switchback job's control channel and netem's qdisc on the real sandbox, tried by an unprivileged
user (chaosok, on the policy's allowlist): what a job can make root do through them is bounded, and
what is not the job's is left alone (#27, findings 8 and 9).

- A job writing on/off requests as fast as it can gets one switch per MIN_SWITCH_INTERVAL_S at
  most: counted as the job sees it (acknowledgements), as the kernel sees it (``tc monitor`` in the
  node's network namespace: every qdisc the agent adds or deletes) and as the agent logs it.
- An administrator's root qdisc, put on the job interface while such a job runs, survives the job's
  switches and its undo; the switches that fail on it are logged a bounded number of times.
- netem on a node the job shares is refused, though the policy says ``require_exclusive: false``.

The sandbox's kernel has no sch_netem: netem's rate limit is a tbf qdisc there (as in
test_faults_node.py), which is all these tests need. The hooks and the policy are test_faults_node's
(``cluster``: require_exclusive false, job_interface eth0, chaosok allowed). After each test the
node is as it was.
"""

from __future__ import annotations

import itertools
import re
import shutil
import statistics
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import test_faults_node
from test_faults_node import REPO, USER_PY, Cluster
from waiting import wait_until

from slurm_chaos.faults import agent
from slurm_chaos.faults.control import ChannelClient
from slurm_chaos.faults.node_net import qdisc_handle

if TYPE_CHECKING:
    from tests.conftest import SandboxUser

pytestmark = pytest.mark.sandbox

#: test_faults_node's hooks and policy, installed for this module too (and put back after it).
cluster = test_faults_node.cluster

NODE = "node1"
HAMMER_S = 4.0
SPEC = "netem:rate=1M,control=switchback"
ADMIN_QDISC = ["root", "handle", "1:", "tbf", "rate", "1000mbit", "burst", "128kb", "latency", "10ms"]

# Runs in the batch step as the job's user: on, off, on, ... as fast as Python writes them, then
# off (waited for). Prints every acknowledgement it saw and how long it hammered.
HAMMER = r"""
import os, sys, time
from pathlib import Path
from slurm_chaos.faults.control import ChannelClient, State
c = ChannelClient.find(Path(sys.argv[1]), os.environ["SLURMD_NODENAME"], os.environ["SLURM_JOB_ID"])
assert c is not None, "no control channel"
seen, n = {}, 0
t0 = time.time()
while time.time() < t0 + float(sys.argv[2]):
    n += 1
    c.request(State.ON if n % 2 else State.OFF)
    a = c.ack()
    if a is not None and a.epoch:
        seen[a.epoch] = (a.time, a.error)
hammered = time.time() - t0
last = c.wait(c.request(State.OFF), 2.0)
print(f"REQUESTS={n} HAMMERED_S={hammered:.3f} LAST={last}", flush=True)
for epoch, (t, err) in sorted(seen.items()):
    print(f"ACK epoch={epoch} time={t:.4f} error={err!r}", flush=True)
"""


@pytest.fixture(scope="module")
def userlib(cluster: Cluster) -> Iterator[Path]:
    """This checkout's package where the job's user can import it (a clone under /root is not)."""
    lib = cluster.shared / "userlib-rate"
    shutil.rmtree(lib, ignore_errors=True)
    shutil.copytree(REPO / "slurm_chaos", lib / "slurm_chaos", ignore=shutil.ignore_patterns("__pycache__"))
    for d in [lib, *(p for p in lib.rglob("*") if p.is_dir())]:
        d.chmod(0o755)
    (cluster.shared / "hammer.py").write_text(HAMMER)
    yield lib
    shutil.rmtree(lib, ignore_errors=True)


class TcMonitor:
    """``tc monitor`` in a node's network namespace: every qdisc change on it, as the kernel saw it."""

    def __init__(self, cluster: Cluster, node: str) -> None:
        argv = ["nsenter", "-t", str(cluster.slurmd_pid(node)), "-n", "--", "tc", "monitor"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def stop(self) -> str:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        return out


def hammer_job(cluster: Cluster, user: SandboxUser, userlib: Path) -> str:
    script = f"PYTHONPATH={userlib} {USER_PY} {cluster.shared}/hammer.py {cluster.journal_root} {HAMMER_S}\n"
    return cluster.submit(script, SPEC, "-N1", "-w", NODE, "--exclusive", user=user)


def acks(out: str) -> list[tuple[int, float, str]]:
    found = re.findall(r"ACK epoch=(\d+) time=([0-9.]+) error='(.*)'", out)
    return [(int(e), float(t), err) for e, t, err in found]


def log_mark(cluster: Cluster) -> int:
    """Where the agent's log ends now: job_log reads from here on."""
    return cluster.log_file.stat().st_size if cluster.log_file.exists() else 0


def job_log(cluster: Cluster, job: str, since: int) -> list[str]:
    """The agent's log lines about the job's channel on NODE, written after ``since`` (log_mark).

    The log outlives the sandbox's job ids (a sandbox brought up again starts them at 1 again), so
    a line about an earlier job of the same id may be there before the test.
    """
    if not cluster.log_file.exists():
        return []
    with cluster.log_file.open("rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return [line for line in text.splitlines() if f"/{NODE}/{job}.control" in line]


def test_a_job_hammering_its_control_channel_gets_one_switch_per_interval(
    cluster: Cluster,
    sandbox_users: dict[str, SandboxUser],
    userlib: Path,
) -> None:
    before = cluster.snapshot(NODE)
    mark = log_mark(cluster)
    monitor = TcMonitor(cluster, NODE)
    try:
        job = hammer_job(cluster, sandbox_users["chaosok"], userlib)
        cluster.wait_done(job, [NODE])
    finally:
        events = monitor.stop()
    out = cluster.output(job)
    m = re.search(r"REQUESTS=(\d+) HAMMERED_S=([0-9.]+) LAST=(.*)", out)
    assert m, out
    requests, hammered = int(m.group(1)), float(m.group(2))
    assert "state=<State.OFF: 'off'>" in m.group(3) and "error=''" in m.group(3), out
    most = hammered / agent.MIN_SWITCH_INTERVAL_S + 3
    seen = acks(out)
    # The job asked thousands of times; the agent answered at most 20 times a second, and still
    # answered (the channel works under the limit).
    assert requests > 10 * most and 10 <= len(seen) <= most, (requests, len(seen), most)
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(seen)]
    assert statistics.median(gaps) >= 0.8 * agent.MIN_SWITCH_INTERVAL_S, gaps
    # What root did on the node: one tc add or del per switch that changed the state.
    handle = qdisc_handle(job)
    changes = re.findall(rf"^(?:deleted )?qdisc tbf {handle} dev eth0 root", events, flags=re.M)
    assert 10 <= len(changes) <= most + 2, events  # + the apply's one add and delete (no sch_netem?)
    (summary,) = [line for line in job_log(cluster, job, mark) if "requests acted on" in line]
    acted = int(re.search(r"(\d+) requests acted on", summary).group(1))  # type: ignore[union-attr]
    assert acted <= most and "held back" in summary, summary
    assert cluster.snapshot(NODE) == before


def test_an_administrators_qdisc_survives_a_netem_jobs_switches_and_undo(
    cluster: Cluster,
    sandbox_users: dict[str, SandboxUser],
    userlib: Path,
) -> None:
    before = cluster.snapshot(NODE)
    mark = log_mark(cluster)
    job = hammer_job(cluster, sandbox_users["chaosok"], userlib)
    try:
        cluster.wait_state(job, {"RUNNING"})

        def hammering() -> bool:
            client = ChannelClient.find(cluster.journal_root, NODE, job)
            ack = client.ack() if client else None
            return ack is not None and ack.epoch >= 5

        wait_until(hammering, timeout=30, interval=0.05)
        # Root (an administrator) shapes the interface now, whatever the job has on or off.
        res = cluster.in_node(NODE, ["tc", "qdisc", "replace", "dev", "eth0", *ADMIN_QDISC])
        assert res.ok, res.stderr
        cluster.wait_done(job, [NODE])
        assert "qdisc tbf 1: root" in cluster.qdisc(NODE), cluster.qdisc(NODE)
        assert "not ours" in cluster.journal(NODE, job) and "left as it is" in cluster.journal(NODE, job)
        failed = [e for e in acks(cluster.output(job)) if e[2]]
        assert len(failed) > agent.FAILURES_LOGGED + 5, cluster.output(job)  # the job made them fail
        errors = [line for line in job_log(cluster, job, mark) if " ERROR " in line]
        # Ten in full, the line that says the rest are summed up, one summary at the end.
        assert agent.FAILURES_LOGGED < len(errors) <= agent.FAILURES_LOGGED + 3, errors
    finally:
        cluster.in_node(NODE, ["tc", "qdisc", "del", "dev", "eth0", "root", "handle", "1:"])
    assert cluster.snapshot(NODE) == before


def test_netem_on_a_shared_node_is_refused_though_the_policy_does_not_require_exclusive(
    cluster: Cluster,
    sandbox_users: dict[str, SandboxUser],
) -> None:
    before = cluster.snapshot("node2")
    user = sandbox_users["chaosok"]
    show = "tc qdisc show dev eth0\n"
    shared = cluster.submit(show, "netem:rate=1M", "-N1", "-n1", "-w", "node2", user=user)
    cluster.wait_done(shared, ["node2"])
    alone = cluster.submit(show, "netem:rate=1M", "-N1", "-w", "node2", "--exclusive", user=user)
    cluster.wait_done(alone, ["node2"])
    assert qdisc_handle(shared) not in cluster.output(shared) and "tbf" not in cluster.output(shared)
    cluster.wait_log(f"netem: not applied on node2 for job {shared}: netem: job {shared} does not hold node2")
    assert f"tbf {qdisc_handle(alone)} root" in cluster.output(alone)  # the control: seen when applied
    assert cluster.snapshot("node2") == before
