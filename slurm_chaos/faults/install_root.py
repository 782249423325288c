"""Where ``plugin install`` writes: this machine, or a node image's tree (``--root DIR``).

Sites roll software out with node images (a Warewulf container, a chroot) or configuration
management: ``plugin install --root DIR`` writes every file at DIR + its absolute path, while every
path written *into* a file (the plugstack.conf line, the hooks, the policy's path in
job_submit.lua, the interpreter and import root the hooks run) is the path the booted node sees.

A path under the image is resolved component by component as the booted node would resolve it:
a symlink's absolute target is read from the image's root, a relative one from where it is, and a
link that climbs above the image's root (``../../..``) is refused before anything is written. So
no write and no read follows a link out of DIR. A file is written into its directory so resolved
(no symlink left in it) through a temporary file made with ``O_EXCL`` (``O_NOFOLLOW`` where the
writer already used it) and renamed over its name, so a link of that name is replaced, not
followed: the writers of plugin_install, install_hooks and the health check do the same on a live
node. The image is root's: nobody but root could swap a directory for a link while we write.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath

from slurm_chaos.errors import UsageError

#: Links followed on one path before it is refused (the kernel's own limit).
MAX_LINKS = 40


@dataclass(frozen=True)
class InstallRoot:
    """'/' (this machine, as ``plugin install`` always did) or an image's root directory."""

    path: Path = Path("/")

    @classmethod
    def at(cls, directory: str | Path, option: str = "--root") -> InstallRoot:
        """The image root `directory` (an existing directory, taken where it really is); UsageError
        naming `option` otherwise."""
        given = Path(directory)
        if not given.is_absolute():
            given = Path.cwd() / given
        if not given.exists():
            raise UsageError(f"{option}: {directory} does not exist")
        if not given.is_dir():
            raise UsageError(f"{option}: {directory} is not a directory")
        return cls(given.resolve())

    @property
    def is_image(self) -> bool:
        return self.path != Path("/")

    def host(self, node_path: str | PurePath) -> Path:
        """Where the node's absolute `node_path` is on this machine: itself on a live install; under
        an image, every existing component resolved inside it (a missing tail is kept as given).
        UsageError for a link that climbs out of the image, or loops."""
        path = PurePosixPath(node_path)
        if not path.is_absolute():
            raise UsageError(f"{node_path}: not an absolute path")
        if not self.is_image:
            return Path(path)
        cur = self.path
        todo = list(path.parts[1:])
        hops = 0
        via = "'..'"  # what led above the root: the path itself, or the last link followed
        while todo:
            part = todo.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if cur == self.path:
                    raise UsageError(
                        f"--root {self.path}: {node_path}: {via} climbs out of the image: refused"
                    )
                cur = cur.parent
                continue
            nxt = cur / part
            try:
                mode = os.lstat(nxt).st_mode
            except FileNotFoundError:
                cur = nxt  # not there yet: created inside the image, as it is
                continue
            if not stat.S_ISLNK(mode):
                cur = nxt
                continue
            hops += 1
            if hops > MAX_LINKS:
                raise UsageError(f"--root {self.path}: {node_path}: too many levels of symlinks at {nxt}")
            target = PurePosixPath(os.readlink(nxt))
            via = f"the symlink {self.node(nxt)} -> {target}"
            if target.is_absolute():
                cur = self.path  # as the booted node reads it: from the image's root
                todo = [*target.parts[1:], *todo]
            else:
                todo = [*target.parts, *todo]
        return cur

    def made(self, node_dir: str | PurePath) -> Path:
        """The directory `node_dir` as :meth:`host` finds it, made with its missing parents if need
        be: each mode 0755 whatever the umask (root runs what is below them), like ``mkdir -p``."""
        where = self.host(node_dir)
        missing = []
        for d in [where, *where.parents]:
            if d.is_dir():
                break
            missing.append(d)
        for d in reversed(missing):
            try:
                d.mkdir(mode=0o755)
            except FileExistsError:
                if not d.is_dir():
                    raise
        return where

    def parent_made(self, node_path: str | PurePath) -> Path:
        """Where to write `node_path`: its directory as :meth:`host` finds it, made if missing
        (:meth:`made`), and its own name as it is. A link of that name is then replaced by the
        rename that writes it, as on a live node, never written through."""
        path = PurePosixPath(node_path)
        return self.made(path.parent) / path.name

    def node(self, host_path: str | Path) -> str:
        """The path the booted node sees for a path of this machine: under the image, without DIR;
        elsewhere unchanged (the image is expected to hold it at the same place)."""
        path = Path(os.path.abspath(host_path))
        if self.is_image and path.is_relative_to(self.path):
            return str(PurePosixPath("/") / path.relative_to(self.path))
        return str(path)

    def python(self) -> str:
        """The interpreter the hooks run, as the node sees it (this one, or the image's copy)."""
        return self.node(sys.executable)

    def missing(self, node_path: str) -> bool:
        """Whether the image lacks `node_path` (False on a live install)."""
        return self.is_image and not self.host(node_path).exists()

    def write(self, node_path: str | PurePath, data: bytes, mode: int = 0o644) -> Path:
        """Write `data` at `node_path` (root's when we are root), atomically: a fresh temporary file
        (O_EXCL|O_NOFOLLOW, fsynced) renamed over the name, so a link there is replaced, not followed."""
        where = self.parent_made(node_path)
        tmp = where.with_name(f".{where.name}.slurm-chaos.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fchmod(fh.fileno(), mode)
                if os.geteuid() == 0:
                    os.fchown(fh.fileno(), 0, 0)
                os.fsync(fh.fileno())
            os.replace(tmp, where)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return where


LIVE = InstallRoot()
