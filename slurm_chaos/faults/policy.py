"""Who may inject faults: the one root-owned policy file, and the decision on a job's facts.

``slurm-chaos plugin install --site S`` writes the policy from the site's ``safety:`` section to
``slurm-chaos-policy.toml`` beside slurm.conf (root-owned, mode 0644). Four readers share it:
the prolog hooks (this module), the SPANK plugin (``spank_plugin/policy.c``), and slurmctld's
job_submit/lua script (``job_submit.lua``). It is a strict subset of TOML that all three parse
the same way, line by line::

    # comment lines start with '#'
    version = 1
    allow_users = ["root", "alice", "1002"]     # names, uids or "*"; absent: only root
    allow_accounts = ["chaos"]                  # absent: any account
    allow_partitions = ["debug"]                # absent: any partition
    allow_reservations = ["maint"]              # absent: any (or no) reservation
    require_exclusive = true                    # default true
    allow_arrays = false                        # default false
    allow_het_jobs = false                      # default false
    max_nodes = 4                               # absent: no limit
    job_interface = "ib0"                       # absent: netem is refused

(Comments after a value, as above, are not part of the subset.) Strings in lists hold only the
characters of a Slurm name (``A-Z a-z 0-9 _ . @ * + -``); a list holds at most 64 of them, on one
line. ``job_interface`` is the one network interface netem may shape (the one the site's job
traffic uses, never one the job names): a Linux interface name of 1 to 15 characters
``A-Z a-z 0-9 _ . -``. Any other line, an unknown or repeated key, a value of the wrong type, a missing
``version = 1``: the file is malformed, and a malformed, missing, unreadable, non-root-owned or
group/world-writable policy refuses every fault.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from slurm_chaos.errors import ChaosError

POLICY_NAME = "slurm-chaos-policy.toml"
VERSION = 1
#: Limits shared with the C reader (fixed-size buffers there) and the Lua one.
MAX_POLICY_BYTES = 16384
MAX_ENTRIES = 64
NAME_RE = re.compile(r"[A-Za-z0-9_.@*+-]{1,127}")

LIST_KEYS = ("allow_users", "allow_accounts", "allow_partitions", "allow_reservations")
BOOL_KEYS = ("require_exclusive", "allow_arrays", "allow_het_jobs")
INT_KEYS = ("version", "max_nodes")
STR_KEYS = ("job_interface",)
#: A network interface name (IFNAMSIZ 16 with its NUL); "." and ".." are no interface.
IFACE_RE = re.compile(r"(?!\.{1,2}$)[A-Za-z0-9_.-]{1,15}")

_LINE = re.compile(r"[ \t]*([a-z_]+)[ \t]*=[ \t]*(.*?)[ \t]*")
_STRING = re.compile(r'"([^"]*)"')
_INT = re.compile(r"[0-9]{1,9}")


class PolicyError(ChaosError):
    """The policy file cannot be trusted or read: every fault is refused."""


@dataclass(frozen=True)
class Policy:
    """The rules; ``None`` for a list means the key is absent (see the module docstring)."""

    allow_users: tuple[str, ...] | None = None
    allow_accounts: tuple[str, ...] | None = None
    allow_partitions: tuple[str, ...] | None = None
    allow_reservations: tuple[str, ...] | None = None
    require_exclusive: bool = True
    allow_arrays: bool = False
    allow_het_jobs: bool = False
    max_nodes: int | None = None
    job_interface: str | None = None

    def render(self) -> str:
        """The file's text; ValueError names an entry no reader would accept."""
        lines = [
            "# slurm-chaos policy: who may inject faults (written by `slurm-chaos plugin install`).",
            "# Read by the prolog hooks, the SPANK plugin and job_submit.lua; root-owned, mode 0644.",
            "# Malformed, missing or writable by others: every fault is refused.",
            f"version = {VERSION}",
        ]
        for key in LIST_KEYS:
            names = getattr(self, key)
            if names is None:
                continue
            if len(names) > MAX_ENTRIES:
                raise ValueError(f"{key}: more than {MAX_ENTRIES} entries")
            for name in names:
                if not NAME_RE.fullmatch(name):
                    raise ValueError(f"{key}: {name!r} is not a plain name")
            lines.append(f"{key} = [{', '.join(json.dumps(n) for n in names)}]")
        lines += [f"{key} = {'true' if getattr(self, key) else 'false'}" for key in BOOL_KEYS]
        if self.max_nodes is not None:
            if not 0 < self.max_nodes < 10**9:
                raise ValueError(f"max_nodes: {self.max_nodes} out of range")
            lines.append(f"max_nodes = {self.max_nodes}")
        if self.job_interface is not None:
            if not IFACE_RE.fullmatch(self.job_interface):
                raise ValueError(f"job_interface: {self.job_interface!r} is not a network interface name")
            lines.append(f'job_interface = "{self.job_interface}"')
        return "\n".join(lines) + "\n"


def _value(key: str, text: str) -> tuple[str, ...] | bool | int | str:
    if key in STR_KEYS:
        m = _STRING.fullmatch(text)
        if not m or not IFACE_RE.fullmatch(m.group(1)):
            raise ValueError(f"{key}: expected a quoted network interface name")
        return m.group(1)
    if key in BOOL_KEYS:
        if text not in ("true", "false"):
            raise ValueError(f"{key}: expected true or false")
        return text == "true"
    if key in INT_KEYS:
        if not _INT.fullmatch(text):
            raise ValueError(f"{key}: expected a whole number")
        return int(text)
    if not (text.startswith("[") and text.endswith("]")):
        raise ValueError(f"{key}: expected a list of names on one line")
    inner = text[1:-1].strip(" \t")
    if not inner:
        return ()
    names = []
    for item in inner.split(","):
        item = item.strip(" \t")
        m = _STRING.fullmatch(item)
        if not m or not NAME_RE.fullmatch(m.group(1)):
            raise ValueError(f"{key}: '{item}' is not a quoted plain name")
        names.append(m.group(1))
    if len(names) > MAX_ENTRIES:
        raise ValueError(f"{key}: more than {MAX_ENTRIES} entries")
    return tuple(names)


def parse_policy(text: str) -> Policy:
    """The policy in `text`; PolicyError names the first bad line."""
    if len(text.encode("utf-8", "surrogateescape")) > MAX_POLICY_BYTES:
        raise PolicyError(f"policy: larger than {MAX_POLICY_BYTES} bytes")
    values: dict[str, tuple[str, ...] | bool | int | str] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        try:
            if any((c < " " and c != "\t") or c > "~" for c in line):
                raise ValueError("control or non-ASCII character")
            if not line.strip(" \t") or line.lstrip(" \t").startswith("#"):
                continue
            m = _LINE.fullmatch(line)
            if not m:
                raise ValueError("expected KEY = VALUE")
            key, text_value = m.groups()
            if key not in LIST_KEYS + BOOL_KEYS + INT_KEYS + STR_KEYS:
                raise ValueError(f"unknown key '{key}'")
            if key in values:
                raise ValueError(f"{key}: given twice")
            values[key] = _value(key, text_value)
        except ValueError as exc:
            raise PolicyError(f"policy line {number}: {exc}") from None
    if values.get("version") != VERSION:
        raise PolicyError(f"policy: 'version = {VERSION}' missing or another version")
    values.pop("version")
    if values.get("max_nodes") == 0:
        raise PolicyError("policy: max_nodes: must be 1 or more")
    return Policy(**values)  # type: ignore[arg-type]


def load_policy(path: Path) -> Policy:
    """Read the policy if it is a regular root-owned file nobody else may write; else PolicyError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise PolicyError(f"policy {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PolicyError(f"policy {path}: not a regular file")
        if st.st_uid != 0:
            raise PolicyError(f"policy {path}: owned by uid {st.st_uid}, not root")
        if st.st_mode & 0o022:
            raise PolicyError(f"policy {path}: writable by group or others (mode {st.st_mode & 0o777:o})")
        data = os.read(fd, MAX_POLICY_BYTES + 1)
    finally:
        os.close(fd)
    return parse_policy(data.decode("utf-8", "surrogateescape"))


def write_policy(path: Path, policy: Policy) -> None:
    """Write the policy root-owned, mode 0644, atomically (readers never see half a file)."""
    text = policy.render()
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
        os.fchmod(fd, 0o644)
        if os.geteuid() == 0:
            os.fchown(fd, 0, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------- the decision


@dataclass(frozen=True)
class JobFacts:
    """What Slurm (slurmd, slurmctld) says about a job; ``None`` where it is not known."""

    uid: int
    user: str | None
    account: str | None = None
    partition: str | None = None
    reservation: str | None = None
    exclusive: bool | None = None
    array: bool | None = None
    het: bool | None = None
    nodes: int | None = None


def _listed(names: tuple[str, ...], value: str | None) -> bool:
    return bool(value) and ("*" in names or value in names)


def _rule(policy: Policy, key: str, what: str, value: str | None) -> str | None:
    names = getattr(policy, key)
    if names is None or _listed(names, value):
        return None
    if not value:
        return f"the job's {what} is not known but {key} is set in the policy"
    return f"{what} '{value}' is not in {key}"


def user_refusal(policy: Policy, uid: int, user: str | None) -> str | None:
    """Why this user may not inject faults at all, or None (root always may)."""
    users = policy.allow_users or ()
    if uid == 0 or _listed(users, user) or _listed(users, str(uid)):
        return None
    why = "not in allow_users" if policy.allow_users is not None else "only root: allow_users is not set"
    return f"user '{user or '?'}' (uid {uid}) may not inject faults ({why})"


def refusal(policy: Policy, facts: JobFacts) -> str | None:
    """Why the job may not inject faults, or None if it may (the same rules as policy.c)."""
    why = user_refusal(policy, facts.uid, facts.user)
    if why:
        return why
    for key, what, value in (
        ("allow_accounts", "account", facts.account),
        ("allow_partitions", "partition", facts.partition),
        ("allow_reservations", "reservation", facts.reservation),
    ):
        why = _rule(policy, key, what, value)
        if why:
            return why
    if policy.require_exclusive and not facts.exclusive:
        return "the job does not hold its nodes exclusively (require_exclusive: submit with --exclusive)"
    if not policy.allow_arrays and facts.array is not False:
        return "array jobs may not inject faults (allow_arrays is not set)"
    if not policy.allow_het_jobs and facts.het is not False:
        return "heterogeneous jobs may not inject faults (allow_het_jobs is not set)"
    if policy.max_nodes is not None and (facts.nodes is None or facts.nodes > policy.max_nodes):
        count = "an unknown number of" if facts.nodes is None else str(facts.nodes)
        return f"the job has {count} nodes (max_nodes {policy.max_nodes})"
    return None


#: PreemptMode words under which slurmctld suspends a running job: preemption by suspension, and
#: gang scheduling (which time-slices jobs by suspending them in turn).
SUSPENDING = frozenset({"SUSPEND", "GANG"})


def suspends(preempt_mode: str, preempt_type: str = "") -> bool:
    """Whether a partition with this PreemptMode (and the cluster's PreemptType) may suspend a
    running job: SUSPEND under a preemption plugin, or GANG."""
    words = {w.strip().upper() for w in preempt_mode.split(",") if w.strip()}
    if "GANG" in words:
        return True
    return "SUSPEND" in words and preempt_type.strip().lower() != "preempt/none"


def preemption_refusal(partition: str | None, preempt_mode: str | None, preempt_type: str = "") -> str | None:
    """Why a job in `partition` may not inject faults because of preemption, or None.

    A suspended job runs no epilog, and the job that preempted it gets the node with the faults
    still in place (netem, a GPU's clocks, a full checkpoint volume): the next tenant's job runs
    under another's faults. `preempt_mode`: the partition's PreemptMode as slurmctld reports it
    (None: not known, which refuses too)."""
    if preempt_mode is None:
        return f"the preemption mode of partition '{partition or '?'}' is not known (slurmctld did not say)"
    if suspends(preempt_mode, preempt_type):
        return (
            f"partition '{partition or '?'}' preempts by suspension (PreemptMode={preempt_mode}): a "
            "suspended job runs no epilog, and the job that preempts it would get the node with the "
            "faults in place"
        )
    return None
