"""The probe's side of a switchback schedule (#11): the physical state before each step, the one
rank per node that toggles, the request/ack flow against a real control channel with a thread
playing the agent, what the rank files record, and a real local probe run read back and judged."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import pytest

from slurm_chaos.analysis.switchback import judge_switchback_run
from slurm_chaos.errors import UsageError
from slurm_chaos.faults.control import REQUEST, Ack, ChannelOwner, Request, State, remove_channel
from slurm_chaos.probe.cli import main, parse
from slurm_chaos.probe.local import run_local
from slurm_chaos.probe.reader import Selection, read_rank, read_run
from slurm_chaos.probe.switch import FaultSwitch, Plan, StepFault, open_switch, physical_states
from slurm_chaos.probe.writer import RankWriter, StepRecord, carry_over
from slurm_chaos.schedule import DROPPED, SwitchbackSchedule, placebo_of

JOB = "4242"
ON, OFF = State.ON, State.OFF
# warm-up 2 | on 3 | off 3 | off 3 | on 3 | held on: boundaries at steps 2 (on), 5 (off), 11 (on).
SCHEDULE = SwitchbackSchedule(
    seed=7, warmup_steps=2, block_steps=(3, 3, 3, 3), assignment=(1, 0, 0, 1), min_block=3, max_block=3
)
ATTRS = {"rank": 0, "world_size": 1, "host": "nodeA", "job_id": JOB}

as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="the agent's end of the channel (ChannelOwner) makes root-owned files"
)


def test_physical_state_is_off_in_warmup_as_assigned_in_blocks_then_held_on() -> None:
    expected = [OFF] * 2 + [ON] * 3 + [OFF] * 6 + [ON] * 3 + [ON] * 4
    assert physical_states(SCHEDULE, 18) == expected
    assert physical_states(placebo_of(SCHEDULE), 18) == [OFF] * 18
    plan = Plan.of(SCHEDULE)
    assert [plan.scheduled_state(s) for s in range(16)] == [2, 2, 2, 1, 1, 2, 0, 0, 2, 0, 0, 2, 1, 1, 2, 2]


def test_a_schedule_longer_than_the_steps_or_control_without_a_schedule_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "schedule.json"
    path.write_text(SCHEDULE.dumps())
    cfg = parse(["--steps", "14", "--out", str(tmp_path), "--fault-schedule", str(path)])
    assert cfg.fault_schedule == SCHEDULE and cfg.fault_control is None and cfg.fault_ack_timeout == 1.0
    assert main(["--steps", "13", "--out", str(tmp_path), "--fault-schedule", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--fault-schedule {path}: the schedule runs 14 steps, more than --steps 13" in err
    assert main(["--steps", "20", "--out", str(tmp_path), "--fault-control", str(tmp_path)]) == 2
    assert "--fault-control: needs --fault-schedule" in capsys.readouterr().err
    path.write_text('{"design": "switchback", "schema": 1}')
    with pytest.raises(UsageError, match=r"--fault-schedule .*: seed: expected an integer"):
        parse(["--steps", "20", "--out", str(tmp_path), "--fault-schedule", str(path)])


# --- a thread playing the agent ---------------------------------------------------------------


@dataclass
class Agent:
    """Acknowledges every request, late (``delay``) or with an error (``errors``) where told."""

    owner: ChannelOwner
    delay: dict[int, float] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    seen: list[Request] = field(default_factory=list)
    state: State = OFF
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            req = self.owner.read()
            if req is None:
                time.sleep(0.002)
                continue
            self.seen.append(req)
            time.sleep(self.delay.get(req.epoch, 0.0))
            error = self.errors.get(req.epoch, "")
            self.state = self.state if error else req.state
            self.owner.acknowledge(Ack(req.epoch, self.state, time.time(), error))


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    root = tmp_path / "journal"
    for node in ("nodeA", "nodeB", "nodeC"):
        (root / node).mkdir(parents=True, mode=0o755)
    return root


@contextmanager
def _agent(journal: Path, node: str = "nodeA", **kw: dict[int, float] | dict[int, str]) -> Iterator[Agent]:
    owner = ChannelOwner.create(journal, node, JOB, os.getuid(), os.getgid())
    agent = Agent(owner, **kw)  # type: ignore[arg-type]
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        agent.stop.set()
        thread.join(5)
        owner.close()


def _steps(switch: FaultSwitch, steps: range, pause: dict[int, float] | None = None) -> list[StepFault]:
    out = []
    for s in steps:
        out.append(switch.before_step(s))
        time.sleep((pause or {}).get(s, 0.0))
    return out


def _scheduled(schedule: SwitchbackSchedule, steps: int) -> list[int]:
    plan = Plan.of(schedule)
    return [plan.scheduled_state(s) for s in range(steps)]


def _events(faults: list[StepFault]) -> list[tuple[int, str, str]]:
    return [(s, kind, detail) for s, f in enumerate(faults) for kind, detail in f.events]


@as_root
def test_exactly_the_local_rank_0_of_a_node_with_a_channel_toggles(journal: Path) -> None:
    for node in ("nodeA", "nodeB"):
        ChannelOwner.create(journal, node, JOB, 0, 0).close()
    switches = {
        (node, local): open_switch(SCHEDULE, journal, node, JOB, local)
        for node in ("nodeA", "nodeB", "nodeC")
        for local in (0, 1)
    }
    assert [k for k, s in switches.items() if s.toggles] == [("nodeA", 0), ("nodeB", 0)]
    assert [k for k, s in switches.items() if s.has_channel] == [
        ("nodeA", 0),
        ("nodeA", 1),
        ("nodeB", 0),
        ("nodeB", 1),
    ]
    assert {s.epoch for k, s in switches.items() if k[0] != "nodeC"} == {0}
    # No channel: the rank follows the schedule, records epoch -1, and never waits.
    c = _steps(switches["nodeC", 0], range(14))
    assert [f.state for f in c] == Plan.of(SCHEDULE).scheduled.tolist() and {f.epoch for f in c} == {-1}
    assert not any(f.events for f in c)
    assert not open_switch(SCHEDULE, None, "nodeA", JOB, 0).has_channel
    with pytest.raises(UsageError, match=r"--fault-control .*SLURM_JOB_ID"):
        open_switch(SCHEDULE, journal, "nodeA", "", 0)


@as_root
def test_the_toggling_rank_requests_each_change_and_the_other_ranks_see_the_same_acks(journal: Path) -> None:
    with _agent(journal) as agent:
        toggler = open_switch(SCHEDULE, journal, "nodeA", JOB, 0)
        observer = open_switch(SCHEDULE, journal, "nodeA", JOB, 1)
        mine, theirs = [], []
        for s in range(18):
            mine.append(toggler.before_step(s))
            theirs.append(observer.before_step(s))
        assert [(r.epoch, r.state) for r in agent.seen] == [(1, ON), (2, OFF), (3, ON)]
    scheduled = _scheduled(SCHEDULE, 18)
    for faults, how in ((mine, "requested"), (theirs, "observed")):
        assert [f.state for f in faults] == scheduled
        assert [f.epoch for f in faults] == [0, 0] + [1] * 3 + [2] * 6 + [3] * 7
        events = _events(faults)
        assert [(s, k) for s, k, _ in events] == [(2, "fault_on"), (5, "fault_off"), (11, "fault_on")]
        assert all(f"epoch={i + 1} ack_ms=" in d and d.endswith(how) for i, (_, _, d) in enumerate(events))
    assert float(_events(mine)[0][2].split("ack_ms=")[1].split()[0]) < 1000


@as_root
def test_a_late_ack_drops_the_steps_until_it_is_found(journal: Path) -> None:
    with _agent(journal, delay={2: 0.6}):
        toggler = open_switch(SCHEDULE, journal, "nodeA", JOB, 0, ack_timeout=0.2)
        faults = _steps(toggler, range(12), pause={6: 0.8})
    states = [f.state for f in faults]
    # Step 5 (off) timed out; step 6 still unsure; by step 7 the late ack is there.
    assert states == [2, 2, 2, 1, 1, 2, 2, 0, 2, 0, 0, 2]
    assert [f.epoch for f in faults] == [0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 3]
    (s, kind, detail), late = _events(faults)[1:3]
    assert (s, kind) == (5, "fault_error") and detail.startswith(
        "epoch=2 step=5 want=off: no ack within 0.2 s"
    )
    assert late[:2] == (7, "fault_off") and "epoch=2" in late[2] and "late ack" in late[2]


@as_root
def test_an_ack_with_an_error_drops_the_block_and_the_next_toggle_recovers(journal: Path) -> None:
    with _agent(journal, errors={1: "freezer cgroup gone"}) as agent:
        toggler = open_switch(SCHEDULE, journal, "nodeA", JOB, 0)
        observer = open_switch(SCHEDULE, journal, "nodeA", JOB, 1)
        mine, theirs = [], []
        for s in range(11):
            mine.append(toggler.before_step(s))
            theirs.append(observer.before_step(s))
        assert [r.epoch for r in agent.seen] == [1, 2]  # the next toggle, at step 5, asked again
    for faults in (mine, theirs):
        assert [f.state for f in faults] == [2, 2, 2, 2, 2, 2, 0, 0, 2, 0, 0]
        assert [f.epoch for f in faults][:6] == [0, 0, 1, 1, 1, 2]
        (s, kind, detail) = _events(faults)[0]
        assert (s, kind) == (2, "fault_error") and "epoch=1" in detail
        assert detail.endswith("want=on: agent: freezer cgroup gone")


@as_root
def test_a_vanished_channel_drops_every_later_step(journal: Path) -> None:
    with _agent(journal):
        toggler = open_switch(SCHEDULE, journal, "nodeA", JOB, 0, ack_timeout=0.2)
        faults = _steps(toggler, range(4))
    remove_channel(journal, "nodeA", JOB)
    faults += _steps(toggler, range(4, 12))
    assert [f.state for f in faults] == [2, 2, 2, 1, 1] + [2] * 7
    # Every later toggle tries again, and fails again.
    assert [(s, k) for s, k, _ in _events(faults)] == [
        (2, "fault_on"),
        (5, "fault_error"),
        (11, "fault_error"),
    ]
    assert "channel vanished" in _events(faults)[1][2]


@as_root
def test_a_placebo_never_writes_a_request(journal: Path) -> None:
    with _agent(journal) as agent:
        placebo = placebo_of(SCHEDULE)
        faults = _steps(open_switch(placebo, journal, "nodeA", JOB, 0), range(18))
        time.sleep(0.05)
        assert agent.seen == []
    assert (journal / "nodeA" / f"{JOB}.control" / REQUEST).stat().st_size == 0
    assert [f.state for f in faults] == _scheduled(placebo, 18)
    assert {f.epoch for f in faults} == {0} and not any(f.events for f in faults)


# --- the rank file ----------------------------------------------------------------------------


def _record(step: int, state: int = 2, epoch: int = -1) -> StepRecord:
    return StepRecord(step, 1000.0 + step, 0.5, 0.3, 0.1, fault_state=state, fault_epoch=epoch)


def test_fault_columns_round_trip_and_the_run_reads_its_schedule(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    attrs = ATTRS | {"world_size": 2, "fault_schedule": SCHEDULE.dumps(), "fault_first_step": 2}
    states = [[2, 2, 1, 1, 0], [2, 2, 2, 1, 0]]
    for rank in (0, 1):
        w = RankWriter(run_dir / f"rank-{rank}.h5", attrs | {"rank": rank}, fault=True)
        for s in range(5):
            w.append_step(_record(s, states[rank][s], s // 2 if rank == 0 else -1))
        w.close()
    run = read_run(run_dir)
    rk = run.ranks[0]
    assert rk.fault_state is not None and rk.fault_state.dtype == np.int8
    assert rk.fault_state.tolist() == states[0] and rk.fault_epoch is not None
    assert rk.fault_epoch.tolist() == [0, 0, 1, 1, 2] and run.ranks[1].fault_epoch.tolist() == [-1] * 5  # type: ignore[union-attr]
    assert rk.attrs["fault_first_step"] == 2 and rk.attrs["schema_version"] == 3
    assert run.fault_schedule() == SCHEDULE
    observed = run.observed_state()
    assert observed is not None and observed.dtype == np.int64 and observed.tolist() == [2, 2, 2, 1, 0]
    some = read_rank(rk.path, Selection(fields=("step_time",), fault=False, events=False))
    assert some.fault_state is None and some.fault_epoch is None


def test_a_run_without_a_schedule_and_a_schema_2_file_have_no_fault_columns(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    w = RankWriter(plain / "rank-0.h5", ATTRS)
    w.append_step(_record(0))
    w.close()
    with h5py.File(plain / "rank-0.h5", "r") as f:
        assert "fault_state" not in f["steps"]
    run = read_run(plain)
    assert run.ranks[0].fault_state is None and run.fault_schedule() is None and run.observed_state() is None
    v2 = _schema_2_file(tmp_path / "v2" / "rank-0.h5")
    rk = read_rank(v2)
    assert rk.attrs["schema_version"] == 2 and rk.step.tolist() == [0, 1, 2]
    assert rk.fault_state is None and rk.fault_epoch is None


def _schema_2_file(path: Path) -> Path:
    """As the schema-2 probe wrote it: no fault columns, no schedule attributes."""
    from slurm_chaos.probe.writer import write_attrs

    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        write_attrs(f, {"schema_version": 2, "attempt": 0, **ATTRS})
        g = f.create_group("steps")
        g.create_dataset("step", data=np.arange(3))
        g.create_dataset("attempt", data=np.zeros(3, dtype=np.int64))
        g.create_dataset("t_start", data=[1.0, 2.0, 3.0])
        g.create_dataset("step_time", data=[0.5, 0.25, 0.125])
    return path


def test_a_requeue_carries_fault_columns_over_and_fills_a_schema_2_attempts(tmp_path: Path) -> None:
    path = _schema_2_file(tmp_path / "rank-0.h5")
    carried = carry_over(path)
    assert carried is not None
    w = RankWriter(path, ATTRS, attempt=carried[0].attempts, fault=True)
    w.copy_previous(carried[1], carried[2])
    for s in (1, 2):
        w.append_step(_record(s, 1, 4))
    w.close()
    carried = carry_over(path)  # and again: this time the earlier attempt has the columns
    assert carried is not None
    w = RankWriter(path, ATTRS, attempt=carried[0].attempts, fault=True)
    w.copy_previous(carried[1], carried[2])
    w.append_step(_record(2, 0, 5))
    w.close()
    rk = read_rank(path)
    assert rk.step.tolist() == [0, 1, 2, 1, 2, 2]
    assert rk.fault_state.tolist() == [2, 2, 2, 1, 1, 0]  # type: ignore[union-attr]
    assert rk.fault_epoch.tolist() == [-1, -1, -1, 4, 4, 5]  # type: ignore[union-attr]


# --- a real local run -------------------------------------------------------------------------


@pytest.mark.spawns
@as_root
def test_a_local_probe_run_toggles_records_and_is_judged_on_its_schedule(
    tmp_path: Path, journal: Path
) -> None:
    schedule_file = tmp_path / "schedule.json"
    schedule_file.write_text(SCHEDULE.dumps())
    out = tmp_path / "out"
    args = ["--steps", "18", "--out", str(out), "--progress-every", "0", "--flush-interval", "0.2"]
    args += ["--fault-schedule", str(schedule_file), "--fault-control", str(journal)]
    env = {"SLURM_JOB_ID": JOB, "SLURMD_NODENAME": "nodeA"}
    with _agent(journal) as agent:
        results = run_local(2, args, timeout=240, extra_env=env)
        assert all(r.returncode == 0 for r in results), "\n".join(r.stderr[-2000:] for r in results)
        assert [(r.epoch, r.state) for r in agent.seen] == [(1, ON), (2, OFF), (3, ON)]
    run = read_run(out)
    scheduled = _scheduled(SCHEDULE, 18)
    for rk, how in zip(run.ranks, ("requested", "observed"), strict=True):
        assert rk.fault_state is not None and rk.fault_state.tolist() == scheduled
        assert rk.fault_epoch is not None
        assert rk.fault_epoch.tolist() == [0, 0] + [1] * 3 + [2] * 6 + [3] * 7
        assert rk.attrs["fault_schedule"] == SCHEDULE.dumps() and rk.attrs["fault_first_step"] == 2
        toggles = [(e.kind, e.detail.split()[0]) for e in rk.events if e.kind.startswith("fault_")]
        assert toggles == [("fault_on", "epoch=1"), ("fault_off", "epoch=2"), ("fault_on", "epoch=3")]
        assert all(e.detail.endswith(how) for e in rk.events if e.kind.startswith("fault_"))
    schedule = run.fault_schedule()
    observed = run.observed_state()
    assert schedule == SCHEDULE and observed is not None and observed.tolist() == scheduled
    result = judge_switchback_run(run, schedule, observed_state=observed)
    assert result.pairs == 2 and not result.placebo
    assert result.dropped_steps == scheduled.count(DROPPED)
