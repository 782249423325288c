"""`slurm-chaos-healthcheck`: the node health check Slurm's HealthCheckProgram runs, in LBNL NHC's manner.

On a failed check it drains the node with a reason starting ``slurm-chaos-health:``; it resumes only
nodes drained with that prefix, once every check passes again, and never touches a node someone
else drained. Exit codes follow Nagios: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN. Which signals are
checked, and the thresholds, come from a small TOML file (`install_healthcheck` writes one per
site) and the command line. Each run also leaves its results in ``<state_dir>/<node>.json`` for
the Prometheus exporter.

What a job reports about itself (its heartbeats, its tasks' CPU binding) any user can forge for
their own job, so it drains the node only for a job Slurm's facts vouch for (`standing`): root's
own (a heartbeat directory root owns, or a job slurmctld says is uid 0's), or one the site's
root-owned policy allows by the user, account, partition and reservation slurmctld reports. Any
other job's findings are a WARNING that says why (the exporter's metrics and alerts still show
them), never a drain. Drains on an allowed non-root job's findings are rate-limited per node
(``thresholds.report_drain_interval_s``, recorded in the root-owned ``<state_dir>/<node>.drained``).
The node's own measurements (GPUs, root's write to the checkpoint storage) drain as before.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import stat
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_chaos.errors import ChaosError, ConfigError, SlurmError
from slurm_chaos.faults.authz import record_facts
from slurm_chaos.faults.policy import POLICY_NAME, PolicyError, load_policy, refusal
from slurm_chaos.observe import checks
from slurm_chaos.observe.checks import CRITICAL, OK, SIGNALS, UNKNOWN, WARNING, Result, Thresholds
from slurm_chaos.probe.heartbeat import heartbeat_dir, read_heartbeats, this_node, write_atomic
from slurm_chaos.runner import Runner, SubprocessRunner

if TYPE_CHECKING:
    from slurm_chaos.faults.install_root import InstallRoot
    from slurm_chaos.site import Site
    from slurm_chaos.slurm.protocol import Scheduler

REASON_PREFIX = "slurm-chaos-health:"
CONFIG_NAME = "slurm-chaos-health.toml"
HOOK_NAME = "50-slurm-chaos"
#: Before the fault hooks (50-slurm-chaos): the job's heartbeat directory.
HEARTBEAT_HOOK_NAME = "40-slurm-chaos-heartbeat"
HEARTBEAT_HOOK_TIMEOUT_S = 20
SCONTROL_TIMEOUT_S = 10
REASON_MAX = 200
#: Where the policy is when neither the config nor SLURM_CONF says (as the fault hooks).
DEFAULT_SLURM_ETC = Path("/etc/slurm")
#: The record of this check's last drain on a job's findings, per node, in the state directory
#: (not ``*.json``: the exporter reads those as node states).
DRAINED_SUFFIX = ".drained"
MAX_RECORD_BYTES = 4096


@dataclass(frozen=True)
class Options:
    """Everything one run needs: what to check, where the inputs are, and the thresholds."""

    signals: frozenset[str] = frozenset(SIGNALS)
    node: str = ""
    heartbeat_dir: Path | None = None
    state_dir: Path | None = None
    checkpoint_path: str | None = None
    # -1: look for GPUs; 0: a CPU node (GPU checks are skipped); N: the node must show N GPUs.
    gpus_per_node: int = -1
    slurm_conf: str | None = None
    #: The site's root-owned policy (default: beside slurm_conf, else /etc/slurm).
    policy: Path | None = None
    drain: bool = True
    thresholds: Thresholds = field(default_factory=Thresholds)

    @property
    def heartbeats(self) -> Path:
        return heartbeat_dir(self.heartbeat_dir)

    @property
    def states(self) -> Path:
        return self.state_dir or self.heartbeats.parent / "health"

    @property
    def policy_file(self) -> Path:
        if self.policy is not None:
            return self.policy
        conf = self.slurm_conf or ""
        return (Path(conf).parent if conf.startswith("/") else DEFAULT_SLURM_ETC) / POLICY_NAME


# ---------------------------------------------------------------- configuration

_TOP_KEYS = {
    "signals": list,
    "heartbeat_dir": str,
    "state_dir": str,
    "checkpoint_path": str,
    "gpus_per_node": int,
    "slurm_conf": str,
    "policy": str,
    "thresholds": dict,
}
_THRESHOLD_TYPES = {f.name: f.type for f in fields(Thresholds)}


def parse_signals(values: Sequence[str], where: str, key: str) -> frozenset[str]:
    unknown = sorted(set(values) - set(SIGNALS))
    if unknown:
        raise ConfigError(where, key, f"unknown signal(s) {', '.join(unknown)} (known: {', '.join(SIGNALS)})")
    return frozenset(values)


def _thresholds(data: Mapping[str, Any], where: str) -> Thresholds:
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _THRESHOLD_TYPES:
            raise ConfigError(
                where, f"thresholds.{key}", f"unknown key (allowed: {', '.join(_THRESHOLD_TYPES)})"
            )
        kind = _THRESHOLD_TYPES[key]
        if key == "xid_ignore":
            if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
                raise ConfigError(
                    where, f"thresholds.{key}", f"expected a list of XID numbers, got {value!r}"
                )
            values[key] = frozenset(value)
        elif kind == "bool":
            if not isinstance(value, bool):
                raise ConfigError(where, f"thresholds.{key}", f"expected true or false, got {value!r}")
            values[key] = value
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(where, f"thresholds.{key}", f"expected a number, got {value!r}")
        else:
            values[key] = int(value) if kind == "int" else float(value)
    return Thresholds(**values)


def load_config(path: Path) -> Options:
    """Options from a TOML config file; errors name the file and the key."""
    where = str(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(where, "", f"cannot read: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(where, "", f"malformed TOML: {exc}") from exc
    for key, value in data.items():
        if key not in _TOP_KEYS:
            raise ConfigError(where, key, f"unknown key (allowed: {', '.join(_TOP_KEYS)})")
        if not isinstance(value, _TOP_KEYS[key]) or isinstance(value, bool):
            raise ConfigError(where, key, f"expected {_TOP_KEYS[key].__name__}, got {value!r}")
    opts = Options(
        signals=parse_signals(data.get("signals", list(SIGNALS)), where, "signals"),
        heartbeat_dir=Path(data["heartbeat_dir"]) if "heartbeat_dir" in data else None,
        state_dir=Path(data["state_dir"]) if "state_dir" in data else None,
        checkpoint_path=data.get("checkpoint_path"),
        gpus_per_node=data.get("gpus_per_node", -1),
        slurm_conf=data.get("slurm_conf"),
        policy=Path(data["policy"]) if "policy" in data else None,
        thresholds=_thresholds(data.get("thresholds", {}), where),
    )
    return opts


def render_config(opts: Options, comment: str = "") -> str:
    """The TOML text `load_config` reads back as `opts` (node and drain are per run, not stored)."""
    lines = [f"# {line}" for line in comment.splitlines()]
    lines.append("signals = [" + ", ".join(json.dumps(s) for s in SIGNALS if s in opts.signals) + "]")
    for key in ("heartbeat_dir", "state_dir", "checkpoint_path", "slurm_conf", "policy"):
        value = getattr(opts, key)
        if value is not None:
            lines.append(f"{key} = {json.dumps(str(value))}")
    lines += [f"gpus_per_node = {opts.gpus_per_node}", "", "[thresholds]"]
    for key, value in asdict(opts.thresholds).items():
        if isinstance(value, frozenset):
            lines.append(f"{key} = [{', '.join(str(v) for v in sorted(value))}]")
        elif isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        else:
            lines.append(f"{key} = {value!r}")
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slurm-chaos-healthcheck",
        description="Node health check for Slurm's HealthCheckProgram: drains the node on failure "
        f"(reason '{REASON_PREFIX} ...') and resumes nodes it drained once healthy.",
    )
    p.add_argument("--config", type=Path, help="TOML file with signals, paths and thresholds")
    p.add_argument("--signals", help=f"comma-separated subset of {','.join(SIGNALS)} (overrides the config)")
    p.add_argument("--node", help="Slurm node name (default: $SLURMD_NODENAME, else the hostname)")
    p.add_argument("--heartbeat-dir", type=Path, help="probe heartbeat directory")
    p.add_argument("--state-dir", type=Path, help="where results are left for the exporter")
    p.add_argument("--checkpoint-path", help="checkpoint directory to check for space and writability")
    p.add_argument("--gpus", type=int, help="GPUs this node must show (0: CPU node, -1: detect)")
    p.add_argument("--policy", type=Path, help="the site's policy: whose jobs' own reports may drain")
    p.add_argument("--no-drain", action="store_true", help="only report; never drain or resume")
    return p


def options_from_args(argv: Sequence[str] | None = None) -> Options:
    args = _parser().parse_args(argv)
    opts = load_config(args.config) if args.config else Options()
    if args.signals is not None:
        names = [s.strip() for s in args.signals.split(",") if s.strip()]
        opts = replace(opts, signals=parse_signals(names, "command line", "--signals"))
    overrides: dict[str, Any] = {
        "heartbeat_dir": args.heartbeat_dir,
        "state_dir": args.state_dir,
        "checkpoint_path": args.checkpoint_path,
        "gpus_per_node": args.gpus,
        "policy": args.policy,
    }
    opts = replace(opts, **{k: v for k, v in overrides.items() if v is not None})
    return replace(opts, node=args.node or this_node(), drain=not args.no_drain)


# ---------------------------------------------------------------- checks


@dataclass(frozen=True)
class Inputs:
    """Where the node's facts are read from (fake trees in tests)."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    kmsg: Path = Path("/dev/kmsg")


def _gpu_results(opts: Options, facts: checks.GpuFacts, kmsg: Path) -> list[Result]:
    out = []
    if "gpu_xid" in opts.signals:
        if facts.expected != 0:
            facts = replace(facts, xids=tuple(checks.parse_kmsg(checks.read_kmsg(kmsg))))
        # Kernel log timestamps count from boot on the monotonic clock.
        out.append(checks.check_gpu_xid(facts, opts.thresholds, time.monotonic()))
    if "gpu_ecc" in opts.signals:
        out.append(checks.check_gpu_ecc(facts))
    if "gpu_throttle" in opts.signals:
        out.append(checks.check_gpu_throttle(facts, opts.thresholds))
    return out


def run_checks(opts: Options, inputs: Inputs = Inputs(), now: float | None = None) -> list[Result]:
    """Every enabled check, in a fixed order (GPU first: those are the causes behind slow steps)."""
    now = time.time() if now is None else now
    th = opts.thresholds
    beats = read_heartbeats(opts.heartbeats) if opts.signals & {"numa", "checkpoint", "straggler"} else []
    gpu_checks = opts.signals & {"gpu_xid", "gpu_ecc", "gpu_throttle"}
    # The NUMA check needs each GPU's NUMA node too.
    facts = checks.read_gpus(opts.gpus_per_node, inputs.sys) if gpu_checks or "numa" in opts.signals else None
    results = _gpu_results(opts, facts, inputs.kmsg) if facts is not None and gpu_checks else []
    if "numa" in opts.signals:
        gpu_numa = {g.index: g.numa_node for g in facts.gpus} if facts is not None else {}
        tasks = checks.scan_tasks(opts.node, inputs.proc)
        results.append(
            checks.check_numa(opts.node, tasks, checks.numa_layout(inputs.sys), gpu_numa, beats, th, now)
        )
    if "checkpoint" in opts.signals:
        results.append(checks.check_checkpoint(opts.node, opts.checkpoint_path, beats, th, now))
    if "straggler" in opts.signals:
        results.append(checks.check_straggler(opts.node, beats, th, now))
    return results


# ---------------------------------------------------------------- whose reports may drain


@dataclass(frozen=True)
class Standing:
    """Whether a job's own reports may drain this node, as Slurm's facts and the policy say."""

    job_id: str
    #: Why they may not (None: they may).
    refused: str | None = None
    #: Root's own job: root may drain a node anyway, so no rate limit either.
    root: bool = False


def heartbeat_owner(opts: Options, job_id: str) -> int | None:
    """The owner of the job's heartbeat directory on this node (the prolog gives it to the job's
    user; no user can make one root's), or None where there is none."""
    try:
        st = (opts.heartbeats / opts.node / job_id).lstat()
    except (OSError, ValueError):
        return None
    return st.st_uid if stat.S_ISDIR(st.st_mode) else None


def standing(job_id: str, node: str, owner: int | None, scheduler: Scheduler, policy_path: Path) -> Standing:
    """May job `job_id`'s findings drain `node`? Decided from facts Slurm sets, never from the job's
    files: its heartbeat directory's owner (`owner`: root's, or the job's user's, as the prolog made
    it), the job's uid, user, account, partition, reservation and nodes from slurmctld, and the
    site's root-owned policy (missing or unsafe: no one's findings drain)."""
    if owner == 0:
        return Standing(job_id, root=True)
    try:
        record = scheduler.job_record(job_id)
    except SlurmError as exc:
        return Standing(job_id, f"slurmctld does not vouch for it ({exc})")
    if record.user_id is None:
        return Standing(job_id, "slurmctld does not say whose job it is")
    if owner is not None and owner != record.user_id:
        return Standing(
            job_id, f"its heartbeats are uid {owner}'s, slurmctld says the job is uid {record.user_id}'s"
        )
    if node not in record.nodes:
        return Standing(job_id, f"slurmctld does not place it on {node}")
    if record.user_id == 0:
        return Standing(job_id, root=True)
    try:
        policy = load_policy(policy_path)
    except PolicyError as exc:
        return Standing(job_id, f"no policy allows it ({exc})")
    why = refusal(policy, record_facts(record, record.user_id))
    return Standing(job_id, f"the policy does not allow it: {why}" if why else None)


def reporting_jobs(results: Sequence[Result]) -> list[str]:
    """The jobs whose own reports some CRITICAL result rests on, in order."""
    jobs = (f.job_id for r in results if r.status == CRITICAL for f in r.findings)
    return list(dict.fromkeys(j for j in jobs if j is not None))


def standings(opts: Options, results: Sequence[Result], scheduler: Scheduler) -> dict[str, Standing]:
    """The standing of every job a CRITICAL result rests on (slurmctld asked once per job)."""
    return {
        job: standing(job, opts.node, heartbeat_owner(opts, job), scheduler, opts.policy_file)
        for job in reporting_jobs(results)
    }


def gate(result: Result, stand: Mapping[str, Standing]) -> Result:
    """`result` as far as it may drain: the findings of jobs whose reports may not drain are held
    back; a result left with none is a WARNING (an alert, no drain) that says why."""
    if result.status != CRITICAL:
        return result

    def held(f: checks.Finding) -> bool:
        return f.job_id is not None and (f.job_id not in stand or stand[f.job_id].refused is not None)

    kept = tuple(f for f in result.findings if not held(f))
    if len(kept) == len(result.findings):
        return result
    if kept:
        return checks.reported(result.check, kept)
    jobs = dict.fromkeys(f.job_id for f in result.findings if f.job_id is not None)
    why = "; ".join(f"job {j}: {stand[j].refused if j in stand else 'not vouched for'}" for j in jobs)
    return Result(result.check, WARNING, f"{result.message} [alert only, no drain: {why}]", result.findings)


def _limited(result: Result, stand: Mapping[str, Standing]) -> bool:
    """Whether a CRITICAL result rests only on findings of non-root jobs (whose drains are limited)."""
    return bool(result.findings) and all(
        f.job_id is not None and not (f.job_id in stand and stand[f.job_id].root) for f in result.findings
    )


# ---------------------------------------------------------------- the drain rate limit


def drained_record(opts: Options) -> Path:
    return opts.states / f"{opts.node}{DRAINED_SUFFIX}"


def last_drained(path: Path) -> float | str:
    """When the check last drained this node on a job's findings (0.0: never), or why the record
    cannot be trusted (it must be a small regular file of ours that no one else may write)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0.0
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return f"{path}: not a regular file of uid {os.geteuid()} writable only by it"
        text = os.read(fd, MAX_RECORD_BYTES).decode(errors="replace")
    finally:
        os.close(fd)
    try:
        when = float(json.loads(text)["time"])
    except (ValueError, KeyError, TypeError):
        return f"{path}: malformed"
    return when if when == when else f"{path}: malformed"


def rate_limited(opts: Options, now: float) -> str | None:
    """Why a drain on a job's findings must wait, or None: at most one per node per
    `report_drain_interval_s`; a record we cannot trust allows none (fail closed)."""
    path = drained_record(opts)
    last = last_drained(path)
    if isinstance(last, str):
        return f"the drain record cannot be trusted ({last})"
    interval = opts.thresholds.report_drain_interval_s
    if now - last < interval:
        return f"a job's findings drained {opts.node} {now - last:.0f} s ago (at most one per {interval:g} s)"
    return None


def record_drain(opts: Options, reason: str, now: float) -> None:
    write_atomic(drained_record(opts), json.dumps({"time": now, "reason": reason}), mode=0o644)


# ---------------------------------------------------------------- remediation


@dataclass(frozen=True)
class Action:
    """What the check did to the node in Slurm, and whether it could ask Slurm at all."""

    did: str
    reachable: bool = True


def _reason(result: Result) -> str:
    text = f"{REASON_PREFIX} {result.check}: {result.message}"
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def _ours(reason: str) -> bool:
    return reason.startswith(REASON_PREFIX)


def health_scheduler(runner: Runner, opts: Options) -> Scheduler:
    """The Slurm CLI the check asks through `runner`: slurmd's environment plus the site's
    SLURM_CONF, each command bounded by SCONTROL_TIMEOUT_S."""
    from slurm_chaos.slurm.cli_backend import SlurmCLI

    env = {"SLURM_CONF": opts.slurm_conf} if opts.slurm_conf else {}
    return SlurmCLI(env, runner, timeout=SCONTROL_TIMEOUT_S)


def remediate(
    scheduler: Scheduler,
    opts: Options,
    results: Sequence[Result],
    stand: Mapping[str, Standing] | None = None,
    now: float | None = None,
) -> Action:
    """Drain on a CRITICAL result, resume a node we drained once nothing is CRITICAL (NHC's rules).

    `results` are gated already (`gate`); a drain that rests only on findings of non-root jobs
    (`stand` says whose) waits for the rate limit, and is recorded."""
    now = time.time() if now is None else now
    stand = stand or {}
    try:
        info = scheduler.node(opts.node)
    except SlurmError as exc:
        return Action(f"cannot read node {opts.node} from Slurm: {exc}", False)
    failed = [r for r in results if r.status == CRITICAL]
    if failed:
        free = [r for r in failed if not _limited(r, stand)]
        reason = _reason((free or failed)[0])
        if info.drain and not _ours(info.reason):
            return Action(f"left alone: already drained by someone else ({info.reason})")
        if info.drain and info.reason.split(":")[:2] == reason.split(":")[:2]:
            return Action("already drained by this check")
        wait = None if free else rate_limited(opts, now)
        if wait is not None:
            return Action(f"not drained: {wait}")
        try:
            scheduler.drain(opts.node, reason)
        except SlurmError as exc:
            return Action(f"drain failed: {exc}", False)
        if not free:
            try:
                record_drain(opts, reason, now)
            except OSError as exc:
                print(f"slurm-chaos-healthcheck: cannot record the drain: {exc}", file=sys.stderr)
        return Action(f"drained: {reason}")
    if info.drain and _ours(info.reason):
        try:
            scheduler.resume(opts.node)
        except SlurmError as exc:
            return Action(f"resume failed: {exc}", False)
        return Action("resumed")
    return Action("none")


def exit_code(results: Sequence[Result], action: Action | None) -> int:
    worst = max((r.status for r in results if r.status != UNKNOWN), default=OK)
    if worst == CRITICAL:
        return CRITICAL
    if any(r.status == UNKNOWN for r in results) or (action is not None and not action.reachable):
        return UNKNOWN
    return worst


def write_state(opts: Options, results: Sequence[Result], action: Action | None, now: float) -> None:
    """Leave this run's results for the exporter; a state directory we cannot write is not fatal."""
    state = {
        "node": opts.node,
        "time": now,
        "results": [asdict(r) for r in results],
        "action": action.did if action else "report only",
    }
    try:
        write_atomic(opts.states / f"{opts.node}.json", json.dumps(state))
    except OSError as exc:
        print(f"slurm-chaos-healthcheck: cannot write state to {opts.states}: {exc}", file=sys.stderr)


def report(node: str, results: Sequence[Result], action: Action | None, code: int) -> str:
    """NHC-like text: a summary line, then one line per check."""
    worst = next((r for r in results if r.status == code), None)
    head = f"slurm-chaos-health {checks.STATUS_WORDS[code]} on {node}"
    if worst is not None and code != OK:
        head += f" - {worst.check}: {worst.message}"
    lines = [head] + [f"  {r.word:8} {r.check}: {r.message}" for r in results]
    if action is not None:
        lines.append(f"  action: {action.did}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, runner: Runner | None = None, inputs: Inputs = Inputs()) -> int:
    try:
        opts = options_from_args(argv)
    except ChaosError as exc:
        print(f"slurm-chaos-healthcheck: {exc}", file=sys.stderr)
        return UNKNOWN
    now = time.time()
    results = run_checks(opts, inputs, now)
    scheduler = health_scheduler(runner or SubprocessRunner(), opts)
    stand = standings(opts, results, scheduler)
    results = [gate(r, stand) for r in results]
    action = None
    if opts.drain:
        action = remediate(scheduler, opts, results, stand, now)
    code = exit_code(results, action)
    write_state(opts, results, action, now)
    print(report(opts.node, results, action, code))
    return code


# ---------------------------------------------------------------- installation


def site_options(site: Site, heartbeats: Path | None = None, states: Path | None = None) -> Options:
    """The options a site's config file holds: its enabled signals, checkpoint path, GPU count and
    the policy `plugin install` writes."""
    from slurm_chaos.faults.plugin_install import site_policy_path

    if heartbeats is None and site.monitoring.heartbeat_dir:
        # The site says where (the sandbox's config names its own directory): no live lookup here.
        heartbeats = Path(site.monitoring.heartbeat_dir)
    return Options(
        signals=parse_signals(
            site.monitoring.healthcheck_signals, str(site.path), "monitoring.healthcheck_signals"
        ),
        heartbeat_dir=heartbeats,
        state_dir=states,
        checkpoint_path=site.checkpoint.path,
        gpus_per_node=site.nodes.gpus_per_node,
        slurm_conf=site.slurm.conf,
        policy=site_policy_path(site),
    )


def _root_preamble() -> str:
    """The first lines of a hook slurmd runs as root: from /, with a fixed PATH (as the fault hooks)."""
    from slurm_chaos.faults.install_hooks import SYSTEM_PATH

    return f"cd / || exit 0\nPATH={SYSTEM_PATH}\nexport PATH\n"


def _root_python(module: str, func: str, root: InstallRoot) -> str:
    """``PYTHON -I -c BOOTSTRAP``: `module`'s `func` run with the interpreter and source tree installing
    it (as the node under `root` sees them), isolated (no PYTHON* variables, neither the current
    directory nor user site-packages)."""
    from slurm_chaos.faults.install_hooks import node_code_root
    from slurm_chaos.resources import isolated_python

    return shlex.join(isolated_python(module, func, root.python(), node_code_root(root)))


def _timeout_bin() -> str:
    from slurm_chaos.faults.install_hooks import SYSTEM_PATH

    return shutil.which("timeout", path=SYSTEM_PATH) or "/usr/bin/timeout"


def install_heartbeat_hooks(hooks_dir: Path, heartbeats: Path, root: InstallRoot | None = None) -> list[Path]:
    """Write ``prolog.d/`` and ``epilog.d/40-slurm-chaos-heartbeat``: every job gets its own heartbeat
    directory (``<heartbeats>/<node>/<job>``, its user's) at its start and loses it at its end.

    They run for every job, so they are short and bounded, and exit 0 whatever happens. ConfigError
    when the code they would run as root is not root's alone. Paths are the node's: under an
    image's `root` the hooks are written into it; the paths returned are the node's."""
    from slurm_chaos.faults.install_hooks import refuse_unsafe_code
    from slurm_chaos.faults.install_root import LIVE

    root = root or LIVE
    refuse_unsafe_code("the heartbeat hooks", root)
    written = []
    for kind in ("prolog", "epilog"):
        hook = hooks_dir / f"{kind}.d" / HEARTBEAT_HOOK_NAME
        text = (
            "#!/bin/sh\n"
            f"# slurm-chaos: the job's heartbeat directory ({kind}); "
            "written by slurm-chaos, edits are overwritten.\n"
            f"{_root_preamble()}"
            f"{shlex.quote(_timeout_bin())} -k 5 {HEARTBEAT_HOOK_TIMEOUT_S} "
            f"{_root_python('slurm_chaos.probe.heartbeat', 'hook_main', root)}"
            f" {kind} --dir {shlex.quote(str(heartbeats))}"
            f' || echo "slurm-chaos: heartbeat {kind} hook exited $? for job ${{SLURM_JOB_ID:-?}}" >&2\n'
            "exit 0\n"
        )
        root.write(hook, text.encode(), mode=0o755)
        written.append(hook)
    return written


def install_healthcheck(
    hooks_dir: Path, site: Site, heartbeats: Path | None = None, root: InstallRoot | None = None
) -> Path:
    """Write `hooks_dir/healthcheck.d/50-slurm-chaos` (and its config) with the site's enabled signals,
    and the prolog/epilog hooks that give each job its heartbeat directory.

    The hooks run this module with the interpreter and source tree installing it, so they work from
    a checkout as well as from an installed package. Returns the health check hook's path.
    ConfigError when that code is not root's alone (root would run it). Under an image's `root`
    every file is written into it, naming the node's paths; the path returned is the node's.
    """
    from slurm_chaos.faults.install_hooks import refuse_unsafe_code
    from slurm_chaos.faults.install_root import LIVE

    root = root or LIVE
    refuse_unsafe_code("the health check hook", root)
    opts = site_options(site, heartbeats)
    config = hooks_dir / CONFIG_NAME
    comment = (
        f'slurm-chaos health check for site "{site.cluster}" ({site.path}),\n'
        "written by slurm-chaos (install_healthcheck); edits are overwritten."
    )
    root.write(config, render_config(opts, comment).encode())
    hook = hooks_dir / "healthcheck.d" / HOOK_NAME
    env = f"export SLURM_CONF={shlex.quote(site.slurm.conf)}\n" if site.slurm.conf else ""
    hook_text = (
        "#!/bin/sh\n"
        f"# slurm-chaos health check (signals: {', '.join(sorted(opts.signals)) or 'none'}); "
        "written by slurm-chaos, edits are overwritten.\n"
        f"{_root_preamble()}"
        f"{env}"
        f"exec {_root_python('slurm_chaos.observe.healthcheck', 'main', root)}"
        f' --config {shlex.quote(str(config))} "$@"\n'
    )
    root.write(hook, hook_text.encode(), mode=0o755)
    install_heartbeat_hooks(hooks_dir, opts.heartbeats, root)
    return hook


if __name__ == "__main__":
    sys.exit(main())
