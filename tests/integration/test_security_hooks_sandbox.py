"""The node hooks' own safety on the real sandbox (#27): a failed undo takes the node out of service.

A job of chaosok (allowed by the policy) gets ``netem:rate=1M`` from an administrator (the
AdminComment of a held job, as ``test_authz_sandbox.admin_marked`` does), while the test has put
something in the undo's way: in that node's mount namespace only, ``tc`` refuses to delete a
qdisc. Its epilog then cannot take the fault back, and the node must end DRAINED with the reason
``slurm-chaos: undo failed: ...`` instead of going back into service with the qdisc in place.
Afterwards the way is cleared, the journal reverted, the node resumed: every node as before.

The policy and the prolog/epilog hooks are installed for this module and the previous files
restored afterwards; the users are tests/conftest.py's ``sandbox_users``.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from slurm_chaos.faults.cleanup import cleanup
from slurm_chaos.faults.hooks import UNDO_FAILED
from slurm_chaos.faults.install_hooks import HOOK_NAME, install_hooks
from slurm_chaos.faults.journal import Journal
from slurm_chaos.faults.policy import POLICY_NAME, Policy, write_policy
from slurm_chaos.runner import Completed, SubprocessRunner

if TYPE_CHECKING:
    from tests.conftest import SandboxUser

pytestmark = pytest.mark.sandbox

TIMEOUT = 120
SPEC = "netem:rate=1M"  # a tbf qdisc: needs no sch_netem in the kernel
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
#: Stands in for tc in one node's mount namespace: everything passes through but deleting a qdisc.
BLOCKING_TC = """#!/bin/sh
case " $* " in
  *" del "*) echo "tc qdisc del blocked by the test" >&2; exit 2 ;;
esac
exec {real} "$@"
"""


@dataclass(frozen=True)
class Hooks:
    """The sandbox with the policy and the hooks installed for this module."""

    env: dict[str, str]
    root: Path
    journal_root: Path
    shared: Path
    nodes: tuple[str, ...]
    user: SandboxUser

    def run(self, argv: Sequence[str]) -> Completed:
        return SubprocessRunner()(argv, timeout=TIMEOUT, env=self.env)

    def as_user(self, *command: str) -> Completed:
        env = {
            "PATH": SYSTEM_PATH,
            "HOME": str(self.user.home),
            "SLURM_CONF": self.env["SLURM_CONF"],
            **{k: v for k, v in self.env.items() if k.endswith("_RESERVATION")},
        }
        argv = self.user.argv("sh", "-c", 'cd "$HOME" && exec "$@"', "sh", *command, env=env)
        return SubprocessRunner()(argv, timeout=TIMEOUT)

    def slurmd_pid(self, node: str) -> int:
        return int((self.root / "run" / f"slurmd.{node}.pid").read_text().split()[0])

    def in_node(self, node: str, *argv: str) -> Completed:
        """`argv` in the node's network and mount namespaces (where its hooks run)."""
        return self.run(["nsenter", "-t", str(self.slurmd_pid(node)), "-n", "-m", "--", *argv])

    def state(self, node: str) -> tuple[str, str]:
        """(state, reason) as sinfo shows them."""
        out = self.run(["sinfo", "-h", "-n", node, "-o", "%T|%E"]).stdout.strip()
        state, _, reason = out.partition("|")
        return state.rstrip("*"), reason

    def snapshot(self) -> dict[str, tuple[str, str]]:
        """Each node's qdisc on eth0 and its state (once it has left mixed/completing)."""
        out = {}
        for node in self.nodes:
            end = time.monotonic() + 60
            while (state := self.state(node)[0]) in ("mixed", "completing", "allocated"):
                if time.monotonic() > end:
                    break
                time.sleep(0.5)
            qdisc = self.in_node(node, "tc", "qdisc", "show", "dev", "eth0").stdout
            out[node] = (qdisc, "idle" if state == "reserved" else state)
        return out


@pytest.fixture(scope="module")
def hooks(sandbox, sandbox_users: dict[str, SandboxUser]) -> Iterator[Hooks]:  # type: ignore[no-untyped-def]
    if shutil.which("tc") is None or shutil.which("nsenter") is None:
        pytest.skip("needs tc and nsenter")
    env = dict(sandbox.env)
    etc = Path(sandbox.slurm_conf).parent
    root = etc.parent
    policy_path = etc / POLICY_NAME
    saved_paths = [policy_path, *(etc / f"{kind}.d" / HOOK_NAME for kind in ("prolog", "epilog"))]
    saved = {p: p.read_text() if p.exists() else None for p in saved_paths}
    policy = Policy(allow_users=("chaosok",), allow_reservations=(sandbox.reservation,), job_interface="eth0")
    write_policy(policy_path, policy)
    install_hooks(
        etc,
        sys.executable,
        journal_root=root / "journal",
        log_file=root / "log" / "slurm-chaos-agent.log",
        audit_log=root / "log" / "slurm-chaos-audit.log",
    )
    try:
        shared, user = Path(sandbox.shared_dir), sandbox_users["chaosok"]
        yield Hooks(env, root, root / "journal", shared, tuple(sandbox.nodes), user)
    finally:
        for path, text in saved.items():
            if text is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(text)


@contextlib.contextmanager
def blocked_tc(hooks: Hooks) -> Iterator[str]:
    """A node where `tc qdisc del` fails (in its mount namespace only): yields its name, and clears
    the way on leaving."""
    node = hooks.nodes[0]
    real_tc = shutil.which("tc", path=SYSTEM_PATH)
    assert real_tc is not None
    way = hooks.shared / f"blocked-tc-{uuid.uuid4().hex[:8]}"
    way.mkdir(mode=0o755)
    shutil.copy2(real_tc, way / "real-tc")
    (way / "tc").write_text(BLOCKING_TC.format(real=way / "real-tc"))
    (way / "tc").chmod(0o755)
    bound = hooks.in_node(node, "mount", "--bind", str(way / "tc"), str(Path(real_tc).resolve()))
    assert bound.ok, bound.stderr
    try:
        assert "blocked" in hooks.in_node(node, "tc", "qdisc", "del", "dev", "lo", "root").stderr
        yield node
    finally:
        hooks.in_node(node, "umount", str(Path(real_tc).resolve()))
        shutil.rmtree(way, ignore_errors=True)


def _admin_marked_job(hooks: Hooks, node: str) -> str:
    """A held job of chaosok on `node` that an administrator gives the SPEC, released and run to its end."""
    out = hooks.user.home / f"job-{uuid.uuid4().hex[:8]}.out"
    held = hooks.as_user(
        "sbatch", "--parsable", "--hold", "-N1", "--exclusive", "-w", node, "-o", str(out), "--wrap",
        "tc qdisc show dev eth0; sleep 1",
    )  # fmt: skip
    assert held.ok, held.stderr
    job = held.stdout.strip().split(";")[0]
    assert hooks.run(["scontrol", "update", f"JobId={job}", f"AdminComment=slurm-chaos={SPEC}"]).ok
    assert hooks.run(["scontrol", "release", job]).ok
    end = time.monotonic() + TIMEOUT
    while hooks.run(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip() not in ("", "COMPLETED"):
        assert time.monotonic() < end, f"job {job} still queued"
        time.sleep(0.3)
    assert "tbf cafe:" in out.read_text(), "the fault never reached the job: nothing to undo"
    return job


def test_a_failed_undo_drains_the_node_with_the_reason(hooks: Hooks) -> None:
    before = hooks.snapshot()
    with blocked_tc(hooks) as node:
        job = _admin_marked_job(hooks, node)
        end = time.monotonic() + TIMEOUT
        while (now := hooks.state(node))[0] not in ("drained", "drain", "draining"):
            assert time.monotonic() < end, f"{node} not drained after the failed undo: {now}"
            time.sleep(0.5)
        reason = now[1]
        assert reason.startswith(f"{UNDO_FAILED}: {node} job {job} netem"), reason
        assert "tc qdisc del dev eth0 root" in reason and "(and" not in reason, reason
        log = (hooks.root / "log" / "slurm-chaos-agent.log").read_text()
        assert f"{reason}: draining {node}" in log and "tc qdisc del blocked by the test" in log
        assert Journal(hooks.journal_root, node, job).read().pending(), "the change stays for a later undo"
        assert "tbf cafe:" in hooks.in_node(node, "tc", "qdisc", "show", "dev", "eth0").stdout
    # The way cleared: the undo goes through from here, and the administrator resumes the node.
    done = cleanup(hooks.journal_root, [node], SubprocessRunner(), job_running=lambda _job: False)
    assert done and not any(o.failed for o in done), done
    assert hooks.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"]).ok
    end = time.monotonic() + 30
    while (after := hooks.snapshot()) != before and time.monotonic() < end:
        time.sleep(0.5)
    assert after == before
