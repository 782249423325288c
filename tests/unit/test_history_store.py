"""The history file: a window round-trips, a version-1 file migrates, two writers at once both land."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from slurm_chaos.analysis.model import Verdict
from slurm_chaos.errors import DataError
from slurm_chaos.history import store
from slurm_chaos.history.records import ExperimentRecord, Firing, Window
from slurm_chaos.history.store import SCHEMA_VERSION, HistoryBusy, migrate, open_store, schema_version

RECORD = ExperimentRecord(
    name="ckpt-full",
    verdict=Verdict.NOT_RECOVERED,
    reason="drained after 40 s, no requeue",
    fault="storage:full@/ckpt",
    design="between-runs",
    effect=0.124,
    ci_low=0.08,
    ci_high=0.17,
    p_value=0.0012,
    mde=0.031,
    detected_by="node_drained",
    time_to_detect_s=5.5,
    time_to_remediate_s=None,
    lost_steps=300,
    crashed=True,
    straggler="rank 3@node2",
    expect_regression=True,
    detect_within_s=60.0,
    remediate_within_s=120.0,
    firings=(
        Firing("nhc", "checkpoint", 5.5),
        Firing("alerts", "checkpoint", 31.0, silenced=True),
    ),
)


def window(
    run_id: str, started: float | None, *experiments: ExperimentRecord, site: str = "golden"
) -> Window:
    return Window(
        site=site,
        run_id=run_id,
        run_dir=f"/runs/{run_id}",
        started=started,
        slurm_version="24.11.1",
        tool_version="0.9.0",
        kind="campaign",
        nodes=("node1", "node2"),
        experiments=experiments,
    )


def test_a_window_round_trips_field_for_field(tmp_path: Path) -> None:
    control = ExperimentRecord("control-aa", Verdict.PASSED, expect_regression=False)
    w = window("w1", 1_764_504_000.25, RECORD, control)
    with open_store(tmp_path / "h.sqlite") as history:
        history.add(w)
    with open_store(tmp_path / "h.sqlite", create=False) as history:
        assert history.windows("golden") == [w]
        assert history.windows("other") == []
        assert history.sites() == ["golden"]


def test_windows_come_oldest_first_and_a_run_id_added_again_replaces_its_window(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "h.sqlite"  # its directory is created
    with open_store(path) as history:
        history.add(window("late", 200.0, RECORD))
        history.add(window("early", 100.0, RECORD))
        history.add(window("undated", None, RECORD))
        history.add(window("late", 300.0, ExperimentRecord("other", Verdict.PASSED)))
        got = history.windows("golden")
    assert [w.run_id for w in got] == ["undated", "early", "late"]
    assert got[-1].started == 300.0 and [e.name for e in got[-1].experiments] == ["other"]
    # The replaced window's experiments and detections went with it.
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM experiments").fetchone()[0] == 3
    assert db.execute("SELECT count(*) FROM detections").fetchone()[0] == 4


def test_a_version_1_file_migrates_and_keeps_its_windows(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    migrate(db, path, to=1)
    assert schema_version(db) == 1
    db.execute(
        "INSERT INTO windows (id, site, run_id, run_dir, started) VALUES (1, 'golden', 'old', '/r', 5.0)"
    )
    db.execute(
        "INSERT INTO experiments (id, window_id, name, verdict, time_to_detect_s, lost_steps)"
        " VALUES (1, 1, 'ckpt-full', 'PASSED', 4.0, 20)"
    )
    db.execute("INSERT INTO detections VALUES (1, 'nhc', 'checkpoint', 4.0, 0)")
    db.close()
    with open_store(path) as history:
        (old,) = history.windows("golden")
        history.add(window("new", 10.0, RECORD))
        assert [w.run_id for w in history.windows("golden")] == ["old", "new"]
    e = old.experiments[0]
    assert (e.verdict, e.time_to_detect_s, e.lost_steps, e.firings) == (
        Verdict.PASSED,
        4.0,
        20,
        (Firing("nhc", "checkpoint", 4.0),),
    )
    # What version 1 did not record: no deadlines, and an experiment that expects a slowdown.
    assert (e.detect_within_s, e.remediate_within_s, e.expect_regression) == (None, None, True)
    assert schema_version(sqlite3.connect(path)) == SCHEMA_VERSION == 2


def test_a_current_file_is_read_while_a_writer_holds_its_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a current file takes no write lock: a report reads while a campaign writes."""
    monkeypatch.setattr(store, "BUSY_TIMEOUT_S", 0.2)
    path = tmp_path / "h.sqlite"
    with open_store(path) as history:
        history.add(window("w1", 1.0, RECORD))
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    try:
        with open_store(path, create=False) as history:
            assert [w.run_id for w in history.windows("golden")] == ["w1"]
            with pytest.raises(HistoryBusy, match="window w2 not added"):
                history.add(window("w2", 2.0, RECORD))
    finally:
        writer.execute("ROLLBACK")


def test_a_newer_file_is_refused_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(DataError, match="newer than this slurm-chaos knows"):
        open_store(path)
    assert schema_version(sqlite3.connect(path)) == SCHEMA_VERSION + 1


def test_what_is_not_a_history_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    with pytest.raises(DataError, match="not a slurm-chaos history"):
        open_store(other)
    text = tmp_path / "notes.txt"
    text.write_text("not a database at all, but long enough to have a header of sorts\n" * 20)
    with pytest.raises(DataError, match="not a slurm-chaos history"):
        open_store(text)
    with pytest.raises(DataError, match="no history here"):
        open_store(tmp_path / "missing.sqlite", create=False)
    assert not (tmp_path / "missing.sqlite").exists()


# Enough that the two overlap: with no busy timeout (BUSY_TIMEOUT_S = 0) this fails, "database is locked".
WRITES = 100


def _writer(path: str, prefix: str, count: int, start: multiprocessing.synchronize.Event) -> None:
    start.wait()
    for i in range(count):
        with open_store(Path(path)) as history:  # a fresh file: both race to create and migrate it
            history.add(window(f"{prefix}-{i:03d}", float(i), RECORD))


def test_two_writers_at_once_both_land_and_the_file_stays_whole(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    writers = [ctx.Process(target=_writer, args=(str(path), name, WRITES, start)) for name in ("a", "b")]
    for w in writers:
        w.start()
    start.set()
    for w in writers:
        w.join(120)
    assert [w.exitcode for w in writers] == [0, 0]
    with open_store(path, create=False) as history:
        got = history.windows("golden")
    assert len(got) == 2 * WRITES and all(len(w.experiments[0].firings) == 2 for w in got)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("SELECT count(*) FROM detections").fetchone()[0] == 4 * WRITES
