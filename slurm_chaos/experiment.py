"""Experiments: a fault, where and when to inject it, and what monitoring and Slurm should do about it.

Experiments are YAML files: the package's library (`slurm_chaos/experiments/`) and any directory
named by the user. Validated against `schemas/experiment.schema.json`.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import yaml

from slurm_chaos.errors import ConfigError, UsageError
from slurm_chaos.resources import shipped

if TYPE_CHECKING:
    from slurm_chaos.site import Deadline

SCHEMA_PATH = Path(__file__).parent / "schemas" / "experiment.schema.json"


# The schema's enums (tests/unit/test_experiments.py holds them equal).
class Strategy(StrEnum):
    """Which part of the cluster an experiment exercises."""

    CONTROL = "control"
    GPU = "gpu"
    RESOURCE = "resource"
    NETWORK = "network"
    STORAGE = "storage"
    NUMA = "numa"
    TOPOLOGY = "topology"
    VARIABILITY = "variability"
    NODE = "node"


class Mode(StrEnum):
    """What the probe runs: a training loop or bare all-reduces."""

    TRAIN = "train"
    ALLREDUCE = "allreduce"


class Design(StrEnum):
    """How the fault's effect on step time is measured (``design``).

    - ``between-runs``: a fault job against an unfaulted baseline job of the same shape;
    - ``switchback``: one job that turns its reversible fault on and off in seeded random blocks of
      steps and is judged on its own on against its off steps (no baseline job). With ``spec: null``
      it is a placebo: the same schedule, nothing toggled.
    """

    SWITCHBACK = "switchback"
    BETWEEN_RUNS = "between-runs"


#: Designs the schema names but that cannot run yet (the loader refuses them with a clear error).
NOT_YET_AVAILABLE = ("window",)
#: The catalogue key a fault has exactly when it can be turned on and off inside a job.
CONTROL_KEY = "control"


class Remediation(StrEnum):
    """A step the cluster must take after the fault (``expect.remediation``)."""

    DRAIN = "drain"
    REQUEUE = "requeue"
    RESUME = "resume"
    RESCHEDULE_SAME_SWITCH = "reschedule_same_switch"
    AVOID_SLOW_NODE = "avoid_slow_node"


#: The ``fault.target`` keys, each the catalogue key of the same name (``rank``, ``node``, ``switch``).
TARGET_KEYS = ("rank", "node", "switch")


@dataclass(frozen=True)
class Target:
    """Where the fault acts, as the SPEC's own ``rank``/``node``/``switch`` keys say it: the loader
    writes each one into the faults of the SPEC that have the key and do not give it, and refuses a
    SPEC that gives another value or has no fault with the key (`_targeted_spec`)."""

    rank: int | None = None
    node: int | None = None
    switch: str | None = None


@dataclass(frozen=True)
class Fault:
    """The fault's SPEC (the target written in; None for a control) and where it acts."""

    spec: str | None
    target: Target = field(default_factory=Target)


#: Keys the experiment format once had that nothing acted on, and what says the same thing now.
REMOVED_FAULT_KEYS = {
    "duration_s": (
        "no longer a key (nothing acted on it): a between-runs fault is on for the whole fault job, "
        "a switchback fault follows its schedule (design: switchback), a controller fault fires once "
        "(after= or at_step= in its SPEC); drop the key"
    ),
    "start_after_s": (
        "no longer a key (nothing acted on it): a fault that can wait says so in its SPEC "
        "(after=DURATION, and for node-drain, node-down and rack-loss at_step=N); drop the key"
    ),
}


@dataclass(frozen=True)
class Hypothesis:
    """The steady state: training within this much of its baseline, and (mode allreduce) a median
    bus bandwidth of at least ``min_busbw_gbps`` GB/s (nccl-tests' busbw), judged by the analysis'
    verdict: a baseline below it makes the experiment INCONCLUSIVE, a fault run below it is the
    fault's effect, which monitoring must then detect (analysis/verdict.py)."""

    max_regression: float = 0.05
    min_busbw_gbps: float | None = None


@dataclass(frozen=True)
class Expect:
    """What monitoring and the scheduler should do once the fault hits."""

    regression: bool = True
    detect: tuple[str, ...] = ()
    detect_within_s: float | None = None
    remediation: tuple[Remediation, ...] = ()
    remediate_within_s: float | None = None
    max_lost_steps: int | None = None


#: How much longer than its deadlines a held fault job trains on before it ends by itself.
HOLD_MARGIN_S = 30.0


@dataclass(frozen=True)
class Experiment:
    name: str
    strategy: Strategy
    description: str
    fault: Fault
    expect: Expect
    path: Path
    nodes: int = 2
    tasks_per_node: int | None = None
    steps: int | None = None
    mode: Mode = Mode.TRAIN
    requeue: bool = False
    switches: int | None = None
    constraint: str | None = None
    hypothesis: Hypothesis = field(default_factory=Hypothesis)
    design: Design = Design.BETWEEN_RUNS

    @property
    def is_control(self) -> bool:
        return self.fault.spec is None

    @property
    def is_switchback(self) -> bool:
        return self.design is Design.SWITCHBACK

    @property
    def hold_limit_s(self) -> float | None:
        """How long the fault job may train on after its steps, waiting for the campaign to release
        it once the expected detection and remediation happened; None where it waits for nothing.

        The fault job must outlast what the verdict waits for (a health check's interval, an alert's
        ``for:``, a drain and requeue) on a fast machine as on a slow one."""
        e = self.expect
        if self.is_control or self.mode is not Mode.TRAIN or not (e.detect or e.remediation):
            return None
        return max(e.detect_within_s or 0.0, e.remediate_within_s or 0.0) + HOLD_MARGIN_S


@cache
def _schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return data


def load_experiment_file(path: Path) -> Experiment:
    from slurm_chaos.site import _describe

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot read experiment: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), "", f"malformed YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(str(path), "", "expected a mapping at the top level")
    _check_removed_keys(path, data.get("fault"))
    errors = sorted(
        jsonschema.Draft202012Validator(_schema()).iter_errors(data), key=lambda e: len(e.absolute_path)
    )
    if errors:
        key, problem = _describe(errors[0])
        raise ConfigError(str(path), key, problem)
    f = data["fault"]
    target = Target(**f.get("target", {}))
    fault = Fault(spec=_targeted_spec(path, f["spec"], target), target=target)
    e = data["expect"]
    _check_signal_kinds(path, e.get("detect", ()))
    expect = Expect(
        regression=e.get("regression", True),
        detect=tuple(e.get("detect", ())),
        detect_within_s=e.get("detect_within_s"),
        remediation=tuple(Remediation(r) for r in e.get("remediation", ())),
        remediate_within_s=e.get("remediate_within_s"),
        max_lost_steps=e.get("max_lost_steps"),
    )
    design = _design(path, data.get("design"), fault)
    hypothesis = Hypothesis(**data.get("hypothesis", {}))
    mode = Mode(data.get("mode", Mode.TRAIN))
    if hypothesis.min_busbw_gbps is not None and mode is not Mode.ALLREDUCE:
        raise ConfigError(
            str(path),
            "hypothesis.min_busbw_gbps",
            f"only an allreduce-mode experiment measures bus bandwidth (mode is {mode}; set mode: allreduce)",
        )
    own = ("fault", "expect", "hypothesis", "strategy", "mode", "design")
    rest = {k: v for k, v in data.items() if k not in own}
    return Experiment(
        **rest,
        strategy=Strategy(data["strategy"]),
        mode=mode,
        fault=fault,
        expect=expect,
        path=path,
        hypothesis=hypothesis,
        design=design,
    )


def _check_removed_keys(path: Path, fault: object) -> None:
    """Refuse a key of `REMOVED_FAULT_KEYS`, saying what to use instead (before the schema, which
    would only call it unknown)."""
    if not isinstance(fault, dict):
        return
    for key, problem in REMOVED_FAULT_KEYS.items():
        if key in fault:
            raise ConfigError(str(path), f"fault.{key}", problem)


def _targeted_spec(path: Path, spec: str | None, target: Target) -> str | None:
    """The SPEC with ``target`` written in: each of its ``rank``/``node``/``switch`` set on every fault
    of the SPEC that has that catalogue key and does not give it (canonical text for those faults,
    the rest as written). Refused, naming the file and the ``fault.target`` key: a target on a
    control (no SPEC), a SPEC fault that gives another value, a target key no fault of the SPEC has
    (such a fault acts on every node or task of the job; the target would not say what it does)."""
    from slurm_chaos.faults.catalogue import load_catalogue
    from slurm_chaos.faults.spec import SpecError, parse_spec

    given = {k: getattr(target, k) for k in TARGET_KEYS if getattr(target, k) is not None}
    if not given:
        return spec
    if spec is None:
        raise ConfigError(
            str(path), f"fault.target.{next(iter(given))}", "a control (spec: null) injects nothing to target"
        )
    catalogue = load_catalogue()
    pieces = spec.split("+")
    written: set[int] = set()
    for k, value in given.items():
        key = f"fault.target.{k}"
        holders = 0
        for i, piece in enumerate(pieces):
            name, colon, rest = piece.partition(":")
            fault = catalogue.get(name)
            spec_key = None if fault is None else fault.key(k)
            if spec_key is None:
                continue
            holders += 1
            try:
                text = spec_key.format(spec_key.parse(str(value)))
            except ValueError as exc:
                raise ConfigError(str(path), key, f"{value!r} is not a {name} {k}: {exc}") from exc
            if k not in {item.partition("=")[0] for item in rest.split(",")}:  # the grammar's KEY=VALUE
                pieces[i] = f"{piece}{',' if colon and rest else ':'}{k}={text}"
                written.add(i)
        if not holders:
            with_key = [f.name for f in catalogue.faults if f.key(k) is not None]
            raise ConfigError(
                str(path),
                key,
                f"no fault of the SPEC {spec!r} has a {k!r} key (faults with one: {', '.join(with_key)}); "
                f"it acts where its SPEC says, not on one {k}: drop {key}",
            )
    try:  # placeholders (${checkpoint_dir}) stand for paths; no targeted fault has a path key
        requests = parse_spec(string.Template("+".join(pieces)).safe_substitute(checkpoint_dir="/c"))
    except SpecError as exc:
        raise ConfigError(str(path), "fault.spec", exc.problem) from exc
    for k, value in given.items():
        for r in requests:
            spec_key = r.fault.key(k)
            have = None if spec_key is None else r.get(k)  # written in above where not given
            if spec_key is None or have is None or have == spec_key.parse(str(value)):
                continue
            raise ConfigError(
                str(path),
                f"fault.target.{k}",
                f"fault.target.{k} is {value!r} but the SPEC says {r.name}:{k}={spec_key.format(have)}; "
                f"make them agree or drop fault.target.{k}",
            )
    return "+".join(requests[i].format() if i in written else p for i, p in enumerate(pieces))


def spec_fault_names(spec: str) -> tuple[str, ...]:
    """The fault names of a SPEC (``NAME[:KEY=VALUE,...]`` joined by ``+``), in order, unchecked."""
    return tuple(piece.partition(":")[0] for piece in spec.split("+"))


def reversible_faults() -> tuple[str, ...]:
    """The faults that can be turned on and off inside a job: those with a ``control`` key."""
    from slurm_chaos.faults.catalogue import load_catalogue

    return tuple(f.name for f in load_catalogue().faults if f.key(CONTROL_KEY) is not None)


def _is_controller_fault(name: str) -> bool:
    from slurm_chaos.faults.catalogue import Where, load_catalogue

    fault = load_catalogue().get(name)
    return fault is not None and fault.where is Where.CONTROLLER


def default_design(spec: str | None) -> Design:
    """``switchback`` when the SPEC has faults and every one is reversible (none is a controller
    fault); ``between-runs`` otherwise, an A/A control (no SPEC) included."""
    if spec is None:
        return Design.BETWEEN_RUNS
    names = spec_fault_names(spec)
    reversible = set(reversible_faults())
    if all(n in reversible and not _is_controller_fault(n) for n in names):
        return Design.SWITCHBACK
    return Design.BETWEEN_RUNS


def _design(path: Path, given: str | None, fault: Fault) -> Design:
    """The experiment's design: the one it names, checked against its fault, else the default."""
    if given in NOT_YET_AVAILABLE:
        raise ConfigError(
            str(path),
            "design",
            f"design {given!r} is not available yet (available: {', '.join(d.value for d in Design)})",
        )
    if given is None:
        design = default_design(fault.spec)
    else:
        design = Design(given)
    if design is not Design.SWITCHBACK:
        return design
    if fault.spec is not None:
        reversible = reversible_faults()
        for name in spec_fault_names(fault.spec):
            if name not in reversible or _is_controller_fault(name):
                raise ConfigError(
                    str(path),
                    "design",
                    f"switchback needs a reversible fault; {name!r} cannot be turned on and off "
                    f"inside a job (reversible: {', '.join(reversible)}); use design: between-runs",
                )
    return design


def _check_signal_kinds(path: Path, detect: list[str]) -> None:
    """An ``expect.detect`` entry ``signal:<kind>`` names a kind site detectors can declare."""
    from slurm_chaos.site import SIGNAL_KIND, signal_kinds

    known = signal_kinds()
    for i, entry in enumerate(detect):
        kind = entry.removeprefix(SIGNAL_KIND)
        if entry.startswith(SIGNAL_KIND) and kind not in known:
            raise ConfigError(
                str(path), f"expect.detect.{i}", f"unknown signal kind {kind!r} (known: {', '.join(known)})"
            )


def signal_kinds_named(expect: Expect) -> tuple[str, ...]:
    """The signal kinds an expectation names (its ``signal:<kind>`` entries), in order."""
    from slurm_chaos.site import SIGNAL_KIND

    return tuple(e.removeprefix(SIGNAL_KIND) for e in expect.detect if e.startswith(SIGNAL_KIND))


def with_site_deadlines(exp: Experiment, deadlines: Mapping[str, Deadline]) -> Experiment:
    """The experiment with the site's deadlines (``monitoring.deadlines``) for the signal kinds it
    names in place of its own; where it names several the site overrides, the longest holds (any
    one of them counts as the detection). Kinds it does not name change nothing."""
    named = [deadlines[k] for k in signal_kinds_named(exp.expect) if k in deadlines]
    detect = [d.detect_within_s for d in named if d.detect_within_s is not None]
    remediate = [d.remediate_within_s for d in named if d.remediate_within_s is not None]
    if not detect and not remediate:
        return exp
    e = exp.expect
    expect = replace(
        e,
        detect_within_s=max(detect) if detect else e.detect_within_s,
        remediate_within_s=max(remediate) if remediate else e.remediate_within_s,
    )
    return replace(exp, expect=expect)


def _directories(extra: tuple[Path, ...]) -> tuple[Path, ...]:
    return (*extra, shipped("experiments"))


def available(extra_dirs: tuple[Path, ...] = ()) -> dict[str, Path]:
    """Experiment name -> file; a user's directory shadows the library."""
    found: dict[str, Path] = {}
    for d in reversed(_directories(extra_dirs)):
        for p in sorted(d.glob("*.yaml")):
            found[p.stem] = p
    return found


def load_experiment(name_or_path: str, extra_dirs: tuple[Path, ...] = ()) -> Experiment:
    """An experiment by name (library or `extra_dirs`) or by path to its YAML file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return load_experiment_file(path)
    known = available(extra_dirs)
    if name_or_path not in known:
        raise UsageError(f"unknown experiment {name_or_path!r} (known: {', '.join(sorted(known))})")
    exp = load_experiment_file(known[name_or_path])
    if exp.name != name_or_path:
        raise ConfigError(str(exp.path), "name", f"{exp.name!r} differs from the file name {name_or_path!r}")
    return exp


def library(extra_dirs: tuple[Path, ...] = ()) -> dict[str, Experiment]:
    """Every experiment `available` finds, loaded, by name in name order (`slurm-chaos experiments`)."""
    return {name: load_experiment_file(path) for name, path in sorted(available(extra_dirs).items())}


def format_library(experiments: dict[str, Experiment]) -> str:
    """One line per experiment: name, strategy and its fault's SPEC."""
    return "\n".join(
        f"{name:<24} {e.strategy:<12} {e.fault.spec or '(no fault)'}" for name, e in experiments.items()
    )


def expect_json(expect: Expect) -> dict[str, Any]:
    return {
        "regression": expect.regression,
        "detect": list(expect.detect),
        "detect_within_s": expect.detect_within_s,
        "remediation": [str(r) for r in expect.remediation],
        "remediate_within_s": expect.remediate_within_s,
        "max_lost_steps": expect.max_lost_steps,
    }


def experiment_json(exp: Experiment) -> dict[str, Any]:
    """The experiment as plain JSON data: what it injects, where, and what must follow."""
    t = exp.fault.target
    return {
        "name": exp.name,
        "path": str(exp.path),
        "strategy": str(exp.strategy),
        "description": exp.description,
        "nodes": exp.nodes,
        "tasks_per_node": exp.tasks_per_node,
        "steps": exp.steps,
        "mode": str(exp.mode),
        "requeue": exp.requeue,
        "switches": exp.switches,
        "constraint": exp.constraint,
        "design": str(exp.design),
        "spec": exp.fault.spec,
        "target": {"rank": t.rank, "node": t.node, "switch": t.switch},
        "hypothesis": {
            "max_regression": exp.hypothesis.max_regression,
            "min_busbw_gbps": exp.hypothesis.min_busbw_gbps,
        },
        "expect": expect_json(exp.expect),
    }
