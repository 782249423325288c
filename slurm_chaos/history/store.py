"""The site's history: one SQLite file, its schema versioned by ``PRAGMA user_version``.

Tables (version 2)::

    windows        one row per campaign: site, run id, run directory, start, Slurm's version, ...
    window_nodes   the nodes its jobs ran on
    experiments    one row per experiment of a window: verdict, effect with CI, MDE, time to
                   detect and remediate (and the deadlines they were judged against), lost steps,
                   the straggler named
    detections     every site detector's firing in an experiment: detector, signal, time, silenced

A window is written in one ``BEGIN IMMEDIATE`` transaction, so two campaigns ending at once take
turns (each waits up to ``BUSY_TIMEOUT_S`` for the other's lock) and a reader never sees half a
window. The journal stays SQLite's default rollback journal, not WAL: WAL needs memory shared
between the writers, which processes on two login nodes writing one file on a shared filesystem
do not have. The same run id added again replaces its window (a resumed campaign reports again).

Migrations: ``MIGRATIONS[i]`` brings a file from version ``i`` to ``i + 1``, inside the same
transaction that checks the version, so two processes opening an old file migrate it once.
A file of a later version than this code knows is refused, never written.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from slurm_chaos.analysis.model import Verdict
from slurm_chaos.errors import ChaosError, DataError
from slurm_chaos.history.records import ExperimentRecord, Firing, Window, ordered

#: How long a writer waits for another's lock before giving up.
BUSY_TIMEOUT_S = 60.0


class HistoryBusy(ChaosError):
    """Another process held the history's lock past BUSY_TIMEOUT_S: the tool could not do its work."""

    exit_code = 3


_V1 = (
    """CREATE TABLE windows (
        id INTEGER PRIMARY KEY,
        site TEXT NOT NULL,
        run_id TEXT NOT NULL,
        run_dir TEXT NOT NULL,
        started REAL,
        slurm_version TEXT NOT NULL DEFAULT '',
        tool_version TEXT NOT NULL DEFAULT '',
        kind TEXT NOT NULL DEFAULT '',
        UNIQUE (site, run_id))""",
    """CREATE TABLE window_nodes (
        window_id INTEGER NOT NULL REFERENCES windows(id) ON DELETE CASCADE,
        node TEXT NOT NULL,
        PRIMARY KEY (window_id, node))""",
    """CREATE TABLE experiments (
        id INTEGER PRIMARY KEY,
        window_id INTEGER NOT NULL REFERENCES windows(id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        verdict TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        fault TEXT NOT NULL DEFAULT '',
        design TEXT NOT NULL DEFAULT '',
        effect REAL, ci_low REAL, ci_high REAL, p_value REAL, mde REAL,
        detected_by TEXT,
        time_to_detect_s REAL,
        time_to_remediate_s REAL,
        lost_steps INTEGER NOT NULL DEFAULT 0,
        crashed INTEGER NOT NULL DEFAULT 0,
        straggler TEXT,
        UNIQUE (window_id, name))""",
    """CREATE TABLE detections (
        experiment_id INTEGER NOT NULL REFERENCES experiments(id) ON DELETE CASCADE,
        detector TEXT NOT NULL,
        signal TEXT NOT NULL,
        time_to_detect_s REAL NOT NULL,
        silenced INTEGER NOT NULL DEFAULT 0)""",
)
# Version 2: what each experiment was judged against: its deadlines, so that a comparison can say
# "past its deadline", and whether it expected a slowdown at all (an A/A control, whose detectors
# must stay quiet). A window stored by version 1 has neither: its times are judged by the spread
# alone, and it counts as expecting a slowdown.
_V2 = (
    "ALTER TABLE experiments ADD COLUMN expect_regression INTEGER",
    "ALTER TABLE experiments ADD COLUMN detect_within_s REAL",
    "ALTER TABLE experiments ADD COLUMN remediate_within_s REAL",
    "CREATE INDEX windows_by_site ON windows (site, started)",
)
MIGRATIONS: tuple[tuple[str, ...], ...] = (_V1, _V2)
SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(db: sqlite3.Connection) -> int:
    row = db.execute("PRAGMA user_version").fetchone()
    return int(row[0])


def migrate(db: sqlite3.Connection, path: Path, to: int = SCHEMA_VERSION) -> int:
    """Bring the file up to version ``to`` inside the caller's transaction; returns the version it had."""
    had = schema_version(db)
    if had > SCHEMA_VERSION:
        raise DataError(
            f"{path}: history schema version {had}, newer than this slurm-chaos knows ({SCHEMA_VERSION}); "
            "upgrade slurm-chaos to read it"
        )
    if had == 0 and db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
        raise DataError(f"{path}: an SQLite file, but not a slurm-chaos history (it has tables of its own)")
    for version in range(had, to):
        for statement in MIGRATIONS[version]:
            db.execute(statement)
    if to > had:
        db.execute(f"PRAGMA user_version = {int(to)}")
    return had


def _connect(path: Path) -> sqlite3.Connection:
    # isolation_level None: this module says where each transaction begins and ends.
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    db.execute("PRAGMA foreign_keys = ON")
    return db


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


class HistoryStore:
    """An open history file; ``open_store`` opens (and creates or migrates) one."""

    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self._db = db
        self.path = path

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, window: Window) -> None:
        """Add a window in one transaction, replacing the one of the same site and run id."""
        try:
            self._add(window)
        except sqlite3.OperationalError as exc:
            raise HistoryBusy(f"{self.path}: window {window.run_id} not added ({exc})") from exc

    def _add(self, window: Window) -> None:
        with _transaction(self._db):
            self._db.execute(
                "DELETE FROM windows WHERE site = ? AND run_id = ?", (window.site, window.run_id)
            )
            cur = self._db.execute(
                "INSERT INTO windows (site, run_id, run_dir, started, slurm_version, tool_version, kind)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    window.site,
                    window.run_id,
                    window.run_dir,
                    window.started,
                    window.slurm_version,
                    window.tool_version,
                    window.kind,
                ),
            )
            window_id = cur.lastrowid
            self._db.executemany(
                "INSERT INTO window_nodes (window_id, node) VALUES (?, ?)",
                [(window_id, n) for n in window.nodes],
            )
            for e in window.experiments:
                self._add_experiment(window_id, e)

    def _add_experiment(self, window_id: int | None, e: ExperimentRecord) -> None:
        cur = self._db.execute(
            "INSERT INTO experiments (window_id, name, verdict, reason, fault, design, effect, ci_low,"
            " ci_high, p_value, mde, detected_by, time_to_detect_s, time_to_remediate_s, lost_steps,"
            " crashed, straggler, expect_regression, detect_within_s, remediate_within_s)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                window_id,
                e.name,
                e.verdict.value,
                e.reason,
                e.fault,
                e.design,
                e.effect,
                e.ci_low,
                e.ci_high,
                e.p_value,
                e.mde,
                e.detected_by,
                e.time_to_detect_s,
                e.time_to_remediate_s,
                e.lost_steps,
                int(e.crashed),
                e.straggler,
                int(e.expect_regression),
                e.detect_within_s,
                e.remediate_within_s,
            ),
        )
        self._db.executemany(
            "INSERT INTO detections (experiment_id, detector, signal, time_to_detect_s, silenced)"
            " VALUES (?, ?, ?, ?, ?)",
            [(cur.lastrowid, f.detector, f.signal, f.time_to_detect_s, int(f.silenced)) for f in e.firings],
        )

    def sites(self) -> list[str]:
        return [str(r[0]) for r in self._db.execute("SELECT DISTINCT site FROM windows ORDER BY site")]

    def windows(self, site: str) -> list[Window]:
        """The site's windows, oldest first."""
        try:
            # One read transaction: a window a writer replaces meanwhile is read whole, old or new.
            self._db.execute("BEGIN")
            try:
                return self._windows(site)
            finally:
                self._db.execute("ROLLBACK")
        except sqlite3.OperationalError as exc:
            raise HistoryBusy(f"{self.path}: cannot read the history ({exc})") from exc

    def _windows(self, site: str) -> list[Window]:
        rows = self._db.execute(
            "SELECT id, site, run_id, run_dir, started, slurm_version, tool_version, kind"
            " FROM windows WHERE site = ?",
            (site,),
        ).fetchall()
        return ordered([self._window(row) for row in rows])

    def _window(self, row: Sequence[object]) -> Window:
        window_id = row[0]
        nodes = self._db.execute(
            "SELECT node FROM window_nodes WHERE window_id = ? ORDER BY node", (window_id,)
        ).fetchall()
        experiments = self._db.execute(
            "SELECT id, name, verdict, reason, fault, design, effect, ci_low, ci_high, p_value, mde,"
            " detected_by, time_to_detect_s, time_to_remediate_s, lost_steps, crashed, straggler,"
            " detect_within_s, remediate_within_s, expect_regression"
            " FROM experiments WHERE window_id = ? ORDER BY id",
            (window_id,),
        ).fetchall()
        return Window(
            site=str(row[1]),
            run_id=str(row[2]),
            run_dir=str(row[3]),
            started=None if row[4] is None else float(str(row[4])),
            slurm_version=str(row[5]),
            tool_version=str(row[6]),
            kind=str(row[7]),
            nodes=tuple(str(n[0]) for n in nodes),
            experiments=tuple(self._experiment(e) for e in experiments),
        )

    def _experiment(self, row: Sequence[object]) -> ExperimentRecord:
        firings = self._db.execute(
            "SELECT detector, signal, time_to_detect_s, silenced FROM detections"
            " WHERE experiment_id = ? ORDER BY rowid",
            (row[0],),
        ).fetchall()
        verdict = str(row[2])
        try:
            judged = Verdict(verdict)
        except ValueError as exc:
            raise DataError(f"{self.path}: experiment {row[1]}: unknown verdict {verdict!r}") from exc
        return ExperimentRecord(
            name=str(row[1]),
            verdict=judged,
            reason=str(row[3]),
            fault=str(row[4]),
            design=str(row[5]),
            effect=_real(row[6]),
            ci_low=_real(row[7]),
            ci_high=_real(row[8]),
            p_value=_real(row[9]),
            mde=_real(row[10]),
            detected_by=None if row[11] is None else str(row[11]),
            time_to_detect_s=_real(row[12]),
            time_to_remediate_s=_real(row[13]),
            lost_steps=int(str(row[14])),
            crashed=bool(row[15]),
            straggler=None if row[16] is None else str(row[16]),
            detect_within_s=_real(row[17]),
            remediate_within_s=_real(row[18]),
            expect_regression=row[19] is None or bool(row[19]),
            firings=tuple(Firing(str(d), str(s), float(t), bool(q)) for d, s, t, q in firings),
        )


def _real(value: object) -> float | None:
    return None if value is None else float(str(value))


def open_store(path: Path, create: bool = True) -> HistoryStore:
    """Open the history at ``path``, creating it (and its directory) when ``create``, migrating an
    older file; a file that is not a history, or one newer than this code, raises DataError."""
    if not create and not path.is_file():
        raise DataError(
            f"{path}: no history here (a campaign adds its results at its end; "
            "older runs: slurm-chaos history import RUN_DIR ...)"
        )
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        db = _connect(path)
    except (OSError, sqlite3.Error) as exc:
        raise DataError(f"{path}: cannot open the history ({exc})") from exc
    try:
        # A history already current is only read: a reader needs no write access to it.
        if schema_version(db) != SCHEMA_VERSION:
            with _transaction(db):
                migrate(db, path)
    except sqlite3.OperationalError as exc:
        db.close()
        raise HistoryBusy(f"{path}: cannot open the history ({exc})") from exc
    except sqlite3.DatabaseError as exc:
        db.close()
        raise DataError(f"{path}: not a slurm-chaos history ({exc})") from exc
    except BaseException:
        db.close()
        raise
    return HistoryStore(db, path)
