"""The node faults' enum keys are enums of the catalogue's words: each enum is its key's
``choices`` in catalogue.json, every enum key of a node fault has one, and a word an enum lacks is
refused on the node naming the words it takes."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

import pytest

from slurm_chaos.enums import allowed
from slurm_chaos.errors import ChaosError
from slurm_chaos.faults import Catalogue, FaultRequest, KeyType, Where, load_catalogue, parse_spec
from slurm_chaos.faults.catalogue import CATALOGUE_PATH, parse_catalogue
from slurm_chaos.faults.choices import KEY_CHOICES, Control, Load, SlowMethod, XidMethod
from slurm_chaos.faults.node_base import choice, switchback
from slurm_chaos.faults.node_cpu import stress_argv


def drift(cat: Catalogue, table: dict[tuple[str, str], type[StrEnum]]) -> list[str]:
    """Where the enums and the catalogue's enum keys of node faults differ, in words."""
    problems = []
    for (fault_name, key_name), kind in table.items():
        fault = cat.get(fault_name)
        key = fault.key(key_name) if fault else None
        if key is None or key.type is not KeyType.ENUM:
            problems.append(f"{fault_name} has no enum key {key_name} ({kind.__name__})")
        elif key.choices != tuple(m.value for m in kind):
            words = ", ".join(key.choices)
            problems.append(f"{fault_name} {key_name}: catalogue {words}; {kind.__name__} {allowed(kind)}")
    for fault in cat.faults:
        for key in fault.keys:
            if fault.where is Where.NODE and key.type is KeyType.ENUM and (fault.name, key.name) not in table:
                problems.append(f"{fault.name} {key.name}: no enum in faults/choices.py")
    return problems


def test_each_enum_is_its_keys_words_in_the_catalogue_and_each_node_enum_key_has_one() -> None:
    assert drift(load_catalogue(), KEY_CHOICES) == []


def _edited(fault: str, key: str, **change: Any) -> Catalogue:
    data = json.loads(CATALOGUE_PATH.read_text())
    raw = next(k for f in data["faults"] if f["name"] == fault for k in f["keys"] if k["name"] == key)
    raw.update(change)
    return parse_catalogue(data)


@pytest.mark.parametrize(
    ("fault", "key", "change", "problem"),
    [
        (
            "gpu-xid",
            "method",
            {"choices": ["kmsg", "dcgm", "both", "nvml"]},
            "gpu-xid method: catalogue kmsg, dcgm, both, nvml; XidMethod kmsg, dcgm, both",
        ),
        (
            "slow-rank",
            "method",
            {"choices": ["duty-cycle"], "default": "duty-cycle"},
            "slow-rank method: catalogue duty-cycle; SlowMethod cgroup, duty-cycle",
        ),
        (
            "noisy-neighbour",
            "cpus",
            {"type": "enum", "choices": ["1", "all"], "default": "1", "min": None, "max": None},
            "noisy-neighbour cpus: no enum in faults/choices.py",
        ),
        ("netem", "control", {"type": "str"}, "netem has no enum key control (Control)"),
    ],
)
def test_a_word_the_catalogue_gains_or_loses_is_a_drift(
    fault: str, key: str, change: dict[str, Any], problem: str
) -> None:
    assert drift(_edited(fault, key, **change), KEY_CHOICES) == [problem]


def test_a_key_reads_as_its_member_given_or_default() -> None:
    xid, slow, noisy = parse_spec("gpu-xid:method=both+slow-rank:control=switchback+noisy-neighbour")
    assert choice(xid, "method", XidMethod) is XidMethod.BOTH
    assert choice(slow, "method", SlowMethod) is SlowMethod.DUTY_CYCLE  # the catalogue's default
    assert choice(slow, "control", Control) is Control.SWITCHBACK and switchback(slow)
    assert choice(noisy, "load", Load) is Load.CPU and not switchback(noisy)


def test_a_word_the_enum_lacks_is_refused_naming_the_fault_the_key_and_the_words() -> None:
    (xid,) = parse_spec("gpu-xid")
    forged = FaultRequest(xid.fault, (("method", "nvml"),))  # as if the catalogue had a word more
    with pytest.raises(ChaosError) as exc:
        choice(forged, "method", XidMethod)
    assert str(exc.value) == "gpu-xid: key method: expected one of kmsg, dcgm, both, got 'nvml'"


def test_every_load_has_a_stress_ng_command() -> None:
    assert {tuple(stress_argv(load, 1, 1)[:2]) for load in Load} == {
        ("stress-ng", "--cpu"),
        ("stress-ng", "--cache"),
        ("stress-ng", "--vm"),
        ("stress-ng", "--matrix"),
    }
