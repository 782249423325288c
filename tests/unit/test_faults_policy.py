"""The policy file and the decision on a job's facts: Python, the plugin's C reader, job_submit.lua.

One file, three readers (the prolog hooks, the SPANK plugin in slurmstepd, slurmctld's Lua):
these tests hold them to the same grammar and the same decisions.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from slurm_chaos.faults.plugin_install import policy_from_safety, render_job_submit
from slurm_chaos.faults.policy import (
    MAX_POLICY_BYTES,
    JobFacts,
    Policy,
    PolicyError,
    load_policy,
    parse_policy,
    refusal,
    write_policy,
)
from slurm_chaos.site import Safety

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "spank_plugin"
CHAOS_SPEC = PLUGIN_DIR / "build" / "chaos-spec"
HAS_CC = shutil.which("make") is not None and shutil.which("cc") is not None
LUA = shutil.which("lua5.1")

GOOD = """# comment
version = 1
allow_users = ["root", "alice", "1002"]
allow_partitions = ["debug"]
allow_reservations = []
require_exclusive = false
max_nodes = 4
job_interface = "ib0"
"""

BAD_IFACE = "expected a quoted network interface name"
MALFORMED = {
    "": "policy: 'version = 1' missing or another version",
    "version = 2\n": "policy: 'version = 1' missing or another version",
    "version = 1\nmax_nodes = 0\n": "policy: max_nodes: must be 1 or more",
    'version = 1\nallow_users = ["a",]\n': "policy line 2: allow_users: '' is not a quoted plain name",
    'version = 1\nallow_users = ["a b"]\n': "policy line 2: allow_users: '\"a b\"' is not a quoted "
    "plain name",
    "version = 1\nallow_users = 'a'\n": "policy line 2: allow_users: expected a list of names on one line",
    "version = 1\nversion = 1\n": "policy line 2: version: given twice",
    "version = 1\nallow_user = []\n": "policy line 2: unknown key 'allow_user'",
    "version = 1 # note\n": "policy line 1: version: expected a whole number",
    "version = 1\nallow_arrays = yes\n": "policy line 2: allow_arrays: expected true or false",
    "version = 1\r\n": "policy line 1: control or non-ASCII character",
    'version = 1\nallow_users = ["é"]\n': "policy line 2: control or non-ASCII character",
    "version = 1\n[section]\n": "policy line 2: expected KEY = VALUE",
    "Version = 1\n": "policy line 1: expected KEY = VALUE",
    **{
        f"version = 1\njob_interface = {value}\n": f"policy line 2: job_interface: {BAD_IFACE}"
        for value in ("eth0", '""', '"eth0 "', '"a234567890123456"', '".."', '"e/0"', '["eth0"]')
    },
    'version = 1\njob_interface = "a"\njob_interface = "b"\n': "policy line 3: job_interface: given twice",
}


def c_tool(*argv: str) -> list[str]:
    result = subprocess.run([str(CHAOS_SPEC), *argv], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode in (0, 1), result.stderr
    return result.stdout.splitlines()


@pytest.fixture(scope="module")
def chaos_spec() -> Path:
    if not HAS_CC:
        pytest.skip("needs make and a C compiler")
    result = subprocess.run(
        ["make", "-C", str(PLUGIN_DIR), "build/chaos-spec"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return CHAOS_SPEC


def describe(policy: Policy) -> str:
    """What ``chaos-spec -p`` prints for a policy (policy.c chaos_policy_describe)."""

    def names(value: tuple[str, ...] | None) -> str:
        return "-" if value is None else ",".join(value)

    return (
        f"users={names(policy.allow_users)} accounts={names(policy.allow_accounts)} "
        f"partitions={names(policy.allow_partitions)} reservations={names(policy.allow_reservations)} "
        f"exclusive={int(policy.require_exclusive)} arrays={int(policy.allow_arrays)} "
        f"het={int(policy.allow_het_jobs)} max_nodes={policy.max_nodes if policy.max_nodes else -1} "
        f"job_interface={policy.job_interface or '-'}"
    )


def python_answer(text: str) -> str:
    try:
        return describe(parse_policy(text))
    except PolicyError as exc:
        return f"error: {exc}"


def c_answers(tmp_path: Path, texts: Sequence[str]) -> list[str]:
    paths = []
    for i, text in enumerate(texts):
        path = tmp_path / f"p{i}.toml"
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        paths.append(str(path))
    out: list[str] = []
    for start in range(0, len(paths), 200):
        out += c_tool("-p", "--", *paths[start : start + 200])
    return out


# --------------------------------------------------------------------------------- Python


def test_parse_and_render_round_trip() -> None:
    policy = parse_policy(GOOD)
    assert policy == Policy(
        allow_users=("root", "alice", "1002"),
        allow_partitions=("debug",),
        allow_reservations=(),
        require_exclusive=False,
        max_nodes=4,
        job_interface="ib0",
    )
    assert parse_policy(policy.render()) == policy
    assert parse_policy("version = 1\n") == Policy()  # defaults: only root, exclusive, no arrays


@pytest.mark.parametrize(("text", "error"), list(MALFORMED.items()))
def test_malformed_policy_is_refused_naming_the_line(text: str, error: str) -> None:
    with pytest.raises(PolicyError) as exc:
        parse_policy(text)
    assert str(exc.value) == error


def test_limits() -> None:
    many = ", ".join(f'"u{i}"' for i in range(65))
    with pytest.raises(PolicyError, match="more than 64 entries"):
        parse_policy(f"version = 1\nallow_users = [{many}]\n")
    with pytest.raises(PolicyError, match="larger than"):
        parse_policy("#" * (MAX_POLICY_BYTES + 1))
    with pytest.raises(ValueError, match="not a plain name"):
        Policy(allow_users=("al ice",)).render()
    with pytest.raises(ValueError, match="not a network interface name"):
        Policy(job_interface="eth0;x").render()
    assert parse_policy('version = 1\njob_interface = "a23456789012345"\n').job_interface == "a23456789012345"
    assert parse_policy('version = 1\njob_interface = "bond0.100"\n').job_interface == "bond0.100"


def test_policy_from_the_sites_safety_section() -> None:
    safety = Safety(allowed_partitions=("debug",), max_nodes=4, allowed_users=("root", "alice"))
    policy = policy_from_safety(safety)
    assert policy.allow_users == ("root", "alice") and policy.allow_accounts is None
    assert policy.job_interface is None  # not named: netem is refused
    named = policy_from_safety(Safety(allowed_partitions=("debug",), max_nodes=4, job_interface="ib0"))
    assert named.job_interface == "ib0" and parse_policy(named.render()) == named
    assert policy.require_exclusive and not policy.allow_arrays and policy.max_nodes == 4
    assert parse_policy(policy.render()) == policy


def test_load_refuses_files_others_could_write(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to own and chown the file")
    path = tmp_path / "slurm-chaos-policy.toml"
    write_policy(path, Policy(allow_users=("alice",)))
    assert path.stat().st_mode & 0o777 == 0o644 and path.stat().st_uid == 0
    assert load_policy(path).allow_users == ("alice",)
    path.chmod(0o664)
    with pytest.raises(PolicyError, match="writable by group or others"):
        load_policy(path)
    path.chmod(0o644)
    os.chown(path, 1000, 1000)
    with pytest.raises(PolicyError, match="owned by uid 1000, not root"):
        load_policy(path)
    os.chown(path, 0, 0)
    link = tmp_path / "link.toml"
    link.symlink_to(path)
    with pytest.raises(PolicyError):
        load_policy(link)
    with pytest.raises(PolicyError, match="No such file"):
        load_policy(tmp_path / "missing.toml")
    path.write_text("version = 1\nallow_users = [alice]\n")
    with pytest.raises(PolicyError, match="line 2"):
        load_policy(path)


FACTS = JobFacts(uid=1001, user="alice", account="a", partition="debug", reservation="maint",
                 exclusive=True, array=False, het=False, nodes=2)  # fmt: skip
STRICT = Policy(
    allow_users=("alice", "1002"),
    allow_accounts=("a",),
    allow_partitions=("debug",),
    allow_reservations=("*",),
    max_nodes=2,
)

EXCL = "the job does not hold its nodes exclusively (require_exclusive: submit with --exclusive)"
UNKNOWN = "the job's {0} is not known but allow_{0}s is set in the policy"
DECISIONS: list[tuple[Policy, dict[str, object], str | None]] = [
    (STRICT, {}, None),
    (Policy(), {}, "user 'alice' (uid 1001) may not inject faults (only root: allow_users is not set)"),
    (Policy(), {"uid": 0, "user": "root"}, None),
    (STRICT, {"user": "bob"}, "user 'bob' (uid 1001) may not inject faults (not in allow_users)"),
    (STRICT, {"user": "bob", "uid": 1002}, None),
    (STRICT, {"account": "b"}, "account 'b' is not in allow_accounts"),
    (STRICT, {"partition": None}, UNKNOWN.format("partition")),
    (STRICT, {"reservation": None}, UNKNOWN.format("reservation")),
    (STRICT, {"exclusive": False}, EXCL),
    (STRICT, {"exclusive": None}, EXCL),
    (STRICT, {"array": True}, "array jobs may not inject faults (allow_arrays is not set)"),
    (STRICT, {"array": None}, "array jobs may not inject faults (allow_arrays is not set)"),
    (Policy(allow_users=("*",), allow_arrays=True), {"array": True}, None),
    (STRICT, {"het": True}, "heterogeneous jobs may not inject faults (allow_het_jobs is not set)"),
    (STRICT, {"nodes": 3}, "the job has 3 nodes (max_nodes 2)"),
    (STRICT, {"nodes": None}, "the job has an unknown number of nodes (max_nodes 2)"),
]


@pytest.mark.parametrize(("policy", "change", "expected"), DECISIONS)
def test_refusal(policy: Policy, change: dict[str, object], expected: str | None) -> None:
    facts = JobFacts(**{**FACTS.__dict__, **change})
    assert refusal(policy, facts) == expected


# --------------------------------------------------------------------------------- C


def test_c_reader_agrees_on_good_and_malformed_files(chaos_spec: Path, tmp_path: Path) -> None:
    texts = [GOOD, STRICT.render(), Policy().render(), *MALFORMED]
    assert c_answers(tmp_path, texts) == [python_answer(t) for t in texts]


ALPHABET = 'version=1 allow_users[]",\t\n#*ab_-.maxnodes4\rtruflsjob_interface/'


def mutate(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 4)):
        pos = rng.randint(0, len(chars))
        op = rng.random()
        if op < 0.4:
            chars.insert(pos, rng.choice(ALPHABET))
        elif op < 0.7 and chars:
            del chars[min(pos, len(chars) - 1)]
        elif chars:
            chars[min(pos, len(chars) - 1)] = rng.choice(ALPHABET)
    return "".join(chars)


def test_c_reader_agrees_on_mutated_files(chaos_spec: Path, tmp_path: Path) -> None:
    rng = random.Random(20261130)
    seeds = [GOOD, STRICT.render(), 'version = 1\nallow_users = ["a", "b"]\nmax_nodes = 12\n',
             'version = 1\njob_interface = "eth0"\n']  # fmt: skip
    texts = [mutate(rng, rng.choice(seeds)) for _ in range(1500)]
    c_out = c_answers(tmp_path, texts)
    mismatches = [
        (t, c, python_answer(t)) for t, c in zip(texts, c_out, strict=True) if c != python_answer(t)
    ]
    assert not mismatches, mismatches[:3]
    assert 100 < sum(not a.startswith("error") for a in c_out) < len(texts) - 100


def _flag(value: object) -> str:
    return "-1" if value is None else str(int(bool(value)))


@pytest.mark.parametrize(("policy", "change", "expected"), DECISIONS)
def test_c_decision_agrees(
    chaos_spec: Path, tmp_path: Path, policy: Policy, change: dict[str, object], expected: str | None
) -> None:
    facts = JobFacts(**{**FACTS.__dict__, **change})
    path = tmp_path / "policy.toml"
    path.write_text(policy.render())
    argv = [
        str(facts.uid),
        *(v or "-" for v in (facts.user, facts.account, facts.partition, facts.reservation)),
        _flag(facts.exclusive),
        _flag(facts.array),
        _flag(facts.het),
        str(-1 if facts.nodes is None else facts.nodes),
    ]
    assert c_tool("-c", "--", str(path), *argv) == ["ok" if expected is None else f"refused: {expected}"]


def test_c_loader_checks_owner_and_mode(chaos_spec: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown the file")
    path = tmp_path / "policy.toml"
    write_policy(path, STRICT)
    assert c_tool("-P", "--", str(path)) == [describe(STRICT)]
    os.chown(path, 1000, 1000)
    assert c_tool("-P", "--", str(path)) == [f"error: policy {path}: owned by uid 1000, not root"]


# --------------------------------------------------------------------------------- Lua

# Runs job_submit.lua outside slurmctld: `slurm` is the part of Slurm's Lua API it uses.
LUA_HARNESS = r"""
slurm = { SUCCESS = 0, ESLURM_ACCESS_DENIED = 2002, msgs = {} }
function slurm.log_info(...) end
function slurm.log_user(fmt, ...) slurm.msgs[#slurm.msgs + 1] = string.format(fmt, ...) end
dofile(arg[1])
local NO_VAL = 4294967294
local parts = {
  debug = { flag_default = 1, max_share = 1 },
  whole = { flag_default = 0, max_share = 0 },
  force = { flag_default = 0, max_share = 32768 + 4 },
}
local function job(over)
  local j = { user_id = 1001, user_name = "alice", shared = 0, het_job_offset = NO_VAL, min_nodes = 2,
              reservation = "maint", spank_job_env = { [0] = "SLURM_CHAOS_SPEC=netem:delay=0.005s" } }
  for k, v in pairs(over) do if v == "nil" then j[k] = nil else j[k] = v end end
  return j
end
local cases = {
  {}, { user_name = "bob" }, { user_id = 0, user_name = "root" }, { shared = 65534 },
  { shared = 65534, partition = "whole" }, { partition = "force" }, { partition = "gpu" },
  { array_inx = "1-2" }, { het_job_offset = 0 }, { min_nodes = 3 }, { reservation = "nil" },
  { spank_job_env = "nil" }, { spank_job_env = { [0] = "SPANK_SLURM_CHAOS_SPEC=netem" } },
  { spank_job_env = { [0] = "SLURM_CHAOS_SPEC=a b" } }, { account = "b" },
}
for i, over in ipairs(cases) do
  slurm.msgs = {}
  local j = job(over)
  local rc = slurm_job_submit(j, parts, j.user_id)
  print(string.format("%d %s %s", rc, tostring(j.admin_comment), slurm.msgs[1] or "-"))
end
"""

REFUSED = "2002 nil slurm-chaos: refused --chaos=netem:delay=0.005s: "
LUA_EXPECTED = [
    "0 slurm-chaos=netem:delay=0.005s -",
    REFUSED + "user 'bob' (uid 1001) may not inject faults (not in allow_users)",
    "0 slurm-chaos=netem:delay=0.005s -",
    REFUSED + EXCL,
    "0 slurm-chaos=netem:delay=0.005s -",
    REFUSED + EXCL,
    REFUSED + "partition 'gpu' is not in allow_partitions",
    REFUSED + "array jobs may not inject faults (allow_arrays is not set)",
    REFUSED + "heterogeneous jobs may not inject faults (allow_het_jobs is not set)",
    REFUSED + "the job asks for 3 nodes (max_nodes 2)",
    REFUSED + "the job has no reservation but allow_reservations is set (submit with --reservation)",
    "0 nil -",
    "0 slurm-chaos=netem -",
    "2002 nil slurm-chaos: refused --chaos=a?b: a SPEC of up to 4096 printable characters, "
    "without spaces or '|'",
    REFUSED + "account 'b' is not in allow_accounts",
]


def _run_lua(tmp_path: Path, policy_text: str, mode: int = 0o644) -> list[str]:
    policy = tmp_path / "slurm-chaos-policy.toml"
    policy.write_text(policy_text)
    policy.chmod(mode)
    script = tmp_path / "job_submit.lua"
    script.write_text(render_job_submit(policy))
    harness = tmp_path / "harness.lua"
    harness.write_text(LUA_HARNESS)
    assert LUA is not None
    result = subprocess.run([LUA, str(harness), str(script)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.skipif(LUA is None or os.geteuid() != 0, reason="needs lua5.1 and root (a root-owned policy)")
def test_job_submit_lua_decides_as_the_policy_says(tmp_path: Path) -> None:
    policy = Policy(
        allow_users=("alice",),
        allow_accounts=("a",),
        allow_partitions=("debug", "whole", "force"),
        allow_reservations=("maint",),
        max_nodes=2,
    )
    assert _run_lua(tmp_path, policy.render()) == LUA_EXPECTED


@pytest.mark.skipif(LUA is None or os.geteuid() != 0, reason="needs lua5.1 and root (a root-owned policy)")
def test_job_submit_lua_refuses_every_spec_under_a_bad_policy(tmp_path: Path) -> None:
    lines = _run_lua(tmp_path, "version = 1\nallow_users = [alice]\n")
    assert lines[0] == (
        "2002 nil slurm-chaos: refused --chaos=netem:delay=0.005s: policy line 2: allow_users: "
        "'alice' is not a quoted plain name"
    )
    assert lines[11] == "0 nil -"  # a job without --chaos is not affected
    lines = _run_lua(tmp_path, Policy(allow_users=("alice",)).render(), mode=0o666)
    assert "writable by group or others (mode 666)" in lines[0]


@pytest.mark.skipif(LUA is None or os.geteuid() != 0, reason="needs lua5.1 and root (a root-owned policy)")
def test_job_submit_lua_reads_the_job_interface_as_the_others_do(tmp_path: Path) -> None:
    policy = Policy(
        allow_users=("alice",),
        allow_accounts=("a",),
        allow_partitions=("debug", "whole", "force"),
        allow_reservations=("maint",),
        max_nodes=2,
        job_interface="bond0.100",
    )
    assert _run_lua(tmp_path, policy.render()) == LUA_EXPECTED
    for text in [t for t in MALFORMED if "job_interface" in t]:
        assert _run_lua(tmp_path, text)[0] == (
            f"2002 nil slurm-chaos: refused --chaos=netem:delay=0.005s: {MALFORMED[text]}"
        ), text


@pytest.mark.skipif(LUA is None or os.geteuid() != 0, reason="needs lua5.1 and root (a root-owned policy)")
def test_job_submit_lua_refuses_a_partition_that_preempts_by_suspension(tmp_path: Path) -> None:
    """#27 finding 12, at submission where slurm.conf says so (the prolog decides from slurmctld)."""
    policy = Policy(
        allow_users=("alice",),
        allow_accounts=("a",),
        allow_partitions=("debug", "whole", "force"),
        allow_reservations=("maint",),
        max_nodes=2,
    )
    (tmp_path / "slurm.conf").write_text(
        "PreemptType=preempt/partition_prio\n"
        "PreemptMode=SUSPEND,GANG  # the cluster's\n"
        "PartitionName=debug Nodes=n[1-2] Default=YES\n"
        "PartitionName=whole Nodes=n[1-2] PreemptMode=REQUEUE\n"
    )
    lines = _run_lua(tmp_path, policy.render())
    assert lines[0] == REFUSED + (
        "partition 'debug' preempts by suspension (PreemptMode=SUSPEND,GANG): a suspended job runs no "
        "epilog, and the job that preempts it would get the node with the faults in place"
    )
    assert lines[4] == LUA_EXPECTED[4] == "0 slurm-chaos=netem:delay=0.005s -"  # whole requeues
    assert lines[2] == lines[0]  # root's job too: the node is everyone's after a suspension
    assert lines[1] == LUA_EXPECTED[1]  # the policy's own rules come first
    (tmp_path / "slurm.conf").write_text("PreemptType=preempt/none\nPreemptMode=SUSPEND\n")
    assert _run_lua(tmp_path, policy.render()) == LUA_EXPECTED  # no plugin to preempt with
