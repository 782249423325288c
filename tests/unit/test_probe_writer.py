"""The rank file: round trip through reader.py, live reads, SIGKILL survival and requeue carry-over."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from slurm_chaos.errors import DataError
from slurm_chaos.probe.reader import read_rank, read_run
from slurm_chaos.probe.schema import STEP_FIELDS, TELEMETRY_FIELDS
from slurm_chaos.probe.writer import RankWriter, StepRecord, attempt_path, carry_over
from slurm_chaos.resources import import_root

ATTRS = {"rank": 0, "world_size": 1, "host": "node1", "job_id": "42", "start_time": 1.0, "restart_step": 0}


def _record(step: int) -> StepRecord:
    return StepRecord(step, 1000.0 + step, 0.5 + step, 0.25, 0.125, 0.0625, 0.03125, 0.0)


def test_roundtrip_through_reader(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.h5"
    w = RankWriter(path, ATTRS, flush_every=3)
    for s in range(7):
        w.append_step(_record(s))
    w.event("checkpoint_failed", "step 5: ENOSPC: No space left on device")
    w.telemetry(5.0, [float(i) for i in range(len(TELEMETRY_FIELDS))])
    w.pending_attrs["steps_lost"] = 3
    w.close({"exit_reason": "done"})
    rk = read_rank(path)
    assert (rk.rank, rk.world_size, rk.host, rk.job_id) == (0, 1, "node1", "42")
    assert rk.step.tolist() == list(range(7))
    assert rk.step_time.tolist() == [0.5 + s for s in range(7)]
    assert rk.comm_time.tolist() == [0.125] * 7
    assert set(rk.fields) == set(STEP_FIELDS)
    assert rk.t_start[3] == 1003.0
    assert [(e.kind, e.detail) for e in rk.events] == [
        ("checkpoint_failed", "step 5: ENOSPC: No space left on device")
    ]
    assert rk.telemetry["gpu_power_w"].tolist() == [1.0]
    assert rk.attrs["complete"] is True and rk.attrs["steps_lost"] == 3 and rk.attrs["exit_reason"] == "done"
    assert read_run(tmp_path).matrix("step_time").shape == (1, 7)


def test_file_is_readable_while_being_written(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.h5"
    w = RankWriter(path, ATTRS, flush_every=100, flush_interval=3600)
    for s in range(5):
        w.append_step(_record(s))
    assert len(read_rank(path).step) == 0  # buffered, not yet flushed
    w.flush()
    assert read_rank(path).step.tolist() == list(range(5))
    w.close()


def test_long_event_detail_is_truncated_not_fatal(tmp_path: Path) -> None:
    w = RankWriter(tmp_path / "rank-0.h5", ATTRS)
    w.event("gpu_xid", "x" * 5000)
    w.close()
    assert len(read_rank(tmp_path / "rank-0.h5").events[0].detail) == 512


WRITER_SCRIPT = """
import sys, time
from pathlib import Path
from slurm_chaos.probe.writer import RankWriter, StepRecord
w = RankWriter(Path(sys.argv[1]), {"rank": 0, "world_size": 1, "host": "h", "job_id": "1"}, flush_every=1)
step = 0
while True:
    w.append_step(StepRecord(step, time.time(), 0.001 * step, comm_time=0.0005))
    if step % 7 == 0:
        w.event("checkpoint_saved", f"step {step}")
    if step == 20:
        print("ready", flush=True)
    step += 1
"""


@pytest.mark.parametrize("trial", range(4))
def test_sigkilled_writer_leaves_readable_file(tmp_path: Path, trial: int) -> None:
    path = tmp_path / "rank-0.h5"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER_SCRIPT, str(path)], cwd=import_root(), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(random.uniform(0.05, 0.6))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rk = read_rank(path)
    n = len(rk.step)
    assert n > 20
    assert rk.step.tolist() == list(range(n))  # every flushed step, in order, no holes
    assert np.allclose(rk.step_time, 0.001 * np.arange(n))
    # Events are flushed as they happen: every 7th step up to the last flushed one is there.
    assert [e.detail for e in rk.events][: (n - 1) // 7] == [f"step {7 * k}" for k in range((n - 1) // 7)]
    assert "complete" not in rk.attrs


def test_carry_over_keeps_first_attempt_and_copies_its_steps(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.h5"
    w = RankWriter(path, ATTRS)
    for s in range(10):
        w.append_step(_record(s))
    w.event("checkpoint_saved", "step 5")
    w.close()
    carried = carry_over(path)
    assert carried is not None
    previous, steps, events = carried
    assert previous.last_step == 9 and previous.attempts == 1
    assert previous.last_end_time == pytest.approx(1009.0 + 9.5)
    assert previous.path == attempt_path(path, 0) and previous.path.exists() and not path.exists()
    w2 = RankWriter(path, ATTRS | {"restart_step": 5}, attempt=1)
    w2.copy_previous(steps, events)
    for s in range(5, 12):
        w2.append_step(_record(s))
    w2.close()
    rk = read_rank(path)
    assert rk.step.tolist() == list(range(10)) + list(range(5, 12))
    assert rk.attrs["attempt"] == 1
    assert [e.detail for e in rk.events] == ["step 5"]
    assert len(read_rank(previous.path).step) == 10  # the first attempt's file, untouched


def test_carry_over_of_unreadable_file_starts_clean(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.h5"
    path.write_bytes(b"not hdf5 at all")
    carried = carry_over(path)
    assert carried is not None and carried[0].last_step == -1 and carried[1] == {}
    assert attempt_path(path, 0).read_bytes() == b"not hdf5 at all"
    assert carry_over(path) is None


def test_reader_rejects_foreign_file(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.h5"
    path.write_bytes(b"\x89HDF\r\n\x1a\n garbage")
    with pytest.raises(DataError, match="unreadable probe file"):
        read_rank(path)


def test_carry_over_fills_fields_an_older_file_lacks(tmp_path: Path) -> None:
    import h5py

    path = tmp_path / "rank-0.h5"
    with h5py.File(path, "w") as f:  # a minimal schema-1 file: step_time only, no step/attempt
        f.attrs.update({"schema_version": 1, "rank": 0, "world_size": 1, "host": "h", "job_id": "1"})
        f.create_group("steps").create_dataset("step_time", data=[0.5, 0.25])
    carried = carry_over(path)
    assert carried is not None
    w = RankWriter(path, ATTRS, attempt=carried[0].attempts)
    w.copy_previous(carried[1], carried[2])
    w.close()
    rk = read_rank(path)
    assert rk.step_time.tolist() == [0.5, 0.25] and rk.step.tolist() == [0, 1]
    assert np.isnan(rk.comm_time).all()


def test_last_step_follows_a_live_file(tmp_path: Path) -> None:
    """The campaign reads a running job's progress from rank 0's file: the last flushed step,
    None before the file exists or before its first flush."""
    from slurm_chaos.probe.reader import last_step

    assert last_step(tmp_path) is None
    w = RankWriter(tmp_path / "rank-0.h5", ATTRS, flush_every=100, flush_interval=3600)
    assert last_step(tmp_path) is None
    for s in range(5):
        w.append_step(_record(s))
    assert last_step(tmp_path) is None  # buffered, not yet flushed
    w.flush()
    assert last_step(tmp_path) == 4
    w.append_step(_record(5))
    w.close()
    assert last_step(tmp_path) == 5
    (tmp_path / "rank-0.h5").write_bytes(b"not hdf5")
    assert last_step(tmp_path) is None
