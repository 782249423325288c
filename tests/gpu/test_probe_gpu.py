"""GPU paths of the probe: nccl, NVML telemetry and GPU NUMA locality. Skipped without CUDA/NVML."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slurm_chaos.probe import telemetry as tel
from slurm_chaos.probe.local import run_local
from slurm_chaos.probe.reader import read_run
from slurm_chaos.probe.schema import TELEMETRY_FIELDS


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


GPUS = _cuda_devices()
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="no CUDA device visible to torch")


@pytest.fixture(scope="module")
def nvml() -> Any:
    if GPUS == 0:
        pytest.skip("no CUDA device visible to torch")
    module, why = tel.load_nvml()
    if module is None:
        pytest.skip(f"NVML unavailable: {why}")
    return module


def _ok(results: list[Any]) -> None:
    assert all(r.returncode == 0 for r in results), "\n".join(r.stderr[-3000:] for r in results)


def test_gpu_info_agrees_with_nvml_and_sysfs(nvml: Any) -> None:
    info = tel.gpu_info(0, nvml)
    handle = nvml.nvmlDeviceGetHandleByUUID(info.uuid)
    assert info.uuid.startswith("GPU-")
    assert tel._str(nvml.nvmlDeviceGetPciInfo(handle).busId) == info.pci_bus_id
    sysfs = Path("/sys/bus/pci/devices") / tel.sysfs_bus_id(info.pci_bus_id)
    assert sysfs.exists(), f"{sysfs} missing"
    assert info.numa_node == int((sysfs / "numa_node").read_text())
    get_node = getattr(nvml, "nvmlDeviceGetNumaNodeId", None)
    if get_node is not None and info.numa_node >= 0:
        try:
            assert int(get_node(handle)) == info.numa_node
        except nvml.NVMLError_NotSupported:
            pass


def test_nvml_sampler_reads_real_values(nvml: Any) -> None:
    sampler = tel.NvmlSampler(nvml, tel.gpu_info(0, nvml).index, interval=0.1)
    _, values = sampler.sample_once()
    sample = dict(zip(TELEMETRY_FIELDS, values, strict=True))
    assert 5 < sample["gpu_temp_c"] < 110
    assert 5 < sample["gpu_power_w"] < 2000
    assert 100 < sample["gpu_sm_clock_mhz"] < 5000
    assert not math.isnan(sample["gpu_throttle_reasons"])
    sampler.start()
    import time

    time.sleep(1.0)
    sampler.stop()
    samples, events = sampler.drain()
    assert len(samples) >= 5
    assert all(kind != "telemetry_unavailable" for _, kind, _ in events), events


@needs_gpu
def test_nccl_training_writes_telemetry_and_placement(tmp_path: Path) -> None:
    world = min(GPUS, 2)  # NCCL refuses two ranks on one GPU
    args = [
        "--steps",
        "60",
        "--model-size",
        "small",
        "--out",
        str(tmp_path),
        "--progress-every",
        "20",
        "--telemetry-interval",
        "0.2",
    ]
    results = run_local(world, args, timeout=300)
    _ok(results)
    run = read_run(tmp_path)
    uuids = set()
    for rk in run.ranks:
        assert rk.attrs["backend"] == "nccl" and int(str(rk.attrs["gpu_index"])) >= 0
        uuids.add(rk.attrs["gpu_uuid"])
        assert str(rk.attrs["gpu_uuid"]).startswith("GPU-") and rk.attrs["gpu_pci_bus_id"]
        assert len(rk.step) == 60 and np.all(rk.step_time > 0)
        assert np.all(rk.fields["compute_time"] > 0)
        if world > 1:
            assert np.all(rk.comm_time > 0)
        assert len(rk.telemetry.get("time", [])) >= 2, "NVML sampler wrote no samples"
        assert np.nanmax(rk.telemetry["gpu_power_w"]) > 0
        cpu_nodes = {int(n) for n in str(rk.attrs["cpu_numa_nodes"]).split(",") if n}
        gpu_node = int(str(rk.attrs["gpu_numa_node"]))
        expected = gpu_node >= 0 and bool(cpu_nodes) and gpu_node not in cpu_nodes
        assert bool(rk.attrs["numa_mismatch"]) == expected
        assert any(e.kind == "numa_mismatch" for e in rk.events) == expected
    assert len(uuids) == world
    assert len({float(str(r.attrs["param_checksum"])) for r in run.ranks}) == 1


@needs_gpu
def test_nccl_allreduce_sweep(tmp_path: Path) -> None:
    world = min(GPUS, 2)
    args = [
        "--mode",
        "allreduce",
        "--steps",
        "10",
        "--min-bytes",
        "1048576",
        "--max-bytes",
        str(64 * 2**20),
        "--out",
        str(tmp_path),
    ]
    _ok(run_local(world, args, timeout=300))
    for rk in read_run(tmp_path).ranks:
        ar = rk.allreduce
        assert ar["size_bytes"].tolist() == [2**e for e in range(20, 27)]
        assert np.all(ar["algbw"] > 0)
        assert np.allclose(ar["busbw"], ar["algbw"] * 2 * (world - 1) / world)


def _other_numa_node(gpu_node: int) -> int | None:
    nodes = sorted(
        int(p.name[4:]) for p in tel.SYSFS_NODES.glob("node[0-9]*") if (p / "cpulist").read_text().strip()
    )
    others = [n for n in nodes if n != gpu_node]
    return others[0] if others else None


@needs_gpu
def test_numa_mismatch_is_recorded_when_pinned_away_from_the_gpu(nvml: Any, tmp_path: Path) -> None:
    if shutil.which("numactl") is None:
        pytest.skip("numactl is not installed")
    gpu_node = tel.gpu_info(0, nvml).numa_node
    if gpu_node < 0:
        pytest.skip("sysfs does not give the GPU's NUMA node")
    other = _other_numa_node(gpu_node)
    if other is None:
        pytest.skip("a single NUMA node with CPUs: nothing to mismatch")
    import subprocess
    import sys

    from slurm_chaos.probe.local import rank_env

    env = rank_env(0, 1, 0) | {"CUDA_VISIBLE_DEVICES": "0"}
    env.pop("RANK")
    env.pop("WORLD_SIZE")
    argv = [
        "numactl",
        f"--cpunodebind={other}",
        sys.executable,
        "-m",
        "slurm_chaos.probe",
        "--steps",
        "5",
        "--out",
        str(tmp_path),
        "--progress-every",
        "0",
    ]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    rk = read_run(tmp_path).ranks[0]
    assert rk.attrs["numa_mismatch"] is True and rk.attrs["gpu_numa_node"] == gpu_node
    assert any(e.kind == "numa_mismatch" and f"NUMA node {gpu_node}" in e.detail for e in rk.events)


@needs_gpu
def test_nccl_resume_from_checkpoint(tmp_path: Path) -> None:
    world = min(GPUS, 2)
    common = ["--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "10", "--progress-every", "0"]
    _ok(run_local(world, ["--steps", "25", "--out", str(tmp_path / "out"), *common], timeout=300))
    _ok(run_local(world, ["--steps", "40", "--out", str(tmp_path / "out"), *common], timeout=300))
    for rk in read_run(tmp_path / "out").ranks:
        assert rk.attrs["restart_step"] == 20 and rk.attrs["steps_lost"] == 5
        assert any(e.kind == "checkpoint_saved" for e in rk.events)
