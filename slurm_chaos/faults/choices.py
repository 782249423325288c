"""The words of the node faults' enum keys, as the enums the node code compares.

``catalogue.json`` is the one source of each key's words: the SPEC parser refuses any other, and
the SPANK plugin's ``catalogue.h`` is generated from it. Each enum here is that key's ``choices``
in catalogue order, a member's value the word a SPEC writes, so a SPEC reads and writes the same
text; ``tests/unit/test_faults_choices.py`` fails when the two differ, or when a node fault has an
enum key without one. Read a key with ``node_base.choice``: a word the enum lacks is refused there
naming the words it takes.
"""

from __future__ import annotations

from enum import StrEnum


class Control(StrEnum):
    """``control``: a reversible fault on for the whole job, or turned on and off by the job."""

    STATIC = "static"
    SWITCHBACK = "switchback"


class XidMethod(StrEnum):
    """gpu-xid ``method``: where the XID is reported."""

    KMSG = "kmsg"
    DCGM = "dcgm"
    BOTH = "both"


class EccKind(StrEnum):
    """gpu-ecc ``kind``: a single- or double-bit error."""

    SBE = "sbe"
    DBE = "dbe"


class ThrottleMethod(StrEnum):
    """gpu-throttle ``method``: a clock lock or a power cap."""

    CLOCKS = "clocks"
    POWER = "power"


class SlowMethod(StrEnum):
    """slow-rank ``method``: a cgroup CPU quota or a stop/continue duty cycle."""

    CGROUP = "cgroup"
    DUTY_CYCLE = "duty-cycle"


class Load(StrEnum):
    """noisy-neighbour ``load``: a stress-ng stressor, or a GPU matmul burn."""

    CPU = "cpu"
    CACHE = "cache"
    MEMORY = "memory"
    MATMUL = "matmul"


#: (fault, key) -> the enum of its words, for every enum key of a fault applied on the node.
KEY_CHOICES: dict[tuple[str, str], type[StrEnum]] = {
    ("netem", "control"): Control,
    ("gpu-xid", "method"): XidMethod,
    ("gpu-ecc", "kind"): EccKind,
    ("gpu-throttle", "method"): ThrottleMethod,
    ("slow-rank", "method"): SlowMethod,
    ("slow-rank", "control"): Control,
    ("noisy-neighbour", "load"): Load,
    ("noisy-neighbour", "control"): Control,
    ("slow-node", "control"): Control,
}
