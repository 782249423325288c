"""The `slurm-chaos` command line: parses options, calls the package, maps errors to exit codes.

Exit codes: 0 success (every verdict PASSED), 1 findings (a verdict other than PASSED, an audit
that found problems), 2 bad input (options, config, data), 3 the tool failed (Slurm unreachable,
a job that could not be submitted), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeAlias

from slurm_chaos import __version__
from slurm_chaos.errors import ChaosError
from slurm_chaos.resources import site_config

log = logging.getLogger("slurm_chaos")

Handler = Callable[[argparse.Namespace], int]

SITE_HELP = "site config YAML, or the name of a shipped one (sandbox, h100-ib-example)"
FORMAT_HELP = "text for people, json for programs: one JSON document on stdout (default: text)"
# A string: argparse._SubParsersAction is generic only to type checkers.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _command(
    sub: Subparsers, name: str, help: str, description: str, exits: str, example: str
) -> argparse.ArgumentParser:
    """A subcommand whose --help says what it does, its exit codes and an example command line."""
    return sub.add_parser(
        name,
        help=help,
        description=description,
        epilog="\n".join(textwrap.wrap(f"exit codes: {exits}", 96, subsequent_indent="  "))
        + f"\n\nexample:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _add_format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", default="text", choices=["text", "json"], help=FORMAT_HELP)


def _sandbox_up(args: argparse.Namespace) -> int:
    from slurm_chaos.sandbox.cluster import Sandbox

    t0 = time.monotonic()
    cgroups = False if args.no_cgroups else None  # None: $SLURM_CHAOS_SANDBOX_CGROUPS, on by default
    layout = Sandbox(args.name).up(
        nodes=args.nodes,
        install=not args.no_install,
        cgroups=cgroups,
        switches=args.switches,
        health=args.health,
    )
    print(
        f"sandbox {layout.name}: {layout.nodes} nodes on {len(layout.switches())} leaf switches "
        f"idle after {time.monotonic() - t0:.1f} s"
    )
    print(f"export SLURM_CONF={layout.slurm_conf}")
    return 0


def _sandbox_down(args: argparse.Namespace) -> int:
    from slurm_chaos.sandbox.cluster import Sandbox

    stopped = Sandbox(args.name).down(purge=not args.keep_state)
    for item in stopped:
        print(f"stopped {item}")
    print(f"sandbox {args.name}: down")
    return 0


def _sandbox_status(args: argparse.Namespace) -> int:
    from slurm_chaos.sandbox.cluster import Sandbox

    status = Sandbox(args.name).status()
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        print(
            f"sandbox {status['name']}  root {status['root']}  bridge {status['bridge']} {status['subnet']}"
        )
        daemons, monitors, nodes = status["daemons"], status["monitoring"], status["nodes"]
        assert isinstance(daemons, dict) and isinstance(monitors, dict) and isinstance(nodes, dict)
        w = max(16, *(len(label) for label in monitors))
        for label, pid in daemons.items():
            print(f"  {label:<{w}} {'pid ' + str(pid) if pid else 'NOT RUNNING'}")
        for label, pid in monitors.items():
            shown = f"pid {pid}" if isinstance(pid, int) else pid or "not running"
            print(f"  {label:<{w}} {shown}")
        for node, state in nodes.items():
            print(f"  {node:<{w}} {state}")
        print(f"  {'health check':<{w}} {status['health']}")
    daemons = status["daemons"]
    assert isinstance(daemons, dict)
    return 0 if all(daemons.values()) else 1


def _sandbox_env(args: argparse.Namespace) -> int:
    from slurm_chaos.sandbox.cluster import Sandbox

    layout = Sandbox(args.name).layout()
    for key, value in layout.env().items():
        print(f"export {key}={value}")
    return 0


SANDBOX_EXITS = {
    "up": "0 every node idle, 1 a daemon or node did not come up (its log named), 2 bad option, "
    "130 interrupted",
    "down": "0 stopped, 1 something could not be stopped, 2 bad option",
    "status": "0 every daemon running, 1 a daemon is not running, 2 bad option",
    "env": "0 printed, 2 bad option (a bad --name)",
}


def _add_sandbox(sub: Subparsers) -> None:
    p = _command(
        sub,
        "sandbox",
        "a real multi-node Slurm cluster on this machine (root)",
        "A real Slurm cluster on this machine: munge, MariaDB + slurmdbd, slurmctld and N slurmd nodes,\n"
        "each in its own network namespace. Needs root; see the subcommands.",
        "those of the subcommand; 2 no or an unknown subcommand",
        'sudo slurm-chaos sandbox up --nodes 4 && eval "$(slurm-chaos sandbox env)"',
    )
    ss = p.add_subparsers(dest="sandbox_cmd", required=True, metavar="{up,down,status,env}")

    def named(
        name: str, help: str, description: str, example: str, handler: Handler
    ) -> argparse.ArgumentParser:
        q = _command(ss, name, help, description, SANDBOX_EXITS[name], example)
        q.add_argument("--name", default="chaos", help="sandbox name, 1-8 of [a-z0-9-] (default: chaos)")
        q.set_defaults(handler=handler)
        return q

    up = named(
        "up",
        "start munge, MariaDB, slurmdbd, slurmctld and N slurmd nodes; wait until idle",
        "Start munge, MariaDB + slurmdbd, slurmctld and N slurmd nodes, each in its own network\n"
        "namespace, and wait until every node is idle; prints the SLURM_CONF to export.",
        "sudo slurm-chaos sandbox up --name chaos --nodes 4\n"
        "  sudo slurm-chaos sandbox up --name scale --nodes 64 --switches 4\n"
        "  sudo slurm-chaos sandbox up --name nhc --health nhc",
        _sandbox_up,
    )
    up.add_argument("--nodes", type=int, default=4, help="number of compute nodes, 1-64 (default: 4)")
    up.add_argument(
        "--switches",
        type=int,
        default=0,
        help="leaf switches under the spine, the nodes split evenly between them in order, one rack "
        "each (default: two nodes per leaf)",
    )
    up.add_argument("--no-install", action="store_true", help="do not install missing Debian packages")
    up.add_argument(
        "--health",
        choices=["slurm-chaos", "nhc"],
        default=None,
        help="what the nodes' HealthCheckProgram runs: slurm-chaos's health check hooks, or LBNL NHC "
        "(installed into the sandbox's directory from ../shared/thirdparty/lbnl-nhc; see "
        "site_configs/sandbox-nhc.yaml); a running sandbox switches at once (default: as it is, "
        "slurm-chaos for a new one)",
    )
    up.add_argument(
        "--no-cgroups",
        action="store_true",
        help="without Slurm's cgroup plugins (proctrack/linuxproc, no task plugin); faults that must "
        "stay inside the job's cgroup are then refused",
    )
    down = named(
        "down",
        "stop what the sandbox started and delete its namespaces and bridge",
        "Stop every daemon the sandbox started and delete its network namespaces and bridge; its Slurm\n"
        "state and accounting database too, unless --keep-state.",
        "sudo slurm-chaos sandbox down --name chaos",
        _sandbox_down,
    )
    down.add_argument(
        "--keep-state", action="store_true", help="keep Slurm state and the accounting database"
    )
    st = named(
        "status",
        "daemons and node states",
        "Show the sandbox's daemons (with their pids), its monitoring daemons (Prometheus, Alertmanager,\n"
        "the exporter, each node's node_exporter) and the state of each node.",
        "slurm-chaos sandbox status --name chaos --json",
        _sandbox_status,
    )
    st.add_argument("--json", action="store_true", help="machine-readable output")
    named(
        "env",
        "print the environment for Slurm commands (export SLURM_CONF=...)",
        "Print the environment Slurm's commands need to talk to this sandbox, as shell export lines.",
        'eval "$(slurm-chaos sandbox env --name chaos)" && sinfo',
        _sandbox_env,
    )


def _render(args: argparse.Namespace) -> int:
    from slurm_chaos.experiment import load_experiment
    from slurm_chaos.render import render_experiment
    from slurm_chaos.sandbox.layout import site_placeholders
    from slurm_chaos.site import load_site

    site = load_site(args.site, site_placeholders)
    experiment = load_experiment(args.experiment, tuple(args.experiments_dir))
    for job in render_experiment(site, experiment, Path(args.out), run_id=args.run_id or "dry-run"):
        print(f"{job.role:<9} {job.script}")
    return 0


def _site_init(args: argparse.Namespace) -> int:
    from slurm_chaos.onboard import init_from_slurm, refuse_overwrite, to_yaml, write_site
    from slurm_chaos.runner import SubprocessRunner

    out = Path(args.out) if args.out else None
    if out:
        refuse_overwrite(out, args.force)
    draft = init_from_slurm(os.environ, SubprocessRunner(), args.reservation)
    text = to_yaml(draft)
    if out is None:
        print(text, end="")
        return 0
    write_site(out, text, args.force)
    print(f"wrote {out}: {len(draft.todos)} TODO entries to fill in (slurm-chaos site check {out})")
    return 0


def _site_check(args: argparse.Namespace) -> int:
    from slurm_chaos.sandbox.layout import site_placeholders
    from slurm_chaos.site import load_site

    site = load_site(args.site, site_placeholders)
    resv = f", reservation {site.slurm.reservation}" if site.slurm.reservation else ""
    print(
        f"{site.path}: cluster {site.cluster}, partition {site.slurm.partition} "
        f"({len(site.partition_nodes)} nodes){resv}, {len(site.racks)} racks: complete"
    )
    return 0


SITE_INIT_HELP = """\
Write a site config from what Slurm reports: the cluster name, partitions, the nodes' CPUs,
sockets (as NUMA nodes) and GPUs with the sockets gres.conf binds them to, one rack per leaf
switch of topology.conf, node features, and the maintenance reservation (--reservation, or the
only one there is). What Slurm cannot tell (checkpoint path, monitoring URLs, health-check
detectors, allowed users, the probe's Python) is written as "TODO: ..." values: every command
that reads the file refuses it, naming each TODO key, until they are filled in.

Slurm is the one SLURM_CONF points at (or Slurm's default).
"""


def _add_site(sub: Subparsers) -> None:
    p = _command(
        sub,
        "site",
        "onboard a cluster: write a site config from Slurm, check one",
        "Onboard a cluster: write a draft site config from what Slurm reports (init), then validate\n"
        "it once its TODO entries are filled in (check).",
        "those of the subcommand; 2 no or an unknown subcommand",
        "slurm-chaos site init --out site.yaml && slurm-chaos site check site.yaml",
    )
    ss = p.add_subparsers(dest="site_cmd", required=True, metavar="{init,check}")
    q = _command(
        ss,
        "init",
        "write a site config from what Slurm reports; unknowns become TODO entries",
        SITE_INIT_HELP,
        "0 written, 2 bad option (--out exists, unknown reservation), 3 Slurm failed or did not answer",
        "slurm-chaos site init --reservation maint_window --out site.yaml\n"
        "  $EDITOR site.yaml && slurm-chaos site check site.yaml",
    )
    q.add_argument("--out", metavar="FILE", help="write here instead of to stdout")
    q.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    q.add_argument(
        "--reservation", metavar="NAME", help="the maintenance reservation (default: the only one there is)"
    )
    q.set_defaults(handler=_site_init)
    q = _command(
        ss,
        "check",
        "validate a site config (TODO entries left included); exit 2 names the key",
        "Validate a site config as every command that reads it does; a TODO entry left or a bad\n"
        "value is named by file and key.",
        "0 complete, 2 invalid (the message names the file and key)",
        "slurm-chaos site check site.yaml",
    )
    q.add_argument("site", metavar="SITE", type=site_config, help=SITE_HELP)
    q.set_defaults(handler=_site_check)


def _print_json(doc: object) -> None:
    print(json.dumps(doc, indent=2))


def _experiments(args: argparse.Namespace) -> int:
    from slurm_chaos.experiment import experiment_json, format_library, library

    experiments = library(tuple(args.experiments_dir))
    if args.format == "json":
        _print_json({"experiments": [experiment_json(e) for e in experiments.values()]})
    elif experiments:
        print(format_library(experiments))
    return 0


def _run_status(args: argparse.Namespace) -> int:
    from slurm_chaos.status import run_status

    text, code = run_status(Path(args.run_dir), live=not args.offline, fmt=args.format)
    print(text)
    return code


def _faults(args: argparse.Namespace) -> int:
    from slurm_chaos.fault_listing import catalogue_json
    from slurm_chaos.faults.catalogue import describe_faults

    if args.format == "json":
        _print_json(catalogue_json())
    else:
        print(describe_faults())
    return 0


def _plugin_install(args: argparse.Namespace) -> int:
    from slurm_chaos.install import install_site

    print("\n".join(install_site(args.site, args.prefix, args.root).lines()))
    return 0


def _plugin_check(args: argparse.Namespace) -> int:
    from slurm_chaos.hostlist import expand_hostlist
    from slurm_chaos.plugin_check import check_image, check_site

    if args.root is not None:
        report = check_image(args.site, args.root)
    else:
        report = check_site(args.site, expand_hostlist(args.nodes) if args.nodes else None)
    print(report.to_json() if args.json else report.table())
    return report.exit_code


def _compare(args: argparse.Namespace) -> int:
    from slurm_chaos.analysis.commands import compare

    dirs = [Path(d) for d in (args.baseline, args.fault) if d is not None]
    print(compare(dirs, args.format), end="")
    return 0


def _report(args: argparse.Namespace) -> int:
    from slurm_chaos.analysis.commands import report_dir

    text, code = report_dir(Path(args.run_dir), args.format, Path(args.output) if args.output else None)
    print(text, end="" if text.endswith("\n") else "\n")
    return code


def _campaign_options(args: argparse.Namespace) -> object:
    from slurm_chaos.campaign.commands import Options

    return Options(
        site=Path(args.site),
        out=Path(args.out) if args.out else None,
        resume=Path(args.resume) if args.resume else None,
        dry_run=args.dry_run,
        time_budget_min=args.time_budget,
        experiments_dirs=tuple(args.experiments_dir),
        quiet=args.quiet,
        calibration=Path(args.calibration) if args.calibration else None,
        plan_format=args.format,
    )


def _launch(args: argparse.Namespace, experiment: str | None, suite: str | None, kind: str) -> int:
    from slurm_chaos.campaign.commands import Options, execute, start
    from slurm_chaos.errors import UsageError
    from slurm_chaos.experiment import load_experiment

    opts = _campaign_options(args)
    assert isinstance(opts, Options)
    if opts.plan_format == "json" and not opts.dry_run:
        raise UsageError(
            "--format json prints the plan: it needs --dry-run (reports: slurm-chaos report --format json)"
        )
    exps = [load_experiment(experiment, opts.experiments_dirs)] if experiment else None
    prepared = start(opts, exps, suite, kind)
    if isinstance(prepared, str):
        print(prepared)
        return 0
    print(f"run directory: {prepared.run_dir}", file=sys.stderr)
    text, code = execute(prepared)
    print(text, end="")
    return code


def _run(args: argparse.Namespace) -> int:
    return _launch(args, args.experiment, None, "run")


def _campaign(args: argparse.Namespace) -> int:
    return _launch(args, None, args.suite, "campaign")


def _calibrate(args: argparse.Namespace) -> int:
    from slurm_chaos.campaign.calibrate import calibration_plan, run_calibration, write_calibration
    from slurm_chaos.campaign.commands import Options, start
    from slurm_chaos.errors import UsageError
    from slurm_chaos.experiment import load_experiment

    if args.dirs:
        from slurm_chaos.analysis.calibrate import calibrate_dirs
        from slurm_chaos.rundir import load_recommended_min_effect

        min_effect = (
            load_recommended_min_effect(Path(args.calibration)) if args.calibration else args.min_effect
        )
        result = calibrate_dirs([Path(d) for d in args.dirs], min_effect)
        if args.out:
            write_calibration(Path(args.out), result)
    else:
        if not args.site:
            raise UsageError("calibrate needs --site (to run A/A jobs) or --dirs (to analyse runs)")
        opts = _campaign_options(args)
        assert isinstance(opts, Options)
        exp = load_experiment(args.experiment, opts.experiments_dirs)
        prepared = start(opts, [exp], None, "calibration")
        if isinstance(prepared, str):
            print(prepared)
            print(calibration_plan(exp, args.runs))
            return 0
        print(f"run directory: {prepared.run_dir}", file=sys.stderr)
        result = run_calibration(prepared, args.runs)
    print(result.summary())
    return 0 if result.ok else 1


def _cleanup(args: argparse.Namespace) -> int:
    from slurm_chaos.campaign.commands import cleanup_site
    from slurm_chaos.faults.journal import any_failed
    from slurm_chaos.hostlist import expand_hostlist

    nodes = expand_hostlist(args.nodes) if args.nodes else None
    done = cleanup_site(Path(args.site), nodes, Path(args.run) if args.run else None)
    for line in done:
        print(f"reverted {line}")
    if not done:
        print("nothing to revert")
    return 1 if any_failed(done) else 0


def _rank_nodes(args: argparse.Namespace) -> int:
    from slurm_chaos.errors import UsageError
    from slurm_chaos.placement import (
        NodeSetting,
        apply_settings,
        format_ranking,
        probe_dirs,
        proposals,
        rank_nodes,
        ranking_json,
    )
    from slurm_chaos.runner import SubprocessRunner
    from slurm_chaos.sandbox.layout import site_placeholders
    from slurm_chaos.site import load_site
    from slurm_chaos.slurm.backend import make_scheduler

    dirs = probe_dirs(Path(p) for p in args.run_dirs)
    if not dirs:
        raise UsageError(f"no probe output (rank-0.h5) under {', '.join(args.run_dirs)}")
    ranking = rank_nodes(dirs, threshold=args.threshold)
    if args.format == "text":
        print(format_ranking(ranking))
    applied: list[NodeSetting] | None = None
    if args.apply:
        if not args.site:
            raise UsageError("--apply needs --site")
        site = load_site(args.site, site_placeholders)
        scheduler = make_scheduler(site.slurm_env(), SubprocessRunner())
        applied = proposals(ranking, scheduler.nodes([r.node for r in ranking]))
        apply_settings(scheduler, applied)
        if args.format == "text":
            for s in applied:
                print("applied: " + s.describe())
    if args.format == "json":
        _print_json(ranking_json(ranking, applied))
    return 0


RUN_EXITS = (
    "0 every verdict PASSED (or the plan printed), 1 a verdict other than PASSED, 2 bad input "
    "(site config, option, experiment), 3 Slurm failed (unreachable, a job not submitted), "
    "130 interrupted (Ctrl-C or --time-budget: continue with --resume)"
)


def _add_campaign(sub: Subparsers) -> None:
    def common(p: argparse.ArgumentParser, site_required: bool = True) -> None:
        p.add_argument("--site", required=site_required, type=site_config, help=SITE_HELP)
        p.add_argument("--out", help="run directory (default: runs/<run id>)")
        p.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run in RUN_DIR")
        p.add_argument("--dry-run", action="store_true", help="render and print the plan; submit nothing")
        p.add_argument(
            "--time-budget", type=float, metavar="MIN", help="stop starting experiments after MIN minutes"
        )
        p.add_argument(
            "--experiments-dir", action="append", default=[], type=Path, help="extra experiment directory"
        )
        p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
        p.add_argument(
            "--calibration",
            metavar="FILE",
            help="calibration.json of 'slurm-chaos calibrate': raise the practical threshold of "
            "every comparison to its recommended min_effect (this cluster's run-to-run noise)",
        )
        p.set_defaults(format="text")

    p = _command(
        sub,
        "run",
        "run one experiment: baseline, fault job, watch, roll back, report",
        "Run one experiment: an unfaulted baseline job, then the fault job, watched for detection and\n"
        "remediation, rolled back, and judged; the report lands in the run directory.",
        RUN_EXITS,
        "slurm-chaos run --site site.yaml slow-rank --out runs/slow-rank",
    )
    p.add_argument("experiment", metavar="EXPERIMENT", help="experiment name or YAML file")
    common(p)
    p.set_defaults(handler=_run)

    p = _command(
        sub,
        "campaign",
        "run a suite of experiments (e.g. the maintenance suite) with one report",
        "Run a suite of experiments (one baseline per job shape, then each fault job) and write one\n"
        "report for all of them; --dry-run prints the plan and submits nothing.",
        RUN_EXITS,
        "slurm-chaos campaign --site site.yaml --suite maintenance --dry-run --format json",
    )
    p.add_argument("--suite", default="maintenance", help="suite name or YAML file (default: maintenance)")
    common(p)
    p.add_argument(
        "--format", default="text", choices=["text", "json"], help=f"with --dry-run, the plan: {FORMAT_HELP}"
    )
    p.set_defaults(handler=_campaign)

    p = _command(
        sub,
        "calibrate",
        "A/A calibration: run the unfaulted control job N times, report the false-positive rates",
        "Run the unfaulted control job N times (or analyse probe runs already made, --dirs). Each run of\n"
        "a placebo experiment (control-aa) follows a placebo schedule of its own and is judged on its own\n"
        "on/off blocks: the in-job test's false positives and MDE. Every pair of runs is compared too:\n"
        "the between-run false-positive rate and the min_effect this cluster's noise needs.",
        "0 the false-positive rate is within bounds, 1 it is not (calibration.json is written either "
        "way), 2 bad input, 3 Slurm failed, 130 interrupted",
        "slurm-chaos calibrate --site site.yaml --runs 12 --out runs/aa",
    )
    p.add_argument("--runs", type=int, default=12, help="A/A runs to submit (default 12: 66 pairs)")
    p.add_argument(
        "--experiment", default="control-aa", help="the unfaulted experiment to repeat (default control-aa)"
    )
    p.add_argument("--dirs", nargs="+", metavar="DIR", help="analyse these probe run directories instead")
    p.add_argument(
        "--min-effect",
        type=float,
        default=0.05,
        help="with --dirs: practical threshold (default 0.05, the campaigns' max_regression; "
        "--calibration sets it from an earlier calibration instead)",
    )
    common(p, site_required=False)
    p.set_defaults(handler=_calibrate)

    p = _command(
        sub,
        "rank-nodes",
        "rank nodes by the probe's measured speed; propose Slurm weights/features",
        "Rank nodes by the compute speed the probe measured on them and propose Slurm weights and the\n"
        "'fast' feature; --apply sets them with scontrol.",
        "0 ranked (and applied), 2 bad input (no probe output, --apply without --site), "
        "3 Slurm refused a setting",
        "slurm-chaos rank-nodes runs/maintenance-* --format json",
    )
    p.add_argument("run_dirs", nargs="+", metavar="DIR", help="probe output or run directories")
    p.add_argument(
        "--threshold", type=float, default=0.9, help="speed below which a node is slow (default 0.9)"
    )
    p.add_argument("--site", type=site_config, help=f"{SITE_HELP} (needed with --apply)")
    p.add_argument("--apply", action="store_true", help="set the proposed weights and features with scontrol")
    _add_format(p)
    p.set_defaults(handler=_rank_nodes)

    p = _command(
        sub,
        "cleanup",
        "revert leftover faults (a missed epilog, a killed campaign)",
        "Revert every fault the node journals still hold (a missed epilog, a killed campaign); with\n"
        "--run, also cancel that run's jobs and undo its drains and lost nodes.",
        "0 reverted (or nothing to revert), 1 a revert FAILED (named), 2 bad input, 3 Slurm failed",
        "slurm-chaos cleanup --site site.yaml --nodes 'node[1-2]' --run runs/maintenance-20250101",
    )
    p.add_argument("--site", required=True, type=site_config, help=SITE_HELP)
    p.add_argument("--nodes", help="only these nodes (a Slurm hostlist, e.g. node[1-2])")
    p.add_argument(
        "--run", metavar="RUN_DIR", help="also undo the controller faults (drains, lost nodes) of a run"
    )
    p.set_defaults(handler=_cleanup)

    p = _command(
        sub,
        "faults",
        "list every fault with its keys",
        "List every fault of the catalogue: what it does, where it acts, and its keys with their types,\n"
        "defaults and bounds (what a --chaos=SPEC may say).",
        "0 listed, 2 bad option",
        "slurm-chaos faults --format json",
    )
    _add_format(p)
    p.set_defaults(handler=_faults)

    p = _command(
        sub,
        "plugin",
        "the SPANK plugin and node hooks",
        "The SPANK plugin that injects faults into jobs, and the node hooks: install them, or audit an\n"
        "installation (on this machine and the nodes, or in a node image with --root DIR).",
        "those of the subcommand; 2 no or an unknown subcommand",
        "sudo slurm-chaos plugin install --site site.yaml && slurm-chaos plugin check --site site.yaml",
    )
    ps = p.add_subparsers(dest="plugin_cmd", required=True, metavar="{install,check}")
    q = _command(
        ps,
        "install",
        "write the policy and job_submit.lua, build the plugin, write its plugstack.conf line, "
        "install the node hooks",
        "Write the fault policy and job_submit.lua, build and install the SPANK plugin, write its\n"
        "plugstack.conf line, and install the node hooks and the health check.\n"
        "With --root DIR, install all of it into a node image (a Warewulf container, a chroot) as if\n"
        "DIR were /: each file lands at DIR + its path, and the paths written into the files are the\n"
        "booted node's. Nothing outside DIR is written and no daemon is told; the plugin is built\n"
        "against this machine's Slurm headers (the image must run the same Slurm release). A symlink\n"
        "in DIR is followed as the node would follow it, from DIR; one that leaves DIR refuses the\n"
        "install before anything is written.",
        "0 installed, 1 the build or an install step failed, 2 bad input (site config, option, a --root "
        "that is not a directory, a symlink in it that leaves it)",
        "sudo slurm-chaos plugin install --site site.yaml --prefix /usr/local\n"
        "  sudo slurm-chaos plugin install --site site.yaml --root /srv/warewulf/chroots/rocky9/rootfs",
    )
    q.add_argument("--site", required=True, type=site_config, help=SITE_HELP)
    q.add_argument("--prefix", default="/usr/local", help="install prefix (default: /usr/local)")
    q.add_argument(
        "--root",
        metavar="DIR",
        help="install into this node image's root directory instead of this machine (an existing directory)",
    )
    q.set_defaults(handler=_plugin_install)
    q = _command(
        ps,
        "check",
        "audit an installation: policy, plugstack.conf, plugin, hooks, slurm.conf settings; "
        "exit 1 names each item that is UNSAFE or MISSING",
        "Audit an installation on every node: policy, plugstack.conf, plugin, hooks, slurm.conf\n"
        "settings; each item that is UNSAFE or MISSING is named with its path and the fix.\n"
        "With --root DIR, audit a node image instead: the node's checks on the files under DIR (symlinks\n"
        "resolved inside it), with the Prolog, Epilog and PlugStackConfig of the image's slurm.conf;\n"
        "no Slurm command runs.",
        "0 every item OK, 1 an item is UNSAFE or MISSING, 2 bad input (site config, option, a --root "
        "that is not a directory)",
        "slurm-chaos plugin check --site site.yaml --nodes 'node[1-4]' --json\n"
        "  slurm-chaos plugin check --site site.yaml --root /srv/warewulf/chroots/rocky9/rootfs",
    )
    q.add_argument("--site", required=True, type=site_config, help=SITE_HELP)
    where = q.add_mutually_exclusive_group()
    where.add_argument("--nodes", help="only these nodes (a Slurm hostlist, e.g. node[1-2]; default: all)")
    where.add_argument("--root", metavar="DIR", help="audit this node image's root directory, not the nodes")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.set_defaults(handler=_plugin_check)

    p = _command(
        sub,
        "compare",
        "compare a fault run's probe files with a baseline's, or a switchback run with itself",
        "Compare the step times of a fault run's probe files with a baseline's: regression, its\n"
        "confidence interval, p-value and stragglers. Given only FAULT_DIR, a switchback run (one\n"
        "with a fault schedule) is judged on its own on against its off blocks: regression, CI,\n"
        "p-value, minimum detectable effect and the ranks that slow down when the fault is on.",
        "0 compared, 2 bad input (missing or inconsistent probe files, no fault schedule)",
        "slurm-chaos compare runs/r1/experiments/slow-rank/baseline runs/r1/experiments/slow-rank/fault\n"
        "  slurm-chaos compare runs/r1/experiments/slow-rank-switchback/fault --format json",
    )
    p.add_argument("baseline", metavar="BASELINE_DIR", nargs="?", help="omit for a switchback run")
    p.add_argument("fault", metavar="FAULT_DIR")
    p.add_argument("--format", default="text", choices=["text", "json"])
    p.set_defaults(handler=_compare)

    p = _command(
        sub,
        "report",
        "verdicts of a run directory: table, HTML, JSON or JUnit XML",
        "Judge every experiment of a run directory and print its verdicts; report.html, report.json\n"
        "and report.xml (JUnit) are written into the run directory.",
        "0 every verdict PASSED, 1 a verdict other than PASSED, 2 bad input (no run directory, bad "
        "probe data)",
        "slurm-chaos report runs/maintenance-20250101 --format junit --output results.xml",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--format", default="table", choices=["table", "html", "json", "junit"])
    p.add_argument("--output", help="also write the chosen format to this file")
    p.set_defaults(handler=_report)


def _history_site(args: argparse.Namespace) -> object:
    from slurm_chaos.sandbox.layout import site_placeholders
    from slurm_chaos.site import load_site

    return None if args.site is None else load_site(args.site, site_placeholders)


def _history(args: argparse.Namespace) -> int:
    from slurm_chaos.errors import UsageError
    from slurm_chaos.history.commands import compare, show
    from slurm_chaos.site import Site

    site = _history_site(args)
    if not isinstance(site, Site):
        raise UsageError("history: --site is required (or: slurm-chaos history import RUN_DIR ...)")
    store = Path(args.store) if args.store else None
    if args.compare:
        text, code = compare(site, store, args.last, args.window, args.format)
        print(text, end="")
        return code
    print(show(site, store, args.format), end="")
    return 0


def _history_import(args: argparse.Namespace) -> int:
    from slurm_chaos.history.commands import import_runs
    from slurm_chaos.site import Site

    site = _history_site(args)
    assert site is None or isinstance(site, Site)
    print(
        import_runs([Path(d) for d in args.run_dirs], site, Path(args.store) if args.store else None), end=""
    )
    return 0


HISTORY_HELP = (
    "the history file (default: the site's history.path, else runs/history.sqlite, beside the run "
    "directories)"
)


def _add_history(sub: Subparsers) -> None:
    p = _command(
        sub,
        "history",
        "the site's history of campaigns, and regressions of its monitoring between windows",
        "Every campaign adds its results to the site's history at its end. Without --compare: per\n"
        "experiment, one row per window (verdict, time to detect per detector, time to remediate, lost\n"
        "steps, effect and MDE). With --compare: this window judged against the last (or the last N):\n"
        "a verdict worse, a detector that stopped firing or is now silenced, a time to detect or\n"
        "remediate past its deadline or beyond the earlier windows' spread, more lost steps, a larger\n"
        "MDE; each a finding with the reason and both windows, the rules printed with them.\n"
        "'history import RUN_DIR ...' adds existing run directories.",
        "0 shown, or compared and no regression; 1 --compare found a regression; 2 bad input (site "
        "config, option, no history, a run directory that does not analyse)",
        "slurm-chaos history --site site.yaml --compare --last 3\n"
        "  slurm-chaos history import runs/maintenance-2025* --site site.yaml",
    )
    p.add_argument("--site", type=site_config, help=SITE_HELP)
    p.add_argument("--store", metavar="FILE", help=HISTORY_HELP)
    p.add_argument(
        "--format", default="text", choices=["text", "json", "html"], help="html: without --compare"
    )
    p.add_argument("--compare", action="store_true", help="judge this window against earlier ones")
    p.add_argument(
        "--last", type=int, default=1, metavar="N", help="compare with the last N windows (default: 1)"
    )
    p.add_argument("--window", metavar="RUN_ID", help="the window to judge (default: the latest)")
    p.set_defaults(handler=_history)
    hs = p.add_subparsers(dest="history_cmd", required=False, metavar="{import}")
    q = _command(
        hs,
        "import",
        "add existing run directories to the history",
        "Analyse each run directory as 'slurm-chaos report' does and add its results to the history\n"
        "(the same run id again replaces its window). Run directories of earlier releases import too.",
        "0 added, 2 bad input (a run directory that does not analyse: nothing is added; a run of\n"
        "another cluster than --site's)",
        "slurm-chaos history import runs/2025-06-01-campaign runs/2025-07-01-campaign --site site.yaml",
    )
    q.add_argument("run_dirs", metavar="RUN_DIR", nargs="+")
    # SUPPRESS: given before 'import', the history's own option stands.
    q.add_argument("--site", type=site_config, default=argparse.SUPPRESS, help=SITE_HELP)
    q.add_argument("--store", metavar="FILE", default=argparse.SUPPRESS, help=HISTORY_HELP)
    q.set_defaults(handler=_history_import)


def _add_common(sub: Subparsers) -> None:
    p = _command(
        sub,
        "render",
        "write an experiment's sbatch scripts without submitting (dry run)",
        "Write the sbatch scripts an experiment would submit (baseline and fault job) into a directory,\n"
        "without submitting anything.",
        "0 written, 2 bad input (site config, experiment, a limit the site sets)",
        "slurm-chaos render --site site.yaml --experiment slow-rank --out /tmp/scripts",
    )
    p.add_argument("--site", required=True, type=site_config, help=SITE_HELP)
    p.add_argument("--experiment", required=True, help="experiment name or YAML file")
    p.add_argument("--out", required=True, help="directory for the scripts")
    p.add_argument("--run-id", help="run id written into the scripts (default: dry-run)")
    p.add_argument(
        "--experiments-dir", action="append", default=[], type=Path, help="extra experiment directory"
    )
    p.set_defaults(handler=_render)

    p = _command(
        sub,
        "experiments",
        "list the experiment library",
        "List the experiment library (and --experiments-dir): each experiment's strategy and fault\n"
        "SPEC; --format json adds its description, nodes and expectations.",
        "0 listed, 2 an invalid experiment file (named)",
        "slurm-chaos experiments --experiments-dir ./my-experiments --format json",
    )
    p.add_argument(
        "--experiments-dir", action="append", default=[], type=Path, help="extra experiment directory"
    )
    _add_format(p)
    p.set_defaults(handler=_experiments)

    p = _command(
        sub,
        "status",
        "what a run directory holds and the state of its jobs",
        "Show what a run directory holds (run, site, versions, experiments complete) and the state of\n"
        "its jobs, asking Slurm for those not yet ended unless --offline.",
        "0 the run finished uninterrupted, 1 it is unfinished or was interrupted, 2 no run directory",
        "slurm-chaos status runs/maintenance-20250101 --offline --format json",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--offline", action="store_true", help="do not ask Slurm for the jobs' current states")
    _add_format(p)
    p.set_defaults(handler=_run_status)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurm-chaos",
        description="Chaos engineering for GPU clusters run by Slurm: inject real faults into training jobs, "
        "measure the regression, and check that monitoring and the scheduler reacted.",
        epilog="exit codes: 0 success (every verdict PASSED), 1 findings (a verdict other than PASSED, an\n"
        "audit that found problems), 2 bad input, 3 the tool failed (Slurm unreachable, a job not\n"
        "submitted), 130 interrupted\n\n"
        "example:\n  slurm-chaos campaign --site site.yaml --suite maintenance --dry-run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_sandbox(sub)
    _add_site(sub)
    _add_common(sub)
    _add_campaign(sub)
    _add_history(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="slurm-chaos: %(levelname)s: %(message)s", stream=sys.stderr)
    try:
        handler: Handler = args.handler
        return handler(args)
    except ChaosError as exc:
        print(f"slurm-chaos: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("slurm-chaos: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: not an error of ours.
        sys.stderr.close()
        return 0
