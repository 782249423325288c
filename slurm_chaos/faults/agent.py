"""The node agent: applies a job's node-level faults, keeps them going, and guarantees their undo.

``apply`` (run by the prolog, in slurmd's namespaces) journals and makes every immediate change
before the job starts, then detaches a small daemon (double fork, new session, no open pipes to
slurmd) that drives what needs a running controller (a rank's duty cycle, delayed faults) and is
the watchdog: it reverts the journal at the deadline, or once the controller says the job ended,
even if the epilog never runs. ``undo`` (run by the epilog) stops the daemon first, then replays
the journal. Both are idempotent: a second apply of the same job is a no-op, a second undo finds
nothing pending.

    python -m slurm_chaos.faults.agent apply --job J --node N --spec SPEC [--deadline S]
    python -m slurm_chaos.faults.agent undo --job J --node N
    python -m slurm_chaos.faults.agent cleanup [--nodes N,...]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import logging.handlers
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from slurm_chaos.errors import ChaosError, SlurmError
from slurm_chaos.faults import control, node_cpu, node_gpu, node_net, node_proc, node_storage  # noqa: F401 - registries
from slurm_chaos.faults.catalogue import Where
from slurm_chaos.faults.cleanup import cleanup, node_scheduler, revert_journal
from slurm_chaos.faults.control import ChannelOwner
from slurm_chaos.faults.journal import (
    DEFAULT_ROOT,
    Journal,
    JournalClosed,
    Json,
    Outcome,
    Undo,
    UndoContext,
    UndoFailed,
    any_failed,
    undo_action,
)
from slurm_chaos.faults.node_base import APPLIERS, Controller, JobContext, Switchable, log, switchback
from slurm_chaos.faults.spec import FaultRequest, parse_spec
from slurm_chaos.hostlist import expand_hostlist
from slurm_chaos.runner import Runner, SubprocessRunner
from slurm_chaos.slurm.protocol import Scheduler

#: The watchdog's deadline when the prolog learnt no end time from slurmctld (a job without a
#: time limit): bounded, so that faults never outlive a lost epilog and an unreachable controller
#: by long. A known end time counts up to MAX_DEADLINE_S.
DEFAULT_DEADLINE_S = 4 * 3600.0
MAX_DEADLINE_S = 7 * 86400.0
#: How often the watchdog asks the controller whether the job still runs; every node of the job
#: asks, so big jobs ask less often (one query per node per JOB_CHECK_NODES_PER_S nodes seconds).
JOB_CHECK_EVERY_S = 15.0
JOB_CHECK_NODES_PER_S = 10.0
FIRST_CHECK_AFTER_S = 5.0
#: Slack after the job's own time limit before the watchdog gives up waiting for the epilog.
TIME_LIMIT_GRACE_S = 120.0
STOP_GRACE_S = 5.0


class Stop(Exception):
    """SIGTERM to the agent: continue stopped tasks and exit (the undo is the caller's)."""


def node_requests(spec: str) -> tuple[list[FaultRequest], list[str]]:
    """The node-level faults of a SPEC, and the names of the others (the plugin's or the controller's)."""
    requests = parse_spec(spec)
    mine = [r for r in requests if r.fault.where is Where.NODE]
    return mine, [r.name for r in requests if r.fault.where is not Where.NODE]


# --------------------------------------------------------------------------------- controllers


@dataclass
class Delayed:
    """A fault that starts `after` seconds into the job; then drives whatever it returns."""

    name: str
    request: FaultRequest
    ctx: JobContext
    due: float
    children: list[Controller] = field(default_factory=list)
    fired: bool = False

    def tick(self, now: float) -> float:
        if not self.fired and now >= self.due:
            self.fired = True
            log.info("%s: delay over, applying on %s for job %s", self.name, self.ctx.node, self.ctx.job_id)
            self.children = apply_one(self.request, self.ctx) or []
        if not self.fired:
            return self.due
        return min((c.tick(now) for c in self.children), default=float("inf"))

    def stop(self) -> None:
        for c in self.children:
            c.stop()


#: The least time between two requests of one channel that the agent acts on. A switchback job asks
#: at block boundaries, and a block is at least 10 steps (``slurm_chaos.schedule.MIN_BLOCK``): the
#: sandbox's 10 ms steps ask every 100 ms at the fastest. A request that comes sooner waits for the
#: interval to end, and is then acknowledged (well within the probe's 1 s wait, outside its step
#: timings); a newer request that replaces it meanwhile is the one acted on. So a job that writes
#: requests as fast as it can makes root switch (fork ``tc``, scan ``/proc``) 20 times a second at most.
MIN_SWITCH_INTERVAL_S = 0.05
#: Requests acted on per job and node: the default schedule (1,000 steps, blocks of 10-15) asks for
#: about 100, so 100 times that. Beyond it the fault stays as it is and the channel is no longer read.
MAX_SWITCHES_PER_JOB = 10_000
#: Failed switches logged in full; after them one summary at most every FAILURE_SUMMARY_EVERY_S.
FAILURES_LOGGED = 10
FAILURE_SUMMARY_EVERY_S = 60.0


@dataclass
class FailureLog:
    """Error lines for failures a job can repeat at will: the first `first` in full, then a count and
    the last message at most once every `every_s` seconds (and once more at the end)."""

    what: str
    first: int = FAILURES_LOGGED
    every_s: float = FAILURE_SUMMARY_EVERY_S
    failures: int = 0
    untold: int = 0
    last: str = ""
    next_summary: float = float("inf")

    def failed(self, message: str, now: float) -> None:
        self.failures += 1
        if self.failures <= self.first:
            log.error("%s", message)
            if self.failures == self.first:
                self.next_summary = now + self.every_s
                log.error("%s: %d logged, the next summed up every %g s", self.what, self.first, self.every_s)
            return
        self.untold += 1
        self.last = message
        self.flush(now)

    def flush(self, now: float, final: bool = False) -> None:
        if not self.untold or (now < self.next_summary and not final):
            return
        log.error("%s: %d more (%d in all); the last: %s", self.what, self.untold, self.failures, self.last)
        self.untold = 0
        self.next_summary = now + self.every_s


@dataclass
class Switched:
    """The reversible faults of a switchback job, turned on and off by its control channel.

    The faults were authorised and applied like any other (journalled, undone by the journal);
    they start off. Every POLL_S the agent reads the channel's request, which can only say on or
    off (:mod:`slurm_chaos.faults.control`), switches every fault, and acknowledges the new state
    with the time it took effect, or with the error that left the faults as they were. It acts on
    one request per MIN_SWITCH_INTERVAL_S at most and on MAX_SWITCHES_PER_JOB in all: the channel
    is the job's to write, as fast and as often as it likes.
    """

    name: str
    channel: ChannelOwner
    children: list[Switchable]
    on: bool = False
    next_poll: float = 0.0
    #: The newest request read and not yet acted on (it waits for the interval to end).
    pending: control.Request | None = None
    last_switch: float = float("-inf")
    switches: int = 0
    held_back: int = 0
    failures: FailureLog = field(init=False)

    def __post_init__(self) -> None:
        self.failures = FailureLog(f"{self.name}: failed switches on {self.channel.path}")

    def tick(self, now: float) -> float:
        self.failures.flush(now)
        if now >= self.next_poll:
            self.next_poll = now + control.POLL_S
            self.pending = self.channel.read() or self.pending
            if self.pending is not None:
                self._take(self.pending, now)
        return min([self.next_poll] + [c.tick(now) for c in self.children])

    def _take(self, req: control.Request, now: float) -> None:
        due = self.last_switch + MIN_SWITCH_INTERVAL_S
        if self.last_switch <= now < due:  # (a clock set back does not hold requests back)
            self.held_back += 1
            self.next_poll = due
            return
        self.pending = None
        if self.switches >= MAX_SWITCHES_PER_JOB:
            self._use_up(req)
            return
        self.switches += 1
        self.last_switch = now
        self._switch(req, now)

    def _use_up(self, req: control.Request) -> None:
        self.next_poll = float("inf")  # never read again
        state = control.State.ON if self.on else control.State.OFF
        why = f"the job's {MAX_SWITCHES_PER_JOB} switches on this node are used up: {self.name} stays {state}"
        log.warning("%s: %s: its control channel %s is no longer read", self.name, why, self.channel.path)
        self.channel.acknowledge(control.Ack(req.epoch, state, time.time(), why))

    def _switch(self, req: control.Request, now: float) -> None:
        want = req.state is control.State.ON
        done: list[Switchable] = []
        try:
            for child in self.children:
                child.switch(want, now)
                done.append(child)
        except (ChaosError, OSError) as exc:
            for child in done:  # back to the state the job was last told
                with contextlib.suppress(ChaosError, OSError):
                    child.switch(self.on, now)
            self.failures.failed(
                f"{self.name}: switch {req.state} for job {self.channel.path} failed: {exc}", now
            )
            state = control.State.ON if self.on else control.State.OFF
            self.channel.acknowledge(control.Ack(req.epoch, state, time.time(), str(exc)[:300]))
            return
        self.on = want
        self.channel.acknowledge(control.Ack(req.epoch, req.state, time.time()))

    def stop(self) -> None:
        for c in self.children:
            c.stop()
        self.channel.close()
        self.failures.flush(time.time(), final=True)
        log.info(
            "%s: %s: %d requests acted on (%d failed), %d held back by the %g s interval",
            self.name,
            self.channel.path,
            self.switches,
            self.failures.failures,
            self.held_back,
            MIN_SWITCH_INTERVAL_S,
        )


def open_switched(requests: Sequence[FaultRequest], ctx: JobContext) -> tuple[list[Controller], list[str]]:
    """Open the job's control channel on this node and apply its switchback faults, all off.

    Returns (the one Switched controller, or none; the faults that failed). The channel belongs
    to the job's uid, which Slurm gave the prolog; without it nothing is applied (fail closed).
    """
    names = [r.name for r in requests]
    if ctx.uid is None or ctx.gid is None:
        log.error(
            "%s: control=switchback needs the job's uid and gid (SLURM_JOB_UID/GID): not applied", names
        )
        return [], names
    path = control.channel_dir(ctx.journal.root, ctx.node, ctx.job_id)
    where: dict[str, Json] = {"root": str(ctx.journal.root), "node": ctx.node, "job": ctx.job_id}
    ctx.journal.record(
        "control",
        f"control channel {path} (uid {ctx.uid})",
        Undo(action="control_remove", data=where),
        ctx.deadline,
    )
    try:
        channel = ChannelOwner.create(ctx.journal.root, ctx.node, ctx.job_id, ctx.uid, ctx.gid)
    except (control.ChannelError, OSError) as exc:
        log.error("%s: control channel for job %s not opened: %s: not applied", names, ctx.job_id, exc)
        return [], names
    children: list[Switchable] = []
    failed: list[str] = []
    for req in requests:
        started = apply_one(req, ctx)
        if started is None:
            failed.append(req.name)
            continue
        for c in started:
            if not isinstance(c, Switchable):
                raise ChaosError(f"{req.name}: its controller {type(c).__name__} cannot be switched")
            children.append(c)
    if len(failed) == len(requests):
        channel.close()
        return [], failed
    return [Switched("+".join(n for n in names if n not in failed), channel, children)], failed


@undo_action("control_remove")
def _control_remove(data: Mapping[str, Json], ctx: UndoContext) -> str:
    root, node, job = Path(str(data["root"])), str(data["node"]), str(data["job"])
    try:
        control.remove_channel(root, node, job)
    except control.ChannelError as exc:
        raise UndoFailed(str(exc)) from exc
    return f"control channel {control.channel_dir(root, node, job)} removed"


def apply_one(req: FaultRequest, ctx: JobContext) -> list[Controller] | None:
    """Apply one fault now; None if it failed (logged; the other faults and the job go on)."""
    try:
        return APPLIERS[req.name](req, ctx)
    except JournalClosed:
        raise
    except (ChaosError, OSError) as exc:
        log.error("%s: not applied on %s for job %s: %s", req.name, ctx.node, ctx.job_id, exc)
        return None


def apply_all(
    requests: Sequence[FaultRequest], ctx: JobContext, now: float
) -> tuple[list[Controller], list[str], list[str]]:
    """Apply (or schedule) every request: (controllers to drive, faults applied, faults failed)."""
    controllers: list[Controller] = []
    applied: list[str] = []
    failed: list[str] = []
    switched = [r for r in requests if switchback(r)]
    if switched:
        controllers, failed = open_switched(switched, ctx)
        applied += [f"{r.name} (switchback, off)" for r in switched if r.name not in failed]
    for req in requests:
        if switchback(req):
            continue
        after = req.get("after") if req.fault.key("after") else None
        if isinstance(after, int | float) and after > 0:
            controllers.append(Delayed(req.name, req, ctx, now + float(after)))
            applied.append(f"{req.name} (in {float(after):g} s)")
            continue
        started = apply_one(req, ctx)
        if started is None:
            failed.append(req.name)
        else:
            controllers += started
            applied.append(req.name)
    return controllers, applied, failed


# --------------------------------------------------------------------------------- the daemon


@dataclass
class Watchdog:
    """Ends the agent: at the deadline, when the job has ended, or when the journal was closed."""

    ctx: JobContext
    scheduler: Scheduler
    deadline: float
    next_check: float = 0.0
    limit_known: bool = False

    def verdict(self, now: float) -> str | None:
        if now >= self.deadline:
            return "deadline"
        if now < self.next_check:
            return None
        self.next_check = now + max(JOB_CHECK_EVERY_S, len(self.ctx.nodes) / JOB_CHECK_NODES_PER_S)
        if self.ctx.journal.read().closed:
            return "journal closed"
        if not self.limit_known:
            self._tighten(now)
        if self.scheduler.job_running(self.ctx.job_id) is False:
            return "job ended"
        return None

    def _tighten(self, now: float) -> None:
        # The prolog cannot see the job's time limit; the detached agent may ask the controller once.
        try:
            left = self.scheduler.time_left(self.ctx.job_id)
        except SlurmError:
            return  # cannot tell now: ask again at the next check
        self.limit_known = True
        if left is not None and now + left + TIME_LIMIT_GRACE_S < self.deadline:
            self.deadline = now + left + TIME_LIMIT_GRACE_S
            log.info(
                "watchdog: job %s ends by its time limit; deadline in %.0f s",
                self.ctx.job_id,
                self.deadline - now,
            )


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise Stop()


def run_loop(ctx: JobContext, controllers: list[Controller], runner: Runner) -> str:
    """Drive the controllers until the watchdog ends the agent; then revert unless told to stop."""
    # The first look at the job waits a little: other nodes' prologs may still be running.
    first_check = time.time() + FIRST_CHECK_AFTER_S
    watchdog = Watchdog(ctx, node_scheduler(runner), ctx.deadline, next_check=first_check)
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    reason = "stopped"
    try:
        while True:
            now = time.time()
            verdict = watchdog.verdict(now)
            if verdict is not None:
                reason = verdict
                break
            wake = min([c.tick(now) for c in controllers] + [watchdog.deadline, watchdog.next_check])
            time.sleep(min(1.0, max(0.0, wake - time.time())))
    except Stop:
        reason = "stopped"
    except JournalClosed:
        reason = "journal closed"
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for c in controllers:
            c.stop()
    if reason in ("deadline", "job ended"):
        result = revert_journal(ctx.journal, runner, by=f"agent watchdog ({reason})", skip_pid=os.getpid())
        for line in result.undone:
            log.info("watchdog (%s): undid %s", reason, line)
        for line in result.failed:
            log.error("watchdog (%s): undo failed: %s", reason, line)
    log.info("agent for job %s on %s exits: %s", ctx.job_id, ctx.node, reason)
    return reason


def _redirect_stdio(log_file: Path | None) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    out = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640) if log_file else null
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)


def detach(ctx: JobContext, controllers: list[Controller], runner: Runner) -> int:
    """Start the daemon (double fork, setsid); returns its PID once it has journalled itself."""
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:  # intermediate child: a new session, then the daemon, then gone
        os.close(read_end)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        code = 1
        try:
            os.chdir("/")
            _redirect_stdio(ctx.log_file)
            _reset_log_handlers(ctx.log_file)
            me = node_proc.proc_id(os.getpid())
            assert me is not None
            ctx.journal.record(
                "agent",
                f"agent pid {me.pid} (watchdog until {time.strftime('%H:%M:%S', time.localtime(ctx.deadline))})",  # noqa: E501
                Undo(action="stop_agent", data={"pid": me.pid, "start": me.start}),
                ctx.deadline,
                early=True,
            )
            os.write(write_end, f"{me.pid}\n".encode())
            os.close(write_end)
            run_loop(ctx, controllers, runner)
            code = 0
        except BaseException as exc:  # the daemon must never raise into the prolog's stack
            log.error("agent for job %s died: %r", ctx.job_id, exc)
        finally:
            os._exit(code)
    os.close(write_end)
    os.waitpid(first, 0)
    with os.fdopen(read_end) as fh:
        text = fh.read().strip()
    if not text.isdigit():
        raise ChaosError(f"the agent for job {ctx.job_id} did not start (see {ctx.log_file})")
    return int(text)


@undo_action("stop_agent")
def _stop_agent(data: Mapping[str, Json], ctx: UndoContext) -> str:
    p = node_proc.ProcId(int(str(data["pid"])), int(str(data["start"])))
    if not node_proc.send(p, signal.SIGTERM):
        return f"agent pid {p.pid} already gone"
    end = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < end and node_proc.is_alive(p):
        time.sleep(0.05)
    if node_proc.send(p, signal.SIGKILL):
        time.sleep(0.1)
        if node_proc.is_alive(p):
            raise UndoFailed(f"agent pid {p.pid} survived SIGKILL")
        return f"agent pid {p.pid} killed (SIGKILL)"
    return f"agent pid {p.pid} stopped"


# --------------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class ApplyResult:
    """What `apply` did: faults applied (or scheduled), faults left to others, the agent's PID."""

    applied: tuple[str, ...]
    skipped: tuple[str, ...]
    agent_pid: int | None
    note: str = ""
    failed: tuple[str, ...] = ()


def _prepare_journal(journal: Journal, runner: Runner) -> str | None:
    """Make room for this run's journal; returns why not to apply, or None to go ahead."""
    state = journal.read()
    if not state.entries and not state.closed:
        return None
    if not state.closed:
        return "already applied (journal open)"
    if state.pending():
        result = revert_journal(journal, runner, by="apply: finishing an earlier undo")
        if result.failed:
            return f"an earlier run's changes are not reverted ({result.failed[0]}); run cleanup"
    # A requeued job runs its prolog again under the same id: keep the old run's journal aside.
    journal.path.rename(journal.path.with_name(f"{journal.job_id}.{int(time.time() * 1000)}.done"))
    return None


def apply(
    job_id: str,
    node: str,
    spec: str,
    deadline_s: float,
    journal_root: Path,
    runner: Runner,
    nodes: Sequence[str] = (),
    uid: int | None = None,
    gid: int | None = None,
    log_file: Path | None = None,
    foreground: bool = False,
    ckpt_roots: Sequence[str] = (),
    job_interface: str | None = None,
    gpus: Sequence[int] = (),
    exclusive: bool = False,
) -> ApplyResult:
    """Apply the node-level faults of `spec` for one job on this node (see the module docstring)."""
    requests, others = node_requests(spec)
    if not requests:
        return ApplyResult((), tuple(others), None, "no node-level fault in the SPEC")
    journal = Journal(journal_root, node, job_id)
    why_not = _prepare_journal(journal, runner)
    if why_not:
        log.warning("job %s on %s: not applying %s: %s", job_id, node, spec, why_not)
        return ApplyResult((), tuple(others), None, why_not)
    now = time.time()
    ctx = JobContext(
        job_id,
        node,
        tuple(nodes),
        uid,
        gid,
        now + deadline_s,
        journal,
        runner,
        log_file=log_file,
        ckpt_roots=tuple(ckpt_roots),
        job_interface=job_interface,
        gpus=tuple(gpus),
        exclusive=exclusive,
    )
    slurmd = node_proc.find_ancestor(os.getpid(), "slurmd") or os.getpid()
    journal.write_header(ctx.deadline, slurmd)
    controllers, applied, failed = apply_all(requests, ctx, now)
    done = (tuple(applied), tuple(others))
    if foreground:
        run_loop(ctx, controllers, runner)
        return ApplyResult(*done, os.getpid(), failed=tuple(failed))
    if not journal.read().pending() and not controllers:
        return ApplyResult(*done, None, "nothing changed", tuple(failed))
    # Even with no controller the agent runs: it is the watchdog that undoes if the epilog never runs.
    pid = detach(ctx, controllers, runner)
    return ApplyResult(*done, pid, failed=tuple(failed))


def undo(job_id: str, node: str, journal_root: Path, runner: Runner) -> list[Outcome]:
    """Stop the job's agent and revert its journal on this node; returns what was done."""
    journal = Journal(journal_root, node, job_id)
    if not journal.path.exists():
        return []
    result = revert_journal(journal, runner, by=f"undo (pid {os.getpid()})")
    return result.outcomes()


# --------------------------------------------------------------------------------- CLI


class _Prefix(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return "slurm-chaos: " + super().format(record)


def setup_logging(log_file: Path | None, stderr: bool = True) -> None:
    """Log with the 'slurm-chaos:' prefix to stderr, syslog (when there is one) and `log_file`."""
    log.setLevel(logging.INFO)
    log.propagate = False
    for h in list(log.handlers):
        log.removeHandler(h)
    stamp = _Prefix("%(asctime)s %(levelname)s [%(process)d] %(message)s")
    if stderr:
        err = logging.StreamHandler(sys.stderr)
        err.setFormatter(_Prefix("%(levelname)s %(message)s"))
        log.addHandler(err)
    if log_file:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(log_file)
        fh.setFormatter(stamp)
        log.addHandler(fh)
    if Path("/dev/log").is_socket():
        try:
            sh = logging.handlers.SysLogHandler(address="/dev/log")
            sh.setFormatter(_Prefix("%(message)s"))
            log.addHandler(sh)
        except OSError:
            pass


def _reset_log_handlers(log_file: Path | None) -> None:
    # In the daemon stderr is the log file already: do not write every line twice.
    setup_logging(log_file, stderr=False)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m slurm_chaos.faults.agent", description=__doc__.split("\n")[0])
    p.add_argument("--journal-root", type=Path, default=DEFAULT_ROOT)
    p.add_argument("--log-file", type=Path, default=None)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("apply", help="apply the node-level faults of a SPEC for one job on this node")
    a.add_argument("--job", required=True)
    a.add_argument("--node", required=True)
    a.add_argument("--spec", required=True)
    a.add_argument(
        "--deadline", type=float, default=DEFAULT_DEADLINE_S, help="seconds until the watchdog undoes"
    )
    a.add_argument("--nodelist", default="", help="the job's nodes (SLURM_JOB_NODELIST), for slow-node")
    a.add_argument("--uid", type=int, default=None)
    a.add_argument("--gid", type=int, default=None)
    a.add_argument("--foreground", action="store_true", help="run the controller loop here, do not detach")
    a.add_argument(
        "--ckpt-root",
        action="append",
        default=[],
        help="an allowed checkpoint root: ckpt-full acts only below one (repeatable; none: it refuses)",
    )
    a.add_argument(
        "--job-interface", default=None, help="the one interface netem may shape (none: it refuses)"
    )
    a.add_argument(
        "--gpus", default="", help="the job's GPUs on this node, as SLURM_JOB_GPUS (none: GPU faults refuse)"
    )
    a.add_argument(
        "--exclusive",
        action="store_true",
        help="the job holds this node alone, as slurmctld says (none: node-wide faults such as netem refuse)",
    )
    u = sub.add_parser("undo", help="stop the job's agent and revert its journal on this node")
    u.add_argument("--job", required=True)
    u.add_argument("--node", required=True)
    c = sub.add_parser("cleanup", help="revert stale journals (job ended, deadline passed)")
    c.add_argument("--nodes", default="", help="node list (default: every node with a journal)")
    return p


SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def ensure_system_path() -> None:
    """The system directories first on PATH: slurmd gives prolog and epilog none (tc, mount and
    nsenter live in sbin), and nothing earlier on PATH may stand in for them in a root process."""
    parts = [p for p in os.environ.get("PATH", "").split(":") if p and p not in SYSTEM_PATH]
    os.environ["PATH"] = ":".join([*SYSTEM_PATH, *parts])


def main(argv: Sequence[str] | None = None, runner: Runner | None = None) -> int:
    args = _parser().parse_args(argv)
    ensure_system_path()
    setup_logging(args.log_file)
    run = runner or SubprocessRunner()
    try:
        if args.cmd == "apply":
            res = apply(
                args.job,
                args.node,
                args.spec,
                args.deadline,
                args.journal_root,
                run,
                nodes=expand_hostlist(args.nodelist),
                uid=args.uid,
                gid=args.gid,
                log_file=args.log_file,
                foreground=args.foreground,
                ckpt_roots=args.ckpt_root,
                job_interface=args.job_interface,
                gpus=node_gpu.parse_job_gpus(args.gpus),
                exclusive=args.exclusive,
            )
            log.info(
                "job %s on %s: applied [%s], failed [%s], left to others [%s], agent %s %s",
                args.job,
                args.node,
                ",".join(res.applied),
                ",".join(res.failed),
                ",".join(res.skipped),
                res.agent_pid,
                res.note,
            )
        elif args.cmd == "undo":
            lines = undo(args.job, args.node, args.journal_root, run)
            for line in lines:
                log.info("undo: %s", line)
            return 1 if any_failed(lines) else 0
        else:
            nodes = expand_hostlist(args.nodes) or None
            lines = cleanup(args.journal_root, nodes, run)
            for line in lines:
                print(line)
            return 1 if any_failed(lines) else 0
    except ChaosError as exc:
        log.error("%s", exc)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
