"""A genuinely full checkpoint volume: a small, filled tmpfs under an overlay on the checkpoint path.

Everything is mounted in the node's mount namespace (the prolog runs in slurmd's, and the job's
tasks inherit it), so only this node's job sees it; the shared filesystem underneath is never
filled, which matters when it is shared with other jobs (or, on the sandbox, with the host).

A small tmpfs is mounted on a staging directory (``/run/slurm-chaos/ckpt-<node>-<job>``) and
filled with ballast but `leave` bytes (rounded up to the page size); an overlay then puts it over
the checkpoint path as the writable layer. The job still reads the checkpoints already there (a
restart works), but statfs, df and every write see a full volume. Where overlayfs cannot use the
path as its lower layer, the tmpfs is bind-mounted over the path instead, hiding what it held.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from pathlib import Path

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults.journal import Json, Undo, UndoContext, UndoFailed, undo_action
from slurm_chaos.faults.node_base import Controller, JobContext, applies, log, num, text
from slurm_chaos.faults.spec import FaultRequest

BALLAST = ".slurm-chaos-ballast"
STAGING_ROOT = Path("/run/slurm-chaos")
PAGE = 4096
#: Room for the ballast itself, so that the volume is full even when `leave` is 0.
SLACK = 64 * 1024


def tmpfs_source(job_id: str) -> str:
    """The mount source that names the tmpfs as ours in /proc/self/mountinfo and findmnt."""
    return f"slurm-chaos-ckpt-{job_id}"


def tmpfs_size(leave: int) -> int:
    return -(-leave // PAGE) * PAGE + SLACK


def fill(path: Path, leave: int) -> int:
    """Write ballast until the volume is full, then give back `leave` bytes; returns ballast size."""
    target = path / BALLAST
    chunk = b"\0" * 65536
    written = 0
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            try:
                n = os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
            if n == 0:
                break
            written += n
        keep = max(0, written - (-(-leave // PAGE) * PAGE))
        os.ftruncate(fd, keep)
        return keep
    finally:
        os.close(fd)


def mounts_at(show: str, target: str) -> list[str]:
    """Sources mounted on `target` in `findmnt -rn -o SOURCE,TARGET` output, bottom to top."""
    out = []
    for line in show.splitlines():
        parts = line.split(" ", 1)
        # findmnt -r escapes spaces in paths as \x20.
        if len(parts) == 2 and parts[1].replace("\\x20", " ") == target:
            out.append(parts[0])
    return out


def _mkdir_journalled(req: FaultRequest, ctx: JobContext, path: Path, owner: bool) -> None:
    """Create `path` and any missing parents, each journalled (undo removes them deepest first)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        ctx.journal.record(
            req.name,
            f"mkdir {directory}",
            Undo(action="rmdir_if_empty", data={"path": str(directory)}),
            ctx.deadline,
        )
        directory.mkdir(exist_ok=True)
        if owner and ctx.uid is not None:
            os.chown(directory, ctx.uid, ctx.gid if ctx.gid is not None else -1)


def check_user_path(path: Path, uid: int | None) -> None:
    """Refuse a checkpoint path the job's user could not create or write themselves.

    The prolog runs as root and mounts on the path the SPEC names: without this a user allowed to
    inject could cover /etc, or have root create directories for them in places they cannot write.
    """
    if uid is None or uid == 0:
        return
    existing = next(p for p in (path, *path.parents) if p.exists())
    st = existing.stat()
    if st.st_uid != uid:
        raise ChaosError(
            f"ckpt-full: {existing} (on the way to {path}) belongs to uid {st.st_uid}, not to the job's "
            f"user {uid}: refusing to mount over or create directories there"
        )


def _mount(req: FaultRequest, ctx: JobContext, argv: list[str], target: Path, source: str) -> bool:
    """Journal, then mount; False if the mount failed (its entry then undoes nothing)."""
    ctx.journal.record(
        req.name,
        " ".join(argv),
        Undo(action="umount_ours", data={"target": str(target), "source": source}),
        ctx.deadline,
    )
    res = ctx.runner(argv, timeout=10)
    if not res.ok:
        log.warning("ckpt-full: %s: %s", " ".join(argv), res.stderr.strip()[:200])
    return res.ok


@applies("ckpt-full")
def apply_ckpt_full(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    path = Path(text(req, "path"))
    if not path.is_absolute():
        raise ChaosError(f"ckpt-full: path {path} must be absolute")
    leave = int(num(req, "leave"))
    source = tmpfs_source(ctx.job_id)
    check_user_path(path, ctx.uid)
    _mkdir_journalled(req, ctx, path, owner=True)
    staging = STAGING_ROOT / f"ckpt-{ctx.node}-{ctx.job_id}"
    # slurm-chaos's own directory stays, as /var/lib/slurm-chaos does: removing it would race
    # with another job creating its staging directory in it.
    STAGING_ROOT.mkdir(mode=0o700, parents=True, exist_ok=True)
    _mkdir_journalled(req, ctx, staging, owner=False)
    argv = ["mount", "-t", "tmpfs", "-o", f"size={tmpfs_size(leave)},mode=0700", source, str(staging)]
    if not _mount(req, ctx, argv, staging, source):
        raise ChaosError(f"ckpt-full: cannot mount a tmpfs on {staging}")
    upper, work = staging / "upper", staging / "work"
    upper.mkdir()
    work.mkdir()
    # The overlay's root takes the upper layer's owner and mode: make them the path's own.
    st = os.stat(path)
    os.chown(upper, st.st_uid, st.st_gid)
    upper.chmod(st.st_mode & 0o7777)
    size = fill(staging, leave)
    opts = f"lowerdir={path},upperdir={upper},workdir={work}"
    if not _mount(req, ctx, ["mount", "-t", "overlay", "-o", opts, source, str(path)], path, source):
        log.warning("ckpt-full: no overlay on %s: the full tmpfs hides what the path held", path)
        bind = ["mount", "--bind", str(upper), str(path)]
        if not _mount(req, ctx, bind, path, source):
            raise ChaosError(f"ckpt-full: cannot mount the full volume on {path}")
    vfs = os.statvfs(path)
    log.info(
        "ckpt-full: %s is full (%d bytes of ballast, %d bytes free)", path, size, vfs.f_bavail * vfs.f_frsize
    )
    return []


@undo_action("umount_ours")
def _umount_ours(data: Mapping[str, Json], ctx: UndoContext) -> str:
    """Unmount our tmpfs (lazily if a straggling process holds it); nothing if it is not mounted."""
    target, source = str(data["target"]), str(data["source"])
    show = ctx.runner(["findmnt", "-rn", "-o", "SOURCE,TARGET"], timeout=10)
    if not show.ok:
        raise UndoFailed(f"findmnt: {show.stderr.strip()}")
    # A bind mount of a tmpfs subdirectory shows as SOURCE[/subdir].
    stack = [src.split("[", 1)[0] for src in mounts_at(show.stdout, target)]
    if source not in stack:
        return f"{target}: {source} not mounted"
    if stack[-1] != source:
        raise UndoFailed(
            f"{target}: {stack[-1]} is mounted over {source}; not unmounting someone else's mount"
        )
    res = ctx.runner(["umount", target], timeout=20)
    if res.ok:
        return f"umount {target}"
    lazy = ctx.runner(["umount", "-l", target], timeout=20)
    if not lazy.ok:
        raise UndoFailed(f"umount {target}: {res.stderr.strip()}; umount -l: {lazy.stderr.strip()}")
    return f"umount -l {target} (busy: {res.stderr.strip()[:80]})"


@undo_action("rmdir_if_empty")
def _rmdir_if_empty(data: Mapping[str, Json], ctx: UndoContext) -> str:
    """Remove a directory slurm-chaos created, unless the job wrote something into it."""
    path = str(data["path"])
    res = ctx.runner(["rmdir", path], timeout=10)
    if res.ok or "No such file" in res.stderr:
        return f"rmdir {path}"
    if "busy" in res.stderr:  # another node's tmpfs still sits on it: retried by cleanup
        raise UndoFailed(f"rmdir {path}: {res.stderr.strip()[:120]}")
    return f"kept {path}: {res.stderr.strip()[:120]}"
