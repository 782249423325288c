"""Which GPU is the job's: Slurm's GPU number -> PCI bus id -> NVML's index and DCGM's id.

Four numberings meet on a GPU node and need not agree:

- **Slurm** (``SLURM_JOB_GPUS`` in the prolog): the number in the name of the device file
  gres.conf gives (``/dev/nvidia2`` -> 2), that is the device's **minor number**, which the driver
  gives in the order it probes the GPUs.
- **NVML** (``nvidia-smi -i N``): its index, in PCI bus order by default.
- **DCGM** (``dcgmi --gpuid N``): the host engine's own ids, in the order it found the GPUs.
- **CUDA**: fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.

Minor numbers and PCI order differ on real machines (A100 and H100 baseboards among them), so a
Slurm number handed to ``nvidia-smi -i`` or ``dcgmi --gpuid`` unchanged may act on another job's
GPU. The one name all of them share is the PCI bus id: the driver's
``/proc/driver/nvidia/gpus/<bus id>/information`` gives each GPU's ``Device Minor`` (kernel-made,
readable by root, nothing a job can write), NVML gives each index's bus id (``--query-gpu=
index,pci.bus_id``) and DCGM each id's (``dcgmi discovery -l``). Every GPU fault goes through
:func:`address`, and a number that does not resolve everywhere it must is refused, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_chaos.errors import ChaosError
from slurm_chaos.gpu.nvsmi import GpuReading, bus_id

PROC_GPUS = Path("/proc/driver/nvidia/gpus")


class NumberingError(ChaosError):
    """A Slurm GPU number that does not name exactly one GPU of this node."""


@dataclass(frozen=True)
class DriverGpu:
    """One GPU as the kernel driver lists it: its bus id and device minor number."""

    bus_id: str
    minor: int
    model: str = ""


def parse_information(text: str) -> DriverGpu | None:
    """``/proc/driver/nvidia/gpus/<bus>/information`` (``Key: <tabs> value`` lines); None without a
    bus location or a minor number (drivers before 352 print no ``Device Minor``)."""
    info = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            info[key.strip()] = value.strip()
    minor = info.get("Device Minor", "")
    try:
        bus = bus_id(info.get("Bus Location", ""))
    except ValueError:
        return None
    return DriverGpu(bus, int(minor), info.get("Model", "")) if minor.isdigit() else None


def read_driver(root: Path = PROC_GPUS) -> tuple[DriverGpu, ...] | None:
    """Every GPU the driver lists, by minor number; None where there is no NVIDIA driver."""
    if not root.is_dir():
        return None
    found = []
    for entry in sorted(root.iterdir()):
        try:
            gpu = parse_information((entry / "information").read_text())
        except OSError:
            continue
        if gpu is not None:
            found.append(gpu)
    return tuple(sorted(found, key=lambda g: g.minor))


_DCGM_ID = re.compile(r"\|\s*(\d+)\s*\|")
_DCGM_BUS = re.compile(r"PCI Bus ID:\s*(\S+)")


def parse_dcgm_discovery(text: str) -> dict[str, int]:
    """``dcgmi discovery -l``: {bus id: DCGM GPU id}."""
    out: dict[str, int] = {}
    current: int | None = None
    for line in text.splitlines():
        if m := _DCGM_ID.match(line.strip()):
            current = int(m.group(1))
        elif (m := _DCGM_BUS.search(line)) and current is not None:
            try:
                out[bus_id(m.group(1))] = current
            except ValueError:
                continue
    return out


@dataclass(frozen=True)
class GpuAddress:
    """One GPU under each of its names: Slurm's number (the minor), its bus id, NVML's index,
    DCGM's id (None where not asked or not known)."""

    slurm: int
    bus_id: str
    nvml: int | None = None
    dcgm: int | None = None

    def describe(self) -> str:
        names = [f"Slurm's GPU {self.slurm}", self.bus_id]
        names += [f"NVML index {self.nvml}"] if self.nvml is not None else []
        names += [f"DCGM id {self.dcgm}"] if self.dcgm is not None else []
        return " = ".join(names)


def address(
    slurm: int,
    driver: Sequence[DriverGpu],
    nvml: Sequence[GpuReading] | None = None,
    dcgm: Mapping[str, int] | None = None,
) -> GpuAddress:
    """Slurm's GPU ``slurm`` under every name asked for (``nvml``/``dcgm`` given); NumberingError
    where one of them does not know it."""
    mine = [g for g in driver if g.minor == slurm]
    if len(mine) != 1:
        listed = ", ".join(f"{g.minor}={g.bus_id}" for g in driver) or "none"
        raise NumberingError(
            f"Slurm's GPU {slurm} (device minor {slurm}) is not one GPU of the driver's "
            f"(/proc/driver/nvidia/gpus minors: {listed})"
        )
    bus = mine[0].bus_id
    index = None
    if nvml is not None:
        by_bus = [r.index for r in nvml if r.bus_id == bus]
        if len(by_bus) != 1:
            raise NumberingError(
                f"Slurm's GPU {slurm} ({bus}) is not one of NVML's GPUs (nvidia-smi --query-gpu)"
            )
        index = by_bus[0]
    gpuid = None
    if dcgm is not None:
        if bus not in dcgm:
            raise NumberingError(
                f"Slurm's GPU {slurm} ({bus}) is not one of DCGM's GPUs (dcgmi discovery -l)"
            )
        gpuid = dcgm[bus]
    return GpuAddress(slurm, bus, index, gpuid)


def pci_order(slurm: int, driver: Sequence[DriverGpu]) -> int:
    """Slurm's GPU ``slurm`` as CUDA numbers it under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (and NVML by
    default): its place among the driver's GPUs sorted by bus id."""
    ordered = sorted(g.bus_id for g in driver)
    return ordered.index(address(slurm, driver).bus_id)
