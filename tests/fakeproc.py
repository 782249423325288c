"""A /proc of made-up processes, for code that decides from /proc which processes are Slurm's.

Each process has what such code reads: ``cmdline`` (its title), ``status`` (its uids), ``exe`` (a
link to the file it runs), ``stat`` (its parent and start time), ``cgroup``, ``environ`` and
``ns/net``, ``ns/mnt`` (links to one file per namespace: a namespace's inode is that file's).
``self`` is the reader, in the namespaces ``host`` unless told otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

SLURMSTEPD = "/usr/sbin/slurmstepd-wlm"
SLURMD = "/usr/sbin/slurmd-wlm"
#: The start time every made-up process has (field 22 of its stat).
START = 4242


class FakeProc:
    def __init__(self, root: Path, net: str = "host", mnt: str = "host") -> None:
        self.root = root
        (root / "ns").mkdir(parents=True, exist_ok=True)
        self._namespaces("self", net, mnt)

    def ns(self, kind: str, name: str) -> Path:
        """The file whose inode is namespace `name` of `kind` (made on first use)."""
        f = self.root / "ns" / f"{kind}-{name}"
        f.touch()
        return f

    def _namespaces(self, pid: int | str, net: str, mnt: str) -> None:
        d = self.root / str(pid) / "ns"
        d.mkdir(parents=True, exist_ok=True)
        for kind, name in (("net", net), ("mnt", mnt)):
            (d / kind).unlink(missing_ok=True)
            (d / kind).symlink_to(self.ns(kind, name))

    def add(
        self,
        pid: int,
        cgroup: str = "0::/\n",
        *,
        argv: Sequence[str] = ("sleep", "60"),
        uid: int = 1001,
        exe: str = "/usr/bin/sleep",
        ppid: int = 1,
        env: Mapping[str, str] | None = None,
        net: str = "host",
        mnt: str = "host",
    ) -> int:
        d = self.root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup").write_text(cgroup)
        (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
        (d / "status").write_text(f"Name:\t{Path(exe).name[:15]}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        (d / "exe").unlink(missing_ok=True)
        (d / "exe").symlink_to(exe)
        fields = ["S", str(ppid), *["0"] * 17, str(START), *["0"] * 5]
        (d / "stat").write_text(f"{pid} ({Path(exe).name[:15]}) {' '.join(fields)}\n")
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in (env or {}).items()))
        self._namespaces(pid, net, mnt)
        return pid

    def stepd(self, pid: int, job: str, step: str, cgroup: str, net: str = "host", mnt: str = "host") -> int:
        """Root's slurmstepd of step `job`.`step` (its title, as Slurm sets it)."""
        argv = (f"slurmstepd: [{job}.{step}]",)
        return self.add(pid, cgroup, argv=argv, uid=0, exe=SLURMSTEPD, net=net, mnt=mnt)
