"""GPU faults: the XID kernel-log line, DCGM injection commands, and honest degradation without GPUs."""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

import pytest
from gpu_captures import dcgm_discovery, driver_layout, load, multiply, needs_captures, project

from slurm_chaos.analysis.verdict import not_injected
from slurm_chaos.errors import ChaosError
from slurm_chaos.faults import injection, node_gpu
from slurm_chaos.faults.journal import Journal, UndoContext, revert
from slurm_chaos.faults.node_base import APPLIERS, JobContext, log
from slurm_chaos.faults.spec import parse_spec
from slurm_chaos.gpu import numbering, nvsmi
from slurm_chaos.rundir import load_injections
from slurm_chaos.rundir.injections import read_record_file
from slurm_chaos.runner import Completed, FakeRunner


def recorded(ctx: JobContext) -> list[tuple[str, bool, str]]:
    """The node's injection record of the job, as (fault, took, detail)."""
    path = injection.record_path(ctx.journal.root, ctx.node, ctx.job_id)
    return [(r.fault, r.took, r.detail) for r in read_record_file(path)]


@pytest.fixture(autouse=True)
def no_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node's /proc/driver/nvidia/gpus is the test's, absent unless a test lays one out."""
    monkeypatch.setattr(node_gpu, "PROC_GPUS", tmp_path / "no-driver", raising=False)


#: A node whose four GPUs the driver numbered out of PCI order (device minor = Slurm's number), and
#: whose DCGM host engine numbered them in yet another order: each numbering differs from the others.
LAYOUT_MINORS = {"0000:3b:00.0": 0, "0000:18:00.0": 1, "0000:db:00.0": 2, "0000:86:00.0": 3}
LAYOUT_NVML = {"0000:18:00.0": 0, "0000:3b:00.0": 1, "0000:86:00.0": 2, "0000:db:00.0": 3}  # PCI order
LAYOUT_DCGM = {"00000000:86:00.0": 0, "00000000:DB:00.0": 1, "00000000:18:00.0": 2, "00000000:3B:00.0": 3}
NVML_BUSES = ["00000000:18:00.0", "00000000:3B:00.0", "00000000:86:00.0", "00000000:DB:00.0"]


def ctx_for(tmp_path: Path, runner: FakeRunner, gpus: tuple[int, ...] = (0, 1)) -> JobContext:
    journal = Journal(tmp_path, "node2", "3")
    return JobContext("3", "node2", ("node2",), None, None, time.time() + 60, journal, runner, gpus=gpus)


def test_xid_line_matches_what_dmesg_detectors_parse() -> None:
    line = node_gpu.xid_line("0000:3b:00", 79, "node2", "3")
    assert line.startswith("NVRM: Xid (PCI:0000:3b:00): 79, ")
    assert "fallen off the bus" in line and "node2" in line


def test_xid_bus_id_without_a_driver_is_made_up_from_the_number() -> None:
    assert node_gpu.xid_bus_id(2) == "0000:1a:00"


def test_xid_bus_id_is_the_drivers_for_slurms_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's GPU 0 is device minor 0, which the driver put at 3b: not the first GPU in PCI order."""
    monkeypatch.setattr(node_gpu, "PROC_GPUS", driver_layout(tmp_path / "gpus", LAYOUT_MINORS), raising=False)
    assert node_gpu.xid_bus_id(0) == "0000:3b:00" and node_gpu.xid_bus_id(1) == "0000:18:00"
    with pytest.raises(ChaosError, match=r"Slurm's GPU 9 \(device minor 9\) is not one GPU of the driver's"):
        node_gpu.xid_bus_id(9)


def test_kmsg_xid_is_written_and_journalled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kmsg = tmp_path / "kmsg"
    monkeypatch.setattr(node_gpu, "KMSG", kmsg)
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: None)
    ctx = ctx_for(tmp_path, FakeRunner(lambda a: Completed(a, 1, "", "")))
    node_gpu.apply_gpu_xid(parse_spec("gpu-xid:xid=48")[0], ctx)
    assert kmsg.read_text().startswith("<3>NVRM: Xid (PCI:0000:18:00): 48, ")
    (entry,) = ctx.journal.read().entries
    assert entry.undo.action == "none"


@needs_captures
def test_kmsg_xid_names_slurms_gpu_by_the_drivers_bus_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm's GPU 1 is minor 1 at bus 18 (NVML's index 0); where NVML shows GPUs but the driver's
    table is missing, no bus id is made up: refused."""
    kmsg = tmp_path / "kmsg"
    monkeypatch.setattr(node_gpu, "KMSG", kmsg)
    node = FakeNode(tmp_path, monkeypatch, "h100")
    node_gpu.apply_gpu_xid(parse_spec("gpu-xid:xid=79,gpu=1")[0], ctx_for(tmp_path, node.runner))
    assert kmsg.read_text().startswith("<3>NVRM: Xid (PCI:0000:18:00): 79, ")
    kmsg.unlink()
    monkeypatch.setattr(node_gpu, "PROC_GPUS", tmp_path / "no-driver", raising=False)
    with pytest.raises(ChaosError, match="no NVIDIA driver on this node"):
        node_gpu.apply_gpu_xid(parse_spec("gpu-xid:xid=79,gpu=1")[0], ctx_for(tmp_path / "b", node.runner))
    assert not kmsg.exists()


def test_without_dcgm_nothing_is_injected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: None)
    runner = FakeRunner(lambda a: Completed(a, 0, "", ""))
    ctx = ctx_for(tmp_path, runner)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    log.addHandler(handler)
    try:
        node_gpu.apply_gpu_ecc(parse_spec("gpu-ecc")[0], ctx)
    finally:
        log.removeHandler(handler)
    assert runner.calls == [] and ctx.journal.read().entries == ()
    missing = "gpu-ecc: no DCGM host engine on node2 (dcgmi not found): nothing was injected"
    assert any(missing in r.getMessage() for r in records)
    assert recorded(ctx) == [("gpu-ecc", False, missing)]


def test_dcgm_injection_and_its_undo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's GPU 1 is DCGM's GPU 2 on this layout: the injection and its undo both say --gpuid 2."""
    only_dcgmi(monkeypatch)
    monkeypatch.setattr(node_gpu, "PROC_GPUS", driver_layout(tmp_path / "gpus", LAYOUT_MINORS), raising=False)
    runner = dcgm({})
    ctx = ctx_for(tmp_path, runner)
    node_gpu.apply_gpu_thermal(parse_spec("gpu-thermal:gpu=1,temp=97")[0], ctx)
    assert ("dcgmi", "test", "--inject", "--gpuid", "2", "-f", "150", "-v", "97") in runner.calls
    revert(ctx.journal, UndoContext(runner), by="test")
    assert runner.calls[-2:] == [
        ("dcgmi", "test", "--inject", "--gpuid", "2", "-f", "241", "-v", "0"),
        ("dcgmi", "test", "--inject", "--gpuid", "2", "-f", "150", "-v", "40"),
    ]


def test_a_gpu_dcgm_does_not_list_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    only_dcgmi(monkeypatch)
    monkeypatch.setattr(node_gpu, "PROC_GPUS", driver_layout(tmp_path / "gpus", LAYOUT_MINORS), raising=False)
    runner = dcgm({}, listed={"00000000:18:00.0": 0})
    ctx = ctx_for(tmp_path, runner, gpus=(0,))
    with pytest.raises(ChaosError, match=r"Slurm's GPU 0 \(0000:3b:00.0\) is not one of DCGM's GPUs"):
        node_gpu.apply_gpu_ecc(parse_spec("gpu-ecc:gpu=0")[0], ctx)
    assert not any(a[:2] == ("dcgmi", "test") for a in runner.calls)
    ((_, took, detail),) = recorded(ctx)
    assert not took and detail.endswith("nothing was injected")


@needs_captures
def test_power_cap_restores_the_previous_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's GPU 0 is NVML's 1 here; the cap is read back from NVML and the H100's 700 W restored."""
    node = FakeNode(tmp_path, monkeypatch, "h100")
    ctx = ctx_for(tmp_path, node.runner)
    node_gpu.apply_gpu_throttle(parse_spec("gpu-throttle:method=power,power=300")[0], ctx)
    assert ("nvidia-smi", "-i", "1", "-pl", "300") in node.runner.calls
    ((_, took, detail),) = recorded(ctx)
    assert took and detail == (
        "gpu-throttle on node2 (Slurm's GPU 0 = 0000:3b:00.0 = NVML index 1): "
        "power limit of GPU 0000:3b:00.0 (NVML): read back 300 W"
    )
    revert(ctx.journal, UndoContext(node.runner), by="test")
    assert node.runner.calls[-1] == ("nvidia-smi", "-i", "1", "-pl", "700")


@needs_captures
def test_clock_lock_is_reset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = FakeNode(tmp_path, monkeypatch, "h100")
    ctx = ctx_for(tmp_path, node.runner, gpus=(2,))
    node_gpu.apply_gpu_throttle(parse_spec("gpu-throttle:clock=500,gpu=2")[0], ctx)
    assert ("nvidia-smi", "-i", "3", "-lgc", "500,500") in node.runner.calls  # Slurm's 2 is NVML's 3
    revert(ctx.journal, UndoContext(node.runner), by="test")
    assert node.runner.calls[-1] == ("nvidia-smi", "-i", "3", "-rgc")


def test_slurm_job_gpus_is_read_as_slurmd_writes_it() -> None:
    assert node_gpu.parse_job_gpus("0,2") == (0, 2)
    assert node_gpu.parse_job_gpus("4-6,1") == (1, 4, 5, 6)
    assert node_gpu.parse_job_gpus("") == () and node_gpu.parse_job_gpus(None) == ()
    assert node_gpu.parse_job_gpus("0,x") == () and node_gpu.parse_job_gpus("3-1") == ()


@pytest.mark.parametrize(
    ("spec", "gpus", "held"),
    [("gpu-xid:gpu=2", (0, 1), "0,1"), ("gpu-ecc:gpu=0", (4, 5), "4,5"), ("gpu-thermal", (), "none"),
     ("gpu-throttle:gpu=7", (3,), "3")],
)  # fmt: skip
def test_a_gpu_the_job_does_not_hold_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, gpus: tuple[int, ...], held: str
) -> None:
    kmsg = tmp_path / "kmsg"
    monkeypatch.setattr(node_gpu, "KMSG", kmsg)
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: "/usr/bin/" + name)
    runner = FakeRunner(lambda a: Completed(a, 0, "", ""))
    ctx = ctx_for(tmp_path, runner, gpus=gpus)
    (req,) = parse_spec(spec)
    with pytest.raises(ChaosError, match=rf"is not one of job 3's GPUs on node2 \(SLURM_JOB_GPUS: {held}\)"):
        APPLIERS[req.name](req, ctx)
    assert runner.calls == [] and not kmsg.exists() and ctx.journal.read().entries == ()


def test_gpu_burn_runs_on_the_jobs_gpus_only(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path, FakeRunner(lambda a: Completed(a, 0, "", "")), gpus=(1, 3))
    argv = node_gpu.burn_argv(ctx, 30)
    assert argv[1:3] == ["-I", "-c"] and "from slurm_chaos.faults.node_gpu import main" in argv[3]
    assert argv[4:] == ["burn", "--seconds", "30", "--gpus", "1,3"]
    # It runs from anywhere, isolated, on this slurm_chaos (a checkout included): its usage error.
    done = subprocess.run([*argv[:4], "burn"], cwd="/", capture_output=True, text=True, env={})
    assert done.returncode == 2 and "--seconds" in done.stderr, done.stderr
    assert node_gpu.burn_env((1, 3)) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1,3"}
    with pytest.raises(ChaosError, match="holds no GPU on node2"):
        node_gpu.burn_argv(ctx_for(tmp_path, FakeRunner(lambda a: Completed(a, 0, "", "")), gpus=()), 30)
    # Without --gpus the burn refuses: never every GPU of the node.
    with pytest.raises(SystemExit):
        node_gpu.main(["burn", "--seconds", "1"])
    assert node_gpu.burn(1, ()) == 2


# ------------------------------------------------------------------ GPU numbering (Slurm -> bus -> NVML/DCGM)


@pytest.mark.parametrize(
    "text",
    [
        "[N/A]",
        "N/A",
        "[Not Supported]",
        "[Unknown Error]",
        "[Requested functionality has been deprecated]",
        "",
    ],
)
def test_a_cell_nvidia_smi_does_not_report_is_none(text: str) -> None:
    assert nvsmi.cell(text) is None and nvsmi.number(text) is None and nvsmi.bitmask(text) is None
    (row,) = nvsmi.parse_query(f"index, pci.bus_id, power.draw [W]\n0, 00000000:3B:00.0, {text}\n")
    assert row == {"index": "0", "pci.bus_id": "00000000:3B:00.0", "power.draw": None}


def test_units_and_nounits_read_alike() -> None:
    assert nvsmi.number("69.85 W") == nvsmi.number("69.85") == 69.85
    assert nvsmi.number("200740215 us") == 200740215 and nvsmi.number("0 %") == 0
    assert nvsmi.bitmask("0x0000000000000041") == 0x41 and nvsmi.number("0x41") is None
    fields = ["index", "pci.bus_id"]
    assert nvsmi.parse_query("0, 00000000:3B:00.0\n", fields) == (
        {"index": "0", "pci.bus_id": "00000000:3B:00.0"},
    )


def test_the_layouts_numberings_all_differ() -> None:
    """The recorded layout is one where Slurm's number, NVML's index and DCGM's id disagree."""
    dcgm_ids = {nvsmi.bus_id(b): i for b, i in LAYOUT_DCGM.items()}
    for bus, minor in LAYOUT_MINORS.items():
        assert len({minor, LAYOUT_NVML[bus], dcgm_ids[bus]}) > 1


def test_slurms_number_resolves_through_the_bus_id(tmp_path: Path) -> None:
    driver = numbering.read_driver(driver_layout(tmp_path / "gpus", LAYOUT_MINORS))
    assert driver is not None and [g.minor for g in driver] == [0, 1, 2, 3]
    nvml = [nvsmi.GpuReading(i, nvsmi.bus_id(b), False, *([None] * 9)) for i, b in enumerate(NVML_BUSES)]
    dcgm_ids = numbering.parse_dcgm_discovery(dcgm_discovery(LAYOUT_DCGM))
    assert dcgm_ids == {nvsmi.bus_id(b): i for b, i in LAYOUT_DCGM.items()}
    for bus, minor in LAYOUT_MINORS.items():
        where = numbering.address(minor, driver, nvml, dcgm_ids)
        assert (where.bus_id, where.nvml, where.dcgm) == (bus, LAYOUT_NVML[bus], dcgm_ids[bus])
        assert numbering.pci_order(minor, driver) == LAYOUT_NVML[bus]  # CUDA's PCI_BUS_ID order
    assert numbering.address(2, driver).describe() == "Slurm's GPU 2 = 0000:db:00.0"
    with pytest.raises(numbering.NumberingError, match="is not one of NVML's GPUs"):
        numbering.address(0, driver, nvml[:1])
    with pytest.raises(numbering.NumberingError, match="is not one of DCGM's GPUs"):
        numbering.address(0, driver, None, {})
    # Two GPUs claiming one minor (or none) is no answer: refused, not the first one taken.
    twice = (*driver, numbering.DriverGpu("0000:99:00.0", 1))
    with pytest.raises(numbering.NumberingError, match=r"minors: 0=0000:3b:00.0, 1=0000:18:00.0"):
        numbering.address(1, twice)


def test_driver_information_without_a_minor_or_a_bus_is_not_a_gpu(tmp_path: Path) -> None:
    layout = driver_layout(tmp_path / "gpus", {"0000:3b:00.0": 0})
    info = (layout / "0000:3b:00.0" / "information").read_text()
    assert numbering.parse_information(info) == numbering.DriverGpu(
        "0000:3b:00.0", 0, "NVIDIA H100 80GB HBM3"
    )
    assert numbering.parse_information(info.replace("Device Minor", "Minor")) is None  # drivers before 352
    assert numbering.parse_information(info.replace("0000:3b:00.0", "unknown")) is None
    assert numbering.read_driver(tmp_path / "absent") is None


def test_the_burn_gets_cuda_numbers_in_pci_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's GPUs 1 and 3 (buses 18 and 86) are CUDA's 0 and 2 under CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    monkeypatch.setattr(node_gpu, "PROC_GPUS", driver_layout(tmp_path / "gpus", LAYOUT_MINORS), raising=False)
    ctx = ctx_for(tmp_path, FakeRunner(lambda a: Completed(a, 0, "", "")), gpus=(1, 3))
    assert node_gpu.burn_argv(ctx, 30)[-2:] == ["--gpus", "0,2"]
    with pytest.raises(ChaosError, match="Slurm's GPU 5"):
        node_gpu.cuda_order((5,))


# ------------------------------------------------------------------ did the injection take?
# `dcgmi dmon -i 1 -e 150 -c 1` as DCGM 3 prints it (a header, a units line, one row per GPU).
DMON_TEMP_97 = "#Entity   TMPTR\nID        C\nGPU 1     97\n"


def dcgm(
    values: dict[str, str], discovery_ok: bool = True, listed: dict[str, int] | None = None
) -> FakeRunner:
    """dcgmi with a host engine (or not) listing ``listed`` (LAYOUT_DCGM): injections succeed,
    `dmon -e FIELD` prints values[FIELD]."""

    def respond(a: tuple[str, ...]) -> Completed:
        if a[:2] == ("dcgmi", "discovery"):
            return Completed(
                a,
                0 if discovery_ok else 1,
                dcgm_discovery(LAYOUT_DCGM if listed is None else listed),
                "" if discovery_ok else "Error: unable to connect to host engine",
            )
        if a[:2] == ("dcgmi", "dmon"):
            field = a[a.index("-e") + 1]
            return Completed(
                a, 0, f"#Entity   F\nID\nGPU {a[a.index('-i') + 1]}     {values.get(field, 'N/A')}\n", ""
            )
        return Completed(a, 0, "", "")

    return FakeRunner(respond)


def only_dcgmi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: "/usr/bin/dcgmi" if name == "dcgmi" else None)


class FakeNode:
    """A node of four GPUs laid out as LAYOUT_* says, each reporting what one captured machine
    reported (its idle or loaded query row), with nvidia-smi -pl changing the limits it reports
    (unless ``takes`` is false) and a DCGM host engine."""

    def __init__(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, machine: str, takes: bool = True
    ) -> None:
        monkeypatch.setattr(node_gpu.shutil, "which", lambda name: "/usr/bin/" + name)
        monkeypatch.setattr(
            node_gpu, "PROC_GPUS", driver_layout(tmp_path / "gpus", LAYOUT_MINORS), raising=False
        )
        self.capture = load(machine)
        self.takes = takes
        self.cells: dict[str, dict[str, str]] = {}
        self.phase("idle")
        self.runner = FakeRunner(self.respond)

    def phase(self, phase: str) -> None:
        self.query = multiply(self.capture.output(phase, "nvidia-smi --query-gpu="), NVML_BUSES)

    def respond(self, a: tuple[str, ...]) -> Completed:
        if a[0] == "nvidia-smi" and a[1].startswith("--query-gpu="):
            return Completed(a, 0, project(self.query, a[1].split("=", 1)[1].split(","), self.cells), "")
        if a[0] == "nvidia-smi" and "-pl" in a and self.takes:
            limit = f"{float(a[a.index('-pl') + 1]):.2f} W"
            self.cells[NVML_BUSES[int(a[2])]] = {"power.limit": limit, "enforced.power.limit": limit}
        if a[:2] == ("dcgmi", "discovery"):
            return Completed(a, 0, dcgm_discovery(LAYOUT_DCGM), "")
        return Completed(a, 0, "", "")


def test_dmon_output_is_parsed_for_the_gpu_asked() -> None:
    assert node_gpu.parse_dmon(DMON_TEMP_97, 1) == 97
    assert node_gpu.parse_dmon(DMON_TEMP_97, 0) is None
    assert node_gpu.parse_dmon("#Entity   TMPTR\nID\nGPU 0     N/A\n", 0) is None
    assert node_gpu.parse_dmon("", 0) is None
    assert node_gpu.dcgm_read_argv(1, 150) == ["dcgmi", "dmon", "-i", "1", "-e", "150", "-c", "1"]


def test_an_injection_read_back_from_dcgm_took(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    only_dcgmi(monkeypatch)
    monkeypatch.setattr(node_gpu, "PROC_GPUS", driver_layout(tmp_path / "gpus", LAYOUT_MINORS), raising=False)
    ctx = ctx_for(tmp_path, dcgm({"150": "97", "241": "1"}))
    node_gpu.apply_gpu_thermal(parse_spec("gpu-thermal:gpu=1,temp=97")[0], ctx)
    ((fault, took, detail),) = recorded(ctx)
    assert (fault, took) == ("gpu-thermal", True)
    assert "(Slurm's GPU 1 = 0000:18:00.0 = DCGM id 2)" in detail
    assert "DCGM field 150 of GPU 2: read back 97" in detail and "field 241" in detail


def test_an_injection_dcgm_does_not_show_did_not_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    only_dcgmi(monkeypatch)
    monkeypatch.setattr(node_gpu, "PROC_GPUS", driver_layout(tmp_path / "gpus", LAYOUT_MINORS), raising=False)
    ctx = ctx_for(tmp_path, dcgm({"311": "0"}))
    node_gpu.apply_gpu_ecc(parse_spec("gpu-ecc:count=3")[0], ctx)
    ((_, took, detail),) = recorded(ctx)
    assert not took and "read back 0, not 3: the injection did not take" in detail
    assert [e.fault for e in ctx.journal.read().entries] == ["gpu-ecc"]  # still undone at the end


def test_no_host_engine_is_named_and_nothing_injected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: "/usr/bin/" + name)
    runner = dcgm({}, discovery_ok=False)
    ctx = ctx_for(tmp_path, runner)
    node_gpu.apply_gpu_xid(parse_spec("gpu-xid:method=dcgm")[0], ctx)
    assert runner.calls == [("dcgmi", "discovery", "-l")]
    ((_, took, detail),) = recorded(ctx)
    assert not took
    assert detail == (
        "gpu-xid: no DCGM host engine on node2 "
        "(dcgmi discovery -l: Error: unable to connect to host engine): nothing was injected"
    )


def test_xid_in_the_kernel_log_takes_without_dcgm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """method=both on a node without DCGM: the kernel-log line took, the DCGM half did not."""
    monkeypatch.setattr(node_gpu, "KMSG", tmp_path / "kmsg")
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: None)
    ctx = ctx_for(tmp_path, FakeRunner(lambda a: Completed(a, 1, "", "")))
    node_gpu.apply_gpu_xid(parse_spec("gpu-xid:method=both")[0], ctx)
    assert [took for _, took, _ in recorded(ctx)] == [True, False]


def test_a_job_without_gpus_records_that_nothing_was_injected(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path, dcgm({}), gpus=())
    with pytest.raises(ChaosError):
        node_gpu.apply_gpu_ecc(parse_spec("gpu-ecc")[0], ctx)
    ((_, took, detail),) = recorded(ctx)
    assert not took and "(SLURM_JOB_GPUS: none)" in detail and detail.endswith("nothing was injected")


def test_throttle_without_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: None)
    ctx = ctx_for(tmp_path, FakeRunner(lambda a: Completed(a, 0, "", "")))
    node_gpu.apply_gpu_throttle(parse_spec("gpu-throttle")[0], ctx)
    assert recorded(ctx) == [
        (
            "gpu-throttle",
            False,
            "gpu-throttle: no NVML on node2 (nvidia-smi not found): nothing was throttled",
        )
    ]


@needs_captures
def test_a_power_cap_nvml_does_not_show_did_not_take(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = FakeNode(tmp_path, monkeypatch, "h100", takes=False)
    ctx = ctx_for(tmp_path, node.runner)
    node_gpu.apply_gpu_throttle(parse_spec("gpu-throttle:method=power,power=300")[0], ctx)
    ((_, took, detail),) = recorded(ctx)
    assert not took and detail.endswith("read back 700 W, not 300 W: the cap did not take")
    assert [e.fault for e in ctx.journal.read().entries] == ["gpu-throttle"]  # still undone at the end


@needs_captures
def test_a_power_cap_outside_the_gpus_range_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalogue's default 100 W is below an H100's 200 W floor: refused before nvidia-smi -pl."""
    node = FakeNode(tmp_path, monkeypatch, "h100")
    ctx = ctx_for(tmp_path, node.runner)
    with pytest.raises(
        ChaosError, match=r"power=100 W is outside GPU 0000:3b:00.0's power limit range 200-700 W"
    ):
        node_gpu.apply_gpu_throttle(parse_spec("gpu-throttle:method=power")[0], ctx)
    assert not any("-pl" in a for a in node.runner.calls) and ctx.journal.read().entries == ()
    ((_, took, _),) = recorded(ctx)
    assert not took


@needs_captures
@pytest.mark.parametrize(
    "spec", ["gpu-throttle:method=clocks", "gpu-throttle:method=power,power=300", "gpu-xid", "gpu-ecc"]
)
def test_a_mig_gpu_refuses_gpu_faults_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    """The MIG capture: nothing is locked, capped or injected, and the record says why."""
    kmsg = tmp_path / "kmsg"
    monkeypatch.setattr(node_gpu, "KMSG", kmsg)
    node = FakeNode(tmp_path, monkeypatch, "h100-mig")
    ctx = ctx_for(tmp_path, node.runner)
    (req,) = parse_spec(spec)
    with pytest.raises(ChaosError, match="is in MIG mode"):
        APPLIERS[req.name](req, ctx)
    assert all(a[1].startswith("--query-gpu=") or a[:2] == ("dcgmi", "discovery") for a in node.runner.calls)
    assert not kmsg.exists() and ctx.journal.read().entries == ()
    ((_, took, detail),) = recorded(ctx)
    assert (
        not took and "cannot lock or cap one instance" in detail and detail.endswith("nothing was injected")
    )


@needs_captures
@pytest.mark.parametrize(("lock", "took"), [(1410, False), (1980, True)])
def test_a_clock_lock_is_read_back_under_the_jobs_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lock: int, took: bool
) -> None:
    """The prolog locks an idle GPU (the H100 capture: 345 MHz, gpu_idle), which proves nothing: no
    record yet. The agent reads it again while the job runs; the loaded capture (1980 MHz at 100%)
    decides: above a 1410 MHz lock it did not take (NO EFFECT), at a 1980 MHz lock it did."""
    node = FakeNode(tmp_path, monkeypatch, "h100")
    ctx = ctx_for(tmp_path, node.runner)
    (controller,) = node_gpu.apply_gpu_throttle(parse_spec(f"gpu-throttle:clock={lock}")[0], ctx)
    assert ("nvidia-smi", "-i", "1", "-lgc", f"{lock},{lock}") in node.runner.calls
    path = injection.record_path(ctx.journal.root, ctx.node, ctx.job_id)
    assert not path.exists()
    now = time.time()
    assert controller.tick(now) > now  # not due yet
    later = now + node_gpu.CLOCK_READ_EVERY_S
    assert controller.tick(later) == later + node_gpu.CLOCK_READ_EVERY_S and not path.exists()  # still idle
    node.phase("load")
    assert controller.tick(later + 2 * node_gpu.CLOCK_READ_EVERY_S) == float("inf")
    ((fault, seen, detail),) = recorded(ctx)
    assert (fault, seen) == ("gpu-throttle", took)
    assert "SM clock 1980 MHz at 100% utilisation" in detail
    assert ("above the" in detail) is not took and ("under load" in detail) is took
    calls = len(node.runner.calls)
    controller.tick(later + 10 * node_gpu.CLOCK_READ_EVERY_S)
    controller.stop()
    assert len(node.runner.calls) == calls  # decided once: no more readings
    # The job's collect step copies the record; the verdict reads NO EFFECT where the lock did not take.
    injection.collect(ctx.journal.root, ctx.node, ctx.job_id, tmp_path / "fault")
    nothing = not_injected(load_injections(tmp_path / "fault"), f"gpu-throttle:clock={lock}")
    assert (nothing == "") is took and ("the lock did not take" in nothing) is not took


def test_the_job_step_copies_the_record_into_the_job_directory(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path / "journal", dcgm({}), gpus=())
    injection.report(ctx, "gpu-ecc", False, "gpu-ecc: no DCGM host engine on node2 (dcgmi not found)")
    out = tmp_path / "fault"
    env = {"SLURMD_NODENAME": "node2", "SLURM_JOB_ID": "3"}
    argv = ["collect", "--journal-root", str(tmp_path / "journal"), "--out", str(out)]
    assert injection.main(argv, env) == 0
    ((record),) = load_injections(out)
    assert (record.node, record.fault, record.took) == ("node2", "gpu-ecc", False)
    # Another job's step (or no record at all) copies nothing, and never fails the job.
    assert injection.main(argv, {**env, "SLURM_JOB_ID": "4"}) == 0 and len(load_injections(out)) == 1
    assert injection.main(argv, {}) == 0
    assert oct(injection.record_path(tmp_path / "journal", "node2", "3").stat().st_mode & 0o777) == "0o644"
