"""slow-rank method=cgroup and noisy-neighbour stay inside the job's cgroup: v1 and v2, on a fake cgroupfs.

The fake is a directory tree shaped like /sys/fs/cgroup (v1: one directory per hierarchy; v2: the
unified tree) and a /proc whose ``PID/cgroup`` files say where each task is, as Slurm puts them.
Its "kernel" is small: a control file is a plain file (the last write is its value), and a cgroup
can be removed while it holds no process and no child cgroup, control files notwithstanding.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_until

from slurm_chaos.faults import cgroupfs, node_proc
from slurm_chaos.faults.cgroupfs import Cgroupfs, job_path
from slurm_chaos.faults.journal import Journal, UndoContext, revert
from slurm_chaos.faults.node_base import MARKER_ENV, JobContext, popen_spawner
from slurm_chaos.faults.node_cpu import JOIN_CGROUPS, CgroupQuota, NoisyLoad, marked
from slurm_chaos.faults.node_proc import ProcId
from slurm_chaos.runner import Completed, FakeRunner

JOB = "77"
TASK = f"/slurm/uid_0/job_{JOB}/step_0/task_1"
V2_JOB = f"/system.slice/slurmstepd.scope/job_{JOB}"
V2_TASK = f"{V2_JOB}/step_0/user/task_1"


def fake_rmdir(group: Path) -> None:
    """The kernel's rmdir of a cgroup: refused while it has processes or child cgroups."""
    if any(p.is_dir() for p in group.iterdir()):
        raise OSError(errno.ENOTEMPTY, "child cgroups", str(group))
    procs = group / "cgroup.procs"
    if procs.exists() and procs.read_text().split():
        raise OSError(errno.EBUSY, "processes", str(group))
    shutil.rmtree(group)


@pytest.fixture(autouse=True)
def kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroupfs, "rmdir", fake_rmdir)


def cgdir(d: Path, **files: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup.procs").touch()
    for name, value in files.items():
        (d / name.replace("__", ".")).write_text(value + "\n")
    return d


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir()}


def procs_of(d: Path) -> list[str]:
    return (d / "cgroup.procs").read_text().split()


def ctx_for(tmp_path: Path) -> JobContext:
    runner = FakeRunner(lambda argv: Completed(argv, 0, "", ""))
    journal = Journal(tmp_path / "journal", "node1", JOB)
    return JobContext(JOB, "node1", ("node1",), 0, 0, time.time() + 60, journal, runner)


@pytest.fixture
def task() -> Iterator[ProcId]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    p = node_proc.proc_id(child.pid)
    assert p is not None
    yield p
    child.kill()
    child.wait()


def dead_process() -> ProcId:
    child = subprocess.Popen(["true"])
    p = node_proc.proc_id(child.pid)
    child.wait()
    return p or ProcId(child.pid, 1)


def fake_proc(tmp_path: Path, cgroups: dict[int, str]) -> Path:
    proc = tmp_path / "proc"
    for pid, text in cgroups.items():
        (proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc / str(pid) / "cgroup").write_text(text)
    return proc


# ---------------------------------------------------------------------------------------- v1


def v1_tree(tmp_path: Path) -> Path:
    """Slurm 22.05 on v1: the job's cgroups in freezer and memory, none in cpu."""
    root = tmp_path / "cgroup"
    cgdir(root / "cpu", cpu__cfs_quota_us="-1", cpu__cfs_period_us="100000")
    for hier in ("freezer", "memory"):
        cgdir(root / hier)
        cgdir(root / hier / TASK.lstrip("/"))
    return root


def v1_lines(path: str = TASK) -> str:
    return f"9:freezer:{path}\n4:memory:{path}\n1:cpu:/\n0::/\n"


def test_job_path_is_the_prefix_up_to_the_jobs_component() -> None:
    assert job_path(TASK, JOB) == f"/slurm/uid_0/job_{JOB}"
    assert job_path(V2_TASK, JOB) == V2_JOB
    assert job_path("/slurm/uid_0/job_770/step_0", JOB) is None
    assert job_path("/", JOB) is None


def test_v1_tasks_move_into_a_group_under_the_jobs_path_and_back(tmp_path: Path, task: ProcId) -> None:
    root = v1_tree(tmp_path)
    fs = Cgroupfs(root, fake_proc(tmp_path, {task.pid: v1_lines()}))
    before = tree(root)
    ctx = ctx_for(tmp_path)
    quota = CgroupQuota("slow-rank", ctx, 1, 60.0, fs, find=lambda job, rank: [task])
    quota.tick(time.time())
    group = root / "cpu" / f"slurm/uid_0/job_{JOB}/slurm-chaos-slow-rank"
    assert procs_of(group) == [str(task.pid)]
    cpus = len(os.sched_getaffinity(task.pid))
    assert (group / "cpu.cfs_quota_us").read_text() == f"{int(100000 * 0.4 * cpus)}\n"
    # Never the hierarchy's root, and the hierarchies Slurm manages are left as they are.
    assert not list((root / "cpu").glob("slurm-chaos-*"))
    assert tree(root) - before == {
        "cpu/slurm",
        "cpu/slurm/uid_0",
        f"cpu/slurm/uid_0/job_{JOB}",
        str(group.relative_to(root)),
    }
    assert procs_of(root / "freezer" / TASK.lstrip("/")) == []
    actions = [e.undo.action for e in ctx.journal.read().entries]
    assert actions == ["cgroup_prune", "cgroup_remove", "cgroup_move"]
    (group / "cgroup.procs").write_text("")  # the move back empties it, as the kernel would
    result = revert(ctx.journal, UndoContext(ctx.runner), by="test")
    assert not result.failed, result
    assert procs_of(root / "cpu") == [str(task.pid)]  # back where it was
    assert tree(root) == before  # the job's path in cpu, made for the fault, is gone too


def test_v1_undo_from_outside_the_node_reaches_its_cgroups_through_its_root(
    tmp_path: Path, task: ProcId
) -> None:
    """The sandbox host reverts a node's journal: the node's /sys/fs/cgroup is the host's
    /proc/PID/root/sys/fs/cgroup (here: the node's tree moved below another root)."""
    node = tmp_path / "node"
    root = v1_tree(node)
    fs = Cgroupfs(root, fake_proc(tmp_path, {task.pid: v1_lines()}))
    ctx = ctx_for(tmp_path)
    CgroupQuota("slow-rank", ctx, 1, 50.0, fs, find=lambda job, rank: [task]).tick(time.time())
    seen_from_host = tmp_path / "host"
    moved = seen_from_host / str(node).lstrip("/")
    moved.parent.mkdir(parents=True)
    shutil.move(node, moved)
    group = moved / "cgroup/cpu" / f"slurm/uid_0/job_{JOB}/slurm-chaos-slow-rank"
    assert procs_of(group) == [str(task.pid)]
    group.joinpath("cgroup.procs").write_text("")
    result = revert(ctx.journal, UndoContext(ctx.runner, root=seen_from_host), by="test")
    assert not result.failed, result
    assert procs_of(moved / "cgroup/cpu") == [str(task.pid)]
    assert not (moved / "cgroup/cpu/slurm").exists()


def test_v1_task_in_no_job_cgroup_is_refused_and_nothing_is_made(tmp_path: Path, task: ProcId) -> None:
    root = v1_tree(tmp_path)
    fs = Cgroupfs(root, fake_proc(tmp_path, {task.pid: v1_lines("/")}))
    before = tree(root)
    ctx = ctx_for(tmp_path)
    quota = CgroupQuota("slow-rank", ctx, 1, 60.0, fs, find=lambda job, rank: [task])
    assert quota.tick(time.time()) == float("inf")
    assert "no cgroup of job 77" in quota.refused
    assert tree(root) == before and ctx.journal.read().entries == ()
    assert procs_of(root / "cpu") == []


class ExitsOnWrite(Cgroupfs):
    """A kernel where the task exits just before its PID is written (ESRCH)."""

    def write(self, path: Path, value: str) -> None:
        if path.name == "cgroup.procs":
            raise OSError(errno.ESRCH, "No such process")
        super().write(path, value)


def test_v1_a_task_that_exits_between_scan_and_write_is_skipped(tmp_path: Path, task: ProcId) -> None:
    root = v1_tree(tmp_path)
    gone = dead_process()
    proc = fake_proc(tmp_path, {task.pid: v1_lines(), gone.pid: v1_lines()})
    ctx = ctx_for(tmp_path)
    # Found by the scan, gone before its affinity is read: skipped, the live task still throttled.
    quota = CgroupQuota("slow-rank", ctx, 1, 60.0, Cgroupfs(root, proc), find=lambda job, rank: [gone, task])
    quota.tick(time.time())
    group = root / "cpu" / f"slurm/uid_0/job_{JOB}/slurm-chaos-slow-rank"
    assert procs_of(group) == [str(task.pid)] and not quota.refused
    # Gone at the write itself: journalled already; skipped, and the undo finds it gone.
    root2 = v1_tree(tmp_path / "b")
    ctx2 = ctx_for(tmp_path / "b")
    racing = CgroupQuota("slow-rank", ctx2, 1, 60.0, ExitsOnWrite(root2, proc), find=lambda job, rank: [task])
    racing.next_scan = 0
    racing.tick(time.time())  # must not raise
    assert task.pid in racing.moved and not racing.refused
    before = tree(root2)
    result = revert(ctx2.journal, UndoContext(ctx2.runner), by="test")
    assert not result.failed, result
    assert not (root2 / "cpu/slurm").exists() and tree(root2) <= before


# ---------------------------------------------------------------------------------------- v2


def v2_tree(tmp_path: Path, others: str = "") -> Path:
    """Slurm on v2: job, step and user levels (no processes), the task's own leaf."""
    root = tmp_path / "cgroup"
    cgdir(root, cgroup__controllers="cpuset cpu memory", cgroup__subtree_control="cpu memory")
    cgdir(
        root / "system.slice/slurmstepd.scope",
        cgroup__controllers="cpu memory",
        cgroup__subtree_control="cpu memory",
    )
    for level in (V2_JOB, f"{V2_JOB}/step_0", f"{V2_JOB}/step_0/user"):
        cgdir(root / level.lstrip("/"), cgroup__controllers="cpu memory", cgroup__subtree_control="memory")
    leaf = cgdir(root / V2_TASK.lstrip("/"), cgroup__controllers="memory", cpu__max="max 100000")
    (leaf / "cgroup.procs").write_text(others)
    return root


def test_v2_caps_the_tasks_own_leaf_and_restores_it(tmp_path: Path, task: ProcId) -> None:
    root = v2_tree(tmp_path)
    leaf = root / V2_TASK.lstrip("/")
    (leaf / "cgroup.procs").write_text(f"{task.pid}\n")
    fs = Cgroupfs(root, fake_proc(tmp_path, {task.pid: f"0::{V2_TASK}\n"}))
    before = tree(root)
    ctx = ctx_for(tmp_path)
    CgroupQuota("slow-rank", ctx, 1, 75.0, fs, find=lambda job, rank: [task]).tick(time.time())
    cpus = len(os.sched_getaffinity(task.pid))
    assert (leaf / "cpu.max").read_text() == f"{int(100000 * 0.25 * cpus)} 100000\n"
    assert procs_of(leaf) == [str(task.pid)]  # not moved: still where Slurm put it
    assert tree(root) == before  # nothing made, above all nothing outside the job
    # cpu enabled for the children from the job's cgroup down to the leaf's parent.
    enabled = [
        str(e.undo.data["path"]) for e in ctx.journal.read().entries if e.undo.action == "cgroup_subtree"
    ]
    assert enabled == [
        str(root / lvl.lstrip("/")) for lvl in (V2_JOB, f"{V2_JOB}/step_0", f"{V2_JOB}/step_0/user")
    ]
    assert (root / V2_JOB.lstrip("/") / "cgroup.subtree_control").read_text() == "+cpu\n"
    result = revert(ctx.journal, UndoContext(ctx.runner), by="test")
    assert not result.failed, result
    assert (leaf / "cpu.max").read_text() == "max 100000\n"
    assert (root / V2_JOB.lstrip("/") / "cgroup.subtree_control").read_text() == "-cpu\n"
    assert tree(root) == before


def test_v2_refuses_a_leaf_shared_with_other_ranks_and_a_task_outside_the_job(
    tmp_path: Path, task: ProcId
) -> None:
    root = v2_tree(tmp_path, others=f"{task.pid}\n{os.getpid()}\n")
    leaf = root / V2_TASK.lstrip("/")
    fs = Cgroupfs(root, fake_proc(tmp_path, {task.pid: f"0::{V2_TASK}\n"}))
    ctx = ctx_for(tmp_path)
    quota = CgroupQuota("slow-rank", ctx, 1, 75.0, fs, find=lambda job, rank: [task])
    quota.tick(time.time())
    assert "not the rank's" in quota.refused
    assert (leaf / "cpu.max").read_text() == "max 100000\n" and ctx.journal.read().entries == ()
    outside = Cgroupfs(root, fake_proc(tmp_path / "b", {task.pid: "0::/system.slice/sshd.service\n"}))
    quota = CgroupQuota("slow-rank", ctx, 1, 75.0, outside, find=lambda job, rank: [task])
    quota.tick(time.time())
    assert "not in job 77's cgroup" in quota.refused and ctx.journal.read().entries == ()


def test_v2_task_that_exited_before_the_scan_read_it_is_skipped(tmp_path: Path) -> None:
    root = v2_tree(tmp_path)
    gone = dead_process()
    ctx = ctx_for(tmp_path)
    quota = CgroupQuota(
        "slow-rank", ctx, 1, 75.0, Cgroupfs(root, tmp_path / "proc"), find=lambda job, rank: [gone]
    )
    quota.tick(time.time())  # /proc/PID/cgroup is gone: ENOENT, skipped
    assert not quota.refused and ctx.journal.read().entries == ()


# ---------------------------------------------------------------------------------- noisy-neighbour


def test_noisy_load_starts_inside_the_extern_steps_cgroups_and_is_undone(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    extern = f"/slurm/uid_0/job_{JOB}/step_extern"
    for hier in ("freezer", "memory"):
        cgdir(root / hier / extern.lstrip("/"))
    ctx = ctx_for(tmp_path)
    seen: list[list[str]] = []

    def spawner(argv, env, log_file):  # type: ignore[no-untyped-def]
        seen.append(list(argv))
        return popen_spawner(argv, env, log_file)

    ctx = JobContext(JOB, "node1", ("node1",), 0, 0, ctx.deadline, ctx.journal, ctx.runner, spawner=spawner)
    found = {"freezer": extern, "memory": extern}
    fs = Cgroupfs(root, tmp_path / "proc")
    load = NoisyLoad("noisy-neighbour", ctx, lambda s: ["sleep", str(s)], fs, extern=lambda job, fs: found)
    load.tick(time.time())
    (argv,) = seen
    files = [str(root / h / extern.lstrip("/") / "cgroup.procs") for h in ("freezer", "memory")]
    assert argv[:4] == ["sh", "-c", JOIN_CGROUPS, "sh"] and argv[4:6] == files and argv[6] == "--"
    marker = ctx.marker("noisy-neighbour")
    wait_until(lambda: len(marked(marker)) == 1 and node_proc.cmdline(marked(marker)[0].pid)[0] == "sleep")
    (p,) = marked(marker)
    # The load wrote itself into the job's cgroups before it became the load.
    assert all(procs_of(Path(f).parent) == [str(p.pid)] for f in files)
    assert os.environ.get(MARKER_ENV) is None
    result = revert(ctx.journal, UndoContext(ctx.runner), by="test")
    assert "stopped 1 processes" in result.undone[0]
    assert marked(marker) == []


def test_noisy_load_without_a_job_cgroup_is_never_started(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    started: list[object] = []
    ctx = JobContext(
        JOB,
        "node1",
        ("node1",),
        0,
        0,
        ctx.deadline,
        ctx.journal,
        ctx.runner,
        spawner=lambda *a: started.append(a) or 1,
    )
    fs = Cgroupfs(tmp_path, tmp_path)
    load = NoisyLoad("noisy-neighbour", ctx, lambda s: ["sleep", str(s)], fs, extern=lambda job, fs: None)
    t = time.time()
    assert load.tick(t) < t + 1  # waits for the extern step a while
    assert load.tick(t + 1000) == float("inf")  # then gives up, having started nothing
    assert started == [] and ctx.journal.read().entries == ()


@pytest.mark.parametrize(
    ("cgroups", "ready"),
    [
        # slurmstepd moved the task into cpuset and memory but not yet into the freezer: not yet.
        (
            {
                "cpuset": f"/slurm_node2/uid_0/job_{JOB}/step_extern",
                "memory": f"/slurm_node2/uid_0/job_{JOB}/step_extern",
                "freezer": f"/slurm_node2/uid_0/job_{JOB}",
            },
            False,
        ),
        (
            {
                "cpuset": f"/slurm_node2/uid_0/job_{JOB}/step_extern",
                "freezer": f"/slurm_node2/uid_0/job_{JOB}/step_extern",
            },
            True,
        ),
        ({"": f"{V2_JOB}/step_extern/user/task_special"}, True),
        ({"": f"{V2_JOB}/step_0/user/task_0"}, False),
        ({"": f"/system.slice/slurmstepd.scope/job_{JOB}1/step_extern"}, False),
        ({}, False),
    ],
)
def test_a_noisy_load_waits_until_every_hierarchy_holds_the_extern_step(
    cgroups: dict[str, str], ready: bool
) -> None:
    from slurm_chaos.faults.node_cpu import in_extern_step

    assert in_extern_step(cgroups, JOB) is ready
