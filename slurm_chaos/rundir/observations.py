"""``observations.json``: what monitoring, Slurm and the engine's own checks saw while a fault job ran.

One per experiment directory, written by the campaign, read by the analysis::

    {"fault": "gpu-throttle",                      (optional)
     "fault_window": {"start": 1700000000.0, "end": 1700000300.0 | null},
     "observations": [{"signal": "node_drained", "time": 1700000042.5, "detail": "node2: NHC"},
                      {"signal": "detector:nhc", "time": 1700000042.5, "detail": "node2: NHC: ...",
                       "detector": "nhc", "covers": ["checkpoint"], "silenced": false,
                       "resolution_s": 1.0}],
                                                   (detector, covers, silenced, resolution_s: optional)
     "expectation": {"expect_regression": true, "detect_signals": ["alert_firing:GpuSlow"], ...},
     "crashed": false}

:func:`load_observations` reads it back and names the key at fault when it is malformed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from slurm_chaos.errors import DataError


class Signal(StrEnum):
    """The observation signals the watcher and the probe's events record under a fixed name.

    Alerts and site detectors are families, recorded as ``<family>:<name>`` (:func:`alert_signal`,
    :func:`detector_signal`); the remediation checks record their own names (``campaign/remediation.py``).
    """

    NODE_DRAINED = "node_drained"
    HEALTHCHECK_DRAIN = "healthcheck_drain"
    NODE_DOWN = "node_down"
    JOB_REQUEUED = "job_requeued"
    JOB_RESCHEDULED = "job_rescheduled"
    RESUMED_FROM_CHECKPOINT = "resumed_from_checkpoint"
    ALERT_FIRING = "alert_firing"
    DETECTOR = "detector"
    #: slurm-chaos's own reference checks (``reference:<check>``): what they saw, never a detection
    #: of the site's, named where the site's detectors missed a fault (BLIND SPOT).
    REFERENCE = "reference"


def alert_signal(alertname: str) -> str:
    """The signal of an Alertmanager alert: ``alert_firing:<alertname>``."""
    return f"{Signal.ALERT_FIRING}:{alertname}"


def reference_signal(check: str) -> str:
    """The signal of a finding of slurm-chaos's reference check `check`: ``reference:<check>``."""
    return f"{Signal.REFERENCE}:{check}"


def detector_signal(detector: str) -> str:
    """The signal of a site detector's firing: ``detector:<name>``."""
    return f"{Signal.DETECTOR}:{detector}"


@dataclass(frozen=True)
class Expectation:
    """What the experiment's author expects the cluster to do about the fault.

    Any one of ``detect_signals`` counts as detection. ``remediation`` lists steps that must all
    happen, by short name ("drain", "requeue", "resume") or by raw signal name. ``min_busbw_gbps``:
    the experiment hypothesis' floor on an allreduce run's median bus bandwidth (GB/s).
    """

    expect_regression: bool = True
    detect_signals: tuple[str, ...] = ()
    detect_within_s: float | None = None
    remediation: tuple[str, ...] = ()
    remediate_within_s: float | None = None
    max_lost_steps: int | None = None
    min_busbw_gbps: float | None = None


@dataclass(frozen=True)
class Observation:
    """One thing monitoring, the scheduler or the probe reported, at a Unix time.

    A site detector's firing names the detector and the signal kinds it covers (``covers``);
    ``silenced``: an alert Alertmanager silenced or inhibited, fired all the same.
    ``resolution_s``: how coarse ``time`` is, 0 for a time we took ourselves; a time the source
    gives in whole seconds (Slurm's reason time, truncated) stands for any moment up to that much later.
    """

    signal: str
    time: float
    detail: str = ""
    detector: str | None = None
    covers: tuple[str, ...] = ()
    silenced: bool = False
    resolution_s: float = 0.0

    def since(self, start: float) -> bool:
        """Whether it may have happened at or after ``start`` (the fault's start).

        A drain 0.3 s after the fault began reads, in Slurm's whole seconds, as up to a second
        before it: such a time counts if the moment it stands for reaches past ``start``; a drain
        from before the job is older than that and does not.
        """
        return self.time >= start or self.time + self.resolution_s > start

    def after(self, start: float) -> float:
        """Seconds from ``start`` until it, for one that :meth:`since` admits: 0 at the least."""
        return max(self.time - start, 0.0)


@dataclass(frozen=True)
class FaultWindow:
    """When the fault was active, Unix seconds; ``end`` is None for a fault left on to the end."""

    start: float
    end: float | None = None

    def contains(self, t: float) -> bool:
        return t >= self.start and (self.end is None or t <= self.end)


@dataclass(frozen=True)
class ObservationLog:
    """Contents of one experiment's ``observations.json``."""

    fault_window: FaultWindow
    observations: tuple[Observation, ...]
    expectation: Expectation
    crashed: bool = False
    fault: str = ""


def observations_to_json(log: ObservationLog) -> dict[str, Any]:
    """The JSON object :func:`load_observations` reads back."""
    e = log.expectation
    return {
        "fault": log.fault,
        "fault_window": {"start": log.fault_window.start, "end": log.fault_window.end},
        "observations": [_observation_json(o) for o in log.observations],
        "expectation": {
            "expect_regression": e.expect_regression,
            "detect_signals": list(e.detect_signals),
            "detect_within_s": e.detect_within_s,
            "remediation": list(e.remediation),
            "remediate_within_s": e.remediate_within_s,
            "max_lost_steps": e.max_lost_steps,
            "min_busbw_gbps": e.min_busbw_gbps,
        },
        "crashed": log.crashed,
    }


def _observation_json(o: Observation) -> dict[str, Any]:
    """The observation's fields; those at their defaults are left out, as files before them lack them."""
    record: dict[str, Any] = {"signal": o.signal, "time": o.time, "detail": o.detail}
    if o.detector is not None:
        record["detector"] = o.detector
        record["covers"] = list(o.covers)
    if o.silenced:
        record["silenced"] = True
    if o.resolution_s:
        record["resolution_s"] = o.resolution_s
    return record


def write_observations(path: Path, log: ObservationLog) -> None:
    path.write_text(json.dumps(observations_to_json(log), indent=2, sort_keys=True) + "\n")


def load_observations(path: Path) -> ObservationLog:
    """Read ``observations.json``; a missing file or a malformed key raises :class:`DataError`."""
    if not path.is_file():
        raise DataError(f"{path}: no such file (the campaign writes it for every experiment)")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from exc
    return observations_from_json(raw, str(path))


def observations_from_json(raw: object, where: str = "observations.json") -> ObservationLog:
    """Parse the JSON object of ``observations.json``; errors name the offending key."""
    obj = _mapping(raw, where, "<top level>")
    window = _mapping(obj.get("fault_window"), where, "fault_window")
    start = _number(window.get("start"), where, "fault_window.start")
    end_raw = window.get("end")
    end = None if end_raw is None else _number(end_raw, where, "fault_window.end")
    items = obj.get("observations", [])
    if not isinstance(items, list):
        raise DataError(f"{where}: observations: expected a list")
    observations = tuple(_observation(item, where, i) for i, item in enumerate(items))
    return ObservationLog(
        fault_window=FaultWindow(start, end),
        observations=tuple(sorted(observations, key=lambda o: (o.time, o.signal, o.detail))),
        expectation=_expectation(obj.get("expectation", {}), where),
        crashed=_bool(obj.get("crashed", False), where, "crashed"),
        fault=str(obj.get("fault", "")),
    )


def _observation(item: object, where: str, i: int) -> Observation:
    o = _mapping(item, where, f"observations[{i}]")
    signal = o.get("signal")
    if not isinstance(signal, str) or not signal:
        raise DataError(f"{where}: observations[{i}].signal: expected a non-empty string")
    detector = o.get("detector")
    if detector is not None and (not isinstance(detector, str) or not detector):
        raise DataError(f"{where}: observations[{i}].detector: expected a non-empty string")
    return Observation(
        signal,
        _number(o.get("time"), where, f"observations[{i}].time"),
        str(o.get("detail", "")),
        detector=detector,
        covers=_strings(o.get("covers", []), where, f"observations[{i}].covers"),
        silenced=_bool(o.get("silenced", False), where, f"observations[{i}].silenced"),
        resolution_s=_resolution(o.get("resolution_s", 0.0), where, f"observations[{i}].resolution_s"),
    )


def _expectation(raw: object, where: str) -> Expectation:
    e = _mapping(raw, where, "expectation")
    known = set(Expectation.__dataclass_fields__)
    unknown = sorted(set(e) - known)
    if unknown:
        raise DataError(f"{where}: expectation.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    return Expectation(
        expect_regression=_bool(e.get("expect_regression", True), where, "expectation.expect_regression"),
        detect_signals=_strings(e.get("detect_signals", []), where, "expectation.detect_signals"),
        detect_within_s=_optional_number(e.get("detect_within_s"), where, "expectation.detect_within_s"),
        remediation=_strings(e.get("remediation", []), where, "expectation.remediation"),
        remediate_within_s=_optional_number(
            e.get("remediate_within_s"), where, "expectation.remediate_within_s"
        ),
        max_lost_steps=_optional_int(e.get("max_lost_steps"), where, "expectation.max_lost_steps"),
        min_busbw_gbps=_optional_number(e.get("min_busbw_gbps"), where, "expectation.min_busbw_gbps"),
    )


def _mapping(raw: object, where: str, key: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise DataError(f"{where}: {key}: expected an object")
    return raw


def _number(raw: object, where: str, key: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise DataError(f"{where}: {key}: expected a number, got {raw!r}")
    return float(raw)


def _resolution(raw: object, where: str, key: str) -> float:
    value = _number(raw, where, key)
    if value < 0:
        raise DataError(f"{where}: {key}: expected a number of seconds >= 0, got {raw!r}")
    return value


def _optional_number(raw: object, where: str, key: str) -> float | None:
    return None if raw is None else _number(raw, where, key)


def _optional_int(raw: object, where: str, key: str) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise DataError(f"{where}: {key}: expected a non-negative integer, got {raw!r}")
    return raw


def _bool(raw: object, where: str, key: str) -> bool:
    if not isinstance(raw, bool):
        raise DataError(f"{where}: {key}: expected true or false, got {raw!r}")
    return raw


def _strings(raw: object, where: str, key: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(s, str) and s for s in raw):
        raise DataError(f"{where}: {key}: expected a list of non-empty strings")
    return tuple(raw)
