"""`slurm-chaos faults --format json`: the fault catalogue as plain JSON data.

Beside `faults.catalogue.describe_faults` (the text form) is where this belongs; it lives here while
that package is being changed by others. It reads only the catalogue, so both forms agree.
"""

from __future__ import annotations

from typing import Any

from slurm_chaos.faults.catalogue import Catalogue, FaultSpec, KeySpec, load_catalogue


def key_json(key: KeySpec) -> dict[str, Any]:
    """One key: its type (as `describe_type` writes it), default, bounds in canonical units, help."""
    return {
        "name": key.name,
        "type": key.type.value,
        "choices": list(key.choices),
        "required": key.required,
        "default": key.default,
        "minimum": key.minimum,
        "maximum": key.maximum,
        "help": key.help,
    }


def fault_json(fault: FaultSpec) -> dict[str, Any]:
    """One fault: name, what it does, where it acts (which part of slurm-chaos applies it), its keys."""
    return {
        "name": fault.name,
        "description": fault.description,
        "where": fault.where.value,
        "keys": [key_json(k) for k in fault.keys],
    }


def catalogue_json(catalogue: Catalogue | None = None) -> dict[str, Any]:
    cat = catalogue or load_catalogue()
    return {"version": cat.version, "faults": [fault_json(f) for f in cat.faults]}
