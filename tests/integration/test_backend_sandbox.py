"""The CLI scheduler backend against the real sandbox cluster (slurmctld + slurmdbd + 4 slurmd)."""

from __future__ import annotations

import re
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from slurm_chaos.errors import SlurmError, SlurmUnreachable
from slurm_chaos.runner import Completed, SubprocessRunner
from slurm_chaos.slurm.cli_backend import SlurmCLI
from slurm_chaos.slurm.model import JobInfo, JobState

pytestmark = pytest.mark.sandbox
T = TypeVar("T")


@dataclass
class CountingRunner:
    """Runs commands for real and keeps every argv, so tests can count Slurm queries."""

    inner: SubprocessRunner = field(default_factory=SubprocessRunner)
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def __call__(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> Completed:
        self.calls.append(tuple(argv))
        return self.inner(argv, timeout=timeout, env=env, input=input)

    def count(self, command: str) -> int:
        return sum(1 for c in self.calls if c[0] == command)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 90, every: float = 0.5) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def finished(cli: SlurmCLI, job_id: str, timeout: float = 90) -> JobInfo:
    def probe() -> JobInfo | None:
        job = cli.poll([job_id]).get(job_id)
        return job if job and job.state.is_terminal else None

    return wait_for(f"job {job_id} to end", probe, timeout)


def running(cli: SlurmCLI, job_id: str) -> JobInfo:
    def probe() -> JobInfo | None:
        job = cli.poll([job_id]).get(job_id)
        return job if job and job.state is JobState.RUNNING else None

    return wait_for(f"job {job_id} to run", probe)


@pytest.fixture
def workdir(sandbox: Any) -> Path:
    path = Path(sandbox.shared_dir) / "h-slurm-tests" / uuid.uuid4().hex[:8]
    path.mkdir(parents=True)
    return path


@pytest.fixture
def runner() -> CountingRunner:
    return CountingRunner()


class Submitter:
    """Submits through the backend and remembers the ids, so a failed test leaves no job behind."""

    def __init__(self, cli: SlurmCLI) -> None:
        self.cli = cli
        self.ids: list[str] = []

    def __call__(self, path: Path, args: Sequence[str] = ()) -> str:
        job_id = self.cli.submit(path, args)
        self.ids.append(job_id)
        return job_id

    def cleanup(self) -> None:
        live = [j for j, info in self.cli.poll(self.ids).items() if not info.state.is_terminal]
        if live:
            self.cli.cancel(live)


@pytest.fixture
def cli(sandbox: Any, runner: CountingRunner) -> SlurmCLI:
    return SlurmCLI(sandbox.env, runner)


@pytest.fixture
def submit(cli: SlurmCLI) -> Iterator[Submitter]:
    submitter = Submitter(cli)
    yield submitter
    submitter.cleanup()


def script(workdir: Path, name: str, body: str, options: Sequence[str] = ()) -> Path:
    path = workdir / f"{name}.sbatch"
    header = [
        "#!/bin/bash",
        f"#SBATCH --job-name=hs-{name}",
        f"#SBATCH --output={workdir}/{name}-%j.out",
        f"#SBATCH --chdir={workdir}",
    ]
    path.write_text("\n".join([*header, *(f"#SBATCH {o}" for o in options), body, ""]))
    return path


# ------------------------------------------------------------------ jobs


def test_two_node_job_runs_and_writes_its_output(cli: SlurmCLI, submit: Submitter, workdir: Path) -> None:
    job_id = submit(script(workdir, "two", "srun hostname | sort", ["--nodes=2"]))
    job = finished(cli, job_id)
    assert (job.state, job.exit_code) == (JobState.COMPLETED, 0), job
    assert len(job.nodes) == 2
    output = (workdir / f"two-{job_id}.out").read_text().split()
    assert output == sorted(job.nodes)


def test_poll_twenty_jobs_with_one_query(
    cli: SlurmCLI, submit: Submitter, runner: CountingRunner, workdir: Path
) -> None:
    path = script(workdir, "short", "sleep 1")
    ids = [submit(path, [f"--job-name=hs-short-{i}"]) for i in range(20)]
    before_squeue, before_sacct = runner.count("squeue"), runner.count("sacct")
    jobs = cli.poll(ids)
    assert sorted(jobs) == sorted(ids)
    assert runner.count("squeue") - before_squeue == 1
    assert runner.count("sacct") - before_sacct <= 1

    def all_done() -> dict[str, JobInfo] | None:
        polls = runner.count("squeue")
        done = cli.poll(ids)
        assert runner.count("squeue") - polls == 1  # every poll is one squeue (+ one sacct at most)
        return done if all(j.state.is_terminal for j in done.values()) and len(done) == 20 else None

    final = wait_for("20 jobs to end", all_done, timeout=120, every=1)
    assert {j.state for j in final.values()} == {JobState.COMPLETED}


def test_cancel(cli: SlurmCLI, submit: Submitter, workdir: Path) -> None:
    job_id = submit(script(workdir, "long", "sleep 300"))
    running(cli, job_id)
    cli.cancel([job_id])
    assert finished(cli, job_id, timeout=30).state is JobState.CANCELLED


def test_sbatch_rejection_shows_slurms_message(cli: SlurmCLI, workdir: Path) -> None:
    with pytest.raises(SlurmError, match="Invalid partition name specified") as info:
        cli.submit(script(workdir, "bad", "true"), ["--partition=h_slurm_no_such_partition"])
    assert "sbatch: error:" in str(info.value)


# ------------------------------------------------------------------ nodes and topology


def test_drain_shows_reason_then_resume(cli: SlurmCLI, sandbox: Any) -> None:
    node = sandbox.nodes[-1]
    reason = f"h-slurm test {uuid.uuid4().hex[:6]}"
    cli.drain(node, reason)
    try:
        info = wait_for("drained", lambda: (n := cli.nodes([node])[node]).drained and n, timeout=30)
        assert info.reason == reason and info.reason_user == "root" and info.reason_time is not None
    finally:
        cli.resume(node)
    after = cli.nodes([node])[node]
    assert not after.drain and after.reason == ""


def test_switches_one_gives_two_nodes_of_one_leaf(
    cli: SlurmCLI, submit: Submitter, sandbox: Any, workdir: Path
) -> None:
    leaves = {sw: tuple(members) for sw, members in sandbox.switches.items()}
    first_leaf = next(iter(leaves.values()))
    # Hold one node of the first leaf, so two free nodes under one switch exist only elsewhere.
    blocker = submit(script(workdir, "hold", "sleep 120", ["--exclusive", f"--nodelist={first_leaf[0]}"]))
    running(cli, blocker)
    job_id = submit(script(workdir, "leaf", "srun hostname", ["--nodes=2", "--switches=1"]))
    job = finished(cli, job_id)
    assert job.state is JobState.COMPLETED and len(job.nodes) == 2, job
    assert any(set(job.nodes) <= set(members) for members in leaves.values()), (job.nodes, leaves)
    assert first_leaf[0] not in job.nodes
    cli.cancel([blocker])


# ------------------------------------------------------------------ requeue and reservations


def test_requeued_job_shows_its_requeue_in_accounting(
    cli: SlurmCLI, submit: Submitter, workdir: Path
) -> None:
    job_id = submit(script(workdir, "rq", "sleep 300", ["--requeue"]))
    running(cli, job_id)
    cli.requeue([job_id])

    def requeued() -> list[Any] | None:
        runs = [r for r in cli.accounting([job_id]) if r.step is None]
        return runs if any(r.state is JobState.REQUEUED for r in runs) else None

    runs = wait_for("the requeue to reach accounting", requeued, timeout=30, every=1)
    assert runs[0].state is JobState.REQUEUED and runs[0].requeues == 0
    assert cli.poll([job_id])[job_id].restarts == 1
    cli.cancel([job_id])


def test_reservation_restricts_a_job_to_its_nodes(
    cli: SlurmCLI, submit: Submitter, sandbox: Any, workdir: Path
) -> None:
    assert set(cli.reservation(sandbox.reservation).nodes) == set(sandbox.nodes)
    node = sandbox.nodes[-1]
    name = f"hs_{uuid.uuid4().hex[:6]}"
    runner = SubprocessRunner()
    create = [
        "scontrol", "create", "reservation", f"ReservationName={name}", f"Nodes={node}", "Users=root",
        "StartTime=now", "Duration=10", "Flags=OVERLAP,IGNORE_JOBS",
    ]  # fmt: skip
    made = runner(create, timeout=10, env=sandbox.env)
    assert made.ok, made.stderr
    try:
        resv = cli.reservation(name)
        assert resv.nodes == (node,) and resv.users == ("root",)
        one = submit(script(workdir, "in-resv", "srun hostname"), [f"--reservation={name}"])
        assert finished(cli, one).nodes == (node,)
        # Two nodes cannot fit a one-node reservation: Slurm refuses the job outright.
        with pytest.raises(SlurmError, match="Requested node configuration is not available"):
            cli.submit(script(workdir, "too-big", "srun hostname"), [f"--reservation={name}", "--nodes=2"])
    finally:
        runner(["scontrol", "delete", f"ReservationName={name}"], timeout=10, env=sandbox.env)


# ------------------------------------------------------------------ unreachable controller


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_controller_fails_fast_and_clearly(sandbox: Any, tmp_path: Path) -> None:
    conf = Path(sandbox.env["SLURM_CONF"])
    for sibling in conf.parent.glob("*.conf"):
        if sibling.name != "slurmdbd.conf":
            (tmp_path / sibling.name).write_text(sibling.read_text())
    text = conf.read_text()
    port = f"SlurmctldPort={_dead_port()}"
    text = re.sub(r"(?m)^SlurmctldPort=.*$", port, text) if "SlurmctldPort=" in text else f"{text}\n{port}\n"
    (tmp_path / "slurm.conf").write_text(text)
    cli = SlurmCLI({**sandbox.env, "SLURM_CONF": str(tmp_path / "slurm.conf")}, SubprocessRunner())
    (tmp_path / "x.sbatch").write_text("#!/bin/bash\ntrue\n")
    for call in (lambda: cli.poll(["1"]), lambda: cli.submit(tmp_path / "x.sbatch")):
        start = time.monotonic()
        with pytest.raises(SlurmUnreachable) as info:
            call()
        elapsed = time.monotonic() - start
        assert elapsed < 10, elapsed
        assert str(tmp_path / "slurm.conf") in str(info.value)
