"""Who may inject, on the real sandbox, tried by unprivileged users: only the policy decides.

chaosok is allowed by the policy, chaosno is not. Both may bring their own SLURM_CONF and
plugstack.conf, with a SPANK plugin of their own that puts any SPEC in the job's SPANK
environment (what libslurm, pyslurm or slurmrestd let any user do too). A fault reached the node
when a new rollback journal appears (every applied change is journalled first), or when the job
sees our qdisc (a handle of ours, ``node_net.qdisc_handle``). After each test every node is as it
was: qdiscs, mounts, cgroups, processes, node state.

The policy, the plugin's plugstack.conf line and the prolog/epilog hooks are installed for this
module and the previous files restored afterwards; the users are tests/conftest.py's
``sandbox_users``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from nodecgroups import leftover_cgroups

from slurm_chaos.faults import node_proc
from slurm_chaos.faults.install_hooks import HOOK_NAME, install_hooks
from slurm_chaos.faults.node_base import MARKER_ENV
from slurm_chaos.faults.node_net import qdisc_handle
from slurm_chaos.faults.plugin_install import (
    JOB_SUBMIT_LUA,
    PluginArgs,
    build_plugin,
    plugstack_line,
    render_job_submit,
    update_plugstack,
)
from slurm_chaos.faults.policy import POLICY_NAME, Policy, write_policy
from slurm_chaos.runner import Completed, SubprocessRunner

if TYPE_CHECKING:
    from tests.conftest import SandboxUser

pytestmark = pytest.mark.sandbox

TIMEOUT = 120
USERS = ("chaosok", "chaosno")
SPEC = "netem:rate=1M"  # a tbf qdisc: needs no sch_netem in the kernel
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

# The attacker's SPANK plugin: puts its argument in the job's SPANK environment as SLURM_CHAOS_SPEC,
# as slurm-chaos's plugin does for an accepted --chaos, whatever any policy says.
FORGE_C = r"""
#include <stdint.h>
#include <slurm/spank.h>
SPANK_PLUGIN(forge, 1);
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	if (ac > 0 && spank_context() != S_CTX_REMOTE)
		spank_job_control_setenv(sp, "SLURM_CHAOS_SPEC", av[0], 1);
	return 0;
}
"""


@dataclass(frozen=True)
class Authz:
    """The sandbox with the policy, the plugin and the hooks installed for this module."""

    env: dict[str, str]
    root: Path
    etc: Path
    journal_root: Path
    audit_log: Path
    nodes: tuple[str, ...]
    users: dict[str, SandboxUser]
    policy: Policy

    def run(self, argv: Sequence[str], env: dict[str, str] | None = None) -> Completed:
        return SubprocessRunner()(argv, timeout=TIMEOUT, env={**self.env, **(env or {})})

    def as_user(self, user: str, *command: str, own_conf: bool = False) -> Completed:
        """`command` run by `user` in their home, with the sandbox's or their own SLURM_CONF."""
        u = self.users[user]
        env = {
            "PATH": SYSTEM_PATH,
            "HOME": str(u.home),
            "SLURM_CONF": str(u.home / "slurm.conf") if own_conf else self.env["SLURM_CONF"],
            **{k: v for k, v in self.env.items() if k.endswith("_RESERVATION")},
        }
        argv = u.argv("sh", "-c", 'cd "$HOME" && exec "$@"', "sh", *command, env=env)
        return SubprocessRunner()(argv, timeout=TIMEOUT)

    def set_policy(self, policy: Policy) -> None:
        write_policy(self.etc / POLICY_NAME, policy)

    # --------------------------------------------------------------------- what changed

    def journals(self) -> set[Path]:
        return set(self.journal_root.glob("*/*.jsonl")) if self.journal_root.is_dir() else set()

    def slurmd_pid(self, node: str) -> int:
        return int((self.root / "run" / f"slurmd.{node}.pid").read_text().split()[0])

    def snapshot(self, node: str) -> dict[str, object]:
        """What a fault may change on a node, read from inside its namespaces."""
        pid = self.slurmd_pid(node)
        tc = ["nsenter", "-t", str(pid), "-n", "--", "tc", "qdisc", "show", "dev", "eth0"]
        qdisc = self.run(tc).stdout
        mounts = sorted(
            " ".join(line.split()[3:5]) for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        )
        net = node_proc.ns_inode(pid, "net")
        marked, tasks = [], []
        for p in node_proc.pids():
            if node_proc.ns_inode(p, "net") != net:
                continue
            env = node_proc.environ(p)
            if MARKER_ENV in env:
                marked.append(p)
            if "SLURM_JOB_ID" in env and "SLURM_STEP_ID" in env:
                tasks.append(p)
        cgroups = leftover_cgroups(self.root.name, node)
        deadline = time.monotonic() + 60
        while True:  # a node stays mixed/completing for a moment after its last job
            state = self.run(["sinfo", "-h", "-n", node, "-o", "%T"]).stdout.strip().rstrip("*")
            if state not in ("mixed", "completing", "allocated") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        return {
            "qdisc": qdisc,
            "mounts": mounts,
            "marked": marked,
            "tasks": tasks,
            "cgroups": cgroups,
            "state": "idle" if state == "reserved" else state,
        }

    def snapshots(self) -> dict[str, dict[str, object]]:
        return {n: self.snapshot(n) for n in self.nodes}

    def audit(self, job: str, since: float) -> list[str]:
        """The decisions the prologs logged for a job since a time ("granted" or "refused: why").

        Job ids start again at 1 when a sandbox is made anew; its logs are kept."""
        if not self.audit_log.exists():
            return []
        entries = [json.loads(line) for line in self.audit_log.read_text().splitlines()]
        mine = [e for e in entries if e["job_id"] == job and e["time"] >= since]
        return [e["decision"] + (f": {e['reason']}" if e["reason"] else "") for e in mine]

    def wait_gone(self, job: str) -> None:
        end = time.monotonic() + TIMEOUT
        while time.monotonic() < end:
            state = self.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip()
            if state in ("", "COMPLETED", "FAILED", "CANCELLED"):
                return
            time.sleep(0.3)
        raise AssertionError(f"job {job} still queued")


def _own_slurm_conf(user: SandboxUser, slurm_conf: Path, forge: Path) -> None:
    """The user's own client configuration: the cluster's, with a plugstack.conf of theirs."""
    plugstack = user.home / "plugstack.conf"
    plugstack.write_text(f"required {forge} {SPEC}\n")
    text = re.sub(r"(?m)^PlugStackConfig=.*$", f"PlugStackConfig={plugstack}", slurm_conf.read_text())
    (user.home / "slurm.conf").write_text(text)
    for path in (plugstack, user.home / "slurm.conf"):
        os.chown(path, user.uid, user.gid)


@pytest.fixture(scope="module")
def authz(sandbox, sandbox_users: dict[str, SandboxUser]) -> Iterator[Authz]:  # type: ignore[no-untyped-def]
    if shutil.which("cc") is None or not Path("/usr/include/slurm/spank.h").exists():
        pytest.skip("needs a C compiler and spank.h (libslurm-dev)")
    env = dict(sandbox.env)
    etc = Path(sandbox.slurm_conf).parent
    root = etc.parent
    config = SubprocessRunner()(["scontrol", "show", "config"], timeout=30, env=env).stdout
    if not re.search(r"JobSubmitPlugins\s*=\s*\S*lua", config):
        pytest.skip("this sandbox predates JobSubmitPlugins=lua: 'sandbox down' and up again")
    users = {name: sandbox_users[name] for name in USERS}
    plugstack, policy_path, lua = etc / "plugstack.conf", etc / POLICY_NAME, etc / JOB_SUBMIT_LUA
    hooks = [etc / f"{kind}.d" / HOOK_NAME for kind in ("prolog", "epilog")]
    saved = {p: p.read_text() if p.exists() else None for p in (plugstack, policy_path, lua, *hooks)}
    journal_root, audit_log = root / "journal", root / "log" / "slurm-chaos-audit.log"
    policy = Policy(allow_users=("chaosok",), allow_reservations=(sandbox.reservation,), job_interface="eth0")
    so = build_plugin(Path(sandbox.shared_dir) / "authz-test-prefix", SubprocessRunner())
    forge = Path(sandbox.shared_dir) / "users" / "forge.so"
    src = forge.with_suffix(".c")
    src.write_text(FORGE_C)
    cc = ["cc", "-shared", "-fPIC", "-o", str(forge), str(src)]
    built = subprocess.run(cc, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    forge.chmod(0o755)
    for user in users.values():
        _own_slurm_conf(user, Path(sandbox.slurm_conf), forge)
    write_policy(policy_path, policy)
    lua.write_text(render_job_submit(policy_path))  # slurmctld reloads it when it changes
    install_hooks(
        etc,
        sys.executable,
        journal_root=journal_root,
        log_file=root / "log" / "slurm-chaos-agent.log",
        audit_log=audit_log,
    )
    update_plugstack(plugstack, plugstack_line(so, PluginArgs(str(policy_path), str(journal_root))))
    try:
        yield Authz(env, root, etc, journal_root, audit_log, tuple(sandbox.nodes), users, policy)
    finally:
        for path, text in saved.items():
            if text is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(text)


@pytest.fixture
def unchanged(authz: Authz) -> Iterator[set[Path]]:
    """Every node as before the test; yields the journals that existed before it."""
    before = authz.snapshots()
    journals = authz.journals()
    yield journals
    authz.set_policy(authz.policy)
    end = time.monotonic() + 20  # an epilog may still be reverting when the job has left the queue
    while (after := authz.snapshots()) != before and time.monotonic() < end:
        time.sleep(0.5)
    changed = {n: {k: (v, after[n][k]) for k, v in s.items() if after[n][k] != v} for n, s in before.items()}
    assert after == before, {n: c for n, c in changed.items() if c}


def batch(authz: Authz, user: str, *sbatch: str, own_conf: bool = False) -> tuple[Completed, str, str]:
    """sbatch --wait of a job that prints its node's qdisc: (result, job id, output)."""
    out = authz.users[user].home / f"job-{uuid.uuid4().hex[:8]}.out"
    script = "tc qdisc show dev eth0; sleep 1"
    argv = ["sbatch", "--wait", "--parsable", "-o", str(out), *sbatch, "--wrap", script]
    res = authz.as_user(user, *argv, own_conf=own_conf)
    job = res.stdout.strip().split(";")[0]
    return res, job, out.read_text() if out.exists() else ""


def admin_marked(authz: Authz, *sbatch: str) -> tuple[str, Path]:
    """A held job of chaosok that an administrator gives the SPEC, released and run to its end."""
    out_path = authz.users["chaosok"].home / f"job-{uuid.uuid4().hex[:8]}.out"
    held = authz.as_user(
        "chaosok", "sbatch", "--parsable", "--hold", *sbatch, "-o", str(out_path), "--wrap",
        "tc qdisc show dev eth0",
    )  # fmt: skip
    assert held.ok, held.stderr
    job = held.stdout.strip()
    assert authz.run(["scontrol", "update", f"JobId={job}", f"AdminComment=slurm-chaos={SPEC}"]).ok
    assert authz.run(["scontrol", "release", job]).ok
    authz.wait_gone(job)
    return job, out_path


def assert_no_fault(authz: Authz, journals_before: set[Path], output: str = "") -> None:
    assert authz.journals() == journals_before, "a fault was journalled, so applied"
    assert not our_qdiscs(output), output


def our_qdiscs(output: str) -> list[str]:
    """The root qdiscs of slurm-chaos that `tc qdisc show` printed (node_net's handles, 4000:..7fff:)."""
    return re.findall(r"qdisc (?:tbf|netem) [4-7][0-9a-f]{3}: root", output)


# --------------------------------------------------------------------------------- positive control


def test_allowed_user_on_exclusive_nodes_gets_the_fault(authz: Authz, unchanged: set[Path]) -> None:
    """The control: the detection below does see a fault when the policy grants one."""
    start = time.time()
    res, job, out = batch(authz, "chaosok", "-N1", "--exclusive", f"--chaos={SPEC}")
    assert res.ok, res.stderr
    assert f"tbf {qdisc_handle(job)} root" in out, out
    assert authz.audit(job, start) == ["granted"]
    assert authz.journals() - unchanged


# --------------------------------------------------------------------------------- refused


def test_own_plugstack_conf_and_spank_job_env_grant_nothing(authz: Authz, unchanged: set[Path]) -> None:
    """chaosno's own SLURM_CONF loads their plugin, which puts the SPEC in the job's SPANK env."""
    res, job, out = batch(authz, "chaosno", "-N1", "--exclusive", own_conf=True)
    assert res.returncode != 0 and not job.isdigit(), res.stdout
    assert "user 'chaosno'" in res.stderr and "may not inject faults (not in allow_users)" in res.stderr
    assert_no_fault(authz, unchanged, out)


def test_salloc_without_a_step_gets_no_fault(authz: Authz, unchanged: set[Path]) -> None:
    """With PrologFlags=Alloc the prolog runs at allocation: no step, no slurmstepd ever checks."""
    res = authz.as_user("chaosno", "salloc", "-N1", "--exclusive", "sleep", "2", own_conf=True)
    assert res.returncode != 0 and "may not inject faults" in res.stderr
    assert_no_fault(authz, unchanged)


def test_user_not_in_the_policy_gets_no_fault(authz: Authz, unchanged: set[Path]) -> None:
    res, job, out = batch(authz, "chaosno", "-N1", "--exclusive", f"--chaos={SPEC}")
    assert res.returncode != 0 and not job.isdigit()
    assert "slurm-chaos: refused --chaos=netem:rate=1M: user 'chaosno'" in res.stderr
    assert_no_fault(authz, unchanged, out)


def test_allowed_user_without_exclusive_nodes_gets_no_fault(authz: Authz, unchanged: set[Path]) -> None:
    # Through their own plugstack.conf (no --chaos check in their client): slurmctld refuses.
    res, job, out = batch(authz, "chaosok", "-N1", "-n1", own_conf=True)
    assert res.returncode != 0 and "does not hold its nodes exclusively" in res.stderr
    assert_no_fault(authz, unchanged, out)
    # Marked by an administrator anyway: the prolog refuses it from slurmctld's facts.
    start = time.time()
    job, out_path = admin_marked(authz, "-N1", "-n1")
    assert authz.audit(job, start) == [
        "refused: the job does not hold its nodes exclusively (require_exclusive: submit with --exclusive)"
    ]
    assert_no_fault(authz, unchanged, out_path.read_text())


def test_array_tasks_get_no_fault_unless_the_policy_allows_them(authz: Authz, unchanged: set[Path]) -> None:
    res, _, _ = batch(authz, "chaosok", "-N1", "--exclusive", "--array=1-2", f"--chaos={SPEC}")
    assert res.returncode != 0 and "array jobs may not inject faults" in res.stderr
    assert_no_fault(authz, unchanged)
    authz.set_policy(dataclasses.replace(authz.policy, allow_arrays=True))
    out = authz.users["chaosok"].home / f"array-{uuid.uuid4().hex[:8]}-%a.out"
    res = authz.as_user(
        "chaosok", "sbatch", "--wait", "--parsable", "-N1", "--exclusive", "--array=1-2", f"--chaos={SPEC}",
        "-o", str(out), "--wrap", "tc qdisc show dev eth0",
    )  # fmt: skip
    assert res.ok, res.stderr
    for task in (1, 2):
        assert our_qdiscs(Path(str(out).replace("%a", str(task))).read_text())


def test_het_job_components_get_no_fault_unless_the_policy_allows_them(
    authz: Authz, unchanged: set[Path]
) -> None:
    het = ["-N1", "--exclusive", f"--chaos={SPEC}", ":", "-N1", "--exclusive"]
    res, _, _ = batch(authz, "chaosok", *het)
    assert res.returncode != 0 and "heterogeneous jobs may not inject faults" in res.stderr
    assert_no_fault(authz, unchanged)
    authz.set_policy(dataclasses.replace(authz.policy, allow_het_jobs=True))
    out = authz.users["chaosok"].home / f"het-{uuid.uuid4().hex[:8]}.out"
    res = authz.as_user(
        "chaosok", "sbatch", "--wait", "--parsable", "-o", str(out), *het, "--wrap",
        "srun --het-group=0,1 tc qdisc show dev eth0",
    )  # fmt: skip
    assert res.ok, res.stderr
    assert len(our_qdiscs(out.read_text())) == 2  # each component's node


@pytest.mark.parametrize("bad", ["missing", "malformed", "not root's", "writable by others"])
def test_a_bad_policy_refuses_every_fault(authz: Authz, unchanged: set[Path], bad: str) -> None:
    policy = authz.etc / POLICY_NAME
    if bad == "missing":
        policy.unlink()
    elif bad == "malformed":
        policy.write_text(policy.read_text() + "allow_users = everyone\n")
    elif bad == "not root's":
        os.chown(policy, authz.users["chaosno"].uid, authz.users["chaosno"].gid)
    else:
        policy.chmod(0o666)
    # The allowed user, with --chaos: refused by their sbatch; past that client (their own
    # plugstack.conf), by slurmctld.
    for argv, own_conf in (([f"--chaos={SPEC}"], False), ([], True)):
        res, _, out = batch(authz, "chaosok", "-N1", "--exclusive", *argv, own_conf=own_conf)
        assert res.returncode != 0 and "policy" in res.stderr
        assert_no_fault(authz, unchanged, out)
    # Marked by an administrator: the prolog refuses it.
    _, out_path = admin_marked(authz, "-N1", "--exclusive")
    assert_no_fault(authz, unchanged, out_path.read_text())
