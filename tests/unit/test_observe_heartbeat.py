"""Heartbeat files: atomic, rate-limited, windowed means, read back and filtered by host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_chaos.observe.heartbeat import Beat, Heartbeat, heartbeat_dir, read_heartbeats, straggler_ratio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_update_writes_at_most_once_per_interval_with_window_means(tmp_path: Path) -> None:
    clock = Clock()
    hb = Heartbeat(tmp_path, "42", 1, "node2", world_size=4, mode="allreduce", window=3, clock=clock)
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


def test_file_name_and_no_temporary_files_left(tmp_path: Path) -> None:
    hb = Heartbeat(tmp_path / "new", "7", 0, "node1")
    hb.update(0, 0.1, 0.1, 0.0)
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["7.0.json"]
    assert json.loads((tmp_path / "new" / "7.0.json").read_text())["host"] == "node1"
    hb.close()
    assert list((tmp_path / "new").iterdir()) == []


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
