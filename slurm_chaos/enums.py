"""Reading a closed set of words (an experiment's strategy, a journal action's kind) into its enum.

Every such set is a ``StrEnum`` whose values are the words written to files, so a file reads back
the same; a word outside the set is refused with the words allowed, for the caller to name the
file and key.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import TypeVar

E = TypeVar("E", bound=StrEnum)


def allowed(kind: type[StrEnum]) -> str:
    """The words `kind` allows, comma-separated in declaration order."""
    return ", ".join(m.value for m in kind)


def not_one_of(words: Iterable[object], value: object) -> str:
    """The words for a value outside a closed set, the same wherever a set is checked (an enum
    here, a schema's ``enum`` in a site file)."""
    return f"expected one of {', '.join(map(str, words))}, got {value!r}"


def parse_enum(kind: type[E], value: object) -> E:
    """The member of `kind` that `value` names; a ValueError naming the allowed words otherwise."""
    if isinstance(value, str):
        for member in kind:
            if member.value == value:
                return member
    raise ValueError(not_one_of((m.value for m in kind), value))
