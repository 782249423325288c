"""Entry point the prolog/epilog hook scripts run: ``python -m slurm_chaos.faults.hooks prolog|epilog``.

Reads the job from the environment slurmd gives prolog and epilog: SLURM_JOB_ID, SLURMD_NODENAME,
SLURM_JOB_UID, SLURM_JOB_GID, SLURM_JOB_NODELIST, and the SPEC the SPANK plugin passed with
``spank_job_control_setenv("SLURM_CHAOS_SPEC")``, which slurmd hands over as
``SPANK_SLURM_CHAOS_SPEC``. Without the plugin, a file ``<spec dir>/<job id>`` holding the SPEC
(written between ``sbatch --hold`` and ``scontrol release``) does the same. The plugin may also
pass ``SLURM_CHAOS_DEADLINE`` (seconds) to bound the watchdog by the job's time limit.

Every failure is logged with the 'slurm-chaos:' prefix and the exit code is always 0: a hook's
own failure must never drain the node.
"""

from __future__ import annotations

import argparse
import os
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_chaos.faults import agent
from slurm_chaos.faults.cleanup import cleanup
from slurm_chaos.faults.journal import DEFAULT_ROOT
from slurm_chaos.faults.node_base import log
from slurm_chaos.hostlist import expand_hostlist
from slurm_chaos.runner import Runner, SubprocessRunner

SPEC_ENV = ("SPANK_SLURM_CHAOS_SPEC", "SLURM_CHAOS_SPEC")
DEADLINE_ENV = ("SPANK_SLURM_CHAOS_DEADLINE", "SLURM_CHAOS_DEADLINE")


def job_spec(env: Mapping[str, str], spec_dir: Path | None) -> str:
    """The job's SPEC: from the plugin's variable, else from the fallback file, else ''."""
    for name in SPEC_ENV:
        if env.get(name):
            return env[name].strip()
    job = env.get("SLURM_JOB_ID", "")
    if spec_dir is not None and job.isdigit():
        try:
            return (spec_dir / job).read_text().strip()
        except OSError:
            return ""
    return ""


def _int(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key, "")
    return int(value) if value.isdigit() else None


def _deadline(env: Mapping[str, str], default: float) -> float:
    for name in DEADLINE_ENV:
        try:
            return min(default, float(env[name]))
        except (KeyError, ValueError):
            continue
    return default


def _stale(args: argparse.Namespace, node: str, runner: Runner, kind: str) -> None:
    """Revert this node's leftovers whose deadline passed (no Slurm call from a hook: deadline only)."""
    for line in cleanup(args.journal_root, [node], runner, job_running=lambda _job: None):
        log.info("%s cleanup: %s", kind, line)


def _job_nodes(env: Mapping[str, str], runner: Runner, job: str, spec: str) -> list[str]:
    """The job's nodes: Slurm 22.05's prolog has no SLURM_JOB_NODELIST, so ask once (time-bounded),
    and only when a fault needs the list (slow-node picks its node by index)."""
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    if not nodelist and "slow-node" in spec:
        res = runner(["squeue", "-h", "-j", job, "-o", "%N"], timeout=5)
        nodelist = res.stdout.strip() if res.ok else ""
    return expand_hostlist(nodelist)


def prolog(args: argparse.Namespace, env: Mapping[str, str], runner: Runner) -> None:
    job, node = env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")
    if not job or not node:
        log.error("prolog: SLURM_JOB_ID or SLURMD_NODENAME missing from the environment")
        return
    _stale(args, node, runner, "prolog")
    spec = job_spec(env, args.spec_dir)
    if not spec:
        return
    res = agent.apply(
        job,
        node,
        spec,
        _deadline(env, args.deadline),
        args.journal_root,
        runner,
        nodes=_job_nodes(env, runner, job, spec),
        uid=_int(env, "SLURM_JOB_UID"),
        gid=_int(env, "SLURM_JOB_GID"),
        log_file=args.log_file,
        ckpt_roots=args.ckpt_root,
    )
    log.info(
        "prolog: job %s on %s: SPEC %s: applied [%s] failed [%s] agent %s %s",
        job,
        node,
        spec,
        ",".join(res.applied),
        ",".join(res.failed),
        res.agent_pid,
        res.note,
    )


def epilog(args: argparse.Namespace, env: Mapping[str, str], runner: Runner) -> None:
    job, node = env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")
    if not job or not node:
        log.error("epilog: SLURM_JOB_ID or SLURMD_NODENAME missing from the environment")
        return
    for line in agent.undo(job, node, args.journal_root, runner):
        log.info("epilog: job %s on %s: %s", job, node, line)
    _stale(args, node, runner, "epilog")


def main(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, runner: Runner | None = None
) -> int:
    p = argparse.ArgumentParser(prog="python -m slurm_chaos.faults.hooks")
    p.add_argument("kind", choices=["prolog", "epilog"])
    p.add_argument("--journal-root", type=Path, default=DEFAULT_ROOT)
    p.add_argument("--log-file", type=Path, default=None)
    p.add_argument("--spec-dir", type=Path, default=None)
    p.add_argument("--deadline", type=float, default=agent.DEFAULT_DEADLINE_S)
    p.add_argument("--ckpt-root", action="append", default=[], help="an allowed checkpoint root (repeatable)")
    args = p.parse_args(argv)
    agent.setup_logging(args.log_file)
    agent.ensure_system_path()
    environ = env if env is not None else dict(os.environ)
    try:
        (prolog if args.kind == "prolog" else epilog)(args, environ, runner or SubprocessRunner())
    except Exception:  # never let a hook's own failure drain the node
        log.error("%s failed for job %s:\n%s", args.kind, environ.get("SLURM_JOB_ID"), traceback.format_exc())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
