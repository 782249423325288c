"""GPU faults: the XID kernel-log line, DCGM injection commands, and honest degradation without GPUs."""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

import pytest

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults import node_gpu
from slurm_chaos.faults.journal import Journal, UndoContext, revert
from slurm_chaos.faults.node_base import APPLIERS, JobContext, log
from slurm_chaos.faults.spec import parse_spec
from slurm_chaos.runner import Completed, FakeRunner


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
    assert any("DCGM is not running" in r.getMessage() for r in records)


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
