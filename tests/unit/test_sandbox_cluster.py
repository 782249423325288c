"""Sandbox bring-up steps against a fake runner: what `sandbox up` asks of ip and MariaDB."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_chaos.runner import Completed, FakeRunner
from slurm_chaos.sandbox.cluster import Sandbox
from slurm_chaos.sandbox.layout import Layout


def _ok(argv: tuple[str, ...], out: str = "") -> Completed:
    return Completed(argv, 0, out, "")


def test_a_veth_left_by_a_down_just_before_is_deleted_before_the_node_gets_its_own() -> None:
    """`ip netns del` returns before the kernel has destroyed the namespace; until it has, the old
    node's veth is still there and `ip link add` of the same name fails with 'File exists'."""
    layout = Layout("vx", 7, 2, "host")
    leftover = {layout.veth(1)}

    def responses(argv: tuple[str, ...]) -> Completed:
        if argv[:3] == ("ip", "link", "show"):
            known = argv[3] == layout.bridge or argv[3] in leftover
            return _ok(argv) if known else Completed(argv, 1, "", "does not exist")
        if argv[:3] == ("ip", "link", "del"):
            leftover.discard(argv[3])
            return _ok(argv)
        if argv[:3] == ("ip", "link", "add") and argv[3] in leftover:
            return Completed(argv, 2, "", "RTNETLINK answers: File exists")
        return _ok(argv)

    runner = FakeRunner(responses)
    Sandbox("vx", runner)._ensure_network(layout)
    assert ("ip", "link", "del", layout.veth(1)) in runner.calls
    assert ("ip", "link", "del", layout.veth(2)) not in runner.calls  # none was left: nothing to do
    adds = [c for c in runner.calls if c[:3] == ("ip", "link", "add")]
    assert [c[3] for c in adds] == [layout.veth(1), layout.veth(2)]
    assert runner.calls.index(("ip", "link", "del", layout.veth(1))) < runner.calls.index(adds[0])


def test_slurmdbd_finds_its_database_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """slurmdbd 24.11 with MariaDB 11.8's client exits when it made the database itself."""
    monkeypatch.setenv("SLURM_CHAOS_SANDBOX_ROOT", str(tmp_path))
    layout = Layout("dbx", 9, 1, "host")
    (layout.root / "db" / "data" / "mysql").mkdir(parents=True)
    runner = FakeRunner(_ok)
    sandbox = Sandbox("dbx", runner)
    monkeypatch.setattr(sandbox, "_is_ours", lambda *_: True)  # mariadbd runs: only the SQL is asked
    sandbox._ensure_mariadb(layout)
    assert not runner.calls  # a running mariadbd is left alone
    monkeypatch.setattr(sandbox, "_is_ours", lambda *_: False)
    monkeypatch.setattr("subprocess.Popen", lambda *a, **k: None)
    sandbox._ensure_mariadb(layout)
    sql = [c[-1] for c in runner.calls if c[0] == "mariadb" and "CREATE USER" in c[-1]]
    assert len(sql) == 1
    create, grant = sql[0].index("CREATE DATABASE IF NOT EXISTS slurm_acct_db_9;"), sql[0].index("GRANT")
    assert create < grant
