"""A full checkpoint volume: which paths root acts on, how they are walked and made, and the undo
that unmounts only our own mount, found by its identity."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults import mountfd, node_storage
from slurm_chaos.faults.journal import Journal, Undo, UndoContext, revert
from slurm_chaos.faults.node_base import JobContext
from slurm_chaos.faults.node_storage import (
    MOUNTFD,
    PAGE,
    SLACK,
    checkpoint_target,
    fill,
    mount_source,
    open_checkpoint_dir,
    open_dir,
    tmpfs_size,
)
from slurm_chaos.faults.spec import parse_spec
from slurm_chaos.runner import Completed, FakeRunner

UID, GID = 4242, 4343


def ok(argv: tuple[str, ...]) -> Completed:
    return Completed(argv, 0, "", "")


def _ctx(tmp_path: Path, runner: FakeRunner, roots: tuple[str, ...], uid: int | None = UID) -> JobContext:
    journal = Journal(tmp_path / "journal", "node1", "5")
    return JobContext("5", "node1", ("node1",), uid, GID, time.time() + 60, journal, runner, ckpt_roots=roots)


def _req(path: str):  # type: ignore[no-untyped-def]
    return parse_spec(f"ckpt-full:path={path}")[0]


def mkdir_as_user(calls: list[tuple[str, ...]], then: Callable[[str], None] | None = None) -> FakeRunner:
    """Plays `setpriv ... mkdir`: makes the directory as the user would own it."""

    def respond(argv: tuple[str, ...]) -> Completed:
        calls.append(argv)
        if "mkdir" in argv:
            directory = argv[-1]
            assert argv[-6:-1] == ("mkdir", "-p", "-m", "700", "--")
            if not os.path.isdir(directory):
                os.mkdir(directory, 0o700)
                os.chown(directory, UID, GID)
            if then:
                then(directory)
        return ok(argv)

    return FakeRunner(respond)


# ---------------------------------------------------------------- which paths


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("ckpt/run", "not an absolute path"),
        ("/scratch/u/x/../../../etc", "'..' component"),
        ("/scratch/u/./x", "'.' or '..' component"),
        ("/scratch//u", "empty component"),
        ("/scratch/u/", "empty component"),
        ("/scratch/u:/etc", "':'"),
        ("/scratch/u,upperdir=/etc", "','"),
        ("/scratch/u x", "' '"),
        ("/etc/cron.d", "not below an allowed checkpoint root (/scratch)"),
        ("/scratch", "not below an allowed checkpoint root"),
        ("/scratchy/u", "not below an allowed checkpoint root"),
    ],
)
def test_only_canonical_paths_below_an_allowed_root(path: str, words: str) -> None:
    with pytest.raises(ChaosError, match="ckpt-full") as exc:
        checkpoint_target(path, ["/scratch"])
    assert words in str(exc.value)


def test_no_allowed_root_refuses_every_path() -> None:
    with pytest.raises(ChaosError, match="no checkpoint root is allowed"):
        checkpoint_target("/scratch/u", [])


def test_a_symlink_on_the_way_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "link").symlink_to("real")
    assert checkpoint_target(f"{root}/real/x", [str(root)]) == (str(root), ("real", "x"))
    with pytest.raises(ChaosError, match="leads through a symlink"):
        checkpoint_target(f"{root}/link/x", [str(root)])
    with pytest.raises(ChaosError, match="not a canonical path on this node"):
        checkpoint_target(f"{root}/link/x", [f"{root}/link"])


def test_open_dir_never_follows_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "l").symlink_to("a")
    names = tmp_path.parts[1:]
    fd, found = open_dir((*names, "a", "missing", "deeper"))
    os.close(fd)
    assert found == len(names) + 1
    with pytest.raises(ChaosError, match="/l is a symlink or not a directory"):
        open_dir((*names, "l"))


# ---------------------------------------------------------------- made by the user, never chowned


def test_missing_directories_are_made_by_the_jobs_user_and_journalled(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    calls: list[tuple[str, ...]] = []
    ctx = _ctx(tmp_path, mkdir_as_user(calls), (str(root),))
    fd = open_checkpoint_dir(_req(f"{root}/run/x"), ctx, f"{root}/run/x")
    try:
        assert os.fstat(fd).st_uid == UID
    finally:
        os.close(fd)
    made = [c for c in calls if "mkdir" in c]
    assert [c[-1] for c in made] == [f"{root}/run", f"{root}/run/x"]
    assert all(c[:4] == ("setpriv", f"--reuid={UID}", f"--regid={GID}", "--init-groups") for c in made)
    undo = [e.undo for e in ctx.journal.read().entries]
    assert [u.data["path"] for u in undo] == [f"{root}/run", f"{root}/run/x"]
    assert all(u.action == "rmdir_if_empty" and u.data["uid"] == UID for u in undo)
    assert os.stat(root).st_uid == 0  # the root above is left as it was


def test_a_directory_another_node_made_meanwhile_is_fine(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    calls: list[tuple[str, ...]] = []

    def other_node_first(directory: str) -> None:
        if directory.endswith("/run"):  # the job's other node makes x before this one gets to it
            os.mkdir(f"{directory}/x", 0o700)
            os.chown(f"{directory}/x", UID, GID)

    ctx = _ctx(tmp_path, mkdir_as_user(calls, then=other_node_first), (str(root),))
    os.close(open_checkpoint_dir(_req(f"{root}/run/x"), ctx, f"{root}/run/x"))
    assert [c[-1] for c in calls] == [f"{root}/run", f"{root}/run/x"]


def test_an_existing_directory_of_someone_else_is_refused_and_not_chowned(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    (root / "other").mkdir(parents=True)
    os.chown(root / "other", 777, 777)
    calls: list[tuple[str, ...]] = []
    ctx = _ctx(tmp_path, mkdir_as_user(calls), (str(root),))
    with pytest.raises(ChaosError, match="belongs to uid 777, not to the job's user 4242"):
        open_checkpoint_dir(_req(f"{root}/other"), ctx, f"{root}/other")
    assert os.stat(root / "other").st_uid == 777 and not calls


def test_a_symlink_swapped_in_while_directories_are_made_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "ckpt", tmp_path / "etc"
    root.mkdir()
    outside.mkdir()

    def swap(directory: str) -> None:
        if directory.endswith("/run"):  # the user replaces a level between two checks
            os.rename(directory, f"{directory}.old")
            os.symlink(outside, directory)

    calls: list[tuple[str, ...]] = []
    ctx = _ctx(tmp_path, mkdir_as_user(calls, then=swap), (str(root),))
    with pytest.raises(ChaosError, match="symlink or not a directory"):
        open_checkpoint_dir(_req(f"{root}/run/x"), ctx, f"{root}/run/x")
    # What the user made through their own symlink is theirs to make; root chowned and mounted nothing.
    assert os.stat(outside).st_uid == 0


def test_unknown_user_or_missing_root_refuses(tmp_path: Path) -> None:
    calls: list[tuple[str, ...]] = []
    ctx = _ctx(tmp_path, mkdir_as_user(calls), (str(tmp_path / "nowhere"),), uid=None)
    with pytest.raises(ChaosError, match="the job's user is unknown"):
        open_checkpoint_dir(_req("/x"), ctx, f"{tmp_path}/nowhere/x")
    ctx = _ctx(tmp_path, mkdir_as_user(calls), (str(tmp_path / "nowhere"),))
    with pytest.raises(ChaosError, match="does not exist on this node"):
        open_checkpoint_dir(_req("/x"), ctx, f"{tmp_path}/nowhere/x")
    assert not calls


def test_overlay_failure_fails_the_fault_without_a_bind_mount(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ckpt"
    (root / "mine").mkdir(parents=True)
    os.chown(root / "mine", UID, GID)
    monkeypatch.setattr(node_storage, "STAGING_ROOT", tmp_path / "staging")
    monkeypatch.setattr(node_storage, "fill", lambda path, leave: 0)

    def respond(argv: tuple[str, ...]) -> Completed:
        return Completed(argv, 32, "", "wrong fs type") if "overlay" in argv else ok(argv)

    runner = FakeRunner(respond)
    ctx = _ctx(tmp_path, runner, (str(root),))
    with pytest.raises(ChaosError, match="cannot mount the full volume"):
        node_storage.apply_ckpt_full(_req(f"{root}/mine"), ctx)
    (overlay,) = [c for c in runner.calls if "overlay" in c]
    assert overlay[:4] == ("mount", "--no-canonicalize", "-t", "overlay")
    assert overlay[-1].startswith(f"/proc/{os.getpid()}/fd/") and f"lowerdir={overlay[-1]}," in overlay[5]
    assert not any("--bind" in c for c in runner.calls)
    sources = [e.undo.data["source"] for e in ctx.journal.read().entries if e.undo.action == "umount_ours"]
    assert len(set(sources)) == 2 and all(str(s).startswith("slurm-chaos-ckpt-5-") for s in sources)


def test_mount_sources_are_unique() -> None:
    assert mount_source("5", "overlay") != mount_source("5", "overlay")
    assert mount_source("5", "tmpfs").startswith("slurm-chaos-ckpt-5-tmpfs-")


def test_tmpfs_size_leaves_room_for_the_ballast() -> None:
    assert tmpfs_size(0) == SLACK
    assert tmpfs_size(1) == PAGE + SLACK
    assert tmpfs_size(10 * PAGE) == 10 * PAGE + SLACK


# ---------------------------------------------------------------- undo


def _journal(tmp_path: Path, data: dict[str, object]) -> Journal:
    j = Journal(tmp_path, "node1", "5")
    j.record("ckpt-full", "mount", Undo(action="umount_ours", data=data), 1e12)  # type: ignore[arg-type]
    return j


def helper_runner(code: int, out: str = "", err: str = "") -> FakeRunner:
    return FakeRunner(lambda argv: Completed(argv, code, out, err))


def test_undo_unmounts_by_source_through_the_helper(tmp_path: Path) -> None:
    runner = helper_runner(0, "umount /ckpt/a (slurm-chaos-ckpt-5-overlay-ab, mount 76)\n")
    data = {"source": "slurm-chaos-ckpt-5-overlay-ab", "target": "/ckpt/a", "unique": True}
    result = revert(_journal(tmp_path, data), UndoContext(runner), by="test")
    (argv,) = runner.calls
    assert argv[1:] == ("-I", str(MOUNTFD), "umount", "--source", "slurm-chaos-ckpt-5-overlay-ab")
    assert result.undone[0].endswith("umount /ckpt/a (slurm-chaos-ckpt-5-overlay-ab, mount 76)")


def test_undo_of_an_older_journal_tells_its_two_mounts_apart_by_target(tmp_path: Path) -> None:
    runner = helper_runner(mountfd.EXIT_NOT_MOUNTED)
    result = revert(
        _journal(tmp_path, {"source": "slurm-chaos-ckpt-5", "target": "/a"}), UndoContext(runner), by="t"
    )
    assert runner.calls[0][-2:] == ("--target", "/a") and "not mounted" in result.undone[0]


def test_undo_that_is_refused_stays_pending(tmp_path: Path) -> None:
    runner = helper_runner(1, err="/a: nfs is mounted on or under x; not unmounting someone else's mount")
    j = _journal(tmp_path, {"source": "x", "target": "/a", "unique": True})
    result = revert(j, UndoContext(runner), by="test")
    assert "someone else's mount" in result.failed[0] and j.read().pending()


def test_rmdir_of_a_users_directory_runs_as_the_user(tmp_path: Path) -> None:
    j = Journal(tmp_path, "node1", "5")
    j.record(
        "ckpt-full",
        "mkdir",
        Undo(action="rmdir_if_empty", data={"path": "/c/u", "uid": UID, "gid": GID}),
        1e12,
    )
    j.record("ckpt-full", "mkdir", Undo(action="rmdir_if_empty", data={"path": "/run/slurm-chaos/x"}), 1e12)
    runner = FakeRunner(ok)
    revert(j, UndoContext(runner), by="test")
    assert runner.calls == [
        ("rmdir", "--", "/run/slurm-chaos/x"),
        ("setpriv", f"--reuid={UID}", f"--regid={GID}", "--init-groups", "--", "rmdir", "--", "/c/u"),
    ]


# ---------------------------------------------------------------- the unmount helper

MOUNTINFO = """\
22 1 0:21 / / rw - ext4 /dev/vda1 rw
76 22 0:50 / /ckpt/a\\040b rw,relatime - overlay slurm-chaos-ckpt-5-overlay-ab rw,lowerdir=x
77 22 0:51 / /run/slurm-chaos/ckpt-node1-5 rw - tmpfs slurm-chaos-ckpt-5-tmpfs-cd rw
"""


def test_mountinfo_is_parsed_with_its_escapes() -> None:
    mounts = mountfd.parse_mountinfo(MOUNTINFO)
    assert mounts[1] == mountfd.Mount(76, 22, "/ckpt/a b", "overlay", "slurm-chaos-ckpt-5-overlay-ab")
    assert mountfd.find(mounts, "slurm-chaos-ckpt-5-tmpfs-cd") == mounts[2]
    assert mountfd.find(mounts, "slurm-chaos-ckpt-9-tmpfs-00") is None


def test_a_mount_on_or_under_ours_is_left_alone() -> None:
    covered = MOUNTINFO + "80 76 0:60 / /ckpt/a\\040b rw - nfs server:/vol rw\n"
    with pytest.raises(mountfd.Refused, match="server:/vol is mounted on or under"):
        mountfd.find(mountfd.parse_mountinfo(covered), "slurm-chaos-ckpt-5-overlay-ab")


def test_two_mounts_of_one_source_need_the_target() -> None:
    legacy = "22 1 0:21 / / rw - ext4 /dev/vda1 rw\n"
    legacy += "30 22 0:5 / /run/s rw - tmpfs slurm-chaos-ckpt-5 rw\n"
    legacy += "31 22 0:6 / /c/a rw - overlay slurm-chaos-ckpt-5 rw\n"
    mounts = mountfd.parse_mountinfo(legacy)
    with pytest.raises(mountfd.Refused, match="2 mounts"):
        mountfd.find(mounts, "slurm-chaos-ckpt-5")
    assert mountfd.find(mounts, "slurm-chaos-ckpt-5", "/c/a") == mounts[2]


def test_helper_refuses_a_mount_point_that_now_leads_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    info = tmp_path / "mountinfo"
    info.write_text(
        f"22 1 0:21 / / rw - ext4 /dev/vda1 rw\n99 22 0:5 / {tmp_path}/link rw - overlay tag rw\n"
    )
    with pytest.raises(mountfd.Refused, match="changed under mount 99"):
        mountfd.umount("tag", mountinfo=str(info))
    info.write_text(
        f"22 1 0:21 / / rw - ext4 /dev/vda1 rw\n99 22 0:5 / {tmp_path}/real rw - overlay tag rw\n"
    )
    with pytest.raises(mountfd.Refused, match=r"not to tag \(mount 99\)"):
        mountfd.umount("tag", mountinfo=str(info))
    info.write_text("22 1 0:21 / / rw - ext4 /dev/vda1 rw\n")
    assert mountfd.umount("tag", mountinfo=str(info))[0] == mountfd.EXIT_NOT_MOUNTED


def test_fill_stops_at_enospc_and_gives_back_leave(tmp_path: Path) -> None:
    # On a plain directory fill() would fill the disk; a file-size limit makes write(2) fail early
    # with EFBIG instead, which fill() must not swallow.
    import resource
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
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
