"""Benchmark: the probe's instrumentation overhead and its all_reduce busbw against a bare loop.

Usage: python bench/bench_probe.py [--ranks 2] [--rounds 8] [--block 20] [--model-size tiny]
                                   [--ar-bytes 4194304] [--ar-iters 20]

Starts `--ranks` local processes (gloo on loopback; nccl if they have GPUs) and, in one run,
interleaves rounds of
- `--block` training steps through the probe's own loop (phase timers and syncs, the SWMR HDF5
  writer, telemetry queue draining: ``run.train_loop``), and the same number of steps with every
  timer, sync and write taken out (``Trainer.step_untimed``);
- the probe's all_reduce measurement (``workload.allreduce_size``) and a bare
  ``torch.distributed.all_reduce`` loop over a tensor of the same size.
Each round runs both variants back to back (in alternating order), so drift on a shared machine
hits both alike; the figures are medians over rounds. Goals: overhead <= 1 %, busbw ratio >= 0.95.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_chaos.probe.local import free_port, rank_env  # noqa: E402


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--block", type=int, default=20, help="training steps per variant per round")
    p.add_argument("--model-size", default="tiny")
    p.add_argument("--ar-bytes", type=int, default=4 * 2**20)
    p.add_argument("--ar-iters", type=int, default=20)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _timed_block(fn: object, world_barrier: object) -> float:
    world_barrier()  # type: ignore[operator]
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    world_barrier()  # type: ignore[operator]
    return time.perf_counter() - t0


def worker(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from slurm_chaos.probe import run as probe_run
    from slurm_chaos.probe.rendezvous import init_process_group, resolve
    from slurm_chaos.probe.workload import MODEL_SIZES, Trainer, allreduce_size, bus_bandwidth
    from slurm_chaos.probe.writer import RankWriter

    rv = resolve(os.environ)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rv.local_rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    init_process_group(rv, "nccl" if cuda else "gloo", 60)
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)

    def barrier() -> None:
        sync()
        dist.barrier()

    trainer = Trainer(MODEL_SIZES[a.model_size], device, seed=1, rank=rv.rank, world_size=rv.world_size)
    trainer.broadcast_parameters()
    out = Path(tempfile.mkdtemp(prefix="bench-probe-"))
    writer = RankWriter(out / f"rank-{rv.rank}.h5", {"rank": rv.rank, "world_size": rv.world_size, "host": "b",
                                                     "job_id": "bench"})
    cfg = probe_run.ProbeConfig(steps=0, out=out, progress_every=0)
    step = 0

    def instrumented() -> None:
        nonlocal step
        probe_run.train_loop(replace(cfg, steps=step + a.block), rv, trainer, writer, None, None, step)
        step += a.block

    def plain() -> None:
        nonlocal step
        for s in range(step, step + a.block):
            trainer.step_untimed(s)
        sync()
        step += a.block

    buf = torch.ones(a.ar_bytes // 4, dtype=torch.float32, device=device)

    def bare_allreduce() -> float:
        for _ in range(3):
            dist.all_reduce(buf)
        barrier()
        t0 = time.perf_counter()
        for _ in range(a.ar_iters):
            dist.all_reduce(buf)
        sync()
        per = (time.perf_counter() - t0) / a.ar_iters
        return bus_bandwidth(a.ar_bytes / per / 1e9, rv.world_size)

    plain()  # warm-up: first steps allocate and fill caches
    instrumented()
    ratios, t_instr, t_plain, bw_probe, bw_bare = [], [], [], [], []
    for r in range(a.rounds):
        order = [("i", instrumented), ("p", plain)] if r % 2 == 0 else [("p", plain), ("i", instrumented)]
        got = {name: _timed_block(fn, barrier) / a.block for name, fn in order}
        t_instr.append(got["i"])
        t_plain.append(got["p"])
        ratios.append(got["i"] / got["p"])
        pair = [("probe", lambda: allreduce_size(a.ar_bytes, a.ar_iters, 3, device, rv.world_size).busbw),
                ("bare", bare_allreduce)]
        for name, fn in pair if r % 2 == 0 else pair[::-1]:
            barrier()
            (bw_probe if name == "probe" else bw_bare).append(fn())
    writer.close()
    if rv.rank == 0:
        _report(a, rv.world_size, t_instr, t_plain, ratios, bw_probe, bw_bare, "nccl" if cuda else "gloo")
    dist.destroy_process_group()


def _report(
    a: argparse.Namespace, world: int, t_instr: list[float], t_plain: list[float], ratios: list[float],
    bw_probe: list[float], bw_bare: list[float], backend: str,
) -> None:
    med = statistics.median
    overhead = med(ratios) - 1
    bw_ratio = med(bw_probe) / med(bw_bare)
    spread = (max(ratios) - min(ratios)) / 2
    print(f"probe benchmark: {world} ranks, backend {backend}, model {a.model_size}, "
          f"{a.rounds} interleaved rounds of {a.block} steps")
    print(f"{'':28}{'probe':>14}{'bare':>14}{'ratio':>10}{'goal':>12}")
    print(f"{'step time (ms, median)':28}{1e3 * med(t_instr):14.3f}{1e3 * med(t_plain):14.3f}"
          f"{med(ratios):10.4f}{'<= 1.01':>12}")
    print(f"{'allreduce busbw (GB/s)':28}{med(bw_probe):14.4f}{med(bw_bare):14.4f}{bw_ratio:10.4f}{'>= 0.95':>12}")
    print(f"  instrumentation overhead {100 * overhead:+.2f} % (round-to-round spread +/- {100 * spread:.2f} %), "
          f"allreduce size {a.ar_bytes} B x {a.ar_iters} iterations")
    print(json.dumps({
        "step_time_instrumented": med(t_instr), "step_time_plain": med(t_plain), "overhead": overhead,
        "overhead_spread": spread, "busbw_probe": med(bw_probe), "busbw_bare": med(bw_bare),
        "busbw_ratio": bw_ratio, "ranks": world, "backend": backend,
    }))


def main() -> None:
    a = _args()
    if a.worker:
        worker(a)
        return
    import subprocess

    port = free_port()
    argv = [sys.executable, __file__, "--worker", *sys.argv[1:]]
    procs = [subprocess.Popen(argv, env=rank_env(r, a.ranks, port)) for r in range(a.ranks)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"bench_probe: a rank failed (exit codes {codes})")


if __name__ == "__main__":
    main()
