"""Site configuration: a YAML file describing one cluster, validated against a JSON schema.

Errors name the file, the key (as a dotted path) and what was expected, and exit 2. A value that
is still a `TODO: ...` string (as `slurm-chaos site init` leaves what Slurm cannot tell) is an
error too, with every such key listed.

A sandbox site's string values may hold `${name}` placeholders (`${sandbox_etc}/plugstack.conf`).
They are filled in after the schema check, from values the caller gives (load_site's
`placeholders`): this module reads no live state, so a bad key is reported as such whether or
not the sandbox is up.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from slurm_chaos.enums import not_one_of
from slurm_chaos.errors import ConfigError
from slurm_chaos.hostlist import expand_hostlist
from slurm_chaos.paths import path_problem

SCHEMA_PATH = Path(__file__).parent / "schemas" / "site.schema.json"
# A value someone still has to fill in; what follows says what.
TODO = "TODO:"
# `${name}` in a string value: filled in after the schema check, from values the caller gives.
_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
#: The values of a site's placeholders, given the name of the sandbox it describes; None when that
#: sandbox is not up.
PlaceholderValues = Callable[[str], Mapping[str, str] | None]


@dataclass(frozen=True)
class GPU:
    index: int
    numa_node: int
    pci_bus_id: str | None = None


@dataclass(frozen=True)
class Rack:
    name: str
    switch: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class SlurmOptions:
    partition: str
    conf: str | None = None
    account: str | None = None
    qos: str | None = None
    reservation: str | None = None
    time_limit: str = "00:30:00"
    backend: str = "auto"
    plugstack_conf: str | None = None
    hooks_dir: str | None = None


@dataclass(frozen=True)
class NodeHardware:
    cpus: int
    numa_nodes: int = 1
    gpus_per_node: int = 0
    gpus: tuple[GPU, ...] = ()
    interface: str = "eth0"
    hca: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProbeOptions:
    python: str = "python3"
    model_size: str = "tiny"
    steps: int = 200
    tasks_per_node: int = 1
    mpi: str = "none"
    progress_every: int = 50


@dataclass(frozen=True)
class Checkpoint:
    path: str
    every: int = 20
    timeout_s: float = 10.0


#: Alert labels that may name the node an alert is about (``host`` is our own exporter's).
NODE_LABELS = ("node", "host", "instance", "hostname", "Hostname")
#: An alert matcher's value that starts so is a regex (anchored, as Alertmanager's ``=~``).
REGEX_MATCH = "=~"
#: An experiment's ``expect.detect`` entry ``signal:<kind>``: any site detector covering that kind.
SIGNAL_KIND = "signal:"


@dataclass(frozen=True)
class Detector:
    """One of the site's detectors: the signal kinds it is meant to cover and how to see it fire,
    a Slurm node reason it sets (``drain_reason``, a regex) or an alert (label matchers)."""

    name: str
    signals: tuple[str, ...]
    drain_reason: str | None = None
    alert: tuple[tuple[str, str], ...] = ()

    def matches_reason(self, reason: str) -> bool:
        return self.drain_reason is not None and re.search(self.drain_reason, reason) is not None

    def matches_alert(self, labels: dict[str, object]) -> bool:
        """Every matcher holds; a label the alert lacks is the empty string, as in Alertmanager."""
        if not self.alert:
            return False
        for label, want in self.alert:
            value = str(labels.get(label, ""))
            if want.startswith(REGEX_MATCH):
                if re.fullmatch(want[len(REGEX_MATCH) :], value) is None:
                    return False
            elif value != want:
                return False
        return True


@dataclass(frozen=True)
class Deadline:
    """The site's deadlines for one signal kind (``monitoring.deadlines.<kind>``); None: the
    experiment's own stands."""

    detect_within_s: float | None = None
    remediate_within_s: float | None = None


@dataclass(frozen=True)
class Monitoring:
    prometheus: str | None = None
    alertmanager: str | None = None
    heartbeat_dir: str | None = None
    healthcheck_signals: tuple[str, ...] = ()
    detectors: tuple[Detector, ...] = ()
    node_labels: tuple[str, ...] = NODE_LABELS
    #: Signal kind -> this site's deadlines for it, overriding an experiment's (``signal:<kind>``).
    deadlines: Mapping[str, Deadline] = field(default_factory=dict)


@dataclass(frozen=True)
class Safety:
    allowed_partitions: tuple[str, ...]
    max_nodes: int
    allowed_users: tuple[str, ...] = ()
    allowed_accounts: tuple[str, ...] = ()
    allowed_reservations: tuple[str, ...] = ()
    require_exclusive: bool = True
    #: Directories under which node-side faults may act on a path the job names (ckpt-full).
    allowed_checkpoint_roots: tuple[str, ...] = ()
    allow_arrays: bool = False
    allow_het_jobs: bool = False
    #: The one interface netem may shape (the job traffic's); None: netem is refused.
    job_interface: str | None = None


@dataclass(frozen=True)
class Site:
    """One cluster as slurm-chaos sees it."""

    path: Path
    cluster: str
    slurm: SlurmOptions
    partitions: dict[str, tuple[str, ...]]
    racks: tuple[Rack, ...]
    nodes: NodeHardware
    checkpoint: Checkpoint
    safety: Safety
    probe: ProbeOptions = field(default_factory=ProbeOptions)
    nccl_env: dict[str, str] = field(default_factory=dict)
    monitoring: Monitoring = field(default_factory=Monitoring)
    features: dict[str, tuple[str, ...]] = field(default_factory=dict)
    sandbox: str | None = None
    description: str = ""
    # The SQLite file of the site's campaign history (history.path); None: beside the run directories.
    history_path: Path | None = None

    def slurm_env(self) -> dict[str, str]:
        """Environment that points Slurm commands at this cluster."""
        return {"SLURM_CONF": self.slurm.conf} if self.slurm.conf else {}

    def switch_of(self, node: str) -> str | None:
        return next((r.switch for r in self.racks if node in r.nodes), None)

    @property
    def partition_nodes(self) -> tuple[str, ...]:
        return self.partitions[self.slurm.partition]


@cache
def _schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return data


def healthcheck_signals() -> tuple[str, ...]:
    """The detectors a site's health check may declare (monitoring.healthcheck_signals)."""
    items = _schema()["properties"]["monitoring"]["properties"]["healthcheck_signals"]["items"]
    return tuple(items["enum"])


def signal_kinds() -> tuple[str, ...]:
    """The symptoms a site detector may cover, and an experiment's ``signal:<kind>`` may name."""
    detector = _schema()["properties"]["monitoring"]["properties"]["detectors"]["items"]
    return tuple(detector["properties"]["signals"]["items"]["enum"])


def _key(path: Any) -> str:
    return ".".join(str(p) for p in path)


def _describe(err: jsonschema.ValidationError) -> tuple[str, str]:
    """(dotted key, problem) in words a site admin understands."""
    key = _key(err.absolute_path)
    if err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        allowed = ", ".join(sorted(err.schema.get("properties", {}))) or "none"
        name = f"{key}.{extra[0]}" if key and extra else (extra[0] if extra else key)
        return name, f"unknown key (allowed here: {allowed})"
    if err.validator == "required":
        missing = err.message.split("'")[1] if "'" in err.message else err.message
        return (f"{key}.{missing}" if key else missing), "required key is missing"
    if err.validator == "type":
        return key, f"expected {err.validator_value}, got {type(err.instance).__name__} {err.instance!r}"
    if err.validator == "enum":
        return key, not_one_of(err.validator_value, err.instance)
    return key, err.message


def todo_entries(data: Any, key: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(dotted key, what to fill in) of every value that is still a `TODO: ...` string."""
    if isinstance(data, str):
        return [(".".join(key), data[len(TODO) :].strip())] if data.startswith(TODO) else []
    if isinstance(data, dict):
        return [t for k, v in data.items() for t in todo_entries(v, (*key, str(k)))]
    if isinstance(data, list):
        return [t for i, v in enumerate(data) for t in todo_entries(v, (*key, str(i)))]
    return []


def _check_filled_in(path: Path, data: dict[str, Any]) -> None:
    todos = todo_entries(data)
    if not todos:
        return
    (key, what), rest = todos[0], todos[1:]
    more = "".join(f"\n  {path}: {k}: TODO: {w}" for k, w in rest)
    also = f"; {len(rest)} more TODO entr{'y' if len(rest) == 1 else 'ies'}:" if rest else ""
    raise ConfigError(str(path), key, f"still TODO: {what}{also}{more}")


def _placeholder_keys(data: Any, key: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(dotted key, placeholder name) of every `${name}` in the string values of a site config."""
    if isinstance(data, str):
        return [(".".join(key), m.group(1)) for m in _PLACEHOLDER.finditer(data)]
    if isinstance(data, dict):
        return [t for k, v in data.items() for t in _placeholder_keys(v, (*key, str(k)))]
    if isinstance(data, list):
        return [t for i, v in enumerate(data) for t in _placeholder_keys(v, (*key, str(i)))]
    return []


def resolve_placeholders(path: Path, data: Any, values: Mapping[str, str]) -> Any:
    """`data` with every `${name}` in its string values replaced by `values[name]`; a placeholder
    `values` lacks is a ConfigError naming its key. Pure: the values come from the caller."""
    for key, name in _placeholder_keys(data):
        if name not in values:
            known = ", ".join(sorted(values)) or "none: only a site that names its sandbox has any"
            raise ConfigError(str(path), key, f"unknown placeholder ${{{name}}} (known: {known})")
    return _substitute(data, values)


def _substitute(data: Any, values: Mapping[str, str]) -> Any:
    if isinstance(data, str):
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], data)
    if isinstance(data, dict):
        return {k: _substitute(v, values) for k, v in data.items()}
    if isinstance(data, list):
        return [_substitute(v, values) for v in data]
    return data


def _sandbox_name(data: dict[str, Any]) -> str | None:
    """The sandbox a site file describes; $SLURM_CHAOS_SANDBOX overrides it (tests use their own)."""
    name = data.get("sandbox")
    if not isinstance(name, str):
        return None
    return os.environ.get("SLURM_CHAOS_SANDBOX") or name


def _placeholder_values(
    path: Path, sandbox: str | None, values_of: PlaceholderValues | None
) -> Mapping[str, str]:
    if sandbox is None:
        return {}
    if values_of is None:
        raise ConfigError(
            str(path), "sandbox", f"loaded without the values of sandbox {sandbox!r}'s placeholders"
        )
    values = values_of(sandbox)
    if values is None:
        raise ConfigError(
            str(path),
            "sandbox",
            f"sandbox {sandbox!r} is not up (run 'slurm-chaos sandbox up --name {sandbox}')",
        )
    return values


def _checked_data(path: Path) -> dict[str, Any]:
    """A site config's YAML, checked against the schema (TODO values included), placeholders left
    as they are: what is wrong with the file is reported whatever state the cluster is in."""
    try:
        raw = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), "", f"cannot read site config: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(str(path), "", f"malformed YAML: {where}{getattr(exc, 'problem', exc)}") from exc
    if not isinstance(data, dict):
        raise ConfigError(str(path), "", "expected a mapping at the top level")
    _check_filled_in(path, data)
    validator = jsonschema.Draft202012Validator(_schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: (len(e.absolute_path), _key(e.absolute_path)))
    if errors:
        key, problem = _describe(errors[0])
        raise ConfigError(str(path), key, problem)
    return data


def load_site(path: Path | str, placeholders: PlaceholderValues | None = None) -> Site:
    """Read and validate a site config; raises ConfigError naming the file and the key.

    The file is checked first, against the schema; only then are its `${name}` placeholders filled
    in, from `placeholders(sandbox)` when the site names a sandbox (the commands pass
    slurm_chaos.sandbox.layout.site_placeholders, which reads the running sandbox).
    """
    path = Path(path)
    data = _checked_data(path)
    sandbox = _sandbox_name(data)
    if _placeholder_keys(data):
        data = resolve_placeholders(path, data, _placeholder_values(path, sandbox, placeholders))
    return _build(path, data, sandbox)


def _nodes(path: Path, key: str, expr: str) -> tuple[str, ...]:
    try:
        return tuple(expand_hostlist(expr))
    except ValueError as exc:
        raise ConfigError(str(path), key, f"bad node list {expr!r}: {exc}") from exc


def _checkpoint_roots(path: Path, d: dict[str, Any]) -> tuple[str, ...]:
    """safety.allowed_checkpoint_roots, else the checkpoint path; each a canonical absolute path."""
    given = d["safety"].get("allowed_checkpoint_roots")
    if given is None:
        keyed = [("checkpoint.path", d["checkpoint"]["path"])]
    else:
        keyed = [(f"safety.allowed_checkpoint_roots.{i}", root) for i, root in enumerate(given)]
    for key, root in keyed:
        problem = path_problem(root)
        if problem:
            what = "" if given is not None else " (the default of safety.allowed_checkpoint_roots)"
            raise ConfigError(
                str(path), key, f"{root!r}{what} {problem}: a canonical absolute path is needed"
            )
    return tuple(root for _, root in keyed)


def _build(path: Path, d: dict[str, Any], sandbox: str | None) -> Site:
    partitions = {
        name: _nodes(path, f"partitions.{name}.nodes", p["nodes"]) for name, p in d["partitions"].items()
    }
    slurm = SlurmOptions(**d["slurm"])
    if slurm.partition not in partitions:
        raise ConfigError(
            str(path),
            "slurm.partition",
            f"unknown partition {slurm.partition!r} (known: {', '.join(partitions)})",
        )
    racks = tuple(
        Rack(name, r["switch"], _nodes(path, f"racks.{name}.nodes", r["nodes"]))
        for name, r in d["racks"].items()
    )
    all_nodes = {n for members in partitions.values() for n in members}
    for rack in racks:
        stray = sorted(set(rack.nodes) - all_nodes)
        if stray:
            raise ConfigError(str(path), f"racks.{rack.name}.nodes", f"nodes {stray} are in no partition")
    features = {name: _nodes(path, f"features.{name}", expr) for name, expr in d.get("features", {}).items()}
    for name, members in features.items():
        stray = sorted(set(members) - all_nodes)
        if stray:
            raise ConfigError(str(path), f"features.{name}", f"nodes {stray} are in no partition")
    safety = Safety(
        allowed_partitions=tuple(d["safety"]["allowed_partitions"]),
        max_nodes=d["safety"]["max_nodes"],
        allowed_users=tuple(d["safety"].get("allowed_users", ())),
        allowed_accounts=tuple(d["safety"].get("allowed_accounts", ())),
        allowed_reservations=tuple(d["safety"].get("allowed_reservations", ())),
        require_exclusive=d["safety"].get("require_exclusive", True),
        allowed_checkpoint_roots=_checkpoint_roots(path, d),
        allow_arrays=d["safety"].get("allow_arrays", False),
        allow_het_jobs=d["safety"].get("allow_het_jobs", False),
        job_interface=d["safety"].get("job_interface"),
    )
    for i, part in enumerate(safety.allowed_partitions):
        if part not in partitions:
            raise ConfigError(str(path), f"safety.allowed_partitions.{i}", f"unknown partition {part!r}")
    if (
        slurm.reservation
        and safety.allowed_reservations
        and slurm.reservation not in safety.allowed_reservations
    ):
        raise ConfigError(
            str(path), "slurm.reservation", f"{slurm.reservation!r} is not in safety.allowed_reservations"
        )
    hw = dict(d["nodes"])
    hw["gpus"] = tuple(GPU(**g) for g in hw.get("gpus", ()))
    hw["hca"] = tuple(hw.get("hca", ()))
    nodes = NodeHardware(**hw)
    if nodes.gpus and len(nodes.gpus) != nodes.gpus_per_node:
        raise ConfigError(
            str(path),
            "nodes.gpus",
            f"lists {len(nodes.gpus)} GPUs but nodes.gpus_per_node is {nodes.gpus_per_node}",
        )
    for i, gpu in enumerate(nodes.gpus):
        if gpu.numa_node >= nodes.numa_nodes:
            raise ConfigError(
                str(path),
                f"nodes.gpus.{i}.numa_node",
                f"{gpu.numa_node} but nodes.numa_nodes is {nodes.numa_nodes}",
            )
    mon = d.get("monitoring", {})
    return Site(
        path=path,
        cluster=d["cluster"],
        description=d.get("description", ""),
        sandbox=sandbox,
        slurm=slurm,
        partitions=partitions,
        racks=racks,
        features=features,
        nodes=nodes,
        checkpoint=Checkpoint(**d["checkpoint"]),
        safety=safety,
        probe=ProbeOptions(**d.get("probe", {})),
        nccl_env={k: str(v) for k, v in d.get("nccl", {}).get("env", {}).items()},
        monitoring=Monitoring(
            prometheus=mon.get("prometheus"),
            alertmanager=mon.get("alertmanager"),
            heartbeat_dir=mon.get("heartbeat_dir"),
            healthcheck_signals=tuple(mon.get("healthcheck_signals", ())),
            detectors=_detectors(path, mon.get("detectors", [])),
            node_labels=tuple(mon.get("node_labels", NODE_LABELS)),
            deadlines=_deadlines(path, mon.get("deadlines", {})),
        ),
        history_path=_history_path(path, d.get("history", {})),
    )


def _history_path(path: Path, raw: dict[str, str]) -> Path | None:
    """history.path: absolute, so that every campaign and `history` command finds one file
    whatever directory it runs in."""
    if "path" not in raw:
        return None
    problem = path_problem(raw["path"])
    if problem:
        raise ConfigError(str(path), "history.path", f"{raw['path']!r} {problem}")
    return Path(raw["path"])


def _deadlines(path: Path, raw: dict[str, dict[str, float]]) -> dict[str, Deadline]:
    """monitoring.deadlines: each key a signal kind a detector may cover (the schema checked the rest)."""
    known = signal_kinds()
    for kind in raw:
        if kind not in known:
            raise ConfigError(str(path), f"monitoring.deadlines.{kind}", not_one_of(known, kind))
    return {kind: Deadline(d.get("detect_within_s"), d.get("remediate_within_s")) for kind, d in raw.items()}


def _detectors(path: Path, raw: list[dict[str, Any]]) -> tuple[Detector, ...]:
    """monitoring.detectors; reports name each detector, so two of one name are an error."""
    detectors = tuple(_detector(path, i, d) for i, d in enumerate(raw))
    for i, det in enumerate(detectors):
        if any(other.name == det.name for other in detectors[:i]):
            raise ConfigError(str(path), f"monitoring.detectors.{i}.name", f"{det.name!r} is named twice")
    return detectors


def _detector(path: Path, i: int, d: dict[str, Any]) -> Detector:
    """monitoring.detectors.<i>; its regexes are compiled here so that a bad one names its key."""
    key = f"monitoring.detectors.{i}"
    if "drain_reason" not in d and "alert" not in d:
        raise ConfigError(str(path), key, "a detector needs drain_reason or alert (how to see it fire)")
    patterns = [("drain_reason", d["drain_reason"])] if "drain_reason" in d else []
    patterns += [
        (f"alert.{label}", v[len(REGEX_MATCH) :])
        for label, v in d.get("alert", {}).items()
        if v.startswith(REGEX_MATCH)
    ]
    for sub, pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(str(path), f"{key}.{sub}", f"bad regex {pattern!r}: {exc}") from exc
    return Detector(
        name=d["name"],
        signals=tuple(d["signals"]),
        drain_reason=d.get("drain_reason"),
        alert=tuple(sorted(d.get("alert", {}).items())),
    )
