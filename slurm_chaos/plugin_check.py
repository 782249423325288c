"""Audit an installation: ``slurm-chaos plugin check --site S [--nodes LIST]``.

Run after ``plugin install`` (and after any change to slurm.conf): every file that root code of
slurm-chaos reads or runs, and every Slurm setting the trust model rests on, is checked and
reported as OK, UNSAFE or MISSING, with its path and the fix.

- On the controller (where this runs): slurm.conf as slurmctld reports it (``scontrol show
  config``: PrologFlags with Alloc and Contain, proctrack/cgroup, task/cgroup, JobSubmitPlugins
  lua), slurm.conf itself, the policy and job_submit.lua beside it.
- On each node: the policy, plugstack.conf (our ``required`` line, its plugin and arguments, and
  every other plugin or include in it), the plugin and the I/O shim, the Prolog/Epilog slurmd runs
  and our hooks in them (``cd /``, a fixed PATH, ``python -I``, absolute tools, an import root and
  interpreter that are root's all the way up), the health check hook, the journal, audit-log,
  agent-log and heartbeat directories.

"Root's" means: owned by uid 0 and writable by nobody else, for the file and every directory
above it (a root-owned sticky directory such as /tmp above it is fine), symlinks followed. A
node's files are read through a :class:`NodeFiles`: directly on this machine, through ``nsenter``
into a sandbox node's mount namespace, or with ``srun -w NODE`` on a real cluster (``stat``,
``readlink``, ``cat`` and ``find``, one argv each), so the checks run the same against a fake tree.

``plugin check --site S --root DIR`` audits a node image instead (what ``plugin install --root DIR``
wrote): the node's checks on the image's files (:class:`ImageFiles`: each path read under DIR,
every symlink resolved inside it as the booted node would), with the Prolog, Epilog and
PlugStackConfig of the image's own slurm.conf; no Slurm command runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from itertools import pairwise
from pathlib import Path, PurePosixPath
from typing import Protocol

from slurm_chaos.errors import SlurmError, UsageError
from slurm_chaos.faults.install_hooks import (
    HOOK_NAME,
    SYSTEM_PATH,
    site_agent_log,
    site_audit_log,
    site_journal_root,
)
from slurm_chaos.faults.plugin_install import (
    JOB_SUBMIT_LUA,
    LUA_MARK,
    OWN_LUA,
    PLUGIN_FILE,
    SHIM_FILE,
    render_job_submit,
    site_policy_path,
    slurm_etc,
)
from slurm_chaos.faults.policy import PolicyError, parse_policy, suspends
from slurm_chaos.runner import Runner, SubprocessRunner
from slurm_chaos.site import Site
from slurm_chaos.slurm.model import ClusterConfig
from slurm_chaos.slurm.parse import parse_scontrol_config
from slurm_chaos.slurm.step import StepRunner

CONTROLLER = "controller"
IMAGE = "image"
#: Our hooks' names in prolog.d/epilog.d/healthcheck.d (observe.healthcheck writes the last two).
HEARTBEAT_HOOK = "40-slurm-chaos-heartbeat"
HEALTHCHECK_HOOK = "50-slurm-chaos"
PLUGIN_ARGS = ("policy", "journal_dir")
MAX_LINKS = 40
MAX_READ = 1 << 20
_ROOT_FIX = "chown root:root {p} && chmod go-w {p}"


class Status(StrEnum):
    OK = "OK"
    UNSAFE = "UNSAFE"
    MISSING = "MISSING"


@dataclass(frozen=True)
class Finding:
    """One checked item on one host; `fix` says what to do when it is not OK."""

    host: str
    item: str
    status: Status
    path: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Report:
    """Every finding of one audit."""

    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return all(f.status is Status.OK for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.status is not Status.OK]

    def to_json(self) -> str:
        rows = [{**asdict(f), "status": f.status.value} for f in self.findings]
        return json.dumps({"ok": self.ok, "findings": rows}, indent=2)

    def table(self) -> str:
        """One line per finding (host, status, item, path, detail); the fix indented below it."""
        widths = [
            max([len(f.host) for f in self.findings] + [4]),
            7,
            max([len(f.item) for f in self.findings] + [4]),
        ]
        lines = [f"{'HOST':<{widths[0]}}  {'STATUS':<{widths[1]}}  {'ITEM':<{widths[2]}}  PATH: DETAIL"]
        for f in self.findings:
            head = f"{f.host:<{widths[0]}}  {f.status.value:<{widths[1]}}  {f.item:<{widths[2]}}  "
            lines.append(f"{head}{f.path}: {f.detail}")
            if f.fix:
                lines.append(f"{'':<{len(head)}}fix: {f.fix}")
        bad = self.problems()
        lines.append("all OK" if not bad else f"{len(bad)} of {len(self.findings)} items UNSAFE or MISSING")
        return "\n".join(lines)


# ------------------------------------------------------------------------------ reading a node


@dataclass(frozen=True)
class Entry:
    """What lstat says about one path."""

    uid: int
    gid: int
    mode: int  # st_mode: type and permission bits

    @property
    def is_link(self) -> bool:
        return stat.S_ISLNK(self.mode)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def sticky(self) -> bool:
        return bool(self.is_dir and self.mode & stat.S_ISVTX)


class NodeFiles(Protocol):
    """Read-only access to one host's files."""

    def lstat(self, paths: Sequence[str]) -> dict[str, Entry]:
        """lstat of each path that exists (missing ones are left out)."""
        ...

    def readlink(self, path: str) -> str | None: ...

    def read(self, path: str) -> str | None:
        """The file's text (symlinks followed), None if it cannot be read."""
        ...

    def unsafe_below(self, path: str) -> list[str]:
        """Entries under the directory `path` not owned by root, writable by group or others, or
        symlinks (each judged by where it leads: :func:`untrusted_below`)."""
        ...


def local_lstat(path: str) -> Entry:
    st = os.lstat(path)
    return Entry(st.st_uid, st.st_gid, st.st_mode)


@dataclass
class LocalFiles:
    """This machine's files; `lstat_fn` is injectable (tests fake ownership with it)."""

    lstat_fn: Callable[[str], Entry] = local_lstat

    def lstat(self, paths: Sequence[str]) -> dict[str, Entry]:
        out = {}
        for p in paths:
            try:
                out[p] = self.lstat_fn(p)
            except OSError:
                continue
        return out

    def readlink(self, path: str) -> str | None:
        try:
            return os.readlink(path)
        except OSError:
            return None

    def read(self, path: str) -> str | None:
        try:
            with open(path, "rb") as fh:
                return fh.read(MAX_READ).decode("utf-8", "replace")
        except OSError:
            return None

    def unsafe_below(self, path: str) -> list[str]:
        bad = []
        for top, dirs, names in os.walk(path):
            for name in sorted(dirs + names):
                p = os.path.join(top, name)
                entry = self.lstat([p]).get(p)
                if entry and (entry.uid != 0 or entry.is_link or entry.mode & 0o022):
                    bad.append(p)
        return sorted(bad)


@dataclass
class RunnerFiles:
    """Another host's files, read with ``stat``, ``readlink``, ``cat`` and ``find`` through a runner
    (an NsRunner into a sandbox node, a StepRunner onto a real one). lstat answers are cached:
    a walk asks for every directory above a path in one command."""

    runner: Runner
    timeout: float = 60
    _cache: dict[str, Entry | None] = field(default_factory=dict)

    def reach(self) -> str | None:
        """Why the host cannot be read, or None."""
        done = self.runner(["stat", "-c", "%u", "--", "/"], timeout=self.timeout)
        if done.ok and done.stdout.strip().isdigit():
            return None
        return (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}").splitlines()[
            -1
        ]

    def lstat(self, paths: Sequence[str]) -> dict[str, Entry]:
        wanted = [p for p in dict.fromkeys(paths) if p not in self._cache and "\n" not in p]
        if wanted:
            done = self.runner(["stat", "-c", "%u %g %f %n", "--", *wanted], timeout=self.timeout)
            found = parse_stat(done.stdout)
            for p in wanted:
                self._cache[p] = found.get(p)
        return {p: e for p in paths if (e := self._cache.get(p)) is not None}

    def readlink(self, path: str) -> str | None:
        done = self.runner(["readlink", "--", path], timeout=self.timeout)
        return done.stdout.rstrip("\n") if done.ok else None

    def read(self, path: str) -> str | None:
        done = self.runner(["cat", "--", path], timeout=self.timeout)
        return done.stdout if done.ok else None

    def unsafe_below(self, path: str) -> list[str]:
        argv = ["find", path, "-mindepth", "1", "(", "!", "-uid", "0", "-o", "-type", "l", "-o"]
        done = self.runner([*argv, "-perm", "/022", ")", "-print"], timeout=self.timeout)
        return sorted(line for line in done.stdout.splitlines() if line)


@dataclass
class ImageFiles:
    """A node image's files: each path of the node read at `root` + path. Symlinks are resolved by
    :func:`walk` (an absolute target from the image's root, ``..`` never above it), so nothing is
    read through a link out of the image; the image's root stands for the node's ``/``."""

    root: Path

    def _host(self, path: str) -> str:
        return str(self.root) + os.path.normpath(path) if path != "/" else str(self.root)

    def lstat(self, paths: Sequence[str]) -> dict[str, Entry]:
        out = {}
        for p in paths:
            try:
                out[p] = local_lstat(self._host(p))
            except OSError:
                continue
        return out

    def readlink(self, path: str) -> str | None:
        try:
            return os.readlink(self._host(path))
        except OSError:
            return None

    def _resolved(self, path: str) -> str | None:
        chain = walk(self, path)
        if chain.missing or not chain.entries or chain.entries[-1][1].is_link:
            return None
        return chain.entries[-1][0]

    def read(self, path: str) -> str | None:
        resolved = self._resolved(path)
        if resolved is None:
            return None
        try:
            fd = os.open(self._host(resolved), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as fh:
            try:
                return fh.read(MAX_READ).decode("utf-8", "replace")
            except OSError:
                return None

    def unsafe_below(self, path: str) -> list[str]:
        resolved = self._resolved(path)
        if resolved is None:
            return []
        top = self._host(resolved)
        bad = LocalFiles().unsafe_below(top)
        return sorted(os.path.join(resolved, os.path.relpath(p, top)) for p in bad)


def parse_stat(text: str) -> dict[str, Entry]:
    """``stat -c '%u %g %f %n'`` output -> entries by path."""
    out = {}
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit():
            try:
                out[parts[3]] = Entry(int(parts[0]), int(parts[1]), int(parts[2], 16))
            except ValueError:
                continue
    return out


# ------------------------------------------------------------------------------ ownership walks


@dataclass(frozen=True)
class Chain:
    """Every entry root passes through to reach a path (each directory, each symlink and its target)."""

    entries: tuple[tuple[str, Entry], ...]
    missing: str | None  # the first component that does not exist


def _prefixes(path: str) -> list[str]:
    parts = PurePosixPath(path).parts
    return [str(PurePosixPath(*parts[: i + 1])) for i in range(len(parts))]


def walk(files: NodeFiles, path: str) -> Chain:
    """Resolve `path` component by component with lstat, following symlinks (at most MAX_LINKS)."""
    files.lstat(_prefixes(path))  # one question for the common case: no symlinks on the way
    todo = list(PurePosixPath(path).parts[1:])
    cur = "/"
    entries: list[tuple[str, Entry]] = []
    root = files.lstat(["/"]).get("/")
    if root is None:
        return Chain((), "/")
    entries.append(("/", root))
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            cur = os.path.dirname(cur) or "/"
            continue
        p = os.path.join(cur, part)
        entry = files.lstat([p]).get(p)
        if entry is None:
            return Chain(tuple(entries), p)
        entries.append((p, entry))
        if not entry.is_link:
            cur = p
            continue
        hops += 1
        target = files.readlink(p)
        if target is None or hops > MAX_LINKS:
            return Chain(tuple(entries), p)
        if target.startswith("/"):
            cur = "/"
        todo = list(PurePosixPath(target).parts[1 if target.startswith("/") else 0 :]) + todo
        files.lstat(_prefixes(os.path.normpath(os.path.join(cur, target))))
    return Chain(tuple(entries), None)


def chain_problem(chain: Chain, path: str) -> tuple[str, str] | None:
    """(what is wrong, the fix) for the first entry root could not trust, or None. The path itself
    is not named in the reason; a directory or link above it is."""
    last = chain.entries[-1][0] if chain.entries else "/"
    for p, e in chain.entries:
        who = "" if p == path else f"{p} is "
        if e.uid != 0:
            return f"{who}owned by uid {e.uid}, not root", _ROOT_FIX.format(p=p)
        if e.is_link or (e.sticky and p != last):
            continue
        if e.mode & 0o022:
            by = "others" if e.mode & 0o002 else f"group {e.gid}"
            return f"{who}writable by {by} (mode {e.mode & 0o7777:o})", _ROOT_FIX.format(p=p)
    return None


def untrusted_below(files: NodeFiles, path: str) -> list[str]:
    """What under the directory `path` root should not trust, each with why: an entry not root's
    or writable by others, or a symlink (root-owned or not) whose chain (every link and its
    target, and every directory on the way) is not root's alone, or leads nowhere."""
    out = []
    for p in files.unsafe_below(path):
        entry = files.lstat([p]).get(p)
        if entry is None or not entry.is_link or entry.uid != 0:
            out.append(p)
            continue
        chain = walk(files, p)
        bad = chain_problem(chain, p)
        if bad:
            out.append(f"{p} -> {files.readlink(p)} ({bad[0].removeprefix(f'{p} is ')})")
        elif chain.missing:
            out.append(f"{p} -> {files.readlink(p)} ({chain.missing} does not exist)")
    return out


def check_root_path(
    files: NodeFiles, host: str, item: str, path: str, missing_fix: str, optional: str = ""
) -> tuple[Finding, Chain]:
    """Is `path` root's all the way up? `optional`: why a missing path is fine (its parent is judged)."""
    if not path.startswith("/"):
        return Finding(host, item, Status.UNSAFE, path, "not an absolute path", missing_fix), Chain((), path)
    chain = walk(files, path)
    bad = chain_problem(chain, path)
    if bad:
        return Finding(host, item, Status.UNSAFE, path, bad[0], bad[1]), chain
    if chain.missing:
        if optional:
            return Finding(host, item, Status.OK, path, optional), chain
        return Finding(
            host, item, Status.MISSING, path, f"{chain.missing} does not exist", missing_fix
        ), chain
    return Finding(host, item, Status.OK, path, "root's, writable by nobody else"), chain


# ------------------------------------------------------------------------------ what is expected


@dataclass(frozen=True)
class Expected:
    """Where the installation's parts are, from the site config and what slurmctld reports."""

    config: ClusterConfig
    slurm_conf: str
    policy: str
    plugstack: str
    hooks_dir: str | None
    journal_root: str
    audit_log: str
    agent_log: str
    heartbeat_dir: str | None
    site_path: str
    image: str = ""  # the image's root directory, when an image is audited
    #: Each partition's own PreemptMode ('' where it has none: the cluster's applies), as slurmctld
    #: (or the image's slurm.conf) says; None where the partitions could not be listed.
    partitions: tuple[tuple[str, str], ...] | None = None
    #: The partitions the policy lets inject faults (None: any).
    allowed_partitions: tuple[str, ...] | None = None

    @property
    def reinstall(self) -> str:
        into = f" --root {self.image}" if self.image else ""
        return f"slurm-chaos plugin install --site {self.site_path}{into}"


def expected(
    site: Site,
    config: ClusterConfig,
    image: str = "",
    partitions: Mapping[str, str] | None = None,
) -> Expected:
    """Where `plugin install` put each part for this site; Slurm's own word for slurm.conf and
    plugstack.conf (what slurmctld and slurmstepd really read); `partitions`: each one's own
    PreemptMode."""
    from slurm_chaos.observe.healthcheck import site_options

    conf = config.slurm_conf or site.slurm.conf or str(slurm_etc(site) / "slurm.conf")
    plugstack = (
        config.plugstack_conf or site.slurm.plugstack_conf or str(Path(conf).parent / "plugstack.conf")
    )
    heartbeats = site_options(site).heartbeat_dir
    return Expected(
        config=config,
        slurm_conf=conf,
        policy=str(site_policy_path(site)),
        plugstack=plugstack,
        hooks_dir=site.slurm.hooks_dir,
        journal_root=str(site_journal_root(site)),
        audit_log=str(site_audit_log(site)),
        agent_log=str(site_agent_log(site)),
        heartbeat_dir=str(heartbeats) if heartbeats else None,
        site_path=str(site.path),
        image=image,
        partitions=tuple(partitions.items()) if partitions is not None else None,
        allowed_partitions=tuple(site.safety.allowed_partitions) or None,
    )


# ------------------------------------------------------------------------------ slurm.conf settings

_RESTART = "in {conf}, then restart slurmctld and every slurmd"


def settings_findings(exp: Expected) -> list[Finding]:
    """The Slurm settings the trust model rests on, as slurmctld reports them."""
    c, conf = exp.config, exp.slurm_conf
    restart = _RESTART.format(conf=conf)
    values = {
        "PrologFlags": ",".join(c.prolog_flags),
        "ProctrackType": c.proctrack_type,
        "TaskPlugin": ",".join(c.task_plugin),
        "JobSubmitPlugins": ",".join(c.job_submit_plugins),
    }
    checks = {  # key: (is it safe, why not, the fix)
        "PrologFlags": (
            "contain" in {f.lower() for f in c.prolog_flags},  # Slurm sets Alloc with Contain
            "needs Alloc (the prolog decides before any step) and Contain (every job has its cgroup "
            "from the start; implies Alloc)",
            f"set PrologFlags=Alloc,Contain (keeping any other flags) {restart}",
        ),
        "ProctrackType": (
            c.proctrack_type == "proctrack/cgroup",
            "a job's processes are tracked, and faults contained, only with proctrack/cgroup",
            f"set ProctrackType=proctrack/cgroup {restart}",
        ),
        "TaskPlugin": (
            "task/cgroup" in c.task_plugin,
            "without task/cgroup a job's limits (cores, memory, devices) are not enforced",
            f"add task/cgroup to TaskPlugin (e.g. TaskPlugin=task/cgroup,task/affinity) {restart}",
        ),
        "JobSubmitPlugins": (
            any(p in ("lua", "job_submit/lua") for p in c.job_submit_plugins),
            "without lua nothing refuses --chaos at submission and no job is granted a fault",
            f"add lua to JobSubmitPlugins {restart}",
        ),
    }
    out = []
    for key, (ok, why, fix) in checks.items():
        setting = f"{key}={values[key] or '(none)'}"
        if ok:
            out.append(Finding(CONTROLLER, f"slurm.conf {key}", Status.OK, conf, setting))
        else:
            out.append(
                Finding(CONTROLLER, f"slurm.conf {key}", Status.UNSAFE, conf, f"{setting}: {why}", fix)
            )
    return out


def preemption_findings(exp: Expected, host: str = CONTROLLER) -> list[Finding]:
    """Partitions the policy allows that preempt by suspension: a suspended job runs no epilog, so
    the job that preempts it would get the node with the faults in place (the prolog refuses faults
    there; the partition should not suspend, or not be the policy's)."""
    c, item = exp.config, "slurm.conf PreemptMode"
    allowed = exp.allowed_partitions
    cluster = c.preempt_mode or "OFF"
    if exp.partitions is None:
        modes, scope = {"(every partition)": ""}, " (the partitions could not be listed: cluster-wide)"
    else:
        modes, scope = dict(exp.partitions), ""
    bad = [
        f"{name} (PreemptMode={mode or cluster})"
        for name, mode in modes.items()
        if (allowed is None or "*" in allowed or name in allowed)
        and suspends(mode or cluster, c.preempt_type)
    ]
    if not bad:
        settings = f"PreemptMode={cluster}, PreemptType={c.preempt_type or '(none)'}"
        detail = f"{settings}: no partition the policy allows suspends jobs{scope}"
        return [Finding(host, item, Status.OK, exp.slurm_conf, detail)]
    detail = (
        f"{', '.join(bad)} preempt by suspension{scope}: a suspended chaos job runs no epilog while the "
        "job that preempts it gets the node with the faults in place (the prolog refuses faults there)"
    )
    fix = (
        "set PreemptMode=REQUEUE or CANCEL on those partitions (PartitionName=... PreemptMode=REQUEUE) "
        f"{_RESTART.format(conf=exp.slurm_conf)}, or leave them out of safety.allowed_partitions in "
        f"{exp.site_path} and run {exp.reinstall}"
    )
    return [Finding(host, item, Status.UNSAFE, exp.slurm_conf, detail, fix)]


def partition_modes(text: str) -> dict[str, str]:
    """Each partition's own PreemptMode in slurm.conf's text ('' where it sets none; a
    ``PartitionName=DEFAULT`` line's applies to the lines after it)."""
    out: dict[str, str] = {}
    default = ""
    for line in text.splitlines():
        words = dict(w.split("=", 1) for w in line.split("#", 1)[0].split() if "=" in w)
        keys = {k.lower(): v for k, v in words.items()}
        name = keys.get("partitionname")
        if not name:
            continue
        mode = keys.get("preemptmode", default)
        if name.upper() == "DEFAULT":
            default = mode
        else:
            out[name] = mode
    return out


# ------------------------------------------------------------------------------ files


def policy_findings(files: NodeFiles, host: str, exp: Expected) -> list[Finding]:
    """The policy: root's all the way up, and it parses (else every fault is refused)."""
    found, chain = check_root_path(files, host, "policy file", exp.policy, f"run {exp.reinstall}")
    out = [found]
    if found.status is not Status.OK:
        return out
    entry = chain.entries[-1][1]
    if not stat.S_ISREG(entry.mode):
        out.append(
            Finding(
                host, "policy parses", Status.UNSAFE, exp.policy, "not a regular file", f"run {exp.reinstall}"
            )
        )
        return out
    text = files.read(exp.policy)
    try:
        if text is None:
            raise PolicyError("cannot be read")
        parse_policy(text)
    except PolicyError as exc:
        fix = f"run {exp.reinstall} (it renders the policy from the site's safety: section)"
        out.append(
            Finding(host, "policy parses", Status.UNSAFE, exp.policy, f"{exc}: every fault is refused", fix)
        )
        return out
    out.append(Finding(host, "policy parses", Status.OK, exp.policy, "version 1, well-formed"))
    return out


def slurm_conf_findings(files: NodeFiles, host: str, exp: Expected) -> list[Finding]:
    found, _ = check_root_path(
        files, host, "slurm.conf", exp.slurm_conf, "the site's slurm.conf is not where slurmctld says"
    )
    return [found]


def job_submit_findings(files: NodeFiles, exp: Expected) -> list[Finding]:
    """Our job_submit.lua beside slurm.conf, root's, exactly what install renders; or the site's
    own (root's too: slurmctld runs it) calling ours under OWN_LUA."""
    etc = str(Path(exp.slurm_conf).parent)
    lua, own = os.path.join(etc, JOB_SUBMIT_LUA), os.path.join(etc, OWN_LUA)
    fix = f"run {exp.reinstall} on the controller"
    text = files.read(lua)
    out: list[Finding] = []
    if text is not None and LUA_MARK not in text:
        found, _ = check_root_path(files, CONTROLLER, "site's job_submit.lua", lua, fix)
        out.append(found)
        if own not in text:
            detail = f"the site's own script does not load {own}: --chaos is not refused at submission"
            calls = f"dofile('{own}') at its top and call its slurm_job_submit from yours"
            out.append(Finding(CONTROLLER, "job_submit.lua calls ours", Status.UNSAFE, lua, detail, calls))
        lua = own
    found, _ = check_root_path(files, CONTROLLER, "job_submit.lua", lua, fix)
    out.append(found)
    if found.status is not Status.OK:
        return out
    if files.read(lua) == render_job_submit(Path(exp.policy)):
        out.append(
            Finding(CONTROLLER, "job_submit.lua content", Status.OK, lua, "as plugin install renders it")
        )
    else:
        detail = (
            f"differs from what plugin install renders for policy {exp.policy} (edited, or an older version)"
        )
        out.append(Finding(CONTROLLER, "job_submit.lua content", Status.UNSAFE, lua, detail, fix))
    return out


def _plugstack_lines(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def plugstack_findings(files: NodeFiles, host: str, exp: Expected) -> list[Finding]:
    """plugstack.conf: root's; one `required` line of ours with only our arguments; every other
    plugin and include root's too (slurmstepd loads them all as root)."""
    path = exp.plugstack
    found, _ = check_root_path(files, host, "plugstack.conf", path, f"run {exp.reinstall}")
    if found.status is not Status.OK:
        return [found]
    out = [found]
    lines = _plugstack_lines(files.read(path) or "")
    ours = [w for w in lines if len(w) >= 2 and w[0] != "include" and PurePosixPath(w[1]).name == PLUGIN_FILE]
    if not ours:
        detail = f"no {PLUGIN_FILE} line: the plugin neither checks --chaos nor enforces the prolog's grant"
        return [
            *out,
            Finding(host, "plugstack.conf line", Status.MISSING, path, detail, f"run {exp.reinstall}"),
        ]
    if len(ours) > 1:
        detail = f"{len(ours)} {PLUGIN_FILE} lines: exactly one is expected"
        return [
            *out,
            Finding(host, "plugstack.conf line", Status.UNSAFE, path, detail, f"run {exp.reinstall}"),
        ]
    out.append(_our_line(host, path, ours[0], exp))
    out += _plugin_files(files, host, ours[0][1], exp)
    out += _other_plugstack_entries(files, host, path, [w for w in lines if w is not ours[0]])
    return out


def _our_line(host: str, path: str, words: list[str], exp: Expected) -> Finding:
    want = {"policy": exp.policy, "journal_dir": exp.journal_root}
    args: dict[str, list[str]] = {}
    for word in words[2:]:
        key, _, value = word.partition("=")
        args.setdefault(key, []).append(value)
    problems = []
    if words[0] != "required":
        problems.append(
            f"'{words[0]}' instead of 'required': a plugin that fails to load would let jobs run unchecked"
        )
    for key in sorted(set(args) - set(PLUGIN_ARGS)):
        problems.append(f"argument '{key}' is not one the plugin takes (only {', '.join(PLUGIN_ARGS)})")
    for key, value in want.items():
        if args.get(key) != [value]:
            problems.append(f"{key}={','.join(args.get(key, [])) or '(missing)'}, expected {key}={value}")
    if problems:
        return Finding(
            host, "plugstack.conf line", Status.UNSAFE, path, "; ".join(problems), f"run {exp.reinstall}"
        )
    return Finding(host, "plugstack.conf line", Status.OK, path, " ".join(words))


def _plugin_files(files: NodeFiles, host: str, so: str, exp: Expected) -> list[Finding]:
    if not so.startswith("/"):
        detail = f"{so} is not an absolute path: slurmstepd would search PluginDir for it"
        return [Finding(host, "plugin", Status.UNSAFE, so, detail, f"run {exp.reinstall}")]
    shim = str(PurePosixPath(so).parent / SHIM_FILE)
    return [
        check_root_path(files, host, "plugin", so, f"run {exp.reinstall} (it builds and installs it)")[0],
        check_root_path(files, host, "I/O shim", shim, f"run {exp.reinstall} (it builds and installs it)")[0],
    ]


def _other_plugstack_entries(files: NodeFiles, host: str, path: str, lines: list[list[str]]) -> list[Finding]:
    """Every other plugin and include: slurmstepd runs them as root, so a user must not write them."""
    out = []
    for words in lines:
        if words[0] == "include" and len(words) >= 2:
            for target in _include_targets(files, words[1]):
                f, _ = check_root_path(
                    files, host, "plugstack include", target, "remove the include or restore the file"
                )
                out.append(f)
        elif len(words) >= 2 and words[1].startswith("/"):
            f, _ = check_root_path(
                files, host, "other SPANK plugin", words[1], "remove its line or restore the file"
            )
            out.append(f)
    return out


def _include_targets(files: NodeFiles, pattern: str) -> list[str]:
    """An include's files: the pattern itself, or the directory of a glob and what it matches there."""
    if not any(c in pattern for c in "*?["):
        return [pattern]
    directory = str(PurePosixPath(pattern).parent)
    return [directory, *files.unsafe_below(directory)]  # each judged, links by their whole chain


# ------------------------------------------------------------------------------ hooks

_BOOTSTRAP_ROOT = re.compile(r"sys\.path\.insert\(0, ['\"]([^'\"]+)['\"]\)")


def hook_content_problems(text: str) -> list[str]:
    """Why a hook's text is not fit to run as root (our hardening rules), empty if it is."""
    problems = []
    if not re.search(r"(?m)^cd / \|\| exit 0$", text):
        problems.append("does not start from / (cd /)")
    if not re.search(rf"(?m)^PATH={re.escape(SYSTEM_PATH)}$", text):
        problems.append(f"does not set PATH={SYSTEM_PATH}")
    if "PYTHONPATH" in text:
        problems.append("sets PYTHONPATH (the import root belongs in the bootstrap, not the environment)")
    if not re.search(r"\s-I\s+-c\s", text):
        problems.append("does not run python -I (isolated: no PYTHON* variables, no current directory)")
    for tool in re.findall(r"(?m)^\s*(?:exec\s+)?(\S+)\s+-k\s+\d+", text):
        if not tool.startswith("/") and not tool.startswith("'/"):
            problems.append(f"runs '{tool}' without an absolute path")
    python = python_of(text)
    if python and not python.startswith("/"):
        problems.append(f"runs '{python}' without an absolute path")
    return problems


def _command_words(text: str) -> list[list[str]]:
    """The hook's lines as the shell splits them (continuations joined, comments dropped)."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        try:
            out.append(shlex.split(line, comments=True))
        except ValueError:
            continue
    return out


def python_of(text: str) -> str | None:
    """The interpreter a hook runs (``PY -I -c`` or ``PY -m``)."""
    for words in _command_words(text):
        for before, word in pairwise(words):
            if word == "-I" or (word == "-m" and re.search(r"python[0-9.]*$", before)):
                return before
    return None


def hook_options(text: str) -> dict[str, str]:
    """The ``--option value`` pairs of the hook's command (where its policy, journal and logs are)."""
    out: dict[str, str] = {}
    for words in _command_words(text):
        for key, value in pairwise(words):
            if key.startswith("--") and not value.startswith("--"):
                out.setdefault(key, value)
    return out


def import_root_of(text: str) -> str | None:
    """The directory a hook puts first on sys.path: its bootstrap's, else its PYTHONPATH's first."""
    for words in _command_words(text):
        if "-c" in words[:-1]:
            m = _BOOTSTRAP_ROOT.search(words[words.index("-c") + 1])
            if m:
                return m.group(1)
        for word in words:
            key, _, value = word.partition("=")
            if key in ("PYTHONPATH", "export PYTHONPATH") and value:
                return re.split(r"[:$]", value)[0]
    return None


def hook_findings(
    files: NodeFiles,
    host: str,
    item: str,
    path: str,
    exp: Expected,
    want_options: Mapping[str, str] | None = None,
) -> list[Finding]:
    """One hook of ours: root's all the way up, hardened, and the code and interpreter it runs root's."""
    found, _ = check_root_path(files, host, item, path, f"run {exp.reinstall}")
    if found.status is not Status.OK:
        return [found]
    text = files.read(path) or ""
    problems = hook_content_problems(text)
    options = hook_options(text)
    for option, want in (want_options or {}).items():
        if options.get(option) != want:
            problems.append(f"{option} {options.get(option, '(missing)')}, expected {want}")
    out = [found]
    if problems:
        out.append(
            Finding(host, f"{item} content", Status.UNSAFE, path, "; ".join(problems), f"run {exp.reinstall}")
        )
    else:
        out.append(
            Finding(host, f"{item} content", Status.OK, path, "cd /, fixed PATH, python -I, absolute tools")
        )
    python = python_of(text)
    if python and python.startswith("/"):
        fix = "install slurm-chaos with a root-owned interpreter and re-run plugin install"
        out.append(check_root_path(files, host, f"{item} interpreter", python, fix)[0])
    root = import_root_of(text)
    if root:
        out += import_root_findings(files, host, f"{item} import root", root, exp)
    return out


def import_root_findings(files: NodeFiles, host: str, item: str, root: str, exp: Expected) -> list[Finding]:
    fix = f"install slurm-chaos where only root writes (pip install as root), then {exp.reinstall}"
    found, _ = check_root_path(files, host, item, root, fix)
    if found.status is not Status.OK:
        return [found]
    package = os.path.join(root, "slurm_chaos")
    # The package directory itself (followed where it links), then everything in it: a root-owned
    # import root may hold a package directory that a user owns or links to.
    found_package, _ = check_root_path(files, host, item, package, fix)
    if found_package.status is not Status.OK:
        return [found_package]
    bad = untrusted_below(files, package + "/")  # the slash: into the package where it is a link
    if bad:
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        detail = f"not root's alone: {', '.join(bad[:3])}{more}"
        return [
            Finding(
                host,
                item,
                Status.UNSAFE,
                package,
                detail,
                f"chown -R root:root {package} && chmod -R go-w {package}",
            )
        ]
    return [found]


def dispatcher_findings(files: NodeFiles, host: str, kind: str, exp: Expected) -> list[Finding]:
    """slurm.conf's Prolog/Epilog: root's, and our hook is what it runs (directly or from kind.d/)."""
    item = f"slurm.conf {kind.capitalize()}"
    configured = exp.config.prolog if kind == "prolog" else exp.config.epilog
    hook = os.path.join(exp.hooks_dir or "", f"{kind}.d", HOOK_NAME)
    directory = os.path.dirname(hook)
    fix_set = (
        f"set {kind.capitalize()}= to a root-owned script that runs every executable of {directory} "
        f"(or to {hook})"
    )
    if not configured:
        return [
            Finding(
                host,
                item,
                Status.MISSING,
                exp.slurm_conf,
                f"{kind.capitalize()} is not set: our hook never runs",
                fix_set,
            )
        ]
    out = []
    for script in configured.split(","):
        found, _ = check_root_path(files, host, item, script, fix_set)
        out.append(found)
    if any(f.status is not Status.OK for f in out):
        return out
    scripts = configured.split(",")
    runs = hook in scripts or any(directory in (files.read(s) or "") for s in scripts)
    if not runs:
        detail = f"{configured} neither is {hook} nor names {directory}: our {kind} hook never runs"
        return [Finding(host, item, Status.UNSAFE, configured, detail, fix_set)]
    return [Finding(host, item, Status.OK, configured, f"root's; runs {hook}")]


def hooks_findings(files: NodeFiles, host: str, exp: Expected) -> list[Finding]:
    if not exp.hooks_dir:
        fix = f"set slurm.hooks_dir in {exp.site_path} and run {exp.reinstall}"
        return [Finding(host, "hooks", Status.MISSING, exp.site_path, "slurm.hooks_dir is not set", fix)]
    out = []
    want = {
        "--policy": exp.policy,
        "--journal-root": exp.journal_root,
        "--audit-log": exp.audit_log,
        "--log-file": exp.agent_log,
    }
    for kind in ("prolog", "epilog"):
        out += dispatcher_findings(files, host, kind, exp)
        hook = os.path.join(exp.hooks_dir, f"{kind}.d", HOOK_NAME)
        out += hook_findings(files, host, f"{kind} hook", hook, exp, want)
        heartbeat = os.path.join(exp.hooks_dir, f"{kind}.d", HEARTBEAT_HOOK)
        if files.lstat([heartbeat]):
            out += hook_findings(files, host, f"{kind} heartbeat hook", heartbeat, exp)
    health = os.path.join(exp.hooks_dir, "healthcheck.d", HEALTHCHECK_HOOK)
    if files.lstat([health]):
        out += hook_findings(files, host, "health check hook", health, exp)
        if exp.config.health_check_program:  # optional: slurmd runs it as root when set
            fix = _ROOT_FIX.format(p=exp.config.health_check_program)
            item = "slurm.conf HealthCheckProgram"
            out.append(check_root_path(files, host, item, exp.config.health_check_program, fix)[0])
    return out


def directory_findings(files: NodeFiles, host: str, exp: Expected) -> list[Finding]:
    """Where root writes: the journal, the audit and agent logs, the heartbeat directories."""
    later = "not created yet (root creates it on first use); {parent} above it is root's"
    out = []
    dirs = [
        ("journal directory", exp.journal_root, f"run {exp.reinstall}", ""),
        ("audit log directory", str(Path(exp.audit_log).parent), "", later),
        ("agent log directory", str(Path(exp.agent_log).parent), "", later),
    ]
    heartbeat_dirs = [exp.heartbeat_dir] if exp.heartbeat_dir else []
    if exp.hooks_dir:  # where the heartbeat hook makes each job's directory, if it differs
        hook = files.read(os.path.join(exp.hooks_dir, "prolog.d", HEARTBEAT_HOOK)) or ""
        heartbeat_dirs.append(hook_options(hook).get("--dir", ""))
    for path in dict.fromkeys(d for d in heartbeat_dirs if d):
        dirs.append(("heartbeat directory", path, "", later))
    for item, path, fix, optional in dirs:
        out.append(
            check_root_path(files, host, item, path, fix, optional.format(parent=os.path.dirname(path)))[0]
        )
    return out


# ------------------------------------------------------------------------------ the audit


def controller_findings(files: NodeFiles, exp: Expected) -> list[Finding]:
    return [
        *settings_findings(exp),
        *preemption_findings(exp),
        *slurm_conf_findings(files, CONTROLLER, exp),
        *policy_findings(files, CONTROLLER, exp),
        *job_submit_findings(files, exp),
    ]


def node_findings(files: NodeFiles, host: str, exp: Expected) -> list[Finding]:
    return [
        *slurm_conf_findings(files, host, exp),
        *policy_findings(files, host, exp),
        *plugstack_findings(files, host, exp),
        *hooks_findings(files, host, exp),
        *directory_findings(files, host, exp),
    ]


def audit(exp: Expected, controller: NodeFiles, nodes: Mapping[str, NodeFiles | str]) -> Report:
    """Every finding: the controller's, then each node's (a str instead of files: why the node
    could not be read)."""
    findings = controller_findings(controller, exp)
    for node, files in nodes.items():
        if isinstance(files, str):
            fix = "bring the node up (or leave it out with --nodes) and check again"
            findings.append(Finding(node, "node reachable", Status.MISSING, node, files, fix))
        else:
            findings += node_findings(files, node, exp)
    return Report(tuple(findings))


def site_nodes(site: Site, wanted: Iterable[str] | None) -> list[str]:
    """The nodes to check: all of the site's partitions' nodes, or those named (each must be one)."""
    known = list(dict.fromkeys(n for nodes in site.partitions.values() for n in nodes))
    if wanted is None:
        return known
    wanted = list(dict.fromkeys(wanted))
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise UsageError(f"--nodes: {', '.join(unknown)} not in any partition of {site.path}")
    return wanted


def node_access(site: Site, node: str, runner: Runner) -> NodeFiles | str:
    """How to read a node's files: in a sandbox, nsenter into its slurmd's mount namespace; on a
    real cluster, a one-task srun on it (in the site's partition and reservation)."""
    if site.sandbox:
        from slurm_chaos.faults.cleanup import NsRunner
        from slurm_chaos.sandbox.daemons import alive, read_pid
        from slurm_chaos.sandbox.layout import Layout

        layout = Layout.load(site.sandbox)
        pid = read_pid(layout.slurmd_pidfile(node)) if layout else None
        if pid is None or not alive(pid):
            return f"the slurmd of sandbox node {node} is not running"
        files = RunnerFiles(NsRunner(runner, pid))
    else:
        opts = [f"--partition={site.slurm.partition}", "--time=5", "--job-name=slurm-chaos-check"]
        if site.slurm.reservation:
            opts.append(f"--reservation={site.slurm.reservation}")
        files = RunnerFiles(StepRunner(runner, node, tuple(opts)))
    return files.reach() or files


def slurm_conf_settings(text: str, path: str) -> ClusterConfig:
    """The settings of a slurm.conf file (``Key=value`` lines; comments dropped) that the audit reads."""
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    return replace(parse_scontrol_config("\n".join(lines)), slurm_conf=path)


def check_image(site_path: Path | str, root_dir: Path | str) -> Report:
    """Audit a node image (``--root DIR``) as a node: its files, and the Prolog, Epilog and
    PlugStackConfig of its own slurm.conf (none: reported as not set)."""
    from slurm_chaos.faults.install_root import InstallRoot
    from slurm_chaos.sandbox.layout import site_placeholders
    from slurm_chaos.site import load_site

    root = InstallRoot.at(root_dir, trusted=False)
    site = load_site(site_path, site_placeholders)
    files = ImageFiles(root.path)
    conf = site.slurm.conf or str(slurm_etc(site) / "slurm.conf")
    text = files.read(conf) or ""
    config = slurm_conf_settings(text, conf)
    exp = expected(site, config, str(root.path), partition_modes(text))
    why = root.untrusted()
    tree = (
        Finding(IMAGE, "image root", Status.UNSAFE, str(root.path), why, _ROOT_FIX.format(p=root.path))
        if why
        else Finding(
            IMAGE, "image root", Status.OK, str(root.path), "root's all the way up, writable by nobody else"
        )
    )
    return Report((tree, *preemption_findings(exp, IMAGE), *node_findings(files, IMAGE, exp)))


def check_site(
    site_path: Path | str, nodes: Iterable[str] | None = None, runner: Runner | None = None
) -> Report:
    """Audit the installation of a site: the controller (here) and each node named (default: all)."""
    from slurm_chaos.sandbox.layout import site_placeholders
    from slurm_chaos.site import load_site
    from slurm_chaos.slurm.backend import make_scheduler

    site = load_site(site_path, site_placeholders)
    names = site_nodes(site, nodes)
    runner = runner or SubprocessRunner(base_env=site.slurm_env())
    scheduler = make_scheduler(site.slurm_env(), runner)
    config = scheduler.cluster_config()
    try:
        partitions: dict[str, str] | None = {n: p.preempt_mode for n, p in scheduler.partitions().items()}
    except SlurmError:
        partitions = None  # judged by the cluster-wide mode, and said so
    exp = expected(site, config, partitions=partitions)
    return audit(exp, LocalFiles(), {n: node_access(site, n, runner) for n in names})
