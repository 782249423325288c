"""Unmount one of slurm-chaos's mounts by its identity, never by a path a user could redirect.

    python3 -I mountfd.py umount --source TAG [--target PATH] [--below ROOT]

Run as a script through the node's runner, so that it acts in the node's mount namespace (an
undo run from the sandbox host enters it with nsenter); it imports nothing from slurm_chaos.

The mount is found in /proc/self/mountinfo by its source: slurm-chaos gives each of its mounts a
source of its own (only root can mount, so no one else can take it). Its mount point, as the
kernel shows it now (a directory renamed since still counts), is opened one directory at a time
with O_PATH|O_NOFOLLOW; what was opened must be the mount's own root (same mount ID); then
umount2 of ``/proc/self/fd/N`` with MNT_DETACH detaches exactly that mount, and with it every
mount on or under it.

Everything stacked on our mount is ours to detach: a job can mount there (FUSE through a setuid
``fusermount3``), and the mount outlives its daemon. Where such a mount covers ours (mounted on
its root), the path leads to that mount first: it is detached, as long as it lies on or under
ours, and the walk starts again. With ``--below ROOT`` (the allowed checkpoint root a job's
path lies under), a mount that hides ours from above (mounted, after ours, on a directory of
our mount point's path strictly below ROOT) is detached first too: only the job's user or root
can mount there while our fault is in place. Anything else the path leads to is someone else's:
refused. Mounts are read in the namespace's order, which is the order they were made in.

Exit status: 0 unmounted, 3 not mounted (nothing to do), 1 refused or failed (stderr says why).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

EXIT_DONE, EXIT_FAILED, EXIT_NOT_MOUNTED = 0, 1, 3
MNT_DETACH = 2
#: O_PATH: a FUSE mount whose daemon is gone still gives its root (nothing is asked of the daemon).
_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: More mounts stacked on ours than this, and the undo gives up (each pass detaches at least one).
MAX_STACKED = 64


class Refused(Exception):
    """The mount is not (or no longer) safely ours to unmount."""


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo."""

    id: int
    parent: int
    point: str
    fstype: str
    source: str


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    out = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if len(fields) < sep + 3:
            continue
        out.append(
            Mount(
                int(fields[0]),
                int(fields[1]),
                _unescape(fields[4]),
                fields[sep + 1],
                _unescape(fields[sep + 2]),
            )
        )
    return out


def find(mounts: Sequence[Mount], source: str, target: str | None = None) -> Mount | None:
    """The mount of `source`; None if there is none; Refused if it is ambiguous."""
    ours = [m for m in mounts if m.source == source]
    if target is not None and len(ours) > 1:
        ours = [m for m in ours if m.point == target]
    if not ours:
        return None
    if len(ours) > 1:
        raise Refused(f"{len(ours)} mounts of {source}: not telling which is ours")
    return ours[0]


def subtree(mounts: Sequence[Mount], top: Mount) -> set[int]:
    """The IDs of `top` and of every mount on or under it."""
    ids = {top.id}
    grew = True
    while grew:
        more = {m.id for m in mounts if m.parent in ids and m.id not in ids}
        grew = bool(more)
        ids |= more
    return ids


def _on_path(point: str, path: str) -> bool:
    """`point` is `path` or a directory above it."""
    return path == point or path.startswith(point.rstrip("/") + "/")


def hiding(mounts: Sequence[Mount], ours: Mount, below: str | None) -> list[Mount]:
    """Mounts made after ours on a directory of its mount point's path strictly below `below`
    (the outermost first; of a stack on one directory, the top first): they hide ours."""
    if not below:
        return []
    after = list(mounts)[list(mounts).index(ours) + 1 :]
    inside = subtree(mounts, ours)
    found = [
        m
        for m in after
        if m.id not in inside
        and _on_path(m.point, ours.point)
        and m.point != below.rstrip("/")
        and _on_path(below, m.point)
    ]
    order = {m.id: i for i, m in enumerate(found)}
    return sorted(found, key=lambda m: (m.point.count("/"), -order[m.id]))


@dataclass(frozen=True)
class Step:
    """One detach: the path to open, the mounts it may lead to, and whether that ends the undo."""

    point: str
    allowed: frozenset[int]
    ours: Mount
    what: str


def next_step(mounts: Sequence[Mount], source: str, target: str | None, below: str | None) -> Step | None:
    """What to detach next to take down the mount of `source`; None when it is not mounted."""
    ours = find(mounts, source, target)
    if ours is None:
        return None
    hiders = hiding(mounts, ours, below)
    if hiders:
        top = hiders[0]
        return Step(
            top.point,
            frozenset(i for h in hiders for i in subtree(mounts, h)),
            ours,
            f"{top.source} ({top.fstype}, mount {top.id}) hiding {source}",
        )
    return Step(ours.point, frozenset(subtree(mounts, ours)), ours, f"{source} (mount {ours.id})")


def open_nofollow(path: str) -> int:
    """An O_PATH descriptor of the directory `path`, opened from / one name at a time without
    following links."""
    fd = os.open("/", _PATH_FLAGS)
    try:
        for name in [p for p in path.split("/") if p]:
            nxt = os.open(name, _PATH_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError:
        os.close(fd)
        raise
    return fd


def mount_id(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as fh:
        for line in fh:
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    raise Refused(f"no mnt_id in /proc/self/fdinfo/{fd}")


def detach(fd: int) -> None:
    """Lazily detach the mount `fd` is the root of, with every mount on or under it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(f"/proc/self/fd/{fd}".encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _detach_step(step: Step) -> int:
    """Open the step's path, check where it leads, detach that; returns the mount ID detached."""
    try:
        fd = open_nofollow(step.point)
    except OSError as exc:
        raise Refused(
            f"{step.point} changed under mount {step.ours.id} ({exc.strerror}); not unmounting"
        ) from None
    try:
        found = mount_id(fd)
        if found not in step.allowed:
            raise Refused(
                f"{step.point} now leads to mount {found}, not to {step.what} or a mount on it; "
                "not unmounting someone else's mount"
            )
        detach(fd)
    finally:
        os.close(fd)
    return found


def umount(
    source: str,
    target: str | None = None,
    mountinfo: str = "/proc/self/mountinfo",
    below: str | None = None,
) -> tuple[int, str]:
    """Detach the mount of `source` and everything stacked on it: (exit status, what happened)."""
    done: list[str] = []
    for _ in range(MAX_STACKED):
        with open(mountinfo) as fh:
            step = next_step(parse_mountinfo(fh.read()), source, target, below)
        if step is None:
            if not done:
                return EXIT_NOT_MOUNTED, f"{source} not mounted"
            return EXIT_DONE, "; ".join(done)
        found = _detach_step(step)
        ours = found == step.ours.id
        shown = (
            f"umount {step.point} ({source}, mount {found})"
            if ours
            else f"detached mount {found} on {step.point}"
        )
        done.append(shown)
        if ours:
            return EXIT_DONE, "; ".join(done)
    raise Refused(f"{source}: more than {MAX_STACKED} mounts stacked on it; not all detached")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mountfd.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("umount")
    u.add_argument("--source", required=True)
    u.add_argument("--target", default=None)
    u.add_argument("--below", default=None)
    args = p.parse_args(argv)
    try:
        code, text = umount(args.source, args.target, below=args.below)
    except (Refused, OSError) as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_FAILED
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
