"""Campaign overhead per experiment: wall time beyond the probe's own run time, per stage.

Runs experiments on a sandbox (root; `--sandbox NAME`, brought up if needed) and prints, per
experiment, the time spent rendering, waiting in the queue, running the job beyond the probe's own
first-to-last step, collecting and analysing. Goal: under 10 s of overhead per experiment.

    python bench/bench_campaign.py [--sandbox bench] [--experiments control-aa,slow-rank]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from slurm_chaos.probe.reader import read_run
from slurm_chaos.rundir import read_manifest
from slurm_chaos.sandbox.cluster import Sandbox

REPO = Path(__file__).resolve().parents[1]


def probe_span(directory: Path) -> float:
    """First step start to last step end, over all ranks (seconds)."""
    run = read_run(directory)
    starts = [float(r.t_start[0]) for r in run.ranks if len(r.t_start)]
    ends = [float(r.t_start[-1] + r.step_time[-1]) for r in run.ranks if len(r.t_start)]
    return max(ends) - min(starts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sandbox", default="bench")
    ap.add_argument("--experiments", default="control-aa,slow-rank")
    args = ap.parse_args()
    sb = Sandbox(args.sandbox)
    started = not sb.is_up()
    sb.up(install=False)
    env = {**os.environ, "SLURM_CHAOS_SANDBOX": args.sandbox}
    site = REPO / "site_configs" / "sandbox.yaml"
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "slurm_chaos",
                "plugin",
                "install",
                "--site",
                str(site),
                "--prefix",
                str(sb.layout().root / "prefix"),
            ],
            env=env,
            check=True,
            capture_output=True,
        )
        with tempfile.TemporaryDirectory() as tmp:
            suite = Path(tmp) / "suite.yaml"
            suite.write_text(json.dumps({"name": "bench", "experiments": args.experiments.split(",")}))
            out = Path(tmp) / "run"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "slurm_chaos",
                    "campaign",
                    "--site",
                    str(site),
                    "--suite",
                    str(suite),
                    "--out",
                    str(out),
                    "-q",
                ],
                env=env,
                check=False,
                capture_output=True,
            )
            m = read_manifest(out)
            t = m.timings
            print(
                f"{'experiment':<20} {'render':>7} {'queue':>7} {'job-probe':>9} {'collect':>8} "
                f"{'analyse':>8} {'overhead':>9} {'probe':>7}  (seconds)"
            )
            n = max(len(m.experiments), 1)
            for name in m.experiments:
                job = m.job(name, "fault")
                assert job is not None and job.started and job.ended
                span = probe_span(out / "experiments" / name / "fault")
                render = t.get(f"{name}.fault.render", 0.0)
                queue = job.started - job.submitted
                beyond = (job.ended - job.started) - span
                collect = t.get(f"{name}.collect", 0.0)
                analyse = t.get("analyse", 0.0) / n
                overhead = render + queue + beyond + collect + analyse
                print(
                    f"{name:<20} {render:7.3f} {queue:7.2f} {beyond:9.2f} {collect:8.3f} {analyse:8.2f} "
                    f"{overhead:9.2f} {span:7.2f}"
                )
            print("goal: overhead under 10 s per experiment (the baseline job is shared and not counted)")
    finally:
        if started:
            sb.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
