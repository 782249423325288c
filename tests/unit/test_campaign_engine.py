"""The campaign engine against a fake Scheduler and a fake clock: no cluster, no sleeping."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_chaos import rundir
from slurm_chaos.campaign import controller, engine, remediation
from slurm_chaos.campaign.commands import Connection, Options, start
from slurm_chaos.campaign.engine import Campaign, open_campaign, run_campaign, run_experiment
from slurm_chaos.campaign.progress import Progress
from slurm_chaos.clock import FakeClock
from slurm_chaos.errors import ChaosError, UsageError
from slurm_chaos.experiment import load_experiment
from slurm_chaos.observe.healthcheck import REASON_PREFIX as HEALTHCHECK_PREFIX
from slurm_chaos.placement import NodeRank
from slurm_chaos.render import fault_schedule, switchback_seed
from slurm_chaos.rundir import Expectation, InjectionRecord
from slurm_chaos.rundir.injections import write_record_file
from slurm_chaos.schedule import schedule_from_json
from slurm_chaos.site import Site, load_site
from slurm_chaos.slurm.fake import FakeScheduler, Submission, idle_nodes
from slurm_chaos.slurm.model import JobInfo, JobState

DATA = Path(__file__).resolve().parent.parent / "data"
GOLDEN = DATA / "sites" / "golden.yaml"
NODES = ("n01", "n02")


def running(n: int, nodes: tuple[str, ...] = NODES, restarts: int = 0) -> list[JobInfo]:
    return [JobInfo("", "job", JobState.RUNNING, nodes=nodes, restarts=restarts)] * n


def simple(sub: Submission) -> list[JobInfo]:
    """Queued for one poll, runs for a while (long enough for a fault due after 6 s), completes."""
    return [
        JobInfo("", "job", JobState.PENDING),
        *running(40),
        JobInfo("", "job", JobState.COMPLETED, nodes=NODES),
    ]


@pytest.fixture
def site() -> Site:
    return load_site(GOLDEN)


@pytest.fixture
def fake() -> FakeScheduler:
    nodes = {n: replace(i, features=("gpu",)) for n, i in idle_nodes(0).items()}
    nodes.update({f"n{i:02d}": idle_nodes(1, f"n{i:02d}-")[f"n{i:02d}-0"] for i in range(1, 9)})
    nodes = {name: replace(info, name=name, features=("gpu", "fast")) for name, info in nodes.items()}
    return FakeScheduler(node_table=nodes, lifecycle=simple)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


STEPS_PER_S = 20.0


class FakeProbe:
    """A job's probe as the engine reads its progress: STEPS_PER_S steps a second of the fake clock,
    from the first time the engine asks about its directory (the job is running by then)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.first: dict[Path, float] = {}

    def __call__(self, job_dir: Path) -> int | None:
        t0 = self.first.setdefault(job_dir, self.clock.time())
        return int((self.clock.time() - t0) * STEPS_PER_S)


def campaign(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path, *names: str, **kw: object
) -> Campaign:
    exps = [load_experiment(n) for n in names]
    camp = open_campaign(
        site,
        exps,
        tmp_path / "run",
        resume=bool(kw.pop("resume", False)),
        scheduler=fake,
        control=controller.SlurmNodeControl(fake),
        kind="campaign",
        progress=Progress(quiet=True),
        clock=clock,
        **kw,  # type: ignore[arg-type]
    )
    camp.probe_step = FakeProbe(clock)
    return camp


def observations(camp: Campaign, name: str) -> rundir.ObservationLog:
    return rundir.load_observations(rundir.experiment_dir(camp.run_dir, name) / rundir.OBSERVATIONS)


# ------------------------------------------------------------------ the stages


def test_drain_is_injected_when_due_requeued_and_rolled_back(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    camp = campaign(site, fake, clock, tmp_path, "node-drain-requeue")
    run_experiment(camp, camp.experiments[0])
    baseline, fault = (s.job_id for s in fake.submissions)
    (drained,) = fake.called("drain")
    assert drained[0] == "n02"  # node=1 of the job's nodes
    assert fake.called("requeue") == [((fault,),)]
    assert ("n02",) in fake.called("resume")  # rolled back
    assert "DRAIN" not in fake.node_table["n02"].state
    assert controller.ControllerJournal(camp.run_dir / rundir.CONTROLLER_JOURNAL).pending() == []
    job = camp.manifest.job("node-drain-requeue", "fault")
    assert job is not None and job.state == JobState.COMPLETED and job.started is not None
    log = observations(camp, "node-drain-requeue")
    # The fault window starts at the injection: when the probe reached step 60 (3 s into the job
    # here), not at the job's start; the engine looks at the probe every 0.5 s meanwhile.
    assert job.started + 3 <= log.fault_window.start <= job.started + 3 + 0.5
    assert not log.crashed
    assert log.expectation.remediation == ("requeue", "resume")
    assert camp.manifest.completed == camp.manifest.experiments == ["node-drain-requeue"]
    assert rundir.read_manifest(camp.run_dir).job("node-drain-requeue", "fault") == job
    assert not any("fault_injected_at" in k for k in camp.manifest.timings)
    assert fake.state_of(baseline).state == JobState.COMPLETED


def test_observations_record_the_spec_the_job_got(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    camp = campaign(site, fake, clock, tmp_path, "checkpoint-enospc")
    run_experiment(camp, camp.experiments[0])
    spec = observations(camp, "checkpoint-enospc").fault
    # The experiment says ckpt-enospc:path=${checkpoint_dir}; the job got the fault run's own path.
    assert "${" not in spec and spec.startswith("ckpt-enospc:path=/"), spec
    fault_dir = rundir.experiment_dir(camp.run_dir, "checkpoint-enospc") / "fault"
    assert f"--chaos={spec}" in (fault_dir.parent / "fault.sbatch").read_text()


def test_each_tick_asks_once_per_kind_and_backs_off(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    camp = campaign(site, fake, clock, tmp_path, "control-aa")
    before = fake.queries.copy()
    job = engine.submit(camp, camp.experiments[0], rundir.Role.FAULT, "control-aa", tmp_path / "f")
    watcher = engine.Watcher(fake, job.job_id, None, clock)
    clock.sleeps.clear()
    watched = engine.watch(camp, job, "control-aa", watcher)
    polls = fake.queries["poll"] - before["poll"]
    node_queries = fake.queries["nodes"] - before["nodes"]
    assert watched.final.state == JobState.COMPLETED
    assert polls == len(clock.sleeps) + 1  # one poll per tick
    assert node_queries <= polls  # and at most one node query, whatever the node count
    # Nothing changes while it runs: the wait grows from 0.5 s to its cap.
    assert clock.sleeps[0] == 0.5 and max(clock.sleeps) == 2.0
    assert polls < 45


def test_a_job_that_never_ends_is_cancelled(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    fake.lifecycle = lambda sub: running(1)
    camp = campaign(site, fake, clock, tmp_path, "control-aa")
    with pytest.raises(ChaosError, match=r"did not finish within 720 s \(.*\); cancelled"):
        run_campaign(camp)
    (job,) = (s.job_id for s in fake.submissions)
    assert fake.called("cancel")[-1] == ((job,),)
    assert camp.manifest.finished is not None


@pytest.mark.parametrize(("time_limit", "limit_s"), [("30", 30 * 60), ("1-02", 26 * 3600)])
def test_the_campaign_waits_slurms_own_limit_plus_grace(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path, time_limit: str, limit_s: int
) -> None:
    """A bare number is minutes and D-HH is days and hours, as Slurm reads them: a site that writes
    its limit so never has a job cancelled by the campaign before Slurm would end it."""
    site = replace(site, slurm=replace(site.slurm, time_limit=time_limit))
    fake.lifecycle = lambda sub: running(1)
    camp = campaign(site, fake, clock, tmp_path, "control-aa")
    t0 = clock.monotonic()
    with pytest.raises(ChaosError, match=f"did not finish within {limit_s + 120} s .*{time_limit!r}"):
        run_campaign(camp)
    assert clock.monotonic() - t0 >= limit_s + 120


def test_the_limit_runs_from_the_jobs_start_not_its_submission(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    """Time spent pending is not Slurm's run time: a job that waited in the queue for most of its
    limit (600 s of 720) still gets its whole limit once it runs."""
    fake.lifecycle = lambda sub: [JobInfo("", "job", JobState.PENDING)] * 300 + running(1)
    camp = campaign(site, fake, clock, tmp_path, "control-aa")
    with pytest.raises(ChaosError, match="did not finish within 720 s"):
        run_campaign(camp)
    (job,) = camp.manifest.jobs
    assert job.started is not None and clock.time() - job.started >= 720
    assert job.started - job.submitted >= 500  # it did wait in the queue first


# ------------------------------------------------------------------ rollback on every path


def test_interrupt_while_watching_cancels_and_rolls_back(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    camp = campaign(site, fake, clock, tmp_path, "node-drain-requeue")
    ticks = 0
    real_poll = fake.poll

    def poll(ids: Sequence[str]) -> dict[str, JobInfo]:
        nonlocal ticks
        if fake.called("drain"):
            ticks += 1
            if ticks == 3:
                raise KeyboardInterrupt
        return real_poll(ids)

    fake.poll = poll  # type: ignore[method-assign]
    assert run_campaign(camp) is False
    fault = fake.submissions[-1].job_id
    assert ((fault,),) in fake.called("cancel")
    assert "DRAIN" not in fake.node_table["n02"].state
    assert "rolled back drain n02" in capsys.readouterr().err
    manifest = rundir.read_manifest(camp.run_dir)
    assert manifest.interrupted and manifest.completed == []


def test_an_error_while_watching_still_rolls_back(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    camp = campaign(site, fake, clock, tmp_path, "node-drain-requeue")
    real_requeue = fake.requeue

    def refuse(ids: Sequence[str]) -> None:
        real_requeue(ids)
        raise ChaosError("requeue refused")

    fake.requeue = refuse  # type: ignore[method-assign]
    with pytest.raises(ChaosError, match="requeue refused"):
        run_experiment(camp, camp.experiments[0])
    assert fake.called("drain") and ("n02",) in fake.called("resume")
    assert "DRAIN" not in fake.node_table["n02"].state


def test_a_failed_rollback_stays_pending_for_cleanup(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    camp = campaign(site, fake, clock, tmp_path, "node-drain-requeue")

    def resume(node: str) -> None:
        raise ChaosError("controller down")

    fake.resume = resume  # type: ignore[method-assign]
    run_experiment(camp, camp.experiments[0])
    (left,) = camp.journal.pending()
    assert (left.kind, left.node) == (controller.ActionKind.DRAIN, "n02")


def test_a_refused_submission_names_the_plugin(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    camp = campaign(site, fake, clock, tmp_path, "control-aa")
    fake.fail_submit = "sbatch: unrecognized option '--chaos=gpu-throttle'"
    with pytest.raises(ChaosError, match="SPANK plugin is not loaded"):
        run_campaign(camp)


def test_stop_cancels_waits_and_settles(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    camp = campaign(site, fake, clock, tmp_path, "control-aa")
    camp.active.add("7")
    fake.drain("n03", f"{HEALTHCHECK_PREFIX} gpu: hot")
    engine.stop(camp)
    assert fake.called("cancel")[0] == (("7",),)
    assert ("n03",) in fake.called("resume")  # the health check never resumed it
    assert clock.now - 1_700_000_000.0 >= engine.SETTLE_TIMEOUT_S
    assert not camp.active


# ------------------------------------------------------------------ requeue, resume, time budget


def requeued(before: int, after: int, nodes: tuple[str, ...]) -> Callable[[Submission], list[JobInfo]]:
    """A fault job that runs for `before` polls, is requeued, then runs `after` polls on `nodes`."""

    def lifecycle(sub: Submission) -> list[JobInfo]:
        if sub.script is None or "fault" not in sub.script.name:
            return simple(sub)
        return [
            JobInfo("", "job", JobState.PENDING),
            *running(before),
            JobInfo("", "job", JobState.REQUEUED, nodes=NODES, restarts=1),
            JobInfo("", "job", JobState.PENDING, restarts=1),
            *running(after, nodes, restarts=1),
            JobInfo("", "job", JobState.COMPLETED, nodes=nodes, restarts=1),
        ]

    return lifecycle


# A fault job that loses its rack: requeued, then runs again under the other switch.
requeued_once = requeued(10, 5, ("n05", "n06"))


def test_requeue_is_watched_through_and_the_new_switch_checked(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    fake.lifecycle = requeued_once
    camp = campaign(site, fake, clock, tmp_path, "rack-loss")
    run_experiment(camp, camp.experiments[0])
    lost = {args[0] for args in fake.called("mark_down")}
    assert lost == {"n01", "n02", "n03", "n04"}  # the whole first switch
    assert {args[0] for args in fake.called("resume")} >= lost
    signals = [o.signal for o in observations(camp, "rack-loss").observations]
    assert {"node_down", "job_requeued", "job_rescheduled", "rescheduled_same_switch"} <= set(signals)
    assert signals.index("job_requeued") < signals.index("job_rescheduled")
    job = camp.manifest.job("rack-loss", "fault")
    assert job is not None and job.restarts == 1 and job.nodes == ("n05", "n06")


def test_resume_runs_only_what_is_left(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    camp = campaign(site, fake, clock, tmp_path, "control-aa", "node-drain-requeue")
    real_submit = fake.submit
    calls = 0

    def submit_then_interrupt(script: Path, args: Sequence[str] = (), env: object = None) -> str:
        nonlocal calls
        calls += 1
        if calls == 3:  # node-drain-requeue's fault job (its baseline is shared with control-aa)
            raise KeyboardInterrupt
        return real_submit(script, args, env)  # type: ignore[arg-type]

    fake.submit = submit_then_interrupt  # type: ignore[method-assign,assignment]
    assert run_campaign(camp) is False
    assert rundir.read_manifest(camp.run_dir).completed == ["control-aa"]
    fake.submit = real_submit  # type: ignore[method-assign]
    before = len(fake.submissions)
    again = campaign(site, fake, clock, tmp_path, "control-aa", "node-drain-requeue", resume=True)
    assert run_campaign(again) is True
    new = fake.submissions[before:]
    assert [s.script.name for s in new if s.script] == ["fault.sbatch"]  # no second baseline
    assert again.manifest.experiments == ["control-aa", "node-drain-requeue"]
    assert again.manifest.switches == camp.manifest.switches != {}


def test_time_budget_leaves_the_rest_for_resume(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    camp = campaign(site, fake, clock, tmp_path, "control-aa", "node-drain-requeue", time_budget_s=10.0)
    assert run_campaign(camp) is False
    manifest = rundir.read_manifest(camp.run_dir)
    assert manifest.interrupted and manifest.completed == ["control-aa"]
    assert manifest.planned == ["control-aa", "node-drain-requeue"]


def test_start_takes_the_cluster_it_is_given(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    opts = Options(site=GOLDEN, out=tmp_path / "run", quiet=True)
    camp = start(
        opts,
        [load_experiment("control-aa")],
        None,
        "run",
        lambda s: Connection(fake, controller.SlurmNodeControl(fake), clock),
    )
    assert isinstance(camp, Campaign)
    assert camp.manifest.started == clock.now and camp.manifest.slurm_version == fake.slurm_version
    assert run_campaign(camp) is True
    # Which switch each node hangs off, from the site's racks, for the report once the site is gone.
    recorded = rundir.read_manifest(camp.run_dir).switches
    assert recorded["n01"] == "leafA" and recorded["n08"] == "leafB" and len(recorded) == 8


# ------------------------------------------------------------------ remediation checks


def slow_n02(dirs: Sequence[Path]) -> list[NodeRank]:
    return [NodeRank("n02", 0.5, 2, True, 2), NodeRank("n01", 1.0, 2, False, 1)]


def placed_on(nodes: tuple[str, ...]):  # type: ignore[no-untyped-def]
    def lifecycle(sub: Submission) -> list[JobInfo]:
        if sub.command is None:
            return simple(sub)
        return [JobInfo("", "wrap", JobState.PENDING), JobInfo("", "wrap", JobState.RUNNING, nodes=nodes)]

    return lifecycle


@pytest.mark.parametrize(("nodes", "avoided"), [(("n01", "n03"), True), (("n01", "n02"), False)])
def test_avoid_slow_node_marks_it_checks_placement_and_restores(
    site: Site,
    fake: FakeScheduler,
    clock: FakeClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    nodes: tuple[str, ...],
    avoided: bool,
) -> None:
    monkeypatch.setattr(remediation, "rank_nodes", slow_n02)
    fake.lifecycle = placed_on(nodes)
    before = dict(fake.node_table)
    camp = campaign(site, fake, clock, tmp_path, "known-slow-node")
    run_experiment(camp, camp.experiments[0])
    assert ("n02", 2, ("gpu",)) in fake.called("update_node")  # slow: heavier, not fast
    (wrap,) = [s for s in fake.submissions if s.command is not None]
    assert "--constraint=fast" in wrap.args and "--reservation=maint" in wrap.args
    assert ((wrap.job_id,),) in fake.called("cancel")
    signals = [o.signal for o in observations(camp, "known-slow-node").observations]
    assert "slow_node_identified" in signals
    assert ("avoided_slow_node" in signals) is avoided
    assert fake.node_table == before  # weights and features restored


def test_avoid_slow_node_is_skipped_when_the_job_crashed(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remediation, "rank_nodes", slow_n02)
    fake.lifecycle = lambda sub: [*running(2), JobInfo("", "job", JobState.FAILED, nodes=NODES)]
    camp = campaign(site, fake, clock, tmp_path, "known-slow-node")
    # The baseline would fail first: run the fault job's stages by hand.
    p = engine.plan(camp, camp.experiments[0])
    job = engine.submit(camp, camp.experiments[0], rundir.Role.FAULT, "known-slow-node", p.exp_dir / "fault")
    watched = engine.watch(camp, job, "known-slow-node")
    log = engine.collect(camp, p, watched)
    assert log.crashed and not fake.called("update_node") and not fake.called("submit_wrap")


def test_a_failing_check_still_restores_the_settings(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remediation, "rank_nodes", slow_n02)
    camp = campaign(site, fake, clock, tmp_path, "known-slow-node")
    before = dict(fake.node_table)
    real = fake.submit_wrap

    def refused(command: str, args: Sequence[str] = (), env: object = None) -> str:
        fake.fail_submit = (
            "sbatch: error: Batch job submission failed: Requested node configuration is not available"
        )
        return real(command, args, env)  # type: ignore[arg-type]

    fake.submit_wrap = refused  # type: ignore[method-assign,assignment]
    with pytest.raises(ChaosError, match="placement check job was refused"):
        run_experiment(camp, camp.experiments[0])
    assert fake.node_table == before
    assert camp.journal.pending() == []


def test_every_remediation_check_is_keyed_by_the_schema() -> None:
    schema = json.loads(
        (Path(remediation.__file__).parents[1] / "schemas" / "experiment.schema.json").read_text()
    )
    names = schema["properties"]["expect"]["properties"]["remediation"]["items"]["enum"]
    assert sorted(names) == sorted(r.value for r in remediation.Remediation)
    assert set(remediation.CHECKS) <= set(remediation.Remediation)


def test_settle_waits_for_the_health_check(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    camp = campaign(site, fake, clock, tmp_path, "control-aa")
    fake.drain("n01", f"{HEALTHCHECK_PREFIX} numa: mismatch")
    real_nodes = fake.nodes

    def nodes(names: object = None) -> dict[str, object]:
        if len(fake.called("nodes")) >= 3:
            fake.node_table["n01"] = replace(fake.node_table["n01"], state=frozenset({"IDLE"}), reason="")
        return real_nodes(names)  # type: ignore[arg-type,return-value]

    fake.nodes = nodes  # type: ignore[method-assign,assignment]
    assert engine.settle(camp, ["n01", "n02"]) == []
    assert not fake.called("resume")


def test_a_fault_waiting_for_the_start_keeps_polling_fast(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    fake.lifecycle = lambda sub: [*[JobInfo("", "job", JobState.PENDING)] * 10, *simple(sub)]
    camp = campaign(site, fake, clock, tmp_path, "node-drain-requeue")
    exp = camp.experiments[0]
    exp = replace(exp, fault=replace(exp.fault, spec="node-drain:after=6s,node=1"))  # a timer
    p = engine.plan(camp, exp)
    job = engine.submit(camp, exp, rundir.Role.FAULT, "node-drain-requeue", p.exp_dir / "fault")
    clock.sleeps.clear()
    watched = engine.watch(camp, job, "node-drain-requeue", None, exp, p.faults)
    assert clock.sleeps[:11] == [0.5] * 11  # pending: the start is seen within half a second
    (injection,) = watched.injections
    assert watched.job.started is not None
    assert injection.at - watched.job.started == pytest.approx(6.0)  # exactly when due
    assert injection.nodes == ("n02",) and injection.requeued


def test_a_fault_due_at_a_step_waits_for_the_probe_however_long_the_job_takes(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    """node-drain:at_step=60 fires once the probe has flushed step 60, never before: a slow start
    (here 5 s of rendezvous with no step) delays it, where a timer would have fired regardless."""
    camp = campaign(site, fake, clock, tmp_path, "node-drain-requeue")
    first: dict[Path, float] = {}

    def slow_start(job_dir: Path) -> int | None:
        ran = clock.time() - first.setdefault(job_dir, clock.time()) - 5.0
        return None if ran < 0 else int(ran * STEPS_PER_S)

    camp.probe_step = slow_start
    exp = camp.experiments[0]
    p = engine.plan(camp, exp)
    (fault,) = p.faults
    assert (fault.at_step, fault.after_s) == (60, 0.0)
    job = engine.submit(camp, exp, rundir.Role.FAULT, exp.name, p.exp_dir / "fault")
    clock.sleeps.clear()
    watched = engine.watch(camp, job, exp.name, None, exp, p.faults, p.exp_dir / "fault")
    (injection,) = watched.injections
    assert watched.job.started is not None
    # 5 s without a step, then 60 steps at 20 a second: 8 s into the job (polled every 0.5 s).
    assert 8.0 <= injection.at - watched.job.started <= 8.5
    assert set(clock.sleeps[: int(8 / 0.5)]) == {0.5}  # a step is waited for at the shortest poll


def test_a_spec_with_both_a_delay_and_a_step_is_refused(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    exp = load_experiment("node-drain-requeue")
    exp = replace(exp, fault=replace(exp.fault, spec="node-drain:after=6s,at_step=60,node=1"))
    with pytest.raises(UsageError, match="give after or at_step, not both"):
        open_campaign(
            site,
            [exp],
            tmp_path / "run",
            resume=False,
            scheduler=fake,
            control=controller.SlurmNodeControl(fake),
            kind="campaign",
            progress=Progress(quiet=True),
            clock=clock,
        )
    assert fake.submissions == [] and not (tmp_path / "run").exists()


# A fault job that keeps running (held) until it is requeued off its drained node.
requeued_after_drain = requeued(30, 30, ("n03", "n04"))


def test_a_held_fault_job_is_released_once_what_it_waits_for_was_seen(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    """The fault job trains on after its steps; the engine releases it once the requeue it waits
    for (detection and remediation) was seen, not before, and the baseline never holds."""
    fake.lifecycle = requeued_after_drain
    camp = campaign(site, fake, clock, tmp_path, "node-drain-requeue")
    exp = camp.experiments[0]
    release = rundir.experiment_dir(camp.run_dir, exp.name) / "fault" / rundir.RELEASE
    seen_at: list[float] = []
    real_poll = fake.poll

    def poll(ids: Sequence[str]) -> dict[str, JobInfo]:
        out = real_poll(ids)
        if release.exists() and not seen_at:
            seen_at.append(clock.time())
        return out

    fake.poll = poll  # type: ignore[method-assign]
    run_experiment(camp, exp)
    script = (release.parent.parent / "fault.sbatch").read_text()
    assert f"--hold-file {release}" in script and "--hold-max-s 150" in script
    assert "--hold" not in next((camp.run_dir / "baselines").glob("*.sbatch")).read_text()
    log = observations(camp, exp.name)
    (requeued,) = [o for o in log.observations if o.signal == "job_requeued"]
    assert release.exists() and seen_at and seen_at[0] >= requeued.time


def test_a_held_fault_job_whose_injection_took_nowhere_is_released_without_waiting(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    """A GPU fault on nodes without GPUs: once both nodes' records say it did not take (copied
    before the probe), the job is released, not held to its 60 s deadline; the verdict is NO EFFECT
    whatever it waited for."""
    fault_jobs: set[str] = set()

    def lifecycle(sub: Submission) -> list[JobInfo]:
        if sub.script is None or sub.script.name != "fault.sbatch":
            return simple(sub)
        fault_jobs.add(sub.job_id)
        return running(1000)

    fake.lifecycle = lifecycle
    camp = campaign(site, fake, clock, tmp_path, "gpu-ecc")
    exp = camp.experiments[0]
    fault_dir = rundir.experiment_dir(camp.run_dir, exp.name) / "fault"
    release = fault_dir / rundir.RELEASE
    t0 = clock.time()
    polled: dict[str, float] = {}
    released_at: list[float] = []
    real_poll = fake.poll

    def write(node: str, took: bool) -> None:
        record = InjectionRecord(
            "gpu-ecc", node, took, f"gpu-ecc: no GPU on {node}: nothing was injected", t0
        )
        (fault_dir / rundir.INJECTIONS).mkdir(parents=True, exist_ok=True)
        write_record_file(fault_dir / rundir.INJECTIONS / f"{node}.json", node, (record,))

    def poll(ids: Sequence[str]) -> dict[str, JobInfo]:
        out = real_poll(ids)
        if not fault_jobs & set(ids):
            return out
        began = polled.setdefault("fault", clock.time())
        if clock.time() - began > 5:
            write("n01", False)  # one node's record: not yet
        if clock.time() - began > 12 and not (fault_dir / rundir.INJECTIONS / "n02.json").exists():
            assert not release.exists()
            write("n02", False)
        if release.exists():
            released_at.append(clock.time() - began)
            return {i: replace(info, state=JobState.COMPLETED) for i, info in out.items()}
        return out

    fake.poll = poll  # type: ignore[method-assign]
    run_experiment(camp, exp)
    assert released_at and 12 < released_at[0] < 20


def test_a_fault_that_took_somewhere_or_not_yet_everywhere_holds_on(tmp_path: Path) -> None:
    from slurm_chaos.campaign.hold import Hold, injected_nowhere, nothing_injected

    def rec(node: str, took: bool, fault: str = "gpu-xid") -> InjectionRecord:
        return InjectionRecord(fault, node, took, f"{fault} on {node}: {'took' if took else 'no GPU'}", 1.0)

    nodes = ("n01", "n02")
    both = (rec("n01", False), rec("n02", False))
    assert nothing_injected(both, nodes, {"gpu-xid"})
    assert not nothing_injected(both[:1], nodes, {"gpu-xid"})  # n02 has not written yet
    assert not nothing_injected((*both, rec("n03", True)), nodes, {"gpu-xid"})
    # A SPEC with two recording faults: the delayed one has not reported yet.
    assert not nothing_injected(both, nodes, {"gpu-xid", "gpu-throttle"})
    assert not nothing_injected(both, (), {"gpu-xid"}) and not nothing_injected(both, nodes, ())
    hold = Hold(Expectation(), frozenset({"gpu-xid"}))
    assert injected_nowhere(hold, tmp_path, nodes) == ""  # no records at all
    (tmp_path / rundir.INJECTIONS).mkdir()
    for r in both:
        write_record_file(tmp_path / rundir.INJECTIONS / f"{r.node}.json", r.node, (r,))
    assert injected_nowhere(hold, tmp_path, nodes) == "gpu-xid on n01: no GPU; gpu-xid on n02: no GPU"
    assert injected_nowhere(Hold(Expectation()), tmp_path, nodes) == ""  # a SPEC that keeps no record
    (tmp_path / rundir.INJECTIONS / "n02.json").write_text('{"node": "n02", "inj')  # being written
    assert injected_nowhere(hold, tmp_path, nodes) == ""


def test_a_held_job_waits_at_most_the_deadline_for_a_signal_that_never_comes(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    from slurm_chaos.campaign.hold import GRACE_S, release_due
    from slurm_chaos.rundir import Expectation, Observation

    e = Expectation(
        expect_regression=False,
        detect_signals=("alert_firing:ChaosCheckpointFailing", "healthcheck_drain"),
        detect_within_s=90.0,
        remediation=("drain", "resume", "avoided_slow_node"),
        remediate_within_s=120.0,
    )
    t0 = 1000.0
    assert not release_due(e, None, (), t0 + 1e6)  # the fault has not begun
    assert not release_due(e, t0, (), t0 + 90 + GRACE_S - 1)
    drained = Observation("healthcheck_drain", t0 + 10, "node1")
    # The drain is both the detection and the remediation; resume and placement are not waited for.
    assert release_due(e, t0, (drained,), t0 + 11)
    # A signal from before the fault does not count.
    assert not release_due(e, t0, (Observation("healthcheck_drain", t0 - 1, ""),), t0 + 11)
    # One Slurm timed in whole seconds (its reason time) may read up to a second early.
    rounded = Observation("healthcheck_drain", t0 - 0.7, "", resolution_s=1.0)
    assert release_due(e, t0, (rounded,), t0 + 11)
    assert not release_due(e, t0, (replace(rounded, time=t0 - 5),), t0 + 11)
    # Nothing seen: released once the longest deadline (remediation, 120 s) plus the grace passed.
    alert = Observation("alert_firing:ChaosCheckpointFailing", t0 + 20, "")
    assert not release_due(e, t0, (alert,), t0 + 100)
    assert release_due(e, t0, (alert,), t0 + 120 + GRACE_S)


# ------------------------------------------------------------------ switchback

SWITCHBACK = DATA / "experiments" / "slow-rank-switchback.yaml"
BETWEEN = DATA / "experiments" / "slow-rank-between-runs.yaml"


def test_a_switchback_experiment_writes_its_schedule_and_runs_no_baseline(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    camp = campaign(site, fake, clock, tmp_path, str(SWITCHBACK))
    exp = camp.experiments[0]
    real = fake.submit
    seen: list[tuple[str, bool]] = []

    def submit(script: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str:
        seen.append((script.name, (script.parent / "fault" / rundir.SCHEDULE).is_file()))
        return real(script, args, env)

    monkeypatch.setattr(fake, "submit", submit)
    run_experiment(camp, exp)
    # One job, the fault job, submitted once its schedule was in place; no baseline at all.
    assert seen == [("fault.sbatch", True)]
    exp_dir = rundir.experiment_dir(camp.run_dir, exp.name)
    assert not (camp.run_dir / "baselines").exists() and not (exp_dir / "baseline").exists()
    assert camp.manifest.job(exp.name, "baseline") is None
    # The schedule is the one drawn from the run id and the experiment's name, its seed recorded.
    raw = rundir.read_schedule(exp_dir / "fault")
    assert raw is not None and raw["seed"] == switchback_seed(camp.manifest.run_id, exp.name)
    assert schedule_from_json(raw) == fault_schedule(site, exp, camp.manifest.run_id)
    script = (exp_dir / "fault.sbatch").read_text()
    assert f"--fault-schedule {exp_dir / 'fault' / rundir.SCHEDULE}" in script
    # The held job and the observations go on as before.
    assert "--hold-file" in script
    log = observations(camp, exp.name)
    assert log.fault == "slow-rank:rank=1,percent=60,control=switchback"
    assert camp.manifest.completed == [exp.name]


def test_a_resumed_switchback_experiment_gets_the_same_schedule(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    camp = campaign(site, fake, clock, tmp_path, str(SWITCHBACK))
    run_experiment(camp, camp.experiments[0])
    fault_dir = rundir.experiment_dir(camp.run_dir, camp.experiments[0].name) / "fault"
    first = rundir.read_schedule(fault_dir)
    again = campaign(site, fake, clock, tmp_path, str(SWITCHBACK), resume=True)
    run_experiment(again, again.experiments[0])
    assert rundir.read_schedule(fault_dir) == first


def test_a_between_runs_experiment_has_no_schedule(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    camp = campaign(site, fake, clock, tmp_path, str(BETWEEN))
    run_experiment(camp, camp.experiments[0])
    assert [s.script.name for s in fake.submissions if s.script] == [
        "n2-t2-s300-train.sbatch",
        "fault.sbatch",
    ]
    assert (
        rundir.read_schedule(rundir.experiment_dir(camp.run_dir, "slow-rank-between-runs") / "fault") is None
    )


def test_the_plan_names_the_design_and_no_baseline_for_a_switchback_experiment(site: Site) -> None:
    from slurm_chaos.campaign.commands import describe_plan

    plan = describe_plan(site, [load_experiment(str(SWITCHBACK)), load_experiment(str(BETWEEN))])
    assert "baseline n2-t2-s300-train: shared by slow-rank-between-runs\n" in plan
    rows = {line.split()[0]: line.split()[3] for line in plan.split("\nEXPERIMENT")[1].splitlines()[1:]}
    assert rows == {"slow-rank-switchback": "switchback", "slow-rank-between-runs": "between-runs"}


# ------------------------------------------------------------------ calibration runs


def test_a_placebos_calibration_runs_follow_schedules_of_their_own(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    camp = campaign(site, fake, clock, tmp_path, "control-aa")
    (exp,) = camp.experiments
    seeds = []
    for i in range(3):
        job_dir = engine.run_unfaulted(camp, exp, f"aa:{i}", rundir.aa_dir(camp.run_dir, i), f"A/A {i}", i)
        recorded = rundir.read_schedule(job_dir)
        assert recorded is not None
        schedule = schedule_from_json(recorded)
        assert schedule.placebo and schedule == fault_schedule(site, exp, camp.manifest.run_id, i)
        seeds.append(schedule.seed)
        script = (job_dir.parent / f"{job_dir.name}.sbatch").read_text()
        assert f"--fault-schedule {job_dir / rundir.SCHEDULE}" in script
        assert "--chaos" not in script and "--fault-control" not in script  # nothing is toggled
    assert len(set(seeds)) == 3 and len(fake.submissions) == 3
    # the campaign's own control-aa job keeps the schedule it always had
    assert fault_schedule(site, exp, camp.manifest.run_id).seed == switchback_seed(
        camp.manifest.run_id, exp.name
    )
    # a resumed calibration does not run a completed replicate again
    engine.run_unfaulted(camp, exp, "aa:0", rundir.aa_dir(camp.run_dir, 0), "A/A 0", 0)
    assert len(fake.submissions) == 3


def test_only_an_unfaulted_experiment_runs_as_a_placebo(
    site: Site, fake: FakeScheduler, clock: FakeClock, tmp_path: Path
) -> None:
    camp = campaign(site, fake, clock, tmp_path, "slow-rank")
    with pytest.raises(UsageError, match="has a fault: only an unfaulted experiment runs as a placebo"):
        engine.run_unfaulted(camp, camp.experiments[0], "aa:0", rundir.aa_dir(camp.run_dir, 0), "A/A 0", 0)
    assert fake.submissions == []
