"""Where ``plugin install`` writes: this machine, or a node image's tree (``--root DIR``).

Sites roll software out with node images (a Warewulf container, a chroot) or configuration
management: ``plugin install --root DIR`` writes every file at DIR + its absolute path, while every
path written *into* a file (the plugstack.conf line, the hooks, the policy's path in
job_submit.lua, the interpreter and import root the hooks run) is the path the booted node sees.

Root writes here, so nothing a user controls may steer a write:

- DIR and every directory above it must be root's and writable by nobody else (a root-owned
  sticky directory such as /tmp above it is fine): otherwise its owner could swap a directory for
  a link while root writes, and ``--root`` is refused before anything is written. A tree built
  by a user (a rootless or CI-built image) is refused the same way: chown it to root first.
- Every path is resolved through directory descriptors, one component at a time from DIR's own
  descriptor (``openat`` with ``O_NOFOLLOW|O_DIRECTORY``), as the booted node would resolve it: a
  symlink's absolute target is read from the image's root, a relative one from where it is, and
  a link that climbs above the image's root (``../../..``) is refused. A directory swapped for a
  link between our look and our open fails the open (``ELOOP``) instead of being followed. Python
  has no ``openat2(RESOLVE_IN_ROOT)``; this walk is its equivalent.
- Every directory a file is written into (and every one made) must be root's and writable by
  nobody else, checked on its open descriptor (``fstat``).
- A file is written as a fresh temporary name (``O_CREAT|O_EXCL|O_NOFOLLOW``) in that directory's
  descriptor, given its mode and owner on its own descriptor (``fchmod``/``fchown``), fsynced and
  renamed over its name within the same directory descriptor: a link of that name is replaced,
  never written through, and nothing is ever chmodded by path.

On this machine (``/``) the same walk and checks apply, with ``/`` as the root.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath

from slurm_chaos.errors import UsageError

#: Links followed on one path before it is refused (the kernel's own limit).
MAX_LINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _why_untrusted(st: os.stat_result, *, written: bool) -> str | None:
    """Why root should not write into (`written`) or pass through a directory, or None. Root's (the
    installer's own uid when it does not run as root) and writable by nobody else; passing through
    a root-owned sticky directory (/tmp) is fine."""
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not {'root' if os.geteuid() == 0 else f'uid {os.geteuid()}'}"
    if st.st_mode & 0o022 and (written or not st.st_mode & stat.S_ISVTX):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _open_trusted_dir(path: Path, option: str) -> int:
    """A descriptor of the directory `path` (absolute, no symlink in it), opened component by
    component without following links, each directory on the way root's alone; UsageError
    otherwise."""
    fd = os.open("/", _DIR_FLAGS)
    try:
        where = Path("/")
        for part in path.parts[1:]:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
            where = where / part
            why = _why_untrusted(os.fstat(fd), written=where == path)
            if why:
                raise UsageError(
                    f"{option}: {path}: {where} is {why}: refused (whoever may write it could redirect "
                    "root's writes out of the image)"
                )
    except OSError as exc:
        os.close(fd)
        raise UsageError(f"{option}: {path}: {exc.strerror}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass
class _Walk:
    """Open directories from the root down to where a walk is (their descriptors, their names)."""

    fds: list[int]
    names: list[str]

    @property
    def fd(self) -> int:
        return self.fds[-1]

    def node(self) -> PurePosixPath:
        return PurePosixPath("/", *self.names)

    def up(self) -> None:
        os.close(self.fds.pop())
        self.names.pop()

    def to_root(self) -> None:
        while len(self.fds) > 1:
            self.up()

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


@dataclass(frozen=True)
class InstallRoot:
    """'/' (this machine, as ``plugin install`` always did) or an image's root directory."""

    path: Path = Path("/")

    @classmethod
    def at(cls, directory: str | Path, option: str = "--root", *, trusted: bool = True) -> InstallRoot:
        """The image root `directory` (an existing directory, taken where it really is, root's all
        the way up and writable by nobody else); UsageError naming `option` otherwise. `trusted`
        False: whoever owns it (an audit that reports :meth:`untrusted`; nothing is written)."""
        given = Path(directory)
        if not given.is_absolute():
            given = Path.cwd() / given
        if not given.exists():
            raise UsageError(f"{option}: {directory} does not exist")
        if not given.is_dir():
            raise UsageError(f"{option}: {directory} is not a directory")
        root = cls(given.resolve())
        if trusted:
            os.close(_open_trusted_dir(root.path, option))
        return root

    def untrusted(self, option: str = "--root") -> str | None:
        """Why root may not write into this image (it or a directory above it is not root's alone),
        or None."""
        try:
            os.close(_open_trusted_dir(self.path, option))
        except UsageError as exc:
            return str(exc)
        return None

    @property
    def is_image(self) -> bool:
        return self.path != Path("/")

    # ------------------------------------------------------------------------ the walk

    def _open_root(self) -> int:
        if not self.is_image:
            return os.open("/", _DIR_FLAGS)
        return _open_trusted_dir(self.path, "--root")

    @contextlib.contextmanager
    def _dir(self, node_dir: str | PurePath, make: bool = False) -> Iterator[_Walk]:
        """The node's directory `node_dir`, opened inside the root (links resolved as the node
        would, none followed by the kernel); missing directories made (mode 0755, root's) when
        `make`, else FileNotFoundError. UsageError for a link that climbs out, or loops."""
        with self._walk(node_dir, make) as (walk, rest):
            if rest:
                raise FileNotFoundError(f"{walk.node() / rest[0]}: not a directory of the image")
            yield walk

    @contextlib.contextmanager
    def _walk(self, node_path: str | PurePath, make: bool = False) -> Iterator[tuple[_Walk, list[str]]]:
        """As :meth:`_dir`, as far as directories exist: the walk to the deepest one, and the rest
        of the path from there (empty: `node_path` is that directory)."""
        path = PurePosixPath(node_path)
        if not path.is_absolute():
            raise UsageError(f"{node_path}: not an absolute path")
        walk = _Walk([self._open_root()], [])
        try:
            yield walk, self._descend(walk, list(path.parts[1:]), str(node_path), make)
        finally:
            walk.close()

    def _descend(self, walk: _Walk, todo: list[str], shown: str, make: bool) -> list[str]:
        hops = 0
        via = "'..'"  # what led above the root: the path itself, or the last link followed
        while todo:
            part = todo.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if len(walk.fds) > 1:
                    walk.up()
                elif self.is_image:
                    raise UsageError(f"--root {self.path}: {shown}: {via} climbs out of the image: refused")
                continue
            try:
                mode: int | None = os.stat(part, dir_fd=walk.fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                if not make:
                    return [part, *todo]
                mode = None
            if mode is not None and not make and not stat.S_ISDIR(mode) and not stat.S_ISLNK(mode):
                return [part, *todo]  # a file: the end of what can be walked
            if mode is not None and stat.S_ISLNK(mode):
                hops += 1
                if hops > MAX_LINKS:
                    raise UsageError(
                        f"{self._shown(shown)}: too many levels of symlinks at {walk.node() / part}"
                    )
                target = PurePosixPath(os.readlink(part, dir_fd=walk.fd))
                via = f"the symlink {walk.node() / part} -> {target}"
                if target.is_absolute():
                    walk.to_root()  # as the booted node reads it: from the image's root
                todo[:0] = list(target.parts[1:] if target.is_absolute() else target.parts)
                continue
            if mode is None:
                with contextlib.suppress(FileExistsError):  # made meanwhile: its open checks it
                    os.mkdir(part, 0o755, dir_fd=walk.fd)
            fd = os.open(part, _DIR_FLAGS, dir_fd=walk.fd)  # ELOOP: a link swapped in since the look
            walk.fds.append(fd)
            walk.names.append(part)
            if mode is None:
                os.fchmod(fd, 0o755)  # whatever the umask: root runs what is below it
            if mode is None or (make and not todo):  # made, or the directory written into
                self._trust(walk, shown)
        return []

    def _trust(self, walk: _Walk, shown: str) -> None:
        """Refuse to write into the directory just opened unless it is root's alone."""
        why = _why_untrusted(os.fstat(walk.fd), written=True)
        if why:
            raise UsageError(
                f"{self._shown(shown)}: {walk.node()} is {why}: refused (whoever may write it could "
                "swap what root writes there)"
            )

    def _shown(self, node_path: str) -> str:
        return f"--root {self.path}: {node_path}" if self.is_image else node_path

    # ------------------------------------------------------------------------ paths

    def host(self, node_path: str | PurePath) -> Path:
        """Where the node's absolute `node_path` is on this machine (for reading and messages, never
        for writing): itself on a live install; under an image, every existing component resolved
        inside it, a missing tail kept as given. UsageError for a link that climbs out of the
        image, or loops."""
        path = PurePosixPath(node_path)
        if not path.is_absolute():
            raise UsageError(f"{node_path}: not an absolute path")
        if not self.is_image:
            return Path(path)
        with self._walk(path) as (walk, rest):
            return self.path / walk.node().relative_to("/") / PurePosixPath(*rest)

    def made(self, node_dir: str | PurePath) -> Path:
        """The directory `node_dir` as :meth:`host` finds it, made with its missing parents if need
        be (each mode 0755 whatever the umask, root's), and root's alone; its host path."""
        with self._dir(node_dir, make=True) as walk:
            return self.path / walk.node().relative_to("/")

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

    # ------------------------------------------------------------------------ I/O

    def read_text(self, node_path: str | PurePath) -> str | None:
        """The text of the regular file `node_path` (links resolved inside the root, the file
        itself opened O_NOFOLLOW from its directory's descriptor), None if there is none."""
        with self._walk(node_path) as (walk, rest):
            if len(rest) != 1:
                return None  # missing, or a directory
            try:
                fd = os.open(
                    rest[0], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=walk.fd
                )
            except OSError:
                return None
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None
            return fh.read().decode("utf-8", "replace")

    def write(self, node_path: str | PurePath, data: bytes, mode: int = 0o644) -> Path:
        """Write `data` at `node_path`, root's with `mode`, atomically: a fresh temporary file
        (O_EXCL|O_NOFOLLOW, fsynced) in its directory's descriptor, renamed over the name there, so
        a link of that name is replaced, never followed. Returns where it landed (host path)."""
        path = PurePosixPath(node_path)
        if path.name in ("", ".", ".."):
            raise UsageError(f"{node_path}: not a file's path")
        tmp = f".{path.name}.slurm-chaos.tmp"
        with self._dir(path.parent, make=True) as walk:
            d = walk.fd
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=d)  # a leftover of ours, or anything else: unlink never follows
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=d
            )
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fchmod(fh.fileno(), mode)
                    if os.geteuid() == 0:
                        os.fchown(fh.fileno(), 0, 0)
                    os.fsync(fh.fileno())
                os.rename(tmp, path.name, src_dir_fd=d, dst_dir_fd=d)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=d)
                raise
            return self.path / walk.node().relative_to("/") / path.name


LIVE = InstallRoot()
