"""The prolog's decision: may this job's faults be applied on this node? From trusted facts only.

Nothing here reads what the job's user controls (the job's environment, ``SPANK_*`` variables,
their own plugstack.conf): a user can set ``SPANK_SLURM_CHAOS_SPEC`` for any job of theirs.

- The SPEC is the one slurmctld holds in the job's AdminComment as ``slurm-chaos=<SPEC>``.
  Only an administrator can set AdminComment: slurmctld refuses it from anyone else at
  submission and on update. slurm-chaos's job_submit.lua copies the ``--chaos`` SPEC there when
  the policy allows the job (and refuses the job otherwise); an administrator may also set it on
  a held job (``scontrol update job=J AdminComment=slurm-chaos=SPEC``).
- The job's uid and user come from slurmd (``SLURM_JOB_UID``, ``SLURM_JOB_USER``); account,
  partition, reservation, oversubscription, array and het membership and node count from
  slurmctld (:meth:`Scheduler.job_record`).
- The rules come from the root-owned policy file (:mod:`slurm_chaos.faults.policy`); besides,
  no job gets faults in a partition that preempts by suspension (PreemptMode SUSPEND or GANG, the
  partition's own or the cluster's, as slurmctld reports them): a suspended job runs no epilog
  while the job that preempts it gets the node, faults and all.

Each decision on a job with a SPEC is appended to the root-owned audit log, and written to the
job's grant file on this node, ``<journal root>/<node>/<job>.grant``, for the SPANK plugin: in
slurmstepd it applies task-level faults only to the SPEC the prolog granted (``policy.c``).

A grant holds for one run of one job: the prolog removes any grant of its job id before it
decides (a job id slurmctld hands out again after its state was reset finds none), the epilog
removes it, and it records an ``until`` time (the job's end by its time limit, or the hooks'
bounded default) after which the plugin refuses it and cleanup removes it. (Grants once carried
the job's submit time too, which nothing checked: slurmstepd has no submit time of its own to
compare it with, and the prolog's removal and ``until`` already bind a grant to one run. It is no
longer written; the plugin still parses it in grants written before.)
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from slurm_chaos.faults.policy import JobFacts, load_policy, preemption_refusal, refusal, user_refusal
from slurm_chaos.faults.spec import SpecError, canonical_spec
from slurm_chaos.slurm.backend import Scheduler
from slurm_chaos.slurm.model import JobRecord

#: AdminComment of a job granted faults: this prefix, then the SPEC.
SPEC_MARK = "slurm-chaos="
DEFAULT_AUDIT_LOG = Path("/var/log/slurm-chaos/audit.log")
GRANT_SUFFIX = ".grant"
MAX_GRANT_BYTES = 8192


@dataclass(frozen=True)
class Decision:
    """The prolog's answer for one job with a SPEC on one node."""

    job_id: str
    node: str
    spec: str
    facts: JobFacts
    nodes: tuple[str, ...]
    refused: str | None = None
    #: The one interface netem may shape (the policy's job_interface).
    job_interface: str | None = None
    #: The end the job's time limit sets (epoch seconds; None: not known).
    end: float | None = None

    @property
    def granted(self) -> bool:
        return self.refused is None


def spec_from_admin_comment(admin_comment: str) -> str:
    """The SPEC of `admin_comment` (``slurm-chaos=<SPEC>``), or '' if it holds none."""
    text = admin_comment.strip()
    return text[len(SPEC_MARK) :] if text.startswith(SPEC_MARK) else ""


def escaped(text: str) -> str:
    """Text for a log line: quoted, control characters escaped (a SPEC may come from anyone)."""
    return json.dumps(text, ensure_ascii=True)


def env_facts(env: Mapping[str, str]) -> JobFacts | None:
    """The facts slurmd puts in the prolog's environment: uid and user (None without a uid)."""
    uid = env.get("SLURM_JOB_UID", "")
    if not uid.isdigit():
        return None
    return JobFacts(uid=int(uid), user=env.get("SLURM_JOB_USER") or None)


def record_facts(record: JobRecord, uid: int, user: str | None = None, het: bool = False) -> JobFacts:
    """The policy's facts from slurmctld's record of a job, with the uid (and user name) of whoever
    vouched for it first (slurmd, a heartbeat directory's owner); ``het``: slurmd says it is one."""
    return JobFacts(
        uid=uid,
        user=user or record.user or None,
        account=record.account or None,
        partition=record.partition or None,
        reservation=record.reservation or None,
        exclusive=record.exclusive,
        array=record.array,
        het=record.het or het,
        nodes=record.num_nodes,
    )


def decide(
    job_id: str, node: str, env: Mapping[str, str], scheduler: Scheduler, policy_path: Path
) -> Decision | None:
    """The decision for a job, or None when it asks for nothing (or nothing can be known).

    Raises PolicyError (a bad policy refuses every fault) and SlurmError (no answer: nothing
    is applied, since the SPEC itself is unknown).
    """
    policy = load_policy(policy_path)
    who = env_facts(env)
    if who is None or user_refusal(policy, who.uid, who.user):
        return None  # slurmctld is not asked about jobs of users the policy refuses anyway
    record = scheduler.job_record(job_id)
    spec = spec_from_admin_comment(record.admin_comment)
    if not spec:
        return None
    facts = record_facts(record, who.uid, who.user, het=bool(env.get("SLURM_HET_JOB_ID")))
    decision = Decision(
        job_id,
        node,
        spec,
        facts,
        record.nodes,
        job_interface=policy.job_interface,
        end=record.end_time.timestamp() if record.end_time else None,
    )
    if record.user_id != who.uid:
        return _refuse(decision, f"slurmd says uid {who.uid}, slurmctld says {record.user_id}")
    try:
        decision = replace(decision, spec=canonical_spec(spec))
    except SpecError as exc:
        return _refuse(decision, str(exc))
    why = refusal(policy, facts) or preemption_refusal(
        facts.partition, *preempt_mode(scheduler, facts.partition)
    )
    return _refuse(decision, why) if why else decision


def preempt_mode(scheduler: Scheduler, partition: str | None) -> tuple[str | None, str]:
    """(the partition's PreemptMode, the cluster's PreemptType) as slurmctld reports them: the
    partition's own mode, else the cluster's; None for a partition slurmctld does not know.
    SlurmError when it does not answer."""
    config = scheduler.cluster_config()
    part = scheduler.partitions().get(partition or "")
    if part is None:
        return None, config.preempt_type
    return part.preempt_mode or config.preempt_mode or "OFF", config.preempt_type


def _refuse(decision: Decision, why: str) -> Decision:
    return replace(decision, refused=why)


# --------------------------------------------------------------------------------- records


def _open_root_file(path: Path, flags: int, mode: int) -> int:
    """Open a file root keeps: no symlink, regular, root-owned, writable by nobody else."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise PermissionError(f"{path}: not a regular file of uid {os.geteuid()} writable only by it")
    return fd


def audit(path: Path, decision: Decision, when: float | None = None) -> None:
    """Append the decision to the audit log, one JSON line (who, which job, SPEC, nodes)."""
    entry = {
        "time": round(time.time() if when is None else when, 3),
        "decision": "granted" if decision.granted else "refused",
        "reason": decision.refused or "",
        "job_id": decision.job_id,
        "node": decision.node,
        "job_nodes": list(decision.nodes),
        "spec": decision.spec,
        **asdict(decision.facts),
    }
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = _open_root_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(entry, sort_keys=True, ensure_ascii=True) + "\n").encode())
    finally:
        os.close(fd)


def _node_dirs(journal_root: Path, node: str) -> list[Path]:
    # The plugin in slurmstepd looks under the short hostname, the hooks under SLURMD_NODENAME.
    host = socket.gethostname().split(".")[0]
    return [journal_root / n for n in dict.fromkeys((node, host)) if n and "/" not in n]


def grant_text(decision: Decision, until: float) -> str:
    """The grant file: ``key=value`` lines the plugin's C reader parses (see policy.c); it holds
    until `until` (epoch seconds)."""
    f = decision.facts

    def flag(value: bool | None) -> str:
        return "" if value is None else str(int(value))

    def epoch(value: float | None) -> str:
        return "" if value is None else str(int(value))

    lines = {
        "job": decision.job_id,
        "uid": str(f.uid),
        "user": f.user or "",
        "account": f.account or "",
        "partition": f.partition or "",
        "reservation": f.reservation or "",
        "exclusive": flag(f.exclusive),
        "array": flag(f.array),
        "het": flag(f.het),
        "nodes": "" if f.nodes is None else str(f.nodes),
        "spec": decision.spec,
        "until": epoch(until),
    }
    if decision.refused:
        lines["refused"] = decision.refused
    text = "".join(f"{k}={' '.join(v.split())}\n" for k, v in lines.items())  # one line each
    return text.encode()[:MAX_GRANT_BYTES].decode(errors="ignore")


def write_grant(journal_root: Path, decision: Decision, until: float) -> list[Path]:
    """Write the job's grant file on this node (mode 0600, atomically), valid until `until`;
    returns the paths."""
    written = []
    for node_dir in _node_dirs(journal_root, decision.node):
        node_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        path = node_dir / f"{decision.job_id}{GRANT_SUFFIX}"
        tmp = node_dir / f".{decision.job_id}{GRANT_SUFFIX}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, grant_text(decision, until).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        written.append(path)
    return written


def remove_grant(journal_root: Path, node: str, job_id: str) -> list[Path]:
    """Remove the job's grant files on this node; returns those removed."""
    removed: list[Path] = []
    if not job_id.isdigit():
        return removed
    for node_dir in _node_dirs(journal_root, node):
        path = node_dir / f"{job_id}{GRANT_SUFFIX}"
        if path.is_symlink() or path.is_file():
            path.unlink()
            removed.append(path)
    return removed


def read_grant(path: Path) -> dict[str, str]:
    """A grant file's ``key=value`` lines (no symlink, at most MAX_GRANT_BYTES); OSError if unreadable."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        text = os.read(fd, MAX_GRANT_BYTES).decode(errors="replace")
    finally:
        os.close(fd)
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def expired_grants(journal_root: Path, nodes: list[str] | None, now: float, default_s: float) -> list[Path]:
    """Grant files past their ``until`` (one without it, or unreadable: older than `default_s`)."""
    out: list[Path] = []
    if not journal_root.is_dir():
        return out
    for node_dir in sorted(p for p in journal_root.iterdir() if p.is_dir() and not p.is_symlink()):
        if nodes is not None and node_dir.name not in nodes:
            continue
        for path in sorted(node_dir.glob(f"*{GRANT_SUFFIX}")):
            try:
                until = read_grant(path).get("until", "")
                mtime = path.lstat().st_mtime
            except OSError:
                until, mtime = "", 0.0
            if (float(until) if until.isdigit() else mtime + default_s) < now:
                out.append(path)
    return out
