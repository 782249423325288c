"""The health check's config, NHC-style drain/resume decisions (FakeScheduler; the CLI commands they
become through FakeRunner), exit codes, and install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from slurm_chaos.errors import ConfigError, SlurmError
from slurm_chaos.faults.policy import Policy, write_policy
from slurm_chaos.observe import checks
from slurm_chaos.observe import healthcheck as hc
from slurm_chaos.observe.checks import CRITICAL, OK, SIGNALS, UNKNOWN, WARNING, Result, Thresholds
from slurm_chaos.probe.heartbeat import Heartbeat
from slurm_chaos.runner import Completed, FakeRunner
from slurm_chaos.site import load_site
from slurm_chaos.slurm.fake import QUERIES, FakeScheduler
from slurm_chaos.slurm.model import JobRecord
from slurm_chaos.slurm.parse import parse_scontrol_nodes

REPO = Path(__file__).resolve().parents[2]
RECORDED = (REPO / "tests/data/slurm-22.05/scontrol_show_node_oneliner.txt").read_text().splitlines()
IDLE = next(line for line in RECORDED if line.startswith("NodeName=node3 "))
DRAINED_BY_OTHER = next(line for line in RECORDED if line.startswith("NodeName=node4 "))
OTHER_REASON = "h-slurm: disk check failed"


def node_line(name: str, drained_reason: str | None = None) -> str:
    """A recorded `scontrol -o show node` line, renamed, and drained with `drained_reason` if given."""
    if drained_reason is None:
        return IDLE.replace("node3", name)
    return DRAINED_BY_OTHER.replace("node4", name).replace(OTHER_REASON, drained_reason)


def slurm(show: str | None, update_ok: bool = True) -> FakeRunner:
    """Slurm's CLI as the health check calls it: `scontrol -o show node` answers `show`."""

    def respond(argv: tuple[str, ...]) -> Completed:
        if argv[:3] == ("scontrol", "-o", "show"):
            if show is None:
                return Completed(argv, 1, "", "slurm_load_node error: Unable to contact slurm controller")
            return Completed(argv, 0, show + "\n", "")
        if argv[:2] == ("scontrol", "update"):
            return Completed(argv, 0 if update_ok else 1, "", "" if update_ok else "Invalid node state")
        raise AssertionError(f"unexpected command {argv}")

    return FakeRunner(respond)


def fake(*lines: str) -> FakeScheduler:
    """A FakeScheduler holding the nodes of recorded `scontrol -o show node` lines."""
    return FakeScheduler(node_table=parse_scontrol_nodes("\n".join(lines)))


OPTS = hc.Options(node="node2", slurm_conf="/sandbox/etc/slurm.conf")
BAD = [Result("numa", OK, "fine"), Result("straggler", CRITICAL, "job 9 rank 1 computes 2.00x")]
GOOD = [Result("numa", OK, "fine"), Result("straggler", OK, "fine")]
OURS = "slurm-chaos-health: straggler: job 9 rank 1 computes 2.00x"


def updates(scheduler: FakeScheduler) -> list[tuple[str, tuple[object, ...]]]:
    return [(name, args) for name, args in scheduler.calls if name not in QUERIES]


def test_failed_check_drains_with_our_prefix() -> None:
    scheduler = fake(node_line("node2"))
    action = hc.remediate(scheduler, OPTS, BAD)
    assert action.did == f"drained: {OURS}" and action.reachable
    assert updates(scheduler) == [("drain", ("node2", OURS))]
    assert scheduler.queries == {"node": 1}  # one node asked about, alone
    assert scheduler.node_table["node2"].drain


def test_node_drained_by_someone_else_is_left_alone() -> None:
    left_alone = f"left alone: already drained by someone else ({OTHER_REASON})"
    for results, did in ((BAD, left_alone), (GOOD, "none")):
        scheduler = fake(node_line("node2", OTHER_REASON))
        assert hc.remediate(scheduler, OPTS, results).did == did
        assert updates(scheduler) == []  # looked, never updated
        assert scheduler.node_table["node2"].reason == OTHER_REASON


def test_resume_only_once_healthy_and_only_our_own_drain() -> None:
    scheduler = fake(node_line("node2", OURS))
    assert hc.remediate(scheduler, OPTS, BAD).did == "already drained by this check"
    assert updates(scheduler) == []
    assert hc.remediate(scheduler, OPTS, GOOD).did == "resumed"
    assert updates(scheduler) == [("resume", ("node2",))]
    # A WARNING (say, a missing checkpoint directory) does not keep a node drained.
    scheduler = fake(node_line("node2", OURS))
    assert hc.remediate(scheduler, OPTS, [Result("checkpoint", WARNING, "missing")]).did == "resumed"
    # A healthy node nobody drained is left as it is.
    scheduler = fake(node_line("node2"))
    assert hc.remediate(scheduler, OPTS, GOOD).did == "none" and updates(scheduler) == []


def test_another_failing_check_rewrites_our_reason() -> None:
    scheduler = fake(node_line("node2", "slurm-chaos-health: numa: squeezed"))
    assert hc.remediate(scheduler, OPTS, BAD).did == f"drained: {OURS}"
    assert updates(scheduler) == [("drain", ("node2", OURS))]


def test_unreachable_controller_is_unknown() -> None:
    scheduler = fake(node_line("node2"))
    scheduler.unreachable = "slurm_load_node error: Unable to contact slurm controller"
    action = hc.remediate(scheduler, OPTS, BAD)
    assert not action.reachable and "Unable to contact" in action.did and updates(scheduler) == []
    assert hc.exit_code(GOOD, action) == UNKNOWN
    assert hc.exit_code(BAD, action) == CRITICAL
    # A node the controller does not know is as good as no answer: nothing is changed.
    action = hc.remediate(fake(node_line("node3")), OPTS, BAD)
    assert not action.reachable and action.did.startswith("cannot read node node2 from Slurm")


def test_a_refused_update_is_reported() -> None:
    scheduler = fake(node_line("node2"))
    scheduler.fail_update = "Invalid node state specified"
    action = hc.remediate(scheduler, OPTS, BAD)
    assert action == hc.Action("drain failed: Invalid node state specified", False)
    scheduler = fake(node_line("node2", OURS))
    scheduler.fail_update = "Invalid node state specified"
    action = hc.remediate(scheduler, OPTS, GOOD)
    assert action == hc.Action("resume failed: Invalid node state specified", False)


@pytest.mark.parametrize(
    ("show", "results", "update"),
    [
        (node_line("node2"), BAD, ("scontrol", "update", "NodeName=node2", "State=DRAIN", f"Reason={OURS}")),
        (node_line("node2", OURS), GOOD, ("scontrol", "update", "NodeName=node2", "State=RESUME")),
    ],
)
def test_the_cli_commands_environment_and_timeout_are_the_health_checks(
    show: str, results: list[Result], update: tuple[str, ...]
) -> None:
    """Run by slurmd as root: only SLURM_CONF is added to slurmd's environment, every command is bounded."""
    runner = slurm(show)
    action = hc.remediate(hc.health_scheduler(runner, OPTS), OPTS, results)
    assert action.reachable
    env = {"SLURM_CONF": "/sandbox/etc/slurm.conf"}
    assert runner.invocations == [
        (("scontrol", "-o", "show", "node", "node2"), hc.SCONTROL_TIMEOUT_S, env),
        (update, hc.SCONTROL_TIMEOUT_S, env),
    ]
    # Without a SLURM_CONF of its own the check adds nothing to slurmd's environment.
    runner = slurm(show)
    hc.remediate(hc.health_scheduler(runner, hc.Options(node="node2")), hc.Options(node="node2"), results)
    assert [c.env for c in runner.invocations] == [{}, {}]


def test_the_cli_maps_an_unreachable_controller_and_a_refused_update() -> None:
    action = hc.remediate(hc.health_scheduler(slurm(None), OPTS), OPTS, BAD)
    assert not action.reachable and "Unable to contact" in action.did
    runner = slurm(node_line("node2"), update_ok=False)
    assert hc.remediate(hc.health_scheduler(runner, OPTS), OPTS, BAD) == hc.Action(
        "drain failed: Invalid node state", False
    )


def test_exit_codes_follow_nagios() -> None:
    assert hc.exit_code(GOOD, None) == OK
    assert hc.exit_code([*GOOD, Result("checkpoint", WARNING, "x")], None) == WARNING
    assert hc.exit_code([*BAD, Result("checkpoint", WARNING, "x")], None) == CRITICAL


def test_long_reasons_are_cut() -> None:
    reason = hc._reason(Result("numa", CRITICAL, "x" * 500))
    assert len(reason) == hc.REASON_MAX and reason.endswith("...")


# ---------------------------------------------------------------- whose reports may drain

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="the policy file must be root's")
POLICY = Policy(allow_users=("alice",), allow_partitions=("debug",), allow_reservations=("maint",))
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
    num_nodes=1,
    nodes=("node2",),
    admin_comment="",
    other_jobs=(),
)
MALLORY = replace(RECORD, job_id="66", user_id=1002, user="mallory")


@dataclass
class JobsScheduler(FakeScheduler):
    """A FakeScheduler that also answers job_record from a table."""

    records: dict[str, JobRecord] = field(default_factory=dict)

    def job_record(self, job_id: str) -> JobRecord:
        self._call("job_record", job_id)
        if job_id not in self.records:
            raise SlurmError(f"job {job_id}: not known to the controller")
        return self.records[job_id]


def jobs(*records: JobRecord, nodes: tuple[str, ...] = ()) -> JobsScheduler:
    table = parse_scontrol_nodes("\n".join(nodes)) if nodes else {}
    return JobsScheduler(node_table=table, records={r.job_id: r for r in records})


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "slurm-chaos-policy.toml"
    write_policy(path, POLICY)
    return path


@ROOT_ONLY
def test_a_job_the_policy_allows_may_drain_one_it_refuses_may_not(policy: Path) -> None:
    sched = jobs(RECORD, MALLORY)
    assert hc.standing("42", "node2", 1001, sched, policy) == hc.Standing("42")
    refused = hc.standing("66", "node2", 1002, sched, policy)
    assert refused.refused == (
        "the policy does not allow it: user 'mallory' (uid 1002) may not inject faults (not in allow_users)"
    )
    # Every fact is slurmctld's: an allowed user's job outside the allowed partition is refused too.
    elsewhere = jobs(replace(RECORD, partition="gpu"))
    assert "partition 'gpu' is not in allow_partitions" in str(
        hc.standing("42", "node2", 1001, elsewhere, policy)
    )


@ROOT_ONLY
def test_what_slurm_does_not_vouch_for_never_drains(policy: Path, tmp_path: Path) -> None:
    sched = jobs(RECORD)
    unknown = hc.standing("7", "node2", 1001, sched, policy).refused
    assert unknown is not None and unknown.startswith("slurmctld does not vouch for it")
    # A heartbeat directory that is not the job's user's (slurmctld's word for whose job it is).
    assert hc.standing("42", "node2", 1002, sched, policy).refused == (
        "its heartbeats are uid 1002's, slurmctld says the job is uid 1001's"
    )
    assert hc.standing("42", "node3", 1001, sched, policy).refused == "slurmctld does not place it on node3"
    missing = hc.standing("42", "node2", 1001, sched, tmp_path / "none.toml").refused
    assert missing is not None and missing.startswith("no policy allows it")
    policy.chmod(0o666)
    writable = hc.standing("42", "node2", 1001, sched, policy).refused
    assert writable is not None and "writable by group or others" in writable


def test_roots_own_reports_may_drain_unasked_and_unlimited(tmp_path: Path) -> None:
    sched = jobs(replace(RECORD, user_id=0, user="root"))
    # A heartbeat directory root owns: no user can make one; slurmctld is not even asked.
    assert hc.standing("9", "node2", 0, sched, tmp_path / "none.toml") == hc.Standing("9", root=True)
    assert sched.queries == {}
    # A task of a job slurmctld says is root's (no heartbeat directory): no policy needed either.
    assert hc.standing("42", "node2", None, sched, tmp_path / "none.toml") == hc.Standing("42", root=True)


STRAGGLER = checks.Finding("66", "job 66 rank 1 computes 5000.0 ms/step")
ALLOWED = checks.Finding("42", "job 42 rank 0 computes 5000.0 ms/step")
FULL = checks.Finding(None, "/ckpt: 1.0 MiB free (< 64 MiB)")
STANDINGS = {
    "66": hc.Standing("66", "the policy does not allow it: not in allow_users"),
    "42": hc.Standing("42"),
}


def test_a_refused_jobs_findings_are_an_alert_that_says_why() -> None:
    gated = hc.gate(checks.reported("straggler", [STRAGGLER]), STANDINGS)
    assert gated.status == WARNING
    assert gated.message == (
        "job 66 rank 1 computes 5000.0 ms/step [alert only, no drain: job 66: the policy does not allow it: "
        "not in allow_users]"
    )
    # A job the health check could not ask about counts as refused.
    assert hc.gate(checks.reported("straggler", [ALLOWED]), {}).status == WARNING


def test_what_may_drain_is_kept_and_alone_in_the_reason() -> None:
    mixed = hc.gate(checks.reported("straggler", [STRAGGLER, ALLOWED]), STANDINGS)
    assert mixed.status == CRITICAL and mixed.findings == (ALLOWED,) and "66" not in mixed.message
    node = hc.gate(checks.reported("checkpoint", [STRAGGLER, FULL]), STANDINGS)
    assert node.status == CRITICAL and node.findings == (FULL,)
    # The node's own measurements (no findings: the GPU checks) pass untouched.
    assert hc.gate(BAD[1], {}) == BAD[1]


def limited_opts(tmp_path: Path, interval: float = 60.0) -> hc.Options:
    return replace(
        OPTS, state_dir=tmp_path / "health", thresholds=Thresholds(report_drain_interval_s=interval)
    )


def test_drains_on_an_allowed_jobs_findings_are_rate_limited_per_node(tmp_path: Path) -> None:
    opts = limited_opts(tmp_path)
    results = [checks.reported("straggler", [ALLOWED])]
    sched = fake(node_line("node2"))
    assert hc.remediate(sched, opts, results, STANDINGS, now=1000.0).did.startswith("drained: ")
    record = tmp_path / "health" / "node2.drained"
    st = record.stat()
    assert st.st_uid == os.geteuid() and not st.st_mode & 0o022
    assert json.loads(record.read_text())["time"] == 1000.0
    # Resumed, then the same findings again 30 s later: no second drain within the interval.
    sched = fake(node_line("node2"))
    action = hc.remediate(sched, opts, results, STANDINGS, now=1030.0)
    assert action.did == "not drained: a job's findings drained node2 30 s ago (at most one per 60 s)"
    assert updates(sched) == []
    assert hc.remediate(sched, opts, results, STANDINGS, now=1061.0).did.startswith("drained: ")
    # The node's own measurement and root's jobs are not limited, nor recorded.
    record.write_text(json.dumps({"time": 1061.0}))
    for unlimited, stand in (
        (checks.reported("checkpoint", [FULL]), STANDINGS),
        (checks.reported("straggler", [ALLOWED]), {"42": hc.Standing("42", root=True)}),
        (BAD[1], {}),
    ):
        sched = fake(node_line("node2"))
        assert hc.remediate(sched, opts, [unlimited], stand, now=1062.0).did.startswith("drained: ")
    assert json.loads(record.read_text())["time"] == 1061.0


def test_a_drain_record_we_cannot_trust_allows_no_limited_drain(tmp_path: Path) -> None:
    opts = limited_opts(tmp_path)
    results = [checks.reported("straggler", [ALLOWED])]
    record = tmp_path / "health" / "node2.drained"
    record.parent.mkdir()
    for plant in ("writable", "link", "malformed"):
        record.unlink(missing_ok=True)
        if plant == "link":
            record.symlink_to(tmp_path / "elsewhere")
        else:
            record.write_text("{}" if plant == "malformed" else json.dumps({"time": 0.0}))
            record.chmod(0o666 if plant == "writable" else 0o644)
        sched = fake(node_line("node2"))
        action = hc.remediate(sched, opts, results, STANDINGS, now=1e9)
        assert action.did.startswith("not drained: the drain record cannot be trusted"), plant
        assert updates(sched) == []


def _forged_heartbeats(hb: Path, job: str, owner: int) -> None:
    for rank, compute in enumerate([0.05, 5.0]):
        beat = Heartbeat(hb, job, rank, "node2")
        for step in range(5):
            beat.update(step, compute + 0.01, compute, 0.01, checkpoint_failures=1)
            beat._last_write = float("-inf")
    for path in [hb / "node2" / job, *(hb / "node2" / job).iterdir()]:
        os.chown(path, owner, owner)


@ROOT_ONLY
def test_main_alerts_but_never_drains_on_a_refused_users_heartbeats(
    tmp_path: Path, policy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user's own job writes a failed checkpoint and a rank 100x slower: the node stays in service."""
    hb, states = tmp_path / "hb", tmp_path / "health"
    _forged_heartbeats(hb, "66", 1002)
    sched = jobs(MALLORY, nodes=(node_line("node2"),))
    argv = ["--signals", "straggler,checkpoint", "--node", "node2", "--heartbeat-dir", str(hb)]
    argv += ["--state-dir", str(states), "--checkpoint-path", str(tmp_path), "--policy", str(policy)]
    opts = hc.options_from_args(argv)
    results = hc.run_checks(opts, hc.Inputs(proc=tmp_path / "noproc", sys=tmp_path / "nosys"))
    assert [r.status for r in results] == [CRITICAL, CRITICAL]  # what the checks found, ungated
    stand = hc.standings(opts, results, sched)
    assert list(stand) == ["66"] and sched.queries == {"job_record": 1}  # asked once for both
    gated = [hc.gate(r, stand) for r in results]
    assert [r.status for r in gated] == [WARNING, WARNING]
    action = hc.remediate(sched, opts, gated, stand)
    assert action.did == "none" and updates(sched) == []
    assert hc.exit_code(gated, action) == WARNING
    assert not (states / "node2.drained").exists()


# ---------------------------------------------------------------- configuration


def test_config_round_trip(tmp_path: Path) -> None:
    opts = hc.Options(
        signals=frozenset({"numa", "straggler"}),
        heartbeat_dir=tmp_path / "hb",
        checkpoint_path="/ckpt",
        gpus_per_node=8,
        slurm_conf="/etc/slurm/slurm.conf",
        thresholds=Thresholds(straggler_ratio=1.5, xid_ignore=frozenset({13}), numa_share=False),
    )
    path = tmp_path / "hc.toml"
    path.write_text(hc.render_config(opts, "a comment"))
    assert hc.load_config(path) == opts


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ('signals = ["numa", "thermal"]', "signals", "unknown signal(s) thermal"),
        ("colour = 1", "colour", "unknown key"),
        ("gpus_per_node = 'eight'", "gpus_per_node", "expected int"),
        ("[thresholds]\nstraggler_ratio = 'high'", "thresholds.straggler_ratio", "expected a number"),
        ("[thresholds]\nspeed = 1", "thresholds.speed", "unknown key"),
        ("signals = [", "", "malformed TOML"),
    ],
)
def test_config_errors_name_file_and_key(tmp_path: Path, text: str, key: str, problem: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        hc.load_config(path)
    assert err.value.path == str(path) and err.value.key == key and problem in err.value.problem


def test_arguments_override_the_config(tmp_path: Path) -> None:
    path = tmp_path / "hc.toml"
    path.write_text(hc.render_config(hc.Options(signals=frozenset({"numa"}), checkpoint_path="/a")))
    opts = hc.options_from_args(["--config", str(path), "--signals", "straggler,checkpoint", "--node", "n7"])
    assert opts.signals == {"straggler", "checkpoint"} and opts.checkpoint_path == "/a" and opts.node == "n7"
    with pytest.raises(ConfigError):
        hc.options_from_args(["--signals", "numa,bogus"])


# ---------------------------------------------------------------- one run, end to end


def test_main_drains_on_a_straggling_heartbeat_and_leaves_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hb, states = tmp_path / "hb", tmp_path / "health"
    for rank, (host, compute) in enumerate([("node1", 0.05), ("node2", 0.12), ("node3", 0.05)]):
        beat = Heartbeat(hb, "31", rank, host)
        for step in range(5):
            beat.update(step, compute + 0.01, compute, 0.01)
            beat._last_write = float("-inf")
    runner = slurm(node_line("node2"))
    argv = ["--signals", "straggler,checkpoint", "--node", "node2", "--heartbeat-dir", str(hb)]
    argv += ["--state-dir", str(states), "--checkpoint-path", str(tmp_path)]
    code = hc.main(argv, runner=runner, inputs=hc.Inputs(proc=tmp_path / "noproc", sys=tmp_path / "nosys"))
    out = capsys.readouterr().out
    assert code == CRITICAL
    assert out.startswith(
        "slurm-chaos-health CRITICAL on node2 - straggler: job 31 rank 1 computes 120.0 ms/step"
    )
    assert runner.calls[-1][3] == "State=DRAIN"
    state = json.loads((states / "node2.json").read_text())
    assert [(r["check"], r["status"]) for r in state["results"]] == [
        ("checkpoint", OK),
        ("straggler", CRITICAL),
    ]
    assert state["action"].startswith("drained: slurm-chaos-health: straggler")


def test_disabled_signal_is_not_checked(tmp_path: Path) -> None:
    hb = tmp_path / "hb"
    for rank, compute in enumerate([0.05, 0.2]):
        beat = Heartbeat(hb, "1", rank, f"node{rank + 1}")
        for step in range(5):
            beat.update(step, compute, compute, 0.0)
            beat._last_write = float("-inf")
    opts = hc.Options(
        signals=frozenset(SIGNALS) - {"straggler"}, node="node2", heartbeat_dir=hb, gpus_per_node=0
    )
    results = hc.run_checks(opts, hc.Inputs(proc=tmp_path, sys=tmp_path))
    assert "straggler" not in [r.check for r in results]
    assert hc.remediate(fake(node_line("node2")), opts, results).did == "none"


# ---------------------------------------------------------------- install


def test_install_writes_an_executable_hook_with_the_sites_signals(tmp_path: Path) -> None:
    site = load_site(REPO / "site_configs/h100-ib-example.yaml")
    hook = hc.install_healthcheck(tmp_path, site, heartbeats=tmp_path / "hb")
    assert hook == tmp_path / "healthcheck.d" / "50-slurm-chaos"
    assert os.access(hook, os.X_OK)
    opts = hc.load_config(tmp_path / hc.CONFIG_NAME)
    assert opts.signals == set(site.monitoring.healthcheck_signals)
    assert "gpu_throttle" not in opts.signals  # this site's set-up leaves throttling out
    assert opts.checkpoint_path == site.checkpoint.path and opts.gpus_per_node == 8
    assert "export SLURM_CONF=/etc/slurm/slurm.conf" in hook.read_text()
    # The hook runs as slurmd would run it (here: report only, a node without that checkpoint path).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(hook), "--no-drain", "--node", "nodeX", "--gpus", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == WARNING, done.stdout + done.stderr  # checkpoint path missing here
    assert "checkpoint: /lustre/scratch/slurm-chaos/checkpoints does not exist" in done.stdout
    assert "straggler: no running probe rank" in done.stdout and "gpu_throttle" not in done.stdout
    assert sys.executable in hook.read_text()


def test_install_writes_the_hooks_that_give_each_job_its_heartbeat_directory(tmp_path: Path) -> None:
    site = load_site(REPO / "site_configs/h100-ib-example.yaml")
    hc.install_healthcheck(tmp_path, site, heartbeats=tmp_path / "hb")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"SLURM_JOB_ID": "5", "SLURMD_NODENAME": "nodeX", "SLURM_JOB_UID": "4242", "SLURM_JOB_GID": "4343"}
    job = tmp_path / "hb" / "nodeX" / "5"
    for kind, exists in (("prolog", True), ("epilog", False)):
        hook = tmp_path / f"{kind}.d" / hc.HEARTBEAT_HOOK_NAME
        assert os.access(hook, os.X_OK)
        done = subprocess.run([str(hook)], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert job.exists() == exists
        if exists:
            assert (job.stat().st_uid, job.stat().st_gid) == (4242, 4343)
