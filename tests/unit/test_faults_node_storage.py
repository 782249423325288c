"""A full checkpoint volume: which paths root acts on, how they are walked and made, and the undo
that unmounts only our own mount, found by its identity."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
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
    ballast_size,
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
    mounts: list[tuple[str, ...]] = []

    def respond(argv: tuple[str, ...]) -> Completed:
        if argv[0] == "mount":
            mounts.append(argv)
            if "tmpfs" in argv:  # the staging directory, made as the tmpfs would be
                (Path(argv[-1]) / "x").mkdir(exist_ok=True)
        return Completed(argv, 32, "", "wrong fs type") if "overlay" in argv else ok(argv)

    runner = FakeRunner(respond)
    ctx = _ctx(tmp_path, runner, (str(root),))
    with pytest.raises(ChaosError, match="cannot mount the full volume"):
        node_storage.apply_ckpt_full(_req(f"{root}/mine"), ctx)
    (overlay,) = [c for c in runner.calls if "overlay" in c]
    assert overlay[:4] == ("mount", "--no-canonicalize", "-t", "overlay")
    assert overlay[-1].startswith(f"/proc/{os.getpid()}/fd/") and f"lowerdir={overlay[-1]}," in overlay[5]
    assert not any("--bind" in c for c in runner.calls)
    # Neither our tmpfs nor our overlay lets a set-uid file or a device node on it act as one.
    assert all({"nosuid", "nodev"} <= set(m[m.index("-o") + 1].split(",")) for m in mounts), mounts
    undo = [e.undo.data for e in ctx.journal.read().entries if e.undo.action == "umount_ours"]
    sources = [u["source"] for u in undo]
    assert len(set(sources)) == 2 and all(str(s).startswith("slurm-chaos-ckpt-5-") for s in sources)
    # The overlay's undo may detach what the job mounts above it on its path below the allowed root.
    assert [u.get("below") for u in undo] == [None, str(root)]


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


def test_undo_passes_the_checkpoint_root_the_overlay_lies_under(tmp_path: Path) -> None:
    runner = helper_runner(0, "umount /ckpt/a (tag, mount 76)\n")
    data = {"source": "tag", "target": "/ckpt/a", "unique": True, "below": "/ckpt"}
    revert(_journal(tmp_path, data), UndoContext(runner), by="test")
    assert runner.calls[0][-4:] == ("--source", "tag", "--below", "/ckpt")


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


# The allowed checkpoint root /ckpt (a filesystem of its own), the job's overlay below it, our tmpfs.
STACKED = """\
22 1 0:21 / / rw - ext4 /dev/vda1 rw
30 22 0:30 / /ckpt rw - nfs server:/ckpt rw
76 30 0:50 / /ckpt/u/a/run rw,nosuid,nodev - overlay slurm-chaos-ckpt-5-overlay-ab rw
77 22 0:51 / /run/slurm-chaos/ckpt-node1-5 rw,nosuid,nodev - tmpfs slurm-chaos-ckpt-5-tmpfs-cd rw
"""
OURS = "slurm-chaos-ckpt-5-overlay-ab"
FUSE = "- fuse.squashfuse squashfuse rw,user_id=1001,group_id=1001"


def test_a_mount_under_ours_goes_with_ours() -> None:
    """squashfuse x.sqfs ckpt/m: our mount is detached with everything under it."""
    under = STACKED + f"80 76 0:60 / /ckpt/u/a/run/m rw,nosuid,nodev {FUSE}\n"
    step = mountfd.next_step(mountfd.parse_mountinfo(under), OURS, None, "/ckpt")
    assert step is not None
    assert (step.point, step.allowed, step.ours.id) == ("/ckpt/u/a/run", frozenset({76, 80}), 76)


def test_mounts_on_ours_are_ours_to_detach() -> None:
    """Two FUSE mounts stacked on our overlay's root: the path leads to the top one, which may go."""
    on = STACKED + f"80 76 0:60 / /ckpt/u/a/run rw {FUSE}\n81 80 0:61 / /ckpt/u/a/run rw {FUSE}\n"
    step = mountfd.next_step(mountfd.parse_mountinfo(on), OURS, None, None)
    assert step is not None and step.allowed == frozenset({76, 80, 81})


def test_a_mount_made_after_ours_above_it_below_the_root_hides_it_and_goes_first() -> None:
    """squashfuse x.sqfs a (the directory above the overlay): it hides ours; detached first."""
    above = STACKED + f"80 30 0:60 / /ckpt/u/a rw {FUSE}\n81 80 0:61 / /ckpt/u/a rw {FUSE}\n"
    mounts = mountfd.parse_mountinfo(above)
    step = mountfd.next_step(mounts, OURS, None, "/ckpt")
    assert step is not None and step.point == "/ckpt/u/a" and step.allowed == frozenset({80, 81})
    assert "hiding" in step.what
    # Without the root the path lies under (older journals, our tmpfs), nothing above ours is ours.
    step = mountfd.next_step(mounts, OURS, None, None)
    assert step is not None and step.point == "/ckpt/u/a/run" and step.allowed == frozenset({76})


@pytest.mark.parametrize(
    "line",
    [
        "80 22 0:60 / /ckpt rw - nfs other:/ckpt rw",  # on the allowed root itself: the site's
        "80 22 0:60 / /ckpt/u/ab rw - fuse x rw",  # a sibling path, not above ours
        "80 30 0:60 / /ckpt/u/a/run2 rw - fuse x rw",
        "80 22 0:60 / /elsewhere rw - fuse x rw",
    ],
)
def test_mounts_beside_or_at_the_root_are_not_ours(line: str) -> None:
    mounts = mountfd.parse_mountinfo(STACKED + line + "\n")
    step = mountfd.next_step(mounts, OURS, None, "/ckpt")
    assert step is not None and step.point == "/ckpt/u/a/run" and step.allowed == frozenset({76})


def test_a_mount_above_ours_made_before_it_is_not_ours() -> None:
    earlier = STACKED.replace("76 30", "80 30 0:60 / /ckpt/u rw - nfs other:/u rw\n76 80", 1)
    step = mountfd.next_step(mountfd.parse_mountinfo(earlier), OURS, None, "/ckpt")
    assert step is not None and step.point == "/ckpt/u/a/run" and step.allowed == frozenset({76})


class FakeKernel:
    """Path walks and lazy detaches over a mountinfo file: a lookup enters the top mount stacked
    on each directory; one inside a FUSE mount fails (its daemon is gone with the job)."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        path.write_text(text)
        self.fds: dict[int, int] = {}
        self.detached: list[int] = []

    def mounts(self) -> list[mountfd.Mount]:
        return mountfd.parse_mountinfo(self.path.read_text())

    def open(self, path: str) -> int:
        mounts = self.mounts()
        cur, prefix = mounts[0], ""
        for name in [p for p in path.split("/") if p]:
            if cur.fstype.startswith("fuse"):
                raise OSError(errno.ENOTCONN, os.strerror(errno.ENOTCONN))
            prefix += "/" + name
            while on := [m for m in mounts if m.parent == cur.id and m.point == prefix]:
                cur = on[-1]
        fd = os.open(os.devnull, os.O_RDONLY)
        self.fds[fd] = cur.id
        return fd

    def detach(self, fd: int) -> None:
        mounts = self.mounts()
        (top,) = [m for m in mounts if m.id == self.fds[fd]]
        gone = mountfd.subtree(mounts, top)
        self.detached.append(top.id)
        kept = [line for line in self.path.read_text().splitlines() if int(line.split()[0]) not in gone]
        self.path.write_text("".join(f"{line}\n" for line in kept))


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], FakeKernel]]:
    def make(text: str) -> FakeKernel:
        k = FakeKernel(tmp_path / "mountinfo", text)
        monkeypatch.setattr(mountfd, "open_nofollow", k.open)
        monkeypatch.setattr(mountfd, "mount_id", lambda fd: k.fds[fd])
        monkeypatch.setattr(mountfd, "detach", k.detach)
        return k

    yield make


@pytest.mark.parametrize(
    ("stacked", "detached"),
    [
        ("80 76 0:60 / /ckpt/u/a/run/m rw {fuse}\n", [76]),  # under ours: goes with it
        ("80 76 0:60 / /ckpt/u/a/run rw {fuse}\n81 80 0:61 / /ckpt/u/a/run rw {fuse}\n", [81, 80, 76]),
        ("80 30 0:60 / /ckpt/u/a rw {fuse}\n", [80, 76]),  # hides ours from above
        ("80 30 0:60 / /ckpt/u rw {fuse}\n81 76 0:61 / /ckpt/u/a/run rw {fuse}\n", [80, 81, 76]),
    ],
)
def test_undo_detaches_everything_stacked_on_our_mount(
    kernel: Callable[[str], FakeKernel], stacked: str, detached: list[int]
) -> None:
    k = kernel(STACKED + stacked.format(fuse=FUSE))
    code, said = mountfd.umount(OURS, mountinfo=str(k.path), below="/ckpt")
    assert code == mountfd.EXIT_DONE and said.endswith(f"({OURS}, mount 76)")
    assert k.detached == detached
    assert [m.id for m in k.mounts()] == [22, 30, 77]  # as before the fault


def test_undo_refuses_a_path_that_leads_to_someone_elses_mount(kernel: Callable[[str], FakeKernel]) -> None:
    """A FUSE mount above ours without the root it lies under: not ours, so ours stays (refused)."""
    k = kernel(STACKED + f"80 30 0:60 / /ckpt/u/a rw {FUSE}\n")
    with pytest.raises(mountfd.Refused, match="changed under mount 76"):
        mountfd.umount(OURS, mountinfo=str(k.path))
    assert k.detached == [] and [m.id for m in k.mounts()] == [22, 30, 76, 77, 80]


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


STACK_SCRIPT = """
set -e
T=$1
mount -t tmpfs test-ckpt-root "$T/ckpt"
mkdir -p "$T/ckpt/u/a/run"
mount -t tmpfs -o nosuid,nodev slurm-chaos-test-ours "$T/ckpt/u/a/run"
mkdir "$T/ckpt/u/a/run/m"
mount -t tmpfs user-under "$T/ckpt/u/a/run/m"
mount -t tmpfs user-on "$T/ckpt/u/a/run"
mount -t tmpfs user-above "$T/ckpt/u/a"
set +e
{py} -I {mountfd} umount --source slurm-chaos-test-ours $2
echo "rc=$?"
grep -F " $T/" /proc/self/mountinfo | cut -d' ' -f5
"""


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m (a private mount namespace)")
@pytest.mark.parametrize("below", [True, False])
def test_undo_in_a_real_mount_namespace(tmp_path: Path, below: bool) -> None:
    """Real mounts in a private namespace: on, under and above ours; all gone, or ours refused."""
    (tmp_path / "ckpt").mkdir()
    script = STACK_SCRIPT.format(py=sys.executable, mountfd=MOUNTFD)
    extra = f"--below {tmp_path}/ckpt" if below else ""
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(tmp_path), extra]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    left = [line for line in res.stdout.splitlines() if not line.startswith(("rc=", "umount", "detached"))]
    if below:
        assert "rc=0" in res.stdout, res
        assert left == [f"{tmp_path}/ckpt"], res  # only the root's own filesystem
    else:
        assert "rc=1" in res.stdout and "not unmounting" in res.stderr, res
        assert f"{tmp_path}/ckpt/u/a/run" in left, res


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


def test_ballast_is_the_free_space_but_leave() -> None:
    assert ballast_size(SLACK, 0) == SLACK
    assert ballast_size(SLACK + PAGE, 1) == SLACK
    assert ballast_size(SLACK + 10 * PAGE, 10 * PAGE) == SLACK
    assert ballast_size(SLACK - PAGE, 0) == SLACK - PAGE  # directories took some of it
    assert ballast_size(0, PAGE) == 0


class FakeVolume:
    """A volume of `size` bytes: write(2) fails with ENOSPC past it; what is allocated is counted."""

    def __init__(self, size: int) -> None:
        self.size, self.allocated, self.peak = size, 0, 0

    def statvfs(self, _: object) -> os.statvfs_result:
        blocks = self.size // PAGE
        return os.statvfs_result((PAGE, PAGE, blocks, blocks, blocks, 100, 100, 100, 0, 255))

    def write(self, fd: int, data: bytes) -> int:
        if self.allocated + len(data) > self.size:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.allocated += len(data)
        self.peak = max(self.peak, self.allocated)
        return len(data)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        self.allocated = max(self.allocated, offset + length)
        self.peak = max(self.peak, self.allocated)


@pytest.mark.parametrize("leave", [0, 1, 10 << 20, 1 << 30])
def test_fill_allocates_only_the_ballast_whatever_leave_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, leave: int
) -> None:
    """leave=900G once made root write 900 GB into RAM (until ENOSPC, then truncate): now the
    ballast alone is allocated, never more than SLACK bytes."""
    volume = FakeVolume(tmpfs_size(leave))
    monkeypatch.setattr(os, "statvfs", volume.statvfs)
    monkeypatch.setattr(os, "fstatvfs", volume.statvfs)
    monkeypatch.setattr(os, "write", volume.write)
    monkeypatch.setattr(os, "posix_fallocate", volume.fallocate)
    monkeypatch.setattr(os, "ftruncate", lambda fd, n: setattr(volume, "allocated", n))
    assert fill(tmp_path, leave) == SLACK
    assert volume.peak == volume.allocated == SLACK


def test_fill_refuses_a_volume_larger_than_its_ballast(tmp_path: Path) -> None:
    # A plain directory (the disk, not our small tmpfs) is never filled: nothing is written. A
    # file-size limit stands guard, so that a fill that writes anyway fails early (EFBIG).
    import resource
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    try:
        with pytest.raises(ChaosError, match="more than a ballast of 65536 bytes"):
            fill(tmp_path, 0)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert not (tmp_path / node_storage.BALLAST).exists()


FILL_SCRIPT = """
set -e
mount -t tmpfs -o size={size},nosuid,nodev test-ballast "$1"
mkdir "$1/upper" "$1/work"
{py} -c 'import os, sys; from pathlib import Path; from slurm_chaos.faults.node_storage import fill
print("BALLAST", fill(Path(sys.argv[1]), int(sys.argv[2])))
st = os.statvfs(sys.argv[1]); print("FREE", st.f_bavail * st.f_frsize)' "$1" {leave}
"""


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m (a private mount namespace)")
@pytest.mark.parametrize("leave", [0, 5000, 1 << 20])
def test_fill_on_a_real_tmpfs_leaves_exactly_leave_free(tmp_path: Path, leave: int) -> None:
    script = FILL_SCRIPT.format(size=tmpfs_size(leave), py=sys.executable, leave=leave)
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(tmp_path)]
    root = Path(node_storage.__file__).parents[2]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=root)
    assert res.returncode == 0, res.stderr
    assert f"FREE {node_storage.page_up(leave)}" in res.stdout, res.stdout
    (ballast,) = [int(line.split()[1]) for line in res.stdout.splitlines() if line.startswith("BALLAST")]
    assert 0 < ballast <= SLACK
