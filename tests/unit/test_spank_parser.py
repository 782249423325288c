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
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slurm_chaos.faults import SpecError, load_catalogue, parse_spec
from slurm_chaos.faults.catalogue import CATALOGUE_PATH
from slurm_chaos.faults.policy import Policy, parse_policy
from slurm_chaos.faults.spec import format_spec

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "spank_plugin"
PRELOAD_DIR = Path(__file__).resolve().parents[2] / "preload"
CHAOS_SPEC = PLUGIN_DIR / "build" / "chaos-spec"

pytestmark = pytest.mark.skipif(
    shutil.which("make") is None or shutil.which("cc") is None, reason="needs make and a C compiler"
)


def _make(*targets: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-C", str(PLUGIN_DIR), *targets],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def chaos_spec() -> Path:
    result = _make("build/chaos-spec")  # the parser alone: no Slurm headers needed
    assert result.returncode == 0, result.stdout + result.stderr
    return CHAOS_SPEC


@pytest.mark.spawns
@pytest.mark.skipif(not Path("/usr/include/slurm/spank.h").exists(), reason="needs spank.h (libslurm-dev)")
def test_c_unit_tests_and_exported_symbols() -> None:
    result = _make("test")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 failures" in result.stdout
    assert "all expected" in result.stdout  # nm -D shows only the SPANK/loader symbols


@pytest.mark.spawns
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
        result = subprocess.run(
            [str(tool), *flags, "--", *batch], capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode in (0, 1), result.stderr  # 2 would be a usage error of the tool
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
            value = rng.choice(
                ["0", "1", "-1", "1.5", "60s", "61s", "500ms", "1G", "2T", "on", "/x", "100%", ""]
            )
            yield f"{fault.name}:{key.name}={value}"
        else:
            yield "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 30)))


@pytest.mark.spawns
def test_c_and_python_agree_on_valid_specs(chaos_spec: Path) -> None:
    answers = c_answers(chaos_spec, SEEDS)
    assert answers == [python_answer(s) for s in SEEDS]
    assert not any(a.startswith("error") for a in answers)


@pytest.mark.spawns
def test_c_and_python_agree_on_mutated_specs(chaos_spec: Path) -> None:
    specs = [s for s in corpus(3000, seed=20261130) if "\n" not in s]
    c_out = c_answers(chaos_spec, specs)
    assert len(c_out) == len(specs)
    mismatches = [
        (s, c, python_answer(s)) for s, c in zip(specs, c_out, strict=True) if c != python_answer(s)
    ]
    assert not mismatches, mismatches[:5]
    # The corpus must exercise both outcomes, or the comparison proves little.
    assert 100 < sum(not a.startswith("error") for a in c_out) < len(specs) - 100


@pytest.mark.spawns
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


@pytest.mark.spawns
@pytest.mark.parametrize(
    "argv",
    [[], ["nccl-degrade:ib=off"], ["-e", "netem"], ["-x", "--", "netem"], ["-e", "-a", "--", "netem"]],
)
def test_spec_tool_operands_only_after_double_dash(chaos_spec: Path, argv: list[str]) -> None:
    result = subprocess.run([str(chaos_spec), *argv], capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "usage: chaos-spec" in result.stderr


@pytest.mark.spawns
def test_spec_tool_takes_an_option_like_spec_as_a_spec(chaos_spec: Path) -> None:
    # The SPEC "-e" (what hypothesis found on a fresh seed) is a malformed SPEC, never the -e flag.
    assert c_answers(chaos_spec, ["-e", "netem"]) == [python_answer("-e"), python_answer("netem")]
    assert python_answer("-e").startswith("error:")


@pytest.mark.spawns
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


# --- plugin_install: the plugstack.conf line, with a fake runner for make ------------------------


def _site_file(tmp_path: Path, plugstack: Path, safety: str) -> Path:
    text = (Path(__file__).resolve().parents[2] / "site_configs" / "sandbox.yaml").read_text()
    text = "\n".join(
        line
        for line in text.splitlines()
        if not line.startswith(
            ("sandbox:", "safety:", "  allowed_", "  max_nodes", "  require_excl", "  job_interf")
        )
    )
    text = (
        text.replace("${sandbox_slurm_conf}", str(tmp_path / "slurm.conf"))
        .replace("${sandbox_etc}/plugstack.conf", str(plugstack))
        .replace("${sandbox_etc}", str(tmp_path))
        .replace("${sandbox_shared}", str(tmp_path))
        .replace("${sandbox_root}", str(tmp_path))
        .replace("${prometheus_port}", "9090")
        .replace("${alertmanager_port}", "9093")
    )
    site = tmp_path / "site.yaml"
    site.write_text(text + "\n" + safety)
    return site


SAFETY = """safety:
  allowed_users: [root, alice]
  allowed_partitions: [debug]
  allowed_reservations: [chaos_maint]
  max_nodes: 4
  require_exclusive: true
"""


def test_install_plugin_builds_and_writes_one_line(tmp_path: Path) -> None:
    from slurm_chaos.faults.plugin_install import install_plugin, uninstall_plugin
    from slurm_chaos.runner import Completed, FakeRunner
    from slurm_chaos.site import load_site

    plugstack = tmp_path / "plugstack.conf"
    plugstack.write_text(
        "# keep me\noptional /usr/lib/other.so x=1\nrequired /old/slurm_chaos.so allow_users=bob\n"
    )
    runner = FakeRunner(lambda argv: Completed(argv, 0, "", ""))
    site = load_site(_site_file(tmp_path, plugstack, SAFETY))
    result = install_plugin(site, tmp_path / "prefix", runner, journal_dir="/var/lib/j")
    # Both are built from their shipped sources into a temporary directory, not in place.
    assert [call[:5] for call in runner.calls] == [
        ("make", "-C", str(PLUGIN_DIR), "install", f"PREFIX={tmp_path / 'prefix'}"),
        ("make", "-C", str(PRELOAD_DIR), "install", f"PREFIX={tmp_path / 'prefix'}"),
    ]
    builds = [Path(call[5].removeprefix("B=")) for call in runner.calls]
    assert [b.name for b in builds] == ["spank_plugin", "preload"] and builds[0].parent == builds[1].parent
    assert not builds[0].parent.exists()  # removed after the install
    assert all(call[6] == f"CATALOGUE={CATALOGUE_PATH}" for call in runner.calls)
    so = tmp_path / "prefix" / "lib" / "slurm-chaos" / "slurm_chaos.so"
    assert result.replaced and result.plugin_path == so
    policy = tmp_path / "slurm-chaos-policy.toml"  # beside the site's slurm.conf
    # Paths only on the plugstack.conf line: the rules are in the root-owned policy file.
    assert plugstack.read_text().splitlines() == [
        "# keep me",
        "optional /usr/lib/other.so x=1",
        f"required {so} policy={policy} journal_dir=/var/lib/j",
    ]
    assert result.policy_path == policy and policy.stat().st_mode & 0o777 == 0o644
    assert parse_policy(policy.read_text()) == Policy(
        allow_users=("root", "alice"),
        allow_partitions=("debug",),
        allow_reservations=("chaos_maint",),
        max_nodes=4,
    )
    lua = (tmp_path / "job_submit.lua").read_text()
    assert result.job_submit == tmp_path / "job_submit.lua" and f'local POLICY_PATH = "{policy}"' in lua
    again = install_plugin(load_site(_site_file(tmp_path, plugstack, SAFETY)), tmp_path / "prefix", runner)
    assert again.line.endswith("journal_dir=/var/lib/slurm-chaos/journal")  # the hooks' root (no sandbox)
    assert again.replaced and plugstack.read_text().count("slurm_chaos.so") == 1
    assert uninstall_plugin(load_site(result.plugstack_path.parent / "site.yaml"))
    assert plugstack.read_text().splitlines() == ["# keep me", "optional /usr/lib/other.so x=1"]
    assert not policy.exists()  # without it every fault is refused


def test_a_sites_own_job_submit_lua_is_kept(tmp_path: Path) -> None:
    from slurm_chaos.faults.plugin_install import OWN_LUA, install_job_submit

    (tmp_path / "job_submit.lua").write_text("function slurm_job_submit() return 0 end\n")
    (tmp_path / "slurm.conf").write_text("ClusterName=x\n")
    target, notes = install_job_submit(tmp_path, tmp_path / "slurm-chaos-policy.toml")
    assert target == tmp_path / OWN_LUA and "slurm-chaos job_submit/lua" in target.read_text()
    assert (tmp_path / "job_submit.lua").read_text().startswith("function slurm_job_submit")
    assert "is the site's own" in notes[0] and "add JobSubmitPlugins=lua" in notes[1]


def test_install_plugin_reports_a_failed_build(tmp_path: Path) -> None:
    from slurm_chaos.errors import ChaosError
    from slurm_chaos.faults.plugin_install import install_plugin
    from slurm_chaos.runner import Completed, FakeRunner
    from slurm_chaos.site import load_site

    plugstack = tmp_path / "plugstack.conf"
    runner = FakeRunner(lambda argv: Completed(argv, 2, "", "parse.c:1: error: boom\nmake: *** [x] Error 1"))
    with pytest.raises(ChaosError, match="boom"):
        install_plugin(load_site(_site_file(tmp_path, plugstack, SAFETY)), tmp_path / "prefix", runner)
    assert not plugstack.exists()  # nothing registered when the build failed


def test_plugin_args_the_c_parser_would_refuse_are_caught(tmp_path: Path) -> None:
    from slurm_chaos.errors import ConfigError
    from slurm_chaos.faults.plugin_install import install_plugin
    from slurm_chaos.runner import Completed, FakeRunner
    from slurm_chaos.site import load_site

    bad = SAFETY.replace("[root, alice]", "['root', 'al ice']")
    site = load_site(_site_file(tmp_path, tmp_path / "plugstack.conf", bad))
    runner = FakeRunner(lambda argv: Completed(argv, 0, "", ""))
    with pytest.raises(ConfigError, match="'al ice' is not a plain name"):
        install_plugin(site, tmp_path / "prefix", runner)
    assert runner.calls == []


@pytest.mark.spawns
def test_rendered_args_are_accepted_by_the_c_parser(chaos_spec: Path) -> None:
    from slurm_chaos.faults.plugin_install import PluginArgs

    words = PluginArgs(policy="/etc/slurm/slurm-chaos-policy.toml", journal_dir="/j").render()
    assert words == ["policy=/etc/slurm/slurm-chaos-policy.toml", "journal_dir=/j"]
    assert c_answers(chaos_spec, words, "-a") == ["ok"]
    with pytest.raises(ValueError, match="absolute path"):
        PluginArgs(policy="relative.toml").render()
    assert c_answers(chaos_spec, ["polcy=/x"], "-a") == [
        "error: unknown plugstack argument 'polcy=/x' (known: policy, journal_dir)"
    ]
    # A plugstack.conf line (the user's own, say) cannot carry rules any more.
    assert c_answers(chaos_spec, ["allow_users=mallory"], "-a") == [
        "error: plugstack argument 'allow_users=mallory': the rules are in the policy file now, not on "
        "this line (slurm-chaos plugin install writes it)"
    ]


def _fake_sysfs(root: Path, nodes: dict[int, str], online: str) -> Path:
    for node, cpus in nodes.items():
        (root / "devices/system/node" / f"node{node}").mkdir(parents=True)
        (root / "devices/system/node" / f"node{node}" / "cpulist").write_text(cpus + "\n")
    (root / "devices/system/cpu").mkdir(parents=True)
    (root / "devices/system/cpu/online").write_text(online + "\n")
    return root


@pytest.mark.spawns
@pytest.mark.parametrize(
    ("mode", "ncpus", "current", "expected"),
    [
        ("auto", 1, "0-1", "cpus=4-7 node=1"),  # task on node 0 -> bound to node 1
        ("remote", 1, "5", "cpus=8-11 node=2"),  # on node 1 -> the next node with CPUs
        ("auto", 1, "9", "cpus=0-3 node=0"),  # wraps around; node 3 has no CPUs
        ("squeeze", 3, "0-11", "cpus=9-11 node=-1"),  # last 3 online CPUs
    ],
)
def test_numa_mismatch_cpu_choice_on_a_multi_numa_node(
    chaos_spec: Path, tmp_path: Path, mode: str, ncpus: int, current: str, expected: str
) -> None:
    sysfs = _fake_sysfs(tmp_path, {0: "0-3", 1: "4-7", 2: "8-11", 3: ""}, "0-11")
    assert c_answers(chaos_spec, [str(sysfs), mode, str(ncpus), current], "-n") == [expected]


@pytest.mark.spawns
def test_numa_mismatch_on_a_single_numa_node(chaos_spec: Path, tmp_path: Path) -> None:
    sysfs = _fake_sysfs(tmp_path, {0: "0-1"}, "0-1")
    assert c_answers(chaos_spec, [str(sysfs), "auto", "1", "0-1"], "-n") == ["cpus=1 node=-1"]
    assert c_answers(chaos_spec, [str(sysfs), "remote", "1", "0-1"], "-n") == [
        "error: mode=remote needs 2 or more NUMA nodes with CPUs"
    ]


@pytest.mark.spawns
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.text(alphabet=ALPHABET, max_size=80) | st.sampled_from(SEEDS).map(lambda s: s + "," + s.split(":")[-1])
)
@example("-e")
@example("-a")
@example("-n")
@example("--")
@example("-")
def test_c_and_python_agree_property(chaos_spec: Path, spec: str) -> None:
    assert c_answers(chaos_spec, [spec]) == [python_answer(spec)]
