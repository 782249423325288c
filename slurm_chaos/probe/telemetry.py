"""Where a rank runs (host, CPUs, NUMA nodes, memory policy, GPU) and what its GPU reports over the run.

Host facts come from the kernel (sched_getaffinity, sysfs, get_mempolicy). GPU facts come from
torch and sysfs, and samples (clocks, temperature, power, clock-event reasons, ECC counters, XID
events) from NVML through nvidia-ml-py, in background threads that hand results to the main
thread through a queue: the HDF5 writer is only ever touched by the main thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Clock-event reasons that slow the GPU down (re-exported: observe's checks use them too).
from slurm_chaos.gpu.nvsmi import SLOWDOWN_MASK as SLOWDOWN_MASK
from slurm_chaos.gpu.nvsmi import bus_id
from slurm_chaos.probe.schema import TELEMETRY_FIELDS

SYSFS_NODES = Path("/sys/devices/system/node")
SYSFS_PCI = Path("/sys/bus/pci/devices")
_MPOL_MODES = ("default", "preferred", "bind", "interleave", "local", "preferred_many", "weighted_interleave")
_GET_MEMPOLICY = {"x86_64": 239, "aarch64": 236, "ppc64le": 260}

Sample = tuple[float, tuple[float, ...]]
Event = tuple[float, str, str]


@dataclass(frozen=True)
class HostInfo:
    """The host and CPU/memory placement of this process."""

    host: str
    cpus: tuple[int, ...]
    cpu_numa_nodes: tuple[int, ...]
    mempolicy: str
    mems_allowed: str


@dataclass(frozen=True)
class GpuInfo:
    """The GPU a rank drives; numa_node is -1 where the platform does not say."""

    index: int
    uuid: str
    pci_bus_id: str
    numa_node: int
    name: str = ""


def format_cpulist(cpus: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (the kernel's cpulist format)."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def parse_cpulist(text: str) -> set[int]:
    """``"0-2,5"`` -> ``{0, 1, 2, 5}``; empty text is the empty set."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def numa_nodes_of(cpus: Iterable[int], nodes_dir: Path = SYSFS_NODES) -> tuple[int, ...]:
    """The NUMA nodes whose cpulist holds any of `cpus`; () where sysfs has no node directories."""
    wanted = set(cpus)
    found = []
    for node in sorted(nodes_dir.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        try:
            if wanted & parse_cpulist((node / "cpulist").read_text()):
                found.append(int(node.name[4:]))
        except (OSError, ValueError):
            continue
    return tuple(found)


def mempolicy() -> str:
    """This thread's memory policy as ``mode`` or ``mode:nodes`` (get_mempolicy(2)); "unknown" if not."""
    nr = _GET_MEMPOLICY.get(platform.machine())
    libc_name = ctypes.util.find_library("c")
    if nr is None or libc_name is None:
        return "unknown"
    libc = ctypes.CDLL(libc_name, use_errno=True)
    mode = ctypes.c_int(0)
    mask = (ctypes.c_ulong * 16)()
    maxnode = ctypes.sizeof(mask) * 8
    if libc.syscall(nr, ctypes.byref(mode), mask, ctypes.c_ulong(maxnode), None, ctypes.c_ulong(0)) != 0:
        return "unknown"
    # Flags (MPOL_F_STATIC_NODES...) sit in the high bits of mode.
    name = _MPOL_MODES[mode.value & 0xFF] if (mode.value & 0xFF) < len(_MPOL_MODES) else str(mode.value)
    bits = [i for i in range(maxnode) if mask[i // 64] >> (i % 64) & 1]
    return name if name in ("default", "local") or not bits else f"{name}:{format_cpulist(bits)}"


def _mems_allowed() -> str:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Mems_allowed_list:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def host_info() -> HostInfo:
    """Facts about this process's placement, read once at start."""
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    return HostInfo(socket.gethostname(), cpus, numa_nodes_of(cpus), mempolicy(), _mems_allowed())


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` -> sysfs's ``0000:3b:00.0``; text that is no bus id, lower-cased."""
    try:
        return bus_id(nvml_bus_id)
    except ValueError:
        return nvml_bus_id.strip().lower()


def pci_numa_node(bus_id: str, pci_dir: Path = SYSFS_PCI) -> int:
    """The NUMA node sysfs gives for a PCI device; -1 when unknown (as sysfs itself says)."""
    try:
        return int((pci_dir / sysfs_bus_id(bus_id) / "numa_node").read_text())
    except (OSError, ValueError):
        return -1


def numa_mismatch(host: HostInfo, gpu: GpuInfo | None) -> bool:
    """True when the GPU sits on a NUMA node none of the task's CPUs belong to."""
    if gpu is None or gpu.numa_node < 0 or not host.cpu_numa_nodes:
        return False
    return gpu.numa_node not in host.cpu_numa_nodes


def load_nvml() -> tuple[Any, str]:
    """The initialised pynvml module, or None and the reason it is not available."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml raises NVMLError subclasses built at run time
        return None, f"NVML did not initialise ({exc})"
    return pynvml, ""


def gpu_info(device: int, nvml: Any) -> GpuInfo:
    """Describe CUDA device `device` (as this process numbers it) through torch and, if present, NVML."""
    import torch

    props = torch.cuda.get_device_properties(device)
    uuid = str(getattr(props, "uuid", ""))
    uuid = uuid if not uuid or uuid.startswith("GPU-") else f"GPU-{uuid}"
    bus = ""
    pci = [getattr(props, a, None) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if all(isinstance(v, int) for v in pci):
        bus = f"{pci[0]:08x}:{pci[1]:02x}:{pci[2]:02x}.0"
    index = device
    if nvml is not None and uuid:
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            index = int(nvml.nvmlDeviceGetIndex(handle))
            bus = _str(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except Exception as exc:  # an NVML that cannot map the UUID still leaves torch's view
            print(f"probe: NVML does not know CUDA device {device} ({uuid}): {exc}", file=sys.stderr)
    return GpuInfo(index, uuid, bus, pci_numa_node(bus) if bus else -1, str(props.name))


def _str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSampler:
    """Samples one GPU every `interval` s and watches its XID events, each in a daemon thread.

    Samples and events are queued; the main thread drains them with :meth:`drain`. Throttle reasons
    that begin to slow the GPU down and ECC counters that grow are turned into events too.
    """

    def __init__(self, nvml: Any, gpu_index: int, interval: float = 1.0) -> None:
        self.nvml = nvml
        self.handle = nvml.nvmlDeviceGetHandleByIndex(gpu_index)
        self.interval = interval
        self.samples: queue.SimpleQueue[Sample] = queue.SimpleQueue()
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._last_reasons = 0
        self._last_ecc = (0.0, 0.0)

    def start(self) -> None:
        for target in (self._sample_loop, self._xid_loop):
            t = threading.Thread(target=target, daemon=True, name=f"probe-{target.__name__}")
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2 * self.interval + 1)

    def drain(self) -> tuple[list[Sample], list[Event]]:
        return _drain(self.samples), _drain(self.events)

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval)

    def sample_once(self) -> Sample:
        """Read every field once, queue the sample and any events it implies."""
        n = self.nvml
        values = {
            "gpu_temp_c": self._read(lambda: n.nvmlDeviceGetTemperature(self.handle, n.NVML_TEMPERATURE_GPU)),
            "gpu_power_w": self._read(lambda: n.nvmlDeviceGetPowerUsage(self.handle) / 1000.0),
            "gpu_sm_clock_mhz": self._read(lambda: n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM)),
            "gpu_throttle_reasons": self._read(self._clock_event_reasons),
            "gpu_ecc_volatile_dbe": self._read(lambda: self._ecc(n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)),
            "gpu_ecc_volatile_sbe": self._read(lambda: self._ecc(n.NVML_MEMORY_ERROR_TYPE_CORRECTED)),
        }
        now = time.time()
        sample = (now, tuple(values[name] for name in TELEMETRY_FIELDS))
        self.samples.put(sample)
        self._derive_events(now, values)
        return sample

    def _clock_event_reasons(self) -> float:
        n = self.nvml
        get = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return float(get(self.handle))

    def _ecc(self, kind: int) -> float:
        n = self.nvml
        return float(n.nvmlDeviceGetTotalEccErrors(self.handle, kind, n.NVML_VOLATILE_ECC))

    @staticmethod
    def _read(getter: Callable[[], float]) -> float:
        try:
            return float(getter())
        except Exception:  # NVMLError_NotSupported and friends: the field is simply absent
            return float("nan")

    def _derive_events(self, now: float, values: dict[str, float]) -> None:
        reasons = values["gpu_throttle_reasons"]
        if reasons == reasons:  # not NaN
            slow = int(reasons) & SLOWDOWN_MASK
            if slow and slow != self._last_reasons & SLOWDOWN_MASK:
                self.events.put((now, "gpu_throttle", f"clock-event reasons 0x{int(reasons):x}"))
            self._last_reasons = int(reasons)
        ecc = (values["gpu_ecc_volatile_dbe"], values["gpu_ecc_volatile_sbe"])
        for label, new, old in zip(("dbe", "sbe"), ecc, self._last_ecc, strict=True):
            if new == new and new > old:
                self.events.put((now, "gpu_ecc", f"volatile {label} count {old:g} -> {new:g}"))
        self._last_ecc = (
            ecc[0] if ecc[0] == ecc[0] else self._last_ecc[0],
            ecc[1] if ecc[1] == ecc[1] else self._last_ecc[1],
        )

    def _xid_loop(self) -> None:
        n = self.nvml
        try:
            event_set = n.nvmlEventSetCreate()
            n.nvmlDeviceRegisterEvents(self.handle, n.nvmlEventTypeXidCriticalError, event_set)
        except Exception as exc:
            self.events.put((time.time(), "telemetry_unavailable", f"XID events: {exc}"))
            return
        wait = getattr(n, "nvmlEventSetWait_v2", None) or n.nvmlEventSetWait
        while not self._stop.is_set():
            try:
                data = wait(event_set, 500)
            except Exception as exc:
                # NVML_ERROR_TIMEOUT: nothing happened in this window; anything else: do not spin.
                if type(exc).__name__ != "NVMLError_Timeout":
                    self._stop.wait(0.5)
                continue
            self.events.put((time.time(), "gpu_xid", f"Xid {int(data.eventData)}"))
        n.nvmlEventSetFree(event_set)


def _drain(q: queue.SimpleQueue[Any]) -> list[Any]:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out
