"""The prolog's authorisation: trusted facts only, the audit log, the grant file, the hook scripts."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pytest

from slurm_chaos.errors import SlurmError
from slurm_chaos.faults import authz
from slurm_chaos.faults.hooks import EXIT_UNDO_FAILED, undo_failed_reason
from slurm_chaos.faults.hooks.__main__ import main as hook_main
from slurm_chaos.faults.install_hooks import (
    HOOK_NAME,
    install_hooks,
    uninstall_hooks,
    unsafe_code_for_root,
    unsafe_for_root,
)
from slurm_chaos.faults.journal import Journal, Undo
from slurm_chaos.faults.policy import Policy, PolicyError, write_policy
from slurm_chaos.runner import Completed, FakeRunner
from slurm_chaos.slurm.backend import Scheduler
from slurm_chaos.slurm.model import ClusterConfig, JobRecord, PartitionInfo

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the policy and audit files must be root's")

RECORD = JobRecord(
    job_id="42",
    user_id=1001,
    user="alice",
    account="chaos",
    partition="debug",
    reservation="maint",
    job_oversubscribe="NO",
    partition_oversubscribe="NO",
    array=False,
    het=False,
    num_nodes=2,
    nodes=("node1", "node2"),
    admin_comment="slurm-chaos=nccl-degrade:ib=off",
    submit_time=datetime(2026, 11, 30, 12, 0, tzinfo=UTC),
    end_time=datetime(2026, 11, 30, 13, 0, tzinfo=UTC),
    other_jobs=(),
)
ENV = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "node1", "SLURM_JOB_UID": "1001", "SLURM_JOB_USER": "alice"}
POLICY = Policy(
    allow_users=("alice",),
    allow_partitions=("debug",),
    allow_reservations=("maint",),
    max_nodes=4,
    job_interface="ib0",
)


class FakeScheduler:
    """Answers job_record from a table; counts the questions; records drains."""

    def __init__(
        self, *records: JobRecord, preempt: tuple[str, str, str] = ("OFF", "OFF", "preempt/none")
    ) -> None:
        self.records = {r.job_id: r for r in records}
        self.asked: list[str] = []
        self.drained: list[tuple[str, str]] = []
        #: (the partition debug's PreemptMode, the cluster's PreemptMode and PreemptType)
        self.preempt = preempt

    def partitions(self) -> dict[str, PartitionInfo]:
        return {"debug": PartitionInfo("debug", ("node1", "node2"), preempt_mode=self.preempt[0])}

    def cluster_config(self) -> ClusterConfig:
        return ClusterConfig("c", preempt_mode=self.preempt[1], preempt_type=self.preempt[2])

    def drain(self, node: str, reason: str) -> None:
        self.drained.append((node, reason))

    def job_record(self, job_id: str) -> JobRecord:
        self.asked.append(job_id)
        if job_id not in self.records:
            raise SlurmError(f"job {job_id}: not known to the controller")
        return self.records[job_id]


def scheduler(*records: JobRecord) -> Scheduler:
    return cast(Scheduler, FakeScheduler(*records))


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "slurm-chaos-policy.toml"
    write_policy(path, POLICY)
    return path


def test_granted_from_the_admin_comment_and_the_controllers_facts(policy: Path) -> None:
    d = authz.decide("42", "node1", ENV, scheduler(RECORD), policy)
    assert d is not None and d.granted
    assert d.spec == "nccl-degrade:ib=off" and d.nodes == ("node1", "node2")
    assert (d.facts.uid, d.facts.user, d.facts.account, d.facts.exclusive, d.facts.array) == (
        1001, "alice", "chaos", True, False,
    )  # fmt: skip


def test_the_jobs_own_environment_grants_nothing(policy: Path) -> None:
    forged = {**ENV, "SPANK_SLURM_CHAOS_SPEC": "netem:rate=1M", "SLURM_CHAOS_SPEC": "netem:rate=1M"}
    assert authz.decide("42", "node1", forged, scheduler(replace(RECORD, admin_comment="")), policy) is None
    # An AdminComment someone else wrote (not ours) is no request either.
    assert (
        authz.decide("42", "node1", ENV, scheduler(replace(RECORD, admin_comment="hold: disk")), policy)
        is None
    )


def test_users_the_policy_refuses_cost_slurmctld_nothing(policy: Path) -> None:
    fake = FakeScheduler(RECORD)
    env = {**ENV, "SLURM_JOB_UID": "1002", "SLURM_JOB_USER": "bob"}
    assert authz.decide("42", "node1", env, cast(Scheduler, fake), policy) is None
    assert fake.asked == []


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"job_oversubscribe": "OK"}, "does not hold its nodes exclusively"),
        ({"partition_oversubscribe": "FORCE:4"}, "does not hold its nodes exclusively"),
        ({"other_jobs": ("43",)}, "does not hold its nodes exclusively"),
        ({"other_jobs": None}, "does not hold its nodes exclusively"),
        (
            {"job_oversubscribe": "OK", "partition_oversubscribe": "YES:4"},
            "does not hold its nodes exclusively",
        ),
        ({"array": True}, "array jobs may not inject faults"),
        ({"het": True}, "heterogeneous jobs"),
        ({"partition": "gpu"}, "partition 'gpu' is not in allow_partitions"),
        ({"reservation": ""}, "the job's reservation is not known"),
        ({"num_nodes": 5}, "the job has 5 nodes (max_nodes 4)"),
        ({"user_id": 0}, "slurmd says uid 1001, slurmctld says 0"),
        ({"admin_comment": "slurm-chaos=netem:delay=fast"}, "bad chaos SPEC 'netem:delay=fast'"),
    ],
)
def test_refused_with_the_reason(policy: Path, change: dict[str, object], reason: str) -> None:
    d = authz.decide("42", "node1", ENV, scheduler(replace(RECORD, **change)), policy)  # type: ignore[arg-type]
    assert d is not None and not d.granted
    assert d.refused is not None and reason in d.refused


def test_a_bad_policy_refuses_everything(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    with pytest.raises(PolicyError, match="No such file"):
        authz.decide("42", "node1", ENV, scheduler(RECORD), path)
    path.write_text("version = 1\nallow_users = alice\n")
    with pytest.raises(PolicyError, match="line 2"):
        authz.decide("42", "node1", ENV, scheduler(RECORD), path)


def test_audit_and_grant_files(tmp_path: Path, policy: Path) -> None:
    d = authz.decide("42", "node1", ENV, scheduler(RECORD), policy)
    assert d is not None
    log = tmp_path / "log" / "audit.log"
    authz.audit(log, d, when=1.0)
    authz.audit(log, replace(d, refused="no"), when=2.0)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["decision"], e["job_id"], e["user"], e["spec"], e["job_nodes"]) for e in lines] == [
        ("granted", "42", "alice", "nccl-degrade:ib=off", ["node1", "node2"]),
        ("refused", "42", "alice", "nccl-degrade:ib=off", ["node1", "node2"]),
    ]
    assert log.stat().st_mode & 0o777 == 0o600
    journal = tmp_path / "journal"
    paths = authz.write_grant(journal, d, until=1796043600.5)
    assert paths[0] == journal / "node1" / "42.grant" and paths[0].stat().st_mode & 0o777 == 0o600
    assert "spec=nccl-degrade:ib=off\n" in paths[0].read_text()
    # Bound to this run of the job by the end after which it grants nothing (13:00 UTC); no submit
    # time, which nothing could check (#27 finding 15).
    assert "\nuntil=1796043600\n" in paths[0].read_text() and "submit=" not in paths[0].read_text()
    assert d.job_interface == "ib0" and d.end == 1796043600.0
    assert "refused=" not in paths[0].read_text()
    assert authz.remove_grant(journal, "node1", "42") == paths
    # The audit log is refused when someone else could have written it.
    os.chmod(log, 0o622)
    with pytest.raises(PermissionError):
        authz.audit(log, d)


def test_escaped_spec_for_log_lines() -> None:
    assert authz.escaped("a\nb\x1b[31m") == '"a\\nb\\u001b[31m"'


# --------------------------------------------------------------------------------- the hook


def _hook(
    tmp_path: Path,
    policy: Path,
    kind: str,
    env: dict[str, str],
    sched: Scheduler,
    runner: FakeRunner | None = None,
) -> int:
    argv = [
        kind,
        "--journal-root", str(tmp_path / "journal"),
        "--policy", str(policy),
        "--audit-log", str(tmp_path / "audit.log"),
    ]  # fmt: skip
    runner = runner or FakeRunner(lambda a: Completed(a, 0, "", ""))
    return hook_main(argv, env=env, runner=runner, scheduler=sched)


def test_prolog_grants_audits_and_epilog_removes_the_grant(
    tmp_path: Path, policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _hook(tmp_path, policy, "prolog", ENV, scheduler(RECORD)) == 0
    err = capsys.readouterr().err
    assert 'SPEC "nccl-degrade:ib=off" granted' in err
    assert json.loads((tmp_path / "audit.log").read_text())["decision"] == "granted"
    grant = tmp_path / "journal" / "node1" / "42.grant"
    assert grant.exists()
    assert _hook(tmp_path, policy, "epilog", ENV, scheduler(RECORD)) == 0
    assert not grant.exists()


def test_prolog_refuses_and_the_grant_says_why(
    tmp_path: Path, policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = replace(RECORD, job_oversubscribe="OK", admin_comment="slurm-chaos=netem:rate=1M")
    assert _hook(tmp_path, policy, "prolog", ENV, scheduler(shared)) == 0
    assert (
        'SPEC "netem:rate=1M" refused: the job does not hold its nodes exclusively' in capsys.readouterr().err
    )
    assert "refused=the job does not hold" in (tmp_path / "journal" / "node1" / "42.grant").read_text()
    assert not list((tmp_path / "journal" / "node1").glob("*.jsonl"))  # nothing applied, nothing journalled


def test_prolog_never_fails_the_job(tmp_path: Path, policy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _hook(tmp_path, policy, "prolog", ENV, scheduler()) == 0  # slurmctld does not know the job
    assert "no fault applied: slurmctld did not answer" in capsys.readouterr().err
    assert _hook(tmp_path, tmp_path / "missing.toml", "prolog", ENV, scheduler(RECORD)) == 0
    assert "every fault refused: policy" in capsys.readouterr().err
    assert not (tmp_path / "audit.log").exists()


def test_installed_hooks_skip_python_unless_the_policy_may_name_the_user(tmp_path: Path) -> None:
    etc, log_file = tmp_path / "etc", tmp_path / "agent.log"
    paths = install_hooks(etc, "/nonexistent/python", journal_root=tmp_path / "j", log_file=log_file)
    assert [p.relative_to(etc).as_posix() for p in paths] == [
        f"prolog.d/{HOOK_NAME}",
        f"epilog.d/{HOOK_NAME}",
    ]
    text = paths[0].read_text()
    assert "cd / ||" in text and " -I -c " in text and "PYTHONPATH" not in text and "SPANK" not in text
    prolog = paths[0]
    env = {
        "SLURM_JOB_ID": "9",
        "SLURMD_NODENAME": "node1",
        "SLURM_JOB_UID": "1001",
        "SLURM_JOB_USER": "alice",
    }

    def run(extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [prolog], env={**env, **(extra or {})}, capture_output=True, text=True, timeout=10
        )

    # No policy: nothing can be granted, no Python runs (and a SPANK variable changes nothing).
    quiet = run({"SPANK_SLURM_CHAOS_SPEC": "netem:rate=1M"})
    assert quiet.returncode == 0 and quiet.stderr == "" and not log_file.exists()
    write_policy(etc / "slurm-chaos-policy.toml", Policy(allow_users=("bob",)))
    assert run().stderr == "" and not log_file.exists()  # alice is not named
    # Named (or root): Python runs; a broken interpreter is logged and the hook still exits 0.
    write_policy(etc / "slurm-chaos-policy.toml", Policy(allow_users=("alice",)))
    broken = run()
    assert broken.returncode == 0 and "slurm-chaos: prolog hook exited" in broken.stderr
    assert "slurm-chaos: prolog hook exited" in log_file.read_text()
    assert run({"SLURM_JOB_UID": "0", "SLURM_JOB_USER": "root"}).stderr.count("hook exited") == 1
    # The epilog runs Python for a job that left a journal or a grant on this node, and for any
    # job while the node holds something newer than its last tidy state (stale leftovers).
    epilog = paths[1]

    def epilog_runs_python(job: str) -> bool:
        done = subprocess.run(
            [epilog], env={**env, "SLURM_JOB_ID": job}, capture_output=True, text=True, timeout=10
        )
        return "slurm-chaos: epilog hook exited" in done.stderr

    assert not epilog_runs_python("9")  # nothing of slurm-chaos on this node ever
    node_dir = tmp_path / "j" / "node1"
    node_dir.mkdir(parents=True)
    (node_dir / "9.grant").write_text("job=9\n")
    assert epilog_runs_python("9")
    assert epilog_runs_python("10")  # another job: node1 was never tidied
    (node_dir / ".tidy").touch()
    # File times tick coarser than the test runs: the tidy state a few seconds old, the grant older.
    os.utime(node_dir / ".tidy", (time.time() - 5, time.time() - 5))
    os.utime(node_dir / "9.grant", (1, 1))
    assert not epilog_runs_python("10")  # nothing newer than the tidy state
    (node_dir / "7.jsonl").write_text("")
    assert epilog_runs_python("10")  # a journal written since
    assert uninstall_hooks(etc) == paths


def test_hooks_refuse_to_run_code_others_may_change(tmp_path: Path) -> None:
    code = tmp_path / "checkout"
    code.mkdir()
    assert unsafe_for_root(code) is None or "tmp" in str(unsafe_for_root(code))
    code.chmod(0o777)
    assert "writable by group or others" in str(unsafe_for_root(code))
    code.chmod(0o755)
    os.chown(code, 1000, 1000)
    assert "owned by uid 1000, not root" in str(unsafe_for_root(code))


def test_hooks_refuse_a_package_directory_others_may_change(tmp_path: Path) -> None:
    """The import root is root's, but the slurm_chaos directory in it (or what it links to, or a
    file in it) is not: root would still run another user's code."""
    root = tmp_path / "site"
    package = root / "slurm_chaos"
    (package / "faults").mkdir(parents=True)
    (package / "faults" / "agent.py").write_text("")
    tmp_path.chmod(0o755)
    assert unsafe_code_for_root(root) is None
    package.chmod(0o777)
    assert "slurm_chaos is writable by group or others" in str(unsafe_code_for_root(root))
    package.chmod(0o755)
    os.chown(package / "faults" / "agent.py", 1000, 1000)
    assert "agent.py is owned by uid 1000" in str(unsafe_code_for_root(root))
    os.chown(package / "faults" / "agent.py", 0, 0)
    elsewhere = tmp_path / "home" / "alice" / "slurm_chaos"
    elsewhere.mkdir(parents=True)
    os.chown(elsewhere.parent, 1000, 1000)
    shutil.rmtree(package)
    package.symlink_to(elsewhere)  # root's link, a user's tree behind it
    assert "owned by uid 1000" in str(unsafe_code_for_root(root))


def test_grant_is_written_under_the_hostname_too(tmp_path: Path, policy: Path) -> None:
    d = authz.decide("42", "nodeX", ENV, scheduler(RECORD), policy)
    assert d is not None
    host = socket.gethostname().split(".")[0]
    written = authz.write_grant(tmp_path, d, until=time.time() + 60)
    assert {p.parent.name for p in written} == {"nodeX", host}


def test_prolog_removes_a_grant_left_under_its_job_id_before_anything_else(
    tmp_path: Path, policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A controller whose state was reset hands job ids out again: a grant an earlier job 42 left
    (its epilog lost) must grant the new job 42 nothing, whatever the new job asks."""
    node_dir = tmp_path / "journal" / "node1"
    node_dir.mkdir(parents=True)
    left = node_dir / "42.grant"
    left.write_text("job=42\nuid=1001\nspec=nccl-degrade:ib=off\nsubmit=1\nuntil=9999999999\n")
    plain = replace(RECORD, admin_comment="")  # the new job 42 asks for nothing
    assert _hook(tmp_path, policy, "prolog", ENV, scheduler(plain)) == 0
    assert not left.exists()
    assert "removed a grant left by an earlier run of this job id" in capsys.readouterr().err


def test_the_deadline_comes_from_the_controller_in_the_prolog(tmp_path: Path, policy: Path) -> None:
    """The job's end by its time limit, as slurmctld told the prolog: a controller unreachable later
    cannot leave faults for the hooks' whole default; without a limit the default is bounded."""
    from slurm_chaos.faults import agent
    from slurm_chaos.faults.hooks.__main__ import deadline_s

    d = authz.decide("42", "node1", ENV, scheduler(RECORD), policy)
    assert d is not None and d.end is not None
    now = d.end - 600
    assert deadline_s(d, {}, agent.DEFAULT_DEADLINE_S, now) == 600 + agent.TIME_LIMIT_GRACE_S
    assert deadline_s(d, {"SPANK_SLURM_CHAOS_DEADLINE": "30"}, agent.DEFAULT_DEADLINE_S, now) == 30
    unlimited = replace(d, end=None)
    assert deadline_s(unlimited, {}, agent.DEFAULT_DEADLINE_S, now) == agent.DEFAULT_DEADLINE_S <= 4 * 3600
    assert deadline_s(replace(d, end=now + 10**9), {}, 3600, now) == agent.MAX_DEADLINE_S


def test_cleanup_removes_expired_grants_and_those_of_ended_jobs(tmp_path: Path) -> None:
    from slurm_chaos.faults.cleanup import cleanup, mark_tidy

    node_dir = tmp_path / "node1"
    node_dir.mkdir()
    (node_dir / "1.grant").write_text("job=1\nuid=0\nspec=x\nuntil=100\n")
    (node_dir / "2.grant").write_text("job=2\nuid=0\nspec=x\nuntil=300\n")
    (node_dir / "3.grant").write_text("job=3\nuid=0\nspec=x\nuntil=300\n")
    os.utime(node_dir / "3.grant", (1, 1))
    (node_dir / "4.grant").write_text("job=4\nuid=0\nspec=x\n")  # an older prolog's: no until
    os.utime(node_dir / "4.grant", (1, 1))
    runner = FakeRunner(lambda a: Completed(a, 0, "", ""))
    assert not mark_tidy(tmp_path, "node1")  # grants left: the epilog keeps looking
    ended = lambda job: False if job == "3" else None  # noqa: E731
    lines = cleanup(tmp_path, ["node1"], runner, ended, now=200, grant_default_s=50)
    assert sorted(str(o) for o in lines) == [
        f"grant {node_dir / '1.grant'} removed [expired]",
        f"grant {node_dir / '3.grant'} removed [job no longer running]",
        f"grant {node_dir / '4.grant'} removed [expired]",
    ]
    assert [p.name for p in node_dir.glob("*.grant")] == ["2.grant"]
    (node_dir / "2.grant").unlink()
    assert mark_tidy(tmp_path, "node1") and (node_dir / ".tidy").exists()


def test_tidy_stamp_is_older_than_a_journal_written_while_it_was_decided(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prolog that writes its journal while the epilog scans must stay visible to `find -newer`."""
    from slurm_chaos.faults import cleanup as cleanup_module

    node_dir = tmp_path / "node1"
    node_dir.mkdir()
    scan = cleanup_module.journals

    def journals_while_a_prolog_writes(root: Path, nodes: list[str] | None) -> object:
        found = scan(root, nodes)
        (node_dir / "8.jsonl").write_text("")  # written during the scan: not seen by it
        return found

    monkeypatch.setattr(cleanup_module, "journals", journals_while_a_prolog_writes)
    assert cleanup_module.mark_tidy(tmp_path, "node1")
    assert (node_dir / "8.jsonl").stat().st_mtime > (node_dir / ".tidy").stat().st_mtime


# --------------------------------------------------------------------------------- failed undos


def _journal_with_undo(tmp_path: Path, job: str, argv: tuple[str, ...], deadline: float = 1e12) -> Journal:
    journal = Journal(tmp_path / "journal", "node1", job)
    journal.write_header(deadline=deadline, ns_pid=os.getpid())
    journal.record("netem", "tc qdisc replace dev ib0 root ...", Undo(argv=argv), deadline)
    return journal


def _refusing(argv: tuple[str, ...]) -> Completed:
    blocked = argv[0] == "blocked-undo"
    return Completed(argv, 2 if blocked else 0, "", "put in its way by the test" if blocked else "")


def test_an_undo_that_fails_drains_the_node_and_fails_the_epilog(
    tmp_path: Path, policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node that still holds the job's fault must not go back into service (#27 finding 13)."""
    journal = _journal_with_undo(tmp_path, "42", ("blocked-undo", "ib0"))
    sched = FakeScheduler(RECORD)
    code = _hook(tmp_path, policy, "epilog", ENV, cast(Scheduler, sched), FakeRunner(_refusing))
    assert code == EXIT_UNDO_FAILED
    ((node, reason),) = sched.drained
    assert node == "node1" and reason.startswith("slurm-chaos: undo failed: node1 job 42 netem")
    assert "put in its way by the test" in reason and "\n" not in reason
    err = capsys.readouterr().err
    assert "slurm-chaos: ERROR epilog: slurm-chaos: undo failed: node1 job 42 netem" in err
    assert journal.read().pending(), "the failed change stays pending for the next hook or cleanup"
    assert not (tmp_path / "journal" / "node1" / ".tidy").exists()
    # The next job's prolog retries it (an earlier undo left it pending): still blocked, it drains
    # again and applies nothing; once the undo goes through, the node is tidy again.
    other = {**ENV, "SLURM_JOB_ID": "43"}
    sched = FakeScheduler(replace(RECORD, job_id="43"))
    code = _hook(tmp_path, policy, "prolog", other, cast(Scheduler, sched), FakeRunner(_refusing))
    assert code == EXIT_UNDO_FAILED
    assert sched.drained and sched.asked == [], "a node still holding a fault decides nothing"
    sched = FakeScheduler(replace(RECORD, job_id="43"))
    assert _hook(tmp_path, policy, "prolog", other, cast(Scheduler, sched)) == 0
    assert not sched.drained and not journal.read().pending()
    assert (tmp_path / "journal" / "node1" / ".tidy").exists()


def test_a_hook_that_crashes_drains_only_if_it_left_an_undo_undone(
    tmp_path: Path, policy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_chaos.faults import agent

    def crash(*_args: object) -> list[object]:
        raise RuntimeError("a bug of the hook's own")

    monkeypatch.setattr(agent, "undo", crash)
    sched = FakeScheduler(RECORD)
    assert _hook(tmp_path, policy, "epilog", ENV, cast(Scheduler, sched)) == 0  # nothing was applied
    assert not sched.drained
    _journal_with_undo(tmp_path, "42", ("tc", "qdisc", "del"))
    assert _hook(tmp_path, policy, "epilog", ENV, cast(Scheduler, sched)) == EXIT_UNDO_FAILED
    ((_, reason),) = sched.drained
    assert reason.startswith("slurm-chaos: undo failed: node1 job 42 netem") and "crashed" in reason


def test_undo_failed_reason_is_one_bounded_line() -> None:
    reason = undo_failed_reason("rmdir /ckpt/\x1b[31m\nevil " + "x" * 500, more=2)
    assert reason.startswith("slurm-chaos: undo failed: rmdir /ckpt/?[31m evil x")
    assert reason.endswith("... (and 2 more)") and len(reason) <= 240
    assert all(" " <= c <= "~" for c in reason)


def _fake_python(tmp_path: Path) -> Path:
    """An interpreter that records its arguments and exits FAKE_RC (or sleeps FAKE_SLEEP first)."""
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {tmp_path}/python.argv\n'
        '[ -z "$FAKE_SLEEP" ] || sleep "$FAKE_SLEEP"\n'
        'exit "${FAKE_RC:-0}"\n'
    )
    fake.chmod(0o755)
    return fake


def test_installed_hooks_fail_only_for_an_undo_left_undone(tmp_path: Path) -> None:
    etc, journal_root = tmp_path / "etc", tmp_path / "j"
    python, log_file = str(_fake_python(tmp_path)), tmp_path / "agent.log"
    prolog, epilog = install_hooks(etc, python, journal_root=journal_root, log_file=log_file, timeout_s=1)
    env = {**ENV, "SLURM_JOB_ID": "9"}
    node_dir = journal_root / "node1"
    node_dir.mkdir(parents=True)
    (node_dir / "9.jsonl").write_text("")

    def run(hook: Path, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([hook], env={**env, **extra}, capture_output=True, text=True, timeout=30)

    assert run(epilog).returncode == 0
    assert run(epilog, FAKE_RC="1").returncode == 0  # the hook's own failure: logged, never drains
    assert run(epilog, FAKE_RC="127").returncode == 0
    assert run(epilog, FAKE_RC=str(EXIT_UNDO_FAILED)).returncode == 1  # Python drained and said why
    late = run(epilog, FAKE_SLEEP="3")  # killed by timeout with the job's journal there
    assert late.returncode == 1
    assert "slurm-chaos: undo failed: the epilog hook ran out of time (1s, exit 124) for job 9" in late.stderr
    (node_dir / "9.jsonl").unlink()
    assert run(epilog, FAKE_SLEEP="3").returncode == 0  # a job without faults: not drained
    assert run(prolog, FAKE_RC=str(EXIT_UNDO_FAILED)).returncode == 1


def test_an_ordinary_jobs_prolog_tidies_stale_journals(tmp_path: Path) -> None:
    """Not only a policy user's prolog: any job's prolog reverts what an earlier job left (#27 13)."""
    etc, journal_root = tmp_path / "etc", tmp_path / "j"
    prolog, _ = install_hooks(etc, str(_fake_python(tmp_path)), journal_root=journal_root)
    write_policy(etc / "slurm-chaos-policy.toml", Policy(allow_users=("bob",)))
    env = {**ENV, "SLURM_JOB_ID": "9"}
    argv = tmp_path / "python.argv"

    def run() -> str:
        argv.unlink(missing_ok=True)
        done = subprocess.run([prolog], env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return argv.read_text() if argv.exists() else ""

    assert run() == ""  # nothing on the node, alice not in the policy: no Python
    node_dir = journal_root / "node1"
    node_dir.mkdir(parents=True)
    (node_dir / "7.jsonl").write_text("")  # an earlier job's journal, never tidied
    assert " prolog --tidy-only --journal-root " in run()
    (node_dir / ".tidy").touch()
    os.utime(node_dir / "7.jsonl", (1, 1))
    assert run() == ""  # tidy since: the cheap guard skips Python again
    (etc / "slurm-chaos-policy.toml").unlink()
    (node_dir / "8.jsonl").write_text("")
    assert " prolog --tidy-only " in run()  # no policy at all: still tidies


# --------------------------------------------------------------------------------- preemption (#27 12)

SUSPENDED_BY = "a suspended job runs no epilog, and the job that preempts it would get the node"


@pytest.mark.parametrize(
    ("preempt", "refused"),
    [
        (
            ("SUSPEND", "OFF", "preempt/partition_prio"),
            "partition 'debug' preempts by suspension (PreemptMode=SUSPEND)",
        ),
        (
            ("", "SUSPEND,GANG", "preempt/qos"),
            "partition 'debug' preempts by suspension (PreemptMode=SUSPEND,GANG)",
        ),
        (("GANG", "OFF", "preempt/none"), "(PreemptMode=GANG)"),  # time-slicing suspends too
        (("REQUEUE", "SUSPEND,GANG", "preempt/partition_prio"), None),  # the partition's own mode
        (("SUSPEND", "SUSPEND", "preempt/none"), None),  # no preemption plugin, no gang: never
        (("OFF", "OFF", "preempt/none"), None),
    ],
)
def test_no_fault_in_a_partition_that_preempts_by_suspension(
    policy: Path, preempt: tuple[str, str, str], refused: str | None
) -> None:
    d = authz.decide("42", "node1", ENV, cast(Scheduler, FakeScheduler(RECORD, preempt=preempt)), policy)
    assert d is not None
    if refused is None:
        assert d.granted, d.refused
    else:
        assert d.refused is not None and refused in d.refused and SUSPENDED_BY in d.refused


def test_a_partition_slurmctld_does_not_know_refuses(policy: Path) -> None:
    elsewhere = replace(RECORD, partition="gone")
    d = authz.decide("42", "node1", ENV, scheduler(elsewhere), policy)
    assert d is not None and d.refused is not None
    # The policy names the partition it wants first; with any partition allowed, the unknown mode refuses.
    write_policy(policy, replace(POLICY, allow_partitions=None))
    d = authz.decide("42", "node1", ENV, scheduler(elsewhere), policy)
    assert (
        d is not None
        and d.refused == "the preemption mode of partition 'gone' is not known (slurmctld did not say)"
    )


def test_the_prolog_applies_nothing_in_a_suspending_partition(tmp_path: Path, policy: Path) -> None:
    sched = FakeScheduler(RECORD, preempt=("SUSPEND", "OFF", "preempt/partition_prio"))
    assert _hook(tmp_path, policy, "prolog", ENV, cast(Scheduler, sched)) == 0
    grant = (tmp_path / "journal" / "node1" / "42.grant").read_text()
    assert "refused=partition 'debug' preempts by suspension" in grant
    assert not list((tmp_path / "journal" / "node1").glob("*.jsonl"))
