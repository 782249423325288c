"""A genuinely full checkpoint volume: a small, filled tmpfs under an overlay on the checkpoint path.

Everything is mounted in the node's mount namespace (the prolog runs in slurmd's, and the job's
tasks inherit it), so only this node's job sees it; the shared filesystem underneath is never
filled, which matters when it is shared with other jobs (or, on the sandbox, with the host).

A small tmpfs (`leave` bytes, rounded up to the page size, and SLACK for the ballast) is mounted
on a staging directory (``/run/slurm-chaos/ckpt-<node>-<job>``) and all its free space but `leave`
bytes is taken by one ballast file (``fallocate``, at most SLACK bytes: root never writes `leave`
into RAM); an overlay then puts it over the checkpoint path as the writable layer. What the job
writes into the `leave` bytes is charged to the job's own memory cgroup (tmpfs pages are charged
to the writer), and the catalogue caps `leave` (1 GiB). Both mounts are ``nosuid,nodev``. The
job still reads the checkpoints already there (a restart works), but statfs, df and every write
see a full volume. Where overlayfs cannot use the path, the fault fails: a bind mount instead
would hide what the path held.

The path is the job's, so root never acts on it by name (the prolog runs as root):

- it must be canonical (no ``..``, ``.``, ``:``; ``realpath(P) == P``) and strictly below one of
  the site's allowed checkpoint roots (``safety.allowed_checkpoint_roots``, passed to the hooks);
- it is walked from ``/`` one directory at a time with ``openat(O_NOFOLLOW|O_DIRECTORY)``, and
  what is missing is created by the job's user (``setpriv``), never chowned by root; an existing
  directory must already be the user's;
- the overlay is mounted on ``/proc/<pid>/fd/<n>`` of that walk, so a symlink swapped in after
  the checks changes nothing;
- each mount gets a source of its own, and the undo finds the mount by it and unmounts through a
  descriptor (``mountfd.py``), wherever the job may have moved it since, with everything stacked
  on it (a FUSE mount the job made on or under it, whose daemon died with the job) and what hides
  it from above on the job's path below the checkpoint root: the node never goes back into service
  with our overlay and its RAM pinned.
"""

from __future__ import annotations

import errno
import os
import pwd
import secrets
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults import mountfd
from slurm_chaos.faults.journal import Json, Undo, UndoContext, UndoFailed, undo_action
from slurm_chaos.faults.node_base import Controller, JobContext, applies, log, num, text
from slurm_chaos.faults.spec import FaultRequest
from slurm_chaos.paths import path_problem, root_of

BALLAST = ".slurm-chaos-ballast"
STAGING_ROOT = Path("/run/slurm-chaos")
PAGE = 4096
#: Room for the ballast itself, so that the volume is full even when `leave` is 0.
SLACK = 64 * 1024
#: The undo's helper, run as a script in the node's mount namespace.
MOUNTFD = Path(mountfd.__file__)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def mount_source(job_id: str, kind: str) -> str:
    """A mount source no other mount has: the identity the undo finds the mount by."""
    return f"slurm-chaos-ckpt-{job_id}-{kind}-{secrets.token_hex(4)}"


def page_up(n: int) -> int:
    return -(-n // PAGE) * PAGE


def tmpfs_size(leave: int) -> int:
    return page_up(leave) + SLACK


def ballast_size(free: int, leave: int) -> int:
    """The ballast that leaves `leave` bytes (page-rounded) of `free` bytes free."""
    return max(0, free - page_up(leave))


def fill(path: Path, leave: int, most: int = SLACK) -> int:
    """Take the volume's free space but `leave` bytes with one ballast file; returns its size.

    Only the ballast is allocated (never `leave` itself, as writing until ENOSPC would): at most
    `most` bytes, else the volume is not the small tmpfs it should be and nothing is written.
    """
    target = path / BALLAST
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstatvfs(fd)
        free = st.f_bavail * st.f_frsize
        size = ballast_size(free, leave)
        if size > most:
            os.unlink(target)
            raise ChaosError(
                f"ckpt-full: {path} has {free} bytes free, more than a ballast of {most} bytes "
                f"and {page_up(leave)} left: not filling it"
            )
        if size:
            os.posix_fallocate(fd, 0, size)
        return size
    finally:
        os.close(fd)


def checkpoint_target(path: str, roots: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """The allowed root `path` lies strictly below, and the names under it; ChaosError if none.

    The text decides most of it; whether a directory on the way is a symlink only the node can tell.
    """
    problem = path_problem(path)
    if problem:
        raise ChaosError(f"ckpt-full: path {path!r} {problem}: only a canonical absolute path is used")
    if not roots:
        raise ChaosError("ckpt-full: no checkpoint root is allowed on this node (hooks without --ckpt-root)")
    found = root_of(path, roots)
    if found is None:
        raise ChaosError(f"ckpt-full: {path} is not below an allowed checkpoint root ({', '.join(roots)})")
    root, rest = found
    if path_problem(root) or os.path.realpath(root) != root:
        raise ChaosError(
            f"ckpt-full: the allowed checkpoint root {root} is not a canonical path on this node"
        )
    real = os.path.realpath(path)
    if real != path:
        raise ChaosError(f"ckpt-full: {path} leads through a symlink (to {real}): refusing")
    return root, rest


def _open_below(fd: int, name: str, shown: str) -> int | None:
    """openat one directory without following a symlink; None if it does not exist."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ChaosError(f"ckpt-full: {shown} is a symlink or not a directory: refusing") from None
        raise


def open_dir(names: Sequence[str]) -> tuple[int, int]:
    """Walk from / through `names`: (descriptor of the deepest existing directory, how many were found)."""
    fd = os.open("/", _DIR_FLAGS)
    shown = ""
    for i, name in enumerate(names):
        shown = f"{shown}/{name}"
        try:
            nxt = _open_below(fd, name, shown)
        except BaseException:
            os.close(fd)
            raise
        if nxt is None:
            return fd, i
        os.close(fd)
        fd = nxt
    return fd, len(names)


def as_user(uid: int, gid: int) -> list[str]:
    """The argv prefix that runs a command with the job user's credentials, not root's."""
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", "--"]


def _job_gid(ctx: JobContext) -> int:
    if ctx.gid is not None:
        return ctx.gid
    try:
        return pwd.getpwuid(ctx.uid or 0).pw_gid
    except KeyError:
        raise ChaosError(
            f"ckpt-full: the job's group is unknown (uid {ctx.uid} has no passwd entry)"
        ) from None


def _create_as_user(req: FaultRequest, ctx: JobContext, missing: Sequence[str]) -> None:
    """Create each missing directory (parents first) as the job's user, each journalled first."""
    assert ctx.uid is not None
    gid = _job_gid(ctx)
    for directory in missing:
        ctx.journal.record(
            req.name,
            f"mkdir {directory} (as uid {ctx.uid})",
            Undo(action="rmdir_if_empty", data={"path": directory, "uid": ctx.uid, "gid": gid}),
            ctx.deadline,
        )
    for directory in missing:
        # -p: the job's other nodes may make the same directory on a shared filesystem at the same time.
        res = ctx.runner([*as_user(ctx.uid, gid), "mkdir", "-p", "-m", "700", "--", directory], timeout=10)
        if not res.ok:
            raise ChaosError(
                f"ckpt-full: the job's user cannot create {directory}: {res.stderr.strip()[:200]}"
            )


def open_checkpoint_dir(req: FaultRequest, ctx: JobContext, path: str) -> int:
    """A descriptor of the job's checkpoint directory, reached without following a symlink.

    What is missing below the allowed root is created by the job's user; what exists must be theirs.
    """
    if ctx.uid is None:
        raise ChaosError("ckpt-full: the job's user is unknown (no SLURM_JOB_UID): refusing")
    root, rest = checkpoint_target(path, ctx.ckpt_roots)
    names = (*root.split("/")[1:], *rest)
    fd, found = open_dir(names)
    if found < len(names):
        os.close(fd)
        if found < len(names) - len(rest):
            raise ChaosError(f"ckpt-full: the checkpoint root {root} does not exist on this node")
        _create_as_user(req, ctx, ["/" + "/".join(names[: i + 1]) for i in range(found, len(names))])
        fd, found = open_dir(names)
        if found < len(names):
            os.close(fd)
            raise ChaosError(f"ckpt-full: {path} is gone again after its creation: refusing")
    st = os.fstat(fd)
    if ctx.uid != 0 and st.st_uid != ctx.uid:
        os.close(fd)
        raise ChaosError(
            f"ckpt-full: {path} belongs to uid {st.st_uid}, not to the job's user {ctx.uid}: "
            "refusing to mount over it"
        )
    return fd


def _staging_root() -> None:
    """slurm-chaos's own directory: root's, and no one else may write in it."""
    STAGING_ROOT.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(STAGING_ROOT)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise ChaosError(f"ckpt-full: {STAGING_ROOT} is not a directory of root's alone: refusing")


def _mkdir_journalled(req: FaultRequest, ctx: JobContext, path: Path) -> None:
    """Create a directory of slurm-chaos's own (under STAGING_ROOT), journalled first."""
    ctx.journal.record(
        req.name, f"mkdir {path}", Undo(action="rmdir_if_empty", data={"path": str(path)}), ctx.deadline
    )
    path.mkdir(mode=0o700, exist_ok=True)


def _mount(
    req: FaultRequest,
    ctx: JobContext,
    argv: list[str],
    shown: str,
    source: str,
    env: dict[str, str] | None = None,
    below: str | None = None,
) -> bool:
    """Journal, then mount; False if the mount failed (its entry then undoes nothing).

    `below`: the allowed checkpoint root the mount point lies under, where a mount the job makes
    above ours (hiding it) is detached by the undo too."""
    data: dict[str, Json] = {"source": source, "target": shown, "unique": True}
    if below:
        data["below"] = below
    ctx.journal.record(
        req.name, f"mount {source} on {shown}", Undo(action="umount_ours", data=data), ctx.deadline
    )
    res = ctx.runner(argv, timeout=10, env=env)
    if not res.ok:
        log.warning("ckpt-full: %s: %s", " ".join(argv), res.stderr.strip()[:200])
    return res.ok


@applies("ckpt-full")
def apply_ckpt_full(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    path = text(req, "path")
    leave = int(num(req, "leave"))
    root, _ = checkpoint_target(path, ctx.ckpt_roots)
    target = open_checkpoint_dir(req, ctx, path)
    try:
        _fill_over(req, ctx, path, target, leave, root)
    finally:
        os.close(target)
    return []


def _fill_over(req: FaultRequest, ctx: JobContext, path: str, target: int, leave: int, root: str) -> None:
    staging = STAGING_ROOT / f"ckpt-{ctx.node}-{ctx.job_id}"
    # slurm-chaos's own directory stays, as /var/lib/slurm-chaos does: removing it would race
    # with another job creating its staging directory in it.
    _staging_root()
    _mkdir_journalled(req, ctx, staging)
    source = mount_source(ctx.job_id, "tmpfs")
    argv = [
        "mount",
        "-t",
        "tmpfs",
        "-o",
        f"size={tmpfs_size(leave)},mode=0700,nosuid,nodev",
        source,
        str(staging),
    ]
    if not _mount(req, ctx, argv, str(staging), source):
        raise ChaosError(f"ckpt-full: cannot mount a tmpfs on {staging}")
    upper, work = staging / "upper", staging / "work"
    upper.mkdir()
    work.mkdir()
    # The overlay's root takes the upper layer's owner and mode: make them the path's own.
    st = os.fstat(target)
    os.chown(upper, st.st_uid, st.st_gid)
    upper.chmod(st.st_mode & 0o7777)
    size = fill(staging, leave)
    # The kernel resolves /proc/<pid>/fd/<n> to the directory walked to, whatever the path shows now.
    fd_path = f"/proc/{os.getpid()}/fd/{target}"
    opts = f"nosuid,nodev,lowerdir={fd_path},upperdir={upper},workdir={work}"
    overlay = mount_source(ctx.job_id, "overlay")
    argv = ["mount", "--no-canonicalize", "-t", "overlay", "-o", opts, overlay, fd_path]
    # mount(2), as util-linux before 2.39 always did: Debian 13's (2.41) mounts through the fd-based
    # API, where this overlay fails ("wrong fs type, bad option"); mount(2) takes it as before.
    if not _mount(req, ctx, argv, path, overlay, env={"LIBMOUNT_FORCE_MOUNT2": "always"}, below=root):
        raise ChaosError(f"ckpt-full: cannot mount the full volume on {path} (no overlay)")
    log.info(
        "ckpt-full: %s is full (%d bytes of ballast, %d bytes left free)",
        path,
        size,
        page_up(leave),
    )


@undo_action("umount_ours")
def _umount_ours(data: Mapping[str, Json], ctx: UndoContext) -> str:
    """Detach our mount, found by its source wherever it is now, with what is stacked on it
    (see mountfd.py); nothing if gone."""
    target, source = str(data.get("target", "")), str(data["source"])
    argv = [sys.executable, "-I", str(MOUNTFD), "umount", "--source", source]
    if not data.get("unique") and target:
        argv += ["--target", target]  # older journals: one source for the tmpfs and the overlay
    if data.get("below"):
        argv += ["--below", str(data["below"])]
    res = ctx.runner(argv, timeout=20)
    if res.returncode == mountfd.EXIT_NOT_MOUNTED:
        return f"{target}: {source} not mounted"
    if res.ok:
        return res.stdout.strip()
    raise UndoFailed(f"{target}: {(res.stderr or res.stdout).strip()[:200]}")


@undo_action("rmdir_if_empty")
def _rmdir_if_empty(data: Mapping[str, Json], ctx: UndoContext) -> str:
    """Remove a directory slurm-chaos created, unless the job wrote something into it.

    A directory made for the job's user is removed as that user: its path is theirs to redirect.
    """
    path = str(data["path"])
    uid, gid = data.get("uid"), data.get("gid")
    user = as_user(int(uid), int(gid)) if isinstance(uid, int) and isinstance(gid, int) else []
    res = ctx.runner([*user, "rmdir", "--", path], timeout=10)
    if res.ok or "No such file" in res.stderr:
        return f"rmdir {path}"
    if "busy" in res.stderr:  # another node's tmpfs still sits on it: retried by cleanup
        raise UndoFailed(f"rmdir {path}: {res.stderr.strip()[:120]}")
    return f"kept {path}: {res.stderr.strip()[:120]}"
