"""The ``--chaos=SPEC`` grammar: ``NAME[:KEY=VALUE[,KEY=VALUE...]]`` joined by ``+``.

Parsing yields typed :class:`FaultRequest` objects; :func:`format_spec` writes the canonical
SPEC back (``parse_spec(format_spec(r)) == r``). The SPANK plugin's ``parse.c`` implements the
same grammar and the same error messages; ``tests/unit/test_spank_parser.py`` holds them to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slurm_chaos.errors import UsageError
from slurm_chaos.faults.catalogue import Catalogue, FaultSpec, Value, load_catalogue

#: Limits shared with the C parser (fixed-size buffers there).
MAX_SPEC_LEN = 4096
MAX_FAULTS = 8


class SpecError(UsageError):
    """A SPEC that cannot be accepted; ``part`` is the offending piece of text."""

    def __init__(self, spec: str, part: str, problem: str) -> None:
        self.spec = spec
        self.part = part
        self.problem = problem
        super().__init__(f"bad chaos SPEC '{spec}': {problem}")


@dataclass(frozen=True)
class FaultRequest:
    """One fault asked for in a SPEC with the keys the user gave (defaults are not stored)."""

    fault: FaultSpec
    params: tuple[tuple[str, Value], ...]

    @property
    def name(self) -> str:
        return self.fault.name

    def get(self, key: str) -> Value | None:
        """The given value, else the catalogue default, else None (unset)."""
        for name, value in self.params:
            if name == key:
                return value
        spec = self.fault.key(key)
        if spec is None:
            raise KeyError(f"{self.fault.name} has no key {key!r}")
        return spec.default_value()

    def resolved(self) -> dict[str, Value]:
        """Every key that has a value, given or default, in catalogue key order."""
        values = {k.name: self.get(k.name) for k in self.fault.keys}
        return {name: value for name, value in values.items() if value is not None}

    def format(self) -> str:
        """Canonical text of this request (given keys only, in catalogue key order)."""
        given = dict(self.params)
        parts = [f"{k.name}={k.format(given[k.name])}" for k in self.fault.keys if k.name in given]
        return self.fault.name + (":" + ",".join(parts) if parts else "")


def parse_spec(spec: str, catalogue: Catalogue | None = None) -> tuple[FaultRequest, ...]:
    """Parse a whole SPEC; raises :class:`SpecError` naming the bad part."""
    cat = catalogue or load_catalogue()
    if not spec:
        raise SpecError(spec, spec, "empty SPEC")
    if len(spec.encode()) > MAX_SPEC_LEN:  # bytes, as the C parser counts
        raise SpecError(spec, spec, f"longer than {MAX_SPEC_LEN} characters")
    pieces = spec.split("+")
    if len(pieces) > MAX_FAULTS:
        raise SpecError(spec, spec, f"more than {MAX_FAULTS} faults")
    requests: list[FaultRequest] = []
    for piece in pieces:
        request = _parse_fault(spec, piece, cat)
        if any(r.name == request.name for r in requests):
            raise SpecError(spec, request.name, f"fault '{request.name}' given twice")
        requests.append(request)
    return tuple(requests)


def format_spec(requests: Iterable[FaultRequest]) -> str:
    """Canonical SPEC text for parsed requests."""
    return "+".join(r.format() for r in requests)


def canonical_spec(spec: str, catalogue: Catalogue | None = None) -> str:
    """Parse and re-format a SPEC (validates it on the way)."""
    return format_spec(parse_spec(spec, catalogue))


def _parse_fault(spec: str, piece: str, cat: Catalogue) -> FaultRequest:
    if not piece:
        raise SpecError(spec, piece, "empty fault (stray '+')")
    name, colon, rest = piece.partition(":")
    fault = cat.get(name)
    if fault is None:
        raise SpecError(spec, name, f"unknown fault '{name}' (known: {', '.join(cat.names())})")
    if colon and not rest:
        raise SpecError(spec, piece, f"{name}: no KEY=VALUE after ':'")
    params = _parse_params(spec, fault, rest.split(",") if colon else [])
    order = [k.name for k in fault.keys]
    params = tuple(sorted(params, key=lambda item: order.index(item[0])))  # one canonical order
    given = {k for k, _ in params}
    for key in fault.keys:
        if key.required and key.name not in given:
            raise SpecError(spec, name, f"{name}: key '{key.name}' is required")
    return FaultRequest(fault, params)


def _parse_params(spec: str, fault: FaultSpec, items: Sequence[str]) -> tuple[tuple[str, Value], ...]:
    params: list[tuple[str, Value]] = []
    for item in items:
        key_name, eq, text = item.partition("=")
        if not eq:
            raise SpecError(spec, item, f"{fault.name}: '{item}' is not KEY=VALUE")
        key = fault.key(key_name)
        if key is None:
            known = ", ".join(k.name for k in fault.keys)
            raise SpecError(spec, key_name, f"{fault.name}: unknown key '{key_name}' (keys: {known})")
        if any(k == key_name for k, _ in params):
            raise SpecError(spec, key_name, f"{fault.name}: key '{key_name}' given twice")
        try:
            value = key.parse(text)
        except ValueError as exc:
            raise SpecError(spec, item, f"{fault.name}: {key_name}: bad value '{text}' ({exc})") from exc
        params.append((key_name, value))
    return tuple(params)
