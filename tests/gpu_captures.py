"""Real nvidia-smi output (``../shared/data/gpu-captures`` beside the checkout), for parser tests.

Not shipped with slurm-chaos: each capture is a header, then one section per command, opened by a
banner (a line of ``#``, ``# <phase> :: <what>``, ``# $ <command>``, a line of ``#``), idle
sections first, then the same under load. Tests that use them skip, saying where they looked, when
the folder is absent.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO.parent / "shared" / "data" / "gpu-captures"
#: The four machines, by the name their file starts with.
MACHINES = ("h100", "h100-mig", "h200", "l40s")
_FILES = {
    "h100": "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt",
    "h100-mig": "linux-x86_64__nvidia-h100-mig__590.48.01.txt",
    "h200": "linux-x86_64__nvidia-h200__590.48.01.txt",
    "l40s": "linux-x86_64__nvidia-l40s__595.80.txt",
}
_BANNER = re.compile(r"^#{20,}\n# (\w+) :: [^\n]*\n(?:# \$ ([^\n]*)\n)+#{20,}\n", re.MULTILINE)

needs_captures = pytest.mark.skipif(
    not CAPTURES.is_dir(),
    reason=f"GPU captures not found at {CAPTURES} (../shared/data/gpu-captures beside the checkout)",
)


@dataclass(frozen=True)
class Capture:
    """One machine's capture: each command's output, idle and under load."""

    machine: str
    sections: dict[tuple[str, str], str]  # (phase, command) -> output

    def output(self, phase: str, command: str) -> str:
        """The output of ``command`` (``nvidia-smi topo -m``, or a prefix of a query command)."""
        for (p, cmd), text in self.sections.items():
            if p == phase and (cmd == command or cmd.startswith(command)):
                return text
        raise KeyError(f"{self.machine}: no {phase} section for {command!r}")


def load(machine: str) -> Capture:
    text = (CAPTURES / _FILES[machine]).read_text()
    banners = list(_BANNER.finditer(text))
    sections: dict[tuple[str, str], str] = {}
    for i, m in enumerate(banners):
        end = banners[i + 1].start() if i + 1 < len(banners) else len(text)
        command = m.group(2).strip()
        sections.setdefault((m.group(1), command), text[m.end() : end].strip("\n") + "\n")
    return Capture(machine, sections)


def _query_table(text: str) -> tuple[list[str], list[list[str]]]:
    rows = [r for r in csv.reader(io.StringIO(text.strip()), skipinitialspace=True) if r]
    return rows[0], rows[1:]


def project(query: str, fields: Sequence[str], cells: Mapping[str, Mapping[str, str]] | None = None) -> str:
    """What ``nvidia-smi --query-gpu=<fields> --format=csv`` prints on the captured machine: the
    columns of a capture's query of every field, header units included. ``cells``: {bus id as the
    capture prints it: {field: cell}} to change (a setting made since, another GPU's index)."""
    header, rows = _query_table(query)
    names = [h.split(" [")[0] for h in header]
    out = [", ".join(header[names.index(f)] for f in fields)]
    for row in rows:
        bus = row[names.index("pci.bus_id")]
        changed = {**dict(zip(names, row, strict=True)), **(cells or {}).get(bus, {})}
        out.append(", ".join(changed[f] for f in fields))
    return "\n".join(out) + "\n"


def multiply(query: str, buses: Sequence[str]) -> str:
    """A capture's query of one GPU as on a node of ``len(buses)`` such GPUs: the row repeated with
    NVML's index (PCI order) and each bus id (NVML's form, ``00000000:1B:00.0``)."""
    header, (row,) = _query_table(query)
    names = [h.split(" [")[0] for h in header]
    out = [", ".join(header)]
    for index, bus in enumerate(sorted(buses)):
        cells = dict(zip(names, row, strict=True)) | {"index": str(index), "pci.bus_id": bus}
        out.append(", ".join(cells[n] for n in names))
    return "\n".join(out) + "\n"


def driver_layout(root: Path, minors: Mapping[str, int], model: str = "NVIDIA H100 80GB HBM3") -> Path:
    """``/proc/driver/nvidia/gpus`` as the driver writes it: one ``<bus>/information`` per GPU
    ({bus id as sysfs writes it: device minor})."""
    for bus, minor in minors.items():
        (root / bus).mkdir(parents=True)
        (root / bus / "information").write_text(
            f"Model: \t\t {model}\nIRQ:   \t\t 0\nGPU UUID: \t GPU-{minor:08x}-0000-0000-0000-000000000000\n"
            "Video BIOS: \t 96.00.a5.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
            f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"
            "GPU Firmware: \t 590.48.01\nGPU Excluded:\t No\n"
        )
    return root


def dcgm_discovery(ids: Mapping[str, int], name: str = "NVIDIA H100 80GB HBM3") -> str:
    """``dcgmi discovery -l`` as DCGM 3 prints it ({bus id in NVML's form: DCGM id})."""
    rule = "+--------+" + "-" * 70 + "+"
    out = [f"{len(ids)} GPUs found.", rule, f"| GPU ID | {'Device Information':<68} |", rule]
    for bus, gpuid in sorted(ids.items(), key=lambda kv: kv[1]):
        out += [
            f"| {gpuid:<6} | {'Name: ' + name:<68} |",
            f"|        | {'PCI Bus ID: ' + bus:<68} |",
            f"|        | {'Device UUID: GPU-' + str(gpuid) * 8:<68} |",
            rule,
        ]
    return "\n".join(out) + "\n"
