"""Benchmark: how small a slow rank the in-job switchback detects on the sandbox, and its false alarms.

Usage: python bench/bench_switchback_sandbox.py [--site site_configs/sandbox.yaml] [--runs 20]
       [--placebo-runs 20] [--percent 10 5] [--ranks 4] [--steps 500] [--model-size SIZE ...] [--out DIR]

Issue #11's sandbox acceptance, measured: for each --percent, --runs jobs of --ranks ranks where
rank 1 loses that share of its time in the on blocks of a seeded switchback schedule (slow-rank
with ``control=switchback``, the SIGSTOP/SIGCONT duty cycle), each judged on its own on/off blocks
(``slurm-chaos compare FAULT_DIR``); and --placebo-runs unfaulted jobs judged on placebo schedules.
Prints per set: runs significant, runs that named rank 1 the slowest straggler (and significant),
the median reported ``mde``, the median effect, and the agents' acknowledgement latency. Every job
is its own slurm-chaos run (``slurm-chaos run``), one after the other; nothing is detected or held
(the experiments expect no signal), so a job lasts its steps.

Acceptance (#11): at 10% at least 19 of 20 significant with rank 1 named; at 5% at least 16 of 20;
at most 3 significant of 100 placebo runs; the reported mde at most 5%.

Measured on the 2-core machine (2026-12-05, ce10ad9, the sandbox's 4 nodes sharing both cores): with
the default 4 ranks, 0 of 9 runs at 10% were significant (median effect +2.4%, median mde 24%, 60 s
a run), because 4 compute-bound ranks time-share 2 cores: the time rank 1 is stopped goes to the
other ranks, so the job loses far less than 10%, and per-step CV is ~60% (step 36 ms: 17 ms of
compute, the rest waiting for the rank whose core is busy). With ``--ranks 2`` (one rank a core):
at 10% 4 of 4 significant (effect +12.3%, mde 10.0%), at 5% 3 of 4 (+5.5%, mde 6.2%), 0 of 4
placebos (mde 8.3%), 20 s a run. The acceptance needs at least one core per rank.

``--model-size`` runs every set once per probe model size (the site file copied with
``probe.model_size`` set), so the sizes' noise is measured side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXPERIMENT = """name: {name}
strategy: gpu
description: bench_switchback_sandbox.py
nodes: 2
tasks_per_node: {tasks}
steps: {steps}
design: switchback
fault:
  spec: {spec}
{target}expect:
  regression: {regression}
"""


@dataclass
class Outcome:
    significant: bool
    named: bool
    mde: float | None
    regression: float | None
    ack_ms: list[float]


def experiment(root: Path, name: str, percent: int | None, ranks: int, steps: int) -> Path:
    spec = "null" if percent is None else f'"slow-rank:rank=1,percent={percent}"'
    path = root / f"{name}.yaml"
    path.write_text(
        EXPERIMENT.format(
            name=name,
            tasks=max(1, ranks // 2),
            steps=steps,
            spec=spec,
            target="" if percent is None else "  target: {rank: 1}\n",
            regression="false" if percent is None else "true",
        )
    )
    return path


def ack_latencies(fault_dir: Path) -> list[float]:
    from slurm_chaos.probe.reader import read_run

    run = read_run(fault_dir)
    out = []
    for r in run.ranks:
        for e in r.events:
            if e.kind in ("fault_on", "fault_off") and "ack_ms=" in e.detail:
                out.append(float(e.detail.split("ack_ms=")[1].split()[0]))
    return out


def one(site: str, exp: Path, out: Path) -> Outcome:
    argv = [sys.executable, "-m", "slurm_chaos", "run", "--site", site, str(exp), "--out", str(out), "-q"]
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode not in (0, 1):
        raise SystemExit(f"run failed ({res.returncode}):\n{res.stderr[-2000:]}")
    fault = out / "experiments" / exp.stem / "fault"
    cmp = subprocess.run(
        [sys.executable, "-m", "slurm_chaos", "compare", str(fault), "--format", "json"],
        capture_output=True,
        text=True,
    )
    if cmp.returncode != 0:
        raise SystemExit(f"compare failed ({cmp.returncode}):\n{cmp.stderr[-2000:]}")
    data: dict[str, Any] = json.loads(cmp.stdout)
    slow = data["stragglers"]
    return Outcome(
        significant=bool(data["significant"]) and (data["regression"] or 0) > 0,
        named=bool(slow) and slow[0]["rank"] == 1,
        mde=data["mde"],
        regression=data["regression"],
        ack_ms=ack_latencies(fault),
    )


def summary(label: str, outcomes: list[Outcome], seconds: float) -> str:
    n = len(outcomes)
    sig = sum(o.significant for o in outcomes)
    named = sum(o.significant and o.named for o in outcomes)
    mdes = [o.mde for o in outcomes if o.mde is not None]
    effects = [o.regression for o in outcomes if o.regression is not None]
    acks = sorted(a for o in outcomes for a in o.ack_ms)
    ack = f"ack median {acks[len(acks) // 2]:.1f} ms max {acks[-1]:.1f} ms" if acks else "no acks"
    return (
        f"{label:<14} runs {n:>3}  significant {sig:>3}  named rank 1 {named:>3}  "
        f"mde median {100 * statistics.median(mdes) if mdes else float('nan'):5.2f}%  "
        f"effect median {100 * statistics.median(effects) if effects else float('nan'):+6.2f}%  "
        f"{ack}  ({seconds / max(n, 1):.0f} s a run)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", default="site_configs/sandbox.yaml")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--placebo-runs", type=int, default=20)
    parser.add_argument("--percent", type=int, nargs="*", default=[10, 5])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--model-size", nargs="*", default=[], help="probe model sizes to compare")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary directory)")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    if args.ranks > cores:
        print(
            f"warning: {args.ranks} ranks on {cores} CPU(s): the ranks time-share cores, so the time a "
            "slowed rank loses goes to the others and the job slows by much less than --percent",
            file=sys.stderr,
        )
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        sites = {size: site_with(Path(args.site), size, root) for size in args.model_size} or {"": args.site}
        sets: list[tuple[str, int | None, int]] = [(f"slow {p}%", p, args.runs) for p in args.percent]
        sets.append(("placebo", None, args.placebo_runs))
        lines = []
        # Interleaved: set by set, the sizes one after the other, so a drift of the machine hits all.
        for label, percent, runs in sets:
            for size, site in sites.items():
                name = ("sb-placebo" if percent is None else f"sb-slow-{percent}") + (
                    f"-{size}" if size else ""
                )
                exp = experiment(root, name, percent, args.ranks, args.steps)
                t0 = time.perf_counter()
                outcomes = []
                for i in range(runs):
                    outcomes.append(one(site, exp, root / f"{name}-{i:03d}"))
                    print(f"  {label} {size} {i + 1}/{runs}: {outcomes[-1]}", file=sys.stderr, flush=True)
                lines.append(summary(f"{label} {size}".strip(), outcomes, time.perf_counter() - t0))
                print(lines[-1], flush=True)
        print("\n".join(["", f"{args.ranks} ranks, {args.steps} steps, site {args.site}", *lines]))


def site_with(site: Path, model_size: str, root: Path) -> str:
    """A copy of the site file whose probe runs ``model_size`` (placeholders left for the sandbox)."""
    import yaml

    data = yaml.safe_load(site.read_text())
    data.setdefault("probe", {})["model_size"] = model_size
    path = root / f"{site.stem}-{model_size}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


if __name__ == "__main__":
    main()
