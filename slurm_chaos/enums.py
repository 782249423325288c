"""Reading a closed set of words (an experiment's strategy, a journal action's kind) into its enum.

Every such set is a ``StrEnum`` whose values are the words written to files, so a file reads back
the same; a word outside the set is refused with the words allowed, for the caller to name the
file and key.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

E = TypeVar("E", bound=StrEnum)


def allowed(kind: type[StrEnum]) -> str:
    """The words `kind` allows, comma-separated in declaration order."""
    return ", ".join(m.value for m in kind)


def parse_enum(kind: type[E], value: object) -> E:
    """The member of `kind` that `value` names; a ValueError naming the allowed words otherwise."""
    if isinstance(value, str):
        for member in kind:
            if member.value == value:
                return member
    raise ValueError(f"expected one of {allowed(kind)}, got {value!r}")
