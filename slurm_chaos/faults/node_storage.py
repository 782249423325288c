"""A genuinely full checkpoint volume: a small tmpfs on the checkpoint path, filled with ballast.

The tmpfs is mounted in the node's mount namespace (the prolog runs in slurmd's, and the job's
tasks inherit it), so only this node's job sees it; the shared filesystem underneath is never
filled, which matters when it is shared with other jobs (or, on the sandbox, with the host).
While mounted it hides whatever the path held: a restart from an earlier checkpoint will not
find it, as on a volume that was replaced. The ballast file takes every free block but `leave`
bytes (rounded up to the page size), so statfs, df and write(2) all see a full volume.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from pathlib import Path

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults.journal import Json, Undo, UndoContext, UndoFailed, undo_action
from slurm_chaos.faults.node_base import Controller, JobContext, applies, check, log, num, text
from slurm_chaos.faults.spec import FaultRequest

BALLAST = ".slurm-chaos-ballast"
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


@applies("ckpt-full")
def apply_ckpt_full(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    path = Path(text(req, "path"))
    if not path.is_absolute():
        raise ChaosError(f"ckpt-full: path {path} must be absolute")
    leave = int(num(req, "leave"))
    if not path.exists():
        ctx.journal.record(
            req.name, f"mkdir {path}", Undo(action="rmdir_if_empty", data={"path": str(path)}), ctx.deadline
        )
        path.mkdir(parents=True)
        if ctx.uid is not None:
            os.chown(path, ctx.uid, ctx.gid if ctx.gid is not None else -1)
    source = tmpfs_source(ctx.job_id)
    opts = f"size={tmpfs_size(leave)},mode=0755"
    if ctx.uid is not None:
        opts += f",uid={ctx.uid}"
    if ctx.gid is not None:
        opts += f",gid={ctx.gid}"
    argv = ["mount", "-t", "tmpfs", "-o", opts, source, str(path)]
    ctx.journal.record(
        req.name,
        " ".join(argv),
        Undo(action="umount_ours", data={"target": str(path), "source": source}),
        ctx.deadline,
    )
    res = ctx.runner(argv, timeout=10)
    check(res.ok, " ".join(argv), res.stderr)
    size = fill(path, leave)
    st = os.statvfs(path)
    log.info(
        "ckpt-full: %s is full (%d bytes of ballast, %d bytes free)", path, size, st.f_bavail * st.f_frsize
    )
    return []


@undo_action("umount_ours")
def _umount_ours(data: Mapping[str, Json], ctx: UndoContext) -> str:
    """Unmount our tmpfs (lazily if a straggling process holds it); nothing if it is not mounted."""
    target, source = str(data["target"]), str(data["source"])
    show = ctx.runner(["findmnt", "-rn", "-o", "SOURCE,TARGET"], timeout=10)
    if not show.ok:
        raise UndoFailed(f"findmnt: {show.stderr.strip()}")
    stack = mounts_at(show.stdout, target)
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
