"""The SPANK plugin on the real sandbox cluster: effects inside the job, refusals, no-op path.

For this module only (the previous files are restored afterwards) the plugin is built and
registered in the sandbox's plugstack.conf, the policy lets root inject in the maintenance
reservation on exclusive nodes, and the prolog/epilog hooks are installed: in slurmstepd the
plugin acts only on the prolog's grant. slurmstepd and srun/sbatch read plugstack.conf at each
start, and slurmctld re-reads job_submit.lua and the policy, so no daemon restart is needed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_chaos.faults import load_catalogue
from slurm_chaos.faults.install_hooks import HOOK_NAME, install_hooks
from slurm_chaos.faults.journal import Journal
from slurm_chaos.faults.plugin_install import PluginArgs, build_plugin, plugstack_line, update_plugstack
from slurm_chaos.faults.policy import POLICY_NAME, Policy, write_policy
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
    policy: Policy

    def run(self, argv: Sequence[str], env: dict[str, str] | None = None) -> Completed:
        return SubprocessRunner()(argv, timeout=TIMEOUT, env={**self.env, **(env or {})})

    def set_policy(self, policy: Policy) -> None:
        write_policy(Path(self.args.policy), policy)


def _saved(paths: Sequence[Path]) -> dict[Path, str | None]:
    return {p: p.read_text() if p.exists() else None for p in paths}


def _restore(saved: dict[Path, str | None]) -> None:
    for path, text in saved.items():
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)


@pytest.fixture(scope="module")
def plugin(sandbox) -> Iterator[PluginSandbox]:  # type: ignore[no-untyped-def]
    etc = Path(sandbox.slurm_conf).parent
    plugstack, policy_path = etc / "plugstack.conf", etc / POLICY_NAME
    hooks = [etc / f"{kind}.d" / HOOK_NAME for kind in ("prolog", "epilog")]
    saved = _saved([plugstack, policy_path, *hooks])
    prefix = Path(sandbox.shared_dir) / "spank-test-prefix"
    journal_dir = Path(sandbox.shared_dir) / f"journal-{uuid.uuid4().hex[:8]}"
    so = build_plugin(prefix, SubprocessRunner())
    args = PluginArgs(policy=str(policy_path), journal_dir=str(journal_dir))
    policy = Policy(
        allow_users=("root",),
        allow_reservations=(sandbox.reservation,),
        require_exclusive=True,
        job_interface="eth0",
    )
    write_policy(policy_path, policy)
    install_hooks(
        etc,
        sys.executable,
        journal_root=journal_dir,
        log_file=etc.parent / "log" / "slurm-chaos-agent.log",
        audit_log=etc.parent / "log" / "slurm-chaos-audit.log",
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
            policy,
        )
    finally:
        _restore(saved)


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


def test_non_exclusive_job_refused_at_submission_and_on_the_node(plugin: PluginSandbox) -> None:
    queue_before = set(plugin.run(["squeue", "-h", "-o", "%i"]).stdout.split())
    # slurmctld's job_submit.lua refuses it: the job never exists.
    for argv in (
        [
            "sbatch",
            "--parsable",
            "-N1",
            "-n1",
            "--chaos=nccl-degrade:ib=off",
            "--wrap",
            "echo SHOULD-NOT-RUN",
        ],
        ["srun", "-N1", "-n1", "--chaos=nccl-degrade:ib=off", "echo", "SHOULD-NOT-RUN"],
    ):
        result = plugin.run(argv)
        assert result.returncode != 0 and "SHOULD-NOT-RUN" not in result.stdout
        assert "does not hold its nodes exclusively" in result.stderr and "--exclusive" in result.stderr
    assert set(plugin.run(["squeue", "-h", "-o", "%i"]).stdout.split()) <= queue_before
    # Marked anyway by an administrator (AdminComment), the prolog refuses it from slurmctld's facts,
    # and its steps are refused on the node: tasks exit before exec, the node is not drained.
    out = plugin.shared_dir / f"spank-refused-{uuid.uuid4().hex[:8]}.out"
    held = plugin.run(
        [
            "sbatch", "--parsable", "--hold", "-N1", "-n1", "-o", str(out), "--wrap",
            "srun --chaos=nccl-degrade:ib=off echo SHOULD-NOT-RUN; echo srun-exit=$?",
        ]
    )  # fmt: skip
    assert held.ok, held.stderr
    job = held.stdout.strip()
    assert plugin.run(
        ["scontrol", "update", f"JobId={job}", "AdminComment=slurm-chaos=nccl-degrade:ib=off"]
    ).ok
    assert plugin.run(["scontrol", "release", job]).ok
    wait_gone(plugin, job)
    text = out.read_text()
    assert "does not hold its nodes exclusively" in text and "SHOULD-NOT-RUN" not in text
    assert "srun-exit=0" not in text
    assert not [n for n, state in node_states(plugin).items() if state.startswith("drain")]


def wait_gone(plugin: PluginSandbox, job: str) -> None:
    end = time.monotonic() + TIMEOUT
    while time.monotonic() < end:
        state = plugin.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip()
        if state in ("", "COMPLETED", "FAILED", "CANCELLED"):
            return
        time.sleep(0.3)
    raise AssertionError(f"job {job} still queued")


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


def test_slurmctld_records_the_canonical_spec_and_the_prolog_grants_it(plugin: PluginSandbox) -> None:
    """job_submit.lua puts the canonical SPEC in the job's AdminComment, which only an administrator
    can set; the prolog grants that, never the job's own SPANK_SLURM_CHAOS_SPEC."""
    start = time.time()
    result = plugin.run(
        [
            "sbatch", "--wait", "--parsable", "--exclusive", "-N1", "--chaos=nccl-degrade:channels=2",
            "-o", "/dev/null", "--wrap", "true",
        ]
    )  # fmt: skip
    assert result.ok, result.stderr
    job = result.stdout.strip().split(";")[0]
    comment = plugin.run(["squeue", "-h", "-t", "all", "-j", job, "-O", "admin_comment:|"]).stdout
    assert comment.strip().rstrip("|") == "slurm-chaos=nccl-degrade:channels=2"
    audit = Path(plugin.args.policy).parent.parent / "log" / "slurm-chaos-audit.log"
    entries = [json.loads(line) for line in audit.read_text().splitlines()]
    mine = [e for e in entries if e["job_id"] == job and e["time"] >= start]  # ids repeat in a new sandbox
    assert [(e["decision"], e["spec"], e["user"], e["exclusive"]) for e in mine] == [
        ("granted", "nccl-degrade:channels=2", "root", True)
    ]


def test_unwritable_journal_refuses_instead_of_injecting(plugin: PluginSandbox) -> None:
    node = plugin.nodes[0]
    held = plugin.run(
        [
            "sbatch", "--parsable", "--hold", "-N1", "--exclusive", "-w", node, "--chaos=nccl-degrade:ib=off",
            "-o", str(plugin.shared_dir / "spank-unwritable-%j.out"), "--wrap", "printenv NCCL_IB_DISABLE",
        ]
    )  # fmt: skip
    assert held.ok, held.stderr
    job = held.stdout.strip()
    blocker = plugin.journal_dir / node / f"{job}.jsonl"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.symlink_to("/nonexistent/journal")  # the plugin never writes through a symlink
    try:
        assert plugin.run(["scontrol", "release", job]).ok
        wait_gone(plugin, job)
        text = (plugin.shared_dir / f"spank-unwritable-{job}.out").read_text()
        assert "cannot write the journal" in text
        assert "1" not in text.split()
        plain = plugin.run(["srun", "-N1", "--exclusive", "true"])
        assert plain.ok, plain.stderr  # jobs without --chaos are not affected
    finally:
        blocker.unlink()


def test_node_rechecks_a_spec_that_bypassed_srun(plugin: PluginSandbox) -> None:
    """The option can reach slurmstepd without srun's check (its internal env variable, or a
    submit host with another catalogue): the node parses it again and refuses what it cannot read."""
    bypass = {"_SLURM_SPANK_OPTION_slurm_chaos_chaos": "bogus"}
    result = plugin.run(["srun", "-N1", "--exclusive", "echo", "SHOULD-NOT-RUN"], env=bypass)
    assert result.returncode != 0
    assert "SHOULD-NOT-RUN" not in result.stdout
    assert "refused --chaos: bad chaos SPEC 'bogus': unknown fault 'bogus'" in result.stderr
    # What the user typed reaches the logs as one line, without control characters.
    forged = {"_SLURM_SPANK_OPTION_slurm_chaos_chaos": "bo\ngus\x1b[2J"}
    result = plugin.run(["srun", "-N1", "--exclusive", "true"], env=forged)
    assert result.returncode != 0 and "bad chaos SPEC 'bo?gus?[2J'" in result.stderr


def test_account_rule_refuses_on_the_node_and_inside_an_allocation(plugin: PluginSandbox) -> None:
    plugin.set_policy(dataclasses.replace(plugin.policy, allow_accounts=("no-such-account",)))
    out = plugin.shared_dir / f"spank-account-{uuid.uuid4().hex[:8]}.out"
    try:
        # srun creating its allocation: the default account is only known once the job exists,
        # so the prolog refuses it from slurmctld's record, and the node refuses the step.
        alone = plugin.run(
            ["srun", "-N1", "--exclusive", "--chaos=nccl-degrade:ib=off", "echo", "SHOULD-NOT-RUN"]
        )
        assert alone.returncode != 0 and "SHOULD-NOT-RUN" not in alone.stdout
        assert "account 'root' is not in allow_accounts" in alone.stderr
        # srun inside an allocation: srun cannot know the job's account (its environment is the
        # user's), so the node refuses the step: the prolog granted this job nothing.
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
        # Refused on the node by the prolog's grant (the job was granted nothing), never decided
        # from SLURM_JOB_ACCOUNT in srun's environment, which the user sets as they like.
        assert "refused --chaos=nccl-degrade:ib=off: the prolog granted job" in text, text
        assert "srun: error: slurm-chaos: refused --chaos=nccl-degrade:ib=off: account" not in text
        assert "SHOULD-NOT-RUN" not in text and "srun-exit=0" not in text
        assert inner.returncode == 0  # the job itself (without --chaos) ran
    finally:
        plugin.set_policy(plugin.policy)
