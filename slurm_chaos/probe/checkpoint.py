"""Background checkpoints that may fail or hang without stopping training.

Every rank writes its own file ``ckpt-step<S>-rank<R>.pt`` (S = steps completed) in the job's
checkpoint directory: write to a hidden temporary name, fsync, rename, fsync the directory, then
delete its own files beyond the newest `keep`. The training thread only pays for copying the state
to host memory; the write runs in a thread. Outcomes come back through :meth:`Checkpointer.poll` as
events: ``checkpoint_saved``, ``checkpoint_failed`` (ENOSPC, EIO, EROFS...), ``checkpoint_hang``
(still writing after `timeout_s`) and ``checkpoint_skipped`` (an interval came while a write hung;
no second write is started behind a hung one).
"""

from __future__ import annotations

import errno
import io
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_chaos.clock import Clock, SystemClock

_CKPT_FILE = re.compile(r"^ckpt-step(\d+)-rank(\d+)\.pt$")

SaveFn = Callable[[Any], bytes]
Event = tuple[float, str, str]


def checkpoint_dir(root: Path, job_name: str, job_id: str) -> Path:
    """The directory of one job: a requeued job (same id) finds its checkpoints, a new job starts fresh."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job_name or "probe")
    return root / (f"{safe}-{job_id}" if job_id else safe)


def checkpoint_file(directory: Path, step: int, rank: int) -> Path:
    return directory / f"ckpt-step{step:08d}-rank{rank}.pt"


def complete_steps(directory: Path, rank: int) -> list[int]:
    """Steps for which `rank` has a complete (renamed) checkpoint, newest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    steps = [int(m.group(1)) for n in names if (m := _CKPT_FILE.match(n)) and int(m.group(2)) == rank]
    return sorted(steps, reverse=True)


def _torch_save(state: Any) -> bytes:
    # Serialise in memory first: a full disk then fails as ENOSPC from write(2), not as a
    # puzzling error from deep inside torch's zip writer.
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def cpu_copy(obj: Any) -> Any:
    """A deep copy of a state dict with every tensor copied to host memory."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_copy(v) for v in obj)
    return obj


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror} ({exc.filename or ''})"
    return f"{type(exc).__name__}: {exc}"


@dataclass
class _Write:
    step: int
    started: float
    hang_reported: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class Checkpointer:
    """Starts background writes and reports how they went."""

    def __init__(
        self,
        directory: Path,
        rank: int,
        *,
        keep: int = 2,
        timeout_s: float = 60.0,
        save: SaveFn = _torch_save,
        clock: Clock | None = None,
    ) -> None:
        self.clock: Clock = clock or SystemClock()  # a write's age (its hang) and how long it took
        self.directory = directory
        self.rank = rank
        self.keep = keep
        self.timeout_s = timeout_s
        self.save_fn = save
        self._busy: _Write | None = None
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self.failures = 0

    def busy(self) -> bool:
        return self._busy is not None and not self._busy.done.is_set()

    def start(self, step: int, snapshot: Callable[[], Any]) -> bool:
        """Write checkpoint `step`; False if the previous write still runs (then nothing is copied).

        `snapshot` returns a host copy of the state; it runs in the calling (training) thread, so the
        state cannot change under the background write.
        """
        self._check_hang()
        if self.busy():
            assert self._busy is not None
            self._report("checkpoint_skipped", f"step {step}: write of step {self._busy.step} still running")
            return False
        state = snapshot()
        write = _Write(step, self.clock.monotonic())
        self._busy = write
        threading.Thread(target=self._run, args=(write, state), daemon=True, name="probe-checkpoint").start()
        return True

    def poll(self) -> list[Event]:
        """Events since the last poll, plus a ``checkpoint_hang`` once a write outlives the timeout."""
        self._check_hang()
        with self._lock:
            events, self._events = self._events, []
        return events

    def _check_hang(self) -> None:
        w = self._busy
        if w is not None and not w.done.is_set() and not w.hang_reported:
            age = self.clock.monotonic() - w.started
            if age > self.timeout_s:
                w.hang_reported = True
                self._report(
                    "checkpoint_hang",
                    f"step {w.step}: still writing after {age:.1f} s (timeout {self.timeout_s:g} s)",
                )

    def wait(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the running write; True if none is left running."""
        w = self._busy
        return w is None or w.done.wait(timeout_s)

    def _report(self, kind: str, detail: str) -> None:
        if kind in ("checkpoint_failed", "checkpoint_hang"):
            self.failures += 1
        with self._lock:
            self._events.append((time.time(), kind, detail))

    def _run(self, write: _Write, state: Any) -> None:
        t0 = self.clock.monotonic()
        try:
            path = self._write(write.step, state)
            self._prune()
        except Exception as exc:  # any failure of the storage is data, not a reason to stop training
            self._report("checkpoint_failed", f"step {write.step}: {_describe(exc)}")
        else:
            late = " (after a hang)" if write.hang_reported else ""
            self._report(
                "checkpoint_saved",
                f"step {write.step}: {path.name} in {self.clock.monotonic() - t0:.3f} s{late}",
            )
        finally:
            write.done.set()

    def _write(self, step: int, state: Any) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        final = checkpoint_file(self.directory, step, self.rank)
        tmp = self.directory / f".{final.name}.tmp-{os.getpid()}"
        try:
            data = self.save_fn(state)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(self.directory)
        return final

    def _prune(self) -> None:
        for step in complete_steps(self.directory, self.rank)[self.keep :]:
            checkpoint_file(self.directory, step, self.rank).unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(directory: Path, step: int, rank: int) -> Any:
    """Load one rank's checkpoint (host tensors)."""
    import torch

    return torch.load(checkpoint_file(directory, step, rank), map_location="cpu", weights_only=True)
