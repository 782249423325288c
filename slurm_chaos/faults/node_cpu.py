"""CPU-side faults: a slow rank, a known-slow node, a noisy neighbour.

A slow rank is a real slow device: its task processes lose a set share of their time, either by
a SIGSTOP/SIGCONT duty cycle driven by the agent (works everywhere, any cgroup setup) or by a
CPU quota on a cgroup of their own (smoother, needs a writable cpu controller). Tasks are the
processes in the cgroups of the job's steps, found through the job's own slurmstepd
(``node_proc.job_tasks``) as they appear, so a rank that starts after the prolog, or forks, is
caught too; a title or an environment, which the job's user sets, never makes a task. Each
process is journalled before it is touched, so an undo continues it (or moves it back) even if
the agent died mid-cycle.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults import cgroupfs, node_gpu, node_proc
from slurm_chaos.faults.cgroupfs import Cgroupfs, ProcessGone
from slurm_chaos.faults.choices import Load, SlowMethod
from slurm_chaos.faults.journal import JournalClosed, Json, Undo, UndoContext, UndoFailed, undo_action
from slurm_chaos.faults.node_base import (
    MARKER_ENV,
    Controller,
    JobContext,
    applies,
    choice,
    log,
    num,
    switchback,
)
from slurm_chaos.faults.node_proc import ProcId
from slurm_chaos.faults.spec import FaultRequest

#: Finds the task processes to slow: (job id, rank or None for all ranks here) -> processes.
TaskFinder = Callable[[str, "int | None"], list[ProcId]]

#: Shorter than a probe step (15-40 ms on CPU nodes), so every step loses its share: with 100 ms
#: a stop fell into only some steps and the median step moved by the share of steps it hit
#: (+6% to +221% measured for the same 60%), not by the slowdown.
DUTY_PERIOD_S = 0.02
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
    #: False while a switchback job has the fault off: tasks are found and journalled, not stopped.
    active: bool = True

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
        if not self.procs or not self.active:
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

    def switch(self, on: bool, now: float) -> None:
        if not on:
            self.stop()
        self.active = on
        self.next_switch = now


# ----------------------------------------------------------------------------------- cgroups


class Refused(ChaosError):
    """The fault cannot stay inside the job's cgroup on this node: it is not applied at all."""


def _quota(share: float, cpus: int, period_us: int = 100_000) -> int:
    return max(1000, int(period_us * share * cpus))


def _cpus_of(pid: int) -> int:
    try:
        return len(os.sched_getaffinity(pid))
    except OSError as exc:
        if cgroupfs.gone(exc):
            raise ProcessGone(f"pid {pid} exited") from exc
        return 1


@dataclass
class CgroupQuota:
    """Caps the chosen tasks at (100 - percent)% of their CPUs by a cgroup inside the job's own.

    On cgroup v1, where Slurm does not manage the cpu controller, the tasks are moved (in the cpu
    hierarchy only: their memory, cpuset, freezer and device cgroups stay Slurm's) into
    ``<job's cgroup>/slurm-chaos-<fault>``: the job's path as Slurm gives it in the hierarchies it
    manages, made in the cpu hierarchy for this and removed afterwards. On v2 a task stays where
    Slurm put it and its own leaf (``.../job_J/step_S/user/task_T``) gets a ``cpu.max``; a leaf
    that other ranks share is refused, as is a task in no cgroup of the job (never the
    hierarchy's root). Every step is journalled before it is made and reverted on undo.

    The cap is absolute: on a dedicated node (the normal case for a training job) the rank loses
    `percent` of its time; on an oversubscribed node it loses less, as its fair share was already
    below the cap. The duty cycle is relative to whatever the rank gets, so it slows it either way.
    """

    name: str
    ctx: JobContext
    rank: int | None
    percent: float
    fs: Cgroupfs = field(default_factory=Cgroupfs)
    find: TaskFinder = _find_tasks
    moved: dict[int, ProcId] = field(default_factory=dict)
    group: Path | None = None
    capped: set[Path] = field(default_factory=set)
    refused: str = ""
    next_scan: float = 0.0
    #: False while a switchback job has the fault off: the cgroups are made, the cap is lifted.
    active: bool = True
    #: What was capped and with how many CPUs, to lift and restore the cap when switched.
    limits: dict[Path, int] = field(default_factory=dict)

    @property
    def share(self) -> float:
        return 1.0 - self.percent / 100.0

    def _limit(self, path: Path, cpus: int) -> None:
        """Write the cap (or, while off, no cap) to a cpu.max (v2) or cpu.cfs_quota_us (v1)."""
        self.limits[path] = cpus
        if path.name == "cpu.max":
            _write(path, f"{_quota(self.share, cpus)} 100000" if self.active else "max 100000")
        else:
            path.write_text(f"{_quota(self.share, cpus)}\n" if self.active else "-1\n")

    def switch(self, on: bool, now: float) -> None:
        self.active = on
        for path, cpus in self.limits.items():
            self._limit(path, cpus)

    def tick(self, now: float) -> float:
        if self.refused:
            return float("inf")
        if now < self.next_scan:
            return self.next_scan
        self.next_scan = now + SCAN_EVERY_S
        for p in self.find(self.ctx.job_id, self.rank):
            if p.pid in self.moved:
                continue
            try:
                self._throttle(p)
            except JournalClosed:
                raise
            except ProcessGone as exc:
                log.info("%s: %s: skipped", self.name, exc)
            except Refused as exc:
                self.refused = str(exc)
                log.error(
                    "%s: not applied on %s for job %s: %s", self.name, self.ctx.node, self.ctx.job_id, exc
                )
                return float("inf")
            except (ChaosError, OSError) as exc:
                log.error("%s: pid %d of job %s not throttled: %s", self.name, p.pid, self.ctx.job_id, exc)
            # Tried once: a task that could not be moved is not retried every second.
            self.moved[p.pid] = p
        return self.next_scan

    def stop(self) -> None:
        """Nothing: the journal's undo moves the tasks back and removes what was made."""

    def _job_cgroups(self) -> dict[str, str]:
        """The job's cgroups as Slurm made them, from its slurmstepd (never from the task's path)."""
        return self.fs.mounted(node_proc.job_cgroups(self.ctx.job_id, self.fs.proc))

    def _record(self, what: str, action: str, **data: Json) -> None:
        self.ctx.journal.record(self.name, what, Undo(action=action, data=data), self.ctx.deadline)

    def _throttle(self, p: ProcId) -> None:
        if self.fs.v2:
            self._cap_leaf(p)
        else:
            self._move_v1(p)

    # -- cgroup v1: a group of ours under the job's path in the cpu hierarchy
    def _move_v1(self, p: ProcId) -> None:
        hier = self.fs.cpu_hierarchy()
        cgs = self.fs.of(p.pid)
        jobs = self._job_cgroups()
        if not jobs:
            raise Refused(
                f"job {self.ctx.job_id} has no cgroup here (Slurm's proctrack/cgroup or task/cgroup make "
                "one); the throttle would leave the job's cgroup: use method=duty-cycle"
            )
        if not cgroupfs.inside(cgs, jobs):
            raise Refused(f"pid {p.pid} is outside job {self.ctx.job_id}'s cgroups {jobs}")
        origin = self.fs.dir(hier, cgs.get(hier, "/"))
        group = self._ensure_group_v1(hier, jobs, origin, p)
        if origin == group:
            return
        self._record(
            f"move pid {p.pid} into {group}",
            "cgroup_move",
            pid=p.pid,
            start=p.start,
            to=str(origin),
            **{"from": str(group)},
        )
        self.fs.move(p.pid, group)
        self.moved[p.pid] = p
        log.info(
            "%s: pid %d of job %s limited to %g%% of its CPUs in %s",
            self.name,
            p.pid,
            self.ctx.job_id,
            100 - self.percent,
            group,
        )

    def _ensure_group_v1(self, hier: str, jobs: dict[str, str], origin: Path, first: ProcId) -> Path:
        if self.group is not None:
            return self.group
        managed = hier in jobs
        # Slurm's own job cgroup in this hierarchy, or the path it gave the job in the others.
        path = jobs[hier] if managed else jobs.get("freezer", sorted(jobs.values())[0])
        mount = self.fs.dir(hier, "/")
        job_dir = self.fs.dir(hier, path)
        cpus = _cpus_of(first.pid)
        # Made for this fault where Slurm made nothing (removed when empty); Slurm's own job cgroup
        # only if it is left empty after the job, which this group would otherwise have kept.
        levels = len(job_dir.relative_to(mount).parts) if not managed else 1
        self._record(f"cgroup {job_dir} (the job's)", "cgroup_prune", path=str(job_dir), levels=levels)
        if not managed:
            job_dir.mkdir(parents=True, exist_ok=True)
        group = job_dir / f"slurm-chaos-{self.name}"
        self._record(f"mkdir cgroup {group}", "cgroup_remove", path=str(group), home=str(origin))
        group.mkdir(exist_ok=True)
        if "cpuset" in hier.split(","):
            cgroupfs.copy_cpuset(group)
        # A rank may use several CPUs (threads): the cap scales with the CPUs it may run on.
        (group / "cpu.cfs_period_us").write_text("100000\n")
        self._limit(group / "cpu.cfs_quota_us", cpus)
        self.group = group
        return group

    # -- cgroup v2: cpu.max on the task's own leaf, inside the job's subtree
    def _cap_leaf(self, p: ProcId) -> None:
        leaf_path = self.fs.of(p.pid).get(cgroupfs.UNIFIED, "")
        job = self._job_cgroups().get(cgroupfs.UNIFIED)
        if job is None or not cgroupfs.inside({cgroupfs.UNIFIED: leaf_path}, {cgroupfs.UNIFIED: job}):
            raise Refused(
                f"pid {p.pid} is in {leaf_path or 'no cgroup'}, not in job {self.ctx.job_id}'s cgroup; "
                "the throttle would leave the job: use method=duty-cycle"
            )
        leaf = self.fs.dir(cgroupfs.UNIFIED, leaf_path)
        if leaf in self.capped:
            self.moved[p.pid] = p
            return
        rank = {q.pid for q in self.find(self.ctx.job_id, self.rank)} | {p.pid}
        others = sorted(set(self.fs.procs(leaf)) - rank)
        if others:
            raise Refused(
                f"{leaf} also holds processes {others[:5]} that are not the rank's: a cap there would slow "
                "them too (TaskPlugin=task/cgroup gives each task its own cgroup), or use method=duty-cycle"
            )
        job_dir = self.fs.dir(cgroupfs.UNIFIED, job)
        if "cpu" not in (job_dir / "cgroup.controllers").read_text().split():
            raise Refused(f"the cpu controller is not delegated to job {self.ctx.job_id}'s cgroup {job_dir}")
        cpus = _cpus_of(p.pid)
        below = leaf.relative_to(job_dir).parts
        if not below:
            raise Refused(f"pid {p.pid} is in job {self.ctx.job_id}'s cgroup itself, not a leaf of it")
        # The leaf gets cpu.max once every level from the job's cgroup down enables cpu for its
        # children; those levels hold no process (the no-internal-process rule), Slurm's leaves do.
        chain = [job_dir]
        for part in below[:-1]:
            chain.append(chain[-1] / part)
        for d in chain:
            if "cpu" not in (d / "cgroup.subtree_control").read_text().split():
                self._record(f"enable cpu in {d}", "cgroup_subtree", path=str(d), controller="cpu")
                _write(d / "cgroup.subtree_control", "+cpu")
        old = (leaf / "cpu.max").read_text().strip()
        self._record(f"cpu.max of {leaf}", "cgroup_write", path=str(leaf / "cpu.max"), value=old)
        self._limit(leaf / "cpu.max", cpus)
        self.capped.add(leaf)
        self.moved[p.pid] = p
        log.info(
            "%s: pid %d of job %s limited to %g%% of its CPUs (cpu.max of %s)",
            self.name,
            p.pid,
            self.ctx.job_id,
            100 - self.percent,
            leaf,
        )


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(f"{value}\n")
    except OSError as exc:
        raise ChaosError(f"write {value!r} to {path}: {exc.strerror or exc}") from exc


@undo_action("cgroup_move")
def _cgroup_move(data: Mapping[str, Json], ctx: UndoContext) -> str:
    p = ProcId(int(str(data["pid"])), int(str(data["start"])))
    if not node_proc.is_alive(p):
        return f"pid {p.pid} gone"
    try:
        (ctx.path(str(data["to"])) / "cgroup.procs").write_text(f"{p.pid}\n")
    except OSError as exc:
        if cgroupfs.gone(exc):
            return f"pid {p.pid} gone"
        raise UndoFailed(f"move pid {p.pid} back to {data['to']}: {exc}") from exc
    return f"pid {p.pid} back in {data['to']}"


def _rmdir(group: Path) -> OSError | None:
    for _ in range(20):
        try:
            cgroupfs.rmdir(group)
            return None
        except FileNotFoundError:
            return None
        except OSError as exc:
            last = exc
            time.sleep(0.05)
    return last


@undo_action("cgroup_remove")
def _cgroup_remove(data: Mapping[str, Json], ctx: UndoContext) -> str:
    group = ctx.path(str(data["path"]))
    if not group.exists():
        return f"{data['path']} gone"
    home = ctx.path(str(data["home"])) if data.get("home") else group.parent
    # Children forked after the move are in the group too: hand them back first.
    try:
        leftovers = (group / "cgroup.procs").read_text().split()
    except OSError:
        leftovers = []
    for pid in leftovers:
        with contextlib.suppress(OSError):
            (home / "cgroup.procs").write_text(f"{pid}\n")
    err = _rmdir(group)
    if err is not None:
        raise UndoFailed(f"rmdir {data['path']}: {err}")
    return f"rmdir {data['path']}" + (f" ({len(leftovers)} processes moved to {home})" if leftovers else "")


@undo_action("cgroup_prune")
def _cgroup_prune(data: Mapping[str, Json], ctx: UndoContext) -> str:
    """Remove the job's cgroup and the levels above it made for it, each only once it is empty:
    a level another job's fault still uses (or Slurm's job cgroup, while the job runs) stays."""
    d = ctx.path(str(data["path"]))
    removed = []
    for _ in range(int(str(data.get("levels", 1)))):
        if d.exists():
            try:
                cgroupfs.rmdir(d)
            except OSError as exc:
                if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
                    break
                raise UndoFailed(f"rmdir {d}: {exc}") from exc
            removed.append(d.name)
        d = d.parent
    return (
        f"rmdir {'/'.join(reversed(removed))} (empty)" if removed else f"{data['path']} kept (in use) or gone"
    )


@undo_action("cgroup_subtree")
def _cgroup_subtree(data: Mapping[str, Json], ctx: UndoContext) -> str:
    d = ctx.path(str(data["path"]))
    controller = str(data["controller"])
    if not d.exists():
        return f"{data['path']} gone"
    try:
        (d / "cgroup.subtree_control").write_text(f"-{controller}\n")
    except OSError as exc:
        raise UndoFailed(f"disable {controller} in {data['path']}: {exc}") from exc
    return f"{controller} disabled again in {data['path']}"


@undo_action("cgroup_write")
def _cgroup_write(data: Mapping[str, Json], ctx: UndoContext) -> str:
    f = ctx.path(str(data["path"]))
    if not f.parent.exists():
        return f"{f.parent} gone"
    try:
        f.write_text(f"{data['value']}\n")
    except OSError as exc:
        if cgroupfs.gone(exc):
            return f"{f.parent} gone"
        raise UndoFailed(f"restore {data['path']}: {exc}") from exc
    return f"{data['path']} = {data['value']}"


@undo_action("signal_process")
def _signal_process(data: Mapping[str, Json], ctx: UndoContext) -> str:
    p = ProcId(int(str(data["pid"])), int(str(data["start"])))
    sig = signal.Signals[str(data["signal"])]
    if node_proc.send(p, sig):
        return f"{sig.name} to pid {p.pid}"
    return f"pid {p.pid} gone"


# ----------------------------------------------------------------------------------- faults


def _throttle(
    name: str, ctx: JobContext, rank: int | None, percent: float, method: SlowMethod, active: bool = True
) -> Controller:
    if method is SlowMethod.CGROUP:
        fs = Cgroupfs()
        if not fs.v2:
            fs.cpu_hierarchy()  # no cpu controller: refused now, before anything is journalled
        return CgroupQuota(name, ctx, rank, percent, fs, active=active)
    return DutyCycle(name, ctx, rank, percent, active=active)


@applies("slow-rank")
def apply_slow_rank(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    rank, percent, method = int(num(req, "rank")), num(req, "percent"), choice(req, "method", SlowMethod)
    return [_throttle(req.name, ctx, rank, percent, method, active=not switchback(req))]


@applies("slow-node")
def apply_slow_node(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    index = int(num(req, "node"))
    if not ctx.nodes:
        raise ChaosError("slow-node: the job's node list is unknown (SLURM_JOB_NODELIST unset)")
    if index >= len(ctx.nodes):
        raise ChaosError(f"slow-node: node={index} but the job has only {len(ctx.nodes)} nodes")
    if ctx.nodes[index] != ctx.node:
        return []
    return [DutyCycle(req.name, ctx, None, num(req, "percent"), active=not switchback(req))]


def stress_argv(load: Load, cpus: int, seconds: int) -> list[str]:
    """stress-ng command line for one noisy-neighbour load (0 CPUs = one worker per online CPU);
    a matmul load on CPUs is stress-ng's matrix stressor."""
    workers = {
        Load.CPU: ["--cpu", str(cpus)],
        Load.CACHE: ["--cache", str(cpus)],
        Load.MEMORY: ["--vm", str(cpus), "--vm-bytes", "10%"],
        Load.MATMUL: ["--matrix", str(cpus)],
    }[load]
    return ["stress-ng", *workers, "--timeout", f"{max(1, seconds)}s", "--quiet"]


#: While a switchback job has its noisy neighbour off, how often late-forked workers are stopped.
HOLD_STOPPED_S = 0.2
#: How long a noisy neighbour waits for its job's extern step (the job's cgroup) before giving up.
EXTERN_WAIT_S = 60.0
EXTERN_POLL_S = 0.5
#: Joins the cgroup.procs files given before "--", then execs the rest: the load is inside the
#: job's cgroups from its first instruction, and so is every worker it forks.
JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"'


def extern_step_cgroups(job_id: str, fs: Cgroupfs) -> dict[str, str] | None:
    """The cgroups of the job's extern step's task here ({hierarchy: path}), None while it has none.

    With ``PrologFlags=Contain`` slurmd starts the extern step right after the prolog; its task
    (a ``sleep``) lives until the job ends, in the step's own cgroup inside the job's, and
    whatever else is in that cgroup is killed with the job (as pam_slurm_adopt relies on). The
    step is the one of root's slurmstepd titled ``[J.extern]``, its cgroup ``job_J/step_extern``
    under the job's cgroup taken from that slurmstepd, the task that slurmstepd's child.

    slurmstepd moves the task into its cgroups one hierarchy at a time: for a moment it can be in
    ``job_J/step_extern`` of cpuset and memory but still in ``job_J`` of the freezer. A load started
    then would sit in the job's own freezer cgroup, outside the step that Slurm kills and removes
    at the job's end: until every hierarchy holds it in the step, this says None (ask again)."""
    daemons = node_proc.step_daemons(job_id, fs.proc)
    externs = {pid for pid, step in daemons.items() if step == "extern"}
    step = node_proc.step_cgroups(fs.mounted(node_proc.job_cgroups(job_id, fs.proc, daemons)), "extern")
    if not externs or not step:
        return None
    for pid in node_proc.pids(fs.proc):
        if node_proc.parent(pid, fs.proc) not in externs:
            continue
        try:
            paths = fs.of(pid)
        except ChaosError:
            continue
        if cgroupfs.inside(paths, step):
            return {h: paths[h] for h in step}
    return None


@dataclass
class NoisyLoad:
    """Starts the load in the job's extern step cgroups once they exist: bound by the job's cpuset
    and memory limit, killed with the job even if no undo runs, and journalled to be stopped."""

    name: str
    ctx: JobContext
    command: Callable[[int], list[str]]
    fs: Cgroupfs = field(default_factory=Cgroupfs)
    extern: Callable[[str, Cgroupfs], dict[str, str] | None] = extern_step_cgroups
    give_up: float = 0.0
    done: bool = False
    #: False while a switchback job has the load off: it is started, then kept stopped.
    active: bool = True
    started: bool = False
    next_hold: float = 0.0

    def _signal(self, sig: int) -> None:
        for p in marked(self.ctx.marker(self.name)):
            node_proc.send(p, sig)

    def switch(self, on: bool, now: float) -> None:
        self.active = on
        if self.started:
            self._signal(signal.SIGCONT if on else signal.SIGSTOP)
        self.next_hold = now + HOLD_STOPPED_S

    def tick(self, now: float) -> float:
        if self.done:
            if not self.started or self.active:
                return float("inf")
            if now >= self.next_hold:  # a worker forked after the last SIGSTOP is stopped too
                self._signal(signal.SIGSTOP)
                self.next_hold = now + HOLD_STOPPED_S
            return self.next_hold
        if not self.give_up:
            self.give_up = now + EXTERN_WAIT_S
        cgroups = self.extern(self.ctx.job_id, self.fs)
        if cgroups is None:
            if now < self.give_up:
                return now + EXTERN_POLL_S
            self.done = True
            log.error(
                "%s: not applied on %s for job %s: the job has no extern step in a cgroup of its own "
                "(Slurm's PrologFlags=Contain with proctrack/cgroup): the load would run outside the job",
                self.name,
                self.ctx.node,
                self.ctx.job_id,
            )
            return float("inf")
        self.done = True
        procs = [str(self.fs.dir(h, path) / "cgroup.procs") for h, path in sorted(cgroups.items())]
        argv = self.command(max(1, int(self.ctx.deadline - now)))
        marker = self.ctx.marker(self.name)
        where = ", ".join(f"{h or 'unified'}:{p}" for h, p in sorted(cgroups.items()))
        self.ctx.journal.record(
            self.name,
            f"{' '.join(argv)} in {where}",
            Undo(action="kill_marked", data={"marker": marker}),
            self.ctx.deadline,
        )
        pid = self.ctx.spawner(
            ["sh", "-c", JOIN_CGROUPS, "sh", *procs, "--", *argv], {MARKER_ENV: marker}, self.ctx.log_file
        )
        log.info("%s: started %s (pid %d) in %s", self.name, " ".join(argv), pid, where)
        self.started = True
        if not self.active:
            self._signal(signal.SIGSTOP)
            self.next_hold = now + HOLD_STOPPED_S
            return self.next_hold
        return float("inf")

    def stop(self) -> None:
        """Continue a load switched off; it ends with the job's extern step, or by the undo."""
        if self.started and not self.active:
            self._signal(signal.SIGCONT)


@applies("noisy-neighbour")
def apply_noisy_neighbour(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    load, cpus = choice(req, "load", Load), int(num(req, "cpus"))
    if load is Load.MATMUL and ctx.gpus:

        def command(seconds: int) -> list[str]:
            return node_gpu.burn_argv(ctx, seconds)  # the job's own GPUs only
    else:
        if load is Load.MATMUL:
            log.warning(
                "noisy-neighbour: job %s holds no GPU on %s: the matmul load runs on its CPUs "
                "(stress-ng --matrix)",
                ctx.job_id,
                ctx.node,
            )
        if shutil.which("stress-ng") is None:
            raise ChaosError("noisy-neighbour: stress-ng is not installed on this node")

        def command(seconds: int) -> list[str]:
            return stress_argv(load, cpus, seconds)

    return [NoisyLoad(req.name, ctx, command, active=not switchback(req))]


def marked(marker: str, proc: Path = node_proc.PROC) -> list[ProcId]:
    """Every live process of ours started with MARKER_ENV=marker, and every descendant of ours of one.

    Ours: every uid of the process is this one's (root's, for the agent that starts the loads).
    A job's user can set the marker in a process of their own, but not start a root process; a
    load's workers are root's children, and no user's process becomes one.
    The environment alone does not find what a load forked: a process may write over the memory
    its /proc/PID/environ is read from (stress-ng's workers do, to call themselves
    "stress-ng-cpu [run]"), and then reads as having none. So the marked processes are the roots,
    and their children, found by parent, are theirs however they look."""
    me = os.geteuid()
    roots: list[int] = []
    children: dict[int, list[int]] = {}
    for pid in node_proc.pids(proc):
        if node_proc.environ(pid, proc).get(MARKER_ENV) == marker and node_proc.owned_by(pid, me, proc):
            roots.append(pid)
        elif (ppid := node_proc.parent(pid, proc)) is not None:
            children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = roots
    while todo:
        pid = todo.pop()
        if pid not in found and node_proc.owned_by(pid, me, proc):
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return [p for p in (node_proc.proc_id(pid, proc) for pid in sorted(found)) if p is not None]


#: Listings of a marked tree the undo makes at most: each kills what the one before missed.
KILL_ROUNDS = 5


@undo_action("kill_marked")
def _kill_marked(data: Mapping[str, Json], ctx: UndoContext) -> str:
    marker = str(data["marker"])
    stopped: set[ProcId] = set()
    killed = 0
    for _ in range(KILL_ROUNDS):  # a worker forked, or mid-exec, during one listing is in the next
        procs = [p for p in marked(marker) if p not in stopped]
        if not procs:
            break
        killed += _term_then_kill(procs, marker)
        stopped.update(procs)
    else:
        if marked(marker):
            raise UndoFailed(f"processes marked {marker} kept appearing after {KILL_ROUNDS} rounds")
    with_kill = f" ({killed} with SIGKILL)" if killed else ""
    return f"stopped {len(stopped)} processes marked {marker}{with_kill}"


def _term_then_kill(procs: Sequence[ProcId], marker: str) -> int:
    """SIGTERM, then SIGKILL after 5 s; the number that needed SIGKILL."""
    for p in procs:
        node_proc.send(p, signal.SIGTERM)
        node_proc.send(p, signal.SIGCONT)  # a load a switchback job left stopped
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(node_proc.is_alive(p) for p in procs):
        time.sleep(0.05)
    killed = [p for p in procs if node_proc.send(p, signal.SIGKILL)]
    time.sleep(0.05 if killed else 0)
    left = [p.pid for p in procs if node_proc.is_alive(p)]
    if left:
        raise UndoFailed(f"processes {left} marked {marker} survived SIGKILL")
    return len(killed)
