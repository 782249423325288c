"""Fault injection: the shared fault catalogue, the ``--chaos=SPEC`` grammar and the SPANK plugin."""

from __future__ import annotations

from slurm_chaos.faults.catalogue import (
    Catalogue,
    FaultSpec,
    KeySpec,
    KeyType,
    Value,
    Where,
    describe_faults,
    load_catalogue,
)
from slurm_chaos.faults.spec import FaultRequest, SpecError, canonical_spec, format_spec, parse_spec

__all__ = [
    "Catalogue",
    "FaultRequest",
    "FaultSpec",
    "KeySpec",
    "KeyType",
    "SpecError",
    "Value",
    "Where",
    "canonical_spec",
    "describe_faults",
    "format_spec",
    "load_catalogue",
    "parse_spec",
]
