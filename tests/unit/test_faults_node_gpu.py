"""GPU faults: the XID kernel-log line, DCGM injection commands, and honest degradation without GPUs."""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

import pytest

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults import injection, node_gpu
from slurm_chaos.faults.journal import Journal, UndoContext, revert
from slurm_chaos.faults.node_base import APPLIERS, JobContext, log
from slurm_chaos.faults.spec import parse_spec
from slurm_chaos.rundir import load_injections
from slurm_chaos.rundir.injections import read_record_file
from slurm_chaos.runner import Completed, FakeRunner


def recorded(ctx: JobContext) -> list[tuple[str, bool, str]]:
    """The node's injection record of the job, as (fault, took, detail)."""
    path = injection.record_path(ctx.journal.root, ctx.node, ctx.job_id)
    return [(r.fault, r.took, r.detail) for r in read_record_file(path)]


def ctx_for(tmp_path: Path, runner: FakeRunner, gpus: tuple[int, ...] = (0, 1)) -> JobContext:
    journal = Journal(tmp_path, "node2", "3")
    return JobContext("3", "node2", ("node2",), None, None, time.time() + 60, journal, runner, gpus=gpus)


def test_xid_line_matches_what_dmesg_detectors_parse() -> None:
    line = node_gpu.xid_line("0000:3b:00", 79, "node2", "3")
    assert line.startswith("NVRM: Xid (PCI:0000:3b:00): 79, ")
    assert "fallen off the bus" in line and "node2" in line


def test_pci_bus_id_without_gpus_is_made_up_from_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: None)
    assert node_gpu.pci_bus_id(FakeRunner(lambda a: Completed(a, 1, "", "")), 2) == "0000:1a:00"


def test_pci_bus_id_from_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: "/usr/bin/" + name)
    runner = FakeRunner(lambda a: Completed(a, 0, "00000000:3B:00.0\n", ""))
    assert node_gpu.pci_bus_id(runner, 0) == "0000:3b:00"


def test_kmsg_xid_is_written_and_journalled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kmsg = tmp_path / "kmsg"
    monkeypatch.setattr(node_gpu, "KMSG", kmsg)
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: None)
    ctx = ctx_for(tmp_path, FakeRunner(lambda a: Completed(a, 1, "", "")))
    node_gpu.apply_gpu_xid(parse_spec("gpu-xid:xid=48")[0], ctx)
    assert kmsg.read_text().startswith("<3>NVRM: Xid (PCI:0000:18:00): 48, ")
    (entry,) = ctx.journal.read().entries
    assert entry.undo.action == "none"


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
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: "/usr/bin/" + name)
    runner = FakeRunner(lambda a: Completed(a, 0, "", ""))
    ctx = ctx_for(tmp_path, runner)
    node_gpu.apply_gpu_thermal(parse_spec("gpu-thermal:gpu=1,temp=97")[0], ctx)
    assert ("dcgmi", "test", "--inject", "--gpuid", "1", "-f", "150", "-v", "97") in runner.calls
    revert(ctx.journal, UndoContext(runner), by="test")
    assert runner.calls[-2:] == [
        ("dcgmi", "test", "--inject", "--gpuid", "1", "-f", "241", "-v", "0"),
        ("dcgmi", "test", "--inject", "--gpuid", "1", "-f", "150", "-v", "40"),
    ]


def test_power_cap_restores_the_previous_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: "/usr/bin/" + name)
    runner = FakeRunner(lambda a: Completed(a, 0, "700.00\n" if "--query-gpu=power.limit" in a else "", ""))
    ctx = ctx_for(tmp_path, runner)
    node_gpu.apply_gpu_throttle(parse_spec("gpu-throttle:method=power,power=200")[0], ctx)
    assert ("nvidia-smi", "-i", "0", "-pl", "200") in runner.calls
    revert(ctx.journal, UndoContext(runner), by="test")
    assert runner.calls[-1] == ("nvidia-smi", "-i", "0", "-pl", "700.00")


def test_clock_lock_is_reset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: "/usr/bin/" + name)
    runner = FakeRunner(lambda a: Completed(a, 0, "", ""))
    ctx = ctx_for(tmp_path, runner)
    node_gpu.apply_gpu_throttle(parse_spec("gpu-throttle:clock=500")[0], ctx)
    assert runner.calls == [("nvidia-smi", "-i", "0", "-lgc", "500,500")]
    revert(ctx.journal, UndoContext(runner), by="test")
    assert runner.calls[-1] == ("nvidia-smi", "-i", "0", "-rgc")


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


# ------------------------------------------------------------------ did the injection take?
# `dcgmi dmon -i 1 -e 150 -c 1` as DCGM 3 prints it (a header, a units line, one row per GPU).
DMON_TEMP_97 = "#Entity   TMPTR\nID        C\nGPU 1     97\n"


def dcgm(values: dict[str, str], discovery_ok: bool = True) -> FakeRunner:
    """dcgmi with a host engine (or not): injections succeed, `dmon -e FIELD` prints values[FIELD]."""

    def respond(a: tuple[str, ...]) -> Completed:
        if a[:2] == ("dcgmi", "discovery"):
            return Completed(
                a,
                0 if discovery_ok else 1,
                "",
                "" if discovery_ok else "Error: unable to connect to host engine",
            )
        if a[:2] == ("dcgmi", "dmon"):
            field = a[a.index("-e") + 1]
            return Completed(
                a, 0, f"#Entity   F\nID\nGPU {a[a.index('-i') + 1]}     {values.get(field, 'N/A')}\n", ""
            )
        return Completed(a, 0, "", "")

    return FakeRunner(respond)


def test_dmon_output_is_parsed_for_the_gpu_asked() -> None:
    assert node_gpu.parse_dmon(DMON_TEMP_97, 1) == 97
    assert node_gpu.parse_dmon(DMON_TEMP_97, 0) is None
    assert node_gpu.parse_dmon("#Entity   TMPTR\nID\nGPU 0     N/A\n", 0) is None
    assert node_gpu.parse_dmon("", 0) is None
    assert node_gpu.dcgm_read_argv(1, 150) == ["dcgmi", "dmon", "-i", "1", "-e", "150", "-c", "1"]


def test_an_injection_read_back_from_dcgm_took(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: "/usr/bin/" + name)
    ctx = ctx_for(tmp_path, dcgm({"150": "97", "241": "1"}))
    node_gpu.apply_gpu_thermal(parse_spec("gpu-thermal:gpu=1,temp=97")[0], ctx)
    ((fault, took, detail),) = recorded(ctx)
    assert (fault, took) == ("gpu-thermal", True)
    assert "DCGM field 150 of GPU 1: read back 97" in detail and "field 241" in detail


def test_an_injection_dcgm_does_not_show_did_not_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: "/usr/bin/" + name)
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


def test_throttle_without_nvml_and_a_power_cap_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    monkeypatch.setattr(node_gpu.shutil, "which", lambda name: "/usr/bin/" + name)
    limits = iter(["700.00\n", "200.00\n"])
    runner = FakeRunner(lambda a: Completed(a, 0, next(limits) if "--query-gpu=power.limit" in a else "", ""))
    other = ctx_for(tmp_path / "b", runner)
    node_gpu.apply_gpu_throttle(parse_spec("gpu-throttle:method=power,power=200")[0], other)
    assert recorded(other) == [
        ("gpu-throttle", True, "gpu-throttle on node2: power limit of GPU 0 (NVML): read back 200")
    ]


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
