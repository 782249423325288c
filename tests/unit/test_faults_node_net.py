"""tc netem on the node's interface: the commands, the journal, the undo, the no-netem kernel, and
what is not ours (another job's qdisc, an administrator's, a node the job shares) left alone."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from slurm_chaos.errors import ChaosError, SlurmError
from slurm_chaos.faults.hooks.__main__ import main as hook_main
from slurm_chaos.faults.journal import Journal, Undo, UndoContext, revert
from slurm_chaos.faults.node_base import JobContext
from slurm_chaos.faults.node_net import (
    HANDLE_BASE,
    HANDLE_SPAN,
    QdiscToggle,
    apply_netem,
    netem_args,
    qdisc_handle,
    root_qdisc,
)
from slurm_chaos.faults.policy import Policy, write_policy
from slurm_chaos.faults.spec import SpecError, parse_spec
from slurm_chaos.runner import Completed, FakeRunner
from slurm_chaos.slurm.backend import Scheduler
from slurm_chaos.slurm.model import ClusterConfig, JobRecord, PartitionInfo

DEFAULT = "qdisc noqueue 0: root refcnt 2 \n"
OURS = "qdisc netem 400a: root refcnt 2 limit 1000 delay 50ms\n"  # job 10's
ADMIN = "qdisc tbf 1: root refcnt 2 rate 1Gbit burst 128Kb lat 10ms\n"


class TcSim:
    """A tiny tc: one root qdisc per interface, add/del/show as the real one answers them (Linux
    6.x: an add never replaces a root qdisc but the default, a delete by handle only that one)."""

    def __init__(self, root: str = DEFAULT, has_netem: bool = True) -> None:
        self.root = root
        self.has_netem = has_netem
        self.runner = FakeRunner(self.respond)

    def respond(self, argv: tuple[str, ...]) -> Completed:
        if argv[:3] == ("tc", "qdisc", "show"):
            return Completed(argv, 0, self.root, "")
        if argv[:3] == ("tc", "qdisc", "add"):
            kind = argv[8]
            if kind == "netem" and not self.has_netem:
                return Completed(argv, 2, "", "Error: Specified qdisc kind is unknown.\n")
            if "noqueue" not in self.root:
                return Completed(argv, 2, "", "Error: Exclusivity flag on, cannot modify.\n")
            self.root = f"qdisc {kind} {argv[7]} root refcnt 2 {' '.join(argv[9:])}\n"
            return Completed(argv, 0, "", "")
        if argv[:3] == ("tc", "qdisc", "del"):
            now = root_qdisc(self.root)
            if "handle" in argv and (now is None or now.handle != argv[argv.index("handle") + 1]):
                return Completed(argv, 2, "", "Error: Invalid handle.\n")
            if now is None or now.handle == "0:":
                return Completed(argv, 2, "", "Error: Cannot delete qdisc with handle of zero.\n")
            self.root = DEFAULT
            return Completed(argv, 0, "", "")
        return Completed(argv, 127, "", "unexpected")


def ctx_for(
    tmp_path: Path, sim: TcSim, job_interface: str | None = "eth0", job: str = "10", exclusive: bool = True
) -> JobContext:
    journal = Journal(tmp_path, "node1", job)
    return JobContext(
        job,
        "node1",
        ("node1",),
        1000,
        1000,
        1e12,
        journal,
        sim.runner,
        job_interface=job_interface,
        exclusive=exclusive,
    )


def test_root_qdisc_parsing() -> None:
    assert root_qdisc(DEFAULT) is not None and root_qdisc(DEFAULT).default  # type: ignore[union-attr]
    ours = root_qdisc(OURS)
    assert ours is not None and ours.ours("400a:") and not ours.default
    assert not ours.ours("400b:") and not ours.ours("400a:", frozenset({"tbf"}))
    mq = root_qdisc("qdisc mq 0: root \nqdisc fq_codel 0: parent :1 limit 10240p\n")
    assert mq is not None and mq.kind == "mq" and mq.default
    assert root_qdisc("") is None


def test_netem_arguments_from_the_spec() -> None:
    (req,) = parse_spec("netem:delay=50ms,jitter=5ms,loss=1.5,rate=10M")
    assert netem_args(req) == ["delay", "50ms", "5ms", "loss", "1.5%", "rate", "10485760bps"]
    (plain,) = parse_spec("netem:delay=1s")
    assert netem_args(plain) == ["delay", "1000ms"]


def test_apply_journals_before_adding_then_undo_restores(tmp_path: Path) -> None:
    sim = TcSim()
    ctx = ctx_for(tmp_path, sim)
    (req,) = parse_spec("netem:delay=20ms")
    apply_netem(req, ctx)
    assert "netem 400a:" in sim.root
    (entry,) = ctx.journal.read().entries
    assert entry.undo.action == "tc_restore" and entry.undo.data["iface"] == "eth0"
    assert entry.undo.data["handle"] == "400a:" and entry.undo.data["kinds"] == ["netem", "tbf"]
    result = revert(ctx.journal, UndoContext(sim.runner), by="test")
    assert sim.root == DEFAULT and "tc qdisc del dev eth0 root handle 400a:" in result.undone[0]
    # Undo twice: our qdisc is gone, nothing is deleted.
    calls = len(sim.runner.calls)
    revert(ctx.journal, UndoContext(sim.runner), by="again")
    assert len(sim.runner.calls) == calls


def test_a_foreign_root_qdisc_is_never_replaced(tmp_path: Path) -> None:
    sim = TcSim(root="qdisc htb 1: root refcnt 2 r2q 10 default 0\n")
    with pytest.raises(ChaosError, match="does not replace"):
        apply_netem(parse_spec("netem:delay=20ms")[0], ctx_for(tmp_path, sim))
    assert not any(c[:3] == ("tc", "qdisc", "add") for c in sim.runner.calls)


def test_undo_leaves_someone_elses_qdisc_alone(tmp_path: Path) -> None:
    sim = TcSim()
    ctx = ctx_for(tmp_path, sim)
    apply_netem(parse_spec("netem:delay=20ms")[0], ctx)
    sim.root = "qdisc htb 1: root refcnt 2\n"  # an admin replaced ours meanwhile
    result = revert(ctx.journal, UndoContext(sim.runner), by="test")
    assert "not ours" in result.undone[0] and sim.root.startswith("qdisc htb")
    assert not any(c[:3] == ("tc", "qdisc", "del") for c in sim.runner.calls)


def test_kernel_without_netem_gets_the_rate_limit_only(tmp_path: Path) -> None:
    sim = TcSim(has_netem=False)
    apply_netem(parse_spec("netem:delay=20ms,rate=1M")[0], ctx_for(tmp_path, sim))
    assert "tbf 400a:" in sim.root and "rate 1048576bps" in sim.root
    sim2 = TcSim(has_netem=False)
    with pytest.raises(ChaosError, match="no sch_netem"):
        apply_netem(parse_spec("netem:delay=20ms")[0], ctx_for(tmp_path / "b", sim2))


def test_only_the_interface_the_site_names_is_shaped(tmp_path: Path) -> None:
    """The job names no interface (`iface` is no SPEC key); the policy's job_interface is the one."""
    with pytest.raises(SpecError, match="unknown key 'iface'"):
        parse_spec("netem:delay=20ms,iface=lo")
    sim = TcSim()
    apply_netem(parse_spec("netem:delay=20ms")[0], ctx_for(tmp_path, sim, job_interface="ib0"))
    adds = [c for c in sim.runner.calls if c[:3] == ("tc", "qdisc", "add")]
    assert adds and all(c[4] == "ib0" for c in adds)
    assert all("eth0" not in c for c in sim.runner.calls)


def test_no_job_interface_in_the_policy_refuses_netem(tmp_path: Path) -> None:
    sim = TcSim()
    ctx = ctx_for(tmp_path, sim, job_interface=None)
    with pytest.raises(ChaosError, match=r"the policy names no job_interface .*safety\.job_interface"):
        apply_netem(parse_spec("netem:delay=20ms")[0], ctx)
    assert sim.runner.calls == [] and ctx.journal.read().entries == ()


def test_each_job_has_a_handle_of_its_own_away_from_the_kernels_and_the_usual_ones() -> None:
    assert qdisc_handle("10") == "400a:" and qdisc_handle("11") == "400b:"
    handles = {qdisc_handle(str(job)) for job in range(1, 3 * HANDLE_SPAN, 7)}
    majors = {int(h.rstrip(":"), 16) for h in handles}
    assert min(majors) >= HANDLE_BASE and max(majors) < HANDLE_BASE + HANDLE_SPAN <= 0x8000
    assert not {"0:", "1:", "10:", "100:", "1000:", "ffff:", "8001:"} & handles
    with pytest.raises(ChaosError, match="not a number"):
        qdisc_handle("10_1")


def test_one_jobs_undo_leaves_another_jobs_qdisc_on_the_node(tmp_path: Path) -> None:
    """Job 11 (switchback, off) and then job 10 (netem) on one node: 11's undo is not 10's."""
    sim = TcSim()
    ctx11 = ctx_for(tmp_path, sim, job="11")
    apply_netem(parse_spec("netem:delay=20ms,control=switchback")[0], ctx11)
    assert sim.root == DEFAULT  # tried once, then off
    apply_netem(parse_spec("netem:delay=30ms")[0], ctx_for(tmp_path, sim, job="10"))
    theirs = sim.root
    result = revert(ctx11.journal, UndoContext(sim.runner), by="test")
    assert sim.root == theirs and "not ours" in result.undone[0], result.undone
    assert not [c for c in sim.runner.calls if c[:3] == ("tc", "qdisc", "del") and "400a:" in c]


def test_a_switch_never_deletes_or_replaces_a_qdisc_that_is_not_ours(tmp_path: Path) -> None:
    sim = TcSim()
    ctx = ctx_for(tmp_path, sim)
    (toggle,) = apply_netem(parse_spec("netem:delay=20ms,control=switchback")[0], ctx)
    assert isinstance(toggle, QdiscToggle)
    toggle.switch(True, 0.0)
    sim.root = ADMIN  # an administrator replaced ours while the job had it on
    with pytest.raises(ChaosError, match="Invalid handle"):
        toggle.switch(False, 0.0)
    assert sim.root == ADMIN and toggle.on
    toggle.on = False
    with pytest.raises(ChaosError, match="Exclusivity flag"):
        toggle.switch(True, 0.0)
    result = revert(ctx.journal, UndoContext(sim.runner), by="test")
    assert sim.root == ADMIN and "not ours" in result.undone[0]


def test_netem_is_refused_on_a_node_the_job_shares_whatever_the_policy_says(tmp_path: Path) -> None:
    sim = TcSim()
    ctx = ctx_for(tmp_path, sim, exclusive=False)
    for spec in ("netem:delay=20ms", "netem:rate=1M,control=switchback"):
        with pytest.raises(ChaosError, match="does not hold node1 exclusively"):
            apply_netem(parse_spec(spec)[0], ctx)
    assert sim.runner.calls == [] and ctx.journal.read().entries == ()


def test_a_journal_written_before_per_job_handles_undoes_the_old_handle_only(tmp_path: Path) -> None:
    sim = TcSim(root="qdisc netem cafe: root refcnt 2 limit 1000 delay 50ms\n")
    journal = Journal(tmp_path, "node1", "9")
    journal.record("netem", "tc qdisc add", Undo(action="tc_restore", data={"iface": "eth0"}), 1e12)
    result = revert(journal, UndoContext(sim.runner), by="test")
    assert sim.root == DEFAULT and "handle cafe:" in result.undone[0]


@dataclass
class Controller:
    """slurmctld's record of one job, and nothing else."""

    record: JobRecord

    def job_record(self, job_id: str) -> JobRecord:
        if job_id != self.record.job_id:
            raise SlurmError(f"job {job_id}: not known to the controller")
        return self.record

    def partitions(self) -> dict[str, PartitionInfo]:
        return {self.record.partition: PartitionInfo(self.record.partition, ("node1",))}

    def cluster_config(self) -> ClusterConfig:
        return ClusterConfig("c")


@pytest.mark.skipif(os.geteuid() != 0, reason="the policy file must be root's")
@pytest.mark.parametrize("alone", [False, True])
def test_the_prolog_lets_netem_act_only_where_slurmctld_says_the_job_holds_the_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], alone: bool
) -> None:
    """require_exclusive: false lets a job on a shared node have faults; netem it gets only alone."""
    policy = tmp_path / "policy.toml"
    write_policy(policy, Policy(allow_users=("alice",), require_exclusive=False, job_interface="eth0"))
    record = JobRecord(
        job_id="42",
        user_id=1001,
        user="alice",
        account="chaos",
        partition="debug",
        reservation="",
        job_oversubscribe="NO" if alone else "OK",
        partition_oversubscribe="NO",
        array=False,
        het=False,
        num_nodes=1,
        nodes=("node1",),
        admin_comment="slurm-chaos=netem:rate=1M",
        other_jobs=() if alone else ("41",),
    )
    env = {
        "SLURM_JOB_ID": "42",
        "SLURMD_NODENAME": "node1",
        "SLURM_JOB_UID": "1001",
        "SLURM_JOB_USER": "alice",
    }
    argv = [
        "--journal-root",
        str(tmp_path / "j"),
        "--policy",
        str(policy),
        "--audit-log",
        str(tmp_path / "a"),
    ]
    sim = TcSim()
    slurm = cast(Scheduler, Controller(record))
    try:
        assert hook_main(["prolog", *argv], env=env, runner=sim.runner, scheduler=slurm) == 0
        err = capsys.readouterr().err
        assert 'SPEC "netem:rate=1M" granted' in err
        if alone:
            assert "applied [netem]" in err and "netem 402a:" in sim.root
        else:
            assert "does not hold node1 exclusively" in err and "failed [netem]" in err
            assert sim.root == DEFAULT and not any(c[:3] == ("tc", "qdisc", "add") for c in sim.runner.calls)
    finally:  # stops the agent the prolog started, if it started one
        assert hook_main(["epilog", *argv], env=env, runner=sim.runner, scheduler=slurm) == 0
    assert sim.root == DEFAULT
