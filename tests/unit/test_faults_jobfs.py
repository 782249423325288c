"""Per-job storage (faults/jobfs.py): a job's tmpfs with limits, taken back by unmounting; trees
removed without recursion and within a time budget; the sweep of jobs that no longer run.

Issue #27, finding 4: 3,000 nested directories in a job's heartbeat directory raised RecursionError
out of the epilog (``shutil.rmtree``) and out of ``sandbox down``; millions of files outran the
hook's timeout; a large file pinned tmpfs memory under /run.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_chaos.faults import jobfs
from slurm_chaos.faults.cleanup import cleanup
from slurm_chaos.faults.jobfs import JobFsError, JobStorage, Limits
from slurm_chaos.runner import Completed, FakeRunner, SubprocessRunner

ROOT = os.geteuid() == 0


def _can_mount() -> bool:
    if not ROOT:
        return False
    probe = subprocess.run(["unshare", "--mount", "mount", "-t", "tmpfs", "x", "/mnt"], capture_output=True)
    return probe.returncode == 0


needs_mount = pytest.mark.skipif(not _can_mount(), reason="mounting a tmpfs needs root (CAP_SYS_ADMIN)")


def nest(top: Path, depth: int) -> Path:
    """`depth` nested directories below `top` (made through a descriptor: the path is too long)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as fh:
            fh.write("x")
    finally:
        os.close(fd)
    return top


@pytest.fixture
def storage_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "hb"
    (root / "node1").mkdir(parents=True)
    for d in (root, root / "node1"):
        d.chmod(0o755)
    yield root
    jobfs.detach(tmp_path, SubprocessRunner())  # never leave a mount behind a failed test


# ------------------------------------------------------------------------------ removal


def test_a_tree_3000_directories_deep_is_removed_where_rmtree_recursed_out(tmp_path: Path) -> None:
    deep = tmp_path / "deep"
    deep.mkdir()
    nest(deep, 3000)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("root's")
    (deep / "link").symlink_to(outside)  # never followed
    (deep / "d" / "file").write_text("x")
    assert jobfs.remove_tree(deep) is True
    assert not deep.exists() and (outside / "keep").read_text() == "root's"


def test_shutil_rmtree_recurses_out_on_the_same_tree(tmp_path: Path) -> None:
    """The control: the tree above is what made the epilog and `sandbox down` raise."""
    (tmp_path / "deep").mkdir()
    nest(tmp_path / "deep", 3000)
    with pytest.raises(RecursionError):
        shutil.rmtree(tmp_path / "deep")
    assert jobfs.remove_tree(tmp_path / "deep")


def test_a_link_or_a_file_where_a_tree_is_expected_is_removed_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    (tmp_path / "link").symlink_to(target)
    assert jobfs.remove_tree(tmp_path / "link") and not (tmp_path / "link").is_symlink()
    assert (target / "keep").exists()
    assert jobfs.remove_tree(tmp_path / "missing")


def test_the_trash_is_emptied_within_its_budget_and_the_rest_later(tmp_path: Path) -> None:
    trash = tmp_path / "trash"
    (trash / "job" / "many").mkdir(parents=True)
    for i in range(2000):
        (trash / "job" / "many" / f"f{i}").write_text("")
    nest(trash / "job", 50)
    ticks = iter(range(10**9))
    fd = os.open(trash, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # A clock that moves one second per look: a 100 s budget lets about 100 entries go.
        assert jobfs.empty_trash(fd, 100.0, clock=lambda: float(next(ticks))) is False
        assert (trash / "job").exists() or any(trash.iterdir())
        assert jobfs.empty_trash(fd, None) is True
    finally:
        os.close(fd)
    assert list(trash.iterdir()) == []


def test_discard_frees_the_jobs_path_at_once(tmp_path: Path) -> None:
    node, trash = tmp_path / "node1", tmp_path / "trash"
    node.mkdir()
    trash.mkdir(mode=0o700)
    (node / "5").mkdir()
    nest(node / "5", 100)
    (node / "6").mkdir()
    nfd, tfd = os.open(node, os.O_RDONLY), os.open(trash, os.O_RDONLY)
    try:
        assert jobfs.discard(nfd, "5", tfd) and jobfs.discard(nfd, "6", tfd)
        assert not jobfs.discard(nfd, "7", tfd)
    finally:
        os.close(nfd)
        os.close(tfd)
    assert sorted(p.name for p in node.iterdir()) == []
    assert len(list(trash.iterdir())) == 1  # the non-empty one, renamed; the empty one removed


# ------------------------------------------------------------------------------ the job's tmpfs


@needs_mount
def test_a_jobs_tmpfs_bounds_what_it_writes_and_goes_with_its_unmount(storage_root: Path) -> None:
    storage = JobStorage(storage_root, SubprocessRunner(), Limits(size=1024 * 1024, inodes=64))
    nfd = os.open(storage_root / "node1", os.O_RDONLY | os.O_DIRECTORY)
    tfd = jobfs.open_trash(nfd)
    try:
        path = storage.give(nfd, "node1", "5", 4242, 4343)
        st = path.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (4242, 4343, 0o755)
        (point,) = jobfs.mounts_at_or_under(path)
        assert point == str(path)
        (path / "sub").mkdir()
        with pytest.raises(OSError) as big:
            with open(path / "big", "wb") as fh:
                fh.write(b"\0" * (2 * 1024 * 1024))
        assert big.value.errno == errno.ENOSPC
        with pytest.raises(OSError) as many:
            for i in range(100):
                (path / f"f{i}").write_text("")
        assert many.value.errno == errno.ENOSPC
        # What a job stacks on or under its tmpfs (a FUSE mount, here a tmpfs) goes with it.
        subprocess.run(["mount", "-t", "tmpfs", "stacked", str(path / "sub")], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "stacked", str(path)], check=True)
        done = storage.take_back("node1", "5", nfd, tfd)
    finally:
        os.close(tfd)
        os.close(nfd)
    assert f"{path} removed" in done and len(done) >= 3
    assert jobfs.mounts_at_or_under(storage_root) == [] and not path.exists()


def test_a_failed_mount_leaves_no_directory(storage_root: Path) -> None:
    runner = FakeRunner(lambda argv: Completed(argv, 32, "", "mount: permission denied"))
    storage = JobStorage(storage_root, runner)
    nfd = os.open(storage_root / "node1", os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(JobFsError, match="permission denied"):
            storage.give(nfd, "node1", "5", 4242, 4343)
    finally:
        os.close(nfd)
    assert not (storage_root / "node1" / "5").exists()
    (argv,) = runner.calls
    assert list(argv[:4]) == ["mount", "-t", "tmpfs", "-o"] and "nosuid,nodev,noexec" in argv[4]
    assert "size=16777216,nr_inodes=4096" in argv[4] and "uid=4242,gid=4343" in argv[4]


# ------------------------------------------------------------------------------ the sweep


@needs_mount
def test_the_sweep_takes_back_ended_jobs_only_and_one_failure_blocks_no_other(storage_root: Path) -> None:
    storage = JobStorage(storage_root, SubprocessRunner())
    nfd = os.open(storage_root / "node1", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for job in ("5", "6", "7"):
            storage.give(nfd, "node1", job, 4242, 4242)
    finally:
        os.close(nfd)
    nest(storage_root / "node1" / "5", 3000)
    (storage_root / "node1" / "8").mkdir()  # a plain directory an older release left, deep too
    nest(storage_root / "node1" / "8", 3000)
    states = {"5": False, "6": None, "7": True, "8": False}
    done = jobfs.sweep(storage, None, states.get)
    assert not any(line.startswith("FAILED") for line in done), done
    assert sorted(p.name for p in (storage_root / "node1").iterdir()) == [".trash", "6", "7"]
    assert list((storage_root / "node1" / ".trash").iterdir()) == []
    assert sorted(jobfs.mounts_at_or_under(storage_root)) == [
        str(storage_root / "node1" / "6"),
        str(storage_root / "node1" / "7"),
    ]
    # A job whose unmount fails is reported; the sweep goes on with the next.
    states = {"6": False, "7": False}
    failing = JobStorage(storage_root, FakeRunner(lambda argv: Completed(argv, 1, "", "busy")))
    done = jobfs.sweep(failing, ["node1"], states.get)
    assert [line.startswith("FAILED") for line in done] == [True, True]
    # cleanup() sweeps with the controller's word on each job.
    outcomes = cleanup(
        storage_root / "no-journals", None, SubprocessRunner(), states.get, storage_roots=[storage_root]
    )
    assert [o.failed for o in outcomes].count(True) == 0
    assert jobfs.mounts_at_or_under(storage_root) == []
    assert sorted(p.name for p in (storage_root / "node1").iterdir()) == [".trash"]


def test_the_sweep_refuses_a_storage_root_that_is_not_roots_alone(storage_root: Path) -> None:
    storage_root.chmod(0o777)
    (line,) = jobfs.sweep(JobStorage(storage_root, SubprocessRunner()), None, lambda job: False)
    assert line.startswith("FAILED") and "not a directory of root's alone" in line


# ------------------------------------------------------------------------------ which jobs run here


def _step_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))  # the name stays after close, as slurmstepd's does while the step runs


def test_slurmds_spool_says_which_jobs_have_a_step_and_an_untrusted_one_says_nothing(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=x\nslurmdSpoolDir = {tmp_path}/spool/%n  # per node\n")
    spool = jobfs.slurmd_spool(conf, "node1")
    assert spool == tmp_path / "spool" / "node1"
    assert jobfs.slurmd_spool(None, "node1") == jobfs.DEFAULT_SPOOL
    spool.mkdir(parents=True, mode=0o755)
    _step_socket(spool / "node1_5.4294967291")  # the extern step
    (spool / "node1_6.0").write_text("")  # not a socket: no step
    _step_socket(spool / "node2_7.0")  # another node's
    running = jobfs.steps_on_node(spool, "node1")
    assert (running("5"), running("6"), running("7")) == (True, False, False)
    spool.chmod(0o777)  # anyone could plant a step there: the spool says nothing
    assert jobfs.steps_on_node(spool, "node1")("6") is None
    assert jobfs.steps_on_node(tmp_path / "missing", "node1")("6") is None


def test_only_storage_without_a_step_and_older_than_the_grace_counts_as_ended(storage_root: Path) -> None:
    storage = JobStorage(storage_root, SubprocessRunner())
    (storage_root / "node1" / "5").mkdir()
    (storage_root / "node1" / "6").mkdir()
    steps = {"5": False, "6": True}.get
    later = time.time() + 2 * jobfs.GRACE_S
    running = jobfs.job_running(storage, "node1", steps, later)
    assert (running("5"), running("6"), running("7")) == (False, None, None)
    assert jobfs.job_running(storage, "node1", steps, time.time())("5") is None  # its prolog may still run
    assert jobfs.job_running(storage, "node1", lambda job: None, later)("5") is None
