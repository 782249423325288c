"""Render the sbatch scripts of an experiment from the Jinja templates in `sbatch_templates/`."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import jinja2

from slurm_chaos import __version__
from slurm_chaos.errors import UsageError
from slurm_chaos.experiment import CONTROL_KEY, Design, Experiment, with_site_deadlines
from slurm_chaos.resources import shipped
from slurm_chaos.rundir import write_schedule
from slurm_chaos.rundir.layout import RELEASE, SCHEDULE, Role
from slurm_chaos.schedule import (
    MAX_BLOCK,
    WARMUP_STEPS,
    SwitchbackSchedule,
    min_pairs,
    switchback_schedule,
)
from slurm_chaos.site import Site

ROLES = tuple(Role)


def templates_dir() -> Path:
    """$SLURM_CHAOS_TEMPLATES (a site's own templates), else the shipped sbatch_templates/."""
    override = os.environ.get("SLURM_CHAOS_TEMPLATES")
    if not override:
        return shipped("sbatch_templates")
    if not (Path(override) / "baseline.sbatch.j2").is_file():
        raise UsageError(f"SLURM_CHAOS_TEMPLATES={override}: no baseline.sbatch.j2 there")
    return Path(override)


@dataclass(frozen=True)
class RenderedJob:
    role: Role
    script: Path
    job_dir: Path


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir()),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - shell scripts, values are quoted with shquote
    )
    env.filters["shquote"] = lambda v: shlex.quote(str(v))
    return env


def check_limits(site: Site, experiment: Experiment) -> None:
    """Refuse an experiment the site's safety limits do not allow, before anything is written."""
    if experiment.nodes > site.safety.max_nodes:
        raise UsageError(
            f"experiment {experiment.name} asks for {experiment.nodes} nodes; "
            f"{site.path}: safety.max_nodes is {site.safety.max_nodes}"
        )
    if site.slurm.partition not in site.safety.allowed_partitions:
        raise UsageError(
            f"{site.path}: slurm.partition {site.slurm.partition!r} is not in safety.allowed_partitions"
        )
    if experiment.nodes > len(site.partition_nodes):
        raise UsageError(
            f"experiment {experiment.name} asks for {experiment.nodes} nodes; partition "
            f"{site.slurm.partition} has {len(site.partition_nodes)}"
        )
    steps = probe_steps(site, experiment)
    if experiment.is_switchback and steps < SWITCHBACK_MIN_STEPS:
        raise UsageError(
            f"experiment {experiment.name}: design switchback needs at least {SWITCHBACK_MIN_STEPS} "
            f"steps ({WARMUP_STEPS} warm-up, then {min_pairs(SWITCHBACK_ALPHA * SWITCHBACK_QUIET_SHARE)} "
            f"on/off pairs of blocks of up to {MAX_BLOCK} steps), it has {steps}"
        )
    unknown = unknown_features(experiment.constraint or "", site.features)
    if unknown:
        raise UsageError(
            f"experiment {experiment.name}: constraint {experiment.constraint!r} names features no node "
            f"has: {', '.join(unknown)} ({site.path}: features: {', '.join(site.features)})"
        )


def unknown_features(constraint: str, features: Mapping[str, object]) -> list[str]:
    """Feature names of an sbatch --constraint (`a&b`, `[a|b]`, `a*2`) the site does not list.

    A site that lists no features is not checked.
    """
    if not features:
        return []
    names = re.findall(r"[A-Za-z_][\w.-]*", re.sub(r"\*\d+", "", constraint))
    return sorted(set(names) - set(features))


#: The level of the switchback test (slurm_chaos.analysis.switchback.ALPHA, not imported here: scipy).
SWITCHBACK_ALPHA = 0.01
#: The share of alpha its quieter statistic is tested at (switchback.QUIET_SHARE).
SWITCHBACK_QUIET_SHARE = 0.8
#: Fewest steps that hold enough on/off pairs for the switchback test to reach p < alpha at all.
SWITCHBACK_MIN_STEPS = WARMUP_STEPS + 2 * MAX_BLOCK * min_pairs(SWITCHBACK_ALPHA * SWITCHBACK_QUIET_SHARE)
#: A switchback job's steps unless the experiment sets its own: some 39 on/off pairs of 10-15-step
#: blocks after the warm-up. On the sandbox's real noise (recorded on a loaded machine) the test
#: detects 9.5% with 80% power at 1,000 steps (6.3% at 2,000, 13% at 500;
#: bench/bench_noise_sandbox.py), ~15 s of a sandbox probe at ~15 ms a step; on a quiet machine
#: control-aa's 99% CI at 2,000 steps was +-3%. 2,000 doubled the maintenance campaign's time
#: (786 s against 284 s at 500): the faults it runs cost 20% or more, so 1,000 is the default and an
#: experiment after a smaller effect sets its own ``steps:``.
SWITCHBACK_STEPS = 1000


def probe_steps(site: Site, experiment: Experiment) -> int:
    """The probe's steps for an experiment: its own, else the site's; a switchback experiment that
    sets none gets at least SWITCHBACK_STEPS (its test needs on/off pairs, not a short run)."""
    if experiment.steps:
        return experiment.steps
    if experiment.is_switchback:
        return max(site.probe.steps, SWITCHBACK_STEPS)
    return site.probe.steps


def switchback_seed(run_id: str, name: str) -> int:
    """The seed of an experiment's fault schedule in one run (32 bits): the same run id and
    experiment name give the same schedule, so a resumed run resubmits the same job."""
    digest = hashlib.sha256(f"{run_id}\0{name}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def fault_schedule(
    site: Site, experiment: Experiment, run_id: str, replicate: int | None = None
) -> SwitchbackSchedule | None:
    """The switchback schedule of the experiment's fault job in run ``run_id`` (a placebo for an
    experiment without a fault); None for a between-runs experiment. ``replicate`` tells apart the
    jobs of one experiment that a run repeats (a calibration's placebo runs): each its own seed."""
    if experiment.design is not Design.SWITCHBACK:
        return None
    rank = experiment.fault.target.rank
    name = experiment.name if replicate is None else f"{experiment.name}#{replicate}"
    return switchback_schedule(
        probe_steps(site, experiment),
        switchback_seed(run_id, name),
        placebo=experiment.is_control,
        affected_ranks=() if rank is None else (rank,),
    )


def switchback_spec(spec: str) -> str:
    """The SPEC with ``control=switchback`` on each reversible fault, in canonical form: it starts
    off and follows the probe's schedule."""
    from slurm_chaos.faults.choices import Control
    from slurm_chaos.faults.spec import FaultRequest, format_spec, parse_spec

    requests = []
    for r in parse_spec(spec):
        if r.fault.key(CONTROL_KEY) is not None:
            order = [k.name for k in r.fault.keys]
            given = {**dict(r.params), CONTROL_KEY: Control.SWITCHBACK.value}
            r = FaultRequest(r.fault, tuple(sorted(given.items(), key=lambda item: order.index(item[0]))))
        requests.append(r)
    return format_spec(requests)


def checkpoint_dir(site: Site, experiment: Experiment, role: Role, run_id: str) -> Path:
    return Path(site.checkpoint.path) / run_id / experiment.name / role


def fault_spec(site: Site, experiment: Experiment, role: Role, run_id: str) -> str | None:
    """The job's --chaos SPEC, with ${checkpoint_dir} filled in (faults on the checkpoint path need
    it), and for a switchback experiment ``control=switchback`` on each of its faults."""
    if role != Role.FAULT or experiment.fault.spec is None:
        return None
    ckpt = checkpoint_dir(site, experiment, role, run_id)
    try:
        spec = string.Template(experiment.fault.spec).substitute(checkpoint_dir=str(ckpt))
    except (KeyError, ValueError) as exc:
        raise UsageError(
            f"{experiment.path}: fault.spec: unknown placeholder {exc} (known: checkpoint_dir)"
        ) from exc
    return switchback_spec(spec) if experiment.is_switchback else spec


def render_job(
    site: Site, experiment: Experiment, role: Role, job_dir: Path, run_id: str, replicate: int | None = None
) -> str:
    """The text of one sbatch script (``replicate``: see :func:`fault_schedule`)."""
    role = Role(role)
    experiment = with_site_deadlines(experiment, site.monitoring.deadlines)  # the hold's limit
    template = _environment().get_template(f"{role}.sbatch.j2")
    ckpt_dir = checkpoint_dir(site, experiment, role, run_id)
    hold = experiment.hold_limit_s if role is Role.FAULT else None
    spec = fault_spec(site, experiment, role, run_id)
    schedule = fault_schedule(site, experiment, run_id, replicate) if role is Role.FAULT else None
    steps = probe_steps(site, experiment)
    return template.render(
        site=site,
        experiment=experiment,
        role=role,
        run_id=run_id,
        version=__version__,
        job_dir=str(job_dir),
        ckpt_dir=str(ckpt_dir),
        nodes=experiment.nodes,
        tasks_per_node=experiment.tasks_per_node or site.probe.tasks_per_node,
        steps=steps if schedule is None else max(steps, schedule.end_step),
        nccl_env=site.nccl_env,
        fault_spec=spec,
        hold_file=None if hold is None else str(job_dir / RELEASE),
        hold_max_s=None if hold is None else f"{hold:g}",
        injection_root=injection_root(site, spec),
        fault_schedule=None if schedule is None else str(job_dir / SCHEDULE),
        fault_control=control_root(site) if schedule is not None and spec else None,
    )


def control_root(site: Site) -> str:
    """Where a switchback job's ranks find their node's fault control channel: the journal root
    (the same directory ``injection collect --journal-root`` reads)."""
    from slurm_chaos.faults.install_hooks import site_journal_root

    return str(site_journal_root(site))


def recorded_faults(spec: str | None) -> frozenset[str]:
    """The faults of a SPEC that record on each node whether their injection took."""
    from slurm_chaos.faults.injection import RECORDED
    from slurm_chaos.faults.spec import parse_spec

    return frozenset(r.name for r in parse_spec(spec) if r.name in RECORDED) if spec else frozenset()


def injection_root(site: Site, spec: str | None) -> str | None:
    """Where the nodes keep their injection records (the journal root), for a SPEC with a fault
    that keeps one; None: the fault job has nothing to collect."""
    from slurm_chaos.faults.install_hooks import site_journal_root

    if not recorded_faults(spec):
        return None
    return str(site_journal_root(site))


def render_experiment(site: Site, experiment: Experiment, out: Path, run_id: str) -> list[RenderedJob]:
    """Write baseline.sbatch and fault.sbatch under `out` (a dry run: nothing is submitted); a
    switchback experiment has no baseline job, and its fault job's schedule.json is written too."""
    check_limits(site, experiment)
    jobs = []
    schedule = fault_schedule(site, experiment, run_id)
    for role in (Role.FAULT,) if schedule is not None else ROLES:
        job_dir = out / role
        job_dir.mkdir(parents=True, exist_ok=True)
        if schedule is not None:
            write_schedule(job_dir, schedule.to_json())
        script = out / f"{role}.sbatch"
        script.write_text(render_job(site, experiment, role, job_dir.resolve(), run_id))
        script.chmod(0o755)
        jobs.append(RenderedJob(role, script, job_dir))
    return jobs
