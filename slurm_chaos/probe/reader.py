"""Read the probe's per-rank HDF5 files back into arrays (see :mod:`slurm_chaos.probe.schema`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from slurm_chaos.errors import DataError
from slurm_chaos.probe.schema import (
    FAULT_FIELDS,
    META_ATTR,
    READABLE_VERSIONS,
    STEP_FIELDS,
    ProbeMode,
    rank_file_name,
)
from slurm_chaos.schedule import SwitchbackSchedule, schedule_from_json

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
_RANK_FILE = re.compile(r"^rank-(\d+)\.h5$")


@dataclass(frozen=True)
class Event:
    time: float
    kind: str
    detail: str


@dataclass(frozen=True)
class Selection:
    """Which of a rank file's datasets :func:`read_rank` reads (``steps/step`` and ``steps/t_start``
    always): an analysis names the few it needs, as over 1,000s of files each one read shows.
    ``fault``: a switchback run's ``steps/fault_state`` and ``steps/fault_epoch``, where present."""

    fields: tuple[str, ...] = STEP_FIELDS
    fault: bool = True
    events: bool = True
    telemetry: bool = True
    allreduce: bool = True


EVERYTHING = Selection()


@dataclass(frozen=True)
class RankData:
    """Everything one rank recorded."""

    path: Path
    rank: int
    world_size: int
    host: str
    job_id: str
    attrs: dict[str, object]
    step: npt.NDArray[np.int64]
    t_start: FloatArray
    fields: dict[str, FloatArray]
    events: tuple[Event, ...] = ()
    allreduce: dict[str, FloatArray] = field(default_factory=dict)
    telemetry: dict[str, FloatArray] = field(default_factory=dict)
    # A switchback run's per-step fault state (0/1/2) and acknowledged epoch; None where absent.
    fault_state: npt.NDArray[np.int8] | None = None
    fault_epoch: IntArray | None = None

    @property
    def step_time(self) -> FloatArray:
        return self.fields["step_time"]

    @property
    def comm_time(self) -> FloatArray:
        return self.fields["comm_time"]

    def allreduce_bytes(self) -> FloatArray | None:
        """Per step of an allreduce-mode run, the bytes its all_reduce carried (NaN for a step of a
        size whose row is missing: the run was killed in it); None for any other run (schema.py:
        ``allreduce_iterations``, or ``steps_planned`` in files from before it)."""
        sizes = self.allreduce.get("size_bytes")
        per_size = self.attrs.get("allreduce_iterations", self.attrs.get("steps_planned"))
        if self.attrs.get("mode") != ProbeMode.ALLREDUCE or sizes is None:
            return None
        if isinstance(per_size, bool) or not isinstance(per_size, int) or per_size <= 0:
            return None
        index = self.step // per_size
        known = index < len(sizes)
        out: FloatArray = np.full(len(self.step), np.nan)
        out[known] = sizes[index[known]]
        return out


@dataclass(frozen=True)
class RunData:
    """All ranks of one probe run, ordered by rank."""

    directory: Path
    ranks: tuple[RankData, ...]

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def matrix(self, name: str = "step_time") -> FloatArray:
        """ranks x steps array of one field, truncated to the shortest rank."""
        n = min(len(r.fields[name]) for r in self.ranks)
        return np.stack([r.fields[name][:n] for r in self.ranks])

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(r.host for r in self.ranks)

    def fault_schedule(self) -> SwitchbackSchedule | None:
        """The fault schedule the run followed (rank 0's ``fault_schedule``), None without one."""
        first = self.ranks[0]
        text = first.attrs.get("fault_schedule")
        if text is None:
            return None
        return schedule_from_json(str(text), source=f"{first.path}: fault_schedule")

    def observed_state(self) -> IntArray | None:
        """Per step, the highest ``fault_state`` over the ranks that recorded one (a step one node
        was unsure of does not count for the job), aligned with :meth:`matrix`'s columns; None
        where no rank recorded one."""
        states = [r.fault_state for r in self.ranks if r.fault_state is not None]
        if not states:
            return None
        n = min(len(r.step_time) for r in self.ranks)
        observed: IntArray = np.stack([s[:n] for s in states]).max(axis=0).astype(np.int64)
        return observed


def _attr(attrs: dict[str, object], key: str, path: Path) -> object:
    if key not in attrs:
        raise DataError(f"{path}: missing attribute {key!r}; not a slurm-chaos probe file")
    return attrs[key]


def read_attrs(f: Any) -> dict[str, object]:
    """The file's attributes: from the one JSON ``meta`` attribute where it holds exactly the others
    (schema 2), else one by one (schema 1, or a writer killed between the two)."""
    attrs = f.attrs
    if META_ATTR in attrs:
        try:
            meta = json.loads(attrs[META_ATTR])
        except (TypeError, ValueError):
            meta = None
        if isinstance(meta, dict) and len(meta) == len(attrs) - 1:
            return meta
    return {k: _decode(v) for k, v in attrs.items() if k != META_ATTR}


def _decode(value: object) -> object:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


def open_probe_file(path: Path) -> Any:
    """Open a rank file for reading, whether its writer closed it, still writes it or was killed.

    The writer uses HDF5's SWMR mode; a file whose writer is alive or died without closing it is
    flagged "open for write" and opens only as a SWMR reader, which sees everything up to the last
    flush.
    """
    import h5py

    try:
        return h5py.File(path, "r", locking=False)
    except OSError as plain:
        try:
            return h5py.File(path, "r", locking=False, swmr=True)
        except OSError:
            raise plain from None


def _read_array(f: Any, name: str, dtype: type = np.float64) -> npt.NDArray[Any]:
    """One 1-D dataset, read straight into a new array by HDF5 (converting its type): the
    high-level ``f[name][()]`` costs several times more per call, which adds up over 1,000s of ranks."""
    import h5py

    dataset = h5py.h5d.open(f.id, name.encode())
    out = np.empty(dataset.shape, dtype=dtype)
    if out.size:
        dataset.read(h5py.h5s.ALL, h5py.h5s.ALL, out)
    return out


def _paths(f: Any) -> set[str]:
    """The path of every group and dataset in the file, in one low-level walk (listing the groups
    through h5py's high-level API costs several times more)."""
    names: list[bytes] = []
    f.id.links.visit(names.append)
    return {name.decode() for name in names}


def read_rank(path: Path, selection: Selection = EVERYTHING) -> RankData:
    """Read one rank file (the datasets `selection` names); a truncated or foreign file raises
    :class:`DataError`. Of the step fields, rows up to the shortest of those read are kept."""
    if not path.exists():
        raise DataError(f"{path}: no such probe file")
    try:
        with open_probe_file(path) as f:
            attrs = read_attrs(f)
            version = _attr(attrs, "schema_version", path)
            if version not in READABLE_VERSIONS:
                raise DataError(f"{path}: schema_version {version}, this reader knows {READABLE_VERSIONS}")
            top = _paths(f)
            if "steps" not in top:
                raise DataError(f"{path}: no 'steps' group")
            members = {name.removeprefix("steps/") for name in top if name.startswith("steps/")}
            wanted = [name for name in STEP_FIELDS if name in members and name in selection.fields]
            fields = {name: _read_array(f, "steps/" + name) for name in wanted}
            if "step_time" not in fields:
                raise DataError(f"{path}: no dataset steps/step_time")
            fault = {
                name: _read_array(f, "steps/" + name, np.dtype(dtype).type)
                for name, dtype in FAULT_FIELDS.items()
                if selection.fault and name in members
            }
            n = min(len(v) for v in (*fields.values(), *fault.values()))
            fields = {k: v[:n] for k, v in fields.items()}
            fault = {k: v[:n] for k, v in fault.items()}
            step = _read_array(f, "steps/step", np.int64)[:n] if "step" in members else np.arange(n)
            t_start = _read_array(f, "steps/t_start")[:n] if "t_start" in members else np.full(n, np.nan)
            events = _read_events(f) if selection.events and "events" in top else ()
            allreduce = _read_group(f, "allreduce") if selection.allreduce and "allreduce" in top else {}
            telemetry = _read_group(f, "telemetry") if selection.telemetry and "telemetry" in top else {}
    except DataError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        raise DataError(f"{path}: unreadable probe file ({exc})") from exc
    return RankData(
        path=path,
        rank=int(_attr(attrs, "rank", path)),  # type: ignore[call-overload]
        world_size=int(_attr(attrs, "world_size", path)),  # type: ignore[call-overload]
        host=str(_attr(attrs, "host", path)),
        job_id=str(_attr(attrs, "job_id", path)),
        attrs=attrs,
        step=step,
        t_start=t_start,
        fields=fields,
        events=events,
        allreduce=allreduce,
        telemetry=telemetry,
        fault_state=fault.get("fault_state"),
        fault_epoch=fault.get("fault_epoch"),
    )


def _read_events(f: Any) -> tuple[Event, ...]:
    e = f["events"]
    return tuple(
        Event(float(t), str(_decode(k)), str(_decode(d)))
        for t, k, d in zip(e["time"][()], e["kind"][()], e["detail"][()], strict=False)
    )


def _read_group(f: Any, name: str) -> dict[str, FloatArray]:
    return {k: np.asarray(v[()], dtype=np.float64) for k, v in f[name].items()}


class MissingProbeFiles(DataError):
    """The run left no probe files at all: its job never ran or died before its first flush."""


def read_run(directory: Path, selection: Selection = EVERYTHING) -> RunData:
    """Read every `rank-<R>.h5` in `directory` (the datasets `selection` names); checks that ranks
    0..world_size-1 are all there."""
    if not directory.is_dir():
        raise MissingProbeFiles(f"{directory}: no such run directory")
    files = sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _RANK_FILE.match(p.name)))
    if not files:
        raise MissingProbeFiles(f"{directory}: no probe files (rank-<R>.h5)")
    ranks = tuple(read_rank(p, selection) for _, p in files)
    world = {r.world_size for r in ranks}
    if len(world) != 1:
        raise DataError(f"{directory}: ranks disagree on world_size: {sorted(world)}")
    (n,) = world
    have = [r.rank for r in ranks]
    if have != list(range(n)):
        missing = sorted(set(range(n)) - set(have))
        raise DataError(f"{directory}: world_size is {n} but rank files {missing} are missing")
    return RunData(directory=directory, ranks=ranks)


def last_step(directory: Path, rank: int = 0) -> int | None:
    """The last training step `rank` has flushed to its file in `directory`, read while the probe
    runs (SWMR); None before its first flush or while the file cannot be read (being created)."""
    import h5py

    try:
        with open_probe_file(directory / rank_file_name(rank)) as f:
            steps = f.get("steps/step")
            if not isinstance(steps, h5py.Dataset) or steps.shape[0] == 0:
                return None
            return int(steps[steps.shape[0] - 1])
    except (OSError, KeyError, ValueError):
        return None
