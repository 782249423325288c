"""Per-job storage on a node: a small tmpfs of the job's user, mounted by root, removed by unmounting.

A job that may write somewhere on the node (its heartbeat directory) gets a filesystem of its own
there, not a directory on one root depends on: root makes ``<root>/<node>/<job>`` (root's, empty)
and mounts a tmpfs on it with the job's uid and gid, :class:`Limits` on its size and inodes, and
``nosuid,nodev,noexec``. What the job writes is bounded by those limits whatever it does (a large
file, millions of files, a deep tree), is on no filesystem anything else uses, and cannot be
hard-linked anywhere else (links never cross filesystems). Readers find it at the same path.

The job's end takes it back by unmounting: a lazy detach (``umount --lazy``) of the tmpfs and of
everything the job stacked on or under it (a FUSE mount made with a setuid ``fusermount3``), in
constant time whatever the tree holds; the kernel frees the pages once the last process holding a
file there is gone. The empty root-owned directory left is removed.

A tree that must still be deleted file by file (a directory left by an older release or a failed
mount, a sandbox's own directories) is removed without recursion and without following a link:
it is renamed into a root-owned trash directory, whose entries are emptied one directory at a time,
each subdirectory found being moved up into the trash (flattening the tree: two descriptors open
whatever its depth), within a time budget; what is left is removed by the next sweep. A job's path
is free as soon as it is renamed, so a leftover never blocks the node.

A sweep takes back the storage of jobs that no longer run: as the controller says (``slurm-chaos
cleanup``), or on the node itself as slurmd's spool directory says (no step socket of the job
there, and storage older than :data:`GRACE_S`). A job it cannot tell about is kept: a leftover
costs at most its limits.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from slurm_chaos.runner import Runner

#: The filesystem name of our mounts (the "source" column of /proc/self/mountinfo).
FSNAME = "slurm-chaos-job"
#: Where trees on their way out wait, in each node's directory (readers skip names starting with ".").
TRASH = ".trash"
MOUNTINFO = Path("/proc/self/mountinfo")
#: At most this many mounts stacked on one path are detached; more is refused.
MAX_STACKED = 32
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_names = itertools.count()


class JobFsError(Exception):
    """A mount or unmount failed."""


@dataclass(frozen=True)
class Limits:
    """A job's tmpfs: at most `size` bytes of data and `inodes` files and directories."""

    size: int = 16 * 1024 * 1024
    inodes: int = 4096

    def options(self, uid: int, gid: int) -> str:
        return f"size={self.size},nr_inodes={self.inodes},mode=0755,uid={uid},gid={gid},nosuid,nodev,noexec"


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mount_points(mountinfo: Path = MOUNTINFO) -> list[str]:
    """Every mount point of this mount namespace, in mount order (a stacked one appears again)."""
    out = []
    for line in mountinfo.read_text().splitlines():
        fields = line.split()
        if len(fields) > 4:
            out.append(_unescape(fields[4]))
    return out


def mounts_at_or_under(path: Path, mountinfo: Path = MOUNTINFO) -> list[str]:
    """The mount points at `path` or below it, shallowest first."""
    top = os.path.normpath(path)
    found = {p for p in mount_points(mountinfo) if p == top or p.startswith(top + "/")}
    return sorted(found, key=lambda p: (p.count("/"), p))


def mount(path: Path, uid: int, gid: int, limits: Limits, runner: Runner) -> None:
    """Mount the job's tmpfs on `path` (an empty directory of root's, made just now)."""
    argv = ["mount", "-t", "tmpfs", "-o", limits.options(uid, gid), FSNAME, str(path)]
    res = runner(argv, timeout=30)
    if not res.ok:
        raise JobFsError(f"mount of {path} failed: {(res.stderr or res.stdout).strip()}")


def detach(path: Path, runner: Runner, mountinfo: Path = MOUNTINFO) -> list[str]:
    """Lazily unmount everything mounted at or under `path`, stacked mounts included; returns the
    mount points detached. JobFsError when one stays.

    The shallowest first: a lazy detach takes the mounts below it along, and a mount hidden under
    one stacked on top of it cannot be reached by its path until the one on top is gone."""
    done: list[str] = []
    for _ in range(MAX_STACKED):
        found = mounts_at_or_under(path, mountinfo)
        if not found:
            return done
        res = runner(["umount", "--lazy", found[0]], timeout=30)
        if not res.ok:
            raise JobFsError(f"umount --lazy {found[0]} failed: {(res.stderr or res.stdout).strip()}")
        done.append(found[0])
    raise JobFsError(f"{path}: still mounted after {MAX_STACKED} unmounts")


# ------------------------------------------------------------------------------ removal, no recursion


def _fresh_name() -> str:
    return f"{os.getpid()}.{time.time_ns()}.{next(_names)}"


def _move_into(dir_fd: int, name: str, trash_fd: int) -> bool:
    """Rename `name` into the trash under a fresh name; False where it cannot move (a mount point,
    another filesystem)."""
    for _ in range(8):
        try:
            os.rename(name, _fresh_name(), src_dir_fd=dir_fd, dst_dir_fd=trash_fd)
            return True
        except (FileExistsError, IsADirectoryError, NotADirectoryError):
            continue  # a name of the tree itself: take another
        except OSError as exc:
            if exc.errno == errno.ENOTEMPTY:
                continue
            if exc.errno in (errno.EXDEV, errno.EBUSY):
                return False
            raise
    return False


def _empty_one(trash_fd: int, name: str, expired: Callable[[], bool]) -> bool:
    """Remove one entry of the trash: a file at once; a directory after its files are unlinked and
    its subdirectories moved up into the trash. False when time ran out first."""
    try:
        os.unlink(name, dir_fd=trash_fd)
        return True
    except FileNotFoundError:
        return True
    except IsADirectoryError:
        pass
    except PermissionError:  # EPERM: a directory (unlink(2) refuses those so on Linux)
        if not stat.S_ISDIR(os.lstat(name, dir_fd=trash_fd).st_mode):
            raise
    fd = os.open(name, _DIR_FLAGS, dir_fd=trash_fd)
    stuck: list[str] = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if expired():
                    return False
                if entry.is_dir(follow_symlinks=False):
                    if not _move_into(fd, entry.name, trash_fd):
                        stuck.append(entry.name)
                    continue
                try:
                    os.unlink(entry.name, dir_fd=fd)
                except FileNotFoundError:
                    pass
                except IsADirectoryError:  # made a directory since it was listed
                    if not _move_into(fd, entry.name, trash_fd):
                        stuck.append(entry.name)
    finally:
        os.close(fd)
    if stuck:
        raise JobFsError(f"{name}/{stuck[0]}: a mount point (or another filesystem) in the tree: not removed")
    try:
        os.rmdir(name, dir_fd=trash_fd)
    except OSError as exc:
        if exc.errno != errno.ENOTEMPTY:
            raise
        # Written to meanwhile: the next pass over the trash takes the rest.
    return True


def empty_trash(
    trash_fd: int, budget_s: float | None = None, clock: Callable[[], float] = time.monotonic
) -> bool:
    """Remove everything in the directory `trash_fd` (no recursion, no link followed); True when it
    is empty, False when `budget_s` seconds ran out first (the rest waits for the next call)."""
    end = None if budget_s is None else clock() + budget_s

    def expired() -> bool:
        return end is not None and clock() >= end

    while True:
        names = os.listdir(trash_fd)
        if not names:
            return True
        for name in names:
            if expired() or not _empty_one(trash_fd, name, expired):
                return False


def remove_tree(path: Path, budget_s: float | None = None) -> bool:
    """Remove the directory `path` and everything in it, however deep (`path` itself is never
    followed if a link: the link is removed). True when gone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    if not stat.S_ISDIR(st.st_mode):
        path.unlink(missing_ok=True)
        return True
    fd = os.open(path, _DIR_FLAGS)
    try:
        done = empty_trash(fd, budget_s)
    finally:
        os.close(fd)
    if done:
        os.rmdir(path)
    return done


def open_trash(root_fd: int) -> int:
    """The trash directory below the storage root (made, root's and 0700, if missing)."""
    try:
        os.mkdir(TRASH, 0o700, dir_fd=root_fd)
    except FileExistsError:
        pass
    fd = os.open(TRASH, _DIR_FLAGS, dir_fd=root_fd)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        raise PermissionError(f"{TRASH}: not a directory of root's alone (mode {st.st_mode & 0o7777:o})")
    return fd


def discard(parent_fd: int, name: str, trash_fd: int) -> bool:
    """Take `name` out of its directory at once: removed if an empty directory or not a directory,
    else renamed into the trash. False if it was not there."""
    try:
        os.rmdir(name, dir_fd=parent_fd)
        return True
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        os.unlink(name, dir_fd=parent_fd)
        return True
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if not _move_into(parent_fd, name, trash_fd):
        raise JobFsError(f"{name}: cannot be moved into the trash (a mount point?)")
    return True


# ------------------------------------------------------------------------------ a node's job storage


@dataclass(frozen=True)
class JobStorage:
    """``<root>/<node>/<job>``: per-job storage of one node below a root-owned `root`."""

    root: Path
    runner: Runner
    limits: Limits = Limits()
    mountinfo: Path = MOUNTINFO

    def path(self, node: str, job_id: str) -> Path:
        return self.root / node / job_id

    def take_back(self, node: str, job_id: str, node_fd: int, trash_fd: int) -> list[str]:
        """Detach the job's mounts and take its directory away (see :func:`discard`); what was done."""
        path = self.path(node, job_id)
        done = [f"{p} detached" for p in detach(path, self.runner, self.mountinfo)]
        if discard(node_fd, job_id, trash_fd):
            done.append(f"{path} removed")
        return done

    def give(self, node_fd: int, node: str, job_id: str, uid: int, gid: int) -> Path:
        """Make the job's directory (root's, empty) and mount its tmpfs there; on a failed mount the
        directory is removed again (the job gets no storage: fail closed)."""
        path = self.path(node, job_id)
        os.mkdir(job_id, 0o755, dir_fd=node_fd)
        try:
            mount(path, uid, gid, self.limits, self.runner)
        except JobFsError:
            os.rmdir(job_id, dir_fd=node_fd)
            raise
        return path

    def sweep(
        self,
        node: str,
        node_fd: int,
        trash_fd: int,
        running: Callable[[str], bool | None],
        jobs: Iterable[str],
    ) -> list[str]:
        """Take back the storage of `jobs` that `running` says no longer run (False); one it cannot
        tell about (None) is kept. A failure on one job is reported and the others go on."""
        done = []
        for job_id in jobs:
            if running(job_id) is not False:
                continue
            try:
                done += [
                    f"{line} [job no longer running]"
                    for line in self.take_back(node, job_id, node_fd, trash_fd)
                ]
            except (OSError, JobFsError) as exc:
                done.append(f"FAILED: {self.path(node, job_id)}: {exc}")
        return done


def _root_dir(name: str, dir_fd: int | None) -> int:
    """Open a directory that must be root's alone (never a link)."""
    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    st = os.fstat(fd)
    if st.st_uid != 0 or st.st_mode & 0o022:
        os.close(fd)
        raise PermissionError(f"{name}: not a directory of root's alone (mode {st.st_mode & 0o7777:o})")
    return fd


def sweep(
    storage: JobStorage,
    nodes: Iterable[str] | None,
    running: Callable[[str], bool | None],
    budget_s: float | None = None,
) -> list[str]:
    """Take back the storage of every job under ``<root>/<node>/`` (of `nodes` only, if given) that
    `running` says no longer runs, and empty each node's trash (within `budget_s` per node)."""
    try:
        base_fd = _root_dir(str(storage.root), None)
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [f"FAILED: {storage.root}: {exc}"]
    done: list[str] = []
    try:
        names = sorted(n for n in os.listdir(base_fd) if not n.startswith("."))
        for node in names if nodes is None else [n for n in names if n in set(nodes)]:
            try:
                node_fd = _root_dir(node, base_fd)
            except OSError as exc:
                done.append(f"FAILED: {storage.root / node}: {exc}")
                continue
            try:
                trash_fd = open_trash(node_fd)
                try:
                    jobs = sorted(j for j in os.listdir(node_fd) if j.isdigit())
                    done += storage.sweep(node, node_fd, trash_fd, running, jobs)
                    if not empty_trash(trash_fd, budget_s):
                        done.append(f"{storage.root / node / TRASH}: not empty yet (left to the next sweep)")
                finally:
                    os.close(trash_fd)
            except (OSError, JobFsError) as exc:
                done.append(f"FAILED: {storage.root / node}: {exc}")
            finally:
                os.close(node_fd)
    finally:
        os.close(base_fd)
    return done


# ------------------------------------------------------------------------------ which jobs run here

#: Slurm's default SlurmdSpoolDir.
DEFAULT_SPOOL = Path("/var/spool/slurmd")
#: A job's storage younger than this is never swept on the spool's word alone: its prolog may still
#: run, before its first step.
GRACE_S = 600.0


def slurm_conf_value(slurm_conf: Path | None, key: str) -> str | None:
    """A setting of slurm.conf itself (not of a file it includes), or None."""
    if slurm_conf is None:
        return None
    try:
        text = slurm_conf.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.split("#", 1)[0].strip().partition("=")
        if name.strip().lower() == key.lower() and value.strip():
            return value.strip()
    return None


def slurmd_spool(slurm_conf: Path | None, node: str, host: str = "") -> Path:
    """slurmd's spool directory on `node`: slurm.conf's SlurmdSpoolDir (``%n`` the node name, ``%h``
    the host name), else Slurm's default."""
    value = slurm_conf_value(slurm_conf, "SlurmdSpoolDir")
    if value is None:
        return DEFAULT_SPOOL
    return Path(value.replace("%n", node).replace("%h", host or node))


def contained(slurm_conf: Path | None) -> bool:
    """Whether every job keeps a step on each of its nodes for its whole life (``PrologFlags`` with
    ``Contain``: the extern step); without it a job between two steps has none."""
    flags = slurm_conf_value(slurm_conf, "PrologFlags") or ""
    return "contain" in {f.strip().lower() for f in flags.split(",")}


def steps_on_node(spool: Path, node: str) -> Callable[[str], bool | None]:
    """Whether a job runs on `node`, from the step sockets slurmstepd keeps in slurmd's spool
    directory while a step runs (``<node>_<job>.<step>``; the extern step for the whole job where
    ``PrologFlags=Contain``): True with one there, False with none, None for every job when the
    directory cannot be trusted (missing, not root's, writable by others)."""
    try:
        st = os.stat(spool)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            return lambda _job: None
        names = os.listdir(spool)
    except OSError:
        return lambda _job: None
    prefix = f"{node}_"
    jobs = set()
    for name in names:
        if not name.startswith(prefix):
            continue
        try:
            if stat.S_ISSOCK(os.lstat(spool / name).st_mode):
                jobs.add(name[len(prefix) :].split(".", 1)[0])
        except OSError:
            continue
    return lambda job: job in jobs


def job_running(
    storage: JobStorage, node: str, steps: Callable[[str], bool | None], now: float, grace_s: float = GRACE_S
) -> Callable[[str], bool | None]:
    """Whether a job still runs, as far as a sweep on the node may act on it: False (ended) when it
    has no step on the node and its directory is older than `grace_s` (its change time, which a
    user can only move forward); else None (unknown: kept)."""

    def probe(job: str) -> bool | None:
        if steps(job) is not False:
            return None
        try:
            age = now - os.lstat(storage.path(node, job)).st_ctime
        except OSError:
            return None
        return False if age > grace_s else None

    return probe
