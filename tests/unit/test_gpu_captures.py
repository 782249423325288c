"""Every parser of GPU tool output, run on what real GPUs print (H100, H100 in MIG mode, H200, L40S;
idle and under load), from ../shared/data/gpu-captures beside the checkout: skipped without it.

The values asserted are the captures' own (read off the raw files), so a parser that drops a unit,
reads ``[N/A]`` as 0 or mistakes one bus-id form for another fails here.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
from gpu_captures import MACHINES, Capture, driver_layout, load, needs_captures

from slurm_chaos.faults import node_gpu
from slurm_chaos.gpu import numbering, nvsmi, readback
from slurm_chaos.observe.checks import parse_kmsg
from slurm_chaos.probe.telemetry import sysfs_bus_id

pytestmark = needs_captures
TESTS = Path(__file__).resolve().parents[1]
PHASES = ("idle", "load")
QUERY = "nvidia-smi --query-gpu="

#: What each capture shows, read off the raw files: bus id, MIG, and per phase
#: (SM clock MHz, utilisation %, clock-event reasons, power draw W).
SEEN = {
    "h100": ("0000:00:09.0", False, {"idle": (345, 0, 0x1, 69.85), "load": (1980, 100, 0x0, 631.95)}),
    "h100-mig": ("0000:00:09.0", True, {"idle": (345, None, 0x1, 71.15), "load": (1980, None, 0x0, 433.78)}),
    "h200": ("0000:83:00.0", False, {"idle": (345, 0, 0x1, 77.71), "load": (1980, 100, 0x0, 627.40)}),
    "l40s": ("0000:01:00.0", None, {"idle": (2520, 100, 0x0, 144.97), "load": (2520, 9, 0x0, 110.23)}),
}
POWER_RANGE = {"h100": (200, 700), "h100-mig": (200, 700), "h200": (200, 700), "l40s": (100, 350)}


@pytest.fixture(scope="module", params=MACHINES)
def capture(request: pytest.FixtureRequest) -> Capture:
    return load(request.param)


@pytest.mark.parametrize("phase", PHASES)
def test_query_gpu_cells_units_and_unreported_values(capture: Capture, phase: str) -> None:
    text = capture.output(phase, QUERY)
    (row,) = nvsmi.parse_query(text)
    assert len(row) > 200 and "power.draw" in row and "power.draw [W]" not in row  # units off the names
    # What a device does not report is None, never a number or the bracketed text.
    assert row["power.management"] is None  # [Requested functionality has been deprecated]
    assert row["retired_pages.pending"] is None  # [N/A]
    assert not any(v is not None and v.startswith("[") for v in row.values())
    assert nvsmi.number(row["ecc.errors.uncorrected.volatile.total"]) == 0  # ECC counters
    assert nvsmi.number(row["memory.total"]) in (81559, 143771, 46068)  # "81559 MiB"
    bus, mig, phases = SEEN[capture.machine]
    sm, util, reasons, draw = phases[phase]
    (r,) = nvsmi.readings(text)
    assert (r.index, r.bus_id, r.mig) == (0, bus, mig)
    assert (r.sm_clock_mhz, r.utilization_pct, r.event_reasons, r.power_draw_w) == (sm, util, reasons, draw)
    lo, hi = POWER_RANGE[capture.machine]
    assert (r.power_min_w, r.power_max_w, r.power_limit_w, r.enforced_power_limit_w) == (lo, hi, hi, hi)
    assert r.reasons() == (("gpu_idle",) if reasons else ())


def test_the_same_gpu_under_every_bus_id_form(capture: Capture) -> None:
    """NVML's 00000000:00:09.0 (query, -q, the table), sysfs's 0000:00:09.0 and NVRM's PCI:0000:00:09."""
    bus = SEEN[capture.machine][0]
    (row,) = nvsmi.parse_query(capture.output("idle", QUERY))
    nvml = row["pci.bus_id"]
    assert nvml is not None and nvml.startswith("00000000:") and nvsmi.bus_id(nvml) == bus
    assert f"GPU {nvml}" in capture.output("idle", "nvidia-smi -q")
    assert nvml in capture.output("idle", "nvidia-smi")  # the default table's Bus-Id
    assert sysfs_bus_id(nvml) == bus  # the probe's and the health check's sysfs lookups
    # A kernel-log XID line as slurm-chaos writes it, read back by the health check's parser.
    line = node_gpu.xid_line(nvsmi.nvrm_bus_id(nvml), 79, "node1", "7")
    ((_, seen, xid),) = parse_kmsg([f"3,1,5000000,-;{line}"])
    assert (nvsmi.bus_id(seen), xid) == (bus, 79)
    with pytest.raises(ValueError, match="not a PCI bus id"):
        nvsmi.bus_id("GPU-00000000-0000-0000-0000-000000000000")


def test_topo_m_gives_each_gpu_its_cpus_and_numa_node(capture: Capture) -> None:
    """The header is underlined with terminal escapes, and a tab pads GPU NUMA ID's column."""
    topo = capture.output("capabilities", "nvidia-smi topo -m")
    assert "\x1b[4m" in topo
    cpus = {"h100": "0-19", "h100-mig": "0-19", "h200": "0-23", "l40s": "0-7"}[capture.machine]
    assert nvsmi.parse_topo(topo) == (nvsmi.TopoGpu(0, cpus, 0),)


def test_list_shows_the_mig_layout(capture: Capture) -> None:
    (gpu,) = nvsmi.parse_list(capture.output("capabilities", "nvidia-smi -L"))
    assert gpu.index == 0 and gpu.uuid.startswith("GPU-") and gpu.name.startswith("NVIDIA ")
    profiles = [m.profile for m in gpu.mig]
    assert profiles == (["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"] if capture.machine == "h100-mig" else [])


@pytest.mark.parametrize("phase", PHASES)
def test_mig_refuses_clock_and_power_faults(capture: Capture, phase: str) -> None:
    (r,) = nvsmi.readings(capture.output(phase, QUERY))
    why = readback.mig_refusal(r)
    if capture.machine == "h100-mig":
        assert "is in MIG mode" in why and "cannot lock or cap one instance" in why
    else:
        assert why == ""  # Disabled, or [N/A] on a GPU without MIG (L40S)


#: (machine, phase, lock MHz) -> took: the loaded captures decide both ways; an idle GPU tells nothing
#: unless it clocks above the lock (a locked GPU never does).
CLOCK_CASES = [
    ("h100", "load", 1410, False),  # 1980 MHz at 100%: the lock did not take
    ("h100", "load", 1980, True),  # at the lock under load
    ("h100", "idle", 1410, None),  # 345 MHz, gpu_idle: cannot tell yet
    ("h100", "idle", 300, None),  # 345 MHz is within a 300 MHz lock's step: still idle
    ("h200", "load", 1200, False),
    ("h200", "load", 2000, True),
    ("h200", "idle", 1200, None),
    ("l40s", "idle", 1410, False),  # 2520 MHz at 100%: above the lock
    ("l40s", "idle", 2520, True),
    ("l40s", "load", 2520, None),  # 9% utilisation (an encoder load): not loaded enough to tell
    ("l40s", "load", 1000, False),
    ("h100-mig", "load", 1410, False),  # no utilisation under MIG: only "above the lock" decides
    ("h100-mig", "load", 1980, None),
]


@pytest.mark.parametrize(("machine", "phase", "lock", "took"), CLOCK_CASES)
def test_clock_read_back_on_the_captures(machine: str, phase: str, lock: int, took: bool | None) -> None:
    (r,) = nvsmi.readings(load(machine).output(phase, QUERY))
    seen = readback.clock_lock(lock, r)
    assert seen.took is took, seen.words
    assert f"SM clock {r.sm_clock_mhz:g} MHz" in seen.words


def test_power_limits_range_and_read_back(capture: Capture) -> None:
    (r,) = nvsmi.readings(capture.output("load", QUERY))
    lo, hi = POWER_RANGE[capture.machine]
    assert readback.power_refusal(lo, r) == "" and readback.power_refusal(hi, r) == ""
    assert f"outside GPU {r.bus_id}'s power limit range {lo}-{hi} W" in readback.power_refusal(lo - 1, r)
    assert readback.power_cap(hi, r).took is True  # the enforced limit is the one asked for
    assert readback.power_cap(lo, r).took is False


def test_the_driver_and_nvml_name_the_captured_gpu_alike(capture: Capture, tmp_path: Path) -> None:
    """/proc/driver/nvidia/gpus's Bus Location against NVML's pci.bus_id (the -q Minor Number is 0)."""
    assert "Minor Number                                       : 0" in capture.output("idle", "nvidia-smi -q")
    bus = SEEN[capture.machine][0]
    driver = numbering.read_driver(driver_layout(tmp_path / "gpus", {bus: 0}))
    assert driver is not None
    where = numbering.address(0, driver, nvsmi.readings(capture.output("load", QUERY)))
    assert (where.bus_id, where.nvml) == (bus, 0)


# ---------------------------------------------------------------- check_gpu.sh's fault checks, on a stand-in


def _gpu_faults() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_faults", TESTS / "gpu" / "gpu_faults.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("machine", ["h100", "h100-mig"])
def test_check_gpu_parsers_and_power_cap_on_a_captured_machine(
    machine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """check_gpu.sh's checks through a stand-in nvidia-smi that answers as the capture did: the
    parsers see one GPU numbered alike everywhere; the power cap is applied, read back and undone
    through real subprocesses; a MIG machine is skipped, saying why."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # This interpreter, not whichever python3 PATH finds (a hook run in-process by an earlier test
    # puts the system's first on PATH, and it may lack what the stand-in imports).
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec {sys.executable} {TESTS / "gpu" / "fake_nvidia_smi.py"} "$@"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SMI_CAPTURE", machine)
    monkeypatch.setenv("FAKE_SMI_STATE", str(tmp_path / "smi.json"))
    monkeypatch.setattr(node_gpu, "PROC_GPUS", driver_layout(tmp_path / "gpus", {"0000:00:09.0": 0}))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    checks = _gpu_faults()
    assert checks.run("parsers", tmp_path) == 0
    mig = 4 if machine == "h100-mig" else 0
    assert (
        f"CHECK parsers: PASS 1 GPUs (-L), 1 (--query-gpu), 1 (driver), {mig} MIG devices; "
        "Slurm->bus->NVML 0->0000:00:09.0->0; NUMA {0: 0}"
    ) in capsys.readouterr().out
    rc = checks.run("power-cap", tmp_path / "journal")
    out = capsys.readouterr().out
    if machine == "h100-mig":
        assert rc == 77 and out.startswith("CHECK power-cap: SKIP every GPU is in MIG mode")
        return
    assert rc == 0, out
    assert out.startswith("CHECK power-cap: PASS GPU 0 cap 450 W: gpu-throttle on gpucheck")
    assert "read back 450 W; limit 700.0 W before, 700.0 W after the undo" in out
    calls = (tmp_path / "smi.json.calls").read_text().splitlines()
    assert ["-i 0 -pl 450", "-i 0 -pl 700"] == [c for c in calls if "-pl" in c]
