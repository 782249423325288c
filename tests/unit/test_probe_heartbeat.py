"""Heartbeat files: atomic, rate-limited, windowed means, read back (only as far as they are trusted)
and filtered by host; the job's own directory made by the prolog."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from slurm_chaos.faults import jobfs
from slurm_chaos.probe.heartbeat import (
    Beat,
    Heartbeat,
    heartbeat_dir,
    hook_main,
    parse_beat,
    read_heartbeats,
    scan_heartbeats,
    straggler_ratio,
    sweep_node,
)
from slurm_chaos.runner import Completed, FakeRunner, SubprocessRunner


def _nest(top: Path, depth: int) -> None:
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)


def _can_mount() -> bool:
    if os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "--mount", "mount", "-t", "tmpfs", "x", "/mnt"], capture_output=True)
    return probe.returncode == 0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_update_writes_at_most_once_per_interval_with_window_means(tmp_path: Path) -> None:
    clock = Clock()
    hb = Heartbeat(
        tmp_path, "42", 1, "node2", world_size=4, mode="allreduce", window=3, clock=clock, window_s=0.0
    )
    assert hb.update(0, 0.10, 0.08, 0.02)
    assert not hb.update(1, 0.20, 0.16, 0.04)  # within the same second: not written
    clock.now += 1.0
    assert hb.update(2, 0.30, 0.24, 0.06, checkpoint_failures=2, numa_mismatch=True)
    (beat,) = read_heartbeats(tmp_path)
    assert (beat.job_id, beat.rank, beat.host, beat.world_size, beat.step) == ("42", 1, "node2", 4, 2)
    assert beat.mode == "allreduce"
    assert beat.window == 3
    assert beat.step_time == pytest.approx(0.20)
    assert beat.compute_time == pytest.approx(0.16)
    assert beat.comm_time == pytest.approx(0.04)
    assert beat.checkpoint_failures == 2 and beat.numa_mismatch
    assert beat.time == 1001.0
    # The window keeps only the last 3 steps.
    clock.now += 1.0
    hb.update(3, 1.0, 1.0, 0.0)
    (beat,) = read_heartbeats(tmp_path)
    assert beat.step_time == pytest.approx((0.2 + 0.3 + 1.0) / 3)


def test_the_window_spans_seconds_not_only_steps(tmp_path: Path) -> None:
    """At 10 ms a step, 20 steps are 0.2 s: one burst of the node's other work. The window keeps
    the last window_s seconds' steps (never fewer than `window`), so a burst is diluted and a
    lasting slowdown is not."""
    clock = Clock()
    hb = Heartbeat(tmp_path, "42", 0, "node1", window=20, window_s=3.0, clock=clock)
    step = 0

    def run(seconds: float, compute: float) -> None:
        nonlocal step
        for _ in range(round(seconds / 0.01)):
            clock.now += 0.01
            hb.update(step, compute, compute, 0.0)
            step += 1

    run(4.0, 0.010)
    run(0.2, 0.030)  # a 0.2 s burst: 3x slower steps
    run(0.95, 0.010)  # the next heartbeat (once a second) comes after it
    (beat,) = read_heartbeats(tmp_path)
    assert 280 <= beat.window <= 301  # the last 3 s of steps, not 20
    assert beat.compute_time == pytest.approx(0.010 * (1 + 2 * 20 / beat.window), rel=0.05)
    assert beat.compute_time < 0.0115  # 1.15x at most: below any straggler ratio
    run(4.0, 0.030)  # a lasting slowdown shows in full
    (beat,) = read_heartbeats(tmp_path)
    assert beat.compute_time == pytest.approx(0.030)
    # Slow steps: 20 of them, however long that takes.
    slow = Heartbeat(tmp_path, "43", 0, "node1", window=20, window_s=3.0, clock=clock)
    for i in range(30):
        clock.now += 1.0
        slow.update(i, float(i), float(i), 0.0)
    beat = next(b for b in read_heartbeats(tmp_path) if b.job_id == "43")
    assert beat.window == 20 and beat.compute_time == pytest.approx(sum(range(10, 30)) / 20)


def test_gpu_index_is_written_where_known_and_read_back(tmp_path: Path) -> None:
    Heartbeat(tmp_path, "42", 0, "node2", gpu=5).update(0, 0.1, 0.1, 0.0)
    Heartbeat(tmp_path, "42", 1, "node2").update(0, 0.1, 0.1, 0.0)
    assert [b.gpu for b in read_heartbeats(tmp_path)] == [5, None]


@pytest.mark.parametrize(
    "gpu, want", [(None, None), (0, 0), (7, 7), (-1, "bad"), (True, "bad"), ("1", "bad")]
)
def test_parse_beat_takes_a_gpu_index_or_none(gpu: object, want: object) -> None:
    data = {"job_id": "1", "rank": 0, "host": "n", "time": 1.0, "step": 1, "window": 1}
    data |= {"step_time": 0.1, "compute_time": 0.1, "comm_time": 0.0, "gpu": gpu}
    beat = parse_beat(json.dumps(data))
    assert (beat is None) if want == "bad" else (beat is not None and beat.gpu == want)
    del data["gpu"]  # a writer from before the field
    old = parse_beat(json.dumps(data))
    assert old is not None and old.gpu is None


def test_file_name_and_no_temporary_files_left(tmp_path: Path) -> None:
    hb = Heartbeat(tmp_path / "new", "7", 0, "node1")
    hb.update(0, 0.1, 0.1, 0.0)
    job = tmp_path / "new" / "node1" / "7"
    assert [p.name for p in job.iterdir()] == ["7.0.json"]
    assert json.loads((job / "7.0.json").read_text())["host"] == "node1"
    hb.close()
    assert list(job.iterdir()) == []


def test_unwritable_directory_turns_heartbeat_off_without_raising(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    hb = Heartbeat(blocker / "sub", "1", 0, "node1")
    assert not hb.update(0, 0.1, 0.1, 0.0)
    assert not hb.enabled


def test_read_filters_by_host_and_skips_foreign_files(tmp_path: Path) -> None:
    for rank, host in enumerate(["node1", "node2", "node1"]):
        Heartbeat(tmp_path, "5", rank, host).update(0, 0.1, 0.1, 0.0)
    (tmp_path / "notes.json").write_text('{"hello": 1}')
    (tmp_path / ".5.9.json.123.tmp").write_text("{")
    assert [b.rank for b in read_heartbeats(tmp_path)] == [0, 1, 2]
    assert [b.rank for b in read_heartbeats(tmp_path, host="node1")] == [0, 2]
    assert read_heartbeats(tmp_path / "missing") == []


def test_directory_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLURM_CHAOS_HEARTBEAT_DIR", str(tmp_path))
    assert heartbeat_dir() == tmp_path
    assert heartbeat_dir("/x") == Path("/x")
    monkeypatch.delenv("SLURM_CHAOS_HEARTBEAT_DIR")
    assert heartbeat_dir() == Path("/run/slurm-chaos/heartbeat")


def _beat(rank: int, compute: float, job: str = "1", host: str = "node1") -> Beat:
    return Beat(job, rank, host, 0.0, 10, 10, compute + 0.01, compute, 0.01)


def test_straggler_ratio_against_median_of_other_ranks_of_the_same_job() -> None:
    beats = [_beat(0, 0.10), _beat(1, 0.11), _beat(2, 0.09), _beat(3, 0.20), _beat(0, 5.0, job="other")]
    assert straggler_ratio(beats[3], beats) == pytest.approx(0.20 / 0.10)
    assert straggler_ratio(beats[0], beats) == pytest.approx(0.10 / 0.11)
    assert straggler_ratio(beats[4], beats) is None


# ---------------------------------------------------------------- what a reader trusts


def _file(base: Path, node: str, job: str, rank: int, owner: int | None = None, **lies: object) -> Path:
    """A heartbeat file of `job`'s rank `rank` in node's directory; `lies` overwrite its fields."""
    data = {"job_id": job, "rank": rank, "host": node, "time": time.time(), "step": 1, "window": 10}
    data |= {"step_time": 0.1, "compute_time": 0.1, "comm_time": 0.0, **lies}
    path = base / node / job / f"{job}.{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    if owner is not None:
        os.chown(path, owner, owner)
    return path


def test_a_file_is_trusted_only_as_its_directory_vouches_for_it(tmp_path: Path) -> None:
    base = tmp_path / "hb"
    _file(base, "node1", "5", 0)
    _file(base, "node1", "5", 1, host="node2")  # a rank of node1's directory claiming node2
    _file(base, "node1", "5", 2, job_id="6")  # another job's rank in job 5's directory
    _file(base, "node1", "5", 3, owner=4242)  # someone else's file in the job's directory
    (base / "node1" / "5" / "5.4.json").symlink_to(_file(base, "node1", "9", 4))  # a link
    _file(base, "node1", "5", 5, step=1e999)  # malformed: never fatal to the others
    scan = scan_heartbeats(base)
    assert [(b.job_id, b.rank) for b in scan.beats] == [("5", 0), ("9", 4)]
    why = "\n".join(scan.rejected)
    assert "5.1.json: says job 5 rank 1 on node2" in why and "5.2.json: says job 6" in why
    assert "5.3.json: owned by uid 4242, not by the job's user 0" in why
    assert "5.4.json: Too many levels of symbolic links" in why and "5.5.json: malformed" in why


def test_time_is_never_later_than_the_files_last_change(tmp_path: Path) -> None:
    path = _file(tmp_path, "node1", "5", 0, time=1e12)
    (beat,) = read_heartbeats(tmp_path)
    assert beat.time == pytest.approx(path.stat().st_ctime) and not beat.fresh(beat.time + 60)


def test_a_heartbeat_directory_others_may_write_is_not_trusted(tmp_path: Path) -> None:
    _file(tmp_path / "hb", "node1", "5", 0)
    (tmp_path / "hb").chmod(0o1777)
    assert read_heartbeats(tmp_path / "hb") == []
    (tmp_path / "hb").chmod(0o755)
    os.chown(tmp_path / "hb" / "node1", 4242, 4242)  # a node directory not made by the prolog's root
    assert read_heartbeats(tmp_path / "hb") == []
    os.chown(tmp_path / "hb" / "node1", 0, 0)
    (tmp_path / "hb" / "node1" / "5").chmod(0o777)  # a job directory its user opened to everyone
    assert read_heartbeats(tmp_path / "hb") == []
    (tmp_path / "link").symlink_to(tmp_path / "hb")
    assert "Not a directory" in scan_heartbeats(tmp_path / "link").rejected[0]


@pytest.mark.skipif(not _can_mount(), reason="the job's tmpfs is mounted by root")
def test_prolog_makes_the_jobs_own_directory_and_the_epilog_removes_it(tmp_path: Path) -> None:
    base = tmp_path / "hb"
    env = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node3", "SLURM_JOB_UID": "4242", "SLURM_JOB_GID": "4343"}
    assert hook_main(["prolog", "--dir", str(base)], env) == 0
    job = base / "node3" / "77"
    st = job.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (4242, 4343, 0o755)
    assert (base.stat().st_mode & 0o7777, (base / "node3").stat().st_uid) == (0o755, 0)
    _file(base, "node3", "77", 0, owner=4242)
    (job / "squat").symlink_to(tmp_path)  # whatever the job left, no link is followed
    assert hook_main(["prolog", "--dir", str(base)], env) == 0  # a requeue: made afresh
    assert list(job.iterdir()) == [] and tmp_path.exists()
    assert hook_main(["epilog", "--dir", str(base)], env) == 0
    assert not job.exists()


def test_prolog_refuses_a_heartbeat_directory_others_may_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "hb"
    base.mkdir(mode=0o755)
    base.chmod(0o1777)
    env = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node3", "SLURM_JOB_UID": "4242", "SLURM_JOB_GID": "1"}
    assert hook_main(["prolog", "--dir", str(base)], env) == 0
    assert not (base / "node3").exists() and "not a directory of uid 0's alone" in capsys.readouterr().err
    assert hook_main(["prolog", "--dir", str(base)], {**env, "SLURM_JOB_ID": "../x"}) == 0
    assert "bad node or job name" in capsys.readouterr().err


@pytest.mark.skipif(not _can_mount(), reason="the job's tmpfs is mounted by root")
def test_the_jobs_directory_is_a_tmpfs_with_limits_and_the_epilog_takes_whatever_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #27 finding 4: 3,000 nested directories raised RecursionError out of the epilog; a
    large file pinned tmpfs memory; millions of files outran the hook's timeout."""
    base = tmp_path / "hb"
    env = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node3", "SLURM_JOB_UID": "4242", "SLURM_JOB_GID": "4343"}
    try:
        assert hook_main(["prolog", "--dir", str(base), "--size", str(1 << 20), "--inodes", "5000"], env) == 0
        job = base / "node3" / "77"
        assert jobfs.mounts_at_or_under(job) == [str(job)]
        _nest(job, 3000)
        for i in range(1000):
            (job / f"f{i}").write_text("")
        with pytest.raises(OSError, match="No space left"), open(job / "big", "wb") as fh:
            fh.write(b"\0" * (2 << 20))
        t0 = time.monotonic()
        assert hook_main(["epilog", "--dir", str(base)], env) == 0
        assert time.monotonic() - t0 < 5.0  # an unmount, not a walk
        assert capsys.readouterr().err == ""
        assert jobfs.mounts_at_or_under(base) == [] and sorted(os.listdir(base / "node3")) == [".trash"]
    finally:
        jobfs.detach(tmp_path, SubprocessRunner())


@pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root")
def test_a_deep_plain_directory_an_older_release_left_is_removed_by_the_epilog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "hb"
    (base / "node3" / "77").mkdir(parents=True)
    for d in (base, base / "node3"):
        d.chmod(0o755)
    _nest(base / "node3" / "77", 3000)
    env = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node3"}
    assert hook_main(["epilog", "--dir", str(base)], env) == 0
    assert capsys.readouterr().err == ""
    assert sorted(os.listdir(base / "node3")) == [".trash"] and os.listdir(base / "node3" / ".trash") == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root")
def test_a_failed_mount_gives_the_job_no_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "hb"
    env = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node3", "SLURM_JOB_UID": "4242", "SLURM_JOB_GID": "4343"}
    refuse = FakeRunner(lambda argv: Completed(argv, 32, "", "mount: only root can do that"))
    assert hook_main(["prolog", "--dir", str(base)], env, refuse) == 0
    assert not (base / "node3" / "77").exists()
    assert "only root can do that" in capsys.readouterr().err


@pytest.mark.skipif(not _can_mount(), reason="the job's tmpfs is mounted by root")
def test_the_hooks_sweep_storage_of_jobs_slurm_no_longer_runs_on_the_node(tmp_path: Path) -> None:
    """A job whose epilog never ran: no step socket of it in slurmd's spool, storage past the grace."""
    base, spool = tmp_path / "hb", tmp_path / "spool" / "node3"
    spool.mkdir(parents=True)
    for d in (tmp_path / "spool", spool):
        d.chmod(0o755)
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"SlurmdSpoolDir={tmp_path}/spool/%n\nPrologFlags=Alloc\n")
    env = {
        "SLURMD_NODENAME": "node3",
        "SLURM_JOB_UID": "4242",
        "SLURM_JOB_GID": "4343",
        "SLURM_CONF": str(conf),
    }
    try:
        for job in ("5", "6"):
            assert hook_main(["prolog", "--dir", str(base)], {**env, "SLURM_JOB_ID": job}) == 0
        _nest(base / "node3" / "5", 3000)
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(spool / "node3_6.4294967291"))  # job 6 still has its extern step
        now = time.time()
        # Without the extern step a job between two steps has none on the node: nothing is taken.
        assert sweep_node(base, "node3", None, env, now + 2 * jobfs.GRACE_S) == []
        conf.write_text(f"SlurmdSpoolDir={tmp_path}/spool/%n\nPrologFlags=Alloc,Contain\n")
        assert sweep_node(base, "node3", None, env, now) == []  # both too recent to tell
        done = sweep_node(base, "node3", None, env, now + 2 * jobfs.GRACE_S)
        assert done == [
            f"{base}/node3/5 detached [job no longer running]",
            f"{base}/node3/5 removed [job no longer running]",
        ]
        assert sorted(os.listdir(base / "node3")) == [".trash", "6"]
        assert jobfs.mounts_at_or_under(base) == [str(base / "node3" / "6")]
    finally:
        jobfs.detach(tmp_path, SubprocessRunner())
