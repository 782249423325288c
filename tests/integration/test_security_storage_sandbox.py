"""What a job may write on its node, tried by unprivileged users on the real sandbox (issue #27,
findings 1 and 4): the node is as before after the job, whatever the job did with it.

1. The control channel of a switchback job: the job's user hard-links the request into its home
   and fallocates a gigabyte through it. The journal's filesystem must not lose that space, and
   nothing of the user's may outlive the job there.
2. The job's heartbeat directory: 3,000 nested directories, thousands of files and a large file.
   The epilog must take it all back (no RecursionError, within the hook's timeout), leaving no
   directory and no mount, on the node or on the host where the exporter reads heartbeats.

The policy (chaosok allowed, shared nodes), the prolog/epilog hooks and the heartbeat hooks are
installed for this module; the files they replace are put back afterwards.
"""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from slurm_chaos.faults import jobfs
from slurm_chaos.faults.authz import SPEC_MARK
from slurm_chaos.faults.cleanup import cleanup
from slurm_chaos.faults.install_hooks import HOOK_NAME, install_hooks
from slurm_chaos.faults.journal import Journal
from slurm_chaos.faults.policy import POLICY_NAME, Policy, write_policy
from slurm_chaos.observe.healthcheck import HEARTBEAT_HOOK_NAME, install_heartbeat_hooks
from slurm_chaos.runner import Completed, SubprocessRunner
from slurm_chaos.sandbox.monitoring import sandbox_heartbeat_dir

if TYPE_CHECKING:
    from tests.conftest import SandboxUser

pytestmark = pytest.mark.sandbox

TIMEOUT = 120
USER_PY = "/usr/bin/python3"
MiB = 1024 * 1024
#: What the channel attack tries to take from the journal's filesystem, and the noise allowed
#: (other work on this machine writes to the same filesystem meanwhile).
GRAB = 1024 * MiB
FREE_MARGIN = 256 * MiB
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED"}

# As the job's user, in the batch step: keep the channel's request past the job, and grow it.
CHANNEL_ATTACK = r"""
import os, sys, time
request, keep, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
deadline = time.time() + 30
while not os.path.exists(request) and time.time() < deadline:
    time.sleep(0.1)
try:
    os.link(request, keep)
    print("LINK=made", flush=True)
    target = keep
except OSError as exc:
    print(f"LINK=refused errno={exc.errno}", flush=True)
    target = request
for path in (target, request):
    try:
        fd = os.open(path, os.O_WRONLY)
        os.posix_fallocate(fd, 0, size)
        os.close(fd)
        print(f"GROWN={path}", flush=True)
    except OSError as exc:
        print(f"GROW=refused errno={exc.errno}", flush=True)
"""

# As the job's user, in the batch step: a heartbeat, then a tree no recursion can remove, many
# files and a large one, all in the job's own heartbeat directory.
HEARTBEAT_ATTACK = r"""
import json, os, sys, time
d, go = sys.argv[1], sys.argv[2]
job = os.environ["SLURM_JOB_ID"]
with open(f"{d}/{job}.0.json", "w") as fh:
    json.dump({"job_id": job, "rank": 0}, fh)
deadline = time.time() + 60
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.1)
top = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
fd, depth = os.dup(top), 0
try:
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd, depth = child, depth + 1
except OSError as exc:
    print(f"MKDIR errno={exc.errno}", flush=True)
written = 0
try:
    with open(f"{d}/big", "wb") as fh:
        for _ in range(64):
            fh.write(b"\0" * (1 << 20))
            fh.flush()
            written += 1 << 20
except OSError as exc:
    print(f"BIG errno={exc.errno}", flush=True)
files = 0
try:
    for i in range(20000):
        os.close(os.open(f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=top))
        files += 1
except OSError as exc:
    print(f"FILES errno={exc.errno}", flush=True)
print(f"DEPTH={depth} FILES={files} BIG={written}", flush=True)
"""


@dataclass(frozen=True)
class Node:
    """The sandbox with the hooks installed, as far as these tests look at it."""

    env: dict[str, str]
    root: Path
    journal_root: Path
    heartbeats: Path

    def run(self, argv: Sequence[str], timeout: float = TIMEOUT) -> Completed:
        return SubprocessRunner()(argv, timeout=timeout, env=self.env)

    def slurmd_pid(self, node: str) -> int:
        return int((self.root / "run" / f"slurmd.{node}.pid").read_text().split()[0])

    def in_node(self, node: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Completed:
        enter = ["nsenter", "-t", str(self.slurmd_pid(node)), "-n", "-m", "-u", "--"]
        pairs = [f"{k}={v}" for k, v in (env or {}).items()]
        return SubprocessRunner()([*enter, "env", *pairs, *argv], timeout=60)

    def submit(self, user: SandboxUser, script: str, spec: str | None, *sbatch: str) -> str:
        name = uuid.uuid4().hex[:8]
        path = user.home / f"job-{name}.sh"
        path.write_text("#!/bin/bash\n" + script)
        os.chown(path, user.uid, user.gid)
        out = user.home / f"job-{name}.out"
        keep = ("SLURM_CONF", "SBATCH_RESERVATION", "PATH")
        argv = ["sbatch", "--parsable", "--hold", "-o", str(out), "-D", str(user.home), *sbatch, str(path)]
        res = self.run(user.argv(*argv, env={k: self.env[k] for k in keep if k in self.env}))
        assert res.ok, res.stderr
        job = res.stdout.strip().split(";")[0]
        if spec:
            marked = self.run(["scontrol", "update", f"JobId={job}", f"AdminComment={SPEC_MARK}{spec}"])
            assert marked.ok, marked.stderr
        assert self.run(["scontrol", "release", job]).ok
        return job

    def output(self, job: str) -> str:
        m = re.search(r"StdOut=(\S+)", self.run(["scontrol", "show", "job", job]).stdout)
        assert m
        path = Path(m.group(1))
        return path.read_text() if path.exists() else ""

    def wait_ended(self, job: str, node: str) -> None:
        """Until slurmctld says the job ended and its node finished the epilog."""
        end = time.monotonic() + TIMEOUT
        while time.monotonic() < end:
            res = self.run(["scontrol", "-o", "show", "job", job])
            m = re.search(r"JobState=(\S+)", res.stdout)
            ended = m.group(1) in ENDED if m else "Invalid job id" in res.stderr
            state = self.run(["sinfo", "-h", "-n", node, "-o", "%T"]).stdout.strip().rstrip("*")
            if ended and state in ("idle", "reserved"):
                return
            time.sleep(0.5)
        raise AssertionError(f"job {job} on {node} never ended")

    def mounts(self, node: str) -> list[str]:
        """The node's mounts (root and mount point), as its own namespace sees them."""
        info = Path(f"/proc/{self.slurmd_pid(node)}/mountinfo").read_text()
        return sorted(" ".join(line.split()[3:5]) for line in info.splitlines())

    def free(self) -> int:
        st = os.statvfs(self.journal_root)
        return st.f_bavail * st.f_frsize


def _user_blocks(root: Path, uid: int, dev: int) -> int:
    """Bytes allocated to files of `uid` below `root` on device `dev` (the journal's filesystem)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if st.st_uid == uid and st.st_dev == dev:
                total += st.st_blocks * 512
    return total


@pytest.fixture(scope="module")
def node(sandbox) -> Iterator[Node]:  # type: ignore[no-untyped-def]
    etc = Path(sandbox.slurm_conf).parent
    root = etc.parent
    journal_root = root / "journal"
    heartbeats = sandbox_heartbeat_dir(sandbox.name)
    policy = etc / POLICY_NAME
    saved_policy = policy.read_text() if policy.exists() else None
    hooks = [
        etc / f"{kind}.d" / name for kind in ("prolog", "epilog") for name in (HOOK_NAME, HEARTBEAT_HOOK_NAME)
    ]
    saved = {h: (h.read_bytes(), h.stat().st_mode) for h in hooks if h.exists()}
    write_policy(policy, Policy(allow_users=("root", "chaosok"), require_exclusive=False))
    install_hooks(
        etc,
        sys.executable,
        journal_root=journal_root,
        log_file=root / "log" / "slurm-chaos-agent.log",
        audit_log=root / "log" / "slurm-chaos-audit.log",
        deadline_s=600,
    )
    install_heartbeat_hooks(etc, heartbeats)
    try:
        yield Node(dict(sandbox.env), root, journal_root, heartbeats)
    finally:
        for hook in hooks:
            if hook in saved:
                hook.write_bytes(saved[hook][0])
                hook.chmod(saved[hook][1])
            else:
                hook.unlink(missing_ok=True)
        if saved_policy is None:
            policy.unlink(missing_ok=True)
        else:
            policy.write_text(saved_policy)


def test_a_jobs_channel_request_cannot_take_space_from_the_journals_filesystem(
    node: Node, sandbox_users: dict[str, SandboxUser]
) -> None:
    user = sandbox_users["chaosok"]
    (user.home / "attack.py").write_text(CHANNEL_ATTACK)
    keep = user.home / f"keep-{uuid.uuid4().hex[:8]}"
    dev = os.stat(node.journal_root).st_dev
    assert os.stat(user.home).st_dev == dev  # the link would be on the journal's filesystem
    before_mounts, before_blocks, before_free = (
        node.mounts("node1"),
        _user_blocks(node.root, user.uid, dev),
        node.free(),
    )
    request = f'"{node.journal_root}/node1/$SLURM_JOB_ID.control/request"'
    script = f"{USER_PY} {user.home}/attack.py {request} {keep} {GRAB}\n"
    job = node.submit(user, script, "slow-node:node=0,percent=20,control=switchback", "-N1", "-w", "node1")
    try:
        node.wait_ended(job, "node1")
        out = node.output(job)
        assert "GROWN" not in out, out
        assert "LINK=" in out and "GROW=refused" in out, out
        state = Journal(node.journal_root, "node1", job).read()
        assert state.closed and not state.pending(), node.journal_root / "node1" / f"{job}.jsonl"
        # Nothing of the user's holds space on the journal's filesystem, and the space is still free.
        grown = _user_blocks(node.root, user.uid, dev) - before_blocks
        assert grown < MiB, f"{grown} bytes more in files of {user.name} on the journal's filesystem"
        assert not keep.exists() or os.lstat(keep).st_blocks == 0
        assert node.free() > before_free - FREE_MARGIN, (before_free, node.free())
        assert not (node.journal_root / "node1" / f"{job}.control").exists()
        after_mounts = node.mounts("node1")
        assert after_mounts == before_mounts, set(after_mounts) ^ set(before_mounts)
    finally:
        keep.unlink(missing_ok=True)


def test_a_jobs_heartbeat_directory_is_taken_back_whatever_it_holds(
    node: Node, sandbox_users: dict[str, SandboxUser]
) -> None:
    """chaosno is on no allowlist: every job gets a heartbeat directory."""
    user = sandbox_users["chaosno"]
    (user.home / "attack.py").write_text(HEARTBEAT_ATTACK)
    go = user.home / f"go-{uuid.uuid4().hex[:8]}"
    before_mounts, before_free = node.mounts("node2"), node.free()
    before_host = jobfs.mounts_at_or_under(node.heartbeats)
    script = f'{USER_PY} {user.home}/attack.py "{node.heartbeats}/node2/$SLURM_JOB_ID" {go}\n'
    job = node.submit(user, script, None, "-N1", "-w", "node2")
    job_dir = node.heartbeats / "node2" / job
    beat = job_dir / f"{job}.0.json"
    try:
        # Where the exporter reads (on the host here): the job's heartbeat, on the job's own tmpfs.
        end = time.monotonic() + TIMEOUT
        while not beat.exists() and time.monotonic() < end:
            time.sleep(0.2)
        assert beat.exists(), node.output(job)
        mounted = str(job_dir) in jobfs.mounts_at_or_under(node.heartbeats)
        go.touch()
        node.wait_ended(job, "node2")
    finally:
        go.unlink(missing_ok=True)
    out = node.output(job)
    assert "DEPTH=" in out, out
    # Nothing left: no directory, no mount (the node's or the host's), an empty trash.
    assert job not in os.listdir(node.heartbeats / "node2")
    trash = node.heartbeats / "node2" / jobfs.TRASH
    assert not trash.exists() or os.listdir(trash) == []
    after_mounts = node.mounts("node2")
    assert after_mounts == before_mounts, set(after_mounts) ^ set(before_mounts)
    assert jobfs.mounts_at_or_under(node.heartbeats) == before_host
    assert node.free() > before_free - FREE_MARGIN
    # The job was bounded by a tmpfs of its own: not all 3,000 directories and 20,000 files, not 64 MiB.
    assert mounted
    depth, files, big = (int(v) for v in re.findall(r"DEPTH=(\d+) FILES=(\d+) BIG=(\d+)", out)[0])
    assert depth + files <= jobfs.Limits().inodes and big <= jobfs.Limits().size, out
    # The epilog again, as slurmd runs it: it does not raise, and finds nothing more to do.
    hook = node.root / "etc" / "epilog.d" / HEARTBEAT_HOOK_NAME
    res = node.in_node("node2", [str(hook)], {"SLURM_JOB_ID": job, "SLURMD_NODENAME": "node2"})
    assert res.ok and "Traceback" not in res.stderr and "FAILED" not in res.stderr, res.stderr
    assert f"job {job}" not in res.stderr, res.stderr
    # And cleanup, told the job ended, finds nothing to take back and fails on nothing.
    outcomes = cleanup(
        node.journal_root, ["node2"], SubprocessRunner(), lambda _job: False, storage_roots=[node.heartbeats]
    )
    assert not any(o.failed for o in outcomes), outcomes
