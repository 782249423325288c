"""The SPANK plugin's C side: unit tests, fuzz smoke, and C/Python agreement on the SPEC grammar.

``spank_plugin/parse.c`` and ``slurm_chaos/faults/spec.py`` implement one grammar twice (the
plugin cannot embed Python); these tests run both on the same inputs, through the
``chaos-spec`` tool, and require the same canonical text or the same error message.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from slurm_chaos.faults import SpecError, load_catalogue, parse_spec
from slurm_chaos.faults.spec import format_spec

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "spank_plugin"
CHAOS_SPEC = PLUGIN_DIR / "build" / "chaos-spec"

pytestmark = pytest.mark.skipif(
    shutil.which("make") is None or shutil.which("cc") is None, reason="needs make and a C compiler"
)


def _make(*targets: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-C", str(PLUGIN_DIR), *targets], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def chaos_spec() -> Path:
    result = _make("all")
    assert result.returncode == 0, result.stdout + result.stderr
    return CHAOS_SPEC


def test_c_unit_tests_and_exported_symbols() -> None:
    result = _make("test")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 failures" in result.stdout
    assert "all expected" in result.stdout  # nm -D shows only the SPANK/loader symbols


def test_fuzz_smoke_under_sanitizers() -> None:
    result = _make("fuzz-smoke", "FUZZ_SECONDS=3")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert ("Done" in out and "runs" in out) or "no failure" in out


def python_answer(spec: str) -> str:
    try:
        return format_spec(parse_spec(spec))
    except SpecError as exc:
        return f"error: {exc}"


def c_answers(tool: Path, specs: Sequence[str], *flags: str) -> list[str]:
    out: list[str] = []
    for start in range(0, len(specs), 200):
        batch = specs[start : start + 200]
        result = subprocess.run([str(tool), *flags, *batch], capture_output=True, text=True, timeout=60, check=False)
        out.extend(result.stdout.splitlines())
    return out


SEEDS = [
    "nccl-degrade:ib=off",
    "nccl-degrade:channels=4,ib=off,hca=mlx5_0:1/mlx5_1",
    "netem:delay=500ms,jitter=0.25,loss=1.5%,rate=10MiB",
    "numa-mismatch:mode=squeeze,cpus=2+slow-rank:rank=3,percent=25",
    "ckpt-hang:path=/ckpt/run-1,bytes=1G,after=30s,hold=1h",
    "node-drain:after=0.03m,node=1+rack-loss:switch=sw1",
    "gpu-xid:xid=79,method=both+gpu-throttle:method=power,power=150",
]
ALPHABET = "+:,=%.-_/0123456789abcdeikmnoprsxyzBGKMPT "


def mutate(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        pos = rng.randint(0, len(chars))
        if op < 0.4:
            chars.insert(pos, rng.choice(ALPHABET))
        elif op < 0.7 and chars:
            del chars[min(pos, len(chars) - 1)]
        elif chars:
            chars[min(pos, len(chars) - 1)] = rng.choice(ALPHABET)
    return "".join(chars)


def corpus(n: int, seed: int) -> Iterator[str]:
    rng = random.Random(seed)
    faults = load_catalogue().faults
    for _ in range(n):
        kind = rng.random()
        if kind < 0.6:
            yield mutate(rng, rng.choice(SEEDS))
        elif kind < 0.9:
            fault = rng.choice(faults)
            key = rng.choice(fault.keys)
            value = rng.choice(["0", "1", "-1", "1.5", "60s", "61s", "500ms", "1G", "2T", "on", "/x", "100%", ""])
            yield f"{fault.name}:{key.name}={value}"
        else:
            yield "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 30)))


def test_c_and_python_agree_on_valid_specs(chaos_spec: Path) -> None:
    answers = c_answers(chaos_spec, SEEDS)
    assert answers == [python_answer(s) for s in SEEDS]
    assert not any(a.startswith("error") for a in answers)


def test_c_and_python_agree_on_mutated_specs(chaos_spec: Path) -> None:
    specs = [s for s in corpus(3000, seed=20261130) if "\n" not in s]
    c_out = c_answers(chaos_spec, specs)
    assert len(c_out) == len(specs)
    mismatches = [(s, c, python_answer(s)) for s, c in zip(specs, c_out) if c != python_answer(s)]
    assert not mismatches, mismatches[:5]
    # The corpus must exercise both outcomes, or the comparison proves little.
    assert 100 < sum(not a.startswith("error") for a in c_out) < len(specs) - 100


def test_c_and_python_agree_on_limits(chaos_spec: Path) -> None:
    specs = [
        "rack-loss:switch=" + "a" * 255,
        "rack-loss:switch=" + "a" * 256,
        "x" * 4096,
        "x" * 4097,
        "+".join(["netem"] * 8),
        "+".join(["netem"] * 9),
        "netem:rate=9999999P",
        "netem:delay=0.0000001ms",
        "node-drain:after=999999999999999d",
    ]
    assert c_answers(chaos_spec, specs) == [python_answer(s) for s in specs]


def test_task_environment_matches_python_resolved_values(chaos_spec: Path) -> None:
    spec = "nccl-degrade:ib=off,channels=2+netem:delay=250ms"
    lines = c_answers(chaos_spec, [spec], "-e")
    expected = []
    for request in parse_spec(spec):
        for key, value in request.resolved().items():
            name = f"SLURM_CHAOS_{request.name}_{key}".upper().replace("-", "_")
            spec_key = request.fault.key(key)
            assert spec_key is not None
            expected.append(f"{name}={spec_key.format(value)}")
    assert lines == expected
    assert "SLURM_CHAOS_NETEM_DELAY=0.25s" in lines
