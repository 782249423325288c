"""Slow rank (duty cycle), noisy neighbour: real processes stopped, continued and stopped for good."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from waiting import wait_until

from slurm_chaos.faults import node_proc
from slurm_chaos.faults.choices import Load
from slurm_chaos.faults.journal import Journal, UndoContext, revert
from slurm_chaos.faults.node_base import MARKER_ENV, JobContext, popen_spawner
from slurm_chaos.faults.node_cpu import DutyCycle, apply_slow_node, marked, stress_argv
from slurm_chaos.faults.node_proc import ProcId
from slurm_chaos.faults.spec import parse_spec
from slurm_chaos.runner import Completed, FakeRunner


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def ctx_for(tmp_path: Path, nodes: tuple[str, ...] = ("node1",)) -> JobContext:
    runner = FakeRunner(lambda argv: Completed(argv, 0, "", ""))
    return JobContext(
        "77", "node1", nodes, None, None, time.time() + 60, Journal(tmp_path, "node1", "77"), runner
    )


def test_proc_identity_survives_only_the_same_process() -> None:
    p = node_proc.proc_id(node_proc.os.getpid())
    assert p is not None and node_proc.is_alive(p)
    assert not node_proc.is_alive(ProcId(p.pid, p.start + 1))


def test_duty_cycle_stops_and_continues_and_journals_first(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        target = node_proc.proc_id(child.pid)
        assert target is not None
        ctx = ctx_for(tmp_path)
        duty = DutyCycle("slow-rank", ctx, 0, 50.0, find=lambda job, rank: [target], period=0.2)
        t = time.time()
        duty.tick(t)  # scan + first SIGSTOP
        wait_until(lambda: state(child.pid) == "T")
        (entry,) = ctx.journal.read().entries
        assert entry.undo.action == "signal_process" and entry.undo.data["signal"] == "SIGCONT"
        # Over one second the process is stopped about half of the time.
        stopped = samples = 0
        end = time.time() + 1.0
        while time.time() < end:
            duty.tick(time.time())
            samples += 1
            stopped += state(child.pid) == "T"
            time.sleep(0.005)
        assert 0.3 < stopped / samples < 0.7
        while not duty.stopped:  # leave it stopped, as a controller killed mid-cycle would
            duty.next_switch = 0
            duty.tick(time.time())
        wait_until(lambda: state(child.pid) == "T")
        # The journal's undo continues it even though the controller never did (as if it died).
        revert(ctx.journal, UndoContext(ctx.runner), by="test")
        wait_until(lambda: state(child.pid) in ("R", "S"))
    finally:
        child.kill()
        child.wait()


def test_slow_node_acts_only_on_its_node(tmp_path: Path) -> None:
    (req,) = parse_spec("slow-node:node=1,percent=30")
    here = apply_slow_node(req, ctx_for(tmp_path, ("node0", "node1")))
    assert len(here) == 1 and isinstance(here[0], DutyCycle) and here[0].rank is None
    assert apply_slow_node(req, ctx_for(tmp_path / "b", ("node1", "node2"))) == []


def test_stress_argv() -> None:
    assert stress_argv(Load.CPU, 2, 30) == ["stress-ng", "--cpu", "2", "--timeout", "30s", "--quiet"]
    assert stress_argv(Load.MEMORY, 1, 0)[1:4] == ["--vm", "1", "--vm-bytes"]
    assert stress_argv(Load.MATMUL, 0, 5)[1:3] == ["--matrix", "0"]


def test_marked_processes_are_killed_by_the_undo(tmp_path: Path) -> None:
    from slurm_chaos.faults.journal import Undo

    marker = f"test-{time.time()}"
    ctx = ctx_for(tmp_path)
    ctx.journal.record("noisy-neighbour", "sleep", Undo(action="kill_marked", data={"marker": marker}), 1e12)
    pid = popen_spawner(["sh", "-c", "sleep 60 & sleep 60"], {MARKER_ENV: marker}, None)
    wait_until(lambda: len(marked(marker)) >= 2)  # the shell and its background child
    procs = marked(marker)
    assert pid in [p.pid for p in procs] and len(procs) >= 2
    result = revert(ctx.journal, UndoContext(ctx.runner), by="test")
    assert "stopped" in result.undone[0]
    assert marked(marker) == []
