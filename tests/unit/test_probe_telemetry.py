"""Telemetry: placement facts from (fake and real) sysfs, memory policy, and the NVML sampler's logic."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from gpu_captures import MACHINES, load, needs_captures

from slurm_chaos.gpu import nvsmi
from slurm_chaos.probe import telemetry as tel
from slurm_chaos.probe.schema import TELEMETRY_FIELDS
from slurm_chaos.resources import import_root


@pytest.mark.parametrize(
    ("text", "cpus"), [("0-2,5", {0, 1, 2, 5}), ("7", {7}), ("", set()), ("0-1,3-4\n", {0, 1, 3, 4})]
)
def test_cpulist_roundtrip(text: str, cpus: set[int]) -> None:
    assert tel.parse_cpulist(text) == cpus
    assert tel.parse_cpulist(tel.format_cpulist(cpus)) == cpus


def test_format_cpulist_compacts_ranges() -> None:
    assert tel.format_cpulist([5, 0, 1, 2, 9, 10]) == "0-2,5,9-10"


def _fake_nodes(root: Path, layout: dict[int, str]) -> Path:
    for node, cpulist in layout.items():
        (root / f"node{node}").mkdir(parents=True)
        (root / f"node{node}" / "cpulist").write_text(cpulist + "\n")
    return root


def test_numa_nodes_of_cpus(tmp_path: Path) -> None:
    nodes = _fake_nodes(tmp_path, {0: "0-15,32-47", 1: "16-31,48-63", 10: "64-71"})
    assert tel.numa_nodes_of([1, 2], nodes) == (0,)
    assert tel.numa_nodes_of([15, 16], nodes) == (0, 1)
    assert tel.numa_nodes_of([65], nodes) == (10,)
    assert tel.numa_nodes_of([100], nodes) == ()


def test_pci_numa_node_from_sysfs(tmp_path: Path) -> None:
    dev = tmp_path / "0000:3b:00.0"
    dev.mkdir()
    (dev / "numa_node").write_text("1\n")
    assert tel.sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert tel.pci_numa_node("00000000:3B:00.0", tmp_path) == 1
    assert tel.pci_numa_node("00000000:AF:00.0", tmp_path) == -1


def test_numa_mismatch() -> None:
    host = tel.HostInfo("n1", (0, 1), (0,), "default", "0-1")
    assert tel.numa_mismatch(host, tel.GpuInfo(0, "GPU-x", "0000:3b:00.0", 1))
    assert not tel.numa_mismatch(host, tel.GpuInfo(0, "GPU-x", "0000:3b:00.0", 0))
    assert not tel.numa_mismatch(host, tel.GpuInfo(0, "GPU-x", "0000:3b:00.0", -1))  # platform does not say
    assert not tel.numa_mismatch(host, None)


def test_host_info_of_this_process() -> None:
    info = tel.host_info()
    assert set(info.cpus) == set(__import__("os").sched_getaffinity(0))
    if Path("/sys/devices/system/node/node0").exists():
        assert info.cpu_numa_nodes
    assert info.mempolicy == "default"


@pytest.mark.parametrize(
    ("flag", "expected"), [("--membind=0", "bind:0"), ("--interleave=0", "interleave:0")]
)
def test_mempolicy_seen_under_numactl(flag: str, expected: str) -> None:
    if not Path("/usr/bin/numactl").exists():
        pytest.skip("numactl is not installed")
    code = "from slurm_chaos.probe.telemetry import mempolicy; print(mempolicy())"
    out = subprocess.run(
        ["numactl", flag, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=import_root(),
        check=True,
    )
    assert out.stdout.strip() == expected


class FakeNvml:
    """Just enough of pynvml's surface, with values the test changes between samples."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self) -> None:
        self.reasons = 0x1
        self.ecc = [0, 0]
        self.xids: list[int] = []

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu{index}"

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        return 61

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        return 312_500

    def nvmlDeviceGetClockInfo(self, handle: str, clock: int) -> int:
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: str) -> int:
        return self.reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: str, kind: int, counter: int) -> int:
        if kind == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            raise RuntimeError("NVMLError_NotSupported")
        return self.ecc[kind]

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceRegisterEvents(self, handle: str, kinds: int, event_set: str) -> None:
        pass

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        if self.xids:
            return SimpleNamespace(eventData=self.xids.pop(0))
        time.sleep(timeout_ms / 1000 / 10)
        raise type("NVMLError_Timeout", (Exception,), {})()

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass


def test_sampler_reads_fields_and_derives_events() -> None:
    nvml = FakeNvml()
    sampler = tel.NvmlSampler(nvml, 0)
    _, values = sampler.sample_once()
    sample = dict(zip(TELEMETRY_FIELDS, values, strict=True))
    assert (
        sample["gpu_temp_c"] == 61 and sample["gpu_power_w"] == 312.5 and sample["gpu_sm_clock_mhz"] == 1980
    )
    assert sample["gpu_ecc_volatile_dbe"] != sample["gpu_ecc_volatile_dbe"]  # NaN: not supported
    nvml.reasons = 0x40 | 0x1  # hardware thermal slowdown begins
    nvml.ecc[0] = 3
    sampler.sample_once()
    sampler.sample_once()  # unchanged: no new events
    _, events = sampler.drain()
    kinds = [k for _, k, _ in events]
    assert kinds.count("gpu_throttle") == 1 and "0x41" in events[kinds.index("gpu_throttle")][2]
    assert kinds.count("gpu_ecc") == 1 and "sbe count 0 -> 3" in events[kinds.index("gpu_ecc")][2]


def test_sampler_idle_reason_is_not_throttling() -> None:
    nvml = FakeNvml()
    sampler = tel.NvmlSampler(nvml, 0)
    nvml.reasons = 0x1 | 0x2  # idle, application clocks: not a slowdown
    sampler.sample_once()
    assert sampler.drain()[1] == []


def test_sampler_threads_report_xid_events() -> None:
    nvml = FakeNvml()
    nvml.xids = [79]
    sampler = tel.NvmlSampler(nvml, 0, interval=0.05)
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    samples, events = sampler.drain()
    assert len(samples) >= 2
    assert ("gpu_xid", "Xid 79") in [(k, d) for _, k, d in events]


def test_load_nvml_without_gpu_says_why() -> None:
    nvml, why = tel.load_nvml()
    if nvml is not None:
        pytest.skip("NVML works on this machine")
    assert why and "\n" not in why


class CapturedNvml(FakeNvml):
    """NVML answering with the values a captured GPU's nvidia-smi query shows (NVML is where
    nvidia-smi reads them: power in mW, clocks in MHz, the clock-event reasons' bitmask)."""

    def __init__(self, row: dict[str, str | None]) -> None:
        super().__init__()
        self.row = row
        self.reasons = nvsmi.bitmask(row["clocks_event_reasons.active"]) or 0

    def _number(self, field: str) -> float:
        value = nvsmi.number(self.row[field])
        if value is None:
            raise RuntimeError("NVMLError_NotSupported")
        return value

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        return int(self._number("temperature.gpu"))

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        return round(self._number("power.draw") * 1000)

    def nvmlDeviceGetClockInfo(self, handle: str, clock: int) -> int:
        return int(self._number("clocks.current.sm"))

    def nvmlDeviceGetTotalEccErrors(self, handle: str, kind: int, counter: int) -> int:
        which = "uncorrected" if kind == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "corrected"
        return int(self._number(f"ecc.errors.{which}.volatile.total"))


@needs_captures
@pytest.mark.parametrize("phase", ["idle", "load"])
@pytest.mark.parametrize("machine", MACHINES)
def test_sampler_on_the_captured_gpus(machine: str, phase: str, tmp_path: Path) -> None:
    """Each sample holds what the GPU reported; idle (gpu_idle) and unthrottled load raise no event."""
    (row,) = nvsmi.parse_query(load(machine).output(phase, "nvidia-smi --query-gpu="))
    sampler = tel.NvmlSampler(CapturedNvml(row), 0)
    _, values = sampler.sample_once()
    sample = dict(zip(TELEMETRY_FIELDS, values, strict=True))
    assert sample["gpu_sm_clock_mhz"] == nvsmi.number(row["clocks.current.sm"])
    assert sample["gpu_power_w"] == pytest.approx(nvsmi.number(row["power.draw"]))
    assert sample["gpu_temp_c"] == nvsmi.number(row["temperature.gpu"])
    assert sample["gpu_throttle_reasons"] == nvsmi.bitmask(row["clocks_event_reasons.active"])
    assert (sample["gpu_ecc_volatile_dbe"], sample["gpu_ecc_volatile_sbe"]) == (0, 0)
    assert sampler.drain()[1] == []
    # NVML's bus id (00000000:00:09.0) finds the GPU's NUMA node in sysfs (0000:00:09.0).
    bus = row["pci.bus_id"]
    assert bus is not None
    (tmp_path / tel.sysfs_bus_id(bus)).mkdir()
    (tmp_path / tel.sysfs_bus_id(bus) / "numa_node").write_text("0\n")
    assert tel.pci_numa_node(bus, tmp_path) == 0
