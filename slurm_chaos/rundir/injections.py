"""``fault/injections/<node>.json``: whether each node fault's injection took on that node.

Written node-side: the fault's apply keeps the record beside its journal (``faults/injection.py``)
and a step of the fault job copies it here, before its probe and after; read by the campaign's hold
(``campaign/hold.py``: a held job whose fault took nowhere is released) and by the analysis, which
judges a fault whose injection took nowhere NO EFFECT (there was nothing for monitoring to see)::

    {"node": "node2",
     "injections": [{"fault": "gpu-ecc", "took": false, "time": 1700000000.0,
                     "detail": "gpu-ecc: no DCGM host engine on node2 (dcgmi not found): ..."}]}

A job whose faults keep no record leaves no file: the verdict is then judged as before.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_chaos.errors import DataError
from slurm_chaos.rundir.layout import INJECTIONS


@dataclass(frozen=True)
class InjectionRecord:
    """One fault's injection on one node: whether it took (read back where it can be), and why."""

    fault: str
    node: str
    took: bool
    detail: str
    time: float


def records_to_json(node: str, records: tuple[InjectionRecord, ...]) -> dict[str, Any]:
    return {
        "node": node,
        "injections": [
            {"fault": r.fault, "took": r.took, "detail": r.detail, "time": r.time} for r in records
        ],
    }


def records_from_json(raw: object, where: str) -> tuple[InjectionRecord, ...]:
    """Parse one node's record; a malformed key raises DataError naming it."""
    if not isinstance(raw, dict) or not isinstance(raw.get("node"), str) or not raw["node"]:
        raise DataError(f"{where}: node: expected a non-empty string")
    items = raw.get("injections")
    if not isinstance(items, list):
        raise DataError(f"{where}: injections: expected a list")
    return tuple(_record(item, raw["node"], where, i) for i, item in enumerate(items))


def _record(item: object, node: str, where: str, i: int) -> InjectionRecord:
    key = f"{where}: injections[{i}]"
    if not isinstance(item, dict):
        raise DataError(f"{key}: expected an object")
    fault, took, detail, t = item.get("fault"), item.get("took"), item.get("detail", ""), item.get("time")
    if not isinstance(fault, str) or not fault:
        raise DataError(f"{key}.fault: expected a non-empty string")
    if not isinstance(took, bool):
        raise DataError(f"{key}.took: expected true or false, got {took!r}")
    if not isinstance(detail, str):
        raise DataError(f"{key}.detail: expected a string")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise DataError(f"{key}.time: expected a number, got {t!r}")
    return InjectionRecord(fault, node, took, detail, float(t))


def read_record_file(path: Path) -> tuple[InjectionRecord, ...]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from exc
    return records_from_json(raw, str(path))


def write_record_file(path: Path, node: str, records: tuple[InjectionRecord, ...]) -> None:
    path.write_text(json.dumps(records_to_json(node, records), indent=2, sort_keys=True) + "\n")


def load_injections(job_dir: Path) -> tuple[InjectionRecord, ...]:
    """Every node's records of a fault job's directory, by node; () where the job left none."""
    directory = job_dir / INJECTIONS
    if not directory.is_dir():
        return ()
    return tuple(r for path in sorted(directory.glob("*.json")) for r in read_record_file(path))
