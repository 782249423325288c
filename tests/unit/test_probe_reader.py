"""Reading rank files: the ``meta`` attribute (schema 2) and its fall-backs, schema 1 files, and
reading only the datasets an analysis needs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slurm_chaos.analysis.regression import job_series
from slurm_chaos.analysis.straggler import STEPS_READ, straggler_scores
from slurm_chaos.analysis.synthetic import JobModel, simulate, write_run
from slurm_chaos.errors import DataError
from slurm_chaos.probe.reader import open_probe_file, read_attrs, read_rank, read_run
from slurm_chaos.probe.schema import META_ATTR, SCHEMA_VERSION, STEP_FIELDS
from slurm_chaos.probe.writer import RankWriter, StepRecord, meta_json, write_attrs

ATTRS = {
    "rank": 0,
    "world_size": 1,
    "host": "node1",
    "job_id": "42",
    "start_time": 1.5,
    "restart_step": 0,
    "numa_mismatch": np.bool_(True),
    "gpu_index": np.int64(-1),
    "recovery_time": float("nan"),
}
MODEL = JobModel(ranks=6, steps=300, warmup_steps=20, ranks_per_host=2, seed=3)


def _one_by_one(path: Path) -> dict[str, object]:
    """The attributes as h5py reads them one by one, scalars as Python values (as schema 1 is read)."""
    import h5py

    with h5py.File(path, "r", locking=False, swmr=True) as f:
        return {
            k: (v.decode() if isinstance(v, bytes) else v.item() if isinstance(v, np.generic) else v)
            for k, v in f.attrs.items()
            if k != META_ATTR
        }


def _same(a: dict[str, object], b: dict[str, object]) -> bool:
    """Equal, NaN equal to NaN, and of the same types."""
    return a.keys() == b.keys() and all(
        type(a[k]) is type(b[k]) and (a[k] == b[k] or (a[k] != a[k] and b[k] != b[k])) for k in a
    )


def _meta(path: Path) -> dict[str, Any]:
    with open_probe_file(path) as f:
        return dict(json.loads(f.attrs[META_ATTR]))


def test_meta_holds_exactly_the_attributes_while_written_and_after_close(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.h5"
    w = RankWriter(path, ATTRS, flush_every=2)
    for s in range(3):
        w.append_step(StepRecord(s, 10.0 + s, 0.5))
    w.flush()
    live = read_rank(path)  # a SWMR read of a file still being written
    assert live.attrs["schema_version"] == SCHEMA_VERSION and live.step.tolist() == [0, 1, 2]
    assert _same(_meta(path), _one_by_one(path)) and _same(live.attrs, _one_by_one(path))
    w.pending_attrs["steps_lost"] = 2
    w.close({"exit_reason": "done"})
    closed = read_rank(path)
    assert closed.attrs["complete"] is True and closed.attrs["exit_reason"] == "done"
    assert closed.attrs["steps_lost"] == 2 and closed.attrs["numa_mismatch"] is True
    assert _same(_meta(path), _one_by_one(path)) and _same(closed.attrs, _one_by_one(path))


def test_schema_1_file_reads_as_before(tmp_path: Path) -> None:
    import h5py

    path = tmp_path / "rank-0.h5"
    with h5py.File(path, "w") as f:  # written the schema-1 way: attributes one by one, no meta
        f.attrs.update({"schema_version": 1, "rank": 0, "world_size": 1, "host": "h", "job_id": "7"})
        f.attrs["kind"] = np.bytes_(b"fixed")
        f.attrs["complete"] = True
        g = f.create_group("steps")
        g.create_dataset("step", data=np.arange(3))
        g.create_dataset("t_start", data=[1.0, 2.0, 3.0])
        g.create_dataset("step_time", data=[0.5, 0.25, 0.125])
        g.create_dataset("comm_time", data=[0.1, 0.1, 0.1])
    rk = read_rank(path)
    assert rk.attrs == {
        "schema_version": 1,
        "rank": 0,
        "world_size": 1,
        "host": "h",
        "job_id": "7",
        "kind": "fixed",
        "complete": True,
    }
    assert rk.step_time.tolist() == [0.5, 0.25, 0.125] and set(rk.fields) == {"step_time", "comm_time"}
    assert rk.job_id == "7" and rk.t_start.tolist() == [1.0, 2.0, 3.0]


def test_meta_that_is_not_the_attributes_is_ignored(tmp_path: Path) -> None:
    import h5py

    path = write_run(tmp_path / "run", simulate(replace(MODEL, ranks=1))) / "rank-0.h5"
    with h5py.File(path, "r+") as f:  # a writer killed between the closing attributes and meta
        f.attrs["complete"] = True
        f.attrs["end_time"] = 2.0
    assert read_rank(path).attrs["complete"] is True
    with h5py.File(path, "r+") as f:
        f.attrs[META_ATTR] = "{not json"
    expected = _one_by_one(path)
    assert _same(read_rank(path).attrs, expected)
    with open_probe_file(path) as f:
        assert _same(read_attrs(f), expected)


def test_attribute_json_cannot_keep_means_no_meta(tmp_path: Path) -> None:
    assert meta_json({"sizes": np.arange(3)}) is None and meta_json({"raw": b"x"}) is None
    path = tmp_path / "rank-0.h5"
    RankWriter(path, ATTRS | {"sizes": np.arange(3)}).close()
    rk = read_rank(path)
    assert rk.attrs["sizes"].tolist() == [0, 1, 2]  # type: ignore[attr-defined]
    with open_probe_file(path) as f:
        assert META_ATTR not in f.attrs


def test_damaged_meta_is_dropped_when_attributes_are_added(tmp_path: Path) -> None:
    import h5py

    path = tmp_path / "rank-0.h5"
    with h5py.File(path, "w") as f:
        write_attrs(f, {"schema_version": 2, "rank": 0, "world_size": 1, "host": "h", "job_id": "1"})
        f.attrs[META_ATTR] = "{damaged"
        write_attrs(f, {"complete": True})
        assert META_ATTR not in f.attrs and f.attrs["complete"]


def test_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.h5"
    RankWriter(path, ATTRS).close()
    import h5py

    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = 99
        del f.attrs[META_ATTR]
    with pytest.raises(DataError, match="schema_version 99"):
        read_rank(path)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_reading_only_the_analysis_datasets_gives_the_same_analysis(tmp_path: Path, version: int) -> None:
    run = simulate(replace(MODEL, slow_rank=4, slow_rank_factor=0.3))
    directory = write_run(tmp_path / "run", run, schema_version=version)
    full, some = read_run(directory), read_run(directory, STEPS_READ)
    assert set(full.ranks[0].fields) == set(STEP_FIELDS)
    assert set(some.ranks[0].fields) == set(STEPS_READ.fields)
    a, b = job_series(full), job_series(some)
    assert np.array_equal(a.step_time, b.step_time) and np.array_equal(a.t_start, b.t_start)
    assert straggler_scores(full) == straggler_scores(some)
    for x, y in zip(full.ranks, some.ranks, strict=True):
        assert x.attrs == y.attrs and np.array_equal(x.step, y.step) and y.events == ()
