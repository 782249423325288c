"""The SPANK plugin on the real sandbox cluster: effects inside the job, refusals, no-op path.

The plugin is built and registered in the sandbox's plugstack.conf for this module only (the
previous file is restored afterwards). slurmstepd and srun/sbatch read plugstack.conf at each
start, so no daemon restart is needed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_chaos.faults import load_catalogue
from slurm_chaos.faults.journal import Journal
from slurm_chaos.faults.plugin_install import PluginArgs, build_plugin, plugstack_line, update_plugstack
from slurm_chaos.runner import Completed, SubprocessRunner

pytestmark = pytest.mark.sandbox

TIMEOUT = 120


@dataclass(frozen=True)
class PluginSandbox:
    """The sandbox with the plugin loaded; ``run`` runs Slurm commands against it."""

    env: dict[str, str]
    journal_dir: Path
    shared_dir: Path
    nodes: tuple[str, ...]
    plugstack: Path
    plugin_path: Path
    args: PluginArgs

    def run(self, argv: Sequence[str], env: dict[str, str] | None = None) -> Completed:
        return SubprocessRunner()(argv, timeout=TIMEOUT, env={**self.env, **(env or {})})


@pytest.fixture(scope="module")
def plugin(sandbox) -> Iterator[PluginSandbox]:  # type: ignore[no-untyped-def]
    plugstack = Path(sandbox.slurm_conf).parent / "plugstack.conf"
    before = plugstack.read_text() if plugstack.exists() else None
    prefix = Path(sandbox.shared_dir) / "spank-test-prefix"
    journal_dir = Path(sandbox.shared_dir) / f"journal-{uuid.uuid4().hex[:8]}"
    so = build_plugin(prefix, SubprocessRunner())
    args = PluginArgs(
        allow_users=("root",),
        allow_reservations=(sandbox.reservation,),
        require_exclusive=True,
        journal_dir=str(journal_dir),
    )
    update_plugstack(plugstack, plugstack_line(so, args))
    try:
        yield PluginSandbox(
            dict(sandbox.env),
            journal_dir,
            Path(sandbox.shared_dir),
            tuple(sandbox.nodes),
            plugstack,
            so,
            args,
        )
    finally:
        if before is None:
            plugstack.unlink(missing_ok=True)
        else:
            plugstack.write_text(before)


def task_env(result: Completed) -> dict[str, str]:
    assert result.ok, result.stderr
    pairs = (line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return {k: v for k, v in pairs}


def cpus_allowed(result: Completed) -> list[str]:
    assert result.ok, result.stderr
    return re.findall(r"Cpus_allowed_list:\s*(\S+)", result.stdout)


def journal_lines(plugin: PluginSandbox, job_id: str) -> list[dict[str, object]]:
    """Every record the job left in the journal, all nodes (``<root>/<node>/<job>.jsonl``)."""
    lines = []
    for path in sorted(plugin.journal_dir.glob(f"*/{job_id}.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


def node_states(plugin: PluginSandbox) -> dict[str, str]:
    out = plugin.run(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def test_help_lists_the_option(plugin: PluginSandbox) -> None:
    result = plugin.run(["srun", "--help"])
    assert "--chaos=SPEC" in result.stdout + result.stderr


def test_nccl_degrade_reaches_the_task_environment(plugin: PluginSandbox) -> None:
    result = plugin.run(
        [
            "srun",
            "-N1",
            "--exclusive",
            "--chaos=nccl-degrade:ib=off,channels=2",
            "bash",
            "-c",
            "env; echo JOB=$SLURM_JOB_ID",
        ]
    )
    env = task_env(result)
    assert env["NCCL_IB_DISABLE"] == "1"
    assert env["NCCL_MAX_NCHANNELS"] == "2"
    assert "NCCL_P2P_DISABLE" not in env  # only what was asked
    assert env["SLURM_CHAOS_SPEC"] == "nccl-degrade:ib=off,channels=2"
    assert env["SLURM_CHAOS_FAULTS"] == "nccl-degrade"
    assert env["SLURM_CHAOS_NCCL_DEGRADE_IB"] == "off"
    # Journalled before the change, in the rollback journal's own format, saying it dies with the task.
    node = env["SLURMD_NODENAME"]
    state = Journal(plugin.journal_dir, node, env["JOB"]).read()
    actions = {(e.fault, e.action) for e in state.entries}
    assert ("nccl-degrade", "task environment of step 0: NCCL_IB_DISABLE=1 NCCL_MAX_NCHANNELS=2") in actions
    assert all(e.undo.action == "none" and e.node == node and e.job_id == env["JOB"] for e in state.entries)
    assert [e.seq for e in state.entries] == list(range(1, len(state.entries) + 1))
    assert len(journal_lines(plugin, env["JOB"])) == len(state.entries) == 2


def test_env_form_of_the_option(plugin: PluginSandbox) -> None:
    result = plugin.run(
        ["srun", "-N2", "--exclusive", "printenv", "NCCL_P2P_DISABLE"],
        env={"SLURM_CHAOS": "nccl-degrade:p2p=off"},
    )
    assert result.ok, result.stderr
    assert result.stdout.split() == ["1", "1"]  # both nodes


def test_sbatch_option_reaches_batch_step_and_inner_steps(plugin: PluginSandbox) -> None:
    out = plugin.shared_dir / f"spank-batch-{uuid.uuid4().hex[:8]}.out"
    script = 'echo batch=$NCCL_SHM_DISABLE; srun bash -c "echo step=\\$NCCL_SHM_DISABLE"'
    result = plugin.run(
        [
            "sbatch",
            "--wait",
            "--parsable",
            "-N2",
            "--exclusive",
            "--chaos=nccl-degrade:shm=off",
            "-o",
            str(out),
            "--wrap",
            script,
        ]
    )
    assert result.ok, result.stderr
    lines = sorted(out.read_text().split())
    assert lines == ["batch=1", "step=1", "step=1"]
    # Each node journals under its own name: the batch node has the batch step and step 0.
    job = result.stdout.strip().split(";")[0]
    per_node = {
        p.parent.name: Journal(plugin.journal_dir, p.parent.name, job).read().entries
        for p in plugin.journal_dir.glob(f"*/{job}.jsonl")
    }
    assert len(per_node) == 2, per_node
    steps = sorted(sorted({e.action.split(":")[0] for e in entries}) for entries in per_node.values())
    assert steps == [
        ["task environment of step 0"],
        ["task environment of step 0", "task environment of step batch"],
    ]


def test_numa_mismatch_changes_affinity_inside_the_task(plugin: PluginSandbox) -> None:
    status = ["grep", "Cpus_allowed_list", "/proc/self/status"]
    baseline = cpus_allowed(plugin.run(["srun", "-N1", "--exclusive", *status]))
    squeezed = cpus_allowed(
        plugin.run(["srun", "-N1", "--exclusive", "--chaos=numa-mismatch:mode=squeeze,cpus=1", *status])
    )
    assert baseline and squeezed
    assert squeezed != baseline
    assert re.fullmatch(r"\d+", squeezed[0])  # one CPU: every rank of the node on the same core
    # The last online CPU of the node, which is in the baseline set.
    last = baseline[0].split(",")[-1].split("-")[-1]
    assert squeezed[0] == last


def test_numa_mismatch_squeezes_every_rank_of_a_node_onto_one_cpu(plugin: PluginSandbox) -> None:
    result = plugin.run(
        [
            "srun",
            "-N1",
            "-n2",
            "--exclusive",
            "--chaos=numa-mismatch",
            "grep",
            "Cpus_allowed_list",
            "/proc/self/status",
        ]
    )
    allowed = cpus_allowed(result)
    assert len(allowed) == 2 and allowed[0] == allowed[1]
    assert re.fullmatch(r"\d+", allowed[0])


def test_without_chaos_nothing_changes(plugin: PluginSandbox) -> None:
    result = plugin.run(
        [
            "srun",
            "-N1",
            "--exclusive",
            "bash",
            "-c",
            "env; grep Cpus_allowed_list /proc/self/status; echo JOB=$SLURM_JOB_ID",
        ]
    )
    env = task_env(result)
    ours = (
        "NCCL_",
        "SLURM_CHAOS_SPEC",
        "SLURM_CHAOS_FAULTS",
        *("SLURM_CHAOS_" + f.name.upper().replace("-", "_") + "_" for f in load_catalogue().faults),
    )
    assert not [k for k in env if k.startswith(ours)]
    assert "SLURM_CHAOS_NUMA_MISMATCH_APPLIED" not in env
    assert journal_lines(plugin, env["JOB"]) == []


def test_malformed_spec_refused_at_submission(plugin: PluginSandbox) -> None:
    queue_before = plugin.run(["squeue", "-h", "-o", "%i"]).stdout
    result = plugin.run(["sbatch", "--parsable", "--chaos=netem:delay=fast", "--wrap", "true"])
    assert result.returncode != 0
    assert "netem: delay: bad value 'fast'" in result.stderr
    assert not result.stdout.strip()  # no job id: nothing was submitted
    unknown = plugin.run(["sbatch", "--parsable", "--chaos=netem+bogus", "--wrap", "true"])
    assert unknown.returncode != 0 and "unknown fault 'bogus'" in unknown.stderr
    new_jobs = set(plugin.run(["squeue", "-h", "-o", "%i"]).stdout.split()) - set(queue_before.split())
    assert not new_jobs


def test_non_exclusive_job_refused_on_the_node_without_draining_it(plugin: PluginSandbox) -> None:
    out = plugin.shared_dir / f"spank-refused-{uuid.uuid4().hex[:8]}.out"
    result = plugin.run(
        [
            "sbatch",
            "--wait",
            "-N1",
            "-n1",
            "--chaos=nccl-degrade:ib=off",
            "-o",
            str(out),
            "--wrap",
            "echo SHOULD-NOT-RUN",
        ]
    )
    assert result.returncode != 0
    text = out.read_text()
    assert "does not hold its nodes exclusively" in text and "--exclusive" in text
    assert "SHOULD-NOT-RUN" not in text
    assert not [n for n, state in node_states(plugin).items() if state.startswith("drain")]
    srun = plugin.run(["srun", "-N1", "-n1", "--chaos=nccl-degrade:ib=off", "echo", "SHOULD-NOT-RUN"])
    assert srun.returncode != 0
    assert "SHOULD-NOT-RUN" not in srun.stdout
    assert "does not hold its nodes exclusively" in srun.stderr


@pytest.fixture
def unprivileged_user() -> Iterator[str]:
    name = f"chaos{uuid.uuid4().hex[:6]}"
    created = SubprocessRunner()(["useradd", "-M", "-s", "/bin/sh", name], timeout=30)
    if not created.ok:
        pytest.skip(f"useradd failed: {created.stderr.strip()}")
    try:
        yield name
    finally:
        SubprocessRunner()(["userdel", name], timeout=30)


def test_unprivileged_user_refused_at_submission(plugin: PluginSandbox, unprivileged_user: str) -> None:
    env = {"SLURM_CONF": plugin.env["SLURM_CONF"], "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    argv = [
        "runuser",
        "-u",
        unprivileged_user,
        "--",
        "env",
        *(f"{k}={v}" for k, v in env.items()),
        "sbatch",
        "--parsable",
        "--chdir=/tmp",
        "--chaos=nccl-degrade:ib=off",
        "--wrap",
        "true",
    ]
    result = plugin.run(argv)
    assert result.returncode != 0
    assert f"user '{unprivileged_user}'" in result.stderr
    assert "may not inject faults (not in allow_users)" in result.stderr
    assert not result.stdout.strip()


def test_prolog_hooks_receive_the_canonical_spec(plugin: PluginSandbox, sandbox) -> None:  # type: ignore[no-untyped-def]
    """The node-level faults are applied by prolog hooks: they read SPANK_SLURM_CHAOS_SPEC."""
    hooks = Path(sandbox.slurm_conf).parent / "prolog.d"
    if not hooks.is_dir():
        pytest.skip("this sandbox has no prolog.d")
    dump = plugin.shared_dir / f"prolog-env-{uuid.uuid4().hex[:8]}"
    probe = hooks / f"99-spank-test-{uuid.uuid4().hex[:6]}"
    probe.write_text(f'#!/bin/sh\necho "$SPANK_SLURM_CHAOS_SPEC" > {dump}.$SLURM_JOB_ID\n')
    probe.chmod(0o755)
    try:
        result = plugin.run(
            [
                "sbatch",
                "--wait",
                "--parsable",
                "--exclusive",
                "-N1",
                "--chaos=netem:delay=5ms",
                "-o",
                "/dev/null",
                "--wrap",
                "true",
            ]
        )
        assert result.ok, result.stderr
        job = result.stdout.strip().split(";")[0]
        assert Path(f"{dump}.{job}").read_text().strip() == "netem:delay=0.005s"
    finally:
        probe.unlink()


def test_unwritable_journal_refuses_instead_of_injecting(plugin: PluginSandbox) -> None:
    blocker = plugin.shared_dir / f"not-a-dir-{uuid.uuid4().hex[:6]}"
    blocker.write_text("a file where the journal directory should be\n")
    broken = dataclasses.replace(plugin.args, journal_dir=str(blocker / "journal"))
    update_plugstack(plugin.plugstack, plugstack_line(plugin.plugin_path, broken))
    try:
        result = plugin.run(
            ["srun", "-N1", "--exclusive", "--chaos=nccl-degrade:ib=off", "printenv", "NCCL_IB_DISABLE"]
        )
        assert result.returncode != 0
        assert "cannot write the journal" in result.stderr
        assert "1" not in result.stdout.split()
        plain = plugin.run(["srun", "-N1", "--exclusive", "true"])
        assert plain.ok, plain.stderr  # jobs without --chaos are not affected
    finally:
        update_plugstack(plugin.plugstack, plugstack_line(plugin.plugin_path, plugin.args))
        blocker.unlink()


def test_node_rechecks_a_spec_that_bypassed_srun(plugin: PluginSandbox) -> None:
    """The option can reach slurmstepd without srun's check (its internal env variable, or a
    submit host with another catalogue): the node parses it again and refuses what it cannot read."""
    bypass = {"_SLURM_SPANK_OPTION_slurm_chaos_chaos": "bogus"}
    result = plugin.run(["srun", "-N1", "--exclusive", "echo", "SHOULD-NOT-RUN"], env=bypass)
    assert result.returncode != 0
    assert "SHOULD-NOT-RUN" not in result.stdout
    assert "refused --chaos: bad chaos SPEC 'bogus': unknown fault 'bogus'" in result.stderr


def test_account_rule_refuses_on_the_node_and_inside_an_allocation(plugin: PluginSandbox) -> None:
    strict = dataclasses.replace(plugin.args, allow_accounts=("no-such-account",))
    update_plugstack(plugin.plugstack, plugstack_line(plugin.plugin_path, strict))
    out = plugin.shared_dir / f"spank-account-{uuid.uuid4().hex[:8]}.out"
    try:
        # srun creating its allocation: the account is only known on the node.
        alone = plugin.run(
            ["srun", "-N1", "--exclusive", "--chaos=nccl-degrade:ib=off", "echo", "SHOULD-NOT-RUN"]
        )
        assert alone.returncode != 0 and "SHOULD-NOT-RUN" not in alone.stdout
        assert "account 'root' is not in allow_accounts" in alone.stderr
        # srun inside an allocation: refused by srun itself, before the step exists.
        inner = plugin.run(
            [
                "sbatch",
                "--wait",
                "-N1",
                "--exclusive",
                "-o",
                str(out),
                "--wrap",
                "srun --chaos=nccl-degrade:ib=off echo SHOULD-NOT-RUN; echo srun-exit=$?",
            ]
        )
        text = out.read_text()
        assert "srun: error: slurm-chaos: refused --chaos=nccl-degrade:ib=off: account 'root'" in text
        assert "SHOULD-NOT-RUN" not in text and "srun-exit=0" not in text
        assert inner.returncode == 0  # the job itself (without --chaos) ran
    finally:
        update_plugstack(plugin.plugstack, plugstack_line(plugin.plugin_path, plugin.args))
