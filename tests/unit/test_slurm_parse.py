"""Parsers of Slurm output, on output recorded from a real 22.05 cluster and 24.11-shaped fixtures."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurm_chaos.errors import SlurmError
from slurm_chaos.slurm import parse
from slurm_chaos.slurm.model import Gres, JobState

DATA = Path(__file__).resolve().parent.parent / "data"
V22 = DATA / "slurm-22.05"
V24 = DATA / "slurm-24.11"
SUBMIT = datetime(2026, 11, 30, 4, 49, 6, tzinfo=UTC)


def text(path: Path) -> str:
    return path.read_text()


# ------------------------------------------------------------------ hostlists and scalars


def test_hostlist_expansion_matches_scontrol_show_hostnames() -> None:
    recorded = text(V22 / "scontrol_show_hostnames.txt").split()
    assert parse.expand_hostlist("node[1-3],gpu[01-03,10],login") == recorded


def test_hostlist_compression_matches_scontrol_show_hostlist() -> None:
    hosts = ["node1", "node2", "node3", "node5", "gpu01", "gpu02"]
    assert parse.compress_hostlist(hosts) == text(V22 / "scontrol_show_hostlist.txt").strip()


@pytest.mark.parametrize("empty", ["", "None assigned", "(null)"])
def test_hostlist_placeholders_mean_no_node(empty: str) -> None:
    assert parse.expand_hostlist(empty) == []


def test_bad_hostlist_is_a_slurm_error() -> None:
    with pytest.raises(SlurmError, match=r"node\[3-1\]"):
        parse.expand_hostlist("node[3-1]")


@pytest.mark.parametrize(("folder", "version"), [(V22, (22, 5, 8)), (V24, (24, 11, 5))])
def test_version(folder: Path, version: tuple[int, int, int]) -> None:
    assert parse.parse_version(text(folder / "sinfo_version.txt")) == version
    assert parse.parse_version(text(folder / "sinfo_version.txt").replace("slurm-wlm", "slurm")) == version


def test_sbatch_parsable() -> None:
    assert parse.parse_sbatch_parsable(text(V22 / "sbatch_parsable.txt")) == "1"
    assert parse.parse_sbatch_parsable("4242;testcluster\n") == "4242"
    with pytest.raises(SlurmError, match="did not print a job id"):
        parse.parse_sbatch_parsable("sbatch: error: nope\n")


def test_job_state_words() -> None:
    assert JobState.parse("CANCELLED by 0") is JobState.CANCELLED
    assert JobState.parse("NOT_A_STATE") is JobState.UNKNOWN
    assert JobState.from_flags(["COMPLETED", "COMPLETING"]) is JobState.COMPLETING
    assert JobState.from_flags(["PENDING", "REQUEUED"]) is JobState.REQUEUED
    assert JobState.TIMEOUT.is_terminal and JobState.OUT_OF_MEMORY.is_terminal
    assert not JobState.REQUEUED.is_terminal and not JobState.COMPLETING.is_terminal


# ------------------------------------------------------------------ squeue


def test_time_left_parsing() -> None:
    assert parse.parse_time_left("1-02:03:04") == 93784.0
    assert parse.parse_time_left("05:00") == 300.0
    assert parse.parse_time_left("2:00:00\n") == 7200.0
    assert parse.parse_time_left("UNLIMITED") is None
    assert parse.parse_time_left("NOT_SET") is None and parse.parse_time_left("") is None


def test_job_running_from_its_state_word() -> None:
    assert parse.parse_job_running("RUNNING\n") and parse.parse_job_running("COMPLETING\n")
    assert parse.parse_job_running("SUSPENDED\n")  # its processes are still on the nodes
    for ended in ("COMPLETED", "CANCELLED", "TIMEOUT", "PENDING", "REQUEUED", ""):
        assert not parse.parse_job_running(f"{ended}\n"), ended
    # squeue -j of an array's id lists every task: the first line answers, as the hooks always read it.
    assert parse.parse_job_running("RUNNING\nPENDING\n") and not parse.parse_job_running("PENDING\nRUNNING\n")


def test_ended_states_are_the_terminal_ones_and_a_job_back_in_the_queue() -> None:
    # The words the node-side hooks have always taken for "nothing of the job runs here any more".
    assert parse.ENDED_STATES == {
        "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
        "PREEMPTED", "TIMEOUT", "REQUEUED", "PENDING", "REVOKED", "SPECIAL_EXIT",
    }  # fmt: skip


@pytest.mark.parametrize("path", [V22 / "squeue.json", V24 / "squeue.json"], ids=["22.05", "24.11"])
def test_squeue_json_live_jobs(path: Path) -> None:
    jobs = parse.parse_squeue_json(text(path))
    two = jobs["1"]
    assert (two.name, two.state, two.nodes, two.partition) == (
        "two-node",
        JobState.RUNNING,
        ("node1", "node2"),
        "debug",
    )
    assert two.start_time == SUBMIT
    assert jobs["2"].name == "leaf switch"
    assert (jobs["3"].state, jobs["3"].reason, jobs["3"].nodes) == (JobState.PENDING, "Resources", ())
    requeued = jobs["6"]
    assert (requeued.state, requeued.restarts, requeued.reservation) == (JobState.PENDING, 1, "maint")
    assert "8_[1-2]" in jobs  # a pending array, named as squeue's %i names it


@pytest.mark.parametrize("path", [V22 / "squeue_terminal.json", V24 / "squeue.json"], ids=["22.05", "24.11"])
def test_squeue_json_exit_codes(path: Path) -> None:
    jobs = parse.parse_squeue_json(text(path))
    assert (jobs["10"].state, jobs["10"].exit_code, jobs["10"].signal) == (JobState.TIMEOUT, 0, 15)
    assert (jobs["11"].state, jobs["11"].exit_code) == (JobState.FAILED, 137)
    assert jobs["10"].nodes == ("node1",)


def test_squeue_json_22_05_reports_wait_status_exit_codes() -> None:
    jobs = parse.parse_squeue_json(text(V22 / "squeue_terminal.json"))
    assert (jobs["3"].exit_code, jobs["1"].signal) == (3, 15)


def test_squeue_json_24_11_flags_name_the_state() -> None:
    ok = parse.parse_squeue_json(text(V24 / "squeue.json"))["4"]
    assert ok.state is JobState.COMPLETING and ok.state_flags == ("COMPLETED", "COMPLETING")


def test_squeue_fields_agree_with_squeue_json_recorded_at_the_same_moment() -> None:
    fields = parse.parse_squeue_fields(text(V22 / "squeue_O_terminal.txt"))
    as_json = parse.parse_squeue_json(text(V22 / "squeue_terminal.json"))
    for job_id in ("1", "2", "3", "4", "6", "10", "11"):
        a, b = fields[job_id], as_json[job_id]
        assert (a.name, a.state, a.nodes, a.exit_code, a.signal, a.restarts, a.reservation) == (
            b.name,
            b.state,
            b.nodes,
            b.exit_code,
            b.signal,
            b.restarts,
            b.reservation,
        ), job_id
        assert (a.submit_time, a.start_time) == (b.submit_time, b.start_time)


def test_squeue_fields_keep_a_name_with_the_separator() -> None:
    line = text(V22 / "squeue_O_terminal.txt").splitlines()[0].replace("two-node", "a|b")
    assert parse.parse_squeue_fields(line)["1"].name == "a|b"


# ------------------------------------------------------------------ sacct


def test_sacct_parsable_requeued_job_has_one_record_per_run() -> None:
    records = parse.parse_sacct_parsable(text(V22 / "sacct_allocations.parsable2.txt"))
    runs = [r for r in records if r.job_id == "6"]
    assert [(r.state, r.requeues) for r in runs] == [(JobState.REQUEUED, 0), (JobState.RUNNING, 1)]
    assert runs[1].reservation == "maint" and runs[0].nodes == ("node3",)
    assert parse.latest_runs(records)["6"].state is JobState.RUNNING


def test_sacct_parsable_exit_codes_states_and_steps() -> None:
    records = parse.parse_sacct_parsable(text(V22 / "sacct_steps_duplicates.parsable2.txt"))
    by_key = {(r.job_id, r.step, r.requeues): r for r in records}
    assert (by_key["3", None, 0].state, by_key["3", None, 0].exit_code) == (JobState.FAILED, 3)
    assert by_key["1", "batch", 0].signal == 15
    assert by_key["1", "0", 0].nodes == ("node1", "node2")
    assert by_key["10", None, 0].state is JobState.TIMEOUT
    assert by_key["6", "batch", 0].state is JobState.CANCELLED  # the first run's batch step
    assert by_key["6", "batch", 1].state is JobState.RUNNING
    assert by_key["5", None, 0].start_time is None


def test_sacct_json_24_11() -> None:
    records = parse.parse_sacct_json(text(V24 / "sacct.json"))
    runs = [r for r in records if r.job_id == "6" and r.step is None]
    assert [(r.state, r.requeues, r.reservation) for r in runs] == [
        (JobState.REQUEUED, 0, ""),
        (JobState.RUNNING, 1, "maint"),
    ]
    steps = {(r.job_id, r.step, r.requeues): r for r in records if r.step}
    assert steps["6", "batch", 0].signal == 15 and steps["1", "0", 0].nodes == ("node1", "node2")
    job3 = next(r for r in records if r.job_id == "3" and r.step is None)
    assert (job3.state, job3.exit_code, job3.elapsed_s) == (JobState.FAILED, 3, 0)


def test_sacct_json_22_05_loses_exit_codes_so_the_cli_reads_parsable2() -> None:
    """Why the CLI backend does not use `sacct --json` on 22.05 (openapi v0.0.38)."""
    as_json = {r.job_id: r for r in parse.parse_sacct_json(text(V22 / "sacct_terminal.json"))}
    parsable = parse.latest_runs(parse.parse_sacct_parsable(text(V22 / "sacct_allocations.parsable2.txt")))
    assert parsable["3"].exit_code == 3 and as_json["3"].exit_code == 0
    assert parsable["6"].reservation == "maint" and as_json["6"].reservation == ""
    assert as_json["3"].state is JobState.FAILED  # the state itself is right


def test_sacct_json_22_05_steps_and_duplicates() -> None:
    records = parse.parse_sacct_json(text(V22 / "sacct_requeued_steps.json"))
    assert [(r.step, r.state, r.requeues) for r in records] == [
        (None, JobState.REQUEUED, 0),
        ("batch", JobState.CANCELLED, 0),
        (None, JobState.RUNNING, 1),
        ("batch", JobState.RUNNING, 1),
    ]


# ------------------------------------------------------------------ nodes


NODE_SOURCES = [
    (parse.parse_nodes_json, V22 / "sinfo.json"),
    (parse.parse_scontrol_nodes, V22 / "scontrol_show_node.txt"),
    (parse.parse_scontrol_nodes, V22 / "scontrol_show_node_oneliner.txt"),
    (parse.parse_nodes_json, V24 / "scontrol_show_nodes.json"),
    (parse.parse_nodes_json, V24 / "sinfo.json"),
]


@pytest.mark.parametrize(("parser", "path"), NODE_SOURCES, ids=lambda x: getattr(x, "name", ""))
def test_nodes_drained_with_reason(parser: object, path: Path) -> None:
    nodes = parser(text(path))  # type: ignore[operator]
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    drained = nodes["node4"]
    assert drained.drained and {"IDLE", "DRAIN"} <= drained.state
    assert (drained.reason, drained.reason_user, drained.reason_time) == (
        "h-slurm: disk check failed",
        "root",
        SUBMIT,
    )
    busy = nodes["node1"]
    assert busy.state == {"ALLOCATED"} and not busy.drain and busy.reason == ""
    assert (busy.features, busy.address, busy.hostname) == (("gpu", "rack1"), "10.200.0.11", "node1")
    assert "MAINTENANCE" in nodes["node3"].state


def test_sinfo_fields() -> None:
    nodes = parse.parse_sinfo_fields(text(V22 / "sinfo.format.txt"))
    assert nodes["node4"].drained and nodes["node4"].reason == "h-slurm: disk check failed"
    assert nodes["node1"].state == {"ALLOCATED"} and nodes["node1"].reason == ""


def test_scontrol_reason_may_contain_equals_signs() -> None:
    line = text(V22 / "scontrol_show_node_oneliner.txt").splitlines()[3]
    line = line.replace("h-slurm: disk check failed", "NHC: mount=/scratch missing")
    node = parse.parse_scontrol_nodes(line)["node4"]
    assert (node.reason, node.reason_user) == ("NHC: mount=/scratch missing", "root")


def test_draining_node_is_not_drained() -> None:
    line = text(V22 / "scontrol_show_node_oneliner.txt").splitlines()[3]
    node = parse.parse_scontrol_nodes(line.replace("State=IDLE+DRAIN", "State=ALLOCATED+DRAIN"))["node4"]
    assert node.drain and not node.drained


@pytest.mark.parametrize(("parser", "path"), NODE_SOURCES[:4], ids=lambda x: getattr(x, "name", ""))
def test_node_hardware(parser: object, path: Path) -> None:
    """The recorded nodes declare CPUs=2 only: Slurm counts each CPU as a socket of one core."""
    node = parser(text(path))["node1"]  # type: ignore[operator]
    assert (node.cpus, node.sockets, node.cores_per_socket, node.threads_per_core) == (2, 2, 1, 1)
    assert node.gres == ()


@pytest.mark.parametrize(
    ("parser", "name"),
    [
        (parse.parse_scontrol_nodes, "scontrol_show_node_gres_oneliner.txt"),
        (parse.parse_nodes_json, "sinfo_gres.json"),
    ],
)
def test_node_gres_with_their_sockets(parser: object, name: str) -> None:
    nodes = parser(text(V22 / name))  # type: ignore[operator]
    assert nodes["node1"].gres == (Gres("gpu", "tesla", 2, (0,)),)
    assert nodes["node3"].gres == (Gres("gpu", "a100", 1, (0,)), Gres("gpu", "t4", 1, (0,)))
    assert nodes["node4"].gres == (Gres("gpu", "tesla", 2, ()),)


@pytest.mark.parametrize(
    ("gres", "expected"),
    [
        # Shapes of src/common/gres.c _build_node_gres_str: sockets as bit_fmt writes them, counts
        # with a K/M/G suffix, no type, no count (one).
        ("gpu:h100:8(S:0-1)", (Gres("gpu", "h100", 8, (0, 1)),)),
        ("gpu:h100:4(S:0),gpu:h100:4(S:1)", (Gres("gpu", "h100", 4, (0,)), Gres("gpu", "h100", 4, (1,)))),
        ("gpu:2(S:0,2),mps:4K", (Gres("gpu", "", 2, (0, 2)), Gres("mps", "", 4096, ()))),
        ("gpu", (Gres("gpu", "", 1, ()),)),
        ("(null)", ()),
        ("", ()),
    ],
)
def test_gres_strings(gres: str, expected: tuple[Gres, ...]) -> None:
    assert parse.parse_gres(gres) == expected


def test_unreadable_gres_is_a_slurm_error() -> None:
    with pytest.raises(SlurmError, match="cannot read GRES"):
        parse.parse_gres("gpu:2(S:0")


# ------------------------------------------------------------------ partitions, topology, config


def test_partitions() -> None:
    (debug,) = parse.parse_scontrol_partitions(text(V22 / "scontrol_show_partition_oneliner.txt")).values()
    assert (debug.name, debug.nodes, debug.default, debug.state) == (
        "debug",
        ("node1", "node2", "node3", "node4"),
        True,
        "UP",
    )


def test_topology_leaves_and_spine() -> None:
    switches = parse.parse_scontrol_topology(text(V22 / "scontrol_show_topology.txt"))
    assert [(s.name, s.level, s.nodes, s.switches) for s in switches] == [
        ("sw1", 0, ("node1", "node2"), ()),
        ("sw2", 0, ("node3", "node4"), ()),
        ("spine", 1, ("node1", "node2", "node3", "node4"), ("sw1", "sw2")),
    ]
    assert [s.leaf for s in switches] == [True, True, False]
    assert parse.parse_scontrol_topology("") == []


def test_cluster_config() -> None:
    config = parse.parse_scontrol_config(text(V22 / "scontrol_show_config.txt"))
    etc = "/var/lib/slurm-chaos/sandboxes/hinit/etc"
    assert (config.name, config.plugstack_conf, config.topology_plugin) == (
        "chaos3",
        f"{etc}/plugstack.conf",
        "topology/tree",
    )
    # What `plugin check` audits: the hooks slurmd runs and the plugins that contain jobs.
    assert (config.slurm_conf, config.prolog, config.epilog) == (
        f"{etc}/slurm.conf",
        f"{etc}/prolog",
        f"{etc}/epilog",
    )
    assert config.prolog_flags == ("Alloc",) and config.proctrack_type == "proctrack/linuxproc"
    assert config.task_plugin == ("task/none",) and config.job_submit_plugins == ()
    assert config.health_check_program == f"{etc}/healthcheck"


# ------------------------------------------------------------------ reservations and jobs


@pytest.mark.parametrize("name", ["scontrol_show_reservation.txt", "scontrol_show_reservation_oneliner.txt"])
def test_reservation(name: str) -> None:
    resv = parse.parse_scontrol_reservations(text(V22 / name))["maint"]
    assert resv.nodes == ("node3", "node4") and resv.users == ("root",) and resv.accounts == ()
    assert {"MAINT", "IGNORE_JOBS"} <= resv.flags and resv.state == "ACTIVE"
    assert resv.start == SUBMIT and resv.end == datetime(2026, 11, 30, 6, 49, 6, tzinfo=UTC)


def test_no_reservation() -> None:
    assert parse.parse_scontrol_reservations(text(V22 / "scontrol_show_reservation_none.txt")) == {}


def test_scontrol_jobs_one_liner_and_multi_line() -> None:
    jobs = parse.parse_scontrol_jobs(text(V22 / "scontrol_show_job_oneliner.txt"))
    assert jobs["2"].name == "leaf switch" and jobs["2"].nodes == ("node1", "node2")
    assert jobs["7"].reason == "ReqNodeNotAvail,_UnavailableNodes:node4"
    single = parse.parse_scontrol_jobs(text(V22 / "scontrol_show_job.txt"))["6"]
    assert (single.state, single.restarts, single.reservation) == (JobState.PENDING, 1, "maint")
    assert single == jobs["6"]
    timeout = parse.parse_scontrol_jobs(text(V22 / "scontrol_show_job_timeout_oneliner.txt"))["10"]
    assert timeout.state is JobState.TIMEOUT and timeout.nodes == ("node1",)


def test_invalid_json_names_the_command() -> None:
    with pytest.raises(SlurmError, match="squeue --json printed invalid JSON"):
        parse.parse_squeue_json("slurm_load_jobs error: Unable to contact slurm controller")


def test_a_reused_job_id_is_a_new_job_not_a_requeue() -> None:
    """A controller whose state was wiped hands out ids slurmdbd has seen: only REQUEUED links runs."""
    lines = {ln.split("|")[0]: ln for ln in text(V22 / "sacct_allocations.parsable2.txt").splitlines()}
    reused = (
        lines["3"]
        .replace("3|3|failing", "4|4|failing")
        .replace("2026-11-30T04:49:06", "2026-11-30T05:00:00", 1)
    )
    records = parse.parse_sacct_parsable(lines["4"] + "\n" + reused + "\n")
    assert [(r.name, r.requeues) for r in records] == [("ok", 0), ("failing", 0)]
    assert parse.latest_runs(records)["4"].name == "failing"


def test_scontrol_config_of_slurm_24_11_numbers_its_prolog_and_epilog() -> None:
    """Seen in the Debian 13 sandbox (24.11.5): `Prolog[0] = ...`, not `Prolog = ...`."""
    from slurm_chaos.slurm.parse import parse_scontrol_config

    text = (
        "Epilog[0]               = /etc/slurm/epilog\n"
        "EpilogMsgTime           = 2000 usec\n"
        "Prolog[0]               = /etc/slurm/prolog\n"
        "PrologFlags             = Alloc,Contain\n"
    )
    conf = parse_scontrol_config(text)
    assert (conf.prolog, conf.epilog, conf.prolog_flags) == (
        "/etc/slurm/prolog",
        "/etc/slurm/epilog",
        ("Alloc", "Contain"),
    )


# ------------------------------------------------------------------ time limits (sbatch --time)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30 * 60),  # a bare number is minutes
        ("30:15", 30 * 60 + 15),  # MM:SS
        ("02:03:04", 2 * 3600 + 3 * 60 + 4),  # HH:MM:SS
        ("1-02", 26 * 3600),  # D-HH
        ("1-02:30", 26 * 3600 + 30 * 60),  # D-HH:MM
        ("1-02:30:05", 26 * 3600 + 30 * 60 + 5),  # D-HH:MM:SS
        ("00:30:00", 1800),
        (" 45 ", 45 * 60),
    ],
)
def test_time_limit_reads_each_of_slurms_formats(text: str, seconds: int) -> None:
    assert parse.parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["UNLIMITED", "infinite"])
def test_an_unlimited_time_limit_has_no_seconds(text: str) -> None:
    assert parse.parse_time_limit(text) is None


@pytest.mark.parametrize("text", ["", "1-2-3", "1:2:3:4", "-5", "1-", "30m", "1-02:03:04:05"])
def test_a_malformed_time_limit_names_the_formats(text: str) -> None:
    with pytest.raises(ValueError, match="MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS"):
        parse.parse_time_limit(text)
