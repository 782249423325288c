"""Background checkpoints: atomic files, pruning, and storage that fails or hangs."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from waiting import wait_until

from slurm_chaos.clock import FakeClock
from slurm_chaos.probe import checkpoint as ckpt


def _state(n: int = 1000) -> dict[str, object]:
    return {"model": {"w": torch.arange(n, dtype=torch.float32)}, "optimizer": {"step": 3}}


def _wait_events(c: ckpt.Checkpointer, count: int, timeout: float = 10.0) -> list[tuple[float, str, str]]:
    events: list[tuple[float, str, str]] = []
    deadline = time.monotonic() + timeout
    while len(events) < count and time.monotonic() < deadline:
        events += c.poll()
        time.sleep(0.01)
    return events


def test_checkpoint_dir_is_per_job() -> None:
    root = Path("/ckpt")
    assert ckpt.checkpoint_dir(root, "my job/1", "77") == root / "my_job_1-77"
    assert ckpt.checkpoint_dir(root, "", "") == root / "probe"


def test_saves_atomically_and_keeps_last_two(tmp_path: Path) -> None:
    c = ckpt.Checkpointer(tmp_path, rank=1)
    for step in (10, 20, 30):
        assert c.start(step, lambda: _state())
        assert c.wait(10)
    events = c.poll()
    assert [k for _, k, _ in events] == ["checkpoint_saved"] * 3
    assert ckpt.complete_steps(tmp_path, 1) == [30, 20]
    assert sorted(os.listdir(tmp_path)) == ["ckpt-step00000020-rank1.pt", "ckpt-step00000030-rank1.pt"]
    assert ckpt.load(tmp_path, 30, 1)["model"]["w"].sum().item() == sum(range(1000))
    assert c.failures == 0


def test_cpu_copy_is_independent_of_training() -> None:
    w = torch.zeros(3)
    copy = ckpt.cpu_copy({"model": {"w": w}, "list": [w]})
    w.add_(1)
    assert copy["model"]["w"].tolist() == [0, 0, 0] and copy["list"][0].tolist() == [0, 0, 0]


def test_hung_write_is_reported_and_not_doubled(tmp_path: Path) -> None:
    release = threading.Event()
    calls: list[int] = []

    def slow_save(state: object) -> bytes:
        calls.append(1)
        release.wait(30)
        return b"late but fine"

    clock = FakeClock()
    c = ckpt.Checkpointer(tmp_path, rank=0, timeout_s=0.2, save=slow_save, clock=clock)
    assert c.start(10, lambda: _state())
    wait_until(lambda: calls)  # the write is under way
    clock.advance(0.1)
    assert c.poll() == []  # not yet past the timeout
    clock.advance(0.2)
    copies: list[int] = []
    assert not c.start(20, lambda: copies.append(1))  # the interval comes while the write hangs: skipped
    assert copies == []  # and the training thread did not even copy the state
    events = c.poll()
    assert [k for _, k, _ in events] == ["checkpoint_hang", "checkpoint_skipped"]
    assert "still writing after 0.3 s (timeout 0.2 s)" in events[0][2]
    assert len(calls) == 1
    release.set()
    assert c.wait(10)
    late = c.poll()
    assert [k for _, k, _ in late] == ["checkpoint_saved"] and "after a hang" in late[0][2]
    assert c.start(30, lambda: _state())  # the next interval writes again
    assert c.wait(10) and c.failures == 1


def _mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir(exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {res.stderr.strip()}")


@pytest.fixture
def full_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "full"
    _mount_tmpfs(path, "size=64k")
    yield path
    subprocess.run(["umount", str(path)], check=True)


@pytest.fixture
def readonly_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "ro"
    _mount_tmpfs(path, "ro,size=64k")
    yield path
    subprocess.run(["umount", str(path)], check=True)


def test_full_disk_is_checkpoint_failed_enospc(full_dir: Path) -> None:
    c = ckpt.Checkpointer(full_dir / "job-1", rank=0)
    assert c.start(10, lambda: _state(100_000))  # 400 kB into 64 kB
    assert c.wait(10)
    events = c.poll()
    assert [k for _, k, _ in events] == ["checkpoint_failed"]
    assert "ENOSPC" in events[0][2]
    assert os.listdir(full_dir / "job-1") == []  # the temporary file was removed
    assert c.failures == 1


def test_readonly_dir_is_checkpoint_failed_erofs(readonly_dir: Path) -> None:
    c = ckpt.Checkpointer(readonly_dir / "job-1", rank=0)
    c.start(10, lambda: _state())
    c.wait(10)
    events = c.poll()
    assert [k for _, k, _ in events] == ["checkpoint_failed"] and "EROFS" in events[0][2]
