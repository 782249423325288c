"""Cleanup enters a node's namespaces only through root's slurmd or slurmstepd (a fake /proc).

An undo run from outside the node (the sandbox host, ``slurm-chaos cleanup``) runs its commands
with ``nsenter -t PID`` and writes cgroups through ``/proc/PID/root``. A user's process in the
node's namespaces may have chrooted into a tree of its own inside a user namespace of its own
(its uid reads as the user's from outside), or have the PID the journal recorded once slurmd is
gone: root's writes and rmdirs through it would land in the user's tree.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakeproc import SLURMD, FakeProc

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults import journal as journal_mod
from slurm_chaos.faults.cleanup import NsRunner, node_runner, revert_journal
from slurm_chaos.faults.journal import Header, Journal, Undo
from slurm_chaos.runner import Completed, FakeRunner

NODE_PID = 300


def header(proc: FakeProc, ns_pid: int = NODE_PID) -> Header:
    net, mnt = proc.ns("net", "node1").stat().st_ino, proc.ns("mnt", "node1").stat().st_ino
    return Header("7", "node1", 0.0, 0.0, ns_pid, net, mnt)


def runner() -> FakeRunner:
    return FakeRunner(lambda argv: Completed(argv, 0, "", ""))


def users_processes(proc: FakeProc) -> None:
    """What a job's user can leave in the node's namespaces: a process with the PID the journal
    recorded, a chrooted one in a user namespace (uid 0 inside reads as 1001), a setuid program's
    (root's effective uid, the user's real one), and the slurmd binary run by the user."""
    proc.add(100, net="node1", mnt="node1")
    proc.add(101, argv=("slurmd",), exe=SLURMD, net="node1", mnt="node1")
    proc.add(102, exe="/usr/bin/passwd", net="node1", mnt="node1")
    status = proc.root / "102" / "status"
    status.write_text("Name:\tpasswd\nUid:\t1001\t0\t0\t0\n")
    proc.add(103, uid=0, exe="/usr/bin/bash", net="node1", mnt="node1")  # root's, but no Slurm daemon


def test_node_runner_enters_namespaces_only_when_needed(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.add(NODE_PID, argv=("slurmd", "-N", "node1"), uid=0, exe=SLURMD, net="node1", mnt="node1")
    here = Header(
        "7", "n", 0.0, 0.0, 1, proc.ns("net", "host").stat().st_ino, proc.ns("mnt", "host").stat().st_ino
    )
    inner = runner()
    assert node_runner(here, inner, tmp_path) is inner
    wrapped = node_runner(header(proc), inner, tmp_path)
    assert isinstance(wrapped, NsRunner) and wrapped.pid == NODE_PID and wrapped.mount
    wrapped(["tc", "qdisc", "show"])
    assert inner.calls[-1][:5] == ("nsenter", "-t", str(NODE_PID), "-n", "-m")
    gone = Header("7", "n", 0.0, 0.0, 1, 1, 1)
    assert node_runner(gone, inner, tmp_path) is inner


def test_cleanup_enters_through_root_slurm_daemons_only(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    users_processes(proc)
    proc.add(NODE_PID, argv=("slurmd", "-N", "node1"), uid=0, exe=SLURMD, net="node1", mnt="node1")
    wrapped = node_runner(header(proc, ns_pid=100), runner(), tmp_path)
    assert isinstance(wrapped, NsRunner) and (wrapped.pid, wrapped.mount) == (NODE_PID, True)
    # Only a slurmstepd left, in the node's network namespace but a mount namespace of its own:
    # the network namespace is entered through it, the node's files are not reached through it.
    proc = FakeProc(tmp_path / "b")
    users_processes(proc)
    proc.stepd(400, "7", "0", "0::/\n", net="node1", mnt="container")
    wrapped = node_runner(header(proc, ns_pid=100), runner(), proc.root)
    assert isinstance(wrapped, NsRunner) and (wrapped.pid, wrapped.mount) == (400, False)


def test_namespaces_held_only_by_a_users_processes_are_never_entered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = FakeProc(tmp_path / "proc")
    users_processes(proc)
    with pytest.raises(ChaosError, match="no slurmd or slurmstepd of root's"):
        node_runner(header(proc, ns_pid=100), runner(), proc.root)
    # The journal's undo is refused and left pending (for a later cleanup or an administrator).
    h = header(proc, ns_pid=100)
    monkeypatch.setattr(journal_mod, "_ns", lambda kind: h.netns if kind == "net" else h.mntns)
    journal = Journal(tmp_path / "journal", "node1", "7")
    journal.write_header(1e12, 100)
    journal.record(
        "netem", "tc qdisc add", Undo(action="tc_restore", data={"iface": "eth0", "before": ""}), 1e12
    )
    inner = runner()
    result = revert_journal(journal, inner, by="test", proc=proc.root)
    assert result.undone == () and "not reverted" in result.failed[0]
    assert inner.calls == []
    state = journal.read()
    assert not state.closed and len(state.pending()) == 1
