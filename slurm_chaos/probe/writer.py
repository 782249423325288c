"""Write one rank's HDF5 file incrementally, so that a SIGKILLed rank leaves a readable file.

The file is written in HDF5's SWMR mode (single writer, multiple readers): every flush leaves the
file consistent on disk, whatever happens to the process afterwards, and readers may open it while it
grows (``reader.read_rank`` opens such a file with ``swmr=True``). SWMR forbids creating objects once
it is on, so every group and dataset is created up front, strings are fixed-length bytes, and the
closing attributes (``end_time``, ``complete``) are written after SWMR is switched off at close,
and ``meta`` (every attribute as one JSON string, schema 2) is written at start and rewritten then.

Rows are buffered in memory and written in one batch per flush (every ``flush_every`` steps or
``flush_interval`` seconds, whichever comes first): that keeps the per-step cost to appending to a
Python list. A requeued job keeps the first attempt's file as ``rank-<R>.attempt-<A>.h5`` and copies
its steps and events into the new ``rank-<R>.h5`` (see :func:`carry_over`), so the rank file shows
the whole job, re-run steps included, and ``steps/attempt`` tells the attempts apart.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slurm_chaos.errors import DataError
from slurm_chaos.probe.schema import (
    ALLREDUCE_FIELDS,
    FAULT_FIELDS,
    FAULT_FILL,
    META_ATTR,
    SCHEMA_VERSION,
    STEP_FIELDS,
    TELEMETRY_FIELDS,
)

KIND_BYTES = 32
DETAIL_BYTES = 512
_INT_STEP_FIELDS = ("step", "attempt")


@dataclass(frozen=True)
class StepRecord:
    """The timings of one step, in seconds (``t_start`` in Unix seconds)."""

    step: int
    t_start: float
    step_time: float
    compute_time: float = 0.0
    comm_time: float = 0.0
    optimizer_time: float = 0.0
    data_time: float = 0.0
    checkpoint_time: float = 0.0
    # Written only by a writer opened with ``fault=True`` (a run with a fault schedule).
    fault_state: int = FAULT_FILL["fault_state"]
    fault_epoch: int = FAULT_FILL["fault_epoch"]


@dataclass(frozen=True)
class PreviousAttempt:
    """What a requeued rank found of its earlier attempt(s)."""

    path: Path
    last_step: int
    last_end_time: float
    attempts: int


def _encode(text: str, size: int) -> bytes:
    return text.encode("utf-8", "replace")[:size]


class RankWriter:
    """Appends steps, events and telemetry samples to ``rank-<R>.h5``; flushes in batches."""

    def __init__(
        self,
        path: Path,
        attrs: Mapping[str, Any],
        *,
        attempt: int = 0,
        allreduce: bool = False,
        fault: bool = False,
        flush_every: int = 50,
        flush_interval: float = 1.0,
    ) -> None:
        import h5py

        self.path = path
        self.attempt = attempt
        self.flush_every = flush_every
        self.flush_interval = flush_interval
        self._steps: list[StepRecord] = []
        self._events: list[tuple[float, str, str]] = []
        self._telemetry: list[tuple[float, Sequence[float]]] = []
        self._last_flush = time.monotonic()
        # SWMR forbids new attributes while the file is open: these are written at close.
        self.pending_attrs: dict[str, Any] = {}
        self._file = h5py.File(path, "w", libver="latest", locking=False)
        self.fault = fault
        self._create_layout(attrs, allreduce)
        self._file.swmr_mode = True
        self.closed = False

    def _create_layout(self, attrs: Mapping[str, Any], allreduce: bool) -> None:
        f = self._file
        write_attrs(f, {"schema_version": SCHEMA_VERSION, "attempt": self.attempt, **attrs})
        steps = f.create_group("steps")
        for name in _INT_STEP_FIELDS:
            steps.create_dataset(name, (0,), maxshape=(None,), dtype="i8", chunks=(1024,))
        for name in ("t_start", *STEP_FIELDS):
            steps.create_dataset(name, (0,), maxshape=(None,), dtype="f8", chunks=(1024,))
        if self.fault:
            for name, dtype in FAULT_FIELDS.items():
                steps.create_dataset(name, (0,), maxshape=(None,), dtype=dtype, chunks=(1024,))
        events = f.create_group("events")
        events.create_dataset("time", (0,), maxshape=(None,), dtype="f8", chunks=(64,))
        events.create_dataset("kind", (0,), maxshape=(None,), dtype=f"S{KIND_BYTES}", chunks=(64,))
        events.create_dataset("detail", (0,), maxshape=(None,), dtype=f"S{DETAIL_BYTES}", chunks=(64,))
        telemetry = f.create_group("telemetry")
        for name in ("time", *TELEMETRY_FIELDS):
            telemetry.create_dataset(name, (0,), maxshape=(None,), dtype="f8", chunks=(256,))
        if allreduce:
            group = f.create_group("allreduce")
            for name in ALLREDUCE_FIELDS:
                dtype = "i8" if name == "size_bytes" else "f8"
                group.create_dataset(name, (0,), maxshape=(None,), dtype=dtype, chunks=(64,))
        self._cols = {
            f"{group.name.strip('/')}/{name}": _Column(ds)
            for group in f.values()
            for name, ds in group.items()
        }

    def append_step(self, record: StepRecord) -> None:
        """Buffer one step; flushes when the batch is due."""
        self._steps.append(record)
        if len(self._steps) >= self.flush_every or time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()

    def event(self, kind: str, detail: str = "", when: float | None = None) -> None:
        """Record an event; events are rare and matter after a crash, so they are flushed at once."""
        self._events.append((time.time() if when is None else when, kind, detail))
        self.flush()

    def telemetry(self, when: float, values: Sequence[float]) -> None:
        """Buffer one telemetry sample (values in the order of ``TELEMETRY_FIELDS``)."""
        self._telemetry.append((when, values))

    def allreduce_rows(self, rows: Sequence[tuple[int, float, float, float]]) -> None:
        """Write the per-message-size summary of ``--mode allreduce``."""
        for i, name in enumerate(ALLREDUCE_FIELDS):
            self._cols[f"allreduce/{name}"].append([row[i] for row in rows])
        self.flush()

    def copy_previous(
        self, steps: Mapping[str, np.ndarray], events: Sequence[tuple[float, str, str]]
    ) -> None:
        """Write an earlier attempt's steps (arrays keyed by dataset name) and events ahead of ours.

        Fault columns an earlier attempt lacks (schema 2, or a run without a schedule) are filled
        with "not measured" (2) and "no channel" (-1): nothing says what the fault did then."""
        n = len(steps.get("step_time", ()))
        names = (*_INT_STEP_FIELDS, "t_start", *STEP_FIELDS, *(FAULT_FIELDS if self.fault else ()))
        for name in names:
            data = steps.get(name)
            if data is None or len(data) < n:  # a field the earlier file lacks: as the reader fills it
                data = _fill(name, n)
            self._cols[f"steps/{name}"].append(data[:n])
        self._events[:0] = list(events)
        self.flush()

    def flush(self) -> None:
        """Write the buffered rows and make them durable in the file."""
        if self.closed:
            return
        col = self._cols
        if self._steps:
            col["steps/step"].append([r.step for r in self._steps])
            col["steps/attempt"].append([self.attempt] * len(self._steps))
            col["steps/t_start"].append([r.t_start for r in self._steps])
            for name in STEP_FIELDS:
                col[f"steps/{name}"].append([getattr(r, name) for r in self._steps])
            if self.fault:
                for name in FAULT_FIELDS:
                    col[f"steps/{name}"].append([getattr(r, name) for r in self._steps])
            self._steps.clear()
        if self._events:
            col["events/time"].append([e[0] for e in self._events])
            col["events/kind"].append([_encode(e[1], KIND_BYTES) for e in self._events])
            col["events/detail"].append([_encode(e[2], DETAIL_BYTES) for e in self._events])
            self._events.clear()
        if self._telemetry:
            col["telemetry/time"].append([t for t, _ in self._telemetry])
            for i, name in enumerate(TELEMETRY_FIELDS):
                col[f"telemetry/{name}"].append([v[i] for _, v in self._telemetry])
            self._telemetry.clear()
        self._file.flush()
        self._last_flush = time.monotonic()

    def close(self, final_attrs: Mapping[str, Any] | None = None) -> None:
        """Flush, leave SWMR mode and write the closing attributes."""
        import h5py

        if self.closed:
            return
        self.flush()
        self._file.close()
        self.closed = True
        with h5py.File(self.path, "r+", locking=False) as f:
            closing = {"end_time": time.time(), "complete": True}
            write_attrs(f, closing | self.pending_attrs | dict(final_attrs or {}))


def _fill(name: str, n: int) -> np.ndarray:
    """What the reader (and a new attempt) takes for step field `name` where a file lacks it."""
    if name == "step":
        return np.arange(n)
    if name == "attempt":
        return np.zeros(n, dtype=np.int64)
    if name in FAULT_FILL:
        return np.full(n, FAULT_FILL[name], dtype=np.int64)
    return np.full(n, np.nan)


def write_attrs(f: Any, attrs: Mapping[str, Any]) -> None:
    """Write `attrs` as file attributes, one by one, and add them to ``meta``, all of them as one
    JSON attribute (schema 2), in a new file or one that has it: where a value does not fit JSON
    the file gets none (readers then read attributes one by one)."""
    has_meta = META_ATTR in f.attrs
    fresh = len(f.attrs) == 0
    for key, value in attrs.items():
        f.attrs[key] = _attr_value(value)
    if not (fresh or has_meta):
        return
    try:
        previous = json.loads(f.attrs[META_ATTR]) if has_meta else {}
    except (TypeError, ValueError):  # damaged: closing the file must not fail for it
        previous = None
    meta = meta_json(previous | dict(attrs)) if isinstance(previous, dict) else None
    if meta is not None:
        f.attrs[META_ATTR] = meta
    elif has_meta:
        del f.attrs[META_ATTR]


def meta_json(attrs: Mapping[str, Any]) -> str | None:
    """``attrs`` as the ``meta`` attribute holds them (values as the reader decodes the attributes
    one by one); None if one is not a scalar JSON keeps exactly."""
    values: dict[str, object] = {}
    for key, value in attrs.items():
        v = value.item() if isinstance(value, np.generic) else _attr_value(value)
        if not isinstance(v, bool | int | float | str):
            return None
        values[key] = v
    return json.dumps(values, sort_keys=True)


def _attr_value(value: Any) -> Any:
    # str subclasses (torch's TorchVersion) would become numpy unicode, which HDF5 cannot store.
    return str(value) if isinstance(value, str) else value


class _Column:
    """One resizable 1-D dataset, appended to through h5py's low-level API.

    The high-level ``dataset[old:] = ...`` and the group look-ups around it cost about 250 us per
    dataset and flush, most of the probe's per-step bookkeeping; the low-level calls cost a fifth.
    """

    def __init__(self, dataset: Any) -> None:
        self.id = dataset.id
        self.dtype = dataset.dtype
        self.length = int(dataset.shape[0])

    def append(self, values: Sequence[Any] | np.ndarray) -> None:
        from h5py import h5s

        data = np.ascontiguousarray(values, dtype=self.dtype)
        n = len(data)
        if n == 0:
            return
        self.id.set_extent((self.length + n,))
        file_space = self.id.get_space()
        file_space.select_hyperslab((self.length,), (n,))
        self.id.write(h5s.create_simple((n,)), file_space, data)
        self.length += n


def attempt_path(path: Path, attempt: int) -> Path:
    """Where attempt `attempt`'s rank file is kept once a later attempt starts."""
    return path.with_name(f"{path.stem}.attempt-{attempt}{path.suffix}")


def carry_over(
    path: Path,
) -> tuple[PreviousAttempt, dict[str, np.ndarray], list[tuple[float, str, str]]] | None:
    """Move an earlier attempt's rank file aside and return what it recorded (None if there is none).

    A file that cannot be read (killed before its first flush) is still moved aside, and the new
    attempt starts with no earlier steps.
    """
    if not path.exists():
        return None
    from slurm_chaos.probe.reader import read_rank

    try:
        prev = read_rank(path)
    except DataError:
        prev = None
    attempts = int(prev.attrs.get("attempt", 0)) + 1 if prev else 1  # type: ignore[call-overload]
    kept = attempt_path(path, attempts - 1)
    path.rename(kept)
    if prev is None or len(prev.step) == 0:
        return PreviousAttempt(kept, -1, float("nan"), attempts), {}, []
    steps = _raw_steps(kept)
    last = int(prev.step[-1])
    end = float(prev.t_start[-1] + prev.step_time[-1])
    events = [(e.time, e.kind, e.detail) for e in prev.events]
    return PreviousAttempt(kept, last, end, attempts), steps, events


def _raw_steps(path: Path) -> dict[str, np.ndarray]:
    from slurm_chaos.probe.reader import open_probe_file

    with open_probe_file(path) as f:
        g = f["steps"]
        raw = {name: np.asarray(g[name][()]) for name in g}
    n = min(len(v) for v in raw.values()) if raw else 0
    return {k: v[:n] for k, v in raw.items()}
