"""Benchmark: analysis of a 1,024-rank x 10,000-step run pair (goal: under 5 s and under 2 GiB).

Usage: python bench/bench_analysis.py [--ranks N] [--steps N] [--from-files]

Times the analysis proper (job series, warm-up, bootstrap CI, Mann-Whitney, change points,
straggler scores) on runs held in memory, and reports its peak memory (tracemalloc, which numpy
reports its buffers to). With --from-files it also writes both runs as probe HDF5 files, reads them
back with the probe reader and reports the end-to-end time and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np

from slurm_chaos.analysis.commands import compare_and_localise
from slurm_chaos.analysis.straggler import stragglers
from slurm_chaos.analysis.synthetic import JobModel, SyntheticRun, host_of, simulate, write_run
from slurm_chaos.probe.reader import RankData, RunData, read_run

GIB = 1024**3


def in_memory(run: SyntheticRun, name: str) -> RunData:
    m = run.model
    ranks = tuple(
        RankData(
            path=Path(name) / f"rank-{r}.h5",
            rank=r,
            world_size=m.ranks,
            host=host_of(m, r),
            job_id=name,
            attrs={"gpu_index": -1},
            step=np.arange(m.steps),
            t_start=run.t_start[r],
            fields={k: v[r] for k, v in run.fields.items()},
        )
        for r in range(m.ranks)
    )
    return RunData(Path(name), ranks)


def analyse(base: RunData, fault: RunData) -> tuple[float, int]:
    """What `slurm-chaos compare` computes: the comparison and the straggler scores."""
    c, scores = compare_and_localise(base, fault)
    slow = stragglers(scores)
    return c.regression, slow[0].rank if slow else -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--from-files", action="store_true")
    args = parser.parse_args()

    base_model = JobModel(ranks=args.ranks, steps=args.steps, warmup_steps=50, ranks_per_host=8, seed=1)
    fault_model = replace(
        base_model, seed=2, slow_rank=args.ranks // 3, slow_rank_factor=0.2, fault_start_step=args.steps // 2
    )
    base_run, fault_run = simulate(base_model), simulate(fault_model)
    base, fault = in_memory(base_run, "baseline"), in_memory(fault_run, "fault")
    records = 2 * args.ranks * args.steps

    tracemalloc.start()
    t0 = time.perf_counter()
    regression, slow = analyse(base, fault)
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"ranks={args.ranks} steps={args.steps} records={records:,} (step records, both runs)")
    print(
        f"analysis (in memory): {elapsed:.2f} s, {records / elapsed:,.0f} records/s, "
        f"peak extra memory {peak / GIB:.2f} GiB"
    )
    print(f"  regression {100 * regression:+.2f}%, slowest rank {slow} (injected {fault_model.slow_rank})")

    if args.from_files:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            write_run(Path(tmp) / "baseline", base_run)
            write_run(Path(tmp) / "fault", fault_run)
            written = time.perf_counter() - t0
            del base_run, fault_run, base, fault
            rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
            t0 = time.perf_counter()
            runs = read_run(Path(tmp) / "baseline"), read_run(Path(tmp) / "fault")
            reading = time.perf_counter() - t0
            regression, slow = analyse(*runs)
            elapsed = time.perf_counter() - t0
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
        print(
            f"from HDF5 files (read + analysis): {elapsed:.2f} s, {records / elapsed:,.0f} records/s "
            f"(reading {2 * args.ranks} files: {reading:.2f} s; writing them took {written:.1f} s)"
        )
        print(f"  process peak RSS {rss:.2f} GiB (already {rss_before:.2f} GiB after generating the data)")


if __name__ == "__main__":
    main()
