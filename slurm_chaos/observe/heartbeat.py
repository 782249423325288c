"""Per-rank heartbeat files: the probe's latest step times, for the health check and the exporter.

Each rank atomically rewrites one small JSON file ``<directory>/<job_id>.<rank>.json`` at most about
once a second. The directory is node-local on a real cluster (only the node's own ranks are seen);
in the sandbox every node shares the host filesystem, so each file names its host and readers pick
the ranks of their node by that name.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ENV_DIR = "SLURM_CHAOS_HEARTBEAT_DIR"
DEFAULT_DIR = Path("/run/slurm-chaos/heartbeat")
# Steps averaged into one heartbeat. On the 4-node sandbox on 2 shared cores, healthy ranks' compute
# times over 10 steps were up to 1.37x apart (over 1.3x in 0.4% of windows); over 20 steps at most 1.2x.
WINDOW = 20
MIN_INTERVAL_S = 1.0
# A heartbeat older than this belongs to a rank that ended, hangs or is stopped.
STALE_AFTER_S = 20.0


def heartbeat_dir(directory: Path | str | None = None) -> Path:
    """`directory`, else $SLURM_CHAOS_HEARTBEAT_DIR, else the node-local default."""
    if directory:
        return Path(directory)
    return Path(os.environ.get(ENV_DIR) or DEFAULT_DIR)


def this_node() -> str:
    """The Slurm node name this process runs on: $SLURMD_NODENAME, else the short hostname."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


@dataclass(frozen=True)
class Beat:
    """One rank's latest heartbeat; times are means over the last `window` steps, in seconds."""

    job_id: str
    rank: int
    host: str
    time: float
    step: int
    window: int
    step_time: float
    compute_time: float
    comm_time: float
    checkpoint_failures: int = 0
    numa_mismatch: bool = False
    world_size: int = 0
    pid: int = 0
    mode: str = "train"

    def age(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.time

    def fresh(self, now: float | None = None, stale_after: float = STALE_AFTER_S) -> bool:
        return self.age(now) <= stale_after


class Heartbeat:
    """Writer for one rank; `update` is called every step and writes at most every `min_interval` s.

    It never raises into the training loop: a directory it cannot write turns it off with one warning.
    """

    def __init__(
        self,
        directory: Path | str | None,
        job_id: str,
        rank: int,
        host: str,
        world_size: int = 0,
        mode: str = "train",
        window: int = WINDOW,
        min_interval: float = MIN_INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = heartbeat_dir(directory)
        self.path = self.directory / f"{job_id}.{rank}.json"
        self.job_id, self.rank, self.host, self.world_size = str(job_id), rank, host, world_size
        self.mode = mode
        self.min_interval = min_interval
        self.clock = clock
        self._recent: deque[tuple[float, float, float]] = deque(maxlen=window)
        self._last_write = float("-inf")
        self.enabled = True

    def update(
        self,
        step: int,
        step_time: float,
        compute_time: float,
        comm_time: float,
        checkpoint_failures: int = 0,
        numa_mismatch: bool = False,
    ) -> bool:
        """Record one step; returns True when the file was rewritten."""
        self._recent.append((step_time, compute_time, comm_time))
        now = self.clock()
        if not self.enabled or now - self._last_write < self.min_interval:
            return False
        n = len(self._recent)
        beat = Beat(
            self.job_id,
            self.rank,
            self.host,
            now,
            step,
            n,
            sum(r[0] for r in self._recent) / n,
            sum(r[1] for r in self._recent) / n,
            sum(r[2] for r in self._recent) / n,
            checkpoint_failures,
            bool(numa_mismatch),
            self.world_size,
            os.getpid(),
            self.mode,
        )
        try:
            write_atomic(self.path, json.dumps(asdict(beat)))
        except OSError as exc:
            self.enabled = False
            log.warning("heartbeat off: cannot write %s: %s", self.path, exc)
            return False
        self._last_write = now
        return True

    def close(self) -> None:
        """Remove the file: a rank that finished is no longer watched."""
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary name and rename over `path`, so readers never see half a file."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # Jobs of every user write here, like /tmp; whoever created it may set that.
            os.chmod(path.parent, 0o1777)  # noqa: S103 - sticky, like /tmp
        except PermissionError:
            pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def parse_beat(text: str) -> Beat | None:
    """One heartbeat file's text, or None when it is not one (a foreign or older file)."""
    try:
        data = json.loads(text)
        return Beat(
            job_id=str(data["job_id"]),
            rank=int(data["rank"]),
            host=str(data["host"]),
            time=float(data["time"]),
            step=int(data["step"]),
            window=int(data["window"]),
            step_time=float(data["step_time"]),
            compute_time=float(data["compute_time"]),
            comm_time=float(data["comm_time"]),
            checkpoint_failures=int(data.get("checkpoint_failures", 0)),
            numa_mismatch=bool(data.get("numa_mismatch", False)),
            world_size=int(data.get("world_size", 0)),
            pid=int(data.get("pid", 0)),
            mode=str(data.get("mode", "train")),
        )
    except (ValueError, KeyError, TypeError):
        return None


def read_heartbeats(directory: Path | str | None = None, host: str | None = None) -> list[Beat]:
    """Every readable heartbeat in the directory (of `host` only, if given), by job and rank."""
    beats = []
    try:
        paths = list(heartbeat_dir(directory).glob("[!.]*.json"))
    except OSError:
        return []
    for path in paths:
        try:
            beat = parse_beat(path.read_text())
        except OSError:
            continue
        if beat is not None and (host is None or beat.host == host):
            beats.append(beat)
    return sorted(beats, key=lambda b: (b.job_id, b.rank))


def straggler_ratio(beat: Beat, peers: list[Beat]) -> float | None:
    """This rank's compute time over the median of its job's other ranks' (None without peers).

    Compute time, not step time: in a synchronous step every rank waits for the slowest, so only
    the time a rank spends on its own work tells who is slow.
    """
    others = sorted(p.compute_time for p in peers if p.job_id == beat.job_id and p.rank != beat.rank)
    if not others:
        return None
    mid = len(others) // 2
    median = others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2
    return beat.compute_time / median if median > 0 else None
