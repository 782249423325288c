"""tc netem on the node's interface: the commands, the journal, the undo, the no-netem kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults.journal import Journal, UndoContext, revert
from slurm_chaos.faults.node_base import JobContext
from slurm_chaos.faults.node_net import apply_netem, netem_args, root_qdisc
from slurm_chaos.faults.spec import SpecError, parse_spec
from slurm_chaos.runner import Completed, FakeRunner

DEFAULT = "qdisc noqueue 0: root refcnt 2 \n"
OURS = "qdisc netem cafe: root refcnt 2 limit 1000 delay 50ms\n"


class TcSim:
    """A tiny tc: one root qdisc per interface, add/del/show as the real one answers them."""

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
            self.root = DEFAULT
            return Completed(argv, 0, "", "")
        return Completed(argv, 127, "", "unexpected")


def ctx_for(tmp_path: Path, sim: TcSim, job_interface: str | None = "eth0") -> JobContext:
    journal = Journal(tmp_path, "node1", "10")
    return JobContext(
        "10", "node1", ("node1",), 1000, 1000, 1e12, journal, sim.runner, job_interface=job_interface
    )


def test_root_qdisc_parsing() -> None:
    assert root_qdisc(DEFAULT) is not None and root_qdisc(DEFAULT).default  # type: ignore[union-attr]
    ours = root_qdisc(OURS)
    assert ours is not None and ours.ours and not ours.default
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
    assert "netem cafe:" in sim.root
    (entry,) = ctx.journal.read().entries
    assert entry.undo.action == "tc_restore" and entry.undo.data["iface"] == "eth0"
    result = revert(ctx.journal, UndoContext(sim.runner), by="test")
    assert sim.root == DEFAULT and "tc qdisc del dev eth0 root" in result.undone[0]
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


def test_kernel_without_netem_gets_the_rate_limit_only(tmp_path: Path) -> None:
    sim = TcSim(has_netem=False)
    apply_netem(parse_spec("netem:delay=20ms,rate=1M")[0], ctx_for(tmp_path, sim))
    assert "tbf cafe:" in sim.root and "rate 1048576bps" in sim.root
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
