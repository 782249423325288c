"""The workload: bandwidth definitions, and data parallelism that really equals DDP's averaging."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slurm_chaos.probe.local import run_local
from slurm_chaos.probe.reader import read_run
from slurm_chaos.probe.workload import MODEL_SIZES, Trainer, bus_bandwidth, message_sizes


def test_message_sizes_are_powers_of_two() -> None:
    assert message_sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    assert message_sizes(1000, 5000) == [1024, 2048, 4096]
    assert message_sizes(1, 4) == [4]


def test_busbw_matches_nccl_tests() -> None:
    assert bus_bandwidth(10.0, 2) == 10.0
    assert bus_bandwidth(10.0, 8) == pytest.approx(17.5)
    assert bus_bandwidth(10.0, 1) == 0.0


def test_gradients_are_views_of_the_flat_buffer() -> None:
    torch.set_num_threads(1)
    t = Trainer(MODEL_SIZES["tiny"], torch.device("cpu"), seed=3, rank=0, world_size=1, bucket_mb=0.1)
    ptrs = [p.grad.data_ptr() for p in t.params if p.grad is not None]
    for step in range(2):
        t.step(step)
    assert [p.grad.data_ptr() for p in t.params if p.grad is not None] == ptrs
    assert len(t.buckets) > 1 and sum(b.numel() for b in t.buckets) == t.numel
    assert float(t.flat_grad.abs().sum()) > 0


def _reference_checksum(steps: int, seed: int, world: int) -> float:
    """One process doing by hand what the ranks must do together: average the ranks' gradients."""
    torch.set_num_threads(1)
    t = Trainer(MODEL_SIZES["tiny"], torch.device("cpu"), seed=seed, rank=0, world_size=1)
    for step in range(steps):
        total = torch.zeros_like(t.flat_grad)
        for rank in range(world):
            t.rank = rank
            x, y = t.batch(step)
            t._forward_backward(x, y)
            total += t.flat_grad
        t.flat_grad.copy_(total / world)
        t.optimizer.step()
    return t.checksum()


@pytest.mark.spawns
def test_two_ranks_train_like_ddp(tmp_path: Path) -> None:
    results = run_local(
        2,
        [
            "--steps",
            "6",
            "--out",
            str(tmp_path),
            "--seed",
            "7",
            "--progress-every",
            "0",
            "--bucket-mb",
            "0.2",
        ],
    )
    assert [r.returncode for r in results] == [0, 0], results[0].stderr + results[1].stderr
    run = read_run(tmp_path)
    sums = [float(str(r.attrs["param_checksum"])) for r in run.ranks]
    assert sums[0] == sums[1]
    assert sums[0] == pytest.approx(_reference_checksum(6, 7, 2), rel=1e-9, abs=1e-6)
    assert sums[0] != pytest.approx(_reference_checksum(6, 7, 1), rel=1e-9, abs=1e-6)  # the averaging matters
