"""nvidia-smi's output as records: ``--query-gpu`` CSV, ``topo -m``, ``-L``, and PCI bus ids.

What real GPUs print (H100, H100 in MIG mode, H200, L40S; drivers 590 and 595) and these parsers
expect:

- A cell a device does not report is ``[N/A]``, ``N/A``, ``[Not Supported]``, ``[Requested
  functionality has been deprecated]`` (power.management on Hopper) or ``[Unknown Error]``; every
  one of them is None here, never 0.
- ``--format=csv`` puts the unit in the header (``power.draw [W]``) and after each number
  (``69.85 W``, ``1980 MHz``, ``0 %``, ``200740215 us``); ``nounits`` leaves both out. Both read
  the same: a field is named without its unit, a number is read without it.
- Bus ids: NVML writes ``00000000:00:09.0`` (8-digit domain, upper-case hex), sysfs and
  ``/proc/driver/nvidia`` ``0000:00:09.0``, and NVRM's Xid lines ``PCI:0000:00:09`` (no function).
  :func:`bus_id` brings each to sysfs's form, the one key every table here is looked up by.
- ``topo -m`` underlines its header with terminal escapes and pads columns with extra tabs.
- ``mig.mode.current`` is ``Enabled``/``Disabled`` where the GPU has MIG, ``[N/A]`` where it has
  none (L40S).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Row = Mapping[str, str | None]

_UNSET = re.compile(r"\[.*\]|N/A|")
_UNIT = re.compile(r"\s*\[[^\]]*\]$")
_NUMBER = re.compile(r"([-+]?\d+(?:\.\d+)?)(?:\s*[A-Za-z%]+)?")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_BUS = re.compile(r"(?:PCI:)?(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?")

#: NVML's clock-event reasons (nvmlClocksEventReason*), by the name nvidia-smi gives each field.
CLOCK_EVENT_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
#: Reasons that mean the GPU is being slowed down, not idling or obeying a clock setting.
SLOWDOWN_MASK = sum(
    CLOCK_EVENT_BITS[n]
    for n in (
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    )
)


def cell(text: str | None) -> str | None:
    """A CSV cell as text; None where the device does not report it (``[N/A]``, ``[Not Supported]``...)."""
    if text is None:
        return None
    value = text.strip()
    return None if _UNSET.fullmatch(value) else value


def number(text: str | None) -> float | None:
    """``"69.85 W"``, ``"1980 MHz"``, ``"0 %"``, ``"700.00"`` -> the number; None where not reported."""
    value = cell(text)
    m = _NUMBER.fullmatch(value) if value is not None else None
    return float(m.group(1)) if m else None


def bitmask(text: str | None) -> int | None:
    """``"0x0000000000000001"`` (clock-event reasons) -> 1; None where not reported."""
    value = cell(text)
    try:
        return int(value, 16) if value is not None and value.lower().startswith("0x") else None
    except ValueError:
        return None


def field_name(header: str) -> str:
    """``"power.draw [W]"`` -> ``"power.draw"``."""
    return _UNIT.sub("", header.strip())


def parse_query(text: str, fields: Sequence[str] = ()) -> tuple[dict[str, str | None], ...]:
    """``nvidia-smi --query-gpu=... --format=csv`` (one row per GPU) as {field: cell}.

    The header names the fields; for ``noheader`` output pass them as ``fields``. Cells a device
    does not report are None. A row with another number of cells than fields is left out.
    """
    rows = [r for r in csv.reader(io.StringIO(text.strip()), skipinitialspace=True) if r]
    if not fields:
        if not rows:
            return ()
        fields, rows = [field_name(h) for h in rows[0]], rows[1:]
    return tuple(
        {name: cell(value) for name, value in zip(fields, row, strict=True)}
        for row in rows
        if len(row) == len(fields)
    )


def bus_id(text: str) -> str:
    """Any form of a PCI address (NVML's, sysfs's, NVRM's ``PCI:0000:3b:00``) in sysfs's form,
    ``0000:3b:00.0``; ValueError on anything else. NVRM leaves out the function: it is 0."""
    m = _BUS.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not a PCI bus id: {text!r}")
    domain, bus, device, function = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function or '0'}"


def nvrm_bus_id(bus: str) -> str:
    """The form NVRM's kernel-log lines print a GPU in: ``0000:3b:00.0`` -> ``0000:3b:00``."""
    return bus_id(bus).rsplit(".", 1)[0]


@dataclass(frozen=True)
class GpuReading:
    """One GPU's row of :data:`READING_FIELDS`; None where the device does not report a value."""

    index: int
    bus_id: str
    mig: bool | None  # None: the GPU has no MIG mode at all
    sm_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    utilization_pct: float | None
    event_reasons: int | None
    power_limit_w: float | None
    enforced_power_limit_w: float | None
    power_min_w: float | None
    power_max_w: float | None
    power_draw_w: float | None

    def reasons(self) -> tuple[str, ...]:
        """The names of the active clock-event reasons."""
        bits = self.event_reasons or 0
        return tuple(name for name, bit in CLOCK_EVENT_BITS.items() if bits & bit)


#: The fields a GpuReading is read from (``nvidia-smi --query-gpu=<these> --format=csv``).
READING_FIELDS = (
    "index",
    "pci.bus_id",
    "mig.mode.current",
    "clocks.current.sm",
    "clocks.max.sm",
    "utilization.gpu",
    "clocks_event_reasons.active",
    "power.limit",
    "enforced.power.limit",
    "power.min_limit",
    "power.max_limit",
    "power.draw",
)


def reading_argv() -> list[str]:
    return ["nvidia-smi", f"--query-gpu={','.join(READING_FIELDS)}", "--format=csv"]


def reading(row: Row) -> GpuReading | None:
    """A GpuReading from one query row (any query holding READING_FIELDS); None without an index
    or a bus id. Drivers before 535 call the reasons ``clocks_throttle_reasons``."""
    index, bus = number(row.get("index")), cell(row.get("pci.bus_id"))
    if index is None or bus is None:
        return None
    mig = cell(row.get("mig.mode.current"))
    reasons = row.get("clocks_event_reasons.active", row.get("clocks_throttle_reasons.active"))
    try:
        bus = bus_id(bus)
    except ValueError:
        return None
    return GpuReading(
        int(index),
        bus,
        None if mig is None else mig.lower() == "enabled",
        number(row.get("clocks.current.sm")),
        number(row.get("clocks.max.sm")),
        number(row.get("utilization.gpu")),
        bitmask(reasons),
        number(row.get("power.limit")),
        number(row.get("enforced.power.limit")),
        number(row.get("power.min_limit")),
        number(row.get("power.max_limit")),
        number(row.get("power.draw")),
    )


def readings(text: str) -> tuple[GpuReading, ...]:
    """Every GPU of a ``--query-gpu`` output with a header."""
    return tuple(r for r in (reading(row) for row in parse_query(text)) if r is not None)


# ---------------------------------------------------------------- topo -m


@dataclass(frozen=True)
class TopoGpu:
    """One GPU row of ``nvidia-smi topo -m``: NVML's index, its CPUs and NUMA node (None: N/A)."""

    index: int
    cpus: str | None
    numa_node: int | None


def parse_topo(text: str) -> tuple[TopoGpu, ...]:
    """The GPU rows of ``nvidia-smi topo -m`` (links to other devices are not kept)."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    header = next((line for line in lines if "CPU Affinity" in line), None)
    if header is None:
        return ()
    columns = [c.strip() for c in header.split("\t") if c.strip()]
    devices = [c for c in columns if " " not in c]  # GPU0, NIC0, mlx5_0: the link matrix
    after = columns[len(devices) :]  # CPU Affinity, NUMA Affinity, GPU NUMA ID
    out = []
    for line in lines[lines.index(header) + 1 :]:
        if not line.strip() or line.startswith("Legend"):
            break
        cells = line.split("\t")
        m = re.fullmatch(r"GPU(\d+)", cells[0].strip())
        if not m:
            continue
        rest = [c.strip() for c in cells[1 + len(devices) :] if c.strip()]
        named = dict(zip(after, rest, strict=False))
        numa = cell(named.get("NUMA Affinity"))
        out.append(
            TopoGpu(
                int(m.group(1)),
                cell(named.get("CPU Affinity")),
                int(numa) if numa and numa.isdigit() else None,
            )
        )
    return tuple(out)


# ---------------------------------------------------------------- -L


@dataclass(frozen=True)
class MigDevice:
    profile: str
    index: int
    uuid: str


@dataclass(frozen=True)
class ListedGpu:
    """One GPU of ``nvidia-smi -L`` with the MIG devices listed under it."""

    index: int
    name: str
    uuid: str
    mig: tuple[MigDevice, ...] = ()


_L_GPU = re.compile(r"GPU (\d+): (.*) \(UUID: (\S+)\)")
_L_MIG = re.compile(r"\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (\S+)\)")


def parse_list(text: str) -> tuple[ListedGpu, ...]:
    """``nvidia-smi -L``: the GPUs, each with its MIG devices (none where MIG is off)."""
    gpus: list[ListedGpu] = []
    for line in text.splitlines():
        if m := _L_GPU.fullmatch(line.rstrip()):
            gpus.append(ListedGpu(int(m.group(1)), m.group(2), m.group(3)))
        elif (m := _L_MIG.fullmatch(line.rstrip())) and gpus:
            last = gpus[-1]
            mig = MigDevice(m.group(1), int(m.group(2)), m.group(3))
            gpus[-1] = ListedGpu(last.index, last.name, last.uuid, (*last.mig, mig))
    return tuple(gpus)
