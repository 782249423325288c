"""CPU-side faults: a slow rank, a known-slow node, a noisy neighbour.

A slow rank is a real slow device: its task processes lose a set share of their time, either by
a SIGSTOP/SIGCONT duty cycle driven by the agent (works everywhere, any cgroup setup) or by a
CPU quota on a cgroup of their own (smoother, needs a writable cpu controller). Tasks are found
through ``/proc/*/environ`` (SLURM_JOB_ID, SLURM_PROCID) as they appear, so a rank that starts
after the prolog, or forks, is caught too. Each process is journalled before it is touched, so an
undo continues it (or moves it back) even if the agent died mid-cycle.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults import node_proc
from slurm_chaos.faults.journal import Json, Undo, UndoContext, UndoFailed, undo_action
from slurm_chaos.faults.node_base import MARKER_ENV, Controller, JobContext, applies, log, num, text
from slurm_chaos.faults.node_proc import ProcId
from slurm_chaos.faults.spec import FaultRequest

#: Finds the task processes to slow: (job id, rank or None for all ranks here) -> processes.
TaskFinder = Callable[[str, "int | None"], list[ProcId]]

DUTY_PERIOD_S = 0.1
SCAN_EVERY_S = 1.0


def _find_tasks(job_id: str, rank: int | None) -> list[ProcId]:
    return node_proc.job_tasks(job_id, rank)


@dataclass
class DutyCycle:
    """Stops the chosen tasks for `percent` of every period and continues them for the rest."""

    name: str
    ctx: JobContext
    rank: int | None
    percent: float
    find: TaskFinder = _find_tasks
    period: float = DUTY_PERIOD_S
    procs: dict[int, ProcId] = field(default_factory=dict)
    stopped: bool = False
    next_switch: float = 0.0
    next_scan: float = 0.0

    def _scan(self, now: float) -> None:
        self.next_scan = now + SCAN_EVERY_S
        for p in self.find(self.ctx.job_id, self.rank):
            if p.pid in self.procs:
                continue
            # Journalled before the first SIGSTOP: an undo continues it whatever happens to us.
            which = "all ranks" if self.rank is None else f"rank {self.rank}"
            self.ctx.journal.record(
                self.name,
                f"duty cycle {self.percent:g}% on pid {p.pid} ({which})",
                Undo(action="signal_process", data={"pid": p.pid, "start": p.start, "signal": "SIGCONT"}),
                self.ctx.deadline,
            )
            self.procs[p.pid] = p
            log.info(
                "%s: throttling pid %d of job %s by %g%%", self.name, p.pid, self.ctx.job_id, self.percent
            )
        for pid in [pid for pid, p in self.procs.items() if not node_proc.is_alive(p)]:
            del self.procs[pid]

    def _signal_all(self, sig: int) -> None:
        for p in list(self.procs.values()):
            node_proc.send(p, sig)

    def tick(self, now: float) -> float:
        if now >= self.next_scan:
            self._scan(now)
        if not self.procs:
            return self.next_scan
        if now >= self.next_switch:
            share = self.percent / 100.0
            if self.stopped:
                self._signal_all(signal.SIGCONT)
                self.next_switch = now + (1.0 - share) * self.period
            else:
                self._signal_all(signal.SIGSTOP)
                self.next_switch = now + share * self.period
            self.stopped = not self.stopped
        return min(self.next_switch, self.next_scan)

    def stop(self) -> None:
        self._signal_all(signal.SIGCONT)
        self.stopped = False


# ----------------------------------------------------------------------------------- cgroups


@dataclass(frozen=True)
class CpuCgroups:
    """The cpu controller's hierarchy: v1 (``/sys/fs/cgroup/cpu``) or v2 (unified)."""

    root: Path
    v2: bool

    @classmethod
    def detect(cls, base: Path = Path("/sys/fs/cgroup")) -> CpuCgroups:
        controllers = base / "cgroup.controllers"
        if controllers.exists():
            if "cpu" not in (base / "cgroup.subtree_control").read_text().split():
                raise ChaosError(
                    f"slow-rank method=cgroup: cpu controller not enabled in {base}/cgroup.subtree_control"
                )
            return cls(base, True)
        if (base / "cpu" / "cpu.cfs_quota_us").exists():
            return cls(base / "cpu", False)
        raise ChaosError(
            "slow-rank method=cgroup: no cgroup cpu controller on this node (use method=duty-cycle)"
        )

    def current(self, pid: int) -> Path | None:
        """The cpu cgroup directory `pid` is in."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if (self.v2 and controllers == "") or (not self.v2 and "cpu" in controllers.split(",")):
                return self.root / path.lstrip("/")
        return None

    def set_quota(self, group: Path, share: float, cpus: int = 1, period_us: int = 100_000) -> None:
        """Limit the group to `share` of `cpus` CPUs (an absolute cap: binding on a dedicated node)."""
        quota = max(1000, int(period_us * share * cpus))
        if self.v2:
            (group / "cpu.max").write_text(f"{quota} {period_us}\n")
        else:
            (group / "cpu.cfs_period_us").write_text(f"{period_us}\n")
            (group / "cpu.cfs_quota_us").write_text(f"{quota}\n")


@dataclass
class CgroupQuota:
    """Moves the chosen tasks into a cgroup of their own capped at (100 - percent)% of their CPUs.

    The cap is absolute: on a dedicated node (the normal case for a training job) the rank loses
    `percent` of its time; on an oversubscribed node it loses less, as its fair share was already
    below the cap. The duty cycle is relative to whatever the rank gets, so it slows it either way.
    """

    name: str
    ctx: JobContext
    rank: int | None
    percent: float
    cgroups: CpuCgroups
    find: TaskFinder = _find_tasks
    moved: dict[int, ProcId] = field(default_factory=dict)
    group: Path | None = None
    next_scan: float = 0.0

    def _ensure_group(self, first: ProcId) -> Path:
        if self.group is None:
            group = self.cgroups.root / f"slurm-chaos-{self.ctx.job_id}-{self.name}"
            self.ctx.journal.record(
                self.name,
                f"mkdir cgroup {group}",
                Undo(action="cgroup_remove", data={"path": str(group)}),
                self.ctx.deadline,
            )
            group.mkdir(exist_ok=True)
            # A rank may use several CPUs (threads): scale the cap by the CPUs it may run on.
            try:
                cpus = len(os.sched_getaffinity(first.pid))
            except OSError:
                cpus = 1
            self.cgroups.set_quota(group, 1.0 - self.percent / 100.0, cpus)
            self.group = group
        return self.group

    def tick(self, now: float) -> float:
        if now < self.next_scan:
            return self.next_scan
        self.next_scan = now + SCAN_EVERY_S
        for p in self.find(self.ctx.job_id, self.rank):
            if p.pid in self.moved:
                continue
            group = self._ensure_group(p)
            origin = self.cgroups.current(p.pid)
            if origin is None or origin == group:
                continue
            self.ctx.journal.record(
                self.name,
                f"move pid {p.pid} into {group}",
                Undo(
                    action="cgroup_move",
                    data={"pid": p.pid, "start": p.start, "to": str(origin), "from": str(group)},
                ),
                self.ctx.deadline,
            )
            (group / "cgroup.procs").write_text(f"{p.pid}\n")
            self.moved[p.pid] = p
            log.info(
                "%s: pid %d of job %s limited to %g%% of a CPU",
                self.name,
                p.pid,
                self.ctx.job_id,
                100 - self.percent,
            )
        return self.next_scan

    def stop(self) -> None:
        """Nothing: the journal's undo moves the tasks back and removes the group."""


@undo_action("cgroup_move")
def _cgroup_move(data: Mapping[str, Json], ctx: UndoContext) -> str:
    p = ProcId(int(str(data["pid"])), int(str(data["start"])))
    if not node_proc.is_alive(p):
        return f"pid {p.pid} gone"
    try:
        (Path(str(data["to"])) / "cgroup.procs").write_text(f"{p.pid}\n")
    except OSError as exc:
        raise UndoFailed(f"move pid {p.pid} back to {data['to']}: {exc}") from exc
    return f"pid {p.pid} back in {data['to']}"


@undo_action("cgroup_remove")
def _cgroup_remove(data: Mapping[str, Json], ctx: UndoContext) -> str:
    group = Path(str(data["path"]))
    if not group.exists():
        return f"{group} gone"
    # Children forked after the move are in the group too: hand them to the parent first.
    leftovers = (group / "cgroup.procs").read_text().split()
    for pid in leftovers:
        try:
            (group.parent / "cgroup.procs").write_text(f"{pid}\n")
        except OSError:
            continue
    for _ in range(20):
        try:
            group.rmdir()
            return f"rmdir {group}" + (
                f" ({len(leftovers)} processes moved to its parent)" if leftovers else ""
            )
        except OSError as exc:
            last = exc
            time.sleep(0.05)
    raise UndoFailed(f"rmdir {group}: {last}")


@undo_action("signal_process")
def _signal_process(data: Mapping[str, Json], ctx: UndoContext) -> str:
    p = ProcId(int(str(data["pid"])), int(str(data["start"])))
    sig = signal.Signals[str(data["signal"])]
    if node_proc.send(p, sig):
        return f"{sig.name} to pid {p.pid}"
    return f"pid {p.pid} gone"


# ----------------------------------------------------------------------------------- faults


def _throttle(name: str, ctx: JobContext, rank: int | None, percent: float, method: str) -> Controller:
    if method == "cgroup":
        return CgroupQuota(name, ctx, rank, percent, CpuCgroups.detect())
    return DutyCycle(name, ctx, rank, percent)


@applies("slow-rank")
def apply_slow_rank(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    return [_throttle(req.name, ctx, int(num(req, "rank")), num(req, "percent"), text(req, "method"))]


@applies("slow-node")
def apply_slow_node(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    index = int(num(req, "node"))
    if not ctx.nodes:
        raise ChaosError("slow-node: the job's node list is unknown (SLURM_JOB_NODELIST unset)")
    if index >= len(ctx.nodes):
        raise ChaosError(f"slow-node: node={index} but the job has only {len(ctx.nodes)} nodes")
    if ctx.nodes[index] != ctx.node:
        return []
    return [DutyCycle(req.name, ctx, None, num(req, "percent"))]


def stress_argv(load: str, cpus: int, seconds: int) -> list[str]:
    """stress-ng command line for one noisy-neighbour load (0 CPUs = one worker per online CPU)."""
    stressor = {
        "cpu": ["--cpu", str(cpus)],
        "cache": ["--cache", str(cpus)],
        "matmul": ["--matrix", str(cpus)],
    }
    workers = stressor.get(load, ["--vm", str(cpus), "--vm-bytes", "10%"])
    return ["stress-ng", *workers, "--timeout", f"{max(1, seconds)}s", "--quiet"]


def _gpu_count(ctx: JobContext) -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    res = ctx.runner(["nvidia-smi", "-L"], timeout=10)
    return sum(1 for line in res.stdout.splitlines() if line.startswith("GPU ")) if res.ok else 0


@applies("noisy-neighbour")
def apply_noisy_neighbour(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    load, cpus = text(req, "load"), int(num(req, "cpus"))
    seconds = int(ctx.deadline - time.time())
    if load == "matmul" and _gpu_count(ctx) > 0:
        import sys

        argv = [sys.executable, "-m", "slurm_chaos.faults.node_gpu", "burn", "--seconds", str(seconds)]
    else:
        if load == "matmul":
            log.warning(
                "noisy-neighbour: no GPU on %s: the matmul load runs on the CPUs (stress-ng --matrix)",
                ctx.node,
            )
        if shutil.which("stress-ng") is None:
            raise ChaosError("noisy-neighbour: stress-ng is not installed on this node")
        argv = stress_argv(load, cpus, seconds)
    marker = ctx.marker(req.name)
    ctx.journal.record(
        req.name, " ".join(argv), Undo(action="kill_marked", data={"marker": marker}), ctx.deadline
    )
    pid = ctx.spawner(argv, {MARKER_ENV: marker}, ctx.log_file)
    log.info("noisy-neighbour: started %s (pid %d)", " ".join(argv), pid)
    return []


def marked(marker: str) -> list[ProcId]:
    """Every live process started with MARKER_ENV=marker (and whatever it forked)."""
    out = []
    for pid in node_proc.pids():
        if node_proc.environ(pid).get(MARKER_ENV) == marker:
            p = node_proc.proc_id(pid)
            if p is not None:
                out.append(p)
    return out


@undo_action("kill_marked")
def _kill_marked(data: Mapping[str, Json], ctx: UndoContext) -> str:
    marker = str(data["marker"])
    procs = marked(marker)
    for p in procs:
        node_proc.send(p, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(node_proc.is_alive(p) for p in procs):
        time.sleep(0.05)
    killed = [p for p in procs if node_proc.send(p, signal.SIGKILL)]
    time.sleep(0.05 if killed else 0)
    left = [p.pid for p in procs if node_proc.is_alive(p)]
    if left:
        raise UndoFailed(f"processes {left} marked {marker} survived SIGKILL")
    return f"stopped {len(procs)} processes marked {marker}" + (
        f" ({len(killed)} with SIGKILL)" if killed else ""
    )
