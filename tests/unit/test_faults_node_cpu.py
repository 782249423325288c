"""Slow rank (duty cycle), noisy neighbour: real processes stopped, continued and stopped for good."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakeproc import START, FakeProc
from waiting import wait_until

from slurm_chaos.faults import node_proc
from slurm_chaos.faults.choices import Load
from slurm_chaos.faults.journal import Journal, Undo, UndoContext, revert
from slurm_chaos.faults.node_base import MARKER_ENV, JobContext, popen_spawner
from slurm_chaos.faults.node_cpu import DutyCycle, apply_slow_node, marked, stress_argv
from slurm_chaos.faults.node_proc import ProcId
from slurm_chaos.faults.spec import parse_spec
from slurm_chaos.runner import Completed, FakeRunner


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def ctx_for(tmp_path: Path, nodes: tuple[str, ...] = ("node1",)) -> JobContext:
    runner = FakeRunner(lambda argv: Completed(argv, 0, "", ""))
    return JobContext(
        "77", "node1", nodes, None, None, time.time() + 60, Journal(tmp_path, "node1", "77"), runner
    )


def test_proc_identity_survives_only_the_same_process() -> None:
    p = node_proc.proc_id(node_proc.os.getpid())
    assert p is not None and node_proc.is_alive(p)
    assert not node_proc.is_alive(ProcId(p.pid, p.start + 1))


def test_duty_cycle_stops_and_continues_and_journals_first(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        target = node_proc.proc_id(child.pid)
        assert target is not None
        ctx = ctx_for(tmp_path)
        duty = DutyCycle("slow-rank", ctx, 0, 50.0, find=lambda job, rank: [target], period=0.2)
        t = time.time()
        duty.tick(t)  # scan + first SIGSTOP
        wait_until(lambda: state(child.pid) == "T")
        (entry,) = ctx.journal.read().entries
        assert entry.undo.action == "signal_process" and entry.undo.data["signal"] == "SIGCONT"
        # Over one second the process is stopped about half of the time.
        stopped = samples = 0
        end = time.time() + 1.0
        while time.time() < end:
            duty.tick(time.time())
            samples += 1
            stopped += state(child.pid) == "T"
            time.sleep(0.005)
        assert 0.3 < stopped / samples < 0.7
        while not duty.stopped:  # leave it stopped, as a controller killed mid-cycle would
            duty.next_switch = 0
            duty.tick(time.time())
        wait_until(lambda: state(child.pid) == "T")
        # The journal's undo continues it even though the controller never did (as if it died).
        revert(ctx.journal, UndoContext(ctx.runner), by="test")
        wait_until(lambda: state(child.pid) in ("R", "S"))
    finally:
        child.kill()
        child.wait()


def test_slow_node_acts_only_on_its_node(tmp_path: Path) -> None:
    (req,) = parse_spec("slow-node:node=1,percent=30")
    here = apply_slow_node(req, ctx_for(tmp_path, ("node0", "node1")))
    assert len(here) == 1 and isinstance(here[0], DutyCycle) and here[0].rank is None
    assert apply_slow_node(req, ctx_for(tmp_path / "b", ("node1", "node2"))) == []


def test_stress_argv() -> None:
    assert stress_argv(Load.CPU, 2, 30) == ["stress-ng", "--cpu", "2", "--timeout", "30s", "--quiet"]
    assert stress_argv(Load.MEMORY, 1, 0)[1:4] == ["--vm", "1", "--vm-bytes"]
    assert stress_argv(Load.MATMUL, 0, 5)[1:3] == ["--matrix", "0"]


def test_marked_processes_are_killed_by_the_undo(tmp_path: Path) -> None:
    marker = f"test-{time.time()}"
    ctx = ctx_for(tmp_path)
    ctx.journal.record("noisy-neighbour", "sleep", Undo(action="kill_marked", data={"marker": marker}), 1e12)
    pid = popen_spawner(["sh", "-c", "sleep 60 & sleep 60"], {MARKER_ENV: marker}, None)
    wait_until(lambda: len(marked(marker)) >= 2)  # the shell and its background child
    procs = marked(marker)
    assert pid in [p.pid for p in procs] and len(procs) >= 2
    result = revert(ctx.journal, UndoContext(ctx.runner), by="test")
    assert "stopped" in result.undone[0]
    assert marked(marker) == []


# ------------------------------------------------------------------ which processes are the job's tasks

JOB = "77"
V1_JOB = f"/slurm_node1/uid_1001/job_{JOB}"
V2_JOB = f"/system.slice/slurmstepd.scope/job_{JOB}"
DELEGATED = "/user.slice/user-1001.slice/user@1001.service"


def env(rank: int, step: str = "0") -> dict[str, str]:
    return {"SLURM_JOB_ID": JOB, "SLURM_STEP_ID": step, "SLURM_PROCID": str(rank)}


def v1(path: str, freezer: str | None = None) -> str:
    return f"9:freezer:{freezer or path}\n4:memory:{path}\n1:cpu:/\n"


def test_tasks_are_the_processes_in_the_steps_cgroup_not_whoever_says_so(tmp_path: Path) -> None:
    """cgroup v1, as the sandbox shows it: the step's slurmstepd in the job's freezer cgroup and the
    step's memory cgroup, its tasks under step_0. A process of the batch step with the task's
    environment, and one titled as the step's slurmstepd, are the user's: not tasks."""
    proc = FakeProc(tmp_path)
    proc.stepd(30, JOB, "0", v1(f"{V1_JOB}/step_0", freezer=V1_JOB))
    proc.add(31, v1(f"{V1_JOB}/step_0/task_0", f"{V1_JOB}/step_0"), ppid=30, env=env(0))
    proc.add(32, v1(f"{V1_JOB}/step_0/task_1", f"{V1_JOB}/step_0"), ppid=30, env=env(1))
    proc.add(33, v1(f"{V1_JOB}/step_0/task_1", f"{V1_JOB}/step_0"), ppid=32, env=env(1))  # a rank's child
    batch = v1(f"{V1_JOB}/step_batch/task_0", f"{V1_JOB}/step_batch")
    proc.stepd(20, JOB, "batch", v1(f"{V1_JOB}/step_batch", freezer=V1_JOB))
    proc.add(21, batch, argv=("/bin/bash", "job.sh"), ppid=20)
    proc.add(22, batch, argv=("srun", "-n2", "busy"), ppid=21, env=env(1, "batch"))
    proc.add(40, batch, argv=("python3", "forged.py"), ppid=21, env=env(1))  # the task's environment
    proc.add(41, batch, argv=(f"slurmstepd: [{JOB}.0]",), exe="/usr/bin/python3", ppid=21, env=env(1))
    proc.add(42, batch, ppid=41, env=env(1))
    # Not in this network namespace: another node's task of the same job (the sandbox's nodes).
    proc.stepd(50, JOB, "0", v1(f"{V1_JOB}/step_0", freezer=V1_JOB), net="node2")
    proc.add(51, v1(f"/../node2{V1_JOB}/step_0/task_0"), ppid=50, env=env(1), net="node2")
    assert [p.pid for p in node_proc.job_tasks(JOB, 1, tmp_path)] == [32, 33]
    assert [p.pid for p in node_proc.job_tasks(JOB, None, tmp_path)] == [31, 32, 33]
    assert node_proc.job_tasks(JOB, 1, tmp_path)[0] == ProcId(32, START)
    assert node_proc.job_tasks(f"{JOB}1", None, tmp_path) == []


def test_v2_a_delegated_job_cgroup_and_a_forged_slurmstepd_hold_no_task(tmp_path: Path) -> None:
    """cgroup v2 with the user's subtree delegated: ``exec -a "slurmstepd: [77.0]"`` and a child in
    .../user@1001.service/job_77/step_0/user/task_0 with the task's environment: not a task; the
    real rank, in the step of root's slurmstepd, is."""
    proc = FakeProc(tmp_path)
    proc.add(10, f"0::{DELEGATED}/job_{JOB}/step_0/slurm\n", argv=(f"slurmstepd: [{JOB}.0]",), uid=1001)
    proc.add(11, f"0::{DELEGATED}/job_{JOB}/step_0/user/task_0\n", ppid=10, env=env(0))
    # The user runs the slurmstepd binary itself, titled as the step: still the user's.
    proc.add(
        12,
        f"0::{DELEGATED}/job_{JOB}/step_0/slurm\n",
        argv=(f"slurmstepd: [{JOB}.0]",),
        exe="/usr/sbin/slurmstepd-wlm",
    )
    proc.add(13, f"0::{DELEGATED}/job_{JOB}/step_0/user/task_0\n", ppid=12, env=env(0))
    assert node_proc.job_tasks(JOB, 0, tmp_path) == []
    proc.stepd(30, JOB, "0", f"0::{V2_JOB}/step_0/slurm\n")
    proc.add(31, f"0::{V2_JOB}/step_0/user/task_0\n", ppid=30, env=env(0))
    assert [p.pid for p in node_proc.job_tasks(JOB, 0, tmp_path)] == [31]


def test_without_a_job_cgroup_the_tasks_are_the_step_daemons_descendants(tmp_path: Path) -> None:
    """Slurm without cgroup plugins (proctrack/linuxproc): the tasks are what root's slurmstepd
    forked, and what they forked; a process with the task's environment elsewhere is not."""
    proc = FakeProc(tmp_path)
    proc.stepd(30, JOB, "0", "0::/system.slice/slurmd.service\n")
    proc.add(31, "0::/system.slice/slurmd.service\n", ppid=30, env=env(0))
    proc.add(32, "0::/system.slice/slurmd.service\n", ppid=31, env=env(0))
    proc.add(40, "0::/system.slice/slurmd.service\n", ppid=1, env=env(0))
    assert [p.pid for p in node_proc.job_tasks(JOB, 0, tmp_path)] == [31, 32]


def test_a_marker_in_a_users_process_marks_nothing(tmp_path: Path) -> None:
    """The marker is known (node:job:fault) and the environment is the user's: only processes of
    ours (the agent's uid) that carry it, and their children of ours, are the load."""
    marker = "node1:77:noisy-neighbour"
    me = os.geteuid()
    proc = FakeProc(tmp_path)
    proc.add(10, uid=me, env={MARKER_ENV: marker})  # the load, as the agent started it
    proc.add(11, uid=me, ppid=10)  # a worker it forked (its environment written over)
    other = 1001 if me != 1001 else 1002
    proc.add(20, uid=other, env={MARKER_ENV: marker})  # the user's, with the marker
    proc.add(21, uid=other, ppid=20)
    proc.add(22, uid=me, ppid=20)  # what the user's started as ours (a setuid program): not the load
    assert [p.pid for p in marked(marker, tmp_path)] == [10, 11]


@pytest.mark.skipif(os.geteuid() != 0, reason="starts a process as another user")
def test_a_users_process_with_the_marker_survives_the_undo(tmp_path: Path) -> None:
    marker = f"test-{time.time()}"
    ctx = ctx_for(tmp_path)
    ctx.journal.record("noisy-neighbour", "sleep", Undo(action="kill_marked", data={"marker": marker}), 1e12)
    users = subprocess.Popen(["sleep", "60"], env={MARKER_ENV: marker}, user=65534)
    try:
        ours = popen_spawner(["sleep", "60"], {MARKER_ENV: marker}, None)
        wait_until(lambda: [p.pid for p in marked(marker)] == [ours])
        result = revert(ctx.journal, UndoContext(ctx.runner), by="test")
        assert "stopped 1 processes" in result.undone[0]
        assert users.poll() is None and state(users.pid) in ("S", "R")
    finally:
        users.kill()
        users.wait()
