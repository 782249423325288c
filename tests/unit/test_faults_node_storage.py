"""A full checkpoint volume: mount bookkeeping and the undo that only unmounts our own tmpfs."""

from __future__ import annotations

from pathlib import Path

from slurm_chaos.faults.journal import Journal, Undo, UndoContext, revert
from slurm_chaos.faults.node_storage import PAGE, SLACK, fill, mounts_at, tmpfs_size, tmpfs_source
from slurm_chaos.runner import Completed, FakeRunner

TARGET = "/shared/ckpt/job-5"


def findmnt_runner(stack: list[str], busy: bool = False) -> FakeRunner:
    def respond(argv: tuple[str, ...]) -> Completed:
        if argv[0] == "findmnt":
            lines = ["/dev/sda1 /"] + [f"{src} {TARGET}" for src in stack]
            return Completed(argv, 0, "\n".join(lines) + "\n", "")
        if argv == ("umount", TARGET) and busy:
            return Completed(argv, 32, "", "umount: target is busy.")
        if argv[0] == "umount":
            stack.pop()
            return Completed(argv, 0, "", "")
        return Completed(argv, 0, "", "")

    return FakeRunner(respond)


def _journal(tmp_path: Path) -> Journal:
    j = Journal(tmp_path, "node1", "5")
    j.record(
        "ckpt-full",
        "mount",
        Undo(action="umount_ours", data={"target": TARGET, "source": tmpfs_source("5")}),
        1e12,
    )
    return j


def test_mounts_at_reads_findmnt_raw_output() -> None:
    out = "tmpfs /run\nslurm-chaos-ckpt-5 /a\\x20b\nother /a\\x20b\n"
    assert mounts_at(out, "/a b") == ["slurm-chaos-ckpt-5", "other"]
    assert mounts_at(out, "/nowhere") == []


def test_tmpfs_size_leaves_room_for_the_ballast() -> None:
    assert tmpfs_size(0) == SLACK
    assert tmpfs_size(1) == PAGE + SLACK
    assert tmpfs_size(10 * PAGE) == 10 * PAGE + SLACK


def test_undo_unmounts_our_tmpfs_once(tmp_path: Path) -> None:
    stack = [tmpfs_source("5")]
    runner = findmnt_runner(stack)
    j = _journal(tmp_path)
    result = revert(j, UndoContext(runner), by="test")
    assert ("umount", TARGET) in runner.calls and stack == []
    assert result.undone[0].endswith(f"umount {TARGET}")


def test_undo_does_nothing_when_not_mounted(tmp_path: Path) -> None:
    runner = findmnt_runner([])
    revert(_journal(tmp_path), UndoContext(runner), by="test")
    assert not any(c[0] == "umount" for c in runner.calls)


def test_undo_refuses_to_unmount_a_mount_stacked_on_ours(tmp_path: Path) -> None:
    runner = findmnt_runner([tmpfs_source("5"), "nfs-server:/vol"])
    result = revert(_journal(tmp_path), UndoContext(runner), by="test")
    assert "someone else's mount" in result.failed[0]
    assert not any(c[0] == "umount" for c in runner.calls)


def test_busy_tmpfs_is_unmounted_lazily(tmp_path: Path) -> None:
    runner = findmnt_runner([tmpfs_source("5")], busy=True)
    result = revert(_journal(tmp_path), UndoContext(runner), by="test")
    assert ("umount", "-l", TARGET) in runner.calls and "umount -l" in result.undone[0]


def test_fill_stops_at_enospc_and_gives_back_leave(tmp_path: Path, monkeypatch: object) -> None:
    # On a plain directory fill() would fill the disk; a file-size limit makes write(2) fail early
    # with EFBIG instead, which fill() must not swallow.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    import signal

    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    try:
        try:
            fill(tmp_path, 0)
            raised = False
        except OSError as exc:
            raised = exc.errno == 27  # EFBIG
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert raised


def test_a_user_may_only_fill_a_path_of_their_own(tmp_path: Path) -> None:
    import os

    import pytest

    from slurm_chaos.errors import ChaosError
    from slurm_chaos.faults.node_storage import check_user_path

    mine = tmp_path / "user"
    mine.mkdir()
    os.chown(mine, 4242, 4242)
    check_user_path(mine / "ckpt" / "deep", 4242)  # missing dirs under the user's own: fine
    check_user_path(Path("/etc/cron.d/x"), 0)  # root jobs: root could do it anyway
    with pytest.raises(ChaosError, match="belongs to uid 0"):
        check_user_path(Path("/etc/cron.d/x"), 4242)
