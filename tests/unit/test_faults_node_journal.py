"""The rollback journal: written before each change, replayed newest first, idempotent."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from slurm_chaos.faults.journal import (
    Journal,
    JournalClosed,
    Json,
    Undo,
    UndoContext,
    UndoFailed,
    journals,
    parse_records,
    revert,
    undo_action,
)
from slurm_chaos.runner import Completed, FakeRunner


def ok_runner(fail: set[str] | None = None) -> FakeRunner:
    def respond(argv: tuple[str, ...]) -> Completed:
        bad = fail is not None and argv[-1] in fail
        return Completed(argv, 1 if bad else 0, "", "boom" if bad else "")

    return FakeRunner(respond)


def test_undo_replays_newest_first_with_early_entries_before_all(tmp_path: Path) -> None:
    j = Journal(tmp_path, "node1", "42")
    j.write_header(deadline=1e12, ns_pid=1)
    j.record("netem", "first", Undo(argv=("undo", "1")), 1e12)
    j.record("agent", "controller", Undo(argv=("undo", "agent")), 1e12, early=True)
    j.record("ckpt-full", "second", Undo(argv=("undo", "2")), 1e12)
    runner = ok_runner()
    result = revert(j, UndoContext(runner), by="test")
    assert runner.calls == [("undo", "agent"), ("undo", "2"), ("undo", "1")]
    assert len(result.undone) == 3 and not result.failed
    state = j.read()
    assert state.closed and not state.pending() and state.header is not None


def test_second_undo_is_harmless(tmp_path: Path) -> None:
    j = Journal(tmp_path, "node1", "7")
    j.record("netem", "change", Undo(argv=("undo", "x")), 1e12)
    runner = ok_runner()
    revert(j, UndoContext(runner), by="epilog")
    again = revert(j, UndoContext(runner), by="epilog again")
    assert runner.calls == [("undo", "x")]
    assert again.undone == () and again.failed == ()


def test_closed_journal_refuses_new_changes(tmp_path: Path) -> None:
    j = Journal(tmp_path, "node1", "7")
    j.record("netem", "change", Undo(argv=("true",)), 1e12)
    revert(j, UndoContext(ok_runner()), by="epilog")
    with pytest.raises(JournalClosed):
        j.record("slow-rank", "late change", Undo(argv=("true",)), 1e12)


def test_failed_undo_stays_pending_and_is_retried(tmp_path: Path) -> None:
    j = Journal(tmp_path, "node2", "9")
    j.record("a", "one", Undo(argv=("undo", "one")), 1e12)
    j.record("b", "two", Undo(argv=("undo", "two")), 1e12)
    first = revert(j, UndoContext(ok_runner(fail={"two"})), by="epilog")
    assert len(first.undone) == 1 and "boom" in first.failed[0]
    assert [e.action for e in j.read().pending()] == ["two"]
    second = revert(j, UndoContext(ok_runner()), by="cleanup")
    assert len(second.undone) == 1 and not j.read().pending()


def test_entries_hold_what_the_issue_asks_for(tmp_path: Path) -> None:
    j = Journal(tmp_path, "node3", "11")
    j.record("netem", "tc qdisc add ...", Undo(action="tc_restore", data={"iface": "eth0"}), 123.0)
    line = json.loads(j.path.read_text().splitlines()[0])
    for key in ("time", "job_id", "node", "fault", "action", "undo", "pid", "deadline"):
        assert key in line
    assert line["undo"] == {"action": "tc_restore", "data": {"iface": "eth0"}}
    assert j.path == tmp_path / "node3" / "11.jsonl"


def test_named_undo_action_and_unknown_action(tmp_path: Path) -> None:
    seen: list[Mapping[str, Json]] = []

    @undo_action("test-remember")
    def remember(data: Mapping[str, Json], ctx: UndoContext) -> str:
        seen.append(data)
        return "remembered"

    j = Journal(tmp_path, "node1", "5")
    j.record("x", "named", Undo(action="test-remember", data={"k": [1, 2]}), 1e12)
    j.record("y", "unknown", Undo(action="no-such-action"), 1e12)
    result = revert(j, UndoContext(ok_runner()), by="test")
    assert seen == [{"k": [1, 2]}]
    assert "unknown undo action" in result.failed[0]


def test_skip_pid_marks_own_early_entry_without_running_it(tmp_path: Path) -> None:
    @undo_action("test-explode")
    def explode(data: Mapping[str, Json], ctx: UndoContext) -> str:
        raise UndoFailed("must not run")

    j = Journal(tmp_path, "node1", "6")
    entry = j.record("agent", "me", Undo(action="test-explode"), 1e12, early=True)
    result = revert(j, UndoContext(ok_runner()), by="watchdog", skip_pid=entry.pid)
    assert not result.failed and not j.read().pending()


def test_torn_last_line_is_ignored() -> None:
    good = json.dumps(
        {
            "kind": "change",
            "seq": 1,
            "time": 1.0,
            "job_id": "1",
            "node": "n",
            "fault": "f",
            "action": "a",
            "undo": {"argv": ["true"]},
            "pid": 1,
            "deadline": 2.0,
        }
    )
    state = parse_records([good, '{"kind": "done", "se'])
    assert len(state.entries) == 1 and state.done == frozenset()


def test_journals_lists_per_node(tmp_path: Path) -> None:
    Journal(tmp_path, "node1", "1").record("a", "x", Undo(argv=("true",)), 1.0)
    Journal(tmp_path, "node2", "2").record("a", "x", Undo(argv=("true",)), 1.0)
    assert [(j.node, j.job_id) for j in journals(tmp_path)] == [("node1", "1"), ("node2", "2")]
    assert [j.node for j in journals(tmp_path, ["node2"])] == ["node2"]
    assert journals(tmp_path / "missing") == []


def test_bad_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Journal(tmp_path, "../etc", "1")
