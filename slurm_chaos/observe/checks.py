"""The node checks behind `slurm-chaos-healthcheck`, and the readers of the node facts they judge.

Readers take their roots (/proc, /sys, /dev/kmsg) as arguments so tests feed them fake trees;
checks are pure functions of those facts and return one `Result` each.

A CRITICAL result says what it rests on in its `findings`: a finding of a job rests on what that job
reports about itself or sets for itself (its heartbeats; its tasks' CPU binding, which `taskset`
changes), which any user can forge for their own job; a finding without a job is the node's own
measurement (GPUs through NVML and the kernel log, root's own write to the checkpoint storage).
Whether a job's findings may drain the node is the health check's decision, not the checks'.
"""

from __future__ import annotations

import os
import re
import secrets
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_chaos.probe.heartbeat import Beat, straggler_ratio
from slurm_chaos.probe.telemetry import SLOWDOWN_MASK, format_cpulist, parse_cpulist, sysfs_bus_id

SIGNALS = ("gpu_xid", "gpu_ecc", "gpu_throttle", "numa", "checkpoint", "straggler")
# Nagios / NHC exit codes.
OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
STATUS_WORDS = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
# XIDs an application causes on its own (illegal address, MMU fault from a kernel bug, preemption):
# they say nothing about the node, so NHC setups leave them out.
APP_XIDS = frozenset({13, 31, 43, 45})
XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+)")


@dataclass(frozen=True)
class Finding:
    """One problem behind a CRITICAL result: of job `job_id` as the job's own reports show it, or
    measured by the node itself (`job_id` None)."""

    job_id: str | None
    text: str


@dataclass(frozen=True)
class Result:
    """The outcome of one check on one node; a CRITICAL one names what it rests on in `findings`
    (none: the node's own measurement, as for every GPU check)."""

    check: str
    status: int
    message: str
    findings: tuple[Finding, ...] = ()

    @property
    def word(self) -> str:
        return STATUS_WORDS[self.status]


@dataclass(frozen=True)
class Thresholds:
    """What counts as unhealthy; every value can be set in the config file."""

    straggler_ratio: float = 1.3
    straggler_min_steps: int = 3
    # Below this much extra compute per step a ratio is noise, not a slow device.
    straggler_min_delta_s: float = 0.002
    stale_after_s: float = 20.0
    checkpoint_min_free_mb: float = 64.0
    checkpoint_timeout_s: float = 5.0
    xid_window_s: float = 300.0
    xid_ignore: frozenset[int] = APP_XIDS
    throttle_clock_ratio: float = 0.5
    throttle_min_util: int = 50
    numa_share: bool = True
    #: At most one drain per node in this many seconds on findings of a policy-allowed job
    #: (root's jobs and the node's own measurements are not limited).
    report_drain_interval_s: float = 60.0


def reported(check: str, findings: Iterable[Finding]) -> Result:
    """A CRITICAL result resting on `findings`, its message theirs."""
    found = tuple(findings)
    return Result(check, CRITICAL, "; ".join(f.text for f in found), found)


# ---------------------------------------------------------------- straggler


def check_straggler(node: str, beats: Iterable[Beat], th: Thresholds, now: float) -> Result:
    """A rank of this node computing `straggler_ratio` times longer than its job's other ranks."""
    fresh = [b for b in beats if b.fresh(now, th.stale_after_s) and b.window >= th.straggler_min_steps]
    mine = [b for b in fresh if b.host == node]
    if not mine:
        return Result("straggler", OK, "no running probe rank on this node")
    slow = []
    for beat in mine:
        ratio = straggler_ratio(beat, fresh)
        if ratio is None:
            continue
        base = beat.compute_time / ratio
        if ratio > th.straggler_ratio and beat.compute_time - base > th.straggler_min_delta_s:
            peers = sum(1 for b in fresh if b.job_id == beat.job_id and b.rank != beat.rank)
            text = (
                f"job {beat.job_id} rank {beat.rank} computes {beat.compute_time * 1e3:.1f} ms/step, "
                f"{ratio:.2f}x the median of {peers} other rank(s)"
            )
            slow.append(Finding(beat.job_id, text))
    if slow:
        return reported("straggler", slow)
    return Result("straggler", OK, f"{len(mine)} rank(s) in step with their jobs")


# ---------------------------------------------------------------- NUMA binding


@dataclass(frozen=True)
class Task:
    """One Slurm task (rank) process running on this node."""

    pid: int
    job_id: str
    step_id: str
    procid: int
    cpus: frozenset[int]
    cpus_on_node: int | None = None
    cpus_per_task: int | None = None
    gpus: tuple[int, ...] = ()
    localid: int = 0


def _environ(pid_dir: Path) -> dict[str, str] | None:
    try:
        raw = (pid_dir / "environ").read_bytes()
    except OSError:
        return None
    if b"SLURM_JOB_ID=" not in raw:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.startswith((b"SLURM", b"CUDA_VISIBLE")):
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _cpus_allowed(pid_dir: Path) -> frozenset[int] | None:
    try:
        for line in (pid_dir / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return frozenset(parse_cpulist(line.split(":", 1)[1]))
    except (OSError, ValueError):
        return None
    return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _gpus(env: Mapping[str, str]) -> tuple[int, ...]:
    """The physical GPU indices of a task (Slurm's own list first: CUDA_VISIBLE_DEVICES may be renumbered)."""
    for key in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        text = env.get(key, "")
        ids = [int(x) for x in text.split(",") if x.strip().isdigit()]
        if ids:
            return tuple(ids)
    return ()


def _namespaces(pid_dir: Path) -> tuple[str, str] | None:
    try:
        return os.readlink(pid_dir / "ns/net"), os.readlink(pid_dir / "ns/uts")
    except OSError:
        return None


def _same_host(pid_dir: Path, mine: tuple[str, str] | None) -> bool:
    """Whether a process shares this check's network or UTS namespace (unknown counts as yes).

    In the sandbox every node (and every other sandbox's node of the same name) shares one /proc;
    a node is its own network and UTS namespace, and the check runs inside them.
    """
    theirs = _namespaces(pid_dir)
    return mine is None or theirs is None or theirs[0] == mine[0] or theirs[1] == mine[1]


STEPD_RE = re.compile(r"slurmstepd: \[(\d+)\.([A-Za-z0-9_]+)\]")
#: How far up a task's parents slurmstepd may be (a task, its shell, a launcher, the program).
MAX_DEPTH = 16


def _ppid(pid_dir: Path) -> int | None:
    try:
        return int((pid_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _root_stepd(pid_dir: Path) -> tuple[str, str] | None:
    """(job, step) of a slurmstepd running as root (every uid 0: a user's process may take the name)."""
    try:
        title = (pid_dir / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        status = (pid_dir / "status").read_text()
    except OSError:
        return None
    m = STEPD_RE.fullmatch(title.strip())
    uids = next((line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")), [])
    return (m.group(1), m.group(2)) if m and uids and all(u == "0" for u in uids) else None


def step_of(pid_dir: Path, proc: Path) -> tuple[str, str] | None:
    """The job step a process belongs to, as Slurm says it (its nearest slurmstepd parent's title),
    not as its environment says: anyone can write SLURM_JOB_ID into an environment."""
    here: Path | None = pid_dir
    for _ in range(MAX_DEPTH):
        ppid = _ppid(here) if here is not None else None
        if ppid is None or ppid <= 1:
            return None
        here = proc / str(ppid)
        step = _root_stepd(here)
        if step is not None:
            return step
    return None


def scan_tasks(node: str, proc: Path = Path("/proc")) -> list[Task]:
    """Task processes of Slurm steps on `node`: those whose environment names a step and a rank,
    and whose slurmstepd parent runs that very step.

    Processes of other nodes are skipped by their SLURMD_NODENAME and their namespaces; of the
    processes of one task, the lowest PID (the task itself) is kept.
    """
    tasks: dict[tuple[str, str, int], Task] = {}
    mine = _namespaces(proc / "self")
    for pid_dir in proc.glob("[0-9]*"):
        env = _environ(pid_dir)
        if env is None or "SLURM_STEP_ID" not in env or env.get("SLURMD_NODENAME", node) != node:
            continue
        if not _same_host(pid_dir, mine):
            continue
        if step_of(pid_dir, proc) != (env.get("SLURM_JOB_ID"), env["SLURM_STEP_ID"]):
            continue
        procid, cpus = _int(env.get("SLURM_PROCID")), _cpus_allowed(pid_dir)
        if procid is None or cpus is None or env["SLURM_STEP_ID"] in ("batch", "extern", "interactive"):
            continue
        task = Task(
            int(pid_dir.name),
            env["SLURM_JOB_ID"],
            env["SLURM_STEP_ID"],
            procid,
            cpus,
            _int(env.get("SLURM_CPUS_ON_NODE")),
            _int(env.get("SLURM_CPUS_PER_TASK")),
            _gpus(env),
            _int(env.get("SLURM_LOCALID")) or 0,
        )
        key = (task.job_id, task.step_id, task.procid)
        if key not in tasks or task.pid < tasks[key].pid:
            tasks[key] = task
    return sorted(tasks.values(), key=lambda t: (t.job_id, t.step_id, t.procid))


def numa_layout(sys_root: Path = Path("/sys")) -> dict[int, frozenset[int]]:
    """NUMA node -> its CPUs, from sysfs ({} where the kernel shows no nodes)."""
    out = {}
    for node_dir in (sys_root / "devices/system/node").glob("node[0-9]*"):
        try:
            out[int(node_dir.name[4:])] = frozenset(parse_cpulist((node_dir / "cpulist").read_text()))
        except (OSError, ValueError):
            continue
    return out


def _nodes_of(cpus: Iterable[int], layout: Mapping[int, frozenset[int]]) -> set[int]:
    wanted = set(cpus)
    return {n for n, members in layout.items() if wanted & members}


def _gpu_mismatch(
    task: Task, layout: Mapping[int, frozenset[int]], gpu_numa: Mapping[int, int]
) -> str | None:
    if not task.gpus or len(layout) < 2:
        return None
    gpu = task.gpus[task.localid % len(task.gpus)]
    node = gpu_numa.get(gpu, -1)
    cpu_nodes = _nodes_of(task.cpus, layout)
    if node < 0 or not cpu_nodes or node in cpu_nodes:
        return None
    return (
        f"job {task.job_id} rank {task.procid}: GPU {gpu} is on NUMA node {node}, "
        f"its CPUs {format_cpulist(task.cpus)} on node(s) {','.join(map(str, sorted(cpu_nodes)))}"
    )


def _squeezed(step: list[Task], share_check: bool) -> list[Finding]:
    """Ranks of one step sharing fewer CPUs than there are ranks, or bound below their CPU share."""
    out = []
    union = frozenset().union(*(t.cpus for t in step))
    first = step[0]
    if len(step) > 1 and len(union) < len(step):
        text = f"job {first.job_id}: {len(step)} ranks squeezed onto CPUs {format_cpulist(union)}"
        out.append(Finding(first.job_id, text))
    if not share_check:
        return out
    for task in step:
        share = task.cpus_per_task or (task.cpus_on_node // len(step) if task.cpus_on_node else None)
        if share and len(task.cpus) < share:
            text = (
                f"job {task.job_id} rank {task.procid} bound to {len(task.cpus)} CPU(s) "
                f"({format_cpulist(task.cpus)}) of its share of {share}"
            )
            out.append(Finding(task.job_id, text))
    return out


def check_numa(
    node: str,
    tasks: list[Task],
    layout: Mapping[int, frozenset[int]],
    gpu_numa: Mapping[int, int],
    beats: Iterable[Beat],
    th: Thresholds,
    now: float,
) -> Result:
    """Running ranks bound away from their GPU's NUMA node, or squeezed onto too few CPUs.

    Both are the job's findings: a task's CPUs are what its process allows itself (`taskset`
    narrows them), and the heartbeat's flag is what the probe says."""
    problems = [
        Finding(b.job_id, f"job {b.job_id} rank {b.rank}: the probe reports its GPU on a remote NUMA node")
        for b in beats
        if b.host == node and b.numa_mismatch and b.fresh(now, th.stale_after_s)
    ]
    steps: dict[tuple[str, str], list[Task]] = {}
    for task in tasks:
        steps.setdefault((task.job_id, task.step_id), []).append(task)
        mismatch = _gpu_mismatch(task, layout, gpu_numa)
        if mismatch:
            problems.append(Finding(task.job_id, mismatch))
    for step in steps.values():
        problems += _squeezed(step, th.numa_share)
    if problems:
        return reported("numa", problems)
    return Result("numa", OK, f"{len(tasks)} task(s) of {len(steps)} step(s) bound as allocated")


# ---------------------------------------------------------------- checkpoint storage


PROBE_PREFIX = ".slurm-chaos-health."


def _write_probe(directory: Path, prefix: str) -> None:
    """Write and fsync 4 KiB in a file of our own making in `directory`, then remove it.

    Users may write in the checkpoint directory: the name is random and the file is created with
    O_EXCL|O_NOFOLLOW relative to the directory, so no file or link of theirs is ever written through.
    """
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        name = f"{prefix}{secrets.token_hex(8)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def _timed_write(directory: Path, name: str, timeout: float) -> str | None:
    """None if a small write and fsync succeed within `timeout`, else what went wrong.

    The write runs in a daemon thread: a hung filesystem blocks that thread, not the check.
    """
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _write_probe(directory, name)
        except OSError as exc:
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return f"a 4 KiB write to {directory} hangs (> {timeout:g} s)"
    if errors:
        exc = errors[0]
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return f"cannot write to {directory}: {why}"
    return None


def check_checkpoint(
    node: str, path: str | None, beats: Iterable[Beat], th: Thresholds, now: float
) -> Result:
    """Free space and writability of the checkpoint storage (root's own write), and checkpoint
    failures the probe reported (the jobs' findings)."""
    failing = [
        Finding(b.job_id, f"job {b.job_id} rank {b.rank}: {b.checkpoint_failures} checkpoint write(s) failed")
        for b in beats
        if b.host == node and b.checkpoint_failures > 0 and b.fresh(now, th.stale_after_s)
    ]
    storage = check_checkpoint_storage(node, path, th)
    if storage.status == CRITICAL:
        failing.append(Finding(None, storage.message))
    return reported("checkpoint", failing) if failing else storage


def check_checkpoint_storage(node: str, path: str | None, th: Thresholds) -> Result:
    """Free space and writability of the checkpoint storage, as a write of root's own finds them."""
    if not path:
        return Result("checkpoint", OK, "no checkpoint path configured")
    directory = Path(path)
    if not directory.is_dir():
        return Result("checkpoint", WARNING, f"{directory} does not exist (yet)")
    try:
        st = os.statvfs(directory)
    except OSError as exc:
        return Result("checkpoint", CRITICAL, f"statvfs {directory}: {exc.strerror}")
    free_mb = st.f_bavail * st.f_frsize / 2**20
    if free_mb < th.checkpoint_min_free_mb:
        return Result(
            "checkpoint",
            CRITICAL,
            f"{directory}: {free_mb:.1f} MiB free (< {th.checkpoint_min_free_mb:g} MiB)",
        )
    problem = _timed_write(directory, f"{PROBE_PREFIX}{node}.", th.checkpoint_timeout_s)
    if problem:
        return Result("checkpoint", CRITICAL, problem)
    return Result("checkpoint", OK, f"{directory}: {free_mb:.0f} MiB free, writable")


# ---------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class GpuState:
    """What NVML says about one GPU right now (-1 where the device does not say)."""

    index: int
    pci_bus_id: str
    numa_node: int = -1
    ecc_uncorrected: int = -1
    remap_pending: bool = False
    remap_failed: bool = False
    clock_reasons: int = 0
    sm_clock: int = -1
    sm_clock_max: int = -1
    utilization: int = -1


@dataclass(frozen=True)
class GpuFacts:
    """The node's GPUs as NVML sees them, or why it could not look."""

    gpus: tuple[GpuState, ...] = ()
    error: str = ""
    expected: int = 0
    xids: tuple[tuple[float, str, int], ...] = field(default_factory=tuple)


def _nvml_call(fn: Any, *args: Any, default: Any = -1) -> Any:
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and friends: the device does not report it
        return default


def _gpu_state(n: Any, i: int, sys_root: Path) -> GpuState:
    h = n.nvmlDeviceGetHandleByIndex(i)
    bus = n.nvmlDeviceGetPciInfo(h).busId
    bus = bus.decode() if isinstance(bus, bytes) else str(bus)
    try:
        numa = int((sys_root / "bus/pci/devices" / sysfs_bus_id(bus) / "numa_node").read_text())
    except (OSError, ValueError):
        numa = -1
    reasons_fn = (
        getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or n.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    remap = _nvml_call(n.nvmlDeviceGetRemappedRows, h, default=(0, 0, 0, 0))
    util = _nvml_call(n.nvmlDeviceGetUtilizationRates, h, default=None)
    return GpuState(
        i,
        bus,
        numa,
        int(
            _nvml_call(
                n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC
            )
        ),
        bool(remap[2]),
        bool(remap[3]),
        int(_nvml_call(reasons_fn, h, default=0)),
        int(_nvml_call(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM)),
        int(_nvml_call(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM)),
        int(util.gpu) if util is not None else -1,
    )


def read_gpus(expected: int, sys_root: Path = Path("/sys")) -> GpuFacts:
    """Every GPU through NVML; without a driver or pynvml, the reason instead."""
    if expected == 0:
        return GpuFacts(error="no GPUs configured for this node")
    if not Path("/proc/driver/nvidia").exists() and expected < 0:
        return GpuFacts(error="no NVIDIA driver on this node")
    try:
        import pynvml as n
    except ImportError:
        return GpuFacts(error="nvidia-ml-py (pynvml) is not installed", expected=expected)
    try:
        n.nvmlInit()
    except Exception as exc:  # NVMLError subclasses are built at run time
        return GpuFacts(error=f"NVML did not initialise ({exc})", expected=expected)
    try:
        gpus = tuple(_gpu_state(n, i, sys_root) for i in range(n.nvmlDeviceGetCount()))
    except Exception as exc:
        return GpuFacts(error=f"NVML query failed ({exc})", expected=expected)
    finally:
        _nvml_call(n.nvmlShutdown)
    return GpuFacts(gpus, expected=expected)


def parse_kmsg(records: Iterable[str]) -> list[tuple[float, str, int]]:
    """NVRM Xid lines of /dev/kmsg records (``pri,seq,usec,flags;text``): (seconds since boot, bus, XID)."""
    out = []
    for rec in records:
        head, sep, text = rec.partition(";")
        m = XID_RE.search(text)
        if not sep or not m:
            continue
        try:
            usec = int(head.split(",")[2])
        except (IndexError, ValueError):
            continue
        out.append((usec / 1e6, m.group(1), int(m.group(2))))
    return out


def read_kmsg(path: Path = Path("/dev/kmsg")) -> list[str]:
    """Every record still in the kernel ring buffer (non-blocking; [] where it cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    records = []
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue  # records overwritten while we read: carry on with the next one
            if not chunk:
                break
            records.append(chunk.decode(errors="replace"))
    except OSError:
        pass
    finally:
        os.close(fd)
    return records


def check_gpu_xid(facts: GpuFacts, th: Thresholds, uptime: float) -> Result:
    """An XID in the kernel log within the last `xid_window_s`, or fewer GPUs than the node should have."""
    if facts.expected == 0:
        return Result("gpu_xid", OK, f"skipped: {facts.error}")
    recent = [
        (t, bus, x) for t, bus, x in facts.xids if uptime - t <= th.xid_window_s and x not in th.xid_ignore
    ]
    if recent:
        t, bus, xid = recent[-1]
        return Result(
            "gpu_xid",
            CRITICAL,
            f"Xid {xid} on GPU {bus} {uptime - t:.0f} s ago ({len(recent)} in {th.xid_window_s:g} s)",
        )
    if facts.expected > 0 and len(facts.gpus) < facts.expected:
        why = f" ({facts.error})" if facts.error else ""
        return Result("gpu_xid", CRITICAL, f"{len(facts.gpus)} of {facts.expected} GPUs visible{why}")
    if facts.error:
        return Result("gpu_xid", WARNING, f"kernel log clean; {facts.error}")
    return Result("gpu_xid", OK, f"no Xid in the last {th.xid_window_s:g} s on {len(facts.gpus)} GPU(s)")


def check_gpu_ecc(facts: GpuFacts) -> Result:
    """Uncorrected ECC errors since the driver loaded, or row remapping pending or failed."""
    if facts.error:
        return Result("gpu_ecc", OK if facts.expected == 0 else WARNING, f"skipped: {facts.error}")
    bad = []
    for g in facts.gpus:
        if g.ecc_uncorrected > 0:
            bad.append(f"GPU {g.index}: {g.ecc_uncorrected} uncorrected ECC error(s)")
        if g.remap_failed:
            bad.append(f"GPU {g.index}: row remapping failed")
        elif g.remap_pending:
            bad.append(f"GPU {g.index}: row remapping pending (reset needed)")
    if bad:
        return Result("gpu_ecc", CRITICAL, "; ".join(bad))
    return Result("gpu_ecc", OK, f"{len(facts.gpus)} GPU(s) without uncorrected ECC errors")


def check_gpu_throttle(facts: GpuFacts, th: Thresholds) -> Result:
    """A busy GPU slowed by power or thermal limits, or clocked far below its maximum."""
    if facts.error:
        return Result("gpu_throttle", OK if facts.expected == 0 else WARNING, f"skipped: {facts.error}")
    bad = []
    for g in facts.gpus:
        if g.clock_reasons & SLOWDOWN_MASK:
            bad.append(f"GPU {g.index}: slowdown reasons 0x{g.clock_reasons & SLOWDOWN_MASK:x}")
        elif (
            g.utilization >= th.throttle_min_util
            and g.sm_clock > 0
            and g.sm_clock_max > 0
            and g.sm_clock < th.throttle_clock_ratio * g.sm_clock_max
        ):
            bad.append(f"GPU {g.index}: {g.utilization}% busy at {g.sm_clock} of {g.sm_clock_max} MHz")
    if bad:
        return Result("gpu_throttle", CRITICAL, "; ".join(bad))
    return Result("gpu_throttle", OK, f"{len(facts.gpus)} GPU(s) at full clocks")
