"""Benchmark: analysis of a 1,024-rank x 10,000-step run pair (goal: under 5 s and under 2 GiB).

Usage: python bench/bench_analysis.py [--ranks N] [--steps N] [--from-files [--reps N]]

Times the analysis proper (job series, warm-up, bootstrap CI, Mann-Whitney, change points,
straggler scores) on runs held in memory, and reports its peak memory (tracemalloc, which numpy
reports its buffers to). With --from-files it also writes both runs as probe HDF5 files, twice
(schema 1: attributes one by one; schema 2: also as one ``meta`` attribute), reads them back with
the probe reader and analyses them, each time in a fresh process so that its peak RSS is its own:
the old path (schema 1 files, every dataset) and the new one (schema 2, only the datasets the
analysis reads), alternated ``--reps`` times, and the mixed two. It reports the medians, the ratio
new/old, and the new path's end-to-end time and peak RSS.

Measured on 2026-12-05 (2-core machine, --from-files, median of 3): 1,024 x 10,000 from HDF5 in
**3.18 s** end to end with a peak RSS of **1.11 GiB** (goal: 5 s, 2 GiB); the old path 6.86 s and
1.57 GiB (new/old 0.46x end to end, reading 0.32x); the analysis in memory 1.06 s.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from slurm_chaos.analysis.commands import compare_and_localise
from slurm_chaos.analysis.straggler import STEPS_READ, stragglers
from slurm_chaos.analysis.synthetic import JobModel, SyntheticRun, host_of, simulate, write_run
from slurm_chaos.probe.reader import EVERYTHING, RankData, RunData, Selection, read_run

GIB = 1024**3


@dataclass(frozen=True)
class ReadPath:
    """One way of reading the runs back: which files (schema version), which datasets."""

    name: str
    schema_version: int
    selection: Selection
    label: str


OLD = ReadPath("old", 1, EVERYTHING, "schema 1 files, every dataset (the reader before)")
NEW = ReadPath("new", 2, STEPS_READ, "schema 2 files (meta), the analysis's datasets")
MIXED = (
    ReadPath("meta", 2, EVERYTHING, "schema 2 files (meta), every dataset"),
    ReadPath("select", 1, STEPS_READ, "schema 1 files, the analysis's datasets"),
)
PATHS = {p.name: p for p in (OLD, NEW, *MIXED)}


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
    parser.add_argument("--reps", type=int, default=3, help="runs of each read path (--from-files)")
    parser.add_argument("--read-back", nargs=2, metavar=("DIR", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read_back:
        print(json.dumps(read_back(Path(args.read_back[0]), PATHS[args.read_back[1]])))
        return

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
            for version in (1, 2):
                write_run(Path(tmp) / f"v{version}" / "baseline", base_run, schema_version=version)
                write_run(Path(tmp) / f"v{version}" / "fault", fault_run, schema_version=version)
            written = (time.perf_counter() - t0) / 2
            del base_run, fault_run, base, fault
            runs = compare_paths(Path(tmp), args.reps)
        new = runs[NEW.name]
        rate = records / new["total"]
        print(
            f"from HDF5 files (read + analysis): {new['total']:.2f} s, {rate:,.0f} records/s "
            f"(reading {2 * args.ranks} files: {new['reading']:.2f} s; writing them took {written:.1f} s)"
        )
        print(
            f"  process peak RSS {new['rss'] / GIB:.2f} GiB "
            f"(already {new['rss_before'] / GIB:.2f} GiB before reading, in a fresh process)"
        )


def peak_rss() -> int:
    """This process's peak RSS in bytes since it started its program (Linux keeps getrusage's
    ru_maxrss across exec, so a child would report the parent's peak; VmHWM starts afresh)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def read_back(root: Path, path: ReadPath) -> dict[str, float]:
    """Read and analyse both runs as `path` says: seconds, bytes, and what the analysis found."""
    rss_before = peak_rss()
    directory = root / f"v{path.schema_version}"
    t0 = time.perf_counter()
    runs = read_run(directory / "baseline", path.selection), read_run(directory / "fault", path.selection)
    reading = time.perf_counter() - t0
    regression, slow = analyse(*runs)
    total = time.perf_counter() - t0
    rss = peak_rss()
    return {
        "reading": reading,
        "total": total,
        "rss": rss,
        "rss_before": rss_before,
        "regression": regression,
        "slow": slow,
    }


def compare_paths(root: Path, reps: int) -> dict[str, dict[str, float]]:
    """Run every read path `reps` times, alternated, each in a fresh process; print the medians."""
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in PATHS}
    for _ in range(reps):
        for name in PATHS:
            child = subprocess.run(
                [sys.executable, __file__, "--read-back", str(root), name], capture_output=True, text=True
            )
            if child.returncode:
                sys.exit(f"read path {name} failed:\n{child.stderr}")
            samples[name].append(json.loads(child.stdout))
    medians = {
        name: {key: statistics.median(s[key] for s in runs) for key in runs[0]}
        for name, runs in samples.items()
    }
    print(f"read paths, median of {reps} alternated runs, each in a fresh process (read + analysis):")
    for name, m in medians.items():
        print(
            f"  {name:6s} {PATHS[name].label:50s} reading {m['reading']:6.2f} s, end to end "
            f"{m['total']:6.2f} s, peak RSS {m['rss'] / GIB:.2f} GiB, "
            f"regression {100 * m['regression']:+.2f}%, slowest rank {m['slow']:.0f}"
        )
    old, new = medians[OLD.name], medians[NEW.name]
    faster = old["reading"] / new["reading"]
    print(
        f"  new/old: reading {new['reading'] / old['reading']:.2f}x ({faster:.1f} times faster), "
        f"end to end {new['total'] / old['total']:.2f}x, peak RSS {new['rss'] / old['rss']:.2f}x"
    )
    return medians


if __name__ == "__main__":
    main()
