"""Job-step launch latency with the slurm-chaos SPANK plugin loaded but unused, vs without it.

Runs ``srun -N1 true`` repeatedly, interleaving the two configurations (A = plugin absent from
plugstack.conf, B = plugin present; order A B B A ... so drift hits both alike), and prints
both side by side with the ratio of medians B/A and its bootstrap 95% interval. Goal: <= 1.02.

    python bench/bench_spank_launch.py --sandbox NAME [--reps 40]

plugstack.conf is restored to its previous content at the end. Also: ``--fuzz SECONDS`` runs
the parser fuzzer for that long first (``make -C spank_plugin fuzz``); ``--null-plugin`` times a
do-nothing SPANK plugin too; ``--micro`` prints the plugin's own per-process cost (dlopen and
callbacks against stubbed SPANK, ``make -C spank_plugin bench-noop``), which load on a shared
machine cannot blur.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_chaos.faults.plugin_install import PluginArgs, build_plugin, plugstack_line
from slurm_chaos.runner import SubprocessRunner

# The checkout's plugin sources: its fuzz and no-op benchmarks build in place (spank_plugin/build/).
PLUGIN_DIR = Path(__file__).resolve().parents[1] / "spank_plugin"

# A SPANK plugin that does nothing: the cost any plugin adds (dlopen, SPANK stack), for attribution.
NULL_PLUGIN_C = """
#include <stdint.h>
#include <slurm/spank.h>
SPANK_PLUGIN(null_bench, 1);
int slurm_spank_init(spank_t sp, int ac, char **av) { return 0; }
"""


def build_null_plugin(prefix: Path) -> Path:
    src, so = prefix / "null_bench.c", prefix / "null_bench.so"
    prefix.mkdir(parents=True, exist_ok=True)
    src.write_text(NULL_PLUGIN_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(so), str(src)], check=True, timeout=120)
    return so


@dataclass(frozen=True)
class Summary:
    """Launch times of one configuration, in milliseconds."""

    label: str
    times_ms: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.times_ms)

    def row(self) -> str:
        t = sorted(self.times_ms)
        p10, p90 = t[len(t) // 10], t[(len(t) * 9) // 10]
        return (
            f"{self.label:<22} n={len(t):<4} median {self.median:8.1f}  mean {statistics.fmean(t):8.1f}"
            f"  p10 {p10:8.1f}  p90 {p90:8.1f}  (ms)"
        )


def ratio_ci(
    a: Sequence[float], b: Sequence[float], rounds: int = 2000, seed: int = 1
) -> tuple[float, float]:
    """Bootstrap 95% interval of median(b) / median(a)."""
    rng = random.Random(seed)
    ratios = sorted(
        statistics.median(rng.choices(b, k=len(b))) / statistics.median(rng.choices(a, k=len(a)))
        for _ in range(rounds)
    )
    return ratios[int(0.025 * rounds)], ratios[int(0.975 * rounds)]


def time_step(argv: Sequence[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=120, check=False)
    elapsed = (time.perf_counter() - start) * 1000.0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return elapsed


def sandbox_env(name: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if name:
        from slurm_chaos.sandbox.layout import Layout

        layout = Layout.load(name)
        if layout is None:
            raise SystemExit(f"sandbox {name!r} is not up")
        env.update(layout.env())
    if "SLURM_CONF" not in env:
        raise SystemExit("no SLURM_CONF: give --sandbox NAME or export SLURM_CONF")
    return env


def run(args: argparse.Namespace) -> int:
    env = sandbox_env(args.sandbox)
    plugstack = Path(args.plugstack or Path(env["SLURM_CONF"]).parent / "plugstack.conf")
    prefix = Path(args.prefix or Path(env["SLURM_CONF"]).parent.parent / "bench-prefix")
    so = build_plugin(prefix, SubprocessRunner())
    lines = {
        "A": None,
        # The no-op path (no --chaos) never reads the policy: any path will do.
        "B": plugstack_line(
            so, PluginArgs(policy=str(prefix / "policy.toml"), journal_dir=str(prefix / "journal"))
        ),
        "C": f"required {build_null_plugin(prefix)}",
    }
    configs = ["A", "B", "C"] if args.null_plugin else ["A", "B"]
    before = plugstack.read_text() if plugstack.exists() else None
    argv = args.command.split()
    job = None
    if args.within_allocation:
        # Steps inside one allocation: no scheduling in the loop, only step launch (srun + slurmstepd).
        alloc = subprocess.run(
            ["salloc", "-N1", "--no-shell"], env=env, capture_output=True, text=True, timeout=120, check=True
        )
        job = alloc.stderr.split("Granted job allocation")[-1].split()[0]
        argv = [argv[0], f"--jobid={job}", *argv[1:]]
    times: dict[str, list[float]] = {c: [] for c in configs}
    try:
        for config in configs:  # warm-up, not counted
            _set_plugstack(plugstack, lines[config])
            time_step(argv, env)
        for i in range(args.reps):
            for config in configs if i % 2 == 0 else configs[::-1]:  # A B B A ...
                _set_plugstack(plugstack, lines[config])
                times[config].append(time_step(argv, env))
    finally:
        if before is None:
            plugstack.unlink(missing_ok=True)
        else:
            plugstack.write_text(before)
        if job:
            subprocess.run(["scancel", job], env=env, timeout=60, check=False)
    a = Summary("A without plugin", tuple(times["A"]))
    b = Summary("B slurm-chaos, unused", tuple(times["B"]))
    low, high = ratio_ci(a.times_ms, b.times_ms)
    ratio = b.median / a.median
    print(f"step launch latency: {' '.join(argv)}  ({args.reps} interleaved rounds)")
    print(a.row())
    print(b.row())
    if "C" in times:
        c = Summary("C null SPANK plugin", tuple(times["C"]))
        print(c.row())
        print(f"B/C = {b.median / c.median:.3f} (slurm-chaos vs any plugin), C/A = {c.median / a.median:.3f}")
    print(
        f"ratio of medians B/A = {ratio:.3f}  (95% bootstrap interval {low:.3f}..{high:.3f}; goal <= 1.02)"
        f"  -> {'OK' if ratio <= 1.02 else 'ABOVE GOAL'}"
    )
    if args.json:
        print(json.dumps({k: v for k, v in times.items()} | {"ratio": ratio, "ci": [low, high]}))
    return 0


def _set_plugstack(path: Path, line: str | None) -> None:
    """Only our line or the null plugin's line, never both (update_plugstack keeps other lines)."""
    path.write_text("# bench_spank_launch\n" + (line + "\n" if line else ""))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sandbox", help="sandbox name (else the Slurm environment already exported)")
    parser.add_argument("--reps", type=int, default=40, help="interleaved A/B pairs (default 40)")
    parser.add_argument(
        "--command", default="srun -N1 true", help="the step to time (default 'srun -N1 true')"
    )
    parser.add_argument(
        "--within-allocation",
        action="store_true",
        help="time steps inside one salloc allocation (step launch only, less noise)",
    )
    parser.add_argument("--plugstack", help="plugstack.conf to toggle (default: next to slurm.conf)")
    parser.add_argument(
        "--prefix", help="install prefix for the plugin (default: <cluster dir>/bench-prefix)"
    )
    parser.add_argument(
        "--null-plugin",
        action="store_true",
        help="also time a do-nothing SPANK plugin (C), to attribute the overhead",
    )
    parser.add_argument(
        "--micro",
        action="store_true",
        help="also measure the plugin's own no-op cost per process (make bench-noop)",
    )
    parser.add_argument("--json", action="store_true", help="also print raw times as JSON")
    parser.add_argument(
        "--fuzz", type=int, default=0, metavar="SECONDS", help="first fuzz the parsers this long"
    )
    args = parser.parse_args(argv)
    if args.fuzz:
        subprocess.run(["make", "-C", str(PLUGIN_DIR), "fuzz", f"FUZZ_LONG_SECONDS={args.fuzz}"], check=True)
    rc = run(args)
    if args.micro:
        # Attribution: dlopen + callbacks of the plugin vs a do-nothing plugin, per srun/slurmstepd.
        micro = subprocess.run(
            ["make", "-s", "-C", str(PLUGIN_DIR), "bench-noop"], capture_output=True, text=True, check=True
        )
        print("\n".join(line for line in micro.stdout.splitlines() if " us," in line))
    return rc


if __name__ == "__main__":
    sys.exit(main())
