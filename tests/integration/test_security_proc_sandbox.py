"""#27 finding 7 on the sandbox: what a job's user can forge does not make a process Slurm's or a task.

An unprivileged user's job (chaosok, allowed to inject) forges, in its batch step:
- a process with rank 1's environment (SLURM_STEP_ID=0, SLURM_PROCID=1) and the noisy
  neighbour's marker (SLURM_CHAOS_MARKER=node1:J:noisy-neighbour), outside the step;
- a process titled as the job's extern step, ``exec -a "slurmstepd: [J.extern]"``;
and, outside the job (the same user, on the same kernel, as a login or an earlier job leaves),
a process tree with the marker and the task's environment, titled as the extern step too.
The slow rank then stops, continues or moves only rank 1 of the real step, the noisy load runs
in the real extern step's cgroups, and the undo signals none of the forged processes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import test_faults_node
from test_faults_node import SLURM_ROOT, USER_PY, Cluster
from waiting import wait_until

from slurm_chaos.faults import node_proc
from slurm_chaos.faults.authz import SPEC_MARK
from slurm_chaos.faults.journal import Journal

if TYPE_CHECKING:
    from tests.conftest import SandboxUser

pytestmark = pytest.mark.sandbox

#: The sandbox with the node hooks installed and a policy that allows chaosok (test_faults_node's).
cluster = test_faults_node.cluster

# Runs as a task ("task") and as the forged processes ("forged"): each says whether it was ever
# continued (a duty cycle stops and continues) and where it is in the cpu hierarchy (a cgroup cap
# moves it there). Rank 1 first waits (up to a minute) until the fault holds it.
PROBE = r"""
import os, signal, sys, time
continued, done = [], []
signal.signal(signal.SIGCONT, lambda *_: continued.append(1))
signal.signal(signal.SIGTERM, lambda *_: done.append(1))
def cpu():
    lines = open("/proc/self/cgroup").read().split()
    return next((line.split(":", 2)[2] for line in lines if ":cpu," in line or ":cpu:" in line), "")
if sys.argv[1] == "task":
    rank = os.environ["SLURM_PROCID"]
    end = time.monotonic() + 60
    while rank == "1" and not continued and "slurm-chaos" not in cpu() and time.monotonic() < end:
        time.sleep(0.01)
    x = 0
    for i in range(2000000):
        x += i
    print(f"TASK rank={rank} pid={os.getpid()} continued={len(continued)} cpu={cpu()}", flush=True)
else:
    print(f"FORGED pid={os.getpid()} started", flush=True)
    while not done:
        time.sleep(0.05)
    print(f"FORGED pid={os.getpid()} continued={len(continued)} cpu={cpu()}", flush=True)
"""

JOB = """
P="{py} {shared}/proc_probe.py"
# Outside the step, with rank 1's environment and the noisy neighbour's marker.
SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_CHAOS_MARKER=node1:$SLURM_JOB_ID:noisy-neighbour $P forged &
F1=$!
# Titled as the job's extern step.
(exec -a "slurmstepd: [$SLURM_JOB_ID.extern]" $P forged) &
F2=$!
srun -n2 -N1 $P task
kill -TERM $F1 $F2
wait
"""


@pytest.fixture
def outside(
    cluster: Cluster, sandbox_users: dict[str, SandboxUser]
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes of chaosok's outside any job, started by the test (the job's id is known then)."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def forge_outside(user: SandboxUser, job: str) -> subprocess.Popen[bytes]:
    """chaosok's process tree on the host: the marker, rank 1's environment, the extern title."""
    env = [
        f"SLURM_CHAOS_MARKER=node1:{job}:noisy-neighbour",
        f"SLURM_JOB_ID={job}",
        "SLURM_STEP_ID=0",
        "SLURM_PROCID=1",
    ]
    script = f'sleep 300 & exec -a "slurmstepd: [{job}.extern]" sleep 300'
    argv = ["runuser", "-u", user.name, "--", "env", *env, "bash", "-c", script]
    return subprocess.Popen(argv, start_new_session=True)


def tree(root: int) -> list[int]:
    """`root` and its descendants."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(p for p in node_proc.pids() if node_proc.parent(p) == pid)
    return found


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def submit_held(cluster: Cluster, user: SandboxUser, script: str, *sbatch: str) -> str:
    name = uuid.uuid4().hex[:8]
    path = user.home / f"job-{name}.sh"
    path.write_text("#!/bin/bash\n" + script)
    os.chown(path, user.uid, user.gid)
    out = user.home / f"job-{name}.out"
    keep = {k: cluster.env[k] for k in ("SLURM_CONF", "SBATCH_RESERVATION", "PATH") if k in cluster.env}
    argv = user.argv(
        "sbatch", "--parsable", "--hold", "-o", str(out), "-D", str(user.home), *sbatch, str(path), env=keep
    )
    res = cluster.run(argv)
    assert res.ok, res.stderr
    return res.stdout.strip().split(";")[0]


@pytest.mark.parametrize("method", ["duty-cycle", "cgroup"])
def test_forged_titles_environments_and_markers_are_never_slurms_or_the_jobs(
    cluster: Cluster,
    sandbox_users: dict[str, SandboxUser],
    outside: list[subprocess.Popen[bytes]],
    method: str,
) -> None:
    user = sandbox_users["chaosok"]
    (cluster.shared / "proc_probe.py").write_text(PROBE)
    before = cluster.snapshot("node1")
    job = submit_held(
        cluster, user, JOB.format(py=USER_PY, shared=cluster.shared), "-N1", "-n2", "-w", "node1"
    )
    outside.append(forge_outside(user, job))
    title = f"slurmstepd: [{job}.extern]"

    def forged_tree() -> list[int]:
        return [p for p in tree(outside[0].pid) if node_proc.cmdline(p)[:1] != ["runuser"]]

    wait_until(lambda: [node_proc.cmdline(p)[0] for p in forged_tree()] == [title, "sleep"], timeout=10)
    forged_outside = forged_tree()
    spec = f"slow-rank:rank=1,percent=60,method={method}+noisy-neighbour:cpus=1"
    assert cluster.run(["scontrol", "update", f"JobId={job}", f"AdminComment={SPEC_MARK}{spec}"]).ok
    assert cluster.run(["scontrol", "release", job]).ok
    cluster.wait_done(job, ["node1"])
    out = cluster.output(job)
    tasks = {
        int(r): (int(p), int(c), cg)
        for r, p, c, cg in re.findall(r"TASK rank=(\d) pid=(\d+) continued=(\d+) cpu=(\S*)", out)
    }
    forged = {
        int(p): (int(c), cg) for p, c, cg in re.findall(r"FORGED pid=(\d+) continued=(\d+) cpu=(\S*)", out)
    }
    assert set(tasks) == {0, 1} and len(forged) == 2, out
    entries = Journal(cluster.journal_root, "node1", job).read().entries
    slowed = {
        int(str(e.undo.data["pid"])) for e in entries if e.fault == "slow-rank" and "pid" in e.undo.data
    }
    # Rank 1 of the real step, and it alone, was held by the fault.
    assert slowed == {tasks[1][0]}, (entries, out)
    if method == "duty-cycle":
        assert tasks[1][1] > 0 and tasks[0][1] == 0, out
    else:
        assert "slurm-chaos-slow-rank" in tasks[1][2] and "slurm-chaos" not in tasks[0][2], out
    # The forged processes in the batch step were never stopped, continued or moved.
    assert all(c == 0 and "slurm-chaos" not in cg for c, cg in forged.values()), out
    # The noisy load ran in the real extern step's cgroups.
    (load,) = [e for e in entries if e.fault == "noisy-neighbour"]
    assert re.search(rf"freezer:{SLURM_ROOT}/uid_{user.uid}/job_{job}/step_extern", load.action), load
    # The forged tree outside the job outlived the load's undo, never stopped.
    assert all(node_proc.cmdline(p) and state(p) != "T" for p in forged_outside), forged_outside
    assert outside[0].poll() is None
    assert cluster.snapshot("node1") == before
