"""The fault catalogue: every fault, its keys and their types, loaded from ``catalogue.json``.

``catalogue.json`` is the single source of truth: the SPANK plugin compiles it into
``catalogue.h`` (``spank_plugin/gen_catalogue.py``), the hooks and the Python side read it here.
The value grammar below is mirrored one to one by ``spank_plugin/parse.c``; a test runs both on
the same inputs, so change them together.

Canonical units: duration in seconds (float), bytes (int), percent as 0..100 (float).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any

CATALOGUE_PATH = Path(__file__).with_name("catalogue.json")

#: A key's value once parsed: int (int, bytes), float (float, duration, percent) or str.
Value = int | float | str

#: Longest value text accepted; the C parser has fixed buffers of this size (+1).
MAX_VALUE_LEN = 255


class KeyType(Enum):
    """How a key's value is written and what it means."""

    INT = "int"
    FLOAT = "float"
    DURATION = "duration"
    PERCENT = "percent"
    STR = "str"
    ENUM = "enum"
    BYTES = "bytes"


class Where(Enum):
    """Where a fault acts: which component of slurm-chaos applies it."""

    TASK_ENV = "task_env"
    TASK_AFFINITY = "task_affinity"
    NODE = "node"
    CONTROLLER = "controller"


_INT_RE = re.compile(r"-?[0-9]{1,18}")
# Fractions are capped so that the shortest fixed-point text always reads back exactly.
_FLOAT_RE = re.compile(r"-?[0-9]{1,9}(\.[0-9]{1,6})?")
_DURATION_RE = re.compile(r"([0-9]{1,15})(?:\.([0-9]{1,9}))?(ms|s|m|h|d)?")
_PERCENT_RE = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,6})?)%?")
_BYTES_RE = re.compile(r"([0-9]{1,18})([kmgtpKMGTP]i?)?[bB]?")
_STR_RE = re.compile(r"[A-Za-z0-9_./@%:-]{1,255}")

NS_PER_S = 1_000_000_000
_DURATION_NS = {"ms": 10**6, "s": NS_PER_S, "m": 60 * NS_PER_S, "h": 3600 * NS_PER_S, "d": 86400 * NS_PER_S}
_BYTE_SUFFIXES = ("K", "M", "G", "T", "P")


def format_fixed(value: float) -> str:
    """Shortest fixed-point text that reads back as exactly ``value`` (never an exponent).

    The C side uses the same loop over ``%.*f``, so both print identical canonical text.
    """
    for digits in range(18):
        text = f"{value:.{digits}f}"  # the same digits as C printf("%.*f")
        if float(text) == value:
            return text
    return f"{value:.17f}"


def duration_ns(text: str) -> int:
    """A duration as whole nanoseconds, computed exactly (no binary floating point)."""
    m = _DURATION_RE.fullmatch(text)
    if not m:
        raise ValueError("expected a duration such as 30s, 500ms, 5m, 1h")
    whole, frac, unit = m.group(1), m.group(2) or "", m.group(3) or "s"
    scaled = (int(whole) * 10 ** len(frac) + int(frac or "0")) * _DURATION_NS[unit]
    ns: int
    rest: int
    ns, rest = divmod(scaled, 10 ** len(frac))
    if rest:
        raise ValueError("finer than 1ns")
    if ns >= 1 << 63:
        raise ValueError("duration too large")
    return ns


def format_ns(ns: int) -> str:
    """Canonical duration text: seconds with only the digits needed, e.g. ``0.5s``, ``120s``."""
    whole, frac = divmod(ns, NS_PER_S)
    return f"{whole}.{frac:09d}".rstrip("0") + "s" if frac else f"{whole}s"


def _parse_bytes(text: str) -> int:
    m = _BYTES_RE.fullmatch(text)
    if not m:
        raise ValueError("expected a byte count such as 4096, 512K, 1G")
    suffix = (m.group(2) or "")[:1].upper()
    shift = 10 * (_BYTE_SUFFIXES.index(suffix) + 1) if suffix else 0
    value = int(m.group(1)) << shift
    if value >= 1 << 63:
        raise ValueError("byte count too large")
    return value


def _format_bytes(value: int) -> str:
    for i in range(len(_BYTE_SUFFIXES), 0, -1):
        unit = 1 << (10 * i)
        if value and value % unit == 0:
            return f"{value // unit}{_BYTE_SUFFIXES[i - 1]}"
    return str(value)


@dataclass(frozen=True)
class KeySpec:
    """One parameter of a fault: its type, default, bounds and help text."""

    name: str
    type: KeyType
    help: str
    default: str | None = None
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()

    def parse(self, text: str) -> Value:
        """Parse one value as written in a SPEC; raises ValueError saying what was expected."""
        if len(text.encode()) > MAX_VALUE_LEN:  # bytes, as the C parser counts
            raise ValueError(f"longer than {MAX_VALUE_LEN} characters")
        if self.type is KeyType.DURATION:
            ns = duration_ns(text)
            self._check_bounds(ns, NS_PER_S)
            return ns / NS_PER_S
        value = self._parse_raw(text)
        if not isinstance(value, str):
            self._check_bounds(value, 1)
        return value

    def format(self, value: Value) -> str:
        """Canonical text of a parsed value; ``parse(format(v)) == v``."""
        if self.type is KeyType.BYTES:
            return _format_bytes(int(value))
        if self.type is KeyType.DURATION:
            # Seconds as float hold every in-bounds nanosecond count exactly enough to round back.
            return format_ns(round(float(value) * NS_PER_S))
        if self.type in (KeyType.FLOAT, KeyType.PERCENT):
            return format_fixed(float(value))
        return str(value)

    def default_value(self) -> Value | None:
        """The parsed default, or None when the key is unset unless given."""
        return None if self.default is None else self.parse(self.default)

    def describe_type(self) -> str:
        """Short human form of the type, e.g. ``enum(on|off)`` or ``duration``."""
        if self.type is KeyType.ENUM:
            return "enum(" + "|".join(self.choices) + ")"
        return str(self.type.value)

    def _parse_raw(self, text: str) -> Value:
        t = self.type
        if t is KeyType.INT:
            if not _INT_RE.fullmatch(text):
                raise ValueError("expected an integer")
            return int(text)
        if t is KeyType.FLOAT:
            if not _FLOAT_RE.fullmatch(text):
                raise ValueError("expected a number such as 1.5")
            return float(text)
        if t is KeyType.PERCENT:
            m = _PERCENT_RE.fullmatch(text)
            if not m:
                raise ValueError("expected a percentage such as 50 or 12.5%")
            return float(m.group(1))
        if t is KeyType.BYTES:
            return _parse_bytes(text)
        if t is KeyType.ENUM:
            if text not in self.choices:
                raise ValueError("expected one of " + ", ".join(self.choices))
            return text
        if not _STR_RE.fullmatch(text):
            raise ValueError("expected letters, digits or _ . / @ % : -")
        return text

    def _check_bounds(self, value: float, scale: int) -> None:
        """Compare in the value's own unit (ns for durations) so the comparison is exact."""
        if self.minimum is not None and value < round(self.minimum * scale):
            raise ValueError(f"below the minimum {self._bound_text(self.minimum)}")
        if self.maximum is not None and value > round(self.maximum * scale):
            raise ValueError(f"above the maximum {self._bound_text(self.maximum)}")

    def _bound_text(self, bound: float) -> str:
        if self.type is KeyType.BYTES:
            return _format_bytes(int(bound))
        if self.type in (KeyType.INT,):
            return str(int(bound))
        return self.format(bound)


@dataclass(frozen=True)
class FaultSpec:
    """One named fault of the catalogue."""

    name: str
    description: str
    where: Where
    keys: tuple[KeySpec, ...]

    def key(self, name: str) -> KeySpec | None:
        """The key called ``name``, or None."""
        return next((k for k in self.keys if k.name == name), None)


@dataclass(frozen=True)
class Catalogue:
    """Every fault slurm-chaos knows, in catalogue order."""

    version: int
    faults: tuple[FaultSpec, ...]

    def get(self, name: str) -> FaultSpec | None:
        """The fault called ``name``, or None."""
        return next((f for f in self.faults if f.name == name), None)

    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.faults)


def _key_from_json(raw: Mapping[str, Any]) -> KeySpec:
    key = KeySpec(
        name=str(raw["name"]),
        type=KeyType(raw["type"]),
        help=str(raw.get("help", "")),
        default=None if raw.get("default") is None else str(raw["default"]),
        required=bool(raw.get("required", False)),
        minimum=None if raw.get("min") is None else float(raw["min"]),
        maximum=None if raw.get("max") is None else float(raw["max"]),
        choices=tuple(str(c) for c in raw.get("choices", ())),
    )
    if key.type is KeyType.ENUM and not key.choices:
        raise ValueError(f"key {key.name}: enum without choices")
    key.default_value()  # a default must itself be a valid value
    return key


def _fault_from_json(raw: Mapping[str, Any]) -> FaultSpec:
    name = str(raw["name"])
    try:
        keys = tuple(_key_from_json(k) for k in raw["keys"])
    except (KeyError, ValueError) as exc:
        raise ValueError(f"fault {name}: {exc}") from exc
    if len({k.name for k in keys}) != len(keys):
        raise ValueError(f"fault {name}: duplicate key")
    return FaultSpec(name, str(raw["description"]), Where(raw["where"]), keys)


def parse_catalogue(data: Mapping[str, Any]) -> Catalogue:
    """Build a Catalogue from the decoded JSON; ValueError names the faulty fault or key."""
    faults = tuple(_fault_from_json(f) for f in data["faults"])
    if len({f.name for f in faults}) != len(faults):
        raise ValueError("duplicate fault name")
    return Catalogue(int(data["version"]), faults)


@cache
def load_catalogue(path: Path = CATALOGUE_PATH) -> Catalogue:
    """Load and validate the catalogue file (cached: it does not change while running)."""
    with path.open(encoding="utf-8") as fh:
        return parse_catalogue(json.load(fh))


def describe_faults(catalogue: Catalogue | None = None) -> str:
    """Human listing of every fault and its keys, for ``slurm-chaos faults``."""
    cat = catalogue or load_catalogue()
    lines: list[str] = []
    for fault in cat.faults:
        lines.append(f"{fault.name}  [{fault.where.value}]")
        lines.append(f"    {fault.description}")
        for key in fault.keys:
            lines.append("      " + _describe_key(key))
    return "\n".join(lines) + "\n"


def _describe_key(key: KeySpec) -> str:
    if key.required:
        default = "required"
    elif key.default is None:
        default = "unset"
    else:
        default = f"default {key.default}"
    bounds = ""
    if key.minimum is not None or key.maximum is not None:
        low = "" if key.minimum is None else key._bound_text(key.minimum)
        high = "" if key.maximum is None else key._bound_text(key.maximum)
        bounds = f", {low}..{high}"
    return f"{key.name}={key.describe_type()} ({default}{bounds}): {key.help}"
