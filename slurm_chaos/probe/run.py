"""One rank of a probe run, from rendezvous to the closed HDF5 file and its summary."""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from slurm_chaos.errors import ChaosError, DataError, UsageError
from slurm_chaos.probe import checkpoint as ckpt
from slurm_chaos.probe import telemetry as tel
from slurm_chaos.probe.heartbeat import Heartbeat, this_node
from slurm_chaos.probe.rendezvous import Rendezvous, init_process_group, resolve
from slurm_chaos.probe.schema import ProbeMode, rank_file_name, schedule_attrs
from slurm_chaos.probe.switch import ACK_TIMEOUT_S, FaultSwitch, StepFault, open_switch
from slurm_chaos.probe.workload import CollectiveFailed, collective
from slurm_chaos.probe.writer import PreviousAttempt, RankWriter, StepRecord, carry_over
from slurm_chaos.schedule import SwitchbackSchedule


class PeerLost(ChaosError):
    """A collective failed mid-run: a peer died, hung past the timeout or the network broke."""


class Terminated(ChaosError):
    """Slurm (or someone) sent SIGTERM/SIGINT; the file is flushed and the rank stops."""

    exit_code = 143


class Superseded(ChaosError):
    """A later run of this job (a requeue) already wrote this rank's file: this rank belongs to an
    earlier attempt, cut off from Slurm (its node lost, then back) and resuming too late."""


@dataclass(frozen=True)
class ProbeConfig:
    """Everything the command line sets."""

    steps: int
    out: Path
    mode: ProbeMode = ProbeMode.TRAIN
    model_size: str = "tiny"
    seed: int = 1234
    progress_every: int = 10
    ckpt_dir: Path | None = None
    ckpt_every: int = 50
    ckpt_timeout: float = 60.0
    rendezvous: str = "auto"
    rendezvous_timeout: float = 60.0
    collective_timeout: float = 600.0
    backend: str = "auto"
    threads: int = 1
    bucket_mb: float = 25.0
    min_bytes: int = 1024
    max_bytes: int = 0
    warmup: int = 5
    telemetry_interval: float = 1.0
    flush_every: int = 50
    flush_interval: float = 1.0
    # Train: after its steps, keep training until this file exists (the campaign releases the job
    # once what it waits for happened) or hold_max_s passed; None: end after the steps.
    hold_file: Path | None = None
    hold_max_s: float = 0.0
    # Train: a switchback schedule toggles the fault at step boundaries (probe.switch), through
    # the node's control channel under fault_control (the journal root); None: no schedule.
    fault_schedule: SwitchbackSchedule | None = None
    fault_control: Path | None = None
    fault_ack_timeout: float = ACK_TIMEOUT_S


@dataclass(frozen=True)
class Summary:
    """The final one-line JSON rank 0 prints."""

    mode: ProbeMode
    rank: int
    steps: int
    last_step: int
    median_step_time: float
    world_size: int
    backend: str
    restarts: int
    restart_step: int
    steps_lost: int
    checkpoint_failures: int
    out: str
    peak_busbw_gbps: float = float("nan")


@dataclass(frozen=True)
class Resume:
    step: int
    load_time: float
    previous: PreviousAttempt | None


def _say(rank: int, text: str) -> None:
    if rank == 0:
        print(f"probe: {text}", flush=True)


_STOP: list[str] = []  # the name of the signal that asked us to stop, once one has


def stop_requested() -> None:
    """Raise :class:`Terminated` at a safe point (between steps) once SIGTERM/SIGINT has arrived."""
    if _STOP:
        raise Terminated(f"stopped by signal {_STOP[0]}")


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    # The handler only takes note: raising inside it could tear an HDF5 write in half.
    def handler(signum: int, frame: FrameType | None) -> None:
        _STOP.append(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_probe(cfg: ProbeConfig, env: Mapping[str, str] | None = None) -> Summary:
    """Run one rank; raises :class:`ChaosError` subclasses for the failures the CLI reports."""
    import torch
    import torch.distributed as dist

    _prepare_out(cfg.out)
    rv = resolve(os.environ if env is None else env, cfg.rendezvous)
    device, backend = _device_and_backend(cfg, rv)
    if device.type == "cpu":
        torch.set_num_threads(cfg.threads)
    init_process_group(rv, backend, cfg.rendezvous_timeout, cfg.collective_timeout)
    try:
        with _sigterm_raises():
            return _run_in_group(cfg, rv, device, backend)
    except CollectiveFailed as exc:  # before the rank file was opened: resume, initial broadcast
        raise PeerLost(f"rank {rv.rank}: a collective failed (peer dead or unreachable): {exc}") from exc
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _prepare_out(out: Path) -> None:
    # Before the rendezvous: a bad --out fails this rank alone, at once, with the path named.
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".probe-write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write there ({exc.strerror or exc})") from exc


def _device_and_backend(cfg: ProbeConfig, rv: Rendezvous) -> tuple[Any, str]:
    import torch

    if torch.cuda.is_available() and cfg.backend in ("auto", "nccl"):
        device = torch.device("cuda", rv.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device, "nccl"
    if cfg.backend == "nccl":
        raise ChaosError("--backend nccl needs CUDA, and torch sees no GPU here")
    return torch.device("cpu"), "gloo"


def _run_in_group(cfg: ProbeConfig, rv: Rendezvous, device: Any, backend: str) -> Summary:
    host = tel.host_info()
    nvml, why = tel.load_nvml() if device.type == "cuda" else (None, "no CUDA device")
    gpu = tel.gpu_info(device.index or 0, nvml) if device.type == "cuda" else None
    if nvml is None:
        _say(rv.rank, f"GPU telemetry off: {why}")
    if cfg.mode is ProbeMode.ALLREDUCE:
        return _run_allreduce(cfg, rv, device, backend, host, gpu)
    return _run_train(cfg, rv, device, backend, host, gpu, nvml)


def _attrs(
    cfg: ProbeConfig, rv: Rendezvous, backend: str, host: tel.HostInfo, gpu: tel.GpuInfo | None
) -> dict[str, Any]:
    import torch

    return {
        "rank": rv.rank,
        "world_size": rv.world_size,
        "local_rank": rv.local_rank,
        "host": host.host,
        "job_id": rv.job_id,
        "job_name": rv.job_name,
        "restart_count": rv.restart_count,
        "rendezvous": rv.source,
        "start_time": time.time(),
        "mode": cfg.mode.value,
        "backend": backend,
        "model_size": cfg.model_size,
        "seed": cfg.seed,
        "steps_planned": cfg.steps,
        "torch_version": torch.__version__,
        "cpu_affinity": tel.format_cpulist(host.cpus),
        "cpu_numa_nodes": ",".join(map(str, host.cpu_numa_nodes)),
        "mempolicy": host.mempolicy,
        "mems_allowed": host.mems_allowed,
        "gpu_index": gpu.index if gpu else -1,
        "gpu_uuid": gpu.uuid if gpu else "",
        "gpu_pci_bus_id": gpu.pci_bus_id if gpu else "",
        "gpu_numa_node": gpu.numa_node if gpu else -1,
        "gpu_name": gpu.name if gpu else "",
        "numa_mismatch": tel.numa_mismatch(host, gpu),
    }


def _numa_event(writer: RankWriter, host: tel.HostInfo, gpu: tel.GpuInfo | None) -> None:
    if gpu is not None and tel.numa_mismatch(host, gpu):
        writer.event(
            "numa_mismatch",
            f"GPU {gpu.index} ({gpu.pci_bus_id}) is on NUMA node {gpu.numa_node}, task CPUs "
            f"{tel.format_cpulist(host.cpus)} are on node(s) {','.join(map(str, host.cpu_numa_nodes))}",
        )


def _agree_resume(directory: Path, rank: int, world: int) -> int:
    """The newest step every rank holds a complete checkpoint for (0 if none)."""
    import torch.distributed as dist

    mine = ckpt.complete_steps(directory, rank)
    everyone: list[list[int] | None] = [None] * world
    dist.all_gather_object(everyone, mine)
    common = set(mine).intersection(*(set(s or []) for s in everyone))
    return max(common, default=0)


def _resume(cfg: ProbeConfig, rv: Rendezvous, trainer: Any, directory: Path) -> tuple[int, float]:
    """Load the newest checkpoint all ranks can load; returns (restart step, seconds it took)."""
    import torch.distributed as dist

    t0 = time.perf_counter()
    step = _agree_resume(directory, rv.rank, rv.world_size)
    while step > 0:
        try:
            trainer.load_state(ckpt.load(directory, step, rv.rank))
            ok = 1
        except Exception as exc:  # a torn or unreadable file: fall back to an older one
            print(f"probe: rank {rv.rank}: checkpoint step {step} unreadable ({exc})", file=sys.stderr)
            ok = 0
        if _allreduce_int(ok, dist.ReduceOp.MIN) == 1:
            break
        older = [s for s in ckpt.complete_steps(directory, rv.rank) if s < step]
        step = _agree_resume_below(older)
    return step, time.perf_counter() - t0


def _agree_resume_below(older: list[int]) -> int:
    import torch.distributed as dist

    return _allreduce_int(max(older, default=0), dist.ReduceOp.MIN)


def _allreduce_int(value: int, op: Any = None) -> int:
    """All-reduce one integer (sum by default); on a GPU tensor where the backend (nccl) needs one."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op is None else op)
    return int(t.item())


def _open_writer(
    cfg: ProbeConfig, rv: Rendezvous, attrs: dict[str, Any], fresh: bool, allreduce: bool = False
) -> tuple[RankWriter, PreviousAttempt | None]:
    path = cfg.out / rank_file_name(rv.rank)
    _refuse_if_superseded(path, rv)
    carried = None if fresh else carry_over(path)
    attempt = carried[0].attempts if carried else 0
    writer = RankWriter(
        path,
        attrs,
        attempt=attempt,
        allreduce=allreduce,
        fault=cfg.fault_schedule is not None and not allreduce,
        flush_every=cfg.flush_every,
        flush_interval=cfg.flush_interval,
    )
    if carried:
        writer.copy_previous(carried[1], carried[2])
    return writer, carried[0] if carried else None


def _refuse_if_superseded(path: Path, rv: Rendezvous) -> None:
    """Stop, touching nothing, where a later restart of this job already writes or wrote `path`.

    A rank whose node was lost (a rack cut off from the controller) is not killed: when its node
    comes back it carries on, after Slurm has requeued the job elsewhere. Opening its rank file then
    would replace what the requeued run recorded.
    """
    from slurm_chaos.probe.reader import read_rank

    if not path.exists():
        return
    try:
        attrs = read_rank(path).attrs
    except DataError:
        return  # unreadable: an earlier attempt killed before its first flush, moved aside as usual
    theirs = int(attrs.get("restart_count", 0))  # type: ignore[call-overload]
    if str(attrs.get("job_id", "")) == str(rv.job_id) and theirs > rv.restart_count:
        raise Superseded(
            f"rank {rv.rank}: {path.name} belongs to restart {theirs} of job {rv.job_id}, this rank to "
            f"restart {rv.restart_count}: an earlier attempt resuming late stops without touching it"
        )


def _run_train(
    cfg: ProbeConfig,
    rv: Rendezvous,
    device: Any,
    backend: str,
    host: tel.HostInfo,
    gpu: tel.GpuInfo | None,
    nvml: Any,
) -> Summary:
    from slurm_chaos.probe.workload import MODEL_SIZES, Trainer

    trainer = Trainer(
        MODEL_SIZES[cfg.model_size],
        device,
        seed=cfg.seed,
        rank=rv.rank,
        world_size=rv.world_size,
        bucket_mb=cfg.bucket_mb,
    )
    checkpointer, start, load_time = None, 0, 0.0
    if cfg.ckpt_dir is not None:
        directory = ckpt.checkpoint_dir(cfg.ckpt_dir, rv.job_name, rv.job_id)
        with collective("agreeing on the checkpoint to resume from"):
            start, load_time = _resume(cfg, rv, trainer, directory)
        checkpointer = ckpt.Checkpointer(directory, rv.rank, timeout_s=cfg.ckpt_timeout)
    if start == 0:
        trainer.broadcast_parameters()
    attrs = _attrs(cfg, rv, backend, host, gpu) | {"restart_step": start, "params": trainer.numel}
    attrs |= schedule_attrs(cfg.fault_schedule)
    switch = _open_switch(cfg, rv)
    writer, previous = _open_writer(cfg, rv, attrs, fresh=start == 0 and rv.restart_count == 0)
    steps_lost = _record_resume(writer, start, load_time, previous, rv)
    _numa_event(writer, host, gpu)
    sampler = _start_sampler(nvml, gpu, cfg.telemetry_interval, writer)
    _say(
        rv.rank,
        f"{cfg.mode} {cfg.model_size} model ({trainer.numel} parameters), {rv.world_size} ranks, "
        f"backend {backend}, steps {start}..{cfg.steps - 1}",
    )
    # The health check and the exporter watch the probe through its heartbeat file. The GPU index
    # only where NVML numbered it, as dcgm-exporter does; CUDA's own numbering would not join.
    gpu_index = gpu.index if gpu is not None and nvml is not None else None
    heartbeat = Heartbeat(
        None, rv.job_id, rv.rank, this_node(), world_size=rv.world_size, mode=cfg.mode, gpu=gpu_index
    )
    numa = bool(attrs.get("numa_mismatch", False))
    with _closing_on_failure(writer, sampler, rv, host), contextlib.closing(heartbeat):
        times = train_loop(cfg, rv, trainer, writer, checkpointer, sampler, start, heartbeat, numa, switch)
        failures = _finish_checkpoints(checkpointer, writer, cfg)
        total_failures = _sum_over_ranks(failures)
    _close(
        writer,
        sampler,
        {"exit_reason": "done", "param_checksum": trainer.checksum(), "steps_completed": len(times)},
    )
    return Summary(
        cfg.mode,
        rv.rank,
        len(times),
        start + len(times) - 1,
        statistics.median(times) if times else float("nan"),
        rv.world_size,
        backend,
        previous.attempts if previous else rv.restart_count,
        start,
        steps_lost,
        total_failures,
        str(cfg.out),
    )


def _open_switch(cfg: ProbeConfig, rv: Rendezvous) -> FaultSwitch | None:
    if cfg.fault_schedule is None:
        return None
    return open_switch(
        cfg.fault_schedule, cfg.fault_control, this_node(), rv.job_id, rv.local_rank, cfg.fault_ack_timeout
    )


def _record_resume(
    writer: RankWriter, start: int, load_time: float, previous: PreviousAttempt | None, rv: Rendezvous
) -> int:
    if start == 0 and previous is None:
        return 0
    last = previous.last_step if previous else -1
    lost = last + 1 - start if last >= 0 else -1
    downtime = (
        time.time() - previous.last_end_time
        if previous and previous.last_end_time == previous.last_end_time
        else float("nan")
    )
    writer.event(
        "resumed",
        f"restart_step={start} steps_lost={lost} last_step_before={last} recovery_time_s={downtime:.3f} "
        f"load_time_s={load_time:.3f} attempt={writer.attempt}",
    )
    writer.pending_attrs.update(steps_lost=lost, recovery_time=downtime)
    return lost


def _start_sampler(
    nvml: Any, gpu: tel.GpuInfo | None, interval: float, writer: RankWriter
) -> tel.NvmlSampler | None:
    if nvml is None or gpu is None:
        return None
    try:
        sampler = tel.NvmlSampler(nvml, gpu.index, interval)
    except Exception as exc:  # an NVML that cannot open the device leaves the run without samples
        writer.event("telemetry_unavailable", f"NVML device {gpu.index}: {exc}")
        return None
    sampler.start()
    return sampler


def _drain_sampler(sampler: tel.NvmlSampler | None, writer: RankWriter) -> None:
    if sampler is None:
        return
    samples, events = sampler.drain()
    for when, values in samples:
        writer.telemetry(when, values)
    for when, kind, detail in events:
        writer.event(kind, detail, when)


def train_loop(
    cfg: ProbeConfig,
    rv: Rendezvous,
    trainer: Any,
    writer: RankWriter,
    checkpointer: ckpt.Checkpointer | None,
    sampler: tel.NvmlSampler | None,
    start: int,
    heartbeat: Heartbeat | None = None,
    numa_mismatch: bool = False,
    switch: FaultSwitch | None = None,
) -> list[float]:
    times: list[float] = []
    t_run = time.perf_counter()

    def one_step(step: int, last: bool) -> None:
        stop_requested()
        # Before the step's clock starts: the step is timed in the state it was asked for.
        fault = _switch_fault(switch, writer, step)
        t_start = time.time()
        t0 = time.perf_counter()
        st = trainer.step(step)
        ckpt_time = 0.0
        if checkpointer is not None and (step + 1) % cfg.ckpt_every == 0 and not last:
            t1 = time.perf_counter()
            checkpointer.start(step + 1, lambda: ckpt.cpu_copy(trainer.state()))
            ckpt_time = time.perf_counter() - t1
        step_time = time.perf_counter() - t0
        columns = {"fault_state": fault.state, "fault_epoch": fault.epoch} if fault is not None else {}
        writer.append_step(
            StepRecord(
                step, t_start, step_time, st.compute, st.comm, st.optimizer, st.data, ckpt_time, **columns
            )
        )
        times.append(step_time)
        if checkpointer is not None:
            for when, kind, detail in checkpointer.poll():
                writer.event(kind, detail, when)
        if heartbeat is not None:
            failures = checkpointer.failures if checkpointer is not None else 0
            heartbeat.update(step, step_time, st.compute, st.comm, failures, numa_mismatch)
        _drain_sampler(sampler, writer)
        if rv.rank == 0 and cfg.progress_every > 0 and (step + 1) % cfg.progress_every == 0:
            _progress(step, cfg.steps, times[-cfg.progress_every :], st, time.perf_counter() - t_run)

    held = cfg.hold_file is not None
    for step in range(start, cfg.steps):
        one_step(step, last=step + 1 == cfg.steps and not held)
    if held:
        hold(cfg, rv, writer, max(start, cfg.steps), one_step)
    return times


def _switch_fault(switch: FaultSwitch | None, writer: RankWriter, step: int) -> StepFault | None:
    """The fault's state for `step` (toggled first where this rank toggles), its events recorded."""
    if switch is None:
        return None
    fault = switch.before_step(step)
    for kind, detail in fault.events:
        writer.event(kind, detail)
    return fault


def hold(
    cfg: ProbeConfig, rv: Rendezvous, writer: RankWriter, first: int, one_step: Callable[[int, bool], None]
) -> int:
    """Go on training, step after step, until the campaign releases the job or the hold's limit.

    A fault job must outlast what it waits for (a health check's interval, an alert's ``for:``, a
    drain and requeue), whatever the machine's speed: a job that simply ends after its steps is
    judged by how fast the machine happened to be. The ranks agree each step (a one-integer
    all-reduce, MAX: the first rank to see the release, or to reach the limit, ends the hold for
    all), so they stop at the same step. Returns the first step not run. With a fault schedule the
    fault stays on through the hold (the schedule's held-on phase, :mod:`.switch`), except in a
    placebo schedule.
    """
    assert cfg.hold_file is not None
    begin = time.monotonic()
    writer.event("hold_started", f"step={first} until={cfg.hold_file} max_s={cfg.hold_max_s:g}")
    _say(rv.rank, f"holding after step {first}: training on until {cfg.hold_file} exists")
    step = first
    while True:
        released = cfg.hold_file.exists()
        over = time.monotonic() - begin >= cfg.hold_max_s
        if _allreduce_int(int(released or over), _max_op()):
            break
        one_step(step, False)
        step += 1
    why = "released" if cfg.hold_file.exists() else f"limit of {cfg.hold_max_s:g} s reached"
    writer.event("hold_ended", f"step={step} held_s={time.monotonic() - begin:.3f} {why}")
    _say(rv.rank, f"hold ended after step {step - 1}: {why}")
    return step


def _max_op() -> Any:
    import torch.distributed as dist

    return dist.ReduceOp.MAX


def _progress(step: int, total: int, recent: list[float], st: Any, elapsed: float) -> None:
    print(
        f"probe: step {step + 1}/{total} step_time median {1e3 * statistics.median(recent):.1f} ms "
        f"(compute {1e3 * st.compute:.1f}, comm {1e3 * st.comm:.1f}, optimizer {1e3 * st.optimizer:.1f} ms) "
        f"loss {st.loss:.3f} elapsed {elapsed:.1f} s",
        flush=True,
    )


def _finish_checkpoints(checkpointer: ckpt.Checkpointer | None, writer: RankWriter, cfg: ProbeConfig) -> int:
    if checkpointer is None:
        return 0
    checkpointer.wait(min(cfg.ckpt_timeout, 30.0))
    for when, kind, detail in checkpointer.poll():
        writer.event(kind, detail, when)
    return checkpointer.failures


def _sum_over_ranks(value: int) -> int:
    with collective("final all_reduce of the checkpoint failure count"):
        return _allreduce_int(value)


@contextmanager
def _closing_on_failure(
    writer: RankWriter, sampler: tel.NvmlSampler | None, rv: Rendezvous, host: tel.HostInfo
) -> Iterator[None]:
    """Close the rank file with the reason whatever stops the rank; say whose fault it was."""
    where = f"rank {rv.rank} on {host.host}"
    try:
        yield
    except CollectiveFailed as exc:
        _close_quietly(writer, sampler, {"exit_reason": f"collective failed: {exc}"[:500]})
        raise PeerLost(f"{where}: a collective failed (peer dead or unreachable): {exc}") from exc
    except Terminated as exc:
        _close_quietly(writer, sampler, {"exit_reason": str(exc)})
        raise
    except (RuntimeError, OSError) as exc:  # the GPU, the model or the rank file's storage
        # HDF5 spreads errno and file name over several lines: keep them, on one.
        text = " ".join(str(exc).split())[:600]
        _close_quietly(writer, sampler, {"exit_reason": f"{type(exc).__name__}: {text}"[:500]})
        raise ChaosError(f"{where}: {type(exc).__name__}: {text}") from exc


def _close_quietly(writer: RankWriter, sampler: tel.NvmlSampler | None, final: dict[str, Any]) -> None:
    # The rank is failing already; a file that cannot be closed must not hide the first error.
    try:
        _close(writer, sampler, final)
    except Exception as exc:
        print(f"probe: could not close {writer.path}: {exc}", file=sys.stderr)


def _close(writer: RankWriter, sampler: tel.NvmlSampler | None, final: dict[str, Any]) -> None:
    if sampler is not None:
        sampler.stop()
        _drain_sampler(sampler, writer)
    writer.close(writer.pending_attrs | final)


def _run_allreduce(
    cfg: ProbeConfig, rv: Rendezvous, device: Any, backend: str, host: tel.HostInfo, gpu: tel.GpuInfo | None
) -> Summary:
    from slurm_chaos.probe.workload import allreduce_size, message_sizes

    max_bytes = cfg.max_bytes or (2**26 if device.type == "cuda" else 2**22)
    # Step s of the sweep timed one all_reduce of allreduce/size_bytes[s // allreduce_iterations].
    attrs = _attrs(cfg, rv, backend, host, gpu) | {"restart_step": 0, "allreduce_iterations": cfg.steps}
    writer, _ = _open_writer(cfg, rv, attrs, fresh=True, allreduce=True)
    _numa_event(writer, host, gpu)
    rows: list[tuple[int, float, float, float]] = []
    times: list[float] = []
    step = 0
    with _closing_on_failure(writer, None, rv, host):
        for nbytes in message_sizes(cfg.min_bytes, max_bytes):
            stop_requested()
            r = allreduce_size(nbytes, cfg.steps, cfg.warmup, device, rv.world_size)
            rows.append((r.size_bytes, r.time, r.algbw, r.busbw))
            t = time.time() - sum(r.iteration_times)  # the sweep just ended: walk back to each start
            for dt in r.iteration_times:
                writer.append_step(StepRecord(step, t, dt, comm_time=dt))
                t += dt
                step += 1
            # Each size's row as soon as it is measured: a run killed mid-sweep keeps its sizes.
            writer.allreduce_rows(rows[-1:])
            times.extend(r.iteration_times)
            _say(
                rv.rank,
                f"allreduce {nbytes:>10d} B  time {1e6 * r.time:9.1f} us  algbw {r.algbw:7.3f} GB/s  "
                f"busbw {r.busbw:7.3f} GB/s",
            )
    _close(writer, None, {"exit_reason": "done", "steps_completed": step})
    return Summary(
        cfg.mode,
        rv.rank,
        step,
        step - 1,
        statistics.median(times) if times else float("nan"),
        rv.world_size,
        backend,
        rv.restart_count,
        0,
        0,
        0,
        str(cfg.out),
        max((r[3] for r in rows), default=float("nan")),
    )


def summary_json(summary: Summary) -> dict[str, Any]:
    """The summary as JSON-ready data: NaN (nothing measured) becomes null."""
    return {k: None if isinstance(v, float) and v != v else v for k, v in asdict(summary).items()}
