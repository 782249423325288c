"""slow-rank method=cgroup and noisy-neighbour stay inside the job's cgroup: v1 and v2, on a fake cgroupfs.

The fake is a directory tree shaped like /sys/fs/cgroup (v1: one directory per hierarchy; v2: the
unified tree) and a /proc (``fakeproc``) whose ``PID/cgroup`` files say where each task is, as
Slurm puts them, with the job's slurmstepd (root's, running slurmstepd), from which alone the
job's cgroup is taken: on v2 a user's delegated subtree may hold a ``job_J/step_extern`` too.
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
from fakeproc import FakeProc
from waiting import wait_until

from slurm_chaos.faults import cgroupfs, node_proc
from slurm_chaos.faults.cgroupfs import Cgroupfs, job_path
from slurm_chaos.faults.journal import Journal, UndoContext, revert
from slurm_chaos.faults.node_base import MARKER_ENV, JobContext, popen_spawner
from slurm_chaos.faults.node_cpu import JOIN_CGROUPS, CgroupQuota, NoisyLoad, extern_step_cgroups, marked
from slurm_chaos.faults.node_proc import ProcId
from slurm_chaos.runner import Completed, FakeRunner

JOB = "77"
TASK = f"/slurm/uid_0/job_{JOB}/step_0/task_1"
V2_JOB = f"/system.slice/slurmstepd.scope/job_{JOB}"
V2_TASK = f"{V2_JOB}/step_0/user/task_1"
#: A v2 subtree systemd delegates to user 1001 (user@1001.service): the user makes cgroups there.
DELEGATED = "/user.slice/user-1001.slice/user@1001.service"
#: The PID of the job's slurmstepd in the fake /procs (no real task has PID 1).
STEPD = 1


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


def fake_proc(tmp_path: Path, cgroups: dict[int, str], stepd: str | None = None) -> Path:
    """A /proc with the tasks' cgroups and, given its cgroup lines, step 0's slurmstepd."""
    proc = FakeProc(tmp_path / "proc")
    if stepd is not None:
        proc.stepd(STEPD, JOB, "0", stepd)
    for pid, text in cgroups.items():
        proc.add(pid, text)
    return proc.root


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


#: Step 0's slurmstepd on v1: in the job's freezer cgroup, in the step's memory cgroup.
V1_STEPD = f"9:freezer:/slurm/uid_0/job_{JOB}\n4:memory:/slurm/uid_0/job_{JOB}/step_0\n1:cpu:/\n0::/\n"
#: Step 0's slurmstepd on v2.
V2_STEPD = f"0::{V2_JOB}/step_0/slurm\n"


def test_job_path_is_the_prefix_up_to_the_jobs_component() -> None:
    assert job_path(TASK, JOB) == f"/slurm/uid_0/job_{JOB}"
    assert job_path(V2_TASK, JOB) == V2_JOB
    assert job_path("/slurm/uid_0/job_770/step_0", JOB) is None
    assert job_path("/", JOB) is None


def test_v1_tasks_move_into_a_group_under_the_jobs_path_and_back(tmp_path: Path, task: ProcId) -> None:
    root = v1_tree(tmp_path)
    fs = Cgroupfs(root, fake_proc(tmp_path, {task.pid: v1_lines()}, V1_STEPD))
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
    fs = Cgroupfs(root, fake_proc(tmp_path, {task.pid: v1_lines()}, V1_STEPD))
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


@pytest.mark.parametrize(
    ("task_lines", "stepd", "why"),
    [
        (v1_lines("/"), V1_STEPD, "outside job 77's cgroups"),  # a task in no cgroup of the job
        (v1_lines(), None, "job 77 has no cgroup here"),  # no slurmstepd of the job: no job cgroup
        # A slurmstepd in no cgroup of the job (Slurm without cgroup plugins) makes none either.
        (v1_lines(), "9:freezer:/\n4:memory:/\n1:cpu:/\n0::/\n", "job 77 has no cgroup here"),
    ],
)
def test_v1_task_in_no_job_cgroup_is_refused_and_nothing_is_made(
    tmp_path: Path, task: ProcId, task_lines: str, stepd: str | None, why: str
) -> None:
    root = v1_tree(tmp_path)
    fs = Cgroupfs(root, fake_proc(tmp_path, {task.pid: task_lines}, stepd))
    before = tree(root)
    ctx = ctx_for(tmp_path)
    quota = CgroupQuota("slow-rank", ctx, 1, 60.0, fs, find=lambda job, rank: [task])
    assert quota.tick(time.time()) == float("inf")
    assert why in quota.refused
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
    proc = fake_proc(tmp_path, {task.pid: v1_lines(), gone.pid: v1_lines()}, V1_STEPD)
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
    fs = Cgroupfs(root, fake_proc(tmp_path, {task.pid: f"0::{V2_TASK}\n"}, V2_STEPD))
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
    fs = Cgroupfs(root, fake_proc(tmp_path, {task.pid: f"0::{V2_TASK}\n"}, V2_STEPD))
    ctx = ctx_for(tmp_path)
    quota = CgroupQuota("slow-rank", ctx, 1, 75.0, fs, find=lambda job, rank: [task])
    quota.tick(time.time())
    assert "not the rank's" in quota.refused
    assert (leaf / "cpu.max").read_text() == "max 100000\n" and ctx.journal.read().entries == ()
    outside = Cgroupfs(
        root, fake_proc(tmp_path / "b", {task.pid: "0::/system.slice/sshd.service\n"}, V2_STEPD)
    )
    quota = CgroupQuota("slow-rank", ctx, 1, 75.0, outside, find=lambda job, rank: [task])
    quota.tick(time.time())
    assert "not in job 77's cgroup" in quota.refused and ctx.journal.read().entries == ()


def test_v2_task_that_exited_before_the_scan_read_it_is_skipped(tmp_path: Path) -> None:
    root = v2_tree(tmp_path)
    gone = dead_process()
    ctx = ctx_for(tmp_path)
    proc = fake_proc(tmp_path, {}, V2_STEPD)
    quota = CgroupQuota("slow-rank", ctx, 1, 75.0, Cgroupfs(root, proc), find=lambda job, rank: [gone])
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


V1_EXTERN = f"/slurm_node2/uid_1001/job_{JOB}"


def v1_extern(task_freezer: str) -> tuple[str, str]:
    """The extern slurmstepd's cgroup lines and its task's (in the freezer at `task_freezer`)."""
    stepd = f"9:freezer:{V1_EXTERN}\n3:cpuset:{V1_EXTERN}/step_extern\n4:memory:{V1_EXTERN}/step_extern\n"
    task = f"9:freezer:{task_freezer}\n3:cpuset:{V1_EXTERN}/step_extern\n4:memory:{V1_EXTERN}/step_extern\n"
    return stepd, task


def v1_mounts(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    for hier in ("freezer", "cpuset", "memory", "cpu"):
        cgdir(root / hier)
    return root


@pytest.mark.parametrize(("task_freezer", "ready"), [(f"{V1_EXTERN}/step_extern", True), (V1_EXTERN, False)])
def test_v1_the_extern_steps_cgroups_once_every_hierarchy_holds_its_task(
    tmp_path: Path, task_freezer: str, ready: bool
) -> None:
    """slurmstepd moves its task into cpuset and memory before the freezer: until all three hold it
    in the step, a load started there would escape the step Slurm kills at the job's end."""
    proc = FakeProc(tmp_path / "proc")
    stepd, task = v1_extern(task_freezer)
    proc.stepd(20, JOB, "extern", stepd)
    proc.add(21, task, uid=0, ppid=20, argv=("sleep", "100000000"))
    found = extern_step_cgroups(JOB, Cgroupfs(v1_mounts(tmp_path), proc.root))
    step = f"{V1_EXTERN}/step_extern"
    assert found == ({"freezer": step, "cpuset": step, "memory": step} if ready else None)


def v2_extern(proc: FakeProc) -> str:
    """The real extern step on v2: root's slurmstepd and its task; returns the task's cgroup."""
    proc.stepd(30, JOB, "extern", f"0::{V2_JOB}/step_extern/slurm\n")
    proc.add(31, f"0::{V2_JOB}/step_extern/user/task_special\n", uid=0, ppid=30)
    return f"{V2_JOB}/step_extern/user/task_special"


def forged_extern(proc: FakeProc, pid: int, uid: int = 1001, exe: str = "/usr/bin/bash") -> None:
    """A process titled as the job's extern slurmstepd (``exec -a``), with a child in a
    ``job_J/step_extern`` of the user's delegated subtree."""
    proc.add(
        pid,
        f"0::{DELEGATED}/job_{JOB}/step_extern/slurm\n",
        argv=(f"slurmstepd: [{JOB}.extern]",),
        uid=uid,
        exe=exe,
    )
    proc.add(pid + 1, f"0::{DELEGATED}/job_{JOB}/step_extern/user/task_special\n", uid=uid, ppid=pid)


@pytest.mark.parametrize(
    ("uid", "exe"),
    [
        (1001, "/usr/bin/bash"),  # exec -a "slurmstepd: [J.extern]" bash
        (1001, "/usr/sbin/slurmstepd-wlm"),  # the user runs the slurmstepd binary itself
        (0, "/usr/bin/sleep"),  # a root process that is not slurmstepd
    ],
)
def test_v2_a_forged_extern_step_in_a_delegated_subtree_is_never_the_jobs(
    tmp_path: Path, uid: int, exe: str
) -> None:
    """On cgroup v2 with user@U.service delegated, the user makes .../job_J/step_extern and a
    process titled "slurmstepd: [J.extern]" with a child there (found first: a lower PID); the
    noisy load goes only into the extern step of root's slurmstepd, or nowhere while it has none."""
    root = tmp_path / "cgroup"
    cgdir(root, cgroup__controllers="cpuset cpu memory")
    proc = FakeProc(tmp_path / "proc")
    forged_extern(proc, 10, uid, exe)
    fs = Cgroupfs(root, proc.root)
    assert extern_step_cgroups(JOB, fs) is None
    real = v2_extern(proc)
    assert extern_step_cgroups(JOB, fs) == {"": real}
    # Another node's extern step (another network namespace) and another job's are not this one's.
    other = FakeProc(tmp_path / "other")
    other.stepd(30, JOB, "extern", f"0::{V2_JOB}/step_extern/slurm\n", net="node2")
    other.add(31, f"0::{V2_JOB}/step_extern/user/task_special\n", uid=0, ppid=30)
    other.stepd(40, f"{JOB}1", "extern", f"0::{V2_JOB}1/step_extern/slurm\n")
    other.add(41, f"0::{V2_JOB}1/step_extern/user/task_special\n", uid=0, ppid=40)
    assert extern_step_cgroups(JOB, Cgroupfs(root, other.root)) is None


def test_v2_a_task_in_a_delegated_job_cgroup_is_never_capped(tmp_path: Path, task: ProcId) -> None:
    """A process of the user's in .../user@1001.service/job_77/step_0/user/task_1 (however it was
    taken for a task: its environment is the user's) is outside the job's cgroup, which Slurm made
    under its slurmstepd's: nothing is enabled or capped in the user's tree, nothing journalled."""
    root = v2_tree(tmp_path)
    forged = f"{DELEGATED}/job_{JOB}/step_0/user/task_1"
    cgdir(
        root / DELEGATED.lstrip("/"), cgroup__controllers="cpu memory", cgroup__subtree_control="cpu memory"
    )
    for level in (f"job_{JOB}", f"job_{JOB}/step_0", f"job_{JOB}/step_0/user"):
        cgdir(
            root / DELEGATED.lstrip("/") / level, cgroup__controllers="cpu memory", cgroup__subtree_control=""
        )
    leaf = cgdir(root / forged.lstrip("/"), cgroup__controllers="cpu", cpu__max="max 100000")
    (leaf / "cgroup.procs").write_text(f"{task.pid}\n")
    before = {f: f.read_text() for f in root.rglob("*") if f.is_file()}
    fs = Cgroupfs(root, fake_proc(tmp_path, {task.pid: f"0::{forged}\n"}, V2_STEPD))
    ctx = ctx_for(tmp_path)
    quota = CgroupQuota("slow-rank", ctx, 1, 75.0, fs, find=lambda job, rank: [task])
    quota.tick(time.time())
    assert "not in job 77's cgroup" in quota.refused
    assert ctx.journal.read().entries == ()
    assert {f: f.read_text() for f in root.rglob("*") if f.is_file()} == before


@pytest.mark.skipif(os.geteuid() != 0, reason="starts a process as another user")
def test_a_live_process_titled_as_the_extern_step_is_not_believed(tmp_path: Path) -> None:
    """The attack as it runs: a user's ``exec -a "slurmstepd: [J.extern]"`` with a child, which on
    cgroup v2 it would have put in ``.../user@U.service/job_J/step_extern`` (the child's cgroup
    file here; its title, owner, program and parent are the live processes')."""
    job = "987654"
    title = f"slurmstepd: [{job}.extern]"
    forged = subprocess.Popen(["bash", "-c", f'exec -a "{title}" bash -c "sleep 60; true"'], user=65534)
    try:
        wait_until(lambda: any(node_proc.parent(p) == forged.pid for p in node_proc.pids()))
        (child,) = [p for p in node_proc.pids() if node_proc.parent(p) == forged.pid]
        assert node_proc.cmdline(forged.pid)[0] == title
        proc = FakeProc(tmp_path / "proc")
        for pid, cgroup in (
            (forged.pid, f"0::{DELEGATED}/job_{job}/step_extern/slurm\n"),
            (child, f"0::{DELEGATED}/job_{job}/step_extern/user/task_special\n"),
        ):
            exe = os.readlink(f"/proc/{pid}/exe")
            ppid = node_proc.parent(pid) or 1
            proc.add(pid, cgroup, argv=node_proc.cmdline(pid), uid=65534, exe=exe, ppid=ppid)
        root = tmp_path / "cgroup"
        cgdir(root, cgroup__controllers="cpuset cpu memory")
        assert extern_step_cgroups(job, Cgroupfs(root, proc.root)) is None
    finally:
        forged.kill()
        forged.wait()
