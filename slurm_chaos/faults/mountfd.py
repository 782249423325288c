"""Unmount one of slurm-chaos's mounts by its identity, never by a path a user could redirect.

    python3 -I mountfd.py umount --source TAG [--target PATH]

Run as a script through the node's runner, so that it acts in the node's mount namespace (an
undo run from the sandbox host enters it with nsenter); it imports nothing from slurm_chaos.

The mount is found in /proc/self/mountinfo by its source: slurm-chaos gives each of its mounts a
source of its own (only root can mount, so no one else can take it). Its mount point, as the
kernel shows it now (a directory renamed since still counts), is opened one directory at a time
with O_NOFOLLOW; what was opened must be the mount's own root (same mount ID); then umount2 of
``/proc/self/fd/N`` detaches exactly that mount. The detach is lazy: the open descriptor holds the
mount itself, and a straggling process may too. A mount with another mount on or under it is
left alone. ``--target`` only tells apart two mounts of one source (journals of older versions).

Exit status: 0 unmounted, 3 not mounted (nothing to do), 1 refused or failed (stderr says why).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

EXIT_DONE, EXIT_FAILED, EXIT_NOT_MOUNTED = 0, 1, 3
MNT_DETACH = 2
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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
    """The mount of `source`; None if there is none; Refused if it is ambiguous or covered."""
    ours = [m for m in mounts if m.source == source]
    if target is not None and len(ours) > 1:
        ours = [m for m in ours if m.point == target]
    if not ours:
        return None
    if len(ours) > 1:
        raise Refused(f"{len(ours)} mounts of {source}: not telling which is ours")
    (mount,) = ours
    covering = [m for m in mounts if m.parent == mount.id]
    if covering:
        raise Refused(
            f"{mount.point}: {covering[0].source} is mounted on or under {source} (mount {mount.id}); "
            "not unmounting someone else's mount"
        )
    return mount


def open_nofollow(path: str) -> int:
    """A descriptor of the directory `path`, opened from / one name at a time without following links."""
    fd = os.open("/", _DIR_FLAGS)
    try:
        for name in [p for p in path.split("/") if p]:
            nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
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
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(f"/proc/self/fd/{fd}".encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def umount(
    source: str, target: str | None = None, mountinfo: str = "/proc/self/mountinfo"
) -> tuple[int, str]:
    """Unmount the mount of `source`: (exit status, what happened)."""
    with open(mountinfo) as fh:
        mount = find(parse_mountinfo(fh.read()), source, target)
    if mount is None:
        return EXIT_NOT_MOUNTED, f"{source} not mounted"
    try:
        fd = open_nofollow(mount.point)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
            raise Refused(
                f"{mount.point} changed under mount {mount.id} ({exc.strerror}); not unmounting"
            ) from None
        raise
    try:
        found = mount_id(fd)
        if found != mount.id:
            raise Refused(f"{mount.point} now leads to mount {found}, not to {source} (mount {mount.id})")
        detach(fd)
    finally:
        os.close(fd)
    return EXIT_DONE, f"umount {mount.point} ({source}, mount {mount.id})"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mountfd.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("umount")
    u.add_argument("--source", required=True)
    u.add_argument("--target", default=None)
    args = p.parse_args(argv)
    try:
        code, text = umount(args.source, args.target)
    except (Refused, OSError) as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_FAILED
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
