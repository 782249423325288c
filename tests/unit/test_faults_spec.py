"""The fault catalogue and the ``--chaos=SPEC`` grammar (Python side)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_chaos.errors import UsageError
from slurm_chaos.faults import (
    KeySpec,
    KeyType,
    SpecError,
    Where,
    canonical_spec,
    describe_faults,
    format_spec,
    load_catalogue,
    parse_spec,
)
from slurm_chaos.faults.catalogue import CATALOGUE_PATH, format_fixed, parse_catalogue

CAT = load_catalogue()

EXPECTED_FAULTS = {
    "numa-mismatch": Where.TASK_AFFINITY,
    "nccl-degrade": Where.TASK_ENV,
    "netem": Where.NODE,
    "ckpt-enospc": Where.TASK_ENV,
    "ckpt-eio": Where.TASK_ENV,
    "ckpt-hang": Where.TASK_ENV,
    "ckpt-full": Where.NODE,
    "gpu-xid": Where.NODE,
    "gpu-ecc": Where.NODE,
    "gpu-thermal": Where.NODE,
    "gpu-throttle": Where.NODE,
    "slow-rank": Where.NODE,
    "node-drain": Where.CONTROLLER,
    "node-down": Where.CONTROLLER,
    "noisy-neighbour": Where.NODE,
    "rack-loss": Where.CONTROLLER,
    "slow-node": Where.NODE,
}


def test_catalogue_has_every_fault_where_it_acts() -> None:
    assert {f.name: f.where for f in CAT.faults} == EXPECTED_FAULTS


def test_catalogue_keys_asked_for_exist() -> None:
    keys = {f.name: {k.name for k in f.keys} for f in CAT.faults}
    assert {"ib", "p2p", "shm", "gdr", "hca", "channels"} <= keys["nccl-degrade"]
    assert {"delay", "jitter", "loss", "rate"} <= keys["netem"]
    assert {"after", "bytes", "path"} <= keys["ckpt-hang"]
    assert {"rank", "percent", "method"} <= keys["slow-rank"]
    assert {"switch", "after"} <= keys["rack-loss"]
    fault = CAT.get("slow-rank")
    assert fault is not None
    method = fault.key("method")
    assert method is not None and method.choices == ("cgroup", "duty-cycle")


def test_every_default_is_a_valid_value() -> None:
    for fault in CAT.faults:
        for key in fault.keys:
            assert not (key.required and key.default is not None), (fault.name, key.name)
            if key.default is not None:
                assert key.parse(key.default) == key.default_value()


def test_catalogue_rejects_a_bad_default() -> None:
    data = json.loads(CATALOGUE_PATH.read_text())
    data["faults"][0]["keys"][0]["default"] = "not-a-choice"
    with pytest.raises(ValueError, match="numa-mismatch"):
        parse_catalogue(data)


@pytest.mark.parametrize(
    ("spec", "canonical"),
    [
        ("nccl-degrade:ib=off", "nccl-degrade:ib=off"),
        ("nccl-degrade:channels=4,ib=off", "nccl-degrade:ib=off,channels=4"),
        ("netem:delay=500ms,loss=1.5%,rate=10MiB", "netem:delay=0.5s,loss=1.5,rate=10M"),
        ("netem:jitter=0.001", "netem:jitter=0.001s"),
        ("node-drain:after=2m,node=1", "node-drain:after=120s,node=1"),
        ("node-drain:after=0.03m", "node-drain:after=1.8s"),
        ("netem:delay=0.000001ms", "netem:delay=0.000000001s"),
        ("ckpt-hang:path=/ckpt/run-1,bytes=1073741824", "ckpt-hang:path=/ckpt/run-1,bytes=1G"),
        ("slow-rank:rank=007", "slow-rank:rank=7"),
        ("numa-mismatch+nccl-degrade:hca=mlx5_0:1/mlx5_1", "numa-mismatch+nccl-degrade:hca=mlx5_0:1/mlx5_1"),
    ],
)
def test_canonical_form(spec: str, canonical: str) -> None:
    assert canonical_spec(spec) == canonical
    assert canonical_spec(canonical) == canonical


def test_typed_values_and_defaults() -> None:
    netem, nccl = parse_spec("netem:delay=250ms,rate=1K+nccl-degrade:ib=off")
    assert netem.get("delay") == 0.25
    assert netem.get("rate") == 1024
    assert netem.get("jitter") == 0.0  # catalogue default
    assert not netem.fault.key("iface")  # the site names the interface (safety.job_interface), not the job
    assert nccl.get("hca") is None  # unset, no default
    assert nccl.resolved() == {"ib": "off", "p2p": "on", "shm": "on", "gdr": "on"}
    with pytest.raises(KeyError):
        netem.get("nope")


@pytest.mark.parametrize(
    ("spec", "part", "message"),
    [
        ("", "", "empty SPEC"),
        ("bogus", "bogus", "unknown fault 'bogus' (known: numa-mismatch, "),
        ("netem:bogus=1", "bogus", "netem: unknown key 'bogus' (keys: delay, jitter, loss, rate, control)"),
        ("netem:iface=lo", "iface", "netem: unknown key 'iface' (keys: delay, jitter, loss, rate, control)"),
        ("netem:delay", "delay", "netem: 'delay' is not KEY=VALUE"),
        ("netem:", "netem:", "netem: no KEY=VALUE after ':'"),
        ("netem:delay=1s,delay=2s", "delay", "netem: key 'delay' given twice"),
        ("netem+netem", "netem", "fault 'netem' given twice"),
        ("netem+", "", "empty fault (stray '+')"),
        (
            "nccl-degrade:ib=maybe",
            "ib=maybe",
            "nccl-degrade: ib: bad value 'maybe' (expected one of on, off)",
        ),
        ("netem:delay=61s", "delay=61s", "(above the maximum 60s)"),
        ("netem:rate=0", "rate=0", "(below the minimum 1)"),
        ("netem:delay=0.0000001ms", "delay=0.0000001ms", "(finer than 1ns)"),
        ("node-drain:after=999999999999999d", "after=999999999999999d", "(duration too large)"),
        ("netem:rate=9999999P", "rate=9999999P", "(byte count too large)"),
        ("rack-loss:switch=sw 1", "switch=sw 1", "(expected letters, digits or _ . / @ % : -)"),
        ("slow-rank:rank=1.5", "rank=1.5", "(expected an integer)"),
        ("ckpt-eio:after=1s", "ckpt-eio", "ckpt-eio: key 'path' is required"),
        ("a+b+c+d+e+f+g+h+i", "a+b+c+d+e+f+g+h+i", "more than 8 faults"),
        ("rack-loss:switch=" + "a" * 256, "switch=" + "a" * 256, "(longer than 255 characters)"),
        ("x" * 4097, "x" * 4097, "longer than 4096 characters"),
    ],
)
def test_errors_name_the_bad_part(spec: str, part: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert info.value.part == part
    assert message in str(info.value)
    assert str(info.value).startswith(f"bad chaos SPEC '{spec}': ")
    assert isinstance(info.value, UsageError) and info.value.exit_code == 2


def test_format_fixed_is_shortest_round_trip() -> None:
    assert format_fixed(0.1) == "0.1"
    assert format_fixed(120.0) == "120"
    assert format_fixed(1.7999999999999998) == "1.7999999999999998"
    assert float(format_fixed(1 / 3)) == 1 / 3


def test_describe_faults_lists_every_fault_and_key() -> None:
    text = describe_faults()
    for fault in CAT.faults:
        assert f"{fault.name}  [{fault.where.value}]" in text
        for key in fault.keys:
            assert f"{key.name}={key.describe_type()}" in text
    assert "ib=enum(on|off) (default on)" in text
    assert "path=str (required)" in text


def _value_text(key: KeySpec) -> st.SearchStrategy[str]:
    """Valid SPEC text for one key, in the many spellings the grammar allows."""
    lo = 0 if key.minimum is None else key.minimum
    hi = 10**6 if key.maximum is None else key.maximum
    if key.type is KeyType.ENUM:
        return st.sampled_from(key.choices)
    if key.type is KeyType.STR:
        return st.text("abcXYZ019_./@%:-", min_size=1, max_size=40)
    if key.type in (KeyType.INT, KeyType.BYTES):
        ints = st.integers(int(lo), int(hi))
        if key.type is KeyType.BYTES:
            return ints.map(str) | st.integers(0, int(hi) >> 20).filter(lambda v: v >= lo).map(
                lambda v: f"{v}M"
            )
        return ints.map(str)
    numbers = st.decimals(min_value=lo, max_value=min(hi, 10**6), places=3, allow_nan=False)
    if key.type is KeyType.DURATION:
        return numbers.map(lambda d: f"{d}s") | st.integers(int(lo * 1000), int(min(hi, 60) * 1000)).map(
            lambda v: f"{v}ms"
        )
    if key.type is KeyType.PERCENT:
        return numbers.map(lambda d: f"{d}%") | numbers.map(str)
    return numbers.map(str)


@st.composite
def specs(draw: st.DrawFn) -> str:
    faults = draw(st.lists(st.sampled_from(CAT.faults), min_size=1, max_size=4, unique_by=lambda f: f.name))
    pieces = []
    for fault in faults:
        keys = [k for k in fault.keys if k.required]
        keys += draw(st.lists(st.sampled_from(fault.keys), max_size=3, unique_by=lambda k: k.name))
        chosen = {k.name: k for k in keys}.values()
        items = [f"{k.name}={draw(_value_text(k))}" for k in chosen]
        pieces.append(fault.name + (":" + ",".join(items) if items else ""))
    return "+".join(pieces)


@settings(max_examples=300, deadline=None)
@given(specs())
def test_round_trip_property(spec: str) -> None:
    requests = parse_spec(spec)
    text = format_spec(requests)
    assert parse_spec(text) == requests
    assert format_spec(parse_spec(text)) == text
