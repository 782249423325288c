"""SlurmCLI with a FakeRunner replaying recorded Slurm output: argv, query count, error mapping."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_chaos.errors import SlurmError, SlurmUnreachable
from slurm_chaos.runner import Completed, FakeRunner
from slurm_chaos.slurm import select
from slurm_chaos.slurm.cli_backend import SlurmCLI
from slurm_chaos.slurm.fake import FakeScheduler
from slurm_chaos.slurm.model import JobState
from slurm_chaos.slurm.protocol import Scheduler
from slurm_chaos.slurm.pyslurm_backend import PyslurmScheduler

DATA = Path(__file__).resolve().parent.parent / "data"
V22 = DATA / "slurm-22.05"
V24 = DATA / "slurm-24.11"
ENV = {"SLURM_CONF": "/tmp/x/slurm.conf"}


def ok(argv: tuple[str, ...], stdout: str = "") -> Completed:
    return Completed(argv, 0, stdout, "")


def recorded_failure(argv: tuple[str, ...], path: Path) -> Completed:
    """A recorded stderr file ends with the `rc=N` line the recording script appended."""
    *lines, rc = path.read_text().splitlines()
    return Completed(argv, int(rc.removeprefix("rc=")), "", "\n".join(lines) + "\n")


def slurm(
    folder: Path, overrides: Mapping[str, Callable[[tuple[str, ...]], Completed]] | None = None
) -> FakeRunner:
    """A FakeRunner answering like the recorded cluster of that Slurm version."""
    squeue = "squeue.json" if folder == V24 else "squeue_O_terminal.txt"
    sacct = "sacct.json" if folder == V24 else "sacct_allocations.parsable2.txt"
    nodes = "scontrol_show_nodes.json" if folder == V24 else "sinfo.json"
    table: dict[str, Callable[[tuple[str, ...]], Completed]] = {
        "sinfo --version": lambda a: ok(a, (folder / "sinfo_version.txt").read_text()),
        "squeue": lambda a: ok(a, (folder / squeue).read_text()),
        "sacct": lambda a: ok(a, (folder / sacct).read_text()),
        "sinfo --json": lambda a: ok(a, (folder / nodes).read_text()),
        "scontrol --json": lambda a: ok(a, (folder / nodes).read_text()),
        "scontrol -o show reservation": lambda a: ok(
            a, (V22 / "scontrol_show_reservation_oneliner.txt").read_text()
        ),
        "sbatch": lambda a: ok(a, "4242\n"),
        "scontrol -o show partition": lambda a: ok(
            a, (V22 / "scontrol_show_partition_oneliner.txt").read_text()
        ),
        "scontrol -o show topology": lambda a: ok(a, (V22 / "scontrol_show_topology.txt").read_text()),
        "scontrol show config": lambda a: ok(a, (V22 / "scontrol_show_config.txt").read_text()),
    }
    table.update(overrides or {})

    def respond(argv: tuple[str, ...]) -> Completed:
        line = " ".join(argv)
        for prefix in sorted(table, key=len, reverse=True):
            if line.startswith(prefix):
                return table[prefix](argv)
        return ok(argv)

    return FakeRunner(respond)


def calls_to(runner: FakeRunner, command: str) -> list[tuple[str, ...]]:
    return [c for c in runner.calls if c[0] == command]


def recording() -> FakeRunner:
    """sinfo --version and sbatch answers, for tests of the timeout and environment kept per call."""
    return FakeRunner(
        lambda argv: (
            ok(argv, "slurm-wlm 22.05.8\n") if argv[:2] == ("sinfo", "--version") else ok(argv, "77\n")
        )
    )


# ------------------------------------------------------------------ version, submit


def test_version_is_read_once() -> None:
    runner = slurm(V22)
    cli = SlurmCLI(ENV, runner)
    assert cli.version() == "22.05.8" and cli.version() == "22.05.8"
    assert runner.calls == [("sinfo", "--version")]
    assert SlurmCLI(ENV, slurm(V24)).version() == "24.11.5"


def test_submit_argv_env_and_timeout(tmp_path: Path) -> None:
    runner = recording()
    cli = SlurmCLI(ENV, runner, timeout=5)
    job = cli.submit(tmp_path / "job.sbatch", ["-N2", "--switches=1"], env={"NCCL_IB_DISABLE": "1"})
    argv, timeout, env = runner.invocations[-1]
    assert job == "77"
    assert argv == ("sbatch", "--parsable", "-N2", "--switches=1", str(tmp_path / "job.sbatch"))
    assert timeout == 5 and env == {**ENV, "NCCL_IB_DISABLE": "1"}


@pytest.mark.parametrize(
    ("recording", "message"),
    [
        ("sbatch_rejected_partition.stderr", "Batch job submission failed: Invalid partition name specified"),
        (
            "sbatch_rejected_reservation.stderr",
            "Batch job submission failed: Requested reservation is invalid",
        ),
        ("sbatch_rejected_constraint.stderr", "Batch job submission failed: Invalid feature specification"),
    ],
)
def test_sbatch_rejection_carries_slurms_message(recording: str, message: str, tmp_path: Path) -> None:
    runner = slurm(V22, {"sbatch": lambda a: recorded_failure(a, V22 / recording)})
    with pytest.raises(SlurmError, match=message) as info:
        SlurmCLI(ENV, runner).submit(tmp_path / "x.sbatch")
    assert not isinstance(info.value, SlurmUnreachable)
    assert str(info.value).startswith("sbatch: error:")


# ------------------------------------------------------------------ unreachable


@pytest.mark.parametrize(
    ("command", "recording"),
    [("sbatch", "unreachable_sbatch.stderr"), ("squeue", "unreachable_squeue.stderr")],
)
def test_unreachable_controller(command: str, recording: str, tmp_path: Path) -> None:
    runner = slurm(V22, {command: lambda a: recorded_failure(a, V22 / recording)})
    cli = SlurmCLI(ENV, runner)
    with pytest.raises(SlurmUnreachable, match=r"Unable to contact slurm controller.*SLURM_CONF=/tmp/x"):
        cli.submit(tmp_path / "x.sbatch") if command == "sbatch" else cli.poll(["1"])


def test_runner_timeout_is_unreachable() -> None:
    runner = slurm(V22, {"scontrol": lambda a: Completed(a, 124, "", "timed out after 8 s")})
    with pytest.raises(SlurmUnreachable, match="no answer from Slurm within 8 s"):
        SlurmCLI(ENV, runner).drain("node1", "test")


def test_missing_tools() -> None:
    runner = slurm(V22, {"sinfo --version": lambda a: Completed(a, 127, "", "sinfo: command not found")})
    with pytest.raises(SlurmError, match="command not found"):
        SlurmCLI(ENV, runner).version()


# ------------------------------------------------------------------ poll


def test_poll_twenty_jobs_is_one_squeue_and_one_sacct_on_22_05() -> None:
    runner = slurm(V22)
    ids = [str(i) for i in range(1, 21)]
    jobs = SlurmCLI(ENV, runner).poll(ids)
    (squeue,) = calls_to(runner, "squeue")
    (sacct,) = calls_to(runner, "sacct")
    assert f"--jobs={','.join(ids)}" in squeue and "--states=all" in squeue
    assert any(a.startswith("--Format=JobID:|,Name:|") for a in squeue)
    # only jobs the controller no longer knows go to accounting
    assert "--parsable2" in sacct and "--duplicates" in sacct and "--allocations" in sacct
    assert "--jobs=12,13,14,15,16,17,18,19,20" in sacct
    assert (jobs["6"].state, jobs["6"].restarts, jobs["6"].reservation) == (JobState.RUNNING, 1, "maint")
    assert (jobs["3"].state, jobs["3"].exit_code, jobs["3"].reason) == (JobState.FAILED, 3, "NonZeroExitCode")
    assert (jobs["10"].state, jobs["10"].signal) == (JobState.TIMEOUT, 15)
    assert set(jobs) == {str(i) for i in range(1, 12)}  # 12..20 are unknown to Slurm


def test_poll_uses_json_on_24_11() -> None:
    runner = slurm(V24)
    jobs = SlurmCLI(ENV, runner).poll(["1", "3", "6", "10", "12"])
    (squeue,) = calls_to(runner, "squeue")
    (sacct,) = calls_to(runner, "sacct")
    assert squeue[:2] == ("squeue", "--json") and sacct[:2] == ("sacct", "--json")
    assert "--jobs=12" in sacct
    assert jobs["1"].state is JobState.RUNNING and jobs["3"].state is JobState.PENDING
    assert (jobs["10"].state, jobs["10"].signal) == (JobState.TIMEOUT, 15)
    assert "12" not in jobs


def test_poll_reads_accounting_json_for_purged_jobs_on_24_11() -> None:
    empty = '{"jobs": [], "errors": [], "warnings": []}'
    runner = slurm(V24, {"squeue": lambda a: ok(a, empty)})
    jobs = SlurmCLI(ENV, runner).poll(["3", "6"])
    assert (jobs["3"].state, jobs["3"].exit_code) == (JobState.FAILED, 3)
    assert (jobs["6"].state, jobs["6"].restarts, jobs["6"].reservation) == (JobState.RUNNING, 1, "maint")


def test_poll_of_jobs_slurmctld_knows_needs_no_accounting() -> None:
    runner = slurm(V22)
    jobs = SlurmCLI(ENV, runner).poll(["6", "6", "3"])
    assert list(jobs) == ["6", "3"] and calls_to(runner, "sacct") == []
    assert len(calls_to(runner, "squeue")) == 1
    assert (jobs["3"].state, jobs["3"].exit_code) == (JobState.FAILED, 3)


def test_poll_when_squeue_has_forgotten_every_job() -> None:
    runner = slurm(V22, {"squeue": lambda a: recorded_failure(a, V22 / "squeue_unknown_job.stderr")})
    jobs = SlurmCLI(ENV, runner).poll(["3", "6"])
    assert (jobs["3"].state, jobs["3"].exit_code) == (JobState.FAILED, 3)
    assert (jobs["6"].state, jobs["6"].restarts) == (JobState.RUNNING, 1)


def test_poll_of_purged_job_with_accounting_down_is_unreachable() -> None:
    def dbd_down(argv: tuple[str, ...]) -> Completed:
        return Completed(argv, 1, "", "sacct: error: Problem talking to the database: Connection refused\n")

    runner = slurm(V22, {"sacct": dbd_down})
    with pytest.raises(SlurmUnreachable, match="Problem talking to the database"):
        SlurmCLI(ENV, runner).poll(["3", "99"])


def test_poll_nothing_runs_nothing() -> None:
    runner = slurm(V22)
    assert SlurmCLI(ENV, runner).poll([]) == {} and runner.calls == []


# ------------------------------------------------------------------ control commands


def test_control_argv() -> None:
    runner = slurm(V22)
    cli = SlurmCLI(ENV, runner)
    cli.cancel(["5", "7"])
    cli.requeue(["6", "8"])
    cli.drain("node4", "chaos: xid 79 injected")
    cli.resume("node4")
    assert runner.calls == [
        ("scancel", "5", "7"),
        ("scontrol", "requeue", "6,8"),
        ("scontrol", "update", "NodeName=node4", "State=DRAIN", "Reason=chaos: xid 79 injected"),
        ("scontrol", "update", "NodeName=node4", "State=RESUME"),
    ]


def test_drain_needs_a_reason_and_reports_slurms_refusal() -> None:
    runner = slurm(
        V22, {"scontrol update": lambda a: recorded_failure(a, V22 / "scontrol_update_bad_node.stderr")}
    )
    cli = SlurmCLI(ENV, runner)
    with pytest.raises(SlurmError, match="requires a reason"):
        cli.drain("node1", " ")
    with pytest.raises(SlurmError, match="slurm_update error: Invalid node name specified"):
        cli.drain("node9", "x")


# ------------------------------------------------------------------ the node side's questions


def test_job_running_tells_ended_from_cannot_tell() -> None:
    answers = {
        "1": lambda a: ok(a, "RUNNING\n"),
        "2": lambda a: ok(a, "COMPLETED\n"),
        "3": lambda a: recorded_failure(a, V22 / "squeue_unknown_job.stderr"),
        "4": lambda a: recorded_failure(a, V22 / "unreachable_squeue.stderr"),
        "5": lambda a: Completed(a, 124, "", "timed out after 8 s"),
        "6": lambda a: Completed(a, 1, "", "squeue: error: something else"),
    }
    runner = FakeRunner(lambda a: answers[a[3]](a))
    cli = SlurmCLI(ENV, runner)
    assert [cli.job_running(j) for j in "123456"] == [True, False, False, None, None, None]
    assert runner.calls[0] == ("squeue", "-h", "-j", "1", "-o", "%T")  # no version query first


def test_job_running_an_unknown_job_after_a_retried_timeout_has_ended() -> None:
    # squeue retries on its own: a timeout line before the final answer does not make it "cannot tell".
    stderr = (
        "squeue: error: slurm_receive_msg: Socket timed out on send/recv operation\n"
        "slurm_load_jobs error: Invalid job id specified\n"
    )
    cli = SlurmCLI(ENV, FakeRunner(lambda a: Completed(a, 1, "", stderr)))
    assert cli.job_running("3") is False


def test_time_left_or_cannot_tell() -> None:
    answers = {"1": lambda a: ok(a, "1-00:00:00\n"), "2": lambda a: ok(a, "UNLIMITED\n")}
    answers["3"] = lambda a: recorded_failure(a, V22 / "squeue_unknown_job.stderr")
    answers["4"] = lambda a: recorded_failure(a, V22 / "unreachable_squeue.stderr")
    runner = FakeRunner(lambda a: answers[a[3]](a))
    cli = SlurmCLI(ENV, runner)
    assert cli.time_left("1") == 86400.0 and cli.time_left("2") is None
    with pytest.raises(SlurmError, match="Invalid job id"):
        cli.time_left("3")
    with pytest.raises(SlurmUnreachable):
        cli.time_left("4")
    with pytest.raises(SlurmUnreachable):
        SlurmCLI(ENV, FakeRunner(lambda a: Completed(a, 124, "", "timed out after 8 s"))).time_left("1")
    assert runner.calls[0] == ("squeue", "-h", "-j", "1", "-o", "%L")


def test_one_node_is_asked_about_alone() -> None:
    lines = (V22 / "scontrol_show_node_oneliner.txt").read_text().splitlines()

    def respond(argv: tuple[str, ...]) -> Completed:
        found = [line for line in lines if line.startswith(f"NodeName={argv[-1]} ")]
        return ok(argv, "\n".join(found)) if found else Completed(argv, 1, "", f"Node {argv[-1]} not found")

    runner = FakeRunner(respond)
    cli = SlurmCLI(ENV, runner)
    node = cli.node("node4")
    assert node.drain and node.reason == "h-slurm: disk check failed"
    assert runner.calls == [("scontrol", "-o", "show", "node", "node4")]
    with pytest.raises(SlurmError, match="Node node9 not found"):
        cli.node("node9")


def test_pyslurm_leaves_the_node_sides_questions_to_the_cli() -> None:
    runner = FakeRunner(lambda a: ok(a, "RUNNING\n" if a[-1] == "%T" else "05:00\n"))
    pyslurm = SimpleNamespace(RPCError=RuntimeError)
    scheduler = PyslurmScheduler(pyslurm, SlurmCLI(ENV, runner))  # type: ignore[arg-type]
    assert scheduler.job_running("7") is True and scheduler.time_left("7") == 300.0
    assert [c[0] for c in runner.calls] == ["squeue", "squeue"]


@pytest.mark.parametrize("implementation", [SlurmCLI, PyslurmScheduler, FakeScheduler])
def test_every_implementation_answers_every_scheduler_question(implementation: type) -> None:
    wanted = {name for name in vars(Scheduler) if not name.startswith("_")}
    assert wanted <= set(dir(implementation)), wanted - set(dir(implementation))


@pytest.mark.parametrize(("folder", "command"), [(V22, ("sinfo", "--json")), (V24, ("scontrol", "--json"))])
def test_nodes_one_query_filtered_here(folder: Path, command: tuple[str, ...]) -> None:
    runner = slurm(folder)
    nodes = SlurmCLI(ENV, runner).nodes(["node[3-4]"])
    assert list(nodes) == ["node3", "node4"] and nodes["node4"].drained
    assert [c[:2] for c in runner.calls[1:]] == [command]
    with pytest.raises(SlurmError, match=r"unknown node\(s\): node\[8-9\]"):
        SlurmCLI(ENV, runner).nodes(["node8", "node9"])


def test_reservation_and_missing_reservation() -> None:
    resv = SlurmCLI(ENV, slurm(V22)).reservation("maint")
    assert resv.nodes == ("node3", "node4")
    missing = slurm(
        V22,
        {
            "scontrol -o show reservation": lambda a: recorded_failure(
                a, V22 / "scontrol_show_reservation_missing.txt"
            )
        },
    )
    with pytest.raises(SlurmError, match="Reservation nosuch not found"):
        SlurmCLI(ENV, missing).reservation("nosuch")


def test_cluster_layout_queries() -> None:
    """What onboarding reads: one scontrol call each, text in every Slurm version."""
    runner = slurm(V24)
    cli = SlurmCLI(ENV, runner)
    assert list(cli.partitions()) == ["debug"]
    assert [s.name for s in cli.topology() if s.leaf] == ["sw1", "sw2"]
    assert list(cli.reservations()) == ["maint"]
    assert cli.cluster_config().name == "chaos3"
    assert runner.calls == [
        ("scontrol", "-o", "show", "partition"),
        ("scontrol", "-o", "show", "topology"),
        ("scontrol", "-o", "show", "reservation"),
        ("scontrol", "show", "config"),
    ]


def test_no_topology_plugin_and_no_reservation() -> None:
    # src/api/topo_info.c: with no switch records scontrol prints this error and nothing on stdout.
    no_topo = Completed((), 1, "", "scontrol: error: No topology information available\n")
    runner = slurm(
        V22,
        {
            "scontrol -o show topology": lambda a: no_topo,
            "scontrol -o show reservation": lambda a: ok(
                a, (V22 / "scontrol_show_reservation_none.txt").read_text()
            ),
        },
    )
    cli = SlurmCLI(ENV, runner)
    assert cli.topology() == [] and cli.reservations() == {}
    broken = slurm(
        V22, {"scontrol -o show topology": lambda a: Completed(a, 1, "", "slurm_load_topo error\n")}
    )
    with pytest.raises(SlurmError, match="slurm_load_topo error"):
        SlurmCLI(ENV, broken).topology()


def test_accounting_has_every_run_and_step() -> None:
    runner = slurm(
        V22, {"sacct": lambda a: ok(a, (V22 / "sacct_steps_duplicates.parsable2.txt").read_text())}
    )
    records = SlurmCLI(ENV, runner).accounting(["6"])
    (sacct,) = calls_to(runner, "sacct")
    assert "--duplicates" in sacct and "--allocations" not in sacct
    runs = [r for r in records if r.job_id == "6" and r.step is None]
    assert [r.requeues for r in runs] == [0, 1]


def test_hostnames_need_no_slurm_call() -> None:
    runner = slurm(V22)
    assert SlurmCLI(ENV, runner).hostnames("node[1-2],login") == ["node1", "node2", "login"]
    assert runner.calls == []


# ------------------------------------------------------------------ backend choice


@pytest.mark.parametrize(
    ("pyslurm_version", "slurm_version", "expected"),
    [("22.5.1", "22.05.8", "pyslurm"), ("24.11.0", "24.11.5", "pyslurm"), ("24.11.0", "22.05.8", "cli")],
)
def test_choose_pyslurm_only_for_the_same_release(
    pyslurm_version: str, slurm_version: str, expected: str
) -> None:
    fake = SimpleNamespace(__version__=pyslurm_version)
    assert select.choose(fake, slurm_version) == expected  # type: ignore[arg-type]


def test_cli_when_pyslurm_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(select, "load_pyslurm", lambda: None)
    assert select.choose(None, "22.05.8") == "cli"
    assert isinstance(select.select_scheduler(ENV, slurm(V22)), SlurmCLI)


def test_pyslurm_nodes_carry_hardware_and_the_layout_comes_from_the_cli() -> None:
    node = SimpleNamespace(
        name="gpu001", state="IDLE", total_cpus=112, sockets=2, cores_per_socket=56, threads_per_core=1
    )
    pyslurm = SimpleNamespace(Nodes=SimpleNamespace(load=lambda: {"gpu001": node}), RPCError=RuntimeError)
    runner = slurm(V22)
    scheduler = PyslurmScheduler(pyslurm, SlurmCLI(ENV, runner))  # type: ignore[arg-type]
    info = scheduler.nodes()["gpu001"]
    assert (info.cpus, info.sockets, info.cores_per_socket, info.threads_per_core) == (112, 2, 56, 1)
    assert list(scheduler.partitions()) == ["debug"] and scheduler.cluster_config().name == "chaos3"
    assert [s.name for s in scheduler.topology()] == ["sw1", "sw2", "spine"]
    assert list(scheduler.reservations()) == ["maint"]


def test_just_finished_job_comes_from_squeue_not_slurmdbds_placeholder() -> None:
    """Recorded on the sandbox: right after a job ends slurmdbd holds an `allocation` stub record."""
    runner = slurm(
        V22,
        {
            "squeue": lambda a: ok(a, (V22 / "squeue_O_just_finished.txt").read_text()),
            "sacct": lambda a: ok(a, (V22 / "sacct_placeholder_just_finished.parsable2.txt").read_text()),
        },
    )
    job = SlurmCLI(ENV, runner).poll(["34"])["34"]
    assert (job.name, job.nodes, job.state) == ("two.sbatch", ("node1", "node2"), JobState.COMPLETED)
    assert calls_to(runner, "sacct") == []


def _job_record_squeue(argv: tuple[str, ...]) -> Completed:
    """squeue as recorded on the sandbox: the job records, and the jobs on node1 (shared) or node2."""
    if "--nodelist=node1" in argv:
        return ok(argv, (V22 / "squeue_node_jobs_shared.txt").read_text())
    if any(a.startswith("--nodelist=") for a in argv):
        return ok(argv, (V22 / "squeue_node_jobs_exclusive.txt").read_text())
    return ok(argv, (V22 / "squeue_job_record.txt").read_text())


def test_job_record_from_squeue_fields_a_user_cannot_write() -> None:
    runner = slurm(V22, {"squeue": _job_record_squeue})
    cli = SlurmCLI(ENV, runner)
    job = cli.job_record("4")
    # The job's name holds " AdminComment=slurm-chaos=evil|y": squeue -O never prints it.
    assert job.admin_comment == "slurm-chaos=netem:delay=0.005s"
    assert (job.user_id, job.user, job.account, job.partition, job.reservation) == (
        0, "root", "root", "debug", "chaos_maint",
    )  # fmt: skip
    assert job.exclusive and not job.array and not job.het and job.other_jobs == ()
    assert (job.num_nodes, job.nodes) == (1, ("node2",))
    assert job.end_time is not None and job.submit_time is not None
    assert (job.end_time - job.submit_time).total_seconds() == 601  # -t 10, started a second later
    assert calls_to(runner, "squeue")[0][:4] == ("squeue", "--noheader", "--jobs=4", "--states=all")
    assert calls_to(runner, "squeue")[1][:4] == ("squeue", "--noheader", "--states=all", "--nodelist=node2")
    task = cli.job_record("6")  # an array's id lists its tasks too: the row of job 6 is the one
    assert task.array and not task.exclusive and task.admin_comment == ""
    with pytest.raises(SlurmError, match="job 99: not known"):
        cli.job_record("99")


def test_a_job_that_shares_its_node_or_holds_every_cpu_without_exclusive_is_not_alone() -> None:
    """Recorded: jobs 2 and 3 share node1 (job 1 finished there just before: it holds nothing);
    job 5 holds both CPUs of node3 without --exclusive (OverSubscribe=OK) and no time limit."""
    cli = SlurmCLI(ENV, slurm(V22, {"squeue": _job_record_squeue}))
    shared = cli.job_record("2")
    assert shared.other_jobs == ("3",) and not shared.exclusive
    assert not replace(shared, job_oversubscribe="NO").exclusive  # even as --exclusive would say
    every_cpu = cli.job_record("5")
    assert every_cpu.job_oversubscribe == "OK" and not every_cpu.exclusive
    assert every_cpu.end_time is None  # EndTime NONE: no time limit


def test_the_jobs_holding_a_node() -> None:
    from slurm_chaos.slurm import parse

    states = parse.parse_node_jobs((V22 / "squeue_node_jobs_shared.txt").read_text())
    assert states == {"1": JobState.COMPLETED, "2": JobState.RUNNING, "3": JobState.RUNNING}
    assert parse.holders(states, "2") == ("3",)
    assert parse.holders({**states, "8": JobState.SUSPENDED, "9": JobState.PENDING}, "3") == ("2", "8")
    assert parse.holders({"4": JobState.COMPLETING}, "5") == ("4",)


@pytest.mark.parametrize(
    ("job", "partition", "others", "exclusive"),
    [("NO", "NO", (), True), ("OK", "NO", (), False), ("OK", "EXCLUSIVE", (), True),
     ("NO", "FORCE:4", (), False), ("USER", "YES:4", (), False), ("OK", "YES:4", (), False),
     ("NO", "YES:4", (), True),
     ("NO", "NO", ("8",), False), ("OK", "EXCLUSIVE", ("8",), False), ("NO", "NO", None, False)],
)  # fmt: skip
def test_exclusive_only_as_the_controller_says_and_with_no_other_job_on_the_nodes(
    job: str, partition: str, others: tuple[str, ...] | None, exclusive: bool
) -> None:
    """Slurm's words, never the CPUs the job holds: on an OverSubscribe=YES partition or an SMT node
    declared with CPUs= only a job may hold every CPU Slurm counts and still share the node. And
    a job another one shares a node with (a suspended one under gang scheduling) is not alone."""
    from slurm_chaos.slurm import parse

    line = f"7|N/A|N/A|1001|alice|a|p|(null)|{job}|1|node1|2026-11-30T12:00:00|Unknown|(null)|\n"
    rec = parse.parse_job_records(line, {"p": partition})["7"]
    assert rec.other_jobs is None and not rec.exclusive  # nobody asked who else is on node1
    rec = replace(rec, other_jobs=others)
    assert rec.exclusive is exclusive and rec.reservation == "" and rec.admin_comment == ""
    assert rec.end_time is None and rec.submit_time is not None


def test_admin_comment_may_hold_the_separator() -> None:
    from slurm_chaos.slurm import parse

    line = "7|N/A|N/A|0|root|a|p|r|NO|1|node1|2026-11-30T12:00:00|2026-11-30T13:00:00|slurm-chaos=x|y|\n"
    assert parse.parse_job_records(line, {})["7"].admin_comment == "slurm-chaos=x|y"
