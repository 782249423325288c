"""Per-rank heartbeat files: the probe's latest step times, for the health check and the exporter.

Each rank atomically rewrites one small JSON file ``<directory>/<node>/<job_id>/<job_id>.<rank>.json``
at most about once a second. ``<directory>`` is node-local on a real cluster; in the sandbox every
node shares the host filesystem, hence the node level.

Only root writes ``<directory>`` and its node directories (mode 0755): the prolog
(``python -m slurm_chaos.probe.heartbeat prolog``) mounts the job's own directory there, a small
tmpfs of the job's user (:mod:`slurm_chaos.faults.jobfs`: 16 MiB, 4096 inodes by default), and
the epilog unmounts it. What a job writes there (a large file, a deep tree, millions of files) is
bounded by that tmpfs and goes with its unmount. Readers trust a file only as far as that layout
vouches for it: its owner is the job directory's (the job's user), its job is the directory's job,
its host is the directory's node, and its time is never later than the file's last change (ctime,
which no user can set). Every file is read on its own: one bad file is skipped, never fatal.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import socket
import stat
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurm_chaos.faults import jobfs
from slurm_chaos.faults.jobfs import JobStorage, Limits
from slurm_chaos.runner import Runner, SubprocessRunner

log = logging.getLogger(__name__)

ENV_DIR = "SLURM_CHAOS_HEARTBEAT_DIR"
DEFAULT_DIR = Path("/run/slurm-chaos/heartbeat")
# Steps averaged into one heartbeat: the last WINDOW_S seconds' steps, and never fewer than WINDOW.
# On the 4-node sandbox on 2 shared cores, healthy ranks' compute times over 10 steps were up to 1.37x
# apart (over 1.3x in 0.4% of windows); over 20 steps at most 1.2x on a quiet machine. During a
# campaign 20 steps (0.2 s at the sandbox's 10 ms steps) are one burst of the node's other work (a
# health check starting) wide: an A/A control's rank read 2.34x its peer's, and its node was drained.
# A window of seconds sees a lasting slowdown only, as a health check run every few seconds should.
WINDOW = 20
WINDOW_S = 3.0
# However fast the steps, a window keeps at most this many (memory; a 0.3 ms step fills it in 3 s).
MAX_WINDOW = 10_000
MIN_INTERVAL_S = 1.0
# A heartbeat older than this belongs to a rank that ended, hangs or is stopped.
STALE_AFTER_S = 20.0
#: Node and job names as directory names: no '/', never '.' or '..'.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
MAX_FILE_BYTES = 64 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def heartbeat_dir(directory: Path | str | None = None) -> Path:
    """`directory`, else $SLURM_CHAOS_HEARTBEAT_DIR, else the node-local default."""
    if directory:
        return Path(directory)
    return Path(os.environ.get(ENV_DIR) or DEFAULT_DIR)


def job_dir(directory: Path | str | None, node: str, job_id: str) -> Path:
    """The job's own heartbeat directory on `node`."""
    return heartbeat_dir(directory) / node / str(job_id)


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
    #: The GPU's NVML index (dcgm-exporter's ``gpu`` label); None where the rank has no GPU or
    #: the probe could not ask NVML (an older writer, or a CPU run).
    gpu: int | None = None

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
        gpu: int | None = None,
        window: int = WINDOW,
        min_interval: float = MIN_INTERVAL_S,
        clock: Callable[[], float] = time.time,
        window_s: float = WINDOW_S,
    ) -> None:
        self.directory = job_dir(directory, host, str(job_id))
        self.path = self.directory / f"{job_id}.{rank}.json"
        self.job_id, self.rank, self.host, self.world_size = str(job_id), rank, host, world_size
        self.mode, self.gpu = mode, gpu
        self.min_interval = min_interval
        self.clock = clock
        self.window, self.window_s = window, window_s
        # (time, step time, compute time, comm time) of the steps in the window, oldest first.
        self._recent: deque[tuple[float, float, float, float]] = deque(maxlen=max(window, MAX_WINDOW))
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
        now = self.clock()
        recent = self._recent
        recent.append((now, step_time, compute_time, comm_time))
        while len(recent) > self.window and now - recent[0][0] > self.window_s:
            recent.popleft()
        if not self.enabled or now - self._last_write < self.min_interval:
            return False
        n = len(recent)
        beat = Beat(
            self.job_id,
            self.rank,
            self.host,
            now,
            step,
            n,
            sum(r[1] for r in recent) / n,
            sum(r[2] for r in recent) / n,
            sum(r[3] for r in recent) / n,
            checkpoint_failures,
            bool(numa_mismatch),
            self.world_size,
            os.getpid(),
            self.mode,
            self.gpu,
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


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write to a fresh temporary file (O_EXCL|O_NOFOLLOW) and rename it over `path`: readers never
    see half a file, and no one can plant a link under the temporary name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            os.fchmod(fh.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parse_beat(text: str) -> Beat | None:
    """One heartbeat file's text, or None when it is not one (a foreign, older or malformed file)."""
    try:
        data = json.loads(text)
        beat = Beat(
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
            gpu=_gpu_index(data.get("gpu")),
        )
    except (ValueError, KeyError, TypeError, OverflowError, AttributeError):
        return None
    times = (beat.time, beat.step_time, beat.compute_time, beat.comm_time)
    return beat if all(math.isfinite(t) for t in times) else None


def _gpu_index(raw: object) -> int | None:
    """A heartbeat's ``gpu``: absent or null (no GPU known), else a non-negative integer."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ValueError(f"gpu: expected a GPU index, got {raw!r}")
    return raw


@dataclass(frozen=True)
class Scan:
    """What one read of the heartbeat directory found: the beats trusted, and what was skipped and why."""

    beats: tuple[Beat, ...] = ()
    rejected: tuple[str, ...] = field(default_factory=tuple)


def _private(st: os.stat_result) -> bool:
    """A directory no one but its owner may write in."""
    return stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o022


def _open_dir(name: str, dir_fd: int | None = None) -> tuple[int, os.stat_result]:
    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    return fd, os.fstat(fd)


def _read_beat(dir_fd: int, name: str, owner: int, node: str, job: str) -> Beat | str:
    """The beat in one file, or why it is not trusted."""
    m = re.fullmatch(rf"{re.escape(job)}\.(\d+)\.json", name)
    if not m:
        return "not a heartbeat file name of this job"
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
            return "not a small regular file"
        if st.st_uid != owner:
            return f"owned by uid {st.st_uid}, not by the job's user {owner}"
        text = os.read(fd, MAX_FILE_BYTES + 1).decode(errors="replace")
    finally:
        os.close(fd)
    beat = parse_beat(text)
    if beat is None:
        return "malformed"
    if (beat.job_id, beat.rank, beat.host) != (job, int(m.group(1)), node):
        return f"says job {beat.job_id} rank {beat.rank} on {beat.host}"
    # A time later than the file's last change is a lie; ctime no user can set.
    return Beat(**{**asdict(beat), "time": min(beat.time, st.st_ctime)})


def _scan_job(node_fd: int, node: str, job: str, beats: list[Beat], rejected: list[str]) -> None:
    fd, st = _open_dir(job, node_fd)
    try:
        if not _private(st):
            rejected.append(f"{node}/{job}: writable by others")
            return
        for name in sorted(os.listdir(fd)):
            if name.startswith("."):
                continue  # a writer's temporary file
            try:
                found = _read_beat(fd, name, st.st_uid, node, job)
            except OSError as exc:
                found = exc.strerror or str(exc)
            if isinstance(found, Beat):
                beats.append(found)
            else:
                rejected.append(f"{node}/{job}/{name}: {found}")
    finally:
        os.close(fd)


def scan_heartbeats(directory: Path | str | None = None) -> Scan:
    """Every trusted heartbeat under the directory (see the module docstring), and what was not."""
    beats: list[Beat] = []
    rejected: list[str] = []
    try:
        base_fd, base = _open_dir(str(heartbeat_dir(directory)))
    except FileNotFoundError:
        return Scan()
    except OSError as exc:  # a link or a file where the directory should be: say so, trust nothing
        return Scan((), (f"{heartbeat_dir(directory)}: {exc.strerror}",))
    try:
        if not _private(base):
            return Scan((), (f"{heartbeat_dir(directory)}: writable by others: no heartbeat trusted",))
        for node in sorted(os.listdir(base_fd)):
            if not NAME_RE.fullmatch(node):
                continue
            try:
                node_fd, st = _open_dir(node, base_fd)
            except OSError as exc:
                rejected.append(f"{node}: {exc.strerror}")
                continue
            try:
                if st.st_uid != base.st_uid or not _private(st):
                    rejected.append(f"{node}: not a directory of the heartbeat directory's owner alone")
                    continue
                for job in sorted(os.listdir(node_fd)):
                    if not NAME_RE.fullmatch(job):
                        continue
                    try:
                        _scan_job(node_fd, node, job, beats, rejected)
                    except OSError as exc:
                        rejected.append(f"{node}/{job}: {exc.strerror}")
            finally:
                os.close(node_fd)
    finally:
        os.close(base_fd)
    return Scan(tuple(sorted(beats, key=lambda b: (b.job_id, b.rank))), tuple(rejected))


def read_heartbeats(directory: Path | str | None = None, host: str | None = None) -> list[Beat]:
    """Every trusted heartbeat in the directory (of `host` only, if given), by job and rank."""
    return [b for b in scan_heartbeats(directory).beats if host is None or b.host == host]


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


# ---------------------------------------------------------------- the job's directory (prolog, epilog)


def _checked_dir(name: str, dir_fd: int | None, owner: int) -> int:
    """Open (making it if missing, mode 0755) a directory that must be `owner`'s alone."""
    try:
        os.mkdir(name, 0o755, dir_fd=dir_fd)
    except FileExistsError:
        pass
    fd, st = _open_dir(name, dir_fd)
    if st.st_uid != owner or not _private(st):
        os.close(fd)
        raise PermissionError(
            f"{name}: not a directory of uid {owner}'s alone (mode {st.st_mode & 0o7777:o})"
        )
    return fd


#: Seconds a hook spends at most emptying the node's trash, twice (its job's and the sweep's):
#: well within the hook's own timeout of 20 s.
TRASH_BUDGET_S = 5.0


def _job_storage(directory: Path | str, runner: Runner | None, limits: Limits | None) -> JobStorage:
    return JobStorage(Path(directory), runner or SubprocessRunner(), limits or Limits())


def make_job_dir(
    directory: Path | str,
    node: str,
    job_id: str,
    uid: int,
    gid: int,
    runner: Runner | None = None,
    limits: Limits | None = None,
) -> Path:
    """Make ``<directory>/<node>/<job_id>`` for the job's user (run as root by the prolog): a tmpfs
    of its own with `limits` (:mod:`slurm_chaos.faults.jobfs`), mounted with the user's uid and gid
    on a directory of root's made afresh. Nothing that existed is chowned; one left by an earlier
    run of the same job id (a requeue) is taken back first. A failed mount leaves no directory.
    """
    if not (NAME_RE.fullmatch(node) and NAME_RE.fullmatch(job_id)):
        raise ValueError(f"bad node or job name: {node!r}, {job_id!r}")
    storage = _job_storage(directory, runner, limits)
    root = os.geteuid()
    Path(directory).mkdir(mode=0o755, parents=True, exist_ok=True)
    base_fd = _checked_dir(str(directory), None, root)
    try:
        node_fd = _checked_dir(node, base_fd, root)
        trash_fd = jobfs.open_trash(node_fd)
        try:
            storage.take_back(node, job_id, node_fd, trash_fd)
            jobfs.empty_trash(trash_fd, TRASH_BUDGET_S)
            return storage.give(node_fd, node, job_id, uid, gid)
        finally:
            os.close(trash_fd)
            os.close(node_fd)
    finally:
        os.close(base_fd)


def remove_job_dir(directory: Path | str, node: str, job_id: str, runner: Runner | None = None) -> list[str]:
    """Take the job's heartbeat storage back (run as root by the epilog): unmount it, remove its
    directory, and empty the node's trash for at most TRASH_BUDGET_S (the rest is the next hook's).
    Returns what was done."""
    if not (NAME_RE.fullmatch(node) and NAME_RE.fullmatch(job_id)):
        raise ValueError(f"bad node or job name: {node!r}, {job_id!r}")
    storage = _job_storage(directory, runner, None)
    try:
        node_fd, st = _open_dir(str(Path(directory) / node))
    except FileNotFoundError:
        return []
    try:
        if st.st_uid != os.geteuid() or not _private(st):
            raise PermissionError(f"{Path(directory) / node}: not a directory of root's alone")
        trash_fd = jobfs.open_trash(node_fd)
        try:
            done = storage.take_back(node, job_id, node_fd, trash_fd)
            if not jobfs.empty_trash(trash_fd, TRASH_BUDGET_S):
                done.append(f"{Path(directory) / node / jobfs.TRASH}: not empty yet (left to the next hook)")
            return done
        finally:
            os.close(trash_fd)
    finally:
        os.close(node_fd)


def hook_main(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, runner: Runner | None = None
) -> int:
    """``python -m slurm_chaos.probe.heartbeat prolog|epilog --dir D``: always exits 0 (a hook's own
    failure must never drain the node); problems go to stderr with the 'slurm-chaos:' prefix."""
    p = argparse.ArgumentParser(prog="python -m slurm_chaos.probe.heartbeat")
    p.add_argument("kind", choices=["prolog", "epilog"])
    p.add_argument("--dir", type=Path, required=True, help="the heartbeat directory")
    p.add_argument("--size", type=int, default=Limits.size, help="bytes of a job's heartbeat tmpfs")
    p.add_argument("--inodes", type=int, default=Limits.inodes, help="files of a job's heartbeat tmpfs")
    args = p.parse_args(argv)
    environ = os.environ if env is None else env
    job, node = environ.get("SLURM_JOB_ID", ""), environ.get("SLURMD_NODENAME", "")
    try:
        if args.kind == "epilog":
            remove_job_dir(args.dir, node, job, runner)
        else:
            uid = int(environ["SLURM_JOB_UID"])
            gid = int(environ.get("SLURM_JOB_GID") or _primary_gid(uid))
            make_job_dir(args.dir, node, job, uid, gid, runner, Limits(args.size, args.inodes))
    except Exception as exc:  # never into slurmd: whatever the job left, the hook reports and ends
        print(
            f"slurm-chaos: heartbeat {args.kind}: job {job or '?'} on {node or '?'}: {exc}", file=sys.stderr
        )
    try:
        for line in sweep_node(args.dir, node, runner, environ):
            print(f"slurm-chaos: heartbeat {args.kind} sweep on {node}: {line}", file=sys.stderr)
    except Exception as exc:
        print(f"slurm-chaos: heartbeat {args.kind} sweep on {node or '?'}: {exc}", file=sys.stderr)
    return 0


def sweep_node(
    directory: Path | str, node: str, runner: Runner | None, env: Mapping[str, str], now: float | None = None
) -> list[str]:
    """Take back the heartbeat storage of jobs that no longer run on `node`, as Slurm's own step
    sockets in slurmd's spool directory say (``SlurmdSpoolDir`` of ``$SLURM_CONF``, only with
    ``PrologFlags=Contain``); a job the spool cannot tell about, or whose storage is recent, is
    kept. Empties the node's trash within TRASH_BUDGET_S."""
    if not NAME_RE.fullmatch(node):
        return []
    storage = _job_storage(directory, runner, None)
    conf = env.get("SLURM_CONF", "")
    slurm_conf = Path(conf) if conf.startswith("/") else None
    if not jobfs.contained(slurm_conf):
        return jobfs.sweep(storage, [node], lambda _job: None, TRASH_BUDGET_S)  # the trash only
    spool = jobfs.slurmd_spool(slurm_conf, node, socket.gethostname().split(".")[0])
    running = jobfs.job_running(
        storage, node, jobfs.steps_on_node(spool, node), time.time() if now is None else now
    )
    return jobfs.sweep(storage, [node], running, TRASH_BUDGET_S)


def _primary_gid(uid: int) -> int:
    import pwd

    return pwd.getpwuid(uid).pw_gid


if __name__ == "__main__":
    sys.exit(hook_main())
