"""What `slurm-chaos run` and `slurm-chaos campaign` do; the CLI only parses options and prints."""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from slurm_chaos.campaign import controller
from slurm_chaos.campaign.engine import Campaign, open_campaign, run_campaign, shape_of
from slurm_chaos.campaign.progress import Progress
from slurm_chaos.clock import Clock, SystemClock
from slurm_chaos.errors import ConfigError, UsageError
from slurm_chaos.experiment import Experiment, experiment_json, load_experiment, with_site_deadlines
from slurm_chaos.faults.journal import Outcome
from slurm_chaos.render import check_limits
from slurm_chaos.resources import shipped
from slurm_chaos.rundir import CONTROLLER_JOURNAL, MANIFEST, read_manifest
from slurm_chaos.runner import SubprocessRunner
from slurm_chaos.sandbox.layout import site_placeholders
from slurm_chaos.site import Site, load_site
from slurm_chaos.slurm.backend import Scheduler, make_scheduler
from slurm_chaos.slurm.model import JobState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Options:
    site: Path
    out: Path | None = None
    resume: Path | None = None
    dry_run: bool = False
    time_budget_min: float | None = None
    experiments_dirs: tuple[Path, ...] = ()
    quiet: bool = False
    calibration: Path | None = None
    # How a dry run's plan is printed: "text" (a table) or "json" (one document).
    plan_format: str = "text"


def load_suite(name: str, extra: tuple[Path, ...] = ()) -> list[Experiment]:
    suites = shipped("suites")
    path = Path(name) if name.endswith((".yaml", ".yml")) else suites / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in suites.glob("*.yaml")))
        raise UsageError(f"unknown suite {name!r} (known: {known})")
    data = yaml.safe_load(path.read_text())
    names = data.get("experiments") if isinstance(data, dict) else None
    if not isinstance(names, list) or not names:
        raise ConfigError(str(path), "experiments", "expected a non-empty list of experiment names")
    return [load_experiment(str(n), extra) for n in names]


def _baselines(site: Site, experiments: list[Experiment]) -> dict[str, list[str]]:
    """Job shape label -> the experiments that share its baseline (each checked against the limits)."""
    shapes: dict[str, list[str]] = {}
    for exp in experiments:
        check_limits(site, exp)
        if not exp.is_switchback:  # a switchback job is its own control: no baseline
            shapes.setdefault(shape_of(site, exp).label, []).append(exp.name)
    return shapes


def plan_json(site: Site, experiments: list[Experiment]) -> dict[str, Any]:
    """The dry-run plan as JSON data: the site, one baseline per job shape, every experiment."""
    return {
        "site": {
            "cluster": site.cluster,
            "path": str(site.path),
            "partition": site.slurm.partition,
            "reservation": site.slurm.reservation,
        },
        "baselines": [
            {"shape": label, "shared_by": names} for label, names in _baselines(site, experiments).items()
        ],
        # The deadlines the campaign will hold and judge by: the site's where it overrides them.
        "experiments": [
            experiment_json(with_site_deadlines(e, site.monitoring.deadlines)) for e in experiments
        ],
    }


def describe_plan(site: Site, experiments: list[Experiment]) -> str:
    """The dry-run plan: one baseline per job shape (switchback experiments need none), then each
    experiment's fault job and its design."""
    lines = [
        f"site {site.cluster} ({site.path}), partition {site.slurm.partition}, "
        f"reservation {site.slurm.reservation or '-'}"
    ]
    for label, names in _baselines(site, experiments).items():
        lines.append(f"baseline {label}: shared by {', '.join(names)}")
    lines.append("")
    lines.append(f"{'EXPERIMENT':<22} {'STRATEGY':<12} {'NODES':>5} {'DESIGN':<12} {'FAULT':<40} EXPECT")
    for exp in experiments:
        expect = ", ".join(exp.expect.detect + exp.expect.remediation) or (
            "regression" if exp.expect.regression else "-"
        )
        lines.append(
            f"{exp.name:<22} {exp.strategy:<12} {exp.nodes:>5} {exp.design:<12} "
            f"{exp.fault.spec or '(none: A/A control)':<40} {expect}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Connection:
    """The door to a cluster: its scheduler, and how its nodes are lost and restored."""

    scheduler: Scheduler
    control: controller.NodeControl
    clock: Clock = field(default_factory=SystemClock)


def connect(site: Site) -> Connection:
    """The real cluster the site describes: the one place the campaign builds command runners."""
    clock = SystemClock()
    scheduler = make_scheduler(site.slurm_env(), SubprocessRunner())
    control: controller.NodeControl
    if site.sandbox:
        control = controller.SandboxNodeControl(site.sandbox, SubprocessRunner(), scheduler, clock)
    else:
        control = controller.SlurmNodeControl(scheduler)
    return Connection(scheduler, control, clock)


def start(
    opts: Options,
    experiments: list[Experiment] | None,
    suite: str | None,
    kind: str,
    connection: Callable[[Site], Connection] = connect,
) -> Campaign | str:
    """The campaign ready to run, or the plan's text for a dry run; `connection` opens the cluster
    (tests pass a fake scheduler and clock)."""
    site = load_site(opts.site, site_placeholders)
    if suite is not None:
        experiments = load_suite(suite, opts.experiments_dirs)
    assert experiments is not None
    floor = 0.0
    if opts.calibration is not None:
        from slurm_chaos.rundir import load_recommended_min_effect

        floor = load_recommended_min_effect(opts.calibration)
    if opts.dry_run:
        if opts.plan_format == "json":
            return json.dumps(plan_json(site, experiments), indent=2)
        return describe_plan(site, experiments)
    conn = connection(site)
    if site.slurm.hooks_dir:
        # The health check must watch this site's signals (a weaker site config checks fewer).
        from slurm_chaos.observe.healthcheck import install_healthcheck

        install_healthcheck(Path(site.slurm.hooks_dir), site)
    return open_campaign(
        site,
        experiments,
        opts.resume or opts.out,
        resume=opts.resume is not None,
        scheduler=conn.scheduler,
        control=conn.control,
        kind=kind,
        progress=Progress(quiet=opts.quiet),
        clock=conn.clock,
        time_budget_s=opts.time_budget_min * 60 if opts.time_budget_min else None,
        min_effect_floor=floor,
    )


def execute(camp: Campaign) -> tuple[str, int]:
    """Run it, then report on what finished; (report table, exit code). A finished campaign is one
    window of the site's history (a partial one, once resumed): it is recorded before the report is
    written, whose page then shows the window against the last."""
    from slurm_chaos.analysis.commands import report_dir
    from slurm_chaos.analysis.report import analyse_run
    from slurm_chaos.history.commands import record_campaign

    finished = run_campaign(camp)
    if not camp.manifest.experiments:
        return f"no experiment finished; run directory {camp.run_dir}", 1 if finished else 130
    t0 = camp.clock.monotonic()
    report = analyse_run(camp.run_dir)
    recorded, trend = record_campaign(camp.site, camp.run_dir, report) if finished else ("", "")
    text, code = report_dir(camp.run_dir, "table", None, report, trend)
    camp.manifest.timings["analyse"] = camp.clock.monotonic() - t0
    camp.save()
    text += f"\nreport: {camp.run_dir / 'report.html'}  (json: report.json, junit: report.xml)\n"
    if not finished:
        # Stopped before its end (Ctrl-C or the time budget): 130 whatever the finished experiments
        # found, so a caller never reads a partial campaign as a complete one that failed.
        text += f"partial: resume with --resume {camp.run_dir}\n"
        return text, 130
    return text + recorded, code


def cleanup_site(site_path: Path, nodes: list[str] | None, run_dir: Path | None) -> list[Outcome]:
    """Revert leftovers: node faults whose job ended or whose deadline passed, and a run's controller faults.

    The node journals are read where this runs: in the sandbox every node's journal is on this
    machine; on a real cluster run it on each node (e.g. `srun -w NODES slurm-chaos cleanup ...`).
    """
    from slurm_chaos.faults.cleanup import cleanup
    from slurm_chaos.faults.install_hooks import site_journal_root

    site = load_site(site_path, site_placeholders)
    runner = SubprocessRunner(base_env=site.slurm_env())
    if run_dir is not None:
        refuse_untrusted_run_dir(run_dir)
    heartbeats = [Path(site.monitoring.heartbeat_dir)] if site.monitoring.heartbeat_dir else []
    done = cleanup(site_journal_root(site), nodes, runner, storage_roots=heartbeats)
    if run_dir is not None:
        conn = connect(site)
        lines = cancel_run_jobs(run_dir, conn.scheduler)
        journal = controller.ControllerJournal(run_dir / CONTROLLER_JOURNAL)
        lines += controller.rollback(journal, conn.scheduler, conn.control, conn.clock)
        done += [Outcome(line) for line in lines]
    return done


def refuse_untrusted_run_dir(run_dir: Path) -> None:
    """UsageError unless the run directory, and the manifest and controller journal read from it,
    belong to whoever runs this (or root) and nobody else may write them: ``cleanup --run`` cancels
    the job ids and undoes the node actions it reads there, as root at that."""
    for path in (run_dir, run_dir / MANIFEST, run_dir / CONTROLLER_JOURNAL):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # read_manifest names what is missing
        except OSError as exc:
            raise UsageError(f"--run: {path}: {exc.strerror}") from None
        why = _untrusted(st, directory=path == run_dir)
        if why:
            raise UsageError(
                f"--run: {path} {why}: refused (cleanup --run cancels the jobs and undoes the node "
                "actions it reads there)"
            )


def _untrusted(st: os.stat_result, directory: bool) -> str | None:
    me = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if not (stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)):
        return "is not a directory" if directory else "is not a regular file"
    if st.st_uid not in (me, 0):
        return f"is owned by uid {st.st_uid}, neither yours ({me}) nor root's"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def cancel_run_jobs(run_dir: Path, scheduler: Scheduler) -> list[str]:
    """Cancel the run's jobs that Slurm still has queued or running (their campaign was killed);
    each job's epilog then reverts its node faults."""
    manifest = read_manifest(run_dir)
    ids = [j.job_id for j in manifest.jobs]
    polled = scheduler.poll(ids) if ids else {}
    live = [i for i, info in polled.items() if not info.state.is_terminal or info.state == JobState.REQUEUED]
    if live:
        scheduler.cancel(live)
    return [f"job {i} of {run_dir.name} cancelled" for i in sorted(live)]
