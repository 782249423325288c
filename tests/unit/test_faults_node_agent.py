"""The agent (apply, watchdog, undo) and cleanup of stale journals (the hooks: test_faults_authz.py)."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

import pytest

from slurm_chaos.errors import ChaosError, SlurmError
from slurm_chaos.faults import agent
from slurm_chaos.faults.cleanup import cleanup, node_scheduler, stale_reason
from slurm_chaos.faults.control import Ack, ChannelOwner, Request, State
from slurm_chaos.faults.install_hooks import install_hooks
from slurm_chaos.faults.journal import Journal, Outcome, Undo, any_failed
from slurm_chaos.faults.node_base import JobContext, log
from slurm_chaos.runner import Completed, FakeRunner
from slurm_chaos.slurm.fake import FakeScheduler

DEFAULT = "qdisc noqueue 0: root refcnt 2 \n"


class TcSim:
    def __init__(self) -> None:
        self.root = DEFAULT
        self.runner = FakeRunner(self.respond)

    def respond(self, argv: tuple[str, ...]) -> Completed:
        if argv[:3] == ("tc", "qdisc", "show"):
            return Completed(argv, 0, self.root, "")
        if argv[:3] == ("tc", "qdisc", "add"):
            self.root = f"qdisc netem {argv[7]} root refcnt 2\n"
        elif argv[:3] == ("tc", "qdisc", "del"):
            self.root = DEFAULT
        elif argv[0] == "squeue":
            return Completed(argv, 1, "", "slurm_load_jobs error: Unable to contact slurm controller")
        return Completed(argv, 0, "", "")


def watchdog(tmp_path: Path, scheduler: FakeScheduler, deadline: float) -> agent.Watchdog:
    """The watchdog of job 7 on node1, due to look at the job now."""
    journal = Journal(tmp_path, "node1", "7")
    runner = FakeRunner(lambda a: Completed(a, 0, "", ""))
    ctx = JobContext("7", "node1", ("node1", "node2"), None, None, deadline, journal, runner)
    return agent.Watchdog(ctx, scheduler, deadline)


def test_watchdog_tightens_its_deadline_to_the_jobs_time_limit(tmp_path: Path) -> None:
    now = 1000.0
    scheduler = FakeScheduler(running={"7": True}, time_limits={"7": 600.0})
    dog = watchdog(tmp_path, scheduler, now + agent.DEFAULT_DEADLINE_S)
    assert dog.verdict(now) is None
    assert dog.deadline == now + 600.0 + agent.TIME_LIMIT_GRACE_S and dog.limit_known
    # The limit is asked once; later checks only ask whether the job still runs.
    assert dog.verdict(dog.next_check) is None
    assert scheduler.queries == {"time_left": 1, "job_running": 2}
    assert dog.verdict(dog.deadline) == "deadline"


def test_watchdog_never_lengthens_its_deadline_and_keeps_it_without_a_limit(tmp_path: Path) -> None:
    now = 1000.0
    for left in (agent.DEFAULT_DEADLINE_S, None):
        scheduler = FakeScheduler(running={"7": True}, time_limits={"7": left})
        dog = watchdog(tmp_path, scheduler, now + 60.0)
        assert dog.verdict(now) is None
        assert dog.deadline == now + 60.0 and dog.limit_known


def test_watchdog_asks_for_the_limit_again_while_the_controller_cannot_tell(tmp_path: Path) -> None:
    now = 1000.0
    scheduler = FakeScheduler(time_limits={"7": 300.0}, unreachable="Unable to contact slurm controller")
    dog = watchdog(tmp_path, scheduler, now + agent.DEFAULT_DEADLINE_S)
    assert dog.verdict(now) is None  # cannot tell is not ended: the faults stay
    assert not dog.limit_known and dog.deadline == now + agent.DEFAULT_DEADLINE_S
    scheduler.unreachable = None
    scheduler.running["7"] = True
    second = dog.next_check
    assert dog.verdict(second) is None
    assert dog.limit_known and dog.deadline == second + 300.0 + agent.TIME_LIMIT_GRACE_S


def test_watchdog_ends_the_agent_once_the_job_ended(tmp_path: Path) -> None:
    now = 1000.0
    scheduler = FakeScheduler(running={"7": False})  # and the controller no longer knows its limit
    dog = watchdog(tmp_path, scheduler, now + agent.DEFAULT_DEADLINE_S)
    assert dog.verdict(now) == "job ended"
    assert not dog.limit_known and dog.deadline == now + agent.DEFAULT_DEADLINE_S


def test_watchdog_checks_less_often_for_big_jobs_and_stops_on_a_closed_journal(tmp_path: Path) -> None:
    scheduler = FakeScheduler(running={"7": True}, time_limits={"7": None})
    dog = watchdog(tmp_path, scheduler, 10_000.0)
    dog.ctx = replace(dog.ctx, nodes=tuple(f"n{i}" for i in range(1000)))
    assert dog.verdict(0.0) is None and dog.next_check == 1000 / agent.JOB_CHECK_NODES_PER_S
    assert dog.verdict(50.0) is None and len(scheduler.calls) == 2  # not due yet: nothing asked
    dog.ctx.journal.record("a", "x", Undo(argv=("true",)), 10_000.0)
    dog.ctx.journal.close("test")
    assert dog.verdict(dog.next_check) == "journal closed"


def test_only_node_level_faults_are_the_agents() -> None:
    mine, others = agent.node_requests("netem:delay=5ms+nccl-degrade:ib=off+node-drain")
    assert [r.name for r in mine] == ["netem"] and others == ["nccl-degrade", "node-drain"]


def test_watchdog_reverts_at_the_deadline_and_a_second_apply_is_a_no_op(tmp_path: Path) -> None:
    sim = TcSim()
    res = agent.apply(
        "12",
        "node1",
        "netem:delay=30ms",
        0.3,
        tmp_path,
        sim.runner,
        foreground=True,
        job_interface="eth0",
        exclusive=True,
    )
    assert res.applied == ("netem",)
    # run_loop returned at the deadline and undid the journal
    assert sim.root == DEFAULT
    state = Journal(tmp_path, "node1", "12").read()
    assert state.closed and not state.pending()
    # A requeued job (same id) starts a fresh journal and applies again.
    again = agent.apply(
        "12",
        "node1",
        "netem:delay=30ms",
        0.2,
        tmp_path,
        sim.runner,
        foreground=True,
        job_interface="eth0",
        exclusive=True,
    )
    assert again.applied == ("netem",)
    assert len(list((tmp_path / "node1").glob("12.*.done"))) == 1


def test_apply_twice_while_open_does_nothing(tmp_path: Path) -> None:
    j = Journal(tmp_path, "node1", "13")
    j.record("netem", "x", Undo(argv=("true",)), time.time() + 60)
    sim = TcSim()
    res = agent.apply("13", "node1", "netem:delay=30ms", 60, tmp_path, sim.runner)
    assert res.applied == () and "already applied" in res.note and sim.runner.calls == []


def test_a_failing_fault_leaves_the_others(tmp_path: Path) -> None:
    sim = TcSim()
    sim.root = "qdisc htb 1: root refcnt 2\n"
    res = agent.apply(
        "14",
        "node1",
        "netem:delay=1ms",
        0.1,
        tmp_path,
        sim.runner,
        foreground=True,
        job_interface="eth0",
        exclusive=True,
    )
    assert res.failed == ("netem",) and res.applied == ()


def test_detached_agent_is_stopped_by_undo(tmp_path: Path) -> None:
    sim = TcSim()
    res = agent.apply(
        "15",
        "node1",
        "netem:delay=30ms",
        60,
        tmp_path,
        sim.runner,
        log_file=tmp_path / "a.log",
        job_interface="eth0",
        exclusive=True,
    )
    assert res.agent_pid is not None
    assert Path(f"/proc/{res.agent_pid}").exists()
    lines = agent.undo("15", "node1", tmp_path, sim.runner)
    assert any("agent pid" in o.what and not o.failed for o in lines)
    time.sleep(0.2)
    stat = Path(f"/proc/{res.agent_pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert agent.undo("15", "node1", tmp_path, sim.runner) == []


def test_stale_reasons() -> None:
    j = Journal(Path("/nonexistent"), "n", "1")
    from slurm_chaos.faults.journal import Entry, State

    e = Entry(1, 0.0, "1", "n", "netem", "a", Undo(argv=("true",)), 1, deadline=100.0)
    open_state = State(None, (e,), frozenset(), False)
    assert stale_reason(open_state, True, now=50.0) is None
    assert stale_reason(open_state, None, now=50.0) is None
    assert stale_reason(open_state, False, now=50.0) == "job no longer running"
    assert stale_reason(open_state, True, now=150.0) == "deadline passed"
    assert stale_reason(State(None, (e,), frozenset({1}), False), False, now=150.0) is None
    assert j.job_id == "1"


def test_cleanup_reverts_only_stale_journals(tmp_path: Path) -> None:
    runner = FakeRunner(lambda a: Completed(a, 0, "", ""))
    Journal(tmp_path, "node1", "1").record("a", "ended job", Undo(argv=("undo", "1")), time.time() + 3600)
    Journal(tmp_path, "node1", "2").record("a", "running job", Undo(argv=("undo", "2")), time.time() + 3600)
    Journal(tmp_path, "node2", "3").record("a", "expired", Undo(argv=("undo", "3")), time.time() - 1)
    out = cleanup(tmp_path, None, runner, job_running=lambda job: job == "2" or job == "3")
    assert sorted(runner.calls) == [("undo", "1"), ("undo", "3")]
    assert any("job no longer running" in o.what for o in out)
    assert any("deadline passed" in o.what for o in out)
    assert not any_failed(out)
    assert cleanup(tmp_path, None, runner, job_running=lambda job: False) != []  # job 2 ended now
    assert cleanup(tmp_path, None, runner, job_running=lambda job: False) == []


def test_a_failed_undo_is_an_outcome_that_fails_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def respond(argv: tuple[str, ...]) -> Completed:
        return Completed(argv, 1, "", "boom") if argv == ("undo", "2") else Completed(argv, 0, "", "")

    runner = FakeRunner(respond)
    Journal(tmp_path, "node1", "1").record("a", "one", Undo(argv=("undo", "1")), time.time() - 1)
    Journal(tmp_path, "node1", "2").record("a", "two", Undo(argv=("undo", "2")), time.time() - 1)
    out = cleanup(tmp_path, None, runner, job_running=lambda job: False)
    assert [o.failed for o in out] == [False, True] and any_failed(out)
    assert out[1] == Outcome(out[1].what, failed=True) and "boom" in out[1].what
    # What the hooks log and `cleanup` prints is the text it was before outcomes had a type.
    assert str(out[1]) == f"FAILED: {out[1].what}" and str(out[0]) == out[0].what
    monkeypatch.setattr(agent, "setup_logging", lambda log_file: None)
    assert agent.main(["--journal-root", str(tmp_path), "cleanup"], runner=runner) == 1
    assert capsys.readouterr().out.splitlines() == [f"FAILED: {out[1].what}"]  # still pending
    fixed = FakeRunner(lambda a: Completed(a, 0, "", ""))
    assert agent.main(["--journal-root", str(tmp_path), "cleanup"], runner=fixed) == 0
    assert capsys.readouterr().out.startswith("node1 job 2 a: two -> ")


def test_cleanup_asks_the_controller_and_reverts_only_ended_jobs(tmp_path: Path) -> None:
    runner = FakeRunner(lambda a: Completed(a, 0, "", ""))
    later = time.time() + 3600
    for job in ("1", "2", "3"):
        Journal(tmp_path, "node1", job).record("a", f"job {job}", Undo(argv=("undo", job)), later)
    # Job 1 runs, job 2 ended, the controller cannot tell about job 3: only job 2's faults go.
    scheduler = FakeScheduler(running={"1": True, "2": False, "3": None})
    out = cleanup(tmp_path, None, runner, job_running=scheduler.job_running)
    assert runner.calls == [("undo", "2")]
    assert len(out) == 1 and out[0].what.endswith("[job no longer running]") and not out[0].failed
    assert sorted(scheduler.called("job_running")) == [("1",), ("2",), ("3",)]
    # Unreachable, it cannot tell about any: nothing is reverted before its deadline.
    unreachable = FakeScheduler(running={"1": False}, unreachable="Unable to contact slurm controller")
    assert cleanup(tmp_path, None, runner, job_running=unreachable.job_running) == []
    assert runner.calls == [("undo", "2")]


def squeue(answers: Mapping[str, Completed]) -> FakeRunner:
    """Answers `squeue -h -j J -o %T` and `%L` per job."""

    def answer(argv: tuple[str, ...]) -> Completed:
        assert argv[:3] == ("squeue", "-h", "-j") and argv[4] == "-o", argv
        done = answers[argv[3]]
        if argv[5] == "%L" and done.ok:
            return Completed(argv, 0, "1:00:00\n" if done.stdout == "RUNNING\n" else "", "")
        return replace(done, argv=argv)

    return FakeRunner(answer)


def test_the_node_side_cli_questions_tell_running_from_ended_from_cannot_tell() -> None:
    answers = {
        "1": Completed((), 0, "RUNNING\n", ""),
        "2": Completed((), 0, "COMPLETED\n", ""),
        "3": Completed((), 1, "", "slurm_load_jobs error: Invalid job id specified"),
        "4": Completed((), 1, "", "slurm_load_jobs error: Unable to contact slurm controller"),
        "5": Completed((), 124, "", "timed out after 15 s"),
        "6": Completed((), 0, "", ""),
        "7": Completed((), 0, "PENDING\n", ""),
    }
    runner = squeue(answers)
    scheduler = node_scheduler(runner)
    assert [scheduler.job_running(j) for j in "1234567"] == [True, False, False, None, None, False, False]
    assert runner.invocations[0] == (
        ("squeue", "-h", "-j", "1", "-o", "%T"),
        15.0,
        {},
    )  # slurmd's env as it is
    assert scheduler.time_left("1") == 3600.0
    assert runner.invocations[-1] == (("squeue", "-h", "-j", "1", "-o", "%L"), 15.0, {})
    for job in "345":
        with pytest.raises(SlurmError):
            scheduler.time_left(job)


def test_prolog_hook_passes_the_allowed_checkpoint_roots(tmp_path: Path) -> None:
    roots = ("/scratch/ckpt", "/lustre/my ckpt")
    prolog, epilog = install_hooks(
        tmp_path / "etc", "/usr/bin/python3", journal_root=tmp_path, ckpt_roots=roots
    )
    assert "--ckpt-root /scratch/ckpt --ckpt-root '/lustre/my ckpt'" in prolog.read_text()
    assert "--ckpt-root" not in epilog.read_text()


def test_delayed_fault_fires_after_its_delay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_chaos.faults import node_gpu

    kmsg = tmp_path / "kmsg"
    monkeypatch.setattr(node_gpu, "KMSG", kmsg)
    monkeypatch.setattr("slurm_chaos.faults.node_gpu.shutil.which", lambda name: None)
    runner = FakeRunner(lambda a: Completed(a, 1, "", "squeue: unreachable"))
    t0 = time.time()
    res = agent.apply(
        "20", "node1", "gpu-xid:after=0.4s", 0.8, tmp_path / "j", runner, foreground=True, gpus=(0,)
    )
    assert res.applied == ("gpu-xid (in 0.4 s)",)
    written = kmsg.stat().st_mtime - t0
    assert 0.35 < written < 0.8 and "Xid" in kmsg.read_text()


@pytest.mark.sandbox
def test_site_journal_root_is_per_sandbox(sandbox, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The sandbox site config resolves only against a sandbox that is up."""
    from slurm_chaos.faults.install_hooks import site_journal_root
    from slurm_chaos.faults.journal import DEFAULT_ROOT
    from slurm_chaos.sandbox.layout import site_placeholders
    from slurm_chaos.site import load_site

    monkeypatch.setenv("SLURM_CHAOS_SANDBOX", sandbox.name)
    repo = Path(__file__).resolve().parents[2]
    sandbox = load_site(repo / "site_configs" / "sandbox.yaml", site_placeholders)
    assert site_journal_root(sandbox) == Path(str(sandbox.slurm.hooks_dir)).parent / "journal"
    assert site_journal_root(load_site(repo / "site_configs" / "h100-ib-example.yaml")) == DEFAULT_ROOT


# --------------------------------------------------------------------------------- the channel's limits


@dataclass
class Channel:
    """The agent's end of a control channel, as the job writes it: `hammer` puts a new request there
    before every read (a job writing as fast as it can), else the test sets `request`; `once`
    hands each request out once (a channel read like a pipe)."""

    hammer: bool = False
    once: bool = False
    request: Request | None = None
    last_epoch: int = 0
    reads: int = 0
    acks: list[Ack] = field(default_factory=list)
    path: Path = Path("/nonexistent/node1/77.control")

    def read(self) -> Request | None:
        self.reads += 1
        if self.hammer:
            epoch = self.last_epoch + self.reads
            self.request = Request(epoch, State.ON if epoch % 2 else State.OFF)
        req, self.request = self.request, (None if self.once else self.request)
        return req if req is not None and req.epoch > self.last_epoch else None

    def acknowledge(self, ack: Ack) -> None:
        self.last_epoch = max(self.last_epoch, ack.epoch)
        self.acks.append(ack)

    def close(self) -> None:
        pass


class Fault:
    """A switchable fault that records when it was switched (and fails every time when told to)."""

    name = "fake"

    def __init__(self, fail: bool = False) -> None:
        self.switched: list[tuple[float, bool]] = []
        self.fail = fail

    def switch(self, on: bool, now: float) -> None:
        if self.fail:
            raise ChaosError("tc: Exclusivity flag on, cannot modify")
        self.switched.append((now, on))

    def tick(self, now: float) -> float:
        return float("inf")

    def stop(self) -> None:
        pass


def switched(channel: Channel, fault: Fault) -> agent.Switched:
    return agent.Switched("netem", cast(ChannelOwner, channel), [fault])


def drive(sw: agent.Switched, until: float, every: float = 0.001) -> None:
    """The agent's loop on a clock of its own: a tick every `every` seconds from 0 to `until`."""
    for i in range(round(until / every) + 1):
        sw.tick(i * every)


@pytest.fixture
def errors() -> Iterator[list[str]]:
    """The agent's ERROR lines while the test runs."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                lines.append(record.getMessage())

    handler = Keep()
    log.addHandler(handler)
    yield lines
    log.removeHandler(handler)


def test_a_job_writing_requests_as_fast_as_it_can_gets_one_switch_per_interval() -> None:
    channel, fault = Channel(hammer=True), Fault()
    sw = switched(channel, fault)
    drive(sw, 10.0)
    times = [t for t, _ in fault.switched]
    # 200 polls a second found a new request each; 20 a second were acted on (10 s, 0.05 s apart).
    assert 150 <= len(times) <= 10.0 / agent.MIN_SWITCH_INTERVAL_S + 1, len(times)
    assert min(b - a for a, b in itertools.pairwise(times)) >= agent.MIN_SWITCH_INTERVAL_S - 1e-9
    assert len(channel.acks) == len(times) == sw.switches and sw.held_back > 0


@pytest.mark.parametrize("once", [False, True])
def test_a_request_too_soon_waits_for_the_interval_and_the_newest_is_acknowledged(once: bool) -> None:
    """What the probe relies on: every request is answered, the one that came too soon late."""
    channel, fault = Channel(once=once), Fault()
    sw = switched(channel, fault)
    channel.request = Request(1, State.ON)
    sw.tick(0.0)
    assert [(a.epoch, a.state) for a in channel.acks] == [(1, State.ON)] and sw.on
    channel.request = Request(2, State.OFF)
    for now in (0.010, 0.020, 0.049):
        sw.tick(now)
    assert len(channel.acks) == 1 and sw.next_poll == pytest.approx(agent.MIN_SWITCH_INTERVAL_S)
    sw.tick(0.050)
    assert [(a.epoch, a.state, a.error) for a in channel.acks][1:] == [(2, State.OFF, "")] and not sw.on
    channel.request = Request(3, State.ON)
    sw.tick(0.060)
    channel.request = Request(4, State.OFF)  # the job changed its mind before the interval was over
    sw.tick(0.100)
    assert [(a.epoch, a.state) for a in channel.acks][2:] == [(4, State.OFF)]
    assert fault.switched == [(0.0, True), (0.05, False), (0.1, False)]


def test_requests_beyond_the_jobs_switches_leave_the_fault_and_the_channel_unread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(agent, "MAX_SWITCHES_PER_JOB", 3)
    channel, fault = Channel(hammer=True), Fault()
    sw = switched(channel, fault)
    drive(sw, 1.0)
    assert [on for _, on in fault.switched] == [True, False, True] and sw.on
    last = channel.acks[-1]
    assert (
        len(channel.acks) == 4
        and last.state is State.ON
        and "3 switches on this node are used up" in last.error
    )
    reads = channel.reads
    drive(sw, 2.0)
    assert channel.reads == reads and len(channel.acks) == 4 and sw.next_poll == float("inf")


def test_failed_switches_are_logged_in_full_ten_times_then_summed_up_once_a_minute(
    errors: list[str],
) -> None:
    channel, fault = Channel(hammer=True), Fault(fail=True)
    sw = switched(channel, fault)
    drive(sw, 300.0, every=0.01)  # five minutes of a job that makes every switch fail
    sw.stop()
    failures = len(channel.acks)
    assert failures >= 5000 and all(a.error for a in channel.acks)
    full = [e for e in errors if "Exclusivity flag" in e and "more" not in e]
    summaries = [e for e in errors if " more (" in e]
    assert len(full) == agent.FAILURES_LOGGED
    assert 5 <= len(summaries) <= 6 and f"({failures} in all)" in summaries[-1], summaries
    assert len(errors) <= agent.FAILURES_LOGGED + 1 + 6
