"""Each health check on fake /proc, /sys and kernel-log inputs, heartbeats and NVML facts."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from slurm_chaos.observe import checks
from slurm_chaos.observe.checks import CRITICAL, OK, WARNING, GpuFacts, GpuState, Task, Thresholds
from slurm_chaos.probe.heartbeat import Beat

NOW = 10_000.0
TH = Thresholds()


def beat(
    job: str,
    rank: int,
    host: str,
    compute: float,
    age: float = 1.0,
    window: int = 10,
    checkpoint_failures: int = 0,
    numa_mismatch: bool = False,
) -> Beat:
    return Beat(
        job,
        rank,
        host,
        NOW - age,
        50,
        window,
        compute + 0.02,
        compute,
        0.02,
        checkpoint_failures,
        numa_mismatch,
    )


# ---------------------------------------------------------------- straggler


def test_straggler_on_this_node_is_critical_and_names_job_rank_and_ratio() -> None:
    beats = [beat("9", 0, "node1", 0.050), beat("9", 1, "node2", 0.100), beat("9", 2, "node3", 0.052)]
    res = checks.check_straggler("node2", beats, TH, NOW)
    assert res.status == CRITICAL
    assert "job 9 rank 1" in res.message and "1.96x" in res.message
    # Its peers only wait for it: they are fine.
    assert checks.check_straggler("node1", beats, TH, NOW).status == OK


def test_straggler_ignores_stale_short_and_tiny_differences() -> None:
    stale = [beat("9", 0, "node1", 0.05), beat("9", 1, "node2", 0.10, age=60)]
    assert checks.check_straggler("node2", stale, TH, NOW).status == OK
    short = [beat("9", 0, "node1", 0.05), beat("9", 1, "node2", 0.10, window=2)]
    assert checks.check_straggler("node2", short, TH, NOW).status == OK
    # 2x of a 1 ms step is noise on a busy host, not a slow device.
    tiny = [beat("9", 0, "node1", 0.001), beat("9", 1, "node2", 0.002)]
    assert checks.check_straggler("node2", tiny, TH, NOW).status == OK


def test_straggler_threshold_is_configurable() -> None:
    beats = [beat("9", 0, "node1", 0.050), beat("9", 1, "node2", 0.070)]
    assert checks.check_straggler("node2", beats, TH, NOW).status == CRITICAL
    assert checks.check_straggler("node2", beats, Thresholds(straggler_ratio=1.5), NOW).status == OK


# ---------------------------------------------------------------- NUMA


def _fake_pid(root: Path, pid: int, ppid: int, cmdline: str, status: str, env: dict[str, str]) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")
    (d / "cmdline").write_bytes(cmdline.encode() + b"\0")
    (d / "stat").write_text(f"{pid} ({cmdline.split()[0][:15]}) S {ppid} {pid} {pid} 0 -1\n")
    (d / "status").write_text(f"Name:\t{cmdline.split()[0][:15]}\nPid:\t{pid}\n{status}")


def fake_proc(
    root: Path,
    procs: dict[int, tuple[dict[str, str], str]],
    parents: dict[int, int] | None = None,
    stepd_uid: int = 0,
) -> Path:
    """A /proc: pid -> (environment, Cpus_allowed_list). Each step named in an environment gets a
    slurmstepd process (running as `stepd_uid`) whose child the process is, unless `parents` says
    which process its parent is."""
    stepds: dict[tuple[str, str], int] = {}
    for env, _ in procs.values():
        if "SLURM_STEP_ID" in env:
            stepds.setdefault((env["SLURM_JOB_ID"], env["SLURM_STEP_ID"]), 9000 + len(stepds))
    for (job, step), pid in stepds.items():
        uid = f"Uid:\t{stepd_uid}\t{stepd_uid}\t{stepd_uid}\t{stepd_uid}\n"
        _fake_pid(root, pid, 1, f"slurmstepd: [{job}.{step}]", uid, {"SLURM_JOB_ID": job})
    for pid, (env, cpus) in procs.items():
        stepd = stepds.get((env.get("SLURM_JOB_ID", ""), env.get("SLURM_STEP_ID", "")), 1)
        status = f"Uid:\t1000\t1000\t1000\t1000\nCpus_allowed_list:\t{cpus}\nMems_allowed_list:\t0\n"
        _fake_pid(root, pid, (parents or {}).get(pid, stepd), "python3 train.py", status, env)
    (root / "self").mkdir()
    return root


def task_env(job: str, step: str, rank: int, node: str, **extra: str) -> dict[str, str]:
    return {
        "PATH": "/usr/bin",
        "SLURM_JOB_ID": job,
        "SLURM_STEP_ID": step,
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": node,
        **extra,
    }


def fake_sys(root: Path, nodes: dict[int, str]) -> Path:
    for n, cpus in nodes.items():
        d = root / "devices/system/node" / f"node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    return root


def test_scan_tasks_keeps_this_nodes_task_processes_only(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path,
        {
            100: (task_env("5", "0", 1, "node2", SLURM_CPUS_ON_NODE="2"), "1"),
            101: (task_env("5", "0", 1, "node2"), "0-1"),  # a child of the task: same task (below)
            102: (task_env("5", "0", 0, "node1"), "0-1"),  # another node's task (shared /proc)
            103: ({**task_env("5", "batch", 0, "node2")}, "0-1"),  # the batch script
            104: ({"SLURM_JOB_ID": "5", "SLURMD_NODENAME": "node2"}, "0-1"),  # slurmstepd-like, no step
            105: ({"HOME": "/root"}, "0-1"),
        },
        parents={101: 100},
    )
    (tasks_,) = [checks.scan_tasks("node2", proc)]
    assert [(t.pid, t.job_id, t.step_id, t.procid, sorted(t.cpus), t.cpus_on_node) for t in tasks_] == [
        (100, "5", "0", 1, [1], 2)
    ]


def test_scan_tasks_believes_slurmstepd_not_the_environment(tmp_path: Path) -> None:
    """Anyone can put SLURM_* into an environment; only Slurm runs a root slurmstepd for the step."""
    squeezed = task_env("5", "0", 0, "node2", SLURM_CPUS_PER_TASK="2")
    forged = fake_proc(tmp_path / "a", {100: (squeezed, "0")}, parents={100: 1})  # no slurmstepd above it
    assert checks.scan_tasks("node2", forged) == []
    other = fake_proc(tmp_path / "b", {100: (squeezed, "0"), 101: (task_env("6", "0", 0, "node2"), "0-1")})
    (other / "100" / "stat").write_text("100 (python3) S 101 100 100 0 -1\n")  # under job 6's task
    assert [t.job_id for t in checks.scan_tasks("node2", other)] == ["6"]
    users = fake_proc(tmp_path / "c", {100: (squeezed, "0")}, stepd_uid=1000)  # a user's 'slurmstepd'
    assert checks.scan_tasks("node2", users) == []
    real = fake_proc(tmp_path / "d", {100: (squeezed, "0")})
    assert [t.pid for t in checks.scan_tasks("node2", real)] == [100]


def test_scan_tasks_skips_processes_of_other_namespaces(tmp_path: Path) -> None:
    """In the sandbox, another sandbox's node2 shares /proc and the node name, not the namespaces."""
    proc = fake_proc(
        tmp_path,
        {500: (task_env("5", "0", 0, "node2"), "0-1"), 501: (task_env("9", "0", 0, "node2"), "0-1")},
    )
    (proc / "self" / "ns").mkdir()
    for pid, ns in (("self", 1), ("500", 1), ("501", 2)):
        (proc / pid / "ns").mkdir(exist_ok=True)
        os.symlink(f"net:[{ns}]", proc / pid / "ns" / "net")
        os.symlink(f"uts:[{ns}]", proc / pid / "ns" / "uts")
    assert [t.job_id for t in checks.scan_tasks("node2", proc)] == ["5"]


def test_numa_squeeze_below_cpu_share_is_critical(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", {200: (task_env("7", "0", 1, "node2", SLURM_CPUS_ON_NODE="2"), "1")})
    tasks_ = checks.scan_tasks("node2", proc)
    res = checks.check_numa("node2", tasks_, {0: frozenset({0, 1})}, {}, [], TH, NOW)
    assert res.status == CRITICAL and "job 7 rank 1 bound to 1 CPU(s) (1) of its share of 2" in res.message
    assert checks.check_numa("node2", tasks_, {}, {}, [], Thresholds(numa_share=False), NOW).status == OK


def test_numa_several_ranks_squeezed_onto_fewer_cpus_than_ranks(tmp_path: Path) -> None:
    procs = {300 + r: (task_env("8", "0", r, "node1"), "3") for r in range(3)}
    tasks_ = checks.scan_tasks("node1", fake_proc(tmp_path / "proc", procs))
    res = checks.check_numa("node1", tasks_, {}, {}, [], Thresholds(numa_share=False), NOW)
    assert res.status == CRITICAL and "3 ranks squeezed onto CPUs 3" in res.message


def test_numa_well_bound_tasks_pass(tmp_path: Path) -> None:
    procs = {
        400: (task_env("8", "0", 0, "node1", SLURM_CPUS_ON_NODE="4"), "0-1"),
        401: (task_env("8", "0", 1, "node1", SLURM_CPUS_ON_NODE="4", SLURM_LOCALID="1"), "2-3"),
    }
    tasks_ = checks.scan_tasks("node1", fake_proc(tmp_path / "proc", procs))
    res = checks.check_numa("node1", tasks_, {0: frozenset({0, 1, 2, 3})}, {}, [], TH, NOW)
    assert res.status == OK, res.message


def test_numa_task_bound_away_from_its_gpu(tmp_path: Path) -> None:
    sys_root = fake_sys(tmp_path / "sys", {0: "0-3", 1: "4-7"})
    layout = checks.numa_layout(sys_root)
    assert layout == {0: frozenset(range(4)), 1: frozenset(range(4, 8))}
    env = task_env("3", "0", 0, "gpu1", SLURM_STEP_GPUS="1,0", SLURM_CPUS_PER_TASK="4")
    task = Task(1, "3", "0", 0, frozenset(range(4)), 8, 4, checks._gpus(env), 0)
    assert task.gpus == (1, 0)
    res = checks.check_numa("gpu1", [task], layout, {0: 0, 1: 1}, [], TH, NOW)
    assert res.status == CRITICAL and "GPU 1 is on NUMA node 1, its CPUs 0-3 on node(s) 0" in res.message
    near = Task(1, "3", "0", 0, frozenset(range(4, 8)), 8, 4, (1,), 0)
    assert checks.check_numa("gpu1", [near], layout, {0: 0, 1: 1}, [], TH, NOW).status == OK


def test_numa_mismatch_reported_by_the_probe_heartbeat() -> None:
    beats = [beat("4", 0, "node1", 0.05, numa_mismatch=True), beat("4", 1, "node2", 0.05)]
    assert checks.check_numa("node1", [], {}, {}, beats, TH, NOW).status == CRITICAL
    assert checks.check_numa("node2", [], {}, {}, beats, TH, NOW).status == OK


# ---------------------------------------------------------------- checkpoint storage


def test_checkpoint_writable_and_free(tmp_path: Path) -> None:
    res = checks.check_checkpoint("node1", str(tmp_path), [], TH, NOW)
    assert res.status == OK and "writable" in res.message
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_checkpoint_too_little_free_space(tmp_path: Path) -> None:
    res = checks.check_checkpoint("node1", str(tmp_path), [], Thresholds(checkpoint_min_free_mb=1e12), NOW)
    assert res.status == CRITICAL and "MiB free (< 1e+12 MiB)" in res.message


def test_checkpoint_write_error_and_missing_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The write fails like on a broken volume (here: the file exists; it is never written through).
    monkeypatch.setattr(checks.secrets, "token_hex", lambda n: "fixed")
    (tmp_path / ".slurm-chaos-health.node1.fixed").mkdir()
    res = checks.check_checkpoint("node1", str(tmp_path), [], TH, NOW)
    assert res.status == CRITICAL and res.message.startswith(f"cannot write to {tmp_path}")
    assert checks.check_checkpoint("node1", str(tmp_path / "nope"), [], TH, NOW).status == WARNING


def test_checkpoint_probe_never_writes_through_a_users_file_or_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for pid in range(os.getpid() - 50, os.getpid() + 50):  # the names the probe file once had
        (ckpt / f".slurm-chaos-health.node1.{pid}").symlink_to(victim)
    assert checks.check_checkpoint("node1", str(ckpt), [], TH, NOW).status == OK
    monkeypatch.setattr(checks.secrets, "token_hex", lambda n: "guessed")
    (ckpt / ".slurm-chaos-health.node1.guessed").symlink_to(victim)  # even a name guessed right
    res = checks.check_checkpoint("node1", str(ckpt), [], TH, NOW)
    assert res.status == CRITICAL and "File exists" in res.message
    assert victim.read_text() == "precious\n" and (ckpt / ".slurm-chaos-health.node1.guessed").is_symlink()


def test_checkpoint_hanging_write_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    # A write that blocks, as on a hung storage server.
    monkeypatch.setattr(checks, "_write_probe", lambda directory, prefix: release.wait(10))
    try:
        res = checks.check_checkpoint("node1", str(tmp_path), [], Thresholds(checkpoint_timeout_s=0.3), NOW)
        assert res.status == CRITICAL and "hangs (> 0.3 s)" in res.message
    finally:
        release.set()


def test_checkpoint_failures_from_the_probe_heartbeat(tmp_path: Path) -> None:
    beats = [beat("6", 1, "node3", 0.05, checkpoint_failures=3)]
    res = checks.check_checkpoint("node3", str(tmp_path), beats, TH, NOW)
    assert res.status == CRITICAL and "job 6 rank 1: 3 checkpoint write(s) failed" in res.message
    assert checks.check_checkpoint("node1", str(tmp_path), beats, TH, NOW).status == OK


# ---------------------------------------------------------------- what a CRITICAL rests on


def test_each_job_finding_names_its_job_and_the_nodes_own_measurements_none(tmp_path: Path) -> None:
    """What a job reports about itself, or sets for itself, is its finding; root's write is the node's."""
    slow = [beat("9", 0, "node2", 0.05), beat("9", 1, "node2", 0.5), beat("8", 0, "node2", 0.05)]
    straggler = checks.check_straggler("node2", slow, TH, NOW)
    assert [f.job_id for f in straggler.findings] == ["9"]
    assert straggler.message == "; ".join(f.text for f in straggler.findings)

    procs = {300 + r: (task_env("12", "0", r, "node1"), "0") for r in range(2)}
    tasks_ = checks.scan_tasks("node1", fake_proc(tmp_path / "proc", procs))
    flagged = [beat("11", 0, "node1", 0.05, numa_mismatch=True)]
    numa = checks.check_numa("node1", tasks_, {}, {}, flagged, Thresholds(numa_share=False), NOW)
    assert numa.status == CRITICAL and [f.job_id for f in numa.findings] == ["11", "12"]

    failed = [beat("6", 1, "node3", 0.05, checkpoint_failures=1)]
    reported = checks.check_checkpoint("node3", str(tmp_path), failed, TH, NOW)
    assert [f.job_id for f in reported.findings] == ["6"]
    full = Thresholds(checkpoint_min_free_mb=1e12)
    both = checks.check_checkpoint("node3", str(tmp_path), failed, full, NOW)
    assert [f.job_id for f in both.findings] == ["6", None]  # root's own probe found the storage full
    alone = checks.check_checkpoint("node3", str(tmp_path), [], full, NOW)
    assert alone.status == CRITICAL and [f.job_id for f in alone.findings] == [None]


def test_heartbeat_checkpoint_failures_no_longer_skip_roots_own_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's failure report does not stand in for the node's measurement: both are made."""
    probed: list[str] = []
    monkeypatch.setattr(checks, "_timed_write", lambda d, n, t: probed.append(str(d)))
    failed = [beat("6", 1, "node3", 0.05, checkpoint_failures=1)]
    checks.check_checkpoint("node3", str(tmp_path), failed, TH, NOW)
    assert probed == [str(tmp_path)]


# ---------------------------------------------------------------- GPUs

KMSG = [
    "6,1001,5000000,-;eth0: link up\n",
    "3,1002,100000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus.\n",
    "3,1003,200000000,-;NVRM: Xid (PCI:0000:86:00): 13, pid=1234, name=python, Graphics Exception\n",
]


def test_parse_kmsg_finds_xid_lines() -> None:
    assert checks.parse_kmsg(KMSG) == [(100.0, "0000:3b:00", 79), (200.0, "0000:86:00", 13)]


def test_read_kmsg_of_a_plain_file_and_a_missing_one(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("".join(KMSG))
    assert checks.parse_kmsg(["".join(checks.read_kmsg(log))])[0][2] == 79
    assert checks.read_kmsg(tmp_path / "none") == []


GPUS = (GpuState(0, "00000000:3B:00.0", 0, 0, False, False, 0, 1980, 1980, 99),)


def test_xid_recent_is_critical_old_or_application_xid_is_not() -> None:
    xids = tuple(checks.parse_kmsg(KMSG))
    facts = GpuFacts(GPUS, expected=1, xids=xids)
    res = checks.check_gpu_xid(facts, TH, uptime=160.0)
    assert res.status == CRITICAL and res.message.startswith("Xid 79 on GPU 0000:3b:00 60 s ago")
    # 79 left the window; 13 is an application's own fault.
    assert checks.check_gpu_xid(facts, TH, uptime=450.0).status == OK


def test_missing_gpu_and_cpu_nodes() -> None:
    assert (
        checks.check_gpu_xid(GpuFacts((), error="NVML did not initialise", expected=2), TH, 1.0).status
        == CRITICAL
    )
    cpu = GpuFacts(error="no GPUs configured for this node")
    for res in (
        checks.check_gpu_xid(cpu, TH, 1.0),
        checks.check_gpu_ecc(cpu),
        checks.check_gpu_throttle(cpu, TH),
    ):
        assert res.status == OK and "skipped" in res.message
    assert checks.read_gpus(0).error == "no GPUs configured for this node"


def test_ecc_uncorrected_and_row_remapping() -> None:
    assert checks.check_gpu_ecc(GpuFacts(GPUS, expected=1)).status == OK
    bad = GpuFacts((GpuState(0, "b", ecc_uncorrected=2), GpuState(1, "c", remap_pending=True)), expected=2)
    res = checks.check_gpu_ecc(bad)
    assert res.status == CRITICAL
    assert (
        "GPU 0: 2 uncorrected ECC error(s)" in res.message and "GPU 1: row remapping pending" in res.message
    )


def test_throttle_by_reason_and_by_low_clock_under_load() -> None:
    assert checks.check_gpu_throttle(GpuFacts(GPUS, expected=1), TH).status == OK
    thermal = GpuState(0, "b", clock_reasons=0x40, sm_clock=900, sm_clock_max=1980, utilization=99)
    locked = GpuState(1, "c", sm_clock=300, sm_clock_max=1980, utilization=95)
    idle = GpuState(2, "d", sm_clock=300, sm_clock_max=1980, utilization=0)
    res = checks.check_gpu_throttle(GpuFacts((thermal, locked, idle), expected=3), TH)
    assert res.status == CRITICAL
    assert (
        "GPU 0: slowdown reasons 0x40" in res.message and "GPU 1: 95% busy at 300 of 1980 MHz" in res.message
    )
    assert "GPU 2" not in res.message


@pytest.mark.parametrize("reasons", [0x1, 0x2, 0x100])  # idle, application clocks, display: not slowdowns
def test_throttle_ignores_benign_clock_reasons(reasons: int) -> None:
    g = GpuState(0, "b", clock_reasons=reasons, sm_clock=1980, sm_clock_max=1980, utilization=99)
    assert checks.check_gpu_throttle(GpuFacts((g,), expected=1), TH).status == OK


class FakeNvml:
    """The few pynvml calls the check makes, answering like one H100 that is power-capped."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_CLOCK_SM = 1

    class NotSupported(Exception):
        pass

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def nvmlDeviceGetPciInfo(self, h: str) -> object:
        return type("Pci", (), {"busId": b"00000000:3B:00.0"})()

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: str) -> int:
        return 0x4

    def nvmlDeviceGetRemappedRows(self, h: str) -> tuple[int, int, int, int]:
        raise self.NotSupported()

    def nvmlDeviceGetUtilizationRates(self, h: str) -> object:
        return type("Util", (), {"gpu": 97})()

    def nvmlDeviceGetTotalEccErrors(self, h: str, kind: int, counter: int) -> int:
        assert (kind, counter) == (1, 0)
        return 3

    def nvmlDeviceGetClockInfo(self, h: str, clock: int) -> int:
        return 1100

    def nvmlDeviceGetMaxClockInfo(self, h: str, clock: int) -> int:
        return 1980


def test_gpu_state_from_nvml_and_sysfs(tmp_path: Path) -> None:
    dev = tmp_path / "bus/pci/devices/0000:3b:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    g = checks._gpu_state(FakeNvml(), 0, tmp_path)
    assert g == GpuState(0, "00000000:3B:00.0", 1, 3, False, False, 0x4, 1100, 1980, 97)
    facts = GpuFacts((g,), expected=1)
    assert checks.check_gpu_throttle(facts, TH).message == "GPU 0: slowdown reasons 0x4"
    assert checks.check_gpu_ecc(facts).message == "GPU 0: 3 uncorrected ECC error(s)"
