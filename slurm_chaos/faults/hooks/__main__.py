"""Entry point of the prolog/epilog hook scripts (``install_hooks``): ``prolog|epilog [options]``.

The prolog decides from trusted facts only (:mod:`slurm_chaos.faults.authz`): the job's SPEC
from its AdminComment in slurmctld, its uid and user from slurmd's ``SLURM_JOB_UID`` and
``SLURM_JOB_USER``, the rest from slurmctld, the rules from the root-owned policy file. It never
reads the SPEC from the job's environment (``SPANK_*`` is the user's to set). Every decision on a
job with a SPEC goes to the audit log and to the job's grant file for the SPANK plugin; a granted
SPEC's node-level faults are then applied by the agent. Their deadline (by which the watchdog
reverts them even if no epilog runs and slurmctld cannot be reached) is the job's end by its time
limit as slurmctld told the prolog, or ``--deadline`` where it has none; ``SLURM_CHAOS_DEADLINE``
(seconds, from the job) may only shorten it. The grant holds until the same time. GPU faults act
only on slurmd's ``SLURM_JOB_GPUS``, netem only on the policy's ``job_interface``.

The epilog of every job (not only of jobs with faults: the hook script runs Python whenever the
node has anything of slurm-chaos newer than its last tidy state) stops the job's agent, reverts
its journal, removes its grant file, then reverts this node's journals whose deadline passed and
removes expired grants.

Every failure is logged with the 'slurm-chaos:' prefix. A hook that leaves an undo undone (the
job's own, or a stale one it retried; or it crashed with the job's journal still pending) drains
the node with the reason ``slurm-chaos: undo failed: ...`` and exits EXIT_UNDO_FAILED: a node
that still holds a fault must not go back into service. Any other failure exits 0: a hook's own
failure must never drain the node.
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from slurm_chaos.errors import SlurmError
from slurm_chaos.faults import agent, authz, injection
from slurm_chaos.faults.cleanup import cleanup, mark_tidy
from slurm_chaos.faults.hooks import EXIT_UNDO_FAILED, undo_failed_reason
from slurm_chaos.faults.journal import DEFAULT_ROOT, Journal, Outcome
from slurm_chaos.faults.node_base import log
from slurm_chaos.faults.node_gpu import parse_job_gpus
from slurm_chaos.faults.policy import POLICY_NAME, PolicyError
from slurm_chaos.runner import Runner, SubprocessRunner
from slurm_chaos.slurm.backend import Scheduler, make_scheduler

DEADLINE_ENV = ("SPANK_SLURM_CHAOS_DEADLINE", "SLURM_CHAOS_DEADLINE")
DEFAULT_SLURM_ETC = Path("/etc/slurm")


def _deadline(env: Mapping[str, str], default: float) -> float:
    for name in DEADLINE_ENV:
        try:
            return min(default, float(env[name]))
        except (KeyError, ValueError):
            continue
    return default


def deadline_s(decision: authz.Decision, env: Mapping[str, str], default: float, now: float) -> float:
    """Seconds until the job's faults must be undone: its end by its time limit (slurmctld's word in
    the prolog, so an unreachable controller later changes nothing), else `default`; the job may
    only shorten it."""
    if decision.end is not None:
        default = min(max(0.0, decision.end - now) + agent.TIME_LIMIT_GRACE_S, agent.MAX_DEADLINE_S)
    return _deadline(env, default)


def _stale(args: argparse.Namespace, node: str, runner: Runner, kind: str) -> list[str]:
    """Revert this node's leftovers whose deadline passed (or whose undo failed before) and remove
    expired grants (no Slurm call from a hook: by deadline only); returns what failed."""
    lines = cleanup(
        args.journal_root, [node], runner, job_running=lambda _job: None, grant_default_s=args.deadline
    )
    for line in lines:
        (log.error if line.failed else log.info)("%s cleanup: %s", kind, line)
    return _failed(lines)


def _failed(outcomes: list[Outcome]) -> list[str]:
    return [o.what for o in outcomes if o.failed]


def _decide(
    args: argparse.Namespace, job: str, node: str, env: Mapping[str, str], scheduler: Scheduler
) -> authz.Decision | None:
    """The decision, audited and written to the grant file; None when the job asks for nothing."""
    try:
        decision = authz.decide(job, node, env, scheduler, args.policy)
    except PolicyError as exc:
        log.error("prolog: job %s on %s: every fault refused: %s", job, node, exc)
        return None
    except SlurmError as exc:
        log.error("prolog: job %s on %s: no fault applied: slurmctld did not answer: %s", job, node, exc)
        return None
    if decision is None:
        return None
    try:
        authz.audit(args.audit_log, decision)
    except OSError as exc:
        decision = replace(decision, refused=f"cannot write the audit log {args.audit_log}: {exc}")
    return decision


def prolog(
    args: argparse.Namespace, env: Mapping[str, str], runner: Runner, scheduler: Scheduler
) -> list[str]:
    """Tidy this node, then decide on the job and apply what is granted; returns the undos of stale
    leftovers that failed (the node must not take the job)."""
    job, node = env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")
    if not job.isdigit() or not node:
        log.error("prolog: SLURM_JOB_ID or SLURMD_NODENAME missing from the environment")
        return []
    # First of all: a grant holds for one run of the job. One left under this id (a node that
    # crashed, a controller whose state was reset and now hands the id out again) grants nothing.
    for path in authz.remove_grant(args.journal_root, node, job):
        log.warning(
            "prolog: job %s on %s: removed a grant left by an earlier run of this job id: %s", job, node, path
        )
    injection.remove(args.journal_root, node, job)  # what an earlier run's faults did says nothing now
    failed = _stale(args, node, runner, "prolog")
    if failed:
        return failed  # nothing is applied on a node that still holds an earlier job's fault
    mark_tidy(args.journal_root, node)
    if args.tidy_only:
        return []
    decision = _decide(args, job, node, env, scheduler)
    if decision is None:
        return []
    deadline = deadline_s(decision, env, args.deadline, time.time())
    authz.write_grant(args.journal_root, decision, time.time() + deadline)
    spec = authz.escaped(decision.spec)
    if not decision.granted:
        log.warning("prolog: job %s on %s: SPEC %s refused: %s", job, node, spec, decision.refused)
        return []
    res = agent.apply(
        job,
        node,
        decision.spec,
        deadline,
        args.journal_root,
        runner,
        nodes=decision.nodes,
        uid=decision.facts.uid,
        gid=int(env["SLURM_JOB_GID"]) if env.get("SLURM_JOB_GID", "").isdigit() else None,
        log_file=args.log_file,
        ckpt_roots=args.ckpt_root,
        job_interface=decision.job_interface,
        gpus=parse_job_gpus(env.get("SLURM_JOB_GPUS")),
        exclusive=decision.facts.exclusive is True,
    )
    log.info(
        "prolog: job %s on %s: SPEC %s granted: applied [%s] failed [%s] agent %s %s",
        job,
        node,
        spec,
        ",".join(res.applied),
        ",".join(res.failed),
        res.agent_pid,
        res.note,
    )
    return []


def epilog(
    args: argparse.Namespace, env: Mapping[str, str], runner: Runner, scheduler: Scheduler
) -> list[str]:
    """Undo the job's faults, remove its grant, tidy the node; returns the undos that failed."""
    job, node = env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")
    if not job.isdigit() or not node:
        log.error("epilog: SLURM_JOB_ID or SLURMD_NODENAME missing from the environment")
        return []
    undone = agent.undo(job, node, args.journal_root, runner)
    for line in undone:
        (log.error if line.failed else log.info)("epilog: job %s on %s: %s", job, node, line)
    authz.remove_grant(args.journal_root, node, job)
    injection.remove(args.journal_root, node, job)  # the job's own step has copied it by now
    # The stale sweep retries the job's own failed undo at once: each failure is named once.
    failed = list(dict.fromkeys(_failed(undone) + _stale(args, node, runner, "epilog")))
    if not failed:
        mark_tidy(args.journal_root, node)
    return failed


def left_undone(journal_root: Path, env: Mapping[str, str]) -> list[str]:
    """After a hook crashed: the job's own journal's changes still pending (none without a
    journal; one that cannot be read counts as pending: fail closed)."""
    job, node = env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")
    if not job.isdigit() or not node or "/" in node:
        return []
    journal = Journal(journal_root, node, job)
    try:
        pending = journal.read().pending() if journal.path.exists() else []
    except OSError as exc:
        return [f"{node} job {job}: its journal cannot be read after the hook crashed: {exc.strerror}"]
    return [f"{node} job {job} {e.fault}: {e.action}: the hook crashed before undoing it" for e in pending]


def drain_for(kind: str, env: Mapping[str, str], failed: list[str], scheduler: Scheduler | None) -> int:
    """Take the node out of service for undos left undone: the reason on stderr (slurmd logs it)
    and as the node's drain reason; returns EXIT_UNDO_FAILED."""
    node = env.get("SLURMD_NODENAME", "")
    reason = undo_failed_reason(failed[0], len(failed) - 1)
    log.error("%s: %s: draining %s", kind, reason, node or "?")
    if node and scheduler is not None:
        try:
            scheduler.drain(node, reason)
        except Exception as exc:  # the non-zero exit still fails the hook in slurmd
            log.error("%s: cannot drain %s: %s", kind, node, exc)
    return EXIT_UNDO_FAILED


def _default_policy(env: Mapping[str, str]) -> Path:
    # SLURM_CONF in the hooks' environment is slurmd's own configuration file.
    conf = env.get("SLURM_CONF", "")
    return (Path(conf).parent if conf.startswith("/") else DEFAULT_SLURM_ETC) / POLICY_NAME


def main(
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    runner: Runner | None = None,
    scheduler: Scheduler | None = None,
) -> int:
    environ = env if env is not None else dict(os.environ)
    p = argparse.ArgumentParser(prog="slurm-chaos hook")
    p.add_argument("kind", choices=["prolog", "epilog"])
    p.add_argument("--journal-root", type=Path, default=DEFAULT_ROOT)
    p.add_argument("--log-file", type=Path, default=None)
    p.add_argument("--policy", type=Path, default=_default_policy(environ))
    p.add_argument("--audit-log", type=Path, default=authz.DEFAULT_AUDIT_LOG)
    p.add_argument(
        "--deadline",
        type=float,
        default=agent.DEFAULT_DEADLINE_S,
        help="seconds until the watchdog undoes a job's faults when slurmctld gave the prolog no end time",
    )
    p.add_argument("--ckpt-root", action="append", default=[], help="an allowed checkpoint root (repeatable)")
    p.add_argument(
        "--tidy-only",
        action="store_true",
        help="prolog: only revert this node's stale leftovers (the policy cannot name the job's user)",
    )
    args = p.parse_args(argv)
    agent.setup_logging(args.log_file)
    agent.ensure_system_path()
    run = runner or SubprocessRunner()
    slurm = scheduler
    try:
        slurm = slurm or make_scheduler({k: v for k, v in environ.items() if k == "SLURM_CONF"}, run)
        failed = (prolog if args.kind == "prolog" else epilog)(args, environ, run, slurm)
    except Exception:  # a hook's own failure drains the node only if it left an undo undone
        log.error("%s failed for job %s:\n%s", args.kind, environ.get("SLURM_JOB_ID"), traceback.format_exc())
        failed = left_undone(args.journal_root, environ) if args.kind == "epilog" else []
    return drain_for(args.kind, environ, failed, slurm) if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
