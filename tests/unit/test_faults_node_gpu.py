"""GPU faults: the XID kernel-log line, DCGM injection commands, and honest degradation without GPUs."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from slurm_chaos.faults import node_gpu
from slurm_chaos.faults.journal import Journal, UndoContext, revert
from slurm_chaos.faults.node_base import JobContext, log
from slurm_chaos.faults.spec import parse_spec
from slurm_chaos.runner import Completed, FakeRunner


def ctx_for(tmp_path: Path, runner: FakeRunner) -> JobContext:
    return JobContext(
        "3", "node2", ("node2",), None, None, time.time() + 60, Journal(tmp_path, "node2", "3"), runner
    )


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
